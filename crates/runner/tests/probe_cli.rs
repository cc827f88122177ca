//! `fraglab probe` as a user runs it, on this machine's live kernel files.
//!
//! Memory moves between any two reads, so nothing here compares free-block counts across two reads:
//! zone lists, column counts and headers are stable, and each JSON sample is checked against itself
//! (its indices against its own buddyinfo, its deltas against its own first sample).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

/// A scratch directory of this test's own; the probe gets a private `--run-dir` inside it so it can
/// never act on the journal of a fragmenter someone else is running.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("fraglab-probe-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    fn probe(&self, args: &[&str]) -> Output {
        Command::new(FRAGLAB)
            .arg("--run-dir")
            .arg(self.0.join("run"))
            .arg("probe")
            .args(args)
            .output()
            .expect("run fraglab")
    }

    /// Run the probe and insist it succeeded; returns stdout.
    fn probe_ok(&self, args: &[&str]) -> String {
        let out = self.probe(args);
        assert!(
            out.status.success(),
            "fraglab probe {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("stdout is UTF-8")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `(node, zone, number of order columns)` of every line of the live `/proc/buddyinfo`, in order.
fn live_zones() -> Vec<(u64, String, usize)> {
    let text = std::fs::read_to_string("/proc/buddyinfo").unwrap();
    let zones: Vec<_> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            // "Node 0, zone   Normal   3 3 15 ..."
            let (node, rest) = l.trim_start().strip_prefix("Node").unwrap().split_once(',').unwrap();
            let mut f = rest.trim_start().strip_prefix("zone").unwrap().split_whitespace();
            let zone = f.next().unwrap().to_string();
            (node.trim().parse().unwrap(), zone, f.count())
        })
        .collect();
    assert!(!zones.is_empty(), "/proc/buddyinfo lists no zone");
    zones
}

fn meminfo_kb(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text.lines().find(|l| l.split(':').next() == Some(key)).unwrap_or_else(|| panic!("no {key}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Block size of `order` as the human table heads it: 4K, 8K, ... 1M, 2M, 4M.
fn block_size(order: usize) -> String {
    let page_kib = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).unwrap().unwrap() as u64 / 1024;
    let kib = page_kib << order;
    if kib >= 1024 {
        format!("{}M", kib / 1024)
    } else {
        format!("{kib}K")
    }
}

/// The lines of a human section: from the line starting with `title` to the next blank line.
fn section<'a>(out: &'a str, title: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = out.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(title))
        .unwrap_or_else(|| panic!("no section {title:?} in:\n{out}"));
    lines[start..].iter().take_while(|l| !l.trim().is_empty()).copied().collect()
}

/// The rows of a section that belong to a zone, keyed by `Node n, zone Z`, each split into cells.
fn zone_rows(lines: &[&str]) -> Vec<(String, Vec<String>)> {
    lines
        .iter()
        .filter_map(|l| {
            let (node, rest) = l.strip_prefix("Node ")?.split_once(", zone ")?;
            let mut f = rest.split_whitespace();
            let zone = f.next()?;
            Some((format!("Node {node}, zone {zone}"), f.map(str::to_string).collect()))
        })
        .collect()
}

fn label((node, zone, _): &(u64, String, usize)) -> String {
    format!("Node {node}, zone {zone}")
}

