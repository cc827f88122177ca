//! `fraglab report RESULTS_DIR [--compare OTHER_DIR]… -o report.html`: one self-contained HTML file
//! (inline SVG and CSS, no script, nothing loaded from the network) from `fraglab run` results.

use anyhow::{Context, Result};

use crate::cli::ReportArgs;
use crate::exit::Exit;

pub fn run(args: ReportArgs) -> Result<Exit> {
    let report = fraglab_report::generate(&args.results, &args.compare)?;
    // Written next to the target and renamed, so a reader never opens half a report.
    let tmp = args.output.with_extension("html.tmp");
    std::fs::write(&tmp, &report.html).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.output).with_context(|| format!("cannot write {}", args.output.display()))?;
    for line in &report.summary {
        errln!("{line}");
    }
    errln!("report: {} ({} KiB)", args.output.display(), report.html.len().div_ceil(1024));
    Ok(Exit::Ok)
}
