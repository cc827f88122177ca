//! `fraglab report` on real runs made here: two short runs of one config (a thread sweep crossed
//! with net.core.high_order_alloc_disable = 0/1, slabinfo sampled, an exec workload that "leaks"
//! tmpfs inodes), side A fragmented, side B a baseline whose exec also reports ENOBUFS. The report
//! is parsed as XML and its series checked against the results files read independently, then
//! opened in Debian's chromium, headless: no console errors, the DOM rendered, the screenshot not
//! blank.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

mod common;
use common::{fraglab, repo};
/// Files each exec round creates on tmpfs: shmem_inode_cache grows by this much per round.
const FILES_PER_ROUND: u64 = 1500;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Runs {
    a: PathBuf,
    b: PathBuf,
    work: PathBuf,
}

/// The config of both runs; `fragment` and the exec's extra output differ.
fn config(name: &str, fragment: &str, leak_dir: &Path, extra: &str) -> String {
    format!(
        r#"[run]
name = "{name}"
iterations = 2

[fragment]
{fragment}

[probe]
interval = "250ms"
catch_min_order = 3

[[workload]]
kind = "tcp-stream"
duration = "1s"

[[workload]]
kind = "tcp-rr"
clients = 2
duration = "1s"

[[workload]]
kind = "exec"
command = ["sh", "-c", "d={dir}; mkdir -p $d; i=0; while [ $i -lt {FILES_PER_ROUND} ]; do : > $d/f$$-$i; i=$((i+1)); done; sleep 0.3{extra}"]

[sweep]
threads = [1, 2]
sysctl."net.core.high_order_alloc_disable" = [0, 1]
"#,
        dir = leak_dir.display()
    )
}

/// Run `cfg`; the results directory. A run that could not test (exit 125) is tried again, up to
/// three times: on a shared machine another fraglab holding memory can leave the budget fragmenter
/// no aligned region to shape (run.json says "the fragmenter made no free block").
fn run_config(run_dir: &Path, cfg: &Path, out_dir: &Path) -> PathBuf {
    let mut reasons = Vec::new();
    for _ in 0..3 {
        let out = fraglab(run_dir, &["run", cfg.to_str().unwrap(), "-o", out_dir.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let dir = stderr.lines().find_map(|l| l.strip_prefix("results: ")).map(PathBuf::from);
        let reason = dir
            .as_ref()
            .map(|d| json(&d.join("run.json"))["reason"].as_str().unwrap_or("").to_string())
            .unwrap_or_else(|| stderr.to_string());
        match (out.status.code(), dir) {
            // 0 not reproduced, 1 reproduced (B's ENOBUFS): both are complete runs.
            (Some(0 | 1), Some(dir)) => return dir,
            (Some(125), _) => reasons.push(reason),
            (code, _) => panic!("{}: exit {code:?}: {reason}\n{stderr}", cfg.display()),
        }
    }
    panic!("{}: could not test three times: {reasons:#?}", cfg.display());
}

/// Made once for every test in this file (they run on threads of one process).
fn runs() -> &'static Runs {
    static RUNS: OnceLock<Runs> = OnceLock::new();
    RUNS.get_or_init(|| {
        let work = scratch("runs");
        let run_dir = work.join("run");
        let leak = PathBuf::from(format!("/dev/shm/fraglab-report-test-{}", std::process::id()));
        let mut dirs = Vec::new();
        for (name, fragment, extra) in [
            ("report-a", "max_free_order = 4\nbudget = \"256MiB\"", ""),
            ("report-b", "enabled = false", "; echo 'sendmsg: No buffer space available' >&2"),
        ] {
            let cfg = work.join(format!("{name}.toml"));
            std::fs::write(&cfg, config(name, fragment, &leak, extra)).unwrap();
            let _ = std::fs::remove_dir_all(&leak);
            let dir = run_config(&run_dir, &cfg, &work.join("results"));
            let _ = std::fs::remove_dir_all(&leak);
            dirs.push(dir);
        }
        let b = dirs.pop().unwrap();
        let a = dirs.pop().unwrap();
        Runs { a, b, work }
    })
}

/// `fraglab report …` into `out`; the report text.
fn report(args: &[&Path], out: &Path) -> String {
    let mut a: Vec<&str> = vec!["report", args[0].to_str().unwrap()];
    for other in &args[1..] {
        a.extend(["--compare", other.to_str().unwrap()]);
    }
    a.extend(["-o", out.to_str().unwrap()]);
    let o = fraglab(&runs().work.join("run"), &a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read_to_string(out).unwrap()
}

fn parse(html: &str) -> roxmltree::Document<'_> {
    let opts = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    roxmltree::Document::parse_with_options(html, opts)
        .unwrap_or_else(|e| panic!("the report is not well-formed: {e}"))
}

/// The `<svg data-chart=…>` elements of a section (and side).
fn charts<'a>(doc: &'a roxmltree::Document<'a>, section: &str, side: &str) -> Vec<roxmltree::Node<'a, 'a>> {
    doc.descendants()
        .filter(|n| n.attribute("data-section") == Some(section) && n.attribute("data-run") == Some(side))
        .flat_map(|n| {
            n.descendants().filter(|c| c.has_tag_name("svg") && c.attribute("data-chart").is_some())
        })
        .collect()
}

