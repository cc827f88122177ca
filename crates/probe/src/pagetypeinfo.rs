//! `/proc/pagetypeinfo`: free blocks per migratetype and pageblocks per migratetype, for every zone.
//!
//! ```text
//! Page block order: 9
//! Pages per block:  512
//!
//! Free pages count per migrate type at order       0      1      2 ...     10
//! Node    0, zone   Normal, type    Unmovable     49    240    234 ...      0
//! Node    0, zone   Normal, type      Movable  13734   8728   3699 ...      0
//! ...
//!
//! Number of blocks type     Unmovable      Movable  Reclaimable   HighAtomic      Isolate
//! Node 0, zone   Normal           44          642           18            0            0
//! ```
//!
//! The kernel prints this whole block once per node with memory, so a NUMA machine repeats the
//! `Page block order` header. With `CONFIG_PAGE_OWNER` and `page_owner=on` a third table, `Number of
//! mixed blocks`, follows each node's block counts: pageblocks of one migratetype that hold pages
//! allocated as another (fallback "pollution").
//!
//! Nothing about the shape is assumed: the number of orders comes from the free table's header (11 on
//! x86, 13–14 on some arm64), and the migratetypes from the block table's header (`CMA` only with
//! `CONFIG_CMA`, `Reserve` before 4.4, `HighAtomic`/`Isolate` depending on version and config).
//!
//! Two caveats for anyone comparing this with `/proc/buddyinfo`: since v5.4 the kernel stops walking a
//! free list at 100000 entries and prints `>100000` (kept here as a lower bound, see
//! [`MigratetypeFree::capped`]); and it drops `zone->lock` between orders, so one row is not a
//! snapshot. The file is mode 0400: reading it needs root.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::error::{read_to_string, Error, Result};

pub const PATH: &str = "/proc/pagetypeinfo";

const ORDER_LINE: &str = "Page block order:";
const PAGES_LINE: &str = "Pages per block:";
const FREE_HEADER: &str = "Free pages count per migrate type at order";
const BLOCKS_HEADER: &str = "Number of blocks type";
const MIXED_HEADER: &str = "Number of mixed blocks";

/// The free lists of one migratetype in one zone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigratetypeFree {
    pub node: u32,
    /// Zone name as the kernel prints it: `DMA`, `DMA32`, `Normal`, `HighMem`, `Movable`.
    pub zone: String,
    /// Migratetype name as the kernel prints it: `Unmovable`, `Movable`, `Reclaimable`, ...
    pub migratetype: String,
    /// `free[order]` = number of free blocks of that order on this migratetype's free list.
    pub free: Vec<u64>,
    /// Orders the kernel printed as `>N`: it stopped counting at N (100000 since v5.4) to bound the
    /// time it holds `zone->lock`, so `free[order]` is only a lower bound there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capped: Vec<usize>,
}

impl MigratetypeFree {
    /// Free pages on this migratetype's free lists; a lower bound if any order is [capped](Self::capped).
    pub fn free_pages(&self) -> u64 {
        self.free.iter().enumerate().fold(0u64, |sum, (order, &n)| sum.saturating_add(pages(n, order)))
    }

    /// Whether any count is a lower bound rather than exact.
    pub fn is_capped(&self) -> bool {
        !self.capped.is_empty()
    }
}

/// Pageblocks per migratetype in one zone; `blocks[i]` counts [`PageTypeInfo::migratetypes`]`[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneBlocks {
    pub node: u32,
    pub zone: String,
    pub blocks: Vec<u64>,
}

/// A parsed `/proc/pagetypeinfo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageTypeInfo {
    /// `pageblock_order`: the unit in which the kernel assigns migratetypes (9 = 2 MiB on x86_64).
    pub pageblock_order: u32,
    /// `pageblock_nr_pages`, always `1 << pageblock_order`.
    pub pages_per_block: u64,
    /// Migratetype names in the kernel's order, from the `Number of blocks type` header.
    pub migratetypes: Vec<String>,
    /// One entry per node, zone and migratetype, in file order.
    pub free: Vec<MigratetypeFree>,
    /// Pageblocks per migratetype, one entry per node and zone.
    pub blocks: Vec<ZoneBlocks>,
    /// The `Number of mixed blocks` table, when the kernel prints it (`CONFIG_PAGE_OWNER` with
    /// `page_owner=on`): pageblocks per migratetype that also hold pages of another migratetype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed: Option<Vec<ZoneBlocks>>,
}

