//! `fraglab compare DIR_A DIR_B [more…]`: every run against the first (the baseline), as a text
//! table like the mailing lists' ("good / good + series", pct in brackets), markdown or JSON.

use anyhow::Result;

use fraglab_report::compare::{Better, Comparison, MetricRow, RunData, Side};

use crate::cli::{CompareArgs, Format};
use crate::exit::Exit;

/// Exit 0 with the comparison on stdout; 255 (with the reason on stderr) when the directories cannot
/// be read or do not measure the same thing.
pub fn run(args: CompareArgs) -> Result<Exit> {
    match build(&args) {
        Ok(c) => {
            for w in &c.warnings {
                errln!("fraglab: warning: {w}");
            }
            let out = match args.format {
                Format::Text => text(&c),
                Format::Markdown => markdown(&c),
                Format::Json => serde_json::to_string_pretty(&c)? + "\n",
            };
            out!("{out}");
            Ok(Exit::Ok)
        }
        Err(e) => {
            errln!("fraglab: {e:#}");
            Ok(Exit::Error)
        }
    }
}

fn build(args: &CompareArgs) -> Result<Comparison> {
    if args.dirs.len() < 2 {
        anyhow::bail!(
            "compare needs at least two results directories: the baseline and a run to set against it"
        );
    }
    if !args.labels.is_empty() && args.labels.len() != args.dirs.len() {
        anyhow::bail!("--labels gives {} names for {} directories", args.labels.len(), args.dirs.len());
    }
    let runs = args
        .dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let label = args.labels.get(i).cloned().unwrap_or_else(|| default_label(i));
            RunData::new(
                fraglab_results::load::Run::load_with(d, fraglab_results::load::Samples::Ends)?,
                &label,
                &crate::runplan::legacy_plan,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    fraglab_report::compare::compare(&runs)
}

/// A, B, …, Z, R27, R28, …
fn default_label(i: usize) -> String {
    if i < 26 {
        ((b'A' + i as u8) as char).to_string()
    } else {
        format!("R{}", i + 1)
    }
}

// ---------------------------------------------------------------------------------------------
// Cells
// ---------------------------------------------------------------------------------------------

fn signed_pct(p: Option<f64>) -> String {
    match p {
        Some(0.0) => "0.00 pct".into(),
        Some(p) => format!("{p:+.2} pct"),
        None => "- pct".into(),
    }
}

fn ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_infinite() => "inf".into(),
        Some(r) => format!("{r:.2}"),
        None => "-".into(),
    }
}

fn p_value(side: &Side) -> String {
    match side.vs_baseline.as_ref().and_then(|v| v.welch) {
        Some(w) if w.p < 0.001 => "<0.001".into(),
        Some(w) => format!("{:.3}", w.p),
        None => "-".into(),
    }
}

/// `6303.31 ±3363.05 n=2 (0.00 pct)` for the baseline; `… (+11.21 pct) p=0.813 r=0.09 *` for others,
/// or `… (not compared: A: 0 of 30 failed, B: 30 of 30 failed)`.
fn cell(side: &Option<Side>, baseline: bool) -> String {
    let Some(s) = side else { return "-".into() };
    let head = format!("{:.2} ±{:.2} n={}", s.mean, s.stddev, s.n);
    if baseline {
        return format!("{head} (0.00 pct)");
    }
    if let Some(why) = &s.not_comparable {
        return format!("{head} (not compared: {why})");
    }
    match &s.vs_baseline {
        None => format!("{head} (no baseline)"),
        Some(v) => format!(
            "{head} ({}) p={} r={}{}",
            signed_pct(v.pct),
            p_value(s),
            ratio(v.ci_ratio),
            if v.significant { " *" } else { "" }
        ),
    }
}

fn title(row: &MetricRow) -> String {
    let better = match row.better {
        Better::Higher => "higher is better",
        Better::Lower => "lower is better",
    };
    format!("#{} {}: {}, {} ({better})", row.index + 1, row.kind, row.metric, row.unit)
}

/// Metric rows grouped into one table per (workload, metric), rows = sweep points, in run order.
fn groups(c: &Comparison) -> Vec<Vec<&MetricRow>> {
    let mut out: Vec<Vec<&MetricRow>> = Vec::new();
    for row in &c.metrics {
        match out.iter_mut().find(|g| {
            let h = g[0];
            (h.index, &h.kind, &h.metric) == (row.index, &row.kind, &row.metric)
        }) {
            Some(g) => g.push(row),
            None => out.push(vec![row]),
        }
    }
    out
}

