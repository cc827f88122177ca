//! Catching failed page allocations in the kernel: `kmem:mm_page_alloc` in a tracefs instance.
//!
//! A failed allocation still fires `mm_page_alloc`, with a NULL page: its raw `pfn` is `-1UL` and it
//! prints as
//!
//! ```text
//! Xorg-12717   [002] .....  3225.313209: mm_page_alloc: page=0000000000000000 pfn=0x0 order=4 migratetype=0 gfp_flags=GFP_KERNEL|__GFP_COMP
//! ```
//!
//! so the filter `order >= N && pfn == 18446744073709551615` keeps exactly the failures of order ≥ N
//! (`pfn == -1` is refused by the filter parser, "Illegal integer value"). A
//! `stacktrace if <same filter>` trigger adds the call chain as a `<stack trace>` entry followed by
//! ` => function` lines. Unlike `warn_alloc()`'s kernel log report, this sees `__GFP_NOWARN`
//! allocations too — the ones that fall back quietly (TCP's order-3 page frags, pipe buffers, slab
//! pages) and that a fragmentation regression slows down without a single log line.
//!
//! Everything lives in an instance of our own (`instances/fraglab-<pid>`): the global buffer,
//! `tracing_on` and `current_tracer` that someone else may be using are never touched. The instance
//! is removed on [`Catcher::stop`], on drop and on every error path. tracefs is mounted if it was
//! not, and unmounted again by the last fraglab process that uses it — a machine-wide rule (flocks
//! and a marker in /run/fraglab, see [`MOUNT_LOCK`]), so concurrent `fraglab` processes neither
//! unmount it under each other nor leave it mounted; a tracefs fraglab did not mount is never
//! unmounted.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where tracefs is mounted when nothing mounted it elsewhere.
pub const DEFAULT_ROOT: &str = "/sys/kernel/tracing";
/// The raw `pfn` of a failed allocation: `-1UL` as the filter parser needs it written.
pub const FAILED_PFN: u64 = u64::MAX;
/// How long a failure waits for its `<stack trace>` entry before it is handed out without one.
const STACK_WAIT: Duration = Duration::from_secs(1);
/// How long the reader drains trace_pipe once the catcher stops. The events are disabled first, so
/// what is left is at most the instance's buffer, read in well under this; events that keep coming
/// (their disable failed) would otherwise keep the reader, and `stop`, forever.
const DRAIN_BOUND: Duration = Duration::from_secs(5);

/// The filter that keeps failed allocations of order ≥ `min_order`.
pub fn failure_filter(min_order: u32) -> String {
    format!("order >= {min_order} && pfn == {FAILED_PFN}")
}

/// The migrate type names for the values `mm_page_alloc` prints, on kernels ≥ v4.4 (before that,
/// 3 was `Reserve`); 4 and up depend on CONFIG_CMA and CONFIG_MEMORY_ISOLATION.
pub fn migratetype_name(migratetype: i32) -> Option<&'static str> {
    ["Unmovable", "Movable", "Reclaimable", "HighAtomic"].get(usize::try_from(migratetype).ok()?).copied()
}

/// One `mm_page_alloc` event: a failure, unless the catcher was asked for successes too.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocFailure {
    /// Seconds on the instance's trace clock (`mono`, i.e. CLOCK_MONOTONIC, when the kernel has it;
    /// see [`Catcher::clock`]).
    pub time: f64,
    pub cpu: u32,
    /// The allocating task (`comm`), as the tracer saw it: `<...>` when its name was not cached.
    pub comm: String,
    pub pid: i32,
    pub order: u32,
    pub migratetype: i32,
    /// The names `__print_flags` printed, in order (`["GFP_KERNEL", "__GFP_COMP"]`); empty for `none`.
    pub gfp_flags: Vec<String>,
    /// Bits no name covered, which the kernel prints as a trailing `|0x…`.
    pub gfp_residue: Option<u64>,
    /// The whole mask, when the names could be mapped through the event's format file.
    pub gfp_mask: Option<u64>,
    /// The page was NULL (`page=0000000000000000`/`(null)` and `pfn=0`).
    pub failed: bool,
    /// The page frame of a successful allocation.
    pub pfn: Option<u64>,
    /// The call chain from the `stacktrace` trigger, innermost first (`trace_event_raw_event_…`
    /// and the allocator's own frames included, as the kernel printed them).
    pub stack: Vec<String>,
    /// The event line as read.
    pub line: String,
    /// Later failures exactly like this one — same task, order, migratetype, flags and call chain —
    /// folded into it once [`KEPT_PER_SITE`] of them were kept whole ([`Folded`]): when each was
    /// (seconds on the same clock as `time`) and on which CPU. Only their event lines are not kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<Repeat>,
}

/// A failure folded into an earlier one exactly like it: its time and CPU, `[time, cpu]` in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Repeat(pub f64, pub u32);

impl AllocFailure {
    /// This failure and those folded into it.
    pub fn count(&self) -> u64 {
        1 + self.repeats.len() as u64
    }

    /// When each of them happened: this one's time, then its repeats'.
    pub fn times(&self) -> impl Iterator<Item = f64> + '_ {
        std::iter::once(self.time).chain(self.repeats.iter().map(|r| r.0))
    }

    /// How many of them happened in `[from, to]`.
    pub fn count_within(&self, from: f64, to: f64) -> u64 {
        self.times().filter(|t| (from..=to).contains(t)).count() as u64
    }

    /// Those of them that happened in `[from, to]`, as one record (the first of them, the rest its
    /// repeats); `None` when none did.
    pub fn within(&self, from: f64, to: f64) -> Option<AllocFailure> {
        let mut times = self.times().zip(std::iter::once(self.cpu).chain(self.repeats.iter().map(|r| r.1)));
        let (time, cpu) = times.by_ref().find(|(t, _)| (from..=to).contains(t))?;
        let repeats = times.filter(|(t, _)| (from..=to).contains(t)).map(|(t, c)| Repeat(t, c)).collect();
        Some(AllocFailure { time, cpu, repeats, ..self.clone() })
    }

    /// The same call site, task and flags: what [`Folded`] folds on.
    fn same_site(&self, other: &AllocFailure) -> bool {
        self.failed == other.failed
            && self.pid == other.pid
            && self.order == other.order
            && self.migratetype == other.migratetype
            && self.gfp_residue == other.gfp_residue
            && self.comm == other.comm
            && self.gfp_flags == other.gfp_flags
            && self.stack == other.stack
    }

    fn site_hash(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.pid, self.order, self.migratetype, self.gfp_residue, &self.comm, &self.gfp_flags, &self.stack)
            .hash(&mut h);
        h.finish()
    }
}

/// Failures of one call site (and task) kept whole before later ones are folded in as [`Repeat`]s.
/// A workload that fails at a known fallback thousands of times a second — TCP's order-3
/// page-frag refill: 19 985 failures in one 10 s window of 30 loopback streams in a 1 GiB guest —
/// would otherwise hold ~1.5 KiB a failure (its stack's strings) in fraglab's memory until the run
/// ends, and write ~700 bytes of JSON each to the results, which in a guest are RAM too: over
/// tcp-high-order's sweep, more than a 1 GiB guest has beside the hold.
pub const KEPT_PER_SITE: usize = 10;

/// Failures in the order they came, each site's past the first [`KEPT_PER_SITE`] folded into the
/// last one kept whole.
#[derive(Debug, Default)]
pub struct Folded {
    failures: Vec<AllocFailure>,
    /// Site hash → (index of the site's last whole record, whole records kept); a hash shared by two
    /// sites has one entry each.
    sites: std::collections::HashMap<u64, Vec<(usize, usize)>>,
}

impl Folded {
    pub fn push(&mut self, f: AllocFailure) {
        if !f.failed {
            self.failures.push(f);
            return;
        }
        let next = self.failures.len();
        let entries = self.sites.entry(f.site_hash()).or_default();
        match entries.iter_mut().find(|(last, _)| self.failures[*last].same_site(&f)) {
            Some(&mut (last, kept)) if kept >= KEPT_PER_SITE => {
                self.failures[last].repeats.push(Repeat(f.time, f.cpu));
            }
            Some(entry) => {
                *entry = (next, entry.1 + 1);
                self.failures.push(f);
            }
            None => {
                entries.push((next, 1));
                self.failures.push(f);
            }
        }
    }

