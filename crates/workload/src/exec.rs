//! `fraglab workload exec [--timeout 60s] -- CMD ARGS...`: run any external command (sctp_test,
//! iperf3, netperf) as a workload. Its output is read line by line as it arrives, so "Cannot allocate
//! memory", ENOMEM, ENOBUFS, "No buffer space available" and "page allocation failure" are counted by
//! errno with the time they first appeared; the last `--keep-output` bytes of stdout and stderr, the
//! exit status, the wall time and the command's own rusage (wait4) go into the result.
//!
//! The command runs in its own process group; on timeout the whole group gets SIGTERM, then SIGKILL
//! after [`KILL_GRACE`]. A Ctrl-C or SIGTERM to fraglab is forwarded the same way, and fraglab dies of
//! it once the command is reaped, so nothing it started is left running.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::signals::{signal_name, DeferSignals};
use fraglab_results::workload::{wall_now, Errors, Rusage, WorkloadResult};
use fraglab_units::{format_size, parse_duration, parse_size};

/// Between SIGTERM and SIGKILL to the command's process group.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long the output may stay open after the command exited (held by processes it left behind)
/// before those are killed; and, once they are, how long before reading stops regardless (a process
/// that left the group — setsid, a daemon — is out of reach of the group's SIGKILL).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How long after the SIGKILL the command may go unreaped before fraglab gives up on it: a process
/// stuck in the kernel (state D) dies only when its call returns, which may be never.
const REAP_BOUND: Duration = Duration::from_secs(10);
/// Longest stretch of a line without a newline that is scanned as one line.
const MAX_LINE: usize = 64 << 10;

fn default_timeout() -> String {
    "60s".into()
}
fn default_keep_output() -> String {
    "64KiB".into()
}

#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// Stop the command after this long: SIGTERM to its process group, SIGKILL 2 s later.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    #[serde(default = "default_timeout")]
    pub timeout: String,
    /// Keep this much of the end of stdout and of stderr in the result.
    #[arg(long, default_value = "64KiB", value_name = "SIZE")]
    #[serde(default = "default_keep_output")]
    pub keep_output: String,
    /// The command and its arguments, after `--`.
    #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Output patterns and the errno each one means.
const PATTERNS: [(&str, i32); 5] = [
    ("Cannot allocate memory", libc::ENOMEM),
    ("ENOMEM", libc::ENOMEM),
    ("page allocation failure", libc::ENOMEM),
    ("No buffer space available", libc::ENOBUFS),
    ("ENOBUFS", libc::ENOBUFS),
];

/// The errnos one line of output reports, each at most once.
pub fn errnos_in(line: &str) -> Vec<i32> {
    let mut found: Vec<i32> = Vec::new();
    for (pattern, code) in PATTERNS {
        if !found.contains(&code) && line.contains(pattern) {
            found.push(code);
        }
    }
    found
}

/// Check the options without running anything: what `fraglab run` does before it fragments.
pub fn validate(args: &ExecArgs) -> Result<()> {
    resolve(args).map(drop)
}

/// The timeout, the output tail to keep, and the program with its arguments.
fn resolve(args: &ExecArgs) -> Result<(std::time::Duration, usize, &String, &[String])> {
    let timeout =
        parse_duration(&args.timeout).map_err(|e| anyhow::anyhow!("--timeout {}: {e}", args.timeout))?;
    if timeout.is_zero() {
        bail!("--timeout {}: must be above zero", args.timeout);
    }
    let keep = parse_size(&args.keep_output)
        .map_err(|e| anyhow::anyhow!("--keep-output {}: {e}", args.keep_output))?;
    if keep > 64 << 20 {
        bail!("--keep-output {}: at most 64MiB", args.keep_output);
    }
    let Some((program, rest)) = args.command.split_first() else {
        bail!("no command: write it after `--`, e.g. fraglab workload exec -- iperf3 -c 127.0.0.1");
    };
    Ok((timeout, keep as usize, program, rest))
}

