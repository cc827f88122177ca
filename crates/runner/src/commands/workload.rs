//! `fraglab workload KIND`: run one workload, print its result.

use std::sync::atomic::AtomicBool;

use anyhow::Result;

use crate::cli::WorkloadArgs;
use crate::workload::result::WorkloadResult;
use crate::workload::{exec, sctp, tcp, trigger, Kind};
use fraglab_units::format_size;

use crate::exit::Exit;

/// `fraglab workload KIND`: exit 0 when every operation succeeded, 1 when any failed, 125 when this
/// kernel cannot run the kind, 255 when it could not run at all (bad option, setup failure) — so a
/// script can loop on it as on `run`, whose statuses these mirror.
pub fn run(args: WorkloadArgs) -> Result<Exit> {
    // Standalone, a signal keeps its own meaning: the default (fraglab dies at once) for the socket
    // workloads, forwarded then re-raised for exec, deferred until the sysctls are back for triggers.
    // Nothing raises this flag.
    let result = match run_kind(&args.kind, &AtomicBool::new(false)) {
        Ok(r) => r,
        Err(e) if e.downcast_ref::<crate::workload::Unsupported>().is_some() => {
            eprintln!("fraglab: {e:#}");
            return Ok(Exit::CouldNotTest);
        }
        Err(e) => {
            eprintln!("fraglab: {e:#}");
            return Ok(Exit::Error);
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("{}", summary(&result));
    }
    Ok(if result.failed > 0 { Exit::Failed } else { Exit::Ok })
}

/// Run one workload of any kind: what `fraglab run` calls for each `[[workload]]`.
///
/// `stop` is the run's stop flag, which its SIGINT/SIGTERM/SIGHUP handler raises. Every kind looks at
/// it where it loops and returns promptly with what it measured so far, the result saying so
/// (`details.stopped_by_signal`, a note "stopped by a signal after ..."): the socket kinds within
/// about 10 ms plus one blocked call, triggers before their next call (with the sysctls they raised
/// put back), exec by stopping its command's process group as on a timeout.
pub fn run_kind(kind: &Kind, stop: &AtomicBool) -> Result<WorkloadResult> {
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

/// The human summary of any result.
pub fn summary(r: &WorkloadResult) -> String {
    let mut o = format!("{} — {:.2} s, {} ok, {} failed\n", r.kind, r.duration_s, r.ok, r.failed);
    if r.bytes > 0 {
        o += &format!("  payload   {}", format_size(r.bytes));
        if let Some(t) = r.throughput_mbit {
            o += &format!(", {t:.1} Mbit/s");
        }
        o += "\n";
    }
    if let Some(ops) = r.ops_per_sec {
        o += &format!("  rate      {ops:.1} ops/s\n");
    }
    if let Some(s) = &r.per_worker {
        o += &format!("  per worker min {:.1} / median {:.1} / max {:.1}\n", s.min, s.median, s.max);
    }
    if let Some(l) = &r.latency_us {
        o += &format!(
            "  latency µs  mean {:.1}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (n={})\n",
            l.mean, l.p50, l.p90, l.p99, l.p999, l.max, l.count
        );
    }
    if let Some(c) = &r.cpu {
        o += &format!("  cpu       {:.1}% of {} CPUs", c.util_pct, c.cpus);
        if let Some(sd) = c.service_demand_us_per_kb {
            o += &format!(", service demand {sd:.3} µs/KB");
        }
        o += "\n";
    }
    for e in &r.errors {
        o += &format!(
            "  error     {} ({}) × {}, first at {:.3} s\n",
            e.errno, e.code, e.count, e.first_seen_s
        );
    }
    for (k, v) in &r.details {
        o += &format!("  {k:<9} {}\n", plain(v));
    }
    for n in &r.notes {
        o += &format!("  note: {n}\n");
    }
    o += &format!(
        "  rusage    user {:.2} s, sys {:.2} s, maxrss {} KiB\n",
        r.rusage.user_s, r.rusage.sys_s, r.rusage.maxrss_kb
    );
    o
}

/// A detail value as a person reads it: strings unquoted, lists joined, objects as `key value`
/// pairs (`name fs.pipe-max-size, original 1048576, set_to 16777216`); the JSON keeps the structure.
fn plain(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join("; "),
        Value::Object(m) => m.iter().map(|(k, v)| format!("{k} {}", plain(v))).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}