impl PageTypeInfo {
    /// Read the live file (root only).
    pub fn read() -> Result<Self> {
        Self::parse(&read_to_string(PATH)?, PATH)
    }

    /// Parse pagetypeinfo text; `path` names the source in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        Parser::new(path).run(text)
    }

    /// `NR_PAGE_ORDERS` of the kernel that wrote this file.
    pub fn nr_orders(&self) -> usize {
        self.free.first().map_or(0, |f| f.free.len())
    }

    /// The free lists of `migratetype` in a zone.
    pub fn free_blocks(&self, node: u32, zone: &str, migratetype: &str) -> Option<&MigratetypeFree> {
        self.free.iter().find(|f| f.node == node && f.zone == zone && f.migratetype == migratetype)
    }

    /// Free blocks per order summed over migratetypes: what `/proc/buddyinfo` shows for the zone
    /// (a lower bound where a count was capped).
    pub fn zone_free_blocks(&self, node: u32, zone: &str) -> Option<Vec<u64>> {
        let mut rows = self.free.iter().filter(|f| f.node == node && f.zone == zone).peekable();
        rows.peek()?;
        let mut sum = vec![0u64; self.nr_orders()];
        for row in rows {
            for (s, &n) in sum.iter_mut().zip(&row.free) {
                *s = s.saturating_add(n);
            }
        }
        Some(sum)
    }

    /// Pageblocks per migratetype in a zone, as `(migratetype, count)`.
    pub fn pageblocks(&self, node: u32, zone: &str) -> Option<Vec<(&str, u64)>> {
        self.labelled(&self.blocks, node, zone)
    }

    /// Pageblocks of one migratetype in a zone.
    pub fn pageblock_count(&self, node: u32, zone: &str, migratetype: &str) -> Option<u64> {
        let i = self.migratetypes.iter().position(|m| m == migratetype)?;
        let zone = self.blocks.iter().find(|b| b.node == node && b.zone == zone)?;
        zone.blocks.get(i).copied()
    }

    /// Mixed pageblocks per migratetype in a zone, if the kernel printed that table.
    pub fn mixed_pageblocks(&self, node: u32, zone: &str) -> Option<Vec<(&str, u64)>> {
        self.labelled(self.mixed.as_ref()?, node, zone)
    }

    /// `(node, zone)` of every zone, in file order.
    pub fn zones(&self) -> impl Iterator<Item = (u32, &str)> {
        self.blocks.iter().map(|b| (b.node, b.zone.as_str()))
    }

    fn labelled<'a>(&'a self, table: &'a [ZoneBlocks], node: u32, zone: &str) -> Option<Vec<(&'a str, u64)>> {
        let row = table.iter().find(|b| b.node == node && b.zone == zone)?;
        Some(self.migratetypes.iter().map(String::as_str).zip(row.blocks.iter().copied()).collect())
    }
}

/// `n` blocks of `order` in pages, saturating: counts come from text and may be garbage.
fn pages(n: u64, order: usize) -> u64 {
    match u32::try_from(order).ok().and_then(|o| 1u64.checked_shl(o)) {
        Some(size) => n.saturating_mul(size),
        None if n == 0 => 0,
        None => u64::MAX,
    }
}

/// Why a line was rejected: usually the line itself, but a free row is only known to name an unknown
/// migratetype once the header below it is read, and the error should point at the row.
enum Fail<'t> {
    Here(String),
    At(usize, &'t str, String),
}

impl From<String> for Fail<'_> {
    fn from(reason: String) -> Self {
        Fail::Here(reason)
    }
}

impl From<&str> for Fail<'_> {
    fn from(reason: &str) -> Self {
        Fail::Here(reason.to_string())
    }
}

/// Where the parser is in one node's block of output.
#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Before a node's `Page block order` line.
    NodeStart,
    PagesPerBlock,
    FreeHeader,
    FreeRows,
    BlockRows,
    MixedRows,
}

