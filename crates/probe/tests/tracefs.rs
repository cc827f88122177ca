//! The failed-allocation catcher: parsing on real trace output (captures/tracefs/README.md), and on
//! this host, as root, the instance's life — setup, filter accepted and read back, real events with
//! their stacks, clean removal, global tracing state untouched, tracefs unmounted again if the
//! catcher mounted it (the cross-process side of that rule: tracefs_mount.rs).
//!
//! No allocation fails on an unfragmented machine, so here successful allocations by this test's
//! own thread prove the plumbing (same event, same parser, a filter with `common_pid`); the failure
//! filter itself is proven by the kernel accepting it and reading it back.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fraglab_probe::tracefs::{
    failure_filter, migratetype_name, parse_alloc_line, parse_alloc_payload, parse_extfrag_payload,
    parse_trace_line, AllocFailure, Catcher, Folded, GfpTable, Options, TraceParser, DEFAULT_ROOT,
    FAILED_PFN, KEPT_PER_SITE, LOCK_DIR, MOUNT_LOCK, MOUNT_MARKER, USERS_LOCK,
};

fn capture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/captures/tracefs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse_all(text: &str) -> (Vec<AllocFailure>, TraceParser) {
    let table = GfpTable::from_format(&capture("host-6.18-mm_page_alloc.format")).unwrap();
    let mut p = TraceParser::new(true, Some(table));
    for line in text.lines() {
        p.feed_line(line);
    }
    p.end_of_read();
    (p.take_ready(true), p)
}

/// A real flood of failures (30 TCP streams' order-3 page-frag refills in a 6.1 guest) folded as
/// the catcher folds them: every site keeps its first KEPT_PER_SITE whole and the rest as repeats,
/// and nothing is lost — per site the same count and the same times, in any window the same number
/// — and the folded records make the same JSON round trip as alloc_failures.jsonl.
#[test]
fn a_flood_of_real_failures_folds_without_losing_any() {
    let raw: Vec<AllocFailure> = capture("guest-6.1-tcp30-alloc_failures.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(raw.len(), 200);
    let mut folder = Folded::default();
    for f in raw.iter().cloned() {
        folder.push(f);
    }
    let folded = folder.take();
    let site = |f: &AllocFailure| (f.pid, f.comm.clone(), f.order, f.gfp_flags.clone(), f.stack.clone());
    let mut sites: std::collections::BTreeMap<_, (usize, Vec<f64>)> = Default::default();
    for f in &raw {
        let e = sites.entry(site(f)).or_default();
        e.0 += 1;
        e.1.push(f.time);
    }
    let biggest = sites.values().map(|(n, _)| *n).max().unwrap();
    assert!(biggest > 2 * KEPT_PER_SITE, "the capture has a site that folds: {biggest}");
    for (key, (n, times)) in &sites {
        let of: Vec<&AllocFailure> = folded.iter().filter(|f| site(f) == *key).collect();
        assert_eq!(of.len(), (*n).min(KEPT_PER_SITE), "{key:?}: whole records");
        assert_eq!(of.iter().map(|f| f.count()).sum::<u64>(), *n as u64, "{key:?}: all counted");
        let mut got: Vec<f64> = of.iter().flat_map(|f| f.times()).collect();
        got.sort_by(f64::total_cmp);
        let mut want = times.clone();
        want.sort_by(f64::total_cmp);
        assert_eq!(got, want, "{key:?}: the same times");
    }
    assert!(folded.len() < raw.len() / 2, "{} records of {}", folded.len(), raw.len());
    // Any window counts the same; `within` keeps exactly the window's.
    let (t0, t1) = (raw[0].time, raw[raw.len() - 1].time);
    for k in 0..4 {
        let (from, to) = (t0 + (t1 - t0) * k as f64 / 4.0, t0 + (t1 - t0) * (k + 1) as f64 / 4.0);
        let want = raw.iter().filter(|f| (from..=to).contains(&f.time)).count() as u64;
        assert_eq!(folded.iter().map(|f| f.count_within(from, to)).sum::<u64>(), want);
        let inside: Vec<AllocFailure> = folded.iter().filter_map(|f| f.within(from, to)).collect();
        assert_eq!(inside.iter().map(|f| f.count()).sum::<u64>(), want);
        assert!(inside.iter().flat_map(|f| f.times()).all(|t| (from..=to).contains(&t)));
    }
    for f in &folded {
        let json = serde_json::to_string(f).unwrap();
        assert_eq!(&serde_json::from_str::<AllocFailure>(&json).unwrap(), f);
        assert_eq!(json.contains("\"repeats\""), !f.repeats.is_empty(), "{json}");
    }
}

#[test]
fn real_order3_event_with_stack() {
    let (events, p) = parse_all(&capture("host-6.18-order3-unix-send.trace"));
    assert_eq!(events.len(), 1);
    assert_eq!(p.unparsed_count, 0, "{:?}", p.unparsed);
    let e = &events[0];
    assert_eq!((e.comm.as_str(), e.pid, e.cpu, e.time), ("python3", 4567, 1, 1717.479162));
    assert_eq!((e.order, e.migratetype, e.failed, e.pfn), (3, 0, false, Some(0x1d5950)));
    assert_eq!(migratetype_name(e.migratetype), Some("Unmovable"));
    assert_eq!(e.gfp_flags, ["GFP_NOWAIT", "__GFP_IO", "__GFP_FS", "__GFP_COMP", "__GFP_ACCOUNT"]);
    assert_eq!(e.gfp_residue, None);
    // GFP_NOWAIT = __GFP_KSWAPD_RECLAIM|__GFP_NOWARN on 6.18; IO, FS, COMP, ACCOUNT are bits 6, 7, 18, 22.
    assert_eq!(e.gfp_mask, Some((1 << 11) | (1 << 13) | (1 << 6) | (1 << 7) | (1 << 18) | (1 << 22)));
    assert_eq!(e.stack.len(), 11);
    assert_eq!(e.stack[0], "trace_event_raw_event_mm_page_alloc");
    assert!(e.stack.iter().any(|f| f == "unix_stream_sendmsg"), "{:?}", e.stack);
}

#[test]
fn real_order2_pipe_resize() {
    let (events, _) = parse_all(&capture("host-6.18-order2-pipe-resize.trace"));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].order, 2);
    assert_eq!(events[0].gfp_flags, ["GFP_KERNEL_ACCOUNT", "__GFP_ZERO", "__GFP_NOWARN", "__GFP_COMP"]);
    assert!(events[0].stack.contains(&"pipe_resize_ring".to_string()));
}

