//! Keeping the target while holding, and knowing when it held.
//!
//! Pinned pages keep every region the cut made from merging, but the rest of memory — the reserve
//! fraglab did not take, the kernel's own — is freed and allocated all through a run: page tables,
//! exiting threads' stacks, a workload's own high-order buffers, blocks direct compaction builds out
//! of page cache. When such memory merges into a free block at or above the target order, the next
//! allocation that needs one gets it. Measured in a Debian 6.1 guest held at max free order 4:
//! `configs/sctp-lo-mtu64k.toml` said "not reproduced" in one run of three, every 32 KiB send served
//! (33 of 33), because one order-4 skb that compaction found kept being freed and re-allocated.
//!
//! So while holding a whole machine the keeper looks at /proc/buddyinfo every 10 ms and takes every
//! such block back with a kernel allocation of exactly its order: a pipe's ring of `struct
//! pipe_buffer` (40 bytes a slot), grown with F_SETPIPE_SZ, is one kcalloc, and above 8 KiB kmalloc
//! hands the request to the page allocator as one block of order get_order(size) — 2^(o+6) slots is
//! exactly order o for every o ≥ 2. The request is unmovable: it takes the smallest free block of at
//! least that order of its own migratetype, or steals one of another; when the only free blocks of
//! the target order or above are the ones that just formed, those are what it gets. Asked only when
//! buddyinfo shows such a block, it never sends the allocator into reclaim or compaction, except in
//! the race where someone else took the block first, or where the block was a HighAtomic reserve an
//! ordinary request may not take (both counted as `refused`, and backed off). Only orders above
//! PAGE_ALLOC_COSTLY_ORDER (3) are asked for: a cheaper order that finds no block goes into reclaim
//! and can call the OOM killer rather than fail (measured: it killed fraglab), so a target of max
//! free order 1–3 is watched, not kept.
//!
//! In budget mode, and for a profile target, the target is the regions the cut made: a free block at
//! or above their order can form inside one only if its kept page moves, which pinning forbids (and
//! which no allocation from user space could undo: the kernel, not the caller, picks the block). The
//! keeper checks the kept pages every second and counts a move as a loss; blocks that form outside
//! the regions are reported, not chased.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Result;
use fraglab_probe::buddyinfo::BuddyInfo;
use serde::{Deserialize, Serialize};

use crate::arena::PAGE_SIZE;
use crate::sysctl::Journal;

/// How often the keeper looks at buddyinfo while re-breaking (about 1 % of a core here).
pub const KEEP_EVERY: Duration = Duration::from_millis(10);

/// How often the kept pages are checked in regions mode: a pagemap read, ~10 ms a GiB held.
const REGIONS_EVERY: Duration = Duration::from_secs(1);

/// After the kernel refused a re-break, wait this long before asking again, doubling with every
/// refusal in a row up to [`MAX_BACKOFF`], so a block we cannot have does not send us into the
/// allocator's slow path a hundred times a second. Short at first: the usual refusal is a block in
/// the HighAtomic reserve (set aside after an atomic high-order allocation succeeded, usable by
/// those only), and the failed request itself makes the kernel give that reserve back
/// (`unreserve_highatomic_pageblock` after direct reclaim), so the next ask succeeds — a 200 ms
/// wait here kept 4 of 10 sctp-lo-mtu64k runs' decisive windows lost for 120–280 ms.
const BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How long re-breaking pauses when it would take MemAvailable below what the hold leaves.
const MEMORY_PAUSE: Duration = Duration::from_millis(200);

/// The smallest order the keeper asks for: one above PAGE_ALLOC_COSTLY_ORDER (3). A request of a
/// costly order that finds no block fails; one of order 3 or less loops in reclaim and, when that
/// cannot make a block (every region pinned), calls the OOM killer — which picks fraglab. Measured:
/// a 1 GiB guest held at max free order 3 with a TCP stream running (its order-3 page frags freed
/// and re-taken thousands of times a second) had fraglab OOM-killed within 0.4 s, 520 MiB still
/// available, when the keeper re-broke order-3 blocks. (A pipe ring is exact from order 2 up.)
pub const MIN_RING_ORDER: usize = 4;

