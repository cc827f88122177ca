//! An A/B of two kernels: rounds of one `fraglab run` on a base and a patched kernel, judged as one
//! answer a CI job or `git bisect run` can act on. The rule (docs/vm.md, "A/B: two kernels, one
//! command"):
//!
//! - a side **reproduced** when any of its rounds did (a failure seen once is a fact about that
//!   kernel); otherwise it **could not test** when any round could not (a round that did not hold its
//!   conditions cannot vouch for "not reproduced"); otherwise it did **not reproduce**;
//! - either side could not test, or the rounds ran under different accelerators → 125;
//! - the patched kernel oopsed or warned (tainted D or W) and the base did not → 1, **regression**;
//! - the base reproduced and the patched did not → 0, **fixed**;
//! - the patched reproduced and the base did not → 1, **regression**;
//! - the same verdict → 1 when any workload metric is significantly worse on the patched kernel
//!   (mmtests' ratio > 1, from [`crate::compare`]), else 0, **no change** — and 125 when the
//!   metrics could not be compared at all, since "no change" would then be unchecked.

use std::path::PathBuf;

use fraglab_results::record::Verdict;
use serde::{Deserialize, Serialize};

use crate::compare::Comparison;

/// What one boot of one kernel gave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Round {
    /// The side: `base`, `patched`, or the user's label.
    pub label: String,
    /// From 1.
    pub round: u32,
    /// The run's results directory, when the guest sent one back.
    pub dir: Option<PathBuf>,
    /// `fraglab vm`'s exit status for this boot: the guest run's own, or 125 when the guest gave
    /// no answer.
    pub exit: i32,
    /// run.json's verdict; could-not-test when there is no complete run.json.
    pub verdict: Verdict,
    /// run.json's reason, or why there is none.
    pub reason: String,
    /// Wall-clock seconds of the boot, qemu start to exit.
    pub seconds: f64,
    /// `kvm` or `tcg`: timings of the two do not compare.
    #[serde(default)]
    pub accel: String,
    /// What the guest's init warned about: a module that did not load, the kernel tainted by an
    /// oops (D) or a WARN (W) during the run.
    #[serde(default)]
    pub warnings: Vec<String>,
}

impl Round {
    /// The kernel oopsed or warned during this round (init checks /proc/sys/kernel/tainted).
    pub fn tainted(&self) -> Option<&str> {
        self.warnings.iter().find(|w| w.contains("is tainted")).map(String::as_str)
    }
}

/// One kernel over all its rounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub label: String,
    /// What `--kernel` named, and the release its image reports.
    pub kernel: String,
    pub release: Option<String>,
    pub verdict: Verdict,
    pub rounds: usize,
    pub reproduced: usize,
    pub not_reproduced: usize,
    pub could_not_test: usize,
    /// The reason behind the side's verdict: the first reproducing round's, or the first round that
    /// could not test.
    pub reason: String,
    /// Rounds whose kernel oopsed or warned, with init's words: `(round, warning)`.
    pub tainted: Vec<(u32, String)>,
}

impl Side {
    pub fn of(label: &str, kernel: &str, release: Option<String>, rounds: &[Round]) -> Side {
        let mine: Vec<&Round> = rounds.iter().filter(|r| r.label == label).collect();
        let count = |v: Verdict| mine.iter().filter(|r| r.verdict == v).count();
        let first = |v: Verdict| mine.iter().find(|r| r.verdict == v);
        let reproduced = count(Verdict::Reproduced);
        // Interrupted rounds are rounds that could not test: the run stopped before its window ended.
        let could_not_test = mine.len() - reproduced - count(Verdict::NotReproduced);
        let (verdict, why) = if let Some(r) = first(Verdict::Reproduced) {
            (Verdict::Reproduced, Some(*r))
        } else if could_not_test > 0 {
            (Verdict::CouldNotTest, mine.iter().find(|r| r.verdict != Verdict::NotReproduced).copied())
        } else if mine.is_empty() {
            (Verdict::CouldNotTest, None)
        } else {
            (Verdict::NotReproduced, mine.first().copied())
        };
        Side {
            label: label.to_string(),
            kernel: kernel.to_string(),
            release,
            verdict,
            rounds: mine.len(),
            reproduced,
            not_reproduced: count(Verdict::NotReproduced),
            could_not_test,
            reason: why
                .map_or_else(|| "no round ran".to_string(), |r| format!("round {}: {}", r.round, r.reason)),
            tainted: mine.iter().filter_map(|r| Some((r.round, r.tainted()?.to_string()))).collect(),
        }
    }

    /// `reproduced in 3 of 3 rounds`, `not reproduced (0 of 3 rounds)`, `could not test (1 of 3 rounds could not)`.
    pub fn tally(&self) -> String {
        match self.verdict {
            Verdict::Reproduced => format!("reproduced in {} of {} rounds", self.reproduced, self.rounds),
            Verdict::NotReproduced => format!("not reproduced in any of {} rounds", self.rounds),
            _ => format!("could not test ({} of {} rounds could not)", self.could_not_test, self.rounds),
        }
    }
}

