//! `fraglab compare`: the statistics and the comparison model. Results directories are read back
//! (run.json, workloads.json, alloc_failures.jsonl, baseline.json/final.json or probe.jsonl), checked
//! to measure the same thing, and turned into a [`Comparison`] that `commands::compare` renders as
//! text, markdown or JSON.
//!
//! Every workload metric at every sweep point (key: point label, workload index, kind) gets, per run,
//! n, mean and sample standard deviation over the iterations; against the first (baseline) run, the
//! % change, Welch's t-test (two-sided, Welch–Satterthwaite degrees of freedom, statrs' Student-t)
//! and mmtests' significance ratio: |difference| / (sum of the two 95% confidence-interval
//! half-widths), significant above 1.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::summary::{mean_stddev, metric};

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

/// One side of a comparison: n, mean and sample standard deviation of its iterations.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Stats {
    pub n: usize,
    pub mean: f64,
    pub stddev: f64,
}

impl Stats {
    pub fn of(values: &[f64]) -> Stats {
        let (mean, stddev) = mean_stddev(values);
        Stats { n: values.len(), mean, stddev }
    }
}

/// Student's t quantile `q` with `df` degrees of freedom.
fn t_quantile(q: f64, df: f64) -> f64 {
    StudentsT::new(0.0, 1.0, df).expect("df > 0 is checked by the callers").inverse_cdf(q)
}

/// Half-width of the two-sided 95% confidence interval of the mean, t(0.975, n−1) · s / √n (what
/// mmtests' `calc_confidence_interval` computes). None below two samples: there is no spread.
pub fn ci95_half_width(s: &Stats) -> Option<f64> {
    if s.n < 2 {
        return None;
    }
    Some(t_quantile(0.975, (s.n - 1) as f64) * s.stddev / (s.n as f64).sqrt())
}

/// Welch's unequal-variances t-test of `new` against `base`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Welch {
    /// (mean_new − mean_base) / √(s²_base/n_base + s²_new/n_new).
    pub t: f64,
    /// Welch–Satterthwaite degrees of freedom (not rounded, as scipy and R compute it).
    pub df: f64,
    /// Two-sided p-value: 2 · P(T_df > |t|).
    pub p: f64,
}

/// None when either side has fewer than two samples, or neither has any spread (t is undefined).
pub fn welch(base: &Stats, new: &Stats) -> Option<Welch> {
    if base.n < 2 || new.n < 2 {
        return None;
    }
    let vb = base.stddev.powi(2) / base.n as f64;
    let vn = new.stddev.powi(2) / new.n as f64;
    let v = vb + vn;
    if v <= 0.0 {
        return None;
    }
    let t = (new.mean - base.mean) / v.sqrt();
    let df = v * v / (vb * vb / (base.n - 1) as f64 + vn * vn / (new.n - 1) as f64);
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    let p = (2.0 * dist.sf(t.abs())).min(1.0);
    Some(Welch { t, df, p })
}

/// mmtests' rule (`cidiff`): |mean_new − mean_base| / (half-width_base + half-width_new) of the 95%
/// confidence intervals; above 1 the intervals are further apart than their combined widths and the
/// change is marked significant. None below two samples on either side. With no spread on either
/// side the ratio is 0 for equal means and infinite otherwise.
pub fn ci_ratio(base: &Stats, new: &Stats) -> Option<f64> {
    let sum = ci95_half_width(base)? + ci95_half_width(new)?;
    let diff = (new.mean - base.mean).abs();
    if sum > 0.0 {
        Some(diff / sum)
    } else if diff == 0.0 {
        Some(0.0)
    } else {
        Some(f64::INFINITY)
    }
}

/// % change of `new` against `base`; None when the baseline is 0 and the new value is not.
pub fn pct_change(base: f64, new: f64) -> Option<f64> {
    if base == 0.0 {
        return (new == 0.0).then_some(0.0);
    }
    Some((new - base) / base.abs() * 100.0)
}

// ---------------------------------------------------------------------------------------------
// Reading a results directory
// ---------------------------------------------------------------------------------------------

/// The counters whose change over a run tells how hard the kernel compacted.
pub const COMPACTION_COUNTERS: [&str; 3] = ["compact_stall", "compact_fail", "compact_success"];

/// One results directory, read.
#[derive(Clone, Debug)]
pub struct RunData {
    /// `A`, `B`, ... or the user's `--labels`.
    pub label: String,
    pub dir: PathBuf,
    /// run.json.
    pub run: Value,
    /// workloads.json (empty when the run had no workload).
    pub workloads: Vec<Value>,
    /// alloc_failures.jsonl, failed allocations only.
    pub failures: Vec<Value>,
    /// run.json's config text, parsed.
    pub config: toml::Table,
    /// Counter deltas over the run and where they came from.
    pub compaction: Option<(String, BTreeMap<String, i64>)>,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

fn vmstat_counters(snapshot: &Value) -> Option<BTreeMap<String, i64>> {
    let values = snapshot["vmstat"]["values"].as_object()?;
    let out: BTreeMap<String, i64> = COMPACTION_COUNTERS
        .iter()
        .filter_map(|c| values.get(*c).and_then(|v| v.as_i64()).map(|v| (c.to_string(), v)))
        .collect();
    (!out.is_empty()).then_some(out)
}

fn deltas(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    before.iter().filter_map(|(k, b)| after.get(k).map(|a| (k.clone(), a - b))).collect()
}

impl RunData {
    pub fn load(dir: &Path, label: &str) -> Result<RunData> {
        crate::results::require_results_dir(dir)?;
        let run = read_json(&dir.join("run.json"))?;
        let workloads = if dir.join("workloads.json").exists() {
            match read_json(&dir.join("workloads.json"))? {
                Value::Array(a) => a,
                _ => bail!("{}: workloads.json is not a list", dir.display()),
            }
        } else {
            Vec::new()
        };
        let mut failures = Vec::new();
        let path = dir.join("alloc_failures.jsonl");
        for (i, line) in std::fs::read_to_string(&path).unwrap_or_default().lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not a JSON line", path.display(), i + 1))?;
            // The catcher records failures only, unless asked for successes too.
            if v["failed"].as_bool().unwrap_or(true) {
                failures.push(v);
            }
        }
        let text = run["config"].as_str().unwrap_or_default();
        let config: toml::Table = toml::from_str(text)
            .with_context(|| format!("{}: the config stored in run.json does not parse", dir.display()))?;
        Ok(RunData {
            label: label.to_string(),
            dir: dir.to_path_buf(),
            compaction: compaction(dir)?,
            run,
            workloads,
            failures,
            config,
        })
    }

