//! run.json ([`RunRecord`]) and workloads.json ([`WorkloadsFile`] of [`WorkloadRecord`]): what a run
//! did and found, typed for the writer (`fraglab run`) and every reader (summary, compare, report,
//! the leak hunt) alike.

use std::time::Duration;

use fraglab_fragmenter::fidelity::Fidelity;
use fraglab_fragmenter::keeper::Lost;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::point::Point;
use crate::workload::WorkloadResult;
use crate::SCHEMA;

/// How a run ended, and so its exit status for `git bisect run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Exit 0.
    NotReproduced,
    /// Exit 1.
    Reproduced,
    /// Exit 125: the target was not reached or lost, something the run needs is missing, or a
    /// workload could not run.
    CouldNotTest,
    /// Exit 130: stopped by a signal; the results are incomplete. Above 127, so `git bisect run`
    /// stops too.
    Interrupted,
}

impl Verdict {
    /// `not-reproduced`, as run.json writes it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::NotReproduced => "not-reproduced",
            Verdict::Reproduced => "reproduced",
            Verdict::CouldNotTest => "could-not-test",
            Verdict::Interrupted => "interrupted",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a run stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Still going — or its fraglab died, until the next fraglab finds it dead and says so.
    #[default]
    Running,
    Complete,
    /// Interrupted, failed part-way, or cut short by a dead fraglab.
    Incomplete,
}

impl RunStatus {
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Complete => "complete",
            RunStatus::Incomplete => "incomplete",
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One phase of the run on the monotonic clock, to line up with probe.jsonl samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// For people: `fragment`, `workload tcp-stream threads=4 #2 1`.
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    #[serde(default)]
    pub secs: f64,
    /// The workload window this phase is; readers match windows by it, never by the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Window>,
}

/// Which workload ran in a window: its kind as the config names it (`trigger`), the sweep point,
/// the iteration (from 1) and its index among the config's `[[workload]]` tables (from 0).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Window {
    pub kind: String,
    pub point: Point,
    pub iteration: u32,
    pub index: usize,
}

impl Window {
    /// `tcp-stream threads=4 #2 1`: the phase name, and how schema 1 wrote the window.
    pub fn phase_name(&self) -> String {
        format!("workload {} {} #{} {}", self.kind, self.point.label(), self.iteration, self.index + 1)
    }

    /// A schema-1 phase name read back (`workload <kind> <point label> #<iteration> <index+1>`);
    /// kinds are one word, and the label is read as [`Point::from_legacy_label`] reads it.
    pub fn from_legacy_phase(name: &str) -> Option<Window> {
        let rest = name.strip_prefix("workload ")?;
        let (rest, n) = rest.rsplit_once(' ')?;
        let (rest, iteration) = rest.rsplit_once(" #")?;
        let (kind, label) = rest.split_once(' ')?;
        Some(Window {
            kind: kind.to_string(),
            point: Point::from_legacy_label(label),
            iteration: iteration.parse().ok()?,
            index: n.parse::<usize>().ok()?.checked_sub(1)?,
        })
    }
}

/// The plan a run carried out, as resolved when it started: what compare checks two runs measure
/// alike, so a run recorded by an older fraglab is judged by its own defaults, not today's.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PlanRecord {
    pub iterations: u32,
    /// Each `[[workload]]` with every option, defaults filled in.
    pub workloads: Vec<WorkloadSpec>,
    /// The sweep's axes in sweep order (workload options, then `sysctl.NAME`), with their values.
    pub sweep: Vec<SweepAxis>,
    /// Every cell of the sweep matrix, in the order the run visits them.
    pub points: Vec<Point>,
    /// The `[fragment]` table as written, when the run fragments; None for a baseline run.
    pub fragment: Option<Value>,
    /// The fragmenter's plan as resolved on the machine (reserve, floor, orders).
    pub fragmenter: Option<fraglab_fragmenter::Plan>,
    pub lost_tolerance_s: f64,
    pub interval_s: f64,
    pub monitors: Vec<String>,
    pub catch_min_order: u32,
    pub kmsg: bool,
    pub expect: Expect,
}

/// A `[[workload]]` as resolved.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub kind: String,
    pub options: serde_json::Map<String, Value>,
}

/// One sweep axis: `threads`, or `sysctl.net.core.high_order_alloc_disable`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepAxis {
    pub axis: String,
    pub values: Vec<Value>,
}

/// `[expect]`: what counts as reproduced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Expect {
    pub errno: Vec<String>,
    pub failed_order: Option<u32>,
    pub failed_in: Vec<String>,
}

