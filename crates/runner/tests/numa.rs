//! NUMA nodes and zones (issue 19), in guests with two nodes (`fraglab vm --numa 2`): a budget bound
//! to a node is built there while the other node keeps its free blocks; the whole machine is shaped on
//! every node; a whole machine's saved buddyinfo is one target, in a guest shaped from it
//! (`--numa-from`); a lower zone's profile is refused in a budget and reproduced whole-machine, its
//! line exactly. Three boots, one at a time (TCG guests on a 2-core machine slow each other down);
//! the budgets, nodes and guest sizes differ between the steps so no figure lines up by chance.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use fraglab_probe::buddyinfo::BuddyInfo;

mod common;
use common::{fraglab_in, guest_status, FRAGLAB, STATUS_SH};

static SERIAL: Mutex<()> = Mutex::new(());

/// Free memory at or above the target order that a held target tolerates per zone: processes that
/// run and exit after the fragmenter (the script's own `cat`s) give back pages whose buddies are
/// free; the keeper takes such blocks back within ~10 ms, but a read can fall in between (vm.rs
/// measured 0.4–4.7 MiB in a 1 GiB guest).
const TOLERANCE_PAGES: u64 = 1024;

/// `fraglab vm` on Debian's cloud kernel, its output printed for the test log.
fn vm(args: &[&str]) -> Output {
    let two_nodes = ["vm", "--kernel", "debian-cloud", "--timeout", "400s"];
    let carried = ["--extra-bin", "cat", "--extra-bin", "sleep"];
    fraglab_in(&std::env::temp_dir(), &[&two_nodes[..], &carried, args].concat())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-numa-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name} did not come back: {e}"))
}

fn buddy(dir: &Path, name: &str) -> BuddyInfo {
    BuddyInfo::parse(&read(dir, name), name).unwrap()
}

/// Free pages in blocks of order ≥ `k` in one zone.
fn at_or_above(b: &BuddyInfo, node: u32, zone: &str, k: usize) -> u64 {
    b.zone(node, zone).map_or(0, |z| z.free_pages_at_or_above(k))
}

fn numbers(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect()
}

fn bounds(status: &serde_json::Value) -> String {
    status["bounds"].as_array().unwrap().iter().map(|b| b.as_str().unwrap()).collect::<Vec<_>>().join("\n")
}

/// A whole-machine profile's fidelity in a status answer agrees with the status itself: one entry
/// per target zone, the profile as cut (planned + missing) for target, the zone's line of this
/// refresh's buddyinfo for achieved, ± 10 % and 16 blocks, within exactly when every order is.
/// Returns it, printed, for what a test measures beyond that.
fn fidelity_agrees(status: &serde_json::Value, at: &str) -> serde_json::Value {
    let f = status["fidelity"].clone();
    eprintln!("{at}: fidelity when the hold began {}; now {f}", status["fidelity_at_hold"]);
    assert_eq!(f["measure"], "buddyinfo", "{at}: {f}");
    assert_eq!(status["fidelity_at_hold"]["measure"], "buddyinfo", "{at}: {status}");
    let orders = f["orders"].as_u64().unwrap() as usize;
    let now: BuddyInfo = serde_json::from_value(status["buddyinfo_now"].clone()).unwrap();
    let cuts = status["zones"].as_array().unwrap();
    let zones = f["zones"].as_array().unwrap();
    assert_eq!(zones.len(), cuts.len(), "{at}: {f}");
    let mut all = true;
    for (z, cut) in zones.iter().zip(cuts) {
        assert_eq!(z["zone"], cut["zone"], "{at}: {f}");
        let asked: Vec<u64> =
            numbers(&cut["planned"]).iter().zip(numbers(&cut["missing"])).map(|(p, m)| p + m).collect();
        assert_eq!(numbers(&z["target"]), asked[..orders], "{at}: {f}");
        let line = now.zones.iter().find(|l| l.label() == z["zone"].as_str().unwrap()).unwrap();
        assert_eq!(numbers(&z["achieved"]), line.free[..orders], "{at}: {f}");
        let within = numbers(&z["target"])
            .iter()
            .zip(numbers(&z["achieved"]))
            .all(|(&t, a)| a.abs_diff(t) <= t / 10 + 16);
        assert_eq!(z["within"], within, "{at}: {f}");
        all &= within;
    }
    assert_eq!(f["within"], all, "{at}: {f}");
    f
}

