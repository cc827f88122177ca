//! `fraglab scan LOGFILE`: read a saved dmesg / syslog / journal export (or a mail quoting one)
//! the way the live kmsg watcher reads `/dev/kmsg`, and turn a bug report into numbers and lab
//! targets: failures by order, GFP mode, command and call site, OOM kills, and every Mem-Info
//! free-area line and pasted `/proc/buddyinfo` line as a ready `fraglab fragment --profile` command.

use std::collections::BTreeMap;
use std::io::Read;

use anyhow::{Context, Result};
use fraglab_probe::fallback::Outcome;
use fraglab_probe::kmsg::{scan_log, AllocFailureReport, Found, FreeArea, KmsgEvent};
use fraglab_probe::stack::{group_by_caller, CallerGroup};
use fraglab_report::mattered::{grouped, Group};
use serde::Serialize;

use fraglab_units::order_size;

use crate::cli::ScanArgs;
use crate::exit::Exit;

/// Everything `--json` prints.
#[derive(Debug, Serialize)]
pub struct ScanReport {
    pub file: String,
    pub lines: usize,
    pub failures: Vec<Found>,
    /// Failure counts keyed by order, GFP mode (`0x…(NAMES)`) and command.
    pub by_order: BTreeMap<u32, usize>,
    pub by_mode: BTreeMap<String, usize>,
    pub by_command: BTreeMap<String, usize>,
    /// By order and call site (the first function outside the allocator and its caller), from
    /// each report's `Call Trace:`; most frequent first.
    pub by_caller: Vec<CallerGroup>,
    /// The same split by what each failure meant: `surfaced` (the caller got it) first, then
    /// `fell_back` with the path the kernel takes instead (`fraglab_probe::fallback`).
    pub by_outcome: Vec<Group>,
    pub oom_invoked: Vec<Found>,
    pub oom_killed: Vec<Found>,
    pub oom_no_victim: usize,
    pub profiles: Vec<Profile>,
    /// `FILE:LINE: reason` for lines that looked like ours but could not be read.
    pub warnings: Vec<String>,
}

/// A Mem-Info free-area line or a pasted `/proc/buddyinfo` line, ready for the fragmenter.
#[derive(Debug, Serialize)]
pub struct Profile {
    pub line: usize,
    pub timestamp: Option<f64>,
    /// `mem_info` or `buddyinfo`: which kind of line it was.
    pub source: &'static str,
    pub node: Option<u32>,
    pub zone: Option<String>,
    /// Free blocks per order.
    pub free: Vec<u64>,
    /// The Mem-Info line as parsed (page size, migrate types, total); `None` for buddyinfo.
    pub area: Option<FreeArea>,
    /// The report it belongs to: the last failure or OOM line before it, if any.
    pub after: Option<String>,
    /// The budget that lets the fragmenter build this profile unscaled: the worst case of one
    /// owned 2^(o+1)-page region per order-o block (`shape::profile_pages`), in 4 KiB pages,
    /// rounded up to a MiB.
    pub budget_bytes: u64,
    /// `fraglab fragment --profile "…" --budget …` for a node's highest zone; without the budget (the
    /// whole machine, in a guest) for a zone below it; none for DMA.
    pub command: Option<String>,
    /// Why the command is not a budget one, when it is not.
    pub note: Option<String>,
}

impl Profile {
    fn new(found: &Found, node: Option<u32>, zone: Option<String>, free: Vec<u64>, line: String) -> Self {
        const MIB: u64 = 1 << 20;
        let pages = fraglab_fragmenter::shape::profile_pages(&free);
        let budget_bytes = pages.saturating_mul(4096).div_ceil(MIB).max(1).saturating_mul(MIB);
        let command =
            Some(format!("fraglab fragment --profile \"{line}\" --budget {}MiB", budget_bytes / MIB));
        Profile {
            line: found.line,
            timestamp: found.timestamp,
            source: "mem_info",
            node,
            zone,
            free,
            area: None,
            after: None,
            budget_bytes,
            command,
            note: None,
        }
    }
}

