//! `fraglab compare` as a user runs it: on two real quickstart runs made here (text, markdown and
//! JSON, the numbers checked against the results directories), and refusing runs that measure
//! different things (a real directory with its stored config edited).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use serde_json::Value;

mod common;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-compare-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Our own runtime directory, so these runs take their own instance lock and journal.
fn run_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| scratch("rundir")).clone()
}

fn fraglab(args: &[&str]) -> Output {
    common::fraglab(&run_dir(), args)
}

fn compare(args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["compare"];
    all.extend_from_slice(args);
    let out = fraglab(&all);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One real `fraglab run configs/quickstart.toml [extra]` into `out`, which must end not reproduced;
/// the results directory it made.
fn quickstart(out: &Path, extra: &[&str]) -> PathBuf {
    assert!(nix::unistd::Uid::effective().is_root(), "fraglab run needs root");
    let before: Vec<PathBuf> = list(out);
    let r = fraglab(&[&["run", "configs/quickstart.toml", "-o", out.to_str().unwrap()], extra].concat());
    assert_eq!(
        r.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    let new: Vec<PathBuf> = list(out).into_iter().filter(|d| !before.contains(d)).collect();
    assert_eq!(new.len(), 1, "{new:?}");
    new[0].clone()
}

/// Two real quickstart runs (about 20 s each), made once for every test in this file.
fn two_runs() -> &'static (PathBuf, PathBuf) {
    static RUNS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    RUNS.get_or_init(|| {
        let out = scratch("results");
        (quickstart(&out, &[]), quickstart(&out, &[]))
    })
}

/// A real `fraglab run configs/quickstart.toml --baseline`: [fragment] stays in the stored config,
/// run.json's fragment is null.
fn baseline_run() -> &'static PathBuf {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| quickstart(&scratch("baseline"), &["--baseline"]))
}

fn list(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default()
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The tcp-stream throughputs a run stored, in iteration order.
fn throughputs(dir: &Path) -> Vec<f64> {
    json(&dir.join("workloads.json"))["workloads"]
        .clone()
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["result"]["kind"] == "tcp-stream")
        .map(|w| w["result"]["throughput_mbit"].as_f64().unwrap())
        .collect()
}

