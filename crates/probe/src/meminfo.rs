//! `/proc/meminfo`, and the `Mem:` row of `free` computed from it.
//!
//! ```text
//! MemTotal:       24683584 kB
//! MemFree:        23611352 kB
//! MemAvailable:   24299248 kB
//! HugePages_Total:       0
//! ```
//!
//! The fields themselves come from procfs's [`Meminfo`] (re-exported here). Note that procfs converts
//! every `kB` value to **bytes**; lines without a unit (`HugePages_*`) keep their count.
//!
//! [`FreeTable`] is what `free -k` prints in its `Mem:` row. Which number `free` calls "used" changed
//! between procps releases, and bug reports from different years mix both, so both are kept:
//!
//! * procps-ng 4.0.2 (this VM; measured, see `tests/captures/procps-4.0.2/README.md`):
//!   `used = MemTotal - available`, where `available = MemAvailable` unless that is absent, 0 or larger
//!   than MemTotal, in which case `available = MemFree`. `used` is signed: when that fallback MemFree
//!   exceeds MemTotal (containers with a faked meminfo) `free` really prints a negative number.
//! * procps-ng 3.3.x (the 2018 reports; every row of the seed satisfies it): `used = MemTotal -
//!   MemFree - buff/cache`, falling back to `MemTotal - MemFree` when that is negative (the fallback
//!   is as 3.3's source is quoted, not measured). This is [`FreeTable::used_classic`].
//!
//! Both agree on the other columns: `shared = Shmem`, `buff/cache = Buffers + Cached + SReclaimable`
//! (a missing line counts as 0). One difference not modelled: 3.3.x estimated `available` itself on
//! kernels older than 3.14 (no MemAvailable line); 4.0.2 just shows MemFree, and so does this module.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{read_to_string, Error, Result};

pub use procfs::Meminfo;

pub const PATH: &str = "/proc/meminfo";

/// Keys procfs 0.18 refuses to build a [`Meminfo`] without. Checked here first so the error can name
/// the missing key; procfs's own error would not say which one.
const REQUIRED: &[&str] = &[
    "MemTotal",
    "MemFree",
    "Buffers",
    "Cached",
    "SwapCached",
    "Active",
    "Inactive",
    "SwapTotal",
    "SwapFree",
    "Dirty",
    "Writeback",
    "Mapped",
    "Slab",
    "Committed_AS",
    "VmallocTotal",
    "VmallocUsed",
    "VmallocChunk",
];

/// Read and parse the live `/proc/meminfo`.
///
/// This reads the text and goes through [`parse_meminfo`] rather than `Meminfo::current()`, so a
/// malformed file (an lxcfs overlay, say) is reported with its line, like a capture would be.
pub fn read_meminfo() -> Result<Meminfo> {
    parse_meminfo(&read_to_string(PATH)?, PATH)
}

/// Parse meminfo text; `path` names the source in errors.
///
/// Every non-blank line must be `Key: <n>` or `Key: <n> kB`. Lines are checked here and handed to
/// procfs in canonical form: procfs reports neither the line nor the key on failure, and some inputs
/// make it panic (a non-ASCII key is sliced mid-character; `kB` values near `u64::MAX` overflow when
/// it converts them to bytes).
pub fn parse_meminfo(text: &str, path: &str) -> Result<Meminfo> {
    let mut canonical = String::with_capacity(text.len());
    let mut seen = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (key, value, kb) = parse_line(line).map_err(|reason| Error::parse(path, i + 1, line, reason))?;
        canonical.push_str(&format!("{key}: {value}{}\n", if kb { " kB" } else { "" }));
        seen.insert(key);
    }
    if let Some(missing) = REQUIRED.iter().find(|k| !seen.contains(*k)) {
        return Err(error_at_end(path, text, format!("no {missing} line before the end of the input")));
    }
    <Meminfo as procfs::FromRead>::from_read(canonical.as_bytes())
        .map_err(|e| error_at_end(path, text, format!("procfs rejected the meminfo: {e}")))
}