/// The zones in the kernel's order, lowest first (HighMem is 32-bit's top zone).
const ZONE_ORDER: [&str; 5] = ["DMA", "DMA32", "Normal", "HighMem", "Movable"];

/// Say which lines can be built in a budget. A node's user pages come from its highest zone, so a
/// lower zone's line needs the zones above it exhausted (the whole machine, in a guest), and DMA
/// is kept for DMA allocations. The lines one report (or one pasted buddyinfo) prints come in a
/// row; a zone is lower when a line of the same row names a higher zone of its node.
fn place_profiles(profiles: &mut [Profile]) {
    let rank = |z: &Option<String>| z.as_deref().and_then(|z| ZONE_ORDER.iter().position(|&o| o == z));
    let mut start = 0;
    while start < profiles.len() {
        let mut end = start + 1;
        while end < profiles.len()
            && profiles[end].source == profiles[start].source
            && profiles[end].after == profiles[start].after
            && profiles[end].line <= profiles[end - 1].line + 3
        {
            end += 1;
        }
        let row: Vec<(Option<u32>, Option<usize>)> =
            profiles[start..end].iter().map(|p| (p.node, rank(&p.zone))).collect();
        for p in &mut profiles[start..end] {
            let (Some(zone), Some(r)) = (p.zone.clone(), rank(&p.zone)) else { continue };
            let node = p.node.map_or_else(String::new, |n| format!("Node {n}'s "));
            if zone == "DMA" {
                p.command = None;
                p.note = Some(fraglab_fragmenter::target::DMA_NOT_SHAPED.into());
            } else if let Some(top) =
                row.iter().filter(|(n, _)| *n == p.node).filter_map(|(_, r)| *r).max().filter(|&t| t > r)
            {
                let line = p.command.as_deref().and_then(|c| c.split(" --budget").next()).unwrap_or_default();
                p.command = Some(line.to_string());
                p.note = Some(format!(
                    "below {node}{}: user pages reach {zone} only once the zones above are exhausted, so \
                     this is a whole-machine target (no budget), best inside `fraglab vm`",
                    ZONE_ORDER[top]
                ));
            }
        }
        start = end;
    }
}

/// A failure whose header names no task (see `AllocFailureReport::comm`).
const UNNAMED: &str = "(not logged)";

pub fn run(args: ScanArgs) -> Result<Exit> {
    let (name, bytes) = if args.log.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::stdin().read_to_end(&mut b).context("cannot read stdin")?;
        ("<stdin>".to_string(), b)
    } else {
        let b = std::fs::read(&args.log).with_context(|| format!("cannot read {}", args.log.display()))?;
        (args.log.display().to_string(), b)
    };
    // Saved logs carry stray binary (serial consoles, NULs in `^@` form); read what is text.
    let text = String::from_utf8_lossy(&bytes);
    let report = scan(&text, &name);
    for w in &report.warnings {
        errln!("fraglab scan: warning: {w}");
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", human(&report));
    }
    Ok(Exit::Ok)
}

