//! `fraglab vm` on kernels built here: Debian's linux-source-6.1 on tinyconfig plus `fraglab vm
//! --print-kconfig`, and the two demo patches of scripts/patches/ on top, built by
//! `scripts/patch-ab-demo --kernels-only` (about 6 minutes the first time on 2 CPUs, then reused
//! until the fragment or the source changes). Such a kernel has no modules and SCTP built in:
//! everything fraglab needs must come from the fragment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

static SERIAL: Mutex<()> = Mutex::new(());

mod common;

use common::{fraglab_in, read_json, repo, FRAGLAB};

/// Kernel name (`base`, `sctp-contiguous-stream-out`, `pipe-kvcalloc`) → bzImage.
fn kernels() -> &'static BTreeMap<String, PathBuf> {
    static KERNELS: OnceLock<BTreeMap<String, PathBuf>> = OnceLock::new();
    KERNELS.get_or_init(|| {
        let out = Command::new(repo().join("scripts/patch-ab-demo"))
            .args(["--kernels-only", "--fraglab", FRAGLAB])
            .output()
            .expect("run scripts/patch-ab-demo");
        eprintln!("--- scripts/patch-ab-demo --kernels-only:\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the kernels did not build: {}", out.status);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(name, path)| (name.to_string(), PathBuf::from(path)))
            .collect()
    })
}

fn kernel(name: &str) -> String {
    let k = &kernels()[name];
    assert!(k.is_file(), "{}", k.display());
    k.display().to_string()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-kbtest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("configs")).unwrap();
    for c in ["pipe-highorder", "sctp64k"] {
        std::fs::copy(repo().join(format!("configs/{c}.toml")), d.join(format!("configs/{c}.toml"))).unwrap();
    }
    d
}

/// Every round's guest output (the guest's fraglab's stdout and stderr), its last 60 lines: what a
/// round that failed was doing, in CI's log, where the results directory does not survive.
fn show_guest_output(ab: &Path) {
    let mut rounds: Vec<PathBuf> = std::fs::read_dir(ab).unwrap().map(|e| e.unwrap().path()).collect();
    rounds.sort();
    for log in rounds.iter().map(|r| r.join("guest-output.log")).filter(|l| l.is_file()) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("--- {} (last 60 of {} lines):", log.display(), lines.len());
        for l in &lines[lines.len().saturating_sub(60)..] {
            eprintln!("  | {l}");
        }
    }
}

fn only_entry(dir: &Path) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

/// The base kernel runs what fraglab does without a module: probe, a whole scenario with the
/// catcher's named stack traces, built-in SCTP with 65535 streams, on a clock finer than jiffies.
/// Each guest ends by restarting, which needs nothing from the kernel's config, so the host never
/// waits for its timeout.
#[test]
fn a_tinyconfig_kernel_with_the_fragment_runs_fraglab() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = kernel("base");
    let dir = scratch("base");
    // --timeout far above what each needs (a few seconds): a guest that halted instead of ending
    // would come back as 125 "timed out … the command did not finish".
    let vm =
        |args: &[&str]| fraglab_in(&dir, &[&["vm", "--kernel", &base, "--timeout", "300s"], args].concat());

    let out = vm(&["--", "probe", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(snap["buddyinfo"]["zones"].as_array().is_some_and(|z| !z.is_empty()), "{snap}");
    assert!(snap["vmstat"].is_object(), "vmstat counters: {snap}");

    // A whole scenario, and the clock it ran on: fragmenting made the TSC unstable in a guest without
    // ACPI's HPET, leaving refined-jiffies (4 ms) for every latency and every "target lost for N s".
    std::fs::write(
        dir.join("scenario.sh"),
        "fraglab run configs/pipe-highorder.toml\necho $? > run-exit\n\
         cat /sys/devices/system/clocksource/clocksource0/current_clocksource > clocksource\n",
    )
    .unwrap();
    let out = vm(&[
        "--extra-bin",
        "cat",
        "--file",
        "configs/pipe-highorder.toml:configs/pipe-highorder.toml",
        "--script",
        "scenario.sh",
        "--results",
        "out",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let read = |f: &str| std::fs::read_to_string(dir.join("out").join(f)).unwrap().trim().to_string();
    assert_eq!(read("run-exit"), "1", "F_SETPIPE_SZ ENOMEM on the fragmented guest");
    let clock = read("clocksource");
    assert!(!clock.contains("jiffies"), "the guest ran on {clock}");
    let results = only_entry(&dir.join("out/results"));
    let failures = std::fs::read_to_string(results.join("alloc_failures.jsonl")).unwrap();
    let named = failures
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|f| f["order"] == 8)
        .filter(|f| {
            f["stack"].as_array().unwrap().iter().any(|s| s.as_str().unwrap().starts_with("pipe_resize_ring"))
        })
        .count();
    assert!(named > 0, "order-8 failures with pipe_resize_ring named in their stacks: {failures}");

    let out = vm(&["--", "workload", "sctp-connect", "--streams", "65535", "--associations", "2", "--json"]);
    assert_eq!(out.status.code(), Some(0), "SCTP is built in: no --modules");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["ok"], 2, "{result}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The A/B on real patches, one round each: the contiguous SCTP stream table is a regression on
/// configs/sctp64k.toml (exit 1, ENOMEM on connect, the order-9 failure in sctp_stream_alloc_out
/// only on the patched side); the pipe's kvcalloc fixes configs/pipe-highorder.toml (exit 0, "fixed").
#[test]
fn ab_on_real_patches_says_regression_and_fixed() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = format!("base={}", kernel("base"));
    for (patch, config, exit, change) in [
        ("sctp-contiguous-stream-out", "sctp64k", 1, "regression"),
        ("pipe-kvcalloc", "pipe-highorder", 0, "fixed"),
    ] {
        let dir = scratch(patch);
        let patched = format!("patched={}", kernel(patch));
        let config_path = format!("configs/{config}.toml");
        let out = fraglab_in(
            &dir,
            &[
                "vm",
                "--kernel",
                &base,
                "--kernel",
                &patched,
                "--rounds",
                "1",
                "--timeout",
                "600s",
                "--",
                "run",
                &config_path,
            ],
        );
        let ab = only_entry(&dir.join("results"));
        if out.status.code() != Some(exit) {
            show_guest_output(&ab);
        }
        assert_eq!(out.status.code(), Some(exit), "{patch} on {config}");
        let record = read_json(&ab.join("ab.json"));
        assert_eq!(record["judgement"]["change"], change, "{record}");
        let comparison = read_json(&ab.join("comparison.json"));
        let errno = |side: usize| -> u64 {
            comparison["errors_by_errno"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["key"] == "ENOMEM")
                .map(|r| r["counts"][side].as_u64().unwrap())
                .sum()
        };
        if change == "regression" {
            assert_eq!(errno(0), 0, "the base connects: {comparison}");
            assert!(errno(1) > 0, "connect ENOMEM on the patched kernel: {comparison}");
            let site = comparison["failures_by_site"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["key"].as_str().unwrap().starts_with("9 sctp_stream_alloc_out"))
                .unwrap_or_else(|| panic!("no order-9 failure in sctp_stream_alloc_out: {comparison}"));
            assert_eq!(site["counts"][0], 0);
            assert!(site["counts"][1].as_u64().unwrap() > 0);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("verdict: regression"), "{text}");
        } else {
            assert!(errno(0) > 0, "F_SETPIPE_SZ ENOMEM on the base: {comparison}");
            assert_eq!(errno(1), 0, "none with kvcalloc: {comparison}");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("verdict: fixed"), "{text}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
