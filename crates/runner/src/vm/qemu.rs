//! One boot: the qemu command line, the two serial ports (console, channel), the timeout, and what
//! came out.
//!
//! Port 1 (`ttyS0`) is the kernel console: qemu's stdout, kept in `console.log` and the last lines in
//! memory, shown live with --verbose. Port 2 (`ttyS1`) is the [`channel`](super::channel): qemu
//! connects it to a Unix socket this process listens on. Both are 8250 UARTs, which every x86 kernel
//! config has built in (Debian's cloud kernel has virtio, ATA and SCSI only as modules, and no 9p).
//! With `-no-reboot` and `panic=-1` a panicking kernel makes qemu exit; the guest's init ends with a
//! restart, which makes it exit 0 too, so only the channel's verdict frame says how the command ended.
//! Once that frame is in, qemu gets [`AFTER_VERDICT`] to exit before it is killed: a kernel that
//! halts instead of restarting must not cost the whole timeout.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::channel::{self, Tag, Verdict};

/// Lines of console kept to explain a boot that went wrong.
const TAIL_LINES: usize = 40;

/// How long qemu may take to exit once the verdict frame is in (init drains the UART first, so
/// nothing is lost by killing it; a restart takes well under a second under TCG).
const AFTER_VERDICT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

pub struct Boot<'a> {
    pub qemu: &'a Path,
    pub accel: Accel,
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub cmdline: String,
    pub mem_mib: u64,
    pub cpus: u32,
    /// Memory of each NUMA node in MiB, node 0 first (one or none: none declared).
    pub nodes_mib: Vec<u64>,
    pub timeout: Duration,
    pub verbose: bool,
    pub workdir: &'a Path,
    /// Where the guest command's stdout and stderr go instead of ours (one file, as they come).
    pub output: Option<&'a Path>,
    /// Give up early when the guest's init has not spoken within this long (KVM that cannot boot
    /// this guest hangs rather than fails).
    pub hello_within: Option<Duration>,
}

/// How a boot ended.
pub enum Outcome {
    /// The guest's init reported the command's end. `warnings`: what init said went wrong beside it
    /// (a module that did not load, the kernel tainted by an oops or a WARN).
    Finished { verdict: Verdict, results: Vec<u8>, boot: Duration, total: Duration, warnings: Vec<String> },
    /// qemu exited without a verdict: a kernel panic (panic=-1, -no-reboot), init dying, qemu failing.
    /// `panic` is the console's first `Kernel panic - not syncing: …` line: the stack dump after it
    /// can push it out of the tail.
    NoVerdict { qemu_status: String, qemu_stderr: String, console_tail: Vec<String>, panic: Option<String> },
    /// The host-side timeout passed; qemu was killed.
    TimedOut { console_tail: Vec<String>, init_started: bool },
    /// `hello_within` passed without the guest's init speaking; qemu was killed.
    NoHello { console_tail: Vec<String> },
}

#[derive(Default)]
struct Shared {
    hello: Option<Instant>,
    verdict: Option<Verdict>,
    results: Vec<u8>,
    warnings: Vec<String>,
    error: Option<String>,
}