/// Scan `text` (from `name`) and group what was found.
pub fn scan(text: &str, name: &str) -> ScanReport {
    let s = scan_log(text, name);
    let mut r = ScanReport {
        file: name.to_string(),
        lines: s.lines,
        failures: Vec::new(),
        by_order: BTreeMap::new(),
        by_mode: BTreeMap::new(),
        by_command: BTreeMap::new(),
        by_caller: Vec::new(),
        by_outcome: Vec::new(),
        oom_invoked: Vec::new(),
        oom_killed: Vec::new(),
        oom_no_victim: 0,
        profiles: Vec::new(),
        warnings: s.warnings.iter().map(|w| w.to_string()).collect(),
    };
    let mut last_report: Option<String> = None;
    for found in s.events {
        // A free-area or buddyinfo line with counts no machine has is reported, not offered.
        let counts = match &found.event {
            KmsgEvent::FreeArea(a) => Some(&a.free),
            KmsgEvent::BuddyInfo(z) => Some(&z.free),
            _ => None,
        };
        if let Some(Err(e)) = counts.map(|c| fraglab_fragmenter::target::plausible(c)) {
            r.warnings.push(format!("{name}:{}: {e}", found.line));
            continue;
        }
        match &found.event {
            KmsgEvent::AllocFailure(f) => {
                *r.by_order.entry(f.order).or_default() += 1;
                let mode = f.gfp.as_ref().map_or_else(|| "(not logged)".to_string(), |g| g.to_string());
                *r.by_mode.entry(mode).or_default() += 1;
                let comm = f.comm.as_deref().unwrap_or(UNNAMED);
                *r.by_command.entry(comm.to_string()).or_default() += 1;
                last_report =
                    Some(format!("line {}: {comm} order-{} allocation failure", found.line, f.order));
                r.failures.push(found);
            }
            KmsgEvent::OomInvoked(o) => {
                let order = o.order.map_or_else(String::new, |o| format!(" (order {o})"));
                last_report = Some(format!("line {}: {} invoked the OOM killer{order}", found.line, o.comm));
                r.oom_invoked.push(found);
            }
            KmsgEvent::OomKilled(_) => r.oom_killed.push(found),
            KmsgEvent::OomNoVictim => r.oom_no_victim += 1,
            KmsgEvent::FreeArea(area) => {
                // The line as the kernel prints it; scan_log already joined a wrapped one.
                let mut p =
                    Profile::new(&found, area.node, area.zone.clone(), area.free.clone(), area.to_line());
                p.area = Some(area.clone());
                p.after = last_report.clone();
                r.profiles.push(p);
            }
            KmsgEvent::BuddyInfo(z) => {
                // Normalised spacing: the fragmenter reads the same parse_line either way.
                let counts: Vec<String> = z.free.iter().map(u64::to_string).collect();
                let line = format!("{} {}", z.label(), counts.join(" "));
                let mut p = Profile::new(&found, Some(z.node), Some(z.zone.clone()), z.free.clone(), line);
                p.source = "buddyinfo";
                p.after = last_report.clone();
                r.profiles.push(p);
            }
        }
    }
    place_profiles(&mut r.profiles);
    let reports: Vec<&AllocFailureReport> = r
        .failures
        .iter()
        .filter_map(|f| match &f.event {
            KmsgEvent::AllocFailure(a) => Some(a),
            _ => None,
        })
        .collect();
    r.by_caller = group_by_caller(reports.iter().map(|a| (a.order, &a.stack[..])));
    r.by_outcome = grouped(reports.iter().map(|a| (a.order, a.gfp_flags(), &a.stack[..])));
    r
}