/// Blocks re-broken in one look at most, so the fragmenter is not held from the guard (and a
/// status request) for long; the rest wait for the next look, 10 ms on.
const MAX_PER_LOOK: usize = 64;

pub use crate::pipefill::KEEPER_FDS;

/// A panic elsewhere must not stop the keeper, the guard or the release: the data under the lock
/// stays valid. Shared with [`crate::hold`].
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Losses kept for the record; a longer hold merges the rest into the last one.
const MAX_LOSSES: usize = 100_000;

/// The order a loss that cannot end is counted at: every order.
const TOP: usize = usize::MAX;

/// What "the target holds" means for a hold, and what the keeper does about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Keep {
    /// Whole machine, max free order k: no free block of order ≥ k in the zones in play (all but
    /// DMA); blocks that form are re-broken.
    Rebreak,
    /// The same check without re-breaking (`keep = false`, or a target order below
    /// [`MIN_RING_ORDER`]).
    Watch,
    /// A budget or a profile: held while every page the cut kept is where it was. Free blocks
    /// elsewhere are reported, not chased.
    Regions,
}

/// What the keeper did, for status and run.json.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Keeping {
    pub how: Keep,
    /// A free block of this order or above in the zones in play is a loss.
    pub order: usize,
    /// Why the keeper does not (or no longer) re-break, when it does not.
    pub note: Option<String>,
    /// Looks at the kernel.
    pub looks: u64,
    /// Blocks re-broken, per order.
    pub rebroken: Vec<u64>,
    /// Memory re-breaking added to the hold.
    pub added_bytes: u64,
    /// Pipes holding it (one a block).
    pub pipes: usize,
    /// Re-breaks the kernel refused (ENOMEM): the block was gone by the time we asked.
    pub refused: u64,
    /// Time the target was lost in all, each loss counted from the look before it was seen.
    pub lost_ns: u64,
    pub losses: u64,
    /// The thread that looks and re-breaks: its own failed allocations are fraglab's, not a
    /// workload's, and a failure catcher must leave them out.
    pub tid: Option<i32>,
    /// CPU time spent looking and re-breaking.
    pub cpu_ns: u64,
}

/// A stretch of time during which the target did not hold.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Loss {
    /// CLOCK_MONOTONIC, the clock probe.jsonl samples and run phases carry.
    pub start_ns: u64,
    /// `None` while still lost.
    pub end_ns: Option<u64>,
    /// The worst seen during it: `3 order-6 blocks free in DMA32`, `memory pressure: …`.
    pub why: String,
    /// Free pages at or above the order when it was worst; `u64::MAX` for a loss that cannot end.
    pub pages: u64,
    /// The largest free block seen during it (the top order for a loss that cannot end): a loss of
    /// order-5 blocks cannot have served an order-8 allocation.
    #[serde(default)]
    pub max_order: usize,
}

/// Free pages at or above the target order in one zone, at the last look.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneAbove {
    /// `Node 0, zone DMA32`.
    pub zone: String,
    pub pages: u64,
    /// Whether it counts against the target (a zone in play: not DMA; and none in regions mode,
    /// where the kept pages decide), or is only reported.
    pub in_play: bool,
}

/// When the target held: shared with whoever records samples and judges workload windows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Timeline {
    pub losses: Vec<Loss>,
    /// The last look, per zone: what it found, before re-breaking any.
    pub now: Vec<ZoneAbove>,
    pub last_look_ns: u64,
}

/// How much of a window the target was lost for, and the worst of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Lost {
    pub ns: u64,
    pub losses: u64,
    pub worst: Option<String>,
}

impl Timeline {
    /// The part of `[start_ns, end_ns]` the target was lost for with a free block of `min_order` or
    /// above (the target's order, or a higher one that an `[expect]` names).
    pub fn lost_within(&self, start_ns: u64, end_ns: u64, min_order: usize) -> Lost {
        let mut lost = Lost::default();
        let mut worst = 0;
        for l in self.losses.iter().filter(|l| l.max_order >= min_order) {
            let (s, e) = (l.start_ns.max(start_ns), l.end_ns.unwrap_or(u64::MAX).min(end_ns));
            if s >= e {
                continue;
            }
            lost.ns += e - s;
            lost.losses += 1;
            if lost.worst.is_none() || l.pages > worst {
                worst = l.pages;
                lost.worst = Some(l.why.clone());
            }
        }
        lost
    }

