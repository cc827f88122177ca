//! Take memory, cut it into the target shape, hold it, give it back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fraglab_probe::buddyinfo::BuddyInfo;
use fraglab_probe::page_reporting::PageReporting;
use fraglab_probe::pagetypeinfo::PageTypeInfo;
use fraglab_probe::zoneinfo::ZoneInfo;
use procfs::Current;
use serde::{Deserialize, Serialize};

use crate::arena::{page_floor, Arena, PAGE_SIZE};
use crate::fidelity::{self, Fidelity};
use crate::frames::Frames;
use crate::keeper::{Keep, Keeper, Keeping, Timeline, ZoneAbove};
use crate::pipefill::PipeFill;
use crate::populate::{self, Pool};
use crate::shape::{self, Cut};
use crate::sysctl::{Entry, Journal, Restored};
use crate::target::Target;

/// How held pages resist compaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pin {
    /// mlocked, with `vm.compact_unevictable_allowed = 0`: compaction cannot move them.
    Mlock,
    /// Ordinary movable pages: the realistic case where compaction fights back.
    None,
}

/// A validated fragmenter job. Built by the runner's resolve step; nothing here is re-checked.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    pub target: Target,
    /// Shape only this many bytes; `None` takes all free memory above the reserve.
    pub budget: Option<u64>,
    pub pin: Pin,
    /// MemAvailable that populating never goes below.
    pub reserve: u64,
    /// Why the reserve is what it is, when a run's workloads made it larger than the default (the
    /// memory they can have the kernel hold in socket buffers), or when a reserve given is smaller
    /// than that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_for: Option<String>,
    /// While holding, MemAvailable below this makes fraglab give memory back before the OOM killer
    /// has to act.
    pub floor: u64,
    /// Set `vm.compaction_proactiveness = 0` while holding, whatever the target (a whole-machine
    /// profile always does: [`Plan::stops_proactive_compaction`]).
    pub no_proactive_compaction: bool,
    /// Number of orders of this kernel (`NR_PAGE_ORDERS`), from buddyinfo.
    pub nr_orders: usize,
    /// Whole machine, max free order: take back free blocks of the target order that form while
    /// holding (`keeper`). Without it the keeper only watches.
    #[serde(default = "keep_by_default")]
    pub keep: bool,
    /// Where the memory must come from: a NUMA node, a zone.
    #[serde(default)]
    pub place: Place,
    /// Free page reporting on this machine: MemAvailable dips while it holds blocks off the free
    /// lists, and the hold must stay clear of the floor by that much.
    #[serde(default)]
    pub page_reporting: Option<PageReporting>,
}

/// Where a plan's memory must come from (`--node`, a profile's `Node 1, zone Normal`), resolved
/// against this machine's zoneinfo.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// Take memory on this node only (budget mode).
    pub bind: Option<Bind>,
    /// Cut only in these zones' frames: the profile's zone, or each line's of a [`Target::Zones`]
    /// (in its order). Pages taken outside them are held (whole machine: the zones above a lower
    /// zone must stay exhausted for the allocator to reach it) or given back (budget).
    pub zones: Vec<ZoneSpan>,
}

/// A budget bound to one NUMA node: every chunk is mbind(2)ed MPOL_BIND before it faults in, so a
/// page comes from the node or not at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub node: u32,
    /// Free bytes the node keeps: a bound allocation that finds the node at its watermark reclaims
    /// there and then calls the OOM killer rather than go to another node, so populating stops while
    /// this much is still free on it.
    pub keep: u64,
    /// The frames of the node's zones, `[start, end)`: where pagemap must show every page landed.
    pub spans: Vec<(u64, u64)>,
}

/// One zone's frames, `[start, end)`, and its name as buddyinfo prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneSpan {
    pub node: u32,
    pub zone: String,
    pub start: u64,
    pub end: u64,
}

impl ZoneSpan {
    /// `Node 1, zone DMA32`.
    pub fn label(&self) -> String {
        format!("Node {}, zone {}", self.node, self.zone)
    }

    pub fn contains(&self, pfn: u64) -> bool {
        (self.start..self.end).contains(&pfn)
    }
}

fn keep_by_default() -> bool {
    true
}

impl Plan {
    /// The order of the aligned regions the cut works in: the max free order, or one above a
    /// profile's largest block.
    pub fn region_order(&self) -> usize {
        match &self.target {
            Target::MaxFreeOrder { order, .. } => *order,
            Target::Profile { free, .. } => self.profile_region_order(free),
            Target::Zones { zones, .. } => {
                zones.iter().map(|z| self.profile_region_order(&z.free)).max().unwrap_or(0)
            }
        }
    }

    fn profile_region_order(&self, free: &[u64]) -> usize {
        free.iter().rposition(|&n| n > 0).map_or(0, |o| (o + 1).min(self.nr_orders - 1))
    }

    /// What holding the target means and what the keeper does ([`crate::keeper`]), and the order at
    /// or above which a free block is a loss. Whole machine, max free order: every free block of the
    /// order anywhere in play, and one the keeper can take back. Otherwise the regions the cut made.
    pub fn keeping(&self) -> (Keep, usize) {
        match (&self.target, self.budget) {
            (Target::MaxFreeOrder { order, .. }, None) if self.keep => (Keep::Rebreak, *order),
            (Target::MaxFreeOrder { order, .. }, None) => (Keep::Watch, *order),
            (_, None) if self.trades_reserve() => (Keep::Rebreak, self.region_order()),
            _ => (Keep::Regions, self.region_order()),
        }
    }

    /// Whole machine, max free order: whether the reserve's free blocks at or above the order are
    /// left to the keeper's rings (order ≥ [`crate::keeper::MIN_RING_ORDER`], `keep` on) — else
    /// the pipe fill breaks them up ([`Plan::fills_reserve`]).
    pub fn rings_take_reserve(&self) -> bool {
        matches!(self.keeping(), (Keep::Rebreak, k) if k >= crate::keeper::MIN_RING_ORDER)
            && matches!(self.target, Target::MaxFreeOrder { .. })
    }

    /// Whole machine, max free order, and no rings to take the reserve's blocks (an order below the
    /// keeper's smallest ring, or `keep = false`): order-0 pipe pages break them up instead, eating
    /// into the cut's small blocks as they go ([`crate::pipefill`]).
    pub fn fills_reserve(&self) -> bool {
        self.budget.is_none()
            && matches!(self.target, Target::MaxFreeOrder { .. })
            && !self.rings_take_reserve()
    }

    /// Whether `vm.compaction_proactiveness` is 0 while holding: asked for, or a whole-machine
    /// profile. There the cut's small blocks are nearly all the free memory a zone has, and
    /// proactive compaction (kcompactd, every 500 ms while a node scores as fragmented, which the
    /// profile makes it) takes them as migration targets: traced in a 5 GiB guest, one pass took
    /// 2 517 free pages of a DMA32 profile's, leaving 20 % of its order-1 blocks.
    pub fn stops_proactive_compaction(&self) -> bool {
        self.no_proactive_compaction
            || (self.budget.is_none() && !matches!(self.target, Target::MaxFreeOrder { .. }))
    }

    /// Whole machine, profile: whether the reserve's free blocks at or above the region order are
    /// traded for blocks below it ([`trade_reserve`]) and re-broken. Not with `keep = false` (no
    /// rings would take them), not when that order is below the keeper's smallest ring
    /// ([`crate::keeper::MIN_RING_ORDER`]), nor when the profile has blocks of the top order itself
    /// (the region order is then the top order: its own blocks and the reserve's look the same).
    pub fn trades_reserve(&self) -> bool {
        let k = self.region_order();
        let top_free = |free: &[u64]| free.iter().skip(k).any(|&n| n > 0);
        let own_above = match &self.target {
            Target::MaxFreeOrder { .. } => return false,
            Target::Profile { free, .. } => top_free(free),
            Target::Zones { zones, .. } => zones.iter().any(|z| top_free(&z.free)),
        };
        self.budget.is_none() && self.keep && k >= crate::keeper::MIN_RING_ORDER && !own_above
    }
}

/// Where shaping stands, for a progress bar.
#[derive(Clone, Debug)]
pub enum Progress {
    Populating {
        done: u64,
        total: u64,
    },
    Cutting,
    Freeing {
        pages: u64,
    },
    Settling,
    /// Whole-machine mode: breaking up the high-order blocks left in the untaken reserve with
    /// order-0 pipe pages (a max free order the keeper's rings cannot take, or `keep = false`).
    Filling {
        bytes: u64,
        leftover_pages: u64,
    },
    /// Whole-machine mode: the keeper's rings taking the reserve's blocks at or above the order,
    /// one allocation of exactly a block's order each.
    Rebreaking {
        bytes: u64,
        leftover_pages: u64,
    },
}

impl Progress {
    /// The step's name, as a run's phase says it.
    pub fn step(&self) -> &'static str {
        match self {
            Progress::Populating { .. } => "populating",
            Progress::Cutting => "cutting",
            Progress::Freeing { .. } => "freeing",
            Progress::Settling => "settling",
            Progress::Filling { .. } => "filling",
            Progress::Rebreaking { .. } => "re-breaking",
        }
    }
}