    /// The [fragment] this run applied, judged by what it did rather than by its config text:
    /// None when run.json's `fragment` (the fragmenter's status) is null — `fraglab run --baseline`
    /// keeps [fragment] in the stored config but never fragments, and neither does a config without
    /// [fragment] or a run stopped before the fragment phase. When it did fragment, the config's
    /// [fragment] table names what was applied: the status's own numbers (a whole-machine target's
    /// free bytes, held bytes, timestamps) differ from run to run of one config.
    pub fn applied_fragment(&self) -> Option<&toml::Value> {
        if self.run["fragment"].is_null() {
            None
        } else {
            self.config.get("fragment")
        }
    }

    fn str(&self, key: &str) -> &str {
        self.run[key].as_str().unwrap_or("?")
    }

    /// `A (results/quickstart-…)`, for messages.
    fn named(&self) -> String {
        format!("{} ({})", self.label, self.dir.display())
    }
}

/// Compaction counter deltas: final.json − baseline.json, else the last probe.jsonl line − the first.
fn compaction(dir: &Path) -> Result<Option<(String, BTreeMap<String, i64>)>> {
    let (b, f) = (dir.join("baseline.json"), dir.join("final.json"));
    if b.exists() && f.exists() {
        if let (Some(before), Some(after)) =
            (vmstat_counters(&read_json(&b)?), vmstat_counters(&read_json(&f)?))
        {
            return Ok(Some(("baseline.json → final.json".into(), deltas(&before, &after))));
        }
    }
    let probe = dir.join("probe.jsonl");
    let Ok(text) = std::fs::read_to_string(&probe) else { return Ok(None) };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let (Some(first), Some(last)) = (lines.next(), lines.next_back()) else { return Ok(None) };
    let parse = |l: &str| serde_json::from_str::<Value>(l).ok().as_ref().and_then(vmstat_counters);
    Ok(match (parse(first), parse(last)) {
        (Some(before), Some(after)) => {
            Some(("probe.jsonl, first → last sample".into(), deltas(&before, &after)))
        }
        _ => None,
    })
}

// ---------------------------------------------------------------------------------------------
// What must match: [[workload]] and [sweep]
// ---------------------------------------------------------------------------------------------

/// A [[workload]] table as the run resolved it: its kind and every option with defaults filled in
/// (so `threads = 2` written out and left to its default compare equal); the raw table when this
/// fraglab does not know the kind.
fn resolved_workload(table: &toml::Value) -> (String, serde_json::Map<String, Value>) {
    let mut options = serde_json::to_value(table).unwrap_or(Value::Null);
    let kind = options.as_object_mut().and_then(|o| o.remove("kind"));
    let kind = kind.as_ref().and_then(|k| k.as_str()).unwrap_or("?").to_string();
    let resolved = crate::runplan::kind_from_options(&kind, &options)
        .map(|k| crate::runplan::kind_options(&k))
        .unwrap_or(options);
    (kind, resolved.as_object().cloned().unwrap_or_default())
}

fn show(v: Option<&Value>) -> String {
    match v {
        None => "absent".into(),
        Some(Value::String(s)) => format!("{s:?}"),
        Some(v) => v.to_string(),
    }
}

/// What `other` measures that `base` does not, in the config's own terms; empty when they agree.
pub fn config_differences(base: &RunData, other: &RunData) -> Vec<String> {
    let (a, b) = (&base.label, &other.label);
    let workloads = |r: &RunData| -> Vec<(String, serde_json::Map<String, Value>)> {
        match r.config.get("workload") {
            Some(toml::Value::Array(list)) => list.iter().map(resolved_workload).collect(),
            _ => Vec::new(),
        }
    };
    let (wa, wb) = (workloads(base), workloads(other));
    let mut out = Vec::new();
    if wa.len() != wb.len() {
        let kinds = |w: &[(String, _)]| w.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", ");
        out.push(format!(
            "[[workload]]: {} in {a} ({}) vs {} in {b} ({})",
            wa.len(),
            kinds(&wa),
            wb.len(),
            kinds(&wb)
        ));
    }
    for (i, ((ka, oa), (kb, ob))) in wa.iter().zip(&wb).enumerate() {
        if ka != kb {
            out.push(format!("[[workload]] #{} kind: {ka:?} in {a} vs {kb:?} in {b}", i + 1));
            continue;
        }
        let keys: BTreeSet<&String> = oa.keys().chain(ob.keys()).collect();
        for k in keys {
            if oa.get(k) != ob.get(k) {
                out.push(format!(
                    "[[workload]] #{} ({ka}) {k}: {} in {a} vs {} in {b}",
                    i + 1,
                    show(oa.get(k)),
                    show(ob.get(k))
                ));
            }
        }
    }
    let sweep = |r: &RunData| -> BTreeMap<String, Value> {
        let mut m = BTreeMap::new();
        if let Some(toml::Value::Table(t)) = r.config.get("sweep") {
            for (k, v) in t {
                match v {
                    toml::Value::Table(sysctls) if k == "sysctl" => {
                        for (name, values) in sysctls {
                            m.insert(
                                format!("sysctl.{name:?}"),
                                serde_json::to_value(values).unwrap_or(Value::Null),
                            );
                        }
                    }
                    _ => {
                        m.insert(k.clone(), serde_json::to_value(v).unwrap_or(Value::Null));
                    }
                }
            }
        }
        m
    };
    let (sa, sb) = (sweep(base), sweep(other));
    let keys: BTreeSet<&String> = sa.keys().chain(sb.keys()).collect();
    for k in keys {
        if sa.get(k) != sb.get(k) {
            out.push(format!("[sweep] {k}: {} in {a} vs {} in {b}", show(sa.get(k)), show(sb.get(k))));
        }
    }
    out
}

/// Refuse runs that do not measure the same thing.
pub fn check_configs(runs: &[RunData]) -> Result<()> {
    let mut diffs = Vec::new();
    for other in &runs[1..] {
        let d = config_differences(&runs[0], other);
        if !d.is_empty() {
            diffs.push(format!("{} vs {}:", runs[0].named(), other.named()));
            diffs.extend(d.into_iter().map(|l| format!("  {l}")));
        }
    }
    if diffs.is_empty() {
        return Ok(());
    }
    bail!(
        "these runs measure different things and cannot be compared: their [[workload]] or [sweep] \
         differ (only [fragment], [run], [probe], [expect] and the kernel may differ)\n{}",
        diffs.join("\n")
    )
}

