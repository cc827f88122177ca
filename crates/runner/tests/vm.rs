//! `fraglab vm` end to end: real qemu boots of Debian's cloud kernel (fetched with apt into
//! ~/.cache/fraglab on first use). Ten boots, one at a time: TCG guests on a 2-core machine slow
//! each other down. Needs qemu-system-x86 and apt lists (`apt-get update`), which scripts/test
//! installs; the first run also builds a static fraglab for the guest (a few minutes).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use fraglab_probe::buddyinfo::BuddyInfo;

mod common;
use common::{guest_status, STATUS_SH};

static SERIAL: Mutex<()> = Mutex::new(());

const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

/// Free memory in blocks of order ≥ 4 that the whole-machine target tolerates in DMA32/Normal. The
/// fragmenter ends with none; the processes that run and exit after it (and its own temporaries)
/// give back a few pages whose buddies are free, measured at 0.4–1.5 MiB in a 1 GiB guest.
const TOLERANCE_BYTES: u64 = 4 << 20;

fn vm(args: &[&str]) -> Output {
    vm_on(&["--kernel", "debian-cloud"], args)
}

/// `fraglab vm` on the kernel `kernel` names (`--kernel …` and maybe `--modules …`).
fn vm_on(kernel: &[&str], args: &[&str]) -> Output {
    let out = Command::new(FRAGLAB)
        .arg("vm")
        .args(kernel)
        .args(["--timeout", "240s"])
        .args(args)
        .output()
        .expect("run fraglab vm");
    eprintln!(
        "--- fraglab vm {args:?}: {}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-vmtest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn probe_json_comes_back_from_a_1g_guest() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = vm(&["--", "probe", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is the guest's JSON");
    let zones: Vec<&str> =
        snap["buddyinfo"]["zones"].as_array().unwrap().iter().map(|z| z["zone"].as_str().unwrap()).collect();
    assert!(zones.contains(&"DMA") && zones.contains(&"DMA32"), "{zones:?}");
    // MemTotal of a 1 GiB guest, in kB: the guest's, not this 24 GiB host's.
    let total = snap["free"]["total"].as_u64().unwrap();
    assert!((900 << 10..=1 << 20).contains(&total), "MemTotal {total} kB");
}

