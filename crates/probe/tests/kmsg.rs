//! The kernel-log parser on real reports (captures/kmsg/README.md names every source), the record
//! format of this machine's /dev/kmsg, and property tests: no line makes it panic.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use fraglab_probe::kmsg::{
    parse_line, parse_message, scan_log, split_log_line, FreeArea, Gfp, KmsgEvent, KmsgRecord, KmsgWatcher,
    LogScan,
};
use proptest::prelude::*;

fn capture(name: &str) -> (PathBuf, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/captures/kmsg").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, text)
}

fn scan(name: &str) -> LogScan {
    let (path, text) = capture(name);
    let s = scan_log(&text, &path);
    assert!(
        s.warnings.is_empty(),
        "{name}: {:?}",
        s.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>()
    );
    s
}

fn failures(s: &LogScan) -> Vec<&fraglab_probe::kmsg::AllocFailureReport> {
    s.events
        .iter()
        .filter_map(|f| match &f.event {
            KmsgEvent::AllocFailure(a) => Some(a),
            _ => None,
        })
        .collect()
}

fn free_areas(s: &LogScan) -> Vec<(&str, &FreeArea)> {
    s.events
        .iter()
        .filter_map(|f| match &f.event {
            KmsgEvent::FreeArea(a) => Some((f.message.as_str(), a)),
            _ => None,
        })
        .collect()
}

fn gfp(mask: u64, flags: &[&str]) -> Option<Gfp> {
    Some(Gfp { mask, flags: flags.iter().map(|f| f.to_string()).collect() })
}

#[test]
fn xorg_order4_failure_with_mem_info() {
    let s = scan("linux-mm-2019-08-05-xorg-order4.dmesg");
    let f = failures(&s);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].comm.as_deref(), Some("Xorg"));
    assert_eq!(f[0].order, 4);
    assert_eq!(f[0].gfp, gfp(0x40dc0, &["GFP_KERNEL", "__GFP_COMP", "__GFP_ZERO"]));
    assert_eq!(f[0].nodemask.as_deref(), Some("(null)"));
    assert_eq!(f[0].cpuset.as_deref(), Some("/"));
    assert_eq!(f[0].mems_allowed.as_deref(), Some("0"));
    assert!(!f[0].legacy_format);
    assert_eq!(s.events[0].line, 1);
    assert_eq!(s.events[0].timestamp, Some(3225.313209));

    let areas = free_areas(&s);
    let zones: Vec<_> = areas.iter().map(|(_, a)| (a.node, a.zone.clone().unwrap())).collect();
    assert_eq!(zones, [(Some(0), "DMA".into()), (Some(0), "DMA32".into()), (Some(0), "Normal".into())]);
    let normal = areas[2].1;
    assert_eq!(normal.free, [3277, 1459, 2012, 1869, 742, 178, 14, 0, 0, 0, 0]);
    assert_eq!(normal.types[3], "UMEH");
    assert_eq!(normal.types[7], "");
    assert_eq!(normal.total_kb, Some(190636));
    assert_eq!(normal.page_kb, 4);
    // Order 4 was asked for and blocks of order 4–6 were free: HighAtomic-reserved ones (H) and
    // others, but below the watermark the request could not use them.
    assert_eq!(normal.max_free_order(), Some(6));
    // Re-rendering gives the kernel's own line back, byte for byte.
    for (message, area) in &areas {
        assert_eq!(&area.to_line(), message);
    }
    // No other event: stack frames, register dumps and Mem-Info counters are none of ours.
    assert_eq!(s.events.len(), 4);
}

#[test]
fn memcg_oom_serial_log() {
    let s = scan("linux-mm-2019-01-06-memcg-oom.dmesg");
    let invoked: Vec<_> = s
        .events
        .iter()
        .filter_map(|f| match &f.event {
            KmsgEvent::OomInvoked(o) => Some(o),
            _ => None,
        })
        .collect();
    assert_eq!(invoked.len(), 4);
    assert!(invoked.iter().all(|o| o.comm == "a.out"
        && o.order == Some(0)
        && o.oom_score_adj == Some(0)
        && o.gfp == gfp(0x6200ca, &["GFP_HIGHUSER_MOVABLE"])));
    let killed: Vec<_> = s
        .events
        .iter()
        .filter_map(|f| match &f.event {
            KmsgEvent::OomKilled(k) => Some(k),
            _ => None,
        })
        .collect();
    // Four `Killed process` lines; the two `Kill process … or sacrifice child` lines announce the
    // same kills and are not counted again, and `oom_reaper: reaped process` is not a kill.
    assert_eq!(killed.iter().map(|k| k.pid).collect::<Vec<_>>(), [8204, 8205, 8206, 8203]);
    assert!(killed.iter().all(|k| k.comm == "a.out" && !k.memcg));
    assert_eq!(killed[0].total_vm_kb, Some(10491132));
    assert_eq!(killed[0].anon_rss_kb, Some(92));
    assert_eq!(killed[0].file_rss_kb, Some(444));
    assert_eq!(killed[0].shmem_rss_kb, Some(167028));
    let no_victim = s.events.iter().filter(|f| f.event == KmsgEvent::OomNoVictim).count();
    assert_eq!(no_victim, 2);
    assert!(failures(&s).is_empty());
}

