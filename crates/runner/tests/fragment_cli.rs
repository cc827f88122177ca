//! `fraglab fragment`, `status` and `release` as a user runs them, on real memory (256 MiB budgets).
//! Each test uses its own run directory, and they run one at a time: sysctls are machine-wide. So is
//! the instance lock: the fraglabs started here wait for it (`FRAGLAB_LOCK_WAIT`) when another test
//! binary or a user holds it, except where a test wants to see a refusal.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

/// How long a fraglab started here queues for the machine-wide instance lock.
const LOCK_WAIT: Duration = Duration::from_secs(600);

/// `fraglab --run-dir DIR`, queueing for the instance lock.
fn command(dir: &Path) -> Command {
    let mut c = Command::new(FRAGLAB);
    c.arg("--run-dir").arg(dir).env(fraglab_fragmenter::instance::WAIT_ENV, "600s");
    c
}

fn run_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn fraglab(dir: &Path, args: &[&str]) -> Output {
    command(dir).args(args).output().unwrap()
}

/// [`fraglab`] refused at once, not queued, when another fraglab holds the lock.
fn fraglab_now(dir: &Path, args: &[&str]) -> Output {
    command(dir).env_remove(fraglab_fragmenter::instance::WAIT_ENV).args(args).output().unwrap()
}

fn sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/vm/{name}")).unwrap().trim().to_string()
}

/// The two sysctls every mlock hold changes.
fn held_sysctls() -> (String, String) {
    (sysctl("compact_unevictable_allowed"), sysctl("percpu_pagelist_high_fraction"))
}

/// What a holder in `dir` found, from its journal: read while it holds the lock, these are the
/// machine's own values, whatever other fraglabs did before.
fn originals(dir: &Path) -> (String, String) {
    let text = std::fs::read_to_string(dir.join("sysctl.journal")).unwrap();
    let original = |name: &str| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} not journaled: {text}"))["original"]
            .as_str()
            .unwrap()
            .to_string()
    };
    (original("vm.compact_unevictable_allowed"), original("vm.percpu_pagelist_high_fraction"))
}

/// The sysctls are back at `want` — unless another fraglab (another test binary, a user) has taken the
/// machine-wide lock since ours let go, and changed them itself.
fn assert_restored(want: &(String, String), what: &str) {
    let now = held_sysctls();
    if &now != want {
        if let Some(h) = fraglab_fragmenter::instance::Instance::holder().filter(|h| h.still_holding()) {
            eprintln!("note: {what}: sysctls {now:?}, not {want:?}, but fraglab {h} holds the lock now");
            return;
        }
    }
    assert_eq!(&now, want, "{what}");
}

/// A foreground fragmenter; if a test fails while it holds, SIGTERM makes it release and restore.
struct Held(Child);

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0.id() as i32),
                nix::sys::signal::SIGTERM,
            );
            let _ = self.0.wait();
        }
    }
}

