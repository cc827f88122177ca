//! slabinfo on the real capture, the live system (root) and fuzzed input.

mod common;
use common::assert_names_line;
use fraglab_probe::slabinfo::{self, SlabCache, SlabInfo};
use fraglab_probe::Error;
use proptest::prelude::*;

const SLABINFO: &str = include_str!("captures/host-6.18/slabinfo");
const SLABINFO_PATH: &str = "tests/captures/host-6.18/slabinfo";

fn cache(name: &str, v: [u64; 7]) -> SlabCache {
    SlabCache {
        name: name.into(),
        active_objs: v[0],
        num_objs: v[1],
        objsize: v[2],
        objperslab: v[3],
        pagesperslab: v[4],
        active_slabs: v[5],
        num_slabs: v[6],
    }
}

#[test]
fn capture_caches() {
    let s = SlabInfo::parse(SLABINFO, SLABINFO_PATH).unwrap();
    assert_eq!(s.caches.len(), 235);
    assert_eq!(s.caches[0], cache("btrfs_delayed_node", [0, 0, 312, 13, 1, 0, 0]));
    assert_eq!(s.caches.last().unwrap(), &cache("kmem_cache", [256, 256, 256, 16, 1, 16, 16]));
    assert_eq!(s.cache("kmalloc-4k"), Some(&cache("kmalloc-4k", [251, 376, 4096, 8, 8, 47, 47])));
    assert_eq!(s.cache("kmalloc-8"), Some(&cache("kmalloc-8", [1536, 1536, 8, 512, 1, 3, 3])));
    assert_eq!(s.cache("TCP"), Some(&cache("TCP", [26, 26, 2368, 13, 8, 2, 2])));
    assert_eq!(s.cache("task_struct"), Some(&cache("task_struct", [101, 110, 5824, 5, 8, 22, 22])));
    assert_eq!(
        s.cache("ext4_inode_cache"),
        Some(&cache("ext4_inode_cache", [10206, 10206, 1128, 14, 4, 729, 729]))
    );
    assert_eq!(s.caches.iter().filter(|c| c.name.starts_with("kmalloc-")).count(), 39);

    let k4 = s.cache("kmalloc-4k").unwrap();
    assert_eq!(k4.bytes(4096), 47 * 8 * 4096);
    assert_eq!(k4.slab_order(), Some(3));
    assert_eq!(s.cache("ext4_inode_cache").unwrap().slab_order(), Some(2));
    // Sum over all caches (awk over the capture: 49000 KiB). meminfo's Slab at the same moment was
    // 55576 kB; they are not expected to agree: this assumes every slab has pagesperslab pages,
    // meminfo counts the pages actually charged (probably including large kmallocs that bypass the
    // caches). Not investigated further.
    assert_eq!(s.total_bytes(4096), 49000 * 1024);
    // SLUB: every slab counts as active.
    assert!(s.caches.iter().all(|c| c.active_slabs == c.num_slabs && c.active_objs <= c.num_objs));
}

#[test]
fn rejects_other_versions() {
    for version in ["2.0", "2.1 (statistics)", "3.0", ""] {
        let text = SLABINFO.replacen("version: 2.1", &format!("version: {version}"), 1);
        let err = SlabInfo::parse(&text, "s").unwrap_err();
        assert_names_line(&err, "s", &text);
        assert!(matches!(err, Error::Parse { line: 1, .. }), "{err}");
        assert!(err.to_string().contains("not supported"), "{err}");
    }
    let headless: String = SLABINFO.lines().skip(1).collect::<Vec<_>>().join("\n");
    let err = SlabInfo::parse(&headless, "s").unwrap_err();
    assert!(matches!(err, Error::Parse { line: 1, .. }) && err.to_string().contains("header"), "{err}");
    let err = SlabInfo::parse("", "s").unwrap_err();
    assert!(matches!(err, Error::Parse { line: 1, .. }), "{err}");
}