#[test]
fn syslog_oom_with_free_areas() {
    let s = scan("linux-mm-2016-08-02-oom.syslog");
    let KmsgEvent::OomInvoked(o) = &s.events[0].event else { panic!("{:?}", s.events[0]) };
    assert_eq!(o.comm, "x2golistsession");
    assert_eq!(o.order, Some(2));
    assert_eq!(o.gfp, gfp(0x27000c0, &["GFP_KERNEL_ACCOUNT", "__GFP_NOTRACK"]));
    assert_eq!(s.events[0].timestamp, Some(11918.534744));
    let areas = free_areas(&s);
    assert_eq!(areas.len(), 2);
    // An order-2 kernel stack was wanted; nothing above order 1 was free in either zone.
    assert!(areas.iter().all(|(_, a)| a.max_free_order() == Some(1)));
    assert_eq!(areas[1].1.free[..2], [2663, 7452]);
    assert_eq!(s.events[2].line, 12);
}

#[test]
fn current_form_from_netdev_and_xen() {
    let s = scan("netdev-2022-07-06-ksoftirqd-order0.dmesg");
    let f = failures(&s);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].comm.as_deref(), Some("ksoftirqd/0"));
    assert_eq!(f[0].gfp, gfp(0x40a20, &["GFP_ATOMIC", "__GFP_COMP"]));
    assert!(s.events.iter().any(|e| e.event == KmsgEvent::OomNoVictim));

    let s = scan("xen-devel-2020-07-22-order4.serial");
    let f = failures(&s);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].comm.as_deref(), Some("libxl-save-help"));
    assert_eq!(f[0].order, 4);
    assert_eq!(f[0].nodemask.as_deref(), Some("(null)"));
    assert_eq!(f[0].cpuset, None);
    assert_eq!(s.events[0].timestamp, Some(530.412043));
}

#[test]
fn legacy_and_intermediate_forms() {
    let s = scan("redhat-rhel6-order1.syslog");
    let f = failures(&s);
    assert_eq!(
        f.iter().map(|f| f.comm.as_deref().unwrap()).collect::<Vec<_>>(),
        ["glusterfsd", "swapper", "swapper", "swapper", "swapper"]
    );
    assert!(f.iter().all(|f| f.legacy_format && f.order == 1 && f.gfp == gfp(0x20, &[])));

    let s = scan("redhat-rhel6-order2.kernel");
    assert_eq!(failures(&s).len(), 1);
    assert_eq!(failures(&s)[0].order, 2);

    let s = scan("node-exporter-2990-order5.kernel");
    let f = failures(&s);
    assert_eq!(
        (f[0].comm.as_deref().unwrap(), f[0].order, f[0].gfp.clone()),
        ("node_exporter", 5, gfp(0xd0, &[]))
    );

    let s = scan("writeboost-72-order8.dmesg");
    let f = failures(&s);
    assert_eq!(
        (f[0].comm.as_deref().unwrap(), f[0].order, f[0].legacy_format),
        ("dmwb_writeback_", 8, false)
    );
    assert_eq!(f[0].gfp, gfp(0x204010, &[]));

    let s = scan("coreos-1106-java-order0.journal");
    let f = failures(&s);
    assert_eq!(f[0].comm.as_deref(), Some("java"));
    assert_eq!(f[0].gfp, gfp(0x2084120, &["GFP_ATOMIC", "__GFP_COLD", "__GFP_COMP"]));
    assert_eq!(f[0].nodemask, None);
}