    /// A loss seen at a look; `since_ns` is the look before, when it may have begun. It never starts
    /// before the previous loss ended: a look that ends one can come late (a re-break that went
    /// through reclaim), and the same time must not be counted twice.
    fn open(&mut self, since_ns: u64, why: String, pages: u64, max_order: usize) {
        let since_ns = self.after_the_last(since_ns);
        let full = self.losses.len() >= MAX_LOSSES;
        match self.losses.last_mut() {
            Some(l) if l.end_ns.is_none() => {
                if pages > l.pages {
                    (l.why, l.pages) = (why, pages);
                }
                l.max_order = l.max_order.max(max_order);
            }
            // A record this long is a hold that keeps losing the target: rather than grow without
            // bound, count it lost from here on.
            _ if full => self.for_good(
                since_ns,
                format!("{why}, and more losses than the record keeps ({MAX_LOSSES}): lost from here on"),
            ),
            _ => self.losses.push(Loss { start_ns: since_ns, end_ns: None, why, pages, max_order }),
        }
    }

    /// A loss that cannot end (memory given back, a kept page moved): from `since_ns` on, for every
    /// order. One is enough; a second cause is added to its reason.
    fn for_good(&mut self, since_ns: u64, why: String) {
        if let Some(l) = self.losses.last_mut().filter(|l| l.end_ns.is_none() && l.pages == u64::MAX) {
            if !l.why.contains(&why) {
                l.why = format!("{}; {why}", l.why);
            }
            return;
        }
        self.close(since_ns);
        let since_ns = self.after_the_last(since_ns);
        self.losses.push(Loss { start_ns: since_ns, end_ns: None, why, pages: u64::MAX, max_order: TOP });
    }

    /// `ns`, or the end of the last loss if that is later: no time is counted in two losses.
    fn after_the_last(&self, ns: u64) -> u64 {
        ns.max(self.losses.last().and_then(|l| l.end_ns).unwrap_or(0))
    }

    fn close(&mut self, at_ns: u64) {
        if let Some(l) = self.losses.last_mut().filter(|l| l.end_ns.is_none() && l.pages != u64::MAX) {
            l.end_ns = Some(at_ns.max(l.start_ns));
        }
    }
}

/// The keeper of one hold.
pub struct Keeper {
    status: Keeping,
    /// Re-broken blocks, as (order, the pipe whose ring holds it).
    pipes: Vec<(usize, OwnedFd)>,
    timeline: Arc<Mutex<Timeline>>,
    /// MemAvailable re-breaking never goes below: what the pipe fill leaves too (the reserve).
    keep_available: u64,
    last_regions_look: Option<Instant>,
    backoff_until: Option<Instant>,
    /// The wait after the next refusal.
    backoff: Duration,
    /// Kept pages found moved so far (regions mode).
    moved: u64,
    /// Re-breaking is waiting for MemAvailable: the last block it wanted would have taken it below
    /// `keep_available`.
    paused: bool,
}

impl Keeper {
    /// A keeper for a hold of `order` (the max free order, or the order of a profile's regions).
    /// Re-breaking never takes MemAvailable below `keep_available`, and raises `fs.pipe-max-size`
    /// through `journal` so a ring of every order up to the kernel's largest can be asked for.
    pub fn new(
        how: Keep,
        order: usize,
        nr_orders: usize,
        keep_available: u64,
        journal: &mut Journal,
    ) -> Result<Keeper> {
        let mut note = None;
        let how = match how {
            Keep::Rebreak if order < MIN_RING_ORDER => {
                note = Some(format!(
                    "free blocks of order {order} are not re-broken: an allocation of order 3 or less \
                     that finds no block can call the OOM killer instead of failing, so the keeper \
                     asks for order {MIN_RING_ORDER} and above only; watching only"
                ));
                Keep::Watch
            }
            how => how,
        };
        // The limit binds only without CAP_SYS_RESOURCE (pipe_set_size): leave the machine-wide
        // sysctl alone when it does not.
        if how == Keep::Rebreak && !has_cap_sys_resource() {
            let most = PAGE_SIZE << (nr_orders - 1 + 6);
            let max = crate::sysctl::read("fs.pipe-max-size")?.parse::<usize>().unwrap_or(0);
            if max < most {
                journal.set("fs.pipe-max-size", &most.to_string())?;
            }
        }
        Ok(Keeper {
            status: Keeping {
                how,
                order,
                note,
                looks: 0,
                rebroken: vec![0; nr_orders],
                added_bytes: 0,
                pipes: 0,
                refused: 0,
                lost_ns: 0,
                losses: 0,
                tid: None,
                cpu_ns: 0,
            },
            pipes: Vec::new(),
            timeline: Arc::default(),
            keep_available,
            last_regions_look: None,
            backoff_until: None,
            backoff: BACKOFF,
            moved: 0,
            paused: false,
        })
    }

