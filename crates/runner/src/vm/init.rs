//! The guest's PID 1 (`fraglab vm --guest-init`, started by the kernel through `rdinit=`, or as
//! the initramfs's `/init` in a LAVA job): mount the kernel's filesystems, bring `lo`
//! up, load the modules, run the job as a child, relay its stdout and stderr, send the results
//! directory and the verdict over the channel, end the guest (a restart, which `-no-reboot` turns
//! into qemu exiting). A LAVA job's guest has no channel: it reports on the console instead
//! ([`crate::lava::console`]) and powers off.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::channel::{self, Tag, Verdict};

/// Where the host puts the job in the initramfs.
pub const JOB_PATH: &str = "/fraglab/job.json";
/// The guest's results directory: the command's working directory, copied back to `--results`.
pub const RESULTS_DIR: &str = "/results";
/// The channel's serial port.
const CHANNEL_TTY: &str = "/dev/ttyS1";

/// What the guest is to do, written by the host into the initramfs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    /// The program and its arguments (`/bin/fraglab probe --json`, `/bin/sh /fraglab/script`).
    pub argv: Vec<String>,
    /// Guest paths of the modules to load, in order.
    pub modules: Vec<String>,
    /// Extra directories for PATH (where --extra-bin programs live).
    pub path: Vec<String>,
    /// Guest uptime (s) at which a command still running is asked to stop (SIGTERM to every
    /// process), so it can write what it has and its partial results still come back before the
    /// host's --timeout kills the whole guest.
    pub deadline_secs: Option<u64>,
    /// Guest uptime (s) at which whatever is still running after the deadline's SIGTERM is killed.
    #[serde(default)]
    pub kill_secs: Option<u64>,
    /// Where the output, the results and the verdict go.
    #[serde(default)]
    pub report: Report,
}

/// Where a guest reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Report {
    /// Frames on the second serial port, read by `fraglab vm` on the host.
    #[default]
    Channel,
    /// Lines on the console, read by LAVA's monitor (and `fraglab lava-results`).
    Console,
}

/// The guest path of the initramfs's `/init`, which a kernel runs without `rdinit=`.
pub const INIT_PATH: &str = "/init";

/// Whether this process runs inside a `fraglab vm` guest: PID 1 is fraglab's guest init. Read from
/// `/proc/1/cmdline` rather than `FRAGLAB_VM`, so a variable exported on a host cannot pass for a
/// guest and hide the whole-machine warning.
pub fn in_guest() -> bool {
    std::fs::read("/proc/1/cmdline")
        .map(|c| {
            c.split(|&b| b == 0).any(|arg| arg == b"--guest-init")
                || (c.split(|&b| b == 0).next() == Some(INIT_PATH.as_bytes()) && Path::new(JOB_PATH).exists())
        })
        .unwrap_or(false)
}

/// Whether this process is a guest's PID 1 started as `/init`: the kernel found the initramfs's
/// /init, with no `rdinit=` (a LAVA device's kernel command line is not the job's). Any arguments
/// are the command line's bare words the kernel did not know (a board's `splash`), passed on to
/// init: they do not make it anything else.
pub fn started_as_init() -> bool {
    std::process::id() == 1 && std::env::args_os().next().is_some_and(|a| a == INIT_PATH)
}

/// Never returns: the guest restarts (or, reporting on the console, powers off), which ends qemu.
pub fn run() -> ! {
    if std::process::id() != 1 {
        errln!("fraglab vm --guest-init runs only as a guest's PID 1 (rdinit=)");
        std::process::exit(2);
    }
    // Read before anything is mounted: the job says where to report, and so where to say that it
    // cannot be read. Without it the host's `fraglab vm` is listening on the channel.
    let job = std::fs::read(JOB_PATH)
        .with_context(|| format!("cannot read {JOB_PATH}"))
        .and_then(|j| serde_json::from_slice::<Job>(&j).with_context(|| format!("{JOB_PATH}: bad job")));
    let report = job.as_ref().map_or(Report::Channel, |j| j.report);
    let opened = match report {
        Report::Channel => Channel::open(),
        Report::Console => Ok(Channel::console()),
    };
    match opened {
        Ok(mut ch) => {
            let verdict = match job.and_then(|job| guest_main(&mut ch, &job)) {
                Ok(v) => v,
                Err(e) => {
                    let msg = format!("{e:#}");
                    ch.warn(&format!("init failed: {msg}"));
                    Verdict::InitFailed(msg)
                }
            };
            ch.finish(&verdict);
        }
        // The console is all we have; the host sees no verdict and shows the console's last lines.
        Err(e) => errln!("fraglab vm init: cannot open the channel {CHANNEL_TTY}: {e:#}"),
    }
    end_guest(report)
}