/// One line: `Key: <n>[ kB]` → (key without the colon, n, whether it had the unit).
fn parse_line(line: &str) -> std::result::Result<(&str, u64, bool), String> {
    let mut fields = line.split_whitespace();
    let key = fields.next().ok_or("empty line")?;
    let key =
        key.strip_suffix(':').ok_or_else(|| format!("expected \"Key: <n> kB\", {key:?} has no colon"))?;
    if key.is_empty() {
        return Err("empty key before the colon".into());
    }
    let value = fields.next().ok_or_else(|| format!("{key} has no value"))?;
    let value: u64 = value.parse().map_err(|_| format!("{key} value {value:?} is not a whole number"))?;
    let kb = match fields.next() {
        None => false,
        Some("kB") => true,
        Some(unit) => return Err(format!("{key} unit {unit:?} is not kB")),
    };
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected {extra:?} after the value of {key}"));
    }
    // procfs stores bytes: a kB count this large cannot be represented.
    if kb && value.checked_mul(1024).is_none() {
        return Err(format!("{key} = {value} kB does not fit in 64 bits as bytes"));
    }
    Ok((key, value, kb))
}

/// A parse error for something missing when the input ran out: it points at the last line (line 1
/// with empty text for an empty input), so every parse error names a line that exists.
pub(crate) fn error_at_end(path: &str, text: &str, reason: impl Into<String>) -> Error {
    let (line, last) = text.lines().enumerate().last().map_or((1, ""), |(i, l)| (i + 1, l));
    Error::parse(path, line, last, reason)
}

/// Which formula produced a `used` figure (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UsedFormula {
    /// procps-ng 4.x: `total - available`.
    TotalMinusAvailable,
    /// procps-ng 3.3.x: `total - free - buff/cache`.
    Classic,
}

/// The `Mem:` row of `free -k`, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeTable {
    pub total: u64,
    /// "used" as procps-ng 4.0.2 computes it (`total - available`). For a row parsed from `free`'s
    /// output, whatever that `free` printed — see [`FreeTable::used_formula`].
    pub used: i64,
    pub free: u64,
    pub shared: u64,
    pub buff_cache: u64,
    pub available: u64,
    /// "used" as procps-ng 3.3.x computed it, for setting an old report beside a new reading.
    pub used_classic: i64,
}

/// The header `free` prints above its rows (without the wide `-w` split of buff/cache).
pub const FREE_HEADER: &str =
    "               total        used        free      shared  buff/cache   available";

impl FreeTable {
    /// Compute the table from the live `/proc/meminfo`.
    pub fn read() -> Result<Self> {
        Ok(Self::from_meminfo(&read_meminfo()?))
    }

    /// Compute the table from a meminfo capture; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        Ok(Self::from_meminfo(&parse_meminfo(text, path)?))
    }

    /// Compute the table the way procps-ng 4.0.2 does (module docs), plus the 3.3.x `used`.
    pub fn from_meminfo(m: &Meminfo) -> Self {
        // procfs holds bytes; free's -k columns are the kernel's kB figures, which divide back exactly.
        let kib = |bytes: u64| bytes / 1024;
        let total = kib(m.mem_total);
        let free = kib(m.mem_free);
        let buff_cache =
            kib(m.buffers).saturating_add(kib(m.cached)).saturating_add(kib(m.s_reclaimable.unwrap_or(0)));
        let available = match m.mem_available.map(kib) {
            Some(a) if a != 0 && a <= total => a,
            _ => free,
        };
        FreeTable {
            total,
            used: signed(i128::from(total) - i128::from(available)),
            free,
            shared: kib(m.shmem.unwrap_or(0)),
            buff_cache,
            available,
            used_classic: classic_used(total, free, buff_cache),
        }
    }

    /// Parse the output of `free` (KiB, i.e. `free` or `free -k`, plain or `-w`) as pasted in a bug
    /// report: every `Mem:` row, in order, under the most recent header. `Swap:`/`Total:`/`Low:`/`High:`
    /// rows are skipped, mail quoting (`> `) is stripped. `used` is taken as printed, `used_classic`
    /// is recomputed from the row's columns.
    ///
    /// Rejected, with the line named: human-readable numbers (`free -h`) and the pre-3.3.10 layout
    /// without an `available` column. `free -m`/`-g` output parses but cannot be told from KiB, so ask
    /// for `free -k`.
    pub fn parse_free_output(text: &str, path: &str) -> Result<Vec<Self>> {
        let mut header: Option<Header> = None;
        let mut rows = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let err = |reason: String| Error::parse(path, i + 1, raw, reason);
            let line = raw.trim_start_matches(|c: char| c == '>' || c.is_whitespace());
            let Some(first) = line.split_whitespace().next() else { continue };
            match first {
                "Mem:" => {
                    let h = header.as_ref().ok_or_else(|| err("Mem: row before any header line".into()))?;
                    rows.push(h.row(line).map_err(err)?);
                }
                "Swap:" | "Total:" | "Low:" | "High:" | "Comm:" => {}
                _ => header = Some(Header::parse(line).map_err(err)?),
            }
        }
        if rows.is_empty() {
            return Err(error_at_end(path, text, "no Mem: row in the free output"));
        }
        Ok(rows)
    }

    /// Which formula `used` agrees with; `None` if neither, or both (the row cannot tell them apart).
    pub fn used_formula(&self) -> Option<UsedFormula> {
        let modern = self.used == signed(i128::from(self.total) - i128::from(self.available));
        let classic = self.used == self.used_classic;
        match (modern, classic) {
            (true, false) => Some(UsedFormula::TotalMinusAvailable),
            (false, true) => Some(UsedFormula::Classic),
            _ => None,
        }
    }

    /// This table's `Mem:` line in `free`'s layout, without the header.
    pub fn mem_row(&self) -> String {
        // free's layout: the label padded to 8, then " %11s" per column (wider numbers push right).
        format!(
            "{:<8} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "Mem:", self.total, self.used, self.free, self.shared, self.buff_cache, self.available
        )
    }

    /// One header and a `Mem:` line per table, like the reports that paste several readings.
    pub fn format_rows(tables: &[FreeTable]) -> String {
        let mut out = String::from(FREE_HEADER);
        for t in tables {
            out.push('\n');
            out.push_str(&t.mem_row());
        }
        out
    }
}

