//! The kernel log: `/dev/kmsg` records and the allocation-failure, OOM-killer and Mem-Info lines in
//! them, live or in a saved log.
//!
//! ```text
//! 4,1234,3225313209,-;Xorg: page allocation failure: order:4, mode:0x40dc0(GFP_KERNEL|__GFP_COMP|__GFP_ZERO), nodemask=(null),cpuset=/,mems_allowed=0
//! [ 3225.315254] Node 0 Normal: 3277*4kB (UME) 1459*8kB (UME) 2012*16kB (UME) ... 0*4096kB = 190636kB
//! Jul 31 17:17:05 fs kernel: [11918.534744] x2golistsession invoked oom-killer: gfp_mask=0x27000c0(GFP_KERNEL_ACCOUNT|__GFP_NOTRACK), order=2, oom_score_adj=0
//! ```
//!
//! Three layers, each usable alone:
//! - [`parse_message`]: one kernel message (no prefix) → a typed [`KmsgEvent`], `Ok(None)` for the
//!   thousands of lines that are none of ours, `Err` for a line that is ours but malformed;
//! - [`split_log_line`] / [`parse_line`]: a line as saved by dmesg (with or without `[  123.456789]`),
//!   syslog (`Nov  3 10:00:01 host kernel: `), journalctl (`kernel: `, short-iso, export and json
//!   output) or a serial console, prefixes removed;
//! - [`scan_log`]: a whole saved log, with line numbers, joining Mem-Info lines that a mail or a
//!   terminal wrapped;
//! - [`KmsgWatcher`]: the live `/dev/kmsg`, from "now" on.
//!
//! The Mem-Info free-area line ([`FreeArea`]) is the same text `fraglab fragment --profile` accepts,
//! so a bug report's free lists become a lab target.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::buddyinfo::ZoneFree;
use crate::error::{Error, Result};

pub const PATH: &str = "/dev/kmsg";

/// A GFP mask as the kernel logs it: `0x40cc0(GFP_KERNEL|__GFP_COMP)`, or just `0x20` before v4.10
/// added the names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Gfp {
    pub mask: u64,
    /// The names the kernel printed, in its order; empty when it printed none.
    pub flags: Vec<String>,
}

impl Gfp {
    /// Parse `0x40cc0(GFP_KERNEL|__GFP_COMP)`, `0x20`, or `0x0()`.
    pub fn parse(text: &str) -> std::result::Result<Gfp, String> {
        let text = text.trim();
        let (hex, names) = match text.split_once('(') {
            Some((hex, rest)) => {
                let names = rest.strip_suffix(')').ok_or_else(|| format!("gfp {text:?}: unclosed '('"))?;
                (hex, names)
            }
            None => (text, ""),
        };
        let digits = hex
            .strip_prefix("0x")
            .or_else(|| hex.strip_prefix("0X"))
            .ok_or_else(|| format!("gfp {hex:?} is not 0x<hex>"))?;
        let mask = u64::from_str_radix(digits, 16).map_err(|_| format!("gfp {hex:?} is not 0x<hex>"))?;
        let flags = names.split('|').filter(|f| !f.is_empty()).map(str::to_string).collect();
        Ok(Gfp { mask, flags })
    }
}

impl std::fmt::Display for Gfp {
    /// The kernel's own form, so a grouped report reads like the log it came from.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.mask)?;
        if !self.flags.is_empty() {
            write!(f, "({})", self.flags.join("|"))?;
        }
        Ok(())
    }
}

/// `warn_alloc()`'s first line: a page allocation that failed and was not `__GFP_NOWARN`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocFailureReport {
    /// The task that allocated (`current->comm`, at most 15 bytes; may contain `/`, `:` and spaces).
    /// `None` when the log does not say: a header printed without it (another CPU's line cut in),
    /// or with more than 15 bytes before the marker (console output glued on) and no `CPU: … Comm:`
    /// line after it to take the name from.
    pub comm: Option<String>,
    pub order: u32,
    /// Missing only when a wrapped line was cut before `mode:`.
    pub gfp: Option<Gfp>,
    /// `nodemask=(null)` on most reports; `0-1` when the caller restricted nodes.
    pub nodemask: Option<String>,
    pub cpuset: Option<String>,
    pub mems_allowed: Option<String>,
    /// The old `failure. order:1, mode:0x20` form (2.6.x kernels) rather than `failure: order:…`.
    pub legacy_format: bool,
    /// The `Call Trace:` frames that followed the report in a saved log, innermost first, as
    /// printed (`? ` marks and `+0x…/0x…` offsets kept; see [`crate::stack`]). Filled by
    /// [`scan_log`]; empty from [`parse_message`], which sees one line, and when the log has none.
    #[serde(default)]
    pub stack: Vec<String>,
    /// What could not be read or had to be recovered from elsewhere, in words: a mode cut short, a
    /// name taken from the `CPU:` line, a call trace not attributed because another report was
    /// interleaved with this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl AllocFailureReport {
    /// The gfp flag names the report logged; none when its mode was cut off.
    pub fn gfp_flags(&self) -> &[String] {
        self.gfp.as_ref().map_or(&[], |g| &g.flags)
    }
}

/// The longest name `current->comm` can hold (TASK_COMM_LEN 16, with its NUL).
pub const COMM_MAX: usize = 15;

/// `<comm> invoked oom-killer: gfp_mask=0x…(…), order=N, oom_score_adj=N`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomInvoked {
    pub comm: String,
    pub gfp: Option<Gfp>,
    pub order: Option<u32>,
    /// `oom_score_adj` (or the 2.6 `oomkilladj`).
    pub oom_score_adj: Option<i32>,
}

/// `Out of memory: Killed process 1234 (x) total-vm:…kB, anon-rss:…kB, …`, and the older
/// `Killed process 1234 (x) …` line that followed `Out of memory: Kill process … or sacrifice child`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomKilled {
    pub pid: u32,
    pub comm: String,
    /// The line itself says `Memory cgroup out of memory` (a cgroup limit, not the machine, ran out).
    pub memcg: bool,
    pub total_vm_kb: Option<u64>,
    pub anon_rss_kb: Option<u64>,
    pub file_rss_kb: Option<u64>,
    pub shmem_rss_kb: Option<u64>,
    pub oom_score_adj: Option<i32>,
}

/// A Mem-Info free-area line: `Node 0 Normal: 3277*4kB (UME) 1459*8kB (UME) ... 0*4096kB = 190636kB`.
///
/// `show_free_areas()` prints one per populated zone with every allocation failure and OOM kill:
/// the count of free blocks of each order, the migrate types that have some (`U`nmovable,
/// `M`ovable, `E` reclaimable, `H`ighatomic, `C`MA, `I`solate; `R`eserve before v4.4), and the sum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeArea {
    /// Printed only on NUMA kernels (`Node 0 Normal:`); `Normal:` alone otherwise.
    pub node: Option<u32>,
    /// `Normal`, `DMA32`, …; `None` for a bare `512*4kB ... = 3016kB` pasted without its zone.
    pub zone: Option<String>,
    /// The size of an order-0 block: the first entry's size (4 on x86, 16 or 64 on some arm64).
    pub page_kb: u64,
    /// `free[order]` = free blocks of that order.
    pub free: Vec<u64>,
    /// `types[order]` = the migrate-type letters printed after that order's count (`""` if none).
    pub types: Vec<String>,
    /// The kernel's sum after `=`, checked against the entries when present.
    pub total_kb: Option<u64>,
}