/// What the fragmenter achieved, and what it is holding.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub pid: u32,
    /// Seconds since the Unix epoch when the hold began.
    pub since: u64,
    pub target: Target,
    pub pin: Pin,
    pub budget: Option<u64>,
    pub held_bytes: u64,
    pub freed_bytes: u64,
    /// Budget mode: bytes taken only to find whole aligned regions and given back untouched.
    #[serde(default)]
    pub surplus_bytes: u64,
    /// Free blocks the cut made, per order.
    pub planned: Vec<u64>,
    /// Of those, the ones whose first page is still a free buddy block (`/proc/kpageflags` BUDDY).
    pub intact: Vec<u64>,
    /// Free blocks the target asked for that the memory taken could not hold, per order.
    pub missing: Vec<u64>,
    /// Bytes the target asked to free that the memory taken could not hold: owned memory comes in
    /// physical runs, and only whole aligned regions inside them can be cut.
    pub missing_bytes: u64,
    /// For a profile target: the factor it was scaled by to fit this machine or budget.
    pub scale: f64,
    /// Held pages no longer at the frame they had when the cut was made (migrated by compaction).
    pub moved_pages: u64,
    /// Whole-machine mode: bytes of pipe pages written to break up the reserve's high-order blocks.
    pub fill_bytes: u64,
    /// Whole machine, profile: held memory freed in blocks below the region order in exchange for
    /// the reserve's free blocks at or above it, which the keeper's rings hold instead.
    #[serde(default)]
    pub traded_bytes: u64,
    /// Whole-machine max-free-order mode: free pages still in blocks of order ≥ k in the target
    /// zones (every populated zone but DMA) when shaping ended; 0 means the target was reached.
    pub leftover_pages: Option<u64>,
    /// True when PFNs were hidden (not root) and the naive every-other-page pattern was used.
    pub naive: bool,
    pub buddyinfo_before: BuddyInfo,
    pub buddyinfo_populated: BuddyInfo,
    pub buddyinfo_now: BuddyInfo,
    pub sysctls: Vec<Entry>,
    /// Which bound ended each step of shaping that waits on the kernel (populate, settle, fill):
    /// the target it reached, or the limit it hit first.
    #[serde(default)]
    pub bounds: Vec<String>,
    /// What fraglab did on its own while holding (gave memory back, ...), with timestamps.
    pub events: Vec<String>,
    /// Set once the target no longer holds and why.
    pub target_lost: Option<String>,
    /// What keeping the target while holding did: blocks re-broken, time lost.
    #[serde(default)]
    pub keeping: Option<Keeping>,
    /// A target placed in zones (a profile line's zone, a profile file's lines): what the cut made
    /// in each, apart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<ZoneCut>,
    /// Each time the guard gave memory back, oldest first.
    #[serde(default)]
    pub give_backs: Vec<GiveBack>,
    /// Whether the target holds at the last refresh: what `fraglab status` exits by.
    #[serde(default)]
    pub now: Option<Now>,
    /// A profile target: how close the free blocks were to it at the last refresh, zone by zone
    /// and order by order, against the stated tolerance ([`crate::fidelity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<Fidelity>,
    /// The same when the hold began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity_at_hold: Option<Fidelity>,
}

impl Status {
    /// The fidelity of this hold now: against `now` (buddyinfo) for a whole machine, against the
    /// intact counts last refreshed for a budget. `None` for a max-free-order target, whose
    /// check is that no block at or above its order is free (the keeper's record), and for a hold with
    /// nothing planned.
    pub fn measure_fidelity(&self, region_order: usize, now: &BuddyInfo, at_ns: u64) -> Option<Fidelity> {
        let whole = self.budget.is_none();
        let measure = if whole { fidelity::Measure::Buddyinfo } else { fidelity::Measure::Intact };
        let below = |v: &[u64]| v.iter().take(region_order).copied().collect::<Vec<u64>>();
        let asked = |planned: &[u64], missing: &[u64]| {
            below(&planned.iter().zip(missing).map(|(p, m)| p + m).collect::<Vec<_>>())
        };
        let zones = match &self.target {
            Target::MaxFreeOrder { .. } => return None,
            _ if region_order == 0 => return None,
            // A profile that named no zone is built wherever fraglab's memory was: the machine's zones
            // in play together (all but DMA, which whole-machine mode puts out of reach).
            Target::Profile { .. } if self.zones.is_empty() => {
                let achieved = if whole {
                    let mut sum = vec![0u64; region_order];
                    for z in now.zones.iter().filter(|z| crate::keeper::in_play(&z.zone)) {
                        for (o, n) in z.free.iter().take(region_order).enumerate() {
                            sum[o] += n;
                        }
                    }
                    sum
                } else {
                    below(&self.intact)
                };
                vec![fidelity::ZoneFidelity::new(
                    "all zones".into(),
                    asked(&self.planned, &self.missing),
                    achieved,
                    measure,
                )]
            }
            _ => self
                .zones
                .iter()
                .map(|z| {
                    let achieved = if whole {
                        let line = now.zones.iter().find(|b| b.label() == z.zone);
                        (0..region_order)
                            .map(|o| line.and_then(|l| l.free.get(o)).copied().unwrap_or(0))
                            .collect()
                    } else {
                        below(&z.intact)
                    };
                    fidelity::ZoneFidelity::new(
                        z.zone.clone(),
                        asked(&z.planned, &z.missing),
                        achieved,
                        measure,
                    )
                })
                .collect(),
        };
        Some(Fidelity::of(zones, measure, region_order, at_ns))
    }
}

/// What one look of the guard saw, and what it did.
#[derive(Clone, Debug)]
pub struct GuardLook {
    /// MemAvailable at the look.
    pub available: u64,
    /// The floor it was held against.
    pub floor: u64,
    /// What it gave back, when MemAvailable was below the floor.
    pub gave_back: Option<String>,
}

/// One give-back of the guard: MemAvailable fell below the floor, and memory went back to the
/// kernel before the OOM killer had to find it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GiveBack {
    /// Seconds since the Unix epoch.
    pub at: u64,
    pub mem_available_bytes: u64,
    pub floor_bytes: u64,
    /// All it gave back, pipe pages included.
    pub bytes: u64,
    /// Of those, pipe pages and the keeper's rings (whole-machine mode: the reserve's broken-up
    /// blocks, and blocks re-broken while holding).
    pub pipe_bytes: u64,
}

/// Whether the target holds, looked at now.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Now {
    /// CLOCK_MONOTONIC, the clock probe.jsonl samples and run phases carry.
    pub at_ns: u64,
    pub holds: bool,
    /// Why it does not.
    pub why: Option<String>,
    /// The order at or above which a free block is a loss ([`Keeping::order`]).
    pub order: usize,
    /// Per zone at this refresh: free pages at or above `order`, and whether the zone counts
    /// (regions mode counts none: there the kept pages, not free blocks elsewhere, say whether it
    /// holds). A block counted here while `holds` is one that formed after the keeper's look: the
    /// next look takes it back or records the loss.
    pub zones: Vec<ZoneAbove>,
    /// Memory the holder has locked now (smaps' `Locked`): pages compaction cannot move. `None`
    /// when smaps_rollup could not be read (a kernel without it, before 4.14).
    pub locked_bytes: Option<u64>,
}

/// A fragmenter holding memory in shape.
pub struct Fragmenter {
    plan: Plan,
    arena: Arena,
    journal: Journal,
    cut: Cut,
    kept: Vec<(usize, u64)>,
    fill: PipeFill,
    keeper: Keeper,
    status: Status,
}

pub use crate::arena::mem_available;

/// The default reserve for this machine: never below a few times the kernel's own min watermark.
pub fn default_reserve() -> Result<u64> {
    let min_free = crate::sysctl::read("vm.min_free_kbytes")?.parse::<u64>().unwrap_or(0) * 1024;
    let total = procfs::Meminfo::current().context("cannot read /proc/meminfo")?.mem_total;
    Ok((3 * min_free).max(total / 64).max(64 << 20))
}

/// Shaping was stopped (`fraglab release`, a signal) before the target was held; everything taken
/// was given back and every sysctl restored.
#[derive(Debug, thiserror::Error)]
#[error("stopped while {phase}: gave back everything taken{}", restored_text(.restored))]
pub struct Stopped {
    pub phase: &'static str,
    pub restored: Vec<Restored>,
}

fn restored_text(restored: &[Restored]) -> String {
    if restored.is_empty() {
        return String::new();
    }
    format!(", restored {}", restored.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", "))
}

/// Give back what shaping took so far (pipes, then the arena), then restore the sysctls: the stop
/// path of [`Fragmenter::start`].
fn stopped(phase: &'static str, mut arena: Arena, mut fill: PipeFill, mut journal: Journal) -> anyhow::Error {
    fill.release();
    arena.release();
    match journal.restore() {
        Ok(restored) => Stopped { phase, restored }.into(),
        Err(e) => e.context(format!("stopped while {phase}; restoring sysctls failed")),
    }
}

/// What populating aims at and may take at most, both whole pages: the budget (or, whole machine,
/// MemAvailable above the reserve), and for a budget the cap of the search for whole aligned
/// regions. The buddy allocator hands out the smallest free blocks first (__rmqueue_smallest), so on
/// an already fragmented machine whole regions start to come only once the free Movable blocks below
/// the region order are used up: a budgeted fragmenter takes more — up to 4× the budget, or the
/// budget plus those small blocks when they are more, never the reserve — until enough of what it
/// holds is usable, and gives the rest back after the cut.
pub fn populate_limits(budget: Option<u64>, mem_available: u64, reserve: u64, small_free: u64) -> (u64, u64) {
    let total = page_floor(budget.unwrap_or_else(|| mem_available.saturating_sub(reserve)));
    let cap = budget.map_or(total, |b| page_floor(b.saturating_mul(4).max(b.saturating_add(small_free))));
    (total, cap.max(total))
}