/// run.json.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RunRecord {
    /// The results schema this file was written in ([`SCHEMA`]); 1 when absent.
    pub schema: u32,
    pub name: String,
    pub description: Option<String>,
    pub status: RunStatus,
    pub verdict: Option<Verdict>,
    pub reason: String,
    pub kernel_release: String,
    pub kernel_cmdline: String,
    pub host: String,
    /// The machine's architecture as Rust names it (`x86_64`, `aarch64`); empty before it was recorded.
    pub arch: String,
    pub fraglab_version: String,
    pub config_path: String,
    /// The config file's text, as the run read it.
    pub config: String,
    /// The plan resolved from it; None in schema 1, which stored only the text.
    pub plan: Option<PlanRecord>,
    pub started: String,
    pub finished: Option<String>,
    /// The phase a running run is in, so one that dies says where; gone once it ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    pub phases: Vec<Phase>,
    pub fragment: Option<fraglab_fragmenter::Status>,
    /// Every stretch of the hold when the target did not hold (the keeper's record).
    pub target_losses: Vec<fraglab_fragmenter::keeper::Loss>,
    pub sysctls_restored: Vec<String>,
    pub errors: Vec<String>,
    /// Fields this fraglab does not know (a newer one's, of the same schema), kept so that marking a
    /// dead run cut short rewrites run.json without losing them.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

impl RunRecord {
    /// A record of the current schema, `running`, with nothing measured yet.
    pub fn new(name: &str) -> RunRecord {
        RunRecord { schema: SCHEMA, name: name.into(), ..Default::default() }
    }

    /// The run ended now: how (complete, or incomplete and why), with its verdict when it has one.
    pub fn end(&mut self, status: RunStatus, verdict: Option<Verdict>, reason: String) {
        self.status = status;
        self.verdict = verdict;
        self.reason = reason;
        self.finished = Some(crate::workload::wall_now());
    }

    /// Workload windows that held their target, of those that had one: `(held, of)`.
    pub fn windows_held(workloads: &[WorkloadRecord]) -> Option<(usize, usize)> {
        let held: Vec<bool> = workloads.iter().filter_map(|w| w.target.as_ref().map(|t| t.held)).collect();
        (!held.is_empty()).then(|| (held.iter().filter(|h| **h).count(), held.len()))
    }
}

/// workloads.json: every workload window's result, in the order they ran.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkloadsFile {
    pub schema: u32,
    pub workloads: Vec<WorkloadRecord>,
}

impl WorkloadsFile {
    /// An empty file of the current schema.
    pub fn new() -> WorkloadsFile {
        WorkloadsFile { schema: SCHEMA, workloads: Vec::new() }
    }
}

/// One workload window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadRecord {
    pub point: Point,
    /// The sysctls the point set, `(name, value)`.
    #[serde(default)]
    pub sysctls: Vec<(String, String)>,
    pub iteration: u32,
    pub index: usize,
    pub result: WorkloadResult,
    /// Whether the target held through the workload's window; `None` for a baseline run.
    #[serde(default)]
    pub target: Option<WindowTarget>,
}

impl WorkloadRecord {
    /// Whether `window` is the phase this workload ran in. By point, iteration and index: the
    /// window's kind is the config's (`trigger`), the result's may say more (`trigger pipe-resize`).
    pub fn ran_in(&self, window: &Window) -> bool {
        window.point == self.point && window.iteration == self.iteration && window.index == self.index
    }

    /// `sctp-stream msg=32KiB #2`, or `trigger #1` without a sweep.
    pub fn window_name(&self) -> String {
        if self.point.axes.is_empty() {
            format!("{} #{}", self.result.kind, self.iteration)
        } else {
            format!("{} {} #{}", self.result.kind, self.point.label(), self.iteration)
        }
    }
}

/// However long the tolerance, a window must have held for 95 % of its length: a trigger's 20 ms
/// window that a 30 ms loss covered was not tested, though 30 ms is within 100 ms.
pub const MOST_LOST_FRACTION: f64 = 0.05;

/// Whether the target held through one workload's window (from the keeper's record).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowTarget {
    /// Lost for no longer than the tolerance: the window can say "not reproduced".
    pub held: bool,
    pub window_s: f64,
    pub lost_s: f64,
    pub losses: u64,
    /// What this window could lose and still hold: `lost_tolerance`, and never more than
    /// [`MOST_LOST_FRACTION`] of the window.
    pub tolerance_s: f64,
    /// Losses count when a free block of this order or above was seen: the target's, or a higher
    /// `[expect] failed_order`.
    pub order: usize,
    /// The worst of it: `3 order-6 blocks free in DMA32`.
    pub worst: Option<String>,
    /// A profile target: target against achieved per zone and order at the window's end. Outside
    /// its tolerance the window did not hold, however short its losses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<Fidelity>,
}