    /// Everything so far; folding starts afresh.
    pub fn take(&mut self) -> Vec<AllocFailure> {
        self.sites.clear();
        std::mem::take(&mut self.failures)
    }
}

/// How a trace prints a task whose name had left the tracer's comm cache (`saved_cmdlines`).
pub const UNKNOWN_COMM: &str = "<...>";

/// Give each `<...>` failure the name its pid has elsewhere in the same capture, so one task is
/// not counted under two names. A pid seen under two different real names (reused within the
/// capture) is left as `<...>`: which of them it was cannot be told.
pub fn fill_unknown_comms(failures: &mut [AllocFailure]) {
    let mut names: std::collections::HashMap<i32, Option<String>> = std::collections::HashMap::new();
    for f in failures.iter().filter(|f| f.comm != UNKNOWN_COMM) {
        names
            .entry(f.pid)
            .and_modify(|n| {
                if n.as_deref() != Some(f.comm.as_str()) {
                    *n = None;
                }
            })
            .or_insert_with(|| Some(f.comm.clone()));
    }
    for f in failures.iter_mut().filter(|f| f.comm == UNKNOWN_COMM) {
        if let Some(Some(name)) = names.get(&f.pid) {
            f.comm = name.clone();
        }
    }
}

/// The part of a trace line before the event: `python3-4567    [001] .....  1717.479162: `.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceHeader {
    pub comm: String,
    pub pid: i32,
    pub cpu: u32,
    pub time: f64,
}

/// Split a trace line into its header, the event name (`mm_page_alloc`, or `<stack trace>`) and the
/// payload after `name: `.
pub fn parse_trace_line(line: &str) -> std::result::Result<(TraceHeader, &str, &str), String> {
    // The timestamp is the first token that is `digits.digits` followed by ": ".
    let mut at = None;
    for (i, _) in line.match_indices(": ") {
        let start = line[..i].rfind(' ').map_or(0, |s| s + 1);
        let token = &line[start..i];
        if token.contains('.') && token.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            at = Some((start, i));
            break;
        }
    }
    let (ts_start, ts_end) = at.ok_or("no \"<seconds>.<fraction>: \" timestamp")?;
    let time: f64 = line[ts_start..ts_end].parse().map_err(|_| "timestamp is not a number".to_string())?;
    let head = line[..ts_start].trim();
    // `comm-pid [cpu] flags`, or with record-tgid `comm-pid (tgid) [cpu] flags`; flags are absent
    // when the irq-info option is off.
    let open = head.rfind('[').ok_or("no [cpu] before the timestamp")?;
    let close = head[open..].find(']').ok_or("unclosed [cpu]")? + open;
    let cpu: u32 = head[open + 1..close].trim().parse().map_err(|_| "cpu is not a number".to_string())?;
    let mut task = head[..open].trim_end();
    if task.ends_with(')') {
        if let Some(p) = task.rfind('(') {
            task = task[..p].trim_end();
        }
    }
    let (comm, pid) = task.rsplit_once('-').ok_or("expected <comm>-<pid>")?;
    let pid: i32 = pid.parse().map_err(|_| format!("pid {pid:?} is not a number"))?;
    let body = &line[ts_end + 2..];
    let (name, payload) = match body.split_once(": ") {
        Some((name, payload)) if !name.contains(' ') => (name, payload),
        _ => (body.trim_end(), ""),
    };
    Ok((TraceHeader { comm: comm.trim().to_string(), pid, cpu, time }, name, payload))
}

/// The fields of an `mm_page_alloc` payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocPayload {
    pub failed: bool,
    pub pfn: u64,
    pub order: u32,
    pub migratetype: i32,
    pub gfp_flags: Vec<String>,
    pub gfp_residue: Option<u64>,
}

/// Parse `page=0000000000000000 pfn=0x0 order=4 migratetype=0 gfp_flags=GFP_KERNEL|__GFP_COMP`.
///
/// Older kernels print `pfn=` in decimal (before v5.14) and a NULL page as `(null)` (before v4.15);
/// both are read.
pub fn parse_alloc_payload(payload: &str) -> std::result::Result<AllocPayload, String> {
    let mut page = None;
    let (mut pfn, mut order, mut migratetype, mut gfp) = (None, None, None, None);
    let mut tokens = payload.split_whitespace().peekable();
    while let Some(token) = tokens.next() {
        let Some((key, value)) = token.split_once('=') else { continue };
        match key {
            // `page=%p` of NULL: zeros (hashed or not), or `(null)` padded into the next token.
            "page" if value.is_empty() => page = tokens.next_if(|t| *t == "(null)").map(|_| true),
            "page" => page = Some(value == "(null)" || value.bytes().all(|b| b == b'0')),
            "pfn" => {
                pfn = Some(
                    match value.strip_prefix("0x") {
                        Some(hex) => u64::from_str_radix(hex, 16),
                        None => value.parse(),
                    }
                    .map_err(|_| format!("pfn {value:?} is not a number"))?,
                )
            }
            "order" => order = Some(value.parse().map_err(|_| format!("order {value:?} is not a number"))?),
            "migratetype" => {
                migratetype =
                    Some(value.parse().map_err(|_| format!("migratetype {value:?} is not a number"))?)
            }
            "gfp_flags" => gfp = Some(value),
            _ => {}
        }
    }
    let pfn = pfn.ok_or("no pfn=")?;
    let order = order.ok_or("no order=")?;
    let migratetype = migratetype.ok_or("no migratetype=")?;
    let gfp = gfp.ok_or("no gfp_flags=")?;
    let (gfp_flags, gfp_residue) = split_gfp_names(gfp)?;
    Ok(AllocPayload {
        failed: page.unwrap_or(false) && pfn == 0,
        pfn,
        order,
        migratetype,
        gfp_flags,
        gfp_residue,
    })
}

/// `GFP_KERNEL|__GFP_COMP|0x100000` → names and the hex residue; `none` → nothing.
fn split_gfp_names(text: &str) -> std::result::Result<(Vec<String>, Option<u64>), String> {
    let mut names = Vec::new();
    let mut residue = None;
    if text == "none" {
        return Ok((names, residue));
    }
    for part in text.split('|').filter(|p| !p.is_empty()) {
        match part.strip_prefix("0x") {
            Some(hex) => {
                residue = Some(u64::from_str_radix(hex, 16).map_err(|_| format!("gfp residue {part:?}"))?)
            }
            None => names.push(part.to_string()),
        }
    }
    Ok((names, residue))
}

/// Parse a whole `mm_page_alloc` trace line (without its stack).
pub fn parse_alloc_line(line: &str) -> std::result::Result<AllocFailure, String> {
    let (h, name, payload) = parse_trace_line(line)?;
    if name != "mm_page_alloc" {
        return Err(format!("event {name:?} is not mm_page_alloc"));
    }
    let p = parse_alloc_payload(payload)?;
    Ok(AllocFailure {
        time: h.time,
        cpu: h.cpu,
        comm: h.comm,
        pid: h.pid,
        order: p.order,
        migratetype: p.migratetype,
        gfp_flags: p.gfp_flags,
        gfp_residue: p.gfp_residue,
        gfp_mask: None,
        failed: p.failed,
        pfn: (!p.failed).then_some(p.pfn),
        stack: Vec::new(),
        line: line.to_string(),
        repeats: Vec::new(),
    })
}

/// One `mm_page_alloc_extfrag` event: an allocation that took pages from another migrate type's
/// free list, the way fragmentation spreads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extfrag {
    pub alloc_order: u32,
    pub fallback_order: u32,
    pub alloc_migratetype: i32,
    pub fallback_migratetype: i32,
    /// The fallback block was smaller than a pageblock: types now mix inside one pageblock.
    pub fragmenting: bool,
    /// The whole pageblock changed owner.
    pub change_ownership: bool,
}

