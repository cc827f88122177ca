//! `fraglab scan` as a user runs it, on the real reports in crates/probe/tests/captures/kmsg (their
//! sources are in that directory's README): counts, JSON, and every profile it prints accepted,
//! verbatim through a shell, by `fraglab fragment --profile … --dry-run`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

fn capture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../probe/tests/captures/kmsg").join(name)
}

/// A scratch run directory, so no command here can touch a real fragmenter's journal.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("fraglab-scan-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(FRAGLAB).arg("--run-dir").arg(self.0.join("run")).args(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "fraglab {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scan_json(s: &Scratch, name: &str) -> Value {
    let path = capture(name);
    serde_json::from_str(&s.ok(&["scan", path.to_str().unwrap(), "--json"])).unwrap()
}

#[test]
fn failure_report_with_mem_info() {
    let s = Scratch::new("xorg");
    let path = capture("linux-mm-2019-08-05-xorg-order4.dmesg");
    let out = s.ok(&["scan", path.to_str().unwrap()]);
    assert!(out.contains("Page allocation failures: 1"), "{out}");
    assert!(out.contains("order 4 (64K) ×1"), "{out}");
    assert!(out.contains("×1    0x40dc0(GFP_KERNEL|__GFP_COMP|__GFP_ZERO)"), "{out}");
    assert!(out.contains("×1    Xorg"), "{out}");
    assert!(
        out.contains(
            "  by caller (first function outside the allocator ← its caller):\n    surfaced (no known \
             fallback: the caller got the failure)\n      order 4 ×1 from dc_create_state ← amdgpu_dm_atomic_commit_tail, then commit_tail ← drm_atomic_helper_commit \
             ← drm_atomic_helper_disable_plane ← drm_mode_cursor_universal\n"
        ),
        "{out}"
    );
    assert!(out.contains("Mem-Info free areas: 3"), "{out}");
    // Σ n·2^(o+1) pages = 95 270 pages = 372.15 MiB: 373MiB builds it unscaled.
    assert!(out.contains(
        "fraglab fragment --profile \"Node 0 Normal: 3277*4kB (UME) 1459*8kB (UME) 2012*16kB (UME) \
         1869*32kB (UMEH) 742*64kB (UMEH) 178*128kB (UMEH) 14*256kB (UM) 0*512kB 0*1024kB 0*2048kB \
         0*4096kB = 190636kB\" --budget 373MiB"
    ));
    assert!(out.contains("without it the fragmenter shapes the whole machine"), "{out}");
    assert!(out.contains("line 73: Node 0 Normal, 190636 kB free, largest free order 6, after line 1: Xorg order-4 allocation failure"), "{out}");

    let j = scan_json(&s, "linux-mm-2019-08-05-xorg-order4.dmesg");
    assert_eq!(j["lines"], 85);
    assert_eq!(j["by_order"]["4"], 1);
    assert_eq!(j["by_command"]["Xorg"], 1);
    assert_eq!(j["failures"][0]["event"]["kind"], "alloc_failure");
    assert_eq!(j["failures"][0]["event"]["gfp"]["mask"], 0x40dc0);
    assert_eq!(j["failures"][0]["timestamp"], 3225.313209);
    assert_eq!(j["profiles"].as_array().unwrap().len(), 3);
    assert_eq!(j["profiles"][2]["area"]["free"][3], 1869);
    assert_eq!(j["profiles"][2]["budget_bytes"], 373u64 << 20);
    assert_eq!(j["by_caller"][0]["site"]["function"], "dc_create_state");
    assert_eq!(j["by_caller"][0]["site"]["caller"], "amdgpu_dm_atomic_commit_tail");
    assert_eq!(j["failures"][0]["event"]["stack"].as_array().unwrap().len(), 42);
    assert_eq!(j["warnings"].as_array().unwrap().len(), 0);
}

