//! `fraglab vm`: boot a kernel under test in qemu and run a fraglab command (or a script of them)
//! inside it, as if it had run here: its stdout, stderr, exit status and results directory come back.
//!
//! The pieces: [`kernel`] (a bzImage, or Debian's cloud kernel fetched with apt), [`modules`]
//! (dependency order from `.modinfo`, decompressed on the host), [`initramfs`] (cpio newc with a
//! static fraglab as PID 1), [`qemu`] (the boot, the timeout), [`channel`] (guest → host frames on a
//! serial port) and [`init`] (the guest side). docs/vm.md has the why of each choice.

pub mod channel;
pub mod elf;
pub mod guestbin;
pub mod init;
pub mod initramfs;
pub mod kernel;
pub mod modules;
pub mod qemu;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;

use crate::units::{format_size, parse_duration, parse_size};
use crate::EXIT_UNSUPPORTED;
use qemu::{Accel, Boot, Outcome};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccelArg {
    /// KVM when /dev/kvm works and has booted a guest on this host before, else TCG.
    Auto,
    Kvm,
    Tcg,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  fraglab vm --kernel debian-cloud -- probe --json
  fraglab vm --kernel arch/x86/boot/bzImage --modules /tmp/mods -- workload sctp-connect --streams 65535
  fraglab vm --kernel debian-cloud --script test.sh --results out/   # several commands, one boot

The guest command runs in /results (also $FRAGLAB_RESULTS); what it writes there is copied to --results.
Exit status: the guest command's own; 125 when the guest could not run it (no kernel, a panic, the timeout).")]
pub struct VmArgs {
    /// Kernel to boot: a bzImage (arch/x86/boot/bzImage, /boot/vmlinuz-*), or `debian-cloud` to
    /// fetch Debian's current cloud kernel with apt into ~/.cache/fraglab/kernels.
    #[arg(long, value_name = "PATH|debian-cloud", required_unless_present = "guest_init")]
    pub kernel: Option<String>,
    /// The kernel's modules: lib/modules/<release>, or the INSTALL_MOD_PATH of `make modules_install`.
    #[arg(long, value_name = "DIR")]
    pub modules: Option<PathBuf>,
    /// Also load this module (with its dependencies); sctp is loaded whenever the kernel has it.
    #[arg(long = "module", value_name = "NAME")]
    pub module: Vec<String>,
    /// Guest memory.
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub mem: String,
    /// Guest CPUs (TCG gets slower with more).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub cpus: u32,
    /// Kill the guest after this long (boot included) and exit 125.
    #[arg(long, default_value = "300s", value_name = "DURATION")]
    pub timeout: String,
    /// Copy what the guest command writes under its working directory /results here.
    #[arg(long, value_name = "DIR")]
    pub results: Option<PathBuf>,
    /// A host program to carry into the guest with its shared libraries (e.g. /usr/bin/sctp_test).
    #[arg(long = "extra-bin", value_name = "PATH")]
    pub extra_bin: Vec<PathBuf>,
    /// A host file to carry into the guest, as HOST[:GUEST]; a relative GUEST lands under /results.
    #[arg(long = "file", value_name = "HOST[:GUEST]")]
    pub file: Vec<String>,
    /// Run this shell script in the guest (the host's /bin/sh is carried along) instead of one
    /// fraglab command; `fraglab` is on its PATH.
    #[arg(long, value_name = "FILE", conflicts_with = "command")]
    pub script: Option<PathBuf>,
    /// More kernel command line (param=value words; a bare unknown word would reach init's argv).
    #[arg(long, value_name = "ARGS")]
    pub append: Option<String>,
    /// Accelerator.
    #[arg(long, value_enum, default_value = "auto")]
    pub accel: AccelArg,
    /// The qemu binary.
    #[arg(long, default_value = "qemu-system-x86_64", value_name = "PROGRAM")]
    pub qemu: PathBuf,
    /// The fraglab to run in the guest (default: this one if static, else a static build of its
    /// source tree).
    #[arg(long, value_name = "PATH")]
    pub guest_fraglab: Option<PathBuf>,
    /// Show the guest's console and init's steps on stderr.
    #[arg(long, short)]
    pub verbose: bool,
    /// Keep the work directory (initramfs, console.log) and print where it is.
    #[arg(long)]
    pub keep: bool,
    /// Internal: be the guest's PID 1.
    #[arg(long, hide = true)]
    pub guest_init: bool,
    /// The fraglab command to run in the guest, after `--` (e.g. `-- probe --json`).
    #[arg(last = true, value_name = "FRAGLAB ARGS")]
    pub command: Vec<String>,
}

/// `fraglab vm`. Its own failures exit 125 so they cannot be mistaken for the guest command's.
pub fn run(args: VmArgs) -> Result<ExitCode> {
    if args.guest_init {
        init::run();
    }
    match host(args) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("fraglab vm: {e:#}");
            Ok(ExitCode::from(EXIT_UNSUPPORTED))
        }
    }
}

