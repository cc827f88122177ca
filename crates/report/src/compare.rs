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
use std::path::Path;

use anyhow::{bail, Context, Result};
use fraglab_probe::fallback::Outcome;
use fraglab_probe::snapshot::Snapshot;
use fraglab_results::load::Run;
use fraglab_results::point::Point;
use fraglab_results::record::{PlanRecord, RunRecord, RunStatus, WorkloadSpec};
use fraglab_results::workload::WorkloadResult;
use serde::Serialize;
use serde_json::Value;
use statrs::distribution::{ContinuousCDF, StudentsT};

use fraglab_fragmenter::describe;

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

/// How a pooled side's compaction source says it was summed.
const SUMMED: &str = ", summed over rounds";

/// The counters whose change over a run tells how hard the kernel compacted.
pub const COMPACTION_COUNTERS: [&str; 3] = ["compact_stall", "compact_fail", "compact_success"];

/// One results directory, read, with the plan it carried out.
#[derive(Clone, Debug)]
pub struct RunData {
    /// `A`, `B`, ... or the user's `--labels`.
    pub label: String,
    pub run: Run,
    /// run.json's stored plan; for a schema-1 run (which stored only its config text) the plan the
    /// caller resolved from that text, and `plan_from_text` says so.
    pub plan: PlanRecord,
    pub plan_from_text: bool,
    /// Counter deltas over the run and where they came from.
    pub compaction: Option<(String, BTreeMap<String, i64>)>,
    /// For a [`RunData::pool`]ed side, the first (renumbered) iteration of each round after the
    /// first: a metric's sample is then one value per round, the mean of its iterations, since
    /// iterations in one boot share that boot's luck and would make a difference look surer than
    /// it is. Empty for a single run: one value per iteration.
    pub round_starts: Vec<u32>,
}

impl RunData {
    /// `run` under `label`. Its stored plan is used; a schema-1 run has none, and `legacy` resolves
    /// one from its config text (the binary's resolver, with today's defaults).
    pub fn new(
        mut run: Run,
        label: &str,
        legacy: &dyn Fn(&RunRecord) -> Result<PlanRecord>,
    ) -> Result<RunData> {
        let (plan, plan_from_text) = match &run.record.plan {
            Some(p) => (p.clone(), false),
            None => (
                legacy(&run.record).with_context(|| {
                    format!(
                        "{}: results schema {} stores no resolved plan, and its config text no longer resolves",
                        run.dir.display(),
                        run.record.schema
                    )
                })?,
                true,
            ),
        };
        if plan_from_text {
            // A schema-1 label gives back text, or a number where the text reads as one; the config
            // says which each value was (`msg = ["4096"]` is text). Take the plan's point of the same
            // label, so the run lines up with a schema-2 run of the same config.
            for w in &mut run.workloads {
                if let Some(p) = plan.points.iter().find(|p| p.label() == w.point.label()) {
                    w.point = p.clone();
                }
            }
        }
        Ok(RunData {
            label: label.to_string(),
            compaction: compaction(&run),
            plan,
            plan_from_text,
            run,
            round_starts: Vec::new(),
        })
    }

    /// Several runs of one config on one kernel — an A/B's rounds of one side — as one run, so each
    /// metric's sample is every iteration of every round. The first round's record and plan stand for
    /// all of them (the caller sets the verdict and reason the side deserves); iterations are
    /// renumbered so rounds stay apart; failed allocations are all kept; compaction deltas are summed
    /// over the rounds that have them all.
    pub fn pool(label: &str, dir: &Path, rounds: Vec<RunData>) -> Result<RunData> {
        let mut rounds = rounds.into_iter();
        let Some(mut pooled) = rounds.next() else { bail!("{label}: no round to pool") };
        pooled.label = label.to_string();
        pooled.run.dir = dir.to_path_buf();
        let mut offset = pooled.run.workloads.iter().map(|w| w.iteration).max().unwrap_or(0);
        for r in rounds {
            let differences = config_differences(&pooled, &r);
            if !differences.is_empty() {
                bail!("{label}: its rounds ran different configs: {}", differences.join("; "));
            }
            let last = r.run.workloads.iter().map(|w| w.iteration).max().unwrap_or(0);
            pooled.run.workloads.extend(r.run.workloads.into_iter().map(|mut w| {
                w.iteration += offset;
                w
            }));
            pooled.round_starts.push(offset + 1);
            offset += last;
            pooled.run.failures.extend(r.run.failures);
            pooled.run.notes.extend(r.run.notes);
            pooled.compaction = match (pooled.compaction.take(), r.compaction) {
                (Some((src, mut sum)), Some((_, d))) if d.keys().eq(sum.keys()) => {
                    for (k, v) in d {
                        *sum.entry(k).or_default() += v;
                    }
                    let src = src.strip_suffix(SUMMED).unwrap_or(&src).to_string();
                    Some((src + SUMMED, sum))
                }
                _ => None,
            };
        }
        Ok(pooled)
    }