/// At least `percent` of the planned blocks of each order are still free (give or take 3 blocks,
/// for orders with few), and half of order 0's (order-0 allocations are served from the smallest
/// blocks: docs/fragmenter.md, known limits).
fn mostly_intact(zone: &serde_json::Value, at: &str, percent: u64) {
    mostly_intact_above_order_0(zone, at, percent);
    let (planned, intact) = (numbers(&zone["planned"]), numbers(&zone["intact"]));
    assert!(intact[0] * 2 >= planned[0], "{at}: order 0: {zone}");
}

/// [`mostly_intact`] for orders 1 and up only.
fn mostly_intact_above_order_0(zone: &serde_json::Value, at: &str, percent: u64) {
    let (planned, intact) = (numbers(&zone["planned"]), numbers(&zone["intact"]));
    for (o, (p, i)) in planned.iter().zip(&intact).enumerate().skip(1) {
        assert!((i + 3) * 100 >= p * percent, "{at}: order {o}: {i} of {p} planned blocks intact: {zone}");
    }
}

#[test]
fn node_bound_budgets_a_placed_run_and_the_whole_machine_in_a_two_node_guest() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("two-node");
    let script = dir.join("numa.sh");
    std::fs::write(
        &script,
        format!("{STATUS_SH}set -e\n\
         cat /proc/buddyinfo > b0\n\
         fraglab fragment --profile 'Node 1, zone DMA32 2000 300 150 80 40 16 8 0 0 0 0' --budget 120MiB --daemon > n1.out 2>&1\n\
         cat /proc/buddyinfo > b1\n\
         status n1\n\
         fraglab release > /dev/null\n\
         cat /proc/buddyinfo > b2\n\
         fraglab fragment --max-free-order 3 --node 0 --budget 150MiB --daemon > n0.out 2>&1\n\
         cat /proc/buddyinfo > b3\n\
         status n0\n\
         fraglab release > /dev/null\n\
         fraglab fragment --max-free-order 4 --daemon > whole.out 2>&1\n\
         sleep 1\n\
         cat /proc/buddyinfo > b4\n\
         status whole\n\
         fraglab release > /dev/null\n\
         fraglab run /results/node1.toml -o runs > run.out 2>&1 || echo \"run exit $?\" >> run.out\n\
         fraglab compare runs/node1-* runs/node1-* > compare.txt\n\
         echo script done\n"),
    )
    .unwrap();
    // A run placed on node 1 by its config: the run summary and compare show the zone apart.
    let config = dir.join("node1.toml");
    std::fs::write(
        &config,
        "[run]\nname = \"node1\"\n\n[fragment]\nprofile = \"Node 1, zone DMA32 600 120 60 30 12 0 0 0 0 0 0\"\n\
         budget = \"48MiB\"\n\n[[workload]]\nkind = \"trigger\"\ntrigger = \"pipe-resize\"\nbytes = \"1MiB\"\n\
         repeat = 2\n",
    )
    .unwrap();
    let results = dir.join("results");
    let out = vm(&[
        "--numa",
        "2",
        "--file",
        &format!("{}:node1.toml", config.display()),
        "--mem",
        "1G",
        "--script",
        script.to_str().unwrap(),
        "--results",
        results.to_str().unwrap(),
    ]);
    for f in ["n1.out", "n0.out", "run.out", "compare.txt", "whole.out"] {
        if let Ok(t) = std::fs::read_to_string(results.join(f)) {
            eprintln!("--- {f}:\n{t}");
        }
    }
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("script done"));
    // Node 0 of a 1 GiB two-node guest holds DMA and DMA32 (0–512 MiB), node 1 DMA32 only.
    let b0 = buddy(&results, "b0");
    assert!(b0.zone(1, "DMA32").is_some() && b0.zone(1, "Normal").is_none(), "{b0:?}");

    // A Node 1 profile in a budget: every page on node 1, the profile there, node 0 untouched.
    let n1 = guest_status(&results, "n1");
    assert!(
        bounds(&n1).contains("bind: all ") && bounds(&n1).contains(" pages on node 1"),
        "{}",
        bounds(&n1)
    );
    let z = &n1["zones"][0];
    assert_eq!(z["zone"], "Node 1, zone DMA32");
    assert_eq!(numbers(&z["planned"])[..7], [2000, 300, 150, 80, 40, 16, 8], "unscaled: {z}");
    mostly_intact(z, "node 1 profile", 90);
    let b1 = buddy(&results, "b1");
    let big = |b: &BuddyInfo, n| at_or_above(b, n, "DMA32", 9);
    let held = |s: &serde_json::Value| s["held_bytes"].as_u64().unwrap() / 4096;
    // The cut's regions (kept and freed pages) came out of large blocks. Had the bind failed, most of
    // them would have come out of the other node's; less than half is that node's own churn: the
    // pcp drain the hold's sysctl causes, and the kernel's allocations for the daemon on the CPU's
    // node broke an order 10 and an order 9 of node 0 in CI (1536 pages, with 2685 held of 8192).
    let regions = |s: &serde_json::Value| held(s) + s["freed_bytes"].as_u64().unwrap() / 4096;
    assert!(regions(&n1) > 4000, "{n1}");
    assert!(big(&b1, 0) + regions(&n1) / 2 >= big(&b0, 0), "node 0 kept its blocks: {b0:?} → {b1:?}");
    // What the hold keeps (the profile's regions; the rest of the budget went back) came out of node
    // 1's large blocks.
    assert!(held(&n1) > 1000, "{}", n1["held_bytes"]);
    assert!(big(&b1, 1) + held(&n1) * 9 / 10 <= big(&b0, 1), "node 1 gave the memory: {b0:?} → {b1:?}");
    let line = b1.zone(1, "DMA32").unwrap();
    for (o, &n) in [2000u64, 300, 150, 80, 40, 16, 8].iter().enumerate().skip(1) {
        assert!(line.free[o] * 10 >= n * 9, "node 1's buddyinfo line at order {o}: {:?}", line.free);
    }

    // The other way round, another target and budget: node 1 keeps its blocks.
    let n0 = guest_status(&results, "n0");
    assert!(bounds(&n0).contains(" pages on node 0"), "{}", bounds(&n0));
    let (b2, b3) = (buddy(&results, "b2"), buddy(&results, "b3"));
    assert!(regions(&n0) > 4000, "{n0}");
    assert!(big(&b3, 1) + regions(&n0) / 2 >= big(&b2, 1), "node 1 kept its blocks: {b2:?} → {b3:?}");
    assert!(big(&b3, 0) + held(&n0) * 9 / 10 <= big(&b2, 0), "node 0 gave the memory: {b2:?} → {b3:?}");
    assert!(numbers(&n0["planned"])[..3].iter().all(|&n| n > 4000), "{}", n0["planned"]);

    // The run's summary and compare name the zone, with its own planned and intact blocks.
    let run = read(&results, "run.out");
    assert!(run.contains("profile of Node 1, zone DMA32: free blocks per order 600 120 60 30 12"), "{run}");
    assert!(run.contains("  Node 1, zone DMA32: planned 600 120 60 30 12 | intact "), "{run}");
    let compare = read(&results, "compare.txt");
    assert!(compare.contains("Node 1, zone DMA32: planned 600 120 60 30 12 | intact "), "{compare}");

    // The whole machine, max free order 4: no free block of order ≥ 4 on either node.
    let whole = guest_status(&results, "whole");
    assert_eq!(whole["leftover_pages"], 0, "{}", bounds(&whole));
    let b4 = buddy(&results, "b4");
    for n in [0, 1] {
        assert!(at_or_above(&b4, n, "DMA32", 4) <= TOLERANCE_PAGES, "node {n}: {b4:?}");
        assert!(b4.zone(n, "DMA32").unwrap().free_pages() > 10_000, "node {n} has small blocks free: {b4:?}");
    }

    std::fs::remove_dir_all(&dir).unwrap();
}

