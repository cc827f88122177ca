//! Every command's output survives a reader that goes away (`fraglab status | head -1`): no panic,
//! the command's usual exit status, and a holder that keeps holding until it is released.
//!
//! The reader is gone before the command starts: a pipe whose read end is closed fails the very
//! first write with EPIPE, whatever the timing — a real `head -1` may have read everything before
//! it exits, and then the test would prove nothing. stdout, stderr and both are each tried.
//! Commands that only read and print (probe, scan, compare, completions, man) die of SIGPIPE as
//! `cat` does; the others must get EPIPE, drop the rest of their output and finish.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{collect, command, read_json, repo, sysctls_at_rest, wait_until};

/// Runs and holds take the machine's memory and sysctls: one at a time in this file.
static SERIAL: Mutex<()> = Mutex::new(());

/// A command that prints and ends must end within this, its output unread.
const BOUND: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug)]
enum Closed {
    Stdout,
    Stderr,
    Both,
}

const CLOSED: [Closed; 3] = [Closed::Stdout, Closed::Stderr, Closed::Both];

/// The write end of a pipe nobody reads.
fn closed_pipe() -> OwnedFd {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    write
}

/// How a command may end with its reader gone.
#[derive(Clone, Copy, Debug)]
enum Ends {
    /// This exit status, as with a reader.
    Code(i32),
    /// This status, or killed by SIGPIPE on the first write to the closed stream (the read-only
    /// commands).
    CodeOrSigpipe(i32),
}

/// `fraglab --run-dir DIR ARGS` with `closed` on a reader that is gone; the other stream kept.
/// Returns the exit status and what the kept stream said.
fn run_closed(dir: &Path, args: &[&str], closed: Closed) -> (ExitStatus, String) {
    let mut c = command(dir);
    c.args(args).stdin(Stdio::null());
    match closed {
        Closed::Stdout => c.stdout(closed_pipe()).stderr(Stdio::piped()),
        Closed::Stderr => c.stdout(Stdio::piped()).stderr(closed_pipe()),
        Closed::Both => c.stdout(closed_pipe()).stderr(closed_pipe()),
    };
    let mut child = c.spawn().unwrap();
    // Read on other threads, so a command that never ends meets the bound instead of hanging here.
    let kept = match (child.stdout.take(), child.stderr.take()) {
        (Some(s), _) => collect(s),
        (_, Some(s)) => collect(s),
        (None, None) => collect(std::io::empty()),
    };
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            panic!(
                "fraglab {args:?} with {closed:?} closed did not end within {BOUND:?}: {}",
                kept.lock().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, all_of(&kept))
}

/// What a [`collect`]ed stream said, once its reader has seen the end (within a bound: a daemon
/// started by the command may keep the pipe open until it detaches).
fn all_of(text: &Arc<Mutex<String>>) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(text) > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    text.lock().unwrap().clone()
}

fn check(dir: &Path, args: &[&str], ends: Ends) {
    for closed in CLOSED {
        // A watch whose stdout is read goes on until the hold ends: only a closed stdout ends it.
        if args.contains(&"--watch") && matches!(closed, Closed::Stderr) {
            continue;
        }
        let (status, kept) = run_closed(dir, args, closed);
        assert!(!kept.contains("panicked"), "fraglab {args:?}, {closed:?} closed: {kept}");
        let ok = match ends {
            Ends::Code(c) => status.code() == Some(c),
            Ends::CodeOrSigpipe(c) => status.code() == Some(c) || status.signal() == Some(libc::SIGPIPE),
        };
        assert!(ok, "fraglab {args:?}, {closed:?} closed: {status}, want {ends:?}: {kept}");
    }
}