impl FreeArea {
    /// Parse a free-area line (the message only, no log prefix).
    pub fn parse(text: &str) -> std::result::Result<FreeArea, String> {
        let text = text.trim();
        let (label, rest) = match text.split_once(':') {
            Some((label, rest)) if !label.contains('*') => (Some(label.trim()), rest),
            _ => (None, text),
        };
        let (node, zone) = match label {
            None => (None, None),
            Some(label) => match label.strip_prefix("Node ") {
                Some(rest) => {
                    let (n, zone) =
                        rest.trim_start().split_once(' ').ok_or("expected \"Node <n> <zone>:\"")?;
                    let n = n.parse().map_err(|_| format!("node {n:?} is not a number"))?;
                    (Some(n), Some(zone.trim().to_string()))
                }
                None => (None, Some(label.to_string())),
            },
        };
        if zone.as_deref().is_some_and(|z| z.is_empty() || z.contains(char::is_whitespace)) {
            return Err(format!("{:?} is not a zone name", zone.unwrap_or_default()));
        }
        // The total after '=' is the kernel's own sum; it is checked, not trusted blindly.
        let (areas, total) = match rest.split_once('=') {
            Some((areas, total)) => (areas, Some(total.trim())),
            None => (rest, None),
        };
        let mut free = Vec::new();
        let mut types: Vec<String> = Vec::new();
        let mut page_kb = 0u64;
        for field in areas.split_whitespace() {
            if let Some(letters) = field.strip_prefix('(') {
                let letters = letters.strip_suffix(')').ok_or_else(|| format!("{field:?}: unclosed '('"))?;
                let last = types.last_mut().ok_or_else(|| format!("{field:?} before any COUNT*SIZEkB"))?;
                if !last.is_empty() {
                    return Err(format!("{field:?}: a second migrate-type list for one order"));
                }
                *last = letters.to_string();
                continue;
            }
            let (count, size) =
                field.split_once('*').ok_or_else(|| format!("{field:?} is not COUNT*SIZEkB"))?;
            let count: u64 = count.parse().map_err(|_| format!("{field:?}: {count:?} is not a count"))?;
            let kb: u64 = size
                .strip_suffix("kB")
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("{field:?}: {size:?} is not a size in kB"))?;
            if free.is_empty() {
                // Real page sizes: 4kB (x86, most), 8kB (sparc64), 16kB and 64kB (arm64, ppc64).
                if ![4, 8, 16, 64].contains(&kb) {
                    return Err(format!("{field:?}: the first entry must be one page (4, 8, 16 or 64kB)"));
                }
                page_kb = kb;
            }
            let order = free.len();
            if order >= 32 || kb != page_kb << order {
                return Err(format!(
                    "{field:?}: expected the order-{order} entry ({}kB) here",
                    page_kb.checked_shl(order as u32).unwrap_or(0)
                ));
            }
            free.push(count);
            types.push(String::new());
        }
        if free.is_empty() {
            return Err("no COUNT*SIZEkB entries found".into());
        }
        let total_kb = match total {
            Some(total) => {
                let total_kb: u64 = total
                    .strip_suffix("kB")
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| format!("total {total:?} is not a size in kB"))?;
                let sum = free
                    .iter()
                    .enumerate()
                    .try_fold(0u64, |acc, (o, &n)| acc.checked_add(n.checked_mul(page_kb << o)?))
                    .ok_or("the entries overflow a 64-bit kB count")?;
                if sum != total_kb {
                    return Err(format!("the entries add up to {sum}kB but the line says = {total_kb}kB"));
                }
                Some(total_kb)
            }
            None => None,
        };
        Ok(FreeArea { node, zone, page_kb, free, types, total_kb })
    }

    /// The line as the kernel prints it: what `fraglab fragment --profile` takes.
    pub fn to_line(&self) -> String {
        let mut s = String::new();
        if let Some(node) = self.node {
            s.push_str(&format!("Node {node} "));
        }
        if let Some(zone) = &self.zone {
            s.push_str(&format!("{zone}: "));
        }
        for (order, n) in self.free.iter().enumerate() {
            s.push_str(&format!("{n}*{}kB ", self.page_kb << order));
            if let Some(t) = self.types.get(order).filter(|t| !t.is_empty()) {
                s.push_str(&format!("({t}) "));
            }
        }
        s.push_str(&format!("= {}kB", self.total_kb.unwrap_or_else(|| self.free_kb())));
        s
    }

    /// Free memory in these lists, in kB.
    pub fn free_kb(&self) -> u64 {
        self.free.iter().enumerate().map(|(o, &n)| n.saturating_mul(self.page_kb << o)).sum()
    }

    /// The highest order with a free block, if any.
    pub fn max_free_order(&self) -> Option<usize> {
        self.free.iter().rposition(|&n| n > 0)
    }
}

/// One recognised kernel message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KmsgEvent {
    AllocFailure(AllocFailureReport),
    OomInvoked(OomInvoked),
    OomKilled(OomKilled),
    /// `Out of memory and no killable processes...`: the OOM killer found no victim (the kernel
    /// panics next when the allocation cannot fail).
    OomNoVictim,
    FreeArea(FreeArea),
    /// A `/proc/buddyinfo` line pasted into a report (`Node 0, zone Normal 40773 37 34 29 0 …`).
    /// The kernel never logs one: only [`scan_log`] returns it, never [`parse_message`].
    BuddyInfo(ZoneFree),
}

const FAILURE: &str = ": page allocation failure";
/// The marker without the `comm: ` before it: a header whose first part another CPU's line took.
const FAILURE_BARE: &str = "page allocation failure";
const INVOKED: &str = " invoked oom-killer";
const KILLED: &str = "Killed process ";
const NO_VICTIM: &str = "Out of memory and no killable processes";

