//! A pasted bug report, read: the failures it holds, the one to reproduce and why, the kernel it
//! came from, the machine's memory and the free areas its Mem-Info printed with that failure.
//!
//! Everything is read by the same scanner as `fraglab scan` ([`scan_log`]), so any log pipeline and
//! era scan handles is one this handles; what is added here is only what a reproduction needs and
//! scan does not group: which failure's Mem-Info block is which, the `CPU:` line's release, and
//! `N pages RAM`.

use std::path::Path;

use anyhow::{bail, Result};
use fraglab_probe::fallback::{classify, Outcome};
use fraglab_probe::kmsg::{self, scan_log, split_log_line, strip_mail_quote, FreeArea, Gfp, KmsgEvent};
use fraglab_probe::stack::{call_site, path_from_site, CallSite};
use serde::Serialize;

/// One `page allocation failure` report of the log.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    /// 1-based line of the report's header.
    pub line: usize,
    pub order: u32,
    pub gfp: Option<Gfp>,
    pub comm: Option<String>,
    /// The first function outside the allocator and its caller, from the report's call trace.
    pub site: Option<CallSite>,
    /// Function names from the call site outwards, up to the system-call or kernel-thread entry.
    pub path: Vec<String>,
    /// The call trace as printed, innermost first (module names in `[brackets]` kept).
    pub stack: Vec<String>,
    /// Whether the caller got the failure (`fraglab_probe::fallback`), and if not, what the
    /// kernel did instead.
    pub surfaced: bool,
    pub fallback: Option<String>,
    /// The kernel release the `CPU: … Comm: …` line after the header names.
    pub release: Option<String>,
    /// The free-area lines of the Mem-Info block printed with this failure, with their lines.
    pub zones: Vec<(usize, FreeArea)>,
    /// `N pages RAM` of that block, with its line.
    pub ram_pages: Option<(usize, u64)>,
}

impl Failure {
    /// `line 12: Xorg order-4 allocation failure, mode 0x40dc0(GFP_KERNEL|__GFP_COMP)`.
    pub fn describe(&self) -> String {
        let comm = self.comm.as_deref().unwrap_or("(task not logged)");
        let mode = self.gfp.as_ref().map_or_else(String::new, |g| format!(", mode {g}"));
        format!("line {}: {comm} order-{} allocation failure{mode}", self.line, self.order)
    }

    /// The call site as a frame, or that the report printed no call trace.
    pub fn site_name(&self) -> String {
        self.site.as_ref().map_or_else(|| "(no call trace)".into(), |s| s.to_string())
    }

    /// `surfaced (the caller got it)`, or `fell back: …` with what the kernel did instead.
    pub fn outcome(&self) -> String {
        match (self.surfaced, &self.fallback) {
            (true, _) => "surfaced (the caller got it)".into(),
            (false, Some(how)) => format!("fell back: {how}"),
            (false, None) => "fell back".into(),
        }
    }

    /// The page size of the report's free areas, in kB: 4 on x86 (and most arm64 builds).
    pub fn page_kb(&self) -> Option<u64> {
        self.zones.first().map(|(_, a)| a.page_kb)
    }
}

/// What a report says, as a reproduction needs it.
#[derive(Debug, Serialize)]
pub struct Report {
    pub file: String,
    pub lines: usize,
    pub failures: Vec<Failure>,
    /// Index into `failures` of the one to reproduce.
    pub chosen: usize,
    /// Why that one, in words.
    pub why: String,
    /// Lines the scanner could not read, `FILE:LINE: reason`.
    pub warnings: Vec<String>,
}

impl Report {
    pub fn chosen(&self) -> &Failure {
        &self.failures[self.chosen]
    }
}

/// How much of a file's start may be other than text before it is taken for a binary file: a
/// serial console's stray bytes are a few, a core dump or a gzip is most of it.
const BINARY_SHARE: f64 = 0.05;