/// Parse `page=… pfn=0x348c00 alloc_order=2 fallback_order=10 pageblock_order=9 alloc_migratetype=2
/// fallback_migratetype=1 fragmenting=0 change_ownership=1`.
pub fn parse_extfrag_payload(payload: &str) -> std::result::Result<Extfrag, String> {
    let mut f: BTreeMap<&str, i64> = BTreeMap::new();
    for token in payload.split_whitespace() {
        if let Some((k, v)) = token.split_once('=') {
            if let Ok(v) = v.parse() {
                f.insert(k, v);
            }
        }
    }
    let get = |k: &str| f.get(k).copied().ok_or_else(|| format!("no {k}="));
    let u = |k: &str| get(k).and_then(|v| u32::try_from(v).map_err(|_| format!("{k}={v} is out of range")));
    let i = |k: &str| get(k).and_then(|v| i32::try_from(v).map_err(|_| format!("{k}={v} is out of range")));
    Ok(Extfrag {
        alloc_order: u("alloc_order")?,
        fallback_order: u("fallback_order")?,
        alloc_migratetype: i("alloc_migratetype")?,
        fallback_migratetype: i("fallback_migratetype")?,
        fragmenting: get("fragmenting")? != 0,
        change_ownership: get("change_ownership")? != 0,
    })
}

/// `mm_page_alloc_extfrag` counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtfragCounts {
    pub events: u64,
    pub fragmenting: u64,
    pub changed_ownership: u64,
    /// Events per requested order.
    pub by_alloc_order: BTreeMap<u32, u64>,
}

impl ExtfragCounts {
    pub fn add(&mut self, e: &Extfrag) {
        self.events += 1;
        self.fragmenting += u64::from(e.fragmenting);
        self.changed_ownership += u64::from(e.change_ownership);
        *self.by_alloc_order.entry(e.alloc_order).or_default() += 1;
    }
}

/// The GFP names of the running kernel and their values, read from the `__print_flags` table in
/// `mm_page_alloc`'s format file, so a symbolic `gfp_flags` can be turned back into the mask that
/// kernel log reports print (`mode:0x40cc0`). Bit positions moved between kernel versions; the
/// table is the running kernel's own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GfpTable {
    pub names: BTreeMap<String, u64>,
}

impl GfpTable {
    /// Read the table out of a format file's `print fmt:` line.
    pub fn from_format(format: &str) -> std::result::Result<GfpTable, String> {
        let start = format.find("__print_flags(").ok_or("no __print_flags( in the format")?;
        let body = &format[start + "__print_flags(".len()..];
        // Skip the value and the delimiter arguments: the table starts at the first '{'.
        let mut rest = &body[body.find('{').ok_or("no flag table")?..];
        let mut names = BTreeMap::new();
        while let Some(open) = rest.find('{') {
            let mut depth = 0i32;
            let mut close = None;
            for (i, c) in rest[open..].char_indices() {
                match c {
                    '{' | '(' => depth += 1,
                    '}' | ')' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            let close = close.ok_or("unbalanced flag table")?;
            let entry = &rest[open + 1..close];
            rest = &rest[close + 1..];
            let Some(comma) = entry.rfind(", \"") else { break };
            let name = entry[comma + 3..].trim().trim_end_matches('"');
            if let Ok(value) = eval_c(&entry[..comma]) {
                names.insert(name.to_string(), value);
            }
            // The `{ 0, ((void *)0) }` / `{ -1, NULL }` terminator has no quoted name.
            if !rest.trim_start().starts_with(',') {
                break;
            }
        }
        if names.is_empty() {
            return Err("the flag table named no flag".into());
        }
        Ok(GfpTable { names })
    }

    /// The mask behind printed names plus residue; `None` if a name is unknown to this table.
    pub fn mask(&self, flags: &[String], residue: Option<u64>) -> Option<u64> {
        flags.iter().try_fold(residue.unwrap_or(0), |m, f| self.names.get(f).map(|v| m | v))
    }
}

/// Evaluate the constant C expressions of a `__print_flags` table: integers (with `UL`-style
/// suffixes), `~ << >> & | + -`, parentheses and casts such as `( gfp_t)` or `( unsigned long)`.
fn eval_c(expr: &str) -> std::result::Result<u64, String> {
    #[derive(Clone, Debug, PartialEq)]
    enum T {
        Num(u64),
        Id(String),
        Op(&'static str),
    }
    let mut toks = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && (b[i] as char).is_ascii_alphanumeric() {
                i += 1;
            }
            let lit = expr[s..i].trim_end_matches(['u', 'U', 'l', 'L']);
            let v = match lit.strip_prefix("0x").or_else(|| lit.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16),
                None => lit.parse(),
            }
            .map_err(|_| format!("bad number {:?}", &expr[s..i]))?;
            toks.push(T::Num(v));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let s = i;
            while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            toks.push(T::Id(expr[s..i].to_string()));
        } else {
            let two = expr.get(i..i + 2).unwrap_or("");
            let op = match (two, c) {
                ("<<", _) => "<<",
                (">>", _) => ">>",
                (_, '(') => "(",
                (_, ')') => ")",
                (_, '~') => "~",
                (_, '|') => "|",
                (_, '&') => "&",
                (_, '+') => "+",
                (_, '-') => "-",
                (_, '*') => "*",
                _ => return Err(format!("unexpected {c:?}")),
            };
            i += op.len();
            toks.push(T::Op(op));
        }
    }
    struct P {
        t: Vec<T>,
        i: usize,
    }
    impl P {
        fn peek(&self) -> Option<&T> {
            self.t.get(self.i)
        }
        fn eat(&mut self, op: &'static str) -> bool {
            if self.peek() == Some(&T::Op(op)) {
                self.i += 1;
                true
            } else {
                false
            }
        }
        fn or(&mut self) -> std::result::Result<u64, String> {
            let mut v = self.and()?;
            while self.eat("|") {
                v |= self.and()?;
            }
            Ok(v)
        }
        fn and(&mut self) -> std::result::Result<u64, String> {
            let mut v = self.shift()?;
            while self.eat("&") {
                v &= self.shift()?;
            }
            Ok(v)
        }
        fn shift(&mut self) -> std::result::Result<u64, String> {
            let mut v = self.add()?;
            loop {
                if self.eat("<<") {
                    v = v.checked_shl(u32::try_from(self.add()?).map_err(|_| "shift")?).ok_or("shift")?;
                } else if self.eat(">>") {
                    v = v.checked_shr(u32::try_from(self.add()?).map_err(|_| "shift")?).ok_or("shift")?;
                } else {
                    return Ok(v);
                }
            }
        }
        fn add(&mut self) -> std::result::Result<u64, String> {
            let mut v = self.unary()?;
            loop {
                if self.eat("+") {
                    v = v.wrapping_add(self.unary()?);
                } else if self.eat("-") {
                    v = v.wrapping_sub(self.unary()?);
                } else {
                    return Ok(v);
                }
            }
        }
        fn unary(&mut self) -> std::result::Result<u64, String> {
            if self.eat("~") {
                return Ok(!self.unary()?);
            }
            if self.eat("-") {
                return Ok(self.unary()?.wrapping_neg());
            }
            match self.peek().cloned() {
                Some(T::Num(n)) => {
                    self.i += 1;
                    Ok(n)
                }
                Some(T::Op("(")) => {
                    // A cast is '(' type words [*] ')'; anything else is a parenthesised expression.
                    let mut j = self.i + 1;
                    while matches!(self.t.get(j), Some(T::Id(_)) | Some(T::Op("*"))) {
                        j += 1;
                    }
                    if j > self.i + 1 && self.t.get(j) == Some(&T::Op(")")) {
                        let words: Vec<&T> = self.t[self.i + 1..j].iter().collect();
                        let known = words.iter().all(|w| match w {
                            T::Id(s) => ["gfp_t", "unsigned", "long", "int", "__force", "u32", "u64", "void"]
                                .contains(&s.as_str()),
                            _ => true,
                        });
                        if !known {
                            return Err("unknown identifier in a cast".into());
                        }
                        self.i = j + 1;
                        return self.unary();
                    }
                    self.i += 1;
                    let v = self.or()?;
                    if !self.eat(")") {
                        return Err("expected ')'".into());
                    }
                    Ok(v)
                }
                Some(T::Id(id)) => Err(format!("unknown identifier {id}")),
                other => Err(format!("unexpected {other:?}")),
            }
        }
    }
    let mut p = P { t: toks, i: 0 };
    let v = p.or()?;
    if p.i != p.t.len() {
        return Err("trailing tokens".into());
    }
    Ok(v)
}

