//! Safety under faults (issue 8), done for real with the real binary on this machine: memory pressure
//! while holding, SIGKILL mid-run, SIGINT/SIGTERM during a run, missing kernel features, two fraglabs
//! at once. See docs/safety.md for what fraglab changes and how each change is put back.
//!
//! Every test has its own run directory under /tmp and they run one at a time (sysctls are
//! machine-wide). Other fraglabs on a shared machine (other run directories, the fragmenter's own
//! tests, fragment_bench) change the same sysctls: when a value check finds one of them running, it
//! says so and skips that check instead of failing on someone else's change. The instance lock is
//! machine-wide too: every fraglab started here queues for it (`FRAGLAB_LOCK_WAIT`) except the ones
//! meant to be refused ([`fraglab_now`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fraglab_fragmenter::instance::{Instance, LOCK_FILE, WAIT_ENV};
use fraglab_probe::kmsg::KmsgWatcher;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod common;
use common::{vm_lck, Hog, Running};

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// How long a fraglab started here queues for the instance lock another test binary or a user holds.
const LOCK_WAIT: Duration = Duration::from_secs(600);

/// Every sysctl fraglab may change: the fragmenter's and the triggers'.
const SYSCTLS: [&str; 7] = [
    "vm.percpu_pagelist_high_fraction",
    "vm.lowmem_reserve_ratio",
    "vm.compact_unevictable_allowed",
    "vm.compaction_proactiveness",
    "vm.nr_hugepages",
    "fs.pipe-max-size",
    "net.core.optmem_max",
];

