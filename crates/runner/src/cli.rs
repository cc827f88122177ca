//! Raw command-line arguments, exactly as typed (ripgrep's "low-level args"). Nothing here reads the
//! kernel; [`crate::resolve`] turns these into validated plans.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "fraglab",
    version,
    about = "Reproduce high-order page-allocation failures on demand",
    after_help = "Environment:
  FRAGLAB_LOCK_WAIT=DURATION  when another fraglab holds the machine (one at a time: memory and
                              sysctls are machine-wide), wait this long for it (e.g. 10m) instead
                              of refusing at once
  FRAGLAB_GUEST_BIN=PATH      the static fraglab `fraglab vm` puts in the guest (as --guest-fraglab)
  FRAGLAB_RESULTS, FRAGLAB_VM set inside a `fraglab vm` guest: its /results, and 1

Docs: README.md and docs/ in the source tree."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Runtime directory for the lock, sysctl journal, control socket and daemon log.
    #[arg(long, global = true, default_value = fraglab_fragmenter::instance::RUN_DIR, hide = true)]
    pub run_dir: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scenario from a config: fragment, run workloads, catch failures, restore, give a
    /// verdict (exit 0 not reproduced, 1 reproduced, 125 could not test).
    Run(RunArgs),
    /// Show the kernel's memory state: free blocks per order, the `free` table, zone watermarks,
    /// fragmentation indices, compaction counters.
    Probe(ProbeArgs),
    /// Shape free memory into a target buddyinfo profile and hold it.
    Fragment(FragmentArgs),
    /// What a fragmenter is doing: where shaping stands, or what it holds and whether its target
    /// holds now (exit 0 it holds; 1 lost, still shaping, or nothing held).
    Status(StatusArgs),
    /// Make a fragmenter give its memory back and restore every sysctl; one still shaping stops
    /// between two steps.
    Release,
    /// Run one workload and report throughput, latency, CPU and failures by errno (exit 0 all
    /// succeeded, 1 some failed, 125 not on this kernel).
    Workload(WorkloadArgs),
    /// Serve the TCP or SCTP (`--proto sctp`) workloads' server side for a client on another host
    /// (`--peer`).
    Serve(fraglab_workload::serve::ServeCommand),
    /// Boot a kernel under test in qemu and run a fraglab command inside it.
    Vm(VmArgs),
    /// From a pasted bug report to a verdict: read its failure, Mem-Info and kernel, choose a workload
    /// that reaches the allocation (same call site or same-order proxy), write the scenario as a
    /// config, run it in a guest shaped like the reporter's machine (exit 0 not reproduced, 1
    /// reproduced, 125 could not test).
    Repro(ReproArgs),
    /// Read a saved dmesg / syslog / journal: allocation failures by order, mode, command and call
    /// site, OOM kills, and each Mem-Info free-area or buddyinfo line as a ready `fraglab fragment
    /// --profile` target.
    Scan(ScanArgs),
    /// One self-contained HTML report of a run (or several, A/B): buddyinfo heatmap with the phases,
    /// free/available memory, compaction counters, throughput and latency against the sweep,
    /// failures over time, slab caches that leak.
    Report(ReportArgs),
    /// Set runs side by side: every workload metric at every sweep point against the first run
    /// (mean, stddev, % change, Welch's t-test, mmtests' significance), target vs achieved
    /// fragmentation, failed allocations, compaction counters. Exit 0, or 255 on an error.
    Compare(CompareArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell), generated from these flags;
    /// scripts/install puts them where shells look.
    Completions(CompletionsArgs),
    /// Print the man page (roff), or with --dir write one per command (fraglab.1, fraglab-run.1, …),
    /// generated from these flags; scripts/install puts them in share/man/man1.
    Man(ManArgs),
    /// Write a LAVA job that boots a kernel under test (in a lab's qemu or on a board) and runs a
    /// scenario, each workload window and the run's verdict a LAVA test case; with its kernel and
    /// initramfs beside it (docs/scale.md).
    LavaJob(LavaJobArgs),
    /// Take a `lava-job` job's results directory back out of its log (lava-run's output, a LAVA
    /// job log, a console capture), for `fraglab compare` and `fraglab report`.
    LavaResults(LavaResultsArgs),
    /// Write results in another system's format: `kcidb` (KernelCI's database) for now.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct LavaJobArgs {
    /// The kernel under test, as `fraglab vm --kernel` takes it: a bzImage, or `debian-cloud[:ABI]`.
    #[arg(long, value_name = "PATH|debian-cloud[:ABI]")]
    pub kernel: String,
    /// The kernel's modules (lib/modules/<release>, or an INSTALL_MOD_PATH).
    #[arg(long, value_name = "DIR")]
    pub modules: Option<PathBuf>,
    /// The scenario: a `fraglab run` config (its profile file comes along).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// The LAVA device type: `qemu`, or an x86-64 board's (which then needs --boot-method; its
    /// kernel command line and hardware come from its device dictionary).
    #[arg(long, default_value = "qemu", value_name = "NAME")]
    pub device_type: String,
    /// How the board boots the kernel and ramdisk LAVA puts on its TFTP server: its device type's
    /// boot method (ipxe, grub, depthcharge, …).
    #[arg(long, value_name = "METHOD")]
    pub boot_method: Option<String>,
    /// Where to write job.yaml, the kernel and the initramfs.
    #[arg(long, short, default_value = "lava-job", value_name = "DIR")]
    pub output: PathBuf,
    /// The URL the lab fetches the images from: where --output will be served (default: its
    /// file:// URL, for lava-run on this machine).
    #[arg(long, value_name = "URL")]
    pub image_url: Option<String>,
    /// Guest memory (qemu).
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub mem: String,
    /// Guest CPUs (qemu).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub cpus: u32,
    /// How long the scenario may run: the test action's timeout. The guest stops a run still going
    /// before it, so its results still come out.
    #[arg(long, default_value = "600s", value_name = "DURATION")]
    pub timeout: String,
    /// The lab's qemu has no KVM (or cannot run this guest under it): TCG (qemu).
    #[arg(long)]
    pub no_kvm: bool,
    /// Also load this module (with its dependencies).
    #[arg(long = "module", value_name = "NAME")]
    pub module: Vec<String>,
    /// A host program to carry into the guest with its shared libraries.
    #[arg(long = "extra-bin", value_name = "PATH")]
    pub extra_bin: Vec<PathBuf>,
    /// More kernel command line (qemu; a board's comes from its device dictionary).
    #[arg(long, value_name = "ARGS")]
    pub append: Option<String>,
    /// The fraglab to run in the guest (default: this one if static, else a static build of its
    /// source tree); a board of another architecture needs one built for it.
    #[arg(long, value_name = "PATH")]
    pub guest_fraglab: Option<PathBuf>,
    /// The job's name (default: `fraglab <config name> on <kernel release>`).
    #[arg(long, value_name = "NAME")]
    pub job_name: Option<String>,
    /// Show what is put in the initramfs.
    #[arg(long, short)]
    pub verbose: bool,
}

