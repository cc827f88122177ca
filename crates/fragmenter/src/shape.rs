//! Choosing which of our pages to free so the buddy allocator sees exactly the free blocks we want.
//!
//! The buddy allocator merges a free block of order `o` with its buddy (the other half of the aligned
//! block of order `o + 1`) only when the buddy is free too. So a freed, aligned run of 2^o pages stays
//! an order-`o` block for as long as its buddy holds at least one page we keep. Everything here works
//! on physical frame numbers read from pagemap; nothing touches the kernel.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::frames::Frames;

use serde::{Deserialize, Serialize};

/// What the plan asks the allocator to end up with in the memory we own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// Page indices (into the arena) to free, merged into `[start, end)` runs in virtual order.
    pub runs: Vec<(usize, usize)>,
    /// Free blocks this creates, per order.
    pub blocks: Vec<u64>,
    /// Each free block as (first PFN, order), to check later that it is still free.
    pub at: Vec<(u64, usize)>,
    /// Free blocks the target asked for but our memory could not hold, per order.
    pub missing_blocks: Vec<u64>,
    /// Pages the target asked to free that our memory could not hold.
    pub missing_pages: u64,
    /// Arena pages outside every region the cut used, merged into runs: pages a budgeted
    /// fragmenter took only to find whole regions, which it can give back untouched.
    pub surplus: Vec<(usize, usize)>,
}

impl Cut {
    pub fn freed_pages(&self) -> u64 {
        self.runs.iter().map(|(s, e)| (e - s) as u64).sum()
    }

    /// Add a cut made in other pages (another zone's): its runs, blocks and what it missed. The
    /// surplus is not merged: each zone's counts every page outside that zone, the others' cuts
    /// included, so together they mean nothing (a whole machine gives no surplus back anyway).
    pub fn merge(&mut self, other: Cut) {
        for (sum, n) in self.blocks.iter_mut().zip(&other.blocks) {
            *sum += n;
        }
        for (sum, n) in self.missing_blocks.iter_mut().zip(&other.missing_blocks) {
            *sum += n;
        }
        self.missing_pages += other.missing_pages;
        let freed = self.freed_pages() + other.freed_pages();
        self.at.extend(other.at);
        self.runs = merged(std::mem::take(&mut self.runs), other.runs);
        debug_assert_eq!(self.freed_pages(), freed, "zones' cuts never share a page");
        self.surplus.clear();
    }
}