    /// The thread that looks and re-breaks, once it has looked.
    pub fn tid(&self) -> Option<i32> {
        self.status.tid
    }

    /// What "the target holds" means for this hold now (a keeper that had to stop re-breaking
    /// watches).
    pub fn how(&self) -> Keep {
        self.status.how
    }

    /// Whether free blocks that form are still taken back (not stopped for pressure, descriptors,
    /// or an error).
    pub fn rebreaking(&self) -> bool {
        self.status.how == Keep::Rebreak
    }

    /// Memory the re-broken blocks hold now.
    pub fn added_bytes(&self) -> u64 {
        self.status.added_bytes
    }

    /// Whether re-breaking is waiting for MemAvailable to come back above what the hold leaves the
    /// machine (the note says by how much).
    pub fn paused_for_memory(&self) -> bool {
        self.paused
    }

    /// When the target held, for samplers and verdicts on other threads.
    pub fn timeline(&self) -> Arc<Mutex<Timeline>> {
        Arc::clone(&self.timeline)
    }

    /// Start the record afresh: what was lost before the hold began (while shaping took the
    /// reserve's blocks) is not a loss of the hold.
    pub fn restart_record(&mut self) {
        *lock(&self.timeline) = Timeline::default();
    }

    pub fn status(&self) -> Keeping {
        let t = lock(&self.timeline);
        let now = fraglab_probe::snapshot::monotonic_ns().unwrap_or(0);
        let lost = t.lost_within(0, now, 0);
        Keeping { lost_ns: lost.ns, losses: lost.losses, ..self.status.clone() }
    }

    /// One look. `moved` counts the kept pages no longer where the cut left them, `None` when that
    /// cannot be seen (asked for in regions mode only, once a second unless `now`). Returns a line for
    /// the log when re-breaking stopped for good — a user must hear that the target is no longer
    /// kept; every block re-broken is in the status instead, or the log would fill.
    pub fn look(
        &mut self,
        now: bool,
        moved: &mut dyn FnMut() -> Result<Option<u64>>,
    ) -> Result<Option<String>> {
        if !now
            && self.status.how == Keep::Regions
            && self.last_regions_look.is_some_and(|t| t.elapsed() < REGIONS_EVERY)
        {
            return Ok(None);
        }
        let cpu = thread_cpu_ns();
        let out = self.look_now(moved);
        self.status.cpu_ns += thread_cpu_ns().saturating_sub(cpu);
        out
    }