/// What populating does next.
enum Next {
    /// Hand out a chunk of this many bytes.
    Take(u64),
    /// Nothing more until the chunks being taken are in.
    Wait,
    /// Taken enough, and why: final once nothing is in flight.
    Enough(String),
}

/// Whether to take another chunk, with `taken` bytes held or being taken (`in_flight` of them not
/// in yet) and `usable` bytes of them in whole regions of the cut's order. The same rules whatever
/// is in flight: a reason to stop becomes final only once everything handed out is in, since
/// MemAvailable may not show a chunk being faulted in and its regions are not counted yet.
fn next_chunk(
    plan: &Plan,
    taken: u64,
    in_flight: u64,
    usable: u64,
    total: u64,
    cap: u64,
    keep: u64,
) -> Result<Next> {
    if taken >= cap {
        return Ok(Next::Enough(match plan.budget {
            None => format!("took MemAvailable − reserve ({})", mib(total)),
            Some(_) if cap == total => format!("took the budget ({})", mib(total)),
            Some(_) => format!("took the search cap ({}) to find whole regions", mib(cap)),
        }));
    }
    if plan.budget.is_some() && taken >= total {
        if usable * 10 >= total * 9 {
            return Ok(Next::Enough(format!(
                "took {}, with whole regions for 90 % of {}",
                mib(taken),
                mib(total)
            )));
        }
        if (usable + in_flight) * 10 >= total * 9 {
            // What is being taken may be enough: do not search past it before it is counted.
            return Ok(Next::Wait);
        }
    }
    let step = CHUNK.min(cap - taken);
    if step < PAGE_SIZE as u64 {
        return Ok(Next::Enough(format!(
            "stopped at {}: a step of {step} bytes is less than a page",
            mib(taken)
        )));
    }
    let m = procfs::Meminfo::current().context("cannot read /proc/meminfo")?;
    let avail = m.mem_available.context("/proc/meminfo has no MemAvailable")?;
    if avail < keep + step + in_flight {
        // The reserve is not ours to take; shape what we have.
        return Ok(Next::Enough(format!(
            "stopped at {}: MemAvailable {} leaves no {} step above {} (what the hold leaves the machine)",
            mib(taken),
            mib(avail),
            mib(step),
            mib(keep)
        )));
    }
    if let Some(b) = &plan.place.bind {
        let free = ZoneInfo::read()?.node_free_pages(b.node) * PAGE_SIZE as u64;
        if free < b.keep + step + in_flight {
            return Ok(Next::Enough(format!(
                "stopped at {}: node {} has {} free, no {} step above the {} it keeps",
                mib(taken),
                b.node,
                mib(free),
                mib(step),
                mib(b.keep)
            )));
        }
    }
    // Past the budget, memory is taken only to find whole regions: from free memory, never by
    // making the kernel reclaim other processes' page cache for it.
    if plan.budget.is_some() && taken >= total && m.mem_free < keep + step + in_flight {
        return Ok(Next::Enough(format!(
            "stopped at {} past the budget: MemFree {} leaves no {} step above the reserve (no reclaim for \
             the region search)",
            mib(taken),
            mib(m.mem_free),
            mib(step)
        )));
    }
    Ok(Next::Take(step))
}

