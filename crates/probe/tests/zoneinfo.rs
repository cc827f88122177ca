//! `/proc/zoneinfo`: two real captures of the 6.18 VM (before and after deferred struct page init grew
//! the Normal zone) parse to their exact numbers and agree with the buddyinfo read beside them; the
//! live file holds the same invariants; no input makes the parser panic.

mod common;
use std::collections::BTreeSet;

use common::{assert_names_line, mutated};
use fraglab_probe::buddyinfo::BuddyInfo;
use fraglab_probe::pagetypeinfo::PageTypeInfo;
use fraglab_probe::zoneinfo::{Pageset, ZoneInfo};
use fraglab_probe::Error;
use proptest::prelude::*;

const EARLY: &str = include_str!("captures/host-6.18/zoneinfo");
const GROWN: &str = include_str!("captures/host-6.18/zoneinfo-grown");
const GROWN_BUDDY: &str = include_str!("captures/host-6.18/buddyinfo-grown");
const GUEST_61: &str = include_str!("captures/guest-6.1/zoneinfo");
const GUEST_61_BUDDY: &str = include_str!("captures/guest-6.1/buddyinfo");
const NUMA2_1G: &str = include_str!("captures/guest-6.1-numa2/zoneinfo");
const NUMA2_5G: &str = include_str!("captures/guest-6.1-numa2-5g/zoneinfo");
/// `Page block order: 9` in the pagetypeinfo capture of the same VM.
const PAGEBLOCK_ORDER: usize = 9;

fn parse(text: &str, path: &str) -> ZoneInfo {
    ZoneInfo::parse(text, path).unwrap_or_else(|e| panic!("{e}"))
}

/// Sum of every CPU's `vm stats threshold` in a zone: NR_FREE_PAGES is batched per CPU, and the value
/// zoneinfo prints may lag the free lists by up to that much until vmstat folds the deltas in.
fn drift(z: &fraglab_probe::zoneinfo::Zone) -> u64 {
    z.pagesets.iter().map(|p| p.stat_threshold.unwrap_or(0)).sum()
}

/// What must hold for any zoneinfo: ordered watermarks and sizes, `protection` shaped like
/// `setup_per_zone_lowmem_reserve()` leaves it, per-CPU lists only in populated zones.
fn check_invariants(zi: &ZoneInfo) {
    assert!(!zi.zones.is_empty(), "no zone");
    let nodes: BTreeSet<u32> = zi.zones.iter().map(|z| z.node).collect();
    for node in nodes {
        let zones: Vec<_> = zi.zones.iter().filter(|z| z.node == node).collect();
        for (idx, z) in zones.iter().enumerate() {
            let l = z.label();
            assert!(z.min <= z.low && z.low <= z.high, "{l}: min {} low {} high {}", z.min, z.low, z.high);
            if let Some(promo) = z.promo {
                assert!(z.high <= promo, "{l}: high {} promo {promo}", z.high);
            }
            assert!(z.managed <= z.present && z.present <= z.spanned, "{l}: {z:?}");
            // zoneinfo prints every zone of the node (MAX_NR_ZONES), each with one reserve per zone.
            assert_eq!(z.protection.len(), zones.len(), "{l}: {:?}", z.protection);
            // lowmem_reserve[j] is 0 for j <= this zone, then grows with the managed pages above it.
            assert!(z.protection[..=idx].iter().all(|&p| p == 0), "{l}: {:?}", z.protection);
            assert!(z.protection.windows(2).all(|w| w[0] <= w[1]), "{l}: {:?}", z.protection);
            assert!(z.nr_free_pages <= z.managed, "{l}: free {} > managed {}", z.nr_free_pages, z.managed);
            if let Some(blocks) = z.nr_free_pages_blocks {
                assert!(blocks <= z.nr_free_pages + drift(z), "{l}: {blocks} in blocks > free");
            }
            if z.populated() {
                assert!(!z.pagesets.is_empty(), "{l}: populated but no pagesets");
                for p in &z.pagesets {
                    assert!(p.batch >= 1, "{l}: cpu {} batch 0", p.cpu);
                    if let (Some(lo), Some(hi)) = (p.high_min, p.high_max) {
                        assert!(lo <= hi, "{l}: cpu {} high_min {lo} > high_max {hi}", p.cpu);
                    }
                }
            } else {
                assert!(z.pagesets.is_empty() && z.nr_free_pages == 0, "{l}: {z:?}");
            }
        }
    }
}

