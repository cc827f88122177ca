//! The `fraglab` command: argument parsing, resolution into a plan, and the subcommands.