/// Recognise one kernel message (no timestamp or syslog prefix).
///
/// `Ok(None)` for every line that is none of ours; `Err` names what is wrong with a line that
/// carries one of our markers but cannot be read, so a log format change is seen, not skipped.
pub fn parse_message(message: &str) -> std::result::Result<Option<KmsgEvent>, String> {
    let m = message.trim();
    if let Some(i) = m.find(FAILURE) {
        return parse_failure(&m[..i], &m[i + FAILURE.len()..]).map(|f| Some(KmsgEvent::AllocFailure(f)));
    }
    if let Some(rest) = m.strip_prefix(FAILURE_BARE) {
        return parse_failure("", rest).map(|f| Some(KmsgEvent::AllocFailure(f)));
    }
    if let Some(i) = m.find(INVOKED) {
        return parse_oom_invoked(&m[..i], &m[i + INVOKED.len()..]).map(|o| Some(KmsgEvent::OomInvoked(o)));
    }
    if m.starts_with(NO_VICTIM) {
        return Ok(Some(KmsgEvent::OomNoVictim));
    }
    // "Killed process" opens the line (before v4.19 it followed "Out of memory: Kill process … or
    // sacrifice child") or follows "…out of memory: " / "Out of memory (oom_kill_allocating_task): ".
    if let Some(i) = m.find(KILLED) {
        let before = &m[..i];
        if before.is_empty()
            || (before.ends_with(": ") && before.to_ascii_lowercase().contains("out of memory"))
        {
            let memcg = before.starts_with("Memory cgroup out of memory");
            return parse_oom_killed(&m[i + KILLED.len()..], memcg).map(|k| Some(KmsgEvent::OomKilled(k)));
        }
        return Ok(None);
    }
    if looks_like_free_area(m) {
        return FreeArea::parse(m).map(|f| Some(KmsgEvent::FreeArea(f)));
    }
    Ok(None)
}

/// `Node 0 Normal: 12*4kB …` or `Normal: 12*4kB …`: a zone label, then a first `COUNT*` entry.
fn looks_like_free_area(m: &str) -> bool {
    let Some((label, rest)) = m.split_once(": ") else { return false };
    let label = label.strip_prefix("Node ").map_or(label, |r| {
        r.trim_start()
            .split_once(' ')
            .map_or("", |(n, z)| if n.bytes().all(|b| b.is_ascii_digit()) { z } else { "" })
    });
    let zone_ok = !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let first = rest.split_whitespace().next().unwrap_or("");
    zone_ok
        && first.split_once('*').is_some_and(|(n, size)| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && size.starts_with(|c: char| c.is_ascii_digit())
        })
}

fn parse_failure(printed: &str, rest: &str) -> std::result::Result<AllocFailureReport, String> {
    let printed = printed.trim();
    let mut notes = Vec::new();
    let comm = if printed.is_empty() {
        notes
            .push("no task name before \"page allocation failure\" (a header split over lines?)".to_string());
        None
    } else if printed.len() > COMM_MAX {
        // A task name holds at most 15 bytes: the rest is console output glued on before it.
        notes.push(format!("{printed:?} before the marker is longer than a task name can be"));
        None
    } else {
        Some(printed.to_string())
    };
    let (legacy_format, rest) = match rest.chars().next() {
        Some(':') => (false, &rest[1..]),
        Some('.') => (true, &rest[1..]),
        _ => return Err("expected ':' or '.' after \"page allocation failure\"".into()),
    };
    let rest = rest.trim_start();
    let after =
        rest.strip_prefix("order:").ok_or("expected \"order:N\" after \"page allocation failure\"")?;
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    let order: u32 =
        after[..digits].parse().map_err(|_| format!("order {:?} is not a number", &after[..digits]))?;
    if order >= 64 {
        return Err(format!("order {order}: no kernel allocates 2^{order} pages"));
    }
    let after = &after[digits..];
    let gfp = match after.find("mode:") {
        Some(i) => parse_mode(&after[i + "mode:".len()..], &mut notes),
        None if after.trim().trim_end_matches(',').is_empty() => None,
        None => return Err(format!("expected \", mode:0x…\" after order:{order}")),
    };
    Ok(AllocFailureReport {
        comm,
        order,
        gfp,
        nodemask: field_value(after, "nodemask=", &["cpuset=", "mems_allowed="]),
        cpuset: field_value(after, "cpuset=", &["mems_allowed="]),
        mems_allowed: field_value(after, "mems_allowed=", &[]),
        legacy_format,
        stack: Vec::new(),
        notes,
    })
}

/// The mask after `mode:`, up to the `,` before nodemask (names hold no `,`). One cut short
/// (`0x14000c0(GFP_KERN` where a terminal's width ended the line) keeps its number: the order is
/// what counts, and the mask is still the kernel's.
fn parse_mode(mode: &str, notes: &mut Vec<String>) -> Option<Gfp> {
    let text = &mode[..mode.find(',').unwrap_or(mode.len())];
    match Gfp::parse(text) {
        Ok(g) => Some(g),
        Err(e) => {
            let hex = text.trim().split('(').next().unwrap_or("");
            let mask = hex.strip_prefix("0x").and_then(|h| u64::from_str_radix(h, 16).ok());
            notes.push(format!(
                "mode {:?} cut short or garbled ({e}){}",
                text.trim(),
                match mask {
                    Some(_) => "; its mask kept, its names not",
                    None => "",
                }
            ));
            mask.map(|mask| Gfp { mask, flags: Vec::new() })
        }
    }
}

/// The value of `key=` in a `, `- or `,`-separated list, ending where one of `next` keys begins
/// (values such as `mems_allowed=0-1,3` contain commas).
fn field_value(text: &str, key: &str, next: &[&str]) -> Option<String> {
    let start = text.find(key)? + key.len();
    let rest = &text[start..];
    let end = next.iter().filter_map(|k| rest.find(k)).min().unwrap_or(rest.len());
    Some(rest[..end].trim().trim_end_matches(',').trim().to_string())
}

fn parse_oom_invoked(comm: &str, rest: &str) -> std::result::Result<OomInvoked, String> {
    let comm = comm.trim();
    if comm.is_empty() {
        return Err("no task name before \"invoked oom-killer\"".into());
    }
    let rest = rest.trim_start_matches(':').trim();
    let mut out = OomInvoked { comm: comm.to_string(), gfp: None, order: None, oom_score_adj: None };
    for part in rest.split(", ") {
        let Some((key, value)) = part.split_once('=') else { continue };
        let value = value.trim().trim_end_matches(',');
        match key.trim() {
            "gfp_mask" => out.gfp = Some(Gfp::parse(value).map_err(|e| format!("gfp_mask: {e}"))?),
            "order" => {
                out.order = Some(value.parse().map_err(|_| format!("order {value:?} is not a number"))?)
            }
            "oom_score_adj" | "oomkilladj" => {
                out.oom_score_adj =
                    Some(value.parse().map_err(|_| format!("{key} {value:?} is not a number"))?)
            }
            _ => {}
        }
    }
    Ok(out)
}