    /// Which sample an iteration's value goes into: its round for a pooled side, else itself.
    fn sample_of(&self, iteration: u32) -> u32 {
        if self.round_starts.is_empty() {
            iteration
        } else {
            self.round_starts.iter().filter(|s| **s <= iteration).count() as u32
        }
    }

    /// The [fragment] this run applied, judged by what it did rather than by its config: None when
    /// run.json's `fragment` (the fragmenter's status) is null — `fraglab run --baseline` keeps
    /// [fragment] in the plan but never fragments, and neither does a config without [fragment] or a
    /// run stopped before the fragment phase. When it did fragment, the plan's [fragment] table names
    /// what was applied: the status's own numbers (a whole-machine target's free bytes, held bytes,
    /// timestamps) differ from run to run of one config.
    pub fn applied_fragment(&self) -> Option<&Value> {
        self.run.record.fragment.as_ref().and(self.plan.fragment.as_ref())
    }

    fn record(&self) -> &RunRecord {
        &self.run.record
    }

    /// `A (results/quickstart-…)`, for messages.
    fn named(&self) -> String {
        format!("{} ({})", self.label, self.run.dir.display())
    }
}

/// Compaction counter deltas: final.json − baseline.json, else the last probe.jsonl line − the first.
fn compaction(run: &Run) -> Option<(String, BTreeMap<String, i64>)> {
    let between = |before: &Snapshot, after: &Snapshot| {
        let d = after.vmstat.as_ref()?.delta(before.vmstat.as_ref()?);
        let picked: BTreeMap<String, i64> =
            COMPACTION_COUNTERS.iter().filter_map(|c| Some((c.to_string(), d.get(c)? as i64))).collect();
        (!picked.is_empty()).then_some(picked)
    };
    if let Some(d) = run.baseline.as_ref().zip(run.final_.as_ref()).and_then(|(b, f)| between(b, f)) {
        return Some(("baseline.json → final.json".into(), d));
    }
    match run.samples.as_slice() {
        [first, .., last] => between(&first.sample.snapshot, &last.sample.snapshot)
            .map(|d| ("probe.jsonl, first → last sample".into(), d)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// What must match: [[workload]] and [sweep]
// ---------------------------------------------------------------------------------------------

fn show(v: Option<&Value>) -> String {
    match v {
        None => "absent".into(),
        Some(Value::String(s)) => format!("{s:?}"),
        Some(v) => v.to_string(),
    }
}

/// What `other` measures that `base` does not, in the config's own terms; empty when they agree.
/// Both plans were resolved when their runs started, so an option left to its default and one
/// written out compare equal, and each run is judged by its own fraglab's defaults.
pub fn config_differences(base: &RunData, other: &RunData) -> Vec<String> {
    let (a, b) = (&base.label, &other.label);
    let (wa, wb) = (&base.plan.workloads, &other.plan.workloads);
    let mut out = Vec::new();
    if wa.len() != wb.len() {
        let kinds = |w: &[WorkloadSpec]| w.iter().map(|w| w.kind.as_str()).collect::<Vec<_>>().join(", ");
        out.push(format!(
            "[[workload]]: {} in {a} ({}) vs {} in {b} ({})",
            wa.len(),
            kinds(wa),
            wb.len(),
            kinds(wb)
        ));
    }
    for (i, (x, y)) in wa.iter().zip(wb).enumerate() {
        if x.kind != y.kind {
            out.push(format!("[[workload]] #{} kind: {:?} in {a} vs {:?} in {b}", i + 1, x.kind, y.kind));
            continue;
        }
        let keys: BTreeSet<&String> = x.options.keys().chain(y.options.keys()).collect();
        for k in keys {
            if x.options.get(k) != y.options.get(k) {
                out.push(format!(
                    "[[workload]] #{} ({}) {k}: {} in {a} vs {} in {b}",
                    i + 1,
                    x.kind,
                    show(x.options.get(k)),
                    show(y.options.get(k))
                ));
            }
        }
    }
    let sweep = |r: &RunData| -> BTreeMap<String, Value> {
        r.plan.sweep.iter().map(|s| (s.axis.clone(), Value::Array(s.values.clone()))).collect()
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
        if r.record().status != RunStatus::Complete {
            warnings.push(format!(
                "{} is {}, not complete: {}",
                r.named(),
                r.record().status,
                r.record().reason
            ));
        }
        if r.plan_from_text {
            notes.push(format!(
                "{} was recorded in results schema {} (fraglab {}), which stored only its config text: its \
                 workloads and sweep were resolved from that text with this fraglab's defaults",
                r.named(),
                r.record().schema,
                r.record().fraglab_version
            ));
        }
        for n in &r.run.notes {
            notes.push(format!("{}: {n}", r.label));
        }
    }
    for other in &runs[1..] {
        let pair = format!("{} and {}", base.label, other.label);
        let (x, y) = (base.record(), other.record());
        let same_release = x.kernel_release == y.kernel_release;
        let same_host = x.host == y.host;
        let same_cmdline = x.kernel_cmdline == y.kernel_cmdline;
        let same_fragment = base.applied_fragment() == other.applied_fragment();
        if same_release && same_host && same_cmdline {
            if same_fragment {
                warnings.push(format!(
                    "{pair}: same kernel on both sides: this compares runs, not kernels ({} on {}, {})",
                    x.kernel_release,
                    x.host,
                    if base.applied_fragment().is_some() { "same [fragment]" } else { "neither fragmented" }
                ));
            } else {
                notes.push(format!(
                    "{pair}: same kernel ({} on {}), different [fragment]: this compares memory states, not kernels",
                    x.kernel_release, x.host
                ));
            }
        } else if same_release && same_host {
            notes.push(format!(
                "{pair}: same kernel release {} on {}, booted with different command lines",
                x.kernel_release, x.host
            ));
        } else if !same_release && !same_host {
            warnings.push(format!(
                "{pair}: different kernels on different hosts ({} on {} vs {} on {}): a difference may \
                 come from the machine, not the kernel",
                x.kernel_release, x.host, y.kernel_release, y.host
            ));
        } else if !same_release {
            notes.push(format!("{pair}: kernel {} vs {} on {}", x.kernel_release, y.kernel_release, x.host));
        } else {
            notes.push(format!(
                "{pair}: same kernel {} on different hosts ({} vs {}): this compares machines",
                x.kernel_release, x.host, y.host
            ));
        }
        if !(same_fragment || same_release && same_host && same_cmdline) {
            notes.push(format!("{pair}: [fragment] differs too"));
        }
        if x.fraglab_version != y.fraglab_version {
            notes.push(format!("{pair}: fraglab {} vs {}", x.fraglab_version, y.fraglab_version));
        }
        if base.plan.catch_min_order != other.plan.catch_min_order {
            notes.push(format!(
                "{pair}: the failure catcher caught orders ≥ {} vs ≥ {}: failed allocations by order are \
                 not comparable below the higher one",
                base.plan.catch_min_order, other.plan.catch_min_order
            ));
        }
    }
    (warnings, notes)
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
    /// The same by order and call site (`8 pipe_resize_ring ← pipe_set_size`; `8 (no stack)` when
    /// the catcher recorded none), each with its outcome, those that surfaced first; one count per
    /// run.
    pub failures_by_site: Vec<CountRow>,
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
    /// The sweep point's label (`threads=4`, `-` without a sweep).
    pub point: String,
    /// The sweep point itself, `{axis: value}` (empty without a sweep).
    pub point_axes: Point,
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
    pub target: Option<fraglab_fragmenter::Target>,
    /// `no free block of order ≥ 4 (64K), 480.00 MiB free below it`, `profile of Node 0, zone Normal: …`, `none (not fragmented)`.
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
    /// A target placed in zones: each zone's planned, intact and missing, in words
    /// (`Node 1, zone DMA32: planned 3000 400 … | intact …`).
    pub zones: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CountRow {
    pub key: String,
    pub counts: Vec<u64>,
    /// For a call site's row: whether its failures surfaced or fell back
    /// (`fraglab_probe::fallback`); the rows that surfaced come first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CounterRow {
    pub counter: String,
    /// Final − baseline per run; None when the run's snapshots lack the counter.
    pub deltas: Vec<Option<i64>>,
}

/// (point, workload index, kind): what a metric is measured at.
type Key = (Point, usize, String);

/// The metrics of one workload result: (name, unit, better, value).
fn metrics_of(result: &WorkloadResult) -> Vec<(String, String, Better, f64)> {
    let (value, unit) = metric(result);
    let name = match unit {
        "Mbit/s" => "throughput",
        "ops/s" => "rate",
        _ => "successes",
    };
    let mut out = vec![(name.to_string(), unit.to_string(), Better::Higher, value)];
    if let Some(l) = &result.latency_us {
        for (p, v) in [("p50", l.p50), ("p99", l.p99)] {
            out.push((format!("latency {p}"), "µs".into(), Better::Lower, v as f64));
        }
    }
    // Seed 004's measure: what one socket keeps charged but unused, and what all of them held.
    if let Some(m) = result.skmem.as_ref().filter(|m| m.samples > 0) {
        out.push((
            "forward alloc per socket".into(),
            "bytes".into(),
            Better::Lower,
            m.summary.per_socket_mean.f,
        ));
        out.push((
            "socket memory held, peak".into(),
            "bytes".into(),
            Better::Lower,
            m.summary.held_max as f64,
        ));
    }
    out
}

fn errno_counts(result: &WorkloadResult) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for e in &result.errors {
        *m.entry(e.errno.clone()).or_default() += e.count;
    }
    m
}

fn run_info(r: &RunData) -> RunInfo {
    RunInfo {
        label: r.label.clone(),
        dir: r.run.dir.display().to_string(),
        name: r.record().name.clone(),
        status: r.record().status.to_string(),
        verdict: r.record().verdict.map(|v| v.to_string()),
        reason: r.record().reason.clone(),
        kernel_release: r.record().kernel_release.clone(),
        host: r.record().host.clone(),
        started: r.record().started.clone(),
        fraglab_version: r.record().fraglab_version.clone(),
        compaction_source: r.compaction.as_ref().map(|(s, _)| s.clone()),
    }
}

fn fragment_side(r: &RunData) -> FragmentSide {
    let f = r.record().fragment.as_ref();
    FragmentSide {
        label: r.label.clone(),
        target: f.map(|f| f.target.clone()),
        target_text: f.map_or_else(|| "none (not fragmented)".to_string(), |f| describe::target(&f.target)),
        budget: f.and_then(|f| f.budget),
        held_bytes: f.map(|f| f.held_bytes),
        freed_bytes: f.map(|f| f.freed_bytes),
        planned: f.map(|f| f.planned.clone()).unwrap_or_default(),
        intact: f.map(|f| f.intact.clone()).unwrap_or_default(),
        missing: f.map(|f| f.missing.clone()).unwrap_or_default(),
        zones: f.map(|f| describe::zone_cuts(&f.zones)).unwrap_or_default(),
        moved_pages: f.map(|f| f.moved_pages),
        target_lost: f.and_then(|f| f.target_lost.clone()),
        keeping: f.and_then(|f| f.keeping.as_ref()).map(describe::keeping),
        windows_held: RunRecord::windows_held(&r.run.workloads),
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
    // run → key → metric name → sample (iteration, or round of a pooled side) → values
    type Samples = BTreeMap<u32, Vec<f64>>;
    let mut grouped: Vec<BTreeMap<Key, BTreeMap<String, Samples>>> = vec![BTreeMap::new(); runs.len()];
    let mut errnos: BTreeMap<Key, BTreeSet<String>> = BTreeMap::new();
    // run → key → (ok, failed)
    let mut tallies: Vec<BTreeMap<Key, Tally>> = vec![BTreeMap::new(); runs.len()];
    for r in runs {
        for w in &r.run.workloads {
            let key = (w.point.clone(), w.index, w.result.kind.clone());
            if !keys.contains(&key) {
                keys.push(key.clone());
            }
            let seen = names.entry(key.clone()).or_default();
            for (name, unit, better, _) in metrics_of(&w.result) {
                if !seen.iter().any(|(n, ..)| *n == name) {
                    seen.push((name, unit, better));
                }
            }
            errnos.entry(key).or_default().extend(errno_counts(&w.result).into_keys());
        }
    }
    for (i, r) in runs.iter().enumerate() {
        for w in &r.run.workloads {
            let key = (w.point.clone(), w.index, w.result.kind.clone());
            let t = tallies[i].entry(key.clone()).or_default();
            t.0 += w.result.ok;
            t.1 += w.result.failed;
            let sample = r.sample_of(w.iteration);
            let per = grouped[i].entry(key.clone()).or_default();
            for (name, _, _, v) in metrics_of(&w.result) {
                per.entry(name).or_default().entry(sample).or_default().push(v);
            }
            // Every iteration counts each errno seen anywhere at this key, 0 when it did not fail so.
            let counts = errno_counts(&w.result);
            for e in &errnos[&key] {
                per.entry(format!("errors {e}"))
                    .or_default()
                    .entry(sample)
                    .or_default()
                    .push(counts.get(e).copied().unwrap_or(0) as f64);
            }
        }
    }
    // One value per sample: an iteration's own, or a pooled round's mean over its iterations.
    let values: Vec<BTreeMap<Key, BTreeMap<String, Vec<f64>>>> = grouped
        .into_iter()
        .map(|per_key| {
            per_key
                .into_iter()
                .map(|(key, names)| {
                    let means = names
                        .into_iter()
                        .map(|(name, samples)| {
                            let v =
                                samples.values().map(|v| v.iter().sum::<f64>() / v.len() as f64).collect();
                            (name, v)
                        })
                        .collect();
                    (key, means)
                })
                .collect()
        })
        .collect();
    for r in runs.iter().filter(|r| !r.round_starts.is_empty()) {
        notes.push(format!(
            "{}: {} rounds pooled; each value is one round's mean over its iterations (n = rounds), and the \
             fragmentation below is its first round's",
            r.label,
            r.round_starts.len() + 1
        ));
    }
    // Workload order: by index, then point in run order, so one workload's points sit together.
    let point_order: Vec<Point> = keys.iter().fold(Vec::new(), |mut v, (p, ..)| {
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
        let what = format!("#{} {} at point {}", key.1 + 1, key.2, key.0.label());
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
                point: key.0.label(),
                point_axes: key.0.clone(),
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
    let mut sites: BTreeMap<(Outcome, u32, String), Vec<u64>> = BTreeMap::new();
    let mut by_errno: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        for f in r.run.failed() {
            orders.entry(u64::from(f.order)).or_insert_with(|| vec![0; runs.len()])[i] += f.count();
            let site = fraglab_probe::stack::call_site(&f.stack)
                .map_or_else(|| "(no stack)".to_string(), |s| s.to_string());
            let outcome = fraglab_probe::fallback::classify(f.order, &f.gfp_flags, &f.stack).outcome;
            sites.entry((outcome, f.order, site)).or_insert_with(|| vec![0; runs.len()])[i] += f.count();
        }
        for w in &r.run.workloads {
            for (e, n) in errno_counts(&w.result) {
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
            .map(|(o, counts)| CountRow { key: o.to_string(), counts, outcome: None })
            .collect(),
        failures_by_site: sites
            .into_iter()
            .map(|((outcome, o, site), counts)| CountRow {
                key: format!("{o} {site}"),
                counts,
                outcome: Some(outcome),
            })
            .collect(),
        errors_by_errno: by_errno
            .into_iter()
            .map(|(e, counts)| CountRow { key: e, counts, outcome: None })
            .collect(),
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
}