fn human(r: &ScanReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "{}: {} lines", r.file, r.lines);
    let _ = writeln!(o, "\nPage allocation failures: {}", r.failures.len());
    if !r.failures.is_empty() {
        let orders: Vec<String> =
            r.by_order.iter().map(|(k, n)| format!("order {k} ({}) ×{n}", order_size(*k as usize))).collect();
        let _ = writeln!(o, "  by order:   {}", orders.join(", "));
        for (title, counts) in [("mode", &r.by_mode), ("command", &r.by_command)] {
            let _ = writeln!(o, "  by {title}:");
            // Most frequent first; ties in name order.
            let mut v: Vec<_> = counts.iter().collect();
            v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            for (key, n) in v {
                let _ = writeln!(o, "    ×{n:<4} {key}");
            }
        }
        // Function ← caller: the first frame outside the allocator (page allocator, slab, kmalloc,
        // vmalloc, warn_alloc) in the report's Call Trace.
        let _ = writeln!(o, "  by caller (first function outside the allocator ← its caller):");
        for (outcome, heading) in [
            (Outcome::Surfaced, "surfaced (no known fallback: the caller got the failure)"),
            (Outcome::FellBack, "fell back (the kernel had a way around it)"),
        ] {
            let mut of = r.by_outcome.iter().filter(|g| g.outcome == outcome).peekable();
            if of.peek().is_some() {
                let _ = writeln!(o, "    {heading}");
            }
            for m in of {
                let g = &m.group;
                let what = match &g.site {
                    None if g.no_stack => format!("order {} ×{}, no Call Trace in the log", g.order, g.count),
                    _ => m.describe(),
                };
                let _ = writeln!(o, "      {what}");
            }
        }
        // What a mangled log left unread or let be recovered only from elsewhere, report by report.
        let noted: Vec<(usize, &Vec<String>)> = r
            .failures
            .iter()
            .filter_map(|f| match &f.event {
                KmsgEvent::AllocFailure(a) if !a.notes.is_empty() => Some((f.line, &a.notes)),
                _ => None,
            })
            .collect();
        if !noted.is_empty() {
            let _ = writeln!(o, "  read with difficulty:");
            for (line, notes) in noted {
                let _ = writeln!(o, "    line {line}: {}", notes.join("; "));
            }
        }
    }
    let _ = writeln!(
        o,
        "\nOOM killer: invoked {} time(s), killed {} process(es){}",
        r.oom_invoked.len(),
        r.oom_killed.len(),
        if r.oom_no_victim > 0 {
            format!(", found no victim {} time(s)", r.oom_no_victim)
        } else {
            String::new()
        }
    );
    for k in &r.oom_invoked {
        if let KmsgEvent::OomInvoked(i) = &k.event {
            let gfp = i.gfp.as_ref().map_or_else(String::new, |g| format!(", gfp_mask={g}"));
            let order = i.order.map_or_else(String::new, |o| format!(", order {o}"));
            let _ = writeln!(o, "  line {:>6}  invoked by {}{order}{gfp}", k.line, i.comm);
        }
    }
    for k in &r.oom_killed {
        if let KmsgEvent::OomKilled(x) = &k.event {
            let rss = x.anon_rss_kb.map_or_else(String::new, |kb| format!(", anon-rss {kb}kB"));
            let memcg = if x.memcg { " (memory cgroup)" } else { "" };
            let _ = writeln!(o, "  line {:>6}  killed {} ({}){rss}{memcg}", k.line, x.pid, x.comm);
        }
    }
    let mem_info = r.profiles.iter().filter(|p| p.source == "mem_info").count();
    let _ = writeln!(o, "\nMem-Info free areas: {mem_info}");
    let _ = writeln!(o, "buddyinfo lines: {}", r.profiles.len() - mem_info);
    if !r.profiles.is_empty() {
        let _ = writeln!(
            o,
            "  each one a target for the fragmenter (add --dry-run to see the plan first); --budget is\n  \
             what builds that profile unscaled: without it the fragmenter shapes the whole machine\n  \
             (best inside `fraglab vm`)"
        );
    }
    for p in &r.profiles {
        let zone = format!(
            "{}{}",
            p.node.map_or_else(String::new, |n| format!("Node {n} ")),
            p.zone.as_deref().unwrap_or("?")
        );
        let largest = p
            .free
            .iter()
            .rposition(|&n| n > 0)
            .map_or_else(|| "nothing free".to_string(), |k| format!("largest free order {k}"));
        let free = match &p.area {
            Some(a) => format!("{} kB free", a.free_kb()),
            None => format!("{} pages free", p.free.iter().enumerate().map(|(o, &n)| n << o).sum::<u64>()),
        };
        let what = if p.source == "buddyinfo" { " (buddyinfo)" } else { "" };
        let after = p.after.as_deref().map_or_else(String::new, |a| format!(", after {a}"));
        let _ = writeln!(o, "  line {}: {zone}{what}, {free}, {largest}{after}", p.line);
        if let Some(c) = &p.command {
            let _ = writeln!(o, "    {c}");
        }
        if let Some(n) = &p.note {
            let _ = writeln!(o, "    ({n})");
        }
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(o, "\n{} line(s) could not be read (see the warnings above)", r.warnings.len());
    }
    o
}
