//! `fraglab run CONFIG`: parse, resolve, run the pipeline, print the summary, exit for bisect.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Result;

use crate::cli::RunArgs;
use crate::config::Source;
use crate::pipeline;
use crate::resolve::Machine;
use crate::runplan;

use crate::exit::Exit;

pub fn run(args: RunArgs, run_dir: &Path) -> Result<Exit> {
    match run_inner(&args, run_dir) {
        Ok(code) => Ok(code),
        Err(e) => {
            errln!("fraglab: {e:#}");
            Ok(Exit::Error)
        }
    }
}

fn run_inner(args: &RunArgs, run_dir: &Path) -> Result<Exit> {
    // Without root there are no PFNs in pagemap, no mlock budget, no sysctls, no tracefs: the run
    // cannot test anything, which bisect must count as "skip", not as an error.
    if !nix::unistd::geteuid().is_root() && !args.dry_run {
        errln!(
            "fraglab: fraglab run needs root (pagemap PFNs, mlock, sysctls, tracefs); could not test: run it with sudo"
        );
        return Ok(Exit::CouldNotTest);
    }
    // Parse, then resolve: a bad config is refused here, before any memory or sysctl is touched.
    let src = Source::read(&args.config)?;
    let cfg = src.parse()?;
    let machine = Machine::read()?;
    let mut plan = runplan::resolve(&src, &cfg, &machine)?;
    if let Some(out) = &args.output {
        plan.output = out.clone();
    }
    if args.baseline {
        // Dropped only after resolving, so the baseline half of an A/B refuses the same bad
        // [fragment] as the fragmented half would.
        plan.fragment = None;
        plan.record.fragmenter = None;
    }
    if args.dry_run {
        out!("{}", runplan::describe(&plan, machine.mem_available, crate::vm::init::in_guest()));
        if let Err(why) = pipeline::preflight(&plan, pipeline::Check::Look) {
            outln!(
                "could not test here: {why}; a real run stops with exit {} (could-not-test) before \
                 taking any memory or changing any sysctl",
                Exit::CouldNotTest.code()
            );
        }
        outln!("dry run: nothing taken, nothing changed");
        return Ok(Exit::Ok);
    }
    let stop = Arc::new(AtomicBool::new(false));
    // SIGHUP too: closing the terminal must end the run cleanly, not leave sysctls changed.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        // A second Ctrl-C exits at once; the next fraglab command restores from the journal.
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))?;
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let (verdict, results) = match pipeline::run(&plan, run_dir, stop) {
        Ok(done) => done,
        Err(e) => {
            // What ran before the error, and what was put back, as for any run.
            if let Some(p) = e.downcast_ref::<pipeline::PartWay>() {
                out!("{}", fraglab_report::summary::render(&p.dir)?);
            }
            return Err(e);
        }
    };
    out!("{}", fraglab_report::summary::render(&results.dir)?);
    errln!("results: {}", results.dir.display());
    Ok(Exit::from(verdict))
}