#[test]
fn real_extfrag_event() {
    let text = capture("host-6.18-extfrag.trace");
    let (h, name, payload) = parse_trace_line(text.lines().next().unwrap()).unwrap();
    assert_eq!((h.comm.as_str(), h.pid, name), ("cargo", 4839, "mm_page_alloc_extfrag"));
    let e = parse_extfrag_payload(payload).unwrap();
    assert_eq!((e.alloc_order, e.fallback_order, e.alloc_migratetype, e.fallback_migratetype), (2, 10, 2, 1));
    assert!(!e.fragmenting && e.change_ownership);
    let (_, p) = parse_all(&text);
    assert_eq!((p.extfrag.events, p.extfrag.changed_ownership, p.extfrag.by_alloc_order[&2]), (1, 1, 1));
}

/// A real failed event (v5.12-era kernel, decimal pfn), from a function_graph trace in a mail.
#[test]
fn real_failed_event_from_a_report() {
    let text = capture("linux-mm-2021-04-30-function-graph.txt");
    let line = text.lines().find(|l| l.contains("mm_page_alloc:")).unwrap();
    let payload = line.split("mm_page_alloc: ").nth(1).unwrap().trim_end().trim_end_matches("*/").trim_end();
    let p = parse_alloc_payload(payload).unwrap();
    assert!(p.failed);
    assert_eq!((p.order, p.migratetype, p.pfn), (9, 1, 0));
    assert_eq!(p.gfp_flags, ["GFP_HIGHUSER_MOVABLE", "__GFP_NOWARN", "__GFP_COMP", "__GFP_THISNODE"]);
}

/// A failed event in 6.18's exact layout. CONSTRUCTED, not captured: no allocation fails on this
/// machine. It is the real order-3 line above with page and pfn replaced by what mm_page_alloc's
/// TP_printk (include/trace/events/kmem.h; this host's copy is in host-6.18-mm_page_alloc.format)
/// prints for pfn == -1UL: `REC->pfn != -1UL ? <page> : NULL` through %p (NULL prints as zeros) and
/// `REC->pfn != -1UL ? REC->pfn : 0` through `0x%lx`. The qemu-guest harness replaces this with a
/// caught one.
#[test]
fn failed_event_in_this_kernels_layout() {
    let real = capture("host-6.18-order3-unix-send.trace");
    let text = real.replace("page=000000004856d7ce pfn=0x1d5950", "page=0000000000000000 pfn=0x0");
    assert_ne!(text, real);
    let (events, _) = parse_all(&text);
    let e = &events[0];
    assert!(e.failed);
    assert_eq!((e.pfn, e.order), (None, 3));
    assert!(e.stack.iter().any(|f| f == "alloc_skb_with_frags"));
    let e = parse_alloc_line(text.lines().next().unwrap()).unwrap();
    assert!(e.failed);
}

