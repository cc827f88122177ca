//! One boot, and what it takes: the checked flags ([`Plan`]), the kernel with its initramfs
//! ([`Guest`]), the boot itself and its report. `fraglab vm` with one kernel is one of these; an A/B
//! ([`super::ab`]) is several.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use fraglab_units::{format_size, parse_duration, parse_size};

use super::qemu::{self, Accel, Boot, Outcome};
use super::{channel, guestbin, init, initramfs, kernel, modules};
use crate::cli::{AccelArg, VmArgs};
use crate::exit::Exit;

/// Checked flags.
pub(crate) struct Plan {
    pub(crate) mem_mib: u64,
    /// Memory of each NUMA node in MiB (one or none: none declared).
    nodes_mib: Vec<u64>,
    timeout: Duration,
    argv: Vec<String>,
    /// `--file`s, and the host files the guest command names (`run CONFIG`, `scan LOG`) carried in
    /// where the guest will look for them, so `vm -- run configs/x.toml` reads the file `run` would.
    carried: Vec<Carried>,
    /// Where the guest's /results goes: `--results`, else for `run` the current directory, so the
    /// run's results directory lands where a run here would have put it.
    pub(crate) results: Option<PathBuf>,
    /// Write the guest command's stdout and stderr here instead of to ours (an A/B's rounds).
    pub(crate) guest_output: Option<PathBuf>,
}

struct Carried {
    host: PathBuf,
    guest: String,
}

pub(crate) fn check(args: &VmArgs) -> Result<Plan> {
    let nodes_mib = match &args.numa_from {
        Some(file) => nodes_from(file)?,
        None => Vec::new(),
    };
    let mem = match nodes_mib.is_empty() {
        true => parse_size(&args.mem).map_err(|e| anyhow::anyhow!("--mem: {e}"))?,
        false => nodes_mib.iter().sum::<u64>() << 20,
    };
    let numa = if nodes_mib.is_empty() { args.numa } else { nodes_mib.len() as u32 };
    if mem < (128 << 20) {
        bail!("--mem {}: give at least 128MiB", format_size(mem));
    }
    if args.cpus == 0 || args.cpus > 64 {
        bail!("--cpus {}: give 1 to 64", args.cpus);
    }
    // Linux ignores a node under 4 MiB (NODE_MIN_SIZE) and folds its memory into a neighbour; a node
    // worth testing on holds at least a memory section (128 MiB on x86-64).
    if numa == 0 || numa > 8 || mem / u64::from(numa.max(1)) < (128 << 20) {
        bail!(
            "--numa {numa}: give 1 to 8 nodes of at least 128MiB each (--mem {} holds {})",
            format_size(mem),
            (mem >> 27).clamp(1, 8)
        );
    }
    if numa > 1 && args.cpus > numa && args.cpus % numa != 0 {
        bail!(
            "--cpus {} --numa {numa}: give CPUs that split evenly among the nodes (a multiple of {numa}), \
             or fewer CPUs than nodes (the nodes past the last CPU are memory-only)",
            args.cpus,
        );
    }
    // --numa N splits --mem evenly, the last node taking the remainder.
    let nodes_mib = match (nodes_mib.is_empty(), numa > 1) {
        (false, _) => nodes_mib,
        (true, false) => Vec::new(),
        (true, true) => {
            let (mib, n) = (mem >> 20, u64::from(numa));
            (0..n).map(|i| if i + 1 == n { mib - mib / n * i } else { mib / n }).collect()
        }
    };
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
    let (named, is_run) =
        if args.script.is_some() { (Vec::new(), false) } else { named_files(&args.command)? };
    let mut carried: Vec<Carried> = args
        .file
        .iter()
        .map(|f| {
            let (host, guest) = f.split_once(':').unwrap_or((f, f));
            Carried { host: PathBuf::from(host), guest: guest_path(Path::new(guest)) }
        })
        .collect();
    for (host, guest) in named {
        if !carried.iter().any(|c| c.guest == guest) {
            carried.push(Carried { host, guest });
        }
    }
    let results = args.results.clone().or_else(|| is_run.then(|| PathBuf::from(".")));
    Ok(Plan { mem_mib: mem >> 20, nodes_mib, timeout, argv, carried, results, guest_output: None })
}

