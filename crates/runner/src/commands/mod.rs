//! One module per subcommand.

pub mod compare;
pub mod export;
pub mod fragment;
pub mod generate;
pub mod probe;
pub mod report;
pub mod run;
pub mod scan;
pub mod workload;
