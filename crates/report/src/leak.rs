//! Slab caches that leak: active objects that grow round after round and never come back down
//! (seed 003: skbuff_head_cache grew with every pktgen run and overnight runs ended in OOM).
//!
//! A *round* is one sweep point at one iteration: the workloads run back to back, so a cache's
//! level between rounds is what the previous rounds left behind. The level after round *i* is the
//! lowest active-object count sampled from the end of round *i* to the end of round *i+1* (the
//! trough: objects in flight are freed, leaked ones are not); the level before is the lowest sampled
//! before the first round. A cache is a leak candidate when
//!
//! - its level after the last round is above the level before by more than the noise allowance
//!   (one slab's worth of objects or 1 % of the level before, whichever is larger), at least twice,
//! - it never dropped by more than that allowance from one round to the next,
//! - it grew by more than the allowance in at least half of the rounds (a cache that warms up once
//!   and then stays flat is not a leak), and
//! - after the run (the last sample, after the release) it is still above the level before by at
//!   least half the growth.
//!
//! Candidates are ranked by growth in bytes (objects × object size), so caches of different object
//! sizes compare by what they cost.

use std::collections::BTreeMap;

use fraglab_probe::slabinfo::SlabInfo;
use fraglab_results::point::Point;

/// A round's span on the time axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// `threads=4 sysctl.x=1 #2`.
    pub name: String,
    pub start: f64,
    pub end: f64,
}

/// Rounds from the run's workload phases: consecutive workload windows of one point and iteration
/// make one round.
pub fn rounds(phases: &[super::data::Phase]) -> Vec<Round> {
    let mut out: Vec<(Point, u32, Round)> = Vec::new();
    for p in phases {
        let Some(w) = &p.workload else { continue };
        match out.last_mut() {
            Some((point, iteration, r)) if *point == w.point && *iteration == w.iteration => r.end = p.end,
            _ => out.push((
                w.point.clone(),
                w.iteration,
                Round { name: format!("{} #{}", w.point.label(), w.iteration), start: p.start, end: p.end },
            )),
        }
    }
    out.into_iter().map(|(_, _, r)| r).collect()
}

/// One cache's levels and verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Growth {
    pub name: String,
    pub objsize: u64,
    pub objperslab: u64,
    pub pagesperslab: u64,
    /// Level before the first round.
    pub before: u64,
    /// Level after each round (`None` when no sample fell in its window).
    pub after: Vec<Option<u64>>,
    /// Last level after a round minus `before`.
    pub growth: i64,
    pub growth_bytes: i64,
    /// Rounds in which it grew by more than the allowance.
    pub grew_rounds: usize,
    /// Largest drop from one round to the next.
    pub max_drop: i64,
    /// The last sample of the run (after the release).
    pub at_end: Option<u64>,
    /// The noise allowance in objects.
    pub allowance: u64,
    pub leak: bool,
}

/// A cache's active objects in one sample, with its geometry.
#[derive(Clone, Copy, Debug, Default)]
struct Level {
    active: u64,
    objsize: u64,
    objperslab: u64,
    pagesperslab: u64,
}

/// Active objects per cache name (same-named caches summed), with the first one's geometry.
fn levels(s: &SlabInfo) -> BTreeMap<&str, Level> {
    let mut m: BTreeMap<&str, Level> = BTreeMap::new();
    for c in &s.caches {
        m.entry(c.name.as_str())
            .or_insert(Level {
                active: 0,
                objsize: c.objsize,
                objperslab: c.objperslab,
                pagesperslab: c.pagesperslab,
            })
            .active += c.active_objs;
    }
    m
}