/// `--numa-from FILE`: the nodes its lines need ([`super::numa::nodes_for`]), in a guest of at most
/// what this host has available, less 1 GiB for itself; said on stderr, since they were chosen.
fn nodes_from(file: &Path) -> Result<Vec<u64>> {
    let at = format!("--numa-from {}", file.display());
    let text = std::fs::read_to_string(file).with_context(|| format!("{at}: cannot read it"))?;
    let lines = fraglab_fragmenter::target::parse_profile_file(&text, file)
        .map_err(|e| anyhow::anyhow!("--numa-from: {e}"))?;
    let available = fraglab_fragmenter::fragment::mem_available()? >> 20;
    let nodes = super::numa::nodes_for(&lines, available.saturating_sub(1 << 10))
        .map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
    let each: Vec<String> =
        nodes.iter().enumerate().map(|(i, n)| format!("node {i} {}", n.describe())).collect();
    errln!("fraglab vm: nodes from {}: {}", file.display(), each.join("; "));
    Ok(nodes.into_iter().map(|n| n.mib).collect())
}

/// The host files a guest fraglab command reads, with where the guest will look for them, and
/// whether it is a `run`. A command that does not parse names nothing: the guest's fraglab says
/// what is wrong with it, exactly as it would here.
fn named_files(command: &[String]) -> Result<(Vec<(PathBuf, String)>, bool)> {
    use crate::cli::{Cli, Command};
    use clap::Parser;
    let argv = std::iter::once("fraglab".to_string()).chain(command.iter().cloned());
    let Ok(cli) = Cli::try_parse_from(argv) else { return Ok((Vec::new(), false)) };
    let (files, is_run) = match &cli.command {
        Command::Run(r) => {
            warn_if_results_stay_in_guest(r);
            // A config's profile file goes where the guest's run will look: beside the config.
            let profile = crate::config::Source::read(&r.config)
                .ok()
                .and_then(|src| {
                    let spec = src.parse().ok()?.fragment?;
                    crate::runplan::profile_file_beside(&src, &spec)
                })
                .map(PathBuf::from);
            (std::iter::once(r.config.clone()).chain(profile).collect(), true)
        }
        Command::Fragment(f) if f.profile_file.is_some() => (f.profile_file.iter().cloned().collect(), false),
        Command::Scan(s) if s.log != Path::new("-") => (vec![s.log.clone()], false),
        _ => (Vec::new(), false),
    };
    let mut named = Vec::new();
    for host in files {
        let meta = std::fs::metadata(&host).with_context(|| {
            format!("`{}` names {}, to carry into the guest", command.join(" "), host.display())
        })?;
        if !meta.is_file() {
            bail!("`{}` names {}, which is not a file", command.join(" "), host.display());
        }
        let guest = guest_path(&host);
        named.push((host, guest));
    }
    Ok((named, is_run))
}

/// Only /results comes back from the guest: say so before booting when a run will write elsewhere.
fn warn_if_results_stay_in_guest(r: &crate::cli::RunArgs) {
    let output = match &r.output {
        Some(o) => Some(o.clone()),
        None => {
            crate::config::Source::read(&r.config).ok().and_then(|src| src.parse().ok()).map(|c| c.run.output)
        }
    };
    if let Some(o) = output.filter(|o| !comes_back(o)) {
        errln!(
            "fraglab vm: the guest run writes its results under {}, outside /results: they will not come \
             back; give a relative -o DIR",
            o.display()
        );
    }
}

/// Whether what the guest writes at `path` (resolved from /results, as the guest does) is under
/// /results, the only directory that comes back to the host.
pub(crate) fn comes_back(path: &Path) -> bool {
    guest_path(path).starts_with(&format!("{}/", init::RESULTS_DIR))
}

