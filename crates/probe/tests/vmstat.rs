//! vmstat counters on the real capture, the live system and fuzzed input.

mod common;
use common::{assert_names_line, mutated};
use fraglab_probe::vmstat::{self, VmCounters};
use fraglab_probe::Error;
use proptest::prelude::*;

const VMSTAT: &str = include_str!("captures/host-6.18/vmstat");
const VMSTAT_PATH: &str = "tests/captures/host-6.18/vmstat";

#[test]
fn capture_counters() {
    let v = VmCounters::parse(VMSTAT, VMSTAT_PATH).unwrap();
    assert_eq!(v.get("nr_free_pages"), Some(868978));
    // An idle, freshly booted VM: nothing has compacted, migrated or stalled yet.
    let zero = [
        "allocstall_dma",
        "allocstall_dma32",
        "allocstall_normal",
        "allocstall_movable",
        "allocstall_device",
        "oom_kill",
        "pgmigrate_success",
        "pgmigrate_fail",
        "compact_migrate_scanned",
        "compact_free_scanned",
        "compact_isolated",
        "compact_stall",
        "compact_fail",
        "compact_success",
        "compact_daemon_wake",
        "htlb_buddy_alloc_success",
        "htlb_buddy_alloc_fail",
        "thp_fault_alloc",
        "thp_fault_fallback",
    ];
    for name in zero {
        assert_eq!(v.get(name), Some(0), "{name}");
    }
    assert_eq!(v.values.len(), zero.len() + 1, "{:?}", v.values.keys());
    // Config-dependent names this kernel does not print are absent, not 0.
    assert_eq!(v.get("allocstall"), None);
    assert_eq!(v.get("allocstall_highmem"), None);
    // Untracked lines are dropped, even near-namesakes.
    assert_eq!(v.get("compact_daemon_migrate_scanned"), None);
    assert_eq!(v.get("thp_fault_fallback_charge"), None);
    assert_eq!(v.get("nr_free_pages_blocks"), None);
}

#[test]
fn from_procfs_vmstat_agrees() {
    let stat = <procfs::VmStat as procfs::FromRead>::from_read(VMSTAT.as_bytes()).unwrap();
    assert_eq!(VmCounters::from_vmstat(&stat), VmCounters::parse(VMSTAT, VMSTAT_PATH).unwrap());
}

#[test]
fn tracked_names() {
    for name in vmstat::COUNTERS {
        assert!(vmstat::is_counter(name) && !vmstat::is_gauge(name), "{name}");
    }
    assert!(vmstat::is_counter("allocstall_somefuturezone"));
    assert!(vmstat::is_gauge("nr_free_pages") && !vmstat::is_counter("nr_free_pages"));
    assert!(!vmstat::is_counter("nr_free_pages_blocks"));
}

#[test]
fn delta_skips_gauges_and_saturates() {
    let earlier = VmCounters::parse(VMSTAT, "a").unwrap();
    let later_text = VMSTAT
        .replace("compact_stall 0", "compact_stall 5")
        .replace("allocstall_normal 0", "allocstall_normal 2")
        .replace("nr_free_pages 868978", "nr_free_pages 1000");
    let later = VmCounters::parse(&later_text, "b").unwrap();
    let d = later.delta(&earlier);
    assert_eq!(d.get("compact_stall"), Some(5));
    assert_eq!(d.get("allocstall_normal"), Some(2));
    assert_eq!(d.get("compact_fail"), Some(0));
    assert_eq!(d.get("nr_free_pages"), None);
    assert_eq!(d.values.len(), earlier.values.len() - 1);
    // Swapped samples (or a reboot in between) do not wrap around.
    assert_eq!(earlier.delta(&later).get("compact_stall"), Some(0));
    // A counter missing from one sample is missing from the delta.
    let fewer = VmCounters::parse("compact_stall 1\n", "c").unwrap();
    assert_eq!(later.delta(&fewer).values.keys().collect::<Vec<_>>(), ["compact_stall"]);
}

#[test]
fn parse_errors_name_the_line() {
    for (bad, needle) in [
        ("compact_stall x", "not an unsigned"),
        ("compact_stall -1", "not an unsigned"),
        ("compact_stall", "no value"),
        ("compact_stall 1 2", "unexpected"),
        ("compact_stall 99999999999999999999", "not an unsigned"),
        ("nr_free_pages 1", "second time"),
    ] {
        let text = VMSTAT.replacen("nr_zone_active_anon 376", bad, 1);
        let err = VmCounters::parse(&text, "v").unwrap_err();
        assert_names_line(&err, "v", &text);
        assert!(matches!(err, Error::Parse { line: 4, .. }), "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    }
    // Blank lines are allowed and still counted, so line numbers match an editor's.
    let text = format!("\n\n{VMSTAT}").replacen("nr_zone_active_anon 376", "junk", 1);
    assert!(matches!(VmCounters::parse(&text, "v").unwrap_err(), Error::Parse { line: 6, .. }));
    assert_eq!(VmCounters::parse("", "v").unwrap(), VmCounters::default());
}

#[test]
fn live_counters_are_monotonic() {
    let first = VmCounters::read().unwrap();
    // Touch some memory between the samples so counters have a reason to move.
    let mut v = vec![0u8; 64 << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = i as u8;
    }
    std::hint::black_box(&v);
    drop(v);
    let second = VmCounters::read().unwrap();

    assert!(second.get("nr_free_pages").is_some_and(|n| n > 0));
    for (name, then) in first.counters() {
        let now = second.get(name).unwrap_or_else(|| panic!("{name} vanished between samples"));
        assert!(now >= then, "{name} went from {then} to {now}");
    }
    assert_eq!(first.values.keys().collect::<Vec<_>>(), second.values.keys().collect::<Vec<_>>());
    for name in first.values.keys() {
        assert!(vmstat::is_counter(name) || vmstat::is_gauge(name), "{name}");
    }
    // The live kernel is the one the capture came from: same tracked names.
    let capture = VmCounters::parse(VMSTAT, VMSTAT_PATH).unwrap();
    assert_eq!(first.values.keys().collect::<Vec<_>>(), capture.values.keys().collect::<Vec<_>>());
}

proptest! {
    #[test]
    fn arbitrary_input_never_panics(text in "\\PC*(\n\\PC*){0,5}") {
        if let Err(e) = VmCounters::parse(&text, "arb") { assert_names_line(&e, "arb", &text) }
    }

    #[test]
    fn token_input_never_panics(lines in prop::collection::vec(
        ("compact_stall|nr_free_pages|allocstall_x|\\PC{0,6}", "[0-9]{1,21}|-1|\\PC{0,3}", "|[ \t]+[0-9]?"), 0..20)) {
        let text: String = lines.iter().map(|(n, v, t)| format!("{n} {v}{t}\n")).collect();
        if let Err(e) = VmCounters::parse(&text, "tok") { assert_names_line(&e, "tok", &text) }
    }

    #[test]
    fn mutated_capture_never_panics(text in mutated(VMSTAT)) {
        match VmCounters::parse(&text, "mut") {
            Ok(v) => for name in v.values.keys() {
                prop_assert!(vmstat::is_counter(name) || vmstat::is_gauge(name));
            },
            Err(e) => assert_names_line(&e, "mut", &text),
        }
    }
}