/// The kernel's own answers to the filter and trigger writes, as captured here.
#[test]
fn filter_readbacks_of_this_host() {
    assert_eq!(failure_filter(3), "order >= 3 && pfn == 18446744073709551615");
    assert_eq!(FAILED_PFN, u64::MAX);
    assert_eq!(capture("host-6.18-filter-accepted.txt").trim(), failure_filter(3));
    assert_eq!(
        capture("host-6.18-trigger.txt").trim(),
        format!("stacktrace:unlimited if {}", failure_filter(3))
    );
    assert!(capture("host-6.18-filter-rejected.txt").contains("Illegal integer value"));
}

/// The GFP name table of this kernel maps a 5.3 report's names to the very mask it logged:
/// GFP_KERNEL, __GFP_ZERO and __GFP_COMP kept their bits from 5.3 to 6.18.
#[test]
fn gfp_table_matches_a_logged_mask() {
    let t = GfpTable::from_format(&capture("host-6.18-mm_page_alloc.format")).unwrap();
    assert_eq!(t.names["GFP_KERNEL"], 0xcc0);
    assert_eq!(t.names["GFP_ATOMIC"], 0x820);
    assert_eq!(t.names["__GFP_COMP"], 1 << 18);
    assert_eq!(t.names.len(), 38, "every name of the table");
    let names: Vec<String> =
        ["GFP_KERNEL", "__GFP_COMP", "__GFP_ZERO"].iter().map(|s| s.to_string()).collect();
    assert_eq!(t.mask(&names, None), Some(0x40dc0));
    assert_eq!(t.mask(&["__GFP_COLD".to_string()], None), None, "a name this kernel no longer has");
}

#[test]
fn stacks_pair_by_task_and_cpu_across_interleaving() {
    // Two CPUs' events interleaved the way trace_pipe merges them (fields from the real lines).
    let a = "python3-4567    [001] .....  1717.479162: mm_page_alloc: page=0000000000000000 pfn=0x0 order=3 migratetype=0 gfp_flags=GFP_KERNEL";
    let b = "kworker/0:1-99    [000] .....  1717.479200: mm_page_alloc: page=0000000000000000 pfn=0x0 order=4 migratetype=1 gfp_flags=GFP_ATOMIC|__GFP_COMP";
    let sa = "python3-4567    [001] .....  1717.479925: <stack trace>";
    let sb = "kworker/0:1-99    [000] .....  1717.480000: <stack trace>";
    let mut p = TraceParser::new(true, None);
    for l in [a, b, sb, " => b_frame", sa, " => a_frame1", " => a_frame2", "CPU:1 [LOST 7 EVENTS]"] {
        p.feed_line(l);
    }
    let ev = p.take_ready(true);
    assert_eq!(ev[0].stack, ["a_frame1", "a_frame2"]);
    assert_eq!((ev[1].comm.as_str(), ev[1].pid), ("kworker/0:1", 99));
    assert_eq!(ev[1].stack, ["b_frame"]);
    assert_eq!(p.lost, 7);
}

// ---- On this host, as root ----

/// One catcher test at a time: they share the process-wide tracefs mount.
static HOST: Mutex<()> = Mutex::new(());

fn root_or_skip() -> Option<std::sync::MutexGuard<'static, ()>> {
    if unsafe { libc::geteuid() } != 0 {
        common::skip("tracefs needs root");
        return None;
    }
    Some(HOST.lock().unwrap_or_else(|p| p.into_inner()))
}

/// tracefs mount points, from mountinfo.
fn tracefs_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(" - ").nth(1).is_some_and(|r| r.starts_with("tracefs ")))
        .map(|l| PathBuf::from(l.split_whitespace().nth(4).unwrap()))
        .collect()
}

/// How long a test waits, under `FRAGLAB_REQUIRE_ALL=1`, for another fraglab process to stop using
/// tracefs — as long as a fraglab started by a test queues for the instance lock.
const BUSY_WAIT: Duration = Duration::from_secs(600);

