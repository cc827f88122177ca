//! Which caught failures mattered (`fraglab_probe::fallback`), grouped by call site with what
//! surfaced first, and the surfaced ones tied to the workload errors of the window they fell in:
//! `ENOMEM×153 in sctp-stream msg=32KiB #1 ← order 4 ×2 from __alloc_skb ← _sctp_make_chunk`.
//! The summary, compare and the HTML report all lead with this.

use fraglab_probe::fallback::{classify, Outcome};
use fraglab_probe::stack::{group_by_caller, CallerGroup};
use fraglab_probe::tracefs::AllocFailure;
use fraglab_results::record::{Window, WorkloadRecord};
use serde::Serialize;

/// Failures of one outcome (and, for a fallback, one path) from one call site.
#[derive(Clone, Debug, Serialize)]
pub struct Group {
    pub outcome: Outcome,
    /// What the kernel does instead, for a fallback.
    pub fallback: Option<&'static str>,
    #[serde(flatten)]
    pub group: CallerGroup,
}

impl Group {
    /// The call-site line, and for a fallback what happens instead.
    pub fn describe(&self) -> String {
        match self.fallback {
            Some(instead) => format!("{} ({instead})", self.group.describe()),
            None => self.group.describe(),
        }
    }
}

/// Caught failures grouped by outcome and call site (see [`grouped`]).
pub fn groups<'a>(failures: impl IntoIterator<Item = &'a AllocFailure>) -> Vec<Group> {
    // A failure with repeats counts as many times as it happened (references, not copies).
    grouped(
        failures
            .into_iter()
            .flat_map(|f| std::iter::repeat_n((f.order, &f.gfp_flags[..], &f.stack[..]), f.count() as usize)),
    )
}

/// Failures, given as (order, gfp flag names, stack innermost first), grouped by outcome and call
/// site: surfaced first, then each fallback path; most frequent first within each (see
/// [`group_by_caller`]). The kernel log's reports (`fraglab scan`) go through here too.
pub fn grouped<'a, S: AsRef<str> + 'a>(
    failures: impl IntoIterator<Item = (u32, &'a [String], &'a [S])>,
) -> Vec<Group> {
    type Part<'a, S> = (Outcome, Option<&'static str>, Vec<(u32, &'a [S])>);
    let mut parts: Vec<Part<S>> = Vec::new();
    for (order, flags, stack) in failures {
        let c = classify(order, flags, stack);
        match parts.iter_mut().find(|(o, why, _)| *o == c.outcome && *why == c.fallback) {
            Some(p) => p.2.push((order, stack)),
            None => parts.push((c.outcome, c.fallback, vec![(order, stack)])),
        }
    }
    parts.sort_by_key(|(o, why, _)| (*o, *why));
    parts
        .into_iter()
        .flat_map(|(outcome, fallback, fs)| {
            group_by_caller(fs).into_iter().map(move |group| Group { outcome, fallback, group })
        })
        .collect()
}

/// A workload window, on the catcher's clock (CLOCK_MONOTONIC seconds).
pub struct Span<'a> {
    pub window: &'a Window,
    pub start_s: f64,
    pub end_s: f64,
}

/// A window whose workload saw errors while surfaced failures were caught.
#[derive(Clone, Debug)]
pub struct Tie {
    /// `sctp-stream msg=32KiB #1`.
    pub window: String,
    /// The workload's errors in that window, `(errno, count)`.
    pub errors: Vec<(String, u64)>,
    /// The surfaced failures caught in the window, by call site.
    pub surfaced: Vec<CallerGroup>,
}

impl Tie {
    /// `ENOMEM×153 in sctp-stream msg=32KiB #1 ← order 4 ×2 from __alloc_skb ← _sctp_make_chunk`.
    pub fn describe(&self) -> String {
        let errors: Vec<String> = self.errors.iter().map(|(e, n)| format!("{e}×{n}")).collect();
        let sites: Vec<String> = self
            .surfaced
            .iter()
            .map(|g| match &g.site {
                Some(s) => format!("order {} ×{} from {s}", g.order, g.count),
                None => format!("order {} ×{}", g.order, g.count),
            })
            .collect();
        format!("{} in {} ← {}", errors.join(" "), self.window, sites.join("; "))
    }
}

