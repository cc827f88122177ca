//! Fragmentation indices, computed from `/proc/buddyinfo` exactly as `mm/vmstat.c` does, and the
//! debugfs files where the kernel prints them (`/sys/kernel/debug/extfrag/{unusable_index,extfrag_index}`).
//!
//! Both indices are integers in thousandths, per zone and per order, derived only from the number of
//! free blocks of each order (`fill_contig_page_info`):
//!
//! - **unusable free space index** (`unusable_free_index`): the fraction of the zone's free memory that
//!   cannot satisfy an order-N request because it sits in blocks smaller than 2^N pages. 0 = every
//!   free page is in a block big enough, 1000 = none is (or there is no free memory at all). It says
//!   how fragmented free memory is, whether or not an allocation would fail.
//! - **fragmentation index** (`__fragmentation_index`, the "extfrag index"): only meaningful when an
//!   order-N request would fail. Near 1000 the failure is due to external fragmentation (plenty of
//!   free pages, all in small blocks: compaction can help); near 0 it is due to lack of memory
//!   (reclaim is needed). -1000 means a suitable block exists, so the request would succeed. The
//!   kernel compares it with `vm.extfrag_threshold` (default 500) to choose compaction over reclaim.
//!
//! The arithmetic is the kernel's: unsigned 64-bit, truncating division, the result converted to
//! `int`. That conversion matters: with very few free blocks the fragmentation index can come out
//! negative without being -1000 (one free order-0 page at order 1 gives -500), and the kernel then
//! prints `" 0.-500"`. [`format_fragmentation_index`] reproduces that too.

use serde::{Deserialize, Serialize};

use crate::buddyinfo::{BuddyInfo, ZoneFree};
use crate::error::{read_to_string, Error, Result};
use crate::pagetypeinfo::split_node_zone;

/// Where debugfs keeps the indices; debugfs must be mounted at `/sys/kernel/debug` (root only).
pub const DEBUGFS_DIR: &str = "/sys/kernel/debug/extfrag";
pub const UNUSABLE_INDEX_PATH: &str = "/sys/kernel/debug/extfrag/unusable_index";
pub const EXTFRAG_INDEX_PATH: &str = "/sys/kernel/debug/extfrag/extfrag_index";

/// The kernel's `struct contig_page_info` for one zone and one requested order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContigPageInfo {
    /// Free base pages over all orders.
    pub free_pages: u64,
    /// Free blocks of any order.
    pub free_blocks_total: u64,
    /// How many order-`suitable_order` blocks the free blocks of that order or larger could be split
    /// into: non-zero means an order-`suitable_order` request can be satisfied without compaction.
    pub free_blocks_suitable: u64,
}

impl ContigPageInfo {
    /// `fill_contig_page_info()`: `free[order]` is the number of free blocks of that order.
    pub fn new(free: &[u64], suitable_order: usize) -> Self {
        let mut info = ContigPageInfo::default();
        // u64 wrapping like the kernel's unsigned long; only garbage input can get near it.
        for (order, &blocks) in free.iter().enumerate() {
            info.free_blocks_total = info.free_blocks_total.wrapping_add(blocks);
            info.free_pages = info.free_pages.wrapping_add(shl(blocks, order));
            if order >= suitable_order {
                info.free_blocks_suitable =
                    info.free_blocks_suitable.wrapping_add(shl(blocks, order - suitable_order));
            }
        }
        info
    }
}

/// `x << by` in u64 where bits shifted out are lost, as in C; a shift past the width leaves nothing
/// (C leaves that undefined, but the kernel never shifts by more than `MAX_PAGE_ORDER`).
fn shl(x: u64, by: usize) -> u64 {
    u32::try_from(by).ok().and_then(|by| x.checked_shl(by)).unwrap_or(0)
}

/// The kernel's `__fragmentation_index()` for an order-`order` request, in thousandths.
///
/// -1000: a free block of `order` or larger exists, the request would succeed. Otherwise near 1000:
/// it would fail because free memory is fragmented; near 0: because there is too little of it.
/// 0 also when the zone has no free blocks at all, and (as the kernel's `WARN_ON_ONCE` path) when
/// `order` is beyond the orders listed in `free`.
pub fn fragmentation_index(free: &[u64], order: usize) -> i32 {
    if order >= free.len() {
        return 0;
    }
    let info = ContigPageInfo::new(free, order);
    if info.free_blocks_total == 0 {
        return 0;
    }
    if info.free_blocks_suitable != 0 {
        return -1000;
    }
    // return 1000 - div_u64((1000 + div_u64(free_pages * 1000ULL, requested)), free_blocks_total);
    // evaluated in u64 and truncated to int on return.
    let requested = shl(1, order);
    let per_request = match requested {
        0 => 0, // 2^order exceeds u64, so the quotient is 0
        r => info.free_pages.wrapping_mul(1000) / r,
    };
    1000u64.wrapping_sub(1000u64.wrapping_add(per_request) / info.free_blocks_total) as i32
}