#[test]
fn early_capture() {
    // Taken minutes after boot: deferred init had given the Normal zone 360448 of its 5505024 pages.
    let zi = parse(EARLY, "host-6.18/zoneinfo");
    check_invariants(&zi);
    let names: Vec<_> = zi.zones.iter().map(|z| z.zone.as_str()).collect();
    assert_eq!(names, ["DMA", "DMA32", "Normal", "Movable", "Device"]);
    let n = zi.zone(0, "Normal").unwrap();
    assert_eq!(
        (n.nr_free_pages, n.min, n.low, n.high, n.promo, n.boost),
        (92340, 5355, 6693, 8031, Some(9369), Some(0))
    );
    assert_eq!((n.spanned, n.present, n.managed, n.cma), (5505024, 5505024, 360448, Some(0)));
    assert_eq!(n.nr_free_pages_blocks, Some(1536));
    assert_eq!(n.protection, [0, 0, 0, 0, 0]);
    assert_eq!(
        n.pagesets[1],
        Pageset {
            cpu: 1,
            count: 10389,
            high: 10684,
            batch: 63,
            high_min: Some(3346),
            high_max: Some(22528),
            stat_threshold: Some(20)
        }
    );
    assert_eq!(n.pcp_pages(), 13386 + 10389);
    assert_eq!((n.node_unreclaimable, n.start_pfn), (Some(false), Some(1048576)));
    assert_eq!(zi.zone(0, "DMA").unwrap().protection, [0, 3018, 4426, 4426, 4426]);
    // DMA32's cpu 0 list had been shrunk below its high_min: high is not bounded by high_min.
    let d32 = &zi.zone(0, "DMA32").unwrap().pagesets[0];
    assert_eq!((d32.high, d32.high_min), (252, Some(7176)));
    let dev = zi.zone(0, "Device").unwrap();
    assert!(!dev.populated() && dev.pagesets.is_empty() && dev.start_pfn.is_none());
    assert_eq!((dev.min, dev.promo), (0, Some(0)));
}

#[test]
fn grown_capture_recomputed_watermarks_and_reserves() {
    // The same VM after 22 GiB more of Normal had been initialised: the kernel recomputed the
    // watermarks and lowmem reserves from the new managed count (min_free_kbytes scales with it).
    let early = parse(EARLY, "early");
    let grown = parse(GROWN, "host-6.18/zoneinfo-grown");
    check_invariants(&grown);
    let n = grown.zone(0, "Normal").unwrap();
    assert_eq!((n.managed, n.min, n.low, n.high, n.promo), (5394258, 14769, 20163, 25557, Some(30951)));
    assert!(n.managed > early.zone(0, "Normal").unwrap().managed);
    assert_eq!(grown.zone(0, "DMA").unwrap().protection, [0, 3018, 24090, 24090, 24090]);
    assert_eq!(grown.zone(0, "DMA32").unwrap().protection, [0, 0, 21071, 21071, 21071]);
    // DMA32 did not grow, yet its min fell from 11483 to 2115: min_free_kbytes is shared out by
    // managed pages, and Normal's share grew.
    assert_eq!(early.zone(0, "DMA32").unwrap().min, 11483);
    assert_eq!(grown.zone(0, "DMA32").unwrap().min, 2115);
    assert_eq!(n.pcp_pages(), 20027 + 62194);
}

