//! `fraglab completions SHELL` and `fraglab man`: shell completions and man pages generated from the
//! same clap definitions the binary parses with, so they cannot drift from the flags.

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs, ManArgs};
use crate::exit::Exit;

pub fn completions(args: CompletionsArgs) -> Result<Exit> {
    clap_complete::generate(args.shell, &mut Cli::command(), "fraglab", &mut std::io::stdout());
    Ok(Exit::Ok)
}

pub fn man(args: ManArgs) -> Result<Exit> {
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
        }
        None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?,
    }
    Ok(Exit::Ok)
}