/// Two sets of `[start, end)` runs as one, ascending, touching or overlapping runs joined.
fn merged(a: Vec<(usize, usize)>, b: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    let mut all = a;
    all.extend(b);
    all.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(all.len());
    for (s, e) in all {
        match out.last_mut() {
            Some((_, end)) if *end >= s => *end = (*end).max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Our pages grouped into aligned, fully owned physical regions, by order.
#[derive(Debug, Default)]
struct Regions {
    /// `by_order[o]` = start PFNs of owned, aligned regions of 2^o pages that are still whole.
    by_order: Vec<Vec<u64>>,
    /// The top-level regions the cut took from (start PFN, order): every page in them is either
    /// freed or kept as somebody's buddy. Pages outside them are surplus to the cut.
    touched: Vec<(u64, usize)>,
    /// Starts of regions split off a touched region and returned to the pool, so taking them later
    /// does not count them twice.
    inside: HashSet<u64>,
}

impl Regions {
    /// Split the owned PFNs into maximal aligned regions no larger than `max_order`.
    fn from_pfns(sorted_pfns: &[u64], max_order: usize) -> Self {
        let mut by_order = vec![Vec::new(); max_order + 1];
        let mut i = 0;
        while i < sorted_pfns.len() {
            let mut j = i + 1;
            while j < sorted_pfns.len() && sorted_pfns[j] == sorted_pfns[j - 1] + 1 {
                j += 1;
            }
            // [start, end) is a physically contiguous run of our pages: carve it into aligned blocks.
            let (mut start, end) = (sorted_pfns[i], sorted_pfns[j - 1] + 1);
            while start < end {
                let align = if start == 0 { max_order } else { start.trailing_zeros() as usize };
                let mut order = align.min(max_order);
                while start + (1 << order) > end {
                    order -= 1;
                }
                by_order[order].push(start);
                start += 1 << order;
            }
            i = j;
        }
        // Ascending, so pop() takes the highest PFNs first: Normal before DMA32, which 32-bit DMA
        // devices need.
        for list in &mut by_order {
            list.sort_unstable();
        }
        Regions { by_order, touched: Vec::new(), inside: HashSet::new() }
    }

    /// Take a whole region of exactly `order`, splitting a larger one if needed; the halves split off
    /// go back to the pool untouched.
    fn take(&mut self, order: usize) -> Option<u64> {
        let from = (order..self.by_order.len()).find(|&o| !self.by_order[o].is_empty())?;
        let start = self.by_order[from].pop()?;
        if !self.inside.remove(&start) {
            self.touched.push((start, from));
        }
        for o in (order..from).rev() {
            self.give_back_inside(start + (1 << o), o);
        }
        Some(start)
    }

    /// Return part of a touched region to the pool; it stays inside the touched region.
    fn give_back_inside(&mut self, start: u64, order: usize) {
        self.by_order[order].push(start);
        self.inside.insert(start);
    }
}

/// No free block of order `k` or above: in each owned aligned 2^k region keep the first page and free
/// the rest, which leaves one free block of every order below `k` there; stop after `free_pages`.
///
/// One pass over the pages through a bitmap of the frames owned ([`Frames`]): no sort of what is
/// held and no map from frame to page, so the cut costs what reading pagemap costs. When more
/// regions are whole than the target needs, the ones at the highest PFNs are cut (Normal before
/// DMA32, which 32-bit DMA devices need), and the lowest of them takes the remainder.
pub fn max_free_order(pfns: &[u64], owned: &Frames, k: usize, free_pages: u64, nr_orders: usize) -> Cut {
    assert!(k >= 1 && k < nr_orders, "max free order {k} outside 1..{nr_orders}: resolve the plan first");
    assert_eq!(owned.order(), k, "the frame set must count regions of the cut's order");
    let region = 1u64 << k;
    let per_region = region - 1;
    let mut starts: Vec<u64> =
        pfns.iter().copied().filter(|&p| p != 0 && p % region == 0 && owned.is_whole(p)).collect();
    let need = free_pages.div_ceil(per_region) as usize;
    if starts.len() > need {
        // Partitioned, not sorted: the `need` highest starts first, in no particular order.
        if need > 0 {
            starts.select_nth_unstable_by(need - 1, |a, b| b.cmp(a));
        }
        starts.truncate(need);
    }
    let chosen = Frames::from_pfns(&starts, 0);
    let full = (starts.len() as u64).min(free_pages / per_region);
    // Pages of the one region cut short, as a mask of orders: freeing the buddies of its first page
    // from the top while they fit takes exactly the binary digits of what is left.
    // There is one only when a region is left over once the full ones are counted: when whole
    // regions ran out, every one found is cut in full and the rest is missing.
    let (partial, rest) = match free_pages - full * per_region {
        rest if rest > 0 && starts.len() as u64 > full => (starts.iter().copied().min(), rest),
        _ => (None, 0),
    };
    let mut blocks = vec![0u64; nr_orders];
    let mut at = Vec::with_capacity(starts.len() * k);
    for &start in &starts {
        let orders = if Some(start) == partial { rest } else { per_region };
        for o in (0..k).filter(|o| orders & (1 << o) != 0) {
            blocks[o] += 1;
            at.push((start + (1 << o), o));
        }
    }
    let mut runs = Runs::default();
    let mut surplus = Runs::default();
    for (i, &p) in pfns.iter().enumerate() {
        let (start, offset) = (p & !(region - 1), p & (region - 1));
        if p == 0 || !chosen.contains(start) {
            surplus.push(i);
            continue;
        }
        // The block an offset falls in is the buddy of order ⌊log2 offset⌋ of the region's first page.
        let freed = offset != 0 && (Some(start) != partial || rest & (1 << offset.ilog2()) != 0);
        if freed {
            runs.push(i);
        }
    }
    let freed_pages: u64 = blocks.iter().enumerate().map(|(o, &n)| n << o).sum();
    let left = free_pages - freed_pages;
    // What was not freed, as the blocks it would have been: one of each order below k per region
    // that was not found, then the remainder as the loop above would have cut it.
    let mut missing_blocks = vec![0u64; nr_orders];
    let mut rest = left % per_region;
    for (o, m) in missing_blocks.iter_mut().enumerate().take(k).rev() {
        *m = left / per_region;
        if 1u64 << o <= rest {
            *m += 1;
            rest -= 1 << o;
        }
    }
    Cut { runs: runs.0, blocks, at, missing_blocks, missing_pages: left, surplus: surplus.0 }
}

/// Arena page indices, pushed ascending, merged into `[start, end)` runs.
#[derive(Default)]
struct Runs(Vec<(usize, usize)>);

impl Runs {
    fn push(&mut self, i: usize) {
        match self.0.last_mut() {
            Some((_, end)) if *end == i => *end += 1,
            _ => self.0.push((i, i + 1)),
        }
    }
}

/// Reproduce `target[o]` free blocks of each order `o` in our memory.
///
/// Highest orders first, each from the smallest region that fits: an order-`o` block is the lower
/// half of an owned aligned 2^(o+1) region whose upper half stays ours (and may host smaller blocks
/// in turn, which always keep half of it). At the top order there is no buddy to merge with, so the
/// whole region is freed.
pub fn profile(pfns: &[u64], target: &[u64], nr_orders: usize) -> Cut {
    let (index, sorted) = index_by_pfn(pfns);
    let top = nr_orders - 1;
    let mut regions = Regions::from_pfns(&sorted, top);
    let mut freed = Vec::new();
    let mut blocks = vec![0u64; nr_orders];
    let mut missing_blocks = vec![0u64; nr_orders];
    for o in (0..target.len().min(nr_orders)).rev() {
        for _ in 0..target[o] {
            if o == top {
                match regions.take(o) {
                    Some(start) => freed.push((start, 1u64 << o)),
                    None => {
                        missing_blocks[o] += 1;
                        continue;
                    }
                }
            } else {
                match regions.take(o + 1) {
                    Some(start) => {
                        freed.push((start, 1u64 << o));
                        regions.give_back_inside(start + (1 << o), o);
                    }
                    None => {
                        missing_blocks[o] += 1;
                        continue;
                    }
                }
            }
            blocks[o] += 1;
        }
    }
    let missing_pages = missing_blocks.iter().enumerate().map(|(o, &n)| n << o).sum();
    let at = block_list(&freed);
    let surplus = surplus(pfns, &regions.touched, &index);
    Cut { runs: to_runs(&freed, &index), blocks, at, missing_blocks, missing_pages, surplus }
}

/// Scale a profile so that building it needs no more than `pages` pages of ours (each order-`o`
/// block needs an owned 2^(o+1) region in the worst case). Returns the factor used (≤ 1).
pub fn scale_profile(target: &[u64], pages: u64) -> (Vec<u64>, f64) {
    let need = profile_pages(target);
    if need <= pages || need == 0 {
        return (target.to_vec(), 1.0);
    }
    let f = pages as f64 / need as f64;
    (target.iter().map(|&n| (n as f64 * f).floor() as u64).collect(), f)
}

/// Pages needed to hold `target` at worst: an owned 2^(o+1) region for every order-`o` block.
pub fn profile_pages(target: &[u64]) -> u64 {
    target.iter().enumerate().map(|(o, &n)| n.saturating_mul(2 << o)).fold(0, u64::saturating_add)
}

/// `pfns[i]` is the PFN of arena page `i` (0 = not present): the owned PFNs sorted, and PFN → index.
fn index_by_pfn(pfns: &[u64]) -> (HashMap<u64, usize>, Vec<u64>) {
    let index: HashMap<u64, usize> =
        pfns.iter().enumerate().filter(|(_, &p)| p != 0).map(|(i, &p)| (p, i)).collect();
    let mut sorted: Vec<u64> = index.keys().copied().collect();
    sorted.sort_unstable();
    (index, sorted)
}

fn surplus(pfns: &[u64], touched: &[(u64, usize)], index: &HashMap<u64, usize>) -> Vec<(usize, usize)> {
    let mut used: HashSet<usize> = HashSet::new();
    for &(start, order) in touched {
        used.extend((start..start + (1u64 << order)).map(|pfn| index[&pfn]));
    }
    let mut runs = Runs::default();
    for i in (0..pfns.len()).filter(|i| !used.contains(i)) {
        runs.push(i);
    }
    runs.0
}

fn block_list(freed: &[(u64, u64)]) -> Vec<(u64, usize)> {
    freed.iter().map(|&(start, len)| (start, len.trailing_zeros() as usize)).collect()
}

/// Physical blocks → arena page indices → merged virtual runs, so the kernel gets few, long ranges.
fn to_runs(freed: &[(u64, u64)], index: &HashMap<u64, usize>) -> Vec<(usize, usize)> {
    let mut pages: Vec<usize> =
        freed.iter().flat_map(|&(start, len)| (start..start + len).map(|pfn| index[&pfn])).collect();
    pages.sort_unstable();
    let mut runs = Runs::default();
    for p in pages {
        runs.push(p);
    }
    runs.0
}

/// Free blocks per order that a set of freed physical pages forms, as the buddy allocator would merge
/// them if nothing else in memory were free — the checker for a cut.
pub fn buddy_blocks(freed_pfns: &[u64], nr_orders: usize) -> Vec<u64> {
    let mut current: BTreeSet<u64> = freed_pfns.iter().copied().collect();
    let mut blocks = vec![0u64; nr_orders];
    for (o, count) in blocks.iter_mut().enumerate() {
        let mut merged = BTreeSet::new();
        for &b in &current {
            if o + 1 < nr_orders && current.contains(&(b ^ (1 << o))) {
                merged.insert(b & !(1 << o)); // both buddies name the same parent
            } else {
                *count += 1;
            }
        }
        current = merged;
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Arena pages mapped onto a shuffled subset of a physical range, like a real populate.
    fn arena(range: u64, holes: &[u64], seed: u64) -> Vec<u64> {
        let mut pfns: Vec<u64> = (4096..4096 + range).filter(|p| !holes.contains(&(p % 997))).collect();
        // A cheap deterministic shuffle: the kernel hands out pages in no useful virtual order.
        let n = pfns.len();
        for i in 0..n {
            let j = ((i as u64).wrapping_mul(6364136223846793005).wrapping_add(seed) % n as u64) as usize;
            pfns.swap(i, j);
        }
        pfns
    }

    fn freed_pfns(pfns: &[u64], cut: &Cut) -> Vec<u64> {
        cut.runs.iter().flat_map(|&(s, e)| (s..e).map(|i| pfns[i])).collect()
    }

    proptest! {
        // Each case builds an arena of up to ~100k pages; fewer cases keep debug builds quick.
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn max_free_order_leaves_nothing_at_or_above_k(
            range in 64u64..20_000, k in 1usize..10, frac in 0.0f64..1.0,
            holes in proptest::collection::vec(0u64..997, 0..20), seed: u64,
        ) {
            let pfns = arena(range, &holes, seed);
            let want = (pfns.len() as f64 * frac) as u64;
            let cut = max_free_order(&pfns, &Frames::from_pfns(&pfns, k), k, want, 11);
            let blocks = buddy_blocks(&freed_pfns(&pfns, &cut), 11);
            prop_assert_eq!(&blocks, &cut.blocks);
            prop_assert!(blocks[k..].iter().all(|&n| n == 0), "{:?}", blocks);
            prop_assert_eq!(cut.freed_pages() + cut.missing_pages, want);
            // The per-order shortfall adds up to the pages not freed, all below k.
            let short: u64 = cut.missing_blocks.iter().enumerate().map(|(o, &n)| n << o).sum();
            prop_assert_eq!(short, cut.missing_pages);
            prop_assert!(cut.missing_blocks[k..].iter().all(|&n| n == 0));
            // Only the last region needed may be cut short; when whole regions ran out, none is.
            prop_assert!(cut.blocks[..k].iter().all(|&n| n.abs_diff(cut.blocks[0]) <= 1), "{:?}", cut.blocks);
            if cut.missing_pages > 0 {
                prop_assert!(cut.blocks[..k].iter().all(|&n| n == cut.blocks[0]), "{:?}", cut.blocks);
            }
            // Surplus never overlaps the cut, and giving it back cannot merge into a freed block:
            // each touched region keeps a page.
            let surplus: BTreeSet<usize> = cut.surplus.iter().flat_map(|&(s, e)| s..e).collect();
            prop_assert!(cut.runs.iter().flat_map(|&(s, e)| s..e).all(|i| !surplus.contains(&i)));
            let mut all = freed_pfns(&pfns, &cut);
            all.extend(surplus.iter().map(|&i| pfns[i]));
            let merged = buddy_blocks(&all, 11);
            let regions = cut.blocks[0];
            prop_assert!(regions == 0 || merged[..k].iter().sum::<u64>() >= regions, "{:?}", merged);
        }

        #[test]
        fn profile_is_reproduced_exactly_when_it_fits(
            target in proptest::collection::vec(0u64..12, 11), seed: u64,
        ) {
            let need = profile_pages(&target);
            let pfns = arena(need.max(1) * 2 + 2048, &[], seed);
            let cut = profile(&pfns, &target, 11);
            prop_assert!(cut.missing_blocks.iter().all(|&n| n == 0));
            prop_assert_eq!(&buddy_blocks(&freed_pfns(&pfns, &cut), 11), &target);
        }
    }

    #[test]
    fn seed_profile_scaled_into_a_small_arena() {
        let target = [40773, 37, 34, 29, 0, 0, 0, 0, 0, 0, 0];
        let pfns = arena(32 * 1024, &[5, 77], 9);
        let (scaled, f) = scale_profile(&target, pfns.len() as u64);
        assert!(f < 1.0 && scaled[0] > 0);
        let cut = profile(&pfns, &scaled, 11);
        let blocks = buddy_blocks(&freed_pfns(&pfns, &cut), 11);
        for o in 0..11 {
            assert_eq!(blocks[o] + cut.missing_blocks[o], scaled[o], "order {o}");
        }
    }
}
