//! `/proc/zoneinfo`: per zone, the watermarks the allocator tests free pages against, the zone sizes,
//! the lowmem reserve and the per-CPU page lists.
//!
//! ```text
//! Node 0, zone   Normal
//!   pages free     268609
//!         boost    0
//!         min      14769
//!         low      20163
//!         high     25557
//!         promo    30951
//!         spanned  5505024
//!         present  5505024
//!         managed  5394258
//!         cma      0
//!         protection: (0, 0, 0, 0, 0)
//!       nr_free_pages 268609
//!       nr_free_pages_blocks 262144
//!       ...
//!   pagesets
//!     cpu: 0
//!               count:    20795
//!               high:     21173
//!               batch:    63
//!               high_min: 10081
//!               high_max: 337141
//!   vm stats threshold: 36
//!   node_unreclaimable:  0
//!   start_pfn:           1048576
//! ```
//!
//! What a kernel prints varies: `boost` appeared in 5.0, `cma` in 5.12, `high_min`/`high_max` in 6.7;
//! `promo` (the NUMA-tiering promotion watermark) and `nr_free_pages_blocks` are recent (6.18 prints
//! both); old kernels print `all_unreclaimable:` where later ones print `node_unreclaimable:`. Those
//! are `Option`s here, absent when the kernel did not print them. There is no `nr_free_highatomic`: the
//! high-order atomic reserve is not in zoneinfo (pagetypeinfo's `HighAtomic` column counts its
//! pageblocks). Empty zones (`Movable`, `Device` on most
//! machines) print only the block down to `protection:`. The first populated zone of a node also
//! carries the node's `per-node stats`; they are read past, as are the other zone counters (vmstat has
//! the global ones).
//!
//! The procfs crate (0.18) has no zoneinfo parser, hence this one.

use serde::{Deserialize, Serialize};

use crate::error::{read_to_string, Error, Result};

pub const PATH: &str = "/proc/zoneinfo";

/// One CPU's per-CPU page list (`struct per_cpu_pages`) for one zone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pageset {
    pub cpu: u32,
    /// Order-0 (and, since 5.13, high-order pages up to PAGE_ALLOC_COSTLY_ORDER and THP-sized ones, counted in pages) pages on this CPU's lists: free, but neither in
    /// buddyinfo nor in `nr_free_pages`.
    pub count: u64,
    /// Above this many pages the CPU gives `batch`es back to the buddy lists. Autotuned since 6.7,
    /// between `high_min` and `high_max`; `vm.percpu_pagelist_high_fraction` sets it.
    pub high: u64,
    /// Pages moved between this list and the buddy lists at a time.
    pub batch: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_min: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_max: Option<u64>,
    /// `vm stats threshold`: how far this CPU's share of the zone counters may drift before it is folded
    /// into the global value zoneinfo and vmstat print (absent on !SMP kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stat_threshold: Option<u64>,
}

/// One zone of `/proc/zoneinfo`, in pages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zone {
    pub node: u32,
    /// Zone name as the kernel prints it: `DMA`, `DMA32`, `Normal`, `HighMem`, `Movable`, `Device`.
    pub zone: String,
    /// `pages free`: NR_FREE_PAGES, the pages on the buddy free lists (the per-CPU lists are not in it).
    pub nr_free_pages: u64,
    /// `nr_free_pages_blocks`: the part of `nr_free_pages` in free blocks of pageblock order or above,
    /// i.e. in wholly free pageblocks — what a THP or order-9+ allocation can use without compaction
    /// (recent kernels only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nr_free_pages_blocks: Option<u64>,
    /// `boost`: the temporary raise of the watermarks after a fragmenting fallback
    /// (`vm.watermark_boost_factor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boost: Option<u64>,
    /// WMARK_MIN (boost included): below it only atomic/high-priority allocations succeed.
    pub min: u64,
    /// WMARK_LOW: below it an allocation wakes kswapd.
    pub low: u64,
    /// WMARK_HIGH: kswapd reclaims until free is above it.
    pub high: u64,
    /// WMARK_PROMO: NUMA-tiering promotion watermark (6.1+).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promo: Option<u64>,
    pub spanned: u64,
    pub present: u64,
    /// Pages the buddy allocator manages. With deferred struct page init this grows while memory is
    /// allocated, until the zone is fully initialised.
    pub managed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cma: Option<u64>,
    /// `protection:` = `lowmem_reserve[]`: pages this zone keeps back from an allocation whose highest
    /// allowed zone is index `i` (`vm.lowmem_reserve_ratio`). An allocation falling back into this
    /// zone must leave `watermark + protection[i]` free.
    pub protection: Vec<u64>,
    /// Per-CPU page lists, one per online CPU; empty for an unpopulated zone.
    pub pagesets: Vec<Pageset>,
    /// `node_unreclaimable` (`all_unreclaimable` before 4.9): kswapd has given up on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_unreclaimable: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_pfn: Option<u64>,
}