/// Turns trace_pipe text into events, pairing each `mm_page_alloc` with the `<stack trace>` entry
/// its trigger wrote right after it (same task, same CPU; other CPUs' entries may come between).
#[derive(Debug, Default)]
pub struct TraceParser {
    pending: Vec<(AllocFailure, Instant, StackState)>,
    /// Index into `pending` of the failure the following ` => ` lines belong to.
    open_stack: Option<usize>,
    ready: Vec<AllocFailure>,
    gfp: Option<GfpTable>,
    /// Do failures wait for a stack at all (a stack trigger is set)?
    pub expect_stacks: bool,
    pub extfrag: ExtfragCounts,
    /// Events the ring buffer dropped (`CPU:1 [LOST 12 EVENTS]`).
    pub lost: u64,
    /// Lines that were not understood (the first few are kept in `unparsed`).
    pub unparsed_count: u64,
    pub unparsed: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StackState {
    Waiting,
    Reading,
    Done,
}

impl TraceParser {
    pub fn new(expect_stacks: bool, gfp: Option<GfpTable>) -> Self {
        TraceParser { expect_stacks, gfp, ..Default::default() }
    }

    /// Feed one line of trace_pipe output (without its newline).
    pub fn feed_line(&mut self, line: &str) {
        if let Some(frame) = line.strip_prefix(" => ") {
            if let Some(i) = self.open_stack {
                self.pending[i].0.stack.push(frame.trim().to_string());
            }
            return;
        }
        self.close_stack();
        if line.trim().is_empty() {
            return;
        }
        if let Some(n) = lost_events(line) {
            self.lost += n;
            return;
        }
        match parse_trace_line(line) {
            Ok((_, "mm_page_alloc", _)) => match parse_alloc_line(line) {
                Ok(mut f) => {
                    if let Some(t) = &self.gfp {
                        f.gfp_mask = t.mask(&f.gfp_flags, f.gfp_residue);
                    }
                    let state = if self.expect_stacks { StackState::Waiting } else { StackState::Done };
                    self.pending.push((f, Instant::now(), state));
                }
                Err(_) => self.unparsed(line),
            },
            Ok((h, "<stack trace>", _)) => {
                let i = self
                    .pending
                    .iter()
                    .rposition(|(f, _, s)| *s == StackState::Waiting && f.pid == h.pid && f.cpu == h.cpu);
                if let Some(i) = i {
                    self.pending[i].2 = StackState::Reading;
                }
                self.open_stack = i;
            }
            Ok((_, "mm_page_alloc_extfrag", payload)) => match parse_extfrag_payload(payload) {
                Ok(e) => self.extfrag.add(&e),
                Err(_) => self.unparsed(line),
            },
            _ => self.unparsed(line),
        }
    }

    fn unparsed(&mut self, line: &str) {
        self.unparsed_count += 1;
        if self.unparsed.len() < 20 {
            self.unparsed.push(line.to_string());
        }
    }

    fn close_stack(&mut self) {
        if let Some(i) = self.open_stack.take() {
            self.pending[i].2 = StackState::Done;
        }
    }

    /// A read from trace_pipe ended: it returns whole entries, so an open stack is complete.
    pub fn end_of_read(&mut self) {
        self.close_stack();
    }

    /// Hand out the events that are complete: their stack is read, or it did not come within a
    /// second, or `all` (the catcher is stopping).
    pub fn take_ready(&mut self, all: bool) -> Vec<AllocFailure> {
        if all {
            self.close_stack();
        }
        let now = Instant::now();
        let open = self.open_stack;
        let mut keep = Vec::new();
        let mut new_open = None;
        for (i, (f, t, s)) in std::mem::take(&mut self.pending).into_iter().enumerate() {
            let done = all
                || s == StackState::Done
                || (s == StackState::Waiting && now.duration_since(t) >= STACK_WAIT);
            if done && Some(i) != open {
                self.ready.push(f);
            } else {
                if Some(i) == open {
                    new_open = Some(keep.len());
                }
                keep.push((f, t, s));
            }
        }
        self.pending = keep;
        self.open_stack = new_open;
        std::mem::take(&mut self.ready)
    }
}

/// `CPU:1 [LOST 12 EVENTS]`.
fn lost_events(line: &str) -> Option<u64> {
    let rest = line.trim().strip_prefix("CPU:")?;
    let (_, rest) = rest.split_once("[LOST ")?;
    rest.strip_suffix(" EVENTS]")?.parse().ok()
}

/// What the catcher records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub min_order: u32,
    /// Only failed allocations (`pfn == -1`). `false` records successful ones of order ≥
    /// `min_order` too — only sensible with `pid`, to prove the plumbing on a machine where
    /// nothing fails.
    pub failures_only: bool,
    /// Only allocations by this task id (`common_pid`).
    pub pid: Option<i32>,
    /// Add the `stacktrace` trigger.
    pub stacks: bool,
    /// Also count `kmem:mm_page_alloc_extfrag` events.
    pub extfrag: bool,
}

impl Options {
    /// Failed allocations of order ≥ `min_order`, with stacks: what a run wants.
    pub fn failures(min_order: u32) -> Self {
        Options { min_order, failures_only: true, pid: None, stacks: true, extfrag: false }
    }

    /// The event filter these options give.
    pub fn filter(&self) -> String {
        let mut f = if self.failures_only {
            failure_filter(self.min_order)
        } else {
            format!("order >= {}", self.min_order)
        };
        if let Some(pid) = self.pid {
            f.push_str(&format!(" && common_pid == {pid}"));
        }
        f
    }
}

/// What [`Catcher::stop`] leaves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stopped {
    /// Events not yet drained.
    pub failures: Vec<AllocFailure>,
    pub extfrag: ExtfragCounts,
    pub lost: u64,
    pub unparsed: Vec<String>,
    /// This stop unmounted tracefs: fraglab had mounted it (this process or another) and this was
    /// the last fraglab process using it.
    pub unmounted: bool,
}

#[derive(Default)]
struct Shared {
    parser: TraceParser,
    ready: Folded,
    error: Option<String>,
}

/// A running failed-allocation catcher: its own tracefs instance and a thread reading its
/// trace_pipe.
pub struct Catcher {
    options: Options,
    filter: String,
    clock: String,
    instance: Option<InstanceGuard>,
    mount: Option<MountGuard>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    shared: Arc<Mutex<Shared>>,
}

impl Catcher {
    /// Catch failed allocations of order ≥ `min_order`, with their call chains.
    pub fn start(min_order: u32) -> Result<Catcher> {
        Self::start_with(Options::failures(min_order))
    }

    pub fn start_with(options: Options) -> Result<Catcher> {
        let mount = MountGuard::acquire()?;
        let root = mount.root.clone();
        let instance = InstanceGuard::create(&root)?;
        let dir = instance.dir.clone();
        let event = dir.join("events/kmem/mm_page_alloc");
        if !event.join("enable").exists() {
            return Err(Error::Io {
                path: event,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "this kernel has no kmem:mm_page_alloc tracepoint",
                ),
            });
        }
        // `mono` makes event times CLOCK_MONOTONIC, comparable with the workloads' Instants; the
        // instance's clock is its own, so nobody else's trace changes.
        let clock =
            if write_ctl(&dir.join("trace_clock"), "mono").is_ok() { "mono" } else { "local" }.to_string();
        // Wake the reader on the first byte, not when the buffer is half full (instance-local too).
        let _ = write_ctl(&dir.join("buffer_percent"), "0");