/// How tracefs is mounted before a test's catchers start: `(foreign, others)`. `foreign`: mounted,
/// and not by fraglab (the marker does not name this mount), so it must stay mounted; otherwise the
/// last catcher to stop unmounts it — unless `others`: another fraglab process is using tracefs
/// now, and then that one is the last and the mount checks are left out. Under
/// `FRAGLAB_REQUIRE_ALL=1` leaving them out is not allowed: the test first waits (at most
/// [`BUSY_WAIT`]) for the other users to go.
fn mount_before() -> (bool, bool) {
    if common::require_all() {
        common::wait_until_idle(BUSY_WAIT, || {
            other_fraglab_users().then(|| "another fraglab process is using tracefs now".to_string())
        });
    }
    let marker_id = std::fs::read_to_string(MOUNT_MARKER)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("mnt_id=")?.parse::<u64>().ok());
    let here = std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let tracefs = l.split(" - ").nth(1).is_some_and(|r| r.starts_with("tracefs "));
        (tracefs && f[4] == DEFAULT_ROOT).then(|| f[0].parse::<u64>().unwrap())
    });
    let foreign = !tracefs_mounts().is_empty() && (here.is_none() || here != marker_id);
    let others = other_fraglab_users();
    if others {
        eprintln!(
            "another fraglab process is using tracefs: the mount state after the test is its to decide"
        );
    }
    (foreign, others)
}

