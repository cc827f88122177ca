//! `fraglab repro REPORT --dry-run` as a user runs it, on the real reports in
//! crates/probe/tests/captures/kmsg (their sources are in that directory's README): the failure
//! chosen, the path to it (same call site, same-order proxy and what is missing), the guest, the
//! config — and bad input refused with the line, writing nothing.

use std::path::PathBuf;
use std::process::{Command, Output};

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

fn capture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../probe/tests/captures/kmsg").join(name)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-repro-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn repro(report: &std::path::Path, out: &std::path::Path) -> Output {
    Command::new(FRAGLAB)
        .arg("--run-dir")
        .arg(out.join("run"))
        .args(["repro", "--dry-run", "-o"])
        .arg(out.join("repro"))
        .arg(report)
        .output()
        .unwrap()
}

/// The dry run's stdout, asserting exit 0 and that nothing was written.
fn dry_run(name: &str) -> String {
    let out = scratch(name);
    let o = repro(&capture(name), &out);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{name}: {stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(!out.join("repro").exists(), "{name}: a dry run wrote {}", out.join("repro").display());
    std::fs::remove_dir_all(&out).unwrap();
    stdout
}

fn line_of<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no `{start}` line in:\n{text}"))
}

/// The reports of several eras and architectures, each with the path fraglab chooses and what it
/// says is missing (the reader's column of the captures' README: call site ← caller).
#[test]
fn real_reports_get_a_path_and_say_what_is_missing() {
    // (capture, order, call site, path words, missing words)
    let cases: &[(&str, u32, &str, &str, &str)] = &[
        (
            "lkml-2020-10-26-kmalloc-order-dc-create-state-order5.txt",
            5,
            "dc_create_state ← amdgpu_dm_atomic_commit_tail",
            "same-order proxy",
            "device driver's: it needs an AMD GPU",
        ),
        (
            "linux-media-2026-03-20-uvcvideo-dma-direct-order5.dmesg",
            5,
            "uvc_alloc_urb_buffers ← uvc_video_start_transfer",
            "same-order proxy",
            "(module uvcvideo): it needs a USB video camera",
        ),
        (
            "linux-input-2024-05-22-oppo-arm64-kworker-order4-hid-colon.dmesg",
            4,
            "hid_add_field ← hid_parser_main",
            "same-order proxy",
            "it needs a HID device",
        ),
        (
            "xen-devel-2020-07-22-order4.serial",
            4,
            "alloc_empty_pages ← privcmd_ioctl_mmap_batch",
            "same-order proxy",
            "Xen's privcmd device",
        ),
        (
            "porjo-mt7601-21-2015-04-08-kirkwood-khubd-order5-fragment.syslog",
            5,
            "RTMPAllocUsbBulkBufStruct",
            "same-order proxy",
            "a Ralink USB Wi-Fi adapter",
        ),
        (
            "stable-2021-10-06-kmalloc-order-trace-nfsd-order5.dmesg",
            5,
            "nfsd_reply_cache_init ← nfsd_init_net",
            "same-order proxy",
            "nfsd_reply_cache_init has no row in the call-site table",
        ),
        (
            "linux-wireless-2024-02-21-ath11k-mhi-resume-order4.dmesg",
            4,
            "mhi_prepare_channel ← __mhi_prepare_for_transfer",
            "same-order proxy",
            "it needs a Qualcomm MHI device",
        ),
        (
            "linux-wireless-2025-04-10-mhi-bhie-table-order7.dmesg",
            7,
            "mhi_alloc_bhie_table ← mhi_fw_load_handler",
            "same-order proxy",
            "it needs a Qualcomm MHI device",
        ),
        (
            "linux-usb-2023-04-06-r8152-alloc-rx-agg-order3-abridged.txt",
            3,
            "alloc_rx_agg ← r8152_poll",
            "same-order proxy",
            "it needs a Realtek USB Ethernet adapter",
        ),
        (
            "cgroups-2021-02-20-proc-sys-call-handler-order5.dmesg",
            5,
            "proc_sys_call_handler ← proc_sys_read",
            "same-order proxy",
            "proc_sys_call_handler has no row in the call-site table",
        ),
        (
            "writeboost-72-order8.dmesg",
            8,
            "no call trace",
            "same-order proxy",
            "the report printed no call trace",
        ),
    ];
    for (name, order, site, path, missing) in cases {
        let out = dry_run(name);
        let chosen = line_of(&out, " * ");
        assert!(chosen.contains(&format!(" order-{order} allocation failure")), "{name}: {chosen}");
        assert!(chosen.contains(site), "{name}: {chosen}");
        let p = line_of(&out, "path: ");
        assert!(p.starts_with(&format!("path: {path}: ")), "{name}: {p}");
        assert!(line_of(&out, "  missing for the same call site: ").contains(missing), "{name}: {out}");
        // The proxy is one order-N kmalloc'd control buffer, and the config expects it at that order.
        let bytes = (4096u64 << (order - 1)) + 4096;
        assert!(out.contains(&format!("bytes = \"{}KiB\"", bytes >> 10)), "{name}: {out}");
        assert!(out.contains(&format!("[expect]\nfailed_order = {order}\n")), "{name}: {out}");
    }
}