#[derive(Debug, Args)]
pub struct LavaResultsArgs {
    /// The job's log: `lava-run`'s output, a LAVA server's job log (`lavacli jobs logs --raw`), or
    /// the console captured any other way; `-` reads stdin.
    #[arg(value_name = "LOG")]
    pub log: PathBuf,
    /// Where to unpack the guest's results (a new or empty directory).
    #[arg(long, short, value_name = "DIR")]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(subcommand)]
    pub format: ExportFormat,
}

#[derive(Debug, Subcommand)]
pub enum ExportFormat {
    /// KCIDB JSON (the latest schema kcidb-io knows, 5.3): the checkout and build the runs tested,
    /// one test per run and one per workload window, verdicts mapped to KCIDB statuses
    /// (docs/scale.md).
    Kcidb(KcidbArgs),
}

#[derive(Debug, Args)]
pub struct KcidbArgs {
    /// Results directories (or directories holding them: an output directory, an A/B's).
    #[arg(value_name = "RESULTS_DIR", required = true)]
    pub dirs: Vec<PathBuf>,
    /// The submitting system's name: KCIDB ids are prefixed with it.
    #[arg(long, default_value = "fraglab", value_name = "NAME")]
    pub origin: String,
    /// The kernel's git commit (40 hex digits): the checkout it was built from.
    #[arg(long, value_name = "SHA1")]
    pub git_commit: Option<String>,
    /// The git repository the commit is in (https://).
    #[arg(long, value_name = "URL")]
    pub git_url: Option<String>,
    /// The branch the commit is on.
    #[arg(long, value_name = "NAME")]
    pub git_branch: Option<String>,
    /// The tree's name (`mainline`, `net-next`, …).
    #[arg(long, value_name = "NAME")]
    pub tree: Option<String>,
    /// Where the results directories will be served (RESULTS_URL/<run dir name>/run.json, …), for
    /// the tests' output files (default: their file:// URLs).
    #[arg(long, value_name = "URL")]
    pub results_url: Option<String>,
    /// Write here instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write fraglab.1 and a page per command (fraglab-run.1, …) into this directory instead.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct WorkloadArgs {
    #[command(subcommand)]
    pub kind: fraglab_workload::Kind,
    /// Print the result as JSON (the object `fraglab run` stores).
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The scenario, e.g. configs/quickstart.toml.
    pub config: PathBuf,
    /// Put the results directory here instead of the config's `[run] output`.
    #[arg(long, short, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Resolve the config and print the plan; take nothing, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Run the scenario on memory as it is, without fragmenting (as if `[fragment] enabled =
    /// false`): the unfragmented half of an A/B, for `fraglab compare`.
    #[arg(long)]
    pub baseline: bool,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Print one snapshot as JSON.
    #[arg(long)]
    pub json: bool,
    /// Sample repeatedly at this interval (e.g. 1s, 100ms) and write JSON lines.
    #[arg(long, value_name = "INTERVAL")]
    pub watch: Option<String>,
    /// With --watch: stop after this long (default: until Ctrl-C).
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<String>,
    /// With --watch: write the JSON lines here instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Monitors to sample, comma-separated (default: all this machine allows).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub monitors: Vec<String>,
    /// Instead of a snapshot: every socket of this protocol (IPv4 and IPv6) with its memory, as
    /// `ss -tm` shows it — summed, beside the protocol's memory_allocated, and the top sockets by
    /// forward allocation (`f`).
    #[arg(long, value_enum, value_name = "PROTO", conflicts_with_all = ["watch", "monitors", "duration", "output"])]
    pub sockets: Option<SocketsProto>,
    /// With --sockets: how many sockets to list, largest forward allocation first.
    #[arg(long, value_name = "N", default_value_t = 10, requires = "sockets")]
    pub top: usize,
    /// With --sockets: also save the raw netlink replies here (FILE.ipv4, FILE.ipv6), for a bug
    /// report or a test capture.
    #[arg(long, value_name = "FILE", requires = "sockets")]
    pub dump_to: Option<PathBuf>,
}

