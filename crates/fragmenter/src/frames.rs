//! The physical frames the fragmenter owns, as a bitmap over PFNs: which aligned regions of an order
//! it owns whole, in O(1) a page and without sorting what it holds.
//!
//! The bitmap is sparse, one 32 KiB page of bits for every 1 GiB of physical address space that holds
//! a frame of ours: a budget whose frames lie in a few GiB costs a few of those pages wherever the
//! machine's memory sits, a whole 24 GiB machine 768 KiB, a whole 1 TiB one 32 MiB. Checking a
//! region is one word for orders below 6, and 2^(order − 6) words above.

use std::collections::HashMap;

/// Frames a bitmap page covers: 2^18 frames, 1 GiB of 4 KiB pages. Larger than any aligned region
/// the buddy allocator knows (order ≤ 10 on x86, 2^(MAX_PAGE_ORDER) frames elsewhere), so a region
/// never straddles two pages.
const SPAN_SHIFT: u32 = 18;
const WORDS: usize = (1 << SPAN_SHIFT) / 64;

/// A set of PFNs that counts, as frames are added, the aligned regions of `order` it holds whole.
#[derive(Debug)]
pub struct Frames {
    order: usize,
    index: HashMap<u64, usize>,
    pages: Vec<Box<[u64]>>,
    /// The page of the last lookup: frames come in long runs within one span.
    last: Option<(u64, usize)>,
    whole: u64,
    len: u64,
}

impl Frames {
    /// An empty set counting whole regions of 2^`order` frames.
    pub fn new(order: usize) -> Self {
        assert!(order < SPAN_SHIFT as usize, "order {order} regions would straddle bitmap pages");
        Frames { order, index: HashMap::new(), pages: Vec::new(), last: None, whole: 0, len: 0 }
    }

    /// The set of `pfns`, skipping 0 (a page pagemap did not show).
    pub fn from_pfns(pfns: &[u64], order: usize) -> Self {
        let mut f = Frames::new(order);
        f.extend(pfns);
        f
    }

    pub fn extend(&mut self, pfns: &[u64]) {
        for &p in pfns.iter().filter(|&&p| p != 0) {
            self.insert(p);
        }
    }

    fn page(&mut self, span: u64) -> usize {
        if let Some((s, i)) = self.last {
            if s == span {
                return i;
            }
        }
        let next = self.pages.len();
        let i = *self.index.entry(span).or_insert(next);
        if i == next {
            self.pages.push(vec![0u64; WORDS].into_boxed_slice());
        }
        self.last = Some((span, i));
        i
    }

    fn find(&self, span: u64) -> Option<&[u64]> {
        match self.last {
            Some((s, i)) if s == span => Some(&self.pages[i]),
            _ => self.index.get(&span).map(|&i| &*self.pages[i]),
        }
    }

    /// Add a frame; a frame added twice counts once.
    pub fn insert(&mut self, pfn: u64) {
        let i = self.page(pfn >> SPAN_SHIFT);
        let bit = (pfn & ((1 << SPAN_SHIFT) - 1)) as usize;
        let word = &mut self.pages[i][bit / 64];
        let mask = 1u64 << (bit % 64);
        if *word & mask != 0 {
            return;
        }
        *word |= mask;
        self.len += 1;
        // Each frame is added once, so a region becomes whole exactly when its last frame comes.
        if whole_in(&self.pages[i], bit, self.order) {
            self.whole += 1;
        }
    }

    pub fn contains(&self, pfn: u64) -> bool {
        let bit = (pfn & ((1 << SPAN_SHIFT) - 1)) as usize;
        self.find(pfn >> SPAN_SHIFT).is_some_and(|page| page[bit / 64] & (1 << (bit % 64)) != 0)
    }

    /// Whether every frame of the aligned region of the set's order that holds `pfn` is in the set.
    pub fn is_whole(&self, pfn: u64) -> bool {
        let bit = (pfn & ((1 << SPAN_SHIFT) - 1)) as usize;
        self.find(pfn >> SPAN_SHIFT).is_some_and(|page| whole_in(page, bit, self.order))
    }

    /// The order of the regions the set counts.
    pub fn order(&self) -> usize {
        self.order
    }

    /// Aligned regions of the set's order held whole.
    pub fn whole(&self) -> u64 {
        self.whole
    }

    /// Frames in the set.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Whether the aligned 2^`order` bits around `bit` are all set in `page`.
fn whole_in(page: &[u64], bit: usize, order: usize) -> bool {
    let n = 1usize << order;
    let first = bit & !(n - 1);
    if n < 64 {
        let mask = ((1u64 << n) - 1) << (first % 64);
        page[first / 64] & mask == mask
    } else {
        page[first / 64..(first + n) / 64].iter().all(|&w| w == u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whole regions counted as frames come, in any order, equal a count from scratch; spans
        /// cross bitmap pages.
        #[test]
        fn whole_regions_are_counted_as_frames_come(
            base in 0u64..(3 << SPAN_SHIFT), len in 1u64..5000, order in 0usize..11,
            holes in proptest::collection::vec(0u64..5000, 0..30), seed: u64,
        ) {
            let mut pfns: Vec<u64> =
                (base + 1..base + 1 + len).filter(|p| !holes.contains(&(p - base))).collect();
            let n = pfns.len();
            for i in 0..n {
                let j = (i as u64).wrapping_mul(6364136223846793005).wrapping_add(seed) % n.max(1) as u64;
                let j = j as usize;
                pfns.swap(i, j);
            }
            let f = Frames::from_pfns(&pfns, order);
            let owned: std::collections::HashSet<u64> = pfns.iter().copied().collect();
            let region = 1u64 << order;
            let mut starts: Vec<u64> = pfns.iter().map(|p| p & !(region - 1)).collect();
            starts.sort_unstable();
            starts.dedup();
            let whole: Vec<u64> =
                starts.into_iter().filter(|&s| (s..s + region).all(|p| owned.contains(&p))).collect();
            prop_assert_eq!(f.whole(), whole.len() as u64);
            prop_assert_eq!(f.len(), owned.len() as u64);
            for &p in &pfns {
                prop_assert!(f.contains(p));
                prop_assert_eq!(f.is_whole(p), whole.contains(&(p & !(region - 1))));
            }
            prop_assert!(!f.contains(base + len + 1));
        }
    }
}
