//! `/proc/vmstat`: the event counters that show compaction, migration and reclaim at work.
//!
//! ```text
//! nr_free_pages 868978
//! allocstall_normal 0
//! compact_stall 0
//! ```
//!
//! Only the names in [`COUNTERS`] (plus every `allocstall_*`, see [`COUNTER_PREFIXES`]) and
//! [`GAUGES`] are kept. Which of them a kernel prints depends on its config: `compact_*` and
//! `pgmigrate_*` need CONFIG_COMPACTION / CONFIG_MIGRATION, `htlb_buddy_*` CONFIG_HUGETLB_PAGE,
//! `thp_*` CONFIG_TRANSPARENT_HUGEPAGE, and the `allocstall_<zone>` set follows the configured zones
//! (kernels before 4.8 print one `allocstall`). A counter the kernel does not print is simply absent
//! from [`VmCounters`] — never reported as 0.
//!
//! The file is parsed here rather than through `procfs::VmStat`: that gives an `i64` map without
//! line numbers, while the kernel prints unsigned values and our errors name the line.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::error::{read_to_string, Error, Result};

pub const PATH: &str = "/proc/vmstat";

/// Monotonic event counters kept by [`VmCounters`] (the `allocstall_*` names listed are the zones
/// Linux has had; any other `allocstall_*` is kept too).
pub const COUNTERS: &[&str] = &[
    "compact_stall",
    "compact_fail",
    "compact_success",
    "compact_migrate_scanned",
    "compact_free_scanned",
    "compact_isolated",
    "compact_daemon_wake",
    "pgmigrate_success",
    "pgmigrate_fail",
    "allocstall",
    "allocstall_dma",
    "allocstall_dma32",
    "allocstall_normal",
    "allocstall_highmem",
    "allocstall_movable",
    "allocstall_device",
    "htlb_buddy_alloc_success",
    "htlb_buddy_alloc_fail",
    "thp_fault_alloc",
    "thp_fault_fallback",
    "oom_kill",
];

/// Name prefixes kept as counters, whatever follows: the zone list behind `allocstall_` varies.
pub const COUNTER_PREFIXES: &[&str] = &["allocstall_"];

/// Kept, but levels rather than counts: they go down as well as up, so [`VmCounters::delta`] leaves
/// them out.
pub const GAUGES: &[&str] = &["nr_free_pages"];

/// Whether `name` is a monotonic counter [`VmCounters`] keeps.
pub fn is_counter(name: &str) -> bool {
    COUNTERS.contains(&name) || COUNTER_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether `name` is a gauge [`VmCounters`] keeps.
pub fn is_gauge(name: &str) -> bool {
    GAUGES.contains(&name)
}

/// The fragmentation-relevant subset of `/proc/vmstat`, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmCounters {
    pub values: BTreeMap<String, u64>,
}

impl VmCounters {
    /// Read the live file.
    pub fn read() -> Result<Self> {
        Self::parse(&read_to_string(PATH)?, PATH)
    }

    /// Parse vmstat text; `path` names the source in errors.
    ///
    /// Every non-blank line must be `<name> <unsigned>`, tracked or not: a malformed line anywhere
    /// means the capture is not what it claims to be. A name appearing twice (two captures pasted
    /// together) is an error too.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        let mut values = BTreeMap::new();
        let mut seen = HashSet::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let err = |reason: String| Error::parse(path, i + 1, line, reason);
            let (name, value) = parse_line(line).map_err(err)?;
            if !seen.insert(name) {
                return Err(err(format!("{name} appears a second time")));
            }
            if is_counter(name) || is_gauge(name) {
                values.insert(name.to_string(), value);
            }
        }
        Ok(VmCounters { values })
    }

    /// Keep the tracked names from a procfs [`procfs::VmStat`] (values the kernel cannot print as
    /// unsigned, i.e. negative ones, are dropped).
    pub fn from_vmstat(stat: &procfs::VmStat) -> Self {
        let values = stat
            .0
            .iter()
            .filter(|(name, _)| is_counter(name) || is_gauge(name))
            .filter_map(|(name, &v)| u64::try_from(v).ok().map(|v| (name.clone(), v)))
            .collect();
        VmCounters { values }
    }

    /// A value by name; `None` if the kernel did not print it (or it is not tracked).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.get(name).copied()
    }

    /// What each counter did between `earlier` and `self`.
    ///
    /// Gauges are left out (a difference of levels is not an event count), as are names missing from
    /// either sample. Subtraction saturates at 0: counters only go down across a reboot or when the
    /// samples are swapped, and neither should read as a huge count.
    pub fn delta(&self, earlier: &VmCounters) -> VmCounters {
        let values = self
            .values
            .iter()
            .filter(|(name, _)| !is_gauge(name))
            .filter_map(|(name, &now)| earlier.get(name).map(|then| (name.clone(), now.saturating_sub(then))))
            .collect();
        VmCounters { values }
    }

    /// Counters (not gauges) and their values.
    pub fn counters(&self) -> impl Iterator<Item = (&str, u64)> {
        self.values.iter().filter(|(n, _)| !is_gauge(n)).map(|(n, &v)| (n.as_str(), v))
    }
}

/// One line: `<name> <unsigned>`.
fn parse_line(line: &str) -> std::result::Result<(&str, u64), String> {
    let mut fields = line.split_whitespace();
    let name = fields.next().ok_or("empty line")?;
    let value = fields.next().ok_or_else(|| format!("{name} has no value"))?;
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected {extra:?} after the value of {name}"));
    }
    let value = value.parse().map_err(|_| format!("{name} value {value:?} is not an unsigned number"))?;
    Ok((name, value))
}