/// Every cache's growth across `rounds`, from slabinfo samples `(t, slabinfo)` in time order.
/// Returns the caches sorted by growth in bytes, largest first; `leak` marks the candidates.
pub fn analyse(samples: &[(f64, &SlabInfo)], rounds: &[Round]) -> Vec<Growth> {
    if rounds.is_empty() || samples.is_empty() {
        return Vec::new();
    }
    let per_sample: Vec<(f64, BTreeMap<&str, Level>)> =
        samples.iter().map(|(t, s)| (*t, levels(s))).collect();
    let first_start = rounds[0].start;
    // Windows: before = [-∞, start of round 1]; after round i = (end_i, end_{i+1}], the last open.
    let window_min = |name: &str, lo: f64, hi: f64| -> Option<u64> {
        per_sample
            .iter()
            .filter(|(t, _)| *t > lo && *t <= hi)
            .filter_map(|(_, m)| m.get(name).map(|v| v.active))
            .min()
    };
    let mut names: Vec<&str> = per_sample.iter().flat_map(|(_, m)| m.keys().copied()).collect();
    names.sort_unstable();
    names.dedup();
    let mut out = Vec::new();
    for name in names {
        let geometry = per_sample.iter().find_map(|(_, m)| m.get(name)).copied().unwrap_or_default();
        let Level { objsize, objperslab, pagesperslab, .. } = geometry;
        let before = window_min(name, f64::NEG_INFINITY, first_start)
            // No sample before the first round: the first sample there is.
            .or_else(|| per_sample.iter().find_map(|(_, m)| m.get(name).map(|v| v.active)))
            .unwrap_or(0);
        let after: Vec<Option<u64>> = rounds
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let hi = rounds.get(i + 1).map_or(f64::INFINITY, |n| n.end);
                window_min(name, r.end, hi)
            })
            .collect();
        let at_end = per_sample.last().and_then(|(_, m)| m.get(name).map(|v| v.active));
        let allowance = objperslab.max(before / 100).max(1);
        let mut prev = before as i64;
        let (mut grew_rounds, mut max_drop) = (0, 0i64);
        for a in after.iter().flatten() {
            let a = *a as i64;
            if a - prev > allowance as i64 {
                grew_rounds += 1;
            }
            max_drop = max_drop.max(prev - a);
            prev = a;
        }
        let last = after.iter().rev().flatten().next().copied();
        let growth = last.map_or(0, |l| l as i64 - before as i64);
        let measured = after.iter().flatten().count();
        let leak = measured >= 2
            && growth > 2 * allowance as i64
            && max_drop <= allowance as i64
            && grew_rounds * 2 >= measured
            && at_end.is_none_or(|e| (e as i64 - before as i64) * 2 >= growth);
        out.push(Growth {
            name: name.to_string(),
            objsize,
            objperslab,
            pagesperslab,
            before,
            after,
            growth,
            growth_bytes: growth.saturating_mul(objsize as i64),
            grew_rounds,
            max_drop,
            at_end,
            allowance,
            leak,
        });
    }
    out.sort_by(|a, b| b.growth_bytes.cmp(&a.growth_bytes).then_with(|| a.name.cmp(&b.name)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fraglab_probe::slabinfo::SlabCache;

    fn cache(name: &str, active: u64, objsize: u64, objperslab: u64) -> SlabCache {
        SlabCache {
            name: name.into(),
            active_objs: active,
            num_objs: active,
            objsize,
            objperslab,
            pagesperslab: 8,
            active_slabs: active / objperslab,
            num_slabs: active / objperslab,
        }
    }

    /// Seed 003: skbuff_head_cache (0.75K objects, 42 per slab) climbs from 256 to 1000610 active
    /// objects over the pktgen runs and stays there; dentry (0.48K, 66 per slab) swings with the
    /// workload but comes back; kernfs_node_cache grows once (a warm-up) and stays flat.
    fn seed_003() -> (Vec<(f64, SlabInfo)>, Vec<Round>) {
        let rounds: Vec<Round> = (0..5)
            .map(|i| Round {
                name: format!("- #{}", i + 1),
                start: 10.0 * i as f64 + 1.0,
                end: 10.0 * i as f64 + 9.0,
            })
            .collect();
        let mut samples = Vec::new();
        let skb_after = [256u64, 200_300, 400_450, 600_480, 800_520, 1_000_610];
        for (i, t) in (0..50).map(|i| (i, i as f64 + 0.5)) {
            let done = rounds.iter().filter(|r| r.end <= t).count();
            let in_round = rounds.iter().any(|r| r.start < t && t < r.end);
            // In flight during a round: up to 32000 more than what stays.
            let skb = skb_after[done] + if in_round { 30_000 + (i as u64 % 3) * 1000 } else { 0 };
            let dentry = 39_598 + if in_round { 24_000 } else { (i as u64 * 37) % 300 };
            let kernfs = if t < 5.0 { 100_435 } else { 110_000 };
            samples.push((
                t,
                SlabInfo {
                    caches: vec![
                        cache("skbuff_head_cache", skb, 768, 42),
                        cache("dentry", dentry, 488, 66),
                        cache("kernfs_node_cache", kernfs, 416, 77),
                    ],
                },
            ));
        }
        (samples, rounds)
    }

    #[test]
    fn seed_003_skbuff_head_cache_is_the_leak_and_ranks_first() {
        let (samples, rounds) = seed_003();
        let refs: Vec<(f64, &SlabInfo)> = samples.iter().map(|(t, s)| (*t, s)).collect();
        let g = analyse(&refs, &rounds);
        let leaks: Vec<&str> = g.iter().filter(|c| c.leak).map(|c| c.name.as_str()).collect();
        assert_eq!(leaks, ["skbuff_head_cache"], "{g:#?}");
        let skb = &g[0];
        assert_eq!(skb.name, "skbuff_head_cache");
        assert_eq!(skb.before, 256);
        assert_eq!(skb.after.last().copied().flatten(), Some(1_000_610));
        assert_eq!(skb.growth, 1_000_610 - 256);
        assert_eq!(skb.growth_bytes, (1_000_610 - 256) * 768);
        assert_eq!(skb.grew_rounds, 5);
        // dentry: in-flight swings, but the troughs do not climb.
        let dentry = g.iter().find(|c| c.name == "dentry").unwrap();
        assert!(!dentry.leak && dentry.growth.abs() < 1000, "{dentry:?}");
        // kernfs: one step during the first round, then flat: grew in 1 of 5 rounds.
        let kernfs = g.iter().find(|c| c.name == "kernfs_node_cache").unwrap();
        assert_eq!(kernfs.grew_rounds, 1);
        assert!(!kernfs.leak);
    }

    #[test]
    fn a_cache_that_comes_back_down_after_the_run_is_not_a_leak() {
        let (mut samples, rounds) = seed_003();
        // After the release everything is freed: it was a backlog, not a leak.
        let mut last = samples.last().unwrap().1.clone();
        last.caches[0].active_objs = 300;
        samples.push((60.0, last));
        let refs: Vec<(f64, &SlabInfo)> = samples.iter().map(|(t, s)| (*t, s)).collect();
        let g = analyse(&refs, &rounds);
        assert!(g.iter().all(|c| !c.leak), "{g:#?}");
    }

    #[test]
    fn rounds_group_workloads_of_one_point_and_iteration() {
        use super::super::data::Phase;
        // As the loader gives them: a window for every workload phase (here from schema-1 names).
        let p = |name: &str, start: f64, end: f64| Phase {
            name: name.into(),
            start,
            end,
            workload: fraglab_results::record::Window::from_legacy_phase(name),
        };
        let phases = [
            p("fragment", 0.0, 4.0),
            p("workload tcp-stream threads=1 sysctl.x=0 #1 1", 4.0, 5.0),
            p("workload exec threads=1 sysctl.x=0 #1 2", 5.0, 5.5),
            p("workload tcp-stream threads=1 sysctl.x=0 #2 1", 5.5, 6.5),
            p("workload tcp-stream - #1 1", 7.0, 8.0),
            p("release", 8.0, 9.0),
        ];
        let r = rounds(&phases);
        assert_eq!(
            r,
            [
                Round { name: "threads=1 sysctl.x=0 #1".into(), start: 4.0, end: 5.5 },
                Round { name: "threads=1 sysctl.x=0 #2".into(), start: 5.5, end: 6.5 },
                Round { name: "- #1".into(), start: 7.0, end: 8.0 },
            ]
        );
    }
}
