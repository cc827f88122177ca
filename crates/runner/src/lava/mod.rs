//! fraglab on LAVA, the test scheduler KernelCI's labs run: [`job`] writes a job that boots the
//! kernel under test with `fraglab vm`'s initramfs and runs a scenario; [`console`] is what the
//! guest says (test cases for LAVA's monitor, the results directory as text) and reading it back.
//! docs/scale.md has the why of each choice.

pub mod console;
pub mod job;

use anyhow::{bail, Context, Result};

use crate::cli::LavaResultsArgs;
use crate::exit::Exit;

/// `fraglab lava-results LOG -o DIR`: the guest's /results out of a job's log, into DIR. Exit 0,
/// 1 when the guest wrote no results directory, 255 when the log has no whole archive.
pub fn results(args: LavaResultsArgs) -> Result<Exit> {
    fetch(&args).or_else(|e| {
        errln!("fraglab lava-results: {e:#}");
        Ok(Exit::Error)
    })
}

fn fetch(args: &LavaResultsArgs) -> Result<Exit> {
    let log = if args.log.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading the log from stdin")?;
        s
    } else {
        let bytes =
            std::fs::read(&args.log).with_context(|| format!("cannot read {}", args.log.display()))?;
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let cpio = console::unarchive(&log, &args.log)?;
    let out = &args.output;
    if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!(
            "-o {}: not an empty directory; give a new one (the results are not merged into others)",
            out.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("-o {}", out.display()))?;
    let files = crate::vm::initramfs::unpack(&cpio, out)?;
    let runs = fraglab_results::load::find_runs(out, 4);
    outln!("{} files into {}", files.len(), out.display());
    for dir in &runs {
        let verdict = fraglab_results::load::Run::load_with(dir, fraglab_results::load::Samples::Ends)
            .map(|r| r.record.verdict.map_or("no verdict".to_string(), |v| v.to_string()))
            .unwrap_or_else(|e| format!("{e:#}"));
        outln!("  {}  {verdict}", dir.display());
    }
    if runs.is_empty() {
        errln!("fraglab lava-results: the guest wrote no results directory (no run.json) under /results");
        return Ok(Exit::Failed);
    }
    Ok(Exit::Ok)
}