/// Where init's frames go: the channel's serial port, or (`tty` None) the console, where only
/// the output, init's messages and [`crate::lava::console`]'s report lines are written.
struct Channel {
    tty: Option<File>,
}

impl Channel {
    fn open() -> Result<Channel> {
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(CHANNEL_TTY)
            .context("open")?;
        raw_mode(&tty)?;
        let mut tty = tty;
        tty.write_all(channel::MAGIC)?;
        Ok(Channel { tty: Some(tty) })
    }

    /// Reporting on the console (init's stdout and stderr, which the kernel opened on it): the
    /// boot prompt a LAVA job waits for, then the monitor's start line.
    fn console() -> Channel {
        crate::lava::console::ready();
        Channel { tty: None }
    }

    fn frame(&mut self, tag: Tag, payload: &[u8]) {
        let Some(tty) = self.tty.as_mut() else {
            // One write per line or chunk: the kernel's own console messages land between writes.
            let text = String::from_utf8_lossy(payload);
            match tag {
                Tag::Stdout => out!("{text}"),
                Tag::Stderr => err!("{text}"),
                Tag::Log => outln!("fraglab: {text}"),
                Tag::Warn => outln!("fraglab: warning: {text}"),
                Tag::Results | Tag::Exit => {}
            }
            return;
        };
        if let Err(e) = channel::write_frame(tty, tag, payload) {
            errln!("fraglab vm init: channel write failed: {e}");
        }
    }

    /// The command is about to run: on the console, the line LAVA's monitor starts reading at.
    fn start(&mut self) {
        if self.tty.is_none() {
            crate::lava::console::start();
        }
    }

    fn log(&mut self, msg: &str) {
        self.frame(Tag::Log, msg.as_bytes());
    }

    fn warn(&mut self, msg: &str) {
        self.frame(Tag::Warn, msg.as_bytes());
    }

    /// The results directory, then the verdict; then wait until the UART has sent every byte.
    fn finish(&mut self, verdict: &Verdict) {
        let Some(tty) = self.tty.as_ref() else {
            crate::lava::console::report(Path::new(RESULTS_DIR), verdict);
            // A write to a tty returns once the line is in the kernel's buffer: on a board's 115200
            // baud UART its last 4 KiB take ~350 ms, and the power-off that follows would cut the
            // end line.
            // SAFETY: tcdrain on our stdout, the console the kernel opened for init.
            unsafe { libc::tcdrain(libc::STDOUT_FILENO) };
            return;
        };
        let tty = tty.as_raw_fd();
        let mut archive = Vec::new();
        match super::initramfs::pack_dir(Path::new(RESULTS_DIR), &mut archive) {
            Ok(skipped) => {
                for s in skipped {
                    self.warn(&format!("results: skipped {} (not a file or directory)", s.display()));
                }
                self.frame(Tag::Results, &archive);
            }
            Err(e) => self.warn(&format!("cannot pack {RESULTS_DIR}: {e:#}")),
        }
        let v = serde_json::to_vec(verdict).expect("verdict serializes");
        self.frame(Tag::Exit, &v);
        // SAFETY: tcdrain on our own open tty.
        unsafe { libc::tcdrain(tty) };
    }
}

use std::os::unix::fs::OpenOptionsExt;

/// Raw 8-bit, no echo, no flow control, no newline translation.
fn raw_mode(tty: &File) -> Result<()> {
    // SAFETY: termios is plain data; tcgetattr/tcsetattr on our own fd.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(tty.as_raw_fd(), &mut t) != 0 {
            return Err(std::io::Error::last_os_error()).context("tcgetattr");
        }
        libc::cfmakeraw(&mut t);
        t.c_cflag &= !(libc::CRTSCTS | libc::HUPCL);
        t.c_cflag |= libc::CLOCAL | libc::CREAD;
        if libc::tcsetattr(tty.as_raw_fd(), libc::TCSANOW, &t) != 0 {
            return Err(std::io::Error::last_os_error()).context("tcsetattr");
        }
    }
    Ok(())
}