/// The guest directories a relative path walks through before each `..` (`a/b/../../x` → /results/a,
/// /results/a/b), which the kernel must find when it resolves the path.
fn dirs_before_parent_steps(host: &Path) -> Vec<String> {
    use std::path::Component;
    if host.is_absolute() {
        return Vec::new();
    }
    let mut dirs = Vec::new();
    let mut walked = PathBuf::from(init::RESULTS_DIR);
    for c in host.components() {
        match c {
            // Above /results the kernel's own tree (and init's /results) is there already.
            Component::ParentDir
                if walked.starts_with(init::RESULTS_DIR) && walked != Path::new(init::RESULTS_DIR) =>
            {
                dirs.push(guest_path(&walked))
            }
            Component::ParentDir => {}
            Component::Normal(n) => {
                walked.push(n);
                continue;
            }
            _ => continue,
        }
        walked.pop();
    }
    dirs
}

/// Where the guest resolves `host` from its working directory /results, lexically (the initramfs
/// holds no symlinks of ours to follow).
pub(crate) fn guest_path(host: &Path) -> String {
    use std::path::Component;
    let mut out = PathBuf::from("/");
    let joined = Path::new(init::RESULTS_DIR).join(host);
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out.to_string_lossy().into_owned()
}

/// Labels of two kernels when `--kernel` gives none: the first is the base of an A/B.
pub const DEFAULT_LABELS: [&str; 2] = ["base", "patched"];

/// `--kernel` values with the `--modules` each one gets. One kernel takes a bare `--modules DIR`;
/// two take `LABEL=DIR`, by the labels their `--kernel` values give (default `base`, `patched`).
pub(crate) fn kernel_args(args: &VmArgs) -> Result<Vec<(kernel::KernelArg, Option<PathBuf>)>> {
    let mut kernels: Vec<kernel::KernelArg> =
        args.kernel.iter().map(|k| kernel::KernelArg::parse(k)).collect();
    match kernels.len() {
        0 => bail!("--kernel is required"),
        1 | 2 => {}
        n => bail!(
            "--kernel given {n} times: give one kernel, or two for an A/B (the base first, then the patched)"
        ),
    }
    if kernels.len() == 2 {
        for (k, default) in kernels.iter_mut().zip(DEFAULT_LABELS) {
            k.label.get_or_insert_with(|| default.to_string());
        }
        if kernels[0].label == kernels[1].label {
            bail!(
                "--kernel: both kernels are labelled {:?}; give each its own LABEL=",
                kernels[0].label.as_deref().unwrap_or("")
            );
        }
    }
    let mut modules: Vec<Option<PathBuf>> = vec![None; kernels.len()];
    for m in &args.modules {
        let labelled = m.split_once('=').and_then(|(label, dir)| {
            kernels.iter().position(|k| k.label.as_deref() == Some(label)).map(|i| (i, dir))
        });
        let (i, dir) = match labelled {
            Some((i, dir)) if !Path::new(m).exists() => (i, dir),
            _ if kernels.len() == 1 => (0, m.as_str()),
            _ => bail!(
                "--modules {m}: with two kernels, say whose: --modules {}=DIR or --modules {}=DIR",
                kernels[0].label.as_deref().unwrap_or_default(),
                kernels[1].label.as_deref().unwrap_or_default()
            ),
        };
        if modules[i].replace(PathBuf::from(dir)).is_some() {
            bail!("--modules given twice for the same kernel");
        }
    }
    Ok(kernels.into_iter().zip(modules).collect())
}

/// A kernel ready to boot: its image, and an initramfs built for it in a work directory of its own
/// (which also takes each boot's console.log).
pub(crate) struct Guest {
    pub(crate) kernel: kernel::Kernel,
    initrd: PathBuf,
    work: PathBuf,
}