/// A byte figure in MiB (KiB below one): one unit throughout, so figures side by side compare.
fn mib(bytes: u64) -> String {
    if bytes < 1 << 20 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// The largest number of pages a max-free-order cut can free out of `pages` held.
pub fn max_freeable(pages: u64, order: usize) -> u64 {
    pages / (1 << order) * ((1 << order) - 1)
}

const CHUNK: u64 = 64 << 20;

/// Per-CPU lists above this many pages hide freed pages from buddyinfo; a huge fraction shrinks
/// every list to its floor (4 × batch).
const PCP_HIGH_FRACTION: &str = "100000";

impl Fragmenter {
    /// Shape memory to `plan`. Sysctls are changed through `journal`, which restores them if this
    /// fails or when the fragmenter is released. `stop` is looked at between every step that takes
    /// memory or waits on the kernel: once set, everything taken is given back, every sysctl
    /// restored, and the error is a [`Stopped`].
    pub fn start(
        plan: Plan,
        mut journal: Journal,
        progress: &mut dyn FnMut(Progress),
        stop: &AtomicBool,
    ) -> Result<Self> {
        // If the OOM killer must pick someone, it should be us: our memory is the cheapest to lose.
        std::fs::write("/proc/self/oom_score_adj", "1000").context("cannot set oom_score_adj")?;
        journal.set("vm.percpu_pagelist_high_fraction", PCP_HIGH_FRACTION)?;
        if plan.pin == Pin::Mlock {
            journal.set("vm.compact_unevictable_allowed", "0")?;
        }
        if plan.stops_proactive_compaction() {
            journal.set("vm.compaction_proactiveness", "0")?;
        }
        if plan.budget.is_none() {
            // Whole-machine mode: the DMA zone's few MiB sit in large free blocks that no one may
            // take (lowmem_reserve keeps it for DMA allocations) but that the kernel's own
            // high-order requests may still fall back to. A ratio of 1 makes the reserve larger
            // than the zone: DMA is out of play for every higher zone's allocations.
            let ratios = crate::sysctl::read("vm.lowmem_reserve_ratio")?;
            let mut fields: Vec<&str> = ratios.split_whitespace().collect();
            if let Some(dma) = fields.first_mut() {
                *dma = "1";
                journal.set("vm.lowmem_reserve_ratio", &fields.join(" "))?;
            }
        }
        let buddyinfo_before = BuddyInfo::read()?;

        let mut arena = Arena::default();
        arena.prepare_checks();
        let mut fill = PipeFill::default();
        if plan.pin == Pin::Mlock {
            arena.lock()?;
        }
        let region_order = plan.region_order();
        let bind = plan.place.bind.as_ref();
        let mut bounds = Vec::new();
        let small_free = small_movable_free_bytes(&PageTypeInfo::read()?, region_order, bind.map(|b| b.node));
        // What populating never takes: the reserve, and a margin above a floor set over it, or the
        // hold would begin below the floor and the guard give the target up at once.
        let keep = fill_keeps(&plan);
        let available = mem_available()?;
        let (total, cap) = populate_limits(plan.budget, available, keep, small_free);
        // The frames taken so far, counting the whole regions of the cut's order among them: the
        // region search's measure, kept as chunks come in rather than re-read.
        let mut owned = Frames::new(region_order);
        // One u64 per page to be taken, faulted in now, before populating: grown as chunks came
        // in, its pages were faulted in among the arena's, and freed after the cut they came back
        // as small free blocks in the target's zones — more blocks of orders 1–3 than a profile
        // asked for (measured in a 5 GiB guest). Taken first, they come from the machine's large
        // free blocks, and go back as large blocks the keeper's rings re-break.
        let mut pfns: Vec<u64> = Vec::with_capacity((cap.min(available) / PAGE_SIZE as u64) as usize);
        // Touched a word a page, not `vec![0; n]`: calloc's fresh mapping would be faulted in
        // only as chunks come in, which is what this avoids.
        let spare = pfns.spare_capacity_mut();
        for word in spare.iter_mut().step_by(PAGE_SIZE / 8) {
            word.write(0);
        }
        std::hint::black_box(spare);
        let mut pool = Pool::new(populate::workers(), plan.pin == Pin::Mlock, true, bind.map(|b| b.node))?;
        // Every pass hands out a chunk, takes one in, or ends with nothing in flight; chunks are
        // handed out only below `cap`, so the loop ends by then at the latest.
        let populated = loop {
            if stop.load(Ordering::Relaxed) {
                pool.cancel();
                while let Some(taken) = pool.recv() {
                    if let Ok(t) = taken {
                        arena.adopt(t.map);
                    }
                }
                return Err(stopped("populating", arena, fill, journal));
            }
            let taken = arena.bytes() + pool.in_flight_bytes();
            let usable = (owned.whole() << region_order) * PAGE_SIZE as u64;
            match next_chunk(&plan, taken, pool.in_flight_bytes(), usable, total, cap, keep)? {
                Next::Take(step) if pool.idle() => {
                    pool.send(step as usize);
                    continue;
                }
                Next::Enough(why) if pool.in_flight_bytes() == 0 => break why,
                // All workers busy, or the decision waits on what they are taking.
                _ => {}
            }
            let t = pool.recv().expect("a chunk is in flight")?;
            owned.extend(&t.pfns);
            pfns.extend_from_slice(&t.pfns);
            arena.adopt(t.map);
            progress(Progress::Populating { done: arena.bytes().min(total), total });
        };
        drop(pool);
        bounds.push(format!("populate: {populated}"));
        bounds.extend(reporting_bound(&plan));
        let buddyinfo_populated = BuddyInfo::read()?;

        progress(Progress::Cutting);
        // Where every page is now: the first chunks were read seconds ago, and a page can have been
        // migrated since — movable ones by compaction, even locked ones by contiguous allocations
        // (CMA, gigantic huge pages). A stale frame would free the wrong page.
        let now = arena.pfns()?;
        let moved = pfns.iter().zip(&now).filter(|(was, is)| was != is).count();
        if moved > 0 {
            bounds.push(format!("pagemap: {moved} pages moved while populating; cut where they are now"));
            owned = Frames::from_pfns(&now, region_order);
            pfns = now;
        }
        if let Some(b) = bind {
            let off: usize = pfns
                .iter()
                .filter(|&&p| p != 0 && !b.spans.iter().any(|&(s, e)| (s..e).contains(&p)))
                .count();
            if off > 0 {
                let e = anyhow::anyhow!(
                    "{off} of {} pages landed outside node {} although every chunk was bound to it \
                     (MPOL_BIND): the node's zones in /proc/zoneinfo do not cover them; gave everything back",
                    pfns.len(),
                    b.node
                );
                return Err(stopped("checking the node", arena, fill, journal).context(e));
            }
            bounds.push(format!(
                "bind: all {} pages on node {} (pagemap against its zones' spans)",
                pfns.len(),
                b.node
            ));
        }
        let naive = pfns.iter().all(|&p| p == 0);
        let (mut cut, scale, zone_cuts) = if naive {
            (naive_cut(arena.pages(), &plan.target, plan.nr_orders), 1.0, Vec::new())
        } else {
            cut_target(&plan, &pfns, &owned, arena.pages(), &mut bounds)
        };
        if stop.load(Ordering::Relaxed) {
            return Err(stopped("cutting", arena, fill, journal));
        }
        // Sorted once: every check of the planned blocks reads /proc/kpageflags in PFN order.
        cut.at.sort_unstable();
        // Whole machine, profile: what the reserve's high-order blocks are traded for, chosen before
        // anything is freed — choosing allocates, and what it faults in must come from the free
        // memory there is now (the reserve's), not from the cut's small blocks (measured: chosen
        // after the cut, a 5 GiB guest's profile lost 2 969 of its 3 000 order-0 blocks to it).
        let trade = match plan.trades_reserve() && !naive {
            true => Some(trade_reserve(&pfns, &cut, &plan, &buddyinfo_populated)?),
            false => None,
        };
        // Which pages stay, listed before anything is freed for the same reason: the list is one
        // entry per held page, megabytes when the whole machine is held.
        let kept = kept_pages(&pfns, &cut, plan.budget.is_some(), trade.as_ref().map_or(&[], |t| &t.runs));
        let mut traded = 0;
        // The trade goes first: until it is freed, the only free memory is the reserve, in the lowest
        // zones beside a lower zone's cut, and every allocation meanwhile takes the cut's blocks
        // (smallest first); once it is, the zones above serve them (measured in a 5 GiB guest: 55–89 %
        // of the cut's order-1…6 blocks left when the cut went first).
        if let Some(t) = trade.filter(|t| !t.runs.is_empty()) {
            arena.free(&t.runs)?;
            traded = t.outside + t.inside;
            bounds.push(format!(
                "trade: {} free in blocks of order ≥ {} (the reserve fraglab left) for {} of held memory \
                 freed in blocks below it ({} outside the target's zones, {} inside); the keeper's rings \
                 take the high-order blocks",
                mib(t.left * PAGE_SIZE as u64),
                plan.region_order(),
                mib(traded * PAGE_SIZE as u64),
                mib(t.outside * PAGE_SIZE as u64),
                mib(t.inside * PAGE_SIZE as u64)
            ));
        }
        progress(Progress::Freeing { pages: cut.freed_pages() });
        arena.free(&cut.runs)?;
        // A budget's surplus goes back after the cut: the last pages each CPU frees stay in its
        // per-CPU list (up to its `high`), out of the buddy lists, and those had better not be the
        // cut's — surplus freed last pushes them out.
        let surplus: &[(usize, usize)] = if plan.budget.is_some() { &cut.surplus } else { &[] };
        arena.free(surplus)?;
        let surplus_pages: u64 = surplus.iter().map(|(s, e)| (e - s) as u64).sum();
        // One u64 per page taken, and the frame bitmap: freed now so their pages do not become a
        // free high-order block after the last check (measured in a 1 GiB guest).
        drop(pfns);
        drop(owned);

        progress(Progress::Settling);
        let settled = if naive {
            settle(stop)?.map(|(b, why)| (b, why, None))
        } else {
            settle_planned(&cut.at, plan.nr_orders, stop)?.map(|(b, why, intact)| (b, why, Some(intact)))
        };
        let Some((mut buddyinfo_now, settled, mut intact)) = settled else {
            return Err(stopped("settling", arena, fill, journal));
        };
        bounds.push(format!("settle: {settled}"));
        let mut leftover = None;
        if let (None, Target::MaxFreeOrder { order, .. }) = (plan.budget, &plan.target) {
            if plan.fills_reserve() {
                let Some((b, left, ended)) =
                    fill_leftovers(&mut fill, &mut journal, *order, fill_keeps(&plan), progress, stop)?
                else {
                    return Err(stopped("filling the reserve's high-order blocks", arena, fill, journal));
                };
                buddyinfo_now = b;
                leftover = Some(left);
                // The fill's pages come from the smallest free blocks first: look at the cut's again.
                intact = None;
                bounds.push(format!("fill: {ended}"));
            } else {
                // The keeper's rings take the reserve's blocks below, once the hold's record exists.
                leftover = Some(leftover_pages(&buddyinfo_now, *order));
            }
        }
        let (how, order) = plan.keeping();
        let keeper = Keeper::new(how, order, plan.nr_orders, fill_keeps(&plan), &mut journal)?;
        let status = Status {
            pid: std::process::id(),
            since: crate::instance::now_epoch(),
            target: plan.target.clone(),
            pin: plan.pin,
            budget: plan.budget,
            held_bytes: (arena.pages() as u64 - cut.freed_pages() - surplus_pages - traded)
                * PAGE_SIZE as u64,
            traded_bytes: traded * PAGE_SIZE as u64,
            surplus_bytes: surplus_pages * PAGE_SIZE as u64,
            freed_bytes: cut.freed_pages() * PAGE_SIZE as u64,
            planned: cut.blocks.clone(),
            intact: vec![0; plan.nr_orders],
            missing: cut.missing_blocks.clone(),
            missing_bytes: cut.missing_pages * PAGE_SIZE as u64,
            scale,
            moved_pages: 0,
            fill_bytes: fill.bytes(),
            leftover_pages: leftover,
            naive,
            buddyinfo_before,
            buddyinfo_populated,
            buddyinfo_now,
            sysctls: journal.entries().to_vec(),
            bounds,
            events: Vec::new(),
            target_lost: None,
            keeping: None,
            zones: zone_cuts,
            give_backs: Vec::new(),
            now: None,
            fidelity: None,
            fidelity_at_hold: None,
        };
        let mut f = Fragmenter { plan, arena, journal, cut, kept, fill, keeper, status };
        // The hold's first look: its record starts with the hold.
        f.keep_now()?;
        // The reserve's blocks at or above the order — what the trade left, a max-free-order hold's
        // that no fill took, or what the fill could not reach — the keeper's rings take now, before
        // the hold begins.
        let rings_take = f.plan.rings_take_reserve() || f.status.leftover_pages.is_some_and(|l| l > 0);
        if (f.status.traded_bytes > 0 || rings_take) && f.rebreaking() {
            f.rebreak_reserve(progress, stop)?;
            if stop.load(Ordering::Relaxed) {
                let restored = f.release()?;
                return Err(Stopped { phase: "re-breaking the reserve's blocks", restored }.into());
            }
            if f.status.leftover_pages.is_some() {
                f.status.leftover_pages = Some(leftover_pages(&BuddyInfo::read()?, f.plan.region_order()));
            }
            // The kernel's own allocations went on meanwhile (and a ring that steals a pageblock
            // moves its free pages to the unmovable lists, where they serve those first): count
            // the cut's blocks again.
            intact = None;
        }
        // What settle just checked block by block needs no second read of /proc/kpageflags; after a
        // fill it does.
        f.refresh_with(intact)?;
        f.status.fidelity_at_hold = f.status.fidelity.clone();
        Ok(f)
    }

    /// Whole machine: let the keeper take the reserve's free blocks at or above the region order (a
    /// profile's traded reserve; a max-free-order hold's, or what its fill could not reach), look
    /// after look. Each ring is one unmovable allocation of exactly a free block's order, which only
    /// a block of that order or above can serve — never the cut's smaller ones, which order-0 pipe
    /// pages eat first (the allocator serves those from the smallest free blocks, and steals whole
    /// pageblocks of them). Ends when none has been seen in the zones in play for [`CLEAN_FOR`]
    /// (freed pages drain from the per-CPU lists late), when no block was taken for
    /// [`STALLED_FOR`] (blocks the kernel will not hand an ordinary request), when re-breaking has
    /// waited [`STALLED_FOR`] for MemAvailable (the reserve itself is high-order blocks: the
    /// target is not reached), at 10 s and 2 s more a GiB there was to take, or when `stop` is set
    /// (the caller then releases).
    fn rebreak_reserve(&mut self, progress: &mut dyn FnMut(Progress), stop: &AtomicBool) -> Result<()> {
        const CLEAN_FOR: Duration = Duration::from_secs(1);
        const STALLED_FOR: Duration = Duration::from_secs(2);
        let start = Instant::now();
        let k = self.plan.region_order();
        // One descriptor a ring: a reserve of a few GiB in top-order blocks is a thousand.
        crate::pipefill::raise_nofile_limit();
        let first = leftover_pages(&BuddyInfo::read()?, k) * PAGE_SIZE as u64;
        let bound = Duration::from_secs(10 + 2 * (first >> 30));
        let (mut clean_since, mut taken_at, mut paused_since) = (None, Instant::now(), None);
        let mut added = self.keeper.status().added_bytes;
        let why = loop {
            let left = leftover_pages(&BuddyInfo::read()?, k);
            let keeping = self.keeper.status();
            progress(Progress::Rebreaking { bytes: keeping.added_bytes, leftover_pages: left });
            let took = || {
                format!(
                    "{} in {} rings, {} ms",
                    mib(keeping.added_bytes),
                    keeping.pipes,
                    start.elapsed().as_millis()
                )
            };
            let still = || format!("{} still free at order ≥ {k}", mib(left * PAGE_SIZE as u64));
            if keeping.added_bytes > added {
                (added, taken_at) = (keeping.added_bytes, Instant::now());
            }
            paused_since = match self.keeper.paused_for_memory() {
                true => paused_since.or(Some(Instant::now())),
                false => None,
            };
            if left > 0 {
                clean_since = None;
            } else if clean_since.get_or_insert_with(Instant::now).elapsed() >= CLEAN_FOR {
                break format!(
                    "no free block of order ≥ {k} left for {} ms; {}",
                    CLEAN_FOR.as_millis(),
                    took()
                );
            }
            if stop.load(Ordering::Relaxed) {
                break format!("stopped with {}; {}", still(), took());
            }
            if left > 0 {
                let note = keeping.note.unwrap_or_default();
                if !self.rebreaking() {
                    break format!("{}: {note}; {}", still(), took());
                }
                if paused_since.is_some_and(|t| t.elapsed() >= STALLED_FOR) {
                    break format!("{}: {note}; {}", still(), took());
                }
                if taken_at.elapsed() >= STALLED_FOR {
                    break format!(
                        "{}: the kernel handed out none for {} ms ({} refused) — {}; {}",
                        still(),
                        STALLED_FOR.as_millis(),
                        keeping.refused,
                        leftover_where(&BuddyInfo::read()?, &ZoneInfo::read()?, k),
                        took()
                    );
                }
                if start.elapsed() >= bound {
                    break format!("{} at the {} s bound; {}", still(), bound.as_secs(), took());
                }
            }
            std::thread::sleep(crate::keeper::KEEP_EVERY);
            self.keep_now()?;
        };
        self.status.bounds.push(format!("rebreak: {}", why.trim_end()));
        // The hold begins now: its record with it.
        self.keeper.restart_record();
        self.keep_now()?;
        Ok(())
    }

    /// Re-read buddyinfo, which planned blocks are still free, and which held pages moved.
    pub fn refresh(&mut self) -> Result<&Status> {
        self.refresh_with(None)
    }

    /// [`Fragmenter::refresh`], taking `intact` as given when it was just checked.
    fn refresh_with(&mut self, intact: Option<Vec<u64>>) -> Result<&Status> {
        self.status.buddyinfo_now = BuddyInfo::read()?;
        if !self.status.naive && self.arena.pages() > 0 {
            // A target in zones has every planned block in one of them (zones placed by the plan
            // never overlap: resolve refuses those that do), each zone's a run of the sorted list:
            // one read of /proc/kpageflags per zone gives both.
            for z in &mut self.status.zones {
                let at = &self.cut.at;
                let (a, b) =
                    (at.partition_point(|&(p, _)| p < z.start), at.partition_point(|&(p, _)| p < z.end));
                z.intact = intact_blocks(&at[a..b], self.plan.nr_orders)?;
            }
            self.status.intact = match (intact, self.status.zones.is_empty()) {
                (Some(intact), _) => intact,
                (None, false) => (0..self.plan.nr_orders)
                    .map(|o| self.status.zones.iter().map(|z| z.intact[o]).sum())
                    .collect(),
                (None, true) => intact_blocks(&self.cut.at, self.plan.nr_orders)?,
            };
            self.status.moved_pages = self.arena.moved(&self.kept)?;
        }
        let keeping = self.keeper.status();
        self.status.now = Some(self.now(&keeping)?);
        self.status.keeping = Some(keeping);
        self.status.fidelity = self.status.measure_fidelity(
            self.plan.region_order(),
            &self.status.buddyinfo_now,
            fraglab_probe::snapshot::monotonic_ns()?,
        );
        Ok(&self.status)
    }

    /// A profile target's fidelity now, for the end of a workload window: whole machine, from one
    /// buddyinfo read; a budget, from its planned blocks' flags (`/proc/kpageflags`). Lighter than
    /// [`Fragmenter::refresh`], which also reads where every kept page is. `None` for a
    /// max-free-order target.
    pub fn fidelity_now(&mut self) -> Result<Option<Fidelity>> {
        if matches!(self.plan.target, Target::MaxFreeOrder { .. }) {
            return Ok(None);
        }
        let at_ns = fraglab_probe::snapshot::monotonic_ns()?;
        let now = BuddyInfo::read()?;
        let mut status = self.status.clone();
        if self.plan.budget.is_some() && !self.status.naive && self.arena.pages() > 0 {
            let at = &self.cut.at;
            for z in &mut status.zones {
                let (a, b) =
                    (at.partition_point(|&(p, _)| p < z.start), at.partition_point(|&(p, _)| p < z.end));
                z.intact = intact_blocks(&at[a..b], self.plan.nr_orders)?;
            }
            if status.zones.is_empty() {
                status.intact = intact_blocks(at, self.plan.nr_orders)?;
            }
        }
        Ok(status.measure_fidelity(self.plan.region_order(), &now, at_ns))
    }

    /// Whether the target holds, as the keeper's record has it — the record a run's verdict is
    /// judged by (which then weighs losses by their order and its tolerance): not while its last
    /// loss is open — a free block at or above the order in a zone in play that the keeper could
    /// not take back, or a loss for good (memory given back; in regions mode a kept page moved or
    /// PFNs hidden) — nor in regions mode while this refresh finds a kept page moved. Fresh when
    /// the keeper has just looked ([`Fragmenter::look_for_status`]).
    fn now(&self, keeping: &Keeping) -> Result<Now> {
        let zones = crate::keeper::counted(&self.status.buddyinfo_now, keeping.order, keeping.how);
        let open = {
            let t = self.keeper.timeline();
            let t = crate::keeper::lock(&t);
            t.losses.last().filter(|l| l.end_ns.is_none()).map(|l| l.why.clone())
        };
        let why = if let Some(lost) = &self.status.target_lost {
            Some(lost.clone())
        } else if open.is_some() {
            open
        } else if keeping.how == Keep::Regions && self.status.moved_pages > 0 {
            Some(format!(
                "{} kept pages moved (migrated): the regions they kept may hold free blocks of order ≥ {}",
                self.status.moved_pages, keeping.order
            ))
        } else {
            None
        };
        // smaps' Locked (resident pages in mlocked mappings), not status' VmLck: with
        // MLOCK_ONFAULT VmLck counts whole mappings, pages the cut freed included (640 MiB for a
        // 256 MiB budget that keeps 16 MiB). A figure to show, not one to fail a status for.
        let locked_bytes = procfs::process::Process::myself()
            .and_then(|p| p.smaps_rollup())
            .ok()
            .map(|r| r.memory_map_rollup.0.iter().filter_map(|m| m.extension.map.get("Locked")).sum());
        Ok(Now {
            at_ns: fraglab_probe::snapshot::monotonic_ns()?,
            holds: why.is_none(),
            why,
            order: keeping.order,
            zones,
            locked_bytes,
        })
    }

    /// A look before answering `fraglab status`, so its answer is the keeper's record as of now: the
    /// keeper's own look (a buddyinfo read, and any re-break it calls for), except in regions mode,
    /// where that look reads the pagemap of everything held — the refresh that follows does that
    /// already, and a `status --watch 100ms` must not make the holder spend a core on it.
    pub fn look_for_status(&mut self) -> Result<Option<String>> {
        if self.keeper.how() == Keep::Regions {
            self.keep()
        } else {
            self.keep_now()
        }
    }

    /// One look of the keeper ([`crate::keeper`]): every [`crate::keeper::KEEP_EVERY`] while
    /// holding. Returns a line for the log when re-breaking had to stop.
    pub fn keep(&mut self) -> Result<Option<String>> {
        self.look(false)
    }

    /// A look now, also in regions mode (whose kept pages are otherwise checked once a second): what
    /// a workload window is judged by once it ends.
    pub fn keep_now(&mut self) -> Result<Option<String>> {
        self.look(true)
    }

    fn look(&mut self, now: bool) -> Result<Option<String>> {
        let (arena, kept, naive) = (&self.arena, &self.kept, self.status.naive);
        self.keeper.look(now, &mut || if naive { Ok(None) } else { arena.moved(kept).map(Some) })
    }

    /// Whether the keeper still takes back the free blocks that form ([`crate::keeper::Keep::Rebreak`]).
    pub fn rebreaking(&self) -> bool {
        self.keeper.rebreaking()
    }

    /// The keeper's thread: its own failed allocations are not a workload's.
    pub fn keeper_tid(&self) -> Option<i32> {
        self.keeper.tid()
    }

    /// When the target held, for other threads (the sampler, the verdict).
    pub fn timeline(&self) -> std::sync::Arc<std::sync::Mutex<Timeline>> {
        self.keeper.timeline()
    }

    /// The frames of the pages kept in place (one or more in every region the cut opened).
    pub fn kept_pfns(&self) -> impl Iterator<Item = u64> + '_ {
        self.kept.iter().map(|&(_, pfn)| pfn)
    }

    /// The journal this fragmenter's sysctls went through; a run sets its sweep sysctls through it
    /// too, so one restore puts everything back.
    pub fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    pub fn status(&self) -> &Status {
        &self.status
    }

    /// One step of the hold: if MemAvailable fell below the floor, give memory back — whole chunks,
    /// until the reserve is available again — before the OOM killer has to act. Returns what it saw
    /// and did.
    pub fn guard(&mut self) -> Result<GuardLook> {
        let avail = mem_available()?;
        let look = |gave_back| GuardLook { available: avail, floor: self.plan.floor, gave_back };
        if avail >= self.plan.floor
            || (self.arena.pages() == 0 && self.fill.bytes() == 0 && self.keeper.added_bytes() == 0)
        {
            return Ok(look(None));
        }
        // Enough for the reserve and the floor both, counted in memory really freed (a chunk after
        // the cut holds a fraction of its mapping): one pass answers the pressure.
        let want = self.plan.reserve.max(self.plan.floor).saturating_sub(avail).max(CHUNK);
        let from_arena = self.arena.shrink(want);
        // The keeper's rings (whole machine: the reserve's high-order blocks, and any that formed
        // since) and pipe pages are unmovable and keep the reserve broken up, so they go last — but
        // they go: hundreds of MiB the OOM killer would otherwise have to find. Rings first: fewer.
        let from_rings = self.keeper.shrink(want.saturating_sub(from_arena));
        let from_pipes = from_rings + self.fill.shrink(want.saturating_sub(from_arena + from_rings));
        let given = from_arena + from_pipes;
        self.kept.retain(|&(i, _)| i < self.arena.pages());
        self.cut.at.clear();
        self.status.held_bytes = self.status.held_bytes.saturating_sub(from_arena);
        self.status.fill_bytes = self.fill.bytes();
        let what = format!(
            "{}: MemAvailable {} MiB fell below the floor {} MiB; gave back {} MiB{}; target lost",
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
            avail >> 20,
            self.plan.floor >> 20,
            given >> 20,
            if from_pipes > 0 {
                format!(" ({} MiB of it pipe pages and rings)", from_pipes >> 20)
            } else {
                String::new()
            }
        );
        self.status.events.push(what.clone());
        self.status.give_backs.push(GiveBack {
            at: crate::instance::now_epoch(),
            mem_available_bytes: avail,
            floor_bytes: self.plan.floor,
            bytes: given,
            pipe_bytes: from_pipes,
        });
        let lost = "memory pressure: memory given back to avoid the OOM killer";
        self.keeper.lost_to_pressure(lost);
        self.status.target_lost = Some(lost.into());
        Ok(GuardLook { available: avail, floor: self.plan.floor, gave_back: Some(what) })
    }

    /// Unmap everything and restore every sysctl.
    pub fn release(mut self) -> Result<Vec<crate::sysctl::Restored>> {
        self.keeper.release();
        self.fill.release();
        self.arena.release();
        self.journal.restore()
    }
}