/// The kernel's `unusable_free_index()` for an order-`order` request, in thousandths: the share of
/// free pages that sit in blocks smaller than 2^order. 1000 when the zone has no free pages.
pub fn unusable_free_index(free: &[u64], order: usize) -> i32 {
    let info = ContigPageInfo::new(free, order);
    if info.free_pages == 0 {
        return 1000;
    }
    // div_u64((free_pages - (free_blocks_suitable << order)) * 1000ULL, free_pages), truncated to int.
    let unusable = info.free_pages.wrapping_sub(shl(info.free_blocks_suitable, order));
    (unusable.wrapping_mul(1000) / info.free_pages) as i32
}

/// An index as `unusable_index` prints it: `"%d.%03d"` of `index / 1000, index % 1000`.
pub fn format_unusable_index(index: i32) -> String {
    // Rust's / and % truncate toward zero like C's, and {:03} pads after the sign like %03d.
    format!("{}.{:03}", index / 1000, index % 1000)
}

/// An index as `extfrag_index` prints it: `"%2d.%03d"`, so -1000 is `"-1.000"`, 997 is `" 0.997"`
/// and -500 is `" 0.-500"`.
pub fn format_fragmentation_index(index: i32) -> String {
    format!("{:2}.{:03}", index / 1000, index % 1000)
}

/// Both indices of one zone, for every order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneIndices {
    pub node: u32,
    pub zone: String,
    /// `unusable[order]`: unusable free space index in thousandths.
    pub unusable: Vec<i32>,
    /// `extfrag[order]`: fragmentation index in thousandths (-1000 = the request would succeed).
    pub extfrag: Vec<i32>,
}

impl ZoneIndices {
    /// Compute both indices for every order the zone lists.
    pub fn from_zone(zone: &ZoneFree) -> Self {
        let orders = 0..zone.free.len();
        ZoneIndices {
            node: zone.node,
            zone: zone.zone.clone(),
            unusable: orders.clone().map(|o| unusable_free_index(&zone.free, o)).collect(),
            extfrag: orders.map(|o| fragmentation_index(&zone.free, o)).collect(),
        }
    }

    /// This zone's line of `unusable_index`, without the newline.
    pub fn unusable_line(&self) -> String {
        self.line(&self.unusable, format_unusable_index)
    }

    /// This zone's line of `extfrag_index`, without the newline.
    pub fn extfrag_line(&self) -> String {
        self.line(&self.extfrag, format_fragmentation_index)
    }

    fn line(&self, values: &[i32], format: fn(i32) -> String) -> String {
        // seq_printf(m, "Node %d, zone %8s ", ...) then "<index> " per order.
        let mut line = format!("Node {}, zone {:>8} ", self.node, self.zone);
        for &v in values {
            line.push_str(&format(v));
            line.push(' ');
        }
        line
    }
}

/// Both indices for every zone of a buddyinfo snapshot, in its order (which is the debugfs files' order).
pub fn indices(buddy: &BuddyInfo) -> Vec<ZoneIndices> {
    buddy.zones.iter().map(ZoneIndices::from_zone).collect()
}

/// The whole of `unusable_index` as the kernel would print it for these zones.
pub fn unusable_index_text(zones: &[ZoneIndices]) -> String {
    zones.iter().map(|z| z.unusable_line() + "\n").collect()
}

/// The whole of `extfrag_index` as the kernel would print it for these zones.
pub fn extfrag_index_text(zones: &[ZoneIndices]) -> String {
    zones.iter().map(|z| z.extfrag_line() + "\n").collect()
}

/// One line of either debugfs file: an index per order, in thousandths.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneIndex {
    pub node: u32,
    pub zone: String,
    pub index: Vec<i32>,
}