#[test]
fn compares_two_real_quickstart_runs_in_text_markdown_and_json() {
    let (a, b) = two_runs();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());

    // JSON: the model, checked against the directories.
    let (code, stdout, stderr) = compare(&[a, b, "--format", "json"]);
    assert_eq!(code, Some(0), "{stderr}");
    // Same config, same kernel, same host: the user is warned this is not a kernel comparison.
    assert!(stderr.contains("same kernel on both sides: this compares runs, not kernels"), "{stderr}");
    let c: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(c["baseline"], "A");
    assert_eq!(c["runs"].as_array().unwrap().len(), 2);
    assert_eq!(c["runs"][1]["dir"], b);
    assert!(c["warnings"][0].as_str().unwrap().contains("same kernel on both sides"));
    let metrics = c["metrics"].as_array().unwrap();
    let find = |kind: &str, metric: &str| {
        metrics
            .iter()
            .find(|m| m["kind"] == kind && m["metric"] == metric && m["point"] == "-")
            .unwrap_or_else(|| panic!("no {kind} {metric} in {metrics:?}"))
    };
    let t = find("tcp-stream", "throughput");
    assert_eq!(t["unit"], "Mbit/s");
    assert_eq!(t["index"], 0);
    for (side, dir) in t["sides"].as_array().unwrap().iter().zip([a, b]) {
        let stored = throughputs(Path::new(dir));
        let values: Vec<f64> =
            side["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(values, stored, "values come from workloads.json");
        assert_eq!(side["n"], 2);
        let mean = stored.iter().sum::<f64>() / 2.0;
        assert!((side["mean"].as_f64().unwrap() - mean).abs() < 1e-6);
        let sd = ((stored[0] - mean).powi(2) + (stored[1] - mean).powi(2)).sqrt(); // n − 1 = 1
        assert!((side["stddev"].as_f64().unwrap() - sd).abs() < 1e-6);
        // Half-width with t(0.975, 1) = 12.706204736174694 (scipy), s/√2.
        let h = 12.706204736174694 * sd / 2f64.sqrt();
        assert!((side["ci95"].as_f64().unwrap() - h).abs() < 1e-6 * h.max(1.0), "{side}");
    }
    assert!(t["sides"][0]["vs_baseline"].is_null());
    let vs = &t["sides"][1]["vs_baseline"];
    let (ma, mb) = (t["sides"][0]["mean"].as_f64().unwrap(), t["sides"][1]["mean"].as_f64().unwrap());
    assert!((vs["pct"].as_f64().unwrap() - (mb - ma) / ma * 100.0).abs() < 1e-9);
    let p = vs["welch"]["p"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&p), "{vs}");
    // df of two n = 2 sides lies between 1 and 2.
    let df = vs["welch"]["df"].as_f64().unwrap();
    assert!((1.0..=2.0).contains(&df), "{vs}");
    let ratio = vs["ci_ratio"].as_f64().unwrap();
    assert_eq!(vs["significant"], ratio > 1.0);
    // The trigger reports latency: p50 and p99 rows.
    let trig = metrics.iter().find(|m| m["kind"].as_str().unwrap().starts_with("trigger")).unwrap();
    let kind = trig["kind"].as_str().unwrap();
    assert_eq!(find(kind, "latency p50")["better"], "lower");
    find(kind, "latency p99");
    // Fragmentation and compaction, from run.json and the snapshots.
    for (f, dir) in c["fragment"].as_array().unwrap().iter().zip([a, b]) {
        let run = json(&Path::new(dir).join("run.json"));
        assert_eq!(f["planned"], run["fragment"]["planned"]);
        assert_eq!(f["intact"], run["fragment"]["intact"]);
        assert_eq!(f["target"]["kind"], "max_free_order");
        assert!(f["target_text"].as_str().unwrap().starts_with("no free block of order ≥ 4 (64K)"), "{f}");
    }
    let counters: Vec<&str> =
        c["compaction"].as_array().unwrap().iter().map(|r| r["counter"].as_str().unwrap()).collect();
    assert_eq!(counters, ["compact_stall", "compact_fail", "compact_success"]);
    for (i, dir) in [a, b].iter().enumerate() {
        let before = json(&Path::new(dir).join("baseline.json"));
        let after = json(&Path::new(dir).join("final.json"));
        let want = after["vmstat"]["values"]["compact_stall"].as_i64().unwrap()
            - before["vmstat"]["values"]["compact_stall"].as_i64().unwrap();
        assert_eq!(c["compaction"][0]["deltas"][i].as_i64(), Some(want));
    }
    assert_eq!(c["runs"][0]["compaction_source"], "baseline.json → final.json");

    // Text: seed 004's layout, the baseline at 0.00 pct, the other with its change and tests.
    let (code, text, _) = compare(&[a, b]);
    assert_eq!(code, Some(0));
    for want in [
        "fraglab compare: 2 runs, each against A",
        "warning: A and B: same kernel on both sides: this compares runs, not kernels",
        "#1 tcp-stream: throughput, Mbit/s (higher is better)",
        "latency p99, µs (lower is better)",
        "(0.00 pct)",
        " p=",
        " r=",
        "Significant changes (r > 1)",
        "Fragmentation: target vs achieved",
        "planned",
        "intact",
        "Failed allocations caught in the kernel",
        "Workload failures by errno",
        "compact_success",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    let line = text.lines().skip_while(|l| !l.starts_with("#1 tcp-stream")).nth(2).unwrap();
    let pct = t["sides"][1]["vs_baseline"]["pct"].as_f64().unwrap();
    let want = if pct == 0.0 { "(0.00 pct)".to_string() } else { format!("({pct:+.2} pct)") };
    assert!(line.trim_start().starts_with("- ") && line.contains(&want), "{line:?} lacks {want}");
    assert!(line.contains(&format!("{ma:.2} ±")) && line.contains(&format!("{mb:.2} ±")), "{line}");

    // Markdown, with the user's names.
    let (code, md, stderr) = compare(&[a, b, "--format", "markdown", "--labels", "stock,patched"]);
    assert_eq!(code, Some(0), "{stderr}");
    for want in [
        "# fraglab compare: 2 runs, each against stock",
        "| run | kernel | host | config | status, verdict | directory |",
        "> **Warning:** stock and patched: same kernel on both sides",
        "### #1 tcp-stream: throughput, Mbit/s (higher is better)",
        "| point | stock | patched |",
        "| --- | --- | --- |",
        "## Fragmentation: target vs achieved",
        "| stock planned |",
        "## Compaction counters over the run",
        "| compact_stall |",
    ] {
        assert!(md.contains(want), "{want:?} missing from:\n{md}");
    }
    // Every table row has as many cells as its header.
    for block in md.split("\n\n").filter(|b| b.starts_with('|')) {
        let cells: Vec<usize> = block.lines().map(|l| l.matches(" | ").count()).collect();
        assert!(cells.windows(2).all(|w| w[0] == w[1]), "ragged table:\n{block}");
    }
}