fn guest_main(ch: &mut Channel, job: &Job) -> Result<Verdict> {
    mount_all(ch);
    if let Err(e) = loopback_up() {
        ch.warn(&format!("cannot bring lo up: {e:#}"));
    }
    for m in &job.modules {
        let t = Instant::now();
        match load_module(m) {
            Ok(true) => ch.log(&format!("loaded {m} in {} ms", t.elapsed().as_millis())),
            Ok(false) => ch.log(&format!("{m}: already loaded")),
            Err(e) => ch.warn(&format!("cannot load {m}: {e:#}")),
        }
    }
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    ch.log(&format!("running {:?} at uptime {}", job.argv, uptime.split_whitespace().next().unwrap_or("?")));
    ch.start();
    let verdict = run_job(ch, job)?;
    if let Ok(t) = std::fs::read_to_string("/proc/sys/kernel/tainted") {
        let taint: u64 = t.trim().parse().unwrap_or(0);
        // D (died: an oops) and W (a WARN) are what a kernel under test should not do.
        if taint & (1 << 7 | 1 << 9) != 0 {
            ch.warn(&format!(
                "the guest kernel is tainted {taint:#x}{}{}: see its console (--verbose)",
                if taint & (1 << 7) != 0 { " D (oops)" } else { "" },
                if taint & (1 << 9) != 0 { " W (warning)" } else { "" }
            ));
        }
    }
    Ok(verdict)
}

fn mount_all(ch: &mut Channel) {
    let mounts: [(&str, &str, &str); 6] = [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
        ("tracefs", "/sys/kernel/tracing", "tracefs"),
        ("debugfs", "/sys/kernel/debug", "debugfs"),
        ("tmpfs", "/dev/shm", "tmpfs"),
    ];
    for (src, target, fstype) in mounts {
        let _ = std::fs::create_dir_all(target);
        if let Err(e) =
            nix::mount::mount(Some(src), target, Some(fstype), nix::mount::MsFlags::empty(), None::<&str>)
        {
            ch.warn(&format!("cannot mount {fstype} on {target}: {e}"));
        }
    }
}

/// `ip link set lo up` without `ip`: SIOCGIFFLAGS, set IFF_UP, SIOCSIFFLAGS.
fn loopback_up() -> Result<()> {
    // SAFETY: a socket we close; ifreq is plain data sized for the ioctls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("socket");
        }
        let _fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(std::io::Error::last_os_error()).context("SIOCGIFFLAGS lo");
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(std::io::Error::last_os_error()).context("SIOCSIFFLAGS lo");
        }
    }
    Ok(())
}

/// finit_module(2); false when the module is already there.
fn load_module(path: &str) -> Result<bool> {
    let f = File::open(path).context("open")?;
    let params = CString::new("").expect("no NUL");
    // SAFETY: finit_module with an fd we own and an empty parameter string.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), params.as_ptr(), 0) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        return Ok(false);
    }
    Err(e).context("finit_module")
}

