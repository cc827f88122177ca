//! `fraglab probe`: one human or JSON snapshot, or a JSON-lines time series.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fraglab_probe::extfrag::{format_fragmentation_index, format_unusable_index};
use fraglab_probe::meminfo::FreeTable;
use fraglab_probe::snapshot::{Monitor, Sampler, Snapshot};
use fraglab_probe::zoneinfo::ZoneInfo;

use crate::cli::{ProbeArgs, SocketsProto};
use fraglab_probe::sock_diag::{self, Family, Proto, SkMem, Socket, States};
use fraglab_probe::sockstat;
use fraglab_units::{format_size, order_size, parse_duration};
use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::exit::Exit;

pub fn run(args: ProbeArgs) -> Result<Exit> {
    if let Some(proto) = args.sockets {
        return sockets(&args, proto);
    }
    // Resolve before sampling: a bad interval or monitor name is refused before any file is opened.
    let interval =
        args.watch.as_deref().map(parse_duration).transpose().map_err(|e| anyhow::anyhow!("--watch: {e}"))?;
    let duration = args
        .duration
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--duration: {e}"))?;
    if interval.is_some_and(|i| i.is_zero()) {
        anyhow::bail!("--watch {:?}: the interval must be above zero", args.watch.as_deref().unwrap_or(""));
    }
    if duration.is_some_and(|d| d.is_zero()) {
        anyhow::bail!("--duration {:?}: must be above zero", args.duration.as_deref().unwrap_or(""));
    }
    if interval.is_none() {
        if let Some(d) = &args.duration {
            anyhow::bail!("--duration {d:?} goes with --watch INTERVAL");
        }
        if let Some(o) = &args.output {
            anyhow::bail!("--output {:?} goes with --watch INTERVAL", o.display().to_string());
        }
    }
    let (mut available, skipped) = Monitor::available();
    let monitors: BTreeSet<Monitor> = if args.monitors.is_empty() {
        for s in &skipped {
            errln!("fraglab probe: skipping {s}");
        }
        if interval.is_some() {
            // Reading pagetypeinfo walks every free list with the zone lock held and interrupts
            // off (~38 ms here, more when fragmented): fine once, not in a series unless asked.
            available.remove(&Monitor::Pagetypeinfo);
        }
        available
    } else {
        let wanted = args
            .monitors
            .iter()
            .map(|m| Monitor::parse(m))
            .collect::<Result<BTreeSet<_>, _>>()
            .map_err(|e| anyhow::anyhow!("--monitors: {e}"))?;
        if let Some(m) = wanted.iter().find(|m| !available.contains(m)) {
            anyhow::bail!("--monitors: cannot read {} for {} (root only?)", m.path(), m.name());
        }
        wanted
    };

    let Some(interval) = interval else {
        let snap = Snapshot::take(&monitors)?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&snap)?);
        } else {
            out!("{}", human(&snap));
        }
        return Ok(Exit::Ok);
    };

    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    let mut sampler = Sampler::new(monitors);
    let start = Instant::now();
    let mut next = start;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) && duration.is_none_or(|d| start.elapsed() < d) {
        let sample = sampler.sample()?;
        serde_json::to_writer(&mut out, &sample)?;
        out.write_all(b"\n")?;
        out.flush()?;
        n += 1;
        // Fixed-rate schedule: a slow sample delays one tick, not every tick after it.
        next += interval;
        if next <= Instant::now() {
            next = Instant::now();
        }
        // Sleep in short steps so Ctrl-C ends a long interval promptly.
        while !stop.load(Ordering::Relaxed) {
            let Some(wait) = next.checked_duration_since(Instant::now()) else { break };
            std::thread::sleep(wait.min(Duration::from_millis(100)));
        }
    }
    if let Some(p) = &args.output {
        errln!(
            "fraglab probe: {n} samples in {:.1} s written to {}",
            start.elapsed().as_secs_f64(),
            p.display()
        );
    }
    Ok(Exit::Ok)
}

