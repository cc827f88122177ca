//! `fraglab workload KIND`: one workload, its result printed.

use std::sync::atomic::AtomicBool;

use anyhow::Result;
use fraglab_results::workload::summary;

use crate::cli::WorkloadArgs;
use crate::exit::Exit;

/// `fraglab workload KIND`: exit 0 when every operation succeeded, 1 when any failed, 125 when this
/// kernel cannot run the kind, 255 when it could not run at all (bad option, setup failure) — so a
/// script can loop on it as on `run`, whose statuses these mirror.
pub fn run(args: WorkloadArgs) -> Result<Exit> {
    // Standalone, a signal keeps its own meaning: the default (fraglab dies at once) for the socket
    // workloads, forwarded then re-raised for exec, deferred until the sysctls are back for triggers.
    // Nothing raises this flag.
    let result = match fraglab_workload::run(&args.kind, &AtomicBool::new(false)) {
        Ok(r) => r,
        Err(e) if e.downcast_ref::<fraglab_workload::Unsupported>().is_some() => {
            errln!("fraglab: {e:#}");
            return Ok(Exit::CouldNotTest);
        }
        Err(e) => {
            errln!("fraglab: {e:#}");
            return Ok(Exit::Error);
        }
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        out!("{}", summary(&result));
    }
    Ok(if result.failed > 0 { Exit::Failed } else { Exit::Ok })
}
