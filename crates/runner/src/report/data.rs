//! A results directory read back: run.json, workloads.json, probe.jsonl, baseline.json, final.json
//! and alloc_failures.jsonl, put on one time axis (seconds since the run's first phase, from the
//! monotonic clock every file shares).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fraglab_probe::snapshot::{Sample, Snapshot};
use fraglab_probe::tracefs::AllocFailure;
use fraglab_probe::vmstat::VmCounters;
use serde::Deserialize;
use serde_json::Value;

use crate::workload::result::WorkloadResult;

/// run.json as the report needs it; every field optional so an incomplete run still reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct RunInfo {
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub verdict: Option<String>,
    pub reason: String,
    pub kernel_release: String,
    pub kernel_cmdline: String,
    pub host: String,
    pub fraglab_version: String,
    pub config_path: String,
    pub started: String,
    pub finished: Option<String>,
    pub phases: Vec<PhaseInfo>,
    pub fragment: Option<Value>,
    pub sysctls_restored: Vec<String>,
    pub errors: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PhaseInfo {
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// One entry of workloads.json.
#[derive(Clone, Debug, Deserialize)]
pub struct WorkloadRow {
    pub point: String,
    #[serde(default)]
    pub sysctls: Vec<(String, String)>,
    pub iteration: u32,
    pub index: usize,
    pub result: Value,
}

impl WorkloadRow {
    pub fn typed(&self) -> Option<WorkloadResult> {
        serde_json::from_value(self.result.clone()).ok()
    }

    pub fn kind(&self) -> &str {
        self.result["kind"].as_str().unwrap_or("?")
    }
}

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
}

pub struct RunData {
    pub dir: PathBuf,
    pub info: RunInfo,
    pub workloads: Vec<WorkloadRow>,
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

    /// The phase in which `(point, iteration, index)` ran: `workload <kind> <point> #<iteration> <index+1>`.
    pub fn workload_phase(&self, w: &WorkloadRow) -> Option<&Phase> {
        let suffix = format!(" {} #{} {}", w.point, w.iteration, w.index + 1);
        self.phases.iter().find(|p| p.name.starts_with("workload ") && p.name.ends_with(&suffix))
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not what fraglab run writes", path.display()))
}

/// JSON lines; a line that does not parse (a run killed mid-write) becomes a note, not an error.
fn read_lines<T: serde::de::DeserializeOwned>(path: &Path, notes: &mut Vec<String>) -> Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(e) => bad.push(format!("{}:{}: {e}", path.display(), i + 1)),
        }
    }
    if !bad.is_empty() {
        notes.push(format!("{} unreadable line(s) skipped, first: {}", bad.len(), bad[0]));
    }
    Ok(out)
}

/// Read a results directory.
pub fn load(dir: &Path) -> Result<RunData> {
    crate::results::require_results_dir(dir)?;
    let run_json = dir.join("run.json");
    let info: RunInfo = read_json(&run_json)?;
    let mut notes = Vec::new();
    let workloads: Vec<WorkloadRow> = if dir.join("workloads.json").exists() {
        read_json(&dir.join("workloads.json"))?
    } else {
        Vec::new()
    };
    let samples: Vec<Sample> = read_lines(&dir.join("probe.jsonl"), &mut notes)?;
    let mut failures: Vec<AllocFailure> = read_lines(&dir.join("alloc_failures.jsonl"), &mut notes)?;
    fraglab_probe::tracefs::fill_unknown_comms(&mut failures);
    let optional = |file: &str, notes: &mut Vec<String>| -> Option<Snapshot> {
        let p = dir.join(file);
        if !p.exists() {
            return None;
        }
        match read_json(&p) {
            Ok(s) => Some(s),
            Err(e) => {
                notes.push(format!("{e:#}"));
                None
            }
        }
    };
    let baseline = optional("baseline.json", &mut notes);
    let final_ = optional("final.json", &mut notes);
    if samples.is_empty() {
        notes.push(format!(
            "{} has no samples: the run ended before its monitors started",
            dir.join("probe.jsonl").display()
        ));
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
        .map(|p| Phase { name: p.name.clone(), start: t(p.start_ns), end: t(p.end_ns.max(p.start_ns)) })
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
