//! What the runner's test binaries share: the binary under test, the checkout, and running it the way
//! a test on a shared machine must.
#![allow(dead_code)] // each test binary uses its own subset

use std::fmt::Display;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

/// Set to `1` by scripts/test (so in CI), and by vm.rs for the tests it runs in a guest: a test that
/// would skip fails instead, naming why — unless another run covers it ([`skip_covered_elsewhere`]).
pub const REQUIRE_ALL: &str = "FRAGLAB_REQUIRE_ALL";
/// Comma-separated kinds of kernel whose tests another run covers, so that a test needing one may
/// skip here even under `FRAGLAB_REQUIRE_ALL=1`: `sctp` (a kernel with SCTP: vm.rs runs
/// workload_sctp's tests in a guest that has it; scripts/test says so for the host) and `no-sctp`
/// (a kernel without it: the host run covers those for the guest; vm.rs says so there).
pub const COVERED_ELSEWHERE: &str = "FRAGLAB_COVERED_ELSEWHERE";

pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL).is_ok_and(|v| v == "1")
}

/// The one way a runner test skips: says `skipped: <reason>` and returns, and the caller returns
/// too. Under `FRAGLAB_REQUIRE_ALL=1` it panics instead, with the reason.
pub fn skip(reason: impl Display) {
    if require_all() {
        panic!("{REQUIRE_ALL}=1: this test would have skipped: {reason}");
    }
    println!("skipped: {reason}");
}

/// A skip because the test needs another kind of kernel (`needs`, e.g. `sctp`), which `runs_in`
/// has. Under `FRAGLAB_REQUIRE_ALL=1` it is allowed only when `FRAGLAB_COVERED_ELSEWHERE` names
/// `needs`: the caller (scripts/test, vm.rs) vouches that `runs_in` is part of the same run.
pub fn skip_covered_elsewhere(needs: &str, reason: impl Display, runs_in: &str) {
    let covered = std::env::var(COVERED_ELSEWHERE).is_ok_and(|v| v.split(',').any(|k| k.trim() == needs));
    if require_all() && !covered {
        panic!(
            "{REQUIRE_ALL}=1: this test would have skipped: {reason}; it runs in {runs_in}, but \
             {COVERED_ELSEWHERE} does not name {needs:?}, so nothing says that run is part of this one"
        );
    }
    let how = if covered { "covered by" } else { "it runs in" };
    println!("skipped: {reason}; {how} {runs_in}");
}

/// Wait until `done`, at most `bound` — a hang guard, not a measurement: a test asserts what it
/// observes, and the bound only turns a hang into a failure that names it and `what`.
pub fn wait_until(bound: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {bound:?} (a hang guard)");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes received so far over TCP, summed over the sockets of process `pid` (all of the caller's
/// network namespace when `None`), as `ss -ti` reports them (tcp_info's bytes_received). What
/// shows a workload's traffic is flowing, without timing it.
pub fn tcp_bytes_received(pid: Option<u32>) -> u64 {
    let out = Command::new("ss").args(["-tinpH"]).output().expect("ss (iproute2) runs");
    assert!(out.status.success(), "ss: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    // One socket per unindented line; its tcp_info on the indented line after it.
    let mut total = 0;
    let mut ours = false;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            ours = pid.is_none_or(|p| line.contains(&format!("pid={p},")));
            continue;
        }
        if ours {
            total += line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("bytes_received:"))
                .map_or(0, |n| n.parse::<u64>().unwrap());
        }
    }
    total
}

/// Names of the threads of process `pid` (its tasks' `comm`).
pub fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

/// The children of process `pid`, of all its threads.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().map(|p| p.parse().unwrap()).collect::<Vec<u32>>())
        .collect()
}

/// The checkout: configs/ and docs/ are read from here, and runs start here.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `fraglab --run-dir RUN_DIR ARGS` from the checkout. The instance lock is machine-wide, so a test
/// queues behind any other fraglab (another test binary, an engineer's run) instead of being refused.
pub fn fraglab(run_dir: &Path, args: &[&str]) -> Output {
    command(run_dir).args(args).output().unwrap()
}