struct Parser<'p, 't> {
    path: &'p str,
    state: State,
    pageblock_order: Option<u32>,
    pages_per_block: u64,
    nr_orders: Option<usize>,
    migratetypes: Option<Vec<String>>,
    free: Vec<MigratetypeFree>,
    blocks: Vec<ZoneBlocks>,
    mixed: Option<Vec<ZoneBlocks>>,
    /// The node this section's rows belong to, fixed by its first row: the kernel prints one node per
    /// section, so a different node inside it means two files were glued together or a line is corrupt.
    section_node: Option<u32>,
    /// Free rows of the current section (line number, text, migratetype), checked against the
    /// migratetype header that follows them.
    pending: Vec<(usize, &'t str, String)>,
    seen_free: HashSet<(u32, String, String)>,
    seen_blocks: HashSet<(u32, String)>,
    seen_mixed: HashSet<(u32, String)>,
    last_line: usize,
}

impl<'p, 't> Parser<'p, 't> {
    fn new(path: &'p str) -> Self {
        Parser {
            path,
            state: State::NodeStart,
            pageblock_order: None,
            pages_per_block: 0,
            nr_orders: None,
            migratetypes: None,
            free: Vec::new(),
            blocks: Vec::new(),
            mixed: None,
            section_node: None,
            pending: Vec::new(),
            seen_free: HashSet::new(),
            seen_blocks: HashSet::new(),
            seen_mixed: HashSet::new(),
            last_line: 1,
        }
    }

    fn run(mut self, text: &'t str) -> Result<PageTypeInfo> {
        for (i, line) in text.lines().enumerate() {
            self.last_line = i + 1;
            if line.trim().is_empty() {
                continue;
            }
            self.line(i + 1, line).map_err(|fail| match fail {
                Fail::Here(reason) => Error::parse(self.path, i + 1, line, reason),
                Fail::At(at, text, reason) => Error::parse(self.path, at, text, reason),
            })?;
        }
        let fail = |reason: &str| Err(Error::parse(self.path, self.last_line, "", reason));
        match self.state {
            State::BlockRows | State::MixedRows => {}
            State::NodeStart => return fail("no \"Page block order\" line: not a pagetypeinfo file"),
            State::PagesPerBlock => return fail("ended before the \"Pages per block\" line"),
            State::FreeHeader => return fail("ended before the free pages table"),
            State::FreeRows => return fail("ended before the \"Number of blocks type\" table"),
        }
        Ok(PageTypeInfo {
            pageblock_order: self.pageblock_order.unwrap_or_default(),
            pages_per_block: self.pages_per_block,
            migratetypes: self.migratetypes.unwrap_or_default(),
            free: self.free,
            blocks: self.blocks,
            mixed: self.mixed,
        })
    }