fn series_in(node: roxmltree::Node) -> BTreeSet<String> {
    node.descendants().filter_map(|n| n.attribute("data-series")).map(String::from).collect()
}

fn phases_in(node: roxmltree::Node) -> BTreeSet<String> {
    node.descendants().filter_map(|n| n.attribute("data-phase")).map(String::from).collect()
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn report_of_a_real_run_draws_every_zone_phase_counter_and_sweep_line() {
    let r = runs();
    let out = scratch("single").join("report.html");
    let html = report(&[&r.a], &out);
    let doc = parse(&html);

    // buddyinfo: one map per zone the samples name, a row per order, a column per snapshot.
    let probe = lines(&r.a.join("probe.jsonl"));
    let mut zones: Vec<(String, usize)> = Vec::new();
    for s in &probe {
        for z in s["buddyinfo"]["zones"].as_array().unwrap() {
            let name = z["zone"].as_str().unwrap().to_string();
            if !zones.iter().any(|(n, _)| *n == name) {
                zones.push((name, z["free"].as_array().unwrap().len()));
            }
        }
    }
    assert!(zones.iter().any(|(z, _)| z == "Normal"), "{zones:?}");
    let maps = charts(&doc, "buddyinfo", "A");
    assert_eq!(maps.len(), zones.len(), "one heatmap per zone");
    // baseline.json + every probe sample + final.json
    let snapshots = probe.len() + 2;
    for ((zone, orders), map) in zones.iter().zip(&maps) {
        let want: BTreeSet<String> = (0..*orders).map(|o| format!("{zone} order {o}")).collect();
        assert_eq!(series_in(*map), want);
        for row in map.descendants().filter(|n| n.attribute("data-series").is_some()) {
            let cells = row.children().filter(|c| c.has_tag_name("rect")).count();
            assert_eq!(cells, snapshots, "{zone}: a cell per snapshot");
        }
        let phases = phases_in(*map);
        for p in ["baseline", "fragment", "workloads", "release", "final"] {
            assert!(phases.contains(p), "{zone}: phase {p} not marked: {phases:?}");
        }
    }
    // Cells checked against the file: every background sample's Normal order 3, at its time.
    let t0 = json(&r.a.join("run.json"))["phases"][0]["start_ns"].as_f64().unwrap();
    for s in &probe {
        let blocks =
            s["buddyinfo"]["zones"].as_array().unwrap().iter().find(|z| z["zone"] == "Normal").unwrap()
                ["free"][3]
                .as_u64()
                .unwrap();
        let t = (s["monotonic_ns"].as_f64().unwrap() - t0) / 1e9;
        let title = format!("Normal order 3 at {t:.1} s: {blocks} free blocks = ");
        assert!(html.contains(&title), "no cell titled {title:?}");
    }

    // Memory and counters.
    let mem = charts(&doc, "memory", "A");
    assert_eq!(series_in(mem[0]), ["available", "free"].map(String::from).into());
    assert!(phases_in(mem[0]).contains("fragment"));
    let counters: BTreeSet<String> =
        charts(&doc, "compaction", "A").into_iter().flat_map(series_in).collect();
    let want: BTreeSet<String> =
        ["compact_stall", "compact_fail", "compact_success", "pgmigrate_success"].map(String::from).into();
    assert_eq!(counters, want);

    // Throughput: a line per high_order_alloc_disable value, points at threads 1 and 2, each the
    // mean of the iterations recomputed here from workloads.json.
    let workloads = json(&r.a.join("workloads.json"))["workloads"].clone();
    let mut expected: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for w in workloads.as_array().unwrap() {
        if w["result"]["kind"] != "tcp-stream" {
            continue;
        }
        let point = &w["point"];
        let threads = point["threads"].as_u64().unwrap();
        let disable = point["sysctl.net.core.high_order_alloc_disable"].to_string();
        expected
            .entry((format!("tcp-stream high_order_alloc_disable={disable}"), threads))
            .or_default()
            .push(w["result"]["throughput_mbit"].as_f64().unwrap());
    }
    assert_eq!(expected.len(), 4);
    let tput =
        doc.descendants().find(|n| n.attribute("data-chart") == Some("throughput-tcp-stream")).unwrap();
    let mut seen = 0;
    for s in tput.descendants().filter(|n| n.has_tag_name("g") && n.attribute("data-series").is_some()) {
        let name = s.attribute("data-series").unwrap();
        for c in s.children().filter(|c| c.has_tag_name("circle")) {
            let x: f64 = c.attribute("data-x").unwrap().parse().unwrap();
            let y: f64 = c.attribute("data-y").unwrap().parse().unwrap();
            let v = &expected[&(name.to_string(), x as u64)];
            assert_eq!(v.len(), 2, "two iterations");
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            assert!((y - mean).abs() <= 1e-9 * mean, "{name} at {x}: {y} vs {mean}");
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
    let tcp_rr = doc.descendants().find(|n| n.attribute("data-chart") == Some("throughput-tcp-rr")).unwrap();
    assert_eq!(series_in(tcp_rr).len(), 2);
    // The exec workload counts successes, not a rate: no throughput plot of it.
    assert!(!html.contains(r#"data-chart="throughput-exec""#));

    // Latency: tcp-rr at four percentiles per line.
    let lat = doc.descendants().find(|n| n.attribute("data-chart") == Some("latency-tcp-rr")).unwrap();
    let lat_series = series_in(lat);
    for pct in ["p50", "p90", "p99", "p99.9"] {
        for d in [0, 1] {
            let s = format!("tcp-rr high_order_alloc_disable={d} {pct}");
            assert!(lat_series.contains(&s), "{s} missing from {lat_series:?}");
        }
    }

    // Forward allocation per socket (seed 004): tcp-stream's sockets sampled every window, a line
    // per statistic and high_order_alloc_disable value, each point the mean over the iterations of
    // what workloads.json recorded.
    let mut fwd: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for w in workloads.as_array().unwrap().iter().filter(|w| w["result"]["kind"] == "tcp-stream") {
        let skmem = &w["result"]["skmem"];
        // One client and one accepted socket per thread, seen by every sample of the window.
        let threads = w["point"]["threads"].as_u64().unwrap();
        assert_eq!(skmem["summary"]["sockets"].as_u64(), Some(2 * threads), "{skmem}");
        assert!(skmem["samples"].as_u64().unwrap() >= 5, "{skmem}");
        let disable = w["point"]["sysctl.net.core.high_order_alloc_disable"].to_string();
        for (label, field) in [("mean per socket", "per_socket_mean"), ("max per socket", "per_socket_max")] {
            fwd.entry((format!("tcp-stream high_order_alloc_disable={disable} {label}"), threads))
                .or_default()
                .push(skmem["summary"][field]["f"].as_f64().unwrap());
        }
    }
    let chart = doc.descendants().find(|n| n.attribute("data-chart") == Some("skmem-tcp-stream")).unwrap();
    let mut seen = 0;
    for s in chart.descendants().filter(|n| n.has_tag_name("g") && n.attribute("data-series").is_some()) {
        let name = s.attribute("data-series").unwrap();
        for c in s.children().filter(|c| c.has_tag_name("circle")) {
            let x: f64 = c.attribute("data-x").unwrap().parse().unwrap();
            let y: f64 = c.attribute("data-y").unwrap().parse().unwrap();
            let v = &fwd[&(name.to_string(), x as u64)];
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            assert!((y - mean).abs() <= 1e-9 * mean.abs().max(1.0), "{name} at {x}: {y} vs {mean}");
            seen += 1;
        }
    }
    assert_eq!(seen, 8, "two statistics × two sysctl values × two thread counts");

    // The leak: every round left FILES_PER_ROUND more tmpfs inodes behind.
    let leaks = doc.descendants().find(|n| n.attribute("data-section") == Some("leaks")).unwrap();
    let row = leaks
        .descendants()
        .find(|n| n.attribute("data-cache") == Some("shmem_inode_cache"))
        .expect("shmem_inode_cache is in the leak table");
    assert_eq!(row.attribute("class"), Some("leak"));
    let growth: i64 =
        row.children().filter(|c| c.has_tag_name("td")).nth(6).unwrap().text().unwrap().parse().unwrap();
    let rounds = 2 * 2 * 2;
    assert!(growth >= (rounds * FILES_PER_ROUND) as i64 * 9 / 10, "growth {growth}");
    assert!(series_in(leaks).contains("slab shmem_inode_cache"));
}

#[test]
fn compare_draws_one_line_per_side_and_each_sides_timeline() {
    let r = runs();
    let out = scratch("compare").join("ab.html");
    let html = report(&[&r.a, &r.b], &out);
    let doc = parse(&html);
    let tput =
        doc.descendants().find(|n| n.attribute("data-chart") == Some("throughput-tcp-stream")).unwrap();
    let want: BTreeSet<String> = ["A", "B"]
        .iter()
        .flat_map(|s| (0..2).map(move |d| format!("{s} tcp-stream high_order_alloc_disable={d}")))
        .collect();
    assert_eq!(series_in(tput), want);
    // Each side has its own heatmaps; only A was fragmented.
    assert!(phases_in(charts(&doc, "buddyinfo", "A")[0]).contains("fragment"));
    let b_phases = phases_in(charts(&doc, "buddyinfo", "B")[0]);
    assert!(!b_phases.contains("fragment") && b_phases.contains("workloads"), "{b_phases:?}");
    // B's exec printed ENOBUFS in every round: one marker per round at its workload's start plus
    // first_seen_s, recomputed here from run.json and workloads.json.
    let run = json(&r.b.join("run.json"));
    // A workload's phase carries its window: (point, iteration, index).
    let starts: Vec<(&Value, f64)> = run["phases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p.get("workload").is_some())
        .map(|p| (&p["workload"], p["start_ns"].as_f64().unwrap()))
        .collect();
    let t0 = run["phases"][0]["start_ns"].as_f64().unwrap();
    // Every ENOBUFS of any workload (on a busy machine TCP may see real ones too); the exec's are
    // one per round.
    let (mut want_x, mut from_exec) = (Vec::new(), 0);
    for w in json(&r.b.join("workloads.json"))["workloads"].clone().as_array().unwrap() {
        let start = starts
            .iter()
            .find(|(window, _)| {
                window["point"] == w["point"]
                    && window["iteration"] == w["iteration"]
                    && window["index"] == w["index"]
            })
            .unwrap()
            .1;
        for e in w["result"]["errors"].as_array().unwrap().iter().filter(|e| e["errno"] == "ENOBUFS") {
            from_exec += usize::from(w["result"]["kind"] == "exec");
            want_x.push((start - t0) / 1e9 + e["first_seen_s"].as_f64().unwrap());
        }
    }
    assert_eq!(from_exec, 8, "one ENOBUFS per round from the exec workload");
    let fail = charts(&doc, "failures", "B");
    let enobufs =
        fail[0].descendants().find(|n| n.attribute("data-series") == Some("errno ENOBUFS")).unwrap();
    let mut got: Vec<f64> = enobufs.children().filter_map(|c| c.attribute("data-x")?.parse().ok()).collect();
    got.sort_by(f64::total_cmp);
    want_x.sort_by(f64::total_cmp);
    assert_eq!(got.len(), want_x.len());
    for (g, w) in got.iter().zip(&want_x) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want_x:?}");
    }
    // A's time line exists exactly when A's files hold a failure (its exec printed nothing, but the
    // catcher is machine-wide and this machine is shared).
    let a_errnos: usize = json(&r.a.join("workloads.json"))["workloads"]
        .clone()
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["result"]["errors"].as_array().unwrap().len())
        .sum();
    let a_caught = std::fs::read_to_string(r.a.join("alloc_failures.jsonl")).unwrap().lines().count();
    let a_chart = !charts(&doc, "failures", "A").is_empty();
    assert_eq!(a_chart, a_errnos + a_caught > 0, "A: {a_errnos} errnos, {a_caught} caught failures");
    let a_side = doc
        .descendants()
        .find(|n| n.attribute("data-section") == Some("failures") && n.attribute("data-run") == Some("A"))
        .unwrap();
    let says_none = a_side.descendants().any(|n| n.text().is_some_and(|t| t.starts_with("No failures")));
    assert_eq!(says_none, !a_chart);
}

#[test]
fn the_report_is_self_contained() {
    let r = runs();
    let out = scratch("contained").join("report.html");
    let html = report(&[&r.a, &r.b], &out);
    assert!(!html.to_lowercase().contains("<script"), "no script");
    let doc = parse(&html);
    for n in doc.descendants().filter(|n| n.is_element()) {
        for a in n.attributes() {
            let v = a.value();
            match a.name() {
                "src" => panic!("<{}> loads {v}", n.tag_name().name()),
                "href" => assert!(v.starts_with('#'), "link out of the document: {v}"),
                _ => assert!(!v.contains("url(") || v.starts_with("url(#"), "{}={v}", a.name()),
            }
        }
    }
    // Clip paths, gradients and patterns are found by id across the whole page.
    let mut ids = BTreeSet::new();
    for id in doc.descendants().filter_map(|n| n.attribute("id")) {
        assert!(ids.insert(id), "id {id:?} used twice");
    }
    let without_ns = html.replace("http://www.w3.org/2000/svg", "");
    assert!(
        !without_ns.contains("http://") && !without_ns.contains("https://"),
        "a network address in the report"
    );
    assert!(!html.contains("@import"));
}

#[test]
fn bad_inputs_are_refused_clearly_and_write_nothing() {
    let r = runs();
    let dir = scratch("bad");
    let out = dir.join("never.html");
    let run_dir = r.work.join("run");
    let missing = dir.join("no-such-run");
    let o = fraglab(&run_dir, &["report", missing.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no such directory"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The parent of results directories: the error lists them.
    let parent = r.a.parent().unwrap();
    let o = fraglab(&run_dir, &["report", parent.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr.contains("not a fraglab results directory") && stderr.contains(r.a.to_str().unwrap()),
        "{stderr}"
    );
    // A broken --compare side fails the whole report.
    let o = fraglab(
        &run_dir,
        &["report", r.a.to_str().unwrap(), "--compare", dir.to_str().unwrap(), "-o", out.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("has no run.json"));
    assert!(!out.exists(), "a refused report wrote a file");
}

/// Debian's chromium on PATH. Missing is a failure, not a skip: the report must be checked in a
/// real browser, and scripts/test installs it.
fn chromium_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join("chromium")).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!(
            "chromium is not installed (not on PATH): the report must be checked in a real browser. \
             scripts/test installs it; by hand: apt-get install -y --no-install-recommends chromium"
        )
    })
}

/// Run chromium headless on `page`; (stderr, screenshot path, dumped DOM).
fn chromium(page: &Path, tag: &str) -> (String, PathBuf, String) {
    let binary = chromium_binary();
    let dir = scratch(&format!("chromium-{tag}"));
    let png = dir.join("page.png");
    let common = |profile: &str| {
        let mut c = Command::new(&binary);
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", dir.join(profile).display()));
        c
    };
    let url = format!("file://{}", page.display());
    let shot = common("profile-shot")
        .args(["--enable-logging=stderr", "--v=0", "--window-size=1280,2000"])
        .arg(format!("--screenshot={}", png.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(shot.status.success(), "chromium failed: {}", String::from_utf8_lossy(&shot.stderr));
    let dom = common("profile-dom").args(["--dump-dom"]).arg(&url).output().unwrap();
    assert!(dom.status.success(), "chromium --dump-dom failed: {}", String::from_utf8_lossy(&dom.stderr));
    (
        String::from_utf8_lossy(&shot.stderr).into_owned(),
        png,
        String::from_utf8_lossy(&dom.stdout).into_owned(),
    )
}

/// Console errors chromium logged for the page.
fn console_errors(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains("Uncaught") || l.contains(":CONSOLE")).collect()
}

/// Distinct colours and the luminance variance of a PNG.
fn png_stats(path: &Path) -> (usize, f64, (u32, u32)) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().expect("a screenshot fits in memory")];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected PNG colour type {other:?}"),
    };
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let mut colours = BTreeSet::new();
    let (mut sum, mut sq, mut n) = (0.0, 0.0, 0.0);
    for px in buf[..info.buffer_size()].chunks(channels) {
        colours.insert((px[0], px[1], px[2]));
        let l = 0.2126 * px[0] as f64 + 0.7152 * px[1] as f64 + 0.0722 * px[2] as f64;
        sum += l;
        sq += l * l;
        n += 1.0;
    }
    let mean = sum / n;
    (colours.len(), sq / n - mean * mean, (info.width, info.height))
}

#[test]
fn the_report_renders_in_headless_chromium_without_console_errors() {
    let r = runs();
    let dir = scratch("browser");
    let out = dir.join("report.html");
    let html = report(&[&r.a, &r.b], &out);
    let (stderr, png, dom) = chromium(&out, "report");
    let errors = console_errors(&stderr);
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    // The DOM chromium built has every chart the file has, and the sections.
    let svgs = html.matches("<svg ").count();
    assert!(svgs > 10);
    assert_eq!(dom.matches("<svg ").count(), svgs, "chromium's DOM lost charts");
    for id in ["buddyinfo", "memory", "compaction", "throughput", "latency", "skmem", "failures", "leaks"] {
        assert!(dom.contains(&format!(r#"<section id="{id}">"#)), "section {id} missing from the DOM");
    }
    let (colours, variance, size) = png_stats(&png);
    assert_eq!(size, (1280, 2000));
    // A blank page has one or two colours and no variance; heatmaps have hundreds.
    assert!(colours > 200, "only {colours} colours in {}", png.display());
    assert!(variance > 200.0, "luminance variance {variance} in {}", png.display());
    // Keep a copy for a person to look at.
    let keep = repo().join("target/report-screenshot.png");
    let _ = std::fs::copy(&png, &keep);
    eprintln!("screenshot: {} ({colours} colours, variance {variance:.0})", keep.display());
}

/// The console check itself: a page that throws and logs an error is caught, a blank page is blank.
#[test]
fn the_browser_checks_catch_a_broken_page() {
    let dir = scratch("control");
    let page = dir.join("broken.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><script>console.error('boom'); notAFunction();</script></body></html>",
    )
    .unwrap();
    let (stderr, png, _) = chromium(&page, "control");
    let errors = console_errors(&stderr);
    assert!(errors.iter().any(|l| l.contains("Uncaught")), "the thrown error was not seen: {stderr}");
    assert!(errors.iter().any(|l| l.contains("boom")), "console.error was not seen: {stderr}");
    let (colours, variance, _) = png_stats(&png);
    assert!(colours <= 2 && variance < 1.0, "a blank page: {colours} colours, variance {variance}");
}