fn significant(c: &Comparison) -> Vec<String> {
    let mut out = Vec::new();
    for row in &c.metrics {
        for (run, side) in c.runs.iter().zip(&row.sides).skip(1) {
            let Some(v) = side.as_ref().and_then(|s| s.vs_baseline.as_ref()) else { continue };
            if v.significant {
                out.push(format!(
                    "#{} {} {} at point {}: {} {} ({}, p={}, r={})",
                    row.index + 1,
                    row.kind,
                    row.metric,
                    row.point,
                    run.label,
                    signed_pct(v.pct),
                    v.change,
                    side.as_ref().map(p_value).unwrap_or_default(),
                    ratio(v.ci_ratio)
                ));
            }
        }
    }
    out
}

fn label_width(c: &Comparison) -> usize {
    c.runs.iter().map(|r| r.label.chars().count()).max().unwrap_or(1)
}

fn header_lines(c: &Comparison) -> Vec<String> {
    let w = label_width(c);
    c.runs
        .iter()
        .map(|r| {
            format!(
                "{:<w$}  {} on {}, {}: {}, {} — {}",
                r.label,
                r.kernel_release,
                r.host,
                r.name,
                r.status,
                r.verdict.as_deref().unwrap_or("no verdict"),
                r.dir
            )
        })
        .collect()
}

const LEGEND: [&str; 3] = [
    "mean ±stddev over n iterations, (pct) change of the mean against the baseline;",
    "p: Welch's two-sided t-test; r: |difference| / sum of the two 95% confidence half-widths",
    "(mmtests' rule), * = significant (r > 1)",
];

fn orders(c: &Comparison) -> usize {
    c.fragment.iter().map(|f| f.planned.len().max(f.intact.len())).max().unwrap_or(0)
}

fn size(b: Option<u64>) -> String {
    b.map(fraglab_units::format_size).unwrap_or_else(|| "-".into())
}

fn fragment_summary(f: &fraglab_report::compare::FragmentSide) -> String {
    if f.target.is_none() {
        return f.target_text.clone();
    }
    let mut s = format!(
        "{}; budget {}, held {}, freed {}",
        f.target_text,
        f.budget.map(fraglab_units::format_size).unwrap_or_else(|| "whole machine".into()),
        size(f.held_bytes),
        size(f.freed_bytes)
    );
    if let Some(m) = f.moved_pages.filter(|m| *m > 0) {
        s += &format!(", {m} held pages migrated");
    }
    if let Some(l) = &f.target_lost {
        s += &format!("; target lost: {l}");
    }
    if let Some((held, of)) = f.windows_held {
        s += &format!("; target held in {held} of {of} workload windows");
    }
    if let Some(k) = &f.keeping {
        s += &format!("; {k}");
    }
    s
}

fn delta(d: Option<i64>) -> String {
    d.map(|d| d.to_string()).unwrap_or_else(|| "-".into())
}

fn compaction_sources(c: &Comparison) -> String {
    let sources: Vec<String> =
        c.runs.iter().map(|r| r.compaction_source.clone().unwrap_or_else(|| "not recorded".into())).collect();
    if sources.windows(2).all(|w| w[0] == w[1]) {
        sources[0].clone()
    } else {
        c.runs.iter().zip(&sources).map(|(r, s)| format!("{}: {s}", r.label)).collect::<Vec<_>>().join("; ")
    }
}