impl Zone {
    /// `Node 0, zone Normal`, as buddyinfo and pagetypeinfo label the same zone.
    pub fn label(&self) -> String {
        format!("Node {}, zone {}", self.node, self.zone)
    }

    /// Pages on every CPU's per-CPU lists of this zone.
    pub fn pcp_pages(&self) -> u64 {
        self.pagesets.iter().map(|p| p.count).sum()
    }

    /// Whether the zone has memory (the kernel's `populated_zone()`: present pages).
    pub fn populated(&self) -> bool {
        self.present > 0
    }

    /// The frames the zone spans, `[start_pfn, start_pfn + spanned)`; `None` for an empty zone (no
    /// `start_pfn` printed). Holes inside the span are not the zone's pages but are no one else's.
    pub fn span(&self) -> Option<(u64, u64)> {
        self.start_pfn.filter(|_| self.spanned > 0).map(|s| (s, s + self.spanned))
    }

    /// The lowest watermark `nr_free_pages` is below: `"min"`, `"low"` or `"high"`; `None` above high.
    /// Below low kswapd is woken, below min ordinary allocations enter direct reclaim.
    pub fn below(&self) -> Option<&'static str> {
        let f = self.nr_free_pages;
        if f < self.min {
            Some("min")
        } else if f < self.low {
            Some("low")
        } else if f < self.high {
            Some("high")
        } else {
            None
        }
    }
}

/// A parsed `/proc/zoneinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneInfo {
    pub zones: Vec<Zone>,
}

impl ZoneInfo {
    /// Read the live file.
    pub fn read() -> Result<Self> {
        Self::parse(&read_to_string(PATH)?, PATH)
    }

