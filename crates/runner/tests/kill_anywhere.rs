//! Fault injection: SIGKILL a `fraglab run` in every phase it goes through — populating, cutting,
//! freeing, settling, starting the monitors, each workload while the catcher runs, releasing — and a
//! `fraglab fragment --daemon` while it populates. After the next fraglab command (any command: here
//! `probe`), every sysctl is back, the dead process's tracefs instance is gone, nothing it started
//! lives on, and the run's run.json says `incomplete` and in which phase it died. Over more than
//! twenty kills, nothing may be lost.
//!
//! A kill lands in a phase by watching run.json's `phase`, which the run writes as it goes — the
//! same record a user reads — not by timing. Phases too short to be seen (cutting a small budget
//! takes milliseconds) are aimed at again with another budget; the kills that land elsewhere still
//! count, attributed to where they landed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

mod common;
use common::{command, fraglab, sysctls_at_rest, wait_until, Running};

/// A run with every phase: a budget to fragment, the catcher, a TCP workload, and a trigger that
/// raises fs.pipe-max-size through its own journal.
const CONFIG: &str = r#"
[run]
name = "killed"
iterations = 1

[fragment]
max_free_order = 4
budget = "BUDGET"

[probe]
interval = "200ms"
catch_min_order = 3

[[workload]]
kind = "tcp-stream"
threads = 1
duration = "2s"

[[workload]]
kind = "trigger"
trigger = "pipe-resize"
bytes = "16MiB"
repeat = 20
"#;

/// The phases a run goes through, in order, as run.json's `phase` names them (a prefix of it).
const PHASES: [&str; 9] = [
    "fragment: populating",
    "fragment: cutting",
    "fragment: freeing",
    "fragment: settling",
    "monitors",
    "workload tcp-stream",
    "workload trigger",
    "release",
    "final",
];

/// Phases every run spends long enough in to be hit each time it is aimed at.
const MUST_HIT: [&str; 5] =
    ["fragment: populating", "fragment: settling", "workload tcp-stream", "workload trigger", "release"];

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-kill-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The tracefs instances a catcher of process `pid` made.
fn instances_of(pid: i32) -> Vec<String> {
    let Ok(d) = std::fs::read_dir("/sys/kernel/tracing/instances") else { return Vec::new() };
    d.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n == &format!("fraglab-{pid}") || n.starts_with(&format!("fraglab-{pid}-")))
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// The run's results directory and its run.json, once there is one that parses (it is replaced by
/// rename, so a read never sees half a file, but the directory comes first).
fn run_json(out: &Path) -> Option<(PathBuf, serde_json::Value)> {
    let dir = std::fs::read_dir(out).ok()?.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| p.is_dir())?;
    let v = serde_json::from_slice(&std::fs::read(dir.join("run.json")).ok()?).ok()?;
    Some((dir, v))
}

fn index_of(phase: &str) -> Option<usize> {
    PHASES.iter().position(|p| phase.starts_with(p))
}