fn parse_oom_killed(rest: &str, memcg: bool) -> std::result::Result<OomKilled, String> {
    let (pid, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    let pid: u32 = pid.trim_end_matches(',').parse().map_err(|_| format!("pid {pid:?} is not a number"))?;
    let rest = rest.trim_start().strip_prefix('(').ok_or("expected \"(comm)\" after the pid")?;
    // comm may itself hold ") ", so the name ends at the last ')' before the first field.
    let fields_at = rest.find(" total-vm:").or_else(|| rest.find(", ")).unwrap_or(rest.len());
    let close = rest[..fields_at].rfind(')').ok_or("expected ')' after the task name")?;
    let mut out = OomKilled {
        pid,
        comm: rest[..close].to_string(),
        memcg,
        total_vm_kb: None,
        anon_rss_kb: None,
        file_rss_kb: None,
        shmem_rss_kb: None,
        oom_score_adj: None,
    };
    for token in rest[close + 1..].split(|c: char| c == ',' || c.is_whitespace()) {
        let Some((key, value)) = token.split_once(':') else { continue };
        let kb = || value.strip_suffix("kB").and_then(|v| v.parse().ok());
        match key {
            "total-vm" => out.total_vm_kb = kb(),
            "anon-rss" => out.anon_rss_kb = kb(),
            "file-rss" => out.file_rss_kb = kb(),
            "shmem-rss" => out.shmem_rss_kb = kb(),
            "oom_score_adj" => out.oom_score_adj = value.parse().ok(),
            _ => {}
        }
    }
    Ok(out)
}

/// A saved log line with its prefixes taken off.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine<'a> {
    /// Seconds since boot, from a `[  123.456789]` prefix or a journal's monotonic timestamp.
    pub timestamp: Option<f64>,
    /// The kernel's message as printed (leading blanks kept: they mark continuation lines).
    pub message: std::borrow::Cow<'a, str>,
}

/// Take off what dmesg, syslog, journalctl or a serial console put before the kernel's message.
///
/// Handled, in the order they can be stacked: `<4>` priority; journalctl `-o export`
/// (`MESSAGE=…`) and `-o json` lines; a syslog date (`Nov  3 10:00:01`, with or without a
/// fraction, or ISO 8601 `2024-11-03T10:00:01+0000`), then `host kernel: ` (or `kernel: ` alone);
/// dmesg `-x` (`kern  :warn  : `); the `[  123.456789]` timestamp (or dmesg `-T`'s
/// `[Mon Nov  3 10:00:01 2025]`) and a `[  T460]` caller id.
pub fn split_log_line(line: &str) -> LogLine<'_> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if let Some(msg) = line.strip_prefix("MESSAGE=") {
        return split_log_line(msg);
    }
    if line.starts_with('{') {
        if let Some(parsed) = journal_json(line) {
            return parsed;
        }
    }
    let mut rest = strip_priority(line);
    // A log pasted as a Markdown code block is indented; a syslog date is never a continuation.
    if let Some(r) = strip_syslog_date(rest.trim_start()) {
        rest = r;
        // `host kernel: ` after the date; a serial console log has the dmesg timestamp right away.
        if let Some((host, r)) = rest.split_once(' ') {
            if !host.starts_with('[') {
                if let Some(r) = r.strip_prefix("kernel:") {
                    rest = r.strip_prefix(' ').unwrap_or(r);
                }
            }
        }
    }
    if let Some(r) = rest.strip_prefix("kernel:") {
        rest = r.strip_prefix(' ').unwrap_or(r);
    }
    rest = strip_dmesg_decode(rest);
    let mut timestamp = None;
    let mut stamped = false;
    if let Some((inside, r)) = bracket(rest) {
        let t = inside.trim();
        if !t.is_empty() && t.contains('.') && t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            timestamp = t.parse::<f64>().ok();
            stamped = timestamp.is_some();
        } else {
            stamped = looks_like_clock(t);
        }
        if stamped {
            rest = r;
        }
    }
    if stamped {
        // `[  T460]` / `[    C0]`: CONFIG_PRINTK_CALLER's task or CPU id.
        if let Some((inside, r)) = bracket(rest.trim_start()) {
            let t = inside.trim();
            if t.len() > 1
                && (t.starts_with('T') || t.starts_with('C'))
                && t[1..].bytes().all(|b| b.is_ascii_digit())
            {
                rest = r;
            }
        }
        // `[71553.093687]: dump_backtrace+0xf4/0x118`: a vendor console's colon after the stamp.
        rest = rest.strip_prefix(": ").or_else(|| rest.strip_prefix(' ')).unwrap_or(rest);
    }
    // `[4: binder:569_5:27109] `: an Android vendor kernel's CPU, task and pid column, with or
    // without a timestamp before it.
    if let Some((inside, r)) = bracket(rest.trim_start()) {
        if is_vendor_caller(inside) {
            rest = r.strip_prefix(' ').unwrap_or(r);
        }
    }
    LogLine { timestamp, message: std::borrow::Cow::Borrowed(rest) }
}

/// `4: binder:569_5:27109` / `4:        kswapd0: 1209`: CPU, a colon, the task name, a colon, the pid.
fn is_vendor_caller(inside: &str) -> bool {
    let Some((cpu, rest)) = inside.trim().split_once(':') else { return false };
    let Some((name, pid)) = rest.rsplit_once(':') else { return false };
    let pid = pid.trim();
    !cpu.is_empty()
        && cpu.bytes().all(|b| b.is_ascii_digit())
        && !name.trim().is_empty()
        && !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
}

/// `[inside]rest` at the start of `s`.
fn bracket(s: &str) -> Option<(&str, &str)> {
    let inner = s.strip_prefix('[')?;
    let close = inner.find(']')?;
    Some((&inner[..close], &inner[close + 1..]))
}

/// `<4>` (dmesg -r, or a syslog line kept raw).
fn strip_priority(s: &str) -> &str {
    if let Some(inner) = s.strip_prefix('<') {
        if let Some(close) = inner.find('>') {
            if close > 0 && close <= 3 && inner[..close].bytes().all(|b| b.is_ascii_digit()) {
                return &inner[close + 1..];
            }
        }
    }
    s
}