/// Debian's 6.1 cloud kernel in a 1 GiB `fraglab vm` guest, the kernel the whole-machine tests run
/// on: an older format (no promo watermark, no nr_free_pages_blocks, no high_min/high_max), no
/// Normal zone, and its free count exactly the buddy free lists' (read back to back at rest).
#[test]
fn guest_61_capture() {
    let zi = parse(GUEST_61, "guest-6.1/zoneinfo");
    check_invariants(&zi);
    let names: Vec<_> = zi.zones.iter().map(|z| z.zone.as_str()).collect();
    assert_eq!(names, ["DMA", "DMA32", "Normal", "Movable", "Device"]);
    let d32 = zi.zone(0, "DMA32").unwrap();
    assert_eq!(
        (d32.nr_free_pages, d32.min, d32.low, d32.high, d32.promo, d32.boost),
        (230819, 11086, 13857, 16628, None, Some(0))
    );
    assert_eq!((d32.spanned, d32.present, d32.managed), (258016, 258016, 245255));
    assert_eq!(d32.nr_free_pages_blocks, None);
    assert_eq!(
        d32.pagesets[1],
        Pageset {
            cpu: 1,
            count: 2816,
            high: 6928,
            batch: 63,
            high_min: None,
            high_max: None,
            stat_threshold: Some(16)
        }
    );
    assert_eq!(d32.pcp_pages(), 2541 + 2816);
    assert_eq!((d32.node_unreclaimable, d32.start_pfn), (Some(false), Some(4096)));
    // The DMA zone's reserve against allocations that could use DMA32 (the `lowmem_reserve_ratio`
    // entry fraglab's whole-machine mode sets to 1 to take DMA out of play).
    assert_eq!(zi.zone(0, "DMA").unwrap().protection, [0, 938, 938, 938, 938]);
    assert!(!zi.zone(0, "Normal").unwrap().populated());
    let b = BuddyInfo::parse(GUEST_61_BUDDY, "guest-6.1/buddyinfo").unwrap();
    for zone in ["DMA", "DMA32"] {
        assert_eq!(zi.zone(0, zone).unwrap().nr_free_pages, b.zone(0, zone).unwrap().free_pages(), "{zone}");
    }
}

/// zoneinfo against the buddyinfo read just before it (the grown pair: buddyinfo read before and
/// after zoneinfo was identical). nr_free_pages counts the buddy free lists and **not** the per-CPU
/// lists: Normal holds 82221 pcp pages, yet differs from the buddy sum by 50, within the 72 pages of
/// per-CPU counter drift. nr_free_pages_blocks is exactly the buddy pages at order >= pageblock_order.
/// Two-node guests (`fraglab vm --numa 2`): the nodes with memory, each node's zones and the zone
/// its user pages come from, and spans that tile each node's memory in address order.
#[test]
fn numa_guest_captures_nodes_zones_and_spans() {
    let one = parse(NUMA2_1G, "guest-6.1-numa2/zoneinfo");
    assert_eq!(one.nodes(), vec![0, 1]);
    let zones = |zi: &ZoneInfo, n| zi.node_zones(n).map(|z| z.zone.clone()).collect::<Vec<_>>();
    assert_eq!(zones(&one, 0), ["DMA", "DMA32"]);
    assert_eq!(zones(&one, 1), ["DMA32"]);
    assert_eq!(one.user_zone(0).unwrap().zone, "DMA32");
    assert_eq!(one.zone(0, "DMA").unwrap().span(), Some((1, 4096)));
    assert_eq!(one.zone(0, "DMA32").unwrap().span(), Some((4096, 131072)));
    assert_eq!(one.zone(1, "DMA32").unwrap().span(), Some((131072, 262112)));
    assert_eq!(one.zone(1, "Normal").unwrap().span(), None, "an empty zone spans nothing");
    assert_eq!(one.node_free_pages(1), one.zone(1, "DMA32").unwrap().nr_free_pages);

    // 5 GiB: 3 GiB below the 4 GiB hole, so node 1 (2.5–5 GiB) holds DMA32 and Normal.
    let five = parse(NUMA2_5G, "guest-6.1-numa2-5g/zoneinfo");
    assert_eq!(zones(&five, 1), ["DMA32", "Normal"]);
    assert_eq!(five.user_zone(1).unwrap().zone, "Normal");
    assert_eq!(five.user_zone(0).unwrap().zone, "DMA32");
    assert_eq!(five.zone(1, "DMA32").unwrap().span(), Some((655360, 1048576)));
    assert_eq!(five.zone(1, "Normal").unwrap().span(), Some((1048576, 1572864)));
    assert_eq!(five.user_zone(7).map(|z| z.label()), None);
    for zi in [&one, &five] {
        check_invariants(zi);
        for z in zi.zones.iter().filter(|z| z.populated()) {
            assert!(zi.overlapping(z.node, &z.zone).is_empty(), "{}", z.label());
        }
    }
    // Node 1's DMA32 moved to start inside node 0's (as interleaved nodes do on some machines):
    // each zone now overlaps the other.
    let moved =
        parse(&NUMA2_1G.replace("start_pfn:           131072", "start_pfn:           100000"), "moved");
    let o: Vec<String> = moved.overlapping(1, "DMA32").iter().map(|z| z.label()).collect();
    assert_eq!(o, ["Node 0, zone DMA32"]);
    assert_eq!(moved.overlapping(0, "DMA32").len(), 1);
    assert!(moved.overlapping(0, "DMA").is_empty());
}