/// Start a foreground fragmenter and wait until it answers on its socket.
fn hold(dir: &Path, budget: &str) -> Held {
    let child = command(dir)
        .args(["fragment", "--max-free-order", "4", "--budget", budget])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Held(child);
    let deadline = Instant::now() + LOCK_WAIT + Duration::from_secs(60);
    // The socket answers from the start; `shaping` in the reply means it does not hold yet.
    let holding = |dir: &Path| {
        let out = fraglab(dir, &["status", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|s| s.get("shaping").is_none())
    };
    while !holding(dir) {
        assert!(child.0.try_wait().unwrap().is_none(), "fragmenter exited before holding");
        assert!(Instant::now() < deadline, "fragmenter did not start holding within 60 s of the lock");
        std::thread::sleep(Duration::from_millis(200));
    }
    child
}

#[test]
fn sigkill_mid_hold_is_repaired_by_the_next_command() {
    let _s = SERIAL.lock().unwrap();
    let dir = run_dir("kill");
    let mut child = hold(&dir, "256MiB");
    let before = originals(&dir);
    assert_eq!(sysctl("compact_unevictable_allowed"), "0");
    child.0.kill().unwrap(); // SIGKILL: no handler runs
    child.0.wait().unwrap();
    if dir.join("sysctl.journal").exists() {
        assert_eq!(
            sysctl("compact_unevictable_allowed"),
            "0",
            "nothing restored yet: the journal must do it"
        );
    }

    let out = fraglab(&dir, &["status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("restored from its journal") {
        assert!(stderr.contains("vm.compact_unevictable_allowed = 1"), "{stderr}");
    } else {
        // The lock is machine-wide: a fraglab of another test binary waiting for it, whatever its run
        // directory, may have taken it first and replayed the dead one's journal.
        assert!(!dir.join("sysctl.journal").exists(), "nobody restored the journal: {stderr}");
        eprintln!("note: another fraglab on this machine restored the journal first");
    }
    assert_restored(&before, "restored from the journal");

    // The dead daemon's socket file must not block a new fragmenter.
    let mut again = hold(&dir, "128MiB");
    assert!(fraglab(&dir, &["release"]).status.success());
    assert!(again.0.wait().unwrap().success());
    assert_restored(&before, "after the release");
}

#[test]
fn second_fragmenter_refuses_naming_the_first_and_socket_survives_garbage() {
    let _s = SERIAL.lock().unwrap();
    let dir = run_dir("two");
    let mut first = hold(&dir, "256MiB");
    let out = fraglab_now(&dir, &["fragment", "--max-free-order", "4", "--budget", "64MiB"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("pid {}", first.0.id())), "{stderr}");

    // Malformed and oversized requests get an error reply; the holder keeps serving.
    for req in ["hello\n".to_string(), "{\"cmd\":\"explode\"}\n".into(), format!("{}\n", "x".repeat(10_000))]
    {
        let mut s = UnixStream::connect(dir.join("fraglab.sock")).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut reply = String::new();
        std::io::Read::read_to_string(&mut s, &mut reply).unwrap();
        assert!(reply.contains("\"ok\":false"), "{reply}");
    }
    let meta = std::fs::metadata(dir.join("fraglab.sock")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600);
    assert!(fraglab(&dir, &["status"]).status.success());
    assert!(fraglab(&dir, &["release"]).status.success());
    assert!(first.0.wait().unwrap().success());
}

#[test]
fn daemon_holds_until_release() {
    let _s = SERIAL.lock().unwrap();
    let dir = run_dir("daemon");
    let out = fraglab(&dir, &["fragment", "--max-free-order", "3", "--budget", "256MiB", "--daemon"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(report.contains("budget 256.00 MiB, no free block of order ≥ 3 (32K)"), "{report}");
    assert!(report.contains("; pin mlock"), "{report}");
    // The human status reads as the report does: no Rust Debug formatting.
    let human = fraglab(&dir, &["status"]);
    let human = String::from_utf8_lossy(&human.stdout).to_string();
    for text in [&report, &human] {
        assert!(text.contains("; pin mlock"), "{text}");
        for leak in ["Mlock", "Some(", "MaxFreeOrder"] {
            assert!(!text.contains(leak), "{leak:?} in:\n{text}");
        }
    }
    let status = fraglab(&dir, &["status", "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(s["planned"][0].as_u64().unwrap() > 1000, "{s}");
    assert_eq!(s["planned"][3], 0);
    let before = originals(&dir);
    assert!(fraglab(&dir, &["release"]).status.success());
    assert!(!fraglab(&dir, &["status"]).status.success(), "still holding after release");
    assert_restored(&before, "after the release");
}

/// A budget's profile: `status` measures it against the cut's blocks still free, zone by zone and
/// order by order, when the hold began and now — target, achieved and tolerance in `--json`, a line
/// each in the human status; a max-free-order hold has no such figure. Profiles of several shapes
/// and budgets, with and without a zone, so no figure lines up by chance.
#[test]
fn a_budget_profile_has_its_fidelity_measured_when_the_hold_begins_and_now() {
    let _s = SERIAL.lock().unwrap();
    let dir = run_dir("fidelity");
    for (profile, budget, zone) in [
        ("Node 0, zone Normal 4000 37 34 29 0 0 0 0 0 0 0", "64MiB", "Node 0, zone Normal"),
        ("1500 700 301 150 77 40 0 0 0 0 0", "96MiB", "all zones"),
        (
            "Normal: 999*4kB (UME) 97*8kB (UM) 12*16kB (M) 5*32kB (M) 1*64kB (M) 3*128kB = 5572kB",
            "40MiB",
            "Node 0, zone Normal",
        ),
    ] {
        let out = fraglab(&dir, &["fragment", "--profile", profile, "--budget", budget, "--daemon"]);
        assert!(out.status.success(), "{profile}: {}", String::from_utf8_lossy(&out.stderr));
        let s: serde_json::Value =
            serde_json::from_slice(&fraglab(&dir, &["status", "--json"]).stdout).expect("status --json");
        let human = String::from_utf8_lossy(&fraglab(&dir, &["status"]).stdout).into_owned();
        assert!(fraglab(&dir, &["release"]).status.success());
        let numbers = |v: &serde_json::Value| -> Vec<u64> {
            v.as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect()
        };
        eprintln!("{profile} in {budget}: {} {}", s["fidelity_at_hold"], s["bounds"]);
        let asked: Vec<u64> =
            numbers(&s["planned"]).iter().zip(numbers(&s["missing"])).map(|(p, m)| p + m).collect();
        let region_order = asked.iter().rposition(|&n| n > 0).unwrap() + 1;
        for key in ["fidelity_at_hold", "fidelity"] {
            let f = &s[key];
            assert_eq!(f["measure"], "intact", "{profile} {key}: {f}");
            assert_eq!(f["orders"], region_order as u64, "{profile} {key}: {f}");
            let zones = f["zones"].as_array().unwrap();
            assert_eq!(zones.len(), 1, "{profile} {key}: {f}");
            let z = &zones[0];
            assert_eq!(z["zone"], zone, "{profile} {key}: {f}");
            // The target is the profile as cut (planned + missing), the achieved the cut's blocks
            // still free, the tolerance 10 % and 16 blocks; within exactly when no order is short.
            let (target, achieved, tol) =
                (numbers(&z["target"]), numbers(&z["achieved"]), numbers(&z["tolerance"]));
            let asked: Vec<u64> =
                numbers(&s["planned"]).iter().zip(numbers(&s["missing"])).map(|(p, m)| p + m).collect();
            assert_eq!(target, asked[..region_order], "{profile} {key}: {f}");
            assert!(achieved.iter().zip(&target).all(|(a, t)| a <= t), "{profile} {key}: {f}");
            assert_eq!(tol, target.iter().map(|t| t / 10 + 16).collect::<Vec<_>>(), "{profile} {key}: {f}");
            let short = target.iter().zip(&achieved).zip(&tol).any(|((t, a), d)| a + d < *t);
            assert_eq!(z["within"], !short, "{profile} {key}: {f}");
            assert_eq!(f["within"], !short, "{profile} {key}: {f}");
        }
        eprintln!("{profile} in {budget}: {} {}", s["fidelity_at_hold"], s["bounds"]);
        for when in ["when the hold began", "now"] {
            assert!(
                human.contains(&format!(
                    "profile fidelity {when} (the cut's blocks still free against the profile"
                )),
                "{human}"
            );
        }
        assert!(human.contains(&format!("  {zone}: asked ")), "{human}");
    }
    // A max-free-order hold has no fidelity figure: its check is the keeper's record.
    let out = fraglab(&dir, &["fragment", "--max-free-order", "4", "--budget", "64MiB", "--daemon"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&fraglab(&dir, &["status", "--json"]).stdout).unwrap();
    assert!(fraglab(&dir, &["release"]).status.success());
    assert!(s.get("fidelity").is_none() && s.get("fidelity_at_hold").is_none(), "{s}");
}

/// Dry runs whose plan must say what will happen for each kind of target: (args, must say, must not).
type DryRun = (Vec<&'static str>, Vec<&'static str>, Vec<&'static str>);

fn whole_machine_and_scaled_dry_runs() -> Vec<DryRun> {
    let meminfo = "Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) = 3016kB";
    let seed = "Node 0, zone Normal 40773 37 34 29 0 0 0 0 0 0 0";
    vec![
        // Whole machine, profile: no pipe fill happens, so none may be promised; below order 4 no
        // trade either.
        (
            vec!["fragment", "--profile", meminfo, "--dry-run"],
            vec![
                "target:   whole machine, profile of zone Normal: free blocks per order 512 97 12 0",
                "the reserve keeps its own free blocks beside the profile's",
                "fits unscaled",
                "!! WHOLE MACHINE on this host",
                "--budget SIZE",
            ],
            vec!["then pipe pages", "[512"],
        ),
        // Seed 000's profile, whole machine: the reserve's blocks of order ≥ 4 are traded.
        (
            vec!["fragment", "--profile", seed, "--dry-run"],
            vec!["then the reserve's free blocks of order ≥ 4 are traded", "keep:     re-break"],
            vec!["then pipe pages"],
        ),
        // Whole machine, max free order 4 and up: the keeper's rings take the reserve's blocks.
        (
            vec!["fragment", "--max-free-order", "4", "--dry-run"],
            vec![
                "target:   whole machine, no free block of order ≥ 4 (64K)",
                "then the keeper's rings take the blocks of order ≥ 4 still free in the reserve",
                "!! WHOLE MACHINE on this host",
            ],
            vec!["pipe pages"],
        ),
        // Whole machine, max free order below the rings' smallest: the pipe fill does run.
        (
            vec!["fragment", "--max-free-order", "3", "--dry-run"],
            vec![
                "target:   whole machine, no free block of order ≥ 3 (32K)",
                "then pipe pages",
                "blocks of order ≥ 3 still free in the reserve",
                "!! WHOLE MACHINE on this host",
            ],
            vec!["MaxFreeOrder"],
        ),
        // A line's node and zone are where it is cut; one node needs no binding.
        (
            vec!["fragment", "--profile", seed, "--budget", "256MiB", "--dry-run"],
            vec![
                "profile of Node 0, zone Normal: free blocks per order 40773 37",
                "zone:     Node 0, zone Normal (frames ",
                "the cut frees pages there only; pages taken elsewhere are given back",
            ],
            vec!["node:     "],
        ),
        // A lower zone is a whole-machine target.
        (
            vec!["fragment", "--profile", "Node 0, zone DMA32 40 3 2 1", "--dry-run"],
            vec![
                "whole machine, profile of Node 0, zone DMA32",
                "zone:     Node 0, zone DMA32 (frames 4096–",
            ],
            vec![],
        ),
        // Seed 000's profile needs ≈ 322 MiB: in a 128 MiB budget it is scaled, and the plan says so.
        (
            vec!["fragment", "--profile", seed, "--budget", "128MiB", "--dry-run"],
            vec![
                "SCALED by 0.3975 to fit the 128.00 MiB budget",
                "40773 37 34 29 0 0 0 0 0 0 0 → 16208 14 13 11 0 0 0 0 0 0 0",
            ],
            vec!["WHOLE MACHINE", "pipe pages"],
        ),
    ]
}

#[test]
fn bad_input_is_refused_with_no_side_effect() {
    let _s = SERIAL.lock().unwrap();
    let dir = run_dir("bad");
    let before = held_sysctls();
    // Another fraglab's hold ending meanwhile would change them back: no side effect of ours.
    let held_elsewhere = fraglab_fragmenter::instance::Instance::holder().is_some_and(|h| h.still_holding());
    let cases: &[(&[&str], &str)] = &[
        (&["--max-free-order", "11"], "largest order is 10"),
        (&["--max-free-order", "4", "--budget", "100TiB"], "more than this machine can give"),
        (&["--max-free-order", "4", "--budget", "1GB"], "binary units"),
        (&["--max-free-order", "4", "--budget", "64MiB", "--free", "1GiB"], "--free"),
        (&["--profile", "Node 0, zone Normal 1 2 x"], "--profile"),
        (&["--profile", "Normal: 1*4kB 1*8kB = 16kB"], "add up to 12kB"),
        (&["--max-free-order", "4", "--reserve", "1MiB"], "min_free_kbytes"),
        // Nodes and zones this machine (one node: DMA, DMA32, Normal) does not have, or cannot
        // shape in a budget: refused before anything is taken.
        (
            &["--profile", "Node 3, zone Normal 4000 37 34 29 0 0 0 0 0 0 0", "--budget", "256MiB"],
            "--profile \"Node 3, zone Normal 4000 37 34 29 0 0 0 0 0 0 0\": node 3 does not exist here: \
             this machine has memory on node 0 (/proc/zoneinfo). Shape one of those with --node, or boot a \
             guest with node 3 (`fraglab vm --numa 4`)",
        ),
        (&["--max-free-order", "4", "--budget", "64MiB", "--node", "3"], "--node = 3: node 3 does not exist"),
        (
            &["--max-free-order", "4", "--budget", "64MiB", "--node", "4294967295"],
            "`fraglab vm --numa` boots at most 8 nodes, not the 4294967296 this needs",
        ),
        (&["--profile", "Node 0 Movable: 1*4kB = 4kB", "--budget", "64MiB"], "Node 0, zone Movable does not exist here: node 0 has DMA, DMA32, Normal"),
        (
            &["--profile", "Node 0, zone DMA32 40 3 2 1", "--budget", "64MiB"],
            "Node 0, zone DMA32 with a budget: user pages come from node 0's highest zone, Normal, and reach \
             DMA32 only once Normal is exhausted",
        ),
        (&["--profile", "Node 0, zone DMA 1 1 1"], "zone DMA cannot be shaped"),
        (&["--profile", "Node 0, zone Normal 1 1 1", "--node", "1", "--budget", "64MiB"], "--node = 1, but the profile line is node 0's"),
        (&["--max-free-order", "4", "--node", "0"], "--node = 0 without a budget: the whole-machine mode shapes every node"),
    ];
    for (args, want) in cases {
        let mut all = vec!["fragment"];
        all.extend_from_slice(args);
        let out = fraglab(&dir, &all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!dir.exists(), "{args:?} took the instance lock (or created {})", dir.display());
    }
    let dry = fraglab(&dir, &["fragment", "--max-free-order", "4", "--budget", "1GiB", "--dry-run"]);
    assert!(dry.status.success());
    let plan = String::from_utf8_lossy(&dry.stdout);
    assert!(plan.contains("nothing taken"));
    assert!(plan.contains("target:   budget 1.00 GiB, no free block of order ≥ 4 (64K)"), "{plan}");
    assert!(plan.contains("pin:      mlock:"), "{plan}");
    assert!(!plan.contains("Mlock") && !plan.contains("WHOLE MACHINE"), "{plan}");
    assert!(!plan.contains("pipe pages"), "a budget has no pipe fill: {plan}");
    for (args, want, not) in whole_machine_and_scaled_dry_runs() {
        let out = fraglab(&dir, &args);
        let plan = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        for w in want {
            assert!(plan.contains(w), "{args:?}: {w:?} missing in:\n{plan}");
        }
        for n in not {
            assert!(!plan.contains(n), "{args:?}: {n:?} in:\n{plan}");
        }
    }
    if !held_elsewhere {
        assert_restored(&before, "refused and dry-run commands");
    }
    assert!(!dir.exists(), "a refused or dry-run command created {}", dir.display());
}