/// Run the command. When `stop` (the run's stop flag: a signal to `fraglab run`, taken by its handler)
/// is raised, the command's group is stopped as on a timeout and the result says so.
pub fn run(args: &ExecArgs, stop: &AtomicBool) -> Result<WorkloadResult> {
    // Validate everything before starting anything.
    let (timeout, keep, program, rest) = resolve(args)?;
    let params = serde_json::to_value(args)?;

    // Ctrl-C / SIGTERM to fraglab are forwarded to the command's group, not left to orphan it. Threads
    // spawned from here on inherit the mask; the command must not (std does not reset it).
    let signals = DeferSignals::block();
    let mask = signals.original();
    let mut command = Command::new(program);
    command.args(rest).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    // The command gets the descriptor limit fraglab started with, not the one a whole-machine pipe
    // fill raised.
    let nofile = fraglab_fragmenter::pipefill::nofile_before_fill()
        .map(|(soft, hard)| libc::rlimit { rlim_cur: soft, rlim_max: hard });
    // SAFETY: between fork and exec only pthread_sigmask and setrlimit run, both async-signal-safe
    // system calls.
    unsafe {
        command.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            if let Some(lim) = &nofile {
                libc::setrlimit(libc::RLIMIT_NOFILE, lim);
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let started = wall_now();
    let mut child = command.spawn().with_context(|| format!("cannot run `{program}`"))?;
    let pid = child.id() as libc::pid_t;
    let abandon = Arc::new(AtomicBool::new(false));
    let readers = [
        spawn_reader(child.stdout.take().expect("piped"), start, keep, Arc::clone(&abandon)),
        spawn_reader(child.stderr.take().expect("piped"), start, keep, Arc::clone(&abandon)),
    ];
    // The child is reaped with wait4() below (for its rusage), never through `child`.
    drop(child);
    let (done_tx, done_rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = done_tx.send(wait4(pid));
    });

    let deadline = start + timeout;
    let mut timed_out = false;
    let mut interrupted = None;
    let mut stopped = false;
    let mut stopping = Stop::Running;
    // `None`: still not reaped REAP_BOUND after the SIGKILL.
    let reaped = loop {
        match done_rx.recv_timeout(Duration::from_millis(20)) {
            Ok(r) => break Some(r.context("wait4 on the command failed")?),
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("lost the command's waiter thread"),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        match stopping {
            Stop::Running => {
                if now >= deadline {
                    timed_out = true;
                } else if let Some(sig) = signals.pending() {
                    interrupted = Some(sig);
                } else if stop.load(Ordering::Relaxed) {
                    stopped = true;
                }
                if timed_out || interrupted.is_some() || stopped {
                    kill_group(pid, libc::SIGTERM);
                    stopping = Stop::Terminating(now + KILL_GRACE);
                }
            }
            Stop::Terminating(kill_at) if now >= kill_at => {
                kill_group(pid, libc::SIGKILL);
                stopping = Stop::Killed(now + REAP_BOUND);
            }
            Stop::Killed(give_up) if now >= give_up => break None,
            Stop::Terminating(_) | Stop::Killed(_) => {}
        }
    };
    let duration = start.elapsed();

    // Processes the command left in its group may hold the output open: give them a moment, then
    // kill them so the readers see EOF. One outside the group is out of reach: after another moment
    // the readers stop regardless, and the result says which stream was still open.
    let mut notes = Vec::new();
    let unreaped = reaped.is_none();
    let (status, usage) = reaped.unwrap_or_default();
    if unreaped {
        notes.push(format!(
            "still not reaped {} s after SIGKILL to its process group (pid {pid}, state {}: stuck in the \
             kernel); gave up waiting and left it: no exit status or rusage",
            REAP_BOUND.as_secs(),
            proc_state(pid)
        ));
    }
    let drained = |until: Instant| {
        while readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
        readers.iter().all(|r| r.is_finished())
    };
    if !drained(Instant::now() + DRAIN_GRACE) {
        kill_group(pid, libc::SIGKILL);
        notes.push(
            "processes the command left behind kept its output open after it exited; killed its process group"
                .to_string(),
        );
        if !drained(Instant::now() + DRAIN_GRACE) {
            abandon.store(true, Ordering::Relaxed);
        }
    }
    let mut outputs = Vec::new();
    for r in readers {
        outputs.push(r.join().map_err(|_| anyhow::anyhow!("an output reader panicked"))?);
    }
    drop(signals); // a forwarded Ctrl-C now ends fraglab too, the command being gone

    let mut errors = Errors::new(start);
    let mut details = BTreeMap::new();
    let mut alloc_failure_lines = 0;
    for (name, out) in ["stdout", "stderr"].into_iter().zip(outputs) {
        if out.abandoned {
            notes.push(format!(
                "{name}: still open {} s after its process group was killed (held by a process outside the \
                 group: setsid, a daemon); stopped reading it there",
                DRAIN_GRACE.as_secs()
            ));
        }
        details.insert(name.to_string(), json!(String::from_utf8_lossy(&out.tail)));
        details.insert(format!("{name}_bytes"), json!(out.bytes));
        if out.bytes > out.tail.len() as u64 {
            notes.push(format!(
                "{name}: kept the last {} of {}",
                format_size(out.tail.len() as u64),
                format_size(out.bytes)
            ));
        }
        alloc_failure_lines += out.alloc_failure_lines;
        errors.merge(out.errors);
    }
    if alloc_failure_lines > 0 {
        details.insert("page_allocation_failure_lines".into(), json!(alloc_failure_lines));
    }
    let exited_ok = !unreaped && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    if unreaped {
        details.insert("unreaped".into(), json!(true));
    } else if libc::WIFEXITED(status) {
        details.insert("exit_code".into(), json!(libc::WEXITSTATUS(status)));
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        details.insert("signal".into(), json!(signal_name(sig)));
    }
    details.insert("timed_out".into(), json!(timed_out));
    if timed_out {
        notes.push(format!(
            "timed out after {}: SIGTERM to its process group, SIGKILL {} s later if still running",
            humantime::format_duration(timeout),
            KILL_GRACE.as_secs()
        ));
    }
    if errors.total() > 0 {
        notes.push(
            "errors are lines of the command's output naming ENOMEM/ENOBUFS (\"Cannot allocate memory\", \
             \"No buffer space available\", \"page allocation failure\" count as ENOMEM/ENOBUFS/ENOMEM)"
                .into(),
        );
    }
    notes.push(
        "rusage is the command's own (wait4), including children it waited for; its maxrss starts from \
         fraglab's RSS at the fork (Linux carries the high-water mark through exec)"
            .into(),
    );

    let mut result = WorkloadResult {
        kind: "exec".into(),
        params,
        started,
        duration_s: duration.as_secs_f64(),
        ok: u64::from(exited_ok),
        failed: u64::from(!exited_ok),
        bytes: 0,
        throughput_mbit: None,
        ops_per_sec: None,
        per_worker: None,
        latency_us: None,
        cpu: None,
        errors: errors.into_vec(),
        rusage: usage,
        skmem: None,
        details,
        notes,
    };
    // Under `fraglab run` the run's handler takes the signal on another thread and raises `stop`, but
    // this thread may see it pending first: the same stop either way.
    if stopped || interrupted.is_some() {
        let by = interrupted.map_or_else(String::new, |sig| format!(" ({} to fraglab)", signal_name(sig)));
        result.mark_stopped(format_args!(
            "{:.1} s{by}: SIGTERM to the command's process group, SIGKILL {} s later if still running",
            duration.as_secs_f64(),
            KILL_GRACE.as_secs()
        ));
    }
    Ok(result)
}

/// How far stopping the command has gone.
enum Stop {
    Running,
    /// SIGTERM sent; SIGKILL at this instant.
    Terminating(Instant),
    /// SIGKILL sent; given up on at this instant if still not reaped.
    Killed(Instant),
}

/// The state letter of `pid` in /proc (`D`: uninterruptible sleep), or `?`.
fn proc_state(pid: libc::pid_t) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().next().map(String::from))
        })
        .unwrap_or_else(|| "?".into())
}