/// The answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    /// The base reproduced, the patched kernel did not. Exit 0.
    Fixed,
    /// The patched kernel reproduced what the base did not, or a metric is significantly worse.
    /// Exit 1.
    Regression,
    /// Same verdict, nothing significantly worse. Exit 0.
    NoChange,
    /// A side could not test. Exit 125.
    CouldNotTest,
}

impl Change {
    pub fn exit_code(self) -> u8 {
        match self {
            Change::Fixed | Change::NoChange => 0,
            Change::Regression => 1,
            Change::CouldNotTest => 125,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Change::Fixed => "fixed",
            Change::Regression => "regression",
            Change::NoChange => "no change",
            Change::CouldNotTest => "could not test",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    pub change: Change,
    /// One sentence: what changed and why that is the answer.
    pub reason: String,
    /// Metrics significantly worse on the patched kernel (`#1 trigger pipe-resize errors ENOMEM at
    /// point -: +100.00 pct`), and better.
    pub worse: Vec<String>,
    pub better: Vec<String>,
}

/// Judge `patched` against `base`; `comparison` is the pooled base-vs-patched comparison, or why
/// there is none; `accels` the accelerators the rounds ran under.
pub fn judge(
    base: &Side,
    patched: &Side,
    comparison: Result<&Comparison, &str>,
    accels: &[&str],
) -> Judgement {
    let (mut worse, mut better) = (Vec::new(), Vec::new());
    for row in comparison.map(|c| c.metrics.as_slice()).unwrap_or_default() {
        let Some(Some(side)) = row.sides.get(1) else { continue };
        let Some(v) = &side.vs_baseline else { continue };
        let pct = v.pct.map_or_else(|| "from 0".to_string(), |p| format!("{p:+.2} pct"));
        let line = format!("#{} {} {} at point {}: {pct}", row.index + 1, row.kind, row.metric, row.point);
        match v.change.as_str() {
            "worse" => worse.push(line),
            "better" => better.push(line),
            _ => {}
        }
    }
    let (b, p) = (&base.label, &patched.label);
    let mut kinds: Vec<&str> = accels.to_vec();
    kinds.sort_unstable();
    kinds.dedup();
    let (change, reason) = match (base.verdict, patched.verdict) {
        (Verdict::CouldNotTest | Verdict::Interrupted, _) => {
            (Change::CouldNotTest, format!("{b} could not test: {}", base.reason))
        }
        (_, Verdict::CouldNotTest | Verdict::Interrupted) => {
            (Change::CouldNotTest, format!("{p} could not test: {}", patched.reason))
        }
        _ if kinds.len() > 1 => (
            Change::CouldNotTest,
            format!(
                "the rounds ran under different accelerators ({}): their timings do not compare",
                kinds.join(", ")
            ),
        ),
        // A patch that makes the kernel oops or WARN is a regression whatever the scenario says.
        _ if !patched.tainted.is_empty() && base.tainted.is_empty() => (
            Change::Regression,
            format!(
                "{p}'s kernel oopsed or warned (round {}: {}); {b}'s did not",
                patched.tainted[0].0, patched.tainted[0].1
            ),
        ),
        (Verdict::Reproduced, Verdict::NotReproduced) => {
            (Change::Fixed, format!("{b} {}; {p} {}: the patch fixes it", base.tally(), patched.tally()))
        }
        (Verdict::NotReproduced, Verdict::Reproduced) => (
            Change::Regression,
            format!(
                "{p} {} ({}); {b} {}: the patch introduces it",
                patched.tally(),
                patched.reason,
                base.tally()
            ),
        ),
        (v, w) if v == w && comparison.is_err() => (
            Change::CouldNotTest,
            format!(
                "both {}, and their metrics could not be compared ({}): \"no change\" would be unchecked",
                v.name(),
                comparison.err().unwrap_or_default()
            ),
        ),
        _ if !worse.is_empty() => (
            Change::Regression,
            format!(
                "both {}, but {} significantly worse on {p}: {}",
                base.verdict.name(),
                if worse.len() == 1 {
                    "1 metric is".to_string()
                } else {
                    format!("{} metrics are", worse.len())
                },
                worse.join("; ")
            ),
        ),
        _ => (
            Change::NoChange,
            format!(
                "both {} ({b}: {}; {p}: {}), no metric significantly worse",
                base.verdict.name(),
                base.tally(),
                patched.tally()
            ),
        ),
    };
    Judgement { change, reason, worse, better }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(label: &str, n: u32, verdict: Verdict) -> Round {
        Round {
            label: label.into(),
            round: n,
            dir: None,
            exit: 0,
            verdict,
            reason: format!("{} {n}", verdict.name()),
            seconds: 1.0,
            accel: "tcg".into(),
            warnings: Vec::new(),
        }
    }

    fn sides(base: &[Verdict], patched: &[Verdict]) -> (Side, Side) {
        let mut rounds = Vec::new();
        for (i, v) in base.iter().enumerate() {
            rounds.push(round("base", i as u32 + 1, *v));
        }
        for (i, v) in patched.iter().enumerate() {
            rounds.push(round("patched", i as u32 + 1, *v));
        }
        (Side::of("base", "a", None, &rounds), Side::of("patched", "b", None, &rounds))
    }

    use Verdict::{CouldNotTest as C, NotReproduced as N, Reproduced as R};

    #[test]
    fn a_side_reproduces_once_seen_and_cannot_vouch_for_absence_with_a_round_missing() {
        let (a, b) = sides(&[N, R, C], &[N, C, N]);
        assert_eq!((a.verdict, a.reproduced, a.could_not_test), (R, 1, 1));
        assert_eq!(a.reason, "round 2: reproduced 2");
        assert_eq!((b.verdict, b.not_reproduced, b.could_not_test), (C, 2, 1));
        assert_eq!(b.reason, "round 2: could-not-test 2");
        let (a, _) = sides(&[N, N], &[]);
        assert_eq!((a.verdict, a.tally()), (N, "not reproduced in any of 2 rounds".to_string()));
        let (_, none) = sides(&[N], &[]);
        assert_eq!(none.verdict, C, "a side with no round cannot say anything");
    }

    fn empty_comparison() -> Comparison {
        Comparison {
            baseline: "base".into(),
            runs: Vec::new(),
            warnings: Vec::new(),
            notes: Vec::new(),
            metrics: Vec::new(),
            fragment: Vec::new(),
            failures_by_order: Vec::new(),
            failures_by_site: Vec::new(),
            errors_by_errno: Vec::new(),
            compaction: Vec::new(),
        }
    }

    #[test]
    fn the_exit_rule() {
        let c = empty_comparison();
        let j = |base: &[Verdict], patched: &[Verdict]| {
            let (a, b) = sides(base, patched);
            judge(&a, &b, Ok(&c), &["tcg"])
        };
        assert_eq!(j(&[R, R], &[N, N]).change, Change::Fixed);
        assert_eq!(j(&[R, R], &[N, N]).change.exit_code(), 0);
        let r = j(&[N, N], &[N, R]);
        assert_eq!((r.change, r.change.exit_code()), (Change::Regression, 1));
        assert!(r.reason.contains("patched reproduced in 1 of 2 rounds"), "{}", r.reason);
        assert_eq!(j(&[R, R], &[R, N]).change, Change::NoChange);
        assert_eq!(j(&[N, N], &[N, N]).change, Change::NoChange);
        // Either side unable to test is 125, even when the other side reproduced.
        assert_eq!(j(&[N, C], &[R, R]).change, Change::CouldNotTest);
        assert_eq!(j(&[R, R], &[N, C]).change, Change::CouldNotTest);
        assert_eq!(j(&[R, R], &[N, C]).change.exit_code(), 125);
        // A reproducing side with a round that could not test still reproduced.
        assert_eq!(j(&[R, C], &[N, N]).change, Change::Fixed);
    }

    #[test]
    fn no_change_needs_a_comparison_and_one_accelerator_and_no_new_taint() {
        let c = empty_comparison();
        let (a, b) = sides(&[N, N], &[N, N]);
        let unchecked = judge(&a, &b, Err("base-1/probe.jsonl: unreadable"), &["tcg"]);
        assert_eq!(unchecked.change, Change::CouldNotTest, "{}", unchecked.reason);
        assert!(unchecked.reason.contains("probe.jsonl"), "{}", unchecked.reason);
        // Different verdicts need no metrics: fixed stands without a comparison.
        let (r, n) = sides(&[R], &[N]);
        assert_eq!(judge(&r, &n, Err("none"), &["tcg"]).change, Change::Fixed);
        assert_eq!(judge(&a, &b, Ok(&c), &["kvm", "tcg", "kvm"]).change, Change::CouldNotTest);

        let tainted = "the guest kernel is tainted 0x200 W (warning): see its console (--verbose)";
        let mut rounds = vec![round("base", 1, R), round("patched", 1, N)];
        rounds[1].warnings.push(tainted.into());
        let side =
            |rounds: &[Round]| (Side::of("base", "a", None, rounds), Side::of("patched", "b", None, rounds));
        let (base, patched) = side(&rounds);
        assert_eq!(patched.tainted, [(1, tainted.to_string())]);
        // Even a "fix" is a regression when the patched kernel warns and the base did not.
        let j = judge(&base, &patched, Ok(&c), &["tcg"]);
        assert_eq!(j.change, Change::Regression, "{}", j.reason);
        assert!(j.reason.contains("W (warning)"), "{}", j.reason);
        // Both tainted: the taint is no difference the patch made.
        rounds[0].warnings.push(tainted.into());
        let (base, patched) = side(&rounds);
        assert_eq!(judge(&base, &patched, Ok(&c), &["tcg"]).change, Change::Fixed);
    }
}
