//! Ctrl-C during a long workload of `fraglab run`, for real with the real binary (root): the workload
//! in progress stops instead of running out its duration, its result says it was stopped by the
//! signal and how long it really ran (less than it was asked for), the run exits 130 with run.json
//! marked incomplete/interrupted, and every sysctl it set is back. Baseline runs (no `[fragment]`),
//! so no memory is shaped; the one sysctl they change is the sweep's
//! `net.core.high_order_alloc_disable`.
//!
//! `fraglab run` takes the machine-wide instance lock; these runs queue for it (`FRAGLAB_LOCK_WAIT`)
//! behind whatever else holds it on this machine, and run one at a time.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fraglab_fragmenter::instance::WAIT_ENV;
use nix::sys::signal::Signal;
use serde_json::Value;

mod common;
use common::Running;

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");
/// How long a run started here queues for the instance lock another fraglab holds.
const LOCK_WAIT: Duration = Duration::from_secs(600);
/// What each workload here is asked to run for (tcp-stream's duration, exec's timeout): a run that
/// is interrupted reports less, and says why.
const ASKED_S: f64 = 60.0;
/// The sysctl the configs' sweep sets (to 1), and the ones any fraglab run may change.
const SWEPT: &str = "net.core.high_order_alloc_disable";
const SYSCTLS: [&str; 5] = [
    "vm.compact_unevictable_allowed",
    "vm.compaction_proactiveness",
    "vm.percpu_pagelist_high_fraction",
    "net.core.high_order_alloc_disable",
    "fs.pipe-max-size",
];

static SERIAL: Mutex<()> = Mutex::new(());

fn sysctl(name: &str) -> String {
    let p = Path::new("/proc/sys").join(name.replace('.', "/"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_string()
}

fn sysctls() -> Vec<(String, String)> {
    SYSCTLS.iter().map(|n| (n.to_string(), sysctl(n))).collect()
}

/// fraglab processes other than `mine`: they change the same sysctls.
fn other_fraglabs(mine: u32) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(exe) = std::fs::read_link(e.path().join("exe")) else { continue };
        if pid != mine && exe.file_name().is_some_and(|n| n == "fraglab") {
            found.push(pid.to_string());
        }
    }
    found
}

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(marker) && !cmd.contains("run_interrupt") {
            found.push(format!("{} {cmd}", e.file_name().to_string_lossy()));
        }
    }
    found
}

