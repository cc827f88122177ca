//! The result every workload returns now lives with the other results types; this path stays until
//! the workloads have their own crate.

pub use fraglab_results::workload::*;
