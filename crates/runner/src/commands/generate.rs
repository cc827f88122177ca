//! `fraglab completions SHELL` and `fraglab man`: shell completions and man pages generated from the
//! same clap definitions the binary parses with, so they cannot drift from the flags.

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs, ManArgs};
use crate::exit::Exit;

pub fn completions(args: CompletionsArgs) -> Result<Exit> {
    // Into memory first: clap_complete panics when a write fails, and stdout may be a closed pipe.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "fraglab", &mut script);
    fraglab_stdio::write_stdout_bytes(&script);
    Ok(Exit::Ok)
}

pub fn man(args: ManArgs) -> Result<Exit> {
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut page)?;
            fraglab_stdio::write_stdout_bytes(&page);
        }
    }
    Ok(Exit::Ok)
}