impl Guest {
    pub(crate) fn prepare(args: &VmArgs, plan: &Plan, kernel: kernel::Kernel) -> Result<Guest> {
        let work = workdir()?;
        let guest = Guest { initrd: work.join("initramfs.cpio"), kernel, work };
        let built = build_initramfs(args, plan, &guest.kernel, init::Report::Channel).and_then(|fs| {
            fs.write_file(&guest.initrd)?;
            Ok(fs)
        });
        match built {
            Ok(fs) if args.verbose => errln!(
                "fraglab vm: kernel {} ({}), initramfs {} in {}",
                guest.kernel.image.display(),
                guest.kernel.release.as_deref().unwrap_or("release unknown"),
                format_size(fs.data_bytes()),
                guest.work.display()
            ),
            Ok(_) => {}
            Err(e) => {
                guest.clean_up(args.keep);
                return Err(e);
            }
        }
        Ok(guest)
    }

    pub(crate) fn console_log(&self) -> PathBuf {
        self.work.join("console.log")
    }

    /// A message cited this boot's console.log, which the caller has kept elsewhere (an A/B's round
    /// directory): the work directory need not be kept for it.
    pub(crate) fn forget_cited_console(&self) {
        let _ = std::fs::remove_file(self.work.join(CONSOLE_CITED));
    }

