//! `fraglab run` as a user runs it: every shipped config resolves, every broken config is refused
//! with a clear error and no side effect, and the quickstart runs for real on this machine.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

mod common;
use common::{fraglab, repo};

/// Runs change machine-wide sysctls and take the instance lock: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The kernel state a run must leave as it found it.
fn kernel_state() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = [
        "vm/compact_unevictable_allowed",
        "vm/percpu_pagelist_high_fraction",
        "vm/compaction_proactiveness",
        "vm/nr_hugepages",
        "fs/pipe-max-size",
        "net/core/optmem_max",
        "net/core/high_order_alloc_disable",
    ]
    .iter()
    .map(|k| (k.to_string(), std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap().trim().to_string()))
    .collect();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    v.push((
        "tracefs mounted".into(),
        mounts.lines().any(|l| l.split_whitespace().nth(2) == Some("tracefs")).to_string(),
    ));
    let instances = std::fs::read_dir("/sys/kernel/tracing/instances")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("fraglab"))
                .count()
        })
        .unwrap_or(0);
    v.push(("fraglab tracefs instances".into(), instances.to_string()));
    v
}

#[test]
fn every_shipped_config_resolves() {
    let dir = scratch("dry");
    for entry in std::fs::read_dir(repo().join("configs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let out = fraglab(&dir, &["run", path.to_str().unwrap(), "--dry-run"]);
        assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        let plan = String::from_utf8_lossy(&out.stdout);
        assert!(plan.contains("nothing taken"));
        // Human text, not Rust's Debug formatting of the plan.
        for leak in ["Some(", "None,", "Mlock", "MaxFreeOrder", "Profile {", "Expect {", "budget None"] {
            assert!(!plan.contains(leak), "{}: {leak:?} in:\n{plan}", path.display());
        }
        assert!(plan.contains("expect: reproduced if a workload sees "), "{}: {plan}", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        let cfg: toml::Value = toml::from_str(&text).unwrap();
        let whole = cfg.get("fragment").is_some_and(|f| {
            f.get("budget").is_none() && f.get("enabled").and_then(|e| e.as_bool()) != Some(false)
        });
        // On this host (not a fraglab vm guest) a whole-machine target is stated loudly, with the way
        // to do it in a guest.
        let guest = format!("fraglab vm --kernel debian-cloud -- run {}", path.display());
        assert_eq!(plan.contains("!! WHOLE MACHINE on this host"), whole, "{}: {plan}", path.display());
        assert_eq!(plan.contains(&guest), whole, "{}: {plan}", path.display());
        if whole {
            assert!(plan.contains("fragment: whole machine, "), "{}: {plan}", path.display());
        }
        if text.contains("kind = \"sctp-") && !sctp_here() {
            assert!(
                plan.contains("could not test here: this kernel has no SCTP"),
                "{}: {plan}",
                path.display()
            );
        }
    }
    // The plan in words: the target and budget as people write them, each swept sysctl once.
    let path = repo().join("configs/tcp-high-order.toml");
    let out = String::from_utf8(fraglab(&dir, &["run", path.to_str().unwrap(), "--dry-run"]).stdout).unwrap();
    assert!(out.contains("fragment: whole machine, no free block of order ≥ 3 (32K), "), "{out}");
    assert!(
        out.contains("point threads=1 sysctl.net.core.high_order_alloc_disable=0: tcp-stream\n"),
        "{out}"
    );
}

/// The reserve leaves room for what the workloads can have the kernel hold in socket buffers —
/// the most of any sweep point, read with that point's sysctls — where the target's own free
/// blocks leave them less (MemAvailable while holding is the reserve plus those), so they neither
/// eat the target nor get fraglab OOM-killed in a small guest. Shown in the plan; a budget that
/// leaves less is refused, naming the workload and the point, with nothing taken.
#[test]
fn the_reserve_leaves_room_for_the_workloads_socket_buffers() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("room");
    std::fs::create_dir_all(&dir).unwrap();
    let tcp = |name: &str| -> u64 {
        let text = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap();
        text.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    // A stream's send and receive buffers at their largest, and a 64 KiB segment, its skb and as
    // much charged ahead past each (fraglab_workload::room's overshoot).
    let per_conn = tcp("tcp_wmem") + tcp("tcp_rmem") + 2 * (136 << 10);
    let default = fraglab_fragmenter::fragment::default_reserve().unwrap();
    let config = |name: &str, fragment: &str, sweep: &str| -> PathBuf {
        let path = dir.join(format!("{name}.toml"));
        let text = format!(
            "[run]\nname = \"{name}\"\n\n[fragment]\n{fragment}\n\n\
             [[workload]]\nkind = \"tcp-stream\"\nduration = \"1s\"\n\n[sweep]\n{sweep}\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let dry = |path: &Path| {
        let out = fraglab(&dir, &["run", path.to_str().unwrap(), "--dry-run"]);
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let size = fraglab_units::format_size;
    // A reporter's zone with under a MiB free: the buffers need the reserve.
    let sparse = "profile = \"Node 0, zone Normal 100 50 10 0 0 0 0 0 0 0 0\"";

    // Whole machine: the default reserve and 3 streams' buffers, the most of the sweep.
    let (code, out, err) = dry(&config("whole", sparse, "threads = [1, 3, 2]"));
    assert_eq!(code, Some(0), "{err}");
    let want = format!(
        "reserve:  {} of MemAvailable never taken (the default {} and {} for what the workloads can hold \
         in socket buffers, more than the target's 960.00 KiB free: tcp-stream at threads=3: 3 \
         connection(s) × {} of socket buffers)",
        size(default + 3 * per_conn),
        size(default),
        size(3 * per_conn),
        size(per_conn)
    );
    assert!(out.contains(&want), "expected {want:?} in:\n{out}");
    eprintln!("{want}");

    // A target that leaves gigabytes free covers the buffers itself: the default reserve.
    let (code, out, err) = dry(&config("roomy", "max_free_order = 4", "threads = [3]"));
    assert_eq!(code, Some(0), "{err}");
    let plain = format!("reserve:  {} of MemAvailable never taken; below", size(default));
    assert!(out.contains(&plain), "expected {plain:?} in:\n{out}");

    // A tcp_mem sweep value of a few pages: its point's room is the hard limit, the other's the
    // buffers; the larger wins.
    let sweep = "threads = [30]\nsysctl.\"net.ipv4.tcp_mem\" = [\"10 20 30\", \"100 200 40000\"]";
    let (code, out, err) = dry(&config("capped", sparse, sweep));
    assert_eq!(code, Some(0), "{err}");
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let hard = (40000 * 4096 + cpus * (1 << 20)).min(30 * per_conn);
    assert!(out.contains(&format!("and {} for what the workloads", size(hard))), "{hard}: {out}");
    assert!(out.contains("sysctl.net.ipv4.tcp_mem=100 200 40000"), "{out}");

    // A budget that fits beside the default reserve, not beside the buffers of enough streams to
    // hold a GiB or so (or TCP's hard limit): half their room short.
    let avail = fraglab_fragmenter::fragment::mem_available().unwrap();
    let n = (1 << 30) / per_conn + 1;
    let room = (n * per_conn).min(tcp("tcp_mem") * 4096);
    let budget = (avail - default - room / 2) >> 20;
    let path =
        config("budget", &format!("{sparse}\nbudget = \"{budget}MiB\""), &format!("threads = [1, {n}]"));
    let before = kernel_state();
    let out = fraglab(&dir, &["run", path.to_str().unwrap(), "-o", dir.join("results").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "{err}");
    let at = format!("tcp-stream at threads={n}");
    for want in ["[fragment] budget", "more than this machine can give", at.as_str(), "budget.toml"] {
        assert!(err.contains(want), "expected {want:?} in: {err}");
    }
    assert!(!dir.join("results").exists() && !dir.join("lock").exists(), "a refused run left things behind");
    assert_eq!(kernel_state(), before, "a refused run changed the kernel");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sweep value the kernel refuses (`[1, "banana"]`) ends the run at that point, exit 255, but
/// not its record: the point that ran is in workloads.json and the phases, the sysctl is put back
/// and run.json and the summary say so, with the error.
#[test]
fn a_sweep_value_the_kernel_refuses_ends_the_run_with_its_record_whole() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knob = "/proc/sys/net/core/high_order_alloc_disable";
    let before = std::fs::read_to_string(knob).unwrap();
    let dir = scratch("refused");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("refused.toml");
    let results = dir.join("results");
    std::fs::write(
        &config,
        format!(
            "[run]\nname = \"refused\"\noutput = \"{}\"\n\n[probe]\ninterval = \"100ms\"\nkmsg = false\n\n\
             [[workload]]\nkind = \"tcp-rr\"\nduration = \"200ms\"\n\n\
             [sweep]\nsysctl.\"net.core.high_order_alloc_disable\" = [1, \"banana\"]\n",
            results.display()
        ),
    )
    .unwrap();
    let out = fraglab(&dir, &["run", config.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(255), "{stdout}\n{stderr}");
    assert_eq!(std::fs::read_to_string(knob).unwrap(), before, "restored");
    assert!(stderr.contains("the run stopped part-way") && stderr.contains("\"banana\""), "{stderr}");
    let run_dir = std::fs::read_dir(&results).unwrap().next().unwrap().unwrap().path();
    let run = common::read_json(&run_dir.join("run.json"));
    assert_eq!(run["status"], "incomplete", "{run}");
    assert!(run["verdict"].is_null(), "{run}");
    assert!(run["reason"].as_str().unwrap().contains("banana"), "{run}");
    let restored = run["sysctls_restored"].as_array().unwrap();
    assert!(
        restored.iter().any(|r| r.as_str().unwrap().starts_with("net.core.high_order_alloc_disable")),
        "{run}"
    );
    let phases: Vec<&str> =
        run["phases"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert!(phases.contains(&"release") && phases.contains(&"final"), "{phases:?}");
    assert_eq!(run["phases"].as_array().unwrap().iter().filter(|p| p.get("workload").is_some()).count(), 1);
    let workloads = common::read_json(&run_dir.join("workloads.json"));
    assert_eq!(workloads["workloads"].as_array().unwrap().len(), 1, "{workloads}");
    // The summary of what ran, its error and what was put back.
    assert!(stdout.contains("tcp-rr"), "{stdout}");
    assert!(
        stdout.contains("error: sweep point sysctl.net.core.high_order_alloc_disable=banana"),
        "{stdout}"
    );
    assert!(stdout.contains("restored net.core.high_order_alloc_disable"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run of a budget profile measures the profile's fidelity when the hold begins and at the end of
/// every window (target against the cut's blocks still free, per order), and judges a window off
/// its profile as one that lost its target: its verdict can only be "not reproduced" when every
/// window held both ways. Whatever this host's allocations do to the blocks meanwhile, the record,
/// the verdict and the summary must agree with each other.
#[test]
fn a_budget_profile_run_judges_every_window_by_its_fidelity() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("fidelity");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("fidelity.toml");
    let results = dir.join("results");
    std::fs::write(
        &config,
        format!(
            "[run]\nname = \"fidelity\"\noutput = \"{}\"\niterations = 3\n\n\
             [fragment]\nprofile = \"1500 700 301 150 77 40 0 0 0 0 0\"\nbudget = \"256MiB\"\n\n\
             [probe]\ninterval = \"200ms\"\nkmsg = false\n\n\
             [[workload]]\nkind = \"trigger\"\ntrigger = \"pipe-resize\"\nbytes = \"1MiB\"\nrepeat = 3\n",
            results.display()
        ),
    )
    .unwrap();
    let out = fraglab(&dir, &["run", config.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let run_dir = std::fs::read_dir(&results).unwrap().next().unwrap().unwrap().path();
    let run = common::read_json(&run_dir.join("run.json"));
    eprintln!("{stdout}\n{stderr}\nverdict {} — {}", run["verdict"], run["reason"]);
    let began = &run["fragment"]["fidelity_at_hold"];
    assert_eq!(began["measure"], "intact", "{began}");
    assert_eq!(began["orders"], 6, "{began}");
    assert_eq!(began["zones"][0]["target"], serde_json::json!([1500, 700, 301, 150, 77, 40]), "{began}");
    assert!(stdout.contains("profile fidelity when the hold began (the cut's blocks still free"), "{stdout}");
    if began["within"] == false {
        // Off its profile before anything ran: could not test, and no window opened.
        assert_eq!(out.status.code(), Some(125), "{stdout}");
        assert!(run["reason"].as_str().unwrap().contains("off the profile when the hold begins"), "{run}");
        return;
    }
    let workloads = common::read_json(&run_dir.join("workloads.json"));
    let windows = workloads["workloads"].as_array().unwrap();
    assert_eq!(windows.len(), 3, "{workloads}");
    let mut off = 0;
    for w in windows {
        let t = &w["target"];
        let f = &t["fidelity"];
        assert_eq!(f["measure"], "intact", "{t}");
        assert_eq!(f["zones"][0]["zone"], "all zones", "{t}");
        let lost_ok = t["lost_s"].as_f64().unwrap() <= t["tolerance_s"].as_f64().unwrap();
        assert_eq!(t["held"], lost_ok && f["within"] == true, "{t}");
        off += usize::from(f["within"] == false);
    }
    assert!(
        stdout.contains(&format!("profile fidelity at the end of each window: within in {} of 3", 3 - off)),
        "{stdout}"
    );
    let reason = run["reason"].as_str().unwrap();
    match out.status.code() {
        // Not reproduced needs every window held, fidelity included.
        Some(0) => assert!(windows.iter().all(|w| w["target"]["held"] == true), "{run}"),
        Some(125) if off > 0 => assert!(reason.contains("off its profile when the window ended"), "{reason}"),
        Some(125 | 1) => {}
        other => panic!("exit {other:?}: {stdout}\n{stderr}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether this kernel opens SCTP sockets (the check a run's preflight makes).
fn sctp_here() -> bool {
    // SAFETY: a plain socket(2) call; the descriptor is closed at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
    if fd >= 0 {
        // SAFETY: closing the descriptor just opened.
        unsafe { libc::close(fd) };
    }
    fd >= 0
}

/// On a kernel without SCTP an SCTP config stops with 125 before the fragment phase: nothing taken,
/// no sysctl changed. The shipped config fragments the whole machine, so the run here is the same
/// config with a budget, in case the check ever moved after the fragmenter.
#[test]
fn sctp_config_without_sctp_stops_before_fragmenting() {
    if sctp_here() {
        eprintln!("this kernel has SCTP: nothing to check");
        return;
    }
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("nosctp");
    let results = scratch("nosctp-results");
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(repo().join("configs/sctp64k.toml")).unwrap();
    let config = dir.join("sctp64k-budget.toml");
    std::fs::write(&config, text.replace("max_free_order = 4\n", "max_free_order = 4\nbudget = \"64MiB\"\n"))
        .unwrap();
    let before = kernel_state();
    let out = fraglab(&dir, &["run", config.to_str().unwrap(), "-o", results.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(125), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("verdict: could-not-test (this kernel has no SCTP"), "{stdout}");
    let run_json = std::fs::read_dir(&results).unwrap().next().unwrap().unwrap().path().join("run.json");
    let run: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run_json).unwrap()).unwrap();
    assert!(run["fragment"].is_null(), "{run}");
    assert_eq!(run["phases"], serde_json::json!([]), "{run}");
    assert_eq!(kernel_state(), before, "the refused run changed the kernel");
    let _ = std::fs::remove_dir_all(&results);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn broken_configs_are_refused_clearly_and_change_nothing() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("bad");
    let results = scratch("bad-results");
    let before = kernel_state();
    // (file, what the message must say: the place and the reason)
    let cases = [
        ("syntax.toml", "line 2"),
        ("unknown-key.toml", "itterations"),
        ("wrong-type.toml", "line 3"),
        ("unknown-fragment-key.toml", "budgett"),
        ("order-too-high.toml", "[fragment] max_free_order"),
        ("budget-too-big.toml", "more than this machine can give"),
        // A workload option's error is at its key's line, under its config name.
        ("negative-duration.toml", ":5:12: [[workload]] #1 duration: \"-3s\""),
        ("trigger-order-too-high.toml", ":8:9: [[workload]] #1 bytes 1GiB: the kernel would allocate"),
        ("zero-interval.toml", "[probe] interval"),
        ("bad-lost-tolerance.toml", ":7:18: [fragment] lost_tolerance"),
        ("unknown-kind.toml", "udp-flood"),
        ("unknown-workload-option.toml", ":5:10: [[workload]] #1 thread: unknown field `thread`"),
        ("sweep-no-such-option.toml", "clients"),
        ("sweep-no-such-sysctl.toml", "no_such_knob"),
        ("bad-errno.toml", "ENOTREAL"),
        ("bad-failed-in.toml", "[expect] failed_in.0"),
        ("nothing-to-do.toml", "nothing to do"),
        ("decimal-size.toml", "binary units"),
        ("zero-iterations.toml", "[run] iterations"),
        (
            "expect-unknown.toml",
            "unknown field `order`, expected one of `errno`, `failed_order`, `failed_in`",
        ),
        ("missing-kind.toml", ":4:1: [[workload]] #1: every [[workload]] needs kind"),
        ("bad-pin.toml", ":7:7: [fragment] pin = \"glue\""),
        ("wl-wrong-type.toml", ":4:1: [[workload]] #1: invalid type: string \"two\""),
        ("bad-trigger.toml", ":7:1: [[workload]] #2: unknown variant `pipe-resiz`"),
        ("sweep-empty.toml", ":8:11: [sweep] threads: an empty list sweeps nothing"),
    ];
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad-configs");
    assert_eq!(
        std::fs::read_dir(&corpus).unwrap().count(),
        cases.len(),
        "every file in the corpus has a case"
    );
    for (file, want) in cases {
        let path = corpus.join(file);
        let out = fraglab(&dir, &["run", path.to_str().unwrap(), "-o", results.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(255), "{file}: {stderr}");
        assert!(stderr.contains(want), "{file}: expected {want:?} in: {stderr}");
        assert!(stderr.contains(file), "{file}: the error must name the file: {stderr}");
        assert!(!results.exists(), "{file}: a refused config created a results directory");
        assert!(!dir.join("lock").exists(), "{file}: a refused config took the instance lock");
        assert_eq!(kernel_state(), before, "{file}: a refused config changed the kernel");
    }
}

#[test]
fn quickstart_runs_end_to_end_and_leaves_the_kernel_as_it_was() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("quick");
    let results = scratch("quick-results");
    let before = kernel_state();
    let out = fraglab(&dir, &["run", "configs/quickstart.toml", "-o", results.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A 512 MiB budget leaves the rest of the machine contiguous: nothing should fail.
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("verdict: not-reproduced"), "{stdout}");
    assert_eq!(kernel_state(), before, "the run left the kernel changed");

    let run_dir: Vec<_> = std::fs::read_dir(&results).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(run_dir.len(), 1);
    let d = &run_dir[0];
    assert!(d.file_name().unwrap().to_string_lossy().starts_with("quickstart-"));
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["status"], "complete");
    assert_eq!(run["verdict"], "not-reproduced");
    assert!(run["config"].as_str().unwrap().contains("[fragment]"));
    assert!(!run["kernel_release"].as_str().unwrap().is_empty());
    let phases: Vec<&str> =
        run["phases"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    for want in ["baseline", "fragment", "monitors", "release", "final"] {
        assert!(phases.contains(&want), "phase {want} missing: {phases:?}");
    }
    let f = &run["fragment"];
    assert!(f["planned"][0].as_u64().unwrap() > 1000, "{f}");
    assert_eq!(f["moved_pages"], 0);
    // A budget's target is the regions its cut made: checked after every window (and each second),
    // held throughout, since mlocked pages do not move.
    let k = &f["keeping"];
    assert_eq!(k["how"], "regions", "{k}");
    assert!(k["looks"].as_u64().unwrap() >= 4, "a look after each of the four windows: {k}");
    assert_eq!(k["losses"], 0, "{k}");
    assert_eq!(run["target_losses"], serde_json::json!([]));

    // Two iterations of two workloads, each with real traffic / real calls.
    let w: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("workloads.json")).unwrap()).unwrap();
    let w = w["workloads"].as_array().unwrap();
    assert_eq!(w.len(), 4, "{w:?}");
    for r in w {
        assert_eq!(r["target"]["held"], true, "{r}");
        assert_eq!(r["target"]["lost_s"], 0.0, "{r}");
        let kind = r["result"]["kind"].as_str().unwrap();
        if kind == "tcp-stream" {
            assert!(r["result"]["bytes"].as_u64().unwrap() > 1 << 20);
        } else {
            assert!(kind.starts_with("trigger"), "{kind}");
            assert_eq!(r["result"]["ok"], 5);
            assert_eq!(r["result"]["details"]["order"], 6);
        }
    }
    // The background sampler ran through the workloads (500 ms interval, several seconds).
    let probe = std::fs::read_to_string(d.join("probe.jsonl")).unwrap();
    let samples: Vec<serde_json::Value> = probe.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(samples.len() >= 8, "{} samples", samples.len());
    assert!(samples.windows(2).all(|p| p[0]["monotonic_ns"].as_u64() < p[1]["monotonic_ns"].as_u64()));
    // Every sample says whether the target held since the one before, and what is free at or above
    // the order per zone (outside the budget: reported, not chased).
    for s in &samples {
        assert_eq!(s["target"]["held"], true, "{}", s["target"]);
        assert!(!s["target"]["zones"].as_array().unwrap().is_empty(), "{}", s["target"]);
    }
    for f in ["alloc_failures.jsonl", "kmsg.log", "baseline.json", "final.json"] {
        assert!(d.join(f).exists(), "{f} missing");
    }
}

/// A sweep over a sysctl whose value is several words (`net.ipv4.tcp_rmem`, tab-separated by the
/// kernel) crossed with a workload option: four distinct points, each kept whole and apart in
/// run.json's plan, workloads.json, the summary, compare and the report — none re-split on spaces.
#[test]
fn a_two_axis_sweep_over_a_multi_word_sysctl_keeps_every_point_apart() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem").unwrap();
    let dir = scratch("multiword");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("multiword.toml");
    let results = dir.join("results");
    std::fs::write(
        &config,
        format!(
            "[run]\nname = \"multiword\"\noutput = \"{}\"\n\n[probe]\ninterval = \"100ms\"\nkmsg = false\n\n\
             [[workload]]\nkind = \"tcp-stream\"\nduration = \"150ms\"\n\n\
             [sweep]\nthreads = [1, 2]\nsysctl.\"net.ipv4.tcp_rmem\" = [\"4096 131072 6291456\", \"4096 131072 4194304\"]\n",
            results.display()
        ),
    )
    .unwrap();
    let out = fraglab(&dir, &["run", config.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem").unwrap(), before, "restored");
    let run_dir = std::fs::read_dir(&results).unwrap().next().unwrap().unwrap().path();

    let labels = [
        "threads=1 sysctl.net.ipv4.tcp_rmem=4096 131072 6291456",
        "threads=1 sysctl.net.ipv4.tcp_rmem=4096 131072 4194304",
        "threads=2 sysctl.net.ipv4.tcp_rmem=4096 131072 6291456",
        "threads=2 sysctl.net.ipv4.tcp_rmem=4096 131072 4194304",
    ];
    let json = |f: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(run_dir.join(f)).unwrap()).unwrap()
    };
    let run = json("run.json");
    assert_eq!(run["schema"], 2);
    let planned: Vec<&serde_json::Value> = run["plan"]["points"].as_array().unwrap().iter().collect();
    assert_eq!(planned.len(), 4, "{:#}", run["plan"]);
    assert_eq!(
        planned[1],
        &serde_json::json!({"threads": 1, "sysctl.net.ipv4.tcp_rmem": "4096 131072 4194304"})
    );
    let windows: Vec<&serde_json::Value> =
        run["phases"].as_array().unwrap().iter().filter_map(|p| p.get("workload")).collect();
    assert_eq!(windows.len(), 4);
    assert_eq!(
        windows[3]["point"],
        serde_json::json!({"threads": 2, "sysctl.net.ipv4.tcp_rmem": "4096 131072 4194304"})
    );
    let workloads = json("workloads.json");
    assert_eq!(workloads["schema"], 2);
    let points: Vec<&serde_json::Value> =
        workloads["workloads"].as_array().unwrap().iter().map(|w| &w["point"]).collect();
    assert_eq!(points, planned, "each window recorded at its own point");
    let sysctls = &workloads["workloads"][1]["sysctls"];
    assert_eq!(sysctls, &serde_json::json!([["net.ipv4.tcp_rmem", "4096 131072 4194304"]]));

    // The summary: one row per point in the workloads' table and one in the socket-memory table,
    // its label whole.
    let (table, sockets) = stdout.split_once("\nsocket memory").expect("a socket-memory table");
    for l in labels {
        for part in [table, sockets] {
            assert_eq!(
                part.lines().filter(|line| line.starts_with(&format!("{l} "))).count(),
                1,
                "{l}:\n{stdout}"
            );
        }
    }
    // Labels longer than any fixed column: every row's next column starts where the header's does.
    let at = |line: &str, word: &str| line.find(word).map(|b| line[..b].chars().count());
    let head = table.lines().find(|l| l.starts_with("point ")).expect("the workloads table's header");
    let column = at(head, "workload").unwrap();
    for l in table.lines().filter(|l| l.starts_with("threads=")) {
        assert_eq!(at(l, "tcp-stream"), Some(column), "{l}\n{table}");
    }
    // compare against itself: every metric at four distinct points, labelled whole.
    let out =
        fraglab(&dir, &["compare", "--format", "json", run_dir.to_str().unwrap(), run_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut seen: Vec<&str> = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["metric"] == "throughput")
        .map(|m| m["point"].as_str().unwrap())
        .collect();
    seen.sort();
    let mut want = labels.to_vec();
    want.sort();
    assert_eq!(seen, want);
    // The report: throughput against threads, one line per tcp_rmem value.
    let html = dir.join("report.html");
    let out = fraglab(&dir, &["report", run_dir.to_str().unwrap(), "-o", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(html).unwrap();
    for series in ["tcp-stream tcp_rmem=4096 131072 6291456", "tcp-stream tcp_rmem=4096 131072 4194304"] {
        assert!(html.contains(&format!("data-series=\"{series}\"")), "{series} not in the report");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
