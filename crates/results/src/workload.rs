//! The result every workload returns: what a human summary prints and what `fraglab run` stores in
//! workloads.json. One schema for all kinds, so compare and report need no per-kind code.

use std::collections::BTreeMap;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// One workload execution. Fields a reader does not find take their empty value, so a result
/// written before a field existed still reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkloadResult {
    /// `tcp-stream`, `tcp-rr`, `sctp-connect`, `trigger pipe-resize`, `exec`, ...
    pub kind: String,
    /// The options it ran with, as resolved.
    pub params: serde_json::Value,
    /// Wall-clock start, RFC 3339 UTC.
    pub started: String,
    pub duration_s: f64,
    /// Operations that succeeded and failed (connects, transactions, messages, trigger calls).
    pub ok: u64,
    pub failed: u64,
    /// Payload bytes moved (sent by the clients), when the kind moves data.
    pub bytes: u64,
    /// Payload throughput over the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput_mbit: Option<f64>,
    /// Operations per second (transactions/s, connects/s, calls/s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_per_sec: Option<f64>,
    /// Spread of the per-thread / per-client rate (Mbit/s for streams, ops/s otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_worker: Option<Spread>,
    /// Latency of one operation, microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<Latency>,
    /// Local CPU over the run, from /proc/stat, and netperf-style service demand.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Failures by errno name, with when each was first seen.
    pub errors: Vec<ErrnoCount>,
    /// This process's resource usage over the run (getrusage(RUSAGE_SELF) delta).
    pub rusage: Rusage,
    /// The memory of the workload's own sockets while it ran (`ss -tm`'s skmem, through sock_diag):
    /// the socket kinds sample it every window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skmem: Option<crate::skmem::SockMem>,
    /// Kind-specific facts a reader needs (e.g. the allocation order a trigger asks for).
    pub details: BTreeMap<String, serde_json::Value>,
    /// Caveats in plain words (e.g. "EINVAL counted as success: the kernel reached the copy").
    pub notes: Vec<String>,
}

impl WorkloadResult {
    /// A result naming its kind, options and start, every measurement still empty.
    pub fn new(kind: &str, params: serde_json::Value, started: String) -> Self {
        WorkloadResult { kind: kind.into(), params, started, ..Default::default() }
    }

    /// Record that the run's stop flag — SIGINT, SIGTERM or SIGHUP to `fraglab run` — ended this
    /// workload early: `details.stopped_by_signal = true` and the note `stopped by a signal after
    /// {how_far}` (e.g. `1.0 s of the 60s asked for`). `duration_s` stays what was measured.
    pub fn mark_stopped(&mut self, how_far: impl std::fmt::Display) {
        self.details.insert("stopped_by_signal".into(), serde_json::Value::Bool(true));
        self.notes.push(format!("stopped by a signal after {how_far}"));
    }

    /// The one figure a test system shows for this workload, with its unit: throughput when it
    /// moves data, else its rate, else the operations that failed.
    pub fn headline(&self) -> (f64, &'static str) {
        match (self.throughput_mbit, self.ops_per_sec) {
            (Some(t), _) => (t, "Mbit/s"),
            (None, Some(r)) => (r, "ops/s"),
            (None, None) => (self.failed as f64, "failed_ops"),
        }
    }