/// `fraglab ARGS` run in `dir`, as a user types it there; its output is printed for the test log.
pub fn fraglab_in(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(FRAGLAB).current_dir(dir).args(args).output().expect("run fraglab");
    eprintln!(
        "--- fraglab {args:?}: {}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A JSON file, or a panic naming it.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The [`fraglab`] command before its arguments, to add to or spawn.
pub fn command(run_dir: &Path) -> Command {
    let mut c = Command::new(FRAGLAB);
    c.arg("--run-dir").arg(run_dir).current_dir(repo()).env(fraglab_fragmenter::instance::WAIT_ENV, "600s");
    c
}

/// Every sysctl the fragmenter may change.
pub const FRAGMENTER_SYSCTLS: [&str; 5] = [
    "vm.percpu_pagelist_high_fraction",
    "vm.lowmem_reserve_ratio",
    "vm.compact_unevictable_allowed",
    "vm.compaction_proactiveness",
    "fs.pipe-max-size",
];

/// The fragmenter's sysctls as no fraglab has them changed: read holding the machine-wide instance
/// lock (taken in `dir`), which must find no journal left to restore — whatever ran before (`after`)
/// did that.
pub fn sysctls_at_rest(dir: &Path, after: &str) -> Vec<String> {
    let (lock, restored) = fraglab_fragmenter::instance::Instance::acquire_wait(
        dir,
        "a test reading sysctls",
        Duration::from_secs(600),
    )
    .unwrap();
    assert!(restored.is_empty(), "{after}: journals nobody restored: {restored:?}");
    let values = FRAGMENTER_SYSCTLS.iter().map(|n| fraglab_fragmenter::sysctl::read(n).unwrap()).collect();
    drop(lock);
    values
}

/// VmLck of a process in bytes (its mlocked memory); 0 once it is gone.
pub fn vm_lck(pid: i32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A child's stdout or stderr, read on a thread as it comes so a test can look at it while the child
/// runs (and the pipe never fills and stalls it).
pub fn collect(mut from: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let to = Arc::clone(&text);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            to.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}

/// A fraglab started in the background, its output collected as it comes. If a test fails while it
/// runs, dropping it sends SIGTERM (release and restore), and SIGKILL plus a journal-restoring
/// command if that does not end it within 90 s.
pub struct Running {
    pub child: std::process::Child,
    pub run_dir: PathBuf,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Running {
    /// Start `cmd` (a fraglab whose run directory is `run_dir`) with its output piped.
    pub fn spawn(cmd: &mut Command, run_dir: &Path) -> Running {
        use std::process::Stdio;
        let mut child =
            cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        Running { child, run_dir: run_dir.to_path_buf(), stdout, stderr }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Both, for a failure message.
    pub fn output(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout(), self.stderr())
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn wait_for(&mut self, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                std::thread::sleep(std::time::Duration::from_millis(50)); // the readers take the last output
                return Some(s);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.running() {
            self.signal(nix::sys::signal::Signal::SIGTERM);
            if self.wait_for(std::time::Duration::from_secs(90)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let _ = fraglab(&self.run_dir, &["probe", "--json"]); // restores from the journal
            }
        }
    }
}

/// Anonymous memory taken and touched by this test process: the "other process" of the pressure test.
pub struct Hog {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Hog {
    pub fn take(len: usize) -> Hog {
        // SAFETY: a fresh private anonymous mapping, used only through this struct.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        // SAFETY: the range is exactly the mapping above.
        if unsafe { libc::madvise(ptr, len, libc::MADV_POPULATE_WRITE) } != 0 {
            for off in (0..len).step_by(4096) {
                // SAFETY: inside the mapping, which is writable.
                unsafe { *(ptr as *mut u8).add(off) = 1 };
            }
        }
        Hog { ptr, len }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what take() mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// For guest scripts under `set -e`: `status NAME` writes `fraglab status --json` to NAME.json and
/// its exit status to NAME.exit — a lost target exits 1, which must not end the script.
pub const STATUS_SH: &str =
    "status() { fraglab status --json > \"$1.json\" && echo 0 > \"$1.exit\" || echo $? > \"$1.exit\"; }\n";

/// NAME.json of a [`STATUS_SH`] call, checked against NAME.exit: 0 exactly when the target holds
/// now (and a hold that answers says whether it does).
pub fn guest_status(dir: &Path, name: &str) -> serde_json::Value {
    let s = read_json(&dir.join(format!("{name}.json")));
    let exit = std::fs::read_to_string(dir.join(format!("{name}.exit")))
        .unwrap_or_else(|e| panic!("{name}.exit: {e}"));
    let holds = s["now"]["holds"].as_bool().unwrap_or_else(|| panic!("{name}.json says nothing of now: {s}"));
    assert_eq!(exit.trim() == "0", holds, "{name}: exit {} for now {}", exit.trim(), s["now"]);
    s
}