/// `hh:mm:ss` somewhere in a bracket: dmesg -T's human time, in whatever locale.
fn looks_like_clock(s: &str) -> bool {
    s.split_whitespace().any(|w| {
        let p: Vec<&str> = w.split(':').collect();
        p.len() == 3 && p.iter().all(|x| x.len() == 2 && x.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// `Nov  3 10:00:01 ` (optionally `.123456`) or `2024-11-03T10:00:01.123+0000 `; the rest after it.
fn strip_syslog_date(s: &str) -> Option<&str> {
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let b = s.as_bytes();
    if b.len() > 20 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[7] == b'-' && b[10] == b'T'
    {
        let end = s.find(' ')?;
        return Some(&s[end + 1..]);
    }
    if s.len() < 16 || !MONTHS.iter().any(|m| s.starts_with(m)) || b[3] != b' ' {
        return None;
    }
    let rest = s[4..].trim_start();
    let (day, rest) = rest.split_once(' ')?;
    if day.is_empty() || day.len() > 2 || !day.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (time, rest) = rest.split_once(' ')?;
    let hms = time.split('.').next()?;
    looks_like_clock(hms).then_some(rest)
}

/// dmesg `-x`: `kern  :warn  : `.
fn strip_dmesg_decode(s: &str) -> &str {
    const FACILITIES: [&str; 20] = [
        "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv", "ftp",
        "local0", "local1", "local2", "local3", "local4", "local5", "local6", "local7",
    ];
    const LEVELS: [&str; 8] = ["emerg", "alert", "crit", "err", "warn", "notice", "info", "debug"];
    let Some((fac, rest)) = s.split_once(':') else { return s };
    if !FACILITIES.contains(&fac.trim_end()) {
        return s;
    }
    let Some((level, rest)) = rest.split_once(':') else { return s };
    if !LEVELS.contains(&level.trim_end()) {
        return s;
    }
    rest.strip_prefix(' ').unwrap_or(rest)
}

/// journalctl `-o json`: the `MESSAGE` field and `_SOURCE_MONOTONIC_TIMESTAMP` (µs since boot).
fn journal_json(line: &str) -> Option<LogLine<'static>> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let message = v.get("MESSAGE")?.as_str()?.to_string();
    let timestamp = v
        .get("_SOURCE_MONOTONIC_TIMESTAMP")
        .and_then(|t| t.as_str())
        .and_then(|t| t.parse::<u64>().ok())
        .map(|us| us as f64 / 1e6);
    Some(LogLine { timestamp, message: std::borrow::Cow::Owned(message) })
}

/// [`split_log_line`] then [`parse_message`].
pub fn parse_line(line: &str) -> std::result::Result<Option<KmsgEvent>, String> {
    parse_message(&split_log_line(line).message)
}

/// One event found in a saved log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Found {
    /// 1-based line number (the first line, when a wrapped line was joined).
    pub line: usize,
    pub timestamp: Option<f64>,
    /// The kernel's message, prefixes removed (wrapped lines joined with a space).
    pub message: String,
    pub event: KmsgEvent,
}

/// What [`scan_log`] found in a saved log.
#[derive(Debug, Default)]
pub struct LogScan {
    pub lines: usize,
    pub events: Vec<Found>,
    /// Lines that carry one of our markers but could not be read; each names the file and line.
    pub warnings: Vec<Error>,
}

/// Read every event out of a saved dmesg / syslog / journal export; `path` names it in warnings.
///
/// A free-area line cut by a mail client or terminal (`… 0*512kB` / `0*1024kB … = 16832kB`) is
/// joined with the following lines until it has its `= total`; anything still unreadable becomes
/// a warning, never a failure of the whole scan — bug-report logs are rarely clean.
///
/// Each failure report takes the call trace that follows it (`Call Trace:`, arm64 `Call trace:`,
/// ARM `Backtrace:`, or frames straight after the header on kernels that printed no heading). What
/// two CPUs printed at once is taken apart as far as the log allows: a header split over lines gets
/// its task name from the line before it or from its `CPU: … Comm:` line and its mode from the
/// `, mode:` line after it; a report with another task's `CPU:` line beside its header does not
/// take the trace that follows (it could be either's), and says so in its notes. A call trace
/// with `warn_alloc` in it but no header before it is a warning: a failure whose order is lost.
pub fn scan_log(text: &str, path: impl AsRef<Path>) -> LogScan {
    let path = path.as_ref();
    // A report quoted in a mail reply (`> > Node 0 Normal: …`) reads as the log it quotes.
    let lines: Vec<&str> = text.lines().map(strip_mail_quote).collect();
    let messages: Vec<LogLine> = lines.iter().map(|l| split_log_line(l)).collect();
    let mut out = LogScan { lines: lines.len(), ..LogScan::default() };
    let mut pending: Option<Pending> = None;
    // The last `CPU: … Comm:` line no report has claimed: (index, task name).
    let mut unclaimed_cpu: Option<(usize, String)> = None;
    // The last report whose block ended before any trace: (its event index, its header's index).
    let mut untraced: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < lines.len() {
        let split = &messages[i];
        let mut message = split.message.trim().to_string();
        if let Some(p) = pending.as_mut() {
            match p.take(&message, &mut out.events) {
                Taken::Consumed => {
                    i += 1;
                    continue;
                }
                Taken::Ended => {
                    if let Some(p) = pending.take() {
                        if let Some(at) = p.untraced() {
                            untraced = Some(at);
                        }
                        out.warnings.extend(p.finish(path, &lines));
                    }
                }
                Taken::NotOurs => {}
            }
        }
        // (A header glued onto a CPU line is read as the header, below.)
        if let Some(comm) = cpu_line_comm(&message).filter(|_| !message.contains(FAILURE_BARE)) {
            // One within a few lines of a report's header (an OOM report's, or one whose block
            // ended) is that report's.
            let last_header = out
                .events
                .iter()
                .rev()
                .find(|e| matches!(e.event, KmsgEvent::AllocFailure(_) | KmsgEvent::OomInvoked(_)));
            if last_header.is_none_or(|e| i + 1 - e.line > 12) {
                unclaimed_cpu = Some((i, comm.to_string()));
            }
            i += 1;
            continue;
        }
        if pending.is_none() && matches!(trace_line(&message, false), TraceLine::Start) {
            // A trace a little further below a report that took none is that report's; one with
            // no report before it is kept aside, to say what was lost if it is a failure's.
            pending = Some(match untraced.take().filter(|(_, at)| i - at <= 40) {
                Some((event, at)) => {
                    if let KmsgEvent::AllocFailure(f) = &mut out.events[event].event {
                        f.notes.push(format!("its call trace begins {} lines after the header", i - at));
                    }
                    Pending::report_trace(event)
                }
                None => Pending::orphan(i),
            });
            i += 1;
            continue;
        }
        if looks_like_buddyinfo(&message) {
            match crate::buddyinfo::parse_line(&message) {
                Ok(zone) => out.events.push(Found {
                    line: i + 1,
                    timestamp: split.timestamp,
                    message,
                    event: KmsgEvent::BuddyInfo(zone),
                }),
                Err(reason) => out.warnings.push(Error::parse(path, i + 1, lines[i], reason)),
            }
            if let Some(p) = pending.take() {
                out.warnings.extend(p.finish(path, &lines));
            }
            i += 1;
            continue;
        }
        let mut used = 1;
        if looks_like_free_area(&message) && !message.contains('=') {
            // At most a few continuation lines: a whole free-area line is ~200 characters.
            while used < 4 && i + used < lines.len() {
                let next = messages[i + used].message.trim().to_string();
                if next.is_empty() || !next.starts_with(|c: char| c.is_ascii_digit() || c == '(' || c == '=')
                {
                    break;
                }
                message = format!("{message} {next}");
                used += 1;
                if message.contains('=') && !message.trim_end().ends_with('=') {
                    break;
                }
            }
            if FreeArea::parse(&message).is_err() {
                // Joining made it no better: read the first line alone and report that.
                message = split.message.trim().to_string();
                used = 1;
            }
        }
        match parse_message(&message) {
            Ok(Some(event)) => {
                if let Some(p) = pending.take() {
                    out.warnings.extend(p.finish(path, &lines));
                }
                // A trace below this is not the earlier report's.
                untraced = None;
                let mut event = event;
                let mut attribute = true;
                let mut name_guessed = false;
                if let KmsgEvent::AllocFailure(f) = &mut event {
                    // Only a header with nothing before its marker: one with console output glued
                    // on had a name, which its CPU line gives.
                    if message.starts_with(FAILURE_BARE) {
                        if let Some(name) = split_header_name(&messages[i.saturating_sub(3)..i]) {
                            f.notes.push(format!("task name {name:?} from the line before the header"));
                            f.comm = Some(name);
                            name_guessed = true;
                        }
                    }
                    // Another task's `CPU:` line just before this header, with its own header out of
                    // sight: two reports are interleaved, and the next trace may be either's.
                    if let Some((at, other)) = unclaimed_cpu.take().filter(|(at, _)| i - at <= 12) {
                        if f.comm.as_deref() != Some(other.as_str()) {
                            f.notes.push(format!(
                                "interleaved with {other}'s report (its CPU line at line {}): the call trace \
                                 that follows is not attributed",
                                at + 1
                            ));
                            attribute = false;
                        }
                    }
                }
                if matches!(event, KmsgEvent::AllocFailure(_)) {
                    pending = Some(Pending::report(out.events.len(), i, attribute, name_guessed));
                }
                out.events.push(Found { line: i + 1, timestamp: split.timestamp, message, event });
            }
            // warn_alloc's other reports (`vmalloc error: size 8192, …, mode:0xcc0(GFP_KERNEL)`,
            // 4.9's `page allocation stalls for 10000ms, order:0, mode:…`): not failures of a page
            // allocation, but their CPU line and trace are theirs, not an orphan's.
            Ok(None) if message.contains("mode:0x") => {
                if let Some(p) = pending.take() {
                    out.warnings.extend(p.finish(path, &lines));
                }
                untraced = None;
                pending = Some(Pending::quiet());
            }
            Ok(None) => {}
            Err(reason) => out.warnings.push(Error::parse(path, i + 1, lines[i], reason)),
        }
        i += used;
    }
    if let Some(p) = pending.take() {
        out.warnings.extend(p.finish(path, &lines));
    }
    out
}

/// A failure report whose call trace may still come, another warn_alloc report's block, or a
/// trace with no report before it.
struct Pending {
    /// The report's index in the events; `None` for a trace found on its own or another report.
    event: Option<usize>,
    /// The report's header line.
    header: usize,
    /// Where an orphan trace began, and its frames.
    orphan: Option<(usize, Vec<String>)>,
    /// Lines read between the header and the trace.
    seen: usize,
    inside: bool,
    /// `Call Trace:` (or its like) read: a second one is another report's.
    heading: bool,
    /// Whether the trace is this report's to take (not when another report is interleaved).
    attribute: bool,
    /// The task name came from the line before the header: the report's CPU line overrides it.
    name_guessed: bool,
}

enum Taken {
    Consumed,
    /// The report's block is over; the line is read as any other.
    Ended,
    /// Not part of the block, which goes on (a line between the header and its trace).
    NotOurs,
}

impl Pending {
    fn report(event: usize, header: usize, attribute: bool, name_guessed: bool) -> Pending {
        Pending {
            event: Some(event),
            header,
            orphan: None,
            seen: 0,
            inside: false,
            heading: false,
            attribute,
            name_guessed,
        }
    }

    /// A report's trace found below its header block.
    fn report_trace(event: usize) -> Pending {
        Pending { inside: true, heading: true, ..Pending::report(event, 0, true, false) }
    }

    fn orphan(line: usize) -> Pending {
        Pending {
            event: None,
            orphan: Some((line, Vec::new())),
            inside: true,
            heading: true,
            ..Pending::quiet()
        }
    }

    fn quiet() -> Pending {
        Pending {
            event: None,
            header: 0,
            orphan: None,
            seen: 0,
            inside: false,
            heading: false,
            attribute: false,
            name_guessed: false,
        }
    }

    /// A report whose block ended before any trace, to give one found a little further down.
    fn untraced(&self) -> Option<(usize, usize)> {
        (!self.inside && self.attribute).then_some((self.event?, self.header))
    }

    fn report_mut<'a>(&self, events: &'a mut [Found]) -> Option<&'a mut AllocFailureReport> {
        match &mut events[self.event?].event {
            KmsgEvent::AllocFailure(f) => Some(f),
            _ => None,
        }
    }

    fn take(&mut self, message: &str, events: &mut [Found]) -> Taken {
        match trace_line(message, self.inside) {
            // (After frames printed before any heading, the heading is still this trace's.)
            TraceLine::Start if !self.heading => {
                self.inside = true;
                self.heading = true;
                Taken::Consumed
            }
            TraceLine::Marker => Taken::Consumed,
            TraceLine::Frame | TraceLine::BareFrame if self.inside || self.seen < 12 => {
                // Kernels before 2.6.2x printed the frames right after the header, with no heading.
                self.inside = true;
                if let Some((_, frames)) = self.orphan.as_mut() {
                    frames.push(message.to_string());
                } else if self.attribute {
                    if let Some(f) = self.report_mut(events) {
                        f.stack.push(message.to_string());
                    }
                }
                Taken::Consumed
            }
            // Between the report and its trace come `CPU:`, `Hardware name:`, `Workqueue:`, the
            // cpuset line and, before v4.9, a few lines of raw stack words: a handful at most.
            TraceLine::Other if !self.inside && self.seen < 12 => {
                self.seen += 1;
                if message.contains(FAILURE_BARE) {
                    // Another report's header, glued to whatever it is glued to: read as one.
                    return Taken::NotOurs;
                }
                let name_guessed = self.name_guessed;
                let Some(f) = self.report_mut(events) else {
                    // Another warn_alloc report's block: its own CPU line.
                    return if cpu_line_comm(message).is_some() { Taken::Consumed } else { Taken::NotOurs };
                };
                if let Some(name) = cpu_line_comm(message) {
                    match f.comm.as_deref() {
                        None => {
                            f.notes.push(format!("task name {name:?} from the CPU line"));
                            f.comm = Some(name.to_string());
                        }
                        Some(c) if c != name && name_guessed => {
                            f.notes.push(format!("task name {name:?} from the CPU line, not {c:?}"));
                            f.comm = Some(name.to_string());
                        }
                        Some(c) if c != name => {
                            f.notes.push(format!(
                                "{name}'s CPU line came before this report's trace: the reports are \
                                 interleaved and the trace is not attributed"
                            ));
                            self.attribute = false;
                        }
                        Some(_) => {}
                    }
                    return Taken::Consumed;
                }
                // `, mode:0x1080020(GFP_ATOMIC), nodemask=`: the rest of a header split over lines.
                if f.gfp.is_none() {
                    if let Some(mode) = message.trim_start_matches(',').trim_start().strip_prefix("mode:") {
                        f.gfp = parse_mode(mode, &mut f.notes);
                        if f.gfp.is_some() {
                            f.notes.push("mode from a line after the header (split over lines)".to_string());
                        }
                        return Taken::Consumed;
                    }
                }
                Taken::NotOurs
            }
            _ => Taken::Ended,
        }
    }

    /// A warning for an orphan trace that was an allocation failure's.
    fn finish(self, path: &Path, lines: &[&str]) -> Option<Error> {
        let (at, frames) = self.orphan?;
        if !frames.iter().flat_map(|f| crate::stack::frame_names(f)).any(|n| n.starts_with("warn_alloc")) {
            return None;
        }
        let site = crate::stack::call_site(&frames)
            .map_or_else(|| "no call site in it".to_string(), |s| format!("call site {s}"));
        Some(Error::parse(
            path,
            at + 1,
            lines[at],
            format!(
                "a page allocation failure's call trace without its \"page allocation failure\" line \
                 (cut off before it?): order and mode unknown; {site}"
            ),
        ))
    }
}