/// Every arena page the cut keeps, with its PFN, to notice migration later. Surplus pages are not
/// kept when they were given back, nor the pages of `traded` runs.
fn kept_pages(
    pfns: &[u64],
    cut: &Cut,
    surplus_given_back: bool,
    traded: &[(usize, usize)],
) -> Vec<(usize, u64)> {
    let mut gone = vec![false; pfns.len()];
    let surplus: &[(usize, usize)] = if surplus_given_back { &cut.surplus } else { &[] };
    for &(s, e) in cut.runs.iter().chain(surplus).chain(traded) {
        gone[s..e].iter_mut().for_each(|g| *g = true);
    }
    pfns.iter().enumerate().filter(|&(i, _)| !gone[i]).map(|(i, &pfn)| (i, pfn)).collect()
}

/// Without PFNs, fall back to what engineers do by hand: free every other page (virtually). It
/// cannot aim at an order, so the result is whatever the physical layout allows.
fn naive_cut(pages: usize, target: &Target, nr_orders: usize) -> Cut {
    let want = match target {
        Target::MaxFreeOrder { free_bytes, .. } => (*free_bytes / PAGE_SIZE as u64) as usize,
        Target::Profile { free, .. } => pages_in(free),
        Target::Zones { zones, .. } => zones.iter().map(|z| pages_in(&z.free)).sum(),
    };
    let runs: Vec<(usize, usize)> = (0..pages).step_by(2).map(|i| (i, i + 1)).take(want).collect();
    Cut {
        runs,
        blocks: vec![0; nr_orders],
        at: Vec::new(),
        missing_blocks: vec![0; nr_orders],
        missing_pages: 0,
        surplus: Vec::new(),
    }
}