    pub(crate) fn clean_up(&self, keep: bool) {
        let work = &self.work;
        if keep {
            errln!("fraglab vm: work directory kept: {}", work.display());
        } else if work.join(CONSOLE_CITED).exists() {
            // Keep the console log the message pointed at; drop the bulky rest.
            for f in ["initramfs.cpio", "channel.sock"] {
                let _ = std::fs::remove_file(work.join(f));
            }
            let _ = std::fs::remove_dir_all(work.join("results"));
        } else {
            let _ = std::fs::remove_dir_all(work);
        }
    }
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

/// The guest's root filesystem: fraglab (also as `/init`), the modules, the programs and files the
/// command needs, and the job. `fraglab vm` boots it; `fraglab lava-job` hands it to a lab.
pub(crate) fn build_initramfs(
    args: &VmArgs,
    plan: &Plan,
    k: &kernel::Kernel,
    report: init::Report,
) -> Result<initramfs::Initramfs> {
    let mut fs = initramfs::Initramfs::new();
    let bin = guestbin::find(args.guest_fraglab.as_deref(), args.verbose)?;
    if args.verbose {
        errln!("fraglab vm: guest fraglab: {} ({})", bin.path.display(), bin.how);
    }
    if bin.dynamic {
        fs.program("/bin/fraglab", &bin.path)?;
    } else {
        fs.host_file("/bin/fraglab", &bin.path)?;
    }
    fs.symlink(init::INIT_PATH, "/bin/fraglab")?;

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
                    errln!("fraglab vm: {} has no {d} module", dir.display());
                }
            }
            for m in tree.resolve(&wanted)? {
                let guest = format!("/lib/modules/{}.ko", m.name);
                if args.verbose {
                    errln!("fraglab vm: module {} from {}", m.name, m.source.display());
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
                errln!("fraglab vm: no modules tree for this kernel; none loaded");
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
    // A shell always comes along (dash: ~130 KiB with its libc): scripts need it, and so do `exec`
    // workloads, which are mostly `sh -c '...'` — a server in the background, then the client.
    match (std::fs::canonicalize("/bin/sh"), &args.script) {
        (Ok(sh), _) if !fs.contains("/bin/sh") => fs.program("/bin/sh", &sh)?,
        (Err(e), Some(_)) => bail!("--script needs the host's /bin/sh: {e}"),
        _ => {}
    }
    if let Some(script) = &args.script {
        let text = std::fs::read(script).with_context(|| format!("--script {}", script.display()))?;
        fs.bytes("/fraglab/script", text, 0o755)?;
    }
    for c in &plan.carried {
        if args.verbose {
            errln!("fraglab vm: carrying {} to {}", c.host.display(), c.guest);
        }
        fs.host_file(&c.guest, &c.host).with_context(|| format!("carrying {}", c.host.display()))?;
        // The guest's kernel resolves `configs/../x.toml` by walking configs/ first: it must exist.
        for d in dirs_before_parent_steps(&c.host) {
            if !fs.contains(&d) {
                fs.dir(&d)?;
            }
        }
    }
    let (deadline_secs, kill_secs) = guest_deadline(plan.timeout);
    let job = init::Job {
        argv: plan.argv.clone(),
        modules: module_paths,
        path: path_dirs,
        deadline_secs: Some(deadline_secs),
        kill_secs: Some(kill_secs),
        report,
    };
    fs.bytes(init::JOB_PATH, serde_json::to_vec_pretty(&job)?, 0o644)?;
    Ok(fs)
}

/// Guest uptimes (s) at which a command still running is stopped (SIGTERM) and then killed, so
/// that what it wrote still comes back before the host's --timeout kills the guest: a quarter of the
/// timeout, at most 60 s, held back — half for the command to stop (a `fraglab run` releases its
/// memory and writes run.json), half to send the results. The channel is a UART: about 260 KiB/s
/// under TCG on an idle host (8 MB in 30 s, measured), slower on a busy one, and a 580 s sctp64k run
/// killed 20 s before a 600 s timeout on a loaded host did not get its results out in time (guest
/// uptime also starts a few seconds after qemu does).
pub(crate) fn guest_deadline(timeout: Duration) -> (u64, u64) {
    let margin = (timeout / 4).min(Duration::from_secs(60));
    let term = timeout.saturating_sub(margin).as_secs().max(1);
    (term, term + (margin / 2).as_secs())
}

/// A program as exec would find it: a bare name on PATH, else the path itself, if it is a file.
pub(crate) fn find_program(p: &Path) -> Option<PathBuf> {
    if p.components().count() == 1 {
        std::env::var_os("PATH")
            .and_then(|path| std::env::split_paths(&path).map(|d| d.join(p)).find(|c| c.is_file()))
    } else {
        Some(p.to_path_buf()).filter(|p| p.is_file())
    }
}

/// `sctp_test` → `/usr/bin/sctp_test`; symlinks resolved to the file.
fn resolve_program(p: &Path) -> Result<PathBuf> {
    let found = if p.components().count() == 1 {
        find_program(p).with_context(|| format!("--extra-bin {}: not found on PATH", p.display()))?
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

/// What one boot gave: the exit status `fraglab vm` reports for it, the accelerator it ran under,
/// and init's warnings (a tainted kernel among them).
pub(crate) struct Booted {
    pub(crate) exit: Exit,
    pub(crate) accel: &'static str,
    pub(crate) warnings: Vec<String>,
}

pub(crate) fn boot_and_report(args: &VmArgs, plan: &Plan, guest: &Guest, cache: &Path) -> Result<Booted> {
    let (k, initrd, work) = (&guest.kernel, guest.initrd.as_path(), guest.work.as_path());
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
            nodes_mib: plan.nodes_mib.clone(),
            timeout: plan.timeout,
            verbose: args.verbose,
            workdir: work,
            output: plan.guest_output.as_deref(),
            // A KVM guest reaches init in a second or two; one that hangs instead is a host whose KVM
            // cannot run this guest (a PVM host): fall back to TCG and remember.
            hello_within: (args.accel == AccelArg::Auto && accel == Accel::Kvm)
                .then_some(Duration::from_secs(20)),
        };
        if args.verbose {
            errln!("fraglab vm: booting {} with {}", k.origin, accel.name());
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
                errln!(
                    "fraglab vm: KVM did not boot the guest on this host; using TCG (remembered in {})",
                    memo.display()
                );
                accel = Accel::Tcg;
                continue;
            }
        }
        let warnings = match &outcome {
            Outcome::Finished { warnings, .. } => warnings.clone(),
            _ => Vec::new(),
        };
        return Ok(Booted { exit: report(args, plan, outcome, work)?, accel: accel.name(), warnings });
    }
}

/// Left in the work directory when a message cites its console.log, which is then kept.
const CONSOLE_CITED: &str = "console-cited";

