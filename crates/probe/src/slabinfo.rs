//! `/proc/slabinfo` (readable by root only): object and slab counts per slab cache.
//!
//! ```text
//! slabinfo - version: 2.1
//! # name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>
//! kmalloc-4k           251    376   4096    8    8 : tunables    0    0    0 : slabdata     47     47      0
//! ```
//!
//! A cache with `pagesperslab` > 1 allocates order > 0 pages for every new slab, which is why slab
//! growth shows up in high-order allocation failures. Only format 2.1 is accepted (every kernel since
//! 2.6.x; SLUB prints the tunables as 0 and `active_slabs == num_slabs`). The `2.1 (statistics)`
//! variant of the old SLAB allocator with CONFIG_DEBUG_SLAB is rejected rather than half-read.

use serde::{Deserialize, Serialize};

use crate::error::{read_to_string, Error, Result};
use crate::meminfo::error_at_end;

pub const PATH: &str = "/proc/slabinfo";

/// The only `slabinfo - version:` this parser knows.
pub const VERSION: &str = "2.1";

/// One slab cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlabCache {
    pub name: String,
    /// Objects in use.
    pub active_objs: u64,
    /// Objects in all slabs, in use or free.
    pub num_objs: u64,
    /// Bytes per object, including the allocator's padding and metadata.
    pub objsize: u64,
    pub objperslab: u64,
    /// Pages per slab: 2^order of the allocations that grow this cache.
    pub pagesperslab: u64,
    pub active_slabs: u64,
    pub num_slabs: u64,
}

impl SlabCache {
    /// Memory held by the cache's slabs: `num_slabs × pagesperslab × page_size` (saturating).
    /// Pass `procfs::page_size()` for the live system, or the capture's page size.
    pub fn bytes(&self, page_size: u64) -> u64 {
        self.num_slabs.saturating_mul(self.pagesperslab).saturating_mul(page_size)
    }

    /// Page order of one slab (`log2(pagesperslab)`, rounded up), `None` for a zero `pagesperslab`.
    pub fn slab_order(&self) -> Option<u32> {
        self.pagesperslab
            .checked_next_power_of_two()
            .filter(|_| self.pagesperslab > 0)
            .map(u64::trailing_zeros)
    }
}

/// A parsed `/proc/slabinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlabInfo {
    /// Caches in file order. Names are not unique in general (two modules may create caches with the
    /// same name), so this is a list and [`SlabInfo::cache`] returns the first match.
    pub caches: Vec<SlabCache>,
}

impl SlabInfo {
    /// Read the live file (needs root: the file is mode 0400).
    pub fn read() -> Result<Self> {
        Self::parse(&read_to_string(PATH)?, PATH)
    }

    /// Parse slabinfo text; `path` names the source in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let Some((i, first)) = lines.next() else {
            return Err(error_at_end(path, text, "empty input: expected \"slabinfo - version: 2.1\""));
        };
        let version = first
            .trim()
            .strip_prefix("slabinfo - version:")
            .ok_or_else(|| {
                Error::parse(path, i + 1, first, "expected the header \"slabinfo - version: 2.1\"")
            })?
            .trim();
        if version != VERSION {
            let reason = format!("slabinfo version {version:?} is not supported (only {VERSION})");
            return Err(Error::parse(path, i + 1, first, reason));
        }
        let mut caches = Vec::new();
        for (i, line) in lines {
            if line.trim_start().starts_with('#') {
                continue;
            }
            caches.push(parse_line(line).map_err(|reason| Error::parse(path, i + 1, line, reason))?);
        }
        Ok(SlabInfo { caches })
    }

    /// The first cache called `name`.
    pub fn cache(&self, name: &str) -> Option<&SlabCache> {
        self.caches.iter().find(|c| c.name == name)
    }

    /// Memory in all slabs, in bytes (see [`SlabCache::bytes`]).
    pub fn total_bytes(&self, page_size: u64) -> u64 {
        self.caches.iter().fold(0u64, |sum, c| sum.saturating_add(c.bytes(page_size)))
    }
}

/// One cache line:
/// `<name> <5 numbers> : tunables <3 numbers> : slabdata <3 numbers>`.
pub fn parse_line(line: &str) -> std::result::Result<SlabCache, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // Anchor on ": tunables" so a cache name containing a blank still parses.
    let colon = fields
        .windows(2)
        .position(|w| w == [":", "tunables"])
        .ok_or("expected \"<name> <5 numbers> : tunables <3 numbers> : slabdata <3 numbers>\"")?;
    if colon < 6 {
        return Err(format!("expected a name and 5 numbers before \": tunables\", found {} fields", colon));
    }
    let rest = &fields[colon..];
    if rest.len() != 10 || rest[5] != ":" || rest[6] != "slabdata" {
        return Err("expected \": tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> \
                    <num_slabs> <sharedavail>\""
            .into());
    }
    let num = |label: &str, s: &str| s.parse::<u64>().map_err(|_| format!("{label} {s:?} is not a number"));
    let head = &fields[colon - 5..colon];
    for (label, s) in ["limit", "batchcount", "sharedfactor"].iter().zip(&rest[2..5]) {
        num(label, s)?;
    }
    num("sharedavail", rest[9])?;
    Ok(SlabCache {
        name: fields[..colon - 5].join(" "),
        active_objs: num("active_objs", head[0])?,
        num_objs: num("num_objs", head[1])?,
        objsize: num("objsize", head[2])?,
        objperslab: num("objperslab", head[3])?,
        pagesperslab: num("pagesperslab", head[4])?,
        active_slabs: num("active_slabs", rest[7])?,
        num_slabs: num("num_slabs", rest[8])?,
    })
}