/// Warnings and notes about what the comparison compares: kernels, memory states or just runs.
fn context(runs: &[RunData]) -> (Vec<String>, Vec<String>) {
    let (mut warnings, mut notes) = (Vec::new(), Vec::new());
    let base = &runs[0];
    for r in runs {
        if r.str("status") != "complete" {
            warnings.push(format!(
                "{} is {}, not complete: {}",
                r.named(),
                r.str("status"),
                r.run["reason"].as_str().unwrap_or("")
            ));
        }
    }
    for other in &runs[1..] {
        let pair = format!("{} and {}", base.label, other.label);
        let same_release = base.str("kernel_release") == other.str("kernel_release");
        let same_host = base.str("host") == other.str("host");
        let same_cmdline = base.str("kernel_cmdline") == other.str("kernel_cmdline");
        let same_fragment = base.applied_fragment() == other.applied_fragment();
        if same_release && same_host && same_cmdline {
            if same_fragment {
                warnings.push(format!(
                    "{pair}: same kernel on both sides: this compares runs, not kernels ({} on {}, {})",
                    base.str("kernel_release"),
                    base.str("host"),
                    if base.applied_fragment().is_some() { "same [fragment]" } else { "neither fragmented" }
                ));
            } else {
                notes.push(format!(
                    "{pair}: same kernel ({} on {}), different [fragment]: this compares memory states, not kernels",
                    base.str("kernel_release"),
                    base.str("host")
                ));
            }
        } else if same_release && same_host {
            notes.push(format!(
                "{pair}: same kernel release {} on {}, booted with different command lines",
                base.str("kernel_release"),
                base.str("host")
            ));
        } else if !same_release && !same_host {
            warnings.push(format!(
                "{pair}: different kernels on different hosts ({} on {} vs {} on {}): a difference may \
                 come from the machine, not the kernel",
                base.str("kernel_release"),
                base.str("host"),
                other.str("kernel_release"),
                other.str("host")
            ));
        } else if !same_release {
            notes.push(format!(
                "{pair}: kernel {} vs {} on {}",
                base.str("kernel_release"),
                other.str("kernel_release"),
                base.str("host")
            ));
        } else {
            notes.push(format!(
                "{pair}: same kernel {} on different hosts ({} vs {}): this compares machines",
                base.str("kernel_release"),
                base.str("host"),
                other.str("host")
            ));
        }
        if !(same_fragment || same_release && same_host && same_cmdline) {
            notes.push(format!("{pair}: [fragment] differs too"));
        }
        if base.str("fraglab_version") != other.str("fraglab_version") {
            notes.push(format!(
                "{pair}: fraglab {} vs {}",
                base.str("fraglab_version"),
                other.str("fraglab_version")
            ));
        }
        if catch_min_order(base) != catch_min_order(other) {
            notes.push(format!(
                "{pair}: the failure catcher caught orders ≥ {} vs ≥ {}: failed allocations by order are \
                 not comparable below the higher one",
                catch_min_order(base),
                catch_min_order(other)
            ));
        }
    }
    (warnings, notes)
}

fn catch_min_order(r: &RunData) -> i64 {
    r.config.get("probe").and_then(|p| p.get("catch_min_order")).and_then(|v| v.as_integer()).unwrap_or(1)
}

// ---------------------------------------------------------------------------------------------
// The comparison model
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The first run's label: every % change and test is against it.
    pub baseline: String,
    pub runs: Vec<RunInfo>,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
    /// One row per (sweep point, workload, metric), in the order the runs ran them.
    pub metrics: Vec<MetricRow>,
    /// Per run, in run order.
    pub fragment: Vec<FragmentSide>,
    /// Failed allocations caught in the kernel, by order; one count per run.
    pub failures_by_order: Vec<CountRow>,
    /// Workload failures by errno over all points and iterations; one count per run.
    pub errors_by_errno: Vec<CountRow>,
    /// Compaction counter deltas over each run.
    pub compaction: Vec<CounterRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    pub label: String,
    pub dir: String,
    pub name: String,
    pub status: String,
    pub verdict: Option<String>,
    pub reason: String,
    pub kernel_release: String,
    pub host: String,
    pub started: String,
    pub fraglab_version: String,
    /// Where the compaction deltas came from, when they could be read.
    pub compaction_source: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Higher,
    Lower,
}

