//! How closely free memory matches a profile target, zone by zone and order by order.
//!
//! A profile is a claim about a machine: "this zone had 40773 free order-0 blocks, 37 of order 1,
//! …". The cut builds those blocks, but what an allocation meets a moment later is what the kernel
//! shows: the cut's blocks less any taken since, plus whatever else is free in the zone — the
//! reserve fraglab left, blocks a trade freed there, pages a workload let go. A reproduction stands
//! only while that stays close to the profile. So a hold of a profile target measures it when the
//! hold begins and at the end of every workload window, and a run judges a window outside the
//! tolerance as it judges a lost target: it cannot say "not reproduced".
//!
//! Orders at and above the cut's region order are not compared here: a free block there is a loss
//! of the hold, which the keeper records (and takes back) as it happens.

use serde::{Deserialize, Serialize};

/// The stated tolerance, per order: the profile's count ± 10 % and 16 blocks. What whole-machine
/// holds reached when they began, measured in guests (docs/fragmenter.md, "Nodes and zones": up to
/// +17 blocks at order 0 and +13 at order 3 beside a profile of thousands).
pub const TOLERANCE_PERCENT: u64 = 10;
pub const TOLERANCE_BLOCKS: u64 = 16;

/// How far a zone's count of an order may be from the profile's `target` and still be it.
pub fn tolerance(target: u64) -> u64 {
    target * TOLERANCE_PERCENT / 100 + TOLERANCE_BLOCKS
}

/// What "achieved" counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Measure {
    /// Whole machine: each zone's `/proc/buddyinfo` line — the machine as an allocation meets it.
    /// Too many free blocks is as far off as too few (an order-3 allocation the reporter saw fail
    /// could succeed), so the tolerance is both ways.
    Buddyinfo,
    /// A budget: the cut's blocks still free (`/proc/kpageflags`). The rest of the zone is not the
    /// target's, and the cut cannot make more than it planned: only too few is off.
    Intact,
}

/// Target against achieved, per zone and order, at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fidelity {
    /// CLOCK_MONOTONIC, the clock of run phases and the keeper's record.
    pub at_ns: u64,
    pub measure: Measure,
    /// Orders below this are compared (the cut's region order).
    pub orders: usize,
    pub zones: Vec<ZoneFidelity>,
    /// Every zone within its tolerance at every order.
    pub within: bool,
}

/// One zone's (or, for a profile without a zone, the machine's) target and what it has.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZoneFidelity {
    /// `Node 1, zone DMA32`, or `all zones` for a profile that named none.
    pub zone: String,
    /// Free blocks per order the target asks for here: the profile as scaled to fit.
    pub target: Vec<u64>,
    pub achieved: Vec<u64>,
    /// ± blocks per order ([`tolerance`]).
    pub tolerance: Vec<u64>,
    pub within: bool,
}

impl ZoneFidelity {
    /// A zone's `target` against what it has, `achieved`, as `measure` counts it.
    pub fn new(zone: String, target: Vec<u64>, achieved: Vec<u64>, measure: Measure) -> Self {
        let tolerance: Vec<u64> = target.iter().map(|&t| tolerance(t)).collect();
        let mut z = ZoneFidelity { zone, target, achieved, tolerance, within: true };
        z.within = z.off(measure).is_empty();
        z
    }

    fn off_at(&self, o: usize, measure: Measure) -> bool {
        let (t, a, tol) = (self.target[o], self.achieved[o], self.tolerance[o]);
        match measure {
            Measure::Buddyinfo => a.abs_diff(t) > tol,
            Measure::Intact => a + tol < t,
        }
    }

    /// The orders outside the tolerance: `order 0: 2500 asked, 1210 free (± 266)`.
    pub fn off(&self, measure: Measure) -> Vec<String> {
        (0..self.target.len().min(self.achieved.len()))
            .filter(|&o| self.off_at(o, measure))
            .map(|o| {
                format!(
                    "order {o}: {} asked, {} free (± {})",
                    self.target[o], self.achieved[o], self.tolerance[o]
                )
            })
            .collect()
    }
}

impl Fidelity {
    /// The zones' figures at `at_ns`, compared below order `orders`.
    pub fn of(zones: Vec<ZoneFidelity>, measure: Measure, orders: usize, at_ns: u64) -> Self {
        let within = zones.iter().all(|z| z.within);
        Fidelity { at_ns, measure, orders, zones, within }
    }

    /// The zones outside the tolerance and how: `Node 1, zone DMA32 order 0: 2500 asked, 1210 free
    /// (± 266), order 3: …`; empty when within.
    pub fn off_text(&self) -> String {
        self.zones
            .iter()
            .filter(|z| !z.within)
            .map(|z| format!("{} {}", z.zone, z.off(self.measure).join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tolerance_is_ten_percent_and_sixteen_blocks() {
        assert_eq!(tolerance(0), 16);
        assert_eq!(tolerance(2500), 266);
        assert_eq!(tolerance(40773), 4093);
    }

    #[test]
    fn whole_machine_counts_both_ways_a_budget_only_too_few() {
        let t = vec![2500, 350, 180, 90];
        let ok = ZoneFidelity::new("z".into(), t.clone(), vec![2517, 350, 170, 103], Measure::Buddyinfo);
        assert!(ok.within && ok.off(Measure::Buddyinfo).is_empty(), "{ok:?}");
        let many = ZoneFidelity::new("z".into(), t.clone(), vec![2500, 350, 180, 200], Measure::Buddyinfo);
        assert!(!many.within);
        assert_eq!(many.off(Measure::Buddyinfo), ["order 3: 90 asked, 200 free (± 25)"]);
        let few = ZoneFidelity::new("z".into(), t.clone(), vec![1210, 350, 180, 90], Measure::Intact);
        assert!(!few.within);
        assert_eq!(few.off(Measure::Intact), ["order 0: 2500 asked, 1210 free (± 266)"]);
        // A budget's cut cannot make more than it planned; its zone's other blocks are not counted.
        let budget = ZoneFidelity::new("z".into(), t, vec![2500, 350, 180, 90], Measure::Intact);
        assert!(budget.within);
    }
}
