//! Take memory, cut it into the target shape, hold it, give it back.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fraglab_probe::buddyinfo::BuddyInfo;
use fraglab_probe::pagetypeinfo::PageTypeInfo;
use procfs::Current;
use serde::{Deserialize, Serialize};

use crate::arena::{Arena, PAGE_SIZE};
use crate::pipefill::PipeFill;
use crate::shape::{self, Cut};
use crate::sysctl::{Entry, Journal};
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
    /// While holding, MemAvailable below this makes fraglab give memory back before the OOM killer
    /// has to act.
    pub floor: u64,
    /// Set `vm.compaction_proactiveness = 0` while holding.
    pub no_proactive_compaction: bool,
    /// Number of orders of this kernel (`NR_PAGE_ORDERS`), from buddyinfo.
    pub nr_orders: usize,
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
    /// Whole-machine mode: breaking up the high-order blocks left in the untaken reserve.
    Filling {
        bytes: u64,
        leftover_pages: u64,
    },
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
    /// Whole-machine max-free-order mode: free pages still in blocks of order ≥ k in the target
    /// zones (every populated zone but DMA) when shaping ended; 0 means the target was reached.
    pub leftover_pages: Option<u64>,
    /// True when PFNs were hidden (not root) and the naive every-other-page pattern was used.
    pub naive: bool,
    pub buddyinfo_before: BuddyInfo,
    pub buddyinfo_populated: BuddyInfo,
    pub buddyinfo_now: BuddyInfo,
    pub sysctls: Vec<Entry>,
    /// What fraglab did on its own while holding (gave memory back, ...), with timestamps.
    pub events: Vec<String>,
    /// Set once the target no longer holds and why.
    pub target_lost: Option<String>,
}

/// A fragmenter holding memory in shape.
pub struct Fragmenter {
    plan: Plan,
    arena: Arena,
    journal: Journal,
    cut: Cut,
    kept: Vec<(usize, u64)>,
    fill: PipeFill,
    status: Status,
}

/// MemAvailable in bytes.
pub fn mem_available() -> Result<u64> {
    let m = procfs::Meminfo::current().context("cannot read /proc/meminfo")?;
    m.mem_available.context("/proc/meminfo has no MemAvailable (kernel older than 3.14)")
}

