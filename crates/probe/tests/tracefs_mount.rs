//! The machine-wide tracefs mount rule, with real processes on this host (root): fraglab mounts
//! tracefs when it is mounted nowhere, the last fraglab process using it unmounts it — whichever
//! process mounted it — and a tracefs someone else mounted is never unmounted. A SIGKILLed fraglab
//! blocks nobody, and what it left (its mount, its instance) is cleaned by the next last user.
//!
//! The other processes are this test binary re-executed (`helper_catcher_process`, ignored in a
//! normal run): each starts a catcher, says so on stdout, stops it when told on stdin and says
//! whether it unmounted tracefs. Each test runs in a mount namespace of its own (see
//! [`in_private_mount_ns`]) where tracefs is unmounted or mounted by someone else, as the test
//! needs — so the host's own state (systemd mounts tracefs at boot on most distributions) decides
//! nothing, and a test killed half-way leaves no mount behind. The flocks and the marker in
//! /run/fraglab are the machine's, so the tests run one at a time (`HOST`), and they skip when
//! another fraglab process is using tracefs right now — or, under `FRAGLAB_REQUIRE_ALL=1` (CI),
//! wait for it to finish (at most [`BUSY_WAIT`]) and fail if it does not.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a test waits, under `FRAGLAB_REQUIRE_ALL=1`, for another fraglab process to stop using
/// tracefs — as long as a fraglab started by a test queues for the instance lock.
const BUSY_WAIT: Duration = Duration::from_secs(600);

use fraglab_probe::tracefs::{Catcher, DEFAULT_ROOT, LOCK_DIR, MOUNT_LOCK, MOUNT_MARKER, USERS_LOCK};

const HELPER_ENV: &str = "FRAGLAB_TRACEFS_HELPER";
/// What a helper's own lines start with (libtest's may share the line: `test … ... `).
const SAY: &str = "fraglab-helper:";

/// A helper process: this binary, running only `helper_catcher_process`.
#[test]
#[ignore = "a helper the cross-process tests start by re-executing this binary"]
fn helper_catcher_process() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let say = |s: String| {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{SAY} {s}").unwrap();
        o.flush().unwrap();
    };
    let c = match Catcher::start(5) {
        Ok(c) => c,
        Err(e) => return say(format!("error {e}")),
    };
    say(format!("started mounted_tracefs={} instance={}", c.mounted_tracefs(), c.instance_dir().display()));
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line); // "stop", or EOF when the test is gone
    match c.stop() {
        Ok(s) => say(format!("stopped unmounted={}", s.unmounted)),
        Err(e) => say(format!("error {e}")),
    }
}

struct Helper {
    child: Child,
    stdin: Option<ChildStdin>,
    said: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

/// What a helper said when its catcher started.
struct Started {
    mounted_tracefs: bool,
    instance: PathBuf,
}

impl Helper {
    fn start() -> (Helper, Started) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["helper_catcher_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(HELPER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, said) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if let Some(at) = line.find(SAY) {
                    let _ = tx.send(line[at + SAY.len()..].trim().to_string());
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let (sink, mut pipe) = (Arc::clone(&stderr), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut pipe, &mut s);
            sink.lock().unwrap().push_str(&s);
        });
        let mut h = Helper { stdin: child.stdin.take(), child, said, stderr };
        let line = h.next("started");
        let mounted_tracefs = field(&line, "mounted_tracefs") == "true";
        let instance = PathBuf::from(field(&line, "instance"));
        (h, Started { mounted_tracefs, instance })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The helper's next line, which must start with `what`.
    fn next(&mut self, what: &str) -> String {
        let line = match self.said.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("helper {} said nothing for 30 s", self.pid()),
            Err(RecvTimeoutError::Disconnected) => {
                let _ = self.child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!("helper {} ended: {}", self.pid(), self.stderr.lock().unwrap());
            }
        };
        assert!(line.starts_with(what), "helper {}: {line}", self.pid());
        line
    }

    /// Stop its catcher; whether that unmounted tracefs.
    fn stop(mut self) -> bool {
        writeln!(self.stdin.as_mut().unwrap(), "stop").unwrap();
        let line = self.next("stopped");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "helper {}: {status}", self.pid());
        field(&line, "unmounted") == "true"
    }

    /// SIGKILL: no stop, no drop; its instance, the mount and the marker stay behind.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .to_string()
}

