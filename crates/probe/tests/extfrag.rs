//! Fragmentation indices: computed from buddyinfo they reproduce the kernel's debugfs files byte for
//! byte, both from a capture and live; the formulas match hand-worked examples; the debugfs parser
//! accepts exactly what the kernel prints.

mod common;

use std::path::Path;
use std::process::Command;

use fraglab_probe::buddyinfo::BuddyInfo;
use fraglab_probe::extfrag::{
    extfrag_index_text, format_fragmentation_index, format_unusable_index, fragmentation_index, indices,
    parse_debugfs, parse_index_file, unusable_free_index, unusable_index_text, ContigPageInfo, ZoneIndices,
};
use fraglab_probe::Error;
use proptest::prelude::*;

fn capture(rel: &str) -> (String, String) {
    let path = format!("{}/tests/captures/{rel}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (text, path)
}

fn buddy_capture(rel: &str) -> BuddyInfo {
    let (text, path) = capture(rel);
    BuddyInfo::parse(&text, &path).unwrap_or_else(|e| panic!("{e}"))
}

/// The host captures were read at the same moment: the kernel's files are exactly what we compute.
#[test]
fn host_capture_reproduces_debugfs_text() {
    let computed = indices(&buddy_capture("host-6.18/buddyinfo"));
    let (unusable, unusable_path) = capture("host-6.18/extfrag_unusable_index");
    let (extfrag, extfrag_path) = capture("host-6.18/extfrag_index");
    assert_eq!(unusable_index_text(&computed), unusable);
    assert_eq!(extfrag_index_text(&computed), extfrag);
    assert_eq!(parse_debugfs(&unusable, &unusable_path, &extfrag, &extfrag_path).unwrap(), computed);

    // Normal, order 10: no free order-10 block, 92403 free pages in 29342 blocks.
    // 1000 - (1000 + 92403000 / 1024) / 29342 = 1000 - 91237 / 29342 = 1000 - 3 = 997: the failure
    // would be almost entirely due to fragmentation.
    let normal = &computed[2];
    assert_eq!((normal.zone.as_str(), normal.extfrag[10], normal.unusable[10]), ("Normal", 997, 1000));
}

/// seed-000, the Normal zone after "mmap all RAM, munmap every second page":
/// `40773 37 34 29 0 0 0 0 0 0 0`.
///
/// free_pages        = 40773 + 37*2 + 34*4 + 29*8 = 40773 + 74 + 136 + 232 = 41215
/// free_blocks_total = 40773 + 37 + 34 + 29 = 40873
///
/// order 4: nothing of order >= 4, so free_blocks_suitable = 0.
///   unusable = (41215 - 0 << 4) * 1000 / 41215 = 1000                 → "1.000": no free page usable
///   extfrag  = 1000 - (1000 + 41215000 / 16) / 40873
///            = 1000 - (1000 + 2575937) / 40873 = 1000 - 63 = 937       → " 0.937": fragmentation,
///              not lack of memory (161 MiB free, no 64 KiB block)
/// order 3: 29 suitable blocks → extfrag -1000 (would succeed);
///   unusable = (41215 - 29*8) * 1000 / 41215 = 40983000 / 41215 = 994
/// order 1: suitable = 37 + 34*2 + 29*4 = 221; unusable = (41215 - 442) * 1000 / 41215 = 989
#[test]
fn hand_worked_seed_000() {
    let free = [40773, 37, 34, 29, 0, 0, 0, 0, 0, 0, 0];
    let info = ContigPageInfo::new(&free, 4);
    assert_eq!((info.free_pages, info.free_blocks_total, info.free_blocks_suitable), (41215, 40873, 0));
    assert_eq!(unusable_free_index(&free, 4), 1000);
    assert_eq!(fragmentation_index(&free, 4), 937);
    assert_eq!(format_unusable_index(1000), "1.000");
    assert_eq!(format_fragmentation_index(937), " 0.937");
    assert_eq!(ContigPageInfo::new(&free, 3).free_blocks_suitable, 29);
    assert_eq!(fragmentation_index(&free, 3), -1000);
    assert_eq!(unusable_free_index(&free, 3), 994);
    assert_eq!(unusable_free_index(&free, 1), 989);
    assert_eq!(unusable_free_index(&free, 0), 0);

    // Run 3, `31113 7 2 1 0 ...`, order 4: 31143 pages in 31123 blocks;
    // 1000 - (1000 + 31143000 / 16) / 31123 = 1000 - 1947437 / 31123 = 1000 - 62 = 938.
    let z = &indices(&buddy_capture("seed-000/buddyinfo-fragmented-3"))[0];
    assert_eq!(z.extfrag[4], 938);
    assert_eq!(z.extfrag[..4], [-1000; 4]);
    assert_eq!(z.unusable[4], 1000);

    // Before fragmenting, every zone had order-10 blocks: every order would succeed.
    for z in indices(&buddy_capture("seed-000/buddyinfo")) {
        assert_eq!(z.extfrag, vec![-1000; 11], "{}", z.zone);
    }
}

#[test]
fn formula_edge_cases() {
    // No free memory: all of it "unusable", and fragmentation index 0 (lack of memory).
    assert_eq!(unusable_free_index(&[0; 11], 3), 1000);
    assert_eq!(fragmentation_index(&[0; 11], 3), 0);
    // Order beyond NR_PAGE_ORDERS: the kernel's WARN_ON_ONCE path returns 0.
    assert_eq!(fragmentation_index(&[0, 0, 1], 3), 0);
    assert_eq!(fragmentation_index(&[], 0), 0);
    assert_eq!(unusable_free_index(&[], 0), 1000);
    // One free page, order-1 request: 1000 - (1000 + 1000/2) / 1 = -500. Negative but not -1000;
    // the kernel's u64 arithmetic truncated to int gives exactly this, and prints it oddly.
    assert_eq!(fragmentation_index(&[1, 0], 1), -500);
    assert_eq!(format_fragmentation_index(-500), " 0.-500");
    assert_eq!(format_unusable_index(-5), "0.-05");
    // Two free pages: 1000 - (1000 + 1000) / 2 = 0, "lack of memory".
    assert_eq!(fragmentation_index(&[2, 0], 1), 0);
    assert_eq!(format_fragmentation_index(-1000), "-1.000");
    assert_eq!(format_fragmentation_index(0), " 0.000");
    assert_eq!(format_unusable_index(66), "0.066");
    // Garbage-sized input neither panics nor loses the kernel's semantics where they are defined.
    let huge = [u64::MAX; 70];
    let _ = (fragmentation_index(&huge, 69), unusable_free_index(&huge, 69));
    assert_eq!(fragmentation_index(&huge, 0), -1000);
}

#[test]
fn debugfs_parser() {
    let text = "Node 0, zone      DMA -1.000  0.997 \nNode 1, zone   Normal  0.-500 -1.000 \n";
    let zones = parse_index_file(text, "e").unwrap();
    assert_eq!(zones[0].index, vec![-1000, 997]);
    assert_eq!(
        (zones[1].node, zones[1].zone.as_str(), zones[1].index.clone()),
        (1, "Normal", vec![-500, -1000])
    );
    for bad in ["1.5", "-1.500", "+0.100", "0.1000", "1", "x.000", "0.99", "99999999.000"] {
        let line = format!("Node 0, zone DMA 0.000 {bad}\n");
        let err = parse_index_file(&line, "e").unwrap_err();
        assert!(err.to_string().starts_with("e:1: "), "{bad}: {err}");
    }
    // Orders must agree between zones; the error names the second line.
    let err =
        parse_index_file("Node 0, zone DMA 0.000\n\nNode 0, zone DMA32 0.000 0.000\n", "u").unwrap_err();
    assert!(err.to_string().starts_with("u:3: "), "{err}");
    // The two files must list the same zones.
    let err = parse_debugfs("Node 0, zone DMA 0.000\n", "u", "Node 0, zone DMA32 -1.000\n", "e").unwrap_err();
    match err {
        Error::Parse { path, line, .. } => assert_eq!((path.as_path(), line), (Path::new("e"), 1)),
        other => panic!("{other}"),
    }
    assert!(parse_debugfs("Node 0, zone DMA 0.000\n", "u", "", "e").is_err());
    assert!(parse_debugfs("", "u", "Node 0, zone DMA -1.000\n", "e").is_err());
}

#[test]
fn old_kernel_captures_parse() {
    // 3.10 and 4.0 printed extfrag_index with "%d.%03d" (no width).
    let (text, path) = capture("linux-mm-2016-09-28/extfrag-3.10");
    let z = parse_index_file(&text, &path).unwrap();
    assert_eq!(z.len(), 4);
    assert_eq!(z[1].index[7..], [981, 991, 996, 998]);
    let (text, path) = capture("linux-mm-2016-09-28/extfrag-4.0");
    let z = parse_index_file(&text, &path).unwrap();
    assert_eq!((z[3].node, z[3].index[6]), (1, 972));
}

// ---- live cross-check ---------------------------------------------------------------------------

fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// Rounds of (buddyinfo, unusable_index, extfrag_index, buddyinfo), each read by one `cat` so the
/// four files are microseconds apart, in a private mount namespace so the debugfs mount is never
/// visible outside it. `Err` is a reason to skip.
fn live_rounds(rounds: usize) -> Result<Vec<[String; 4]>, String> {
    const U: &str = "/sys/kernel/debug/extfrag/unusable_index";
    const E: &str = "/sys/kernel/debug/extfrag/extfrag_index";
    let script = format!(
        "mount -t debugfs none /sys/kernel/debug || exit 90
         [ -r {E} ] && [ -r {U} ] || exit 91
         i=0; while [ $i -lt {rounds} ]; do cat /proc/buddyinfo {U} {E} /proc/buddyinfo; echo '@@'; i=$((i+1)); done"
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(90) => return Err(format!("cannot mount debugfs in a private namespace: {stderr}")),
        Some(91) => return Err("debugfs has no extfrag directory (kernel without CONFIG_COMPACTION?)".into()),
        _ => return Err(format!("unshare -m failed ({}): {stderr}", out.status)),
    }
    let stdout = String::from_utf8(out.stdout).expect("kernel text is ASCII");
    let mut result = Vec::new();
    for round in stdout.split("@@\n").filter(|r| !r.trim().is_empty()) {
        // Every file has one line per populated zone, so the round is four equal slices.
        let lines: Vec<&str> = round.lines().collect();
        assert_eq!(lines.len() % 4, 0, "round is not four files of equal length:\n{round}");
        let z = lines.len() / 4;
        let part = |k: usize| lines[k * z..(k + 1) * z].iter().map(|l| format!("{l}\n")).collect::<String>();
        result.push([part(0), part(1), part(2), part(3)]);
    }
    Ok(result)
}

/// Indices computed from a live buddyinfo equal the kernel's debugfs files read at the same moment.
///
/// Pages move between reads, so only zones whose buddyinfo line was identical before and after the
/// debugfs reads are compared; every zone must be caught still and matching at least once.
#[test]
fn live_matches_debugfs() {
    if effective_uid() != Some(0) {
        return common::skip("mounting debugfs needs root");
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems.lines().any(|l| l.split_whitespace().last() == Some("debugfs")) {
        return common::skip("this kernel has no debugfs");
    }
    let mut matched: Vec<(u32, String)> = Vec::new();
    let mut all_zones: Vec<(u32, String)> = Vec::new();
    let mut mismatches = Vec::new();
    for _ in 0..5 {
        let rounds = match live_rounds(20) {
            Ok(r) => r,
            Err(reason) => return common::skip(reason),
        };
        for [before, unusable, extfrag, after] in rounds {
            let before = BuddyInfo::parse(&before, "/proc/buddyinfo").unwrap();
            let after = BuddyInfo::parse(&after, "/proc/buddyinfo").unwrap();
            let kernel = parse_debugfs(&unusable, "unusable_index", &extfrag, "extfrag_index").unwrap();
            let computed = indices(&before);
            assert_eq!(kernel.len(), computed.len(), "debugfs and buddyinfo list different zones");
            for ((b, a), (c, k)) in before.zones.iter().zip(&after.zones).zip(computed.iter().zip(&kernel)) {
                let key = (b.node, b.zone.clone());
                if !all_zones.contains(&key) {
                    all_zones.push(key.clone());
                }
                if b != a {
                    continue; // the zone moved during the round
                }
                if c == k {
                    if !matched.contains(&key) {
                        matched.push(key);
                    }
                } else {
                    mismatches.push(format!(
                        "{}\n  computed {}\n  kernel   {}\n  computed {}\n  kernel   {}",
                        b.label(),
                        c.unusable_line(),
                        k.unusable_line(),
                        c.extfrag_line(),
                        k.extfrag_line()
                    ));
                }
            }
        }
        if all_zones.iter().all(|z| matched.contains(z)) {
            // A still zone that disagreed would mean a formula bug, unless it changed and changed back
            // within microseconds; tolerate a rare one, never a majority.
            assert!(
                mismatches.len() <= 2,
                "still zones disagreed with the kernel:\n{}",
                mismatches.join("\n")
            );
            println!("{} zones matched debugfs exactly: {:?}", matched.len(), matched);
            return;
        }
    }
    panic!(
        "zones never caught still and matching: {:?}\nmismatches:\n{}",
        all_zones.iter().filter(|z| !matched.contains(z)).collect::<Vec<_>>(),
        mismatches.join("\n")
    );
}

// ---- property tests -------------------------------------------------------------------------------

/// The kernel's formulas with signed 128-bit arithmetic: equal to the u64 version whenever nothing
/// overflows, which holds for any real zone.
fn reference(free: &[u64], order: usize) -> (i32, i32) {
    let free_pages: i128 = free.iter().enumerate().map(|(o, &n)| (n as i128) << o).sum();
    let total: i128 = free.iter().map(|&n| n as i128).sum();
    let suitable: i128 = free.iter().enumerate().skip(order).map(|(o, &n)| (n as i128) << (o - order)).sum();
    let unusable =
        if free_pages == 0 { 1000 } else { (free_pages - (suitable << order)) * 1000 / free_pages };
    let extfrag = if order >= free.len() || total == 0 {
        0
    } else if suitable > 0 {
        -1000
    } else {
        1000 - (1000 + free_pages * 1000 / (1i128 << order)) / total
    };
    (unusable as i32, extfrag as i32)
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn formulas_match_reference(free in prop::collection::vec(0u64..(1 << 36), 0..16), order in 0usize..18) {
        let (unusable, extfrag) = reference(&free, order);
        prop_assert_eq!(unusable_free_index(&free, order), unusable);
        prop_assert_eq!(fragmentation_index(&free, order), extfrag);
        prop_assert!((0..=1000).contains(&unusable));
        prop_assert!(extfrag == -1000 || (-500..=1000).contains(&extfrag), "{}", extfrag);
    }

    #[test]
    fn unusable_grows_with_order(free in prop::collection::vec(0u64..(1 << 30), 1..16)) {
        let z = ZoneIndices::from_zone(&fraglab_probe::buddyinfo::ZoneFree { node: 0, zone: "Normal".into(), free });
        prop_assert!(z.unusable.windows(2).all(|w| w[0] <= w[1]), "{:?}", z.unusable);
    }

    #[test]
    fn garbage_counts_never_panic(free in prop::collection::vec(any::<u64>(), 0..80), order in 0usize..100) {
        let _ = (unusable_free_index(&free, order), fragmentation_index(&free, order));
        let _ = ContigPageInfo::new(&free, order);
    }

    #[test]
    fn every_index_round_trips(v in any::<i32>()) {
        let line = format!("Node 0, zone Normal {} {} \n", format_fragmentation_index(v), format_unusable_index(v));
        prop_assert_eq!(parse_index_file(&line, "p").unwrap()[0].index.clone(), vec![v, v]);
    }

    #[test]
    fn arbitrary_debugfs_text_never_panics(text in "\\PC*(\n\\PC*){0,4}") {
        if let Err(e) = parse_index_file(&text, "arbitrary") {
            match e {
                Error::Parse { line, .. } => prop_assert!((1..=text.lines().count().max(1)).contains(&line)),
                other => prop_assert!(false, "{}", other),
            }
        }
    }
}