/// A saved two-node buddyinfo (a guest's, held at max free order 4) as one target, in a guest shaped
/// from it (`--numa-from`): a node each, sized so that every line is built unscaled. Each DMA32 line
/// in its own node (DMA skipped), and nothing of order ≥ 4 on either: the reserve's blocks traded
/// and re-broken.
#[test]
fn a_saved_two_node_buddyinfo_is_one_target_in_a_guest_shaped_from_it() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("file");
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/captures/numa2-guest-held-max-free-order-4.buddyinfo");
    let script = dir.join("file.sh");
    std::fs::write(
        &script,
        format!(
            "{STATUS_SH}set -e\n\
         fraglab fragment --profile-file /results/held.buddyinfo --daemon > file.out 2>&1\n\
         sleep 1\n\
         cat /proc/buddyinfo > b5\n\
         status file\n\
         fraglab release > /dev/null\n\
         echo script done\n"
        ),
    )
    .unwrap();
    let results = dir.join("results");
    let out = vm(&[
        "--numa-from",
        file.to_str().unwrap(),
        "--file",
        &format!("{}:held.buddyinfo", file.display()),
        "--script",
        script.to_str().unwrap(),
        "--results",
        results.to_str().unwrap(),
    ]);
    if let Ok(t) = std::fs::read_to_string(results.join("file.out")) {
        eprintln!("--- file.out:\n{t}");
    }
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "node 0 640 MiB (DMA, DMA32); node 1 1024 MiB (DMA32); node 2 1024 MiB (spare: the reserve's)"
        ),
        "{stderr}"
    );
    // The saved two-node buddyinfo as one target: each DMA32 line in its own node (DMA skipped),
    // and nothing of order ≥ 4 on either: the reserve's blocks traded and re-broken.
    let f = guest_status(&results, "file");
    let b = bounds(&f);
    assert!(b.contains("rebreak: no free block of order ≥ 4 left"), "{b}");
    fidelity_agrees(&f, "the saved buddyinfo");
    assert!(f["target"]["skipped"][0].as_str().unwrap().starts_with("Node 0, zone DMA (line 1)"), "{f}");
    let zones = f["zones"].as_array().unwrap();
    let names: Vec<&str> = zones.iter().map(|z| z["zone"].as_str().unwrap()).collect();
    assert_eq!(names, ["Node 0, zone DMA32", "Node 1, zone DMA32"]);
    let b5 = buddy(&results, "b5");
    let want = BuddyInfo::parse(&std::fs::read_to_string(&file).unwrap(), "held").unwrap();
    for (n, z) in [0u32, 1].iter().zip(zones) {
        let (planned, scale) = (numbers(&z["planned"]), z["scale"].as_f64().unwrap());
        let asked = &want.zone(*n, "DMA32").unwrap().free;
        // Sized from the file, each node holds its line unscaled.
        assert_eq!(scale, 1.0, "node {n}: {z}");
        assert_eq!(planned[..4], asked[..4], "node {n}: {z}");
        // The trade is inside the target's zones here (every zone in play is one), and the
        // kernel's own allocations around the re-breaking took whole regions of the cut's blocks
        // in one run: 77 % of node 0's left (docs/fragmenter.md, known limits).
        mostly_intact_above_order_0(z, &format!("node {n}"), 70);
        // Order 0 as the hold began, from the daemon's own read: by the status read a second
        // later node 0 (the guest's CPU's node) had 716, 20 and ~1300 of its 1448 planned order-0
        // blocks left in three runs of 2026-12-07 — any order-0 allocation there (the status
        // command itself, most likely) takes the smallest blocks first.
        let at_hold = &f["fidelity_at_hold"]["zones"][*n as usize];
        assert_eq!(at_hold["zone"], z["zone"], "node {n}: {at_hold}");
        let achieved = numbers(&at_hold["achieved"]);
        assert!(achieved[0] * 2 >= planned[0], "node {n}: order 0 when the hold began: {at_hold}");
        assert!(at_or_above(&b5, *n, "DMA32", 4) <= TOLERANCE_PAGES, "node {n}: {b5:?}");
        let line = &b5.zone(*n, "DMA32").unwrap().free;
        // The blocks counted intact are free in buddyinfo, within the fidelity tolerance (± 10 %
        // and 16 blocks): a block counts as intact while its first page is free, which it still
        // is, at a lower order, when the kernel takes its other half; and b5 is read a moment
        // before the status's count (a CI run: 1229 order-1 blocks free for 1238 intact).
        let intact = numbers(&z["intact"]);
        for o in 1..4 {
            let slack = fraglab_fragmenter::fidelity::tolerance(intact[o]);
            assert!(line[o] + slack >= intact[o], "node {n} order {o}: {line:?} for {intact:?} intact");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A lower zone: a 5 GiB two-node guest's node 1 holds DMA32 (2.5–4 GiB) under Normal (4–5 GiB). In a
/// budget the DMA32 line is refused, naming Normal; whole-machine it is reproduced, its buddyinfo
/// line matching the profile order by order when the hold begins — the reserve's high-order blocks
/// traded and re-broken, its small ones freed in the zones outside the target. A second on, the
/// zone sits near its watermarks, where kswapd and kcompactd work: blocks can form that the kernel
/// will not hand to the keeper, and then the hold's record says the target was lost.
#[test]
fn a_lower_zone_profile_is_a_whole_machine_target_reproduced_exactly() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("lower-zone");
    let profile = [2500u64, 350, 180, 90, 45, 18, 9, 0, 0, 0, 0];
    let line =
        format!("Node 1, zone DMA32 {}", profile.iter().map(u64::to_string).collect::<Vec<_>>().join(" "));
    let script = dir.join("zone.sh");
    std::fs::write(
        &script,
        format!(
            "{STATUS_SH}fraglab fragment --profile '{line}' --budget 100MiB --dry-run > refused.out 2>&1\n\
             echo \"exit $?\" >> refused.out\n\
             set -e\n\
             cat /proc/vmstat > vmstat-before\n\
             fraglab fragment --profile '{line}' --daemon > zone.out 2>&1\n\
             status begun\n\
             sleep 1\n\
             cat /proc/buddyinfo > held\n\
             sleep 0.2\n\
             cat /proc/buddyinfo > held-later\n\
             status later\n\
             cat /proc/vmstat > vmstat-held\n\
             fraglab release > /dev/null\n\
             echo script done\n"
        ),
    )
    .unwrap();
    let results = dir.join("results");
    let out = vm(&[
        "--numa",
        "2",
        "--mem",
        "5G",
        "--script",
        script.to_str().unwrap(),
        "--results",
        results.to_str().unwrap(),
    ]);
    if let Ok(t) = std::fs::read_to_string(results.join("zone.out")) {
        eprintln!("--- zone.out:\n{t}");
    }
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("script done"));
    let refused = read(&results, "refused.out");
    assert!(
        refused
            .contains("Node 1, zone DMA32 with a budget: user pages come from node 1's highest zone, Normal")
            && refused.ends_with("exit 1\n"),
        "{refused}"
    );
    // What compaction and reclaim did while shaping and holding, for the record.
    let vmstat = |name: &str| -> std::collections::BTreeMap<String, u64> {
        read(&results, name)
            .lines()
            .filter_map(|l| l.split_once(' ').and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?))))
            .collect()
    };
    let (before, after) = (vmstat("vmstat-before"), vmstat("vmstat-held"));
    for (k, v) in after.iter().filter(|(k, _)| k.starts_with("compact_") || k.contains("kswapd")) {
        eprintln!("vmstat {k}: +{}", v.saturating_sub(before.get(k).copied().unwrap_or(0)));
    }

    // When the hold begins: the profile, in its zone, and nothing of order ≥ 7 anywhere.
    let begun = guest_status(&results, "begun");
    fidelity_agrees(&begun, "node 1's DMA32 when the hold began");
    fidelity_agrees(&guest_status(&results, "later"), "node 1's DMA32 a second on");
    let b = bounds(&begun);
    assert!(b.contains("held, not cut"), "{b}");
    // Re-breaking ends with no block of order ≥ 7 free, or with the kernel refusing the rest: every
    // zone that still has one sits under its min watermark, where no ordinary allocation can have
    // it (populating takes MemAvailable down to the reserve, and with it some zones to min; seen in
    // 5 of 21 runs: docs/fragmenter.md, known limits). The line gives the zone's figures: check them.
    let rebreak = b.lines().find(|l| l.starts_with("rebreak: ")).unwrap_or_else(|| panic!("{b}"));
    eprintln!("{rebreak}");
    if !rebreak.starts_with("rebreak: no free block of order ≥ 7 left") {
        let (_, zones) = rebreak.split_once(" — ").unwrap_or_else(|| panic!("no zones named: {rebreak}"));
        let (zones, _) = zones.rsplit_once("; ").unwrap();
        assert!(rebreak.contains("the kernel handed out none"), "{rebreak}");
        for z in zones.split("; ") {
            let figure = |after: &str| -> u64 {
                let rest = &z[z.find(after).unwrap_or_else(|| panic!("{after} in {z}")) + after.len()..];
                rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
            };
            let smallest: u64 = figure(": order ");
            let (free, min, protect) = (figure("("), figure("against min "), figure("protection "));
            assert!(
                free - (1 << smallest) <= min + protect && z.contains("under min, refused"),
                "a block left in a zone above min: {z}"
            );
        }
    }
    let zone = &begun["zones"][0];
    assert_eq!(numbers(&zone["planned"]), profile, "{zone}");
    // The cut's blocks, but for those taken while the reserve was re-broken: kswapd, woken for the
    // rings' orders, wakes kcompactd, whose free scanner takes them (traced: 706 pages in one run).
    // Proactive compaction, which took 2 517 in the same run, is off for a whole-machine profile,
    // and a status refresh no longer copies the pagemap into fresh memory (docs/fragmenter.md, known limits).
    let zone_out = read(&results, "zone.out");
    assert!(zone_out.contains("sysctl vm.compaction_proactiveness = 0 (was "), "{zone_out}");
    mostly_intact(zone, "node 1 DMA32", 50);
    let now: BuddyInfo = serde_json::from_value(begun["buddyinfo_now"].clone()).unwrap();
    let got = &now.zone(1, "DMA32").unwrap().free;
    let intact = numbers(&zone["intact"]);
    for (o, (&g, &want)) in got.iter().zip(&profile).enumerate() {
        // No fewer than the intact blocks; no more than the profile and the few blocks below the
        // region order that populating left in the zone (docs/fragmenter.md: 10 % + 16 per order;
        // measured up to +17 at order 0 and +13 at order 3).
        assert!(g + 8 >= intact[o] && g <= want + want / 10 + 16, "order {o}: {got:?} for {profile:?}");
    }
    // Nothing of order ≥ 7 anywhere, or the keeper saw what formed after the cut and re-broke it
    // or recorded a loss: kswapd and kcompactd work in zones near their watermarks, and status reads
    // buddyinfo after the keeper's last look (CI once saw two order-9 and an order-10 block in node
    // 0's DMA32 here, 3 ms after "no free block of order ≥ 7 left").
    let formed: Vec<String> = now
        .zones
        .iter()
        .filter(|z| z.zone != "DMA" && z.free_pages_at_or_above(7) > TOLERANCE_PAGES)
        .map(|z| format!("{}: {:?}", z.label(), z.free))
        .collect();
    if !formed.is_empty() {
        let later = guest_status(&results, "later");
        // A loss already open when the hold began (a re-break paused at the memory the hold
        // leaves the machine, as CI once saw) adds no loss but runs on: its time grows.
        let acted = |k: &serde_json::Value| {
            k["rebroken"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum::<u64>()
                + k["refused"].as_u64().unwrap()
                + k["losses"].as_u64().unwrap()
        };
        let lost_ns = |k: &serde_json::Value| k["lost_ns"].as_u64().unwrap();
        assert!(
            acted(&later["keeping"]) > acted(&begun["keeping"])
                || lost_ns(&later["keeping"]) > lost_ns(&begun["keeping"]),
            "formed after the hold began and the keeper neither re-broke nor recorded them: {formed:?}; \
             begun {}, later {}",
            begun["keeping"],
            later["keeping"]
        );
    }

    // A second on: blocks of order ≥ 7 seen at both looks 0.2 s apart are blocks the keeper could
    // not take back, and the hold's record must say the target was lost.
    let (held, later) = (buddy(&results, "held"), buddy(&results, "held-later"));
    let stuck =
        held.zones.iter().filter(|z| z.zone != "DMA").any(|z| {
            z.free_pages_at_or_above(7).min(at_or_above(&later, z.node, &z.zone, 7)) > TOLERANCE_PAGES
        });
    let keeping = &guest_status(&results, "later")["keeping"];
    eprintln!("a second on: {held:?} / {later:?}; keeping {keeping}");
    if stuck {
        assert!(
            keeping["losses"].as_u64().unwrap() > 0 && keeping["lost_ns"].as_u64().unwrap() > 0,
            "{keeping}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--numa` is checked before anything boots.
#[test]
fn bad_numa_flags_are_refused_before_booting() {
    for (args, want) in [
        (&["--numa", "9"][..], "--numa 9: give 1 to 8 nodes of at least 128MiB each"),
        (
            &["--numa", "4", "--mem", "256M"],
            "--numa 4: give 1 to 8 nodes of at least 128MiB each (--mem 256.00 MiB holds 2)",
        ),
        (&["--numa", "2", "--cpus", "3"], "--cpus 3 --numa 2: give CPUs that split evenly among the nodes"),
        (&["--numa-from", "/nonexistent.buddyinfo"], "--numa-from /nonexistent.buddyinfo: cannot read it"),
        (&["--numa-from", "Cargo.toml"], "--numa-from: Cargo.toml: no buddyinfo line"),
    ] {
        let out = Command::new(FRAGLAB)
            .args(["vm", "--kernel", "debian-cloud"])
            .args(args)
            .args(["--", "probe"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // fraglab vm's own failures are 125, never the guest command's codes (docs/vm.md).
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