/// One row per key: the key, then each run's count.
fn count_rows(rows: &[fraglab_report::compare::CountRow]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| {
            // A call site's row leads with what it meant: `surfaced   8 pipe_resize_ring ← …`.
            let key = match r.outcome {
                Some(o) => format!("{:<9}  {}", o.name(), r.key),
                None => r.key.clone(),
            };
            std::iter::once(key).chain(r.counts.iter().map(|n| n.to_string())).collect()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Text
// ---------------------------------------------------------------------------------------------

/// Columns two spaces apart, every line indented by two; after the first column, cells are
/// right-aligned when `right` (counts) and left-aligned otherwise (composite cells).
fn columns(rows: &[Vec<String>], right: bool) -> String {
    let n = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let align: Vec<bool> = (0..n).map(|i| right && i > 0).collect();
    fraglab_stdio::columns(rows, &align)
        .iter()
        .map(|l| if l.is_empty() { "\n".to_string() } else { format!("  {l}\n") })
        .collect()
}

pub fn text(c: &Comparison) -> String {
    let mut o = format!("fraglab compare: {} runs, each against {}\n", c.runs.len(), c.baseline);
    for l in header_lines(c) {
        o += &format!("  {l}\n");
    }
    for w in &c.warnings {
        o += &format!("warning: {w}\n");
    }
    for n in &c.notes {
        o += &format!("note: {n}\n");
    }
    let labels: Vec<String> = c.runs.iter().map(|r| r.label.clone()).collect();

    o += "\nWorkloads\n";
    if c.metrics.is_empty() {
        o += "  no workload results in these runs\n";
    } else {
        for l in LEGEND {
            o += &format!("  {l}\n");
        }
        for g in groups(c) {
            o += &format!("\n{}\n", title(g[0]));
            let mut rows = vec![std::iter::once("point".to_string()).chain(labels.iter().cloned()).collect()];
            for row in g {
                let mut r = vec![row.point.clone()];
                r.extend(row.sides.iter().enumerate().map(|(i, s)| cell(s, i == 0)));
                rows.push(r);
            }
            o += &columns(&rows, false);
        }
        let sig = significant(c);
        o += "\nSignificant changes (r > 1)\n";
        if sig.is_empty() {
            o += "  none\n";
        }
        for s in sig {
            o += &format!("  {s}\n");
        }
    }

    o += "\nFragmentation: target vs achieved (free blocks per order the cut made; intact = still free at the end)\n";
    let n = orders(c);
    for f in &c.fragment {
        o += &format!("  {:<w$}  {}\n", f.label, fragment_summary(f), w = label_width(c));
        if f.target.is_some() && n > 0 {
            let mut rows =
                vec![std::iter::once("order".to_string()).chain((0..n).map(|i| i.to_string())).collect()];
            let line = |name: &str, v: &[u64]| -> Vec<String> {
                std::iter::once(name.to_string())
                    .chain((0..n).map(|i| v.get(i).map(|x| x.to_string()).unwrap_or_else(|| "-".into())))
                    .collect()
            };
            rows.push(line("planned", &f.planned));
            rows.push(line("intact", &f.intact));
            if f.missing.iter().any(|m| *m > 0) {
                rows.push(line("missing", &f.missing));
            }
            for l in columns(&rows, true).lines() {
                o += &format!("  {:w$}  {}\n", "", l.trim_start(), w = label_width(c));
            }
        }
        for z in &f.zones {
            o += &format!("  {:w$}  {z}\n", "", w = label_width(c));
        }
    }

    o += "\nFailed allocations caught in the kernel (alloc_failures.jsonl), by order\n";
    if c.failures_by_order.is_empty() {
        o += "  none in any run\n";
    } else {
        let head = |first: &str| std::iter::once(first.to_string()).chain(labels.iter().cloned()).collect();
        o += &columns(&[vec![head("order")], count_rows(&c.failures_by_order)].concat(), true);
        o +=
            "  by order and call site (the first function outside the allocator ← its caller); surfaced:\n  \
              no known fallback, the caller got the failure; fell back: the kernel had a way around it\n";
        o += &columns(&[vec![head("outcome    order site")], count_rows(&c.failures_by_site)].concat(), true);
    }

    o += "\nWorkload failures by errno (workloads.json, all points and iterations)\n";
    if c.errors_by_errno.is_empty() {
        o += "  none in any run\n";
    } else {
        let mut rows = vec![std::iter::once("errno".to_string()).chain(labels.iter().cloned()).collect()];
        for r in &c.errors_by_errno {
            rows.push(std::iter::once(r.key.clone()).chain(r.counts.iter().map(|n| n.to_string())).collect());
        }
        o += &columns(&rows, true);
    }

    o += &format!("\nCompaction counters over the run ({})\n", compaction_sources(c));
    let mut rows = vec![std::iter::once("counter".to_string()).chain(labels.iter().cloned()).collect()];
    for r in &c.compaction {
        rows.push(std::iter::once(r.counter.clone()).chain(r.deltas.iter().map(|d| delta(*d))).collect());
    }
    o += &columns(&rows, true);
    o
}

// ---------------------------------------------------------------------------------------------
// Markdown
// ---------------------------------------------------------------------------------------------

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

fn md_table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut o = format!("| {} |\n", header.iter().map(|h| md_escape(h)).collect::<Vec<_>>().join(" | "));
    o += &format!("|{}\n", header.iter().map(|_| " --- |").collect::<String>());
    for r in rows {
        o += &format!("| {} |\n", r.iter().map(|c| md_escape(c)).collect::<Vec<_>>().join(" | "));
    }
    o
}

pub fn markdown(c: &Comparison) -> String {
    let mut o = format!("# fraglab compare: {} runs, each against {}\n\n", c.runs.len(), c.baseline);
    let labels: Vec<String> = c.runs.iter().map(|r| r.label.clone()).collect();
    let runs: Vec<Vec<String>> = c
        .runs
        .iter()
        .map(|r| {
            vec![
                format!("**{}**", r.label),
                r.kernel_release.clone(),
                r.host.clone(),
                r.name.clone(),
                format!("{}, {}", r.status, r.verdict.as_deref().unwrap_or("no verdict")),
                format!("`{}`", r.dir),
            ]
        })
        .collect();
    o += &md_table(
        &["run", "kernel", "host", "config", "status, verdict", "directory"].map(String::from),
        &runs,
    );
    o += "\n";
    for w in &c.warnings {
        o += &format!("> **Warning:** {}\n\n", w);
    }
    for n in &c.notes {
        o += &format!("> Note: {}\n\n", n);
    }

    o += "## Workloads\n\n";
    if c.metrics.is_empty() {
        o += "No workload results in these runs.\n\n";
    } else {
        o += &format!("{}; significant cells are in bold.\n\n", LEGEND.join(" "));
        let header: Vec<String> =
            std::iter::once("point".to_string()).chain(labels.iter().cloned()).collect();
        for g in groups(c) {
            o += &format!("### {}\n\n", title(g[0]));
            let rows: Vec<Vec<String>> = g
                .iter()
                .map(|row| {
                    std::iter::once(format!("`{}`", row.point))
                        .chain(row.sides.iter().enumerate().map(|(i, s)| {
                            let text = cell(s, i == 0);
                            let sig = s
                                .as_ref()
                                .and_then(|s| s.vs_baseline.as_ref())
                                .is_some_and(|v| v.significant);
                            if sig {
                                format!("**{text}**")
                            } else {
                                text
                            }
                        }))
                        .collect()
                })
                .collect();
            o += &md_table(&header, &rows);
            o += "\n";
        }
        o += "### Significant changes (r > 1)\n\n";
        let sig = significant(c);
        if sig.is_empty() {
            o += "None.\n";
        }
        for s in sig {
            o += &format!("- {s}\n");
        }
        o += "\n";
    }

    o += "## Fragmentation: target vs achieved\n\n";
    o += "Free blocks per order the cut made (planned) and still free at the end of the run (intact).\n\n";
    let n = orders(c);
    for f in &c.fragment {
        o += &format!("- **{}**: {}\n", f.label, fragment_summary(f));
        for z in &f.zones {
            o += &format!("  - {z}\n");
        }
    }
    o += "\n";
    if n > 0 && c.fragment.iter().any(|f| f.target.is_some()) {
        let header: Vec<String> =
            std::iter::once("run".to_string()).chain((0..n).map(|i| format!("order {i}"))).collect();
        let mut rows = Vec::new();
        for f in c.fragment.iter().filter(|f| f.target.is_some()) {
            for (name, v) in [("planned", &f.planned), ("intact", &f.intact), ("missing", &f.missing)] {
                if name == "missing" && v.iter().all(|m| *m == 0) {
                    continue;
                }
                rows.push(
                    std::iter::once(format!("{} {name}", f.label))
                        .chain((0..n).map(|i| v.get(i).map(|x| x.to_string()).unwrap_or_else(|| "-".into())))
                        .collect(),
                );
            }
        }
        o += &md_table(&header, &rows);
        o += "\n";
    }

    let header = |first: &str| -> Vec<String> {
        std::iter::once(first.to_string()).chain(labels.iter().cloned()).collect()
    };
    o += "## Failed allocations caught in the kernel, by order\n\n";
    if c.failures_by_order.is_empty() {
        o += "None in any run.\n\n";
    } else {
        o += &md_table(&header("order"), &count_rows(&c.failures_by_order));
        o += "\n";
        o += &md_table(&header("outcome, order and call site"), &count_rows(&c.failures_by_site));
        o += "\n";
    }
    o += "## Workload failures by errno\n\n";
    if c.errors_by_errno.is_empty() {
        o += "None in any run.\n\n";
    } else {
        let rows: Vec<Vec<String>> = c
            .errors_by_errno
            .iter()
            .map(|r| std::iter::once(r.key.clone()).chain(r.counts.iter().map(|n| n.to_string())).collect())
            .collect();
        o += &md_table(&header("errno"), &rows);
        o += "\n";
    }
    o += &format!("## Compaction counters over the run\n\nFrom {}.\n\n", compaction_sources(c));
    let rows: Vec<Vec<String>> = c
        .compaction
        .iter()
        .map(|r| std::iter::once(r.counter.clone()).chain(r.deltas.iter().map(|d| delta(*d))).collect())
        .collect();
    o += &md_table(&header("counter"), &rows);
    o
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use fraglab_probe::tracefs::AllocFailure;
    use fraglab_report::compare::{compare, config_differences, Better, RunData};
    use fraglab_results::load::Run;
    use serde_json::{json, Value};

    const CONFIG: &str = "[run]\nname = \"t\"\n[fragment]\nmax_free_order = 4\n\n[[workload]]\nkind = \"tcp-rr\"\nduration = \"1s\"\n\n[sweep]\nclients = [1, 2]\n";

    fn record(point: &str, iteration: u32, ops: f64, p99: u64, enomem: u64) -> Value {
        let errors = if enomem > 0 {
            json!([{"errno": "ENOMEM", "code": 12, "count": enomem, "first_seen_s": 0.1}])
        } else {
            json!([])
        };
        json!({"point": point, "sysctls": [], "iteration": iteration, "index": 0, "result": {
            "kind": "tcp-rr", "ops_per_sec": ops, "ok": 10, "failed": enomem,
            "latency_us": {"count": 10, "mean": 1.0, "min": 1, "p50": 10, "p90": 20, "p99": p99, "p999": p99, "max": p99},
            "errors": errors}})
    }

    /// A run as schema 1 recorded it (config text, no plan: compare resolves it with
    /// [`legacy_plan`]), its fragmenter status from a real run.json with these numbers.
    fn fake(label: &str, config: &str, kernel: &str, workloads: Vec<Value>) -> RunData {
        let mut record: Value =
            serde_json::from_str(include_str!("../../tests/captures/pipe-highorder-6.1-fragmented/run.json"))
                .unwrap();
        for (k, v) in [
            ("name", json!("t")),
            ("status", json!("complete")),
            ("verdict", json!("not-reproduced")),
            ("reason", json!("")),
            ("kernel_release", json!(kernel)),
            ("kernel_cmdline", json!("quiet")),
            ("host", json!("h")),
            ("fraglab_version", json!("0.1.0")),
            ("config", json!(config)),
        ] {
            record[k] = v;
        }
        let f = &mut record["fragment"];
        f["target"] = json!({"kind": "max_free_order", "order": 4, "free_bytes": 1048576});
        f["budget"] = json!(2097152);
        f["planned"] = json!([4, 4, 4, 4, 0]);
        f["intact"] = json!([1, 2, 3, 4, 0]);
        f["missing"] = json!([0, 0, 0, 0, 0]);
        let path = PathBuf::from(format!("/results/{label}/run.json"));
        let run = Run {
            dir: PathBuf::from(format!("/results/{label}")),
            record: fraglab_results::load::parse_run(record.to_string().as_bytes(), &path).unwrap(),
            workloads: workloads.into_iter().map(|w| serde_json::from_value(w).unwrap()).collect(),
            samples: vec![],
            failures: vec![failure(4)],
            baseline: None,
            final_: None,
            notes: vec![],
        };
        let mut r = RunData::new(run, label, &crate::runplan::legacy_plan).unwrap();
        r.compaction =
            Some(("baseline.json → final.json".into(), BTreeMap::from([("compact_stall".into(), 3)])));
        r
    }

    fn failure(order: u32) -> AllocFailure {
        AllocFailure {
            time: 1.0,
            cpu: 0,
            comm: "x".into(),
            pid: 1,
            order,
            migratetype: 0,
            gfp_flags: vec![],
            gfp_residue: None,
            gfp_mask: None,
            failed: true,
            pfn: None,
            stack: vec![],
            line: String::new(),
            repeats: vec![],
        }
    }

    #[test]
    fn model_keys_metrics_errnos_and_verdicts() {
        let a = fake(
            "A",
            CONFIG,
            "6.18",
            vec![
                record("clients=1", 1, 100.0, 50, 0),
                record("clients=2", 1, 200.0, 50, 0),
                record("clients=1", 2, 101.0, 52, 0),
                record("clients=2", 2, 201.0, 52, 0),
                record("clients=1", 3, 99.0, 51, 0),
                record("clients=2", 3, 199.0, 51, 0),
            ],
        );
        let b = fake(
            "B",
            CONFIG,
            "6.19",
            vec![
                record("clients=1", 1, 80.0, 50, 2),
                record("clients=2", 1, 200.0, 50, 0),
                record("clients=1", 2, 81.0, 53, 0),
                record("clients=2", 2, 202.0, 52, 0),
                record("clients=1", 3, 79.0, 51, 1),
                record("clients=2", 3, 198.0, 51, 0),
            ],
        );
        let c = compare(&[a, b]).unwrap();
        let rows: Vec<(&str, &str)> =
            c.metrics.iter().map(|m| (m.point.as_str(), m.metric.as_str())).collect();
        assert_eq!(
            rows,
            [
                ("clients=1", "rate"),
                ("clients=1", "latency p50"),
                ("clients=1", "latency p99"),
                ("clients=1", "errors ENOMEM"),
                ("clients=2", "rate"),
                ("clients=2", "latency p50"),
                ("clients=2", "latency p99"),
            ]
        );
        let rate1 = &c.metrics[0];
        let b1 = rate1.sides[1].as_ref().unwrap();
        assert_eq!((b1.n, b1.mean), (3, 80.0));
        let v = b1.vs_baseline.as_ref().unwrap();
        assert!(v.significant && v.change == "worse", "{v:?}");
        assert!((v.pct.unwrap() + 20.0).abs() < 1e-9);
        let rate2 = c.metrics[4].sides[1].as_ref().unwrap().vs_baseline.as_ref().unwrap();
        assert!(!rate2.significant && rate2.change == "same", "{rate2:?}");
        // Errors: every iteration counts, 0 where the errno did not occur; the baseline has only zeros.
        let e = &c.metrics[3];
        assert_eq!(e.sides[0].as_ref().unwrap().values, [0.0, 0.0, 0.0]);
        assert_eq!(e.sides[1].as_ref().unwrap().values, [2.0, 0.0, 1.0]);
        assert_eq!(e.better, Better::Lower);
        assert_eq!(c.errors_by_errno[0].key, "ENOMEM");
        assert_eq!(c.errors_by_errno[0].counts, [0, 3]);
        assert_eq!(c.failures_by_order[0].key, "4");
        assert_eq!(c.failures_by_order[0].counts, [1, 1]);
        assert_eq!(c.compaction[0].deltas, [Some(3), Some(3)]);
        assert_eq!(c.compaction[1].deltas, [None, None]);
        assert_eq!(c.fragment[1].target_text, "no free block of order ≥ 4 (64K), 1.00 MiB free below it");
        // Different kernels on one host: no warning, a note.
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.notes.iter().any(|n| n.contains("kernel 6.18 vs 6.19")), "{:?}", c.notes);
    }

    /// An A/B's side: rounds pooled, one sample per round (its iterations' mean), failures and
    /// compaction summed, iterations renumbered so rounds stay apart.
    #[test]
    fn pooled_rounds_give_one_sample_per_round() {
        let round = |label: &str, rates: [f64; 2], enomem: u64| {
            fake(
                label,
                CONFIG,
                "6.18",
                vec![record("clients=1", 1, rates[0], 50, enomem), record("clients=1", 2, rates[1], 50, 0)],
            )
        };
        let dir = PathBuf::from("/results/ab/base-*");
        let base =
            RunData::pool("base", &dir, vec![round("b1", [100.0, 102.0], 0), round("b2", [98.0, 96.0], 0)])
                .unwrap();
        assert_eq!(base.round_starts, [3]);
        let iterations: Vec<u32> = base.run.workloads.iter().map(|w| w.iteration).collect();
        assert_eq!(iterations, [1, 2, 3, 4]);
        assert_eq!(base.run.failures.len(), 2);
        let (source, deltas) = base.compaction.clone().unwrap();
        assert_eq!(deltas["compact_stall"], 6);
        assert_eq!(source, "baseline.json → final.json, summed over rounds");
        let patched = RunData::pool(
            "patched",
            &dir,
            vec![round("p1", [80.0, 82.0], 3), round("p2", [79.0, 81.0], 1), round("p3", [81.0, 83.0], 0)],
        )
        .unwrap();
        assert_eq!(patched.round_starts, [3, 5]);
        assert_eq!(patched.compaction.as_ref().unwrap().0, "baseline.json → final.json, summed over rounds");
        let c = compare(&[base, patched]).unwrap();
        let rate = &c.metrics[0];
        assert_eq!(rate.metric, "rate");
        assert_eq!(rate.sides[0].as_ref().unwrap().values, [101.0, 97.0]);
        assert_eq!(rate.sides[1].as_ref().unwrap().values, [81.0, 80.0, 82.0]);
        let errors = c.metrics.iter().find(|m| m.metric == "errors ENOMEM").unwrap();
        assert_eq!(errors.sides[1].as_ref().unwrap().values, [1.5, 0.5, 0.0]);
        assert!(c.notes.iter().any(|n| n.contains("patched: 3 rounds pooled")), "{:?}", c.notes);
        // A round of another config is refused, naming the difference.
        let other = fake("o", &CONFIG.replace("1s", "2s"), "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let e = RunData::pool("base", &dir, vec![round("b1", [1.0, 1.0], 0), other]).unwrap_err();
        assert!(e.to_string().contains("its rounds ran different configs"), "{e}");
    }

    #[test]
    fn same_kernel_warns_and_fragment_difference_is_noted() {
        let a = fake("A", CONFIG, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let b = fake("B", CONFIG, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let c = compare(&[a.clone(), b]).unwrap();
        assert!(c
            .warnings
            .iter()
            .any(|w| w.contains("same kernel on both sides: this compares runs, not kernels")));
        let unfragmented = CONFIG.replace("[fragment]\nmax_free_order = 4\n", "");
        let b = fake("B", &unfragmented, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let c = compare(&[a, b]).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.notes.iter().any(|n| n.contains("compares memory states")), "{:?}", c.notes);
    }

    /// `fraglab run --baseline` keeps [fragment] in the stored config and writes `"fragment": null`.
    #[test]
    fn a_baseline_run_of_the_same_config_is_a_different_memory_state() {
        let a = fake("A", CONFIG, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let mut b = fake("B", CONFIG, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        b.run.record.fragment = None;
        let c = compare(&[a, b.clone()]).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.notes.iter().any(|n| n.contains("different [fragment]: this compares memory states")));
        assert_eq!(c.fragment[1].target_text, "none (not fragmented)");
        // Two baseline runs: the same memory state, runs compared.
        let mut a = b.clone();
        a.label = "A".into();
        let c = compare(&[a, b]).unwrap();
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("this compares runs, not kernels") && w.contains("neither fragmented")),
            "{:?}",
            c.warnings
        );
    }

    const TRIGGER: &str = "[run]\nname = \"t\"\n[fragment]\nmax_free_order = 4\n\n[[workload]]\nkind = \"trigger\"\ntrigger = \"pipe-resize\"\nbytes = \"64MiB\"\nrepeat = 10\n";

    /// A trigger iteration: `failed` of 10 calls failed with ENOMEM.
    fn trigger(iteration: u32, calls_per_sec: f64, p50: u64, failed: u64) -> Value {
        let errors = if failed > 0 {
            json!([{"errno": "ENOMEM", "code": 12, "count": failed, "first_seen_s": 0.01}])
        } else {
            json!([])
        };
        json!({"point": "-", "sysctls": [], "iteration": iteration, "index": 0, "result": {
            "kind": "trigger pipe-resize", "ops_per_sec": calls_per_sec, "ok": 10 - failed, "failed": failed,
            "latency_us": {"count": 10, "mean": 1.0, "min": 1, "p50": p50, "p90": p50, "p99": p50, "p999": p50, "max": p50},
            "errors": errors, "details": {"calls": 10}}})
    }

    #[test]
    fn trigger_rate_and_latency_are_not_compared_when_the_failed_share_differs() {
        let frag = fake(
            "A",
            TRIGGER,
            "6.18",
            (1..=3).map(|i| trigger(i, 3000.0 + i as f64, 90 + i as u64, 10)).collect(),
        );
        let base = fake(
            "B",
            TRIGGER,
            "6.18",
            (1..=3).map(|i| trigger(i, 900.0 + i as f64, 800 + i as u64, 0)).collect(),
        );
        let c = compare(&[base.clone(), frag.clone()]).unwrap();
        let why = "B: 0 of 30 failed, A: 30 of 30 failed";
        let row = |m: &str| c.metrics.iter().find(|r| r.metric == m).unwrap();
        for m in ["rate", "latency p50", "latency p99"] {
            let s = row(m).sides[1].as_ref().unwrap();
            assert_eq!(s.not_comparable.as_deref(), Some(why), "{m}");
            assert!(s.vs_baseline.is_none(), "{m}: {s:?}");
            assert_eq!(s.n, 3, "the values are still shown");
        }
        // The failure change itself is compared, and said first.
        let e = row("errors ENOMEM").sides[1].as_ref().unwrap();
        assert!(e.not_comparable.is_none());
        assert!(e.vs_baseline.as_ref().unwrap().significant);
        assert!(
            c.warnings.iter().any(|w| w.starts_with("#1 trigger pipe-resize at point -: ")
                && w.contains(why)
                && w.contains("not compared")),
            "{:?}",
            c.warnings
        );
        // The same share of failed calls on both sides: compared as before.
        let frag2 = fake(
            "B",
            TRIGGER,
            "6.19",
            (1..=3).map(|i| trigger(i, 2000.0 + i as f64, 80 + i as u64, 10)).collect(),
        );
        let c = compare(&[frag, frag2]).unwrap();
        assert!(c.metrics.iter().all(|r| r.sides[1].as_ref().unwrap().not_comparable.is_none()));
        let rate = c.metrics[0].sides[1].as_ref().unwrap().vs_baseline.as_ref().unwrap();
        assert!(rate.significant && rate.change == "worse", "{rate:?}");
        assert!(!c.warnings.iter().any(|w| w.contains("failed")), "{:?}", c.warnings);
    }

    #[test]
    fn network_rates_count_successes_and_stay_compared_when_failures_differ() {
        let a = fake("A", CONFIG, "6.18", (1..=3).map(|i| record("clients=1", i, 100.0, 50, 0)).collect());
        let b = fake(
            "B",
            CONFIG,
            "6.18",
            (1..=3).map(|i| record("clients=1", i, 80.0 + i as f64, 50, 2)).collect(),
        );
        let c = compare(&[a, b]).unwrap();
        let rate = c.metrics[0].sides[1].as_ref().unwrap();
        assert!(rate.not_comparable.is_none() && rate.vs_baseline.as_ref().unwrap().significant);
        assert!(
            c.notes
                .iter()
                .any(|n| n.contains("#1 tcp-rr at point clients=1: A: 0 of 30 failed, B: 6 of 36 failed")),
            "{:?}",
            c.notes
        );
    }

    #[test]
    fn configs_that_measure_different_things_are_refused() {
        let a = fake("A", CONFIG, "6.18", vec![]);
        let cases = [
            (
                CONFIG.replace("clients = [1, 2]", "clients = [1, 4]"),
                "[sweep] clients: [1,2] in A vs [1,4] in B",
            ),
            (
                CONFIG.replace("duration = \"1s\"", "duration = \"2s\""),
                "[[workload]] #1 (tcp-rr) duration: \"1s\" in A vs \"2s\" in B",
            ),
            (
                CONFIG.replace("tcp-rr", "tcp-crr"),
                "[[workload]] #1 kind: \"tcp-rr\" in A vs \"tcp-crr\" in B",
            ),
            (CONFIG.replace("[sweep]\nclients = [1, 2]\n", ""), "[sweep] clients: [1,2] in A vs absent in B"),
            (
                CONFIG.to_string() + "[[workload]]\nkind = \"tcp-stream\"\n",
                "[[workload]]: 1 in A (tcp-rr) vs 2 in B (tcp-rr, tcp-stream)",
            ),
        ];
        for (config, want) in cases {
            let b = fake("B", &config, "6.19", vec![]);
            let e = format!("{:#}", compare(&[a.clone(), b]).unwrap_err());
            assert!(e.contains(want), "want {want:?} in: {e}");
            assert!(e.contains("cannot be compared"), "{e}");
        }
        // What may differ: [run], [probe], [expect], [fragment]; defaults written out count as equal.
        let ok = CONFIG
            .replace("name = \"t\"", "name = \"patched\"\niterations = 5")
            .replace("max_free_order = 4", "max_free_order = 6")
            .replace("duration = \"1s\"", "duration = \"1s\"\nclients = 1");
        let b = fake("B", &(ok + "[probe]\ninterval = \"2s\"\n"), "6.19", vec![]);
        assert!(config_differences(&a, &b).is_empty(), "{:?}", config_differences(&a, &b));
    }

    /// A run recorded before the results schema against one recorded after, of one config whose
    /// sweep values are text that reads as a number (`["0", "1"]`): the schema-1 labels come back
    /// as the config's own values, so every point lines up and is compared.
    #[test]
    fn a_schema_1_run_lines_up_with_a_schema_2_run_of_the_same_config() {
        let config = "[run]\nname = \"t\"\n\n[[workload]]\nkind = \"tcp-rr\"\nduration = \"1s\"\n\n\
                      [sweep]\nsysctl.\"net.core.high_order_alloc_disable\" = [\"0\", \"1\"]\n";
        let axis = "sysctl.net.core.high_order_alloc_disable";
        let old: Vec<Value> = ["0", "1"]
            .iter()
            .flat_map(|v| (1..=2).map(move |i| record(&format!("{axis}={v}"), i, 100.0 + i as f64, 50, 0)))
            .collect();
        let a = fake("A", config, "6.1", old);
        let mut b = fake("B", config, "6.18", vec![]);
        // B as schema 2 wrote it: its stored plan, points as objects with the config's text values.
        b.plan_from_text = false;
        b.run.workloads = ["0", "1"]
            .iter()
            .flat_map(|v| {
                (1..=2).map(move |i| {
                    let mut r = record("-", i, 90.0 + i as f64, 50, 0);
                    r["point"] = json!({ axis: v });
                    serde_json::from_value(r).unwrap()
                })
            })
            .collect();
        let c = compare(&[a, b]).unwrap();
        let rates: Vec<&fraglab_report::compare::MetricRow> =
            c.metrics.iter().filter(|m| m.metric == "rate").collect();
        assert_eq!(rates.len(), 2, "two points, not four: {rates:#?}");
        for r in rates {
            assert!(r.sides.iter().all(Option::is_some), "{} lacks a side: {r:#?}", r.point);
        }
        assert!(
            c.notes.iter().any(|n| n.contains("A (/results/A) was recorded in results schema 1")),
            "{:?}",
            c.notes
        );
    }
}