#[test]
fn captures_against_their_buddyinfo() {
    // (The early pair is not used: its buddyinfo was read a while before its zoneinfo, and Normal moved
    // by 63 pages in between — see buddyinfo.rs.)
    let zi = parse(GROWN, "grown");
    let b = BuddyInfo::parse(GROWN_BUDDY, "grown").unwrap();
    for zone in ["DMA", "DMA32", "Normal"] {
        let (z, bz) = (zi.zone(0, zone).unwrap(), b.zone(0, zone).unwrap());
        assert!(z.nr_free_pages.abs_diff(bz.free_pages()) <= drift(z), "{zone}");
        assert_eq!(z.nr_free_pages_blocks, Some(bz.free_pages_at_or_above(PAGEBLOCK_ORDER)), "{zone}");
    }
    let normal = zi.zone(0, "Normal").unwrap();
    assert_eq!((normal.nr_free_pages, b.zone(0, "Normal").unwrap().free_pages()), (947167, 947117));
    assert_eq!(zi.zone(0, "DMA32").unwrap().nr_free_pages, b.zone(0, "DMA32").unwrap().free_pages());
}

/// The live file: parses, holds the invariants, lists exactly buddyinfo's zones as populated, one
/// pageset per online CPU, and its free counters match buddyinfo read around it. The zones' sizes are
/// not compared between reads: with deferred struct page init (this VM) `managed` grows while memory
/// is being allocated, and the watermarks and reserves are recomputed with it.
#[test]
fn live_zoneinfo_matches_buddyinfo() {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let cpus = parse_cpu_list(online.trim());
    let pageblock_order = PageTypeInfo::read().ok().map(|p| p.pageblock_order as usize);
    let mut attempts = Vec::new();
    for _ in 0..20 {
        let before = BuddyInfo::read().unwrap();
        let zi = ZoneInfo::read().unwrap();
        let after = BuddyInfo::read().unwrap();
        check_invariants(&zi);
        let populated: BTreeSet<(u32, &str)> =
            zi.zones.iter().filter(|z| z.populated()).map(|z| (z.node, z.zone.as_str())).collect();
        let listed: BTreeSet<(u32, &str)> = before.zones.iter().map(|z| (z.node, z.zone.as_str())).collect();
        assert_eq!(populated, listed, "populated zoneinfo zones vs buddyinfo zones");
        for z in zi.zones.iter().filter(|z| z.populated()) {
            let seen: Vec<u32> = z.pagesets.iter().map(|p| p.cpu).collect();
            assert_eq!(seen, cpus, "{}: pagesets vs online CPUs {online:?}", z.label());
        }
        // Each counter must lie within [min, max] of the two buddyinfo reads, widened by the drift.
        let mut ok = true;
        let mut report = Vec::new();
        for z in zi.zones.iter().filter(|z| z.populated()) {
            let (b1, b2) = (before.zone(z.node, &z.zone).unwrap(), after.zone(z.node, &z.zone).unwrap());
            let within = |v: u64, a: u64, b: u64| v + drift(z) >= a.min(b) && v <= a.max(b) + drift(z);
            ok &= within(z.nr_free_pages, b1.free_pages(), b2.free_pages());
            if let (Some(order), Some(blocks)) = (pageblock_order, z.nr_free_pages_blocks) {
                ok &= within(blocks, b1.free_pages_at_or_above(order), b2.free_pages_at_or_above(order));
            }
            report.push(format!(
                "{}: nr_free_pages {} buddy {}..{} pcp {} drift {}",
                z.label(),
                z.nr_free_pages,
                b1.free_pages(),
                b2.free_pages(),
                z.pcp_pages(),
                drift(z)
            ));
        }
        attempts.push(report.join("; "));
        if ok {
            println!("{}", attempts.last().unwrap());
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("zoneinfo never agreed with buddyinfo:\n{}", attempts.join("\n"));
}

/// `0-1`, `0,2-3`: the kernel's CPU list format.
fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => v.push(part.parse().unwrap()),
        }
    }
    v
}