    fn look_now(&mut self, moved: &mut dyn FnMut() -> Result<Option<u64>>) -> Result<Option<String>> {
        self.status.looks += 1;
        self.status.tid = Some(nix::unistd::gettid().as_raw());
        let before = self.last_look_ns();
        let now_ns = fraglab_probe::snapshot::monotonic_ns()?;
        let b = BuddyInfo::read()?;
        let zones = counted(&b, self.status.order, self.status.how);
        {
            let mut t = lock(&self.timeline);
            t.now = zones.clone();
            t.last_look_ns = now_ns;
        }
        if self.status.how == Keep::Regions {
            self.last_regions_look = Some(Instant::now());
            match moved()? {
                // A moved page does not come back: its region may be free as a whole from now on.
                Some(m) if m > self.moved => {
                    self.moved = m;
                    let why = format!(
                        "kept pages moved (migrated): the regions they kept may hold free blocks of order ≥ {}",
                        self.status.order
                    );
                    lock(&self.timeline).for_good(before, why);
                }
                Some(_) => {}
                None => lock(&self.timeline).for_good(
                    before,
                    "PFNs hidden (not root): whether the kept pages stayed cannot be seen".into(),
                ),
            }
            return Ok(None);
        }
        let found: u64 = zones.iter().filter(|z| z.in_play).map(|z| z.pages).sum();
        if found == 0 {
            lock(&self.timeline).close(now_ns);
            return Ok(None);
        }
        let max_order =
            b.zones.iter().filter(|z| in_play(&z.zone)).filter_map(|z| z.max_free_order()).max().unwrap_or(0);
        lock(&self.timeline).open(before, describe(&b, self.status.order), found, max_order);
        if self.status.how != Keep::Rebreak || self.backoff_until.is_some_and(|t| Instant::now() < t) {
            return Ok(None);
        }
        self.backoff_until = None;
        let said = self.rebreak(&b)?;
        let after = BuddyInfo::read()?;
        let left: u64 = above(&after, self.status.order).iter().filter(|z| z.in_play).map(|z| z.pages).sum();
        if left == 0 {
            lock(&self.timeline).close(fraglab_probe::snapshot::monotonic_ns()?);
        }
        Ok(said)
    }

    fn last_look_ns(&self) -> u64 {
        let t = lock(&self.timeline).last_look_ns;
        if t > 0 {
            t
        } else {
            fraglab_probe::snapshot::monotonic_ns().unwrap_or(0)
        }
    }

    /// Take every free block of the order or above that `b` shows in the zones in play, largest
    /// first. An order the kernel refuses is not asked again in this look, but the smaller ones
    /// still are (a block it will not hand out — a zone's last free memory above its watermark, a
    /// HighAtomic reserve — must not keep every other block free); after a refusal the next look
    /// waits. Returns a line when re-breaking had to stop for good.
    fn rebreak(&mut self, b: &BuddyInfo) -> Result<Option<String>> {
        let k = self.status.order;
        let mut wanted = vec![0u64; b.nr_orders()];
        for z in b.zones.iter().filter(|z| in_play(&z.zone)) {
            for (o, &n) in z.free.iter().enumerate().skip(k) {
                wanted[o] += n;
            }
        }
        let mut available = crate::arena::mem_available()?;
        let mut asked = 0;
        let (mut refused, mut took) = (false, false);
        'orders: for o in (k..wanted.len()).rev() {
            for _ in 0..wanted[o] {
                if asked == MAX_PER_LOOK {
                    break 'orders;
                }
                asked += 1;
                let bytes = (PAGE_SIZE as u64) << o;
                if available < self.keep_available + bytes {
                    // Memory a workload holds for a moment may come back: try again later, and let
                    // the record show the loss meanwhile.
                    self.status.note = Some(format!(
                        "re-breaking paused: an order-{o} block would take MemAvailable {} MiB below {} MiB \
                         (what the hold leaves the machine)",
                        available >> 20,
                        self.keep_available >> 20
                    ));
                    self.backoff_until = Some(Instant::now() + MEMORY_PAUSE);
                    self.paused = true;
                    return Ok(None);
                }
                if self.pipes.len() >= KEEPER_FDS && !crate::pipefill::descriptors_to_spare() {
                    let why = format!(
                        "stopped re-breaking: {} blocks re-broken, one descriptor each, and the descriptor \
                         limit leaves no more",
                        self.pipes.len()
                    );
                    return Ok(Some(self.stop_rebreaking(why)));
                }
                match ring(o) {
                    Ok(fd) => {
                        took = true;
                        if std::mem::take(&mut self.paused) {
                            self.status.note = None;
                        }
                        self.pipes.push((o, fd));
                        self.status.rebroken[o] += 1;
                        self.status.added_bytes += bytes;
                        self.status.pipes = self.pipes.len();
                        available -= bytes;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
                        self.status.refused += 1;
                        refused = true;
                        break;
                    }
                    Err(e) => {
                        let why = format!("stopped re-breaking: a pipe ring of order {o}: {e}");
                        return Ok(Some(self.stop_rebreaking(why)));
                    }
                }
            }
        }
        // A look with a refusal waits before the next, longer each time in a row; one with none
        // starts the wait afresh.
        if refused {
            self.backoff_until = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        } else if took {
            self.backoff = BACKOFF;
        }
        Ok(None)
    }

    fn stop_rebreaking(&mut self, why: String) -> String {
        self.status.how = Keep::Watch;
        self.status.note = Some(why.clone());
        why
    }

    /// Memory pressure: the guard gave memory back, so the target is gone for the rest of the hold,
    /// and re-breaking would only take memory the machine needs.
    pub fn lost_to_pressure(&mut self, why: &str) {
        if self.status.how == Keep::Rebreak {
            self.stop_rebreaking(format!("stopped re-breaking: {why}"));
        }
        let now = fraglab_probe::snapshot::monotonic_ns().unwrap_or(0);
        lock(&self.timeline).for_good(now, why.to_string());
    }

    /// Give back re-broken blocks, newest first, until `bytes` are freed. Returns the bytes freed.
    pub fn shrink(&mut self, bytes: u64) -> u64 {
        let mut given = 0;
        while given < bytes {
            let Some((o, _)) = self.pipes.pop() else { break };
            given += (PAGE_SIZE as u64) << o;
        }
        self.status.added_bytes -= given;
        self.status.pipes = self.pipes.len();
        given
    }

    /// Closing the pipes frees the rings: the blocks go back to the buddy allocator with the rest of
    /// the hold.
    pub fn release(&mut self) {
        self.pipes.clear();
        self.status.pipes = 0;
        self.status.added_bytes = 0;
    }
}