/// The protocols `fraglab probe --sockets` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SocketsProto {
    Tcp,
    Sctp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PinArg {
    Mlock,
    None,
}

#[derive(Debug, Args)]
pub struct FragmentArgs {
    /// Leave no free block of this order or above.
    #[arg(long, value_name = "ORDER", conflicts_with = "profile")]
    pub max_free_order: Option<usize>,
    /// With --max-free-order: how much memory stays free in smaller blocks (default: as much as the
    /// shape allows, (2^k-1)/2^k of what is taken).
    #[arg(long, value_name = "SIZE", requires = "max_free_order")]
    pub free: Option<String>,
    /// Reproduce a buddyinfo line (`Node 0, zone Normal 40773 37 34 29 0 ...`) or a kernel Mem-Info
    /// line (`Normal: 512*4kB (UME) 97*8kB ... = 3016kB`), as pasted from a log: a dmesg stamp,
    /// `<4>`, syslog or journal prefix is taken off.
    #[arg(long, value_name = "LINE")]
    pub profile: Option<String>,
    /// Reproduce every node/zone line of this file at once — a saved /proc/buddyinfo or a report's
    /// Mem-Info block, as pasted — each in its own zone (whole machine: best in `fraglab vm --numa`).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["profile", "max_free_order"])]
    pub profile_file: Option<std::path::PathBuf>,
    /// Shape only this much memory (shared machines, tests); success is judged on the memory taken.
    #[arg(long, value_name = "SIZE")]
    pub budget: Option<String>,
    /// With --budget: take the memory on this NUMA node only (a profile line's `Node N` says it
    /// itself).
    #[arg(long, value_name = "N")]
    pub node: Option<u32>,
    /// How held pages resist compaction.
    #[arg(long, value_enum, default_value = "mlock")]
    pub pin: PinArg,
    /// MemAvailable never taken (default: max(3 × min_free_kbytes, MemTotal/64, 64MiB)).
    #[arg(long, value_name = "SIZE")]
    pub reserve: Option<String>,
    /// Advanced: while holding, MemAvailable below this makes fraglab give memory back (default:
    /// 2 × min_free_kbytes). At least that and below MemAvailable; raising it lets a test show the
    /// guard acting without exhausting the machine.
    #[arg(long, value_name = "SIZE")]
    pub floor: Option<String>,
    /// Also set vm.compaction_proactiveness = 0 while holding (a whole-machine profile always does).
    #[arg(long)]
    pub no_proactive_compaction: bool,
    /// Whole machine, max free order: do not take back free blocks of the order that form while
    /// holding (freed memory merging, compaction); only watch and record when the target was lost.
    #[arg(long)]
    pub no_keep: bool,
    /// Hold in the background until `fraglab release`.
    #[arg(long)]
    pub daemon: bool,
    /// Resolve the target and print the plan; take nothing, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Internal: the background half of --daemon.
    #[arg(long, hide = true)]
    pub daemon_child: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the status as JSON (with --watch: one object a line).
    #[arg(long)]
    pub json: bool,
    /// Ask again every DURATION (1s, 250ms; at least 100ms) and print a line each time, until
    /// Ctrl-C or nobody reads (exit by the last answer) or the hold ends (exit 1).
    #[arg(long, value_name = "DURATION", value_parser = watch_interval)]
    pub watch: Option<Duration>,
}