/// One kill: start the run, SIGKILL it as soon as run.json says it is in `aim` (or at the first
/// phase after it, if `aim` went by between two looks), then check what the next command repairs.
/// Returns the phase it was killed in; `None` when the run had just ended (try again).
fn kill_run_in(aim: &str, budget: &str, dir: &Path, before: &[String]) -> Option<String> {
    let out = scratch("out");
    let config = out.join("killed.toml");
    std::fs::write(&config, CONFIG.replace("BUDGET", budget)).unwrap();
    let results = out.join("results");
    let mut run = Running::spawn(
        command(dir).args(["run", config.to_str().unwrap(), "-o", results.to_str().unwrap()]),
        dir,
    );
    let want = index_of(aim).unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let phase = loop {
        if !run.running() {
            // Its last phase went by between two looks: aim again.
            assert!(index_of(aim).unwrap() >= index_of("release").unwrap(), "ended early: {}", run.output());
            std::fs::remove_dir_all(&out).unwrap();
            return None;
        }
        assert!(Instant::now() < deadline, "no phase {aim} within 600 s (a hang guard): {}", run.output());
        if let Some(p) = run_json(&results).and_then(|(_, v)| v["phase"].as_str().map(String::from)) {
            if index_of(&p).is_some_and(|i| i >= want) {
                break p;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let pid = run.pid();
    // Frozen first, so what run.json says is where it dies: a run aimed at `final` may otherwise write
    // its verdict and exit between the look and the kill.
    run.signal(Signal::SIGSTOP);
    let (_, record) = run_json(&results).expect("run.json");
    if record["status"] != "running" {
        run.signal(Signal::SIGCONT);
        run.wait_for(Duration::from_secs(60)).expect("the run ends");
        std::fs::remove_dir_all(&out).unwrap();
        return None;
    }
    let phase = record["phase"].as_str().map_or(phase, String::from);
    let children = common::children(pid as u32);
    run.signal(Signal::SIGKILL);
    run.wait_for(Duration::from_secs(30)).expect("SIGKILL ends it");

    // Any command repairs what it left.
    let probe = fraglab(dir, &["probe", "--json"]);
    assert!(probe.status.success(), "{}", String::from_utf8_lossy(&probe.stderr));
    let said = String::from_utf8_lossy(&probe.stderr).into_owned();
    let at = format!("killed in {phase} (aimed at {aim}, budget {budget})");
    assert_eq!(sysctls_at_rest(dir, &at), before, "{at}: sysctls; the probe said: {said}");
    assert!(instances_of(pid).is_empty(), "{at}: tracefs instances left: {:?}; {said}", instances_of(pid));
    wait_until(Duration::from_secs(30), &format!("{at}: its children {children:?} end"), || {
        children.iter().all(|&c| !alive(c))
    });
    let (_, record) = run_json(&results).expect("run.json");
    assert_eq!(record["status"], "incomplete", "{at}: {record}");
    let reason = record["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("pid {pid} died")) && reason.contains("phase"), "{at}: {reason}");
    std::fs::remove_dir_all(&out).unwrap();
    Some(phase)
}

#[test]
fn sigkill_in_every_phase_of_a_run_loses_nothing() {
    let _s = serial();
    let dir = scratch("run-dir");
    let before = sysctls_at_rest(&dir, "before");
    // Budgets of several sizes and alignments: cutting and freeing take longer with more memory.
    let budgets = ["256MiB", "393220KiB", "768MiB"];
    let mut landed: BTreeMap<String, u32> = BTreeMap::new();
    let mut kills = 0;
    for (round, budget) in budgets.iter().enumerate() {
        for aim in PHASES {
            // A run that ended between the look and the freeze is started again, a few times at most.
            let phase = (0..5)
                .find_map(|_| kill_run_in(aim, budget, &dir, &before))
                .unwrap_or_else(|| panic!("aimed at {aim} five times; every run ended first"));
            eprintln!("round {round}: aimed at {aim}, killed in {phase}");
            let name = PHASES[index_of(&phase).unwrap()];
            *landed.entry(name.to_string()).or_default() += 1;
            kills += 1;
        }
    }
    eprintln!("{kills} kills: {landed:?}");
    assert!(kills >= 20);
    for phase in MUST_HIT {
        assert!(landed.get(phase).is_some_and(|&n| n >= budgets.len() as u32), "{phase}: {landed:?}");
    }
}

/// `fraglab fragment --daemon` SIGKILLed while it populates: its foreground half says it stopped
/// before holding, and the next command restores every sysctl.
#[test]
fn sigkill_of_a_populating_daemon_loses_nothing() {
    let _s = serial();
    let dir = scratch("daemon");
    let before = sysctls_at_rest(&dir, "before");
    let mut in_populating = 0;
    for budget in ["1GiB", "1572868KiB", "2GiB"] {
        let mut daemon = Running::spawn(
            command(&dir).args(["fragment", "--max-free-order", "4", "--budget", budget, "--daemon"]),
            &dir,
        );
        let mut pid = None;
        wait_until(Duration::from_secs(600), "the daemon says it is populating", || {
            assert!(daemon.running(), "it ended before populating: {}", daemon.output());
            let out = fraglab(&dir, &["status", "--json"]);
            let s: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
            pid = s
                .filter(|s| s["shaping"].as_str().is_some_and(|p| p.starts_with("populating")))
                .map(|s| s["pid"].as_i64().unwrap() as i32);
            pid.is_some()
        });
        let pid = pid.unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        let code = daemon.wait_for(Duration::from_secs(60)).expect("the foreground half ends").code();
        // The kill comes a moment after the look: a budget can finish shaping in between, and then
        // the foreground half has already said it holds.
        if code == Some(0) {
            assert!(daemon.stderr().contains("holding in the background"), "{}", daemon.output());
        } else {
            assert_eq!(code, Some(1), "{}", daemon.output());
            assert!(daemon.stderr().contains("stopped before holding"), "{}", daemon.output());
            in_populating += 1;
        }

        let probe = fraglab(&dir, &["probe", "--json"]);
        assert!(probe.status.success(), "{}", String::from_utf8_lossy(&probe.stderr));
        let at = format!("daemon killed while populating {budget}");
        assert_eq!(sysctls_at_rest(&dir, &at), before, "{at}");
        assert!(!alive(pid as u32), "{at}");
    }
    assert!(in_populating > 0, "no kill landed while populating");
}