#[test]
fn human_output_shows_every_live_zone_free_table_indices_and_counters() {
    let s = Scratch::new("human");
    let out = s.probe_ok(&[]);
    let zones = live_zones();
    let labels: Vec<String> = zones.iter().map(label).collect();
    let orders = zones[0].2;

    // Free blocks per order: a header of block sizes, then one row per zone with a count per order
    // and the zone's free total (number and unit).
    let buddy = section(&out, "Free blocks per order (/proc/buddyinfo)");
    let header: Vec<&str> = buddy[1].split_whitespace().collect();
    let sizes: Vec<String> = (0..orders).map(block_size).collect();
    assert_eq!(header[0], "order:", "{out}");
    assert_eq!(header[1..=orders], sizes[..], "{out}");
    assert_eq!(header.last(), Some(&"free"), "{out}");
    if orders == 11 && block_size(0) == "4K" {
        assert_eq!((sizes[0].as_str(), sizes[10].as_str()), ("4K", "4M"));
    }
    let rows = zone_rows(&buddy);
    assert_eq!(rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), labels, "{out}");
    for (zone, cells) in &rows {
        assert_eq!(cells.len(), orders + 2, "{zone}: {orders} counts, then the free size: {cells:?}");
        assert!(cells[..orders].iter().all(|c| c.parse::<u64>().is_ok()), "{zone}: {cells:?}");
        assert!(cells[orders].parse::<f64>().is_ok(), "{zone}: {cells:?}");
        assert!(["B", "KiB", "MiB", "GiB", "TiB"].contains(&cells[orders + 1].as_str()), "{zone}: {cells:?}");
    }

    // The free table: procps's header and a Mem: row whose total is MemTotal (which never moves).
    let free = section(&out, "free (KiB, as procps free computes it)");
    assert_eq!(
        free[1], "               total        used        free      shared  buff/cache   available",
        "{out}"
    );
    let mem: Vec<&str> = free[2].split_whitespace().collect();
    assert_eq!(mem[0], "Mem:", "{out}");
    assert_eq!(mem.len(), 7, "{out}");
    assert_eq!(mem[1].parse::<u64>().unwrap(), meminfo_kb("MemTotal"), "{out}");

    // Both index tables, every zone in each, one index per order in the kernel's d.ddd form.
    let indices = section(&out, "Unusable free space index");
    let extfrag_title = indices
        .iter()
        .position(|l| l.starts_with("Fragmentation index"))
        .unwrap_or_else(|| panic!("no fragmentation index table after the unusable index:\n{out}"));
    for (table, lines) in [("unusable", &indices[..extfrag_title]), ("extfrag", &indices[extfrag_title..])] {
        let rows = zone_rows(lines);
        assert_eq!(rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), labels, "{table}:\n{out}");
        for (zone, cells) in rows {
            assert_eq!(cells.len(), orders, "{table} {zone}: {cells:?}");
            for c in &cells {
                let (int, frac) = c.split_once('.').unwrap_or_else(|| panic!("{table} {zone}: {c:?}"));
                assert!(int.parse::<i32>().is_ok() && frac.parse::<i32>().is_ok(), "{table} {zone}: {c:?}");
            }
            if table == "unusable" {
                // Every free page can serve an order-0 request.
                assert!(cells[0] == "0.000" || cells[0] == "1.000", "{zone}: {cells:?}");
            }
        }
    }

    // The compaction counters: every tracked compaction/migration counter this kernel prints.
    let counters = section(&out, "Compaction and allocation counters (/proc/vmstat, since boot)");
    let shown: BTreeMap<&str, &str> = counters[1..]
        .iter()
        .map(|l| {
            let mut f = l.split_whitespace();
            (f.next().unwrap(), f.next().unwrap())
        })
        .collect();
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap();
    let printed: BTreeSet<&str> = vmstat.lines().filter_map(|l| l.split_whitespace().next()).collect();
    for name in [
        "compact_stall",
        "compact_fail",
        "compact_success",
        "compact_migrate_scanned",
        "compact_free_scanned",
        "compact_isolated",
        "compact_daemon_wake",
        "pgmigrate_success",
        "pgmigrate_fail",
        "thp_fault_alloc",
        "thp_fault_fallback",
        "allocstall_normal",
    ] {
        if printed.contains(name) {
            let v =
                shown.get(name).unwrap_or_else(|| panic!("{name} is in /proc/vmstat but not shown:\n{out}"));
            assert!(v.parse::<u64>().is_ok(), "{name} = {v:?}");
        } else {
            assert!(!shown.contains_key(name), "{name} shown, but this kernel does not print it");
        }
    }
    assert!(!shown.contains_key("nr_free_pages"), "a gauge listed among counters:\n{out}");
}

// The kernel's fill_contig_page_info / unusable_free_index / __fragmentation_index (mm/vmstat.c),
// written out again here so the probe's output is checked against the C, not against itself.

fn contig(free: &[u64], order: usize) -> (u64, u64, u64) {
    let (mut pages, mut total, mut suitable) = (0u64, 0u64, 0u64);
    for (o, &n) in free.iter().enumerate() {
        total += n;
        pages += n << o;
        if o >= order {
            suitable += n << (o - order);
        }
    }
    (pages, total, suitable)
}