#[test]
fn wrapped_free_area_line_is_joined() {
    let s = scan("dcache-3787-swapper-order0.dmesg");
    let areas = free_areas(&s);
    assert_eq!(areas.len(), 1);
    let a = areas[0].1;
    assert_eq!((a.node, a.zone.as_deref()), (Some(1), Some("Normal")));
    assert_eq!(a.free, [4172, 8, 5, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(a.total_kb, Some(16832));
    assert_eq!(s.events[0].line, 1);
    let f = failures(&s);
    assert_eq!(
        (f[0].comm.as_deref().unwrap(), f[0].gfp.clone()),
        ("swapper/12", gfp(0x2080020, &["GFP_ATOMIC"]))
    );
}

#[test]
fn current_oom_kill_line() {
    let s = scan("intel-gfx-2020-06-22-oom.dmesg");
    assert_eq!(s.events.len(), 1);
    let KmsgEvent::OomKilled(k) = &s.events[0].event else { panic!() };
    assert_eq!((k.pid, k.comm.as_str(), k.oom_score_adj), (27368, "chromium", Some(300)));
    assert_eq!(k.shmem_rss_kb, Some(7452));
}

/// The same five records through every dmesg output format of this machine come out as the same
/// messages and times.
#[test]
fn dmesg_formats_of_this_host() {
    let (_, plain) = capture("host-6.18-dmesg.txt");
    let expect: Vec<_> = plain.lines().map(|l| split_log_line(l).message.into_owned()).collect();
    assert_eq!(expect[0], "Zone ranges:");
    assert_eq!(expect[1], "  DMA      [mem 0x0000000000001000-0x0000000000ffffff]");
    for name in
        ["host-6.18-dmesg-x.txt", "host-6.18-dmesg-r.txt", "host-6.18-dmesg-T.txt", "host-6.18-dmesg-iso.txt"]
    {
        let (_, text) = capture(name);
        let got: Vec<_> = text.lines().map(|l| split_log_line(l).message.into_owned()).collect();
        assert_eq!(got, expect, "{name}");
    }
    let t: Vec<_> = plain.lines().map(|l| split_log_line(l).timestamp).collect();
    assert_eq!(t[0], Some(0.003074));
    let (_, raw) = capture("host-6.18-dmesg-r.txt");
    assert_eq!(split_log_line(raw.lines().next().unwrap()).timestamp, Some(0.003074));
}

/// Records as /dev/kmsg handed them out on this machine.
#[test]
fn dev_kmsg_records_of_this_host() {
    let (_, raw) = capture("host-6.18-dev-kmsg.raw");
    // One record per line, its dictionary on the following blank-led lines (one read() each).
    let mut records: Vec<String> = Vec::new();
    for line in raw.lines() {
        match records.last_mut() {
            Some(r) if line.starts_with(' ') => {
                r.push('\n');
                r.push_str(line);
            }
            _ => records.push(line.to_string()),
        }
    }
    let parsed: Vec<KmsgRecord> = records.iter().map(|r| KmsgRecord::parse(r).unwrap()).collect();
    assert_eq!(parsed.len(), 11);
    let zone = &parsed[0];
    assert_eq!((zone.facility, zone.level, zone.seq, zone.ts_usec), (0, 6, 39, 3074));
    assert_eq!(zone.message, "Zone ranges:");
    assert!(!zone.continued);
    let (_, dmesg) = capture("host-6.18-dmesg.txt");
    assert_eq!(zone.to_dmesg_line(), dmesg.lines().next().unwrap());
    let acpi = &parsed[6];
    assert_eq!(acpi.dict, ["SUBSYSTEM=acpi", "DEVICE=+acpi:PNP0A08:00"]);
    let rcu = &parsed[9];
    assert_eq!(rcu.message, "rcu: \tRCU restricting CPUs from NR_CPUS=256 to nr_cpu_ids=2.");
    assert!(parsed.iter().all(|r| r.event() == Ok(None)));
}

#[test]
fn lines_with_our_marker_but_bad_fields_are_errors_naming_file_and_line() {
    let text = "[    1.0] ok line\n[    2.0] x: page allocation failure: order:banana, mode:0x20\n";
    let s = scan_log(text, "/tmp/report.txt");
    assert!(s.events.is_empty());
    let w = s.warnings[0].to_string();
    assert!(w.starts_with("/tmp/report.txt:2: "), "{w}");
    assert!(w.contains("order"), "{w}");
    // A free-area line whose sum disagrees with its entries.
    let e = parse_message("Node 0 Normal: 1*4kB 1*8kB = 16kB").unwrap_err();
    assert!(e.contains("12kB"), "{e}");
    // Cut before mode: accepted, with no mask.
    let Ok(Some(KmsgEvent::AllocFailure(f))) =
        parse_line("[ 1221.658269] RenderThread: page allocation failure: order:0,")
    else {
        panic!()
    };
    assert_eq!((f.order, f.gfp), (0, None));
}

#[test]
fn prefixes_people_save_logs_with() {
    // Each prefix on a message from the captures; the message must come out unchanged.
    let msg = "Xorg: page allocation failure: order:4, mode:0x40dc0(GFP_KERNEL|__GFP_COMP|__GFP_ZERO), nodemask=(null),cpuset=/,mems_allowed=0";
    for (line, ts) in [
        (format!("[ 3225.313209] {msg}"), Some(3225.313209)),
        (format!("[ 3225.313209][  T460] {msg}"), Some(3225.313209)),
        (format!("<4>[ 3225.313209] {msg}"), Some(3225.313209)),
        (format!("kern  :warn  : [ 3225.313209] {msg}"), Some(3225.313209)),
        (format!("[Wed Dec  2 16:03:48 2026] {msg}"), None),
        (format!("2026-12-02T16:03:48,003074+00:00 {msg}"), None),
        (format!("Nov  3 10:00:01 host kernel: {msg}"), None),
        (format!("Nov  3 10:00:01 host kernel: [ 3225.313209] {msg}"), Some(3225.313209)),
        (format!("Jul 21 16:20:58.985209 [ 3225.313209] {msg}"), Some(3225.313209)),
        (format!("kernel: {msg}"), None),
        (msg.to_string(), None),
        // journalctl -o export and -o json (constructed from their documented field names: no
        // journal runs on this VM).
        (format!("MESSAGE={msg}"), None),
        (
            serde_json::json!({"MESSAGE": msg, "_SOURCE_MONOTONIC_TIMESTAMP": "3225313209"}).to_string(),
            Some(3225.313209),
        ),
    ] {
        let l = split_log_line(&line);
        assert_eq!(l.message, msg, "{line}");
        assert_eq!(l.timestamp, ts, "{line}");
    }
}

/// The live device: only records logged after opening come back, each once.
#[test]
fn watcher_reads_only_new_records() {
    if unsafe { libc::geteuid() } != 0 {
        return common::skip("/dev/kmsg needs root");
    }
    let mut w = KmsgWatcher::open().unwrap();
    let before = w.read_available().unwrap();
    // Nothing old: whatever came back was logged in the instant since open.
    assert!(before.len() < 5, "{} records right after open: did it seek to the end?", before.len());
    let marker = format!(
        "fraglab-probe kmsg test {} {}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    );
    // With its newline: a record written without one stays open for a continuation, and readers
    // see it only when the next record closes it.
    std::fs::write("/dev/kmsg", format!("{marker}\n")).unwrap();
    let mut seen = Vec::new();
    for _ in 0..50 {
        if w.wait(Duration::from_millis(100)).unwrap() {
            seen.extend(w.read_available().unwrap());
        }
        if seen.iter().any(|r| r.message == marker) {
            break;
        }
    }
    let r = seen.iter().find(|r| r.message == marker).expect("our record");
    // Written from user space without a <prio> prefix: facility user, level default (4).
    assert_eq!(r.facility, 1);
    assert!(w.read_available().unwrap().iter().all(|r| r.message != marker), "a record came back twice");
}

proptest! {
    #[test]
    fn no_line_panics(line in ".{0,300}") {
        let _ = parse_line(&line);
        let _ = split_log_line(&line);
        let _ = KmsgRecord::parse(&line);
        let _ = FreeArea::parse(&line);
        let _ = Gfp::parse(&line);
        let _ = scan_log(&line, "x");
    }

    #[test]
    fn no_near_miss_panics(
        prefix in prop::sample::select(vec!["", "[ 1.5] ", "kernel: ", "Nov  3 10:00:01 h kernel: ", "<4>", "[", "MESSAGE="]),
        body in prop::sample::select(vec![
            "x: page allocation failure", "x: page allocation failure: order:", "x: page allocation failure. order:9999999999999",
            "x invoked oom-killer: gfp_mask=0x", "Killed process ", "Killed process 12 (", "Out of memory: Killed process x (",
            "Node 0 Normal: ", "Normal: 1*4kB", "Node x Normal: 1*4kB", "1*4kB (U", "= kB", "Node 0 DMA: 1*64kB 1*128kB = 192kB",
        ]),
        tail in "[ -~]{0,40}",
    ) {
        let text = format!("{prefix}{body}{tail}");
        let _ = parse_line(&text);
        let _ = scan_log(&format!("{text}\n{tail}\n{body}"), "x");
    }

    #[test]
    fn failure_lines_round_trip(
        comm in "[a-zA-Z0-9/._-][a-zA-Z0-9/:._ -]{0,13}[a-zA-Z0-9/._-]",
        order in 0u32..11,
        mask in any::<u32>(),
        names in prop::collection::vec("__?GFP_[A-Z_]{1,12}", 0..4),
        ts in 0u32..10_000_000,
    ) {
        let g = Gfp { mask: u64::from(mask), flags: names };
        let line = format!("[{:5}.{:06}] {comm}: page allocation failure: order:{order}, mode:{g}, nodemask=(null),cpuset=/,mems_allowed=0-1,3", ts / 1000, ts % 1000);
        let Ok(Some(KmsgEvent::AllocFailure(f))) = parse_line(&line) else { panic!("{line}") };
        prop_assert_eq!(f.comm, Some(comm));
        prop_assert_eq!(f.order, order);
        prop_assert_eq!(f.gfp, Some(g));
        prop_assert_eq!(f.mems_allowed.as_deref(), Some("0-1,3"));
    }

    #[test]
    fn free_area_lines_round_trip(
        node in prop::option::of(0u32..8),
        zone in prop::sample::select(vec!["DMA", "DMA32", "Normal", "Movable", "HighMem"]),
        page_kb in prop::sample::select(vec![4u64, 16, 64]),
        entries in prop::collection::vec((0u64..1_000_000, prop::sample::select(vec!["", "U", "UME", "H", "C"])), 1..14),
    ) {
        let area = FreeArea {
            node,
            zone: Some(zone.to_string()),
            page_kb,
            free: entries.iter().map(|e| e.0).collect(),
            types: entries.iter().map(|e| if e.0 == 0 { String::new() } else { e.1.to_string() }).collect(),
            total_kb: Some(entries.iter().enumerate().map(|(o, e)| e.0 * (page_kb << o)).sum()),
        };
        let line = area.to_line();
        prop_assert_eq!(FreeArea::parse(&line), Ok(area.clone()));
        prop_assert_eq!(parse_message(&line), Ok(Some(KmsgEvent::FreeArea(area))));
    }
}

/// Each report's `Call Trace:` is attached to it, in the forms real kernels printed: 5.3 with `?`
/// frames and modules, a serial console, arm64's `Call trace:`, 3.18's `[<addr>]` and 2.6's
/// `<IRQ>` with every frame unreliable. Its call site is the first frame outside the allocator.
#[test]
fn call_traces_and_call_sites() {
    use fraglab_probe::stack::call_site;
    let site = |name: &str| {
        let s = scan(name);
        let f = failures(&s);
        assert_eq!(f.len(), 1, "{name}");
        (f[0].stack.clone(), call_site(&f[0].stack).map(|c| c.to_string()))
    };
    let (stack, s) = site("linux-mm-2019-08-05-xorg-order4.dmesg");
    assert_eq!(stack.len(), 42, "{stack:?}");
    assert_eq!(stack[0], "dump_stack+0x85/0xc0");
    assert_eq!(stack[2], "? _cond_resched+0x15/0x30");
    assert_eq!(stack.last().unwrap(), "entry_SYSCALL_64_after_hwframe+0x49/0xbe");
    assert_eq!(s.as_deref(), Some("dc_create_state ← amdgpu_dm_atomic_commit_tail"));
    let (_, s) = site("xen-devel-2020-07-22-order4.serial");
    assert_eq!(s.as_deref(), Some("alloc_empty_pages ← privcmd_ioctl_mmap_batch"));
    let (_, s) = site("netdev-2022-07-06-ksoftirqd-order0.dmesg");
    assert_eq!(s.as_deref(), Some("fdb_create ← br_fdb_update"));
    let (stack, s) = site("redhat-rhel6-order2.kernel");
    assert_eq!(stack.len(), 5);
    assert_eq!(s.as_deref(), None, "only allocator frames: {stack:?}");
    // The 4.9 report has raw stack words but its capture stops before `Call Trace:`.
    let (stack, _) = site("dcache-3787-swapper-order0.dmesg");
    assert!(stack.is_empty(), "{stack:?}");
    // The trace ends at the first line that is no frame: the registers are not frames.
    let s = scan("linux-mm-2019-08-05-xorg-order4.dmesg");
    assert_eq!(free_areas(&s).len(), 3);
}

/// A mail that quotes `/proc/buddyinfo` (seed 000): the `> ` quoting is taken off and each pasted
/// line is a `BuddyInfo` event; the mail's `* Node: CPU …` line is not one.
#[test]
fn quoted_buddyinfo_lines_in_a_mail() {
    let s = scan("netdev-2018-08-10-sctp-buddyinfo.mail");
    let zones: Vec<(usize, String, Vec<u64>)> = s
        .events
        .iter()
        .filter_map(|f| match &f.event {
            KmsgEvent::BuddyInfo(z) => Some((f.line, z.zone.clone(), z.free.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(zones.len(), 6, "{zones:?}");
    assert_eq!(zones[0], (11, "DMA".into(), vec![0, 1, 1, 0, 2, 1, 1, 0, 1, 1, 3]));
    assert_eq!(zones[3], (37, "Normal".into(), vec![40773, 37, 34, 29, 0, 0, 0, 0, 0, 0, 0]));
    assert_eq!(s.events.len(), 6);
    // The live parser never takes a buddyinfo line for a kernel message.
    assert_eq!(parse_message("Node 0, zone Normal 40773 37 34 29 0 0 0 0 0 0 0"), Ok(None));
    // A zoneinfo header and a pagetypeinfo row are not buddyinfo.
    let other = "Node 0, zone   Normal\nNode    0, zone   Normal, type    Unmovable      1      2\n";
    let s = scan_log(other, "other");
    assert!(s.events.is_empty() && s.warnings.is_empty(), "{:?}", s.events);
}

/// What scan_log read from one capture: its failures, and its warnings as text.
fn scan_with_warnings(name: &str) -> (Vec<fraglab_probe::kmsg::AllocFailureReport>, Vec<String>) {
    let (path, text) = capture(name);
    let s = scan_log(&text, &path);
    (failures(&s).into_iter().cloned().collect(), s.warnings.iter().map(|w| w.to_string()).collect())
}

/// Reports of every era and architecture (captures/kmsg/README.md, "Call sites across eras"): the
/// order, mask, task and call site each is about, as a kernel engineer reads them off the log.
#[test]
fn call_sites_across_eras_and_architectures() {
    use fraglab_probe::stack::call_site;
    // (capture, order, mask, comm, "function ← caller" or "function" when the trace ends there)
    let cases: &[(&str, u32, u64, &str, &str)] = &[
        // 2.6.9 i386: no `Call Trace:` heading, no `?` marks, a stale `tcp_v4_route_req` between
        // kmem_getpages and cache_grow.
        (
            "lkml-2004-12-03-cache-alloc-refill-sk-alloc-order1.txt",
            1,
            0x20,
            "smtpd",
            "sk_alloc ← tcp_create_openreq_child",
        ),
        // 2.6.18: show_trace and dump_stack before the allocator, the IRQ stack's `=====` line.
        (
            "lkml-2006-11-06-show-trace-cache-alloc-refill-order1.dmesg",
            1,
            0x20,
            "swapper",
            "__alloc_skb ← tcp_collapse",
        ),
        // 3.8: SLAB's kmem_getpages / fallback_alloc, every frame marked `?`.
        (
            "linux-mm-2013-01-28-fallback-alloc-check-partition-order4.dmesg",
            4,
            0x2000d0,
            "kworker/u:0",
            "check_partition ← rescan_partitions",
        ),
        // 5.9: kmalloc_order with `.cold` and `.constprop.0`, every frame `?`.
        (
            "lkml-2020-10-26-kmalloc-order-dc-create-state-order5.txt",
            5,
            0x40dc0,
            "kworker/u24:4",
            "dc_create_state ← amdgpu_dm_atomic_commit_tail",
        ),
        // 5.4: kmalloc_order_trace.
        (
            "stable-2021-10-06-kmalloc-order-trace-nfsd-order5.dmesg",
            5,
            0x40dc0,
            "emerge",
            "nfsd_reply_cache_init ← nfsd_init_net",
        ),
        // 6.19 SLUB sheaves: allocate_slab, refill_objects, __pcs_replace_empty_main; `[btrfs]`.
        (
            "linux-mm-2026-02-22-allocate-slab-btrfs-order0.dmesg",
            0,
            0xc0c40,
            "kswapd0",
            "alloc_extent_state ← btrfs_clear_extent_bit_changeset",
        ),
        // 6.19: the DMA API between the driver and the page allocator; `.isra.0`, `.part.0`.
        (
            "linux-media-2026-03-20-uvcvideo-dma-direct-order5.dmesg",
            5,
            0xcc0,
            "v4l2src0:src",
            "uvc_alloc_urb_buffers ← uvc_video_start_transfer",
        ),
        // 6.19 `dmesg -T`, a build id on the CPU line; folio_alloc_swap is no folio allocator.
        (
            "github-rocm-2026-04-17-folio-alloc-swap-buildid-order0.dmesg",
            0,
            0xc0de0,
            "kswapd0",
            "isolate_lock_cluster ← folio_alloc_swap",
        ),
        // ARM32 v5.3, `(callee) from [<…>] (caller+…)`, SLOB, a frame line split in the source.
        (
            "linux-omap-2019-08-14-sx1-swapper-order0-slob.txt",
            0,
            0x0,
            "swapper",
            "__clk_register ← omap1_clk_init",
        ),
        // ARM32 Thumb-2 v5.8: the last line cut short.
        (
            "lkml-2020-09-02-sunxi-f2fs-zstd-order9.txt",
            9,
            0x40c40,
            "kworker/u9:3",
            "zstd_init_decompress_ctx ← f2fs_decompress_pages",
        ),
        // ARM32 v4.14, every line cut at a terminal's width: the last caller only after ` from `.
        (
            "pfsol-prj-2018-rza2-yavta-order7-truncated.dmesg",
            7,
            0x14000c0,
            "yavta",
            "vb2_dc_alloc ← __vb2_queue_alloc",
        ),
        // ARM32 v3.10, the old one-line form, console output glued before the task name.
        (
            "linux-mm-2014-12-08-imx6q-swapper-order0-fec-mangled-prefix.txt",
            0,
            0x200020,
            "swapper/0",
            "build_skb ← __netdev_alloc_skb",
        ),
        // arm64 with `<4>` and a CFI jump-table frame.
        (
            "lkml-2022-06-03-android-system-server-order0-selinux.dmesg",
            0,
            0xa20,
            "system_server",
            "context_struct_to_string ← context_add_hash",
        ),
        // arm64 with a vendor `[cpu: comm:pid]` column and no timestamp.
        (
            "lkml-2023-12-27-samsung-s5e9945-binder-order0-async.txt",
            0,
            0xa20,
            "binder:569_5",
            "async_schedule_node_domain ← async_schedule_node",
        ),
        // arm64 4.14: `[<0000000000000000>] func` frames, glued lines, zsmalloc as the allocator.
        (
            "lkml-2020-06-16-android-arm64-kswapd0-order0-zsmalloc-mangled.dmesg",
            0,
            0x140000a,
            "kswapd0",
            "zram_bvec_rw ← zram_rw_page",
        ),
        (
            "lkml-2020-06-13-android-arm64-binder-order0-callercol.dmesg",
            0,
            0x480020,
            "Binder:9343_3",
            "context_struct_to_string ← security_sid_to_context_core",
        ),
        // arm64 with `[ts]text` and `[ts]: func` (no space, a colon).
        (
            "linux-input-2024-05-22-oppo-arm64-kworker-order4-hid-colon.dmesg",
            4,
            0x40dc0,
            "kworker/1: 0",
            "hid_add_field ← hid_parser_main",
        ),
        // x86 with CONFIG_PRINTK_CALLER's `[    T1]`, `?` frames beside the real ones.
        (
            "lkml-2022-08-23-sle15-x86-swapper-order10-dmapool-callerid-8node.dmesg",
            10,
            0xcc1,
            "swapper/0",
            "atomic_pool_expand ← __dma_atomic_pool_init",
        ),
        // ARM32 3.2 as a syslog excerpt indented as a Markdown block; the trace cut after the site.
        (
            "porjo-mt7601-21-2015-04-08-kirkwood-khubd-order5-fragment.syslog",
            5,
            0x20,
            "khubd",
            "RTMPAllocUsbBulkBufStruct",
        ),
    ];
    for &(name, order, mask, comm, site) in cases {
        let (f, warnings) = scan_with_warnings(name);
        assert_eq!(f.len(), 1, "{name}: {f:#?}");
        let f = &f[0];
        assert_eq!(
            (f.order, f.gfp.as_ref().map(|g| g.mask), f.comm.as_deref()),
            (order, Some(mask), Some(comm)),
            "{name}"
        );
        assert_eq!(
            call_site(&f.stack).map(|c| c.to_string()).as_deref(),
            Some(site),
            "{name}: {:#?}",
            f.stack
        );
        // Only the yavta log has an unreadable line: its free-area line, cut at the terminal.
        let expected = usize::from(name.starts_with("pfsol"));
        assert_eq!(warnings.len(), expected, "{name}: {warnings:?}");
    }
}

/// What a mangled log could not give is said, not guessed.
#[test]
fn mangled_reports_say_what_they_lost() {
    // Console output before the name: over 15 bytes, so not a task name; the CPU line names it.
    let (f, _) = scan_with_warnings("linux-mm-2014-12-08-imx6q-swapper-order0-fec-mangled-prefix.txt");
    assert!(f[0].notes.iter().any(|n| n.contains("longer than a task name")), "{:?}", f[0].notes);
    assert!(f[0].notes.iter().any(|n| n.contains("from the CPU line")), "{:?}", f[0].notes);

    // Two MIPS CPUs at once (OpenWrt): CPU 3's header split over four lines, CPU 0's `CPU:` line
    // and raw stack words between them. CPU 3's failure is counted with its name (the line before)
    // and its mode (a line after); the trace that follows could be either CPU's and is not taken.
    let (f, warnings) = scan_with_warnings("lede-2453-mt7621-mips-interleaved-cpu0-cpu3-window2.dmesg");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(
        (f[0].order, f[0].comm.as_deref(), f[0].gfp.as_ref().map(|g| g.mask)),
        (0, Some("swapper/3"), Some(0x1080020))
    );
    assert!(f[0].stack.is_empty(), "{:?}", f[0].stack);
    let notes = f[0].notes.join("; ");
    for said in [
        "no task name before",
        "from the line before the header",
        "interleaved with swapper/0's report",
        "mode from a line after",
    ] {
        assert!(notes.contains(said), "{said}: {notes}");
    }
    // The trace at the top of the window, whose header is above it: a failure with no order.
    let (f, warnings1) = scan_with_warnings("lede-2453-mt7621-mips-interleaved-cpu0-cpu3-window1.dmesg");
    assert_eq!(f.len(), 1);
    assert!(
        warnings1.iter().any(|w| w.contains(":4: a page allocation failure's call trace without its")
            && w.contains("call site mt76_dma_attach")),
        "{warnings1:?}"
    );
    assert!(warnings.iter().all(|w| w.contains("call trace without its")), "{warnings:?}");

    // The excerpt begins after its header: only the orphan trace, with its call site.
    let (f, warnings) = scan_with_warnings("lkml-2020-06-13-android-arm64-kswapd0-noheader-callercol.dmesg");
    assert!(f.is_empty());
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].contains("order and mode unknown; call site zram_bvec_rw ← zram_rw_page"),
        "{warnings:?}"
    );

    // The trace stops inside SLUB: no call site, and none is made up.
    let (f, _) = scan_with_warnings("linux-mm-2019-03-28-android-arm32-kswapd0-order0-slab-regs.dmesg");
    assert_eq!(fraglab_probe::stack::call_site(&f[0].stack), None, "{:?}", f[0].stack);
    assert!(f[0].stack.iter().any(|s| s.contains("(kmem_cache_alloc+0x16c/0x2d0)")), "{:?}", f[0].stack);

    // A mode cut short keeps its mask.
    let Ok(Some(KmsgEvent::AllocFailure(f))) =
        parse_line("[  887.838111] yavta: page allocation failure: order:7, mode:0x14000c0(GFP_KERN")
    else {
        panic!()
    };
    assert_eq!((f.order, f.gfp.map(|g| g.mask)), (7, Some(0x14000c0)));
    assert!(f.notes[0].contains("cut short"), "{:?}", f.notes);
}

/// Free-area lines behind every prefix the captures have: `<4>[ts]`, a vendor column, a caller id.
#[test]
fn free_area_lines_behind_any_prefix() {
    for (name, zone, first) in [
        ("lkml-2022-06-03-android-system-server-order0-selinux.dmesg", "Normal", 8),
        ("lkml-2020-06-13-android-arm64-binder-order0-callercol.dmesg", "Normal", 505),
        ("lkml-2020-06-13-android-arm64-kswapd0-noheader-callercol.dmesg", "Normal", 196),
        ("linux-mm-2019-03-28-android-arm32-meminfo-highmem.dmesg", "DMA", 148),
        ("lkml-2022-08-23-sle15-x86-swapper-order10-dmapool-callerid-8node.dmesg", "DMA", 0),
    ] {
        let (path, text) = capture(name);
        let s = scan_log(&text, &path);
        let areas = free_areas(&s);
        let a = areas.first().unwrap_or_else(|| panic!("{name}: no free area"));
        assert_eq!((a.1.zone.as_deref(), a.1.free[0]), (Some(zone), first), "{name}");
    }
}

/// warn_alloc's reports that are not page allocation failures (vmalloc errors, 4.x stalls) keep
/// their CPU line and call trace: no failure is counted and no "trace without its header" warned.
/// The 4.6 ppc64 one prints a real order-0 failure with its vmalloc line: powerpc's `[sp] [pc]`
/// frames, one wrapped by the mail client, still give its call site.
#[test]
fn warn_alloc_s_other_reports_are_not_failures() {
    for name in [
        "linux-kernel-2023-03-31-vmalloc-error.dmesg",
        "linux-kernel-2023-06-26-vmalloc-error-page-order.dmesg",
        "linux-kernel-2023-06-26-vmalloc-error-btrfs-kworker.dmesg",
        "linux-fsdevel-2023-03-02-syzbot-vmalloc-error.dmesg",
        "stable-2019-09-01-vmalloc-allocation-failure.dmesg",
        "linux-mm-2017-03-02-vmalloc-allocation-failure.dmesg",
        "linux-mm-2017-09-11-page-allocation-stalls.dmesg",
        "linux-mm-2016-12-27-page-allocation-stalls-i386.dmesg",
        "linux-mm-2019-05-02-page-allocation-stalls-wrapped.dmesg",
    ] {
        let (f, warnings) = scan_with_warnings(name);
        assert!(f.is_empty(), "{name}: {f:#?}");
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
    }
    let (f, warnings) = scan_with_warnings("linux-mm-2016-08-02-vmalloc-with-page-allocation-failure.dmesg");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!((f.len(), f[0].order, f[0].comm.as_deref()), (1, 0, Some("swapper/0")));
    assert_eq!(
        fraglab_probe::stack::call_site(&f[0].stack).map(|c| c.to_string()).as_deref(),
        Some("alloc_large_system_hash ← inode_init"),
        "{:#?}",
        f[0].stack
    );
}