#[test]
fn errors_name_file_and_line() {
    let cases: &[(&str, &str, usize, &str)] = &[
        ("        min      14769", "        min      x", 148, "min value \"x\" is not an unsigned number"),
        ("        protection: (0, 0, 0, 0, 0)", "        protection: (0, 0", 156, "protection: expected"),
        (
            "              batch:    63\n              high_min: 10081",
            "              batch:    63\n              batch:    64",
            179,
            "batch appears a second time for cpu 0",
        ),
        ("        low      20163", "        min      1", 149, "min appears a second time"),
        ("  node_unreclaimable:  0", "  node_unreclaimable:  7", 0, "expected 0 or 1"),
    ];
    for (from, to, line, needle) in cases {
        assert!(GROWN.contains(from), "{from}");
        let text = GROWN.replacen(from, to, 1);
        let err = ZoneInfo::parse(&text, "z").unwrap_err();
        assert_names_line(&err, "z", &text);
        if *line > 0 {
            assert!(matches!(err, Error::Parse { line: l, .. } if l == *line), "{err}");
        }
        assert!(err.to_string().contains(needle), "{err}");
    }
    // A zone that lost a required line is reported at its header.
    let text = GROWN.replacen("        spanned  5505024\n", "", 1);
    let err = ZoneInfo::parse(&text, "z").unwrap_err();
    assert_names_line(&err, "z", &text);
    assert!(err.to_string().contains("Node 0, zone Normal has no spanned line"), "{err}");
    // Text before the first header, and a zone listed twice.
    let err = ZoneInfo::parse("  pages free 1\n", "z").unwrap_err();
    assert!(err.to_string().starts_with("z:1: "), "{err}");
    let dev = &GROWN[GROWN.find("Node 0, zone   Device").unwrap()..];
    let err = ZoneInfo::parse(&format!("{GROWN}{dev}"), "z").unwrap_err();
    assert!(err.to_string().contains("appears a second time"), "{err}");
    assert_eq!(ZoneInfo::parse("", "z").unwrap(), ZoneInfo::default());
}

proptest! {
    #[test]
    fn arbitrary_input_never_panics(text in "\\PC*(\n\\PC*){0,6}") {
        if let Err(e) = ZoneInfo::parse(&text, "arb") { assert_names_line(&e, "arb", &text) }
    }

    #[test]
    fn mutated_captures_never_panic(text in mutated(GROWN)) {
        match ZoneInfo::parse(&text, "mut") {
            Ok(zi) => prop_assert!(zi.zones.len() <= 10),
            Err(e) => assert_names_line(&e, "mut", &text),
        }
    }

    #[test]
    fn mutated_early_capture_never_panics(text in mutated(EARLY)) {
        if let Err(e) = ZoneInfo::parse(&text, "mut") { assert_names_line(&e, "mut", &text) }
    }
}