/// The kernel release a `CPU: … Comm: …` line (or 2.6's `Pid: …, comm: …`) names: the word after
/// the taint field (`Not tainted`, `Tainted: G        W  O`: flag letters) that begins with a digit,
/// `4.14.158` in `CPU: 0 PID: 0 Comm: swapper/0 Not tainted 4.14.158 #0`. `None` for any other line,
/// or one cut before the release.
pub fn cpu_line_release(message: &str) -> Option<&str> {
    cpu_line_comm(message)?;
    let after =
        [" Not tainted ", " Tainted: "].iter().filter_map(|w| message.find(w).map(|i| i + w.len())).min()?;
    message[after..]
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .filter(|w| w.contains('.'))
}

/// `2048 pages RAM`, which `show_mem()` prints at the end of a report's Mem-Info: the machine's
/// memory in pages (its page size is the free-area lines' first block size).
pub fn pages_ram(message: &str) -> Option<u64> {
    message.trim().strip_suffix(" pages RAM")?.trim().parse().ok()
}

/// `CPU: 4 PID: 1221 Comm: kswapd0 Not tainted …` (or 2.6's `Pid: 1221, comm: kswapd0 …`): the
/// task the report is about, as the kernel itself names it.
fn cpu_line_comm(message: &str) -> Option<&str> {
    let rest = if message.starts_with("CPU: ") {
        &message[message.find(" Comm: ")? + " Comm: ".len()..]
    } else if message.starts_with("Pid: ") {
        &message[message.find(", comm: ")? + ", comm: ".len()..]
    } else {
        return None;
    };
    // The name runs to the taint field; it may itself hold spaces, so cut at the known words.
    let end = [" Not tainted", " Tainted:"].iter().filter_map(|w| rest.find(w)).min().unwrap_or(rest.len());
    let name = rest[..end].trim();
    (!name.is_empty() && name.len() <= COMM_MAX).then_some(name)
}