/// What one output stream produced.
struct Output {
    tail: Vec<u8>,
    bytes: u64,
    errors: Errors,
    alloc_failure_lines: u64,
    /// Reading stopped at `abandon`, the stream still open.
    abandoned: bool,
}

/// Read `stream` to its end, or until `abandon` is raised: it is looked at between reads, which
/// wait in poll() so a stream that stays open and silent cannot keep the thread.
fn spawn_reader(
    mut stream: impl Read + AsRawFd + Send + 'static,
    start: Instant,
    keep: usize,
    abandon: Arc<AtomicBool>,
) -> thread::JoinHandle<Output> {
    thread::spawn(move || {
        let mut out = Output {
            tail: Vec::new(),
            bytes: 0,
            errors: Errors::new(start),
            alloc_failure_lines: 0,
            abandoned: false,
        };
        let mut tail: VecDeque<u8> = VecDeque::new();
        let mut line: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 16 << 10];
        let scan = |line: &[u8], out: &mut Output| {
            let text = String::from_utf8_lossy(line);
            for code in errnos_in(&text) {
                out.errors.record(&io::Error::from_raw_os_error(code));
            }
            if text.contains("page allocation failure") {
                out.alloc_failure_lines += 1;
            }
        };
        loop {
            if abandon.load(Ordering::Relaxed) {
                out.abandoned = true;
                break;
            }
            let mut pfd = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: poll on one pollfd we own, for a descriptor `stream` keeps open.
            match unsafe { libc::poll(&mut pfd, 1, 100) } {
                0 => continue,
                n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
                n if n < 0 => break,
                // Readable, at end of stream or in error: the read below says which without blocking.
                _ => {}
            }
            let n = match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let chunk = &buf[..n];
            out.bytes += n as u64;
            tail.extend(chunk);
            if tail.len() > keep {
                tail.drain(..tail.len() - keep);
            }
            for piece in chunk.split_inclusive(|&b| b == b'\n') {
                line.extend_from_slice(piece);
                if line.ends_with(b"\n") || line.len() >= MAX_LINE {
                    scan(&line, &mut out);
                    line.clear();
                }
            }
        }
        if !line.is_empty() {
            scan(&line, &mut out);
        }
        out.tail = tail.into();
        out
    })
}

