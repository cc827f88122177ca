//! Raw command-line arguments, exactly as typed (ripgrep's "low-level args"). Nothing here reads the
//! kernel; [`crate::resolve`] turns these into validated plans.

use std::path::PathBuf;

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
    /// What a fragmenter is doing: where shaping stands, or what it holds.
    Status(StatusArgs),
    /// Make a fragmenter give its memory back and restore every sysctl; one still shaping stops
    /// between two steps.
    Release,
    /// Run one workload and report throughput, latency, CPU and failures by errno (exit 0 all
    /// succeeded, 1 some failed, 125 not on this kernel).
    Workload(WorkloadArgs),
    /// Serve the TCP or SCTP (`--proto sctp`) workloads' server side for a client on another host
    /// (`--peer`).
    Serve(crate::workload::serve::ServeCommand),
    /// Boot a kernel under test in qemu and run a fraglab command inside it.
    Vm(crate::vm::VmArgs),
    /// Read a saved dmesg / syslog / journal: allocation failures by order, mode, command and call
    /// site, OOM kills, and each Mem-Info free-area or buddyinfo line as a ready `fraglab fragment
    /// --profile` target.
    Scan(crate::commands::scan::ScanArgs),
    /// One self-contained HTML report of a run (or several, A/B): buddyinfo heatmap with the phases,
    /// free/available memory, compaction counters, throughput and latency against the sweep,
    /// failures over time, slab caches that leak.
    Report(crate::commands::report::ReportArgs),
    /// Set runs side by side: every workload metric at every sweep point against the first run
    /// (mean, stddev, % change, Welch's t-test, mmtests' significance), target vs achieved
    /// fragmentation, failed allocations, compaction counters. Exit 0, or 255 on an error.
    Compare(crate::commands::compare::CompareArgs),
}

#[derive(Debug, Args)]
pub struct WorkloadArgs {
    #[command(subcommand)]
    pub kind: crate::workload::Kind,
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
    /// line (`Normal: 512*4kB (UME) 97*8kB ... = 3016kB`).
    #[arg(long, value_name = "LINE")]
    pub profile: Option<String>,
    /// Shape only this much memory (shared machines, tests); success is judged on the memory taken.
    #[arg(long, value_name = "SIZE")]
    pub budget: Option<String>,
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
    /// Also set vm.compaction_proactiveness = 0 while holding.
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
    #[arg(long)]
    pub json: bool,
}