/// Checked flags.
struct Plan {
    mem_mib: u64,
    timeout: Duration,
    argv: Vec<String>,
}

fn check(args: &VmArgs) -> Result<Plan> {
    let mem = parse_size(&args.mem).map_err(|e| anyhow::anyhow!("--mem: {e}"))?;
    if mem < (128 << 20) {
        bail!("--mem {}: give at least 128MiB", format_size(mem));
    }
    if args.cpus == 0 || args.cpus > 64 {
        bail!("--cpus {}: give 1 to 64", args.cpus);
    }
    let timeout = parse_duration(&args.timeout).map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
    let argv = match (&args.script, args.command.is_empty()) {
        (Some(_), _) => vec!["/bin/sh".into(), "/fraglab/script".into()],
        (None, false) => {
            std::iter::once("/bin/fraglab".to_string()).chain(args.command.iter().cloned()).collect()
        }
        (None, true) => bail!(
            "nothing to run: give a fraglab command after `--` (e.g. `-- probe --json`) or --script FILE"
        ),
    };
    Ok(Plan { mem_mib: mem >> 20, timeout, argv })
}

fn host(args: VmArgs) -> Result<ExitCode> {
    let plan = check(&args)?;
    let cache = kernel::cache_dir();
    let kernel_arg = args.kernel.as_deref().context("--kernel is required")?;
    let k = kernel::resolve(kernel_arg, args.modules.as_deref(), &cache, args.verbose)?;

    let work = workdir()?;
    let result = (|| -> Result<ExitCode> {
        let initrd = work.join("initramfs.cpio");
        let fs = build_initramfs(&args, &plan, &k)?;
        fs.write_file(&initrd)?;
        if args.verbose {
            eprintln!(
                "fraglab vm: kernel {} ({}), initramfs {} in {}",
                k.image.display(),
                k.release.as_deref().unwrap_or("release unknown"),
                format_size(fs.data_bytes()),
                work.display()
            );
        }
        boot_and_report(&args, &plan, &k, &initrd, &work, &cache)
    })();
    if args.keep {
        eprintln!("fraglab vm: work directory kept: {}", work.display());
    } else if work.join(CONSOLE_CITED).exists() {
        // Keep the console log the message pointed at; drop the bulky rest.
        for f in ["initramfs.cpio", "channel.sock"] {
            let _ = std::fs::remove_file(work.join(f));
        }
        let _ = std::fs::remove_dir_all(work.join("results"));
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

fn workdir() -> Result<PathBuf> {
    // Short: it holds the channel's Unix socket (108-byte path limit).
    let base = std::env::temp_dir();
    for n in 0..1000 {
        let d = base.join(format!("fraglab-vm-{}-{n}", std::process::id()));
        if std::fs::create_dir(&d).is_ok() {
            return Ok(d);
        }
    }
    bail!("cannot create a work directory in {}", base.display())
}

fn build_initramfs(args: &VmArgs, plan: &Plan, k: &kernel::Kernel) -> Result<initramfs::Initramfs> {
    let mut fs = initramfs::Initramfs::new();
    let bin = guestbin::find(args.guest_fraglab.as_deref(), args.verbose)?;
    if args.verbose {
        eprintln!("fraglab vm: guest fraglab: {} ({})", bin.path.display(), bin.how);
    }
    if bin.dynamic {
        fs.program("/bin/fraglab", &bin.path)?;
    } else {
        fs.host_file("/bin/fraglab", &bin.path)?;
    }

    // Modules: the defaults when present, plus what was asked for.
    let mut module_paths = Vec::new();
    let mut wanted: Vec<String> = args.module.iter().map(|m| modules::canonical(m)).collect();
    match &k.modules {
        Some(dir) => {
            let tree = modules::Tree::open(dir)?;
            for d in modules::DEFAULT_MODULES {
                if tree.contains(d) && !wanted.iter().any(|w| w == d) {
                    wanted.push(d.to_string());
                } else if !tree.contains(d) && !tree.is_builtin(d) && args.verbose {
                    eprintln!("fraglab vm: {} has no {d} module", dir.display());
                }
            }
            for m in tree.resolve(&wanted)? {
                let guest = format!("/lib/modules/{}.ko", m.name);
                if args.verbose {
                    eprintln!("fraglab vm: module {} from {}", m.name, m.source.display());
                }
                fs.bytes(&guest, m.object, 0o644)?;
                module_paths.push(guest);
            }
        }
        None if !wanted.is_empty() => {
            bail!("--module {}: this kernel has no modules tree; give --modules DIR", wanted.join(","))
        }
        None => {
            if args.verbose {
                eprintln!("fraglab vm: no modules tree for this kernel; none loaded");
            }
        }
    }

    let mut path_dirs: Vec<String> = Vec::new();
    for b in &args.extra_bin {
        let host = resolve_program(b)?;
        let guest = host.to_string_lossy().into_owned();
        fs.program(&guest, &host)?;
        if let Some(dir) = host.parent().map(|p| p.to_string_lossy().into_owned()) {
            if !path_dirs.contains(&dir) {
                path_dirs.push(dir);
            }
        }
    }
    if let Some(script) = &args.script {
        let text = std::fs::read(script).with_context(|| format!("--script {}", script.display()))?;
        fs.bytes("/fraglab/script", text, 0o755)?;
        let sh = std::fs::canonicalize("/bin/sh").context("--script needs the host's /bin/sh")?;
        fs.program("/bin/sh", &sh)?;
    }
    for f in &args.file {
        let (host, guest) = match f.split_once(':') {
            Some((h, g)) => (h, g.to_string()),
            None => (f.as_str(), f.clone()),
        };
        let guest = if guest.starts_with('/') { guest } else { format!("{}/{guest}", init::RESULTS_DIR) };
        fs.host_file(&guest, Path::new(host)).with_context(|| format!("--file {f}"))?;
    }
    // Leave the guest time to send what the command wrote before the host's timeout: a quarter of
    // it, at most 20 s (guest uptime starts a second or two after qemu does).
    let margin = (plan.timeout / 4).min(Duration::from_secs(20));
    let deadline_secs = Some(plan.timeout.saturating_sub(margin).as_secs().max(1));
    let job = init::Job { argv: plan.argv.clone(), modules: module_paths, path: path_dirs, deadline_secs };
    fs.bytes(init::JOB_PATH, serde_json::to_vec_pretty(&job)?, 0o644)?;
    Ok(fs)
}

/// `sctp_test` → `/usr/bin/sctp_test`; symlinks resolved to the file.
fn resolve_program(p: &Path) -> Result<PathBuf> {
    let found = if p.components().count() == 1 {
        std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).map(|d| d.join(p)).find(|c| c.is_file()))
            .unwrap_or_default()
            .with_context(|| format!("--extra-bin {}: not found on PATH", p.display()))?
    } else {
        p.to_path_buf()
    };
    let meta = std::fs::metadata(&found).with_context(|| format!("--extra-bin {}", found.display()))?;
    if !meta.is_file() {
        bail!("--extra-bin {}: not a file", found.display());
    }
    Ok(std::path::absolute(&found)?)
}