    /// Parse zoneinfo text; `path` names the source in errors.
    ///
    /// Every line must be a zone header, a section name (`per-node stats`, `pagesets`), `protection:
    /// (...)` or a name with one unsigned value; names not kept are read past. A zone missing `pages
    /// free`, a watermark, a size or `protection`, a CPU missing `count`/`high`/`batch`, or a name
    /// repeated within a zone or CPU is an error naming the line.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        let mut zones = Vec::new();
        let mut cur: Option<Builder> = None;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let err = |reason: String| Error::parse(path, n, line, reason);
            let t = line.trim();
            if t.is_empty() {
                continue;
            }
            if t.starts_with("Node ") {
                if let Some(b) = cur.take() {
                    zones.push(
                        b.finish().map_err(|(at, text, reason)| Error::parse(path, at, &text, reason))?,
                    );
                }
                let (node, zone) = parse_header(t).map_err(err)?;
                if zones.iter().any(|z: &Zone| z.node == node && z.zone == zone) {
                    return Err(err(format!("Node {node}, zone {zone} appears a second time")));
                }
                cur = Some(Builder::new(node, zone, n, line));
                continue;
            }
            let Some(b) = cur.as_mut() else {
                return Err(err("expected \"Node <n>, zone <name>\" before any zone field".into()));
            };
            b.line(t).map_err(err)?;
        }
        if let Some(b) = cur.take() {
            zones.push(b.finish().map_err(|(at, text, reason)| Error::parse(path, at, &text, reason))?);
        }
        Ok(ZoneInfo { zones })
    }

    /// Look a zone up by node and name.
    pub fn zone(&self, node: u32, zone: &str) -> Option<&Zone> {
        self.zones.iter().find(|z| z.node == node && z.zone == zone)
    }

    /// `nr_free_pages` over all zones.
    pub fn free_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.nr_free_pages).sum()
    }

    /// Per-CPU list pages over all zones.
    pub fn pcp_pages(&self) -> u64 {
        self.zones.iter().map(Zone::pcp_pages).sum()
    }

    /// The nodes with memory (a populated zone), ascending: what `/sys/devices/system/node/has_memory`
    /// lists. A CPU-only node has none.
    pub fn nodes(&self) -> Vec<u32> {
        let mut nodes: Vec<u32> = self.zones.iter().filter(|z| z.populated()).map(|z| z.node).collect();
        nodes.dedup();
        nodes
    }

    /// A node's populated zones, lowest first (zoneinfo prints them in the kernel's zone order:
    /// DMA, DMA32, Normal, Movable, Device).
    pub fn node_zones(&self, node: u32) -> impl Iterator<Item = &Zone> {
        self.zones.iter().filter(move |z| z.node == node && z.populated())
    }

    /// The zone a node's user pages come from first: its highest populated zone, ZONE_DEVICE aside
    /// (device memory is never handed to the page allocator). A movable page fault walks the zones
    /// from the highest down and takes a lower one only when the ones above are at their watermark.
    pub fn user_zone(&self, node: u32) -> Option<&Zone> {
        self.node_zones(node).filter(|z| z.zone != "Device").last()
    }

    /// The other populated zones whose frames overlap this one's span: a Movable zone memory hotplug
    /// or `kernelcore=mirror` made inside Normal's range, nodes interleaved on some arm64 and POWER
    /// machines. Frame numbers alone cannot tell such zones apart.
    pub fn overlapping(&self, node: u32, zone: &str) -> Vec<&Zone> {
        let Some((s, e)) = self.zone(node, zone).and_then(Zone::span) else { return Vec::new() };
        self.zones
            .iter()
            .filter(|z| z.populated() && !(z.node == node && z.zone == zone))
            .filter(|z| z.span().is_some_and(|(a, b)| a < e && s < b))
            .collect()
    }

    /// `nr_free_pages` over a node's zones.
    pub fn node_free_pages(&self, node: u32) -> u64 {
        self.node_zones(node).map(|z| z.nr_free_pages).sum()
    }
}

/// `Node <n>, zone <name>`.
fn parse_header(t: &str) -> std::result::Result<(u32, String), String> {
    let rest = t.strip_prefix("Node").ok_or("expected \"Node <n>, zone <name>\"")?;
    let (node, rest) = rest.split_once(',').ok_or("expected a comma after the node number")?;
    let node: u32 = node.trim().parse().map_err(|_| format!("node {:?} is not a number", node.trim()))?;
    let rest = rest.trim_start().strip_prefix("zone").ok_or("expected \"zone\" after the node")?;
    let mut fields = rest.split_whitespace();
    let zone = fields.next().ok_or("missing zone name")?;
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected {extra:?} after the zone name"));
    }
    Ok((node, zone.to_string()))
}

#[derive(PartialEq)]
enum Section {
    /// Between the header and `pages free`: `per-node stats` and its counters.
    NodeStats,
    /// From `pages free` on: watermarks, sizes, protection, zone counters.
    Zone,
    /// From `pagesets` on.
    Pagesets,
}

#[derive(Default)]
struct CpuBuilder {
    cpu: u32,
    count: Option<u64>,
    high: Option<u64>,
    batch: Option<u64>,
    high_min: Option<u64>,
    high_max: Option<u64>,
    stat_threshold: Option<u64>,
}

struct Builder {
    node: u32,
    zone: String,
    /// Header line number and text, for errors about what the zone lacks.
    at: usize,
    header: String,
    section: Section,
    free: Option<u64>,
    nr_free_pages_blocks: Option<u64>,
    boost: Option<u64>,
    min: Option<u64>,
    low: Option<u64>,
    high: Option<u64>,
    promo: Option<u64>,
    spanned: Option<u64>,
    present: Option<u64>,
    managed: Option<u64>,
    cma: Option<u64>,
    protection: Option<Vec<u64>>,
    cpus: Vec<CpuBuilder>,
    node_unreclaimable: Option<bool>,
    start_pfn: Option<u64>,
}

/// Set a field seen once per zone (or CPU); a second sighting means two captures pasted together or a
/// format this parser does not understand.
fn set(slot: &mut Option<u64>, name: &str, value: u64) -> std::result::Result<(), String> {
    if slot.replace(value).is_some() {
        return Err(format!("{name} appears a second time in this zone"));
    }
    Ok(())
}

