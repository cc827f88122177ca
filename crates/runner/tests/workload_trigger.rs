//! `fraglab workload trigger` on this host, unfragmented: every trigger reaches its allocation, the
//! sysctls it raises come back — after a normal run, a SIGTERM, and a SIGKILL (restored by the next
//! `fraglab` command) — and errno accounting is shown with calls the kernel really refuses.
//! Sysctls are machine-wide, so the tests run one at a time, each with its own run directory.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fraglab_results::workload::WorkloadResult;

static SERIAL: Mutex<()> = Mutex::new(());

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A run directory of the test's own, removed afterwards.
struct RunDir(PathBuf);

impl std::ops::Deref for RunDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run_dir(name: &str) -> RunDir {
    let d = std::env::temp_dir().join(format!("fraglab-trigger-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    RunDir(d)
}

fn fraglab(dir: &Path, args: &[&str]) -> Output {
    Command::new(FRAGLAB).arg("--run-dir").arg(dir).args(args).output().unwrap()
}

/// `fraglab workload --json trigger ARGS`, which must produce a result, with exit status 1 when a
/// call failed and 0 when none did.
fn trigger(dir: &Path, args: &[&str]) -> WorkloadResult {
    let out = fraglab(dir, &[&["workload", "--json", "trigger"], args].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r: WorkloadResult =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("trigger {args:?}: {e}: {stderr}"));
    assert_eq!(out.status.code(), Some(i32::from(r.failed > 0)), "trigger {args:?}: {stderr}");
    r
}

fn sysctl(name: &str) -> u64 {
    let p = format!("/proc/sys/{}", name.replace('.', "/"));
    std::fs::read_to_string(&p).unwrap().trim().parse().unwrap()
}

fn meminfo(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn detail(r: &WorkloadResult, key: &str) -> serde_json::Value {
    r.details.get(key).cloned().unwrap_or_else(|| panic!("no details.{key} in {:#?}", r.details))
}

/// Kills a trigger a test leaves running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A long pipe-resize that raises fs.pipe-max-size to 64 MiB; returns once the sysctl is raised.
fn start_long_pipe_resize(dir: &Path) -> Running {
    assert_ne!(sysctl("fs.pipe-max-size"), 64 << 20, "fs.pipe-max-size is already 64 MiB");
    let child = Command::new(FRAGLAB)
        .arg("--run-dir")
        .arg(dir)
        .args(["workload", "trigger", "pipe-resize", "--bytes", "64MiB", "--repeat", "100000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    wait_for("fs.pipe-max-size to be raised", || {
        assert!(running.0.try_wait().unwrap().is_none(), "the trigger exited early");
        sysctl("fs.pipe-max-size") == 64 << 20
    });
    running
}

#[test]
fn pipe_resize_succeeds_unfragmented_at_order_6_and_8_and_restores_pipe_max_size() {
    let _s = serial();
    let dir = run_dir("pipe");
    let before = sysctl("fs.pipe-max-size");
    for (bytes, order) in [("16MiB", 6), ("64MiB", 8)] {
        let r = trigger(&dir, &["pipe-resize", "--bytes", bytes, "--repeat", "3"]);
        assert_eq!(r.kind, "trigger pipe-resize");
        assert_eq!((r.ok, r.failed), (3, 0), "{bytes}: {r:#?}");
        assert!(r.errors.is_empty(), "{bytes}: {:?}", r.errors);
        assert_eq!(detail(&r, "order"), order, "{bytes}");
        assert_eq!(detail(&r, "calls"), 3);
        assert_eq!(r.latency_us.as_ref().unwrap().count, 3);
        assert_eq!(r.params["bytes"], bytes);
        assert_eq!(r.params["trigger"], "pipe-resize");
        // It needed fs.pipe-max-size raised (1 MiB here) and put it back.
        if before < 16 << 20 {
            assert_eq!(detail(&r, "sysctl")["original"], before);
            assert_eq!(detail(&r, "restored")[0], format!("fs.pipe-max-size = {before}"));
        }
        assert_eq!(sysctl("fs.pipe-max-size"), before, "{bytes}: fs.pipe-max-size not restored");
    }
    assert!(!dir.join("trigger.journal").exists(), "the journal outlived the trigger");
}

#[test]
fn ip_msfilter_and_udp_cmsg_reach_the_copy_unfragmented_and_restore_optmem_max() {
    let _s = serial();
    let dir = run_dir("optmem");
    let before = sysctl("net.core.optmem_max");
    for (kind, bytes, order) in
        [("ip-msfilter", "1MiB", 8), ("ip-msfilter", "2MiB", 9), ("udp-cmsg", "1MiB", 8)]
    {
        let r = trigger(&dir, &[kind, "--bytes", bytes, "--repeat", "3"]);
        // The kernel allocated, copied, then rejected the zeroed content with EINVAL: success.
        assert_eq!((r.ok, r.failed), (3, 0), "{kind} {bytes}: {r:#?}");
        assert!(r.errors.is_empty(), "{kind}: EINVAL must not be an error: {:?}", r.errors);
        assert_eq!(detail(&r, "einval_after_alloc"), 3, "{kind}");
        assert_eq!(detail(&r, "order"), order, "{kind} {bytes}");
        assert!(
            r.notes.iter().any(|n| n.contains("EINVAL counted as allocation succeeded")),
            "{:?}",
            r.notes
        );
        assert_eq!(sysctl("net.core.optmem_max"), before, "{kind}: optmem_max not restored");
    }
}

#[test]
fn errno_accounting_with_calls_the_kernel_refuses() {
    let _s = serial();
    let dir = run_dir("errno");
    // Measured here: with net.core.optmem_max (128 KiB) left alone, a 1 MiB optlen / control buffer
    // is refused with ENOBUFS before any allocation.
    let optmem = sysctl("net.core.optmem_max");
    let bytes = (optmem + 1).next_power_of_two().max(1 << 20);
    assert!(bytes <= 4 << 20, "net.core.optmem_max {optmem} is too high for this test");
    let bytes = bytes.to_string();
    for kind in ["ip-msfilter", "udp-cmsg"] {
        let r = trigger(&dir, &[kind, "--bytes", &bytes, "--repeat", "4", "--no-raise"]);
        assert_eq!((r.ok, r.failed), (0, 4), "{kind}: {r:#?}");
        assert_eq!(r.errno_count("ENOBUFS"), 4, "{kind}: {:?}", r.errors);
        let e = &r.errors[0];
        assert_eq!((e.errno.as_str(), e.code), ("ENOBUFS", libc::ENOBUFS));
        assert!(e.first_seen_s >= 0.0 && e.first_seen_s <= r.duration_s);
        assert_eq!(detail(&r, "einval_after_alloc"), 0);
        assert_eq!(detail(&r, "sysctl")["not_raised"], true);
        assert_eq!(sysctl("net.core.optmem_max"), optmem);
    }
    // Without CAP_SYS_RESOURCE (this VM's root lacks it), F_SETPIPE_SZ above fs.pipe-max-size: EPERM.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cap_eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim();
    let has_sys_resource = u64::from_str_radix(cap_eff, 16).unwrap() & (1 << 24) != 0;
    if !has_sys_resource && sysctl("fs.pipe-max-size") < 64 << 20 {
        let r = trigger(&dir, &["pipe-resize", "--bytes", "64MiB", "--repeat", "2", "--no-raise"]);
        assert_eq!((r.ok, r.failed), (0, 2), "{r:#?}");
        assert_eq!(r.errno_count("EPERM"), 2, "{:?}", r.errors);
    }
}

#[test]
fn hugetlb_gets_order_9_pages_and_frees_them() {
    let _s = serial();
    let dir = run_dir("hugetlb");
    let nr_before = sysctl("vm.nr_hugepages");
    let total_before = meminfo("HugePages_Total");
    let r = trigger(&dir, &["hugetlb", "--pages", "8"]);
    assert_eq!(detail(&r, "order"), 9);
    assert_eq!(detail(&r, "calls"), 8);
    let got = detail(&r, "obtained_pages").as_u64().unwrap();
    assert!(got > 0 && got <= 8, "obtained {got} of 8: {r:#?}");
    assert_eq!((r.ok, r.failed), (got, 8 - got));
    assert_eq!(r.errno_count("ENOMEM"), 8 - got);
    assert_eq!(sysctl("vm.nr_hugepages"), nr_before, "vm.nr_hugepages not restored");
    assert_eq!(meminfo("HugePages_Total"), total_before, "the huge pages were not freed");
    assert_eq!(detail(&r, "hugepages_total_after"), total_before);
}

#[test]
fn sctp_bindx_says_clearly_when_the_kernel_has_no_sctp() {
    let _s = serial();
    let dir = run_dir("sctp");
    // SAFETY: a plain socket() probe; the descriptor is closed at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    if fd >= 0 {
        // SAFETY: closing the descriptor just opened.
        unsafe { libc::close(fd) };
        // A kernel with SCTP (the qemu guest): 64 KiB is an order-4 allocation, EINVAL after it.
        let r = trigger(&dir, &["sctp-bindx", "--bytes", "64KiB", "--repeat", "3"]);
        assert_eq!((r.ok, detail(&r, "order").as_u64().unwrap()), (3, 4), "{r:#?}");
        return;
    }
    assert_eq!(errno, Some(libc::EPROTONOSUPPORT));
    let out = fraglab(&dir, &["workload", "trigger", "sctp-bindx", "--bytes", "64KiB"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("EPROTONOSUPPORT"), "{stderr}");
    assert!(stderr.contains("load the sctp module or use `fraglab vm`"), "{stderr}");
}

#[test]
fn io_uring_succeeds_and_says_it_cannot_tell() {
    let _s = serial();
    if std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").is_ok_and(|v| v.trim() != "0") {
        return;
    }
    let r = trigger(&run_dir("uring"), &["io-uring", "--entries", "32768", "--repeat", "3"]);
    assert_eq!((r.ok, r.failed), (3, 0), "{r:#?}");
    assert_eq!(detail(&r, "order"), 9);
    assert!(r.notes.iter().any(|n| n.contains("falls back to single pages")), "{:?}", r.notes);
}

#[test]
fn bad_options_are_refused_before_anything_is_touched() {
    let _s = serial();
    let pipe_max = sysctl("fs.pipe-max-size");
    let optmem = sysctl("net.core.optmem_max");
    for (args, says) in [
        (&["pipe-resize", "--bytes", "64MiB", "--repeat", "0"][..], "--repeat 0"),
        (&["pipe-resize", "--bytes", "64MB"][..], "--bytes 64MB"),
        (&["pipe-resize", "--bytes", "lots"][..], "--bytes lots"),
        (&["pipe-resize", "--bytes", "512MiB"][..], "--bytes 512MiB"),
        (&["ip-msfilter", "--bytes", "8MiB"][..], "--bytes 8MiB"),
        (&["udp-cmsg", "--bytes", "0"][..], "--bytes 0"),
        (&["hugetlb", "--pages", "0"][..], "--pages 0"),
        (&["io-uring", "--entries", "65536"][..], "--entries 65536"),
    ] {
        let dir = run_dir("bad");
        let out = fraglab(&dir, &[&["workload", "trigger"], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!dir.exists(), "{args:?}: the run directory was touched");
    }
    assert_eq!(sysctl("fs.pipe-max-size"), pipe_max);
    assert_eq!(sysctl("net.core.optmem_max"), optmem);
}

#[test]
fn sigkilled_trigger_is_restored_by_the_next_fraglab_command_but_a_live_one_is_left_alone() {
    let _s = serial();
    let dir = run_dir("sigkill");
    let before = sysctl("fs.pipe-max-size");
    let mut running = start_long_pipe_resize(&dir);
    // A live trigger's journal is not stale: another fraglab command leaves it alone.
    let out = fraglab(&dir, &["probe", "--json"]);
    assert!(out.status.success());
    assert_eq!(sysctl("fs.pipe-max-size"), 64 << 20, "a live trigger's sysctl was restored under it");
    assert!(running.0.try_wait().unwrap().is_none());

    running.0.kill().unwrap(); // SIGKILL: no chance to restore
    let status = running.0.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert_eq!(sysctl("fs.pipe-max-size"), 64 << 20);
    assert!(dir.join("trigger.journal").exists());

    let out = fraglab(&dir, &["probe", "--json"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a previous trigger died holding sysctls"), "{stderr}");
    assert!(stderr.contains(&format!("fs.pipe-max-size = {before}")), "{stderr}");
    assert_eq!(sysctl("fs.pipe-max-size"), before, "not restored by the next fraglab command");
    assert!(!dir.join("trigger.journal").exists());
}

#[test]
fn sigterm_stops_a_trigger_after_it_restores() {
    let _s = serial();
    let dir = run_dir("sigterm");
    let before = sysctl("fs.pipe-max-size");
    let mut running = start_long_pipe_resize(&dir);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(running.0.id() as i32), nix::sys::signal::SIGTERM)
        .unwrap();
    let status = running.0.wait().unwrap();
    // It still dies of the signal, but only once fs.pipe-max-size is back.
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert_eq!(sysctl("fs.pipe-max-size"), before);
    assert!(!dir.join("trigger.journal").exists());
}

#[test]
fn a_trigger_runs_while_the_instance_lock_is_held() {
    let _s = serial();
    let dir = run_dir("beside");
    std::fs::create_dir_all(&*dir).unwrap();
    // What a holding fragmenter does: take the (machine-wide) instance lock.
    let (lock, _) = fraglab_fragmenter::instance::Instance::acquire_wait(
        &dir,
        "workload_trigger test",
        std::time::Duration::from_secs(600),
    )
    .unwrap();
    let r = trigger(&dir, &["pipe-resize", "--bytes", "16MiB", "--repeat", "2"]);
    assert_eq!(r.ok, 2);
    drop(lock);
}

/// The trigger lock is machine-wide, like the sysctls it guards: a trigger with another `--run-dir`
/// that would raise fs.pipe-max-size further is refused while one holds it raised (it would journal
/// the raised value as the original), and once the holder is SIGKILLed, a fraglab command in yet
/// another run directory finds the dead one's journal through the lock's record and restores it.
#[test]
fn another_run_dir_cannot_journal_a_live_triggers_raised_sysctl() {
    let _s = serial();
    let (a, b, c) = (run_dir("wide-a"), run_dir("wide-b"), run_dir("wide-c"));
    let before = sysctl("fs.pipe-max-size");
    let mut running = start_long_pipe_resize(&a);

    let out =
        fraglab(&b, &["workload", "--json", "trigger", "pipe-resize", "--bytes", "128MiB", "--repeat", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second trigger raised fs.pipe-max-size beside a live one");
    assert!(stderr.contains(&format!("another trigger (pid {})", running.0.id())), "{stderr}");
    assert_eq!(sysctl("fs.pipe-max-size"), 64 << 20, "the live trigger's value was changed");
    assert!(!b.join("trigger.journal").exists(), "the refused trigger journaled");

    running.0.kill().unwrap();
    running.0.wait().unwrap();
    let out = fraglab(&c, &["probe", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("fs.pipe-max-size = {before}")), "{stderr}");
    assert_eq!(sysctl("fs.pipe-max-size"), before, "the dead trigger's journal in another run dir");
    assert!(!a.join("trigger.journal").exists());
}
