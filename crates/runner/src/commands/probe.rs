//! `fraglab probe`.

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::ProbeArgs;

pub fn run(_args: ProbeArgs) -> Result<ExitCode> {
    let b = fraglab_probe::buddyinfo::BuddyInfo::read()?;
    println!("{}", serde_json::to_string_pretty(&b)?);
    Ok(ExitCode::SUCCESS)
}