#[derive(Clone, Debug, Serialize)]
pub struct MetricRow {
    /// The sweep point's label (`-` without a sweep).
    pub point: String,
    /// The workload's index in the config, from 0 as in workloads.json.
    pub index: usize,
    pub kind: String,
    /// `throughput`, `rate`, `successes`, `latency p50`, `latency p99`, `errors ENOMEM`, ...
    pub metric: String,
    pub unit: String,
    pub better: Better,
    /// One per run, in run order; None when that run has no value for this key.
    pub sides: Vec<Option<Side>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub n: usize,
    pub mean: f64,
    pub stddev: f64,
    /// Half-width of the 95% confidence interval of the mean (None below n = 2).
    pub ci95: Option<f64>,
    pub values: Vec<f64>,
    /// Against the baseline; None for the baseline itself, when the baseline has no value, or when
    /// the two are not comparable (`not_comparable` says why).
    pub vs_baseline: Option<VsBaseline>,
    /// Why this value is not set against the baseline's: a trigger's rate and latency count failed
    /// calls too, so when the share of failed calls differs they measure different mixes
    /// (`A: 0 of 30 failed, B: 30 of 30 failed`).
    pub not_comparable: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct VsBaseline {
    /// % change of the mean (None when the baseline mean is 0 and this one is not).
    pub pct: Option<f64>,
    /// Welch's t-test (None below n = 2 on a side, or with no spread on either side).
    pub welch: Option<Welch>,
    /// mmtests' ratio; infinite (null in JSON) when neither side has spread and the means differ.
    pub ci_ratio: Option<f64>,
    /// ci_ratio > 1.
    pub significant: bool,
    /// `better`, `worse` (significant changes only) or `same`.
    pub change: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct FragmentSide {
    pub label: String,
    /// None for a baseline run with no [fragment].
    pub target: Option<Value>,
    /// `no free block of order ≥ 4 (64K), 480.00 MiB free below it`, `profile of zone Normal: …`, `none (not fragmented)`.
    pub target_text: String,
    pub budget: Option<u64>,
    pub held_bytes: Option<u64>,
    pub freed_bytes: Option<u64>,
    /// Free blocks the cut made, per order.
    pub planned: Vec<u64>,
    /// Of those, still free blocks at the end of the run.
    pub intact: Vec<u64>,
    /// Free blocks the target asked for that could not be made.
    pub missing: Vec<u64>,
    pub moved_pages: Option<u64>,
    pub target_lost: Option<String>,
    /// What the keeper did while holding, in words (runs recorded before the keeper: None).
    pub keeping: Option<String>,
    /// Workload windows whose target held, of those recorded.
    pub windows_held: Option<(usize, usize)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CountRow {
    pub key: String,
    pub counts: Vec<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CounterRow {
    pub counter: String,
    /// Final − baseline per run; None when the run's snapshots lack the counter.
    pub deltas: Vec<Option<i64>>,
}

/// (point, workload index, kind): what a metric is measured at.
type Key = (String, usize, String);

/// The metrics of one workload result: (name, unit, better, value).
fn metrics_of(result: &Value) -> Vec<(String, String, Better, f64)> {
    let (value, unit) = metric(result);
    let name = match unit {
        "Mbit/s" => "throughput",
        "ops/s" => "rate",
        _ => "successes",
    };
    let mut out = vec![(name.to_string(), unit.to_string(), Better::Higher, value)];
    for p in ["p50", "p99"] {
        if let Some(v) = result["latency_us"][p].as_f64() {
            out.push((format!("latency {p}"), "µs".into(), Better::Lower, v));
        }
    }
    out
}

fn errno_counts(result: &Value) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for e in result["errors"].as_array().into_iter().flatten() {
        *m.entry(e["errno"].as_str().unwrap_or("?").to_string()).or_default() +=
            e["count"].as_u64().unwrap_or(0);
    }
    m
}

fn run_info(r: &RunData) -> RunInfo {
    RunInfo {
        label: r.label.clone(),
        dir: r.dir.display().to_string(),
        name: r.str("name").into(),
        status: r.str("status").into(),
        verdict: r.run["verdict"].as_str().map(String::from),
        reason: r.run["reason"].as_str().unwrap_or("").into(),
        kernel_release: r.str("kernel_release").into(),
        host: r.str("host").into(),
        started: r.str("started").into(),
        fraglab_version: r.str("fraglab_version").into(),
        compaction_source: r.compaction.as_ref().map(|(s, _)| s.clone()),
    }
}

/// A fragment target (run.json's `fragment.target`) in words, as the run's summary says it
/// ([`crate::describe::target`]); one this fraglab cannot read (another version's) as its JSON.
pub fn target_text(t: &Value) -> String {
    serde_json::from_value::<fraglab_fragmenter::Target>(t.clone())
        .map_or_else(|_| t.to_string(), |t| crate::describe::target(&t))
}

fn fragment_side(r: &RunData) -> FragmentSide {
    let f = &r.run["fragment"];
    let list = |v: &Value| -> Vec<u64> {
        v.as_array().map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect()).unwrap_or_default()
    };
    let target = f.get("target").cloned().filter(|t| !t.is_null());
    let target_text = target.as_ref().map_or_else(|| "none (not fragmented)".to_string(), target_text);
    FragmentSide {
        label: r.label.clone(),
        target,
        target_text,
        budget: f["budget"].as_u64(),
        held_bytes: f["held_bytes"].as_u64(),
        freed_bytes: f["freed_bytes"].as_u64(),
        planned: list(&f["planned"]),
        intact: list(&f["intact"]),
        missing: list(&f["missing"]),
        moved_pages: f["moved_pages"].as_u64(),
        target_lost: f["target_lost"].as_str().map(String::from),
        keeping: serde_json::from_value::<fraglab_fragmenter::keeper::Keeping>(f["keeping"].clone())
            .ok()
            .map(|k| crate::describe::keeping(&k)),
        windows_held: {
            let judged: Vec<bool> =
                r.workloads.iter().filter_map(|w| w["target"]["held"].as_bool()).collect();
            (!judged.is_empty()).then(|| (judged.iter().filter(|&&h| h).count(), judged.len()))
        },
    }
}

fn side(values: &[f64], base: Option<&Stats>, better: Better, not_comparable: Option<String>) -> Side {
    let s = Stats::of(values);
    let vs_baseline = base.filter(|_| not_comparable.is_none()).map(|b| {
        let ratio = ci_ratio(b, &s);
        let significant = ratio.is_some_and(|r| r > 1.0);
        let up = s.mean > b.mean;
        let change = if !significant {
            "same"
        } else if up == (better == Better::Higher) {
            "better"
        } else {
            "worse"
        };
        VsBaseline {
            pct: pct_change(b.mean, s.mean),
            welch: welch(b, &s),
            ci_ratio: ratio,
            significant,
            change: change.into(),
        }
    });
    Side {
        n: s.n,
        mean: s.mean,
        stddev: s.stddev,
        ci95: ci95_half_width(&s),
        values: values.to_vec(),
        vs_baseline,
        not_comparable,
    }
}

/// Whether a workload kind's rate and latency count its failed operations too. A trigger times
/// every call and reports calls per second (workload/trigger.rs), and a failed call — ENOMEM once
/// the allocation gives up — returns in a fraction of the time a successful one takes. The network
/// workloads count and time successful operations only, so fewer of them per second is a real
/// change.
pub fn counts_failed_ops(kind: &str) -> bool {
    kind.starts_with("trigger ")
}

/// (operations that succeeded, operations that failed) over every iteration.
type Tally = (u64, u64);

/// `A: 0 of 30 failed, B: 30 of 30 failed` when the share of failed operations differs.
fn failure_difference(base: (&str, Tally), other: (&str, Tally)) -> Option<String> {
    let ((la, (oka, fa)), (lb, (okb, fb))) = (base, other);
    let (ta, tb) = (oka + fa, okb + fb);
    // fa/ta ≠ fb/tb, in integers; a side that made no call at all differs from one that did.
    let differs = if ta == 0 || tb == 0 {
        ta != tb
    } else {
        u128::from(fa) * u128::from(tb) != u128::from(fb) * u128::from(ta)
    };
    differs.then(|| format!("{la}: {fa} of {ta} failed, {lb}: {fb} of {tb} failed"))
}

/// Check the runs measure the same thing, then compare every run against the first.
pub fn compare(runs: &[RunData]) -> Result<Comparison> {
    if runs.len() < 2 {
        bail!("compare needs at least two results directories");
    }
    check_configs(runs)?;
    let (mut warnings, mut notes) = context(runs);

    // Keys in the order the runs ran them: the baseline's first, then any only others have.
    let mut keys: Vec<Key> = Vec::new();
    // key → metric name → (unit, better) in first-seen order
    let mut names: BTreeMap<Key, Vec<(String, String, Better)>> = BTreeMap::new();
    // run → key → metric name → values
    let mut values: Vec<BTreeMap<Key, BTreeMap<String, Vec<f64>>>> = vec![BTreeMap::new(); runs.len()];
    let mut errnos: BTreeMap<Key, BTreeSet<String>> = BTreeMap::new();
    // run → key → (ok, failed)
    let mut tallies: Vec<BTreeMap<Key, Tally>> = vec![BTreeMap::new(); runs.len()];
    for r in runs {
        for w in &r.workloads {
            let key = (
                w["point"].as_str().unwrap_or("-").to_string(),
                w["index"].as_u64().unwrap_or(0) as usize,
                w["result"]["kind"].as_str().unwrap_or("?").to_string(),
            );
            if !keys.contains(&key) {
                keys.push(key.clone());
            }
            let seen = names.entry(key.clone()).or_default();
            for (name, unit, better, _) in metrics_of(&w["result"]) {
                if !seen.iter().any(|(n, ..)| *n == name) {
                    seen.push((name, unit, better));
                }
            }
            errnos.entry(key).or_default().extend(errno_counts(&w["result"]).into_keys());
        }
    }
    for (i, r) in runs.iter().enumerate() {
        for w in &r.workloads {
            let key = (
                w["point"].as_str().unwrap_or("-").to_string(),
                w["index"].as_u64().unwrap_or(0) as usize,
                w["result"]["kind"].as_str().unwrap_or("?").to_string(),
            );
            let t = tallies[i].entry(key.clone()).or_default();
            t.0 += w["result"]["ok"].as_u64().unwrap_or(0);
            t.1 += w["result"]["failed"].as_u64().unwrap_or(0);
            let per = values[i].entry(key.clone()).or_default();
            for (name, _, _, v) in metrics_of(&w["result"]) {
                per.entry(name).or_default().push(v);
            }
            // Every iteration counts each errno seen anywhere at this key, 0 when it did not fail so.
            let counts = errno_counts(&w["result"]);
            for e in &errnos[&key] {
                per.entry(format!("errors {e}"))
                    .or_default()
                    .push(counts.get(e).copied().unwrap_or(0) as f64);
            }
        }
    }
    // Workload order: by index, then point in run order, so one workload's points sit together.
    let point_order: Vec<String> = keys.iter().fold(Vec::new(), |mut v, (p, ..)| {
        if !v.contains(p) {
            v.push(p.clone());
        }
        v
    });
    keys.sort_by_key(|(p, i, k)| (*i, k.clone(), point_order.iter().position(|x| x == p)));

    let mut metrics = Vec::new();
    for key in &keys {
        // Per run, how its failed operations differ from the baseline's: said once per workload
        // and point, and a trigger's rate and latency rows are then not compared.
        let differs: Vec<Option<String>> = (0..runs.len())
            .map(|i| {
                let (Some(a), Some(b)) = (tallies[0].get(key), tallies[i].get(key)) else { return None };
                failure_difference((&runs[0].label, *a), (&runs[i].label, *b)).filter(|_| i > 0)
            })
            .collect();
        let what = format!("#{} {} at point {}", key.1 + 1, key.2, key.0);
        for d in differs.iter().flatten() {
            if counts_failed_ops(&key.2) {
                warnings.push(format!(
                    "{what}: {d}: its rate and latency count failed calls too, and a failed call returns \
                     early, so they are not compared (see its errors rows)"
                ));
            } else {
                notes.push(format!(
                    "{what}: {d}; its rate and latency count successful operations only and are compared"
                ));
            }
        }
        let mut list = names[key].clone();
        list.extend(errnos[key].iter().map(|e| (format!("errors {e}"), "count".to_string(), Better::Lower)));
        for (name, unit, better) in list {
            let sample = |i: usize| values[i].get(key).and_then(|m| m.get(&name)).filter(|v| !v.is_empty());
            let base = sample(0).map(|v| Stats::of(v));
            let mixed = counts_failed_ops(&key.2) && !name.starts_with("errors ");
            let sides = (0..runs.len())
                .map(|i| {
                    let why = differs[i].clone().filter(|_| mixed);
                    sample(i).map(|v| side(v, if i == 0 { None } else { base.as_ref() }, better, why))
                })
                .collect();
            metrics.push(MetricRow {
                point: key.0.clone(),
                index: key.1,
                kind: key.2.clone(),
                metric: name,
                unit,
                better,
                sides,
            });
        }
    }

    let mut orders: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut by_errno: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        for f in &r.failures {
            orders.entry(f["order"].as_u64().unwrap_or(0)).or_insert_with(|| vec![0; runs.len()])[i] += 1;
        }
        for w in &r.workloads {
            for (e, n) in errno_counts(&w["result"]) {
                by_errno.entry(e).or_insert_with(|| vec![0; runs.len()])[i] += n;
            }
        }
    }
    let compaction = COMPACTION_COUNTERS
        .iter()
        .map(|c| CounterRow {
            counter: c.to_string(),
            deltas: runs
                .iter()
                .map(|r| r.compaction.as_ref().and_then(|(_, d)| d.get(*c).copied()))
                .collect(),
        })
        .collect();

    Ok(Comparison {
        baseline: runs[0].label.clone(),
        runs: runs.iter().map(run_info).collect(),
        warnings,
        notes,
        metrics,
        fragment: runs.iter().map(fragment_side).collect(),
        failures_by_order: orders
            .into_iter()
            .map(|(o, counts)| CountRow { key: o.to_string(), counts })
            .collect(),
        errors_by_errno: by_errno.into_iter().map(|(e, counts)| CountRow { key: e, counts }).collect(),
        compaction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1e-300)
    }

    // Reference values computed with scipy 1.17.1 (Python 3.11):
    //   from scipy import stats; import numpy as np
    //   r = stats.ttest_ind(new, base, equal_var=False)             # t, p
    //   va, vb = base.var(ddof=1)/len(base), new.var(ddof=1)/len(new)
    //   df = (va+vb)**2 / (va**2/(len(base)-1) + vb**2/(len(new)-1))
    //   h = stats.t.ppf(0.975, n-1) * s / np.sqrt(n)                # 95% CI half-width per side
    //   ratio = (new.mean() - base.mean()) / (h_base + h_new)

    /// Seed 000's wall-clock times for the sctp_test, normal vs fragmented memory.
    /// By hand: s²_a = 0.5670543, s²_b = 0.7171690; s²/n = 0.1890181 and 0.2390563, sum 0.4280744,
    /// √ = 0.6542740; Δ = 15.079 − 15.0873333 = −0.0083333; t = −0.0083333 / 0.6542740 = −0.012737.
    /// df = 0.4280744² / (0.1890181²/2 + 0.2390563²/2) = 0.1832477 / 0.0464382 = 3.94608.
    /// scipy: t = −0.012736764037111846, p = 0.9904556728256093, df = 3.9460823097584568;
    /// half-widths 1.8706304725071614 and 2.103712668463302 (t(0.975, 2) = 4.302652729749462).
    #[test]
    fn failure_difference_counts_shares_and_empty_sides() {
        assert_eq!(failure_difference(("A", (30, 0)), ("B", (60, 0))), None);
        assert_eq!(failure_difference(("A", (5, 5)), ("B", (10, 10))), None);
        assert_eq!(
            failure_difference(("A", (30, 0)), ("B", (0, 30))).as_deref(),
            Some("A: 0 of 30 failed, B: 30 of 30 failed")
        );
        // A side that made no call cannot share the other's failure rate.
        assert!(failure_difference(("A", (0, 0)), ("B", (5, 5))).is_some());
        assert_eq!(failure_difference(("A", (0, 0)), ("B", (0, 0))), None);
    }

    #[test]
    fn welch_seed_000_timings() {
        let a = Stats::of(&[14.715, 14.593, 15.954]);
        let b = Stats::of(&[14.159, 15.252, 15.826]);
        assert!(close(a.stddev, 0.753030101213314, 1e-12), "{a:?}");
        let w = welch(&a, &b).unwrap();
        assert!(close(w.t, -0.012736764037111846, 1e-9), "{w:?}");
        assert!(close(w.df, 3.9460823097584568, 1e-9), "{w:?}");
        assert!(close(w.p, 0.9904556728256093, 1e-7), "{w:?}");
        assert!(close(ci95_half_width(&a).unwrap(), 1.8706304725071614, 1e-7));
        assert!(close(ci95_half_width(&b).unwrap(), 2.103712668463302, 1e-7));
        assert!(close(ci_ratio(&a, &b).unwrap(), 0.002096782546888493, 1e-6));
        assert!(close(pct_change(a.mean, b.mean).unwrap(), -0.05523397110158701, 1e-9));
    }

    /// Unequal n, a real difference (seed 004's 1-client numbers with made-up spread):
    /// base 574.93 570.1 580.2 577.0, new 554.42 549.0 560.3.
    /// scipy: t = −5.394580301265442, p = 0.007604784863419019, df = 3.61234568271883;
    /// half-widths 6.739205772523233 (n = 4) and 14.039253963507111 (n = 3);
    /// ratio −1.009900008626702 (|·| > 1: significant); pct −3.645885366217383.
    #[test]
    fn welch_unequal_n_significant() {
        let a = Stats::of(&[574.93, 570.1, 580.2, 577.0]);
        let b = Stats::of(&[554.42, 549.0, 560.3]);
        let w = welch(&a, &b).unwrap();
        assert!(close(w.t, -5.394580301265442, 1e-9), "{w:?}");
        assert!(close(w.df, 3.61234568271883, 1e-9), "{w:?}");
        assert!(close(w.p, 0.007604784863419019, 1e-6), "{w:?}");
        assert!(close(ci95_half_width(&a).unwrap(), 6.739205772523233, 1e-7));
        assert!(close(ci95_half_width(&b).unwrap(), 14.039253963507111, 1e-7));
        let r = ci_ratio(&a, &b).unwrap();
        assert!(close(r, 1.009900008626702, 1e-6), "{r}");
        assert!(close(pct_change(a.mean, b.mean).unwrap(), -3.645885366217383, 1e-9));
    }

    /// One side without spread: df is the other side's n − 1.
    /// base 10 10 10, new 12 11 13 12.5 11.5. scipy: t = 5.65685424949238, df = 4.0,
    /// p = 0.004812678330044224; half-widths 0 and 0.9816215807387786; ratio 2.0374450187767668.
    #[test]
    fn welch_one_side_constant() {
        let a = Stats::of(&[10.0, 10.0, 10.0]);
        let b = Stats::of(&[12.0, 11.0, 13.0, 12.5, 11.5]);
        let w = welch(&a, &b).unwrap();
        assert!(close(w.t, 5.65685424949238, 1e-9), "{w:?}");
        assert!(close(w.df, 4.0, 1e-12), "{w:?}");
        assert!(close(w.p, 0.004812678330044224, 1e-6), "{w:?}");
        assert!(close(ci_ratio(&a, &b).unwrap(), 2.0374450187767668, 1e-6));
    }

    #[test]
    fn degenerate_cases() {
        let one = Stats::of(&[5.0]);
        let flat = Stats::of(&[5.0, 5.0]);
        let flat2 = Stats::of(&[6.0, 6.0]);
        assert_eq!(welch(&one, &flat), None, "n = 1 has no variance");
        assert_eq!(ci_ratio(&one, &flat), None);
        assert_eq!(welch(&flat, &flat2), None, "no spread on either side: t is undefined");
        assert_eq!(ci_ratio(&flat, &flat), Some(0.0));
        assert_eq!(ci_ratio(&flat, &flat2), Some(f64::INFINITY));
        assert_eq!(pct_change(0.0, 0.0), Some(0.0));
        assert_eq!(pct_change(0.0, 3.0), None);
        assert_eq!(pct_change(-2.0, -1.0), Some(50.0));
        // 1 and 3: s = √2, so the half-width is t(0.975, 1) · √2 / √2 = 12.706204736174694 (scipy).
        let two = Stats::of(&[1.0, 3.0]);
        assert!(close(ci95_half_width(&two).unwrap(), 12.706204736174694, 1e-7));
    }

    const CONFIG: &str = "[run]\nname = \"t\"\n[fragment]\nmax_free_order = 4\n\n[[workload]]\nkind = \"tcp-rr\"\nduration = \"1s\"\n\n[sweep]\nclients = [1, 2]\n";

    fn record(point: &str, iteration: u32, ops: f64, p99: u64, enomem: u64) -> Value {
        let errors = if enomem > 0 {
            serde_json::json!([{"errno": "ENOMEM", "code": 12, "count": enomem, "first_seen_s": 0.1}])
        } else {
            serde_json::json!([])
        };
        serde_json::json!({"point": point, "sysctls": [], "iteration": iteration, "index": 0, "result": {
            "kind": "tcp-rr", "ops_per_sec": ops, "ok": 10, "failed": enomem,
            "latency_us": {"count": 10, "mean": 1.0, "min": 1, "p50": 10, "p90": 20, "p99": p99, "p999": p99, "max": p99},
            "errors": errors}})
    }

    fn fake(label: &str, config: &str, kernel: &str, workloads: Vec<Value>) -> RunData {
        RunData {
            label: label.into(),
            dir: PathBuf::from(format!("/results/{label}")),
            run: serde_json::json!({"name": "t", "status": "complete", "verdict": "not-reproduced",
                "reason": "", "kernel_release": kernel, "kernel_cmdline": "quiet", "host": "h",
                "fraglab_version": "0.1.0", "config": config, "started": "now",
                "fragment": {"target": {"kind": "max_free_order", "order": 4, "free_bytes": 1048576},
                    "budget": 2097152, "held_bytes": 1, "freed_bytes": 2, "planned": [4, 4, 4, 4, 0],
                    "intact": [1, 2, 3, 4, 0], "missing": [0, 0, 0, 0, 0], "moved_pages": 0, "target_lost": null}}),
            workloads,
            failures: vec![serde_json::json!({"order": 4, "failed": true})],
            config: toml::from_str(config).unwrap(),
            compaction: Some((
                "baseline.json → final.json".into(),
                BTreeMap::from([("compact_stall".into(), 3)]),
            )),
        }
    }

    #[test]
    fn model_keys_metrics_errnos_and_verdicts() {
        let a = fake(
            "A",
            CONFIG,
            "6.18",
            vec![
                record("clients=1", 1, 100.0, 50, 0),
                record("clients=2", 1, 200.0, 50, 0),
                record("clients=1", 2, 101.0, 52, 0),
                record("clients=2", 2, 201.0, 52, 0),
                record("clients=1", 3, 99.0, 51, 0),
                record("clients=2", 3, 199.0, 51, 0),
            ],
        );
        let b = fake(
            "B",
            CONFIG,
            "6.19",
            vec![
                record("clients=1", 1, 80.0, 50, 2),
                record("clients=2", 1, 200.0, 50, 0),
                record("clients=1", 2, 81.0, 53, 0),
                record("clients=2", 2, 202.0, 52, 0),
                record("clients=1", 3, 79.0, 51, 1),
                record("clients=2", 3, 198.0, 51, 0),
            ],
        );
        let c = compare(&[a, b]).unwrap();
        let rows: Vec<(&str, &str)> =
            c.metrics.iter().map(|m| (m.point.as_str(), m.metric.as_str())).collect();
        assert_eq!(
            rows,
            [
                ("clients=1", "rate"),
                ("clients=1", "latency p50"),
                ("clients=1", "latency p99"),
                ("clients=1", "errors ENOMEM"),
                ("clients=2", "rate"),
                ("clients=2", "latency p50"),
                ("clients=2", "latency p99"),
            ]
        );
        let rate1 = &c.metrics[0];
        let b1 = rate1.sides[1].as_ref().unwrap();
        assert_eq!((b1.n, b1.mean), (3, 80.0));
        let v = b1.vs_baseline.as_ref().unwrap();
        assert!(v.significant && v.change == "worse", "{v:?}");
        assert!((v.pct.unwrap() + 20.0).abs() < 1e-9);
        let rate2 = c.metrics[4].sides[1].as_ref().unwrap().vs_baseline.as_ref().unwrap();
        assert!(!rate2.significant && rate2.change == "same", "{rate2:?}");
        // Errors: every iteration counts, 0 where the errno did not occur; the baseline has only zeros.
        let e = &c.metrics[3];
        assert_eq!(e.sides[0].as_ref().unwrap().values, [0.0, 0.0, 0.0]);
        assert_eq!(e.sides[1].as_ref().unwrap().values, [2.0, 0.0, 1.0]);
        assert_eq!(e.better, Better::Lower);
        assert_eq!(c.errors_by_errno[0].key, "ENOMEM");
        assert_eq!(c.errors_by_errno[0].counts, [0, 3]);
        assert_eq!(c.failures_by_order[0].key, "4");
        assert_eq!(c.failures_by_order[0].counts, [1, 1]);
        assert_eq!(c.compaction[0].deltas, [Some(3), Some(3)]);
        assert_eq!(c.compaction[1].deltas, [None, None]);
        assert_eq!(c.fragment[1].target_text, "no free block of order ≥ 4 (64K), 1.00 MiB free below it");
        // Different kernels on one host: no warning, a note.
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.notes.iter().any(|n| n.contains("kernel 6.18 vs 6.19")), "{:?}", c.notes);
    }