fn pages_in(free: &[u64]) -> usize {
    free.iter().enumerate().map(|(o, n)| (*n as usize) << o).sum()
}

/// One zone of a zone-placed target after the cut, for status: what the cut made there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZoneCut {
    /// `Node 1, zone DMA32`.
    pub zone: String,
    pub planned: Vec<u64>,
    /// Of those, the ones still free at the last refresh.
    pub intact: Vec<u64>,
    pub missing: Vec<u64>,
    /// The factor the zone's profile was scaled by to fit the pages taken there (1 = unscaled).
    pub scale: f64,
    /// Frames `[start, end)`: which planned blocks are this zone's.
    pub start: u64,
    pub end: u64,
}

/// Choose the pages to free for the plan's target, in the frames its place allows. Returns the cut,
/// the factor a profile was scaled by (the smallest of its zones'), and, for a target placed in
/// zones, what the cut made in each.
fn cut_target(
    plan: &Plan,
    pfns: &[u64],
    owned: &Frames,
    pages: usize,
    bounds: &mut Vec<String>,
) -> (Cut, f64, Vec<ZoneCut>) {
    let spans = &plan.place.zones;
    // Only the zone's own frames are the cut's: elsewhere, frame 0 (none).
    let masked = |zone: &[ZoneSpan]| -> Vec<u64> {
        pfns.iter().map(|&p| if zone.iter().any(|z| z.contains(p)) { p } else { 0 }).collect()
    };
    if !spans.is_empty() {
        let outside = pfns.iter().filter(|&&p| p != 0 && !spans.iter().any(|z| z.contains(p))).count();
        if outside > 0 {
            let names: Vec<String> = spans.iter().map(ZoneSpan::label).collect();
            bounds.push(format!(
                "zone: {} of {} taken outside {}: {}, not cut",
                mib(outside as u64 * PAGE_SIZE as u64),
                mib(pfns.len() as u64 * PAGE_SIZE as u64),
                names.join(", "),
                if plan.budget.is_some() { "given back" } else { "held" }
            ));
        }
    }
    match &plan.target {
        Target::MaxFreeOrder { order, free_bytes } => (
            shape::max_free_order(pfns, owned, *order, free_bytes / PAGE_SIZE as u64, plan.nr_orders),
            1.0,
            vec![],
        ),
        Target::Profile { free, .. } => {
            // A budget bounds what is shaped; memory taken beyond it only to find whole aligned
            // regions is surplus, given back after the cut, and must not unscale it.
            let fit = plan.budget.map_or(pages as u64, |b| (b / PAGE_SIZE as u64).min(pages as u64));
            let (scaled, f) = shape::scale_profile(free, fit);
            let cut = match spans.is_empty() {
                true => shape::profile(pfns, &scaled, plan.nr_orders),
                false => shape::profile(&masked(spans), &scaled, plan.nr_orders),
            };
            let zones = spans.first().map(|z| zone_cut(z, &cut, f)).into_iter().collect();
            (cut, f, zones)
        }
        Target::Zones { zones, .. } => {
            let mut all = Cut {
                blocks: vec![0; plan.nr_orders],
                missing_blocks: vec![0; plan.nr_orders],
                ..Cut::default()
            };
            let (mut scale, mut cuts) = (1.0f64, Vec::new());
            for (line, span) in zones.iter().zip(spans) {
                let mine = masked(std::slice::from_ref(span));
                // Each line is scaled to the pages taken in its own zone.
                let there = mine.iter().filter(|&&p| p != 0).count() as u64;
                let (scaled, f) = shape::scale_profile(&line.free, there);
                let cut = shape::profile(&mine, &scaled, plan.nr_orders);
                scale = scale.min(f);
                cuts.push(zone_cut(span, &cut, f));
                all.merge(cut);
            }
            (all, scale, cuts)
        }
    }
}

fn zone_cut(span: &ZoneSpan, cut: &Cut, scale: f64) -> ZoneCut {
    ZoneCut {
        zone: span.label(),
        planned: cut.blocks.clone(),
        intact: vec![0; cut.blocks.len()],
        missing: cut.missing_blocks.clone(),
        scale,
        start: span.start,
        end: span.end,
    }
}