/// Read `bytes` (the file `path`) as a bug report. Refused: a binary file, a file without a page
/// allocation failure report, and a chosen failure whose Mem-Info block has a line cut short — each
/// naming the file and the line.
pub fn read(bytes: &[u8], path: &Path) -> Result<Report> {
    let name = path.display().to_string();
    let head = &bytes[..bytes.len().min(64 << 10)];
    let odd = String::from_utf8_lossy(head)
        .chars()
        .filter(|&c| c == '\u{fffd}' || (c.is_control() && !matches!(c, '\n' | '\r' | '\t' | '\x1b')))
        .count();
    if !head.is_empty() && odd as f64 > head.len() as f64 * BINARY_SHARE {
        bail!(
            "{name}: not a text file ({odd} of its first {} bytes are binary): give the kernel log as text \
             (dmesg, journalctl -k, a mail or issue quoting it)",
            head.len()
        );
    }
    let text = String::from_utf8_lossy(bytes);
    let scan = scan_log(&text, path);
    let lines: Vec<&str> = text.lines().collect();
    let message = |n: usize| split_log_line(strip_mail_quote(lines[n - 1])).message.trim().to_string();

    // Each report's block: from its header to the next report's (or OOM kill's) header.
    let headers: Vec<usize> = scan
        .events
        .iter()
        .filter(|f| matches!(f.event, KmsgEvent::AllocFailure(_) | KmsgEvent::OomInvoked(_)))
        .map(|f| f.line)
        .collect();
    let end_of = |line: usize| headers.iter().copied().find(|&h| h > line).unwrap_or(lines.len() + 1);
    let mut failures = Vec::new();
    for found in &scan.events {
        let KmsgEvent::AllocFailure(a) = &found.event else { continue };
        let (start, end) = (found.line, end_of(found.line));
        // show_mem() ends the report's Mem-Info with `N pages RAM`; what comes after it (a sysrq-m,
        // a stall or vmalloc report the scanner does not count as a header) is not this failure's.
        let ram_pages = (start + 1..end).find_map(|n| kmsg::pages_ram(&message(n)).map(|p| (n, p)));
        let end = ram_pages.map_or(end, |(n, _)| n);
        let zones = first_block(
            scan.events
                .iter()
                .filter(|f| f.line > start && f.line < end)
                .filter_map(|f| match &f.event {
                    KmsgEvent::FreeArea(area) => Some((f.line, area.clone())),
                    _ => None,
                })
                .collect(),
        );
        let classified = classify(a.order, a.gfp_flags(), &a.stack);
        // The CPU line comes right after the header (a few lines on, when another CPU cut in).
        let release = (start + 1..end.min(start + 8))
            .find_map(|n| kmsg::cpu_line_release(&message(n)).map(String::from));
        failures.push(Failure {
            line: found.line,
            order: a.order,
            gfp: a.gfp.clone(),
            comm: a.comm.clone(),
            site: call_site(&a.stack),
            path: path_from_site(&a.stack, 12),
            stack: a.stack.clone(),
            surfaced: classified.outcome == Outcome::Surfaced,
            fallback: classified.fallback.map(String::from),
            release,
            zones,
            ram_pages,
        });
    }
    if failures.is_empty() {
        bail!(
            "{name}: no page allocation failure in its {} lines (no `<task>: page allocation failure: \
             order:N, mode:…` line): give the kernel log of the failure, from that line to the end of its \
             Mem-Info",
            lines.len()
        );
    }
    let (chosen, why) = choose(&failures);
    let warnings: Vec<String> = scan.warnings.iter().map(|w| w.to_string()).collect();
    // A free-area line of the chosen block that did not parse is a target cut short.
    let f = &failures[chosen];
    let end = end_of(f.line);
    for w in &scan.warnings {
        if let fraglab_probe::Error::Parse { line, text, reason, .. } = w {
            let free_area = text.contains("kB") && text.contains('*');
            if *line > f.line && *line < end && free_area {
                bail!(
                    "{name}:{line}: the Mem-Info free-area line of the failure on line {} is cut short \
                     ({reason}): {text:?}; paste the whole line (it ends in `= <total>kB`)",
                    f.line
                );
            }
        }
    }
    if let Some((line, _)) = f.zones.iter().find(|(_, a)| a.total_kb.is_none()) {
        bail!(
            "{name}:{line}: the Mem-Info free-area line of the failure on line {} is cut short (no `= \
             <total>kB` at its end): paste the whole line",
            f.line
        );
    }
    Ok(Report { file: name, lines: lines.len(), failures, chosen, why, warnings })
}

/// The first block of free-area lines: one zone a line, a line or two apart (a wrapped line joined
/// by the scanner spans more); a zone seen again, or a gap, begins another block.
fn first_block(areas: Vec<(usize, FreeArea)>) -> Vec<(usize, FreeArea)> {
    let mut block: Vec<(usize, FreeArea)> = Vec::new();
    for (line, a) in areas {
        let again = block.iter().any(|(_, b)| b.node == a.node && b.zone == a.zone);
        let gap = block.last().is_some_and(|(l, _)| line > l + 3);
        if again || gap {
            break;
        }
        block.push((line, a));
    }
    block
}

/// The failure to reproduce: one that surfaced (the caller got it: the bug) before one the kernel
/// fell back from; of those the highest order (fragmentation shows there first), the first of it.
fn choose(failures: &[Failure]) -> (usize, String) {
    let best = |surfaced: bool| {
        failures
            .iter()
            .enumerate()
            .filter(|(_, f)| f.surfaced == surfaced)
            .max_by(|(i, a), (j, b)| a.order.cmp(&b.order).then(j.cmp(i)))
            .map(|(i, _)| i)
    };
    let n = failures.len();
    match (best(true), best(false)) {
        (Some(i), _) if n == 1 => (i, "the report's only failure; it surfaced (the caller got it)".into()),
        (Some(i), fell) => {
            let surfaced = failures.iter().filter(|f| f.surfaced).count();
            let others = match fell {
                Some(_) => format!(
                    "; {} other(s) the kernel fell back from",
                    failures.iter().filter(|f| !f.surfaced).count()
                ),
                None => String::new(),
            };
            (
                i,
                format!(
                    "of {n} failures, {surfaced} surfaced (the caller got them){others}: this is the \
                     highest order of those that surfaced, the first of that order"
                ),
            )
        }
        (None, Some(i)) => (
            i,
            format!(
                "every one of the {n} failure(s) fell back ({}): the highest order, the first of it; \
                 reproducing it shows the fallback, not a failure a caller saw",
                failures[i].fallback.as_deref().unwrap_or("the kernel had a way around it")
            ),
        ),
        (None, None) => unreachable!("failures is not empty"),
    }
}