/// Another process holds `tracefs.users`, i.e. has a catcher running. Asked the way fraglab asks:
/// under `tracefs.lock`, so a fraglab leaving at this moment is not misled.
fn other_fraglab_users() -> bool {
    std::fs::create_dir_all(LOCK_DIR).unwrap();
    let open = |p| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p);
    let gate = open(MOUNT_LOCK).unwrap();
    assert_eq!(unsafe { libc::flock(gate.as_raw_fd(), libc::LOCK_EX) }, 0);
    let users = open(USERS_LOCK).unwrap();
    unsafe { libc::flock(users.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// One `read()`: tracefs `filter` files answer only the read at offset 0 (see tracefs.rs).
fn read(p: &Path) -> String {
    use std::io::Read;
    let mut f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut buf = vec![0u8; 64 * 1024];
    let n = f.read(&mut buf).unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

/// The global state a catcher must never change.
fn global_state(root: &Path) -> Vec<(String, String)> {
    [
        "tracing_on",
        "current_tracer",
        "set_event",
        "trace_clock",
        "events/kmem/mm_page_alloc/enable",
        "events/kmem/mm_page_alloc/filter",
        "events/kmem/mm_page_alloc/trigger",
        "buffer_size_kb",
    ]
    .iter()
    .map(|f| (f.to_string(), read(&root.join(f))))
    .collect()
}

fn gettid() -> i32 {
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

#[test]
fn catcher_lifecycle_on_this_host() {
    let Some(_g) = root_or_skip() else { return };
    let (foreign, others) = mount_before();

    let c = Catcher::start(3).unwrap();
    let dir = c.instance_dir().to_path_buf();
    // `fraglab-<pid>`, or `fraglab-<pid>-<n>` when another test thread's catcher has that name.
    let name = dir.file_name().unwrap().to_str().unwrap().to_string();
    let base = format!("fraglab-{}", std::process::id());
    assert!(name == base || name.starts_with(&format!("{base}-")), "{name}");
    assert_eq!(c.mounted_tracefs(), !foreign, "fraglab mounted it, this process or another");
    assert!(!tracefs_mounts().is_empty());
    let event = dir.join("events/kmem/mm_page_alloc");
    assert_eq!(read(&event.join("filter")).trim(), failure_filter(3));
    assert_eq!(c.filter(), failure_filter(3));
    assert_eq!(read(&event.join("trigger")).trim(), format!("stacktrace:unlimited if {}", failure_filter(3)));
    // `1*`: enabled, and the `*` says a trigger is attached.
    assert_eq!(read(&event.join("enable")).trim(), "1*");
    assert_eq!(c.clock(), "mono");
    assert!(read(&dir.join("trace_clock")).contains("[mono]"));

    // A second catcher, its own instance; the global state around it must not move.
    let root = dir.parent().unwrap().parent().unwrap().to_path_buf();
    let before = global_state(&root);
    let opts = Options { extfrag: true, ..Options::failures(4) };
    let c2 = Catcher::start_with(opts).unwrap();
    let dir2 = c2.instance_dir().to_path_buf();
    assert_ne!(dir2, dir);
    assert_eq!(read(&dir2.join("events/kmem/mm_page_alloc_extfrag/enable")).trim(), "1");
    std::thread::sleep(Duration::from_millis(200));
    let s2 = c2.stop().unwrap();
    assert!(!s2.unmounted, "the first catcher still uses tracefs");
    assert!(!dir2.exists());
    assert_eq!(global_state(&root), before);

    // Nothing fails here: an empty drain, then a clean stop.
    assert!(c.drain().iter().all(|f| f.failed && f.order >= 3));
    let s = c.stop().unwrap();
    assert!(s.failures.iter().all(|f| f.failed));
    assert!(!dir.exists(), "instance left behind");
    if !others {
        assert_eq!(s.unmounted, !foreign);
        assert_eq!(!tracefs_mounts().is_empty(), foreign, "tracefs mount state changed");
    }
}

#[test]
fn real_events_of_this_thread_parse() {
    let Some(_g) = root_or_skip() else { return };
    let tid = gettid();
    let opts = Options { min_order: 2, failures_only: false, pid: Some(tid), stacks: true, extfrag: false };
    let c = Catcher::start_with(opts).unwrap();
    assert_eq!(c.filter(), format!("order >= 2 && common_pid == {tid}"));

    // Order 2: a pipe's ring for 1 MiB (fs.pipe-max-size) is 256 × 40 bytes, kmalloc'ed.
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    assert_eq!(unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 1 << 20) }, 1 << 20);
    // Order 3: AF_UNIX stream sends build skbs from order-3 page frags.
    let (mut a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let size: libc::c_int = 1 << 20;
    unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &size as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    a.write_all(&[0u8; 65536]).unwrap();

    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline
        && !(events.iter().any(|e: &AllocFailure| e.order == 2) && events.iter().any(|e| e.order >= 3))
    {
        std::thread::sleep(Duration::from_millis(100));
        events.extend(c.drain());
    }
    let stopped = c.stop().unwrap();
    events.extend(stopped.failures);
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    assert!(stopped.unparsed.is_empty(), "{:?}", stopped.unparsed);
    assert!(events.iter().all(|e| e.pid == tid && !e.failed && e.pfn.is_some() && e.order >= 2));
    let pipe =
        events.iter().find(|e| e.stack.iter().any(|f| f == "pipe_resize_ring")).expect("pipe ring event");
    assert_eq!(pipe.order, 2);
    let unix =
        events.iter().find(|e| e.stack.iter().any(|f| f == "unix_stream_sendmsg")).expect("unix send event");
    assert_eq!(unix.order, 3);
    assert!(unix.gfp_flags.contains(&"__GFP_COMP".to_string()));
    assert!(unix.gfp_mask.is_some_and(|m| m & (1 << 18) != 0), "{:?}", unix.gfp_mask);
    // mono clock: event times are CLOCK_MONOTONIC seconds, so close to ours.
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let now = ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9;
    assert!((now - unix.time).abs() < 30.0, "event at {} but CLOCK_MONOTONIC is {now}", unix.time);
    // The event serialises for alloc_failures.jsonl and comes back equal.
    let json = serde_json::to_string(unix).unwrap();
    assert_eq!(&serde_json::from_str::<AllocFailure>(&json).unwrap(), unix);
}

#[test]
fn dropping_a_catcher_removes_its_instance() {
    let Some(_g) = root_or_skip() else { return };
    let (foreign, others) = mount_before();
    let c = Catcher::start(5).unwrap();
    let dir = c.instance_dir().to_path_buf();
    drop(c);
    assert!(!dir.exists());
    if !others {
        assert_eq!(!tracefs_mounts().is_empty(), foreign);
    }
}

#[test]
fn stale_instances_of_dead_processes_are_removed() {
    let Some(_g) = root_or_skip() else { return };
    // A pid that is not running: beyond pid_max.
    let pid_max: u64 = read(Path::new("/proc/sys/kernel/pid_max")).trim().parse().unwrap();
    let c = Catcher::start(5).unwrap();
    let instances = c.instance_dir().parent().unwrap().to_path_buf();
    let stale = instances.join(format!("fraglab-{}", pid_max + 1));
    std::fs::create_dir(&stale).unwrap();
    let c2 = Catcher::start(5).unwrap();
    let gone = !stale.exists();
    let _ = std::fs::remove_dir(&stale);
    c2.stop().unwrap();
    c.stop().unwrap();
    assert!(gone, "{} survived", stale.display());
}