#[test]
fn oom_logs() {
    let s = Scratch::new("oom");
    let j = scan_json(&s, "linux-mm-2019-01-06-memcg-oom.dmesg");
    assert_eq!(j["oom_invoked"].as_array().unwrap().len(), 4);
    let pids: Vec<_> =
        j["oom_killed"].as_array().unwrap().iter().map(|k| k["event"]["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids, [8204, 8205, 8206, 8203]);
    assert_eq!(j["oom_no_victim"], 2);
    assert_eq!(j["failures"].as_array().unwrap().len(), 0);

    let path = capture("linux-mm-2016-08-02-oom.syslog");
    let out = s.ok(&["scan", path.to_str().unwrap()]);
    assert!(
        out.contains(
            "invoked by x2golistsession, order 2, gfp_mask=0x27000c0(GFP_KERNEL_ACCOUNT|__GFP_NOTRACK)"
        ),
        "{out}"
    );
    assert!(out.contains("after line 1: x2golistsession invoked the OOM killer (order 2)"), "{out}");
}

/// Logs concatenated from every capture, through stdin: the forms mix without confusing each other.
#[test]
fn every_capture_through_stdin() {
    let s = Scratch::new("stdin");
    let mut all = String::new();
    let mut names: Vec<_> = std::fs::read_dir(capture(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".md") && !n.ends_with(".raw"))
        .collect();
    names.sort();
    for n in &names {
        all.push_str(&std::fs::read_to_string(capture(n)).unwrap());
        all.push('\n');
    }
    let mut child = Command::new(FRAGLAB)
        .arg("--run-dir")
        .arg(s.0.join("run"))
        .args(["scan", "-", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(all.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["file"], "<stdin>");
    // Xorg, ksoftirqd/0, libxl-save-help, glusterfsd + 4 swapper, swapper (RHEL 2.6.32 order 2),
    // java, swapper/12, dmwb_writeback_, node_exporter; then one from each of the 22 captures of
    // every era and architecture (README, second table) that has its header, two of them the same
    // interleaved MIPS CPU 3 in two windows; and the ppc64 one printed with a vmalloc line. The
    // other nine warn_alloc reports (vmalloc errors, stalls) are no failures. Then the five of the
    // README's third table (radeon, two MHI, r8152, proc_sys).
    assert_eq!(j["failures"].as_array().unwrap().len(), 41);
    assert_eq!(j["by_command"]["swapper"], 7);
    assert_eq!(j["by_command"]["swapper/3"], 2);
    assert_eq!(j["by_order"]["1"], 7);
    assert_eq!(j["by_order"]["4"], 6);
    assert_eq!(j["by_order"]["5"], 6);
    // 48 Mem-Info free areas and the mail's 6 buddyinfo lines.
    assert_eq!(j["profiles"].as_array().unwrap().len(), 54);
    let callers: Vec<String> = j["by_caller"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["site"].is_null())
        .map(|g| format!("{} {}", g["order"], g["site"]["function"].as_str().unwrap()))
        .collect();
    assert_eq!(callers.len(), 28, "{callers:?}");
    for site in [
        "0 fdb_create",
        "4 alloc_empty_pages",
        "1 sk_alloc",
        "7 vb2_dc_alloc",
        "10 atomic_pool_expand",
        "0 alloc_large_system_hash",
    ] {
        assert!(callers.iter().any(|c| c == site), "{site} in {callers:?}");
    }
    // Three call traces whose headers are not in the log, and the yavta log's free-area line cut
    // at a terminal's width.
    let warnings: Vec<&str> = j["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
    assert_eq!(warnings.iter().filter(|w| w.contains("call trace without its")).count(), 3, "{warnings:?}");
    assert_eq!(warnings.len(), 4, "{warnings:?}");
}

/// A free-area line as the log has it, stamp and prefixes included, is a `--profile` (what a
/// user pastes from a bug report, not what scan re-prints).
#[test]
fn raw_log_lines_are_profiles() {
    let s = Scratch::new("raw");
    for (name, zone) in [
        ("lkml-2022-06-03-android-system-server-order0-selinux.dmesg", "Normal"),
        ("lkml-2020-06-13-android-arm64-binder-order0-callercol.dmesg", "Normal"),
        ("linux-mm-2019-08-05-xorg-order4.dmesg", "Normal"),
        ("linux-mm-2016-08-02-oom.syslog", "DMA32"),
        ("lkml-2022-08-23-sle15-x86-swapper-order10-dmapool-callerid-8node.dmesg", "DMA"),
    ] {
        let text = std::fs::read_to_string(capture(name)).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains(&format!(" {zone}: ")) && l.contains("kB ="))
            .unwrap_or_else(|| panic!("{name}: no {zone} free-area line"));
        // The counts before each `*`, read off the line by eye's rule.
        let counts: Vec<&str> =
            line.split_whitespace().filter_map(|w| w.split_once('*')).map(|(n, _)| n).collect();
        let counts = counts.join(" ");
        let out = s.run(&["fragment", "--profile", line, "--budget", "64MiB", "--dry-run"]);
        let (plan, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        // This host's node 0 has DMA, DMA32 and Normal: only Normal's pages are a budget's.
        match zone {
            "Normal" => {
                assert!(out.status.success(), "{line}: {err}");
                let node = if line.contains("Node 0 ") { "Node 0, " } else { "" };
                assert!(
                    plan.contains(&format!("profile of {node}zone {zone}: free blocks per order {counts}")),
                    "{line}: {plan}"
                );
                assert!(plan.contains("dry run: nothing taken, nothing changed"), "{plan}");
            }
            "DMA32" => {
                assert_eq!(out.status.code(), Some(1), "{line}: {plan}");
                assert!(
                    err.contains("Node 0, zone DMA32 with a budget: user pages come from node 0's highest zone, Normal"),
                    "{err}"
                );
            }
            _ => {
                assert_eq!(out.status.code(), Some(1), "{line}: {plan}");
                assert!(err.contains("zone DMA cannot be shaped"), "{err}");
            }
        }
    }
}

/// Seed 000: a mail quoting `/proc/buddyinfo` and nothing from the kernel log. Every pasted line
/// is a target, with the budget that builds it unscaled.
#[test]
fn quoted_buddyinfo_lines_are_targets() {
    let s = Scratch::new("buddyinfo");
    let path = capture("netdev-2018-08-10-sctp-buddyinfo.mail");
    let out = s.ok(&["scan", path.to_str().unwrap()]);
    assert!(out.contains("Mem-Info free areas: 0\nbuddyinfo lines: 6\n"), "{out}");
    // docs/fragmenter.md: `40773 37 34 29 0 …` needs 82 430 pages, 321.99 MiB.
    assert!(
        out.contains(
            "  line 37: Node 0 Normal (buddyinfo), 41215 pages free, largest free order 3\n    fraglab fragment \
             --profile \"Node 0, zone Normal 40773 37 34 29 0 0 0 0 0 0 0\" --budget 322MiB\n"
        ),
        "{out}"
    );
    let j = scan_json(&s, "netdev-2018-08-10-sctp-buddyinfo.mail");
    let p = &j["profiles"][3];
    assert_eq!(
        (p["source"].as_str(), p["zone"].as_str(), p["line"].as_u64()),
        (Some("buddyinfo"), Some("Normal"), Some(37))
    );
    assert_eq!(p["budget_bytes"], 322u64 << 20);
    assert!(p["area"].is_null());
}

/// Every profile scan prints is a command the fragmenter takes as it is, quotes and all.
#[test]
fn printed_profiles_are_accepted_by_fragment_dry_run() {
    let s = Scratch::new("dry");
    let (mut n, mut refused, mut dma) = (0, 0, 0);
    for name in [
        "linux-mm-2019-08-05-xorg-order4.dmesg",
        "linux-mm-2016-08-02-oom.syslog",
        "dcache-3787-swapper-order0.dmesg",
        "netdev-2018-08-10-sctp-buddyinfo.mail",
    ] {
        let j = scan_json(&s, name);
        // The mail's unfragmented 32 GiB machine needs more than this one has.
        for p in j["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["budget_bytes"].as_u64().unwrap() <= 1 << 30)
        {
            // DMA lines get no command, only the reason.
            let Some(command) = p["command"].as_str() else {
                assert_eq!(p["zone"], "DMA", "{p}");
                assert!(p["note"].as_str().unwrap().contains("zone DMA cannot be shaped"), "{p}");
                dma += 1;
                continue;
            };
            let rest = command.strip_prefix("fraglab ").unwrap();
            let shell = format!("'{FRAGLAB}' --run-dir '{}' {rest} --dry-run", s.0.join("run").display());
            let out = Command::new("sh").arg("-c").arg(&shell).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            // This host has one node: another node's line is refused, with nothing taken.
            if let Some(n) = p["node"].as_u64().filter(|&n| n > 0) {
                assert_eq!(out.status.code(), Some(1), "{shell}: {err}");
                assert!(err.contains(&format!("node {n} does not exist here")), "{err}");
                refused += 1;
                continue;
            }
            assert!(out.status.success(), "{shell}: {err}");
            let plan = String::from_utf8_lossy(&out.stdout);
            let zone = p["zone"].as_str().unwrap();
            let node = p["node"].as_u64().map_or_else(String::new, |n| format!("Node {n}, "));
            let free: Vec<String> = p["free"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
            assert!(
                plan.contains(&format!(
                    "profile of {node}zone {zone}: free blocks per order {}",
                    free.join(" ")
                )),
                "{plan}"
            );
            // A zone below its node's highest is a whole-machine target, and says why.
            if command.contains("--budget") {
                let budget =
                    format!("take:     {}.00 MiB (budget)", p["budget_bytes"].as_u64().unwrap() >> 20);
                assert!(plan.contains(&budget), "{budget} in {plan}");
                assert!(p["note"].is_null(), "{p}");
            } else {
                assert!(plan.contains("target:   whole machine"), "{plan}");
                assert!(p["note"].as_str().unwrap().contains("whole-machine target"), "{p}");
            }
            assert!(plan.contains("dry run: nothing taken, nothing changed"), "{plan}");
            n += 1;
        }
    }
    // Accepted (budget or whole machine), another node's, DMA.
    assert_eq!((n, refused, dma), (7, 1, 2));
}

#[test]
fn errors_and_warnings_name_the_file() {
    let s = Scratch::new("errors");
    let missing = s.0.join("no-such.log");
    let out = s.run(&["scan", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot read {}", missing.display())), "{err}");

    let bad = s.0.join("bad.log");
    std::fs::write(
        &bad,
        "[    1.000000] fine\n[    2.000000] x: page allocation failure: order:x, mode:0x20\n[    3.000000] Node 0 Normal: 1*4kB 1*8kB = 16kB\n",
    )
    .unwrap();
    let out = s.run(&["scan", bad.to_str().unwrap()]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("fraglab scan: warning: {}:2: ", bad.display())), "{err}");
    assert!(
        err.contains(&format!("{}:3: the entries add up to 12kB but the line says = 16kB", bad.display())),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 line(s) could not be read"));
}

/// `fraglab scan LOG | head`: when the reader has gone, scan (like probe, compare and status) dies
/// of SIGPIPE as cat does, instead of panicking with "failed printing to stdout". The pipe's read
/// end is closed before scan starts, so its first write meets no reader.
#[test]
fn a_reader_gone_ends_scan_quietly_as_cat() {
    use std::os::unix::process::ExitStatusExt;
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(FRAGLAB)
        .args(["scan", capture("host-6.18-dmesg.txt").to_str().unwrap()])
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