/// Reap `pid`, with its resource usage.
fn wait4(pid: libc::pid_t) -> io::Result<(libc::c_int, Rusage)> {
    let mut status = 0;
    // SAFETY: rusage is plain data the kernel fills in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: status and ru are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        status,
        Rusage {
            user_s: secs(ru.ru_utime),
            sys_s: secs(ru.ru_stime),
            maxrss_kb: ru.ru_maxrss,
            minflt: ru.ru_minflt,
            majflt: ru.ru_majflt,
            nvcsw: ru.ru_nvcsw,
            nivcsw: ru.ru_nivcsw,
        },
    ))
}

fn kill_group(pgid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill() with a negative pid signals the process group the command leads.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn recognises_allocation_failures() {
        assert_eq!(errnos_in("connect: Cannot allocate memory"), vec![libc::ENOMEM]);
        assert_eq!(errnos_in("sendmsg: No buffer space available (ENOBUFS)"), vec![libc::ENOBUFS]);
        assert_eq!(
            errnos_in("[  12.3] sctp_test: page allocation failure: order:5, mode:0xcc0(GFP_KERNEL)"),
            vec![libc::ENOMEM]
        );
        assert_eq!(errnos_in("ENOMEM and ENOBUFS"), vec![libc::ENOMEM, libc::ENOBUFS]);
        assert!(errnos_in("all good").is_empty());
    }

    #[test]
    fn the_run_stop_flag_stops_the_command_group() {
        let stop = AtomicBool::new(false);
        let args = ExecArgs {
            timeout: "60s".into(),
            keep_output: "64KiB".into(),
            // The shell's child must go too: the group is signalled, not just the shell.
            command: ["sh", "-c", "sleep 60 & echo started; wait"].map(String::from).to_vec(),
        };
        let t = Instant::now();
        let r = thread::scope(|s| {
            s.spawn(|| {
                thread::sleep(Duration::from_millis(300));
                stop.store(true, Ordering::Relaxed);
            });
            run(&args, &stop).unwrap()
        });
        assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
        assert_eq!(r.failed, 1);
        assert_eq!(r.details["signal"], "SIGTERM");
        assert_eq!(r.details["timed_out"], false);
        assert_eq!(r.details["stopped_by_signal"], true);
        assert!(r.duration_s < 2.0, "{}", r.duration_s);
        let note = r.notes.last().unwrap();
        assert!(note.starts_with("stopped by a signal after 0.") && note.contains("SIGTERM"), "{note}");
        assert!(!r.notes.iter().any(|n| n.contains("left behind")), "{:?}", r.notes);
    }

    /// A process that left the command's group (setsid) keeps its stdout open after the command
    /// exits, out of reach of the group's SIGKILL: reading stops after the grace periods, and the
    /// result names the stream and the bound instead of waiting for that process.
    #[test]
    fn output_held_open_outside_the_group_is_given_up_on() {
        let args = ExecArgs {
            timeout: "60s".into(),
            keep_output: "64KiB".into(),
            // setsid, not a group leader here, calls setsid() and execs sleep: $! is the sleep, which holds
            // stdout only.
            command: ["sh", "-c", "setsid sleep 600 2>/dev/null & echo $!"].map(String::from).to_vec(),
        };
        let r = run(&args, &AtomicBool::new(false)).unwrap();
        let escapee: libc::pid_t = r.details["stdout"].as_str().unwrap().trim().parse().unwrap();
        let alive = Path::new(&format!("/proc/{escapee}")).exists();
        // SAFETY: kill() of the sleep this test started.
        unsafe { libc::kill(escapee, libc::SIGKILL) };
        assert!(alive, "the setsid'd sleep outlived the group's SIGKILL, as the test needs");
        assert_eq!(r.details["exit_code"], 0);
        assert_eq!(r.ok, 1);
        let note = r.notes.iter().find(|n| n.starts_with("stdout: still open")).unwrap_or_else(|| {
            panic!("no note on the stdout held open: {:?}", r.notes);
        });
        assert!(
            note.contains(&format!("{} s after its process group was killed", DRAIN_GRACE.as_secs())),
            "{note}"
        );
        assert!(!r.notes.iter().any(|n| n.starts_with("stderr: still open")), "{:?}", r.notes);
    }

    /// Under `fraglab run` a signal may be seen pending on the workload's thread (which defers it)
    /// before the run's handler takes it: the command is stopped and the result says so just the same.
    /// A thread-directed SIGHUP to that thread makes this certain; a handler, as `fraglab run`
    /// installs, receives it once the mask comes back.
    #[test]
    fn a_signal_pending_on_the_workload_thread_stops_it_too() {
        let handled = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(libc::SIGHUP, Arc::clone(&handled)).unwrap();
        let args = ExecArgs {
            timeout: "60s".into(),
            keep_output: "64KiB".into(),
            command: ["sleep", "60"].map(String::from).to_vec(),
        };
        let tid = std::sync::atomic::AtomicI32::new(0);
        let r = thread::scope(|s| {
            s.spawn(|| {
                thread::sleep(Duration::from_millis(300));
                // SAFETY: tgkill to a thread of this process that is alive (it runs the command).
                unsafe {
                    libc::syscall(libc::SYS_tgkill, libc::getpid(), tid.load(Ordering::SeqCst), libc::SIGHUP)
                };
            });
            // SAFETY: gettid has no preconditions.
            tid.store(unsafe { libc::gettid() }, Ordering::SeqCst);
            run(&args, &AtomicBool::new(false)).unwrap()
        });
        assert!(handled.load(Ordering::SeqCst), "the deferred SIGHUP reached the handler afterwards");
        assert_eq!(r.details["signal"], "SIGTERM");
        assert_eq!(r.details["stopped_by_signal"], true);
        let note = r.notes.last().unwrap();
        assert!(
            note.starts_with("stopped by a signal after 0.") && note.contains("(SIGHUP to fraglab)"),
            "{note}"
        );
    }

    #[test]
    fn configs_deserialize_with_cli_defaults() {
        let a: ExecArgs = serde_json::from_value(json!({"command": ["true"]})).unwrap();
        assert_eq!((a.timeout.as_str(), a.keep_output.as_str()), ("60s", "64KiB"));
        assert!(serde_json::from_value::<ExecArgs>(json!({"command": ["true"], "tmeout": "1s"})).is_err());
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: ExecArgs,
        }
        let c = Cli::parse_from(["x", "--", "sh", "-c", "exit 1"]);
        assert_eq!(c.a.command, ["sh", "-c", "exit 1"]);
        assert_eq!(
            serde_json::to_value(&c.a).unwrap(),
            json!({"timeout": "60s", "keep_output": "64KiB", "command": ["sh", "-c", "exit 1"]})
        );
        let c = Cli::parse_from(["x", "--timeout", "1s", "sleep", "30", "--timeout", "5s"]);
        assert_eq!((c.a.timeout.as_str(), c.a.command.len()), ("1s", 4));
    }
}