/// The zones a whole-machine target covers: all but DMA, which lowmem_reserve keeps out of reach of
/// every ordinary allocation while fraglab holds (`vm.lowmem_reserve_ratio`).
pub fn in_play(zone: &str) -> bool {
    zone != "DMA"
}

/// Free pages at or above `order` per zone, each marked whether it counts against a hold kept
/// `how`: the zones in play, and none in regions mode, where the kept pages decide and free blocks
/// elsewhere are only reported.
pub fn counted(b: &BuddyInfo, order: usize, how: Keep) -> Vec<ZoneAbove> {
    let mut zones = above(b, order);
    if how == Keep::Regions {
        zones.iter_mut().for_each(|z| z.in_play = false);
    }
    zones
}

/// Free pages at or above `order`, per zone.
pub fn above(b: &BuddyInfo, order: usize) -> Vec<ZoneAbove> {
    b.zones
        .iter()
        .map(|z| ZoneAbove {
            zone: z.label(),
            pages: z.free_pages_at_or_above(order),
            in_play: in_play(&z.zone),
        })
        .collect()
}

/// `3 order-6 and 1 order-7 blocks free in DMA32` for every zone in play that has any.
pub fn describe(b: &BuddyInfo, order: usize) -> String {
    let parts: Vec<String> = b
        .zones
        .iter()
        .filter(|z| in_play(&z.zone) && z.free_pages_at_or_above(order) > 0)
        .map(|z| {
            let blocks: Vec<String> = z
                .free
                .iter()
                .enumerate()
                .skip(order)
                .filter(|(_, &n)| n > 0)
                .map(|(o, &n)| format!("{n} order-{o}"))
                .collect();
            let zone = if b.zones.iter().any(|o| o.node != 0) { z.label() } else { z.zone.clone() };
            let n: u64 = z.free.iter().skip(order).sum();
            format!("{} block{} free in {zone}", blocks.join(", "), if n == 1 { "" } else { "s" })
        })
        .collect();
    parts.join("; ")
}

/// One kernel allocation of exactly `order` (≥ [`MIN_RING_ORDER`]): a new pipe whose slot array is
/// grown to 2^(order+6) slots of 40 bytes. The read end is closed; the ring lives until the write
/// end does.
fn ring(order: usize) -> std::io::Result<OwnedFd> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    drop(r);
    let bytes = (PAGE_SIZE << (order + 6)) as libc::c_int;
    // SAFETY: F_SETPIPE_SZ on a pipe we own.
    if unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, bytes) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(w)
}

