//! The whole-machine path (no budget) on this host, as `fraglab fragment --max-free-order 4 --free
//! 4GiB --daemon` once hung here holding 23.7 GiB: populating asked for less than a page and spun.
//! A `--reserve` that leaves all but 1–2 GiB alone takes the same path without starving the
//! machine; the reserve is then many GiB, which is also what the pipe fill must cope with. Every
//! figure is varied — what is taken, its alignment, when a release or signal comes — because one
//! that happens to line up proves nothing.
//!
//! Sysctls are compared holding the machine-wide instance lock, so no other fraglab (another test
//! binary, an engineer's run) is changing them at that moment.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;

mod common;
use common::{command, fraglab, sysctls_at_rest, vm_lck, wait_until, Running};

const MIB: u64 = 1 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-whole-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn text(o: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn mem_available() -> u64 {
    fraglab_fragmenter::fragment::mem_available().unwrap()
}

/// A `--reserve` in bytes that leaves about `take` of MemAvailable to the fragmenter, off by `skew`
/// bytes so the figure it computes is not page-aligned.
fn reserve_leaving(take: u64, skew: u64) -> String {
    (settled_mem_available().saturating_sub(take) + skew).to_string()
}

/// MemAvailable once it has stopped moving: five readings 100 ms apart within 4 MiB. Right after
/// another test's daemon let go of gigabytes it was seen 64 MiB lower and 128 MiB higher a moment
/// later (most likely pages still on their way back through the per-CPU lists), and a reserve
/// computed from a drifting figure leaves the daemon, which reads it a moment later, more or less
/// than the test meant (a step took 1408 MiB for 1280). Settled, every step took what it asked.
fn settled_mem_available() -> u64 {
    const BOUND: Duration = Duration::from_secs(30);
    let start = std::time::Instant::now();
    let mut seen: Vec<u64> = Vec::new();
    loop {
        seen.push(mem_available());
        let last = &seen[seen.len().saturating_sub(5)..];
        let (lo, hi) = (last.iter().min().unwrap(), last.iter().max().unwrap());
        if last.len() == 5 && hi - lo <= 4 * MIB {
            eprintln!("MemAvailable settled after {:?} ({} readings)", start.elapsed(), seen.len());
            return *last.last().unwrap();
        }
        let mib: Vec<u64> = last.iter().map(|b| b >> 20).collect();
        assert!(
            start.elapsed() < BOUND,
            "MemAvailable still moving after {BOUND:?} (a hang guard): {mib:?} MiB"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A daemon this test started in `dir`: released when the test ends, also when an assertion fails
/// — a failed test must not leave the machine held (the next test would queue behind it).
struct Daemon(PathBuf);

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = fraglab(&self.0, &["release"]);
        }
    }
}

/// `fraglab status --json` of the fragmenter holding `dir`, when one answers.
fn status(dir: &Path) -> Option<serde_json::Value> {
    let out = fraglab(dir, &["status", "--json"]);
    // Exit 1 when the target is lost now, or while shaping: the answer is on stdout all the same.
    serde_json::from_slice(&out.stdout).ok()
}

/// The fix's own arithmetic: every step of populating adds at least a page, whatever the figures.
#[test]
fn populate_limits_are_whole_pages_at_every_alignment() {
    use fraglab_fragmenter::fragment::populate_limits;
    for avail in [(1 << 30) + 1, (22 << 30) + 4095, 987_654_321_123, 4097, 0] {
        for reserve in [0, 1, 4095, 4097, 64 << 20, (64 << 20) + 12345, avail] {
            for budget in [None, Some(1 << 20), Some((256 << 20) + 1), Some(12345)] {
                for small in [0, 1, 3 << 30, (3 << 30) + 777] {
                    let (total, cap) = populate_limits(budget, avail, reserve, small);
                    assert_eq!(total % 4096, 0, "{budget:?} {avail} {reserve}");
                    assert_eq!(cap % 4096, 0, "{budget:?} {avail} {reserve} {small}");
                    assert!(cap >= total);
                    assert!(total <= budget.unwrap_or(avail.saturating_sub(reserve)));
                    // The loop's steps: min(64 MiB, cap − held) from 0 reaches cap, a page or more a step.
                    let (mut held, mut steps) = (0u64, 0u64);
                    while held < cap {
                        let step = (64u64 << 20).min(cap - held);
                        assert!(step >= 4096 && step % 4096 == 0, "step {step}");
                        held += step;
                        steps += 1;
                    }
                    assert_eq!(held, cap);
                    assert!(steps <= cap.div_ceil(64 << 20));
                }
            }
        }
    }
}

/// The whole-machine daemon on a host, at several sizes and alignments: it holds, says which bound
/// ended each step, `release` gives everything back with exit 0, and the sysctls are back.
#[test]
fn whole_machine_daemon_on_a_host_holds_and_releases_at_every_alignment() {
    let _s = serial();
    let dir = scratch("daemon");
    let before = sysctls_at_rest(&dir, "the test");
    for (take, skew) in [(1024 * MIB, 0), (1280 * MIB, 1), (1536 * MIB + 12345, 4095), (1100 * MIB, 777_777)]
    {
        let reserve = reserve_leaving(take, skew);
        let _daemon = Daemon(dir.clone());
        let out = fraglab(&dir, &["fragment", "--max-free-order", "4", "--reserve", &reserve, "--daemon"]);
        assert!(out.status.success(), "take {take} skew {skew}: {}", text(&out));
        let s = status(&dir).expect("the daemon answers status");
        let pid = s["pid"].as_i64().unwrap() as i32;
        let bounds: Vec<&str> = s["bounds"].as_array().unwrap().iter().map(|b| b.as_str().unwrap()).collect();
        eprintln!("take {take} skew {skew} reserve {reserve}: {bounds:?}");
        for step in ["populate: ", "settle: ", "rebreak: "] {
            assert!(bounds.iter().any(|b| b.starts_with(step)), "no {step:?} bound in {bounds:?}");
        }
        let held = s["held_bytes"].as_u64().unwrap() + s["freed_bytes"].as_u64().unwrap();
        assert!(held > 512 * MIB && held <= take + 128 * MIB, "took {held} B, asked about {take}");
        assert!(vm_lck(pid) > 0, "the daemon holds mlocked memory");
        // Order 4: the keeper's rings take the reserve's blocks, no pipe page is written (order-0
        // pages would come out of the cut's blocks first).
        assert!(!bounds.iter().any(|b| b.starts_with("fill: ")), "no pipe fill at order 4: {bounds:?}");
        assert_eq!(s["fill_bytes"], 0, "{bounds:?}");
        // The rings never eat into the reserve the rest of the machine was promised: they stop
        // there, and a reserve of many GiB in high-order blocks leaves the target unreached.
        let rebreak = bounds.iter().find(|b| b.starts_with("rebreak: ")).unwrap();
        assert!(
            rebreak.contains("re-breaking paused: an order-") || rebreak.contains("no free block"),
            "the rings ended at the reserve or at the target: {rebreak}"
        );

        let rel = fraglab(&dir, &["release"]);
        assert!(rel.status.success(), "{}", text(&rel));
        let said = String::from_utf8_lossy(&rel.stderr);
        assert!(said.contains("released") && !said.contains("os error"), "{said}");
        assert_eq!(vm_lck(pid), 0, "the daemon let go of its memory");
        assert_eq!(sysctls_at_rest(&dir, "the test"), before, "sysctls after take {take} skew {skew}");
        // The next step's reserve is MemAvailable − take: read while this daemon is still exiting
        // (freeing its page tables, pipes and arena) it comes out low, and the next daemon, reading
        // MemAvailable a moment later, takes more than the step asked (seen: 1408 MiB for 1280).
        wait_until(Duration::from_secs(60), "the released daemon's process has exited", || exited(pid));
    }
}

/// `pid` is gone, or a zombie (its memory is freed before it becomes one; nobody may reap it).
fn exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name, which may itself hold spaces or ')'.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// `release` of a fragmenter still taking memory: it stops between two steps, gives everything
/// back, restores every sysctl and says so — exit 0 — and the daemon's own command says it was
/// released before it held. The release comes at different points of shaping.
#[test]
fn release_while_shaping_stops_it_and_gives_everything_back() {
    let _s = serial();
    let dir = scratch("release");
    let before = sysctls_at_rest(&dir, "the test");
    for (take, after_ms) in [(3072 * MIB, 0), (2560 * MIB + 4097, 300), (3584 * MIB, 800)] {
        let reserve = reserve_leaving(take, 0);
        let mut frag = Running::spawn(
            command(&dir).args(["fragment", "--max-free-order", "4", "--reserve", &reserve, "--daemon"]),
            &dir,
        );
        // Shaping has begun when the control socket answers that it is shaping.
        let mut shaping = None;
        wait_until(Duration::from_secs(600), "the daemon answers status while shaping", || {
            assert!(frag.running() || shaping.is_some(), "it ended before shaping: {}", frag.output());
            shaping = status(&dir).filter(|s| s["shaping"].is_string());
            shaping.is_some()
        });
        std::thread::sleep(Duration::from_millis(after_ms));
        let pid = shaping.unwrap()["pid"].as_i64().unwrap() as i32;
        let rel = fraglab(&dir, &["release"]);
        assert!(rel.status.success(), "{}", text(&rel));
        let said = String::from_utf8_lossy(&rel.stderr).into_owned();
        assert!(!said.contains("os error"), "{said}");
        let code = frag.wait_for(Duration::from_secs(120)).expect("the daemon's command ends").code();
        if said.contains("while still shaping") {
            assert_eq!(code, Some(1), "released before it held: {}", frag.output());
            assert!(frag.stderr().contains("stopped by `fraglab release`"), "{}", frag.output());
        } else {
            // Shaping finished between the status and the release: an ordinary release.
            assert_eq!(code, Some(0), "{}", frag.output());
        }
        assert!(said.contains("restored vm.percpu_pagelist_high_fraction"), "{said}");
        wait_until(Duration::from_secs(30), "the daemon exits", || vm_lck(pid) == 0);
        assert_eq!(sysctls_at_rest(&dir, "the test"), before, "sysctls after a release at {after_ms} ms");
    }
}

/// SIGINT (Ctrl-C) while a foreground whole-machine fragmenter shapes: the same clean stop.
#[test]
fn sigint_while_shaping_stops_it_and_gives_everything_back() {
    let _s = serial();
    let dir = scratch("sigint");
    let before = sysctls_at_rest(&dir, "the test");
    let reserve = reserve_leaving(3 * 1024 * MIB, 123);
    let mut frag = Running::spawn(
        command(&dir).args(["fragment", "--max-free-order", "4", "--reserve", &reserve]),
        &dir,
    );
    wait_until(Duration::from_secs(600), "the fragmenter answers status while shaping", || {
        assert!(frag.running(), "it ended before shaping: {}", frag.output());
        status(&dir).is_some_and(|s| s["shaping"].is_string())
    });
    frag.signal(Signal::SIGINT);
    let code = frag.wait_for(Duration::from_secs(120)).expect("SIGINT ends it").code();
    let err = frag.stderr();
    if err.contains("stopped by a signal") {
        assert_eq!(code, Some(1), "{}", frag.output());
        assert!(err.contains("nothing is held"), "{err}");
    } else {
        assert_eq!(code, Some(0), "held by the time the signal came, then released: {}", frag.output());
    }
    assert_eq!(vm_lck(frag.pid()), 0);
    assert_eq!(sysctls_at_rest(&dir, "the test"), before);
}

/// The pipe fill of a whole-machine hold whose reserve is many GiB, under the common descriptor
/// limit of 1024: at 1 MiB a pipe the fill would run out of descriptors after ~1 GiB (it once ended
/// in EMFILE here); it sizes its pipes to the descriptors it has instead, raising
/// fs.pipe-max-size through the journal, and restores it on release.
#[test]
fn a_fill_of_many_gib_fits_in_1024_descriptors() {
    use std::os::unix::process::CommandExt;
    let _s = serial();
    let dir = scratch("fill");
    let before = sysctls_at_rest(&dir, "the test");
    let reserve = reserve_leaving(6 << 30, 4095);
    let mut cmd = command(&dir);
    // Without the keeper the reserve's blocks are broken up with pipe pages (order 4 and up, the
    // keeper's rings take them instead).
    cmd.args(["fragment", "--max-free-order", "4", "--no-keep", "--reserve", &reserve, "--daemon"]);
    // SAFETY: prctl and setrlimit are plain system calls, safe between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // Without CAP_SYS_RESOURCE (after exec: it leaves the bounding set) fraglab cannot raise
            // the hard limit, as on this VM; an ordinary root would raise it to fs.nr_open and the
            // fill would never have to size its pipes. CAP_SYS_RESOURCE is 24 (linux/capability.h).
            const CAP_SYS_RESOURCE: libc::c_ulong = 24;
            if libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let lim = libc::rlimit { rlim_cur: 1024, rlim_max: 1024 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let _daemon = Daemon(dir.clone());
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let s = status(&dir).expect("the daemon answers status");
    let pid = s["pid"].as_i64().unwrap() as i32;
    let fill = s["fill_bytes"].as_u64().unwrap();
    let bounds: Vec<&str> = s["bounds"].as_array().unwrap().iter().map(|b| b.as_str().unwrap()).collect();
    eprintln!("filled {} MiB: {bounds:?}", fill >> 20);
    let limit = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    assert!(limit.lines().any(|l| l.starts_with("Max open files") && l.contains(" 1024 ")), "{limit}");
    assert!(fill > 2 << 30, "a fill of many GiB: {} MiB", fill >> 20);
    let pipe_max: u64 = fraglab_fragmenter::sysctl::read("fs.pipe-max-size").unwrap().parse().unwrap();
    assert!(pipe_max >= 4 << 20, "pipes larger than 1 MiB: fs.pipe-max-size {pipe_max}");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    assert!(fds < 1024 && fds as u64 >= fill / pipe_max, "{fds} descriptors for {} MiB", fill >> 20);
    let fill_bound = bounds.iter().find(|b| b.starts_with("fill: ")).unwrap();
    assert!(!fill_bound.contains("descriptors"), "{fill_bound}");

    let rel = fraglab(&dir, &["release"]);
    assert!(rel.status.success(), "{}", text(&rel));
    assert!(String::from_utf8_lossy(&rel.stderr).contains("fs.pipe-max-size = "), "{}", text(&rel));
    assert_eq!(vm_lck(pid), 0);
    assert_eq!(sysctls_at_rest(&dir, "the test"), before);
}

/// Memory pressure on a whole-machine hold: the guard gives back the arena's chunks — counted as the
/// memory they still hold after the cut, a sixteenth of their mapping — and then the reserve's
/// unmovable blocks (the keeper's rings at order 4; the pipe fill's pages with `--no-keep`), in the
/// same step, until the floor is met again. (Counting mappings, the first step "gave back" 256 MiB
/// while freeing 16, and never reached the pipes.)
#[test]
fn pressure_on_a_whole_machine_hold_gives_back_chunks_then_rings_or_pipes() {
    let _s = serial();
    let dir = scratch("pressure");
    let before = sysctls_at_rest(&dir, "the test");
    // This host's free memory starts with ~2 GiB of small blocks, which populating soaks up first
    // and which form few whole regions: 3 GiB leaves the cut enough to free (2 GiB once freed 5 MiB).
    for (keep, take) in [(true, 3072 * MIB), (false, 3328 * MIB + 4097)] {
        let avail = mem_available();
        // The floor sits 128 MiB above the reserve, so the rings (or the fill) stop above the
        // floor by the margin for MemAvailable's noise and for free page reporting (this VM's
        // balloon holds up to 128 MiB off the free lists at a time: with a 128 MiB margin in all,
        // a CI run began its hold 3 MiB above the floor and the guard went off before the hog),
        // with what the cut freed beyond that holding the reserve's high-order blocks.
        let reserve = avail - take;
        let floor = reserve + 128 * MIB;
        let _daemon = Daemon(dir.clone());
        let (reserve, floor) = (reserve.to_string(), floor.to_string());
        let mut args = vec!["fragment", "--max-free-order", "4", "--reserve", &reserve, "--floor", &floor];
        args.extend(if keep { &["--daemon"][..] } else { &["--no-keep", "--daemon"][..] });
        let out = fraglab(&dir, &args);
        let at = if keep { "rings" } else { "pipes" };
        assert!(out.status.success(), "{at}: {}", text(&out));
        let s = status(&dir).expect("the daemon answers status");
        let pid = s["pid"].as_i64().unwrap() as i32;
        let held = s["held_bytes"].as_u64().unwrap();
        let unmovable = |s: &serde_json::Value| {
            s["fill_bytes"].as_u64().unwrap() + s["keeping"]["added_bytes"].as_u64().unwrap()
        };
        let (fill, rings) =
            (s["fill_bytes"].as_u64().unwrap(), s["keeping"]["added_bytes"].as_u64().unwrap());
        eprintln!(
            "{at}: holding {} MiB in the arena, {} MiB in pipes, {} MiB in rings: {}",
            held >> 20,
            fill >> 20,
            rings >> 20,
            s["bounds"]
        );
        match keep {
            true => assert!(fill == 0 && rings >= 32 * MIB, "{at}: the rings this test needs: {s}"),
            false => assert!(rings == 0 && fill >= 32 * MIB, "{at}: the fill this test needs: {s}"),
        }
        assert!(s["events"].as_array().unwrap().is_empty(), "{at}: no pressure yet: {}", s["events"]);
        let reporting = fraglab_probe::page_reporting::PageReporting::read().unwrap();
        let bounds = s["bounds"].as_array().unwrap().iter().map(|b| b.as_str().unwrap());
        assert_eq!(
            bounds
                .filter(|b| b.starts_with("free page reporting (") && b.contains("above the floor"))
                .count(),
            usize::from(reporting.is_some()),
            "{at}: the bounds say whether page reporting decided the margin ({reporting:?}): {}",
            s["bounds"]
        );

        // Cross the floor by everything the arena holds and half the rings or pipes.
        let floor_bytes: u64 = floor.parse().unwrap();
        let hog = common::Hog::take(
            (mem_available().saturating_sub(floor_bytes) + held + unmovable(&s) / 2) as usize,
        );
        // The guard answers every 200 ms while the hog faults in, each time with what it takes then.
        let mut after = serde_json::Value::Null;
        wait_until(Duration::from_secs(60), "the guard meets the floor again (a hang guard)", || {
            after = status(&dir).unwrap();
            mem_available() >= floor_bytes && !after["events"].as_array().unwrap().is_empty()
        });
        let events: Vec<&str> =
            after["events"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
        eprintln!("{at}: {events:#?}");
        assert!(events.iter().all(|e| e.contains("fell below the floor")), "{at}: {events:?}");
        assert!(
            events.iter().any(|e| e.contains("of it pipe pages and rings")),
            "{at}: given back too: {events:?}"
        );
        assert!(unmovable(&after) < unmovable(&s), "{at}: {after}");
        let piped: u64 =
            after["give_backs"].as_array().unwrap().iter().map(|g| g["pipe_bytes"].as_u64().unwrap()).sum();
        assert_eq!(
            piped,
            unmovable(&s) - unmovable(&after),
            "{at}: give_backs count the rings and pipes: {after}"
        );
        assert_eq!(after["held_bytes"], 0, "{at}: every chunk went before any ring or pipe: {after}");
        assert!(
            after["target_lost"].as_str().is_some_and(|t| t.contains("memory pressure")),
            "{at}: {after}"
        );
        drop(hog);

        let rel = fraglab(&dir, &["release"]);
        assert!(rel.status.success(), "{at}: {}", text(&rel));
        wait_until(Duration::from_secs(60), "the released daemon's process has exited", || exited(pid));
        assert_eq!(vm_lck(pid), 0);
        assert_eq!(sysctls_at_rest(&dir, "the test"), before, "{at}");
    }
}
