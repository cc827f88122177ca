//! The `fraglab` command: raw arguments ([`cli`]) are resolved into validated plans ([`resolve`])
//! before anything touches the kernel, then handed to one module per subcommand ([`commands`]).

// outln!, errln!, out!, err!: printing that never panics on a closed pipe, in every module.
#[macro_use]
extern crate fraglab_stdio;

pub mod cli;
pub mod commands;
pub mod config;
pub mod exit;
pub mod lava;
pub mod pipeline;
pub mod progress;
pub mod repro;
pub mod resolve;
pub mod runplan;
pub mod verdict;
pub mod vm;

use std::process::ExitCode;

use clap::Parser;

use crate::exit::Exit;

pub fn main() -> ExitCode {
    // A LAVA device's kernel runs the initramfs's /init (fraglab), with no `vm --guest-init`.
    if vm::init::started_as_init() {
        vm::init::run();
    }
    // A mistyped flag is bad input like any other: 255, which stops `git bisect run`, rather than
    // clap's 2, which bisect would take for "this commit is bad". --help and --version still exit 0.
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { Exit::Error.into() } else { Exit::Ok.into() };
        }
    };
    // Commands that only read files and print die quietly when their reader goes away (`fraglab scan LOG |
    // head`), as cat does; Rust ignores SIGPIPE and would panic on the write instead. Not for the
    // ones that hold memory, change sysctls or use sockets: they must get EPIPE and clean up.
    let reads_only = matches!(
        cli.command,
        cli::Command::Probe(_)
            | cli::Command::Scan(_)
            | cli::Command::Compare(_)
            | cli::Command::Completions(_)
            | cli::Command::Man(_)
            | cli::Command::Export(_)
    );
    if reads_only {
        // SAFETY: restoring a signal's default disposition before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // What these print is all they do: output lost to a full disk means they did not do their job.
    let prints_only = reads_only || matches!(&cli.command, cli::Command::Fragment(a) if a.dry_run);
    // Whatever a SIGKILLed fraglab left changed is put back before anything else happens.
    recover_after_dead_fraglabs(&cli.run_dir);
    let result = match cli.command {
        cli::Command::Run(args) => commands::run::run(args, &cli.run_dir),
        cli::Command::Probe(args) => commands::probe::run(args),
        cli::Command::Fragment(args) => commands::fragment::run(args, &cli.run_dir),
        cli::Command::Status(args) => commands::fragment::status(args, &cli.run_dir),
        cli::Command::Release => commands::fragment::release(&cli.run_dir),
        cli::Command::Workload(args) => commands::workload::run(args),
        cli::Command::Serve(args) => fraglab_workload::serve::serve(args).map(|()| Exit::Ok),
        cli::Command::Vm(args) => crate::vm::run(args),
        cli::Command::Scan(args) => commands::scan::run(args),
        cli::Command::Repro(args) => repro::run(args),
        cli::Command::Report(args) => commands::report::run(args),
        cli::Command::Compare(args) => commands::compare::run(args),
        cli::Command::Completions(args) => commands::generate::completions(args),
        cli::Command::Man(args) => commands::generate::man(args),
        cli::Command::LavaJob(args) => lava::job::run(args),
        cli::Command::LavaResults(args) => lava::results(args),
        cli::Command::Export(args) => commands::export::run(args),
    };
    match result {
        // Output asked for and lost (a full disk) is a failure a script must see; a reader that
        // went away (`| head`) is not. Only for the commands whose output is the answer: 255, not
        // 1, which would read as a verdict. Every other command's exit status says what it did
        // (run: its verdict; status: whether the target holds), whatever became of the text.
        Ok(Exit::Ok) if prints_only && fraglab_stdio::stdout_lost() => Exit::Error.into(),
        Ok(exit) => exit.into(),
        Err(e) => {
            errln!("fraglab: {e:#}");
            // The kernel lacks what the command needs (SCTP for `serve`, file locking for anything
            // that takes fraglab's lock): could not test, not failed.
            let unsupported = e.is::<fraglab_workload::Unsupported>()
                || e.is::<fraglab_fragmenter::instance::NoFileLocking>();
            if unsupported { Exit::CouldNotTest } else { Exit::Failed }.into()
        }
    }
}

/// Replay the sysctl journals of fraglabs that died holding them (the instance's and the triggers'),
/// remove their tracefs instances, say what was put back, and mark a dead run's results as cut
/// short. Only the process that finds a dead holder under the lock marks its run, so two commands
/// starting together never both write it.
fn recover_after_dead_fraglabs(run_dir: &std::path::Path) {
    let say = |who: &str, restored: Vec<fraglab_fragmenter::sysctl::Restored>| {
        if !restored.is_empty() {
            errln!("fraglab: a previous {who} died holding sysctls; restored from its journal:");
            for r in restored {
                errln!("  {r}");
            }
        }
    };
    match fraglab_fragmenter::instance::Instance::recover_if_stale(run_dir) {
        Ok((restored, dead)) => {
            say("fraglab", restored);
            if let Some((h, dir)) = dead.and_then(|h| h.results.clone().map(|r| (h, r))) {
                let why = format!(
                    "fraglab pid {} died during the run (SIGKILL, an OOM kill or a crash); pid {} found it \
                     dead and restored what it had changed",
                    h.pid,
                    std::process::id()
                );
                match (fraglab_results::dir::ResultsDir { dir: dir.clone() }).mark_cut_short(&why) {
                    Ok(true) => {
                        errln!("fraglab: marked the dead run's results incomplete: {}", dir.display())
                    }
                    Ok(false) => {}
                    Err(e) => errln!("fraglab: could not mark the dead run's results: {e:#}"),
                }
            }
        }
        Err(e) => errln!("fraglab: could not restore a previous fraglab's sysctls: {e:#}"),
    }
    // A dead run's catcher instance (its filter and stack trigger) costs every page allocation.
    for dir in fraglab_probe::tracefs::remove_dead_instances() {
        errln!("fraglab: removed {} left by a fraglab that died", dir.display());
    }
    // Triggers journal apart from the fragmenter (they run while it holds the instance lock).
    fraglab_workload::trigger::set_run_dir(run_dir);
    match fraglab_workload::trigger::recover_if_stale(run_dir) {
        Ok(restored) => say("trigger", restored),
        Err(e) => errln!("fraglab: could not restore a previous trigger's sysctls: {e:#}"),
    }
}