/// Parse `unusable_index` or `extfrag_index` text (`Node 0, zone DMA -1.000 0.997 ...`); `path` names
/// the source in errors. Accepts both the current `%2d.%03d` and the older unpadded layout, and only
/// values the kernel's formatter can produce.
pub fn parse_index_file(text: &str, path: &str) -> Result<Vec<ZoneIndex>> {
    let mut zones: Vec<ZoneIndex> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let zone = parse_index_line(line).map_err(|reason| Error::parse(path, i + 1, line, reason))?;
        if let Some(first) = zones.first() {
            if first.index.len() != zone.index.len() {
                let reason = format!(
                    "{} orders here but {} on the first line; every zone has NR_PAGE_ORDERS columns",
                    zone.index.len(),
                    first.index.len()
                );
                return Err(Error::parse(path, i + 1, line, reason));
            }
        }
        zones.push(zone);
    }
    Ok(zones)
}

fn parse_index_line(line: &str) -> std::result::Result<ZoneIndex, String> {
    let (node, zone, rest) = split_node_zone(line)?;
    let index = rest
        .split_whitespace()
        .enumerate()
        .map(|(order, tok)| parse_index(tok).map_err(|why| format!("order {order} index {tok:?} {why}")))
        .collect::<std::result::Result<Vec<i32>, String>>()?;
    if index.is_empty() {
        return Err(format!("zone {zone} lists no indices"));
    }
    Ok(ZoneIndex { node, zone: zone.to_string(), index })
}

/// `-1.000` → -1000, `0.997` → 997, `0.-500` → -500.
fn parse_index(tok: &str) -> std::result::Result<i32, &'static str> {
    let (int, frac) = tok.split_once('.').ok_or("is not <int>.<thousandths>")?;
    let int: i32 = int.parse().map_err(|_| "has a non-numeric integer part")?;
    let frac: i32 = frac.parse().map_err(|_| "has non-numeric thousandths")?;
    let value = int.checked_mul(1000).and_then(|v| v.checked_add(frac)).ok_or("is out of range")?;
    // The printed form is a function of the value; anything it cannot produce ("1.5", "-1.500",
    // "+0.100") is not kernel output.
    if format_unusable_index(value) != tok {
        return Err("is not how the kernel prints an index");
    }
    Ok(value)
}

/// Join the two debugfs files into [`ZoneIndices`]. They list the same zones in the same order, but
/// were read at different moments, so this is not a snapshot of one state the way [`indices`] is.
pub fn parse_debugfs(
    unusable: &str,
    unusable_path: &str,
    extfrag: &str,
    extfrag_path: &str,
) -> Result<Vec<ZoneIndices>> {
    let unusable_zones = parse_index_file(unusable, unusable_path)?;
    let extfrag_zones = parse_index_file(extfrag, extfrag_path)?;
    // Name the offending extfrag line by its number in the file, skipping blank lines as the parser did.
    let extfrag_lines: Vec<(usize, &str)> =
        extfrag.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| (i + 1, l)).collect();
    let mut out = Vec::with_capacity(unusable_zones.len());
    for (k, u) in unusable_zones.into_iter().enumerate() {
        let Some(e) = extfrag_zones.get(k) else {
            let (n, l) = extfrag_lines.last().copied().unwrap_or((1, ""));
            return Err(Error::parse(extfrag_path, n, l, format!("ends before {}", u_label(&u))));
        };
        let (n, l) = extfrag_lines[k];
        if (e.node, &e.zone) != (u.node, &u.zone) || e.index.len() != u.index.len() {
            let reason = format!(
                "{} with {} orders, but {unusable_path} has {} with {} here",
                u_label(e),
                e.index.len(),
                u_label(&u),
                u.index.len()
            );
            return Err(Error::parse(extfrag_path, n, l, reason));
        }
        out.push(ZoneIndices { node: u.node, zone: u.zone, unusable: u.index, extfrag: e.index.clone() });
    }
    if let Some(&(n, l)) = extfrag_lines.get(out.len()) {
        return Err(Error::parse(extfrag_path, n, l, format!("zone not in {unusable_path}")));
    }
    Ok(out)
}

fn u_label(z: &ZoneIndex) -> String {
    format!("Node {}, zone {}", z.node, z.zone)
}

/// Read both debugfs files (needs root and debugfs mounted at `/sys/kernel/debug`).
pub fn read_debugfs() -> Result<Vec<ZoneIndices>> {
    let unusable = read_to_string(UNUSABLE_INDEX_PATH)?;
    let extfrag = read_to_string(EXTFRAG_INDEX_PATH)?;
    parse_debugfs(&unusable, UNUSABLE_INDEX_PATH, &extfrag, EXTFRAG_INDEX_PATH)
}