/// Copy a real results directory and let `edit` change its run.json.
fn edited_copy(src: &Path, name: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let dst = scratch(name);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    let mut run = json(&dst.join("run.json"));
    edit(&mut run);
    std::fs::write(dst.join("run.json"), serde_json::to_string_pretty(&run).unwrap()).unwrap();
    dst
}

fn edit_config(run: &mut Value, from: &str, to: &str) {
    let text = run["config"].as_str().unwrap();
    assert!(text.contains(from), "{from:?} not in the config");
    run["config"] = Value::String(text.replacen(from, to, 1));
}

/// Edit the stored plan, which is what compare judges (and the config text with it, as a run of
/// the edited config would have stored both).
fn edit_plan(run: &mut Value, from: &str, to: &str, plan: impl Fn(&mut Value)) {
    edit_config(run, from, to);
    plan(&mut run["plan"]);
}

#[test]
fn refuses_runs_that_measure_different_things() {
    let (a, _) = two_runs();
    let a_str = a.to_str().unwrap();
    let cases: [(&str, &str, &str, &[&str]); 3] = [
        (
            "threads",
            "threads = 2",
            "threads = 4",
            &["[[workload]] #1 (tcp-stream) threads: 2 in A", "4 in B"],
        ),
        (
            "sweep",
            "[[workload]]\nkind = \"tcp-stream\"",
            "[sweep]\nthreads = [1, 2]\n\n[[workload]]\nkind = \"tcp-stream\"",
            &["[sweep] threads: absent in A vs [1,2] in B"],
        ),
        (
            "bytes",
            "bytes = \"16MiB\"",
            "bytes = \"8MiB\"",
            &["[[workload]] #2 (trigger) bytes: \"16MiB\" in A vs \"8MiB\" in B"],
        ),
    ];
    let plans: [fn(&mut Value); 3] = [
        |p| p["workloads"][0]["options"]["threads"] = 4.into(),
        |p| p["sweep"] = serde_json::json!([{"axis": "threads", "values": [1, 2]}]),
        |p| p["workloads"][1]["options"]["bytes"] = "8MiB".into(),
    ];
    for ((name, from, to, wants), plan) in cases.into_iter().zip(plans) {
        let b = edited_copy(a, name, |r| edit_plan(r, from, to, plan));
        let (code, stdout, stderr) = compare(&[a_str, b.to_str().unwrap()]);
        assert_eq!(code, Some(255), "{name}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{name}: nothing on stdout when refused: {stdout}");
        assert!(stderr.contains("measure different things and cannot be compared"), "{name}: {stderr}");
        assert!(stderr.contains(a_str) && stderr.contains(b.to_str().unwrap()), "{name}: {stderr}");
        for want in wants {
            assert!(stderr.contains(want), "{name}: {want:?} missing from: {stderr}");
        }
        let _ = std::fs::remove_dir_all(&b);
    }
}