    #[test]
    fn same_kernel_warns_and_fragment_difference_is_noted() {
        let a = fake("A", CONFIG, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let b = fake("B", CONFIG, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let c = compare(&[a.clone(), b]).unwrap();
        assert!(c
            .warnings
            .iter()
            .any(|w| w.contains("same kernel on both sides: this compares runs, not kernels")));
        let unfragmented = CONFIG.replace("[fragment]\nmax_free_order = 4\n", "");
        let b = fake("B", &unfragmented, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let c = compare(&[a, b]).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.notes.iter().any(|n| n.contains("compares memory states")), "{:?}", c.notes);
    }

    /// `fraglab run --baseline` keeps [fragment] in the stored config and writes `"fragment": null`.
    #[test]
    fn a_baseline_run_of_the_same_config_is_a_different_memory_state() {
        let a = fake("A", CONFIG, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        let mut b = fake("B", CONFIG, "6.18", vec![record("clients=1", 1, 1.0, 1, 0)]);
        b.run["fragment"] = Value::Null;
        let c = compare(&[a, b.clone()]).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.notes.iter().any(|n| n.contains("different [fragment]: this compares memory states")));
        assert_eq!(c.fragment[1].target_text, "none (not fragmented)");
        // Two baseline runs: the same memory state, runs compared.
        let mut a = b.clone();
        a.label = "A".into();
        let c = compare(&[a, b]).unwrap();
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("this compares runs, not kernels") && w.contains("neither fragmented")),
            "{:?}",
            c.warnings
        );
    }

