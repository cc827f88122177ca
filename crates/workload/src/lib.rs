//! Workloads: the traffic and syscalls that make the kernel allocate, and what they report.
//!
//! Each kind takes resolved options and returns a [`WorkloadResult`] (the results crate's, one schema
//! for every kind); `fraglab workload` prints it, `fraglab run` stores it. [`net`] is the one driver
//! TCP and SCTP run on; [`serve`] is their server side for a client on another host.

// outln!, errln!, out!, err!: printing that never panics on a closed pipe, in every module.
#[macro_use]
extern crate fraglab_stdio;

pub mod exec;
mod net;
mod opts;
pub mod room;
pub mod sctp;
pub mod serve;
mod signals;
mod skmem;
pub mod tcp;
pub mod trigger;
pub mod unsupported;

use std::sync::atomic::AtomicBool;

use anyhow::{bail, Result};
use clap::Subcommand;
use fraglab_results::workload::WorkloadResult;
use serde::Deserialize;

pub use unsupported::Unsupported;

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
pub fn validate(kind: &Kind) -> Result<()> {
    match kind {
        Kind::SctpConnect(a) => sctp::ConnectPlan::resolve(a).map(drop),
        Kind::SctpStream(a) => sctp::StreamPlan::resolve(a).map(drop),
        Kind::SctpRr(a) => sctp::RrPlan::resolve(a).map(drop),
        Kind::TcpStream(a) => tcp::StreamPlan::resolve(a).map(drop),
        Kind::TcpRr(a) | Kind::TcpCrr(a) => tcp::RrPlan::resolve(a).map(drop),
        Kind::Trigger(t) => trigger::validate(t),
        Kind::Exec(a) => exec::validate(a),
    }
}

/// The memory a workload can have the kernel hold at once in socket buffers, by `limits`
/// ([`room`]); `None` for the kinds no kernel limit bounds (SCTP association set-up, triggers,
/// exec). The options must have passed [`validate`].
pub fn room(kind: &Kind, limits: &room::Limits) -> Result<Option<room::Room>> {
    Ok(match kind {
        Kind::SctpStream(a) => sctp::StreamPlan::resolve(a)?.room(limits),
        Kind::SctpRr(a) => sctp::RrPlan::resolve(a)?.room(limits),
        Kind::TcpStream(a) => tcp::StreamPlan::resolve(a)?.room(limits),
        Kind::TcpRr(a) | Kind::TcpCrr(a) => tcp::RrPlan::resolve(a)?.room(limits),
        Kind::SctpConnect(_) | Kind::Trigger(_) | Kind::Exec(_) => None,
    })
}

/// Run one workload of any kind: what `fraglab run` calls for each `[[workload]]`.
///
/// `stop` is the run's stop flag, which its SIGINT/SIGTERM/SIGHUP handler raises. Every kind looks at
/// it where it loops and returns promptly with what it measured so far, the result saying so
/// (`details.stopped_by_signal`, a note "stopped by a signal after ..."): the socket kinds within
/// about 10 ms plus one blocked call, triggers before their next call (with the sysctls they raised
/// put back), exec by stopping its command's process group as on a timeout.
pub fn run(kind: &Kind, stop: &AtomicBool) -> Result<WorkloadResult> {
    match kind {
        Kind::SctpConnect(a) => sctp::connect_until(a, stop),
        Kind::SctpStream(a) => sctp::stream_until(a, stop),
        Kind::SctpRr(a) => sctp::rr_until(a, stop),
        Kind::TcpStream(a) => tcp::stream_until(a, stop),
        Kind::TcpRr(a) => tcp::rr_until(a, stop),
        Kind::TcpCrr(a) => tcp::crr_until(a, stop),
        Kind::Trigger(k) => trigger::run(k, stop),
        Kind::Exec(a) => exec::run(a, stop),
    }
}

/// A typed workload from a config's kind name and options; serde rejects unknown options.
pub fn from_options(kind_name: &str, options: &serde_json::Value) -> Result<Kind> {
    Ok(match kind_name {
        "sctp-connect" => Kind::SctpConnect(sctp::ConnectArgs::deserialize(options)?),
        "sctp-stream" => Kind::SctpStream(sctp::StreamArgs::deserialize(options)?),
        "sctp-rr" => Kind::SctpRr(sctp::RrArgs::deserialize(options)?),
        "tcp-stream" => Kind::TcpStream(tcp::StreamArgs::deserialize(options)?),
        "tcp-rr" => Kind::TcpRr(tcp::RrArgs::deserialize(options)?),
        "tcp-crr" => Kind::TcpCrr(tcp::RrArgs::deserialize(options)?),
        "trigger" => Kind::Trigger(trigger::Kind::deserialize(options)?),
        "exec" => Kind::Exec(exec::ExecArgs::deserialize(options)?),
        other => bail!(
            "kind = {other:?} is not a workload; choose sctp-connect, sctp-stream, sctp-rr, tcp-stream, \
             tcp-rr, tcp-crr, trigger or exec"
        ),
    })
}

/// A workload's options as JSON, whatever its kind: every option, defaults filled in.
pub fn options(kind: &Kind) -> serde_json::Value {
    let v = match kind {
        Kind::SctpConnect(a) => serde_json::to_value(a),
        Kind::SctpStream(a) => serde_json::to_value(a),
        Kind::SctpRr(a) => serde_json::to_value(a),
        Kind::TcpStream(a) => serde_json::to_value(a),
        Kind::TcpRr(a) | Kind::TcpCrr(a) => serde_json::to_value(a),
        Kind::Trigger(t) => serde_json::to_value(t),
        Kind::Exec(a) => serde_json::to_value(a),
    };
    v.unwrap_or(serde_json::Value::Null)
}