        let filter = options.filter();
        write_ctl(&event.join("filter"), &filter).map_err(|e| with_error_log(e, &dir))?;
        let back = read_ctl(&event.join("filter"))?;
        if back.trim() != filter {
            return Err(Error::parse(
                event.join("filter"),
                1,
                back.trim(),
                format!("the kernel kept {:?}, not {filter:?}", back.trim()),
            ));
        }
        if options.stacks {
            let trigger = format!("stacktrace if {filter}");
            write_ctl(&event.join("trigger"), &trigger).map_err(|e| with_error_log(e, &dir))?;
            let back = read_ctl(&event.join("trigger"))?;
            if !back.lines().any(|l| l.starts_with("stacktrace") && l.ends_with(&format!(" if {filter}"))) {
                return Err(Error::parse(
                    event.join("trigger"),
                    1,
                    back.trim(),
                    "the stacktrace trigger did not stick",
                ));
            }
        }
        let gfp =
            std::fs::read_to_string(event.join("format")).ok().and_then(|f| GfpTable::from_format(&f).ok());
        let shared = Arc::new(Mutex::new(Shared {
            parser: TraceParser::new(options.stacks, gfp),
            ..Default::default()
        }));

        // Open the pipe before enabling, so the first event cannot be missed.
        let pipe_path = dir.join("trace_pipe");
        let pipe = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&pipe_path)
                .map_err(|source| Error::Io { path: pipe_path.clone(), source })?
        };
        write_ctl(&event.join("enable"), "1")?;
        if options.extfrag {
            let x = dir.join("events/kmem/mm_page_alloc_extfrag/enable");
            write_ctl(&x, "1")?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (stop, shared) = (Arc::clone(&stop), Arc::clone(&shared));
            std::thread::Builder::new()
                .name("fraglab-tracefs".into())
                .spawn(move || read_pipe(pipe, &pipe_path, &stop, &shared, DRAIN_BOUND))
                .map_err(|source| Error::Io { path: dir.join("trace_pipe"), source })?
        };
        Ok(Catcher {
            options,
            filter,
            clock,
            instance: Some(instance),
            mount: Some(mount),
            stop,
            reader: Some(reader),
            shared,
        })
    }

    /// The event filter, as the kernel read it back.
    pub fn filter(&self) -> &str {
        &self.filter
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The instance's trace clock: `mono` (CLOCK_MONOTONIC) or, on kernels without it, `local`.
    pub fn clock(&self) -> &str {
        &self.clock
    }

    /// `…/instances/fraglab-<pid>`.
    pub fn instance_dir(&self) -> &Path {
        &self.instance.as_ref().expect("instance lives until stop").dir
    }

    /// fraglab mounted the tracefs this catcher uses (this process or another fraglab, as the marker
    /// [`MOUNT_MARKER`] says): the last fraglab process to stop its catchers unmounts it.
    pub fn mounted_tracefs(&self) -> bool {
        self.mount.as_ref().is_some_and(|m| m.ours())
    }

    /// Failures caught since the last drain. A failure is held back until its stack arrives (at
    /// most a second).
    pub fn drain(&self) -> Vec<AllocFailure> {
        let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        for f in s.parser.take_ready(false) {
            s.ready.push(f);
        }
        s.ready.take()
    }

    /// `mm_page_alloc_extfrag` counts so far (zero unless [`Options::extfrag`]).
    pub fn extfrag(&self) -> ExtfragCounts {
        self.shared.lock().unwrap_or_else(|p| p.into_inner()).parser.extfrag.clone()
    }

    /// Disable the events, read what is left, remove the instance; if this was the last fraglab
    /// process using tracefs and fraglab mounted it, unmount it.
    pub fn stop(mut self) -> Result<Stopped> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<Stopped> {
        let mut first_err = None;
        if let Some(instance) = &self.instance {
            // Stop new events first; what is already in the buffer is still read below.
            if let Err(e) = instance.disable_events() {
                first_err.get_or_insert(e);
            }
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let mut out = {
            let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            for f in s.parser.take_ready(true) {
                s.ready.push(f);
            }
            let failures = s.ready.take();
            if let Some(e) = s.error.take() {
                first_err.get_or_insert(Error::Io {
                    path: self.instance.as_ref().map_or_else(PathBuf::new, |i| i.dir.join("trace_pipe")),
                    source: std::io::Error::other(e),
                });
            }
            Stopped {
                failures,
                extfrag: s.parser.extfrag.clone(),
                lost: s.parser.lost,
                unparsed: s.parser.unparsed.clone(),
                unmounted: false,
            }
        };
        if let Some(mut instance) = self.instance.take() {
            if let Err(e) = instance.remove() {
                first_err.get_or_insert(e);
            }
        }
        if let Some(mut mount) = self.mount.take() {
            match mount.release() {
                Ok(unmounted) => out.unmounted = unmounted,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

impl Drop for Catcher {
    fn drop(&mut self) {
        if self.instance.is_some() || self.mount.is_some() {
            let _ = self.shutdown();
        }
    }
}

/// The reader thread: poll, read whole entries, parse; after `stop`, read until the pipe is empty,
/// for at most `drain_bound` (past it, the error says so).
fn read_pipe(mut pipe: File, path: &Path, stop: &AtomicBool, shared: &Mutex<Shared>, drain_bound: Duration) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut partial = String::new();
    let mut stopped_at = None;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if stopping && stopped_at.get_or_insert_with(Instant::now).elapsed() > drain_bound {
            shared.lock().unwrap_or_else(|p| p.into_inner()).error = Some(format!(
                "still not empty {} after the catcher stopped (events still coming: not disabled?); stopped \
                 reading",
                humantime::format_duration(drain_bound)
            ));
            return;
        }
        let mut pfd = libc::pollfd { fd: pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // The timeout bounds both the stop latency and, if poll waits for a fuller buffer on some
        // kernel, how late an event is read.
        if !stopping {
            unsafe { libc::poll(&mut pfd, 1, 100) };
        }
        let mut empty = false;
        match pipe.read(&mut buf) {
            Ok(0) => empty = true,
            Ok(n) => {
                partial.push_str(&String::from_utf8_lossy(&buf[..n]));
                let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
                while let Some(nl) = partial.find('\n') {
                    let line: String = partial.drain(..=nl).collect();
                    s.parser.feed_line(line.trim_end_matches('\n'));
                }
                if partial.is_empty() {
                    s.parser.end_of_read();
                }
                for f in s.parser.take_ready(false) {
                    s.ready.push(f);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => empty = true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                shared.lock().unwrap_or_else(|p| p.into_inner()).error =
                    Some(format!("{}: {e}", path.display()));
                return;
            }
        }
        if stopping && empty {
            if !partial.is_empty() {
                shared.lock().unwrap_or_else(|p| p.into_inner()).parser.feed_line(&partial);
            }
            return;
        }
    }
}

/// Write a tracefs control file in one `write()`, without O_TRUNC (which on `trigger` would
/// clear every trigger first).
fn write_ctl(path: &Path, text: &str) -> Result<()> {
    let io = |source| Error::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::OpenOptions::new().write(true).open(path).map_err(io)?;
    let n = f.write(text.as_bytes()).map_err(io)?;
    if n != text.len() {
        return Err(io(std::io::Error::other(format!("short write: {n} of {} bytes", text.len()))));
    }
    Ok(())
}

/// Read a tracefs control file in one `read()`: `filter` answers only the read at offset 0, so
/// `read_to_string`'s 32-byte first read would cut it to 32 characters.
fn read_ctl(path: &Path) -> Result<String> {
    let io = |source| Error::Io { path: path.to_path_buf(), source };
    let mut f = File::open(path).map_err(io)?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = f.read(&mut buf).map_err(io)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Add the instance's `error_log` (where the filter parser says what it disliked) to an error.
fn with_error_log(e: Error, dir: &Path) -> Error {
    let log = read_ctl(&dir.join("error_log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect();
    match e {
        Error::Io { path, source } if !tail.is_empty() => Error::Io {
            path,
            source: std::io::Error::new(
                source.kind(),
                format!("{source}; error_log: {}", tail.join(" / ").trim()),
            ),
        },
        e => e,
    }
}

// ---- The machine-wide mount rule ----
//
// Several fraglab processes (a `fraglab run`, a `fraglab workload trigger`, a test binary) may use
// catchers at the same time, so "who mounted tracefs, and who unmounts it" is decided machine-wide,
// with two flocks and a marker file in /run/fraglab:
//
// - every process with a catcher holds `tracefs.users` LOCK_SH (one lock per process, taken by its
//   first catcher and let go by its last: [`MountState`] counts the catchers inside the process);
// - `tracefs.lock` is held LOCK_EX around every decision: joining (take `tracefs.users` shared,
//   mount tracefs if it is nowhere, write the marker) and leaving (try `tracefs.users` exclusively,
//   without waiting: getting it means no other fraglab process uses tracefs, so this one is the last
//   and unmounts what the marker says fraglab mounted);
// - `tracefs.mounted` (the marker) says that fraglab mounted tracefs: the mount point, its mount ids
//   (mountinfo's, which the kernel reuses, and statx's never-reused one), the mount namespace and the
//   boot. A tracefs the marker does not describe (the user's, another tool's, systemd's) is never
//   unmounted.
//
// The kernel drops a flock when its process dies, so a SIGKILLed fraglab never blocks the others,
// and its leftovers (the mount, its instance) are cleaned by whoever is the last user next. Apart
// from a death dropping a shared lock, every change to `tracefs.users`' lock state happens under
// `tracefs.lock`, so the shared→exclusive conversion (not atomic in flock) cannot race with another
// process's.

/// The directory of fraglab's machine-wide tracefs lock and marker (the fragmenter's run directory;
/// fixed, not `--run-dir`, so every fraglab on the machine sees the same files).
pub const LOCK_DIR: &str = "/run/fraglab";
/// Held LOCK_EX while a process joins or leaves the tracefs users (and mounts or unmounts).
pub const MOUNT_LOCK: &str = "/run/fraglab/tracefs.lock";
/// Held LOCK_SH by every process that has a catcher running.
pub const USERS_LOCK: &str = "/run/fraglab/tracefs.users";
/// Present while a tracefs that fraglab mounted is (or may be) mounted: `key=value` lines.
pub const MOUNT_MARKER: &str = "/run/fraglab/tracefs.mounted";

/// The tracefs mount this process uses; shared by every catcher in it.
struct MountGuard {
    root: PathBuf,
    released: bool,
}

/// This process's share of tracefs: how many of its catchers use it, and its `tracefs.users` lock.
struct MountState {
    users: usize,
    root: PathBuf,
    /// The marker described this mount when the process joined: fraglab mounted it.
    fraglab_mounted: bool,
    /// `tracefs.users`, flocked LOCK_SH.
    users_lock: File,
}

static MOUNT: Mutex<Option<MountState>> = Mutex::new(None);

impl MountGuard {
    fn acquire() -> Result<MountGuard> {
        let mut state = MOUNT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = state.as_mut() {
            s.users += 1;
            return Ok(MountGuard { root: s.root.clone(), released: false });
        }
        let (root, fraglab_mounted, users_lock) = join_users()?;
        *state = Some(MountState { users: 1, root: root.clone(), fraglab_mounted, users_lock });
        Ok(MountGuard { root, released: false })
    }

    fn ours(&self) -> bool {
        MOUNT.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|s| s.fraglab_mounted)
    }

    /// Drop this user; the process's last one leaves the machine's tracefs users, and if it was the
    /// last fraglab process using tracefs, unmounts it when fraglab mounted it. `Ok(true)` when it
    /// was unmounted here.
    fn release(&mut self) -> Result<bool> {
        if self.released {
            return Ok(false);
        }
        self.released = true;
        // Held until the process has left, so a catcher starting meanwhile in another thread joins
        // afresh (and sees the unmount).
        let mut state = MOUNT.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = state.as_mut() else { return Ok(false) };
        s.users -= 1;
        if s.users > 0 {
            return Ok(false);
        }
        let s = state.take().expect("checked above");
        leave_users(s.users_lock, &s.root)
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}

/// Open (creating /run/fraglab and the file if needed) one of the lock files.
fn open_lock(path: &str) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(LOCK_DIR).map_err(io_err(LOCK_DIR))?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
        .map_err(io_err(path))
}

/// `flock(2)`, retried on EINTR; `Ok(false)` when a `LOCK_NB` request found the lock held.
fn flock(file: &File, path: &str, op: libc::c_int) -> Result<bool> {
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if op & libc::LOCK_NB != 0 => return Ok(false),
            _ => return Err(Error::Io { path: path.into(), source: e }),
        }
    }
}

/// Join the machine's tracefs users: under `tracefs.lock`, take `tracefs.users` shared, mount
/// tracefs (and write the marker) if it is mounted nowhere. If no other fraglab process is using
/// tracefs, every `fraglab-*` instance is a dead process's and is removed. Returns the tracefs root,
/// whether fraglab mounted it, and the held users lock.
fn join_users() -> Result<(PathBuf, bool, File)> {
    let gate = open_lock(MOUNT_LOCK)?;
    flock(&gate, MOUNT_LOCK, libc::LOCK_EX)?;
    let users = open_lock(USERS_LOCK)?;
    // Nobody holds it exclusively outside `tracefs.lock`, so neither of these waits.
    let alone = flock(&users, USERS_LOCK, libc::LOCK_EX | libc::LOCK_NB)?;
    flock(&users, USERS_LOCK, libc::LOCK_SH)?;
    let here = Here::now();
    let marker = Marker::read();
    if marker.is_none() && Path::new(MOUNT_MARKER).exists() {
        remove_marker(); // unreadable: it can never justify an unmount
    }
    let (root, fraglab_mounted) = match find_tracefs()? {
        Some(m) => {
            let ours = marker.as_ref().is_some_and(|k| k.describes(&m, &here));
            if !ours && marker.as_ref().is_some_and(|k| !k.elsewhere(&here) && !k.mounted(&here)) {
                // It names a mount of this namespace that is gone or was replaced: stale.
                remove_marker();
            }
            (m.path, ours)
        }
        None => {
            let at = Path::new(DEFAULT_ROOT);
            mount_tracefs(at)?;
            let written = find_tracefs().and_then(|m| {
                let m = m.filter(|m| m.path == at).ok_or_else(|| {
                    io_err(at)(std::io::Error::other("mounted tracefs here but mountinfo does not show it"))
                })?;
                Marker {
                    mountpoint: m.path,
                    mnt_id: m.id,
                    mnt_id_unique: m.unique,
                    mnt_ns: here.ns,
                    boot_id: here.boot_id,
                    pid: std::process::id(),
                }
                .write()
            });
            if let Err(e) = written {
                let _ = unmount(at);
                return Err(e);
            }
            (at.to_path_buf(), true)
        }
    };
    if alone {
        remove_stale_instances(&root.join("instances"), true);
    }
    drop(gate);
    Ok((root, fraglab_mounted, users))
}

/// Leave the machine's tracefs users (this process's last catcher has stopped). Under
/// `tracefs.lock`, try `tracefs.users` exclusively without waiting: if another fraglab process
/// holds it shared, it is still using tracefs and will clean up. Otherwise this is the last user:
/// instances dead fraglabs left are removed, and the tracefs the marker describes is unmounted.
/// `Ok(true)` when it was unmounted here. If something else keeps it busy (EBUSY: an open trace
/// file), it stays mounted and the marker stays, for the next last user to retry.
fn leave_users(users: File, root: &Path) -> Result<bool> {
    let gate = open_lock(MOUNT_LOCK)?;
    flock(&gate, MOUNT_LOCK, libc::LOCK_EX)?;
    let last = flock(&users, USERS_LOCK, libc::LOCK_EX | libc::LOCK_NB)?;
    let out = if last { clean_up_as_last_user(root) } else { Ok(false) };
    // Unlock before the gate goes, so whoever takes the gate next finds the users lock as it is.
    drop(users);
    drop(gate);
    out
}

fn clean_up_as_last_user(root: &Path) -> Result<bool> {
    remove_stale_instances(&root.join("instances"), true);
    let Some(marker) = Marker::read() else {
        if Path::new(MOUNT_MARKER).exists() {
            remove_marker(); // unreadable: it can never justify an unmount
        }
        return Ok(false);
    };
    let here = Here::now();
    let target = tracefs_mounts()?.into_iter().rev().find(|m| marker.describes(m, &here));
    let Some(target) = target else {
        // Unmounted by someone else, replaced, from an earlier boot, or in another mount
        // namespace (whose fraglab, not holding the users lock, is gone): nothing here is
        // fraglab's to unmount.
        remove_marker();
        return Ok(false);
    };
    if target.path != root {
        remove_stale_instances(&target.path.join("instances"), true);
    }
    match unmount(&target.path) {
        Ok(()) => {
            remove_marker();
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
        Err(source) => Err(Error::Io { path: target.path, source }),
    }
}

fn unmount(at: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).expect("no NUL in a mount point");
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Where a mount is seen from: this boot and this process's mount namespace.
#[derive(Clone, Debug, PartialEq)]
struct Here {
    /// `mnt:[4026531841]`.
    ns: String,
    /// /proc/sys/kernel/random/boot_id: a marker on a /run that is not tmpfs outlives the boot.
    boot_id: String,
}

impl Here {
    fn now() -> Here {
        // thread-self, not self: a thread may have its own mount namespace (unshare(CLONE_NEWNS) on
        // one thread, as the mount-rule tests do), and it is this thread's that it mounts in.
        let ns = std::fs::read_link("/proc/thread-self/ns/mnt").map(|p| p.to_string_lossy().into_owned());
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id");
        Here { ns: ns.unwrap_or_default(), boot_id: boot.unwrap_or_default().trim().to_string() }
    }
}

/// What `tracefs.mounted` records: the tracefs fraglab mounted.
#[derive(Clone, Debug, PartialEq)]
struct Marker {
    mountpoint: PathBuf,
    /// The mount's id (the first field of its mountinfo line). The kernel reuses these ids.
    mnt_id: u64,
    /// Its 64-bit id that is never reused until reboot (statx `STATX_MNT_ID_UNIQUE`, Linux 6.8+).
    mnt_id_unique: Option<u64>,
    mnt_ns: String,
    boot_id: String,
    /// The process that mounted it (for a human reading the file).
    pid: u32,
}

impl Marker {
    /// The marker, if there is one and it reads; a garbled one counts as none.
    fn read() -> Option<Marker> {
        let text = std::fs::read_to_string(MOUNT_MARKER).ok()?;
        Marker::parse(&text)
    }

    fn parse(text: &str) -> Option<Marker> {
        let mut fields = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((k, v)) = line.split_once('=') {
                fields.insert(k.trim(), v.trim());
            }
        }
        Some(Marker {
            mountpoint: PathBuf::from(fields.get("mountpoint").filter(|p| p.starts_with('/'))?),
            mnt_id: fields.get("mnt_id")?.parse().ok()?,
            mnt_id_unique: match fields.get("mnt_id_unique") {
                Some(u) => Some(u.parse().ok()?),
                None => None,
            },
            mnt_ns: fields.get("mnt_ns")?.to_string(),
            boot_id: fields.get("boot_id")?.to_string(),
            pid: fields.get("pid").and_then(|p| p.parse().ok()).unwrap_or(0),
        })
    }

    fn text(&self) -> String {
        let mut t = format!(
            "# fraglab mounted tracefs here; the last fraglab process using it unmounts it \
             (crates/probe/src/tracefs.rs)\nmountpoint={}\nmnt_id={}\n",
            self.mountpoint.display(),
            self.mnt_id
        );
        if let Some(u) = self.mnt_id_unique {
            t.push_str(&format!("mnt_id_unique={u}\n"));
        }
        t.push_str(&format!("mnt_ns={}\nboot_id={}\npid={}\n", self.mnt_ns, self.boot_id, self.pid));
        t
    }

    /// Written whole (a temporary file renamed over it), under `tracefs.lock`.
    fn write(&self) -> Result<()> {
        let tmp = format!("{MOUNT_MARKER}.tmp");
        std::fs::write(&tmp, self.text()).map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, MOUNT_MARKER).map_err(io_err(MOUNT_MARKER))
    }

    /// `m`, seen from `here`, is the mount this marker records.
    fn describes(&self, m: &TracefsMount, here: &Here) -> bool {
        self.boot_id == here.boot_id
            && self.mnt_ns == here.ns
            && self.mountpoint == m.path
            && self.mnt_id == m.id
            && self.mnt_id_unique.is_none_or(|u| m.unique == Some(u))
    }

    /// It records a mount of another mount namespace (of this boot), which this process cannot see.
    fn elsewhere(&self, here: &Here) -> bool {
        self.boot_id == here.boot_id && self.mnt_ns != here.ns
    }

    /// The recorded mount is still there (seen from `here`).
    fn mounted(&self, here: &Here) -> bool {
        tracefs_mounts().is_ok_and(|ms| ms.iter().any(|m| self.describes(m, here)))
    }
}

fn remove_marker() {
    let _ = std::fs::remove_file(MOUNT_MARKER);
}

/// A tracefs mount: its mountinfo id and mount point.
#[derive(Clone, Debug, PartialEq)]
struct TracefsMount {
    id: u64,
    path: PathBuf,
    /// Its never-reused id, when the kernel has them and it is the mount the path leads to.
    unique: Option<u64>,
}

/// Every tracefs mount of this mount namespace, in mountinfo order (a mount stacked on another
/// comes after it).
fn tracefs_mounts() -> Result<Vec<TracefsMount>> {
    // This thread's mounts (see `Here::now`).
    const MOUNTINFO: &str = "/proc/thread-self/mountinfo";
    let text = crate::error::read_to_string(MOUNTINFO)?;
    let mut found = parse_tracefs_mounts(&text);
    for m in &mut found {
        // statx names the mount the path leads to (the top one): only if that is `m` is its
        // unique id `m`'s.
        if statx_mnt_id(&m.path, libc::STATX_MNT_ID) == Some(m.id) {
            m.unique = statx_mnt_id(&m.path, libc::STATX_MNT_ID_UNIQUE);
        }
    }
    Ok(found)
}

/// The mount id statx reports for `path`: `STATX_MNT_ID` (as in mountinfo) or
/// `STATX_MNT_ID_UNIQUE`; `None` if the kernel does not report that kind.
fn statx_mnt_id(path: &Path, kind: libc::c_uint) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statx into a zeroed struct of the right type, on a NUL-terminated path.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_NO_AUTOMOUNT, kind, &mut st) };
    (r == 0 && st.stx_mask & kind != 0).then_some(st.stx_mnt_id)
}

fn parse_tracefs_mounts(mountinfo: &str) -> Vec<TracefsMount> {
    let mut found = Vec::new();
    for line in mountinfo.lines() {
        // `36 35 0:12 / /sys/kernel/tracing rw,nosuid - tracefs nodev rw`: the type follows " - ".
        let Some((left, right)) = line.split_once(" - ") else { continue };
        if right.split_whitespace().next() != Some("tracefs") {
            continue;
        }
        let mut f = left.split_whitespace();
        let id = f.next().and_then(|id| id.parse().ok());
        if let (Some(id), Some(mp)) = (id, f.nth(3)) {
            found.push(TracefsMount { id, path: PathBuf::from(unescape_mountinfo(mp)), unique: None });
        }
    }
    found
}

/// Where tracefs is mounted, preferring /sys/kernel/tracing (the top mount there, if stacked);
/// `None` if nowhere.
fn find_tracefs() -> Result<Option<TracefsMount>> {
    let found = tracefs_mounts()?;
    let default = found.iter().rev().find(|m| m.path == Path::new(DEFAULT_ROOT));
    Ok(default.or(found.first()).cloned())
}

/// mountinfo writes ` `, `\t`, `\n` and `\` in paths as `\040`-style octal.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mount_tracefs(at: &Path) -> Result<()> {
    let io = |source| Error::Io { path: at.to_path_buf(), source };
    if !at.is_dir() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no mount point: is CONFIG_TRACING set?",
        )));
    }
    let target = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).expect("no NUL in a path");
    let r =
        unsafe { libc::mount(c"nodev".as_ptr(), target.as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Our instance directory; removed on drop.
struct InstanceGuard {
    dir: PathBuf,
    removed: bool,
}

static NEXT_INSTANCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl InstanceGuard {
    fn create(root: &Path) -> Result<InstanceGuard> {
        let instances = root.join("instances");
        remove_stale_instances(&instances, false);
        let pid = std::process::id();
        loop {
            let n = NEXT_INSTANCE.fetch_add(1, Ordering::SeqCst);
            let name = if n == 0 { format!("fraglab-{pid}") } else { format!("fraglab-{pid}-{n}") };
            let dir = instances.join(name);
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(InstanceGuard { dir, removed: false }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
                Err(source) => return Err(Error::Io { path: dir, source }),
            }
        }
    }

    fn disable_events(&self) -> Result<()> {
        for event in ["mm_page_alloc", "mm_page_alloc_extfrag"] {
            let enable = self.dir.join("events/kmem").join(event).join("enable");
            if enable.exists() {
                write_ctl(&enable, "0")?;
            }
        }
        Ok(())
    }

    /// Disable, clear the trigger and the filter, then rmdir (which also frees the buffer).
    fn remove(&mut self) -> Result<()> {
        if self.removed {
            return Ok(());
        }
        self.disable_events()?;
        let event = self.dir.join("events/kmem/mm_page_alloc");
        let triggers = read_ctl(&event.join("trigger")).unwrap_or_default();
        if triggers.lines().any(|l| l.starts_with("stacktrace")) {
            write_ctl(&event.join("trigger"), "!stacktrace")?;
        }
        if event.join("filter").exists() {
            write_ctl(&event.join("filter"), "0")?;
        }
        std::fs::remove_dir(&self.dir).map_err(|source| Error::Io { path: self.dir.clone(), source })?;
        self.removed = true;
        Ok(())
    }
}

impl Drop for InstanceGuard {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.remove();
            if !self.removed {
                // A half-set-up instance (say, a refused filter) still goes: rmdir works regardless.
                let _ = std::fs::remove_dir(&self.dir);
            }
        }
    }
}

