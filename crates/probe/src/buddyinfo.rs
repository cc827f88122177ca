//! `/proc/buddyinfo`: free blocks per order, for every node and zone.
//!
//! ```text
//! Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3
//! Node 0, zone   Normal      3      3     15     15    203    114     67     30      9      2     24
//! ```
//!
//! Column `i` after the zone name counts free blocks of order `i` (2^i contiguous pages). The number of
//! columns is `NR_PAGE_ORDERS`: 11 on x86 today, 13 or 14 on some arm64 and older configs, so it is
//! read from the file, never assumed.

use serde::{Deserialize, Serialize};

use crate::error::{read_to_string, Error, Result};

pub const PATH: &str = "/proc/buddyinfo";

/// The free lists of one zone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneFree {
    pub node: u32,
    /// Zone name as the kernel prints it: `DMA`, `DMA32`, `Normal`, `HighMem`, `Movable`.
    pub zone: String,
    /// `free[order]` = number of free blocks of that order.
    pub free: Vec<u64>,
}

impl ZoneFree {
    /// Free pages in this zone's buddy free lists (per-CPU lists are not included).
    pub fn free_pages(&self) -> u64 {
        self.free.iter().enumerate().map(|(order, &n)| n << order).sum()
    }

    /// Free pages held in blocks of `order` or larger.
    pub fn free_pages_at_or_above(&self, order: usize) -> u64 {
        self.free.iter().enumerate().skip(order).map(|(o, &n)| n << o).sum()
    }

    /// The highest order with at least one free block, if any.
    pub fn max_free_order(&self) -> Option<usize> {
        self.free.iter().rposition(|&n| n > 0)
    }

    /// `Node 0, zone Normal` — the key other interfaces use for the same zone.
    pub fn label(&self) -> String {
        format!("Node {}, zone {}", self.node, self.zone)
    }
}

/// A parsed `/proc/buddyinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuddyInfo {
    pub zones: Vec<ZoneFree>,
}

impl BuddyInfo {
    /// Read the live file.
    pub fn read() -> Result<Self> {
        Self::parse(&read_to_string(PATH)?, PATH)
    }

    /// Parse buddyinfo text; `path` names the source in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        let mut zones: Vec<ZoneFree> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let zone = parse_line(line).map_err(|reason| Error::parse(path, i + 1, line, reason))?;
            if let Some(first) = zones.first() {
                if first.free.len() != zone.free.len() {
                    let reason = format!(
                        "{} orders here but {} on the first line; every zone has NR_PAGE_ORDERS columns",
                        zone.free.len(),
                        first.free.len()
                    );
                    return Err(Error::parse(path, i + 1, line, reason));
                }
            }
            zones.push(zone);
        }
        Ok(BuddyInfo { zones })
    }

    /// `NR_PAGE_ORDERS` of the kernel that wrote this file (0 when it lists no zone).
    pub fn nr_orders(&self) -> usize {
        self.zones.first().map_or(0, |z| z.free.len())
    }

    /// Free pages over all zones.
    pub fn free_pages(&self) -> u64 {
        self.zones.iter().map(ZoneFree::free_pages).sum()
    }

    /// Look a zone up by node and name.
    pub fn zone(&self, node: u32, zone: &str) -> Option<&ZoneFree> {
        self.zones.iter().find(|z| z.node == node && z.zone == zone)
    }
}

/// One line: `Node <n>, zone <name> <count>...`.
pub fn parse_line(line: &str) -> std::result::Result<ZoneFree, String> {
    let rest = line.trim_start().strip_prefix("Node").ok_or("expected \"Node <n>, zone <name> <counts>\"")?;
    let (node, rest) = rest.split_once(',').ok_or("expected a comma after the node number")?;
    let node: u32 = node.trim().parse().map_err(|_| format!("node {:?} is not a number", node.trim()))?;
    let rest = rest.trim_start().strip_prefix("zone").ok_or("expected \"zone\" after the node")?;
    let mut fields = rest.split_whitespace();
    let zone = fields.next().ok_or("missing zone name")?.to_string();
    let free = fields
        .enumerate()
        .map(|(order, f)| f.parse::<u64>().map_err(|_| format!("order {order} count {f:?} is not a number")))
        .collect::<std::result::Result<Vec<u64>, String>>()?;
    if free.is_empty() {
        return Err(format!("zone {zone} lists no free counts"));
    }
    // NR_PAGE_ORDERS is 11–14 on real kernels; far more columns is not buddyinfo, and block sizes
    // past 2^63 pages could not be counted anyway.
    if free.len() > 32 {
        return Err(format!("{} orders: no kernel has more than 32", free.len()));
    }
    Ok(ZoneFree { node, zone, free })
}