impl Boot<'_> {
    pub fn args(&self, socket: &Path) -> Vec<String> {
        let mut a: Vec<String> =
            vec!["-nodefaults".into(), "-no-user-config".into(), "-display".into(), "none".into()];
        a.push("-no-reboot".into());
        match self.accel {
            Accel::Kvm => a.extend(["-accel".into(), "kvm".into(), "-cpu".into(), "host".into()]),
            // One host thread for every vCPU. Multi-threaded TCG (qemu 7.2) livelocks an x86 guest
            // whose kernel patches its own text while the other vCPU runs it — a tracepoint's
            // jump label or static call turned on or off, which every catcher start and stop
            // does: both vCPUs spin at the patched instruction (`__alloc_pages+0x20f`, or one in
            // `exc_int3` while the other waits in `text_poke_bp`) until the timeout. Measured:
            // 400 trigger on/off rounds hung 5 guests of 5 multi-threaded, 0 of 3 single (docs/vm.md).
            Accel::Tcg => a.extend(["-accel".into(), "tcg,thread=single".into()]),
        }
        a.extend(["-m".into(), format!("{}M", self.mem_mib)]);
        a.extend(smp_args(&self.nodes_mib, self.cpus));
        a.extend(["-kernel".into(), self.kernel.display().to_string()]);
        a.extend(["-initrd".into(), self.initrd.display().to_string()]);
        a.extend(["-append".into(), self.cmdline.clone()]);
        a.extend([
            "-chardev".into(),
            "stdio,id=con,signal=off".into(),
            "-serial".into(),
            "chardev:con".into(),
        ]);
        a.extend(["-chardev".into(), format!("socket,id=ctl,path={}", socket.display())]);
        a.extend(["-serial".into(), "chardev:ctl".into()]);
        a
    }

    pub fn run(&self) -> Result<Outcome> {
        let socket = self.workdir.join("channel.sock");
        let _ = std::fs::remove_file(&socket);
        let listener =
            UnixListener::bind(&socket).with_context(|| format!("cannot listen on {}", socket.display()))?;
        listener.set_nonblocking(true)?;
        let args = self.args(&socket);
        if self.verbose {
            errln!("fraglab vm: {} {}", self.qemu.display(), shell_words(&args));
        }
        // Before qemu starts: nothing may fail between spawning it and the loop that bounds it.
        let sink = match self.output {
            Some(p) => {
                Some(std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?)
            }
            None => None,
        };
        let start = Instant::now();
        let mut command = Command::new(self.qemu);
        // SAFETY: prctl(PR_SET_PDEATHSIG) in the child before exec touches no memory of the parent;
        // it makes qemu die with this process (a SIGTERM or SIGKILL aimed at fraglab alone would
        // otherwise leave a guest running that nothing bounds any more).
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| {
                format!(
                    "cannot run {} (install it: apt-get install --no-install-recommends qemu-system-x86)",
                    self.qemu.display()
                )
            })?;

        let tail = Arc::new(Mutex::new(Console::default()));
        let console = {
            let out = child.stdout.take().expect("piped");
            let tail = Arc::clone(&tail);
            let log = self.workdir.join("console.log");
            let verbose = self.verbose;
            std::thread::spawn(move || console_reader(out, &log, &tail, verbose))
        };
        let stderr = {
            let mut err = child.stderr.take().expect("piped");
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                s
            })
        };
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let chan = {
            let shared = Arc::clone(&shared);
            let stop = Arc::clone(&stop);
            let verbose = self.verbose;
            std::thread::spawn(move || channel_reader(listener, &shared, &stop, verbose, sink))
        };

        let mut killed = None;
        let mut verdict_at = None;
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            let (hello, verdict_in) = {
                let s = shared.lock().expect("channel state");
                (s.hello, s.verdict.is_some())
            };
            if verdict_in && verdict_at.is_none() {
                verdict_at = Some(Instant::now());
            }
            if verdict_at.is_some_and(|t| t.elapsed() > AFTER_VERDICT) {
                if self.verbose {
                    errln!("fraglab vm: qemu still running {AFTER_VERDICT:?} after the verdict; killed");
                }
                let _ = child.kill();
                break child.wait()?;
            }
            // Once the verdict is in, only AFTER_VERDICT bounds the wait: a verdict that arrived
            // just before --timeout is the command's answer, not a timeout.
            if verdict_at.is_none() && start.elapsed() > self.timeout {
                killed = Some(false);
            } else if hello.is_none() && self.hello_within.is_some_and(|d| start.elapsed() > d) {
                killed = Some(true);
            }
            if killed.is_some() {
                let _ = child.kill();
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let total = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        let _ = chan.join();
        let _ = console.join();
        let qemu_stderr = stderr.join().unwrap_or_default();
        let (console_tail, panic) = {
            let c = tail.lock().expect("console");
            (c.tail.iter().cloned().collect::<Vec<String>>(), c.panic.clone())
        };
        let mut s = shared.lock().expect("channel state");
        if let Some(e) = &s.error {
            errln!("fraglab vm: channel: {e}");
        }
        Ok(match (killed, s.verdict.take()) {
            (Some(true), _) => Outcome::NoHello { console_tail },
            (Some(false), _) => Outcome::TimedOut { console_tail, init_started: s.hello.is_some() },
            (None, Some(verdict)) => Outcome::Finished {
                verdict,
                results: std::mem::take(&mut s.results),
                boot: s.hello.map(|h| h - start).unwrap_or_default(),
                total,
                warnings: std::mem::take(&mut s.warnings),
            },
            (None, None) => {
                Outcome::NoVerdict { qemu_status: status.to_string(), qemu_stderr, console_tail, panic }
            }
        })
    }
}

/// What the console reader keeps besides the log file.
#[derive(Default)]
struct Console {
    tail: VecDeque<String>,
    panic: Option<String>,
}

