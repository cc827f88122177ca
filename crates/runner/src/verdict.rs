//! Verdicts: the run's (what `fraglab run` writes in run.json) and each workload window's (what a
//! LAVA test case or a KCIDB test says about one workload), judged by the same rules.

use fraglab_probe::kmsg::KmsgEvent;
use fraglab_probe::tracefs::AllocFailure;
use fraglab_results::load::Run;
use fraglab_results::record::{Expect, Verdict, WorkloadRecord};

/// Reproduced when any expectation is met: an expected errno seen by a workload, or a failed
/// allocation of the expected order caught in the kernel. Without `[expect]`: any ENOMEM/ENOBUFS or
/// any caught failure. A caught failure the kernel has a way around (a THP fault, kvmalloc's first
/// try: `fraglab_probe::fallback`) counts only when `failed_in` names its call site: the caller never
/// saw it, so it is not the bug — and a fragmented machine has them in every run.
pub fn run(
    expect: &Expect,
    catch_min_order: u32,
    workloads: &[WorkloadRecord],
    failures: &[fraglab_probe::tracefs::AllocFailure],
    kernel_log: &[KmsgEvent],
) -> (Verdict, String) {
    let default_errnos = ["ENOMEM".to_string(), "ENOBUFS".to_string()];
    let errnos: &[String] = if expect.errno.is_empty() { &default_errnos } else { &expect.errno };
    for e in errnos {
        let n: u64 = workloads.iter().map(|w| w.result.errno_count(e)).sum();
        if n > 0 {
            return (Verdict::Reproduced, format!("{e} seen {n} times in the workloads"));
        }
    }
    // An [expect] that names errnos but no order asks for those errnos only: a kernel that fails an
    // allocation and quietly falls back has not reproduced the bug the errno stands for.
    if !expect.errno.is_empty() && expect.failed_order.is_none() && expect.failed_in.is_empty() {
        return (Verdict::NotReproduced, format!("no {} in the workloads", errnos.join("/")));
    }
    let min_order = expect.failed_order.unwrap_or(catch_min_order);
    let wanted = &expect.failed_in;
    // `foo.isra.0`, `foo.constprop.0`: the compiler's clones of foo are foo (the same
    // normalisation the by-caller summaries use).
    let names = |frame: &str| {
        let name = fraglab_probe::stack::function_name;
        name(frame).is_some_and(|f| wanted.iter().any(|w| name(w) == Some(f)))
    };
    let of_order: Vec<_> = failures.iter().filter(|f| f.order >= min_order).collect();
    let caught = match wanted.is_empty() {
        true => of_order.iter().filter(|f| fraglab_probe::fallback::surfaced(f)).count(),
        false => of_order.iter().filter(|f| f.stack.iter().any(|s| names(s))).count(),
    };
    let in_what = if wanted.is_empty() { String::new() } else { format!(" in {}", wanted.join("/")) };
    if caught > 0 {
        let which = if wanted.is_empty() { " that surfaced" } else { "" };
        return (
            Verdict::Reproduced,
            format!(
                "{caught} failed allocations of order ≥ {min_order}{in_what}{which} caught in the kernel"
            ),
        );
    }
    if !wanted.is_empty() {
        // A failure whose stack the catcher did not get (the ring buffer overflowed, the stack came
        // too late) may have been in the wanted function: that is not a "no".
        let unknown = of_order.iter().filter(|f| f.stack.is_empty()).count();
        if unknown > 0 {
            return (
                Verdict::CouldNotTest,
                format!(
                    "{unknown} failed allocations of order ≥ {min_order} were caught without a stack: cannot \
                     tell whether they were{in_what}"
                ),
            );
        }
        // The kernel log's reports carry no parsed stack: they cannot say where they failed.
        return (
            Verdict::NotReproduced,
            format!("no failed allocation of order ≥ {min_order}{in_what} caught"),
        );
    }
    let logged = kernel_log
        .iter()
        .filter(|e| match e {
            KmsgEvent::AllocFailure(f) => f.order >= min_order && fraglab_probe::fallback::surfaced_in_log(f),
            _ => false,
        })
        .count();
    if logged > 0 {
        return (
            Verdict::Reproduced,
            format!("{logged} page allocation failures of order ≥ {min_order} in the kernel log"),
        );
    }
    // Every caught failure of the order fell back, or there would have been a verdict above.
    let aside = match of_order.len() {
        0 => String::new(),
        n => format!(
            " that surfaced ({n} fell back: counted only when [expect] failed_in names their call site)"
        ),
    };
    (
        Verdict::NotReproduced,
        format!("no {} and no failed allocation of order ≥ {min_order}{aside}", errnos.join("/")),
    )
}

/// One workload window's verdict.
pub struct WindowVerdict<'a> {
    pub workload: &'a WorkloadRecord,
    pub verdict: Verdict,
    pub reason: String,
    /// The failed allocations caught in the kernel during the window, whatever their order.
    pub caught: usize,
}