#[test]
fn accepts_what_may_differ_and_says_what_is_compared() {
    let (a, _) = two_runs();
    let a_str = a.to_str().unwrap();
    // [fragment] differs, same kernel: a comparison of memory states, no same-kernel warning.
    let b = edited_copy(a, "fragment", |r| {
        edit_plan(r, "max_free_order = 4", "max_free_order = 6", |p| {
            p["fragment"]["max_free_order"] = 6.into()
        })
    });
    let (code, stdout, stderr) = compare(&[a_str, b.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("same kernel on both sides"), "{stderr}");
    assert!(
        stdout.contains("note: A and B: same kernel") && stdout.contains("compares memory states"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&b);

    // Another kernel, [run] and [probe] edited: compared, the kernels named.
    let b = edited_copy(a, "kernel", |r| {
        r["kernel_release"] = Value::String("6.19.0-patched".into());
        edit_config(r, "iterations = 2", "iterations = 3");
        edit_config(r, "interval = \"500ms\"", "interval = \"1s\"");
    });
    let (code, stdout, stderr) = compare(&[a_str, b.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    let c: Value = serde_json::from_str(&stdout).unwrap();
    assert!(c["notes"].to_string().contains("6.19.0-patched"), "{}", c["notes"]);
    let _ = std::fs::remove_dir_all(&b);
}

#[test]
fn bad_input_exits_255_with_the_reason() {
    let (a, _) = two_runs();
    let a_str = a.to_str().unwrap();
    let (code, _, stderr) = compare(&[a_str]);
    assert_eq!(code, Some(255));
    assert!(stderr.contains("at least two results directories"), "{stderr}");
    let empty = scratch("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, stderr) = compare(&[a_str, empty.to_str().unwrap()]);
    assert_eq!(code, Some(255));
    assert!(stderr.contains("not a fraglab results directory: it has no run.json"), "{stderr}");
    let missing = empty.join("nope");
    let (code, _, stderr) = compare(&[a_str, missing.to_str().unwrap()]);
    assert_eq!(code, Some(255));
    assert!(stderr.contains(&format!("{}: no such directory", missing.display())), "{stderr}");
    // The parent of results directories: the ones inside are named.
    let parent = a.parent().unwrap();
    let (code, _, stderr) = compare(&[a_str, parent.to_str().unwrap()]);
    assert_eq!(code, Some(255));
    assert!(stderr.contains("pass one of them") && stderr.contains(a_str), "{stderr}");
    let (code, _, stderr) = compare(&[a_str, a_str, "--labels", "one"]);
    assert_eq!(code, Some(255));
    assert!(stderr.contains("--labels gives 1 names for 2 directories"), "{stderr}");
}

#[test]
fn a_baseline_run_of_the_same_config_compares_memory_states() {
    let (a, _) = two_runs();
    let b = baseline_run();
    let run = json(&b.join("run.json"));
    assert!(run["fragment"].is_null(), "--baseline does not fragment");
    assert!(run["config"].as_str().unwrap().contains("[fragment]"), "but its config keeps [fragment]");
    let (code, stdout, stderr) = compare(&[a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !stderr.contains("same kernel on both sides") && !stdout.contains("same [fragment]"),
        "{stderr}{stdout}"
    );
    assert!(
        stdout.contains("note: A and B: same kernel")
            && stdout.contains("different [fragment]: this compares memory states"),
        "{stdout}"
    );
    assert!(stdout.contains("  B  none (not fragmented)"), "{stdout}");
}

/// A real pair from a Debian 6.1 guest (`fraglab vm --kernel debian-cloud -- run
/// configs/pipe-highorder.toml`, then the same with `--baseline`; see captures/README.md): fragmented,
/// every F_SETPIPE_SZ fails with ENOMEM in a fraction of the time a successful one takes.
#[test]
fn a_trigger_failing_on_one_side_only_is_not_compared_on_rate_and_latency() {
    let captures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures");
    let frag = captures.join("pipe-highorder-6.1-fragmented");
    let base = captures.join("pipe-highorder-6.1-baseline");
    let (frag, base) = (frag.to_str().unwrap(), base.to_str().unwrap());
    let why = "A: 0 of 30 failed, B: 30 of 30 failed";

    let (code, stdout, stderr) = compare(&[base, frag, "--format", "json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let c: Value = serde_json::from_str(&stdout).unwrap();
    let metrics = c["metrics"].as_array().unwrap();
    let row = |m: &str| metrics.iter().find(|r| r["metric"] == m).unwrap_or_else(|| panic!("no {m}"));
    for m in ["rate", "latency p50", "latency p99"] {
        let b = &row(m)["sides"][1];
        assert_eq!(b["not_comparable"], why, "{m}: {b}");
        assert!(b["vs_baseline"].is_null(), "{m}: {b}");
        assert_eq!(b["n"], 3, "{m}: the values are still shown");
    }
    // The change that matters: 0 → 10 ENOMEM per iteration, compared and significant.
    let e = &row("errors ENOMEM")["sides"][1];
    assert!(e["not_comparable"].is_null() && e["vs_baseline"]["significant"] == true, "{e}");
    let warning =
        format!("#1 trigger pipe-resize at point -: {why}: its rate and latency count failed calls");
    assert!(c["warnings"].to_string().contains(&warning), "{}", c["warnings"]);
    assert!(stderr.contains(&warning), "{stderr}");
    // Both were written before the results schema (schema 1: config text, no stored plan): they
    // still compare, and the reader is told how their plans were found.
    for (label, dir) in [("A", base), ("B", frag)] {
        let note = format!(
            "{label} ({dir}) was recorded in results schema 1 (fraglab 0.1.0), which stored only its config text"
        );
        assert!(c["notes"].to_string().contains(&note), "{note} not in {}", c["notes"]);
    }
    // The baseline run did not fragment; this one did: memory states, not the same-kernel warning.
    assert!(!c["warnings"].to_string().contains("same kernel"), "{}", c["warnings"]);
    assert!(
        c["notes"].to_string().contains("different [fragment]: this compares memory states"),
        "{}",
        c["notes"]
    );

    let (code, text, _) = compare(&[base, frag]);
    assert_eq!(code, Some(0));
    assert!(text.contains(&format!("(not compared: {why})")), "{text}");
    let significant: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Significant changes"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(
        significant,
        ["  #1 trigger pipe-resize errors ENOMEM at point -: B - pct (worse, p=-, r=inf)"],
        "{text}"
    );
}

/// A results directory from a newer fraglab is refused by name, not misread.
#[test]
fn a_newer_schema_is_refused_naming_it() {
    let (a, _) = two_runs();
    let b = edited_copy(a, "newer", |r| r["schema"] = 99.into());
    let (code, stdout, stderr) = compare(&[a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code, Some(255), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: written in results schema 99, by a newer fraglab",
            b.join("run.json").display()
        )) && stderr.contains("reads schemas 1 to 2"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&b);
}

/// The summary and the report read a schema-1 directory too (the real 6.1 guest run, written before
/// the results schema): its `k=v` labels and phase names come back as points and windows, so each
/// workload's errors are placed on the time line of its own phase.
#[test]
fn the_report_reads_a_schema_1_run_and_places_its_windows() {
    let frag = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures/pipe-highorder-6.1-fragmented");
    let dir = scratch("schema1-report");
    std::fs::create_dir_all(&dir).unwrap();
    let html = dir.join("report.html");
    let out = fraglab(&["report", frag.to_str().unwrap(), "-o", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&html).unwrap();
    // The workload phases make one band, a mark per window.
    for phase in ["workload trigger - #1 1 (", "workload trigger - #3 1 ("] {
        assert!(html.contains(phase), "{phase} not marked");
    }
    // Every ENOMEM row has the time it happened on the run's axis: its window was found.
    let rows: Vec<&str> = html.split("<tr>").filter(|r| r.contains("<td>ENOMEM</td>")).collect();
    assert_eq!(rows.len(), 3, "one row per iteration");
    for r in rows {
        assert!(!r.contains(">–<"), "an ENOMEM row without its time: {r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