/// The default reserve for this machine: never below a few times the kernel's own min watermark.
pub fn default_reserve() -> Result<u64> {
    let min_free = crate::sysctl::read("vm.min_free_kbytes")?.parse::<u64>().unwrap_or(0) * 1024;
    let total = procfs::Meminfo::current().context("cannot read /proc/meminfo")?.mem_total;
    Ok((3 * min_free).max(total / 64).max(64 << 20))
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
    /// fails or when the fragmenter is released.
    pub fn start(plan: Plan, mut journal: Journal, progress: &mut dyn FnMut(Progress)) -> Result<Self> {
        // If the OOM killer must pick someone, it should be us: our memory is the cheapest to lose.
        std::fs::write("/proc/self/oom_score_adj", "1000").context("cannot set oom_score_adj")?;
        journal.set("vm.percpu_pagelist_high_fraction", PCP_HIGH_FRACTION)?;
        if plan.pin == Pin::Mlock {
            journal.set("vm.compact_unevictable_allowed", "0")?;
        }
        if plan.no_proactive_compaction {
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
        if plan.pin == Pin::Mlock {
            arena.lock()?;
        }
        let region_order = match &plan.target {
            Target::MaxFreeOrder { order, .. } => *order,
            Target::Profile { free, .. } => {
                free.iter().rposition(|&n| n > 0).map_or(0, |o| (o + 1).min(plan.nr_orders - 1))
            }
        };
        // A budget is the memory to shape into whole aligned regions. The buddy allocator hands
        // out the smallest free blocks first (__rmqueue_smallest), so on an already fragmented
        // machine whole regions start to come only once the free Movable blocks below the region order
        // are used up: a budgeted fragmenter takes more — up to 4× the budget, or the budget
        // plus those small blocks when they are more, never the reserve — until enough of what
        // it holds is usable, and gives the rest back after the cut.
        let total = match plan.budget {
            Some(b) => b,
            None => mem_available()?.saturating_sub(plan.reserve),
        };
        let small_free = small_movable_free_bytes(&PageTypeInfo::read()?, region_order);
        let cap = plan.budget.map_or(total, |b| b.saturating_mul(4).max(b.saturating_add(small_free)));
        let mut next_look = total;
        loop {
            if arena.bytes() >= total && (plan.budget.is_none() || arena.bytes() >= cap) {
                break;
            }
            if arena.bytes() >= next_look {
                let usable =
                    shape::usable_pages(&arena.pfns()?, region_order, plan.nr_orders) * PAGE_SIZE as u64;
                if usable * 10 >= total * 9 {
                    break;
                }
                // A look reads pagemap and sorts every page held (0.2 s a GiB): look again after
                // another quarter of the budget or of what is held, whichever is more, not after
                // every chunk.
                next_look = arena.bytes() + (total / 4).max(arena.bytes() / 4).max(CHUNK);
            }
            let step = CHUNK.min(cap - arena.bytes());
            let m = procfs::Meminfo::current().context("cannot read /proc/meminfo")?;
            if m.mem_available.context("/proc/meminfo has no MemAvailable")? < plan.reserve + step {
                break; // the reserve is not ours to take; shape what we have
            }
            // Past the budget, memory is taken only to find whole regions: from free memory, never
            // by making the kernel reclaim other processes' page cache for it.
            if plan.budget.is_some() && arena.bytes() >= total && m.mem_free < plan.reserve + step {
                break;
            }
            arena.populate(step as usize)?;
            progress(Progress::Populating { done: arena.bytes().min(total), total });
        }
        let buddyinfo_populated = BuddyInfo::read()?;

        progress(Progress::Cutting);
        let pfns = arena.pfns()?;
        let naive = pfns.iter().all(|&p| p == 0);
        let mut scale = 1.0;
        let cut = if naive {
            naive_cut(arena.pages(), &plan.target, plan.nr_orders)
        } else {
            match &plan.target {
                Target::MaxFreeOrder { order, free_bytes } => {
                    shape::max_free_order(&pfns, *order, free_bytes / PAGE_SIZE as u64, plan.nr_orders)
                }
                Target::Profile { free, .. } => {
                    // A budget bounds what is shaped; memory taken beyond it only to find whole
                    // aligned regions is surplus, given back after the cut, and must not unscale it.
                    let fit = plan
                        .budget
                        .map_or(arena.pages() as u64, |b| (b / PAGE_SIZE as u64).min(arena.pages() as u64));
                    let (scaled, f) = shape::scale_profile(free, fit);
                    scale = f;
                    shape::profile(&pfns, &scaled, plan.nr_orders)
                }
            }
        };
        progress(Progress::Freeing { pages: cut.freed_pages() });
        arena.free(&cut.runs)?;
        let surplus_pages: u64 = if plan.budget.is_some() {
            arena.free(&cut.surplus)?;
            cut.surplus.iter().map(|(s, e)| (e - s) as u64).sum()
        } else {
            0
        };
        let kept = kept_pages(&pfns, &cut, plan.budget.is_some());
        // One u64 per page taken: freed now so its pages do not become a free high-order block
        // after the last check (measured in a 1 GiB guest).
        drop(pfns);

        progress(Progress::Settling);
        let mut buddyinfo_now = settle()?;
        let mut fill = PipeFill::default();
        let mut leftover_pages = None;
        if let (None, Target::MaxFreeOrder { order, .. }) = (plan.budget, &plan.target) {
            let (b, left) = fill_leftovers(&mut fill, *order, plan.floor, progress)?;
            buddyinfo_now = b;
            leftover_pages = Some(left);
        }
        let status = Status {
            pid: std::process::id(),
            since: crate::instance::now_epoch(),
            target: plan.target.clone(),
            pin: plan.pin,
            budget: plan.budget,
            held_bytes: (arena.pages() as u64 - cut.freed_pages() - surplus_pages) * PAGE_SIZE as u64,
            surplus_bytes: surplus_pages * PAGE_SIZE as u64,
            freed_bytes: cut.freed_pages() * PAGE_SIZE as u64,
            planned: cut.blocks.clone(),
            intact: vec![0; plan.nr_orders],
            missing: cut.missing_blocks.clone(),
            missing_bytes: cut.missing_pages * PAGE_SIZE as u64,
            scale,
            moved_pages: 0,
            fill_bytes: fill.bytes(),
            leftover_pages,
            naive,
            buddyinfo_before,
            buddyinfo_populated,
            buddyinfo_now,
            sysctls: journal.entries().to_vec(),
            events: Vec::new(),
            target_lost: None,
        };
        let mut f = Fragmenter { plan, arena, journal, cut, kept, fill, status };
        f.refresh()?;
        Ok(f)
    }

    /// Re-read buddyinfo, which planned blocks are still free, and which held pages moved.
    pub fn refresh(&mut self) -> Result<&Status> {
        self.status.buddyinfo_now = BuddyInfo::read()?;
        if !self.status.naive && self.arena.pages() > 0 {
            self.status.intact = intact_blocks(&self.cut.at, self.plan.nr_orders)?;
            let pfns = self.arena.pfns()?;
            self.status.moved_pages =
                self.kept.iter().filter(|&&(i, pfn)| pfns.get(i).is_some_and(|&p| p != pfn)).count() as u64;
        }
        Ok(&self.status)
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
    /// until the reserve is available again — before the OOM killer has to act. Returns what it did.
    pub fn guard(&mut self) -> Result<Option<String>> {
        let avail = mem_available()?;
        if avail >= self.plan.floor || (self.arena.pages() == 0 && self.fill.bytes() == 0) {
            return Ok(None);
        }
        let want = self.plan.reserve.saturating_sub(avail).max(CHUNK);
        let given = self.arena.shrink(want);
        // Pipe pages (whole-machine mode) are unmovable and keep the reserve broken up, so they go
        // last — but they go: hundreds of MiB the OOM killer would otherwise have to find.
        let from_pipes = self.fill.shrink(want.saturating_sub(given));
        self.kept.retain(|&(i, _)| i < self.arena.pages());
        self.cut.at.clear();
        self.status.held_bytes = self.status.held_bytes.saturating_sub(given);
        self.status.fill_bytes = self.fill.bytes();
        let what = format!(
            "{}: MemAvailable {} MiB fell below the floor {} MiB; gave back {} MiB{}; target lost",
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
            avail >> 20,
            self.plan.floor >> 20,
            (given + from_pipes) >> 20,
            if from_pipes > 0 {
                format!(" ({} MiB of it pipe pages)", from_pipes >> 20)
            } else {
                String::new()
            }
        );
        self.status.events.push(what.clone());
        self.status.target_lost = Some("memory pressure: memory given back to avoid the OOM killer".into());
        Ok(Some(what))
    }

    /// Unmap everything and restore every sysctl.
    pub fn release(mut self) -> Result<Vec<crate::sysctl::Restored>> {
        self.fill.release();
        self.arena.release();
        self.journal.restore()
    }
}

/// Every arena page the cut keeps, with its PFN, to notice migration later. Surplus pages are not
/// kept when they were given back.
fn kept_pages(pfns: &[u64], cut: &Cut, surplus_given_back: bool) -> Vec<(usize, u64)> {
    let mut gone = vec![false; pfns.len()];
    let surplus: &[(usize, usize)] = if surplus_given_back { &cut.surplus } else { &[] };
    for &(s, e) in cut.runs.iter().chain(surplus) {
        gone[s..e].iter_mut().for_each(|g| *g = true);
    }
    pfns.iter().enumerate().filter(|&(i, _)| !gone[i]).map(|(i, &pfn)| (i, pfn)).collect()
}

/// Without PFNs, fall back to what engineers do by hand: free every other page (virtually). It
/// cannot aim at an order, so the result is whatever the physical layout allows.
fn naive_cut(pages: usize, target: &Target, nr_orders: usize) -> Cut {
    let want = match target {
        Target::MaxFreeOrder { free_bytes, .. } => (*free_bytes / PAGE_SIZE as u64) as usize,
        Target::Profile { free, .. } => free.iter().enumerate().map(|(o, n)| (*n as usize) << o).sum(),
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

/// Wait for the per-CPU lists to drain into the buddy lists: buddyinfo stops changing, or 3 s pass.
fn settle() -> Result<BuddyInfo> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = BuddyInfo::read()?;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = BuddyInfo::read()?;
        if now == last || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// Free pages in blocks of order ≥ `k` in the zones a whole-machine target covers: all but DMA,
/// which lowmem_reserve keeps out of reach of ordinary allocations anyway.
pub fn leftover_pages(b: &BuddyInfo, k: usize) -> u64 {
    b.zones.iter().filter(|z| z.zone != "DMA").map(|z| z.free_pages_at_or_above(k)).sum()
}

/// Break up the high-order blocks still free after the cut with pipe pages, in steps, until none is
/// left (seen twice, a second apart, since freed pages drain from per-CPU lists late), the floor
/// would be crossed, or 60 s pass. Returns the last buddyinfo and the leftover pages.
fn fill_leftovers(
    fill: &mut PipeFill,
    k: usize,
    floor: u64,
    progress: &mut dyn FnMut(Progress),
) -> Result<(BuddyInfo, u64)> {
    const STEP: u64 = 16 << 20;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut clean_checks = 0;
    loop {
        let b = BuddyInfo::read()?;
        let left = leftover_pages(&b, k);
        progress(Progress::Filling { bytes: fill.bytes(), leftover_pages: left });
        if left == 0 {
            clean_checks += 1;
            if clean_checks == 2 {
                return Ok((b, 0));
            }
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        clean_checks = 0;
        if Instant::now() > deadline || mem_available()? < floor + 2 * STEP {
            return Ok((b, left));
        }
        fill.fill(STEP.min(left * PAGE_SIZE as u64))?;
    }
}

/// Per order, the planned free blocks whose first page still carries the BUDDY flag.
fn intact_blocks(at: &[(u64, usize)], nr_orders: usize) -> Result<Vec<u64>> {
    let mut flags = procfs::KPageFlags::new().context("cannot open /proc/kpageflags")?;
    let mut intact = vec![0u64; nr_orders];
    let mut sorted: Vec<(u64, usize)> = at.to_vec();
    sorted.sort_unstable();
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

/// Free memory in Movable blocks below `order` outside the DMA zone: what the kernel hands the
/// fragmenter's (movable) page faults before any whole aligned region of that order, since it takes
/// the smallest free block of the asked migratetype first and falls back to other types only when
/// none is left. pagetypeinfo prints at most 100000 blocks a list, so this can undercount.
fn small_movable_free_bytes(p: &PageTypeInfo, order: usize) -> u64 {
    p.free
        .iter()
        .filter(|m| m.migratetype == "Movable" && m.zone != "DMA")
        .flat_map(|m| m.free.iter().take(order).enumerate().map(|(o, &n)| n << o))
        .sum::<u64>()
        * PAGE_SIZE as u64
}