    fn line(&mut self, lineno: usize, line: &'t str) -> std::result::Result<(), Fail<'t>> {
        let body = line.trim();
        if let Some(value) = body.strip_prefix(ORDER_LINE) {
            if !matches!(self.state, State::NodeStart | State::BlockRows | State::MixedRows) {
                return Err(format!("\"{ORDER_LINE}\" in the middle of a node's tables").into());
            }
            let order: u32 = value
                .trim()
                .parse()
                .map_err(|_| format!("pageblock order {:?} is not a number", value.trim()))?;
            if let Some(prev) = self.pageblock_order.filter(|&p| p != order) {
                return Err(format!("pageblock order {order} here but {prev} for an earlier node").into());
            }
            self.pageblock_order = Some(order);
            self.section_node = None;
            self.state = State::PagesPerBlock;
        } else if let Some(value) = body.strip_prefix(PAGES_LINE) {
            if self.state != State::PagesPerBlock {
                return Err(format!("\"{PAGES_LINE}\" not right after \"{ORDER_LINE}\"").into());
            }
            let pages: u64 = value
                .trim()
                .parse()
                .map_err(|_| format!("pages per block {:?} is not a number", value.trim()))?;
            let order = self.pageblock_order.unwrap_or_default();
            // pageblock_nr_pages is defined as 1 << pageblock_order; disagreement means a corrupt file.
            if 1u64.checked_shl(order) != Some(pages) {
                return Err(
                    format!("{pages} pages per block, but pageblock order {order} means 2^{order}").into()
                );
            }
            self.pages_per_block = pages;
            self.state = State::FreeHeader;
        } else if let Some(orders) = body.strip_prefix(FREE_HEADER) {
            if self.state != State::FreeHeader {
                return Err("free pages table header not after \"Pages per block\"".into());
            }
            let n = parse_order_header(orders)?;
            if let Some(prev) = self.nr_orders.filter(|&p| p != n) {
                return Err(format!("{n} orders here but {prev} for an earlier node").into());
            }
            self.nr_orders = Some(n);
            self.state = State::FreeRows;
        } else if let Some(names) = body.strip_prefix(BLOCKS_HEADER) {
            if self.state != State::FreeRows {
                return Err("\"Number of blocks type\" header not after the free pages table".into());
            }
            let names = parse_migratetype_header(names)?;
            if let Some(prev) = self.migratetypes.as_ref().filter(|p| **p != names) {
                return Err(format!("migratetypes {names:?} here but {prev:?} for an earlier node").into());
            }
            // The free rows name their migratetype; every one must be in the header printed from the
            // same migratetype_names[] array.
            for (row_line, text, mt) in std::mem::take(&mut self.pending) {
                if !names.contains(&mt) {
                    let reason =
                        format!("migratetype {mt:?} is not in the header on line {lineno}: {names:?}");
                    return Err(Fail::At(row_line, text, reason));
                }
            }
            self.migratetypes = Some(names);
            self.state = State::BlockRows;
        } else if let Some(names) = body.strip_prefix(MIXED_HEADER) {
            if self.state != State::BlockRows {
                return Err("\"Number of mixed blocks\" header not after the block counts".into());
            }
            let names = parse_migratetype_header(names)?;
            if Some(&names) != self.migratetypes.as_ref() {
                return Err(
                    format!("mixed blocks header {names:?} differs from the block counts header").into()
                );
            }
            self.mixed.get_or_insert_with(Vec::new);
            self.state = State::MixedRows;
        } else if body.starts_with("Node") {
            self.row(lineno, line)?;
        } else {
            return Err("not a line of pagetypeinfo".into());
        }
        Ok(())
    }

    fn row(&mut self, lineno: usize, line: &'t str) -> std::result::Result<(), String> {
        let (node, zone, rest) = split_node_zone(line)?;
        if let Some(section) = self.section_node.filter(|&s| s != node) {
            return Err(format!("node {node} inside node {section}'s tables"));
        }
        self.section_node = Some(node);
        match self.state {
            State::FreeRows => {
                let row = parse_free_rest(node, zone, rest, self.nr_orders)?;
                if !self.seen_free.insert((node, row.zone.clone(), row.migratetype.clone())) {
                    return Err(format!("second row for node {node}, zone {zone}, type {}", row.migratetype));
                }
                self.pending.push((lineno, line, row.migratetype.clone()));
                self.free.push(row);
            }
            State::BlockRows | State::MixedRows => {
                let want = self.migratetypes.as_ref().map_or(0, Vec::len);
                let blocks = parse_counts(rest, want, "migratetype")?;
                let row = ZoneBlocks { node, zone: zone.to_string(), blocks };
                let (seen, table) = if self.state == State::BlockRows {
                    (&mut self.seen_blocks, &mut self.blocks)
                } else {
                    (&mut self.seen_mixed, self.mixed.get_or_insert_with(Vec::new))
                };
                if !seen.insert((node, zone.to_string())) {
                    return Err(format!("second row for node {node}, zone {zone} in this table"));
                }
                table.push(row);
            }
            State::NodeStart | State::PagesPerBlock | State::FreeHeader => {
                return Err("zone row before the table headers".into());
            }
        }
        Ok(())
    }
}

/// `0 1 2 ... n-1` after the free table's title; returns n.
fn parse_order_header(orders: &str) -> std::result::Result<usize, String> {
    let mut n = 0;
    for (i, tok) in orders.split_whitespace().enumerate() {
        if tok.parse::<usize>().ok() != Some(i) {
            return Err(format!("order column {i} is headed {tok:?}; expected the orders 0, 1, 2, ..."));
        }
        n = i + 1;
    }
    if n == 0 {
        return Err("free pages table header lists no orders".into());
    }
    Ok(n)
}

fn parse_migratetype_header(names: &str) -> std::result::Result<Vec<String>, String> {
    let names: Vec<String> = names.split_whitespace().map(str::to_string).collect();
    if names.is_empty() {
        return Err("header lists no migratetypes".into());
    }
    let unique: HashSet<&String> = names.iter().collect();
    if unique.len() != names.len() {
        return Err(format!("header repeats a migratetype: {names:?}"));
    }
    Ok(names)
}

/// `Node <n>, zone <name>` at the start of a row; returns the node, the zone and what follows the name
/// (for free rows that starts with `, type`).
pub(crate) fn split_node_zone(line: &str) -> std::result::Result<(u32, &str, &str), String> {
    let rest = line.trim_start().strip_prefix("Node").ok_or("expected \"Node <n>, zone <name>\"")?;
    let (node, rest) = rest.split_once(',').ok_or("expected a comma after the node number")?;
    let node: u32 = node.trim().parse().map_err(|_| format!("node {:?} is not a number", node.trim()))?;
    let rest = rest.trim_start().strip_prefix("zone").ok_or("expected \"zone\" after the node")?;
    let rest = rest.trim_start();
    let end = rest.find(|c: char| c.is_whitespace() || c == ',').unwrap_or(rest.len());
    let (zone, rest) = rest.split_at(end);
    if zone.is_empty() {
        return Err("missing zone name".into());
    }
    Ok((node, zone, rest))
}

/// The part of a free row after the zone name: `, type <migratetype> <count>...`.
/// `nr_orders` is the column count the table header promised, if known.
fn parse_free_rest(
    node: u32,
    zone: &str,
    rest: &str,
    nr_orders: Option<usize>,
) -> std::result::Result<MigratetypeFree, String> {
    let rest = rest.trim_start().strip_prefix(',').ok_or("expected \", type\" after the zone name")?;
    let rest = rest.trim_start().strip_prefix("type").ok_or("expected \"type\" after the zone")?;
    let mut fields = rest.split_whitespace();
    let migratetype = fields.next().ok_or("missing migratetype name")?.to_string();
    let mut free = Vec::new();
    let mut capped = Vec::new();
    for (order, tok) in fields.enumerate() {
        let (digits, is_capped) = match tok.strip_prefix('>') {
            Some(d) => (d, true),
            None => (tok, false),
        };
        let n: u64 = digits.parse().map_err(|_| format!("order {order} count {tok:?} is not a number"))?;
        if is_capped {
            capped.push(order);
        }
        free.push(n);
    }
    if let Some(want) = nr_orders.filter(|&n| n != free.len()) {
        return Err(format!("{} order columns but the header lists {want}", free.len()));
    }
    Ok(MigratetypeFree { node, zone: zone.to_string(), migratetype, free, capped })
}

fn parse_counts(rest: &str, want: usize, what: &str) -> std::result::Result<Vec<u64>, String> {
    let counts = rest
        .split_whitespace()
        .enumerate()
        .map(|(i, f)| f.parse::<u64>().map_err(|_| format!("{what} column {i} count {f:?} is not a number")))
        .collect::<std::result::Result<Vec<u64>, String>>()?;
    if counts.len() != want {
        return Err(format!("{} {what} columns but the header lists {want}", counts.len()));
    }
    Ok(counts)
}

/// Parse one row of the free table, `Node 0, zone Normal, type Movable 3 1 >100000 ...`, with
/// however many orders it has.
pub fn parse_free_line(line: &str) -> std::result::Result<MigratetypeFree, String> {
    let (node, zone, rest) = split_node_zone(line)?;
    let row = parse_free_rest(node, zone, rest, None)?;
    if row.free.is_empty() {
        return Err(format!("zone {zone}, type {} lists no free counts", row.migratetype));
    }
    Ok(row)
}