fn cmdline(args: &VmArgs) -> String {
    // loglevel 5 keeps the boot chatter off the (emulated, slow) console but shows warnings, oopses
    // and panics; --verbose shows everything.
    let level = if args.verbose { 7 } else { 5 };
    let mut c = format!("console=ttyS0 panic=-1 loglevel={level} rdinit=/bin/fraglab");
    if let Some(extra) = &args.append {
        c.push(' ');
        c.push_str(extra);
    }
    c.push_str(" -- vm --guest-init");
    c
}

fn boot_and_report(
    args: &VmArgs,
    plan: &Plan,
    k: &kernel::Kernel,
    initrd: &Path,
    work: &Path,
    cache: &Path,
) -> Result<ExitCode> {
    let memo = qemu::accel_memo(cache);
    let mut accel = match args.accel {
        AccelArg::Kvm => Accel::Kvm,
        AccelArg::Tcg => Accel::Tcg,
        AccelArg::Auto => {
            let remembered = std::fs::read_to_string(&memo).unwrap_or_default();
            if qemu::kvm_openable() && remembered.trim() != "tcg" {
                Accel::Kvm
            } else {
                Accel::Tcg
            }
        }
    };
    loop {
        let boot = Boot {
            qemu: &args.qemu,
            accel,
            kernel: &k.image,
            initrd,
            cmdline: cmdline(args),
            mem_mib: plan.mem_mib,
            cpus: args.cpus,
            timeout: plan.timeout,
            verbose: args.verbose,
            workdir: work,
            // A KVM guest reaches init in a second or two; one that hangs instead is a host whose KVM
            // cannot run this guest (a PVM host): fall back to TCG and remember.
            hello_within: (args.accel == AccelArg::Auto && accel == Accel::Kvm)
                .then_some(Duration::from_secs(20)),
        };
        if args.verbose {
            eprintln!("fraglab vm: booting {} with {}", k.origin, accel.name());
        }
        let outcome = boot.run()?;
        if args.accel == AccelArg::Auto {
            let verdict = match (&outcome, accel) {
                (Outcome::NoHello { .. }, Accel::Kvm) => Some("tcg"),
                (Outcome::NoVerdict { qemu_stderr, .. }, Accel::Kvm) if qemu_stderr.contains("kvm") => {
                    Some("tcg")
                }
                (Outcome::Finished { .. }, Accel::Kvm) => Some("kvm"),
                _ => None,
            };
            if let Some(v) = verdict {
                let _ = std::fs::create_dir_all(cache);
                let _ = std::fs::write(&memo, v);
            }
            if verdict == Some("tcg") {
                eprintln!(
                    "fraglab vm: KVM did not boot the guest on this host; using TCG (remembered in {})",
                    memo.display()
                );
                accel = Accel::Tcg;
                continue;
            }
        }
        return report(args, outcome, work);
    }
}