    /// Count of failures with errno `name` (`ENOMEM`).
    pub fn errno_count(&self, name: &str) -> u64 {
        self.errors.iter().filter(|e| e.errno == name).map(|e| e.count).sum()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 0 { (v[mid - 1] + v[mid]) / 2.0 } else { v[mid] };
        Some(Spread { min: v[0], median, max: v[v.len() - 1] })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub mean: f64,
    pub min: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Option<Latency> {
        (!h.is_empty()).then(|| Latency {
            count: h.len(),
            mean: h.mean(),
            min: h.min(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        })
    }
}

/// A latency histogram in microseconds, 1 µs to 100 s at 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("static bounds are valid")
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrnoCount {
    /// `ENOMEM`, `ENOBUFS`, `ECONNREFUSED`, ... (`E?<n>` for a number libc does not name).
    pub errno: String,
    pub code: i32,
    pub count: u64,
    /// Seconds from the workload's start to the first failure with this errno.
    pub first_seen_s: f64,
}

/// Failures by errno, shared by the workers of one run.
#[derive(Debug)]
pub struct Errors {
    start: Instant,
    by_code: BTreeMap<i32, ErrnoCount>,
}

impl Errors {
    pub fn new(start: Instant) -> Self {
        Errors { start, by_code: BTreeMap::new() }
    }

    pub fn record(&mut self, err: &std::io::Error) {
        let code = err.raw_os_error().unwrap_or(0);
        let first_seen_s = self.start.elapsed().as_secs_f64();
        self.by_code
            .entry(code)
            .or_insert_with(|| ErrnoCount { errno: errno_name(code), code, count: 0, first_seen_s })
            .count += 1;
    }

    pub fn merge(&mut self, other: Errors) {
        for (code, e) in other.by_code {
            let mine = self.by_code.entry(code).or_insert_with(|| ErrnoCount { count: 0, ..e.clone() });
            mine.count += e.count;
            mine.first_seen_s = mine.first_seen_s.min(e.first_seen_s);
        }
    }

    pub fn total(&self) -> u64 {
        self.by_code.values().map(|e| e.count).sum()
    }

    pub fn into_vec(self) -> Vec<ErrnoCount> {
        self.by_code.into_values().collect()
    }
}

/// `12` → `ENOMEM`, from nix's table of this platform's errno names.
pub fn errno_name(code: i32) -> String {
    let e = nix::errno::Errno::from_raw(code);
    if e == nix::errno::Errno::UnknownErrno {
        format!("E?{code}")
    } else {
        format!("{e:?}")
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rusage {
    pub user_s: f64,
    pub sys_s: f64,
    /// Peak resident set size of the process so far (not a delta), KiB. Inside `fraglab run` the
    /// process also holds the fragmenter's memory, so there it says nothing about the workload.
    pub maxrss_kb: i64,
    pub minflt: i64,
    pub majflt: i64,
    pub nvcsw: i64,
    pub nivcsw: i64,
}

impl Rusage {
    pub fn now() -> Rusage {
        let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
            .expect("getrusage(RUSAGE_SELF) cannot fail");
        let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        Rusage {
            user_s: secs(u.user_time()),
            sys_s: secs(u.system_time()),
            maxrss_kb: u.max_rss(),
            minflt: u.minor_page_faults(),
            majflt: u.major_page_faults(),
            nvcsw: u.voluntary_context_switches(),
            nivcsw: u.involuntary_context_switches(),
        }
    }

    /// Usage between `earlier` and `self`.
    pub fn since(&self, earlier: &Rusage) -> Rusage {
        Rusage {
            user_s: self.user_s - earlier.user_s,
            sys_s: self.sys_s - earlier.sys_s,
            maxrss_kb: self.maxrss_kb,
            minflt: self.minflt - earlier.minflt,
            majflt: self.majflt - earlier.majflt,
            nvcsw: self.nvcsw - earlier.nvcsw,
            nivcsw: self.nivcsw - earlier.nivcsw,
        }
    }
}

/// Machine-wide CPU use over the run, as netperf -c reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    /// Busy share of all CPUs, percent (100 = every CPU busy).
    pub util_pct: f64,
    pub cpus: usize,
    /// CPU time per KiB of payload, µs/KB (netperf's local service demand).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_demand_us_per_kb: Option<f64>,
}

/// A /proc/stat reading to diff against.
pub struct CpuSample {
    busy: u64,
    total: u64,
    cpus: usize,
}

impl CpuSample {
    pub fn now() -> std::io::Result<CpuSample> {
        use procfs::CurrentSI;
        let stat = procfs::KernelStats::current().map_err(std::io::Error::other)?;
        let t = &stat.total;
        let idle = t.idle + t.iowait.unwrap_or(0);
        let busy =
            t.user + t.nice + t.system + t.irq.unwrap_or(0) + t.softirq.unwrap_or(0) + t.steal.unwrap_or(0);
        Ok(CpuSample { busy, total: busy + idle, cpus: stat.cpu_time.len() })
    }

    /// CPU use from `self` to `later`; `bytes` of payload give the service demand.
    pub fn until(&self, later: &CpuSample, bytes: u64) -> Cpu {
        let total = later.total.saturating_sub(self.total).max(1) as f64;
        let busy = later.busy.saturating_sub(self.busy) as f64;
        let util = busy / total;
        // busy ticks are summed over CPUs: seconds of CPU = busy / ticks_per_second.
        let ticks = procfs::ticks_per_second() as f64;
        let cpu_us = busy / ticks * 1e6;
        Cpu {
            util_pct: util * 100.0,
            cpus: self.cpus,
            service_demand_us_per_kb: (bytes > 0).then(|| cpu_us / (bytes as f64 / 1024.0)),
        }
    }
}

/// RFC 3339 wall clock now, UTC, milliseconds.
pub fn wall_now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// The human summary of a result, as `fraglab workload` and `fraglab run` print it.
pub fn summary(r: &WorkloadResult) -> String {
    let mut o = format!("{} — {:.2} s, {} ok, {} failed\n", r.kind, r.duration_s, r.ok, r.failed);
    if r.bytes > 0 {
        o += &format!("  payload   {}", fraglab_units::format_size(r.bytes));
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
    if let Some(m) = &r.skmem {
        for line in m.summary_lines() {
            o += &format!("  skmem     {line}\n");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_errno_names() {
        let s = Spread::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.min, s.median, s.max), (1.0, 2.5, 10.0));
        assert_eq!(errno_name(libc::ENOMEM), "ENOMEM");
        assert_eq!(errno_name(libc::ECONNREFUSED), "ECONNREFUSED");
        assert_eq!(errno_name(9999), "E?9999");
    }

    #[test]
    fn errors_count_and_merge() {
        let start = Instant::now();
        let mut a = Errors::new(start);
        a.record(&std::io::Error::from_raw_os_error(libc::ENOMEM));
        let mut b = Errors::new(start);
        b.record(&std::io::Error::from_raw_os_error(libc::ENOMEM));
        b.record(&std::io::Error::from_raw_os_error(libc::ENOBUFS));
        a.merge(b);
        let v = a.into_vec();
        assert_eq!(v.iter().find(|e| e.errno == "ENOMEM").unwrap().count, 2);
        assert_eq!(v.iter().find(|e| e.errno == "ENOBUFS").unwrap().count, 1);
    }
}