#[test]
fn parse_errors_name_the_line() {
    let good = "kmalloc-64          1767   1856     64   64    1 : tunables    0    0    0 : slabdata     29     29      0";
    assert!(SLABINFO.contains(good));
    for (bad, needle) in [
        ("kmalloc-64 1767 1856 64 64 x : tunables 0 0 0 : slabdata 29 29 0", "pagesperslab"),
        ("kmalloc-64 1767 1856 64 64 1 : tunables 0 0 : slabdata 29 29 0", "slabdata"),
        ("kmalloc-64 1767 1856 64 64 1 : tunables 0 0 0 : slabdata 29 29 0 7", "slabdata"),
        ("kmalloc-64 1767 1856 64 64 1", "tunables"),
        ("1767 1856 64 64 1 : tunables 0 0 0 : slabdata 29 29 0", "name and 5 numbers"),
        ("kmalloc-64 1767 1856 64 64 1 : tunables 0 0 z : slabdata 29 29 0", "sharedfactor"),
        ("kmalloc-64 1767 1856 64 64 1 : tunables 0 0 0 : slabdata 29 -29 0", "num_slabs"),
    ] {
        let text = SLABINFO.replacen(good, bad, 1);
        let line = SLABINFO.lines().position(|l| l == good).unwrap() + 1;
        let err = SlabInfo::parse(&text, "s").unwrap_err();
        assert_names_line(&err, "s", &text);
        assert!(matches!(err, Error::Parse { line: l, .. } if l == line), "{err}");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
}

#[test]
fn name_with_a_blank() {
    let c = slabinfo::parse_line("my cache  1 2 3 4 1 : tunables 0 0 0 : slabdata 5 6 0").unwrap();
    assert_eq!(c, cache("my cache", [1, 2, 3, 4, 1, 5, 6]));
}

#[test]
fn live_slabinfo() {
    let s = match SlabInfo::read() {
        Ok(s) => s,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied => {
            return common::skip("/proc/slabinfo needs root");
        }
        Err(e) => panic!("{e}"),
    };
    let kmalloc: Vec<_> = s.caches.iter().filter(|c| c.name.starts_with("kmalloc-")).collect();
    assert!(kmalloc.len() >= 10, "{} kmalloc caches", kmalloc.len());
    assert!(s.cache("kmalloc-64").is_some());
    for c in &s.caches {
        assert!(c.active_objs <= c.num_objs, "{c:?}");
        assert!(c.active_slabs <= c.num_slabs, "{c:?}");
        assert!(c.pagesperslab >= 1 && c.objsize > 0, "{c:?}");
    }
    assert!(s.total_bytes(procfs::page_size()) > 0);
}

/// Up to 8 line- and character-level edits of `base`.
fn mutated(base: &'static str) -> impl Strategy<Value = String> {
    let edit = (any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0u8..7, any::<char>());
    prop::collection::vec(edit, 1..8).prop_map(move |edits| {
        let mut lines: Vec<Vec<char>> = base.lines().map(|l| l.chars().collect()).collect();
        for (li, ci, kind, ch) in edits {
            if lines.is_empty() {
                lines.push(Vec::new());
            }
            let l = li.index(lines.len());
            let c = ci.index(lines[l].len() + 1);
            match kind {
                0 => drop(lines.remove(l)),
                1 => lines.insert(l, lines[l].clone()),
                2 => lines[l].insert(c, ch),
                3 if c < lines[l].len() => lines[l][c] = ch,
                4 if c < lines[l].len() => drop(lines[l].remove(c)),
                5 => lines[l].splice(c..c, "99999999999999999999".chars()).for_each(drop),
                6 => lines[l].splice(c..c, " : ".chars()).for_each(drop),
                _ => {}
            }
        }
        lines.iter().map(|l| l.iter().collect::<String>()).collect::<Vec<_>>().join("\n")
    })
}

proptest! {
    #[test]
    fn arbitrary_input_never_panics(text in "\\PC*(\n\\PC*){0,5}") {
        if let Err(e) = SlabInfo::parse(&text, "arb") { assert_names_line(&e, "arb", &text) }
    }

    #[test]
    fn token_input_never_panics(body in prop::collection::vec(prop::collection::vec(
        prop_oneof![Just(":"), Just("tunables"), Just("slabdata"), Just("0"), Just("7"), Just("kmalloc-8"),
                    Just("18446744073709551615"), Just("#")], 0..16), 0..10)) {
        let text = format!("slabinfo - version: 2.1\n{}",
            body.iter().map(|l| l.join(" ")).collect::<Vec<_>>().join("\n"));
        if let Err(e) = SlabInfo::parse(&text, "tok") { assert_names_line(&e, "tok", &text) }
    }

    #[test]
    fn mutated_capture_never_panics(text in mutated(SLABINFO)) {
        if let Err(e) = SlabInfo::parse(&text, "mut") { assert_names_line(&e, "mut", &text) }
    }
}