impl Builder {
    fn new(node: u32, zone: String, at: usize, header: &str) -> Self {
        Builder {
            node,
            zone,
            at,
            header: header.to_string(),
            section: Section::NodeStats,
            free: None,
            nr_free_pages_blocks: None,
            boost: None,
            min: None,
            low: None,
            high: None,
            promo: None,
            spanned: None,
            present: None,
            managed: None,
            cma: None,
            protection: None,
            cpus: Vec::new(),
            node_unreclaimable: None,
            start_pfn: None,
        }
    }

    fn line(&mut self, t: &str) -> std::result::Result<(), String> {
        match t {
            "per-node stats" if self.section == Section::NodeStats => return Ok(()),
            "pagesets" => {
                if self.section != Section::Zone {
                    return Err("pagesets before \"pages free\" or a second time".into());
                }
                self.section = Section::Pagesets;
                return Ok(());
            }
            _ => {}
        }
        if let Some(list) = t.strip_prefix("protection:") {
            if self.section != Section::Zone || self.protection.is_some() {
                return Err("protection outside the zone block or a second time".into());
            }
            self.protection = Some(parse_protection(list)?);
            return Ok(());
        }
        let (name, value) = split_name_value(t)?;
        match (name, &self.section) {
            ("pages free", Section::NodeStats) => {
                self.section = Section::Zone;
                set(&mut self.free, name, value)
            }
            ("pages free", _) => Err("pages free appears a second time in this zone".into()),
            (_, Section::NodeStats) => Ok(()),
            ("cpu", Section::Pagesets) => {
                let cpu = u32::try_from(value).map_err(|_| format!("cpu {value} is not a CPU number"))?;
                if self.cpus.iter().any(|c| c.cpu == cpu) {
                    return Err(format!("cpu {cpu} appears a second time in this zone"));
                }
                self.cpus.push(CpuBuilder { cpu, ..Default::default() });
                Ok(())
            }
            (
                "count" | "high" | "batch" | "high_min" | "high_max" | "vm stats threshold",
                Section::Pagesets,
            ) => {
                let c = self.cpus.last_mut().ok_or_else(|| format!("{name} before any \"cpu:\" line"))?;
                let slot = match name {
                    "count" => &mut c.count,
                    "high" => &mut c.high,
                    "batch" => &mut c.batch,
                    "high_min" => &mut c.high_min,
                    "high_max" => &mut c.high_max,
                    _ => &mut c.stat_threshold,
                };
                if slot.replace(value).is_some() {
                    return Err(format!("{name} appears a second time for cpu {}", c.cpu));
                }
                Ok(())
            }
            ("node_unreclaimable" | "all_unreclaimable", _) => {
                let v = match value {
                    0 => false,
                    1 => true,
                    _ => return Err(format!("{name} is {value}, expected 0 or 1")),
                };
                if self.node_unreclaimable.replace(v).is_some() {
                    return Err(format!("{name} appears a second time in this zone"));
                }
                Ok(())
            }
            ("start_pfn", _) => set(&mut self.start_pfn, name, value),
            (_, Section::Pagesets) => Ok(()),
            ("boost", _) => set(&mut self.boost, name, value),
            ("min", _) => set(&mut self.min, name, value),
            ("low", _) => set(&mut self.low, name, value),
            ("high", _) => set(&mut self.high, name, value),
            ("promo", _) => set(&mut self.promo, name, value),
            ("spanned", _) => set(&mut self.spanned, name, value),
            ("present", _) => set(&mut self.present, name, value),
            ("managed", _) => set(&mut self.managed, name, value),
            ("cma", _) => set(&mut self.cma, name, value),
            ("nr_free_pages_blocks", _) => set(&mut self.nr_free_pages_blocks, name, value),
            // The same NR_FREE_PAGES as `pages free`, printed again among the zone counters — read
            // a second time by zoneinfo_show_print(), so on a busy machine it may have moved: the
            // first reading (`pages free`) is kept.
            ("nr_free_pages", _) => Ok(()),
            _ => Ok(()),
        }
    }