/// The snapshot as a kernel engineer reads it: buddyinfo with block sizes, `free`, indices, counters.
pub fn human(s: &Snapshot) -> String {
    let mut o = String::new();
    let line = |o: &mut String, t: String| {
        o.push_str(&t);
        o.push('\n');
    };
    line(&mut o, format!("fraglab probe at {}", s.wall));
    if let Some(b) = &s.buddyinfo {
        let n = b.nr_orders();
        line(&mut o, "\nFree blocks per order (/proc/buddyinfo)".into());
        let head: String = (0..n).map(|i| format!("{:>7}", order_size(i))).collect();
        line(&mut o, format!("{:<22}{head}{:>12}", "order:", "free"));
        for z in &b.zones {
            let cells: String = z.free.iter().map(|c| format!("{c:>7}")).collect();
            line(
                &mut o,
                format!("{:<22}{cells}{:>12}", z.label(), format_size(z.free_pages() * procfs::page_size())),
            );
        }
        if let Some(r) = &s.page_reporting {
            line(
                &mut o,
                format!(
                    "{}: up to {} blocks at a time leave the free lists to be reported to the host, so \
                     the counts from order {} up and MemFree dip for a moment (up to {})",
                    r.describe(),
                    fraglab_probe::page_reporting::PAGE_REPORTING_CAPACITY,
                    r.order,
                    format_size(r.isolated_pages_at_most(n) * procfs::page_size())
                ),
            );
        }
    }
    if let Some(zi) = &s.zoneinfo {
        o.push_str(&watermarks(zi));
    }
    if let Some(f) = &s.free {
        line(&mut o, "\nfree (KiB, as procps free computes it)".into());
        o.push_str(&FreeTable::format_rows(std::slice::from_ref(f)));
        if !o.ends_with('\n') {
            o.push('\n');
        }
    }
    if let Some(idx) = &s.indices {
        line(&mut o, "\nUnusable free space index (0: all free memory usable at this order; 1: none)".into());
        for z in idx {
            let cells: String =
                z.unusable.iter().map(|&v| format!("{:>7}", format_unusable_index(v))).collect();
            line(&mut o, format!("{:<22}{cells}", format!("Node {}, zone {}", z.node, z.zone)));
        }
        line(
            &mut o,
            "Fragmentation index (-1: would succeed; →1 fails from fragmentation; →0 from lack of memory)"
                .into(),
        );
        for z in idx {
            let cells: String =
                z.extfrag.iter().map(|&v| format!("{:>7}", format_fragmentation_index(v).trim())).collect();
            line(&mut o, format!("{:<22}{cells}", format!("Node {}, zone {}", z.node, z.zone)));
        }
    }
    if let Some(p) = &s.pagetypeinfo {
        line(
            &mut o,
            format!(
                "\nPageblocks per migratetype (/proc/pagetypeinfo, pageblock order {})",
                p.pageblock_order
            ),
        );
        line(
            &mut o,
            format!("{:<22}{}", "", p.migratetypes.iter().map(|m| format!("{m:>12}")).collect::<String>()),
        );
        for z in &p.blocks {
            let cells: String = z.blocks.iter().map(|c| format!("{c:>12}")).collect();
            line(&mut o, format!("{:<22}{cells}", format!("Node {}, zone {}", z.node, z.zone)));
        }
    }
    if let Some(v) = &s.vmstat {
        line(&mut o, "\nCompaction and allocation counters (/proc/vmstat, since boot)".into());
        for (name, value) in v.counters() {
            line(&mut o, format!("  {name:<32}{value:>14}"));
        }
    }
    if let Some(sock) = &s.sockstat {
        let tcp = sock.v4.get("TCP", "inuse").unwrap_or(0);
        let udp = sock.v4.get("UDP", "inuse").unwrap_or(0);
        let mut t = format!(
            "\nSockets: {} in use; TCP {tcp} (mem {} pages), UDP {udp} (mem {} pages)",
            sock.sockets_used().unwrap_or(0),
            sock.mem_pages("TCP").unwrap_or(0),
            sock.mem_pages("UDP").unwrap_or(0)
        );
        match sock.sctp() {
            Some((n, pages)) => t.push_str(&format!(", SCTP {n} (mem {} pages)", pages.unwrap_or(0))),
            None => t.push_str(", SCTP not loaded"),
        }
        line(&mut o, t);
    }
    if let Some(slab) = &s.slabinfo {
        let mut caches: Vec<_> = slab.caches.iter().collect();
        caches.sort_by_key(|c| std::cmp::Reverse(c.bytes(procfs::page_size())));
        line(
            &mut o,
            format!(
                "\nLargest slab caches (/proc/slabinfo, {} in all)",
                format_size(slab.total_bytes(procfs::page_size()))
            ),
        );
        for c in caches.iter().take(5) {
            line(
                &mut o,
                format!(
                    "  {:<28}{:>10} active / {:>10} objs  {:>12}",
                    c.name,
                    c.active_objs,
                    c.num_objs,
                    format_size(c.bytes(procfs::page_size()))
                ),
            );
        }
    }
    o
}