/// `swapper/3: ` alone on a line just before a header that lacks its name (the nearest of the
/// lines given): the first part of a header another CPU's line was printed into. A heading
/// (`Backtrace:`, `Mem-Info:`) or anything with a blank in it is no task name here.
fn split_header_name(before: &[LogLine]) -> Option<String> {
    const HEADINGS: [&str; 4] = ["Backtrace", "Mem-Info", "Mem-info", "Stack"];
    before.iter().rev().find_map(|l| {
        let m = l.message.trim();
        let name = m.strip_suffix(':')?;
        let ok = !name.is_empty()
            && name.len() <= COMM_MAX
            && !name.contains(char::is_whitespace)
            && !HEADINGS.contains(&name);
        ok.then(|| name.to_string())
    })
}

/// `> `, `> > `, `>>`: a mail reply's quoting, taken off so a quoted report scans like the log.
pub fn strip_mail_quote(line: &str) -> &str {
    let mut l = line;
    while let Some(rest) = l.strip_prefix('>') {
        l = rest.strip_prefix(' ').unwrap_or(rest);
    }
    l
}

/// A line after an allocation failure report, as far as its call trace is concerned.
enum TraceLine {
    /// `Call Trace:` (`Call trace:` on arm64, `Backtrace:` on 32-bit ARM).
    Start,
    /// `<IRQ>`, `</IRQ>`, `<TASK>`, `<EOI>`: a context change inside the trace; the `=====` line
    /// 2.6 printed between the IRQ and the task stack; ARM's `r6:600f0093 r5:8141bd5c` registers.
    Marker,
    /// ` dump_stack+0x85/0xc0`, ` ? kfree+0x1b6/0x3b0`, `[<ffffffff815f3246>] dump_stack+0x46/0x58`.
    Frame,
    /// A 32-bit ARM frame without offsets, or one a terminal cut short: `[<c000dc44>]
    /// (unwind_backtrace) from [<c000cb00>] (show_stack+0x10/0x18)`, `[<bf84408f>]
    /// (__alloc_pages_nodemask) from [<bf809fbf>] (__dma_a)`.
    BareFrame,
    Other,
}

fn trace_line(message: &str, inside: bool) -> TraceLine {
    let m = message.trim();
    if m.eq_ignore_ascii_case("Call Trace:") || m == "Backtrace:" {
        return TraceLine::Start;
    }
    if inside && m.starts_with('<') && m.ends_with('>') && !m.contains(' ') {
        return TraceLine::Marker;
    }
    if inside
        && ((m.len() >= 8 && m.bytes().all(|b| b == b'=')) || is_arm_registers(m) || is_bare_addresses(m))
    {
        return TraceLine::Marker;
    }
    // Every printed frame carries `+0xOFF/0xSIZE`; a register dump or `Code:` line has none.
    if m.contains("+0x") && crate::stack::function_name(m).is_some() {
        return TraceLine::Frame;
    }
    if m.starts_with("[<") && m.contains(">] (") && crate::stack::function_name(m).is_some() {
        return TraceLine::BareFrame;
    }
    TraceLine::Other
}