    /// The zone, or (header line, header text, what is missing).
    fn finish(self) -> std::result::Result<Zone, (usize, String, String)> {
        let label = format!("Node {}, zone {}", self.node, self.zone);
        let missing = |what: &str| (self.at, self.header.clone(), format!("{label} has no {what} line"));
        let need = |v: Option<u64>, what: &str| v.ok_or_else(|| missing(what));
        let mut pagesets = Vec::with_capacity(self.cpus.len());
        for c in &self.cpus {
            let need_cpu = |v: Option<u64>, what: &str| {
                v.ok_or_else(|| {
                    (self.at, self.header.clone(), format!("{label}: cpu {} has no {what}:", c.cpu))
                })
            };
            pagesets.push(Pageset {
                cpu: c.cpu,
                count: need_cpu(c.count, "count")?,
                high: need_cpu(c.high, "high")?,
                batch: need_cpu(c.batch, "batch")?,
                high_min: c.high_min,
                high_max: c.high_max,
                stat_threshold: c.stat_threshold,
            });
        }
        let nr_free_pages = need(self.free, "\"pages free\"")?;
        let (min, low, high) = (need(self.min, "min")?, need(self.low, "low")?, need(self.high, "high")?);
        let spanned = need(self.spanned, "spanned")?;
        let present = need(self.present, "present")?;
        let managed = need(self.managed, "managed")?;
        let protection = self.protection.clone().ok_or_else(|| missing("protection"))?;
        Ok(Zone {
            node: self.node,
            zone: self.zone,
            nr_free_pages,
            nr_free_pages_blocks: self.nr_free_pages_blocks,
            boost: self.boost,
            min,
            low,
            high,
            promo: self.promo,
            spanned,
            present,
            managed,
            cma: self.cma,
            protection,
            pagesets,
            node_unreclaimable: self.node_unreclaimable,
            start_pfn: self.start_pfn,
        })
    }
}

/// `<name> <value>` or `<name>: <value>`; the name may contain spaces (`pages free`, `vm stats
/// threshold`).
fn split_name_value(t: &str) -> std::result::Result<(&str, u64), String> {
    let (name, value) = match t.split_once(':') {
        Some((name, value)) => (name.trim(), value.trim()),
        None => {
            let (name, value) =
                t.rsplit_once(char::is_whitespace).ok_or_else(|| format!("{t:?} has no value"))?;
            (name.trim(), value.trim())
        }
    };
    if name.is_empty() {
        return Err("a value without a name".into());
    }
    if value.is_empty() || value.contains(char::is_whitespace) {
        return Err(format!("{name}: expected one unsigned value, got {value:?}"));
    }
    let v = value.parse().map_err(|_| format!("{name} value {value:?} is not an unsigned number"))?;
    Ok((name, v))
}

/// ` (0, 3018, 24090, 24090, 24090)`: one lowmem_reserve entry per zone index (MAX_NR_ZONES).
fn parse_protection(list: &str) -> std::result::Result<Vec<u64>, String> {
    let inner = list
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or("protection: expected \"(n, n, ...)\"")?;
    let v = inner
        .split(',')
        .map(|f| {
            f.trim()
                .parse::<u64>()
                .map_err(|_| format!("protection entry {:?} is not an unsigned number", f.trim()))
        })
        .collect::<std::result::Result<Vec<u64>, String>>()?;
    // MAX_NR_ZONES is at most 6 (DMA, DMA32, Normal, HighMem, Movable, Device); far more is not zoneinfo.
    if v.len() > 16 {
        return Err(format!("protection has {} entries: no kernel has more than 16 zones", v.len()));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_value_forms() {
        assert_eq!(split_name_value("pages free     3840"), Ok(("pages free", 3840)));
        assert_eq!(split_name_value("count:    20795"), Ok(("count", 20795)));
        assert_eq!(split_name_value("vm stats threshold: 36"), Ok(("vm stats threshold", 36)));
        assert!(split_name_value("min").is_err());
        assert!(split_name_value("min -1").is_err());
        assert!(split_name_value("count: 1 2").is_err());
    }

    #[test]
    fn protection_list() {
        assert_eq!(
            parse_protection(" (0, 3018, 24090, 24090, 24090)"),
            Ok(vec![0, 3018, 24090, 24090, 24090])
        );
        assert!(parse_protection(" (0, 3018").is_err());
        assert!(parse_protection(" (0, x)").is_err());
    }
}