fn console_reader(out: impl Read, log: &Path, console: &Mutex<Console>, verbose: bool) {
    let mut file = std::fs::File::create(log).ok();
    let mut r = BufReader::new(out);
    let mut line = Vec::new();
    while let Ok(n) = r.read_until(b'\n', &mut line) {
        if n == 0 {
            break;
        }
        if let Some(f) = file.as_mut() {
            let _ = f.write_all(&line);
        }
        let text = String::from_utf8_lossy(&line).trim_end_matches(['\r', '\n']).to_string();
        if verbose {
            errln!("console: {text}");
        }
        let mut c = console.lock().expect("console");
        if c.panic.is_none() {
            c.panic = panic_line(&text);
        }
        if c.tail.len() == TAIL_LINES {
            c.tail.pop_front();
        }
        c.tail.push_back(text);
        line.clear();
    }
}

/// The reason of a kernel panic from a console line (`[    2.55] Kernel panic - not syncing: …`).
fn panic_line(line: &str) -> Option<String> {
    line.find("Kernel panic - not syncing").map(|i| line[i..].to_string())
}

fn channel_reader(
    listener: UnixListener,
    shared: &Mutex<Shared>,
    stop: &AtomicBool,
    verbose: bool,
    mut sink: Option<std::fs::File>,
) {
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                shared.lock().expect("channel state").error = Some(format!("accept: {e}"));
                return;
            }
        }
    };
    let _ = stream.set_nonblocking(false);
    let mut reader = channel::Reader::new(BufReader::new(stream));
    loop {
        let frame = reader.next_frame();
        if reader.synced() {
            let mut s = shared.lock().expect("channel state");
            if s.hello.is_none() {
                s.hello = Some(Instant::now());
            }
        }
        let (tag, payload) = match frame {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                shared.lock().expect("channel state").error = Some(e.to_string());
                return;
            }
        };
        match tag {
            Tag::Stdout | Tag::Stderr if sink.is_some() => {
                let _ = sink.as_mut().expect("checked").write_all(&payload);
            }
            Tag::Stdout => fraglab_stdio::write_stdout_bytes(&payload),
            Tag::Stderr => {
                let _ = std::io::stderr().lock().write_all(&payload);
            }
            Tag::Log if verbose => {
                errln!("fraglab vm: guest: {}", String::from_utf8_lossy(&payload).trim_end())
            }
            Tag::Log => {}
            Tag::Warn => {
                let warning = String::from_utf8_lossy(&payload).trim_end().to_string();
                errln!("fraglab vm: guest: {warning}");
                shared.lock().expect("channel state").warnings.push(warning);
            }
            Tag::Results => shared.lock().expect("channel state").results.extend_from_slice(&payload),
            Tag::Exit => {
                let v = serde_json::from_slice::<Verdict>(&payload)
                    .unwrap_or_else(|e| Verdict::InitFailed(format!("unreadable verdict: {e}")));
                shared.lock().expect("channel state").verdict = Some(v);
            }
        }
    }
}

/// `-smp` with `-object memory-backend-ram` and `-numa node` for nodes of `nodes_mib` MiB each, so
/// node `i` spans the `i`-th part of the guest's RAM in address order; one socket per node holding a
/// CPU, its CPUs numbered in a row. The sockets matter: CPUs of
/// two nodes in one socket share a last-level cache, which the kernel warns about at boot
/// (`topology_sane`, "llc-sibling CPU #0 is not on the same node") and taints itself. With fewer
/// CPUs than nodes, the nodes past the last CPU are memory-only, as on some real servers.
/// [`super::boot::check`] refuses CPUs that do not divide evenly among the nodes.
pub fn smp_args(nodes_mib: &[u64], cpus: u32) -> Vec<String> {
    let nodes = nodes_mib.len() as u32;
    if nodes <= 1 {
        return vec!["-smp".into(), cpus.to_string()];
    }
    let sockets = nodes.min(cpus);
    let cores = cpus / sockets;
    let mut a = vec!["-smp".into(), format!("cpus={cpus},sockets={sockets},cores={cores},threads=1")];
    for (n, size) in (0..nodes).zip(nodes_mib) {
        a.extend(["-object".into(), format!("memory-backend-ram,id=ram{n},size={size}M")]);
        let mut node = format!("node,nodeid={n},memdev=ram{n}");
        if n < sockets {
            node.push_str(&format!(",cpus={}-{}", n * cores, (n + 1) * cores - 1));
        }
        a.extend(["-numa".into(), node]);
    }
    a
}

/// Arguments quoted for a shell, for --verbose and error messages.
pub fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_=/.,:+@%".contains(c)) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Can this process use KVM at all? (Whether KVM can boot *this* guest is only known by trying.)
pub fn kvm_openable() -> bool {
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok()
}

/// Where the verdict of trying KVM is remembered, per host kernel.
pub fn accel_memo(cache: &Path) -> PathBuf {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    cache.join(format!("accel-{}", release.trim()))
}
