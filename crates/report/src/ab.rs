//! An A/B of two kernels: rounds of one `fraglab run` on a base and a patched kernel, judged as one
//! answer a CI job or `git bisect run` can act on. The rule (docs/patch-testing.md):
//!
//! - a side **reproduced** when any of its rounds did (a failure seen once is a fact about that
//!   kernel); otherwise it **could not test** when any round could not (a round that did not hold its
//!   conditions cannot vouch for "not reproduced"); otherwise it did **not reproduce**;
//! - either side could not test → 125;
//! - the base reproduced and the patched did not → 0, **fixed**;
//! - the patched reproduced and the base did not → 1, **regression**;
//! - the same verdict → 1 when any workload metric is significantly worse on the patched kernel
//!   (mmtests' ratio > 1, from [`crate::compare`]), else 0, **no change**.

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

/// Judge `patched` against `base`; `comparison` is the pooled base-vs-patched comparison, when both
/// sides have results to compare.
pub fn judge(base: &Side, patched: &Side, comparison: Option<&Comparison>) -> Judgement {
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
    let (change, reason) = match (base.verdict, patched.verdict) {
        (Verdict::CouldNotTest | Verdict::Interrupted, _) => {
            (Change::CouldNotTest, format!("{b} could not test: {}", base.reason))
        }
        (_, Verdict::CouldNotTest | Verdict::Interrupted) => {
            (Change::CouldNotTest, format!("{p} could not test: {}", patched.reason))
        }
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

    #[test]
    fn the_exit_rule() {
        let j = |base: &[Verdict], patched: &[Verdict]| {
            let (a, b) = sides(base, patched);
            judge(&a, &b, None)
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
}