// ---- The machine's state ----

static HOST: Mutex<()> = Mutex::new(());

/// tracefs mounts of this thread's mount namespace: (mount id, mount point). `thread-self`: a test
/// runs on a thread with a namespace of its own.
fn tracefs_mounts() -> Vec<(u64, PathBuf)> {
    std::fs::read_to_string("/proc/thread-self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(" - ").nth(1).is_some_and(|r| r.starts_with("tracefs ")))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].parse().unwrap(), PathBuf::from(f[4]))
        })
        .collect()
}

fn mounted() -> bool {
    !tracefs_mounts().is_empty()
}

fn mount_tracefs() -> u64 {
    // SAFETY: mount(2) with NUL-terminated constant strings and no data.
    let r = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "mount tracefs: {}", std::io::Error::last_os_error());
    tracefs_mounts().iter().rev().find(|(_, p)| p == Path::new(DEFAULT_ROOT)).unwrap().0
}

fn umount_tracefs() {
    // SAFETY: umount2(2) on a NUL-terminated constant path.
    let r = unsafe { libc::umount2(c"/sys/kernel/tracing".as_ptr(), 0) };
    assert_eq!(r, 0, "umount tracefs: {}", std::io::Error::last_os_error());
}

/// `fraglab-*` instances: mounts tracefs for a look if it is not mounted.
fn fraglab_instances() -> Vec<String> {
    let ours = !mounted();
    if ours {
        mount_tracefs();
    }
    let names = std::fs::read_dir(Path::new(DEFAULT_ROOT).join("instances"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fraglab-"))
        .collect();
    if ours {
        umount_tracefs();
    }
    names
}

fn instance_of(pid: u32) -> impl Fn(&String) -> bool {
    move |n: &String| n == &format!("fraglab-{pid}") || n.starts_with(&format!("fraglab-{pid}-"))
}

/// Another process holds `tracefs.users`, i.e. has a catcher running. Asked the way fraglab asks:
/// under `tracefs.lock`, so a fraglab leaving at this moment is not misled.
fn other_fraglab_users() -> bool {
    std::fs::create_dir_all(LOCK_DIR).unwrap();
    let open = |p| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p);
    let gate = open(MOUNT_LOCK).unwrap();
    assert_eq!(unsafe { libc::flock(gate.as_raw_fd(), libc::LOCK_EX) }, 0);
    let users = open(USERS_LOCK).unwrap();
    unsafe { libc::flock(users.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// How tracefs is at the start of a test, in its namespace.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Start {
    Unmounted,
    /// Mounted by someone else (its mount id).
    Foreign(u64),
}

/// The machine, to a test that may change its mount state: `None` (skip) while another fraglab
/// uses tracefs — under `FRAGLAB_REQUIRE_ALL=1`, a wait for it instead (see [`BUSY_WAIT`]). A dead
/// fraglab's leftover mount (and marker) is cleaned first, by the rule itself.
fn host() -> Option<MutexGuard<'static, ()>> {
    if unsafe { libc::geteuid() } != 0 {
        common::skip("tracefs needs root");
        return None;
    }
    let g = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let idle = common::wait_until_idle(BUSY_WAIT, || {
        if other_fraglab_users() {
            return Some("another fraglab process is using tracefs now".to_string());
        }
        // A fraglab without this rule (an older build) running now: its instance has a live pid.
        if !mounted() {
            return None;
        }
        let live: Vec<String> = fraglab_instances()
            .into_iter()
            .filter(|n| n.split('-').nth(1).is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists()))
            .collect();
        (!live.is_empty()).then(|| format!("fraglab catchers of live processes: {live:?}"))
    });
    if !idle {
        return None;
    }
    if Path::new(MOUNT_MARKER).exists() {
        Catcher::start(5).unwrap().stop().unwrap();
        let marker = std::fs::read_to_string(MOUNT_MARKER).unwrap_or_default();
        assert!(marker.is_empty(), "a start and stop left this marker (tracefs busy?): {marker}");
    }
    Some(g)
}

/// Runs `test` on a thread of its own in a new mount namespace — a copy of this one, made private
/// so nothing mounted or unmounted in it reaches the machine's — where tracefs is `start`:
/// unmounted (every tracefs mount of the copy detached), or, for `Foreign`, mounted by the test the
/// way a user or systemd would (the id given is replaced by the real one). Helpers started from
/// `test` are born in that namespace; the namespace, and any mount left in it, dies with the last
/// of them.
fn in_private_mount_ns(start: Start, test: impl FnOnce(Start) + Send) {
    let ran = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare(2) of this thread's mount namespace (its fs_struct is unshared with
            // it; the other threads of this process keep theirs).
            let r = unsafe { libc::unshare(libc::CLONE_NEWNS) };
            assert_eq!(r, 0, "unshare(CLONE_NEWNS): {}", std::io::Error::last_os_error());
            // SAFETY: mount(2) changing propagation only: no source, type or data.
            let r = unsafe {
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            };
            assert_eq!(r, 0, "make / private: {}", std::io::Error::last_os_error());
            // Stacked mounts come off one at a time; a handful is all any machine has.
            for _ in 0..16 {
                let Some((_, path)) = tracefs_mounts().pop() else { break };
                let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: umount2(2) on a NUL-terminated path, in this thread's private namespace.
                let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                assert_eq!(r, 0, "umount {}: {}", path.display(), std::io::Error::last_os_error());
            }
            assert!(!mounted(), "tracefs still mounted after 16 unmounts: {:?}", tracefs_mounts());
            let start = match start {
                Start::Unmounted => Start::Unmounted,
                Start::Foreign(_) => Start::Foreign(mount_tracefs()),
            };
            test(start)
        })
        .join()
    });
    if let Err(panic) = ran {
        std::panic::resume_unwind(panic);
    }
}

