//! `fraglab report RESULTS_DIR [--compare OTHER_DIR]… -o report.html`: one self-contained HTML file
//! (inline SVG and CSS, no script, nothing loaded from the network) from `fraglab run` results.

use crate::exit::Exit;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

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

pub fn run(args: ReportArgs) -> Result<Exit> {
    let report = fraglab_report::generate(&args.results, &args.compare)?;
    // Written next to the target and renamed, so a reader never opens half a report.
    let tmp = args.output.with_extension("html.tmp");
    std::fs::write(&tmp, &report.html).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.output).with_context(|| format!("cannot write {}", args.output.display()))?;
    for line in &report.summary {
        eprintln!("{line}");
    }
    eprintln!("report: {} ({} KiB)", args.output.display(), report.html.len().div_ceil(1024));
    Ok(Exit::Ok)
}