fn kernel_unusable(free: &[u64], order: usize) -> i64 {
    let (pages, _, suitable) = contig(free, order);
    if pages == 0 {
        return 1000;
    }
    ((pages - (suitable << order)) * 1000 / pages) as i32 as i64
}

fn kernel_extfrag(free: &[u64], order: usize) -> i64 {
    let (pages, total, suitable) = contig(free, order);
    if total == 0 {
        return 0;
    }
    if suitable != 0 {
        return -1000;
    }
    1000u64.wrapping_sub((1000 + pages * 1000 / (1u64 << order)) / total) as i32 as i64
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

fn i64s(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

/// Check one JSON snapshot's buddyinfo against the live zone list, and its indices against its
/// buddyinfo.
fn check_buddyinfo_and_indices(snap: &Value) {
    let zones = live_zones();
    let buddy = snap["buddyinfo"]["zones"].as_array().expect("buddyinfo.zones");
    let got: Vec<(u64, String, usize)> = buddy
        .iter()
        .map(|z| {
            (z["node"].as_u64().unwrap(), z["zone"].as_str().unwrap().to_string(), u64s(&z["free"]).len())
        })
        .collect();
    assert_eq!(got, zones, "JSON zones differ from /proc/buddyinfo's");

    let indices = snap["indices"].as_array().expect("indices");
    assert_eq!(indices.len(), buddy.len());
    for (z, idx) in buddy.iter().zip(indices) {
        assert_eq!((&z["node"], &z["zone"]), (&idx["node"], &idx["zone"]));
        let free = u64s(&z["free"]);
        let orders = 0..free.len();
        let unusable: Vec<i64> = orders.clone().map(|o| kernel_unusable(&free, o)).collect();
        let extfrag: Vec<i64> = orders.map(|o| kernel_extfrag(&free, o)).collect();
        assert_eq!(i64s(&idx["unusable"]), unusable, "unusable index of {z}");
        assert_eq!(i64s(&idx["extfrag"]), extfrag, "extfrag index of {z}");
    }
}

#[test]
fn json_snapshot_matches_live_zones_and_its_indices_recompute_from_its_buddyinfo() {
    let s = Scratch::new("json");
    let snap: Value = serde_json::from_str(&s.probe_ok(&["--json"])).expect("probe --json is JSON");
    check_buddyinfo_and_indices(&snap);

    assert!(snap["wall"].as_str().unwrap().ends_with('Z'), "wall is RFC 3339 UTC: {}", snap["wall"]);
    assert!(snap["monotonic_ns"].as_u64().unwrap() > 0);
    assert!(
        snap.get("elapsed").is_none() && snap.get("vmstat_delta").is_none(),
        "a snapshot is not a series"
    );

    // The free table: total is MemTotal; used is the procps 4 formula, used_classic the 3.3 one.
    let f = &snap["free"];
    let n = |k: &str| f[k].as_i64().unwrap_or_else(|| panic!("free.{k}: {f}"));
    assert_eq!(n("total") as u64, meminfo_kb("MemTotal"));
    assert_eq!(n("used"), n("total") - n("available"));
    let classic = n("total") - n("free") - n("buff_cache");
    assert_eq!(n("used_classic"), if classic < 0 { n("total") - n("free") } else { classic });

    // Counters are keyed by the kernel's names.
    let vm = snap["vmstat"]["values"].as_object().expect("vmstat.values");
    assert!(vm.contains_key("nr_free_pages"), "{vm:?}");
    if std::fs::read_to_string("/proc/vmstat").unwrap().contains("compact_stall ") {
        assert!(vm.contains_key("compact_stall"), "{vm:?}");
    }
}

#[test]
fn watch_writes_a_json_line_per_tick_with_deltas_from_the_first() {
    let s = Scratch::new("watch");
    let file = s.path("p.jsonl");
    let out = s.probe(&["--watch", "100ms", "--duration", "1500ms", "--output", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "with --output nothing goes to stdout");
    let text = std::fs::read_to_string(&file).unwrap();
    let samples: Vec<Value> = text
        .lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {}: {e}: {l:.200}", i + 1)))
        .collect();
    assert!(samples.len() >= 8, "{} samples in 1.5 s at 100 ms", samples.len());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{} samples", samples.len())), "{stderr}");

    let first = &samples[0];
    let mono0 = first["monotonic_ns"].as_u64().unwrap();
    let vm0 = first["vmstat"]["values"].as_object().expect("vmstat in the first sample").clone();
    assert_eq!(first["elapsed"].as_f64(), Some(0.0), "elapsed starts at 0");
    let mut last_mono = 0;
    for (i, s) in samples.iter().enumerate() {
        let mono = s["monotonic_ns"].as_u64().unwrap();
        assert!(mono > last_mono, "sample {i}: monotonic_ns {mono} after {last_mono}");
        last_mono = mono;
        let elapsed = s["elapsed"].as_f64().unwrap();
        assert!((elapsed - (mono - mono0) as f64 / 1e9).abs() < 1e-6, "sample {i}: elapsed {elapsed}");
        assert!(s["wall"].is_string());
        check_buddyinfo_and_indices(s);

        let vm = s["vmstat"]["values"].as_object().unwrap();
        let delta =
            s["vmstat_delta"]["values"].as_object().unwrap_or_else(|| panic!("sample {i}: no vmstat_delta"));
        // Every counter has a delta, gauges (nr_free_pages) have none.
        let counters: BTreeSet<&String> = vm.keys().filter(|k| *k != "nr_free_pages").collect();
        assert_eq!(delta.keys().collect::<BTreeSet<_>>(), counters, "sample {i}");
        for (name, d) in delta {
            let d = d.as_u64().unwrap_or_else(|| panic!("sample {i}: {name} delta {d} is not ≥ 0"));
            let (now, then) = (vm[name].as_u64().unwrap(), vm0[name].as_u64().unwrap());
            assert_eq!(d, now - then, "sample {i}: {name} delta {d}, but {now} − {then}");
            if i == 0 {
                assert_eq!(d, 0, "{name}");
            }
        }
    }
}

#[test]
fn monitors_buddyinfo_reads_only_buddyinfo() {
    let s = Scratch::new("monitors");
    let snap: Value = serde_json::from_str(&s.probe_ok(&["--monitors", "buddyinfo", "--json"])).unwrap();
    let keys: BTreeSet<&str> = snap.as_object().unwrap().keys().map(String::as_str).collect();
    let mut want = BTreeSet::from(["wall", "monotonic_ns", "buddyinfo", "indices"]);
    // Read with buddyinfo, since it says when buddyinfo's top orders dip.
    if let Some(r) = fraglab_probe::page_reporting::PageReporting::read().unwrap() {
        want.insert("page_reporting");
        assert_eq!(
            snap["page_reporting"]["order"].as_u64(),
            Some(r.order.into()),
            "{}",
            snap["page_reporting"]
        );
    }
    assert_eq!(keys, want);
    check_buddyinfo_and_indices(&snap);

    let file = s.path("b.jsonl");
    let args = ["--monitors", "buddyinfo", "--watch", "100ms", "--duration", "300ms", "--output"];
    let out = s.probe(&[&args[..], &[file.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for line in std::fs::read_to_string(&file).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = want.clone();
        want.insert("elapsed");
        assert_eq!(keys, want);
    }

    // Human output: the buddyinfo table and the indices, nothing that needs another file.
    let human = s.probe_ok(&["--monitors", "buddyinfo"]);
    assert!(human.contains("Free blocks per order") && human.contains("Fragmentation index"), "{human}");
    for absent in ["free (KiB", "Compaction and allocation counters", "Pageblocks", "Sockets:", "slab"] {
        assert!(!human.contains(absent), "{absent:?} in --monitors buddyinfo output:\n{human}");
    }
}

/// Run a refused command line, `OUT` standing for a file in a fresh directory: it must exit 1, say
/// every one of `needles` on stderr, print nothing on stdout, and leave no file at `OUT`.
fn refused(name: &str, args: &[&str], needles: &[&str]) {
    let s = Scratch::new(name);
    let file = s.path("out.jsonl");
    let args: Vec<&str> = args.iter().map(|&a| if a == "OUT" { file.to_str().unwrap() } else { a }).collect();
    let out = s.probe(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?} not refused: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?} printed: {}", String::from_utf8_lossy(&out.stdout));
    for needle in needles {
        assert!(stderr.contains(needle), "{args:?}: {needle:?} not in {stderr:?}");
    }
    assert!(!file.exists(), "{args:?} created {}", file.display());
}

#[test]
fn bad_input_is_refused_naming_the_flag_and_creating_nothing() {
    let watch = |w: &'static str| ["--watch", w, "--duration", "1s", "--output", "OUT"];
    refused("zero", &watch("0s"), &["--watch"]);
    refused("zero-ms", &watch("0ms"), &["--watch"]);
    refused("fast", &watch("fast"), &["--watch", "\"fast\""]);
    refused("nowatch", &["--duration", "3s"], &["--duration", "--watch"]);
    refused("nowatch-out", &["--duration", "3s", "--output", "OUT"], &["--duration", "--watch"]);
    refused("out-only", &["--output", "OUT"], &["--output", "--watch"]);
    refused(
        "soon",
        &["--watch", "100ms", "--duration", "soon", "--output", "OUT"],
        &["--duration", "\"soon\""],
    );
    refused("bogus", &["--monitors", "bogus"], &["--monitors", "\"bogus\""]);
    refused("bogus-json", &["--monitors", "buddyinfo,bogus", "--json"], &["--monitors", "\"bogus\""]);
    refused(
        "bogus-watch",
        &["--monitors", "bogus", "--watch", "100ms", "--duration", "1s", "--output", "OUT"],
        &["--monitors", "\"bogus\""],
    );
}

/// Every refusal quotes the value typed, not just the flag.
#[test]
fn bad_input_messages_quote_the_value() {
    refused("zero-value", &["--watch", "0s", "--duration", "1s", "--output", "OUT"], &["--watch", "0s"]);
    refused("nowatch-value", &["--duration", "3s", "--output", "OUT"], &["--duration", "3s"]);
}

/// `fraglab probe --sockets`: a connection this test holds, with bytes its server has not read, is
/// in the view with its memory; the sums are the sockets'; the raw replies saved by `--dump-to`
/// parse to the same sockets; SCTP on a kernel without it (this host) is "could not test".
#[test]
fn the_sockets_view_shows_a_held_connection() {
    use std::io::Write;
    let sc = Scratch::new("sockets");
    let listener = std::net::TcpListener::bind("[::1]:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    let (_server, _) = listener.accept().unwrap();
    client.write_all(&[9u8; 7000]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let dump = sc.path("dump");
    let out =
        sc.probe(&["--sockets", "tcp", "--top", "100000", "--json", "--dump-to", dump.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let top = v["top"].as_array().unwrap();
    let total = v["sockets"]["ipv4"].as_u64().unwrap() + v["sockets"]["ipv6"].as_u64().unwrap();
    assert_eq!(top.len() as u64, total, "--top above the count lists every socket");
    let ours =
        top.iter().find(|s| s["local"] == addr.to_string() && s["state"] == "ESTAB").expect("the server end");
    assert!(ours["skmem"]["r"].as_i64().unwrap() >= 7000, "{ours}");
    assert_eq!(ours["family"], "ipv6");
    for k in ["r", "rb", "t", "tb", "f", "w", "o", "bl", "d"] {
        let sum: i64 = top.iter().map(|s| s["skmem"][k].as_i64().unwrap()).sum();
        assert_eq!(v["sum"][k].as_i64(), Some(sum), "sum of {k}");
    }
    // Largest forward allocation first.
    let f: Vec<i64> = top.iter().map(|s| s["skmem"]["f"].as_i64().unwrap()).collect();
    assert!(f.windows(2).all(|w| w[0] >= w[1]), "{f:?}");
    let raw = std::fs::read(sc.path("dump.ipv6")).unwrap();
    use fraglab_probe::sock_diag::{self, Family, Proto};
    let d = sock_diag::parse(Proto::Tcp, Family::V6, &raw, "dump.ipv6").unwrap();
    assert!(d.sockets().iter().any(|s| s.local == addr && s.skmem.r >= 7000));

    let sctp = sc.probe(&["--sockets", "sctp"]);
    // SAFETY: a plain socket() call; the fd is closed at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
    if fd >= 0 {
        // SAFETY: closing the fd just opened.
        unsafe { libc::close(fd) };
    }
    let err = String::from_utf8_lossy(&sctp.stderr);
    match sctp.status.code() {
        Some(0) => assert!(fd >= 0, "an SCTP view on a kernel without SCTP"),
        Some(125) => assert!(err.contains("no sctp_diag") && err.contains("modprobe sctp_diag"), "{err}"),
        other => panic!("--sockets sctp exited {other:?}: {err}"),
    }
}
