//! `fraglab workload exec` running real commands: exit status, ENOMEM/ENOBUFS in their output with
//! when each first appeared, timeouts that kill the whole process group, bounded output, the child's
//! own rusage, and a SIGTERM to fraglab that takes the command down with it.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fraglab_results::workload::WorkloadResult;

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

fn fraglab(args: &[&str]) -> Output {
    Command::new(FRAGLAB).args(args).output().unwrap()
}

/// `fraglab workload --json exec ARGS`, which must produce a result, with exit status 1 when the
/// command failed and 0 when it succeeded.
fn exec(args: &[&str]) -> WorkloadResult {
    let out = fraglab(&[&["workload", "--json", "exec"], args].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r: WorkloadResult =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("exec {args:?}: {e}: {stderr}"));
    assert_eq!(out.status.code(), Some(i32::from(r.failed > 0)), "exec {args:?}: {stderr}");
    r
}

fn detail(r: &WorkloadResult, key: &str) -> serde_json::Value {
    r.details.get(key).cloned().unwrap_or_else(|| panic!("no details.{key} in {:#?}", r.details))
}

fn alive(pid: i32) -> bool {
    // A zombie is dead for our purpose.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Children of `pid`, from every thread's `children` file.
fn children(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    out
}

#[test]
fn enomem_in_the_output_is_counted_and_a_nonzero_exit_fails() {
    let r = exec(&["--", "sh", "-c", "echo connect: Cannot allocate memory; exit 1"]);
    assert_eq!(r.kind, "exec");
    assert_eq!((r.ok, r.failed), (0, 1));
    assert_eq!(r.errno_count("ENOMEM"), 1, "{:?}", r.errors);
    assert_eq!(r.errors[0].code, libc::ENOMEM);
    assert_eq!(detail(&r, "exit_code"), 1);
    assert_eq!(detail(&r, "timed_out"), false);
    assert_eq!(detail(&r, "stdout"), "connect: Cannot allocate memory\n");
    assert_eq!(
        r.params["command"],
        serde_json::json!(["sh", "-c", "echo connect: Cannot allocate memory; exit 1"])
    );
}

#[test]
fn each_errno_is_timed_when_its_line_arrives() {
    let script = "echo 'sendmsg: No buffer space available' >&2; echo ENOBUFS; sleep 0.6; \
                  echo 'kernel: sctp_test: page allocation failure: order:5'; echo done";
    let r = exec(&["--", "sh", "-c", script]);
    assert_eq!((r.ok, r.failed), (1, 0));
    assert_eq!(r.errno_count("ENOBUFS"), 2, "{:?}", r.errors);
    assert_eq!(r.errno_count("ENOMEM"), 1, "{:?}", r.errors);
    let first = |name: &str| r.errors.iter().find(|e| e.errno == name).unwrap().first_seen_s;
    // The 0.6 s sleep between the lines shows between their times: each was timed as it arrived,
    // not when the command ended (a lower bound the sleep guarantees, not an upper one that a
    // loaded machine could miss).
    let gap = first("ENOMEM") - first("ENOBUFS");
    assert!(
        gap >= 0.55,
        "ENOBUFS at {} s, ENOMEM at {} s: not read as they arrived",
        first("ENOBUFS"),
        first("ENOMEM")
    );
    assert_eq!(detail(&r, "page_allocation_failure_lines"), 1);
}

/// Live processes whose command line is `sleep ARG`.
fn sleeps(arg: &str) -> Vec<String> {
    let want = format!("sleep\0{arg}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want.as_bytes()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The `sleep ARG` processes are gone (killed with their group), within a hang guard.
fn assert_sleeps_gone(arg: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sleeps(arg).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sleep {arg} outlived the timeout (10 s hang guard): {:?}",
            sleeps(arg)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Not timed: the command (30 s, marked with this test's pid) is stopped at its 1 s timeout, which
/// shows as the result saying so, `echo never` never printed, a reported duration between the
/// timeout and the command's own 30 s, and both sleeps of its group gone.
#[test]
fn a_timeout_kills_the_process_group_and_is_reported() {
    let (a, b) = (format!("30.{}1", std::process::id()), format!("30.{}2", std::process::id()));
    let r = exec(&["--timeout", "1s", "--", "sh", "-c", &format!("sleep {a} & sleep {a}; echo never")]);
    assert_eq!((r.ok, r.failed), (0, 1));
    assert_eq!(detail(&r, "timed_out"), true);
    assert_eq!(detail(&r, "signal"), "SIGTERM");
    assert!(r.duration_s >= 1.0 && r.duration_s < 30.0, "{}", r.duration_s);
    assert!(r.notes.iter().any(|n| n.contains("timed out after 1s")), "{:?}", r.notes);
    assert_eq!(detail(&r, "stdout"), "");
    assert_sleeps_gone(&a);

    // A command that ignores SIGTERM gets SIGKILL after the grace period (2 s).
    let r = exec(&["--timeout", "1s", "--", "sh", "-c", &format!("trap '' TERM; sleep {b}")]);
    assert_eq!(detail(&r, "signal"), "SIGKILL");
    assert!(r.duration_s >= 3.0 && r.duration_s < 30.0, "{}", r.duration_s);
    assert_sleeps_gone(&b);
}

#[test]
fn true_is_ok() {
    let r = exec(&["--", "true"]);
    assert_eq!((r.ok, r.failed), (1, 0));
    assert!(r.errors.is_empty());
    assert_eq!(detail(&r, "exit_code"), 0);
    assert_eq!(r.params["timeout"], "60s");
}

#[test]
fn output_is_bounded_to_its_tail() {
    let r = exec(&["--keep-output", "1KiB", "--", "sh", "-c", "seq 1 30000; echo tail-marker >&2"]);
    let stdout = detail(&r, "stdout").as_str().unwrap().to_string();
    assert_eq!(stdout.len(), 1024);
    assert!(stdout.ends_with("29999\n30000\n"), "{stdout}");
    let total: u64 = (1..=30000u64).map(|n| n.to_string().len() as u64 + 1).sum();
    assert_eq!(detail(&r, "stdout_bytes"), total);
    assert_eq!(detail(&r, "stderr"), "tail-marker\n");
}

#[test]
fn rusage_is_the_commands_own() {
    // Burn about 0.3 s of the child's CPU; fraglab itself only waits.
    let r = exec(&["--", "sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"]);
    assert!(r.rusage.user_s + r.rusage.sys_s > 0.05, "{:?}", r.rusage);
    assert!(r.rusage.user_s <= r.duration_s + 0.05, "{:?} over {} s", r.rusage, r.duration_s);
}

#[test]
fn bad_options_and_missing_commands_are_errors() {
    for (args, says) in [
        (&["--timeout", "soon", "--", "true"][..], "--timeout soon"),
        (&["--timeout", "0s", "--", "true"][..], "--timeout 0s"),
        (&["--keep-output", "1GB", "--", "true"][..], "--keep-output 1GB"),
        (&["--", "/nonexistent/fraglab-test"][..], "cannot run `/nonexistent/fraglab-test`"),
    ] {
        let out = fraglab(&[&["workload", "exec"], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn sigterm_to_fraglab_takes_the_command_down_too() {
    let mut child = Command::new(FRAGLAB)
        .args(["workload", "exec", "--", "sleep", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let sleeper = loop {
        if let Some(&pid) = children(child.id()).first() {
            if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep") {
                break pid;
            }
        }
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "fraglab should still die of the SIGTERM");
    assert!(!alive(sleeper), "the command (pid {sleeper}) outlived fraglab");
}