static SERIAL: Mutex<()> = Mutex::new(());
/// Pids this test process started (children and daemons): not "other fraglabs".
static MINE: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn mine(pid: i32) {
    MINE.lock().unwrap_or_else(|p| p.into_inner()).push(pid);
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-safety-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `fraglab --run-dir DIR`, queueing for the instance lock.
fn command(run_dir: &Path) -> Command {
    let mut c = Command::new(FRAGLAB);
    c.arg("--run-dir").arg(run_dir).current_dir(repo()).env(WAIT_ENV, format!("{}s", LOCK_WAIT.as_secs()));
    c
}

fn fraglab(run_dir: &Path, args: &[&str]) -> Output {
    command(run_dir).args(args).output().unwrap()
}

/// [`fraglab`] refused at once, not queued, when another fraglab holds the instance lock.
fn fraglab_now(run_dir: &Path, args: &[&str]) -> Output {
    command(run_dir).env_remove(WAIT_ENV).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn sysctl(name: &str) -> String {
    let p = Path::new("/proc/sys").join(name.replace('.', "/"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_string()
}

fn sysctls() -> Vec<(String, String)> {
    SYSCTLS.iter().map(|n| (n.to_string(), sysctl(n))).collect()
}

/// A /proc/meminfo field in bytes.
fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text.lines().find(|l| l.split(':').next() == Some(key)).unwrap_or_else(|| panic!("no {key}"));
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn vmstat(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/vmstat"))
}

fn tracefs_mounted() -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts.lines().any(|l| l.split_whitespace().nth(2) == Some("tracefs"))
}

/// The tracefs instances the catcher of process `pid` made (`fraglab-<pid>`, `fraglab-<pid>-<n>`).
fn instances_of(pid: i32) -> Vec<String> {
    fraglab_instances()
        .into_iter()
        .filter(|n| n == &format!("fraglab-{pid}") || n.starts_with(&format!("fraglab-{pid}-")))
        .collect()
}

fn fraglab_instances() -> Vec<String> {
    std::fs::read_dir("/sys/kernel/tracing/instances")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("fraglab-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Processes other than ours that may change the same sysctls right now.
fn others() -> Vec<String> {
    let mine = MINE.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        if pid == me || mine.contains(&pid) {
            continue;
        }
        let Ok(exe) = std::fs::read_link(e.path().join("exe")) else { continue };
        let name = exe.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if name == "fraglab" || name == "fragment_bench" || name.starts_with("hold-") {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            found.push(format!("{pid} {}", String::from_utf8_lossy(&cmd).replace('\0', " ").trim()));
        }
    }
    found
}

/// [`others`], and the programs that move MemAvailable by gigabytes (compilers, guests).
fn busy() -> Vec<String> {
    let mut found = others();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) else { continue };
        let comm = comm.trim();
        if ["rustc", "clippy-driver", "rust-lld", "cc1", "ld"].contains(&comm)
            || comm.starts_with("qemu-system")
        {
            found.push(format!("{} {comm}", e.file_name().to_string_lossy()));
        }
    }
    found
}

/// The sysctls are `want` again — unless another fraglab on this machine is changing them.
fn assert_sysctls(want: &[(String, String)], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let now: Vec<(String, String)> = want.iter().map(|(n, _)| (n.clone(), sysctl(n))).collect();
        if now == want {
            return;
        }
        if Instant::now() > deadline {
            let others = others();
            if others.is_empty() {
                assert_eq!(now, want, "{what}");
            }
            eprintln!("note: {what}: sysctls {now:?} differ from {want:?}, but other fraglabs run here ({others:?}); not judged");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The entries of a sysctl journal: (name, original).
fn journal(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["original"].as_str().unwrap().to_string()))
        .collect()
}

fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until no fraglab holds the instance lock, so what is measured next is the machine without
/// another test binary's or user's hold (one may still start right after: judged as usual).
fn wait_for_idle_lock() {
    wait_until(LOCK_WAIT, "the instance lock to be free", || {
        Instance::holder().is_none_or(|h| !h.still_holding())
    });
}

/// Whether another fraglab may have replayed a journal this test left for its next command: the lock
/// is machine-wide, so any fraglab that takes it — whatever its run directory — restores a dead
/// holder's journal first. `others` is [`others`] sampled around the kill and the command.
fn recovered_elsewhere(journal: &Path, err: &str, others: &[String]) -> bool {
    if err.contains("died holding sysctls; restored from its journal") {
        return false;
    }
    assert!(!journal.exists(), "the journal was left and not restored: {err}");
    assert!(!others.is_empty(), "the journal is gone, but no fraglab said it restored it: {err}");
    eprintln!("note: another fraglab restored the dead one's journal first ({others:?})");
    true
}

/// A fraglab in the background (see [`common::Running`]), registered as this test binary's.
fn start(run_dir: &Path, args: &[&str]) -> Running {
    let run = Running::spawn(command(run_dir).args(args), run_dir);
    mine(run.pid());
    run
}

/// A child of `pid` runs `sleep ARG` (an exec workload of that run).
fn sleeping(pid: i32, arg: &str) -> bool {
    common::children(pid as u32).iter().any(|c| {
        std::fs::read(format!("/proc/{c}/cmdline"))
            .is_ok_and(|cmd| cmd == format!("sleep\0{arg}\0").as_bytes())
    })
}

/// How often the main thread of `pid` has gone to sleep by itself (voluntary_ctxt_switches).
fn voluntary_switches(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .map_or(0, |n| n.trim().parse().unwrap())
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// A `fraglab fragment --daemon` holding in `dir`; released when dropped.
struct Daemon {
    dir: PathBuf,
    pid: i32,
}

impl Daemon {
    fn start(dir: &Path, budget: &str) -> Daemon {
        let out = fraglab(dir, &["fragment", "--max-free-order", "4", "--budget", budget, "--daemon"]);
        assert!(out.status.success(), "daemon: {}", stderr(&out));
        let holder = Instance::holder().expect("the daemon's record in the lock file");
        assert_eq!(holder.run_dir.as_deref(), Some(dir), "the lock is held for another run dir: {holder}");
        let pid = holder.pid as i32;
        mine(pid);
        assert!(stderr(&out).contains(&format!("pid {pid}")), "{}", stderr(&out));
        Daemon { dir: dir.to_path_buf(), pid }
    }

    fn release(&self) {
        let out = fraglab(&self.dir, &["release"]);
        assert!(out.status.success(), "release: {}", stderr(&out));
        wait_until(Duration::from_secs(30), "the daemon to exit after release", || !alive(self.pid));
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if alive(self.pid) {
            let _ = fraglab(&self.dir, &["release"]);
            let deadline = Instant::now() + Duration::from_secs(30);
            while alive(self.pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if alive(self.pid) {
                let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
            }
        }
    }
}

/// The fragmenter in `dir` holds: `status` answers, and no longer with where shaping stands (it
/// answers while it still takes memory too, with a `shaping` field).
fn holds(dir: &Path) -> bool {
    let out = fraglab(dir, &["status", "--json"]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|s| s.get("shaping").is_none())
}

fn status_json(dir: &Path) -> serde_json::Value {
    let out = fraglab(dir, &["status", "--json"]);
    let s: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("status: {e}: {}", stderr(&out)));
    // Exit 0 exactly when the target holds now.
    assert_eq!(out.status.success(), s["now"]["holds"].as_bool().unwrap(), "{s}");
    s
}

/// The one results directory a run made under `out`.
fn results_dir(out: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(out).ok()?.map(|e| e.unwrap().path()).collect();
    assert!(dirs.len() <= 1, "{dirs:?}");
    dirs.pop()
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}\n{text}", path.display()))
}

/// 1. Another process allocates while fraglab holds: fraglab gives memory back before the OOM killer
///    acts, logs it, and its status records the lost target.
#[test]
fn memory_pressure_while_holding_gives_memory_back_before_the_oom_killer() {
    let _s = serial();
    let dir = scratch("pressure");
    wait_for_idle_lock();
    let avail = meminfo("MemAvailable");
    if avail < 6 * GIB {
        return common::skip(format!(
            "MemAvailable is {} MiB; this test wants 6 GiB so every step stays far above the watermarks",
            avail >> 20
        ));
    }
    let before = sysctls();
    let oom_kills = vmstat("oom_kill");
    let mut kmsg = KmsgWatcher::open().unwrap();
    // The guard acts 1.5 GiB below what is available now, instead of near the watermarks, so
    // ~2 GiB of pressure is enough to make it act.
    let floor = avail - 3 * GIB / 2;
    let floor_arg = format!("{floor}B");
    let mut f =
        start(&dir, &["fragment", "--max-free-order", "4", "--budget", "512MiB", "--floor", &floor_arg]);
    wait_until(LOCK_WAIT + Duration::from_secs(90), "the fragmenter to answer `fraglab status`", || {
        assert!(f.running(), "the fragmenter exited before holding: {}", f.stderr());
        holds(&dir)
    });
    let s = status_json(&dir);
    assert!(s["target_lost"].is_null() && s["events"].as_array().unwrap().is_empty(), "{s}");
    let held = s["held_bytes"].as_u64().unwrap();
    let locked = vm_lck(f.pid());
    let holding_avail = meminfo("MemAvailable");
    assert!(held > 0 && locked > 0, "held {held}, VmLck {locked}");

    // The pressure: 256 MiB at a time, touched, until MemAvailable is below fraglab's floor; about
    // 2 GiB on a quiet machine (more if other programs free memory meanwhile, at most 6 GiB). Then
    // the test holds that and waits for fraglab to give back: what is judged is that it did (its
    // log, status and mlocked memory) and that the OOM killer never acted, not how fast. The test
    // never takes MemAvailable below 3 GiB, and lets go of its memory as soon as fraglab has acted.
    let step = 256 * MIB;
    let mut hogs = Vec::new();
    let mut crossed: Option<Instant> = None;
    let mut trace = Vec::new();
    while !f.stderr().contains("gave back") {
        assert!(f.running(), "the fragmenter died under pressure: {}", f.stderr());
        let now = meminfo("MemAvailable");
        trace.push(format!("{} MiB taken, MemAvailable {} MiB", (hogs.len() as u64 * step) >> 20, now >> 20));
        if crossed.is_none() && now < floor {
            crossed = Some(Instant::now());
        }
        match crossed {
            // A hang guard only: the guard looks every 200 ms, so a minute is a guard that never acts.
            Some(t) => assert!(
                t.elapsed() < Duration::from_secs(60),
                "MemAvailable below the floor for the 60 s hang guard and nothing given back: {}",
                f.stderr()
            ),
            None => {
                assert!(
                    (hogs.len() as u64) * step < 6 * GIB,
                    "6 GiB taken and MemAvailable never fell below the floor {} MiB: {trace:#?}",
                    floor >> 20
                );
                assert!(now > 3 * GIB + step, "MemAvailable {} MiB: too low to go on safely", now >> 20);
                hogs.push(Hog::take(step as usize));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let taken = hogs.len() as u64 * step;
    let after_guard = vm_lck(f.pid());
    drop(hogs);
    eprintln!(
        "MemAvailable {} MiB before fraglab, {} MiB while it held; floor {} MiB; it gave back after {} MiB \
         of pressure: {trace:?}",
        avail >> 20,
        holding_avail >> 20,
        floor >> 20,
        taken >> 20
    );
    let err = f.stderr();
    assert!(err.contains("fell below the floor") && err.contains("target lost"), "{err}");
    let s = status_json(&dir);
    assert!(s["target_lost"].as_str().is_some_and(|t| t.contains("memory pressure")), "{s}");
    let events = s["events"].as_array().unwrap();
    assert!(!events.is_empty() && events[0].as_str().unwrap().contains("gave back"), "{s}");
    assert!(s["held_bytes"].as_u64().unwrap() < held, "held_bytes did not go down: {s}");
    assert!(after_guard < locked, "the fragmenter's mlocked memory did not go down");
    // Status says so, and exits 1: the give-backs with their times and sizes, the target lost now.
    assert_eq!(s["now"]["holds"], false, "{s}");
    let gave = s["give_backs"].as_array().unwrap();
    assert!(!gave.is_empty() && gave.iter().all(|g| g["bytes"].as_u64().unwrap() > 0), "{s}");
    let bytes = |g: &serde_json::Value, k: &str| g[k].as_u64().unwrap_or_else(|| panic!("{k} in {g}"));
    assert!(gave.iter().all(|g| bytes(g, "mem_available_bytes") < bytes(g, "floor_bytes")), "{s}");
    let human = fraglab(&dir, &["status"]);
    assert_eq!(human.status.code(), Some(1));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("TARGET LOST now: memory pressure"), "{text}");
    // More may follow between the two requests.
    assert!(text.contains("guard: gave back ") && text.contains(" give-back(s), "), "{text}");

    // Nobody was OOM-killed, and the kernel did not even consider it.
    assert_eq!(vmstat("oom_kill"), oom_kills, "the OOM killer acted");
    for r in kmsg.read_available().unwrap() {
        let m = &r.message;
        assert!(
            !m.contains("Out of memory") && !m.contains("invoked oom-killer") && !m.contains("oom-kill:"),
            "kernel log: {m}"
        );
    }
    assert!(fraglab(&dir, &["release"]).status.success());
    assert!(f.wait_for(Duration::from_secs(30)).expect("exits after release").success());
    assert!(f.stderr().contains("released; restored"), "{}", f.stderr());
    assert_sysctls(&before, "after the release");
    assert_eq!(vmstat("oom_kill"), oom_kills);
}

/// 1b. The same during `fraglab run` (a config's `[fragment] floor`): the run's guard gives memory
///     back in the middle of a workload, and run.json records the lost target and could-not-test.
#[test]
fn memory_pressure_during_a_run_is_recorded_as_target_lost() {
    let _s = serial();
    wait_for_idle_lock();
    let avail = meminfo("MemAvailable");
    if avail < 6 * GIB {
        return common::skip(format!(
            "MemAvailable is {} MiB; this test wants 6 GiB of headroom",
            avail >> 20
        ));
    }
    let dir = scratch("run-pressure");
    let out = scratch("run-pressure-results");
    let config = scratch("run-pressure-config");
    std::fs::create_dir_all(&config).unwrap();
    let floor = avail - 3 * GIB / 2;
    let path = config.join("pressure.toml");
    // Order 2 over 256 MiB: whole aligned 16 KiB regions are found even on a machine that earlier
    // runs left fragmented. One 30 s workload: the run's guard must act while it runs, which is seen
    // as the workload's `sleep` (its argument marked with this test's pid) still running then.
    let sleep_arg = format!("30.{}", std::process::id());
    std::fs::write(
        &path,
        format!(
            "[run]\nname = \"pressure\"\niterations = 1\n\n[fragment]\nmax_free_order = 2\nbudget = \"256MiB\"\n\
             floor = \"{floor}B\"\n\n[probe]\ninterval = \"500ms\"\n\n[[workload]]\nkind = \"exec\"\n\
             command = [\"sleep\", \"{sleep_arg}\"]\n"
        ),
    )
    .unwrap();
    let before = sysctls();
    let oom_kills = vmstat("oom_kill");
    let mut kmsg = KmsgWatcher::open().unwrap();
    let mut run = start(&dir, &["run", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let pid = run.pid();
    wait_until(LOCK_WAIT + Duration::from_secs(120), "the run to reach its workloads", || {
        assert!(run.running(), "the run ended early: {}{}", run.stdout(), run.stderr());
        !instances_of(pid).is_empty()
    });
    let locked = vm_lck(pid);
    assert!(locked > 0, "the run holds no mlocked memory");
    // Pressure while the workloads run, until the run's guard has given memory back (its mlocked
    // memory shrinks): at most 6 GiB, never taking MemAvailable below 3 GiB. Once below the floor
    // the test only waits; that the guard acted in the middle of the workload is judged by the
    // workload still running when the memory came back, not by a time.
    let step = 256 * MIB;
    let mut hogs = Vec::new();
    let mut crossed: Option<Instant> = None;
    let mut trace = Vec::new();
    while vm_lck(pid) >= locked {
        assert!(run.running(), "the run ended under pressure: {}{}\n{trace:?}", run.stdout(), run.stderr());
        let now = meminfo("MemAvailable");
        trace.push(format!("{} MiB taken, MemAvailable {} MiB", (hogs.len() as u64 * step) >> 20, now >> 20));
        if crossed.is_none() && now < floor {
            crossed = Some(Instant::now());
        }
        match crossed {
            // Nothing to do but wait: the loop ends when the mlocked memory shrinks — by the guard,
            // or at the latest by the release after the 30 s workload, which the check below
            // refuses — and run.running() above ends it if the run does.
            Some(_) => {}
            None => {
                assert!(
                    (hogs.len() as u64) * step < 6 * GIB,
                    "6 GiB taken, never below the floor: {trace:?}"
                );
                assert!(now > 3 * GIB + step, "MemAvailable {} MiB: too low to go on safely", now >> 20);
                hogs.push(Hog::take(step as usize));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let workload_running = sleeping(pid, &sleep_arg);
    drop(hogs);
    assert!(
        workload_running,
        "the mlocked memory shrank only after the workload ended (MemAvailable below the floor {} MiB \
         since {:?} ago): the guard did not act during it: {trace:?}",
        floor >> 20,
        crossed.map(|t| t.elapsed())
    );
    let status = run.wait_for(Duration::from_secs(120)).expect("the run ends");
    let all = format!("{}{}", run.stdout(), run.stderr());
    assert_eq!(status.code(), Some(125), "{all}");

    let r = read_json(&results_dir(&out).unwrap().join("run.json"));
    assert_eq!(r["verdict"], "could-not-test", "{r}");
    assert!(r["reason"].as_str().unwrap().contains("target was lost"), "{r}");
    let f = &r["fragment"];
    assert!(f["target_lost"].as_str().is_some_and(|t| t.contains("memory pressure")), "{f}");
    assert!(!f["events"].as_array().unwrap().is_empty(), "{f}");
    assert!(r["errors"].as_array().unwrap().iter().any(|e| e.as_str().unwrap().contains("gave back")), "{r}");
    assert_eq!(vmstat("oom_kill"), oom_kills, "the OOM killer acted");
    for rec in kmsg.read_available().unwrap() {
        assert!(
            !rec.message.contains("Out of memory") && !rec.message.contains("invoked oom-killer"),
            "{}",
            rec.message
        );
    }
    assert_sysctls(&before, "after the run");
}

/// 2. SIGKILL in the middle of `fraglab run` (while it fragments): the next fraglab command restores
///    every sysctl from the journal and says so, and marks the run's results incomplete; a new daemon
///    starts in the same run directory.
#[test]
fn sigkill_mid_run_is_repaired_by_the_next_command() {
    let _s = serial();
    let dir = scratch("kill");
    let out = scratch("kill-results");
    let before = sysctls();
    let mut run = start(&dir, &["run", "configs/quickstart.toml", "-o", out.to_str().unwrap()]);
    let journal_path = dir.join("sysctl.journal");
    wait_until(
        LOCK_WAIT + Duration::from_secs(120),
        "run.json and vm.compact_unevictable_allowed = 0",
        || {
            assert!(run.running(), "the run ended early: {}{}", run.stdout(), run.stderr());
            results_dir(&out).is_some_and(|d| d.join("run.json").exists())
                && journal(&journal_path).iter().any(|(n, _)| n == "vm.compact_unevictable_allowed")
                && sysctl("vm.compact_unevictable_allowed") == "0"
        },
    );
    // Read before the kill: once it is dead, any fraglab on this machine may replay it.
    let entries = journal(&journal_path);
    run.signal(Signal::SIGKILL);
    let status = run.wait_for(Duration::from_secs(10)).expect("SIGKILL ends it");
    let mut around = others();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
    assert!(instances_of(run.pid()).is_empty(), "killed before the monitors: no tracefs instance yet");
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"vm.percpu_pagelist_high_fraction"), "{entries:?}");
    if journal_path.exists() {
        assert_eq!(journal(&journal_path), entries);
        assert_eq!(
            sysctl("vm.compact_unevictable_allowed"),
            "0",
            "nothing restored yet: the journal must do it"
        );
    }

    // What a killed run leaves: run.json is valid, still "running", with no finish time.
    let run_json = read_json(&results_dir(&out).unwrap().join("run.json"));
    assert_eq!(run_json["status"], "running");
    assert!(run_json["finished"].is_null());

    // Any command repairs it, and says what it put back.
    let probe = fraglab(&dir, &["probe", "--json"]);
    assert!(probe.status.success(), "{}", stderr(&probe));
    serde_json::from_slice::<serde_json::Value>(&probe.stdout).expect("probe still prints its JSON");
    let err = stderr(&probe);
    around.extend(others());
    if !recovered_elsewhere(&journal_path, &err, &around) {
        for (name, original) in &entries {
            assert!(err.contains(&format!("{name} = {original}")), "{name} not reported restored: {err}");
        }
    }
    assert!(!journal_path.exists(), "the journal is removed once restored");
    assert_sysctls(&entries, "restored from the journal");
    // ... and the dead run's results no longer claim to be running (whichever fraglab found it dead).
    let run_json = read_json(&results_dir(&out).unwrap().join("run.json"));
    assert_eq!(run_json["status"], "incomplete", "{run_json}");
    assert!(run_json["reason"].as_str().unwrap().contains("died during the run"), "{run_json}");
    assert!(!run_json["finished"].is_null());
    let again = fraglab(&dir, &["probe", "--json"]);
    assert!(!stderr(&again).contains("restored"), "restored twice: {}", stderr(&again));

    // The dead run's lock file and run directory do not block a new daemon.
    let d = Daemon::start(&dir, "256MiB");
    assert_eq!(status_json(&dir)["pid"], d.pid);
    d.release();
    assert_sysctls(&before, "after the daemon's release");
}

/// 2b. SIGKILL while a trigger has raised its sysctl (and the catcher's tracefs instance is up): the
///     next command restores both journals; the next run removes the dead run's tracefs instance.
#[test]
fn sigkill_mid_trigger_restores_both_journals() {
    let _s = serial();
    // Another fraglab's trigger may have raised it for now; with none holding the lock, what is
    // read is the machine's own value.
    wait_for_idle_lock();
    let max = sysctl("fs.pipe-max-size").parse::<u64>().unwrap();
    if max >= 16 * MIB {
        return common::skip(format!(
            "fs.pipe-max-size is {max}, already ≥ 16 MiB: a 16 MiB pipe-resize would not raise it"
        ));
    }
    let dir = scratch("kill-trigger");
    let out = scratch("kill-trigger-results");
    let config = scratch("kill-trigger-config");
    std::fs::create_dir_all(&config).unwrap();
    let long = config.join("long-trigger.toml");
    std::fs::write(
        &long,
        "[run]\nname = \"long-trigger\"\n\n[fragment]\nmax_free_order = 2\nbudget = \"256MiB\"\n\n\
         [probe]\ninterval = \"500ms\"\n\n[[workload]]\nkind = \"trigger\"\ntrigger = \"pipe-resize\"\n\
         bytes = \"16MiB\"\nrepeat = 2000000\n",
    )
    .unwrap();
    let before = sysctls();
    let trigger_journal = dir.join("trigger.journal");
    let mut run = start(&dir, &["run", long.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    wait_until(LOCK_WAIT + Duration::from_secs(120), "the trigger to raise fs.pipe-max-size", || {
        assert!(run.running(), "the run ended early: {}{}", run.stdout(), run.stderr());
        journal(&trigger_journal).iter().any(|(n, _)| n == "fs.pipe-max-size")
            && sysctl("fs.pipe-max-size") == "16777216"
    });
    let pid = run.pid();
    // Read before the kill: once it is dead, any fraglab on this machine may replay the fragmenter's
    // journal (the trigger's is replayed only from this run directory).
    let fragmenter = journal(&dir.join("sysctl.journal"));
    let trigger = journal(&trigger_journal);
    run.signal(Signal::SIGKILL);
    run.wait_for(Duration::from_secs(10)).expect("SIGKILL ends it");
    let mut around = others();
    assert!(!fragmenter.is_empty() && !trigger.is_empty());
    assert_eq!(sysctl("fs.pipe-max-size"), "16777216", "nothing restored yet");
    assert!(!instances_of(pid).is_empty(), "the catcher's instance was up during the workloads");

    let probe = fraglab(&dir, &["probe", "--json"]);
    let err = stderr(&probe);
    assert!(probe.status.success(), "{err}");
    around.extend(others());
    let mut reported = trigger.clone();
    if !recovered_elsewhere(&dir.join("sysctl.journal"), &err, &around) {
        assert!(err.contains("a previous fraglab died holding sysctls"), "{err}");
        reported.extend(fragmenter.iter().cloned());
    }
    assert!(err.contains("a previous trigger died holding sysctls"), "{err}");
    for (name, original) in &reported {
        assert!(err.contains(&format!("{name} = {original}")), "{name}: {err}");
    }
    assert!(!dir.join("sysctl.journal").exists() && !trigger_journal.exists());
    assert_sysctls(&before, "both journals restored");

    // The dead run's tracefs instance is removed by the next run's catcher (a quick baseline run).
    let cleanup = config.join("cleanup.toml");
    std::fs::write(
        &cleanup,
        "[run]\nname = \"cleanup\"\n\n[fragment]\nenabled = false\n\n[probe]\ninterval = \"500ms\"\n\n\
         [[workload]]\nkind = \"exec\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let next = fraglab(&dir, &["run", cleanup.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    assert!(instances_of(pid).is_empty(), "the dead run's tracefs instance is still there");
    assert_sysctls(&before, "after the next run");
}

/// 3. SIGINT or SIGTERM while `fraglab run`'s workloads run: it stops by itself, releases memory,
///    restores sysctls, removes its tracefs instance and leaves a valid run.json marked incomplete.
fn interrupt_run(sig: Signal) {
    let name = format!("{sig:?}").to_lowercase();
    let dir = scratch(&name);
    let out = scratch(&format!("{name}-results"));
    let before = sysctls();
    let mounted_before = tracefs_mounted();
    let avail_before = meminfo("MemAvailable");
    let locked_before = meminfo("Mlocked");
    let mut run = start(&dir, &["run", "configs/quickstart.toml", "-o", out.to_str().unwrap()]);
    let pid = run.pid();
    // The catcher's instance appears when the monitors start, right before the first workload.
    wait_until(LOCK_WAIT + Duration::from_secs(120), "the run to reach its workloads", || {
        assert!(run.running(), "the run ended early: {}{}", run.stdout(), run.stderr());
        !instances_of(pid).is_empty()
    });
    // Inside the first workload, the 3 s tcp-stream: its data is moving.
    wait_until(Duration::from_secs(60), "the run's tcp-stream to move data", || {
        assert!(run.running(), "the run ended early: {}{}", run.stdout(), run.stderr());
        common::tcp_bytes_received(Some(pid as u32)) > 0
    });
    assert!(vm_lck(pid) > 0, "the run holds mlocked memory while its workloads run");

    // Two fraglabs at once, the other way round: while the run holds, a fragmenter and a second
    // run in the same run directory refuse, naming it.
    let second = fraglab_now(&dir, &["fragment", "--max-free-order", "4", "--budget", "64MiB"]);
    assert!(!second.status.success());
    assert!(stderr(&second).contains(&format!("pid {pid}")), "{}", stderr(&second));

    run.signal(sig);
    let t = Instant::now();
    let status =
        run.wait_for(Duration::from_secs(60)).expect("the run did not stop within 60 s of the signal");
    eprintln!("{sig:?}: exited with {status} after {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(status.code(), Some(130), "it must exit by itself, as interrupted: {status}");
    assert!(run.stderr().contains("results:"), "{}", run.stderr());
    assert!(run.stdout().contains("— incomplete; verdict:"), "the summary must say so: {}", run.stdout());

    let d = results_dir(&out).expect("a results directory");
    let r = read_json(&d.join("run.json"));
    assert_eq!(r["status"], "incomplete", "{r}");
    assert_eq!(r["verdict"], "interrupted", "{r}");
    assert!(r["reason"].as_str().unwrap().contains("interrupted"), "{r}");
    assert!(!r["finished"].is_null());
    let restored: Vec<&str> =
        r["sysctls_restored"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert!(restored.iter().any(|s| s.starts_with("vm.compact_unevictable_allowed = ")), "{restored:?}");
    if d.join("workloads.json").exists() {
        assert!(read_json(&d.join("workloads.json"))["workloads"].is_array());
    }
    for line in std::fs::read_to_string(d.join("probe.jsonl")).unwrap().lines() {
        serde_json::from_str::<serde_json::Value>(line).expect("every probe.jsonl line is whole JSON");
    }
    assert!(std::fs::read_to_string(repo().join("configs/quickstart.toml")).unwrap() == r["config"]);

    // Nothing left behind.
    assert!(!dir.join("sysctl.journal").exists() && !dir.join("trigger.journal").exists());
    assert!(!dir.join("fraglab.sock").exists());
    assert!(instances_of(pid).is_empty(), "tracefs instance left: {:?}", instances_of(pid));
    if !mounted_before && tracefs_mounted() && fraglab_instances().is_empty() {
        panic!("tracefs was not mounted before the run and is mounted after it");
    }
    assert_sysctls(&before, &format!("after {sig:?}"));
    // Its memory is back: the mlocked total exactly (compilers and other programs do not mlock), and
    // MemAvailable near its start (within 1 GiB: other programs on the machine come and go).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (locked, avail) = (meminfo("Mlocked"), meminfo("MemAvailable"));
        if locked <= locked_before + 64 * MIB && avail + GIB >= avail_before {
            break;
        }
        if Instant::now() > deadline {
            let busy = busy();
            assert!(
                !busy.is_empty(),
                "Mlocked {} MiB (was {} MiB), MemAvailable {} MiB (was {} MiB) after the run",
                locked >> 20,
                locked_before >> 20,
                avail >> 20,
                avail_before >> 20
            );
            eprintln!("note: memory not back to where it was, but the machine is busy: {busy:?}");
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The next command has nothing to repair.
    assert!(!stderr(&fraglab(&dir, &["probe", "--json"])).contains("restored"));
}

#[test]
fn sigint_during_run_stops_cleanly_and_marks_results_incomplete() {
    let _s = serial();
    interrupt_run(Signal::SIGINT);
}

#[test]
fn sigterm_during_run_stops_cleanly_and_marks_results_incomplete() {
    let _s = serial();
    interrupt_run(Signal::SIGTERM);
}

fn have_sctp() -> bool {
    // SAFETY: a plain socket(2); the descriptor is closed at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
    if fd >= 0 {
        // SAFETY: closing the descriptor just opened.
        unsafe { libc::close(fd) };
    }
    fd >= 0
}

/// 4. A run that needs a kernel feature this machine lacks (SCTP) is refused with exit 125 and a
///    clear message before anything is taken: run.json says could-not-test and why, nothing else.
#[test]
fn missing_sctp_exits_125_before_anything_is_taken() {
    let _s = serial();
    if have_sctp() {
        // Not run in the guest (only workload_sctp is): on a host with SCTP nothing covers it.
        return common::skip_covered_elsewhere(
            "no-sctp",
            "this kernel has SCTP",
            "a host without SCTP, such as the CI machine",
        );
    }
    let dir = scratch("nosctp");
    let out = scratch("nosctp-results");
    let config = scratch("nosctp-config");
    std::fs::create_dir_all(&config).unwrap();
    let path = config.join("sctp.toml");
    std::fs::write(
        &path,
        "[run]\nname = \"nosctp\"\n\n[fragment]\nmax_free_order = 4\nbudget = \"256MiB\"\n\n\
         [[workload]]\nkind = \"sctp-connect\"\nassociations = 1\nstreams = 10\n",
    )
    .unwrap();
    let before = sysctls();
    let run = fraglab(&dir, &["run", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let all = format!("{}{}", String::from_utf8_lossy(&run.stdout), stderr(&run));
    assert_eq!(run.status.code(), Some(125), "{all}");
    assert!(all.contains("no SCTP"), "{all}");
    assert!(all.contains("could-not-test"), "{all}");

    // Only run.json, finished, with the verdict and its reason: no baseline, no samples, no lock.
    let d = results_dir(&out).expect("a results directory with the verdict");
    let files: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, ["run.json"], "a half-done run");
    let r = read_json(&d.join("run.json"));
    assert_eq!(r["verdict"], "could-not-test");
    assert_eq!(r["status"], "complete");
    assert!(r["reason"].as_str().unwrap().contains("no SCTP"), "{r}");
    assert!(r["fragment"].is_null() && r["phases"].as_array().unwrap().is_empty(), "{r}");
    // Taking the instance lock creates the run directory (a refused or unlocked command does not).
    assert!(!dir.exists(), "the instance lock was taken");
    assert_sysctls(&before, "a run refused for a missing feature");

    let w = fraglab(&dir, &["workload", "sctp-connect", "--associations", "1", "--streams", "10"]);
    assert_eq!(w.status.code(), Some(125), "{}", stderr(&w));
    assert!(stderr(&w).contains("no SCTP"), "{}", stderr(&w));
}

/// 4b. Not root: no pagemap PFNs, no mlock, no sysctls. Refused with a clear message before anything
///     is created; the exit status is not a verdict (not 0/1), so `git bisect run` does not count it.
#[test]
fn not_root_is_refused_before_anything_is_taken() {
    let _s = serial();
    let base = scratch("notroot");
    std::fs::create_dir_all(&base).unwrap();
    std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let before = sysctls();
    let mut cmd = Command::new(FRAGLAB);
    cmd.arg("--run-dir")
        .arg(base.join("rd"))
        .args(["run", "configs/quickstart.toml", "-o"])
        .arg(base.join("out"))
        .current_dir(repo());
    // SAFETY: setgid/setuid between fork and exec, async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            nix::unistd::setgroups(&[]).map_err(std::io::Error::from)?;
            nix::unistd::setgid(nix::unistd::Gid::from_raw(65534)).map_err(std::io::Error::from)?;
            nix::unistd::setuid(nix::unistd::Uid::from_raw(65534)).map_err(std::io::Error::from)
        });
    }
    let out = cmd.output().unwrap();
    let err = stderr(&out);
    assert!(err.contains("needs root"), "{err}");
    let code = out.status.code();
    assert!(matches!(code, Some(125) | Some(255)), "exit {code:?} would be read as a verdict: {err}");
    assert!(!base.join("rd").exists() && !base.join("out").exists(), "a refused run created files");
    assert_sysctls(&before, "a refused non-root run");
}

/// 5. Two fraglabs at once: while a daemon holds, `fraglab run` refuses naming the daemon's pid and
///    changes nothing of the daemon's or the kernel's.
#[test]
fn run_refuses_while_a_daemon_holds() {
    let _s = serial();
    let dir = scratch("two");
    let out = scratch("two-results");
    let before = sysctls();
    let d = Daemon::start(&dir, "256MiB");
    let holding = sysctls();
    let journal_text = std::fs::read_to_string(dir.join("sysctl.journal")).unwrap();
    let lock_text = std::fs::read_to_string(LOCK_FILE).unwrap();
    let status = status_json(&dir);

    let run = fraglab_now(&dir, &["run", "configs/quickstart.toml", "-o", out.to_str().unwrap()]);
    let err = stderr(&run);
    assert_eq!(run.status.code(), Some(255), "{err}");
    assert!(err.contains("another fraglab is running") && err.contains(&format!("pid {}", d.pid)), "{err}");

    assert!(alive(d.pid), "the holder died");
    assert_eq!(std::fs::read_to_string(dir.join("sysctl.journal")).unwrap(), journal_text);
    assert_eq!(std::fs::read_to_string(LOCK_FILE).unwrap(), lock_text);
    assert_sysctls(&holding, "a refused run while a daemon holds");
    let after = status_json(&dir);
    assert_eq!(after["pid"], status["pid"]);
    assert_eq!(after["held_bytes"], status["held_bytes"]);
    assert!(after["target_lost"].is_null());
    // Refused before anything was written: no results directory (a run that never started has no
    // results to compare or report).
    assert!(!out.exists(), "a refused run created -o {}", out.display());

    d.release();
    assert_sysctls(&before, "after the daemon's release");
}

/// 5b. The instance lock is machine-wide, whatever `--run-dir` says. While a daemon holds, a fraglab
///     with another run directory is refused, naming it and changing nothing; with
///     `FRAGLAB_LOCK_WAIT` it waits, says once whom for, and goes ahead only once the daemon has
///     restored everything, so it journals the machine's own values. (With a lock per run directory
///     the second one held at once, journaled the daemon's changed values as originals and "restored"
///     those at its end, leaving the machine changed.)
#[test]
fn another_run_dir_is_refused_or_waits_while_a_daemon_holds() {
    let _s = serial();
    let (a, b) = (scratch("lock-a"), scratch("lock-b"));
    let out = scratch("lock-b-results");
    let before = sysctls();
    let d = Daemon::start(&a, "128MiB");
    let originals = journal(&a.join("sysctl.journal"));
    assert!(originals.iter().any(|(n, _)| n == "vm.compact_unevictable_allowed"), "{originals:?}");
    let holding = sysctls();
    let lock_text = std::fs::read_to_string(LOCK_FILE).unwrap();
    let journal_text = std::fs::read_to_string(a.join("sysctl.journal")).unwrap();

    // Refused at once: a daemon and a run, each with another run directory.
    let frag = fraglab_now(&b, &["fragment", "--max-free-order", "4", "--budget", "64MiB", "--daemon"]);
    if frag.status.success() {
        let _ = fraglab(&b, &["release"]);
        panic!("a second daemon held beside the first: {}", stderr(&frag));
    }
    let run = fraglab_now(&b, &["run", "configs/quickstart.toml", "-o", out.to_str().unwrap()]);
    for o in [&frag, &run] {
        let err = stderr(o);
        assert!(!o.status.success(), "{err}");
        assert!(
            err.contains("another fraglab is running") && err.contains(&format!("pid {}", d.pid)),
            "{err}"
        );
    }
    assert!(!b.exists(), "a refused fraglab created its run directory");
    assert!(alive(d.pid), "the holder died");
    assert_eq!(std::fs::read_to_string(LOCK_FILE).unwrap(), lock_text, "the holder's record changed");
    assert_eq!(std::fs::read_to_string(a.join("sysctl.journal")).unwrap(), journal_text);
    assert_sysctls(&holding, "refused fraglabs with another run directory");
    // `release` in the other run directory has nothing to release there, but the machine is held:
    // a failure that says by whom and how to release it.
    let rel = fraglab_now(&b, &["release"]);
    let err = stderr(&rel);
    assert_eq!(rel.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("pid {}", d.pid))
            && err.contains(&format!("fraglab --run-dir {} release", a.display())),
        "{err}"
    );
    assert!(alive(d.pid), "the holder died");

    // Queued: it waits for the daemon and changes nothing meanwhile.
    let mut waiter = start(&b, &["fragment", "--max-free-order", "4", "--budget", "64MiB"]);
    let waiting = format!("waiting for fraglab pid {}", d.pid);
    wait_until(Duration::from_secs(30), "the second fraglab to say whom it waits for", || {
        assert!(waiter.running(), "it did not wait: {}", waiter.stderr());
        waiter.stderr().contains(&waiting)
    });
    // It keeps looking and keeps waiting: each look at the held lock ends in a sleep, a voluntary
    // context switch of its main thread. Three more of them since it said so are three more looks.
    let looked = voluntary_switches(waiter.pid());
    wait_until(Duration::from_secs(30), "the waiting fraglab to look at the lock again", || {
        assert!(waiter.running(), "it stopped waiting: {}", waiter.stderr());
        voluntary_switches(waiter.pid()) >= looked + 3
    });
    assert!(waiter.running(), "{}", waiter.stderr());
    assert!(!b.join("sysctl.journal").exists(), "it changed sysctls while the daemon held");
    assert_sysctls(&holding, "a fraglab waiting for the lock");
    d.release();
    wait_until(LOCK_WAIT + Duration::from_secs(90), "the second fraglab to hold", || {
        assert!(waiter.running(), "it stopped instead of holding: {}", waiter.stderr());
        holds(&b)
    });
    assert_eq!(waiter.stderr().matches("waiting for").count(), 1, "{}", waiter.stderr());
    let second = journal(&b.join("sysctl.journal"));
    assert_eq!(second, originals, "the second fraglab journaled other values than the machine's own");
    assert!(fraglab(&b, &["release"]).status.success());
    assert!(waiter.wait_for(Duration::from_secs(30)).expect("exits after release").success());
    assert_sysctls(&before, "after both released");
    // Nothing held anywhere: a cleanup script's `fraglab release` succeeds.
    let rel = fraglab(&b, &["release"]);
    assert!(rel.status.success() && stderr(&rel).contains("nothing to release"), "{}", stderr(&rel));
}

/// 2c. A fraglab SIGKILLed while holding is repaired by the next fraglab command whatever its run
///     directory: the lock's record says where the dead one's journal is.
#[test]
fn sigkill_is_repaired_from_another_run_dir() {
    let _s = serial();
    let (dead, other) = (scratch("stale-dead"), scratch("stale-other"));
    let before = sysctls();
    let mut f = start(&dead, &["fragment", "--max-free-order", "4", "--budget", "64MiB"]);
    wait_until(LOCK_WAIT + Duration::from_secs(90), "the fragmenter to answer `fraglab status`", || {
        assert!(f.running(), "the fragmenter exited before holding: {}", f.stderr());
        holds(&dead)
    });
    let journal_path = dead.join("sysctl.journal");
    let entries = journal(&journal_path);
    assert!(entries.iter().any(|(n, _)| n == "vm.compact_unevictable_allowed"), "{entries:?}");
    f.signal(Signal::SIGKILL);
    f.wait_for(Duration::from_secs(10)).expect("SIGKILL ends it");
    let mut around = others();
    if journal_path.exists() {
        assert_eq!(
            sysctl("vm.compact_unevictable_allowed"),
            "0",
            "nothing restored yet: the journal must do it"
        );
    }

    let probe = fraglab(&other, &["probe", "--json"]);
    let err = stderr(&probe);
    assert!(probe.status.success(), "{err}");
    around.extend(others());
    if !recovered_elsewhere(&journal_path, &err, &around) {
        for (name, original) in &entries {
            assert!(err.contains(&format!("{name} = {original}")), "{name} not reported restored: {err}");
        }
    }
    assert!(!journal_path.exists(), "the dead one's journal is still there");
    assert!(!dead.join("fraglab.sock").exists(), "the dead one's socket is still there");
    assert!(!other.exists(), "recovering created the probe's run directory");
    assert_sysctls(&entries, "restored from another run directory");
    assert_sysctls(&before, "restored from another run directory");
}

/// `--floor` is checked before anything is taken: not below 2 × min_free_kbytes, below MemAvailable.
#[test]
fn floor_is_validated_with_no_side_effect() {
    let _s = serial();
    let dir = scratch("floor");
    let before = sysctls();
    let too_high = format!("{}B", meminfo("MemAvailable") + GIB);
    for (floor, want) in [
        ("1MiB", "below 2 × vm.min_free_kbytes"),
        (too_high.as_str(), "not below MemAvailable"),
        ("lots", "not a size"),
    ] {
        let out =
            fraglab(&dir, &["fragment", "--max-free-order", "4", "--budget", "64MiB", "--floor", floor]);
        assert!(!out.status.success(), "--floor {floor} accepted");
        assert!(
            stderr(&out).contains("--floor") && stderr(&out).contains(want),
            "--floor {floor}: {}",
            stderr(&out)
        );
    }
    let dry = fraglab(
        &dir,
        &["fragment", "--max-free-order", "4", "--budget", "64MiB", "--floor", "1GiB", "--dry-run"],
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(String::from_utf8_lossy(&dry.stdout).contains("below 1.00 GiB while holding"));
    assert!(!dir.exists(), "a refused or dry-run command created {}", dir.display());
    assert_sysctls(&before, "refused --floor");
}

/// 1c. An error after fragmenting (here a sweep value the kernel refuses with EINVAL): the run stops
///     with 255, and every sysctl is back *before* the process exits, with the journal gone, so no
///     later fraglab has anything to repair. (`Guarded`'s Drop joins its thread so the fragmenter is
///     dropped on the pipeline's thread before the instance lock; without it the restore raced the
///     process's exit — a race this test only catches when it is lost.)
#[test]
fn an_error_after_fragmenting_restores_before_the_process_exits() {
    let _s = serial();
    let dir = scratch("error-mid-run");
    let out = scratch("error-mid-run-results");
    let config = scratch("error-mid-run-config");
    std::fs::create_dir_all(&config).unwrap();
    let path = config.join("einval.toml");
    std::fs::write(
        &path,
        "[run]\nname = \"einval\"\n\n[fragment]\nmax_free_order = 2\nbudget = \"256MiB\"\n\n[sweep]\n\
         sysctl.\"net.core.high_order_alloc_disable\" = [5]\n\n[[workload]]\nkind = \"exec\"\n\
         command = [\"true\"]\n",
    )
    .unwrap();
    let before = sysctls();
    let run = fraglab(&dir, &["run", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let err = stderr(&run);
    assert_eq!(run.status.code(), Some(255), "{err}");
    assert!(err.contains("net.core.high_order_alloc_disable"), "{err}");
    // Read at once: nothing else is going to put these back.
    assert!(!dir.join("sysctl.journal").exists(), "the journal was left for someone else to replay");
    assert_sysctls(&before, "right after the failed run");
    let r = read_json(&results_dir(&out).unwrap().join("run.json"));
    assert_eq!(r["status"], "incomplete", "{r}");
}