fn report(args: &VmArgs, plan: &Plan, outcome: Outcome, work: &Path) -> Result<Exit> {
    let tail = |lines: &[String]| {
        if lines.is_empty() {
            errln!("  | (nothing yet)");
        }
        for l in lines {
            errln!("  | {l}");
        }
    };
    let cite = || {
        let _ = std::fs::write(work.join(CONSOLE_CITED), "");
        errln!("fraglab vm: full console: {}", work.join("console.log").display());
    };
    match outcome {
        Outcome::Finished { verdict, results, boot, total, .. } => {
            if args.verbose {
                errln!(
                    "fraglab vm: init up after {:.1} s; guest done after {:.1} s; results archive {}",
                    boot.as_secs_f64(),
                    total.as_secs_f64(),
                    format_size(results.len() as u64)
                );
            }
            match &verdict {
                channel::Verdict::InitFailed(why) => {
                    errln!("fraglab vm: the guest could not run the command: {why}")
                }
                channel::Verdict::TimedOut(at) => errln!(
                    "fraglab vm: timed out: the command was still running at {at} s of guest uptime (--timeout {}); \
                     killed, and what it had written is in --results",
                    args.timeout
                ),
                _ => {}
            }
            match &plan.results {
                Some(dir) => {
                    std::fs::create_dir_all(dir).with_context(|| format!("--results {}", dir.display()))?;
                    // Files carried in under /results come back too; one that would land on its own
                    // source is left alone.
                    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b))
                    {
                        (Ok(a), Ok(b)) => a == b,
                        _ => false,
                    };
                    let carried: Vec<PathBuf> = plan
                        .carried
                        .iter()
                        .filter_map(|c| {
                            Path::new(&c.guest).strip_prefix(init::RESULTS_DIR).ok().map(|r| (c, r))
                        })
                        // Into the current directory by default (`run`): no carried file comes back
                        // at all, so none can land on a different file of the user's there.
                        .filter(|(c, rel)| args.results.is_none() || same(&c.host, &dir.join(rel)))
                        .map(|(_, rel)| rel.to_path_buf())
                        .collect();
                    let files = if results.is_empty() {
                        Vec::new()
                    } else {
                        initramfs::unpack_except(&results, dir, &carried)?
                    };
                    if args.verbose {
                        errln!("fraglab vm: {} result files in {}", files.len(), dir.display());
                    }
                }
                None => {
                    let scratch = work.join("results");
                    let n = initramfs::unpack(&results, &scratch).map(|f| f.len()).unwrap_or(0);
                    if n > 0 {
                        errln!("fraglab vm: the guest wrote {n} files under /results; pass --results DIR to keep them");
                    }
                }
            }
            Ok(Exit::Guest(verdict.exit_code()))
        }
        Outcome::NoVerdict { qemu_status, qemu_stderr, console_tail, panic } => {
            errln!(
                "fraglab vm: the guest ended without a verdict ({}; qemu {qemu_status}). Last console lines:",
                match &panic {
                    Some(line) => format!("kernel panic: {line}"),
                    None => "no exit status from init".to_string(),
                }
            );
            tail(&console_tail);
            if !qemu_stderr.trim().is_empty() {
                errln!("fraglab vm: qemu said: {}", qemu_stderr.trim());
            }
            cite();
            Ok(Exit::CouldNotTest)
        }
        Outcome::TimedOut { console_tail, init_started } => {
            errln!(
                "fraglab vm: timed out after {} ({}); qemu killed. Last console lines:",
                args.timeout,
                if init_started { "the command did not finish" } else { "the guest never reached init" }
            );
            tail(&console_tail);
            cite();
            Ok(Exit::CouldNotTest)
        }
        Outcome::NoHello { console_tail } => {
            errln!("fraglab vm: the guest never reached init under KVM. Last console lines:");
            tail(&console_tail);
            Ok(Exit::CouldNotTest)
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::vm::qemu::smp_args;

    /// One socket per node holding a CPU, memory split in address order; nodes past the last CPU
    /// are memory-only; one node declares nothing.
    #[test]
    fn numa_guests_split_memory_and_cpus() {
        assert_eq!(smp_args(&[], 2), ["-smp", "2"]);
        assert_eq!(smp_args(&[1024], 2), ["-smp", "2"]);
        let a = smp_args(&[512, 512], 2).join(" ");
        assert_eq!(
            a,
            "-smp cpus=2,sockets=2,cores=1,threads=1 \
             -object memory-backend-ram,id=ram0,size=512M -numa node,nodeid=0,memdev=ram0,cpus=0-0 \
             -object memory-backend-ram,id=ram1,size=512M -numa node,nodeid=1,memdev=ram1,cpus=1-1"
        );
        // 1000 MiB over 3 nodes (as --numa 3 splits it): 333, 333, and the remainder 334; 2 CPUs
        // leave node 2 memory-only.
        let a = smp_args(&[333, 333, 334], 2).join(" ");
        assert!(a.starts_with("-smp cpus=2,sockets=2,cores=1,threads=1 "), "{a}");
        assert!(a.contains("size=333M -numa node,nodeid=1,memdev=ram1,cpus=1-1"), "{a}");
        assert!(a.ends_with("size=334M -numa node,nodeid=2,memdev=ram2"), "{a}");
        let a = smp_args(&[2048, 2048], 4).join(" ");
        assert!(a.contains("cores=2") && a.contains("cpus=0-1") && a.contains("cpus=2-3"), "{a}");
    }

    use super::*;

    #[test]
    fn the_guest_deadline_leaves_room_to_stop_and_to_send() {
        let d = |s| guest_deadline(Duration::from_secs(s));
        assert_eq!(d(40), (30, 35));
        assert_eq!(d(600), (540, 570));
        assert_eq!(d(3600), (3540, 3570));
        assert_eq!(d(1), (1, 1));
        assert_eq!(d(7), (5, 5));
    }

    #[test]
    fn guest_paths_resolve_from_results_as_the_guest_would() {
        assert_eq!(guest_path(Path::new("configs/x.toml")), "/results/configs/x.toml");
        assert_eq!(guest_path(Path::new("./a/../b.toml")), "/results/b.toml");
        assert_eq!(guest_path(Path::new("../x.toml")), "/x.toml");
        assert_eq!(guest_path(Path::new("/home/me/x.toml")), "/home/me/x.toml");
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_path_through_parent_steps_has_its_directories_in_the_guest() {
        assert_eq!(dirs_before_parent_steps(Path::new("configs/../x.toml")), ["/results/configs"]);
        assert_eq!(dirs_before_parent_steps(Path::new("a/b/../../x")), ["/results/a/b", "/results/a"]);
        assert!(dirs_before_parent_steps(Path::new("../x.toml")).is_empty());
        assert!(dirs_before_parent_steps(Path::new("configs/x.toml")).is_empty());
        assert!(dirs_before_parent_steps(Path::new("/abs/../x")).is_empty());
    }

    #[test]
    fn run_and_scan_name_the_files_to_carry() {
        let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/quickstart.toml");
        let (files, is_run) = named_files(&words(&format!("run {config} --baseline"))).unwrap();
        assert!(is_run);
        assert_eq!(files, vec![(PathBuf::from(config), guest_path(Path::new(config)))]);
        let (files, is_run) = named_files(&words(&format!("scan {config}"))).unwrap();
        assert_eq!((files.len(), is_run), (1, false));
        // Nothing to carry, or a command the guest's fraglab will refuse with its own message.
        for cmd in ["probe --json", "scan -", "run", "no-such-command x"] {
            assert_eq!(named_files(&words(cmd)).unwrap(), (Vec::new(), false), "{cmd}");
        }
        let err = named_files(&words("run configs/no-such.toml")).unwrap_err();
        assert!(format!("{err:#}").contains("configs/no-such.toml"), "{err:#}");
    }
}
