//! The kernel lacks what a workload needs (SCTP, io_uring, ...): `fraglab workload`, `fraglab serve`
//! and `fraglab run` say "could not test" (exit 125) rather than failing.

/// A workload this kernel cannot run, and why.
#[derive(Debug)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unsupported {}