/// Both starts, one after the other.
const BOTH: [Start; 2] = [Start::Unmounted, Start::Foreign(0)];

// ---- The tests ----

/// Two processes whose catchers overlap, stopped in either order: the one that mounted tracefs
/// leaves it to the other when the other is last, and the last one unmounts it.
#[test]
fn two_processes_the_last_one_unmounts() {
    let Some(_g) = host() else { return };
    for start in BOTH {
        in_private_mount_ns(start, two_processes);
    }
}

fn two_processes(start: Start) {
    let fresh = start == Start::Unmounted;

    // A mounts (when it is unmounted), B joins; A stops first, then B.
    let (a, sa) = Helper::start();
    assert!(mounted());
    let (b, sb) = Helper::start();
    assert_eq!((sa.mounted_tracefs, sb.mounted_tracefs), (fresh, fresh), "the marker tells B too");
    assert!(!a.stop(), "B still uses tracefs");
    assert!(mounted(), "unmounted under B");
    assert!(sb.instance.join("trace_pipe").exists(), "B's instance is intact");
    assert_eq!(b.stop(), fresh, "B is the last user");
    assert_eq!(mounted(), !fresh, "the mount state at the start");
    assert!(!Path::new(MOUNT_MARKER).exists());

    // The nested order: A first in, last out.
    let (a, sa) = Helper::start();
    let (b, _) = Helper::start();
    assert_eq!(sa.mounted_tracefs, fresh);
    assert!(!b.stop());
    assert!(mounted());
    assert_eq!(a.stop(), fresh);
    assert_eq!(mounted(), !fresh);
    assert!(!Path::new(MOUNT_MARKER).exists());
    if let Start::Foreign(id) = start {
        assert_eq!(tracefs_mounts().last().unwrap().0, id, "someone else's mount, untouched");
    }
}