impl WindowTarget {
    /// Judge a window from what the keeper saw lost in it and, for a profile target, how close the
    /// free blocks were to it when the window ended.
    pub fn judge(
        lost: Lost,
        start_ns: u64,
        end_ns: u64,
        tolerance: Duration,
        order: usize,
        fidelity: Option<Fidelity>,
    ) -> Self {
        let window = end_ns - start_ns;
        let tolerance = (tolerance.as_nanos() as u64).min((window as f64 * MOST_LOST_FRACTION) as u64);
        WindowTarget {
            held: lost.ns <= tolerance && fidelity.as_ref().is_none_or(|f| f.within),
            window_s: window as f64 / 1e9,
            lost_s: lost.ns as f64 / 1e9,
            losses: lost.losses,
            tolerance_s: tolerance as f64 / 1e9,
            order,
            worst: lost.worst,
            fidelity,
        }
    }

    /// Why the window did not hold: `lost for 1.800 s of the 3.000 s window (3 order-6 blocks free
    /// in DMA32), more than its 0.100 s tolerance`, and/or `off its profile when the window ended:
    /// Node 1, zone DMA32 order 0: 2500 asked, 1210 free (± 266)`.
    pub fn lost_text(&self) -> String {
        let mut why = Vec::new();
        if self.lost_s > self.tolerance_s || self.fidelity.as_ref().is_none_or(|f| f.within) {
            why.push(format!(
                "lost for {:.3} s of the {:.3} s window{}, more than its {:.3} s tolerance",
                self.lost_s,
                self.window_s,
                self.worst.as_ref().map(|w| format!(" ({w})")).unwrap_or_default(),
                self.tolerance_s
            ));
        }
        if let Some(f) = self.fidelity.as_ref().filter(|f| !f.within) {
            why.push(format!("off its profile when the window ended: {}", f.off_text()));
        }
        why.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_off_its_profile_did_not_hold_however_short_its_losses() {
        use fraglab_fragmenter::fidelity::{Measure, ZoneFidelity};
        let zone = |achieved| {
            ZoneFidelity::new("Node 1, zone DMA32".into(), vec![2500, 350, 180], achieved, Measure::Buddyinfo)
        };
        let lost = Lost { ns: 0, losses: 0, worst: None };
        let s = Duration::from_millis(100);
        let close = Fidelity::of(vec![zone(vec![2510, 340, 190])], Measure::Buddyinfo, 3, 7);
        let t = WindowTarget::judge(lost.clone(), 0, 1_000_000_000, s, 3, Some(close));
        assert!(t.held, "{t:?}");
        let off = Fidelity::of(vec![zone(vec![1210, 350, 180])], Measure::Buddyinfo, 3, 7);
        let t = WindowTarget::judge(lost.clone(), 0, 1_000_000_000, s, 3, Some(off));
        assert!(!t.held, "{t:?}");
        assert_eq!(
            t.lost_text(),
            "off its profile when the window ended: Node 1, zone DMA32 order 0: 2500 asked, 1210 free (± 266)"
        );
        // Both at once: both are said.
        let long = Lost { ns: 600_000_000, losses: 1, worst: Some("1 order-4 block free in DMA32".into()) };
        let off = Fidelity::of(vec![zone(vec![2500, 350, 400])], Measure::Buddyinfo, 3, 7);
        let t = WindowTarget::judge(long, 0, 1_000_000_000, s, 3, Some(off));
        assert_eq!(
            t.lost_text(),
            "lost for 0.600 s of the 1.000 s window (1 order-4 block free in DMA32), more than its 0.050 s \
             tolerance; off its profile when the window ended: Node 1, zone DMA32 order 2: 180 asked, 400 \
             free (± 34)"
        );
        // A max-free-order window has no fidelity, and reads as before.
        let t = WindowTarget::judge(lost, 0, 1_000_000_000, s, 3, None);
        assert!(t.held && t.fidelity.is_none());
    }

    #[test]
    fn a_window_reads_back_from_its_schema_1_phase_name() {
        let w = Window {
            kind: "tcp-stream".into(),
            point: Point::from_legacy_label("sysctl.net.ipv4.tcp_wmem=4096 16384 4194304 threads=4"),
            iteration: 2,
            index: 1,
        };
        assert_eq!(
            w.phase_name(),
            "workload tcp-stream sysctl.net.ipv4.tcp_wmem=4096 16384 4194304 threads=4 #2 2"
        );
        assert_eq!(Window::from_legacy_phase(&w.phase_name()), Some(w));
        let plain = Window::from_legacy_phase("workload trigger - #1 1").unwrap();
        assert_eq!(
            (plain.kind.as_str(), plain.point, plain.iteration, plain.index),
            ("trigger", Point::none(), 1, 0)
        );
        assert_eq!(Window::from_legacy_phase("fragment: populating"), None);
    }
}