/// The shortest `status --watch` interval: each answer costs the holder a buddyinfo read and a
/// refresh of its whole account, between its 10 ms looks and its guard.
pub const MIN_WATCH: Duration = Duration::from_millis(100);

fn watch_interval(text: &str) -> Result<Duration, String> {
    let every = fraglab_units::parse_duration(text)?;
    if every < MIN_WATCH {
        return Err(format!(
            "{text:?} is shorter than {}: every answer takes the holder's time from keeping the target and \
             guarding memory; ask at most ten times a second",
            humantime::format_duration(MIN_WATCH)
        ));
    }
    Ok(every)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccelArg {
    /// KVM when /dev/kvm works and has booted a guest on this host before, else TCG.
    Auto,
    Kvm,
    Tcg,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  fraglab vm --kernel debian-cloud -- run configs/pipe-highorder.toml   # results/ and exit status come back
  fraglab vm --kernel debian-cloud -- probe --json
  fraglab vm --kernel arch/x86/boot/bzImage --modules /tmp/mods -- workload sctp-connect --streams 65535
  fraglab vm --kernel debian-cloud --script test.sh --results out/   # several commands, one boot
  fraglab vm --kernel base=/tmp/base/bzImage --kernel patched=/tmp/patched/bzImage --rounds 3 \\
      -- run configs/sctp64k.toml                                      # A/B: does the patch change it?
  fraglab vm --print-kconfig > fraglab.config                          # what a kernel you build needs

The guest command runs in /results (also $FRAGLAB_RESULTS); what it writes there is copied to --results.
Exit status: the guest command's own; 125 when the guest could not run it (no kernel, a panic, the timeout).
With two kernels (A/B): 0 the patched kernel is no worse (\"fixed\" when only the base reproduces),
1 it reproduces what the base does not, oopses or warns, or regresses significantly, 125 either side
could not test, 255 bad input (docs/vm.md, \"A/B: two kernels, one command\").")]
pub struct VmArgs {
    /// Kernel to boot: a bzImage (arch/x86/boot/bzImage, /boot/vmlinuz-*), `debian-cloud` for
    /// Debian's current cloud kernel or `debian-cloud:ABI` for one build (`debian-cloud:6.1.0-47`),
    /// fetched with apt into ~/.cache/fraglab/kernels. Give it twice, as `LABEL=KERNEL` if you like
    /// (default labels base, patched), for an A/B of `-- run CONFIG`: base first.
    #[arg(long, value_name = "[LABEL=]PATH|debian-cloud[:ABI]", required_unless_present_any = ["guest_init", "print_kconfig"])]
    pub kernel: Vec<String>,
    /// The kernel's modules: lib/modules/<release>, or the INSTALL_MOD_PATH of `make modules_install`.
    /// With two kernels, `LABEL=DIR` says whose.
    #[arg(long, value_name = "[LABEL=]DIR")]
    pub modules: Vec<String>,
    /// With two kernels: boot each this many times, interleaved (base, patched, base, …) [default: 3].
    #[arg(long, value_name = "N")]
    pub rounds: Option<u32>,
    /// Print the kconfig fragment a kernel needs for everything fraglab does under `fraglab vm`, to
    /// merge with scripts/kconfig/merge_config.sh onto tinyconfig or defconfig.
    #[arg(long, exclusive = true)]
    pub print_kconfig: bool,
    /// Also load this module (with its dependencies); sctp, inet_diag, tcp_diag and sctp_diag are
    /// loaded whenever the kernel has them.
    #[arg(long = "module", value_name = "NAME")]
    pub module: Vec<String>,
    /// Guest memory.
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub mem: String,
    /// Guest CPUs (under TCG they take turns on one host thread).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub cpus: u32,
    /// Guest NUMA nodes: memory split evenly across them in address order, CPUs round-robin (a node
    /// left without a CPU is memory-only, as on some real servers).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub numa: u32,
    /// Guest NUMA nodes shaped like a reporter's machine: as many as the profile file (a saved
    /// /proc/buddyinfo, a Mem-Info block) names, each with the memory and zones its lines need
    /// (instead of --numa and --mem).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["numa", "mem"])]
    pub numa_from: Option<PathBuf>,
    /// Kill the guest after this long (boot included) and exit 125.
    #[arg(long, default_value = "300s", value_name = "DURATION")]
    pub timeout: String,
    /// Copy what the guest command writes under its working directory /results here (for `run`, by
    /// default the current directory: its results/ lands where a run here would put it).
    #[arg(long, value_name = "DIR")]
    pub results: Option<PathBuf>,
    /// A host program to carry into the guest with its shared libraries (e.g. /usr/bin/sctp_test).
    #[arg(long = "extra-bin", value_name = "PATH")]
    pub extra_bin: Vec<PathBuf>,
    /// A host file to carry into the guest, as HOST[:GUEST]; a relative GUEST lands under /results.
    /// The file a `run CONFIG` or `scan LOG` names is carried without it.
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

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A results directory written by `fraglab run` (the one holding run.json): side A.
    #[arg(value_name = "RESULTS_DIR")]
    pub results: PathBuf,
    /// Another results directory to draw against it (side B; repeat for C, D, …).
    #[arg(long, value_name = "OTHER_DIR")]
    pub compare: Vec<PathBuf>,
    /// Where to write the HTML file.
    #[arg(long, short, value_name = "FILE", default_value = "report.html")]
    pub output: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Markdown,
    Json,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Results directories of `fraglab run` (`results/stock-…`); the first is the baseline every
    /// other run is compared against.
    #[arg(value_name = "DIR", required = true)]
    pub dirs: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Names for the runs in the tables, comma-separated, in the order of the directories
    /// (default: A, B, C, …).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub labels: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    /// The saved log: `dmesg` output (with or without timestamps), /var/log/messages or kern.log,
    /// `journalctl -k` (also `-o short-iso`, `-o export`, `-o json`); `-` reads stdin.
    #[arg(value_name = "LOGFILE")]
    pub log: PathBuf,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReproArgs {
    /// The bug report: a saved kernel log (any form `fraglab scan` reads), or a mail or issue quoting
    /// one, from the `page allocation failure` line to the end of its Mem-Info.
    #[arg(value_name = "REPORT")]
    pub report: PathBuf,
    /// The kernel to test, as `fraglab vm --kernel` takes it.
    #[arg(long, default_value = "debian-cloud", value_name = "PATH|debian-cloud[:ABI]")]
    pub kernel: String,
    /// The kernel's modules, as `fraglab vm --modules` takes them.
    #[arg(long, value_name = "DIR")]
    pub modules: Option<PathBuf>,
    /// Boot the guest up to this many times, stopping at the first round that reproduces.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub rounds: u32,
    /// Print the parsed report, the chosen path and why, the guest and the config; write nothing,
    /// boot nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Where the config, its target file and each round's results go [default: repro-<REPORT's
    /// name>].
    #[arg(long, short, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Each round's guest timeout, as `fraglab vm --timeout`.
    #[arg(long, default_value = "400s", value_name = "DURATION")]
    pub timeout: String,
}
