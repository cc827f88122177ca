//! The summary a run prints, read back from its results directory (so it is also what a later
//! reader of the directory would see): like the seeds' tables, one row per sweep point and workload.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use fraglab_fragmenter::describe;
use fraglab_probe::fallback::Outcome;
use fraglab_results::load::{Run, Samples};
use fraglab_results::point::Point;
use fraglab_results::record::RunRecord;
use fraglab_results::workload::WorkloadResult;

use crate::mattered;

/// The main number of a workload result and its unit: throughput, else rate, else successes.
pub fn metric(result: &WorkloadResult) -> (f64, &'static str) {
    if let Some(t) = result.throughput_mbit {
        (t, "Mbit/s")
    } else if let Some(r) = result.ops_per_sec {
        (r, "ops/s")
    } else {
        (result.ok as f64, "ok")
    }
}

/// Mean and sample standard deviation.
pub fn mean_stddev(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// One summary row's values, unit and errno counts.
type Row = (Vec<f64>, &'static str, BTreeMap<String, u64>);

/// `fragment: budget 512.00 MiB, no free block of order ≥ 4 (64K), 480.00 MiB free below it; pin
/// mlock`, and the scaling of a profile target.
fn fragment_line(f: &fraglab_fragmenter::Status) -> String {
    let mut o = format!("fragment: {}, {}", describe::extent(f.budget), describe::target(&f.target));
    o += &format!("; pin {}", describe::pin(f.pin));
    o += "\n";
    if let Some(s) = describe::scaled_profile(&f.target, f.scale, f.budget, &f.planned, &f.missing) {
        o += &format!("  {s}\n");
    }
    o
}

/// The summary of the run in `dir`.
pub fn render(dir: &Path) -> Result<String> {
    Ok(render_run(&Run::load_with(dir, Samples::Ends)?))
}

/// The summary of a run read.
pub fn render_run(run: &Run) -> String {
    let r: &RunRecord = &run.record;
    let mut o = String::new();
    o += &format!(
        "{} on {} — {}; verdict: {} ({})\n",
        r.name,
        r.kernel_release,
        r.status,
        r.verdict.map_or("none", |v| v.name()),
        r.reason
    );
    if let Some(f) = &r.fragment {
        o += &fragment_line(f);
        o += &format!("  planned free blocks per order: {}\n", describe::counts(&f.planned));
        o += &format!("  intact at the end:             {}\n", describe::counts(&f.intact));
        for z in describe::zone_cuts(&f.zones) {
            o += &format!("  {z}\n");
        }
        if let Some(t) = describe::traded(f.traded_bytes) {
            o += &format!("  {t}\n");
        }
        let zones: Vec<Vec<String>> = f
            .buddyinfo_now
            .zones
            .iter()
            .map(|z| {
                let mut row = vec![format!("buddyinfo Node {}, zone {}", z.node, z.zone)];
                row.extend(z.free.iter().map(u64::to_string));
                row
            })
            .collect();
        let mut right = vec![false];
        right.extend(std::iter::repeat_n(true, f.buddyinfo_now.nr_orders()));
        for line in fraglab_stdio::columns(&zones, &right) {
            o += &format!("  {line}\n");
        }
        if let Some(k) = &f.keeping {
            o += &format!("  {}\n", describe::keeping(k));
        }
        for (f, when) in [(&f.fidelity_at_hold, "when the hold began"), (&f.fidelity, "at the release")] {
            for line in f.iter().flat_map(|f| describe::fidelity(f, when)) {
                o += &format!("  {line}\n");
            }
        }
        let windows: Vec<_> =
            run.workloads.iter().filter_map(|w| w.target.as_ref()?.fidelity.as_ref()).collect();
        if !windows.is_empty() {
            let off = windows.iter().filter(|f| !f.within).count();
            o += &format!(
                "  profile fidelity at the end of each window: within in {} of {}\n",
                windows.len() - off,
                windows.len()
            );
        }
        if let Some((held, of)) = RunRecord::windows_held(&run.workloads) {
            o += &format!("  target held in {held} of {of} workload windows\n");
        }
        for w in &run.workloads {
            let Some(t) = w.target.as_ref().filter(|t| !t.held) else { continue };
            o += &format!(
                "    lost in {} {} #{}: {:.3} s of {:.3} s ({})\n",
                w.result.kind,
                w.point,
                w.iteration,
                t.lost_s,
                t.window_s,
                t.worst.as_deref().unwrap_or("")
            );
            if let Some(f) = t.fidelity.as_ref().filter(|f| !f.within) {
                o += &format!("      off its profile when it ended: {}\n", f.off_text());
            }
        }
    }
    // (point, kind) → values; printed in sweep order (see `Point::by_value`).
    let mut table: BTreeMap<(Point, String), Row> = BTreeMap::new();
    for w in &run.workloads {
        let (value, unit) = metric(&w.result);
        let entry = table
            .entry((w.point.clone(), w.result.kind.clone()))
            .or_insert_with(|| (Vec::new(), unit, BTreeMap::new()));
        entry.0.push(value);
        for e in &w.result.errors {
            *entry.2.entry(e.errno.clone()).or_default() += e.count;
        }
    }
    if !table.is_empty() {
        let mut rows: Vec<_> = table.iter().collect();
        rows.sort_by(|a, b| a.0 .0.by_value(&b.0 .0).then_with(|| a.0 .1.cmp(&b.0 .1)));
        let mut cells =
            vec![["point", "workload", "n", "unit", "mean", "stddev", "errors"].map(String::from).to_vec()];
        for ((point, kind), (values, unit, errors)) in rows {
            let (mean, sd) = mean_stddev(values);
            let errs = errors.iter().map(|(e, n)| format!("{e}×{n}")).collect::<Vec<_>>().join(" ");
            cells.push(vec![
                point.label(),
                kind.clone(),
                values.len().to_string(),
                unit.to_string(),
                format!("{mean:.2}"),
                format!("{sd:.2}"),
                errs,
            ]);
        }
        o += "\n";
        for line in fraglab_stdio::columns(&cells, &[false, false, true, true, true, true, false]) {
            o += &line;
            o += "\n";
        }
    }
    o += &skmem_table(run);
    let failures: Vec<_> = run.failed().collect();
    let mut by_order: BTreeMap<u32, (u64, BTreeMap<String, u64>)> = BTreeMap::new();
    for f in &failures {
        let e = by_order.entry(f.order).or_default();
        e.0 += f.count();
        *e.1.entry(f.comm.clone()).or_default() += f.count();
    }
    if by_order.is_empty() {
        o += "\nkernel: no failed allocation caught\n";
    } else {
        o += "\nkernel: failed allocations by order\n";
        for (order, (n, comms)) in &by_order {
            let c = comms.iter().map(|(c, n)| format!("{c}×{n}")).collect::<Vec<_>>().join(" ");
            o += &format!("  order {order}: {n} ({c})\n");
        }
        o += "kernel: failed allocations by caller (first function outside the allocator ← its caller)\n";
        let groups = mattered::groups(failures.iter().copied());
        for (outcome, heading) in [
            (Outcome::Surfaced, "surfaced (no known fallback: the caller got the failure)"),
            (Outcome::FellBack, "fell back (the kernel had a way around it)"),
        ] {
            let mut of = groups.iter().filter(|g| g.outcome == outcome).peekable();
            if of.peek().is_some() {
                o += &format!("  {heading}\n");
            }
            for g in of {
                o += &format!("    {}\n", g.describe());
            }
        }
        let spans: Vec<mattered::Span> = r
            .phases
            .iter()
            .filter_map(|p| {
                let window = p.workload.as_ref()?;
                Some(mattered::Span {
                    window,
                    start_s: p.start_ns as f64 / 1e9,
                    end_s: p.end_ns as f64 / 1e9,
                })
            })
            .collect();
        let ties = mattered::ties(&spans, &run.workloads, &failures);
        if !ties.is_empty() {
            o += "kernel: the workloads' errors and the surfaced failures caught in the same window\n";
            for t in ties {
                o += &format!("  {}\n", t.describe());
            }
        }
    }
    for e in &r.errors {
        o += &format!("error: {e}\n");
    }
    for s in &r.sysctls_restored {
        o += &format!("restored {s}\n");
    }
    for n in &run.notes {
        o += &format!("note: {n}\n");
    }
    o
}

/// The workloads' own sockets, per point and kind (means over the iterations): how many, what one
/// kept as forward allocation (mean and the largest), and the peak of what all of them held beside
/// the protocol's memory_allocated. Empty when no workload sampled its sockets.
fn skmem_table(run: &Run) -> String {
    let mut table: BTreeMap<(Point, String), Vec<&fraglab_results::skmem::Summary>> = BTreeMap::new();
    for w in &run.workloads {
        if let Some(m) = w.result.skmem.as_ref().filter(|m| m.samples > 0) {
            table.entry((w.point.clone(), w.result.kind.clone())).or_default().push(&m.summary);
        }
    }
    if table.is_empty() {
        return String::new();
    }
    let mut rows: Vec<_> = table.iter().collect();
    rows.sort_by(|a, b| a.0 .0.by_value(&b.0 .0).then_with(|| a.0 .1.cmp(&b.0 .1)));
    let mean = |v: &[&fraglab_results::skmem::Summary],
                f: &dyn Fn(&fraglab_results::skmem::Summary) -> f64| {
        v.iter().map(|s| f(s)).sum::<f64>() / v.len() as f64
    };
    let size = |v: f64| fraglab_results::skmem::signed_size(v.round() as i64);
    let head = ["point", "workload", "sockets", "f/socket", "f max", "held peak", "proto mem peak"];
    let mut cells = vec![head.map(String::from).to_vec()];
    cells.extend(rows.iter().map(|((point, kind), v)| {
        vec![
            point.label(),
            kind.clone(),
            format!("{:.0}", mean(v, &|s| s.sockets as f64)),
            size(mean(v, &|s| s.per_socket_mean.f)),
            size(mean(v, &|s| s.per_socket_max.f as f64)),
            size(mean(v, &|s| s.held_max as f64)),
            if v.iter().all(|s| s.proto_mem_max_bytes.is_some()) {
                size(mean(v, &|s| s.proto_mem_max_bytes.unwrap_or(0) as f64))
            } else {
                "-".into()
            },
        ]
    }));
    let mut o =
        String::from("\nsocket memory (skmem of the workloads' own sockets, means over iterations)\n");
    for line in fraglab_stdio::columns(&cells, &[false, false, true, true, true, true, true]) {
        o += &line;
        o += "\n";
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A results directory: a real run.json (schema 1, from a 6.1 guest) given the sctp-lo-mtu64k
    /// run's target, and the real sctp-stream capture as alloc_failures.jsonl.
    fn results_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("fraglab-summary-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mut run: serde_json::Value = serde_json::from_str(include_str!(
            "../../runner/tests/captures/pipe-highorder-6.1-fragmented/run.json"
        ))
        .unwrap();
        run["name"] = "sctp-lo-mtu64k".into();
        run["fragment"]["target"] =
            serde_json::json!({"free_bytes":503316480,"kind":"max_free_order","order":4});
        std::fs::write(d.join("run.json"), run.to_string()).unwrap();
        std::fs::write(
            d.join("alloc_failures.jsonl"),
            include_str!("../../runner/tests/captures/alloc_failures-sctp-stream-6.1.jsonl"),
        )
        .unwrap();
        d
    }

    #[test]
    fn failures_by_caller_one_name_per_task_and_target_in_words() {
        let d = results_dir("caller");
        let out = render(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert!(
            out.contains(
                "fragment: whole machine, no free block of order ≥ 4 (64K), 480.00 MiB free below it; pin mlock\n"
            ),
            "{out}"
        );
        // pid 93 is `<...>` once and `fraglab` once in the capture: one task, one name. Pids 87
        // and 36 have no name anywhere, so they stay `<...>`.
        assert!(out.contains("  order 4: 2 (fraglab×2)\n"), "{out}");
        assert!(out.contains("  order 9: 2 (<...>×2)\n"), "{out}");
        // The SCTP data chunk's skb surfaced (sendmsg's ENOMEM); both huge pages fell back.
        assert!(
            out.contains(
                "  surfaced (no known fallback: the caller got the failure)\n    order 4 ×2 from __alloc_skb ← \
                 _sctp_make_chunk, then sctp_make_datafrag_empty ← sctp_datamsg_from_user ← \
                 sctp_sendmsg_to_asoc ← sctp_sendmsg\n  fell back (the kernel had a way around it)\n"
            ),
            "{out}"
        );
        let thp = "(THP: the fault maps base pages, khugepaged tries again later)";
        assert!(
            out.contains(
                "    order 9 ×1 from do_huge_pmd_anonymous_page ← __handle_mm_fault, then handle_mm_fault"
            ),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "    order 9 ×1 from alloc_charge_hpage ← collapse_huge_page, then hpage_collapse_scan_pmd ← \
                 khugepaged {thp}\n"
            )),
            "{out}"
        );
    }

    #[test]
    fn mean_and_sample_stddev() {
        // Seed 000's three fragmented runs, real seconds: 14.159 15.252 15.826.
        let (m, sd) = mean_stddev(&[14.159, 15.252, 15.826]);
        assert!((m - 15.079).abs() < 1e-3, "{m}");
        assert!((sd - 0.8470).abs() < 1e-3, "{sd}");
    }
}