/// `fraglab vm [flags] -- run configs/NAME.toml`, the way a user types it: from a directory holding
/// configs/NAME.toml (a copy of the checkout's), which fraglab carries into the guest by itself.
/// Returns the output and the scratch directory the results came back to.
fn vm_run(name: &str, flags: &[&str], run_flags: &[&str]) -> (Output, PathBuf) {
    let dir = scratch(name);
    std::fs::create_dir_all(dir.join("configs")).unwrap();
    let config = format!("configs/{name}.toml");
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(checkout.join(&config)).unwrap();
    std::fs::write(dir.join(&config), &text).unwrap();
    let out = Command::new(FRAGLAB)
        .current_dir(&dir)
        .args(["vm", "--kernel", "debian-cloud", "--timeout", "280s"])
        .args(flags)
        .args(["--", "run", &config])
        .args(run_flags)
        .output()
        .expect("run fraglab vm");
    eprintln!(
        "--- fraglab vm {flags:?} -- run {config} {run_flags:?}: {}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The config went in and its results came back, but the host's copy was left as it was.
    assert_eq!(std::fs::read_to_string(dir.join(&config)).unwrap(), text, "{config} was overwritten");
    (out, dir)
}

/// The one results directory a guest run left under `<dir>/results`, as a run here would have.
fn results_dir(dir: &Path, name: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir.join("results"))
        .expect("the guest's results directory came back to the host")
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{name}-")))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

/// Every run under `<dir>/results`: its verdict, its reason and the failures it caught (order,
/// task, flags, the top of the stack) — what a CI log must show when a run's exit status is not
/// the one wanted, since the guest's results go with the scratch directory.
fn verdicts(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir.join("results")) else {
        return format!("no {}/results", dir.display());
    };
    let mut runs: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    runs.sort();
    let mut out = String::new();
    for run in runs {
        let record = std::fs::read(run.join("run.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let record: serde_json::Value = record.unwrap_or_default();
        out += &format!(
            "{}: {} — {}\n",
            run.file_name().unwrap().to_string_lossy(),
            record["verdict"],
            record["reason"]
        );
        for line in std::fs::read_to_string(run.join("alloc_failures.jsonl")).unwrap_or_default().lines() {
            let f: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            let top: Vec<&str> =
                f["stack"].as_array().into_iter().flatten().take(8).filter_map(|s| s.as_str()).collect();
            out += &format!(
                "  order {} {} {} pid {}: {}\n",
                f["order"],
                f["comm"],
                f["gfp_flags"],
                f["pid"],
                top.join(" ← ")
            );
        }
    }
    out
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Issue 14: `fraglab run` is what `git bisect run` calls, so the same kernel and config must give
/// the same verdict every time. pipe-highorder and sctp-lo-mtu64k, three runs each in one boot of the
/// Debian 6.1 guest: every run reproduces (exit 1), with the target held through the windows that
/// decide it, and each run's evidence is the bug's own — issue 6's order-8 failure in
/// pipe_resize_ring; the 32 KiB message's order-4 skb failing in sctp_datamsg_from_user.
#[test]
fn pipe_highorder_and_sctp_lo_mtu64k_reproduce_three_runs_in_a_row() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("three-in-a-row");
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let configs = ["pipe-highorder", "sctp-lo-mtu64k"];
    let mut script = String::new();
    let mut files = Vec::new();
    for c in configs {
        files.push(format!("{}:configs/{c}.toml", checkout.join(format!("configs/{c}.toml")).display()));
        script += &format!(
            "for i in 1 2 3; do fraglab run configs/{c}.toml > {c}-$i.txt; echo \"{c} $i $?\" >> exits.txt; done\n"
        );
    }
    std::fs::write(dir.join("three.sh"), script).unwrap();
    let files: Vec<&str> = files.iter().flat_map(|f| ["--file", f.as_str()]).collect();
    let out = Command::new(FRAGLAB)
        .args(["vm", "--kernel", "debian-cloud", "--timeout", "900s", "--script"])
        .arg(dir.join("three.sh"))
        .args(&files)
        .arg("--results")
        .arg(&dir)
        .output()
        .expect("run fraglab vm");
    eprintln!("--- fraglab vm: {}\n--- stderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let exits = std::fs::read_to_string(dir.join("exits.txt")).expect("the script's exit codes came back");
    let runs_of = |c: &str| {
        let mut runs: Vec<PathBuf> = std::fs::read_dir(dir.join("results"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{c}-")))
            .collect();
        runs.sort();
        runs
    };
    // Every run reproduces — except that the kernel's direct compaction can assemble the order-8
    // block out of memory the hold never had (other processes' pages, page cache), and every resize
    // then succeeds: measured in 1 of 12 runs. That run must say so — could not test, the target
    // lost, and vmstat's compact_success up during it — and no other exit is excused.
    let mut excused = Vec::new();
    let mut excused_runs = Vec::new();
    for (line, (c, i)) in exits.lines().zip(configs.iter().flat_map(|c| (1..=3).map(move |i| (*c, i)))) {
        if line == format!("{c} {i} 1") {
            continue;
        }
        assert_eq!(line, format!("{c} {i} 125"), "every run reproduces: exit 1\n{exits}\n{}", verdicts(&dir));
        let results = &runs_of(c)[i - 1];
        let run = json(&results.join("run.json"));
        let compacted =
            |doc: &str| json(&results.join(doc))["vmstat"]["values"]["compact_success"].as_u64().unwrap();
        assert!(
            c == "pipe-highorder"
                && run["reason"].as_str().unwrap().contains("\"not reproduced\" needs the target held")
                && compacted("final.json") > compacted("baseline.json"),
            "only a run that direct compaction served may be 125\n{}",
            verdicts(&dir)
        );
        eprintln!("excused, compaction served it: {}", run["reason"]);
        excused.push(results.clone());
        excused_runs.push(format!("{c}-{i}"));
    }
    assert!(exits.lines().count() == 6 && excused.len() <= 1, "{exits}\n{}", verdicts(&dir));

    for c in configs {
        let runs = runs_of(c);
        assert_eq!(runs.len(), 3, "{runs:?}");
        for results in runs.iter().filter(|r| !excused.contains(r)) {
            let run = json(&results.join("run.json"));
            assert_eq!(run["verdict"], "reproduced", "{run}");
            assert!(run["kernel_release"].as_str().unwrap().ends_with("-cloud-amd64"), "the guest's kernel");
            let keeping = &run["fragment"]["keeping"];
            assert_eq!(keeping["how"], "rebreak", "{keeping}");
            assert!(keeping["looks"].as_u64().unwrap() > 10, "{keeping}");
            let workloads = json(&results.join("workloads.json"))["workloads"].clone();
            for w in workloads.as_array().unwrap() {
                assert!(w["target"]["held"].is_boolean(), "every window is judged: {w}");
            }
            let failures: Vec<serde_json::Value> =
                std::fs::read_to_string(results.join("alloc_failures.jsonl"))
                    .unwrap()
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
            // The keeper's own allocations that lost a race (its pipe resizes) are not the kernel
            // failing a workload; a softirq allocation traced under the keeper's thread (a T3-rtx
            // timer's skb, seen here) is, and stays.
            let keeper = keeping["tid"].as_i64().unwrap();
            let resize = |f: &&serde_json::Value| {
                f["stack"].as_array().unwrap().iter().any(|s| s == "pipe_resize_ring" || s == "pipe_set_size")
            };
            let own = failures.iter().filter(|f| f["pid"].as_i64() == Some(keeper)).filter(resize).count();
            assert_eq!(own, 0, "{keeping}");
            let caught_in = |order: u64, function: &str| {
                failures
                    .iter()
                    .filter(|f| f["order"] == order)
                    .filter(|f| f["stack"].as_array().unwrap().iter().any(|s| s == function))
                    .count()
            };
            eprintln!("{}: {} failures caught; {keeping}", results.display(), failures.len());
            if c == "pipe-highorder" {
                assert!(enomem(&workloads, None) > 0, "F_SETPIPE_SZ gave ENOMEM: {workloads}");
                assert!(caught_in(8, "pipe_resize_ring") > 0, "the order-8 failure in pipe_resize_ring");
            } else {
                // 32 KiB: the DATA chunk's skb is order 4, none is free: sendmsg fails. 4 KiB: order 1,
                // plentiful; the sender is never refused (if slow: retransmits need order 4).
                assert!(enomem(&workloads, Some("msg=32KiB")) > 0, "{workloads}");
                assert_eq!(enomem(&workloads, Some("msg=4KiB")), 0, "{workloads}");
                let served_4k: u64 = workloads
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|w| w["point"] == serde_json::json!({"msg": "4KiB"}))
                    .map(|w| w["result"]["ok"].as_u64().unwrap())
                    .sum();
                assert!(served_4k > 0, "4 KiB messages were sent: {workloads}");
                assert!(caught_in(4, "sctp_datamsg_from_user") > 0, "the order-4 skb failure in SCTP");
            }
        }
        // Issue 17: which failures mattered. The order-4 skb failures surfaced and are tied to the
        // ENOMEM sendmsg returned in the 32 KiB window; a huge page that failed (khugepaged, or a
        // fault) fell back.
        for i in (1..=3).filter(|i| !excused_runs.contains(&format!("{c}-{i}"))) {
            let summary = std::fs::read_to_string(dir.join(format!("{c}-{i}.txt"))).unwrap();
            let surfaced = summary.find("  surfaced (no known fallback: the caller got the failure)\n");
            assert!(surfaced.is_some(), "{summary}");
            if let Some(fell_back) = summary.find("  fell back (the kernel had a way around it)\n") {
                assert!(surfaced < Some(fell_back), "surfaced first: {summary}");
            }
            // A call-site line (`order 9 ×1 from alloc_charge_hpage ← …`), not the by-order count.
            for line in summary
                .lines()
                .filter(|l| l.contains(" from "))
                .filter(|l| l.contains("khugepaged") || l.contains("do_huge_pmd_anonymous_page"))
            {
                assert!(line.contains("(THP: the fault maps base pages"), "a huge page falls back: {line}");
            }
            if c == "sctp-lo-mtu64k" {
                let tie = summary
                    .lines()
                    .find(|l| l.contains(" in sctp-stream msg=32KiB #1 ← "))
                    .unwrap_or_else(|| panic!("no tie for the 32 KiB window: {summary}"));
                assert!(tie.contains("ENOMEM×"), "{tie}");
                assert!(
                    tie.contains("order 4 ×") && tie.contains("from __alloc_skb ← _sctp_make_chunk"),
                    "{tie}"
                );
                eprintln!("--- {c}-{i} summary:\n{summary}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 14: memory freed in the middle of a run merges into blocks the target forbids — here huge
/// pages reserved before the run and given back by its first workload, so a 64 MiB pipe resize
/// (order 8) that should fail finds an order-9 block. With the keeper (the default) the blocks are
/// taken back before the next workload and the run reproduces; with `keep = false` they stay free,
/// and the run that would have said "not reproduced" says it could not test (125), naming them.
/// Two sizes of what is freed (16 and 7 huge pages: 32 and 14 MiB), so no figure lines up by chance.
#[test]
fn a_block_freed_mid_run_is_taken_back_or_the_run_cannot_say_not_reproduced() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("freed-mid-run");
    let config = |name: &str, keep: bool| {
        format!(
            "[run]\nname = \"{name}\"\n[fragment]\nmax_free_order = 4\nkeep = {keep}\n[probe]\ninterval = \"200ms\"\n\
             catch_min_order = 4\n[[workload]]\nkind = \"exec\"\n\
             command = [\"/bin/sh\", \"-c\", \"echo 0 > /proc/sys/vm/nr_hugepages\"]\n[[workload]]\n\
             kind = \"trigger\"\ntrigger = \"pipe-resize\"\nbytes = \"64MiB\"\nrepeat = 10\n[expect]\n\
             errno = [\"ENOMEM\"]\nfailed_order = 8\n"
        )
    };
    std::fs::write(dir.join("keep.toml"), config("keep", true)).unwrap();
    std::fs::write(dir.join("watch.toml"), config("watch", false)).unwrap();
    // (The count is not read back: dash's `read` takes a byte at a time, and a sysctl file read at
    // an offset past 0 ends there — "16" reads as "1".)
    let script = "for run in keep:16 watch:7; do\n\
                  echo ${run#*:} > /proc/sys/vm/nr_hugepages\n\
                  fraglab run ${run%:*}.toml > /dev/null; echo \"${run%:*} $?\" >> exits.txt\n\
                  done\n";
    std::fs::write(dir.join("freed.sh"), script).unwrap();
    let out = Command::new(FRAGLAB)
        .args(["vm", "--kernel", "debian-cloud", "--timeout", "300s", "--script"])
        .arg(dir.join("freed.sh"))
        .arg("--file")
        .arg(format!("{}:keep.toml", dir.join("keep.toml").display()))
        .arg("--file")
        .arg(format!("{}:watch.toml", dir.join("watch.toml").display()))
        .arg("--results")
        .arg(dir.join("out"))
        .output()
        .expect("run fraglab vm");
    eprintln!("--- fraglab vm: {}\n--- stderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let out = dir.join("out");
    let exits = std::fs::read_to_string(out.join("exits.txt")).expect("the script's exit codes came back");
    assert_eq!(
        exits,
        "keep 1\nwatch 125\n",
        "huge pages reserved, then: reproduced / could not test\n{}",
        verdicts(&out)
    );

    let keep = results_dir(&out, "keep");
    let run = json(&keep.join("run.json"));
    let k = &run["fragment"]["keeping"];
    eprintln!("keep: {} — {k}", run["reason"]);
    let rebroken = k["rebroken"].as_array().unwrap();
    let huge: u64 = rebroken.iter().skip(9).map(|n| n.as_u64().unwrap()).sum();
    assert!(huge > 0, "blocks of order 9 or 10 were re-broken: {k}");
    // 32 MiB freed; the keeper took back at least half of it (the kernel may use some first).
    assert!(k["added_bytes"].as_u64().unwrap() >= 16 << 20, "{k}");
    let workloads = json(&keep.join("workloads.json"))["workloads"].clone();
    let trigger = &workloads.as_array().unwrap()[1];
    assert_eq!(trigger["target"]["held"], true, "{trigger}");
    assert_eq!(trigger["result"]["failed"], 10, "every resize failed: {trigger}");

    let watch = results_dir(&out, "watch");
    let run = json(&watch.join("run.json"));
    let reason = run["reason"].as_str().unwrap();
    eprintln!("watch: {reason}");
    assert_eq!(run["verdict"], "could-not-test", "{run}");
    assert!(reason.contains("not reproduced\" needs the target held"), "{reason}");
    assert!(reason.contains("order-9") || reason.contains("order-10"), "{reason}");
    assert!(reason.contains("free in DMA32"), "{reason}");
    assert_eq!(run["fragment"]["keeping"]["how"], "watch");
    let workloads = json(&watch.join("workloads.json"))["workloads"].clone();
    let trigger = &workloads.as_array().unwrap()[1];
    assert_eq!(trigger["target"]["held"], false, "{trigger}");
    assert!(trigger["result"]["ok"].as_u64().unwrap() > 0, "the resize found its block: {trigger}");
    // The samples say it too: lost, with the pages free per zone.
    let samples = std::fs::read_to_string(watch.join("probe.jsonl")).unwrap();
    let lost = samples
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|s| s["target"]["held"] == false)
        .filter(|s| {
            s["target"]["zones"]
                .as_array()
                .unwrap()
                .iter()
                .any(|z| z["zone"] == "Node 0, zone DMA32" && z["pages"].as_u64().unwrap() >= 512)
        })
        .count();
    assert!(lost > 0, "a sample saw the target lost: {samples}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A sweep point's label, `msg=32KiB`, as fraglab prints it.
fn label(point: &serde_json::Value) -> String {
    serde_json::from_value::<fraglab_results::point::Point>(point.clone()).unwrap().label()
}

/// ENOMEM counted in a workloads.json, at one sweep point or all.
fn enomem(workloads: &serde_json::Value, point: Option<&str>) -> u64 {
    workloads
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| point.is_none_or(|p| label(&w["point"]) == p))
        .flat_map(|w| w["result"]["errors"].as_array().unwrap())
        .filter(|e| e["errno"] == "ENOMEM")
        .map(|e| e["count"].as_u64().unwrap())
        .sum()
}

/// #3's other half: the same scenario on memory as it is (`--baseline`) succeeds — F_SETPIPE_SZ
/// finds its order-8 block — and exit 0 comes back.
#[test]
fn pipe_highorder_succeeds_in_an_unfragmented_guest() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (out, dir) = vm_run("pipe-highorder", &[], &["--baseline"]);
    assert_eq!(out.status.code(), Some(0), "exit 0: not reproduced");
    let results = results_dir(&dir, "pipe-highorder");
    let run = json(&results.join("run.json"));
    assert_eq!(run["verdict"], "not-reproduced", "{run}");
    assert!(run["fragment"].is_null(), "a baseline run fragments nothing: {run}");
    let workloads = json(&results.join("workloads.json"))["workloads"].clone();
    for w in workloads.as_array().unwrap() {
        assert_eq!(w["result"]["failed"], 0, "{w}");
        assert!(w["result"]["ok"].as_u64().unwrap() > 0, "{w}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// #1 and #4 in one boot: on the guest fragmented to max free order 4, fraglab's sctp-connect sets up
/// associations with 65535 streams each way (SCTP_STATUS 65535/65535), and next to it the `exec`
/// workload runs the seed's own `sctp_test ... -M 65535 -T`, carried in with --extra-bin.
#[test]
fn sctp_65535_streams_native_and_the_seeds_sctp_test() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bins = ["sctp_test", "ip", "cat", "sleep"].map(|b| ["--extra-bin", b]).concat();
    let (out, dir) = vm_run("sctp64k-seed", &bins, &[]);
    let results = results_dir(&dir, "sctp64k-seed");
    // A current kernel no longer fails: no ENOMEM in any window. Exit 0 when the target held in
    // every window; the first sctp-connect window of a run has been seen to lose it for 2–19 % of
    // the window (the tolerance is 5 %: order-4/5 blocks, each taken back within a look, more of
    // them the more associations — 3 runs of 3 in one boot under TCG), and then the honest answer
    // is 125, which says so.
    let run = json(&results.join("run.json"));
    let reason = run["reason"].as_str().unwrap();
    assert!(reason.starts_with("no ENOMEM in the workloads"), "{reason}");
    match out.status.code() {
        Some(0) => assert_eq!(run["verdict"], "not-reproduced"),
        Some(125) => assert!(reason.contains("\"not reproduced\" needs the target held"), "{reason}"),
        other => panic!("exit {other:?}: {reason}"),
    }
    let workloads = json(&results.join("workloads.json"))["workloads"].clone();
    let by_kind = |k: &str| -> Vec<&serde_json::Value> {
        workloads.as_array().unwrap().iter().map(|w| &w["result"]).filter(|r| r["kind"] == k).collect()
    };
    let native = by_kind("sctp-connect");
    let seed = by_kind("exec");
    assert_eq!((native.len(), seed.len()), (3, 3), "3 iterations of each: {workloads}");
    for r in native {
        assert_eq!(r["failed"], 0, "{r}");
        assert_eq!(r["ok"], 10, "{r}");
        assert_eq!(r["details"]["sstat_outstrms"], 65535, "{r}");
        assert_eq!(r["details"]["sstat_instrms"], 65535, "{r}");
    }
    for r in seed {
        assert_eq!(r["details"]["exit_code"], 0, "sctp_test exited 0: {r}");
        assert_eq!(r["ok"], 1, "{r}");
        let command = r["params"]["command"].to_string();
        assert!(command.contains("-M 65535 -T"), "the seed's command: {command}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name} did not come back: {e}"))
}

fn high_order_bytes(b: &BuddyInfo) -> u64 {
    b.zones.iter().filter(|z| z.zone != "DMA").map(|z| z.free_pages_at_or_above(4)).sum::<u64>() * 4096
}

fn low_order_bytes(b: &BuddyInfo) -> u64 {
    b.zones
        .iter()
        .filter(|z| z.zone != "DMA")
        .map(|z| z.free_pages() - z.free_pages_at_or_above(4))
        .sum::<u64>()
        * 4096
}

/// Issue 6, "what must be shown" #2, and the results round trip, in one boot.
#[test]
fn whole_machine_max_free_order_4_holds_through_compact_memory() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("frag");
    let script = dir.join("frag.sh");
    std::fs::write(
        &script,
        format!(
            "{STATUS_SH}set -e\n\
         cat /proc/sys/vm/min_free_kbytes > min_free_kbytes\n\
         cat /proc/meminfo > meminfo-before\n\
         cat /proc/buddyinfo > buddyinfo-before\n\
         fraglab fragment --max-free-order 4 --daemon\n\
         cat /proc/buddyinfo > buddyinfo-fragmented\n\
         cat /proc/meminfo > meminfo-fragmented\n\
         echo 1 > /proc/sys/vm/compact_memory\n\
         cat /proc/buddyinfo > buddyinfo-compacted\n\
         sleep 1\n\
         cat /proc/buddyinfo > buddyinfo-kept\n\
         status status\n\
         fraglab release\n\
         cat /proc/buddyinfo > buddyinfo-released\n\
         mkdir -p sub && echo round trip > sub/marker.txt\n\
         echo script done\n"
        ),
    )
    .unwrap();
    let results = dir.join("results");
    let out = vm(&[
        "--script",
        script.to_str().unwrap(),
        "--extra-bin",
        "cat",
        "--extra-bin",
        "mkdir",
        "--extra-bin",
        "sleep",
        "--results",
        results.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("script done"));

    // Results round trip: files and a subdirectory written in the guest's /results.
    assert_eq!(read(&results, "sub/marker.txt"), "round trip\n");

    let buddy = |name: &str| BuddyInfo::parse(&read(&results, name), name).unwrap();
    let (before, fragmented, compacted, kept, released) = (
        buddy("buddyinfo-before"),
        buddy("buddyinfo-fragmented"),
        buddy("buddyinfo-compacted"),
        buddy("buddyinfo-kept"),
        buddy("buddyinfo-released"),
    );
    let meminfo = |name: &str, key: &str| -> u64 {
        read(&results, name)
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
            .unwrap()
    };
    eprintln!("guest min_free_kbytes {}", read(&results, "min_free_kbytes").trim());
    eprintln!(
        "MemAvailable before {} kB, fragmented {} kB",
        meminfo("meminfo-before", "MemAvailable:"),
        meminfo("meminfo-fragmented", "MemAvailable:")
    );
    for (name, b) in [
        ("before", &before),
        ("fragmented", &fragmented),
        ("compacted", &compacted),
        ("kept", &kept),
        ("released", &released),
    ] {
        eprintln!(
            "{name:>10}: {} KiB at order >= 4, {} KiB below; {:?}",
            high_order_bytes(b) >> 10,
            low_order_bytes(b) >> 10,
            b.zones.iter().map(|z| format!("{} {:?}", z.zone, z.free)).collect::<Vec<_>>()
        );
    }
    assert!(high_order_bytes(&before) > 512 << 20, "the guest starts with high-order free memory");
    // compact_memory cannot move the held (mlocked) pages, but it does assemble blocks out of memory
    // the hold never had — other processes' pages, page cache — which the keeper then takes back:
    // 0.4–4.7 MiB measured right after the write, none a second later.
    for (name, b) in [("fragmented", &fragmented), ("kept", &kept)] {
        assert!(
            high_order_bytes(b) <= TOLERANCE_BYTES,
            "{name}: {} KiB free at order >= 4 in DMA32/Normal, tolerance {} KiB",
            high_order_bytes(b) >> 10,
            TOLERANCE_BYTES >> 10
        );
        assert!(low_order_bytes(b) > 400 << 20, "{name}: the memory is free, only in small blocks");
    }
    let status = guest_status(&results, "status");
    assert_eq!(status["leftover_pages"], 0, "the fragmenter reached the target itself");
    assert_eq!(status["moved_pages"], 0, "compaction moved no held page: {status}");
    assert!(low_order_bytes(&compacted) > 400 << 20, "compacted: the memory is still free in small blocks");
    let rebroken: u64 =
        status["keeping"]["rebroken"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum();
    assert!(
        high_order_bytes(&compacted) == 0 || rebroken > 0,
        "what compaction assembled was taken back: {}",
        status["keeping"]
    );
    assert!(high_order_bytes(&released) > 256 << 20, "release gives the high-order blocks back");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The whole-machine path in guests of odd sizes, so MemAvailable, the reserve and what is taken are
/// figures of every alignment (a page-unaligned one once made populating spin): each holds the
/// target, releases with exit 0 and restores every sysctl. In each guest a second fragmenter is
/// released while it is still shaping, at a different moment in each: it stops, gives everything
/// back and its command says so.
#[test]
fn whole_machine_in_odd_sized_guests_holds_and_releases() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const SYSCTLS: &str = "/proc/sys/vm/percpu_pagelist_high_fraction /proc/sys/vm/lowmem_reserve_ratio \
                           /proc/sys/vm/compact_unevictable_allowed /proc/sys/fs/pipe-max-size";
    for (mem, polls, huge) in [("777M", 0, 3), ("1000M", 3, 5), ("1234M", 8, 9)] {
        let dir = scratch(&format!("odd-{mem}"));
        let script = dir.join("odd.sh");
        std::fs::write(
            &script,
            format!(
                "{STATUS_SH}set -e\n\
                 cat {SYSCTLS} > sysctls-before\n\
                 echo {huge} > /proc/sys/vm/nr_hugepages\n\
                 fraglab fragment --max-free-order 4 --daemon > fragment.out 2>&1\n\
                 status status\n\
                 # Huge pages given back while the daemon holds: order-9 blocks its keeper takes back.\n\
                 echo 0 > /proc/sys/vm/nr_hugepages\n\
                 # Wait (bounded) until status says blocks were re-broken.\n\
                 i=0; while [ $i -lt 500 ]; do\n\
                   s=$(fraglab status || true); case \"$s\" in *'re-broken (order'*) break;; esac; i=$((i+1))\n\
                 done\n\
                 echo \"$s\" > status-kept.txt\n\
                 status status-kept\n\
                 fraglab release > release.out 2>&1\n\
                 cat {SYSCTLS} > sysctls-released\n\
                 fraglab fragment --max-free-order 4 --daemon > early.out 2>&1 &\n\
                 # Wait (bounded) until it answers while shaping, then let it shape a little longer.\n\
                 i=0; seen=0\n\
                 while [ $i -lt 3000 ]; do\n\
                   case \"$(fraglab status 2>/dev/null)\" in *'still shaping'*) seen=$((seen+1));; esac\n\
                   [ $seen -gt {polls} ] && break\n\
                   i=$((i+1))\n\
                 done\n\
                 echo \"shaping seen $seen times in $i polls\" > early.polls\n\
                 fraglab release > early-release.out 2>&1\n\
                 wait $! || echo \"exit $?\" > early.rc\n\
                 cat {SYSCTLS} > sysctls-after\n\
                 echo script done\n"
            ),
        )
        .unwrap();
        let results = dir.join("results");
        let out = vm(&[
            "--mem",
            mem,
            "--script",
            script.to_str().unwrap(),
            "--extra-bin",
            "cat",
            "--results",
            results.to_str().unwrap(),
        ]);
        let at = format!("{mem} guest");
        assert_eq!(out.status.code(), Some(0), "{at}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("script done"), "{at}");
        for f in ["fragment.out", "release.out", "early.polls", "early.out", "early-release.out"] {
            eprintln!("--- {at} {f}:\n{}", read(&results, f));
        }
        let status = guest_status(&results, "status");
        assert_eq!(status["leftover_pages"], 0, "{at}: the target was reached: {status}");
        let bounds = status["bounds"].as_array().unwrap();
        assert!(
            bounds.iter().any(|b| b.as_str().unwrap().starts_with("rebreak: no free block")),
            "{at}: {bounds:?}"
        );
        // The keeper took back the blocks the huge pages left (each 2 MiB; the kernel may take some
        // first), and status says so.
        let kept = guest_status(&results, "status-kept");
        let k = &kept["keeping"];
        assert_eq!(k["how"], "rebreak", "{at}: {k}");
        let rebroken = k["rebroken"].as_array().unwrap();
        assert!(rebroken.iter().skip(9).any(|n| n.as_u64().unwrap() > 0), "{at}: order ≥ 9 re-broken: {k}");
        assert!(k["added_bytes"].as_u64().unwrap() >= huge << 20, "{at}: {k}");
        let human = read(&results, "status-kept.txt");
        assert!(human.contains("keeping order ≥ 4 (re-break"), "{at}: {human}");
        assert!(read(&results, "release.out").starts_with("released: memory given back, restored "), "{at}");
        let before = read(&results, "sysctls-before");
        assert_eq!(read(&results, "sysctls-released"), before, "{at}: after the release");
        assert_eq!(read(&results, "sysctls-after"), before, "{at}: after the early release");
        let early = read(&results, "early-release.out");
        assert!(early.starts_with("released"), "{at}: {early}");
        if early.contains("while still shaping") {
            assert!(read(&results, "early.out").contains("stopped by `fraglab release`"), "{at}");
            assert_eq!(read(&results, "early.rc"), "exit 1\n", "{at}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// What an `exec` workload inherits from a whole-machine run (in a guest, where the whole-machine
/// target is reached and the workloads run): none of the keeper's ring pipes — a child holding a
/// write end would keep that pipe's block after the guard or the release gave it back — and the
/// descriptor limit fraglab started with, not the one raised for the rings.
#[test]
fn an_exec_workload_inherits_no_ring_pipes_and_the_original_descriptor_limit() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("inherit");
    std::fs::write(
        dir.join("inherit.toml"),
        "[run]\nname = \"inherit\"\niterations = 1\n\n[fragment]\nmax_free_order = 4\n\n\
         [[workload]]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"ulimit -n; ls -l /proc/$$/fd\"]\n",
    )
    .unwrap();
    let out = Command::new(FRAGLAB)
        .current_dir(&dir)
        .args([
            "vm",
            "--kernel",
            "debian-cloud",
            "--timeout",
            "240s",
            "--extra-bin",
            "sh",
            "--extra-bin",
            "ls",
        ])
        .args(["--", "run", "inherit.toml"])
        .output()
        .expect("run fraglab vm");
    eprintln!("--- {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let results = results_dir(&dir, "inherit");
    let run = json(&results.join("run.json"));
    // The verdict is not what this is about. sh and ls exit inside the window, and the pages they
    // free can merge into a block for longer than the window's tolerance before the keeper takes it
    // back (seen under TCG: 30 ms of a 144 ms window): then the run could not test, and says so.
    let lost = run["reason"].as_str().unwrap().contains("\"not reproduced\" needs the target held");
    assert!(
        matches!(out.status.code(), Some(0 | 1)) || (out.status.code() == Some(125) && lost),
        "the run ran its workload: {} — {}",
        out.status,
        run["reason"]
    );
    assert_eq!(run["status"], "complete", "{run}");
    // Order 4: the keeper's rings took the reserve's high-order blocks, one pipe each.
    let rings = run["fragment"]["keeping"]["pipes"].as_u64().unwrap();
    assert!(rings > 0, "the run's keeper holds rings: {}", run["fragment"]);
    let workloads = json(&results.join("workloads.json"))["workloads"].clone();
    let stdout = workloads[0]["result"]["details"]["stdout"].as_str().unwrap().to_string();
    eprintln!("{rings} rings; the command saw:\n{stdout}");
    let limit: u64 = stdout.lines().next().unwrap().trim().parse().unwrap();
    assert!(limit < 100_000, "the raised limit leaked into the command: {stdout}");
    let pipes = stdout.lines().filter(|l| l.contains("pipe:")).count();
    assert_eq!(pipes, 2, "only its own stdout and stderr are pipes, not the keeper's: {stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_guest_kernel_panic_is_125_with_the_console() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("panic");
    let script = dir.join("panic.sh");
    std::fs::write(&script, "echo c > /proc/sysrq-trigger\n").unwrap();
    let out = vm(&["--script", script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The panic's reason is named even when the stack dump after it has filled the console tail.
    assert!(stderr.contains("kernel panic: Kernel panic - not syncing: sysrq triggered crash"), "{stderr}");
    // The console log is kept for the user; this test has read it.
    if let Some(log) = stderr.lines().find_map(|l| l.strip_prefix("fraglab vm: full console: ")) {
        std::fs::remove_dir_all(Path::new(log).parent().unwrap()).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The number before `word` in a line of `fraglab serve`'s summary (`7 associations`).
fn count_before(line: &str, word: &str) -> u64 {
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words
        .iter()
        .position(|w| w.trim_end_matches(',') == word)
        .unwrap_or_else(|| panic!("{word}: {line}"));
    words[i - 1].parse().unwrap_or_else(|e| panic!("{word}: {e}: {line}"))
}

/// One boot, two things SCTP needs a guest for. (1) `fraglab serve --proto sctp` serves the three sctp
/// kinds as a `--peer` — stream and rr traffic counted at both ends, sctp-connect's 65535 streams each
/// way — and SIGINT gives its summary. (2) `fraglab run`'s stop flag reaches an sctp workload: SIGINT
/// 3 s into a baseline run's 60 s sctp-stream gives exit 130, run.json incomplete/interrupted, the
/// stream's result stopped after ~3 s, and the guest powers off long before 60 s.
#[test]
fn sctp_serve_for_a_peer_and_sigint_stops_an_sctp_run() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("sctp-serve");
    let config = dir.join("stop.toml");
    std::fs::write(
        &config,
        "[run]\nname = \"sctp-stop\"\ndescription = \"a 60 s sctp-stream, SIGINT after 3 s\"\n\n\
         [[workload]]\nkind = \"sctp-stream\"\nduration = \"60s\"\n",
    )
    .unwrap();
    // dash's read works on regular files, so /proc/net/sctp/snmp is copied with cat before it is read.
    let script = dir.join("sctp.sh");
    std::fs::write(
        &script,
        "peer=127.0.0.1:12866\n\
         established() {\n\
           cat /proc/net/sctp/snmp > snmp; est=0\n\
           while read k v; do [ \"$k\" = SctpCurrEstab ] && est=$v; done < snmp\n\
           [ \"$est\" -gt 0 ]\n\
         }\n\
         cat /proc/uptime > uptime-start\n\
         fraglab serve --proto sctp --listen $peer --streams 65535 --duration 120s > serve.out 2> serve.err &\n\
         serve=$!\n\
         i=0; until [ -s serve.out ] || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done\n\
         fraglab workload --json sctp-stream --peer $peer --duration 3s > stream.json 2> stream.err\n\
         fraglab workload --json sctp-rr --peer $peer --duration 2s > rr.json 2> rr.err\n\
         fraglab workload --json sctp-connect --peer $peer --streams 65535 --associations 5 > connect.json \
           2> connect.err\n\
         kill -INT $serve; wait $serve; echo $? > serve.status\n\
         cat /proc/uptime > uptime-serve\n\
         fraglab serve --proto sctp --listen 127.0.0.1:12867 --style one-to-many --duration 5s > serve2.out \
           2> serve2.err &\n\
         serve2=$!\n\
         i=0; until [ -s serve2.out ] || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done\n\
         fraglab workload --json sctp-stream --peer 127.0.0.1:12867 --style one-to-many --duration 1s \
           > stream2.json 2> stream2.err\n\
         fraglab workload --json sctp-rr --peer 127.0.0.1:12867 --style one-to-many --duration 1s > rr2.json \
           2> rr2.err\n\
         wait $serve2; echo $? > serve2.status\n\
         cat /proc/uptime > uptime-serve2\n\
         fraglab run stop.toml -o out > run.out 2> run.err &\n\
         run=$!\n\
         i=0; until established || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done\n\
         cat /proc/uptime > uptime-established\n\
         sleep 3\n\
         cat /proc/uptime > uptime-sigint\n\
         kill -INT $run; wait $run; echo $? > run.status\n\
         cat /proc/uptime > uptime-end\n",
    )
    .unwrap();
    let results = dir.join("results");
    let t = std::time::Instant::now();
    let out = vm(&[
        "--script",
        script.to_str().unwrap(),
        "--file",
        &format!("{}:stop.toml", config.display()),
        "--extra-bin",
        "cat",
        "--extra-bin",
        "sleep",
        "--results",
        results.to_str().unwrap(),
    ]);
    let wall = t.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(0));
    let uptime = |name: &str| -> f64 {
        read(&results, name)
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let (start, served, established) =
        (uptime("uptime-start"), uptime("uptime-serve"), uptime("uptime-established"));
    let (sigint, end) = (uptime("uptime-sigint"), uptime("uptime-end"));
    eprintln!(
        "guest uptime: script start {start:.1} s, serve part done {served:.1} s, run's association up \
         {established:.1} s, SIGINT {sigint:.1} s, end {end:.1} s; fraglab vm wall time {wall:.1} s"
    );
    let result_json = |name: &str| -> serde_json::Value {
        serde_json::from_str(&read(&results, name)).unwrap_or_else(|e| {
            panic!(
                "{name}: {e}; stderr: {}",
                std::fs::read_to_string(results.join(name.replace(".json", ".err"))).unwrap_or_default()
            )
        })
    };

    // (1) serve and its peers.
    let serve = read(&results, "serve.out");
    eprintln!("serve.out:\n{serve}serve.err:\n{}", read(&results, "serve.err"));
    assert_eq!(read(&results, "serve.status").trim(), "0", "serve exits 0 on SIGINT");
    let mut lines = serve.lines();
    let first = lines.next().unwrap();
    assert!(
        first.starts_with("fraglab serve: listening on 127.0.0.1:12866 (SCTP one-to-one, 65535 streams"),
        "{first}"
    );
    let summary = lines.next().unwrap();
    assert!(lines.next().is_none(), "no error lines: {serve}");
    let (stream, rr, connect) =
        (result_json("stream.json"), result_json("rr.json"), result_json("connect.json"));
    for r in [&stream, &rr, &connect] {
        eprintln!(
            "{}: {} ok, {} failed, {} bytes in {:.2} s",
            r["kind"],
            r["ok"],
            r["failed"],
            r["bytes"],
            r["duration_s"].as_f64().unwrap()
        );
        assert_eq!((r["failed"].as_u64(), r["errors"].as_array().map(Vec::len)), (Some(0), Some(0)), "{r:#}");
        assert_eq!(r["details"]["peer"], "127.0.0.1:12866", "{r:#}");
        assert!(r["details"].get("server_associations").is_none(), "no in-process server: {r:#}");
    }
    let (stream_ok, rr_ok) = (stream["ok"].as_u64().unwrap(), rr["ok"].as_u64().unwrap());
    assert!(stream_ok > 0 && stream["bytes"].as_u64().unwrap() == stream_ok * 12000, "{stream:#}");
    assert!(rr_ok > 0 && rr["latency_us"]["count"] == rr["ok"], "{rr:#}");
    assert_eq!(connect["ok"], 5, "{connect:#}");
    for k in ["sstat_outstrms", "sstat_instrms"] {
        assert_eq!(connect["details"][k], 65535, "serve --streams 65535 offers 65535 each way: {connect:#}");
    }
    assert_eq!(connect["details"]["associations_with_fewer_streams"], 0, "{connect:#}");
    // One association per stream thread, rr client and sctp-connect association; every message the
    // clients sent arrived, and every rr request was answered.
    assert_eq!(count_before(summary, "associations"), 7, "{summary}");
    assert_eq!(count_before(summary, "messages"), stream_ok + rr_ok, "{summary}");
    assert_eq!(count_before(summary, "replies"), rr_ok, "{summary}");
    assert_eq!(count_before(summary, "unfinished"), 0, "{summary}");

    // (1b) A one-to-many server (one socket for all associations) that stops by itself after
    // --duration, for one-to-many clients.
    let serve2 = read(&results, "serve2.out");
    eprintln!("serve2.out:\n{serve2}serve2.err:\n{}", read(&results, "serve2.err"));
    assert_eq!(read(&results, "serve2.status").trim(), "0", "serve exits 0 when --duration ends");
    let lasted = uptime("uptime-serve2") - served;
    assert!((5.0..12.0).contains(&lasted), "serve --duration 5s ended {lasted:.1} s after it started");
    let mut lines = serve2.lines();
    let first = lines.next().unwrap();
    assert!(first.starts_with("fraglab serve: listening on 127.0.0.1:12867 (SCTP one-to-many"), "{first}");
    let summary = lines.next().unwrap();
    assert!(lines.next().is_none(), "no error lines: {serve2}");
    let (stream, rr) = (result_json("stream2.json"), result_json("rr2.json"));
    for r in [&stream, &rr] {
        assert_eq!((r["failed"].as_u64(), r["errors"].as_array().map(Vec::len)), (Some(0), Some(0)), "{r:#}");
        assert_eq!(r["params"]["style"], "one-to-many", "{r:#}");
    }
    let (stream_ok, rr_ok) = (stream["ok"].as_u64().unwrap(), rr["ok"].as_u64().unwrap());
    assert!(stream_ok > 0 && rr_ok > 0, "{stream:#} {rr:#}");
    // A one-to-many association is set up by one message (rr: one transaction) before the clock,
    // which the server counts and the client does not.
    assert_eq!(count_before(summary, "associations"), 2, "{summary}");
    assert_eq!(count_before(summary, "messages"), stream_ok + rr_ok + 2, "{summary}");
    assert_eq!(count_before(summary, "replies"), rr_ok + 1, "{summary}");

    // (2) SIGINT to a run in its 60 s sctp-stream.
    eprintln!("run.out:\n{}run.err:\n{}", read(&results, "run.out"), read(&results, "run.err"));
    assert_eq!(
        read(&results, "run.status").trim(),
        "130",
        "an interrupted run exits 130, also when the signal came during its last workload"
    );
    let found: Vec<PathBuf> =
        std::fs::read_dir(results.join("out")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let run = json(&found[0].join("run.json"));
    assert_eq!(
        (run["status"].as_str(), run["verdict"].as_str()),
        (Some("incomplete"), Some("interrupted")),
        "{run:#}"
    );
    assert!(run["fragment"].is_null(), "a baseline run: {run:#}");
    let workloads = json(&found[0].join("workloads.json"))["workloads"].clone();
    let w = workloads.as_array().unwrap();
    assert_eq!(w.len(), 1, "{workloads:#}");
    let r = &w[0]["result"];
    let took = r["duration_s"].as_f64().unwrap();
    let note =
        r["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).find(|n| n.starts_with("stopped"));
    eprintln!("run's sctp-stream: {} ok, {} bytes, {took:.2} s; {note:?}", r["ok"], r["bytes"]);
    assert_eq!(r["kind"], "sctp-stream", "{r:#}");
    assert_eq!(r["details"]["stopped_by_signal"], true, "{r:#}");
    assert!(note.is_some_and(|n| n.ends_with("of the 1m asked for")), "{r:#}");
    assert!((1.0..15.0).contains(&took), "stopped ~3 s in, not after the 60 s asked for: {took}");
    assert!(r["ok"].as_u64().unwrap() > 0 && r["failed"] == 0, "{r:#}");
    assert_eq!(r["details"]["server_bytes"], r["bytes"], "the in-process server got every byte: {r:#}");
    assert!(end - sigint < 5.0, "the run exited {:.1} s after SIGINT", end - sigint);
    assert!(end < 60.0, "the guest was done after {end:.1} s, before the 60 s stream could have ended");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A hung guest command is 125 too, and what it wrote before it hung still comes back: init stops it
/// at the guest-side deadline (`--timeout` minus a quarter, at most 60 s: SIGTERM, SIGKILL half-way
/// to the end of that margin) and sends the results. The command here is a `fraglab run` whose
/// workload would take 10 minutes: the SIGTERM lets it release what it holds and write run.json as
/// interrupted, so the partial run comes back whole. A program that ignores SIGTERM is killed.
#[test]
fn a_hung_guest_command_is_125_with_its_results_so_far() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("hang");
    let script = dir.join("hang.sh");
    std::fs::write(
        &script,
        "echo written before the hang > partial.txt\n\
         (trap '' TERM; exec sleep 600) &\n\
         fraglab run -o runs long.toml\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("long.toml"),
        "[run]\nname = \"long\"\n[fragment]\nmax_free_order = 4\nbudget = \"128MiB\"\n\
         [[workload]]\nkind = \"tcp-stream\"\nduration = \"600s\"\n",
    )
    .unwrap();
    let results = dir.join("results");
    let out = Command::new(FRAGLAB)
        .args(["vm", "--kernel", "debian-cloud", "--timeout", "60s", "--extra-bin", "sleep"])
        .arg("--file")
        .arg(format!("{}:long.toml", dir.join("long.toml").display()))
        .arg("--script")
        .arg(&script)
        .arg("--results")
        .arg(&results)
        .output()
        .expect("run fraglab vm");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {}\n{stderr}", out.status);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr.contains("timed out: the command was still running at 45 s"), "{stderr}");
    assert!(stderr.contains("SIGKILL at 52 s"), "{stderr}");
    assert!(stderr.contains("killing every process (SIGKILL)"), "the sleep ignoring SIGTERM: {stderr}");
    assert_eq!(read(&results, "partial.txt"), "written before the hang\n");
    let runs: Vec<PathBuf> =
        std::fs::read_dir(results.join("runs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runs[0].join("run.json")).unwrap()).unwrap();
    assert_eq!(run["verdict"], "interrupted", "{run:#}");
    assert!(run["fragment"].is_object(), "it fragmented before the deadline: {run:#}");
    assert!(
        run["sysctls_restored"].as_array().is_some_and(|r| !r.is_empty()),
        "it released and restored what it held: {run:#}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The SCTP workload tests (`tests/workload_sctp.rs`) skip on a host without SCTP, like this one:
/// here they run for real, their test binary carried into the guest with its libraries. The guest
/// run is under `FRAGLAB_REQUIRE_ALL=1` with `FRAGLAB_COVERED_ELSEWHERE=no-sctp`: there the one test
/// that needs a kernel without SCTP may skip (the host's run covers it) and any other skip fails. `cargo test
/// --workspace` builds every test binary before running any, so the newest one beside this binary is
/// the current one (running `--test vm` alone uses the last build of workload_sctp). The guest boots
/// as a user's own build would: `--kernel PATH --modules INSTALL_MOD_PATH`.
#[test]
fn the_sctp_workload_tests_run_in_the_guest() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Booted the way a patch is tested: a bzImage by path and the INSTALL_MOD_PATH its modules went
    // to. The Debian package unpacked in fraglab's cache has that layout (boot/vmlinuz-*,
    // lib/modules/<release>/); sctp.ko comes only from --modules, so SCTP working proves it was used.
    let debian =
        fraglab::vm::kernel::resolve("debian-cloud", None, &fraglab::vm::kernel::cache_dir(), false).unwrap();
    let prefix = debian.image.parent().unwrap().parent().unwrap();
    assert!(
        !Path::new("/lib/modules").join(debian.release.as_deref().unwrap()).exists(),
        "host has the tree"
    );
    let kernel = ["--kernel", debian.image.to_str().unwrap(), "--modules", prefix.to_str().unwrap()];
    let me = std::env::current_exe().unwrap();
    let deps = me.parent().unwrap();
    let binary = std::fs::read_dir(deps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("workload_sctp-") && p.extension().is_none()
        })
        .max_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap())
        .unwrap_or_else(|| {
            panic!("no workload_sctp test binary in {}: cargo test --workspace builds it", deps.display())
        });
    eprintln!("guest runs {}", binary.display());
    let dir = scratch("sctp-tests");
    let script = dir.join("sctp-tests.sh");
    // --nocapture: every skip line comes back, so what skipped is checked below.
    std::fs::write(
        &script,
        format!(
            "FRAGLAB_REQUIRE_ALL=1 FRAGLAB_COVERED_ELSEWHERE=no-sctp FRAGLAB_BIN=/bin/fraglab {} \
             --test-threads=1 --nocapture\n",
            binary.display()
        ),
    )
    .unwrap();
    let out =
        vm_on(&kernel, &["--extra-bin", binary.to_str().unwrap(), "--script", script.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    // The guest has SCTP: only the test of the error a kernel without it gives may skip.
    let skipped: Vec<&str> = stdout.lines().filter(|l| l.contains("skipped: ")).collect();
    assert!(
        skipped.len() == 1 && skipped[0].contains("this kernel has SCTP, so the EPROTONOSUPPORT error"),
        "the guest has SCTP: only no_sctp_gives_a_clear_error may skip: {skipped:#?}"
    );
    let tests = include_str!("workload_sctp.rs").matches("#[test]").count();
    assert!(
        stdout.contains(&format!("test result: ok. {tests} passed")),
        "all {tests} ran and passed: {stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