/// `fraglab status --watch 100ms`, both streams collected as they come.
fn spawn_watch(dir: &Path) -> (std::process::Child, Arc<Mutex<String>>, Arc<Mutex<String>>) {
    let mut watch = command(dir)
        .args(["status", "--watch", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = collect(watch.stdout.take().unwrap());
    let err = collect(watch.stderr.take().unwrap());
    (watch, out, err)
}

fn run_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-pipes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The commands that print and end, without memory held.
#[test]
fn commands_that_print_and_end_survive_a_closed_pipe() {
    // `release` answers for the whole machine: not while another test here holds.
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = run_dir("print");
    let mail = "crates/probe/tests/captures/kmsg/netdev-2018-08-10-sctp-buddyinfo.mail";
    use Ends::*;
    for (args, ends) in [
        (&["--help"][..], Code(0)),
        (&["help", "run"], Code(0)),
        (&["fragment", "--help"], Code(0)),
        (&["--version"], Code(0)),
        (&["completions", "bash"], CodeOrSigpipe(0)),
        (&["man"], CodeOrSigpipe(0)),
        (&["probe"], CodeOrSigpipe(0)),
        (&["probe", "--json"], CodeOrSigpipe(0)),
        (&["probe", "--watch", "100ms", "--duration", "1s"], CodeOrSigpipe(0)),
        (&["probe", "--sockets", "tcp"], CodeOrSigpipe(0)),
        (&["scan", mail], CodeOrSigpipe(0)),
        (&["scan", "--json", mail], CodeOrSigpipe(0)),
        (&["fragment", "--dry-run", "--budget", "64MiB", "--max-free-order", "4"], Code(0)),
        (&["fragment", "--dry-run", "--json", "--budget", "64MiB", "--max-free-order", "4"], Code(0)),
        (&["workload", "tcp-rr", "--duration", "1s"], Code(0)),
        (&["workload", "tcp-stream", "--duration", "1s", "--json"], Code(0)),
        (&["workload", "trigger", "pipe-resize", "--bytes", "64KiB", "--repeat", "3"], Code(0)),
        (&["serve", "--listen", "127.0.0.1:0", "--duration", "1s"], Code(0)),
        // Nothing held: status says so (1), release has nothing to do (0).
        (&["status"], Code(1)),
        (&["status", "--watch", "100ms"], Code(1)),
        (&["release"], Code(0)),
        // Bad input: 255, said on stderr (or not at all when stderr is closed).
        (&["workload", "tcp-rr", "--threads", "abc"], Code(255)),
        (&["status", "--watch", "soon"], Code(255)),
        (&["status", "--watch", "0s"], Code(255)),
    ] {
        check(&dir, args, ends);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run with nobody reading its output runs to its verdict and exits by it; report and compare of
/// its results likewise.
#[test]
fn a_run_report_and_compare_survive_a_closed_pipe() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = run_dir("run");
    let out = dir.join("out");
    let config = repo().join("configs/quickstart.toml");
    let (status, kept) =
        run_closed(&dir, &["run", config.to_str().unwrap(), "-o", out.to_str().unwrap()], Closed::Both);
    assert!(!kept.contains("panicked"), "{kept}");
    let results = std::fs::read_dir(&out).unwrap().next().unwrap().unwrap().path();
    let run = read_json(&results.join("run.json"));
    assert_eq!(run["status"], "complete", "{run}");
    let want = match run["verdict"].as_str().unwrap() {
        "not-reproduced" => 0,
        "reproduced" => 1,
        _ => 125,
    };
    assert_eq!(status.code(), Some(want), "{}", run["verdict"]);
    let r = results.to_str().unwrap();
    check(&dir, &["report", r, "-o", dir.join("report.html").to_str().unwrap()], Ends::Code(0));
    check(&dir, &["compare", r, r], Ends::CodeOrSigpipe(0));
    check(&dir, &["compare", "--format", "json", r, r], Ends::CodeOrSigpipe(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A holder with nobody reading holds until released; status and its watch, with nobody reading,
/// end at once with the hold's state; `status --watch | head -2` ends when head does.
#[test]
fn a_hold_and_its_status_survive_a_closed_pipe() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = run_dir("hold");
    let before = sysctls_at_rest(&dir, "before the test");

    // In the foreground, both streams closed: it holds, answers, and ends on release.
    let mut fg = command(&dir)
        .args(["fragment", "--max-free-order", "4", "--budget", "256MiB"])
        .stdin(Stdio::null())
        .stdout(closed_pipe())
        .stderr(closed_pipe())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(600), "the foreground fragmenter holds", || {
        assert!(fg.try_wait().unwrap().is_none(), "it ended instead of holding");
        let out = command(&dir).args(["status", "--json"]).output().unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|s| s["now"]["holds"] == true)
    });
    check(&dir, &["status"], Ends::Code(0));
    check(&dir, &["status", "--json"], Ends::Code(0));
    check(&dir, &["release"], Ends::Code(0));
    let status = fg.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(sysctls_at_rest(&dir, "the foreground hold"), before);

    // In the background, started with both streams closed: it holds, and once detached its log
    // gets what it says (a write that failed before must not silence it).
    let (status, kept) = run_closed(
        &dir,
        &["fragment", "--max-free-order", "4", "--budget", "256MiB", "--daemon"],
        Closed::Both,
    );
    assert_eq!(status.code(), Some(0), "{kept}");
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["status", "--watch", "100ms"],
        &["status", "--json", "--watch", "100ms"],
    ] {
        check(&dir, args, Ends::Code(0));
    }
    // Its text lost to a full disk, status still answers by its exit status: the target holds.
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = command(&dir).arg("status").stdout(full).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("fraglab: cannot write to stdout: No space left on device"), "{said}");
    // As a user types it: a watch read for two lines, then the reader leaves.
    let mut watch = command(&dir)
        .args(["status", "--watch", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("fraglab pid "), "{first}");
    let mut seen = vec![first];
    // The whole account first, then one line an answer: the first of those says `holds`.
    for line in lines.by_ref() {
        let line = line.unwrap();
        let watch_line = line.len() > 10 && line.as_bytes()[2] == b':' && !line.starts_with(' ');
        seen.push(line);
        if watch_line {
            break;
        }
    }
    let last = seen.last().unwrap().clone();
    assert!(last.contains("  holds") && last.contains("held "), "{seen:#?}");
    // A budget is held by its regions: free blocks elsewhere are listed as not counted, each with
    // its node (on a NUMA machine "DMA32 0, DMA32 0" would say nothing).
    assert!(last.contains("not counted, free pages at order ≥ 4: Node "), "{seen:#?}");
    drop(lines);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = watch.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the watch went on with nobody reading");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    watch.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // A watch sees the hold end: it says so and exits 1 (nothing holds now). Released once the
    // watch has had its first answer, which is what "ended" is measured against.
    let (mut watch, out, err) = spawn_watch(&dir);
    wait_until(Duration::from_secs(60), "the watch's first answer", || {
        out.lock().unwrap().contains("holding since")
    });
    check(&dir, &["release"], Ends::Code(0));
    let mut status = None;
    wait_until(Duration::from_secs(60), "the watch ends with the hold", || {
        status = watch.try_wait().unwrap();
        status.is_some()
    });
    let err = all_of(&err);
    assert_eq!(status.unwrap().code(), Some(1), "{err}");
    assert!(err.contains("fraglab status: the hold ended"), "{err}");
    assert_eq!(sysctls_at_rest(&dir, "the background hold"), before);
    // The daemon's last line comes after it let go of the lock, which is what release waits for.
    wait_until(Duration::from_secs(30), "the daemon's log says it released", || {
        std::fs::read_to_string(dir.join("fraglab.log")).unwrap().contains("released; restored")
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fraglab vm` passes the guest's stdout through; with nobody reading it still exits by the
/// guest command.
#[test]
fn a_guest_command_survives_a_closed_pipe() {
    // A guest takes a core and 1 GiB: not beside a hold of this file's.
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = run_dir("vm");
    let (status, kept) =
        run_closed(&dir, &["vm", "--kernel", "debian-cloud", "--", "probe", "--json"], Closed::Stdout);
    assert!(!kept.contains("panicked"), "{kept}");
    assert_eq!(status.code(), Some(0), "{kept}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Output lost to a full disk (`> /dev/full`): a command whose output is its answer says so and
/// exits 255; any other exits by what it did, the loss said on stderr (status, which exits by the
/// target: in the hold test).
#[test]
fn output_lost_to_a_full_disk_fails_only_the_commands_whose_output_is_the_answer() {
    let dir = run_dir("full");
    let mail = "crates/probe/tests/captures/kmsg/netdev-2018-08-10-sctp-buddyinfo.mail";
    for (args, want) in [
        (&["probe"][..], 255),
        (&["probe", "--json"], 255),
        (&["scan", mail], 255),
        (&["completions", "bash"], 255),
        (&["man"], 255),
        (&["fragment", "--dry-run", "--budget", "64MiB", "--max-free-order", "4"], 255),
        (&["workload", "trigger", "pipe-resize", "--bytes", "64KiB", "--repeat", "3"], 0),
    ] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = command(&dir).args(args).current_dir(repo()).stdout(full).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(want), "fraglab {args:?} > /dev/full: {err}");
        assert!(
            err.contains("fraglab: cannot write to stdout: No space left on device"),
            "fraglab {args:?} > /dev/full: {err}"
        );
        assert!(!err.contains("panicked"), "fraglab {args:?} > /dev/full: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `status --watch` against a holder that answers badly once: the error is said and the watch goes
/// on; it ends (exit 1, "the hold ended") only when nothing answers on the socket. The holder here
/// is this test, answering on the run directory's socket as a fragmenter would, so that each of
/// its answers is the one wanted.
#[test]
fn a_watch_goes_on_through_a_bad_answer_and_ends_when_nothing_answers() {
    use std::io::Write;
    use std::os::unix::net::UnixListener;
    let dir = run_dir("badanswer");
    let listener = UnixListener::bind(dir.join("fraglab.sock")).unwrap();
    let (mut watch, out, err) = spawn_watch(&dir);
    let shaping = r#"{"ok":true,"shaping":"taking memory: 1.00 GiB of 4.00 GiB","pid":4242}"#;
    let bad = r#"{"ok":false,"error":"cannot read /proc/buddyinfo: this test said so"}"#;
    listener.set_nonblocking(true).unwrap();
    for reply in [shaping, bad, bad, shaping] {
        // The watch asks every 100 ms; one that stopped asking must fail this test, not hang it.
        let mut conn = None;
        wait_until(Duration::from_secs(60), "the watch asks again", || {
            assert!(
                watch.try_wait().unwrap().is_none(),
                "the watch ended early: {}{}",
                out.lock().unwrap(),
                err.lock().unwrap()
            );
            conn = listener.accept().ok();
            conn.is_some()
        });
        let (stream, _) = conn.unwrap();
        stream.set_nonblocking(false).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), r#"{"cmd":"status"}"#);
        writeln!(&stream, "{reply}").unwrap();
    }
    // The holder lets go: its socket goes away.
    drop(listener);
    std::fs::remove_file(dir.join("fraglab.sock")).unwrap();
    let mut status = None;
    wait_until(Duration::from_secs(60), "the watch ends once nothing answers", || {
        status = watch.try_wait().unwrap();
        status.is_some()
    });
    let (out, err) = (all_of(&out), all_of(&err));
    assert_eq!(status.unwrap().code(), Some(1), "{out}{err}");
    assert_eq!(
        out.lines().filter(|l| l.contains("fraglab pid 4242 is still shaping: taking memory")).count(),
        2,
        "{out}"
    );
    assert_eq!(
        err.matches("fraglab status: fraglab answered: \"cannot read /proc/buddyinfo").count(),
        2,
        "{err}"
    );
    assert!(err.contains("fraglab status: the hold ended (no fraglab is holding memory"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
