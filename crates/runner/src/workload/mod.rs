//! Workloads: the traffic and syscalls that make the kernel allocate, and what they report.
//!
//! Each kind takes resolved options and returns a [`result::WorkloadResult`]; `fraglab workload`
//! prints it, `fraglab run` stores it.

pub mod exec;
mod net;
mod opts;
pub mod result;
pub mod sctp;
pub mod serve;
mod signals;
pub mod tcp;
pub mod trigger;

use clap::Subcommand;

/// The kernel lacks what a workload needs (SCTP, io_uring, ...): `fraglab workload` and
/// `fraglab run` exit 125, "could not test", rather than 1.
#[derive(Debug)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unsupported {}

/// `fraglab workload <kind>`.
#[derive(Debug, Subcommand)]
pub enum Kind {
    /// N SCTP associations with up to 65535 streams each (seed 000's sctp_test -M 65535 -T).
    SctpConnect(sctp::ConnectArgs),
    /// SCTP bulk transfer, like netperf -t SCTP_STREAM (seed 001).
    SctpStream(sctp::StreamArgs),
    /// SCTP request/response, like netperf -t SCTP_RR.
    SctpRr(sctp::RrArgs),
    /// T threads, each a TCP connection streaming messages, like super_netperf (seed 002).
    TcpStream(tcp::StreamArgs),
    /// C clients doing request/response transactions (seed 004).
    TcpRr(tcp::RrArgs),
    /// A new connection per transaction.
    TcpCrr(tcp::RrArgs),
    /// Syscalls that make the kernel do one allocation of a known high order.
    #[command(subcommand)]
    Trigger(trigger::Kind),
    /// Any external command (sctp_test, iperf3, netperf), with a timeout; ENOMEM/ENOBUFS in its
    /// output are recognised.
    Exec(exec::ExecArgs),
}

/// Check a workload's options without running it: sizes, durations, counts, ranges. `fraglab run`
/// calls this for every workload at every sweep point before it takes any memory.
pub fn validate(kind: &Kind) -> anyhow::Result<()> {
    match kind {
        Kind::SctpConnect(_) | Kind::SctpStream(_) | Kind::SctpRr(_) => sctp::validate(kind),
        Kind::TcpStream(_) | Kind::TcpRr(_) | Kind::TcpCrr(_) => tcp::validate(kind),
        Kind::Trigger(t) => trigger::validate(t),
        Kind::Exec(a) => exec::validate(a),
    }
}