/// One line per populated zone: free pages against the watermarks, in MiB, with the per-CPU lists
/// beside them because their pages are free but counted in neither `free` nor buddyinfo.
pub fn watermarks(zi: &ZoneInfo) -> String {
    let mib = |pages: u64| format!("{:.1}", (pages * procfs::page_size()) as f64 / (1024.0 * 1024.0));
    let opt = |pages: Option<u64>| pages.map_or_else(|| "-".to_string(), mib);
    let mut o = String::from(
        "\nWatermarks (/proc/zoneinfo, MiB; free = nr_free_pages; pcp = per-CPU lists, not in free)\n",
    );
    o.push_str(&format!(
        "{:<22}{:>10}{:>9}{:>9}{:>9}{:>9}{:>8}{:>9}{:>10}{:>10}\n",
        "", "free", "min", "low", "high", "promo", "boost", "pcp", "pcp high", "managed"
    ));
    let mut empty = Vec::new();
    for z in &zi.zones {
        if !z.populated() {
            empty.push(z.zone.as_str());
            continue;
        }
        let pcp_high: u64 = z.pagesets.iter().map(|p| p.high).sum();
        let below = z.below().map_or(String::new(), |w| format!("  below {w}"));
        o.push_str(&format!(
            "{:<22}{:>10}{:>9}{:>9}{:>9}{:>9}{:>8}{:>9}{:>10}{:>10}{below}\n",
            z.label(),
            mib(z.nr_free_pages),
            mib(z.min),
            mib(z.low),
            mib(z.high),
            opt(z.promo),
            opt(z.boost),
            mib(z.pcp_pages()),
            mib(pcp_high),
            mib(z.managed),
        ));
    }
    if !empty.is_empty() {
        o.push_str(&format!("  (no memory in zone {})\n", empty.join(", ")));
    }
    o
}