/// The sysctls are `want` again — unless another fraglab has taken the lock since ours ended and is
/// changing them now: then that is said, not judged.
fn assert_sysctls_back(want: &[(String, String)], mine: u32) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let now = sysctls();
        if now == want {
            return;
        }
        if Instant::now() > deadline {
            let others = other_fraglabs(mine);
            assert!(!others.is_empty(), "the run left sysctls changed: {now:?}, were {want:?}");
            eprintln!("note: sysctls {now:?} differ from {want:?}, but other fraglabs run ({others:?})");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sysctls as the machine has them: read once no fraglab holds the instance lock, since one
/// that holds it (another test binary, an engineer's fragmenter) has them changed for now.
fn idle_sysctls() -> Vec<(String, String)> {
    common::wait_until(LOCK_WAIT, "the instance lock to be free", || {
        fraglab_fragmenter::instance::Instance::holder().is_none_or(|h| !h.still_holding())
    });
    sysctls()
}

/// A scratch directory with the config, the run directory and the results.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, config: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("fraglab-interrupt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("run.toml"), config).unwrap();
        Scratch(d)
    }

    /// The one results directory the run made.
    fn results(&self) -> Option<PathBuf> {
        let dirs: Vec<PathBuf> =
            std::fs::read_dir(self.0.join("out")).ok()?.map(|e| e.unwrap().path()).collect();
        assert!(dirs.len() <= 1, "{dirs:?}");
        dirs.into_iter().next()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `fraglab run run.toml -o out` in the scratch directory, in the background.
fn start(sc: &Scratch) -> Running {
    let run_dir = sc.0.join("run");
    let mut cmd = Command::new(FRAGLAB);
    cmd.arg("--run-dir")
        .arg(&run_dir)
        .args(["run", "run.toml", "-o", "out"])
        .current_dir(&sc.0)
        .env(WAIT_ENV, format!("{}s", LOCK_WAIT.as_secs()));
    Running::spawn(&mut cmd, &run_dir)
}

/// Wait until the run is in its first workload: the results directory has its first probe sample,
/// the sweep point's sysctl is set (right before the workloads start), and `working` sees the
/// workload itself at work (its data moving, its command running). The bound is the lock queue plus
/// a minute: a hang guard, named when it is hit.
fn wait_for_workload(run: &mut Running, sc: &Scratch, working: impl Fn(u32) -> bool) {
    let bound = LOCK_WAIT + Duration::from_secs(60);
    let deadline = Instant::now() + bound;
    loop {
        if let Some(s) = run.child.try_wait().unwrap() {
            panic!("the run ended before its workload ({s}): {}", run.output());
        }
        let sampled =
            sc.results().is_some_and(|d| std::fs::metadata(d.join("probe.jsonl")).is_ok_and(|m| m.len() > 0));
        if sampled && sysctl(SWEPT) == "1" && working(run.child.id()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run was not at work in its workload within {bound:?} (the lock queue plus a minute): {}",
            run.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGINT, then the exit status and how long it took (said, not judged: the result says whether
/// the signal stopped the workload). The 60 s bound is a hang guard.
fn interrupt(run: &mut Running) -> (ExitStatus, Duration) {
    run.signal(Signal::SIGINT);
    let t = Instant::now();
    let status = run.wait_for(Duration::from_secs(60)).unwrap_or_else(|| {
        panic!("the run did not stop within the 60 s hang guard after SIGINT: {}", run.output());
    });
    (status, t.elapsed())
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()))
}

/// What every interrupted run must show: exit 130, the summary and run.json saying interrupted, the
/// swept sysctl restored, one workload result — stopped by the signal, with its real duration, less
/// than the one asked for — and no second workload started. Returns that result.
fn assert_interrupted(sc: &Scratch, run: &mut Running, before: &[(String, String)]) -> Value {
    let pid = run.child.id();
    let (status, took) = interrupt(run);
    eprintln!("SIGINT: exited with {status} after {:.2} s", took.as_secs_f64());
    assert_eq!(status.code(), Some(130), "interrupted runs exit 130: {}", run.output());
    let out = run.output();
    assert!(out.contains("— incomplete; verdict: interrupted"), "the summary says so: {out}");
    assert!(out.contains("results: "), "{out}");

    let d = sc.results().expect("a results directory");
    let r = read_json(&d.join("run.json"));
    assert_eq!(r["status"], "incomplete", "{r:#}");
    assert_eq!(r["verdict"], "interrupted", "{r:#}");
    assert!(r["reason"].as_str().unwrap().starts_with("interrupted by a signal"), "{r:#}");
    assert!(!r["finished"].is_null() && r["fragment"].is_null(), "{r:#}");
    let restored: Vec<&str> =
        r["sysctls_restored"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    let original = &before.iter().find(|(n, _)| n == SWEPT).unwrap().1;
    assert_eq!(restored, [format!("{SWEPT} = {original}")], "{r:#}");
    let phases: Vec<&str> =
        r["phases"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    let ran: Vec<&&str> = phases.iter().filter(|p| p.starts_with("workload ")).collect();
    assert_eq!(ran.len(), 1, "only the interrupted workload ran: {phases:?}");
    for want in ["baseline", "monitors", "release", "final"] {
        assert!(phases.contains(&want), "phase {want} missing: {phases:?}");
    }

    let w = read_json(&d.join("workloads.json"));
    let w = w["workloads"].as_array().unwrap();
    assert_eq!(w.len(), 1, "{w:#?}");
    let result = w[0]["result"].clone();
    assert_eq!(result["details"]["stopped_by_signal"], true, "{result:#}");
    let duration = result["duration_s"].as_f64().unwrap();
    assert!(duration < ASKED_S, "the real duration, not the {ASKED_S} s asked for: {duration}");
    let note = result["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|n| n.starts_with("stopped by a signal after "));
    eprintln!("{}: {}", result["kind"], note.unwrap_or("no stopped note"));
    assert!(note.is_some(), "{result:#}");

    // Nothing left behind.
    assert!(!run.run_dir.join("sysctl.journal").exists() && !run.run_dir.join("trigger.journal").exists());
    assert_sysctls_back(before, pid);
    result
}

/// `workload`, then (when `then_more`) a trigger the run must never reach. Without it the signal
/// stops the run's last workload, after which no check at the top of the loop comes to see it.
fn baseline_config(workload: &str, then_more: bool) -> String {
    let more = if then_more {
        "# Never reached: the run stops first.\n[[workload]]\nkind = \"trigger\"\ntrigger = \"pipe-resize\"\n\
         bytes = \"16MiB\"\nrepeat = 1\n"
    } else {
        ""
    };
    format!(
        "[run]\nname = \"interrupt\"\ndescription = \"a long workload, then Ctrl-C\"\n\n[probe]\ninterval = \
         \"200ms\"\n\n[sweep]\nsysctl.\"{SWEPT}\" = [1]\n\n{workload}\n{more}"
    )
}

#[test]
fn sigint_stops_a_60s_tcp_stream_at_once_and_restores_the_sysctls() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let before = idle_sysctls();
    let sc = Scratch::new(
        "tcp",
        &baseline_config(
            "[[workload]]\nkind = \"tcp-stream\"\nthreads = 2\nduration = \"60s\"\nmsg = \"16KiB\"\n",
            true,
        ),
    );
    let mut run = start(&sc);
    // Its data is moving: the signal lands in the middle of the stream, with bytes to report.
    wait_for_workload(&mut run, &sc, |pid| common::tcp_bytes_received(Some(pid)) > 0);
    let r = assert_interrupted(&sc, &mut run, &before);
    assert_eq!(r["kind"], "tcp-stream");
    assert!(r["bytes"].as_u64().unwrap() > 0 && r["failed"] == 0, "{r:#}");
    assert_eq!(r["details"]["receiver_bytes"], r["bytes"], "{r:#}");
    let note = r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|n| n.starts_with("stopped"))
        .unwrap();
    assert!(note.ends_with("s of the 60s asked for"), "{note}");
}

#[test]
fn sigint_stops_an_exec_workload_and_its_whole_process_group_even_as_the_last_workload() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let before = idle_sysctls();
    // A marker no other process has, in the grandchild's command line: it must go too.
    let marker = format!("60.{}", std::process::id());
    let sc = Scratch::new(
        "exec",
        &baseline_config(&format!(
            "[[workload]]\nkind = \"exec\"\ntimeout = \"60s\"\ncommand = [\"sh\", \"-c\", \"sleep {marker} & echo \
             started; wait\"]\n"
            ),
            false,
        ),
    );
    let mut run = start(&sc);
    // Its command is running (the grandchild, which must go too, with it).
    wait_for_workload(&mut run, &sc, |_| !processes_with(&format!("sleep {marker}")).is_empty());
    let r = assert_interrupted(&sc, &mut run, &before);
    assert_eq!(r["kind"], "exec");
    assert_eq!((r["ok"].as_u64(), r["failed"].as_u64()), (Some(0), Some(1)), "{r:#}");
    assert_eq!(r["details"]["signal"], "SIGTERM", "the command got SIGTERM: {r:#}");
    assert_eq!(r["details"]["timed_out"], false);
    assert!(r["details"]["stdout"].as_str().unwrap().contains("started"), "{r:#}");
    let left = processes_with(&format!("sleep {marker}"));
    assert!(left.is_empty(), "the command's group outlived the run: {left:?}");
}