    const TRIGGER: &str = "[run]\nname = \"t\"\n[fragment]\nmax_free_order = 4\n\n[[workload]]\nkind = \"trigger\"\ntrigger = \"pipe-resize\"\nbytes = \"64MiB\"\nrepeat = 10\n";

    /// A trigger iteration: `failed` of 10 calls failed with ENOMEM.
    fn trigger(iteration: u32, calls_per_sec: f64, p50: u64, failed: u64) -> Value {
        let errors = if failed > 0 {
            serde_json::json!([{"errno": "ENOMEM", "code": 12, "count": failed, "first_seen_s": 0.01}])
        } else {
            serde_json::json!([])
        };
        serde_json::json!({"point": "-", "sysctls": [], "iteration": iteration, "index": 0, "result": {
            "kind": "trigger pipe-resize", "ops_per_sec": calls_per_sec, "ok": 10 - failed, "failed": failed,
            "latency_us": {"count": 10, "mean": 1.0, "min": 1, "p50": p50, "p90": p50, "p99": p50, "p999": p50, "max": p50},
            "errors": errors, "details": {"calls": 10}}})
    }

    #[test]
    fn trigger_rate_and_latency_are_not_compared_when_the_failed_share_differs() {
        let frag = fake(
            "A",
            TRIGGER,
            "6.18",
            (1..=3).map(|i| trigger(i, 3000.0 + i as f64, 90 + i as u64, 10)).collect(),
        );
        let base = fake(
            "B",
            TRIGGER,
            "6.18",
            (1..=3).map(|i| trigger(i, 900.0 + i as f64, 800 + i as u64, 0)).collect(),
        );
        let c = compare(&[base.clone(), frag.clone()]).unwrap();
        let why = "B: 0 of 30 failed, A: 30 of 30 failed";
        let row = |m: &str| c.metrics.iter().find(|r| r.metric == m).unwrap();
        for m in ["rate", "latency p50", "latency p99"] {
            let s = row(m).sides[1].as_ref().unwrap();
            assert_eq!(s.not_comparable.as_deref(), Some(why), "{m}");
            assert!(s.vs_baseline.is_none(), "{m}: {s:?}");
            assert_eq!(s.n, 3, "the values are still shown");
        }
        // The failure change itself is compared, and said first.
        let e = row("errors ENOMEM").sides[1].as_ref().unwrap();
        assert!(e.not_comparable.is_none());
        assert!(e.vs_baseline.as_ref().unwrap().significant);
        assert!(
            c.warnings.iter().any(|w| w.starts_with("#1 trigger pipe-resize at point -: ")
                && w.contains(why)
                && w.contains("not compared")),
            "{:?}",
            c.warnings
        );
        // The same share of failed calls on both sides: compared as before.
        let frag2 = fake(
            "B",
            TRIGGER,
            "6.19",
            (1..=3).map(|i| trigger(i, 2000.0 + i as f64, 80 + i as u64, 10)).collect(),
        );
        let c = compare(&[frag, frag2]).unwrap();
        assert!(c.metrics.iter().all(|r| r.sides[1].as_ref().unwrap().not_comparable.is_none()));
        let rate = c.metrics[0].sides[1].as_ref().unwrap().vs_baseline.as_ref().unwrap();
        assert!(rate.significant && rate.change == "worse", "{rate:?}");
        assert!(!c.warnings.iter().any(|w| w.contains("failed")), "{:?}", c.warnings);
    }

