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
    let caught: u64 = match wanted.is_empty() {
        true => of_order.iter().filter(|f| fraglab_probe::fallback::surfaced(f)).map(|f| f.count()).sum(),
        false => of_order.iter().filter(|f| f.stack.iter().any(|s| names(s))).map(|f| f.count()).sum(),
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
        let unknown: u64 = of_order.iter().filter(|f| f.stack.is_empty()).map(|f| f.count()).sum();
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
    let aside = match of_order.iter().map(|f| f.count()).sum::<u64>() {
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
    pub caught: u64,
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
                Some(p) => {
                    let (from, to) = (p.start_ns as f64 / 1e9, p.end_ns as f64 / 1e9);
                    failed.iter().filter_map(|f| f.within(from, to)).collect()
                }
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
            WindowVerdict { workload: w, verdict, reason, caught: in_window.iter().map(|f| f.count()).sum() }
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

    use fraglab_results::record::{Phase, PlanRecord, RunRecord, Window, WindowTarget};
    use fraglab_results::workload::{ErrnoCount, WorkloadResult};

    /// A run of four tcp-stream windows, 1 s each from 10 s, 12 s, 14 s and 16 s on the monotonic
    /// clock; the capture's two order-4 SCTP failures (15.355 s, 15.359 s) fall in the third.
    fn four_windows() -> Run {
        let window = |i: usize| Window {
            kind: "tcp-stream".into(),
            point: fraglab_results::point::Point::none(),
            iteration: i as u32 + 1,
            index: 0,
        };
        let record = RunRecord {
            plan: Some(PlanRecord { catch_min_order: 4, ..Default::default() }),
            phases: (0..4)
                .map(|i| Phase {
                    name: window(i).phase_name(),
                    start_ns: (10 + 2 * i as u64) * 1_000_000_000,
                    end_ns: (11 + 2 * i as u64) * 1_000_000_000 + if i == 2 { 500_000_000 } else { 0 },
                    secs: 1.0,
                    workload: Some(window(i)),
                })
                .collect(),
            ..RunRecord::new("windows")
        };
        let workloads = (0..4)
            .map(|i| WorkloadRecord {
                point: fraglab_results::point::Point::none(),
                sysctls: Vec::new(),
                iteration: i as u32 + 1,
                index: 0,
                result: WorkloadResult { kind: "tcp-stream".into(), ..Default::default() },
                target: Some(WindowTarget {
                    held: true,
                    window_s: 1.0,
                    lost_s: 0.0,
                    losses: 0,
                    tolerance_s: 0.05,
                    order: 4,
                    worst: None,
                    fidelity: None,
                }),
            })
            .collect();
        Run {
            dir: "windows".into(),
            record,
            workloads,
            samples: Vec::new(),
            failures: caught(),
            baseline: None,
            final_: None,
            notes: Vec::new(),
        }
    }

    #[test]
    fn each_window_is_judged_by_its_own_errnos_failures_and_target() {
        let mut run = four_windows();
        // Window 1 saw ENOMEM itself; window 2 lost its target; window 3 had the kernel fail two
        // order-4 allocations while it ran; window 4 saw nothing and held. The THP failures (15.28 s,
        // 20.19 s: one in window 3, one after every window) fall back and count for none.
        run.workloads[0].result.errors.push(ErrnoCount {
            errno: "ENOMEM".into(),
            code: 12,
            count: 3,
            first_seen_s: 0.1,
        });
        run.workloads[1].target.as_mut().unwrap().held = false;
        run.workloads[1].target.as_mut().unwrap().lost_s = 0.4;
        let v = windows(&run);
        let got: Vec<(Verdict, u64)> = v.iter().map(|w| (w.verdict, w.caught)).collect();
        assert_eq!(
            got,
            [
                (Verdict::Reproduced, 0),
                (Verdict::CouldNotTest, 0),
                (Verdict::Reproduced, 3),
                (Verdict::NotReproduced, 0)
            ],
            "{:?}",
            v.iter().map(|w| &w.reason).collect::<Vec<_>>()
        );
        assert!(v[0].reason.contains("ENOMEM seen 3 times"), "{}", v[0].reason);
        assert!(v[1].reason.contains("but the target was lost for 0.400 s"), "{}", v[1].reason);
        assert!(
            v[2].reason.starts_with("2 failed allocations of order ≥ 4 that surfaced"),
            "{}",
            v[2].reason
        );

        // A window a signal cut short cannot say "not reproduced"; one whose phase run.json lacks
        // cannot either.
        run.workloads[3].result.details.insert("stopped_by_signal".into(), serde_json::Value::Bool(true));
        run.record.phases[1].workload = None;
        let v = windows(&run);
        assert_eq!(v[3].verdict, Verdict::Interrupted, "{}", v[3].reason);
        assert_eq!(v[1].verdict, Verdict::CouldNotTest, "{}", v[1].reason);
        run.workloads[1].target.as_mut().unwrap().held = true;
        let v = windows(&run);
        assert!(v[1].reason.ends_with("but run.json has no phase for this window"), "{}", v[1].reason);

        // Schema 1 stored no plan: nothing can be judged again.
        run.record.plan = None;
        assert!(windows(&run).iter().all(|w| w.verdict == Verdict::CouldNotTest));
    }
}
