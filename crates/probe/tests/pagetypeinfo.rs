//! `/proc/pagetypeinfo`: real captures parse to the exact numbers, the free tables agree with
//! buddyinfo captured beside them, the live file reads as root, and no input — random or a mangled
//! capture — makes the parser panic.

mod common;

use std::path::Path;

use fraglab_probe::buddyinfo::BuddyInfo;
use fraglab_probe::pagetypeinfo::{parse_free_line, PageTypeInfo};
use fraglab_probe::Error;
use proptest::prelude::*;

fn capture(rel: &str) -> (String, String) {
    let path = format!("{}/tests/captures/{rel}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (text, path)
}

fn parse_capture(rel: &str) -> PageTypeInfo {
    let (text, path) = capture(rel);
    PageTypeInfo::parse(&text, &path).unwrap_or_else(|e| panic!("{e}"))
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn host_capture() {
    let p = parse_capture("host-6.18/pagetypeinfo");
    assert_eq!(p.pageblock_order, 9);
    assert_eq!(p.pages_per_block, 512);
    assert_eq!(p.migratetypes, strings(&["Unmovable", "Movable", "Reclaimable", "HighAtomic", "Isolate"]));
    assert_eq!(p.nr_orders(), 11);
    assert_eq!(p.free.len(), 3 * 5);
    assert!(p.free.iter().all(|f| !f.is_capped()));
    assert_eq!(p.mixed, None);
    assert_eq!(p.zones().collect::<Vec<_>>(), vec![(0, "DMA"), (0, "DMA32"), (0, "Normal")]);

    let free = |zone, mt| p.free_blocks(0, zone, mt).unwrap_or_else(|| panic!("{zone} {mt}")).free.clone();
    assert_eq!(free("Normal", "Movable"), vec![13734, 8728, 3699, 1460, 677, 209, 65, 12, 7, 3, 0]);
    assert_eq!(free("Normal", "Unmovable"), vec![49, 240, 234, 105, 43, 41, 16, 11, 4, 0, 0]);
    assert_eq!(free("Normal", "Reclaimable"), vec![0, 0, 0, 2, 0, 1, 0, 1, 1, 0, 0]);
    assert_eq!(free("DMA", "Unmovable")[8], 1);
    assert_eq!(free("DMA32", "Movable")[10], 752);
    assert_eq!(free("DMA32", "HighAtomic"), vec![0; 11]);
    assert!(p.free_blocks(0, "Normal", "CMA").is_none());
    assert!(p.free_blocks(1, "Normal", "Movable").is_none());

    let normal_unmovable = p.free_blocks(0, "Normal", "Unmovable").unwrap();
    assert_eq!(
        normal_unmovable.free_pages(),
        49 + 240 * 2 + 234 * 4 + 105 * 8 + 43 * 16 + 41 * 32 + 16 * 64 + 11 * 128 + 4 * 256
    );

    assert_eq!(
        p.pageblocks(0, "Normal").unwrap(),
        vec![("Unmovable", 44), ("Movable", 642), ("Reclaimable", 18), ("HighAtomic", 0), ("Isolate", 0)]
    );
    assert_eq!(p.pageblock_count(0, "DMA32", "Movable"), Some(1528));
    assert_eq!(p.pageblock_count(0, "DMA", "Unmovable"), Some(1));
    assert_eq!(p.pageblock_count(0, "DMA", "CMA"), None);
    assert_eq!(p.mixed_pageblocks(0, "Normal"), None);

    // Against host-6.18/zoneinfo: DMA32's 1528 blocks are its present pages (782336) exactly. Normal's
    // 704 blocks are 360448 pages = its *managed* pages, not present/spanned (5505024): with
    // deferred_init=lazy the blocks whose struct pages are not initialised yet are not counted.
    let pages = |zone| p.pageblocks(0, zone).unwrap().iter().map(|(_, n)| n).sum::<u64>() * p.pages_per_block;
    assert_eq!(pages("DMA32"), 782_336);
    assert_eq!(pages("Normal"), 360_448);
}

/// Summed over migratetypes, the free table is buddyinfo — when both are read at one moment.
///
/// buddyinfo prints `free_area[order].nr_free`; pagetypeinfo walks each `free_list[migratetype]`
/// and drops `zone->lock` between orders, so on a busy machine the two drift apart. These host
/// captures were taken back to back on the idle VM and agree exactly, for every zone and order.
#[test]
fn host_capture_sums_to_buddyinfo() {
    let p = parse_capture("host-6.18/pagetypeinfo");
    let (text, path) = capture("host-6.18/buddyinfo");
    let b = BuddyInfo::parse(&text, &path).unwrap();
    assert_eq!(p.zones().count(), b.zones.len());
    for z in &b.zones {
        assert_eq!(p.zone_free_blocks(z.node, &z.zone).as_ref(), Some(&z.free), "{}", z.label());
    }
}

#[test]
fn two_node_captures() {
    // Two node sections, each with its own header; Reserve (before 4.4) and, on 4.0, CMA.
    let p = parse_capture("linux-mm-2016-09-28/pagetypeinfo-3.10");
    assert_eq!(p.migratetypes, strings(&["Unmovable", "Reclaimable", "Movable", "Reserve", "Isolate"]));
    assert_eq!(p.zones().collect::<Vec<_>>(), vec![(0, "DMA"), (0, "DMA32"), (0, "Normal"), (1, "Normal")]);
    assert_eq!(p.free.len(), 4 * 5);
    assert_eq!(
        p.free_blocks(1, "Normal", "Movable").unwrap().free,
        vec![1, 2919, 1131, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(p.free_blocks(0, "DMA32", "Reserve").unwrap().free[3], 17);
    assert_eq!(p.pageblocks(1, "Normal").unwrap()[2], ("Movable", 31465));
    assert_eq!(p.pageblock_count(0, "Normal", "Unmovable"), Some(1105));

    let p = parse_capture("linux-mm-2016-09-28/pagetypeinfo-4.0");
    assert_eq!(
        p.migratetypes,
        strings(&["Unmovable", "Reclaimable", "Movable", "Reserve", "CMA", "Isolate"])
    );
    assert_eq!(p.free.len(), 4 * 6);
    // Wider than the %6lu column, and exact: the 100000 cap came in v5.4.
    let unmovable = p.free_blocks(0, "Normal", "Unmovable").unwrap();
    assert_eq!(unmovable.free[..3], [115050, 40237, 3785]);
    assert!(!unmovable.is_capped());
    assert_eq!(p.free_blocks(1, "Normal", "Unmovable").unwrap().free[0], 58723);
    assert_eq!(
        p.pageblocks(1, "Normal").unwrap(),
        vec![
            ("Unmovable", 3903),
            ("Reclaimable", 3518),
            ("Movable", 25345),
            ("Reserve", 2),
            ("CMA", 0),
            ("Isolate", 0)
        ]
    );
    // The mail's buddyinfo was not read at the same moment, but its DMA zone did not move.
    let (text, path) = capture("linux-mm-2016-09-28/buddyinfo-4.0");
    let b = BuddyInfo::parse(&text, &path).unwrap();
    assert_eq!(p.zone_free_blocks(0, "DMA").unwrap(), b.zone(0, "DMA").unwrap().free);
    assert_ne!(p.zone_free_blocks(0, "DMA32").unwrap(), b.zone(0, "DMA32").unwrap().free);
}

#[test]
fn capped_counts_are_lower_bounds() {
    // The example row from the changelog of "mm, vmstat: reduce zone->lock holding time by
    // /proc/pagetypeinfo" (Michal Hocko, 2019), which introduced the cap.
    let row = "Node    6, zone   Normal, type      Movable >100000 >100000 >100000 >100000  41019  31560  23996  10054   3229    983    648";
    let f = parse_free_line(row).unwrap();
    assert_eq!((f.node, f.zone.as_str(), f.migratetype.as_str()), (6, "Normal", "Movable"));
    assert_eq!(f.free, vec![100000, 100000, 100000, 100000, 41019, 31560, 23996, 10054, 3229, 983, 648]);
    assert_eq!(f.capped, vec![0, 1, 2, 3]);
    assert!(f.is_capped());
    assert!(parse_free_line("Node 0, zone Normal, type Movable >x 1").is_err());
    assert!(parse_free_line("Node 0, zone Normal, type Movable").is_err());
}

/// Append a `Number of mixed blocks` table to `text`, printed with the kernel's format strings
/// (pagetypeinfo_showmixedcount). Synthetic: no capture with this table is at hand.
fn with_mixed_table(text: &str, names: &[&str], rows: &[(u32, &str, Vec<u64>)]) -> String {
    let mut out = text.to_string();
    out.push_str(&format!("\n{:<23}", "Number of mixed blocks "));
    for n in names {
        out.push_str(&format!("{n:>12} "));
    }
    out.push('\n');
    for (node, zone, counts) in rows {
        out.push_str(&format!("Node {node}, zone {zone:>8} "));
        for c in counts {
            out.push_str(&format!("{c:>12} "));
        }
        out.push('\n');
    }
    out
}

#[test]
fn mixed_blocks_table_is_optional() {
    let (text, path) = capture("host-6.18/pagetypeinfo");
    let names = ["Unmovable", "Movable", "Reclaimable", "HighAtomic", "Isolate"];
    let mixed = with_mixed_table(
        &text,
        &names,
        &[(0, "DMA", vec![0, 1, 0, 0, 0]), (0, "Normal", vec![3, 17, 2, 0, 0])],
    );
    let p = PageTypeInfo::parse(&mixed, &path).unwrap();
    assert_eq!(
        p.mixed_pageblocks(0, "Normal").unwrap(),
        vec![("Unmovable", 3), ("Movable", 17), ("Reclaimable", 2), ("HighAtomic", 0), ("Isolate", 0)]
    );
    assert_eq!(p.mixed.as_ref().unwrap().len(), 2);
    // Everything else is as without the table.
    let plain = PageTypeInfo::parse(&text, &path).unwrap();
    assert_eq!(PageTypeInfo { mixed: None, ..p }, plain);

    // The mixed table must use the same migratetypes as the block counts.
    let wrong = with_mixed_table(&text, &names[..4], &[(0, "DMA", vec![0, 1, 0, 0])]);
    let err = PageTypeInfo::parse(&wrong, "p").unwrap_err().to_string();
    assert!(err.starts_with(&format!("p:{}: ", text.lines().count() + 2)), "{err}");
}

fn parse_error_line(text: &str) -> usize {
    match PageTypeInfo::parse(text, "/c/p") {
        Err(Error::Parse { path, line, .. }) => {
            assert_eq!(path, Path::new("/c/p"));
            line
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn errors_name_file_and_line() {
    let (text, _) = capture("host-6.18/pagetypeinfo");
    let lines: Vec<&str> = text.lines().collect();
    let with_line = |k: usize, replacement: &str| {
        let mut l = lines.clone();
        l[k] = replacement;
        l.join("\n") + "\n"
    };
    // Line numbers are 1-based; index k is line k + 1.
    assert_eq!(parse_error_line(&with_line(1, "Pages per block:  1024")), 2);
    assert_eq!(parse_error_line(&with_line(3, "Free pages count per migrate type at order 0 1 2 4")), 4);
    // One order column short.
    assert_eq!(parse_error_line(&with_line(5, "Node 0, zone DMA, type Movable 0 0 0 0 0 0 0 0 0 1")), 6);
    // A count that is not a number.
    assert_eq!(
        parse_error_line(&with_line(16, "Node 0, zone Normal, type Movable 1 2 3 4 5 6 7 8 9 10 x")),
        17
    );
    // A migratetype the block header does not list is reported on its own row.
    assert_eq!(parse_error_line(&with_line(8, "Node 0, zone DMA, type CMA 0 0 0 0 0 0 0 0 0 0 0")), 9);
    // A row of another node inside node 0's section.
    assert_eq!(parse_error_line(&with_line(22, "Node 1, zone Normal 44 642 18 0 0")), 23);
    // Block counts with a missing migratetype column.
    assert_eq!(parse_error_line(&with_line(21, "Node 0, zone DMA32 0 1528 0 0")), 22);
    // Truncated before the block counts: the error points at the last line.
    let truncated = lines[..18].join("\n") + "\n";
    assert_eq!(parse_error_line(&truncated), 18);
    assert_eq!(parse_error_line(""), 1);
    assert_eq!(parse_error_line("\n\n"), 2);
    let err = PageTypeInfo::parse("Page block order: nine\n", "/c/p").unwrap_err();
    assert!(err.to_string().starts_with("/c/p:1: "), "{err}");
}

/// As root the live file parses; its shape matches the live buddyinfo.
#[test]
fn live_pagetypeinfo() {
    let p = match PageTypeInfo::read() {
        Ok(p) => p,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied => {
            return common::skip("/proc/pagetypeinfo is root-only (mode 0400) and this test is not root");
        }
        Err(e) => panic!("{e}"),
    };
    let b = BuddyInfo::read().unwrap();
    // x86_64 pageblocks are PMD-sized (2 MiB = order 9) whenever hugetlb is configured, as here.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(p.pageblock_order, 9);
    assert_eq!(p.pages_per_block, 1 << p.pageblock_order);
    assert_eq!(p.nr_orders(), b.nr_orders());
    for mt in ["Unmovable", "Movable", "Reclaimable"] {
        assert!(p.migratetypes.iter().any(|m| m == mt), "{mt} missing from {:?}", p.migratetypes);
    }
    let zones: Vec<(u32, &str)> = b.zones.iter().map(|z| (z.node, z.zone.as_str())).collect();
    assert_eq!(p.zones().collect::<Vec<_>>(), zones);
    for (node, zone) in zones {
        for mt in &p.migratetypes {
            assert!(p.free_blocks(node, zone, mt).is_some(), "no free row for node {node} {zone} {mt}");
        }
    }
    println!("pageblock order {}, migratetypes {:?}", p.pageblock_order, p.migratetypes);
}

// ---- property tests -------------------------------------------------------------------------------

const CAPTURES: &[&str] = &[
    "host-6.18/pagetypeinfo",
    "linux-mm-2016-09-28/pagetypeinfo-3.10",
    "linux-mm-2016-09-28/pagetypeinfo-4.0",
];

#[derive(Clone, Debug)]
enum Mutation {
    Truncate { line: usize, at: usize },
    DropLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    DropToken { line: usize, token: usize },
    AddToken { line: usize, token: usize, text: String },
    ReplaceToken { line: usize, token: usize, text: String },
}

fn garbage() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,25}",
        Just(u64::MAX.to_string()),
        Just("-1".to_string()),
        "[a-zA-Z,>.:-]{1,6}",
        ">[0-9]{1,7}",
        Just(">".to_string()),
        "\\PC{0,4}",
        Just(String::new()),
        Just("Node".to_string()),
        Just("type".to_string()),
        Just("CMA".to_string()),
        Just("Page block order: 10".to_string()),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let i = 0..1000usize;
    prop_oneof![
        (i.clone(), 0..200usize).prop_map(|(line, at)| Mutation::Truncate { line, at }),
        i.clone().prop_map(Mutation::DropLine),
        i.clone().prop_map(Mutation::DuplicateLine),
        (i.clone(), i.clone()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (i.clone(), i.clone()).prop_map(|(line, token)| Mutation::DropToken { line, token }),
        (i.clone(), i.clone(), garbage()).prop_map(|(line, token, text)| Mutation::AddToken {
            line,
            token,
            text
        }),
        (i.clone(), i, garbage()).prop_map(|(line, token, text)| Mutation::ReplaceToken {
            line,
            token,
            text
        }),
    ]
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for m in mutations {
        if lines.is_empty() {
            break;
        }
        let n = lines.len();
        let edit_tokens = |line: &mut String, f: &dyn Fn(&mut Vec<String>)| {
            let mut tokens: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            f(&mut tokens);
            *line = tokens.join(" ");
        };
        match m {
            Mutation::Truncate { line, at } => {
                let l = &mut lines[line % n];
                let cut = l.char_indices().map(|(i, _)| i).nth(*at).unwrap_or(l.len());
                l.truncate(cut);
            }
            Mutation::DropLine(line) => {
                lines.remove(line % n);
            }
            Mutation::DuplicateLine(line) => {
                let l = lines[line % n].clone();
                lines.insert(line % n, l);
            }
            Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
            Mutation::DropToken { line, token } => edit_tokens(&mut lines[line % n], &|t| {
                if !t.is_empty() {
                    let k = token % t.len();
                    t.remove(k);
                }
            }),
            Mutation::AddToken { line, token, text } => edit_tokens(&mut lines[line % n], &|t| {
                let k = token % (t.len() + 1);
                t.insert(k, text.clone());
            }),
            Mutation::ReplaceToken { line, token, text } => edit_tokens(&mut lines[line % n], &|t| {
                if !t.is_empty() {
                    let k = token % t.len();
                    t[k] = text.clone();
                }
            }),
        }
    }
    lines.join("\n") + "\n"
}

/// Parsing never panics; a failure is a parse error naming `path` and a line that exists in `text`;
/// a success is internally consistent and its helpers do not panic either.
fn check(text: &str, path: &str) -> std::result::Result<(), TestCaseError> {
    match PageTypeInfo::parse(text, path) {
        Ok(p) => {
            prop_assert_eq!(p.pages_per_block, 1u64 << p.pageblock_order);
            let orders = p.nr_orders();
            prop_assert!(p.free.iter().all(|f| f.free.len() == orders));
            let types = p.migratetypes.len();
            prop_assert!(p.blocks.iter().chain(p.mixed.iter().flatten()).all(|b| b.blocks.len() == types));
            for f in &p.free {
                let _ = f.free_pages();
                let _ = p.zone_free_blocks(f.node, &f.zone);
            }
            for (node, zone) in p.zones() {
                let _ = p.pageblocks(node, zone);
                let _ = p.mixed_pageblocks(node, zone);
            }
        }
        Err(Error::Parse { path: p, line, .. }) => {
            prop_assert_eq!(p.as_path(), Path::new(path));
            let lines = text.lines().count().max(1);
            prop_assert!((1..=lines).contains(&line), "line {} of {}", line, lines);
        }
        Err(other) => prop_assert!(false, "not a parse error: {}", other),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC*(\n\\PC*){0,6}") {
        check(&text, "arbitrary")?;
    }

    #[test]
    fn pagetypeinfo_shaped_text_never_panics(
        lines in prop::collection::vec(
            prop::collection::vec(
                prop_oneof![
                    Just("Page block order:"), Just("Pages per block:"), Just("9"), Just("512"), Just("64"),
                    Just("Free pages count per migrate type at order"), Just("0"), Just("1"),
                    Just("Number of blocks type"), Just("Number of mixed blocks"), Just("Movable"), Just("CMA"),
                    Just("Node"), Just("0,"), Just("zone"), Just("Normal,"), Just("Normal"), Just("type"),
                    Just(">100000"), Just("18446744073709551616"), Just(","),
                ],
                0..14),
            0..12),
    ) {
        let text: String = lines.iter().map(|l| l.join(" ") + "\n").collect();
        check(&text, "shaped")?;
    }

    #[test]
    fn mutated_captures_never_panic(
        which in 0..CAPTURES.len(),
        mutations in prop::collection::vec(mutation(), 1..5),
    ) {
        let (text, path) = capture(CAPTURES[which]);
        check(&mutate(&text, &mutations), &path)?;
    }
}