/// The header line and the `Mem:` row, exactly as `free -k` lays them out (no Swap: row).
impl fmt::Display for FreeTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{FREE_HEADER}\n{}", self.mem_row())
    }
}

fn classic_used(total: u64, free: u64, buff_cache: u64) -> i64 {
    let used = i128::from(total) - i128::from(free) - i128::from(buff_cache);
    signed(if used < 0 { i128::from(total) - i128::from(free) } else { used })
}

/// Columns are u64 but `used` is signed; values beyond i64 only come from nonsense input.
fn signed(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// Column positions from a `free` header line.
struct Header {
    names: Vec<String>,
}

impl Header {
    // "cached" is only in the pre-3.3.10 header; known so that header gets the specific error below.
    const KNOWN: &'static [&'static str] =
        &["total", "used", "free", "shared", "buff/cache", "buffers", "cache", "cached", "available"];

    fn parse(line: &str) -> std::result::Result<Self, String> {
        let names: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        if let Some(unknown) = names.iter().find(|n| !Self::KNOWN.contains(&n.as_str())) {
            return Err(format!(
                "{unknown:?} is neither a free column (total used free shared buff/cache available) nor a row label"
            ));
        }
        let has = |n: &str| names.iter().any(|c| c == n);
        if !has("available") {
            return Err(
                "header has no \"available\" column: the pre-3.3.10 free layout is not supported".into()
            );
        }
        for needed in ["total", "used", "free", "shared"] {
            if !has(needed) {
                return Err(format!("header has no {needed:?} column"));
            }
        }
        if !(has("buff/cache") || (has("buffers") && has("cache"))) {
            return Err("header has neither buff/cache nor buffers and cache".into());
        }
        Ok(Header { names })
    }

    fn row(&self, line: &str) -> std::result::Result<FreeTable, String> {
        let values: Vec<&str> = line.split_whitespace().skip(1).collect();
        if values.len() != self.names.len() {
            return Err(format!("{} numbers under a header of {} columns", values.len(), self.names.len()));
        }
        let get = |name: &str| -> std::result::Result<Option<i64>, String> {
            let Some(pos) = self.names.iter().position(|n| n == name) else { return Ok(None) };
            let v = values[pos];
            v.parse::<i64>()
                .map(Some)
                .map_err(|_| format!("{name} {v:?} is not a whole number of KiB (paste `free -k` output)"))
        };
        let unsigned = |name: &str| -> std::result::Result<u64, String> {
            let v = get(name)?.unwrap_or(0);
            u64::try_from(v).map_err(|_| format!("{name} is negative ({v})"))
        };
        let total = unsigned("total")?;
        let free = unsigned("free")?;
        let buff_cache = if self.names.iter().any(|n| n == "buff/cache") {
            unsigned("buff/cache")?
        } else {
            unsigned("buffers")?.saturating_add(unsigned("cache")?)
        };
        Ok(FreeTable {
            total,
            used: get("used")?.unwrap_or(0),
            free,
            shared: unsigned("shared")?,
            buff_cache,
            available: unsigned("available")?,
            used_classic: classic_used(total, free, buff_cache),
        })
    }
}