/// A report with its Mem-Info: the free areas become the target file, DMA left out, and the guest
/// is shaped from them.
#[test]
fn a_mem_info_block_is_the_target_and_shapes_the_guest() {
    let out = dry_run("linux-wireless-2024-02-21-ath11k-mhi-resume-order4.dmesg");
    assert!(out.contains("  kernel: 6.8.0-rc3-1.gae4495f-default\n"), "{out}");
    assert!(
        out.contains("\n  Node 0 Normal: 141767*4kB (UME) 25812*8kB (UME) 6*16kB (UM) 10*32kB (U) 0*64kB"),
        "{out}"
    );
    assert!(!out.contains("\n  Node 0 DMA: "), "DMA is left to the kernel: {out}");
    assert!(!out.contains("note: "), "{out}");
    assert!(out.contains("profile_file = \"target.meminfo\""), "{out}");
    let guest = line_of(&out, "guest: ");
    assert!(guest.contains("(line 66: 3870291 pages RAM)"), "{guest}");
    assert!(
        guest.starts_with("guest: --numa-from target.meminfo: ") || guest.contains("SCALED: "),
        "{guest}"
    );
}

/// What cannot be tested exits 125 and says why; what is bad input exits 255 naming the line. Either
/// way nothing is written.
#[test]
fn bad_and_untestable_reports_are_refused_writing_nothing() {
    let cases: &[(&str, i32, &str)] = &[
        ("redhat-rhel6-order1.syslog", 125, "redhat-rhel6-order1.syslog:1: order 1: no workload makes"),
        ("netdev-2022-07-06-ksoftirqd-order0.dmesg", 125, "an order-0 failure is memory running out"),
        // Every zone still had blocks of the failed order: shaped like it, memory cannot fail one.
        (
            "linux-mm-2014-06-27-radeon-cs-ioctl-order4.dmesg",
            125,
            "radeon-cs-ioctl-order4.dmesg:3: every zone of the failure's Mem-Info still had free blocks of order ≥ 4",
        ),
        ("linux-mm-2013-01-28-fallback-alloc-check-partition-order4.dmesg", 125, "order ≥ 4: the reporter's"),
        ("linux-mm-2019-08-05-xorg-order4.dmesg", 125, "still had free blocks of order ≥ 4: the reporter's"),
        // GFP_DMA: ZONE_DMA is never shaped.
        (
            "lkml-2022-08-23-sle15-x86-swapper-order10-dmapool-callerid-8node.dmesg",
            125,
            "was GFP_DMA: it could come from ZONE_DMA only",
        ),
        ("intel-gfx-2020-06-22-oom.dmesg", 255, "no page allocation failure in its 7 lines"),
        (
            "pfsol-prj-2018-rza2-yavta-order7-truncated.dmesg",
            255,
            "pfsol-prj-2018-rza2-yavta-order7-truncated.dmesg:32: the Mem-Info free-area line of the failure on line 1 is cut short",
        ),
    ];
    for (name, code, says) in cases {
        let out = scratch(name);
        let o = repro(&capture(name), &out);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(*code), "{name}: {stderr}");
        assert!(stderr.contains(says), "{name}: {stderr}");
        assert!(!out.join("repro").exists(), "{name}");
        std::fs::remove_dir_all(&out).unwrap();
    }
    // A binary file: this test's own executable.
    let out = scratch("binary");
    let o = repro(std::path::Path::new(FRAGLAB), &out);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{stderr}");
    assert!(stderr.contains("not a text file"), "{stderr}");
    std::fs::remove_dir_all(&out).unwrap();
}
