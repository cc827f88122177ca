//! `fraglab report`: one self-contained HTML file (inline SVG and CSS, no script, nothing fetched)
//! from one results directory, or several for an A/B comparison: what memory did over the run
//! (buddyinfo heatmap, free and available memory, compaction counters), what the workloads measured
//! against the sweep (throughput, latency percentiles), what failed and when, and which slab caches
//! leak.
//!
//! Every plotted series is a `<g class="series" data-series="…">`; every phase band a
//! `data-phase="…"`; every section a `<section id="…">` with `data-run` for per-run parts. The
//! document is well-formed XML as well as HTML.

pub mod ab;
pub mod compare;
pub mod data;
pub mod heatmap;
pub mod leak;
pub mod mattered;
pub mod summary;
pub mod svg;
pub mod sweep;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;

use data::RunData;
use fraglab_probe::fallback::Outcome;
use svg::{colour, dash, esc, fmt_num, Band, Chart, LogColour, Scale, Shape};

/// The rendered report and a few lines for the terminal.
pub struct Report {
    pub html: String,
    pub summary: Vec<String>,
}

/// Read the results directories (the first is side A) and render the report.
pub fn generate(primary: &Path, compare: &[PathBuf]) -> Result<Report> {
    let mut runs = vec![data::load(primary)?];
    for dir in compare {
        runs.push(data::load(dir)?);
    }
    Ok(render(&runs))
}

/// A, B, C, … AA.
fn letter(i: usize) -> String {
    let mut s = String::new();
    let mut n = i + 1;
    while n > 0 {
        n -= 1;
        s.insert(0, (b'A' + (n % 26) as u8) as char);
        n /= 26;
    }
    s
}

/// A side as a heading reads: `A: quickstart on 6.18.0 (quickstart-20261202T171413Z)`.
fn side_label(letter: &str, r: &RunData) -> String {
    let dir = r.dir.file_name().map(|d| d.to_string_lossy().to_string()).unwrap_or_default();
    format!("{letter}: {} on {} ({dir})", r.info.name, r.info.kernel_release)
}

/// Phase bands: every phase its own band, except the workload phases, which make one `workloads`
/// band with a mark at the start of each, and the fragment phase of a run that did not fragment.
pub fn bands(r: &RunData) -> Vec<Band> {
    let mut out: Vec<Band> = Vec::new();
    for p in &r.phases {
        let secs = p.end - p.start;
        if p.workload.is_some() {
            let mark = (p.start, format!("{} ({secs:.2} s)", p.name));
            match out.last_mut() {
                Some(b) if b.name == "workloads" => {
                    b.end = p.end;
                    b.marks.push(mark);
                    b.title = format!("workloads: {} runs, {:.1} s", b.marks.len(), b.end - b.start);
                }
                _ => out.push(Band {
                    name: "workloads".into(),
                    start: p.start,
                    end: p.end,
                    title: format!("workloads: 1 run, {secs:.1} s"),
                    fill: "#dbe9f6",
                    marks: vec![mark],
                }),
            }
        } else if p.name == "fragment" && r.info.fragment.is_none() {
            // A baseline run passes through the phase without fragmenting anything.
            continue;
        } else {
            let fill = match p.name.as_str() {
                "fragment" => "#fde2c8",
                "release" => "#d9f0d3",
                _ => "#efefef",
            };
            out.push(Band {
                name: p.name.clone(),
                start: p.start,
                end: p.end,
                title: format!("{} ({secs:.2} s)", p.name),
                fill,
                marks: vec![],
            });
        }
    }
    out
}