/// `[c00000000108fd40] [c000000000aecfb0]`: a powerpc frame's addresses, its function wrapped onto
/// the next line by a mail client; the trace goes on.
fn is_bare_addresses(m: &str) -> bool {
    let words: Vec<&str> = m.split_whitespace().collect();
    !words.is_empty()
        && words.iter().all(|w| {
            w.strip_prefix('[')
                .and_then(|w| w.strip_suffix(']'))
                .is_some_and(|h| h.len() >= 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        })
}

/// ` r6:600f0093 r5:8141bd5c r4:00000000 r3:3abdc664`: what ARM's `Backtrace:` prints between frames.
fn is_arm_registers(m: &str) -> bool {
    let mut words = m.split_whitespace().peekable();
    words.peek().is_some()
        && words.all(|w| {
            w.split_once(':').is_some_and(|(reg, val)| {
                (1..=3).contains(&reg.len())
                    && reg.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                    && !val.is_empty()
                    && val.bytes().all(|b| b.is_ascii_hexdigit())
            })
        })
}

/// `Node 0, zone   Normal  40773 37 34 …`: the zone label and at least one count. A zoneinfo
/// header (`Node 0, zone Normal` alone) or a pagetypeinfo row (`zone Normal, type Movable …`) is not.
fn looks_like_buddyinfo(m: &str) -> bool {
    let Some(rest) = m.strip_prefix("Node") else { return false };
    let Some((node, rest)) = rest.split_once(',') else { return false };
    let Some(rest) = rest.trim_start().strip_prefix("zone") else { return false };
    let mut fields = rest.split_whitespace();
    let zone = fields.next().unwrap_or("");
    let counts: Vec<&str> = fields.collect();
    !node.trim().is_empty()
        && node.trim().bytes().all(|b| b.is_ascii_digit())
        && !zone.is_empty()
        && zone.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !counts.is_empty()
        && counts.iter().all(|c| c.bytes().all(|b| b.is_ascii_digit()))
}

/// One `/dev/kmsg` record: `prio,seq,ts_usec,flags;message`, then ` KEY=value` dictionary lines.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KmsgRecord {
    /// Syslog facility (0 = kernel; messages written to /dev/kmsg by user space are 1).
    pub facility: u8,
    /// Log level, 0 (emerg) … 7 (debug).
    pub level: u8,
    pub seq: u64,
    /// Microseconds since boot (the printk clock, `local_clock()`).
    pub ts_usec: u64,
    /// The `c` flag: the record opens a continued line (`-` otherwise).
    pub continued: bool,
    /// The message with the kernel's `\xNN` escapes undone.
    pub message: String,
    /// ` SUBSYSTEM=acpi`-style dictionary lines, without the leading blank.
    pub dict: Vec<String>,
}

impl KmsgRecord {
    /// Parse one record as read from `/dev/kmsg` (one `read()` returns exactly one).
    pub fn parse(raw: &str) -> std::result::Result<KmsgRecord, String> {
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let (first, dict) = match raw.split_once('\n') {
            Some((first, dict)) => (first, dict),
            None => (raw, ""),
        };
        let (prefix, message) = first.split_once(';').ok_or("expected \"prio,seq,ts_usec,flags;message\"")?;
        let mut fields = prefix.split(',');
        let mut next = |what: &str| fields.next().ok_or_else(|| format!("missing {what} before ';'"));
        let prio: u32 =
            next("prio").and_then(|p| p.parse().map_err(|_| format!("prio {p:?} is not a number")))?;
        let seq: u64 =
            next("seq").and_then(|p| p.parse().map_err(|_| format!("seq {p:?} is not a number")))?;
        let ts_usec: u64 =
            next("ts_usec").and_then(|p| p.parse().map_err(|_| format!("ts_usec {p:?} is not a number")))?;
        let flags = next("flags")?;
        // Later kernels may append fields (caller id): only the first four are ours.
        let facility = u8::try_from(prio >> 3).map_err(|_| format!("prio {prio} is out of range"))?;
        Ok(KmsgRecord {
            facility,
            level: (prio & 7) as u8,
            seq,
            ts_usec,
            continued: flags.contains('c'),
            message: unescape(message),
            dict: dict.lines().map(|l| l.trim_start().to_string()).filter(|l| !l.is_empty()).collect(),
        })
    }

    /// The record's event, if it is one of ours.
    pub fn event(&self) -> std::result::Result<Option<KmsgEvent>, String> {
        parse_message(&self.message)
    }

    /// The record as `dmesg` prints it: `[  123.456789] message`, for a saved kmsg.log.
    pub fn to_dmesg_line(&self) -> String {
        format!("[{:5}.{:06}] {}", self.ts_usec / 1_000_000, self.ts_usec % 1_000_000, self.message)
    }
}

/// Undo `/dev/kmsg`'s `\xNN` escaping of non-printable bytes (and of `\` itself).
fn unescape(s: &str) -> String {
    if !s.contains("\\x") {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1] == b'x' {
            if let Ok(v) = u8::from_str_radix(std::str::from_utf8(&b[i + 2..i + 4]).unwrap_or("zz"), 16) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Follows `/dev/kmsg` from the moment it was opened: earlier records are never returned.
pub struct KmsgWatcher {
    file: File,
    records: usize,
    lost: u64,
}

impl KmsgWatcher {
    /// The most records one [`KmsgWatcher::read_available`] returns: more than a default 128 KiB
    /// ring buffer holds, so a full batch means records arrive as fast as they are read.
    pub const MAX_RECORDS: usize = 16384;

    /// Open `/dev/kmsg` non-blocking and seek to its end (root or CAP_SYSLOG when
    /// `kernel.dmesg_restrict` is set).
    pub fn open() -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| Error::Io { path: PATH.into(), source };
        let file =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(PATH).map_err(io)?;
        // SEEK_END on /dev/kmsg means "after the newest record" (devkmsg_llseek); a std Seek would
        // work too, but the kernel defines only this whence, offset 0, so say exactly that.
        if unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) } < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        Ok(KmsgWatcher { file, records: 0, lost: 0 })
    }

    /// Every record logged since the last call (or since [`KmsgWatcher::open`]), up to
    /// [`KmsgWatcher::MAX_RECORDS`]; never blocks. A full batch means there may be more: a kernel
    /// logging as fast as it is read would otherwise keep one call going for ever.
    pub fn read_available(&mut self) -> Result<Vec<KmsgRecord>> {
        // A record is at most PRINTK_MESSAGE_MAX (2048) plus dictionary; 8 KiB is devkmsg's own size.
        let mut buf = vec![0u8; 8192];
        let mut out = Vec::new();
        while out.len() < Self::MAX_RECORDS {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.records += 1;
                    let raw = String::from_utf8_lossy(&buf[..n]);
                    let record = KmsgRecord::parse(&raw).map_err(|reason| {
                        Error::parse(PATH, self.records, &raw, format!("record {}: {reason}", self.records))
                    })?;
                    out.push(record);
                }
                // The ring buffer overwrote records before they were read: count and go on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => self.lost += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(Error::Io { path: PATH.into(), source }),
            }
        }
        Ok(out)
    }

    /// Wait up to `timeout` for a new record; `true` if one is there.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let mut pfd = libc::pollfd { fd: self.file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::Io { path: PATH.into(), source: e });
        }
        Ok(n > 0 && pfd.revents & libc::POLLIN != 0)
    }

    /// How many times records were overwritten before they could be read.
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_tab_and_backslash() {
        assert_eq!(unescape("\\x09RCU"), "\tRCU");
        assert_eq!(unescape("a\\x5cb"), "a\\b");
        assert_eq!(unescape("end\\x0"), "end\\x0");
    }

    #[test]
    fn clock_shapes() {
        assert!(looks_like_clock("Mon Nov  3 10:00:01 2025"));
        assert!(!looks_like_clock("3225.313209"));
    }
}