/// `fraglab probe --sockets PROTO`: every socket of the protocol, both families, with its memory —
/// summed, beside the protocol's memory_allocated, and the `top` sockets by forward allocation.
fn sockets(args: &ProbeArgs, proto: SocketsProto) -> Result<Exit> {
    let proto = match proto {
        SocketsProto::Tcp => Proto::Tcp,
        SocketsProto::Sctp => Proto::Sctp,
    };
    let wall = fraglab_results::workload::wall_now();
    let mut all: Vec<(Family, Socket)> = Vec::new();
    let mut families = BTreeMap::new();
    let mut without_memory = 0;
    for family in [Family::V4, Family::V6] {
        let dump = sock_diag::read(proto, family, States::All).map_err(|e| match &e {
            fraglab_probe::Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT) => {
                // Could not test (125): the kernel lacks the protocol's diag handler.
                anyhow::Error::new(fraglab_workload::Unsupported(format!(
                    "{e}: this kernel has no {p}_diag (CONFIG_INET_{P}_DIAG), or it is a module not loaded \
                     (modprobe {p}_diag)",
                    p = proto.name(),
                    P = proto.name().to_uppercase()
                )))
            }
            _ => anyhow::Error::new(e),
        })?;
        if let Some(base) = &args.dump_to {
            let path = PathBuf::from(format!("{}.{}", base.display(), family.key()));
            std::fs::write(&path, &dump.raw).with_context(|| format!("cannot write {}", path.display()))?;
            errln!(
                "fraglab probe: {} bytes of {} replies saved to {}",
                dump.raw.len(),
                family.name(),
                path.display()
            );
        }
        let socks = dump.sockets();
        without_memory += dump.entries.iter().filter(|e| e.skmem.is_none()).count();
        families.insert(family.key(), socks.len());
        all.extend(socks.into_iter().map(|s| (family, s)));
    }
    let mut sum = [0i64; 9];
    for (_, s) in &all {
        for (acc, (_, v)) in sum.iter_mut().zip(s.skmem.fields()) {
            *acc += v;
        }
    }
    let names = SkMem::default().fields().map(|(k, _)| k);
    let held: i64 = all.iter().map(|(_, s)| s.skmem.held()).sum();
    let pages = sockstat::memory_allocated_pages(proto);
    let proto_mem = pages.map(|p| p * procfs::page_size() as i64);
    all.sort_by_key(|(_, s)| std::cmp::Reverse(s.skmem.f));
    let top: Vec<&(Family, Socket)> = all.iter().take(args.top).collect();
    let state = |s: &Socket| sock_diag::state_name(proto, false, s.state);

    if args.json {
        let top: Vec<serde_json::Value> = top
            .iter()
            .map(|(family, s)| {
                serde_json::json!({
                    "family": family.key(), "state": state(s), "local": s.local.to_string(),
                    "remote": s.remote.to_string(), "inode": s.inode, "associations": s.associations,
                    "skmem": s.skmem,
                })
            })
            .collect();
        let sum: BTreeMap<&str, i64> = names.iter().copied().zip(sum).collect();
        let out = serde_json::json!({
            "wall": wall, "proto": proto.name(), "sockets": families, "without_memory": without_memory,
            "sum": sum, "held": held, "proto_mem_bytes": proto_mem, "top": top,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(Exit::Ok);
    }
    let mut o = format!("fraglab probe --sockets {} at {wall}\n", proto.name());
    let counts: Vec<String> = families.iter().map(|(k, n)| format!("{k} {n}")).collect();
    o += &format!("  sockets   {}", counts.join(", "));
    if without_memory > 0 {
        o += &format!(" ({without_memory} more without memory: TIME-WAIT and request sockets)");
    }
    o += "\n";
    // d counts packets; the rest are bytes.
    let cells: Vec<String> = names
        .iter()
        .zip(sum)
        .map(|(k, v)| match *k {
            "d" => format!("d {v}"),
            _ => format!("{k} {}", fraglab_results::skmem::signed_size(v)),
        })
        .collect();
    o += &format!("  sum       {}\n", cells.join("  "));
    o += &format!("  charged   r+w+f {}", fraglab_results::skmem::signed_size(held));
    match (proto_mem, pages) {
        (Some(b), Some(p)) => {
            o += &format!(
                "; {} memory_allocated {} ({p} pages)",
                proto.name().to_uppercase(),
                format_size(b as u64)
            )
        }
        _ => o += &format!("; {} memory_allocated not readable", proto.name().to_uppercase()),
    }
    o += "\n";
    if !top.is_empty() {
        o += &format!("top {} by forward allocation (f):\n", top.len());
        let mut rows = vec![["State", "Local", "Peer", "Inode", "Memory"].map(String::from).to_vec()];
        rows.extend(top.iter().map(|(_, s)| {
            vec![
                state(s).to_string(),
                s.local.to_string(),
                s.remote.to_string(),
                s.inode.to_string(),
                s.skmem.to_string(),
            ]
        }));
        for line in fraglab_stdio::columns(&rows, &[]) {
            o += &format!("  {line}\n");
        }
    }
    out!("{o}");
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_lines_from_a_real_capture() {
        let text = include_str!("../../../probe/tests/captures/host-6.18/zoneinfo-grown");
        let zi = ZoneInfo::parse(text, "zoneinfo-grown").unwrap();
        let out = watermarks(&zi);
        assert_eq!(procfs::page_size(), 4096, "the expected MiB figures assume 4 KiB pages");
        let normal = out.lines().find(|l| l.starts_with("Node 0, zone Normal")).unwrap();
        let cells: Vec<&str> = normal.split_whitespace().skip(4).collect();
        // free 947167, min 14769, low 20163, high 25557, promo 30951, boost 0, pcp 20027 + 62194,
        // pcp high 28728 + 63034 = 358.4 MiB, managed 5394258 pages.
        assert_eq!(&cells[..7], ["3699.9", "57.7", "78.8", "99.8", "120.9", "0.0", "321.2"]);
        assert_eq!(cells[7..], ["358.4", "21071.3"]);
        assert!(!normal.contains("below"), "{normal}");
        assert!(out.contains("(no memory in zone Movable, Device)"), "{out}");
        assert!(!out.contains("zone Movable "), "{out}");
    }
}