const CSS: &str = r#"
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: #1d1d1d; margin: 0; background: #fafafa; }
main { max-width: 1140px; margin: 0 auto; padding: 8px 20px 40px; background: #fff; }
h1 { font-size: 22px; margin: 16px 0 4px; }
h2 { font-size: 18px; margin: 30px 0 6px; padding-top: 8px; border-top: 2px solid #e4e4e4; }
h3 { font-size: 15px; margin: 18px 0 4px; }
p.help { color: #444; margin: 4px 0 10px; max-width: 900px; }
p.none { color: #666; font-style: italic; }
nav { font-size: 13px; margin: 6px 0 0; }
nav a { margin-right: 12px; color: #2a5db0; text-decoration: none; }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 12.5px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.leak td { background: #fff1f0; }
svg.chart { display: block; max-width: 100%; height: auto; margin: 6px 0 12px; }
svg.spark { vertical-align: middle; }
.verdict-reproduced { color: #b3261e; font-weight: 600; }
.verdict-not-reproduced { color: #1e7b34; font-weight: 600; }
.verdict-could-not-test { color: #8a6d00; font-weight: 600; }
ul.notes { color: #6b4e00; }
code { font-size: 12px; background: #f4f4f4; padding: 0 3px; }
"#;

/// The whole document.
pub fn render(runs: &[RunData]) -> Report {
    let letters: Vec<String> = (0..runs.len()).map(letter).collect();
    let multi = runs.len() > 1;
    let refs: Vec<&RunData> = runs.iter().collect();
    let mut summary = Vec::new();
    let title = if multi {
        format!(
            "fraglab report: {}",
            runs.iter().map(|r| r.info.name.as_str()).collect::<Vec<_>>().join(" vs ")
        )
    } else {
        format!("fraglab report: {}", runs[0].info.name)
    };
    let mut b = String::new();
    b += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>";
    b += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>";
    let _ = write!(b, "<title>{}</title><style>{CSS}</style></head><body><main>", esc(&title));
    let _ = write!(b, "<h1>{}</h1>", esc(&title));
    b += r##"<nav><a href="#runs">runs</a><a href="#buddyinfo">buddyinfo</a><a href="#memory">memory</a><a href="#compaction">compaction</a><a href="#throughput">throughput</a><a href="#latency">latency</a><a href="#failures">failures</a><a href="#leaks">slab leaks</a></nav>"##;

    b += &runs_section(runs, &letters);

    // buddyinfo: one colour scale for every zone of every side, so colours compare.
    let max_pages = runs
        .iter()
        .flat_map(|r| &r.timeline)
        .filter_map(|s| s.snapshot.buddyinfo.as_ref())
        .flat_map(|bi| &bi.zones)
        .flat_map(|z| z.free.iter().enumerate().map(|(o, n)| heatmap::pages(*n, o)))
        .fold(0.0, f64::max);
    b += r#"<section id="buddyinfo"><h2>Free blocks per order over time (buddyinfo)</h2>"#;
    b += r#"<p class="help">One map per zone: a row per order (0 at the bottom), a column per sample. The colour is the free memory held in blocks of that order, in pages (blocks × 2<sup>order</sup>), on a log scale; white means no free block of that order at all. A high-order allocation needs a block at or above its order, so white rows from some order up are what makes it fail. Phases are marked along the top and as dashed lines; the hatched stretches had no sample (the fragment phase runs between the baseline snapshot and the first background sample).</p>"#;
    for (i, r) in runs.iter().enumerate() {
        b += &side_open(multi, &letters[i], r, "buddyinfo");
        let zones = zone_series(r);
        if zones.is_empty() {
            b += r#"<p class="none">buddyinfo was not sampled in this run.</p>"#;
        }
        let orders = zones.iter().flat_map(|z| z.columns.iter().map(|c| c.1.len())).max().unwrap_or(0);
        let bands = bands(r);
        for (zi, z) in zones.iter().enumerate() {
            let id = format!("heat-{}-{zi}", letters[i]);
            b += &heatmap::render(&id, z, orders, LogColour { max: max_pages }, &bands, r.t_end());
        }
        b += "</div>";
    }
    b += "</section>";

    b += r#"<section id="memory"><h2>Free and available memory</h2><p class="help">From /proc/meminfo at every sample (the <code>free</code> table): <em>free</em> is MemFree, memory in no use at all; <em>available</em> is MemAvailable, the kernel's estimate of what could be allocated without swapping (free plus reclaimable cache). The fragmenter takes memory in the fragment phase and gives it back in the release phase.</p>"#;
    for (i, r) in runs.iter().enumerate() {
        b += &side_open(multi, &letters[i], r, "memory");
        b += &memory_chart(&letters[i], r);
        b += "</div>";
    }
    b += "</section>";

    b += r#"<section id="compaction"><h2>Compaction counters</h2><p class="help">/proc/vmstat counters accumulated since the baseline snapshot (before the fragment phase): the background samples' <code>vmstat_delta</code> plus what changed between the baseline and the first sample. <em>compact_stall</em> counts allocations that entered direct compaction; <em>compact_fail</em> and <em>compact_success</em> how those ended; <em>pgmigrate_success</em> the pages moved by compaction (and other migration).</p>"#;
    for (i, r) in runs.iter().enumerate() {
        b += &side_open(multi, &letters[i], r, "compaction");
        b += &compaction_charts(&letters[i], r);
        b += "</div>";
    }
    b += "</section>";

    b += &throughput_section(&refs, &letters, &mut summary);
    b += &latency_section(&refs, &letters);
    b += &forward_alloc_section(&refs, &letters);

    b += r#"<section id="failures"><h2>Failures</h2><p class="help">Two sources on one time line. <em>Workload errnos</em>: each errno a workload saw (ENOMEM, ENOBUFS, ECONNREFUSED, …), placed where it was first seen (the workload's start plus its <code>first_seen_s</code>), sized by its count. <em>Kernel</em>: failed page allocations caught by the tracefs catcher (<code>mm_page_alloc</code> with no page), one row per order.</p>"#;
    for (i, r) in runs.iter().enumerate() {
        b += &side_open(multi, &letters[i], r, "failures");
        b += &failures(&letters[i], r, &mut summary);
        b += "</div>";
    }
    b += "</section>";

    b += r#"<section id="leaks"><h2>Slab caches that grow and stay grown</h2><p class="help">From the slabinfo samples, aligned to the run's rounds (one sweep point at one iteration). <em>Before</em> is the lowest active-object count sampled before the first round; the level after each round is the lowest sampled between its end and the end of the next (objects in flight are freed by then, leaked ones are not). A cache is a leak candidate when it grew by more than its noise allowance (one slab or 1 % of <em>before</em>) in at least half of the rounds, never fell back by more than that, ended at least two allowances up, and was still at least half of that growth up after the run. Ranked by growth in bytes (objects × object size). The chart shows each candidate's active objects minus <em>before</em>; the marks are round starts.</p>"#;
    for (i, r) in runs.iter().enumerate() {
        b += &side_open(multi, &letters[i], r, "leaks");
        b += &leak_section(&letters[i], r, &mut summary);
        b += "</div>";
    }
    b += "</section>";

    let _ = write!(
        b,
        r#"<p class="help">Generated by fraglab {} from {}.</p></main></body></html>"#,
        env!("CARGO_PKG_VERSION"),
        esc(&runs.iter().map(|r| r.dir.display().to_string()).collect::<Vec<_>>().join(", "))
    );
    Report { html: b, summary }
}

fn side_open(multi: bool, letter: &str, r: &RunData, section: &str) -> String {
    let mut o = format!(r#"<div class="side" data-run="{}" data-section="{section}">"#, esc(letter));
    if multi {
        let _ = write!(o, "<h3>{}</h3>", esc(&side_label(letter, r)));
    }
    o
}

fn runs_section(runs: &[RunData], letters: &[String]) -> String {
    let mut o = String::from(
        r#"<section id="runs"><h2>Runs</h2><table><tr><th>side</th><th>run</th><th>kernel</th><th>host</th><th>started</th><th>status</th><th>verdict</th><th>reason</th></tr>"#,
    );
    for (r, l) in runs.iter().zip(letters) {
        let verdict = r.info.verdict.map_or("none".to_string(), |v| v.to_string());
        let _ = write!(
            o,
            r#"<tr data-run="{}"><td>{}</td><td>{}<br/><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="verdict-{}">{}</td><td>{}</td></tr>"#,
            esc(l),
            esc(l),
            esc(&r.info.name),
            esc(&r.dir.display().to_string()),
            esc(&r.info.kernel_release),
            esc(&r.info.host),
            esc(&r.info.started),
            esc(r.info.status.name()),
            esc(&verdict),
            esc(&verdict),
            esc(&r.info.reason)
        );
    }
    o += "</table>";
    for (r, l) in runs.iter().zip(letters) {
        let prefix = if runs.len() > 1 { format!("{l}: ") } else { String::new() };
        if let Some(d) = &r.info.description {
            let _ = write!(o, "<p>{}{}</p>", esc(&prefix), esc(d));
        }
        if let Some(f) = &r.info.fragment {
            let _ = write!(
                o,
                "<p>{}fragment target <code>{}</code>; free blocks planned per order <code>{}</code>, intact at the end <code>{}</code>.</p>",
                esc(&prefix),
                esc(&fraglab_fragmenter::describe::target(&f.target)),
                esc(&fraglab_fragmenter::describe::counts(&f.planned)),
                esc(&fraglab_fragmenter::describe::counts(&f.intact))
            );
        } else {
            let _ = write!(o, "<p>{}no fragmentation (a baseline run).</p>", esc(&prefix));
        }
        let notes: Vec<String> =
            r.info.errors.iter().map(|e| format!("error: {e}")).chain(r.notes.iter().cloned()).collect();
        if !notes.is_empty() {
            o += r#"<ul class="notes">"#;
            for n in notes {
                let _ = write!(o, "<li>{}{}</li>", esc(&prefix), esc(&n));
            }
            o += "</ul>";
        }
    }
    o += "</section>";
    o
}

/// buddyinfo per zone, in the order the kernel lists zones.
fn zone_series(r: &RunData) -> Vec<heatmap::ZoneSeries> {
    let nodes: std::collections::BTreeSet<u32> = r
        .timeline
        .iter()
        .filter_map(|s| s.snapshot.buddyinfo.as_ref())
        .flat_map(|b| b.zones.iter().map(|z| z.node))
        .collect();
    let mut out: Vec<(u32, String, heatmap::ZoneSeries)> = Vec::new();
    for s in &r.timeline {
        let Some(bi) = &s.snapshot.buddyinfo else { continue };
        for z in &bi.zones {
            let i = match out.iter().position(|(n, name, _)| *n == z.node && *name == z.zone) {
                Some(i) => i,
                None => {
                    let label =
                        if nodes.len() > 1 { format!("Node {} {}", z.node, z.zone) } else { z.zone.clone() };
                    out.push((z.node, z.zone.clone(), heatmap::ZoneSeries { label, columns: vec![] }));
                    out.len() - 1
                }
            };
            out[i].2.columns.push((s.t, z.free.clone()));
        }
    }
    out.into_iter().map(|(_, _, z)| z).collect()
}

fn time_scale(r: &RunData) -> Scale {
    Scale::Linear { min: 0.0, max: r.t_end() }
}

fn memory_chart(letter: &str, r: &RunData) -> String {
    let pts: Vec<(f64, &fraglab_probe::meminfo::FreeTable)> =
        r.timeline.iter().filter_map(|s| s.snapshot.free.as_ref().map(|f| (s.t, f))).collect();
    if pts.is_empty() {
        return r#"<p class="none">meminfo was not sampled in this run.</p>"#.into();
    }
    let gib = |kib: u64| kib as f64 / (1024.0 * 1024.0);
    let y = Scale::linear(pts.iter().flat_map(|(_, f)| [gib(f.free), gib(f.available), gib(f.total)]), true);
    let mut c = Chart::new(
        &format!("memory-{letter}"),
        "free and available memory",
        time_scale(r),
        y,
        "seconds since the run started",
        "GiB",
    );
    c.bands(&bands(r));
    let markers = pts.len() <= 150;
    for (i, (name, get)) in [
        (
            "free",
            &(|f: &fraglab_probe::meminfo::FreeTable| f.free)
                as &dyn Fn(&fraglab_probe::meminfo::FreeTable) -> u64,
        ),
        ("available", &|f: &fraglab_probe::meminfo::FreeTable| f.available),
    ]
    .into_iter()
    .enumerate()
    {
        let line: Vec<(f64, f64, String)> = pts
            .iter()
            .map(|(t, f)| (*t, gib(get(f)), format!("{name} at {t:.1} s: {:.2} GiB", gib(get(f)))))
            .collect();
        c.line(name, colour(i), "", &line, None, markers);
    }
    let total = gib(pts[0].1.total);
    c.raw(&format!(
        r##"<line class="total" x1="{:.1}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#bbb" stroke-dasharray="4 3"><title>MemTotal {total:.2} GiB</title></line>"##,
        c.left,
        c.left + c.plot_w(),
        y = c.py(total)
    ));
    c.finish()
}

/// The counters the compaction charts draw besides [`compare::COMPACTION_COUNTERS`]: pages moved.
pub const MIGRATION: [&str; 1] = ["pgmigrate_success"];

fn compaction_charts(letter: &str, r: &RunData) -> String {
    let pts: Vec<(f64, &fraglab_probe::vmstat::VmCounters)> =
        r.timeline.iter().filter_map(|s| s.counters.as_ref().map(|c| (s.t, c))).collect();
    if pts.is_empty() {
        return r#"<p class="none">vmstat was not sampled in this run.</p>"#.into();
    }
    let mut o = String::new();
    for (id, title, names, unit) in [
        ("compaction", "direct compaction since the baseline", &compare::COMPACTION_COUNTERS[..], "events"),
        ("migration", "pages migrated since the baseline", &MIGRATION[..], "pages"),
    ] {
        let y = Scale::linear(
            pts.iter().flat_map(|(_, c)| names.iter().map(|n| c.get(n).unwrap_or(0) as f64)),
            true,
        );
        let mut c = Chart::new(
            &format!("{id}-{letter}"),
            title,
            time_scale(r),
            y,
            "seconds since the run started",
            unit,
        );
        c.height = 260.0;
        c.bands(&bands(r));
        let markers = pts.len() <= 150;
        for (i, name) in names.iter().enumerate() {
            let line: Vec<(f64, f64, String)> = pts
                .iter()
                .filter_map(|(t, v)| v.get(name).map(|n| (*t, n as f64, format!("{name} at {t:.1} s: {n}"))))
                .collect();
            let col = if names.len() == 1 { colour(4) } else { colour(i) };
            c.line(name, col, "", &line, None, markers);
        }
        o += &c.finish();
    }
    // The totals in words, for a reader who wants the numbers.
    if let Some((_, last)) = pts.last() {
        let words: Vec<String> = compare::COMPACTION_COUNTERS
            .iter()
            .chain(&MIGRATION)
            .map(|n| format!("{n} {}", last.get(n).map_or("–".into(), |v| v.to_string())))
            .collect();
        let _ = write!(o, r#"<p class="help">Over the whole run: {}.</p>"#, esc(&words.join(", ")));
    }
    o
}

/// The x scale of a sweep plot and its ticks: the swept values themselves when there are few (no
/// 1.5 threads), the point labels when the sweep is not numeric.
fn x_scale_for(x: &sweep::XAxis, series: &[sweep::Series]) -> (Scale, Option<Vec<(f64, String)>>) {
    match x {
        sweep::XAxis::Numeric { .. } => {
            let mut xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.x)).collect();
            xs.sort_by(f64::total_cmp);
            xs.dedup();
            let (lo, hi) =
                xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
            let scale = if lo > 0.0 && hi / lo >= 16.0 {
                Scale::Log { min: lo / 1.3, max: hi * 1.3 }
            } else {
                let pad = ((hi - lo) * 0.05).max(0.5);
                Scale::Linear { min: lo - pad, max: hi + pad }
            };
            let ticks = (xs.len() <= 16).then(|| xs.iter().map(|x| (*x, fmt_num(*x))).collect());
            (scale, ticks)
        }
        sweep::XAxis::Categorical { labels } => {
            // Without a sweep the axis title says so; the single tick needs no label.
            let ticks = labels
                .iter()
                .enumerate()
                .map(|(i, l)| (i as f64, if l == "-" { String::new() } else { l.clone() }))
                .collect();
            (Scale::Linear { min: -0.5, max: labels.len() as f64 - 0.5 }, Some(ticks))
        }
    }
}

fn x_label(x: &sweep::XAxis, s: &sweep::Stat) -> String {
    match x {
        sweep::XAxis::Numeric { key } => format!("{}={}", sweep::short_key(key), fmt_num(s.x)),
        sweep::XAxis::Categorical { .. } => s.point.clone(),
    }
}

fn throughput_section(sides: &[&RunData], letters: &[String], summary: &mut Vec<String>) -> String {
    let mut o = String::from(
        r#"<section id="throughput"><h2>Throughput against the sweep</h2><p class="help">Each workload's main number (throughput in Mbit/s, or operations per second) against the swept variable: one line per A/B side and per value of the other sweep axes, each point the mean over the iterations with ±1 sample standard deviation as the error bar. The table under each plot has the same numbers (mean ± stddev, n).</p>"#,
    );
    let mut any = false;
    for kind in sweep::kinds(sides) {
        let Some(p) = sweep::throughput(sides, letters, &kind) else { continue };
        any = true;
        let (xs, cats) = x_scale_for(&p.x, &p.series);
        let y = Scale::linear(p.series.iter().flat_map(|s| s.points.iter().map(|pt| pt.mean + pt.sd)), true);
        let id = format!("throughput-{}", kind.replace(' ', "-"));
        let mut c = Chart::new(
            &id,
            &match &p.x {
                sweep::XAxis::Numeric { key } => format!("{kind}: {} against {key}", p.unit),
                _ => format!("{kind}: {} at each sweep point", p.unit),
            },
            xs,
            y,
            &p.x.title(),
            &p.unit,
        );
        c.x_ticks = cats;
        for (i, s) in p.series.iter().enumerate() {
            let pts: Vec<(f64, f64, String)> = s
                .points
                .iter()
                .map(|pt| {
                    let t = format!(
                        "{} at {}: {} ± {} {} (n={})",
                        s.name,
                        x_label(&p.x, pt),
                        fmt_num(pt.mean),
                        fmt_num(pt.sd),
                        p.unit,
                        pt.values.len()
                    );
                    (pt.x, pt.mean, t)
                })
                .collect();
            let sd: Vec<f64> = s.points.iter().map(|pt| pt.sd).collect();
            c.line(&s.name, colour(i), dash(s.side), &pts, Some(&sd), true);
        }
        let _ = write!(o, r#"<div class="plot" data-kind="{}">"#, esc(&kind));
        o += &c.finish();
        o += &sweep_table(&p, &|pt| format!("{} ± {}", fmt_num(pt.mean), fmt_num(pt.sd)));
        o += "</div>";
        summary.push(format!("throughput: {kind} ({}), {} series", p.unit, p.series.len()));
    }
    if !any {
        o += r#"<p class="none">No workload in these runs measures a rate.</p>"#;
    }
    o += "</section>";
    o
}

/// Rows: x values; columns: series.
fn sweep_table(p: &sweep::Plot, cell: &dyn Fn(&sweep::Stat) -> String) -> String {
    let mut xs: Vec<(f64, String)> = Vec::new();
    for s in &p.series {
        for pt in &s.points {
            if !xs.iter().any(|(x, _)| *x == pt.x) {
                xs.push((pt.x, x_label(&p.x, pt)));
            }
        }
    }
    xs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut o = format!("<table><tr><th>{}</th>", esc(&p.x.title()));
    for s in &p.series {
        let _ = write!(o, r#"<th class="num">{}</th>"#, esc(&s.name));
    }
    o += "</tr>";
    for (x, label) in xs {
        let _ = write!(o, "<tr><td>{}</td>", esc(&label));
        for s in &p.series {
            match s.points.iter().find(|pt| pt.x == x) {
                Some(pt) => {
                    let _ = write!(
                        o,
                        r#"<td class="num">{} <small>(n={})</small></td>"#,
                        esc(&cell(pt)),
                        pt.values.len()
                    );
                }
                None => o += "<td></td>",
            }
        }
        o += "</tr>";
    }
    o += "</table>";
    o
}

/// The colour of a series drawn as several lines (one per percentile or statistic): one colour per
/// `base` (the series without that suffix), in order of first appearance.
fn colour_of(bases: &mut Vec<String>, base: &str) -> usize {
    bases.iter().position(|b| b == base).unwrap_or_else(|| {
        bases.push(base.to_string());
        bases.len() - 1
    })
}

/// Seed 004's plot: what each socket keeps charged but unused, against the sweep.
fn forward_alloc_section(sides: &[&RunData], letters: &[String]) -> String {
    let mut o = String::from(
        r#"<section id="skmem"><h2>Forward allocation per socket</h2><p class="help">skmem's <code>f</code> (<code>sk_forward_alloc</code>, as <code>ss -tm</code> shows it): memory charged to the protocol's pool that a socket holds but has not used yet, sampled from the workload's own sockets through sock_diag during every window. Solid: the mean over sockets of each socket's mean over the window; dashed: the largest any one socket held. Before Linux 6.0 a TCP socket could keep up to 2 MiB here; since then under a page. SCTP's dips below zero: it charges received chunks before it schedules memory for them. A point is the mean over the iterations.</p>"#,
    );
    let mut any = false;
    for kind in sweep::kinds(sides) {
        let Some(p) = sweep::forward_alloc(sides, letters, &kind) else { continue };
        any = true;
        let (xs, cats) = x_scale_for(&p.x, &p.series);
        let y = Scale::linear(p.series.iter().flat_map(|s| s.points.iter().map(|pt| pt.mean + pt.sd)), true);
        let id = format!("skmem-{}", kind.replace(' ', "-"));
        let mut c = Chart::new(
            &id,
            &format!("{kind}: forward allocation per socket (bytes)"),
            xs,
            y,
            &p.x.title(),
            "bytes",
        );
        c.x_ticks = cats;
        let mut bases: Vec<String> = Vec::new();
        for s in &p.series {
            let (di, base) = match sweep::FWD_ALLOC.iter().position(|(l, _)| s.name.ends_with(l)) {
                Some(i) => (i, s.name.trim_end_matches(sweep::FWD_ALLOC[i].0).trim_end()),
                None => (0, s.name.as_str()),
            };
            let ci = colour_of(&mut bases, base);
            let pts: Vec<(f64, f64, String)> = s
                .points
                .iter()
                .map(|pt| {
                    let t = format!(
                        "{} at {}: {} bytes (n={})",
                        s.name,
                        x_label(&p.x, pt),
                        fmt_num(pt.mean),
                        pt.values.len()
                    );
                    (pt.x, pt.mean, t)
                })
                .collect();
            c.line(&s.name, colour(ci), dash(di), &pts, None, true);
        }
        let _ = write!(o, r#"<div class="plot" data-kind="{}">"#, esc(&kind));
        o += &c.finish();
        o += &sweep_table(&p, &|pt| format!("{} ± {}", fmt_num(pt.mean), fmt_num(pt.sd)));
        o += "</div>";
    }
    if !any {
        o += r#"<p class="none">No workload in these runs sampled its sockets' memory.</p>"#;
    }
    o += "</section>";
    o
}

fn latency_section(sides: &[&RunData], letters: &[String]) -> String {
    let mut o = String::from(
        r#"<section id="latency"><h2>Latency percentiles</h2><p class="help">Latency of one operation (a transaction, a connect, a call) in microseconds, from each run's HDR histogram: p50, p90, p99 and p99.9 against the swept variable, on a log scale. A point is the mean over the iterations of each iteration's percentile. Colour tells the series apart, the dash pattern the percentile (solid p50, dashed p90, dotted p99, dash-dot p99.9).</p>"#,
    );
    let mut any = false;
    for kind in sweep::kinds(sides) {
        let Some(p) = sweep::latency(sides, letters, &kind) else { continue };
        any = true;
        let (xs, cats) = x_scale_for(&p.x, &p.series);
        let y = Scale::log(p.series.iter().flat_map(|s| s.points.iter().map(|pt| pt.mean)));
        let id = format!("latency-{}", kind.replace(' ', "-"));
        let mut c =
            Chart::new(&id, &format!("{kind}: latency percentiles (µs)"), xs, y, &p.x.title(), "µs (log)");
        c.x_ticks = cats;
        // Colour by the series without its percentile, dash by percentile.
        let mut bases: Vec<String> = Vec::new();
        for s in &p.series {
            let (base, pct) = s.name.rsplit_once(' ').unwrap_or((&s.name, ""));
            let ci = colour_of(&mut bases, base);
            let di = sweep::PERCENTILES.iter().position(|(l, _)| *l == pct).unwrap_or(0);
            let pts: Vec<(f64, f64, String)> = s
                .points
                .iter()
                .map(|pt| {
                    (
                        pt.x,
                        pt.mean,
                        format!(
                            "{} at {}: {} µs (n={})",
                            s.name,
                            x_label(&p.x, pt),
                            fmt_num(pt.mean),
                            pt.values.len()
                        ),
                    )
                })
                .collect();
            c.line(&s.name, colour(ci), dash(di), &pts, None, true);
        }
        let _ = write!(o, r#"<div class="plot" data-kind="{}">"#, esc(&kind));
        o += &c.finish();
        // Table: one row per base series and x, the four percentiles across.
        o += r#"<table><tr><th>series</th><th>point</th>"#;
        for (l, _) in sweep::PERCENTILES {
            let _ = write!(o, r#"<th class="num">{l} µs</th>"#);
        }
        o += r#"<th class="num">n</th></tr>"#;
        for base in &bases {
            let of_base: Vec<&sweep::Series> = p
                .series
                .iter()
                .filter(|s| s.name.rsplit_once(' ').map(|x| x.0) == Some(base.as_str()))
                .collect();
            let Some(first) = of_base.first() else { continue };
            for pt in &first.points {
                let _ = write!(o, "<tr><td>{}</td><td>{}</td>", esc(base), esc(&x_label(&p.x, pt)));
                for s in &of_base {
                    let v = s.points.iter().find(|q| q.x == pt.x).map_or("–".into(), |q| fmt_num(q.mean));
                    let _ = write!(o, r#"<td class="num">{}</td>"#, esc(&v));
                }
                let _ = write!(o, r#"<td class="num">{}</td></tr>"#, pt.values.len());
            }
        }
        o += "</table></div>";
    }
    if !any {
        o += r#"<p class="none">No workload in these runs measures latency.</p>"#;
    }
    o += "</section>";
    o
}

/// One failure event on the time line.
struct Event {
    t: f64,
    count: u64,
    title: String,
}

/// Kernel failures of one order within one time bucket.
#[derive(Default)]
struct Bucket {
    /// The first one's time.
    t: f64,
    n: u64,
    comms: BTreeMap<String, u64>,
    /// The first one's GFP flags.
    gfp: String,
}

/// A line's points: (x, y, hover text).
type Points = Vec<(f64, f64, String)>;

/// What surfaced, first: the workloads' errors with the surfaced failures caught in the same
/// window, and how many caught failures surfaced and how many fell back.
fn surfaced_lead(r: &RunData) -> String {
    let failed: Vec<&fraglab_probe::tracefs::AllocFailure> = r.failures.iter().filter(|f| f.failed).collect();
    if failed.is_empty() {
        return String::new();
    }
    let t0 = r.t0_ns as f64 / 1e9;
    let spans: Vec<mattered::Span> = r
        .phases
        .iter()
        .filter_map(|p| {
            Some(mattered::Span { window: p.workload.as_ref()?, start_s: t0 + p.start, end_s: t0 + p.end })
        })
        .collect();
    let ties = mattered::ties(&spans, &r.workloads, &failed);
    let groups = mattered::groups(failed.iter().copied());
    let count = |o: Outcome| groups.iter().filter(|g| g.outcome == o).map(|g| g.group.count).sum::<usize>();
    let mut o = format!(
        r#"<p class="lead"><strong>{} caught failed allocation(s) surfaced</strong> (no known fallback: the caller got the failure); {} fell back (the kernel had a way around it).</p>"#,
        count(Outcome::Surfaced),
        count(Outcome::FellBack)
    );
    if !ties.is_empty() {
        o += "<ul class=\"ties\">";
        for t in &ties {
            let _ = write!(o, "<li><code>{}</code></li>", esc(&t.describe()));
        }
        o += "</ul>";
    }
    o
}

fn failures(letter: &str, r: &RunData, summary: &mut Vec<String>) -> String {
    let mut o = String::new();
    // Workload errnos.
    let mut by_errno: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    let mut rows = String::new();
    let mut unplaced = 0;
    for w in &r.workloads {
        let res = &w.result;
        let phase = r.workload_phase(w);
        for e in &res.errors {
            let at = phase.map(|p| p.start + e.first_seen_s);
            let _ = write!(
                rows,
                r#"<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{:.3}</td><td class="num">{}</td></tr>"#,
                esc(&w.point.label()),
                w.iteration,
                esc(&res.kind),
                esc(&e.errno),
                e.count,
                e.first_seen_s,
                at.map_or("–".into(), |t| format!("{t:.2}"))
            );
            match at {
                Some(t) => by_errno.entry(e.errno.clone()).or_default().push(Event {
                    t,
                    count: e.count,
                    title: format!(
                        "{} ×{} in {} at {} #{}: first seen {:.2} s into the workload ({t:.2} s)",
                        e.errno, e.count, res.kind, w.point, w.iteration, e.first_seen_s
                    ),
                }),
                None => unplaced += 1,
            }
        }
    }
    // Kernel-caught failures: per order, bucketed so thousands stay readable.
    let t_end = r.t_end();
    let bucket = t_end / 600.0;
    let mut by_order: BTreeMap<u32, BTreeMap<i64, Bucket>> = BTreeMap::new();
    let mut out_of_range = 0;
    // A failure's repeats ([`AllocFailure::times`]) each land in their own bucket.
    for (f, time) in r.failures.iter().flat_map(|f| f.times().map(move |t| (f, t))) {
        let t = time - r.t0_ns as f64 / 1e9;
        if t < -1.0 || t > t_end + 1.0 {
            out_of_range += 1;
        }
        let e = by_order
            .entry(f.order)
            .or_default()
            .entry((t / bucket).floor() as i64)
            .or_insert_with(|| Bucket { t, gfp: f.gfp_flags.join("|"), ..Default::default() });
        e.n += 1;
        *e.comms.entry(f.comm.clone()).or_default() += 1;
    }
    let total_errnos: u64 = by_errno.values().flatten().map(|e| e.count).sum();
    summary.push(format!(
        "failures{}: {} workload errno(s) ({} kinds), {} kernel-caught failed allocation(s)",
        if letter == "A" { String::new() } else { format!(" ({letter})") },
        total_errnos,
        by_errno.len(),
        r.failures.iter().map(|f| f.count()).sum::<u64>()
    ));
    o += &surfaced_lead(r);
    if by_errno.is_empty() && by_order.is_empty() && unplaced == 0 {
        o += r#"<p class="none">No failures: no workload saw an errno and the catcher caught no failed allocation.</p>"#;
    } else {
        let mut cats: Vec<String> = by_errno.keys().map(|e| format!("errno {e}")).collect();
        cats.extend(by_order.keys().map(|o| format!("kernel order {o}")));
        let y = Scale::Linear { min: -0.6, max: cats.len() as f64 - 0.4 };
        let mut c = Chart::new(
            &format!("failures-{letter}"),
            "failures over time",
            time_scale(r),
            y,
            "seconds since the run started",
            "",
        );
        c.height = (c.top + c.bottom + 34.0 * cats.len() as f64).max(180.0);
        // Room for "kernel order 10" on the left.
        c.left = 118.0;
        c.y_categories = Some(cats.clone());
        c.bands(&bands(r));
        let size = |n: u64| 3.0 + 2.0 * (n as f64).log10().max(0.0);
        let mut row = 0;
        for (errno, evs) in &by_errno {
            let pts: Vec<(f64, f64, f64, String)> =
                evs.iter().map(|e| (e.t, row as f64, size(e.count), e.title.clone())).collect();
            c.events(&format!("errno {errno}"), colour(2 + row), Shape::Diamond, &pts);
            row += 1;
        }
        for (order, buckets) in &by_order {
            let pts: Vec<(f64, f64, f64, String)> = buckets
                .values()
                .map(|b| {
                    let who = b.comms.iter().map(|(c, n)| format!("{c}×{n}")).collect::<Vec<_>>().join(" ");
                    let (t, n, gfp) = (b.t, b.n, &b.gfp);
                    (
                        t,
                        row as f64,
                        size(n),
                        format!("order {order}: {n} failed at {t:.2} s ({who}) gfp {gfp}"),
                    )
                })
                .collect();
            c.events(&format!("kernel order {order}"), colour(row), Shape::Circle, &pts);
            row += 1;
        }
        o += &c.finish();
        if out_of_range > 0 {
            let _ = write!(
                o,
                r#"<p class="help">{out_of_range} kernel failure(s) fall outside the run's time span: this kernel's trace clock is not the monotonic clock, so their times are approximate.</p>"#
            );
        }
    }
    if !rows.is_empty() {
        o += r#"<h3>Workload errnos</h3><table><tr><th>point</th><th>iteration</th><th>workload</th><th>errno</th><th class="num">count</th><th class="num">first seen (s into the workload)</th><th class="num">at (s since start)</th></tr>"#;
        o += &rows;
        o += "</table>";
    }
    if !by_order.is_empty() {
        o += r#"<h3>Failed allocations caught in the kernel</h3><table><tr><th>order</th><th class="num">failures</th><th>first at (s)</th><th>commands</th><th>gfp flags (first)</th></tr>"#;
        for (order, buckets) in &by_order {
            let n: u64 = buckets.values().map(|b| b.n).sum();
            let first = buckets.values().map(|b| b.t).fold(f64::INFINITY, f64::min);
            let mut comms: BTreeMap<&str, u64> = BTreeMap::new();
            for b in buckets.values() {
                for (c, k) in &b.comms {
                    *comms.entry(c).or_default() += k;
                }
            }
            let who = comms.iter().map(|(c, k)| format!("{c}×{k}")).collect::<Vec<_>>().join(" ");
            let gfp = buckets.values().next().map(|b| b.gfp.clone()).unwrap_or_default();
            let _ = write!(
                o,
                r#"<tr><td>{order}</td><td class="num">{n}</td><td class="num">{first:.2}</td><td>{}</td><td><code>{}</code></td></tr>"#,
                esc(&who),
                esc(&gfp)
            );
        }
        o += "</table>";
        let groups = mattered::groups(r.failures.iter().filter(|f| f.failed));
        o += r#"<h3>Failed allocations by caller</h3><p class="help">The first function in each stack that is not the allocator itself (page allocator, slab, kmalloc, vmalloc, the DMA API) and the function that called it; then, for the first failure of the group, the path on towards the system call. <em>Surfaced</em>: no fallback is known for the call site and flags, the caller got the failure; <em>fell back</em>: the kernel had a way around it (a huge page, kvmalloc's first try, SLUB's preferred slab order, a page-fragment refill). Surfaced first.</p><table><tr><th>outcome</th><th>order</th><th class="num">failures</th><th>function ← caller</th><th>then</th></tr>"#;
        for m in &groups {
            let g = &m.group;
            let outcome = match m.fallback {
                Some(instead) => format!(r#"<span title="{}">fell back</span>"#, esc(instead)),
                None => "<strong>surfaced</strong>".to_string(),
            };
            let site = match &g.site {
                Some(s) => s.to_string(),
                None if g.no_stack => "(no stack captured)".into(),
                None => "(only allocator frames)".into(),
            };
            let _ = write!(
                o,
                r#"<tr><td>{outcome}</td><td>{}</td><td class="num">{}</td><td><code>{}</code></td><td><code>{}</code></td></tr>"#,
                g.order,
                g.count,
                esc(&site),
                esc(&g.then.join(" ← "))
            );
        }
        o += "</table>";
    }
    if !r.info.errors.is_empty() {
        o += r#"<h3>Workloads that did not run to the end</h3><ul class="notes">"#;
        for e in &r.info.errors {
            let _ = write!(o, "<li>{}</li>", esc(e));
        }
        o += "</ul>";
    }
    o
}

/// A small inline line of a cache's levels: before, then after each round.
fn sparkline(g: &leak::Growth) -> String {
    let vals: Vec<f64> =
        std::iter::once(Some(g.before)).chain(g.after.iter().copied()).flatten().map(|v| v as f64).collect();
    let (lo, hi) = vals.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
    let (w, h) = (140.0, 26.0);
    let span = if hi > lo { hi - lo } else { 1.0 };
    let n = vals.len().max(2) - 1;
    let pts: Vec<String> = vals
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                2.0 + i as f64 * (w - 4.0) / n as f64,
                h - 3.0 - (v - lo) / span * (h - 6.0)
            )
        })
        .collect();
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}"><polyline fill="none" stroke="#b3261e" stroke-width="1.5" points="{}"/></svg>"##,
        pts.join(" ")
    )
}

fn why_not(g: &leak::Growth) -> String {
    let measured = g.after.iter().flatten().count();
    if g.leak {
        return "leak candidate".into();
    }
    if measured < 2 {
        return "fewer than two rounds sampled".into();
    }
    if g.growth <= 2 * g.allowance as i64 {
        return format!("growth within noise (allowance {})", g.allowance);
    }
    if g.max_drop > g.allowance as i64 {
        return format!("came back down by {} between rounds", g.max_drop);
    }
    if g.grew_rounds * 2 < measured {
        return format!("grew in only {}/{} rounds", g.grew_rounds, measured);
    }
    "came back down after the run".into()
}

fn leak_section(letter: &str, r: &RunData, summary: &mut Vec<String>) -> String {
    let samples: Vec<(f64, &fraglab_probe::slabinfo::SlabInfo)> = r
        .timeline
        .iter()
        .filter(|s| s.source != "baseline")
        .filter_map(|s| s.snapshot.slabinfo.as_ref().map(|si| (s.t, si)))
        .collect();
    if samples.is_empty() {
        return r#"<p class="none">slabinfo was not sampled in this run (it needs root; add "slabinfo" to [probe] monitors).</p>"#.into();
    }
    let rounds = leak::rounds(&r.phases);
    if rounds.len() < 2 {
        return format!(
            r#"<p class="none">{} round(s) in this run: growth across iterations needs at least two (set [run] iterations or a sweep).</p>"#,
            rounds.len()
        );
    }
    let all = leak::analyse(&samples, &rounds);
    let leaks: Vec<&leak::Growth> = all.iter().filter(|g| g.leak).collect();
    summary.push(format!(
        "slab leak candidates{}: {}",
        if letter == "A" { String::new() } else { format!(" ({letter})") },
        if leaks.is_empty() {
            "none".to_string()
        } else {
            leaks.iter().take(5).map(|g| format!("{} +{}", g.name, g.growth)).collect::<Vec<_>>().join(", ")
        }
    ));
    let mut o = format!(
        r#"<p class="help">{} rounds, {} slabinfo samples, {} caches.</p>"#,
        rounds.len(),
        samples.len(),
        all.len()
    );
    if leaks.is_empty() {
        o += r#"<p class="none">No slab cache grew across the rounds and stayed grown. The caches that grew most are below with the reason each is not a candidate.</p>"#;
    } else {
        // Chart: each candidate's active objects minus its level before.
        let top: Vec<&leak::Growth> = leaks.iter().take(8).copied().collect();
        let mut lines: Vec<(String, Points)> = Vec::new();
        for g in &top {
            let pts: Vec<(f64, f64, String)> = samples
                .iter()
                .filter_map(|(t, si)| {
                    let active: u64 =
                        si.caches.iter().filter(|c| c.name == g.name).map(|c| c.active_objs).sum();
                    let d = active as f64 - g.before as f64;
                    si.cache(&g.name)
                        .map(|_| (*t, d, format!("{} at {t:.1} s: {active} active ({:+})", g.name, d)))
                })
                .collect();
            lines.push((g.name.clone(), pts));
        }
        let y = Scale::linear(lines.iter().flat_map(|(_, p)| p.iter().map(|x| x.1)), true);
        let mut c = Chart::new(
            &format!("leaks-{letter}"),
            "active objects above the level before the first round",
            time_scale(r),
            y,
            "seconds since the run started",
            "objects",
        );
        let mut b = bands(r);
        for band in &mut b {
            if band.name == "workloads" {
                band.marks = rounds.iter().map(|rd| (rd.start, format!("round {}", rd.name))).collect();
            }
        }
        c.bands(&b);
        for (i, (name, pts)) in lines.iter().enumerate() {
            c.line(&format!("slab {name}"), colour(i), "", pts, None, pts.len() <= 150);
        }
        o += &c.finish();
    }
    let shown: Vec<&leak::Growth> = if leaks.is_empty() {
        all.iter().filter(|g| g.growth > 0).take(5).collect()
    } else {
        leaks.iter().take(20).copied().collect()
    };
    if !shown.is_empty() {
        o += r#"<table class="leaks"><tr><th>#</th><th>cache</th><th class="num">object size</th><th class="num">before</th><th>level after each round</th><th class="num">after the last round</th><th class="num">growth (objects)</th><th class="num">growth (bytes)</th><th class="num">rounds grown</th><th class="num">after the run</th><th>verdict</th></tr>"#;
        for (i, g) in shown.iter().enumerate() {
            let measured = g.after.iter().flatten().count();
            let last = g.after.iter().rev().flatten().next().map_or("–".into(), |v| v.to_string());
            let _ = write!(
                o,
                r#"<tr class="{}" data-cache="{}"><td class="num">{}</td><td><code>{}</code></td><td class="num">{}</td><td class="num">{}</td><td>{}</td><td class="num">{}</td><td class="num">{:+}</td><td class="num">{}</td><td class="num">{}/{}</td><td class="num">{}</td><td>{}</td></tr>"#,
                if g.leak { "leak" } else { "not-leak" },
                esc(&g.name),
                i + 1,
                esc(&g.name),
                g.objsize,
                g.before,
                sparkline(g),
                last,
                g.growth,
                esc(&fraglab_units::format_size(g.growth_bytes.max(0) as u64)),
                g.grew_rounds,
                measured,
                g.at_end.map_or("–".into(), |v| v.to_string()),
                esc(&why_not(g))
            );
        }
        o += "</table>";
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    use fraglab_probe::tracefs::AllocFailure;
    use fraglab_results::workload::{ErrnoCount, WorkloadResult};

    fn failure(time: f64, order: u32, comm: &str) -> AllocFailure {
        AllocFailure {
            time,
            cpu: 0,
            comm: comm.into(),
            pid: 42,
            order,
            migratetype: 0,
            gfp_flags: vec!["GFP_KERNEL".into(), "__GFP_COMP".into()],
            gfp_residue: None,
            gfp_mask: None,
            failed: true,
            pfn: None,
            stack: vec![],
            line: String::new(),
            repeats: vec![],
        }
    }

    /// A run 1000 s after boot: fragment 0–2 s, one workload 2–5 s that saw ENOMEM 1.5 s in, and two
    /// order-4 failures and one order-6 failure caught by the kernel catcher.
    fn run_with_failures() -> RunData {
        let t0_ns = 1_000_000_000_000u64;
        let result = WorkloadResult {
            kind: "tcp-stream".into(),
            errors: vec![ErrnoCount { errno: "ENOMEM".into(), code: 12, count: 40, first_seen_s: 1.5 }],
            ..Default::default()
        };
        RunData {
            dir: "/results/x-1".into(),
            info: fraglab_results::record::RunRecord::new("x"),
            workloads: vec![fraglab_results::record::WorkloadRecord {
                point: fraglab_results::point::Point::none(),
                sysctls: vec![],
                iteration: 1,
                index: 0,
                result,
                target: None,
            }],
            timeline: vec![],
            phases: vec![
                data::Phase { name: "fragment".into(), start: 0.0, end: 2.0, workload: None },
                data::Phase {
                    name: "workload tcp-stream - #1 1".into(),
                    start: 2.0,
                    end: 5.0,
                    workload: Some(fraglab_results::record::Window {
                        kind: "tcp-stream".into(),
                        point: fraglab_results::point::Point::none(),
                        iteration: 1,
                        index: 0,
                    }),
                },
                data::Phase { name: "release".into(), start: 5.0, end: 6.0, workload: None },
            ],
            failures: vec![
                failure(1003.0, 4, "tcp-stream"),
                failure(1003.0005, 4, "kworker/0:1"),
                failure(1004.25, 6, "tcp-stream"),
            ],
            t0_ns,
            notes: vec![],
        }
    }

    #[test]
    fn failures_land_on_the_time_line_by_errno_and_order() {
        let r = run_with_failures();
        let mut summary = vec![];
        let html = failures("A", &r, &mut summary);
        let wrapped = format!("<div>{html}</div>");
        let doc = roxml(&wrapped);
        let series: Vec<(String, Vec<f64>)> = doc
            .descendants()
            .filter(|n| n.attribute("data-series").is_some())
            .map(|n| {
                let xs = n.children().filter_map(|c| c.attribute("data-x")?.parse().ok()).collect();
                (n.attribute("data-series").unwrap().to_string(), xs)
            })
            .collect();
        // ENOMEM: the workload's start (2 s) + first_seen_s (1.5 s).
        assert_eq!(series[0], ("errno ENOMEM".to_string(), vec![3.5]));
        // The two order-4 failures 0.5 ms apart share a marker at 3 s; order 6 at 4.25 s.
        assert_eq!(series[1].0, "kernel order 4");
        assert_eq!(series[1].1.len(), 1);
        assert!((series[1].1[0] - 3.0).abs() < 1e-6, "{series:?}");
        assert_eq!(series[2].0, "kernel order 6");
        assert!((series[2].1[0] - 4.25).abs() < 1e-6);
        assert!(html.contains("kworker/0:1×1 tcp-stream×1"), "{html}");
        assert!(html.contains("GFP_KERNEL|__GFP_COMP"));
        assert_eq!(
            summary,
            ["failures: 40 workload errno(s) (1 kinds), 3 kernel-caught failed allocation(s)"]
        );
    }

    #[test]
    fn a_run_without_samples_still_renders_as_well_formed_xml() {
        let r = run_with_failures();
        let report = render(&[r]);
        let doc = roxml(&report.html);
        let ids: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("section"))
            .filter_map(|n| n.attribute("id"))
            .collect();
        assert_eq!(
            ids,
            [
                "runs",
                "buddyinfo",
                "memory",
                "compaction",
                "throughput",
                "latency",
                "skmem",
                "failures",
                "leaks"
            ]
        );
        assert!(report.html.contains("No workload in these runs sampled its sockets' memory."));
        assert!(report.html.contains("buddyinfo was not sampled"));
        assert!(report.html.contains("slabinfo was not sampled"));
    }

    fn roxml(text: &str) -> roxmltree::Document<'_> {
        let opts = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
        roxmltree::Document::parse_with_options(text, opts).unwrap_or_else(|e| panic!("not well-formed: {e}"))
    }

    #[test]
    fn sides_are_lettered_like_columns() {
        assert_eq!([letter(0), letter(1), letter(25), letter(26)], ["A", "B", "Z", "AA"]);
    }
}