    #[test]
    fn network_rates_count_successes_and_stay_compared_when_failures_differ() {
        let a = fake("A", CONFIG, "6.18", (1..=3).map(|i| record("clients=1", i, 100.0, 50, 0)).collect());
        let b = fake(
            "B",
            CONFIG,
            "6.18",
            (1..=3).map(|i| record("clients=1", i, 80.0 + i as f64, 50, 2)).collect(),
        );
        let c = compare(&[a, b]).unwrap();
        let rate = c.metrics[0].sides[1].as_ref().unwrap();
        assert!(rate.not_comparable.is_none() && rate.vs_baseline.as_ref().unwrap().significant);
        assert!(
            c.notes
                .iter()
                .any(|n| n.contains("#1 tcp-rr at point clients=1: A: 0 of 30 failed, B: 6 of 36 failed")),
            "{:?}",
            c.notes
        );
    }

    #[test]
    fn configs_that_measure_different_things_are_refused() {
        let a = fake("A", CONFIG, "6.18", vec![]);
        let cases = [
            (
                CONFIG.replace("clients = [1, 2]", "clients = [1, 4]"),
                "[sweep] clients: [1,2] in A vs [1,4] in B",
            ),
            (
                CONFIG.replace("duration = \"1s\"", "duration = \"2s\""),
                "[[workload]] #1 (tcp-rr) duration: \"1s\" in A vs \"2s\" in B",
            ),
            (
                CONFIG.replace("tcp-rr", "tcp-crr"),
                "[[workload]] #1 kind: \"tcp-rr\" in A vs \"tcp-crr\" in B",
            ),
            (CONFIG.replace("[sweep]\nclients = [1, 2]\n", ""), "[sweep] clients: [1,2] in A vs absent in B"),
            (
                CONFIG.to_string() + "[[workload]]\nkind = \"tcp-stream\"\n",
                "[[workload]]: 1 in A (tcp-rr) vs 2 in B (tcp-rr, tcp-stream)",
            ),
        ];
        for (config, want) in cases {
            let b = fake("B", &config, "6.19", vec![]);
            let e = format!("{:#}", compare(&[a.clone(), b]).unwrap_err());
            assert!(e.contains(want), "want {want:?} in: {e}");
            assert!(e.contains("cannot be compared"), "{e}");
        }
        // What may differ: [run], [probe], [expect], [fragment]; defaults written out count as equal.
        let ok = CONFIG
            .replace("name = \"t\"", "name = \"patched\"\niterations = 5")
            .replace("max_free_order = 4", "max_free_order = 6")
            .replace("duration = \"1s\"", "duration = \"1s\"\nclients = 1");
        let b = fake("B", &(ok + "[probe]\ninterval = \"2s\"\n"), "6.19", vec![]);
        assert!(config_differences(&a, &b).is_empty(), "{:?}", config_differences(&a, &b));
    }
}