/// Each workload window of a run judged on its own: by the errnos its workload saw, the failed
/// allocations caught in the kernel while it ran (by time: the catcher's `mono` trace clock is the
/// phases' CLOCK_MONOTONIC), and whether the target held through it. The kernel log's reports carry
/// no time on that clock and count for the run only. A run recorded without its plan (schema 1)
/// cannot be judged again: every window could not be tested.
pub fn windows(run: &Run) -> Vec<WindowVerdict<'_>> {
    let failed: Vec<&AllocFailure> = run.failed().collect();
    run.workloads
        .iter()
        .map(|w| {
            let Some(plan) = &run.record.plan else {
                return WindowVerdict {
                    workload: w,
                    verdict: Verdict::CouldNotTest,
                    reason: "run.json (schema 1) does not store the plan its verdict was judged by".into(),
                    caught: 0,
                };
            };
            let phase =
                run.record.phases.iter().find(|p| p.workload.as_ref().is_some_and(|win| w.ran_in(win)));
            let in_window: Vec<AllocFailure> = match phase {
                Some(p) => failed
                    .iter()
                    .filter(|f| (p.start_ns as f64..=p.end_ns as f64).contains(&(f.time * 1e9)))
                    .map(|f| (*f).clone())
                    .collect(),
                None => Vec::new(),
            };
            let (mut verdict, mut reason) =
                self::run(&plan.expect, plan.catch_min_order, std::slice::from_ref(w), &in_window, &[]);
            if verdict == Verdict::NotReproduced {
                if let Some(t) = w.target.as_ref().filter(|t| !t.held) {
                    (verdict, reason) =
                        (Verdict::CouldNotTest, format!("{reason}, but the target was {}", t.lost_text()));
                } else if phase.is_none() {
                    (verdict, reason) = (
                        Verdict::CouldNotTest,
                        format!("{reason}, but run.json has no phase for this window"),
                    );
                } else if w.result.details.get("stopped_by_signal") == Some(&serde_json::Value::Bool(true)) {
                    (verdict, reason) =
                        (Verdict::Interrupted, format!("{reason} before a signal stopped it"));
                }
            }
            WindowVerdict { workload: w, verdict, reason, caught: in_window.len() }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failures caught in a Debian 6.1 guest fragmented to max free order 4 while sctp-stream sent
    /// 32 KiB messages on lo (configs/sctp-lo-mtu64k.toml): one of each kind — the SCTP DATA chunk's
    /// order-4 skb, and two order-9 THP attempts that fall back quietly.
    fn caught() -> Vec<AllocFailure> {
        include_str!("../tests/captures/alloc_failures-sctp-stream-6.1.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn expect(errno: &[&str], failed_order: Option<u32>, failed_in: &[&str]) -> Expect {
        Expect {
            errno: errno.iter().map(|s| s.to_string()).collect(),
            failed_order,
            failed_in: failed_in.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn failed_in_counts_only_failures_whose_stack_names_the_function() {
        let all = caught();
        let thp: Vec<AllocFailure> = all.iter().filter(|f| f.order == 9).cloned().collect();
        assert_eq!((all.len(), thp.len()), (4, 2));
        let sctp = expect(&[], Some(4), &["sctp_datamsg_from_user"]);

        let (v, why) = run(&sctp, 4, &[], &all, &[]);
        assert_eq!(v, Verdict::Reproduced, "{why}");
        assert!(why.contains("2 failed allocations of order ≥ 4 in sctp_datamsg_from_user"), "{why}");
        // The THP faults alone are order 9 ≥ 4, but not in SCTP: not this bug.
        let (v, why) = run(&sctp, 4, &[], &thp, &[]);
        assert_eq!(v, Verdict::NotReproduced, "{why}");
        // Without failed_in they do not count either: both fell back (the fault maps base pages,
        // khugepaged tries again), so the caller never saw them.
        let (v, why) = run(&expect(&[], Some(4), &[]), 4, &[], &thp, &[]);
        assert_eq!(v, Verdict::NotReproduced, "{why}");
        assert!(why.contains("(2 fell back: counted only when [expect] failed_in names"), "{why}");
        let (v, why) = run(&expect(&[], None, &[]), 4, &[], &all, &[]);
        assert_eq!(v, Verdict::Reproduced, "{why}");
        assert!(why.starts_with("2 failed allocations of order ≥ 4 that surfaced"), "{why}");
        // Named, a fallback's call site counts: the user asked about huge pages.
        let huge = expect(&[], Some(9), &["do_huge_pmd_anonymous_page"]);
        let (v, why) = run(&huge, 4, &[], &all, &[]);
        assert_eq!(v, Verdict::Reproduced, "{why}");
        assert!(
            why.starts_with("1 failed allocations of order ≥ 9 in do_huge_pmd_anonymous_page caught"),
            "{why}"
        );
    }

    #[test]
    fn failed_in_matches_compiler_clones_and_a_missing_stack_cannot_say_no() {
        let mut clone = caught();
        for f in &mut clone {
            for s in &mut f.stack {
                if s == "sctp_datamsg_from_user" {
                    *s = "sctp_datamsg_from_user.isra.0".into();
                }
            }
        }
        let sctp = expect(&[], Some(4), &["sctp_datamsg_from_user"]);
        assert_eq!(run(&sctp, 4, &[], &clone, &[]).0, Verdict::Reproduced);
        // Not a prefix match: sctp_datamsg_from_user_x is another function.
        assert_eq!(
            run(&expect(&[], Some(4), &["sctp_datamsg"]), 4, &[], &clone, &[]).0,
            Verdict::NotReproduced
        );
        let mut stackless = caught();
        stackless.iter_mut().for_each(|f| f.stack.clear());
        let (v, why) = run(&sctp, 4, &[], &stackless, &[]);
        assert_eq!(v, Verdict::CouldNotTest, "{why}");
        assert!(why.contains("without a stack"), "{why}");
    }

    #[test]
    fn errno_only_expectations_ignore_caught_failures() {
        let (v, why) = run(&expect(&["ENOMEM"], None, &[]), 3, &[], &caught(), &[]);
        assert_eq!(v, Verdict::NotReproduced, "{why}");
        // Naming a function makes the caught failures count again.
        let (v, _) = run(&expect(&["ENOMEM"], None, &["sctp_datamsg_from_user"]), 3, &[], &caught(), &[]);
        assert_eq!(v, Verdict::Reproduced);
    }
}