/// Run the job with stdout and stderr on pipes relayed to the channel, reaping every orphan (we are
/// PID 1) until the job itself exits. Output still arriving then is relayed for up to a second: a
/// background process that keeps the pipes open must not keep the guest up.
fn run_job(ch: &mut Channel, job: &Job) -> Result<Verdict> {
    let Some((prog, args)) = job.argv.split_first() else { bail!("empty command") };
    let mut path = vec!["/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin"];
    path.extend(job.path.iter().map(String::as_str));
    let mut child = match Command::new(prog)
        .args(args)
        .env_clear()
        .env("PATH", path.join(":"))
        .env("HOME", "/root")
        .env("TERM", "dumb")
        .env("FRAGLAB_VM", "1")
        .env("FRAGLAB_RESULTS", RESULTS_DIR)
        .current_dir(RESULTS_DIR)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Ok(Verdict::InitFailed(format!("cannot run {prog}: {e}"))),
    };
    let pid = child.id() as libc::pid_t;
    let mut out = child.stdout.take().map(|o| File::from(OwnedFd::from(o)));
    let mut err = child.stderr.take().map(|e| File::from(OwnedFd::from(e)));
    let mut status = None;
    let mut linger_until = None;
    let mut timed_out = false;
    let mut killed_at: Option<Instant> = None;
    // Once every process has ended: how long what they wrote last may take to read.
    let mut drain_until: Option<Instant> = None;
    let mut buf = vec![0u8; channel::MAX_FRAME];
    loop {
        // Reap first: the job, and orphans re-parented to us (daemons' parents, a script's
        // children). A job that ended just before the deadline is then not taken for one running.
        let mut none_left = false;
        loop {
            let mut st = 0;
            // SAFETY: waitpid on any child, without blocking.
            let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if r < 0 {
                // ECHILD: every process but us has ended (each is our descendant).
                none_left = true;
            }
            if r <= 0 {
                break;
            }
            if r == pid {
                status = Some(std::process::ExitStatus::from_raw(st));
                linger_until = Some(Instant::now() + Duration::from_secs(1));
            }
        }
        let now = uptime();
        // A `fraglab run` stops at SIGTERM, releases what it holds and writes run.json; whatever
        // ignores it is killed once the grace is over.
        if !timed_out && status.is_none() && job.deadline_secs.is_some_and(|d| now >= d as f64) {
            ch.warn(&format!(
                "the command is still running at {} s of guest uptime, near the --timeout; stopping every process (SIGTERM{})",
                job.deadline_secs.unwrap_or_default(),
                job.kill_secs.map_or(String::new(), |k| format!(", SIGKILL at {k} s"))
            ));
            // SAFETY: kill(-1) signals every process but PID 1 (us).
            unsafe { libc::kill(-1, libc::SIGTERM) };
            timed_out = true;
        }
        if timed_out && !none_left && killed_at.is_none() && job.kill_secs.is_none_or(|k| now >= k as f64) {
            ch.warn(&format!(
                "processes still running at {now:.0} s of guest uptime; killing every process (SIGKILL)"
            ));
            // SAFETY: as above.
            unsafe { libc::kill(-1, libc::SIGKILL) };
            killed_at = Some(Instant::now());
        }
        if timed_out {
            // Past the deadline the job's own exit is not the end: a `fraglab run` a script started
            // is still releasing and writing run.json when the shell has died of the SIGTERM. Wait
            // for every process, then for what they wrote last (with none left, nothing holds the
            // pipes: EOF is immediate); after SIGKILL for at most 2 s (one stuck in the kernel stays).
            if none_left {
                let until = *drain_until.get_or_insert_with(|| Instant::now() + Duration::from_secs(1));
                if (out.is_none() && err.is_none()) || Instant::now() > until {
                    break;
                }
            }
            if killed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
                ch.warn("processes still alive 2 s after SIGKILL (stuck in the kernel?); sending what was written");
                break;
            }
        } else {
            if out.is_none() && err.is_none() && status.is_some() {
                break;
            }
            if linger_until.is_some_and(|t| Instant::now() > t) {
                break;
            }
        }
        let mut fds: Vec<libc::pollfd> = [&out, &err]
            .iter()
            .map(|f| libc::pollfd {
                fd: f.as_ref().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: poll over our own descriptors (-1 entries are ignored).
        unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };
        for (i, pfd) in fds.iter().enumerate() {
            if pfd.revents == 0 {
                continue;
            }
            let (slot, tag) = if i == 0 { (&mut out, Tag::Stdout) } else { (&mut err, Tag::Stderr) };
            let Some(f) = slot.as_mut() else { continue };
            match f.read(&mut buf) {
                Ok(0) | Err(_) => *slot = None,
                Ok(n) => ch.frame(tag, &buf[..n]),
            }
        }
    }
    if timed_out {
        return Ok(Verdict::TimedOut(job.deadline_secs.unwrap_or_default()));
    }
    let status = status.expect("before the deadline the loop ends only after the job exits");
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => Verdict::Exited(c),
        (None, Some(s)) => Verdict::Signaled(s),
        _ => Verdict::InitFailed(format!("job ended oddly: {status:?}")),
    })
}

/// Seconds since the guest kernel started.
fn uptime() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME);
    t.map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9).unwrap_or(0.0)
}

/// End the guest. For `fraglab vm` a restart, not a power-off: qemu runs with `-no-reboot`, so a
/// restart ends it on every kernel, while a power-off needs ACPI (or another `pm_power_off`) and a
/// kernel without it — tinyconfig's — only halts, leaving qemu running until the host's timeout.
/// A LAVA device restarts into the same job (its qemu has no `-no-reboot`; a board boots again):
/// power off there, and where that only returns, wait for LAVA to end the job.
fn end_guest(report: Report) -> ! {
    // SAFETY: sync and reboot(2) take no pointers; as PID 1 we are allowed to restart.
    unsafe {
        libc::sync();
        libc::reboot(if report == Report::Console { libc::RB_POWER_OFF } else { libc::RB_AUTOBOOT });
    }
    if report == Report::Console {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    // reboot only returns on failure; PID 1 exiting panics the kernel, which qemu also ends on.
    std::process::exit(125)
}