/// Every window in which the workload saw an error and surfaced failures were caught: the errors
/// the kernel's failures explain. A surfaced failure outside every window with errors (a timer's
/// retransmission, another task) is in [`groups`] only.
pub fn ties(spans: &[Span], workloads: &[WorkloadRecord], failures: &[&AllocFailure]) -> Vec<Tie> {
    let surfaced: Vec<&AllocFailure> =
        failures.iter().copied().filter(|f| fraglab_probe::fallback::surfaced(f)).collect();
    let mut out = Vec::new();
    for s in spans {
        let Some(w) = workloads.iter().find(|w| w.ran_in(s.window)) else { continue };
        let errors: Vec<(String, u64)> = w.result.errors.iter().map(|e| (e.errno.clone(), e.count)).collect();
        if errors.is_empty() {
            continue;
        }
        let inside: Vec<(&AllocFailure, u64)> = surfaced
            .iter()
            .map(|f| (*f, f.count_within(s.start_s, s.end_s)))
            .filter(|&(_, n)| n > 0)
            .collect();
        if inside.is_empty() {
            continue;
        }
        out.push(Tie {
            window: w.window_name(),
            errors,
            surfaced: group_by_caller(
                inside.iter().flat_map(|&(f, n)| std::iter::repeat_n((f.order, &f.stack[..]), n as usize)),
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fraglab_results::point::Point;
    use fraglab_results::workload::{ErrnoCount, WorkloadResult};

    /// The real 6.1 sctp-stream capture: two order-4 skb failures (surfaced), a khugepaged and a
    /// fault's huge page (fell back).
    fn capture() -> Vec<AllocFailure> {
        include_str!("../../runner/tests/captures/alloc_failures-sctp-stream-6.1.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn surfaced_first_and_tied_to_the_errors_of_their_window() {
        let failures = capture();
        let g = groups(&failures);
        let outcomes: Vec<(Outcome, u32, usize)> =
            g.iter().map(|g| (g.outcome, g.group.order, g.group.count)).collect();
        assert_eq!(
            outcomes,
            [(Outcome::Surfaced, 4, 2), (Outcome::FellBack, 9, 1), (Outcome::FellBack, 9, 1)]
        );
        assert_eq!(g[0].group.site.as_ref().unwrap().function, "__alloc_skb");

        let times: Vec<f64> = failures.iter().filter(|f| f.order == 4).map(|f| f.time).collect();
        let (first, last) =
            (times.iter().copied().fold(f64::MAX, f64::min), times.iter().copied().fold(0.0, f64::max));
        let window = |msg: &str| Window {
            kind: "sctp-stream".into(),
            point: Point { axes: vec![("msg".into(), msg.into())] },
            iteration: 1,
            index: 0,
        };
        let record = |msg: &str, enomem: u64| WorkloadRecord {
            point: Point { axes: vec![("msg".into(), msg.into())] },
            sysctls: Vec::new(),
            iteration: 1,
            index: 0,
            result: WorkloadResult {
                kind: "sctp-stream".into(),
                errors: (enomem > 0)
                    .then(|| ErrnoCount {
                        errno: "ENOMEM".into(),
                        code: 12,
                        count: enomem,
                        first_seen_s: 0.1,
                    })
                    .into_iter()
                    .collect(),
                ..Default::default()
            },
            target: None,
        };
        let (w4, w32) = (window("4KiB"), window("32KiB"));
        // The 4 KiB window ends just before the first skb failure; the 32 KiB one holds them all.
        let spans = [
            Span { window: &w4, start_s: first - 10.0, end_s: first - 0.001 },
            Span { window: &w32, start_s: first - 0.001, end_s: last + 0.001 },
        ];
        let workloads = [record("4KiB", 3), record("32KiB", 153)];
        let refs: Vec<&AllocFailure> = failures.iter().collect();
        let t = ties(&spans, &workloads, &refs);
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(
            t[0].describe(),
            "ENOMEM×153 in sctp-stream msg=32KiB #1 ← order 4 ×2 from __alloc_skb ← _sctp_make_chunk"
        );
    }
}