/// linux/capability.h; the libc crate does not carry capability numbers.
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process may grow a pipe past `fs.pipe-max-size`.
fn has_cap_sys_resource() -> bool {
    procfs::process::Process::myself()
        .and_then(|p| p.status())
        .is_ok_and(|s| s.capeff & (1 << CAP_SYS_RESOURCE) != 0)
}

/// CPU time of the calling thread.
fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Debian 6.1 guest right after boot (crates/probe/tests/captures/guest-6.1/README.md).
    fn guest_after_boot() -> BuddyInfo {
        let text = include_str!("../../probe/tests/captures/guest-6.1/buddyinfo");
        BuddyInfo::parse(text, "guest-6.1/buddyinfo").unwrap()
    }

    #[test]
    fn a_loss_names_every_order_in_the_zones_in_play_and_not_dma() {
        let b = guest_after_boot();
        assert_eq!(
            describe(&b, 4),
            "1 order-4, 2 order-5, 1 order-6, 2 order-7, 2 order-8, 3 order-9, 223 order-10 blocks free in DMA32"
        );
        assert_eq!(describe(&b, 10), "223 order-10 blocks free in DMA32");
        let zones = above(&b, 9);
        assert_eq!(zones[0].zone, "Node 0, zone DMA");
        assert_eq!((zones[0].pages, zones[0].in_play), (3 * 1024 + 512, false));
        assert_eq!((zones[1].pages, zones[1].in_play), (223 * 1024 + 3 * 512, true));
    }

    fn loss(start_ns: u64, end_ns: Option<u64>, pages: u64, max_order: usize) -> Loss {
        Loss { start_ns, end_ns, why: format!("{pages} pages"), pages, max_order }
    }

    #[test]
    fn lost_within_counts_only_the_overlap_and_names_the_worst() {
        let t = Timeline {
            losses: vec![loss(100, Some(130), 16, 4), loss(500, Some(520), 2048, 9), loss(900, None, 32, 5)],
            ..Timeline::default()
        };
        // A window that starts inside the first loss and ends inside the open one.
        let lost = t.lost_within(120, 1000, 4);
        assert_eq!((lost.ns, lost.losses), (10 + 20 + 100, 3));
        assert_eq!(lost.worst.as_deref(), Some("2048 pages"));
        // Only losses with a block of the order that matters count: order 5 cannot serve order 8.
        assert_eq!((t.lost_within(120, 1000, 8).ns, t.lost_within(120, 1000, 8).losses), (20, 1));
        assert_eq!(t.lost_within(120, 1000, 10), Lost::default());
        // Before, between and exactly at the edges of losses: nothing.
        assert_eq!(t.lost_within(0, 100, 4), Lost::default());
        assert_eq!(t.lost_within(130, 500, 4), Lost::default());
        // An open loss runs to the window's end however late it is.
        assert_eq!(t.lost_within(950, 10_000_000, 4).ns, 10_000_000 - 950);
    }

    #[test]
    fn a_loss_stays_open_until_a_look_sees_none_and_pressure_never_closes() {
        let mut t = Timeline::default();
        t.open(10, "small".into(), 16, 4);
        t.open(20, "large".into(), 4096, 10);
        t.open(30, "small again".into(), 16, 4);
        assert_eq!(t.losses.len(), 1, "one loss while it lasts, from the look before it was seen");
        assert_eq!((t.losses[0].start_ns, t.losses[0].why.as_str()), (10, "large"));
        assert_eq!(t.losses[0].max_order, 10);
        t.close(40);
        assert_eq!(t.losses[0].end_ns, Some(40));
        t.close(50);
        assert_eq!(t.losses[0].end_ns, Some(40), "closing twice keeps the first end");
        t.for_good(60, "memory pressure".into());
        t.close(70);
        t.for_good(80, "kept pages moved".into());
        assert_eq!(t.losses.len(), 2, "one loss that cannot end, with both reasons");
        assert_eq!(t.losses[1].end_ns, None, "memory given back does not come back");
        assert_eq!(t.losses[1].why, "memory pressure; kept pages moved");
        assert_eq!(t.lost_within(0, 100, 10).ns, 30 + 40, "the second counted once, from when it began");
    }
}