/// Without PFNs (naive cut, no planned blocks to check): wait for the per-CPU lists to drain into
/// the buddy lists: buddyinfo stops changing, or 3 s pass. Returns the last buddyinfo and which of
/// the two ended the wait; `None` when `stop` was set.
fn settle(stop: &AtomicBool) -> Result<Option<(BuddyInfo, String)>> {
    const BOUND: Duration = Duration::from_secs(3);
    let start = Instant::now();
    let mut last = BuddyInfo::read()?;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let now = BuddyInfo::read()?;
        if now == last {
            return Ok(Some((now, format!("buddyinfo still after {} ms", start.elapsed().as_millis()))));
        }
        if start.elapsed() > BOUND {
            return Ok(Some((
                now,
                format!("buddyinfo still changing after the {} s bound", BOUND.as_secs()),
            )));
        }
        last = now;
    }
}

/// Wait until the cut's blocks are free buddy blocks — freed pages reach the buddy lists through
/// the per-CPU lists, late — checking them every 10 ms. Ends when every planned block is free; when
/// the pages of those not free would all fit in the per-CPU lists (the last pages each CPU freed
/// stay there, up to its `high`, until an order-0 allocation on that CPU takes them: no wait
/// brings them out); when none more turned free for 1.2 s, longer than the vmstat worker's 1 s
/// trim of those lists (the rest were taken by other allocations); or at 3 s. Returns buddyinfo and
/// which ended the wait, and the planned blocks free per order; `None` when `stop` was set. `at` is
/// sorted.
fn settle_planned(
    at: &[(u64, usize)],
    nr_orders: usize,
    stop: &AtomicBool,
) -> Result<Option<(BuddyInfo, String, Vec<u64>)>> {
    const BOUND: Duration = Duration::from_secs(3);
    const QUIET: Duration = Duration::from_millis(1200);
    let mut planned = vec![0u64; nr_orders];
    for &(_, o) in at {
        planned[o] += 1;
    }
    let start = Instant::now();
    let (mut best, mut since) = (0u64, start);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let intact = intact_blocks(at, nr_orders)?;
        let free: u64 = intact.iter().sum();
        let not_free_pages: u64 =
            planned.iter().zip(&intact).enumerate().map(|(o, (p, i))| (p - i) << o).sum();
        let ms = start.elapsed().as_millis();
        if free > best {
            (best, since) = (free, Instant::now());
        }
        let why = if free == at.len() as u64 {
            Some(format!("every planned block free after {ms} ms"))
        } else if not_free_pages <= ZoneInfo::read()?.pcp_pages() {
            Some(format!(
                "{free} of {} planned blocks free after {ms} ms; the other {not_free_pages} pages fit in the \
                 per-CPU lists, where they stay until an order-0 allocation takes them",
                at.len()
            ))
        } else if since.elapsed() >= QUIET {
            Some(format!(
                "{free} of {} planned blocks free after {ms} ms, none more in {} ms (the rest were taken)",
                at.len(),
                QUIET.as_millis()
            ))
        } else if start.elapsed() >= BOUND {
            Some(format!("{free} of {} planned blocks free at the {} s bound", at.len(), BOUND.as_secs()))
        } else {
            None
        };
        if let Some(why) = why {
            return Ok(Some((BuddyInfo::read()?, why, intact)));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whole machine, profile: the reserve fraglab did not take is free memory in blocks of every
/// order, high ones included — and it sits in the lowest zones, the allocator's last resort, where
/// a lower zone's profile is cut. The reporter's machine had no such blocks, so trade them: free as
/// much of the held memory in blocks below the region order `k` (max-free-order style, in whole
/// aligned regions the cut never touched), so that the keeper's rings can then take the high-order
/// blocks without MemAvailable going below the reserve. Each zone's share is freed in that zone when it is not one
/// of the target's: a zone near its watermark hands its last blocks to no ordinary allocation, the
/// rings included (measured: a 5 GiB two-node guest kept 37 MiB of node 0's DMA32 blocks when the
/// trade freed it all in node 1's Normal). The rest — a target zone's share, or what a zone's own
/// held memory could not give — comes from any zone outside the target's, then from inside them.
fn trade_reserve(held: &[u64], cut: &Cut, plan: &Plan, now: &BuddyInfo) -> Result<Trade> {
    let k = plan.region_order();
    let zoneinfo = ZoneInfo::read()?;
    let targets = &plan.place.zones;
    let in_target = |p: u64| targets.iter().any(|z| z.contains(p));
    // What the cut frees is not held.
    let mut taken = vec![false; held.len()];
    for &(s, e) in &cut.runs {
        taken[s..e].iter_mut().for_each(|t| *t = true);
    }
    let left = leftover_pages(now, k);
    let mut trade = Trade { runs: Vec::new(), left, outside: 0, inside: 0 };
    if left == 0 {
        return Ok(trade);
    }
    // One page list for every share: a whole machine's is megabytes.
    let mut pfns = vec![0u64; held.len()];
    // Cut `want` pages out of the held pages `pick` allows and no earlier share took.
    let mut cut_in = |pick: &dyn Fn(u64) -> bool, want: u64, trade: &mut Trade, inside: bool| -> u64 {
        if want == 0 {
            return 0;
        }
        for (d, (&p, &t)) in pfns.iter_mut().zip(held.iter().zip(&taken)) {
            *d = if p != 0 && !t && pick(p) { p } else { 0 };
        }
        let cut = shape::max_free_order(&pfns, &Frames::from_pfns(&pfns, k), k, want, plan.nr_orders);
        for &(s, e) in &cut.runs {
            taken[s..e].iter_mut().for_each(|t| *t = true);
        }
        let freed = cut.freed_pages();
        trade.runs.extend(cut.runs);
        if inside {
            trade.inside += freed;
        } else {
            trade.outside += freed;
        }
        freed
    };
    let mut rest = 0;
    for z in now.zones.iter().filter(|z| crate::keeper::in_play(&z.zone)) {
        let left = z.free_pages_at_or_above(k);
        let span = zoneinfo.zone(z.node, &z.zone).and_then(|z| z.span());
        match span {
            Some((s, e)) if left > 0 && !targets.iter().any(|t| t.node == z.node && t.zone == z.zone) => {
                rest += left - cut_in(&|p| (s..e).contains(&p), left, &mut trade, false);
            }
            _ => rest += left,
        }
    }
    rest -= cut_in(&|p| !in_target(p), rest, &mut trade, false);
    if !targets.is_empty() {
        cut_in(&in_target, rest, &mut trade, true);
    }
    trade.runs.sort_unstable();
    Ok(trade)
}

/// What [`trade_reserve`] frees: arena page runs, and how many pages outside and inside the
/// target's zones, for `left` pages free at or above the region order.
struct Trade {
    runs: Vec<(usize, usize)>,
    left: u64,
    outside: u64,
    inside: u64,
}

/// Free pages in blocks of order ≥ `k` in the zones a whole-machine target covers: all but DMA,
/// which lowmem_reserve keeps out of reach of ordinary allocations anyway.
pub fn leftover_pages(b: &BuddyInfo, k: usize) -> u64 {
    b.zones.iter().filter(|z| z.zone != "DMA").map(|z| z.free_pages_at_or_above(k)).sum()
}

/// Where the free blocks of order ≥ `k` are, zone by zone, with the watermarks that decide whether
/// the kernel hands them out. The keeper's ring is a GFP_KERNEL allocation: a zone whose free pages,
/// less the block, fall under its low watermark (boost included) plus the protection it keeps from a
/// Normal-zone request is passed over on the first try, and under min refused outright — to the
/// keeper as to any ordinary allocation of the reproduction; only atomic and high-priority requests
/// dip below min. So a block left there is free in buddyinfo yet not an order an ordinary
/// allocation can have.
pub fn leftover_where(b: &BuddyInfo, zoneinfo: &ZoneInfo, k: usize) -> String {
    b.zones
        .iter()
        .filter(|z| z.zone != "DMA" && z.free_pages_at_or_above(k) > 0)
        .map(|z| {
            let blocks: Vec<String> =
                (k..z.free.len()).filter(|&o| z.free[o] > 0).map(|o| format!("{o}: {}", z.free[o])).collect();
            let marks = zoneinfo.zone(z.node, &z.zone).map(|zi| {
                // protection[] is indexed by the request's highest zone, in the node's zone order.
                let normal =
                    zoneinfo.zones.iter().filter(|n| n.node == z.node).position(|n| n.zone == "Normal");
                let protect = normal.and_then(|i| zi.protection.get(i)).copied().unwrap_or(0);
                let smallest = (k..z.free.len()).find(|&o| z.free[o] > 0).unwrap_or(k);
                let after = zi.nr_free_pages.saturating_sub(1 << smallest);
                let verdict = if after <= zi.min + protect {
                    "under min, refused to all but atomic requests"
                } else if after <= zi.low + protect {
                    "under low, passed over until reclaim or compaction"
                } else {
                    "above low"
                };
                format!(
                    "{} pages free against min {} and low {}, boost {} in both, protection {protect}: {verdict}",
                    zi.nr_free_pages,
                    zi.min,
                    zi.low,
                    zi.boost.unwrap_or(0)
                )
            });
            format!(
                "{}: order {} ({})",
                z.label(),
                blocks.join(", "),
                marks.unwrap_or_else(|| "not in zoneinfo".into())
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The smallest step of the whole-machine pipe fill.
pub const FILL_STEP: u64 = 16 << 20;

/// MemAvailable seen to move by this much between two reads here with nothing held changing and
/// no free page reporting under way (44 MiB measured on the 24 GiB VM): what the pipe fill leaves
/// above a floor set above the reserve, so the guard is not set off by noise the moment the hold
/// begins. (It was 128 MiB until the falls of 64 and 128 MiB seen here were traced to free page
/// reporting, which [`reporting_margin`] now counts on its own: a CI run had the hold begin 3 MiB
/// above the floor, 125 MiB below where the rings stopped, and the guard gave the target up.)
const FLOOR_NOISE: u64 = 64 << 20;

/// What free page reporting can hold off the free lists at once, in bytes (0 without it): the
/// most MemAvailable can fall for a moment with nothing allocated.
fn reporting_margin(plan: &Plan) -> u64 {
    plan.page_reporting.as_ref().map_or(0, |r| r.isolated_pages_at_most(plan.nr_orders) * PAGE_SIZE as u64)
}

/// The MemAvailable that populating and the whole-machine pipe fill never take: the reserve, or,
/// when `--floor` was set at or above the reserve, a margin above the floor; and with free page
/// reporting, never less than what a report takes above the floor. (Applied to the default floor,
/// the noise margin outweighed a small guest's reserve and left 100 MiB of a 1 GiB guest unshaped:
/// pipe-highorder then found an order-9 block. Guests fraglab boots have no balloon.)
fn fill_keeps(plan: &Plan) -> u64 {
    if plan.floor >= plan.reserve {
        plan.floor + FLOOR_NOISE + reporting_margin(plan)
    } else {
        plan.reserve.max(plan.floor + reporting_margin(plan))
    }
}

/// Why the hold leaves the machine what it does, when free page reporting has a say in it.
fn reporting_bound(plan: &Plan) -> Option<String> {
    let r = plan.page_reporting.as_ref()?;
    Some(format!(
        "{}: the hold leaves MemAvailable {} above the floor {} ({} for the {} blocks of order {} a report \
         takes off the free lists at once{})",
        r.describe(),
        mib(fill_keeps(plan) - plan.floor),
        mib(plan.floor),
        mib(reporting_margin(plan)),
        fraglab_probe::page_reporting::PAGE_REPORTING_CAPACITY,
        plan.nr_orders - 1,
        if plan.floor >= plan.reserve { format!(", {} for noise", mib(FLOOR_NOISE)) } else { String::new() }
    ))
}

/// How long the pipe fill may go on when it may take up to `most` bytes: 60 s, and 2 s more a GiB
/// (writing pipes runs at about 1 GiB/s here; the rest is margin for a slower machine).
pub fn fill_time_bound(most: u64) -> Duration {
    Duration::from_secs(60 + 2 * (most >> 30))
}

/// Break up the high-order blocks still free after the cut with pipe pages, in steps, until none is
/// left (seen twice, a second apart, since freed pages drain from per-CPU lists late: a 200 ms gap
/// was tried, and the test run after it had an A/B's first SCTP window find an order-4 and an
/// order-5 block in DMA32 and say could not test), MemAvailable would fall below `keep` (the
/// reserve: what the rest of the machine was promised — a reserve that is itself mostly high-order
/// free blocks leaves the target unreached, and says so), a pipe cannot be had, or the time bound
/// passes (60 s, and 2 s more for every GiB the fill may take). Returns the last buddyinfo, the
/// leftover pages and which of those ended it; `None` when `stop` was set.
fn fill_leftovers(
    fill: &mut PipeFill,
    journal: &mut Journal,
    k: usize,
    keep: u64,
    progress: &mut dyn FnMut(Progress),
    stop: &AtomicBool,
) -> Result<Option<(BuddyInfo, u64, String)>> {
    let start = Instant::now();
    let most = mem_available()?.saturating_sub(keep);
    let room = fill.fit(most, journal)?;
    let bound = fill_time_bound(most);
    let mut clean_checks = 0;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let b = BuddyInfo::read()?;
        let left = leftover_pages(&b, k);
        progress(Progress::Filling { bytes: fill.bytes(), leftover_pages: left });
        let ended = |why: String, fill: &PipeFill| {
            format!(
                "{why}; {} in {} pipes of up to {}",
                mib(fill.bytes()),
                fill.pipes(),
                mib(fill.pipe_bytes() as u64)
            )
        };
        if left == 0 {
            clean_checks += 1;
            if clean_checks == 2 {
                let why = format!(
                    "no free block of order ≥ {k} left, after {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                return Ok(Some((b, 0, ended(why, fill))));
            }
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        clean_checks = 0;
        let left_bytes = left * PAGE_SIZE as u64;
        if start.elapsed() > bound {
            let why =
                format!("{} still free at order ≥ {k} at the {} s bound", mib(left_bytes), bound.as_secs());
            return Ok(Some((b, left, ended(why, fill))));
        }
        let avail = mem_available()?;
        // One step of margin: MemAvailable falls by a little more than the pipe pages written (their
        // slot arrays, accounting), and a fill that crossed the floor would set the guard off.
        if avail < keep + 2 * FILL_STEP {
            let why = format!(
                "{} still free at order ≥ {k}: MemAvailable {} leaves no {} step (and as much margin) above \
                 {} (what the hold leaves the machine)",
                mib(left_bytes),
                mib(avail),
                mib(FILL_STEP),
                mib(keep)
            );
            return Ok(Some((b, left, ended(why, fill))));
        }
        // Large leftovers (a reserve of many GiB) go in larger steps: buddyinfo is read once a step.
        // At most half the room left, so the overshoot (~2 % of a step: slot arrays, accounting) can
        // never carry MemAvailable below `keep`; at most 1 GiB, so a stop is seen within a second.
        let step = left_bytes.min(FILL_STEP.max(left_bytes / 4)).min((avail - keep) / 2).min(1 << 30);
        if let Err(e) = fill.fill(step) {
            let why =
                format!("{} still free at order ≥ {k}: {e:#} (room for {})", mib(left_bytes), mib(room));
            return Ok(Some((b, left, ended(why, fill))));
        }
    }
}

/// Per order, the planned free blocks whose first page still carries the BUDDY flag. `at` is sorted.
///
/// The kernel builds each /proc/kpageflags entry as it is read (~0.1 µs a frame, a look at 16 GiB
/// cut takes ~0.4 s on one CPU), so the blocks are checked in one share per CPU.
fn intact_blocks(at: &[(u64, usize)], nr_orders: usize) -> Result<Vec<u64>> {
    debug_assert!(at.is_sorted(), "planned blocks are sorted once, after the cut");
    // A share below a few thousand blocks costs more to start a thread for than to read.
    let share = at.len().div_ceil(crate::cpu::cpus().len()).max(4096);
    let mut intact = vec![0u64; nr_orders];
    for part in
        crate::cpu::each(&at.chunks(share).collect::<Vec<_>>(), false, |part| intact_in(part, nr_orders))
    {
        for (sum, n) in intact.iter_mut().zip(part?) {
            *sum += n;
        }
    }
    Ok(intact)
}

fn intact_in(sorted: &[(u64, usize)], nr_orders: usize) -> Result<Vec<u64>> {
    let mut flags = procfs::KPageFlags::new().context("cannot open /proc/kpageflags")?;
    let mut intact = vec![0u64; nr_orders];
    // Read in windows so neighbouring blocks share one read.
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i].0;
        let mut j = i;
        while j < sorted.len() && sorted[j].0 < start + 4096 {
            j += 1;
        }
        let end = sorted[j - 1].0 + 1;
        let range = flags
            .get_range_info(procfs::process::Pfn(start), procfs::process::Pfn(end))
            .context("cannot read /proc/kpageflags")?;
        for &(pfn, order) in &sorted[i..j] {
            if range[(pfn - start) as usize].contains(procfs::PhysicalPageFlags::BUDDY) {
                intact[order] += 1;
            }
        }
        i = j;
    }
    Ok(intact)
}

/// Refuse a target this kernel cannot express.
pub fn check_order(order: usize, nr_orders: usize) -> Result<()> {
    if order == 0 || order >= nr_orders {
        bail!(
            "max free order {order} is outside 1..={}: this kernel's largest order is {} (NR_PAGE_ORDERS {nr_orders} in /proc/buddyinfo)",
            nr_orders - 1,
            nr_orders - 1
        );
    }
    Ok(())
}

/// Free memory in Movable blocks below `order` outside the DMA zone (on `node`, when bound): what
/// the kernel hands the fragmenter's (movable) page faults before any whole aligned region of that order, since it takes
/// the smallest free block of the asked migratetype first and falls back to other types only when
/// none is left. pagetypeinfo prints at most 100000 blocks a list, so this can undercount.
fn small_movable_free_bytes(p: &PageTypeInfo, order: usize, node: Option<u32>) -> u64 {
    p.free
        .iter()
        .filter(|m| m.migratetype == "Movable" && m.zone != "DMA" && node.is_none_or(|n| m.node == n))
        .flat_map(|m| m.free.iter().take(order).enumerate().map(|(o, &n)| n << o))
        .sum::<u64>()
        * PAGE_SIZE as u64
}