/// This process's own catchers count as one user of the machine: an in-process pair and a helper,
/// interleaved.
#[test]
fn a_process_with_two_catchers_and_another_process() {
    let Some(_g) = host() else { return };
    for start in BOTH {
        in_private_mount_ns(start, two_catchers_and_another_process);
    }
}

fn two_catchers_and_another_process(start: Start) {
    let fresh = start == Start::Unmounted;
    let c1 = Catcher::start(5).unwrap();
    assert_eq!(c1.mounted_tracefs(), fresh);
    let (a, sa) = Helper::start();
    assert_eq!(sa.mounted_tracefs, fresh);
    let c2 = Catcher::start(6).unwrap();
    assert!(!c1.stop().unwrap().unmounted, "c2 of this process and A still use it");
    assert!(!c2.stop().unwrap().unmounted, "A still uses it");
    assert!(mounted());
    assert_eq!(a.stop(), fresh);
    assert_eq!(mounted(), !fresh);
}

/// A tracefs mounted by someone else (here: by this test, the way a user or systemd would) is
/// never unmounted, whatever the order.
#[test]
fn someone_elses_tracefs_stays_mounted() {
    let Some(_g) = host() else { return };
    in_private_mount_ns(Start::Foreign(0), someone_elses_stays);
}

fn someone_elses_stays(start: Start) {
    let Start::Foreign(id) = start else { unreachable!("started foreign") };
    let (a, sa) = Helper::start();
    let (b, sb) = Helper::start();
    assert!(!sa.mounted_tracefs && !sb.mounted_tracefs);
    assert!(!a.stop());
    assert!(!b.stop());
    assert_eq!(tracefs_mounts().last().map(|m| m.0), Some(id), "still the same mount");
    assert!(!Path::new(MOUNT_MARKER).exists());
}

/// A marker that does not describe the mount is no licence to unmount: it is dropped instead. Such
/// a marker is left over from a fraglab whose mount was since replaced by someone else's — with a
/// new mount id, or with the same reused mountinfo id but a new never-reused one — or from an
/// earlier boot (a /run on disk), or is garbled.
#[test]
fn a_stale_marker_never_unmounts_someone_elses_tracefs() {
    let Some(_g) = host() else { return };
    in_private_mount_ns(Start::Foreign(0), a_stale_marker_is_dropped);
}

fn a_stale_marker_is_dropped(start: Start) {
    let Start::Foreign(id) = start else { unreachable!("started foreign") };
    let ns = std::fs::read_link("/proc/thread-self/ns/mnt").unwrap();
    let ns = ns.to_string_lossy();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot = boot.trim();
    let marker = |mnt_id: u64, unique: Option<u64>, boot: &str| {
        let unique = unique.map(|u| format!("mnt_id_unique={u}\n")).unwrap_or_default();
        format!("mountpoint={DEFAULT_ROOT}\nmnt_id={mnt_id}\n{unique}mnt_ns={ns}\nboot_id={boot}\npid=1\n")
    };
    let mut stale = vec![
        ("another mount id", marker(id + 100_000, None, boot)),
        ("another boot", marker(id, None, "00000000-0000-4000-8000-000000000000")),
        ("garbled", "mountpoint=/sys/kernel/tracing\nmnt_id=\n".to_string()),
    ];
    match unique_mount_id() {
        Some(u) => stale.push(("the mount id reused", marker(id, Some(u + 1), boot))),
        None => eprintln!("no STATX_MNT_ID_UNIQUE on this kernel: the reused-id case is not tried"),
    }
    for (what, text) in stale {
        std::fs::write(MOUNT_MARKER, &text).unwrap();
        let (a, sa) = Helper::start();
        assert!(!sa.mounted_tracefs, "{what}");
        assert!(!Path::new(MOUNT_MARKER).exists(), "{what}: the stale marker is dropped on start");
        std::fs::write(MOUNT_MARKER, &text).unwrap();
        assert!(!a.stop(), "{what}");
        assert!(!Path::new(MOUNT_MARKER).exists(), "{what}: and by the last user");
        assert_eq!(tracefs_mounts().last().map(|m| m.0), Some(id), "{what}");
    }
}

