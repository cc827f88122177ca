//! A results directory read back: run.json, workloads.json, probe.jsonl, baseline.json, final.json
//! and alloc_failures.jsonl, put on one time axis (seconds since the run's first phase, from the
//! monotonic clock every file shares).

use std::path::{Path, PathBuf};

use anyhow::Result;
use fraglab_probe::snapshot::Snapshot;
use fraglab_probe::tracefs::AllocFailure;
use fraglab_probe::vmstat::VmCounters;
use fraglab_results::load::Run;
use fraglab_results::record::{RunRecord, WorkloadRecord};

/// A snapshot on the report's time axis.
pub struct TimedSnapshot {
    /// Seconds since the run's start.
    pub t: f64,
    pub snapshot: Snapshot,
    /// Counters since the baseline (or since the first sample when there is no baseline).
    pub counters: Option<VmCounters>,
    /// `baseline`, `sample` or `final`.
    pub source: &'static str,
}

/// A phase on the report's time axis.
#[derive(Clone, Debug)]
pub struct Phase {
    pub name: String,
    pub start: f64,
    pub end: f64,
    /// The workload window it is, if it is one.
    pub workload: Option<fraglab_results::record::Window>,
}

pub struct RunData {
    pub dir: PathBuf,
    /// run.json.
    pub info: RunRecord,
    pub workloads: Vec<WorkloadRecord>,
    /// baseline.json, every probe.jsonl sample, final.json: in time order.
    pub timeline: Vec<TimedSnapshot>,
    pub phases: Vec<Phase>,
    pub failures: Vec<AllocFailure>,
    /// CLOCK_MONOTONIC of t = 0, ns.
    pub t0_ns: u64,
    /// Things the reader should know about the data (unreadable lines, missing files).
    pub notes: Vec<String>,
}

impl RunData {
    pub fn t(&self, monotonic_ns: u64) -> f64 {
        (monotonic_ns as f64 - self.t0_ns as f64) / 1e9
    }

    /// End of the time axis: the last phase end or the last snapshot.
    pub fn t_end(&self) -> f64 {
        let p = self.phases.iter().map(|p| p.end).fold(0.0, f64::max);
        let s = self.timeline.iter().map(|s| s.t).fold(0.0, f64::max);
        p.max(s).max(1e-3)
    }

    /// The phase in which workload window `w` ran.
    pub fn workload_phase(&self, w: &WorkloadRecord) -> Option<&Phase> {
        self.phases.iter().find(|p| p.workload.as_ref().is_some_and(|window| w.ran_in(window)))
    }
}

/// Read a results directory.
pub fn load(dir: &Path) -> Result<RunData> {
    let Run { dir: _, record: info, workloads, samples, failures, baseline, final_, mut notes } =
        Run::load(dir)?;
    let samples: Vec<_> = samples.into_iter().map(|s| s.sample).collect();
    let probe = dir.join("probe.jsonl");
    let monitors_ran = info.phases.iter().any(|p| p.name == "monitors");
    if samples.is_empty() {
        notes.push(match (probe.exists(), monitors_ran) {
            (false, true) => format!(
                "{} is missing: the plots over time have only the baseline and final snapshots",
                probe.display()
            ),
            (true, true) => format!("{} has no readable sample", probe.display()),
            (_, false) => {
                format!("{} has no samples: the run ended before its monitors started", probe.display())
            }
        });
    }

    let t0_ns = info
        .phases
        .first()
        .map(|p| p.start_ns)
        .or(baseline.as_ref().map(|b| b.monotonic_ns))
        .or(samples.first().map(|s| s.snapshot.monotonic_ns))
        .unwrap_or(0);
    let t = |ns: u64| (ns as f64 - t0_ns as f64) / 1e9;

    // Counters relative to the baseline: vmstat_delta (relative to the first sample) plus what
    // happened between the baseline and the first sample (the fragment phase).
    let reference: Option<VmCounters> = baseline
        .as_ref()
        .and_then(|b| b.vmstat.clone())
        .or_else(|| samples.first().and_then(|s| s.snapshot.vmstat.clone()));
    let first_offset: Option<VmCounters> =
        match (samples.first().and_then(|s| s.snapshot.vmstat.as_ref()), reference.as_ref()) {
            (Some(first), Some(r)) => Some(first.delta(r)),
            _ => None,
        };
    let mut timeline = Vec::new();
    if let Some(b) = baseline {
        let zero = b.vmstat.as_ref().map(|v| v.delta(v));
        timeline.push(TimedSnapshot {
            t: t(b.monotonic_ns),
            snapshot: b,
            counters: zero,
            source: "baseline",
        });
    }
    for s in samples {
        let counters = match (&s.vmstat_delta, &first_offset) {
            (Some(d), Some(off)) => Some(add(d, off)),
            (Some(d), None) => Some(d.clone()),
            (None, _) => None,
        };
        timeline.push(TimedSnapshot {
            t: t(s.snapshot.monotonic_ns),
            snapshot: s.snapshot,
            counters,
            source: "sample",
        });
    }
    if let Some(f) = final_ {
        let counters = match (&f.vmstat, &reference) {
            (Some(v), Some(r)) => Some(v.delta(r)),
            _ => None,
        };
        timeline.push(TimedSnapshot { t: t(f.monotonic_ns), snapshot: f, counters, source: "final" });
    }
    timeline.sort_by(|a, b| a.t.total_cmp(&b.t));

    let phases = info
        .phases
        .iter()
        .map(|p| Phase {
            name: p.name.clone(),
            start: t(p.start_ns),
            end: t(p.end_ns.max(p.start_ns)),
            workload: p.workload.clone(),
        })
        .collect();
    Ok(RunData { dir: dir.to_path_buf(), info, workloads, timeline, phases, failures, t0_ns, notes })
}

fn add(a: &VmCounters, b: &VmCounters) -> VmCounters {
    let mut values = a.values.clone();
    for (k, v) in &b.values {
        *values.entry(k.clone()).or_default() += v;
    }
    VmCounters { values }
}