/// Remove `fraglab-<pid>…` instances a SIGKILLed fraglab left: those whose process is gone, or with
/// `all`, every one (when no other fraglab process holds `tracefs.users`, none of them is in use: this
/// also covers a dead fraglab whose pid was reused, or that ran in another pid namespace). An
/// instance whose `trace_pipe` is open refuses rmdir (EBUSY), so a live reader never loses its own.
/// Returns the instances removed.
fn remove_stale_instances(instances: &Path, all: bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(instances) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = instance_pid(&name) else { continue };
        let dead = pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists();
        if (all || dead) && std::fs::remove_dir(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

/// Remove the instances of fraglab catchers whose process is gone, in every tracefs mounted here —
/// what every fraglab command does first, so a SIGKILLed run's filter and stack trigger stop
/// costing every page allocation now, not at the next run. Mounts nothing and waits on no lock; an
/// instance whose `trace_pipe` is still open refuses rmdir and stays. Returns the instances removed.
pub fn remove_dead_instances() -> Vec<PathBuf> {
    let Ok(mounts) = tracefs_mounts() else { return Vec::new() };
    mounts.iter().flat_map(|m| remove_stale_instances(&m.path.join("instances"), false)).collect()
}

/// The pid in a catcher's instance name: `fraglab-<pid>` or `fraglab-<pid>-<n>`.
fn instance_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("fraglab-")?;
    let (pid, n) = rest.split_once('-').map_or((rest, None), |(p, n)| (p, Some(n)));
    if n.is_some_and(|n| n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_expressions() {
        assert_eq!(eval_c("( unsigned long)(( gfp_t)((((1UL))) << (10)))").unwrap(), 1 << 10);
        assert_eq!(eval_c("((1UL << 3) | (1UL << 1)) & ~(1UL << 1)").unwrap(), 8);
        assert!(eval_c("FOO | 1").is_err());
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
    }

    #[test]
    fn instance_names() {
        assert_eq!(instance_pid("fraglab-4567"), Some(4567));
        assert_eq!(instance_pid("fraglab-4567-3"), Some(4567));
        assert_eq!(instance_pid("fraglab-4567-x"), None);
        assert_eq!(instance_pid("fraglab-"), None);
        assert_eq!(instance_pid("fraglabby-12"), None);
        assert_eq!(instance_pid("mine"), None);
    }

    #[test]
    fn marker_round_trip() {
        let m = Marker {
            mountpoint: PathBuf::from(DEFAULT_ROOT),
            mnt_id: 46,
            mnt_id_unique: Some(0x1_0000_0123),
            mnt_ns: "mnt:[4026531832]".into(),
            boot_id: "8d3c2f1e-0000-4000-8000-000000000001".into(),
            pid: 1234,
        };
        assert_eq!(Marker::parse(&m.text()), Some(m.clone()));
        let old_kernel = Marker { mnt_id_unique: None, ..m.clone() };
        assert_eq!(Marker::parse(&old_kernel.text()), Some(old_kernel.clone()));
        assert_eq!(Marker::parse("mountpoint=/sys/kernel/tracing\nmnt_id=\n"), None);
        assert_eq!(Marker::parse(""), None);

        let here = Here { ns: m.mnt_ns.clone(), boot_id: m.boot_id.clone() };
        let mount = TracefsMount { id: 46, path: PathBuf::from(DEFAULT_ROOT), unique: m.mnt_id_unique };
        assert!(m.describes(&mount, &here));
        // The mountinfo id was reused by a later mount; its unique id tells them apart.
        assert!(!m.describes(&TracefsMount { unique: Some(0x1_0000_0200), ..mount.clone() }, &here));
        assert!(!m.describes(&TracefsMount { unique: None, ..mount.clone() }, &here));
        assert!(old_kernel.describes(&TracefsMount { unique: None, ..mount.clone() }, &here));
        assert!(!m.describes(&TracefsMount { id: 47, ..mount.clone() }, &here));
        // Another namespace: not ours to judge; another boot: stale.
        let other_ns = Here { ns: "mnt:[4026532000]".into(), ..here.clone() };
        assert!(!m.describes(&mount, &other_ns) && m.elsewhere(&other_ns));
        let next_boot = Here { boot_id: "8d3c2f1e-0000-4000-8000-000000000002".into(), ..here.clone() };
        assert!(!m.describes(&mount, &next_boot) && !m.elsewhere(&next_boot));
    }

    #[test]
    fn tracefs_mounts_from_mountinfo() {
        let text = "23 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n\
                    46 23 0:13 / /sys/kernel/tracing rw,relatime - tracefs nodev rw\n\
                    51 50 0:13 / /mnt/my\\040trace rw - tracefs tracefs rw\n";
        let ms = parse_tracefs_mounts(text);
        assert_eq!(
            ms,
            [
                TracefsMount { id: 46, path: PathBuf::from("/sys/kernel/tracing"), unique: None },
                TracefsMount { id: 51, path: PathBuf::from("/mnt/my trace"), unique: None }
            ]
        );
    }

    /// A source that never runs dry — as trace_pipe would if its events could not be disabled — ends
    /// the drain at its bound, which the error names. /dev/zero is such a source.
    #[test]
    fn the_drain_after_stop_is_bounded() {
        let zero = File::open("/dev/zero").unwrap();
        let shared = Mutex::new(Shared::default());
        read_pipe(zero, Path::new("/dev/zero"), &AtomicBool::new(true), &shared, Duration::from_millis(200));
        let error = shared.into_inner().unwrap().error;
        assert_eq!(
            error.as_deref(),
            Some(
                "still not empty 200ms after the catcher stopped (events still coming: not disabled?); stopped \
                 reading"
            )
        );
    }

    #[test]
    fn lost_line() {
        assert_eq!(lost_events("CPU:1 [LOST 12 EVENTS]"), Some(12));
    }
}