/// The never-reused id (Linux 6.8+) of the mount at /sys/kernel/tracing.
fn unique_mount_id() -> Option<u64> {
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c"/sys/kernel/tracing".as_ptr(),
            libc::AT_NO_AUTOMOUNT,
            libc::STATX_MNT_ID_UNIQUE,
            &mut st,
        )
    };
    (r == 0 && st.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0).then_some(st.stx_mnt_id)
}

/// A SIGKILLed fraglab blocks nobody (the kernel drops its flock); the next last user removes its
/// instance and unmounts the tracefs it mounted, whether that user was running already or comes
/// later.
#[test]
fn a_sigkilled_fraglab_is_cleaned_up_by_the_next_last_user() {
    let Some(_g) = host() else { return };
    in_private_mount_ns(Start::Unmounted, |_| a_sigkilled_fraglab());
}

fn a_sigkilled_fraglab() {
    // Killed while another process runs: that one is the last user.
    let (a, sa) = Helper::start();
    let (b, _) = Helper::start();
    let a_pid = a.pid();
    assert!(sa.mounted_tracefs);
    a.kill();
    assert!(sa.instance.exists(), "a SIGKILLed catcher leaves its instance");
    assert!(b.stop(), "B is the last user and unmounts what A mounted");
    assert!(!mounted() && !Path::new(MOUNT_MARKER).exists());
    assert!(!fraglab_instances().iter().any(instance_of(a_pid)), "A's instance survived");

    // Killed alone: its mount, marker and instance stay until the next fraglab comes and goes.
    let (a, sa) = Helper::start();
    let a_pid = a.pid();
    assert!(sa.mounted_tracefs);
    a.kill();
    assert!(mounted() && Path::new(MOUNT_MARKER).exists() && sa.instance.exists());
    let c = Catcher::start(5).unwrap();
    assert!(c.mounted_tracefs(), "the marker says fraglab mounted it");
    assert!(!sa.instance.exists(), "the dead process's instance is removed on start");
    assert!(c.stop().unwrap().unmounted);
    assert!(!mounted() && !Path::new(MOUNT_MARKER).exists());
    assert!(!fraglab_instances().iter().any(instance_of(a_pid)));
}

/// The users lock, not open trace files, is what keeps tracefs mounted: a fraglab process that has
/// joined but holds nothing open in tracefs yet (between its join and its `trace_pipe`; simulated
/// here by holding `tracefs.users` shared on a descriptor of this test) keeps a last-looking
/// catcher from unmounting; once it is gone, the next last user unmounts.
#[test]
fn a_joined_fraglab_with_nothing_open_keeps_it_mounted() {
    let Some(_g) = host() else { return };
    in_private_mount_ns(Start::Unmounted, |_| a_joined_fraglab());
}

fn a_joined_fraglab() {
    let (a, sa) = Helper::start();
    assert!(sa.mounted_tracefs);
    let joined = {
        let gate = std::fs::File::open(MOUNT_LOCK).unwrap();
        assert_eq!(unsafe { libc::flock(gate.as_raw_fd(), libc::LOCK_EX) }, 0);
        let users = std::fs::File::open(USERS_LOCK).unwrap();
        assert_eq!(unsafe { libc::flock(users.as_raw_fd(), libc::LOCK_SH) }, 0);
        users
    };
    assert!(!a.stop(), "another fraglab has joined: it is not A's to unmount");
    assert!(mounted() && Path::new(MOUNT_MARKER).exists());
    drop(joined); // that process dies before opening anything
    let (b, sb) = Helper::start();
    assert!(sb.mounted_tracefs);
    assert!(b.stop(), "the next last user unmounts it");
    assert!(!mounted() && !Path::new(MOUNT_MARKER).exists());
}