/// Left in the work directory when a message cites its console.log, which is then kept.
const CONSOLE_CITED: &str = "console-cited";

fn report(args: &VmArgs, outcome: Outcome, work: &Path) -> Result<ExitCode> {
    let tail = |lines: &[String]| {
        if lines.is_empty() {
            eprintln!("  | (nothing yet)");
        }
        for l in lines {
            eprintln!("  | {l}");
        }
    };
    let cite = || {
        let _ = std::fs::write(work.join(CONSOLE_CITED), "");
        eprintln!("fraglab vm: full console: {}", work.join("console.log").display());
    };
    match outcome {
        Outcome::Finished { verdict, results, boot, total } => {
            if args.verbose {
                eprintln!(
                    "fraglab vm: init up after {:.1} s; guest done after {:.1} s; results archive {}",
                    boot.as_secs_f64(),
                    total.as_secs_f64(),
                    format_size(results.len() as u64)
                );
            }
            match &verdict {
                channel::Verdict::InitFailed(why) => {
                    eprintln!("fraglab vm: the guest could not run the command: {why}")
                }
                channel::Verdict::TimedOut(at) => eprintln!(
                    "fraglab vm: timed out: the command was still running at {at} s of guest uptime (--timeout {}); \
                     killed, and what it had written is in --results",
                    args.timeout
                ),
                _ => {}
            }
            match &args.results {
                Some(dir) => {
                    std::fs::create_dir_all(dir).with_context(|| format!("--results {}", dir.display()))?;
                    let files =
                        if results.is_empty() { Vec::new() } else { initramfs::unpack(&results, dir)? };
                    if args.verbose {
                        eprintln!("fraglab vm: {} result files in {}", files.len(), dir.display());
                    }
                }
                None => {
                    let scratch = work.join("results");
                    let n = initramfs::unpack(&results, &scratch).map(|f| f.len()).unwrap_or(0);
                    if n > 0 {
                        eprintln!("fraglab vm: the guest wrote {n} files under /results; pass --results DIR to keep them");
                    }
                }
            }
            Ok(ExitCode::from(verdict.exit_code()))
        }
        Outcome::NoVerdict { qemu_status, qemu_stderr, console_tail } => {
            let panicked = console_tail.iter().any(|l| l.contains("Kernel panic"));
            eprintln!(
                "fraglab vm: the guest ended without a verdict ({}; qemu {qemu_status}). Last console lines:",
                if panicked { "kernel panic" } else { "no exit status from init" }
            );
            tail(&console_tail);
            if !qemu_stderr.trim().is_empty() {
                eprintln!("fraglab vm: qemu said: {}", qemu_stderr.trim());
            }
            cite();
            Ok(ExitCode::from(EXIT_UNSUPPORTED))
        }
        Outcome::TimedOut { console_tail, init_started } => {
            eprintln!(
                "fraglab vm: timed out after {} ({}); qemu killed. Last console lines:",
                args.timeout,
                if init_started { "the command did not finish" } else { "the guest never reached init" }
            );
            tail(&console_tail);
            cite();
            Ok(ExitCode::from(EXIT_UNSUPPORTED))
        }
        Outcome::NoHello { console_tail } => {
            eprintln!("fraglab vm: the guest never reached init under KVM. Last console lines:");
            tail(&console_tail);
            Ok(ExitCode::from(EXIT_UNSUPPORTED))
        }
    }
}
