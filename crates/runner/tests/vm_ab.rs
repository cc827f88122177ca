//! `fraglab vm --kernel A --kernel B --rounds N -- run CONFIG`, the pre-merge A/B, on two real
//! kernels without building one: Debian's 6.1.0-47 cloud build (6.1.170) against the current one,
//! both fetched with apt-get download. Also what it refuses before anything boots. Needs qemu and
//! apt lists, which scripts/test installs.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

mod common;

use common::{fraglab_in, read_json, repo};

/// An older Debian cloud build still in the archive (6.1.170): the base of the A/B.
const OLD_ABI: &str = "6.1.0-47";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-abtest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("configs")).unwrap();
    d
}

fn copy_config(dir: &Path, name: &str) -> String {
    let config = format!("configs/{name}.toml");
    std::fs::copy(repo().join(&config), dir.join(&config)).unwrap();
    config
}

/// The rule of docs/patch-testing.md, computed here from the rounds' own run.json files and the
/// comparison, independently of fraglab's judgement.
fn expected_exit(rounds: &[(String, String)], comparison: &serde_json::Value) -> i32 {
    let side = |label: &str| {
        let v: Vec<&str> = rounds.iter().filter(|(l, _)| l == label).map(|(_, v)| v.as_str()).collect();
        if v.contains(&"reproduced") {
            "reproduced"
        } else if v.iter().any(|v| *v != "not-reproduced") {
            "could-not-test"
        } else {
            "not-reproduced"
        }
    };
    let (a, b) = (side("base"), side("patched"));
    if a == "could-not-test" || b == "could-not-test" {
        return 125;
    }
    if a != b {
        return if b == "reproduced" { 1 } else { 0 };
    }
    let worse = comparison["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["sides"][1]["vs_baseline"]["change"] == "worse");
    i32::from(worse)
}

#[test]
fn ab_of_two_debian_cloud_builds_interleaves_rounds_and_follows_the_exit_rule() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("debian");
    let config = copy_config(&dir, "pipe-highorder");
    let base = format!("debian-cloud:{OLD_ABI}");
    let out = fraglab_in(
        &dir,
        &[
            "vm",
            "--kernel",
            &base,
            "--kernel",
            "debian-cloud",
            "--rounds",
            "2",
            "--timeout",
            "240s",
            "--",
            "run",
            &config,
        ],
    );
    let found: Vec<PathBuf> = std::fs::read_dir(dir.join("results"))
        .expect("the A/B writes under the run's results directory")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let ab = &found[0];
    assert!(ab.file_name().unwrap().to_string_lossy().starts_with("pipe-highorder-ab-"), "{}", ab.display());

    // Interleaved, each round a whole run of its own kernel with its console beside it.
    let record = read_json(&ab.join("ab.json"));
    let order: Vec<(String, u64)> = record["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["label"].as_str().unwrap().to_string(), r["round"].as_u64().unwrap()))
        .collect();
    let want: Vec<(String, u64)> = [("base", 1), ("patched", 1), ("base", 2), ("patched", 2)]
        .iter()
        .map(|(l, n)| (l.to_string(), *n))
        .collect();
    assert_eq!(order, want);
    let current_release = record["sides"][1]["release"].as_str().unwrap().to_string();
    assert_ne!(current_release, format!("{OLD_ABI}-cloud-amd64"), "the current build is a different kernel");
    let mut verdicts = Vec::new();
    for (label, n) in &want {
        let round = ab.join(format!("{label}-{n}"));
        let run = read_json(&round.join("run.json"));
        assert_eq!(run["status"], "complete", "{}", round.display());
        let release = run["kernel_release"].as_str().unwrap();
        if label == "base" {
            assert_eq!(release, format!("{OLD_ABI}-cloud-amd64"), "{}", round.display());
        } else {
            assert_eq!(release, current_release, "{}", round.display());
        }
        let console = std::fs::read_to_string(round.join("console.log")).unwrap();
        assert!(console.contains("reboot: Restarting system"), "{} console:\n{console}", round.display());
        let output = std::fs::read_to_string(round.join("guest-output.log")).unwrap();
        assert!(output.contains("pipe-highorder"), "{} guest output:\n{output}", round.display());
        verdicts.push((label.clone(), run["verdict"].as_str().unwrap().to_string()));
    }
    // ab.json says what each round's own run.json says, and the boot's scratch is gone.
    let recorded: Vec<(String, String)> = record["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["label"].as_str().unwrap().to_string(), r["verdict"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(recorded, verdicts);
    let left: Vec<String> = std::fs::read_dir(ab)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "scratch left in {}: {left:?}", ab.display());

    // The comparison: both sides, failed allocations by order and call site, and the report.
    let comparison = read_json(&ab.join("comparison.json"));
    let labels: Vec<&str> =
        comparison["runs"].as_array().unwrap().iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["base", "patched"]);
    let text = std::fs::read_to_string(ab.join("comparison.txt")).unwrap();
    assert!(text.contains("8 pipe_resize_ring"), "{text}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&text), "comparison.txt is what was printed");
    let html = std::fs::read_to_string(ab.join("report.html")).unwrap();
    for (label, n) in &want {
        assert!(html.contains(&format!("({label}-{n})")), "report.html lacks {label}-{n}");
    }

    let _ = std::fs::remove_dir_all(&dir);
    let expected = expected_exit(&verdicts, &comparison);
    assert_eq!(out.status.code(), Some(expected), "rounds {verdicts:?}");
    assert_eq!(
        i64::from(expected),
        record["judgement"]["change"].as_str().map_or(-1, |c| match c {
            "fixed" | "no-change" => 0,
            "regression" => 1,
            "could-not-test" => 125,
            _ => -1,
        })
    );
}

/// Bad input is refused with 255 before anything boots or is fetched: no results directory, no
/// kernel download (an ABI that does not exist would otherwise be tried).
#[test]
fn ab_refuses_bad_input_before_booting() {
    let dir = scratch("refuse");
    let config = copy_config(&dir, "pipe-highorder");
    let nokernel = "debian-cloud:0.0.0-0";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--kernel",
                nokernel,
                "--kernel",
                "debian-cloud",
                "--kernel",
                "x=debian-cloud",
                "--",
                "run",
                &config,
            ],
            "given 3 times",
        ),
        (
            vec!["--kernel", nokernel, "--kernel", "debian-cloud", "--modules", "/tmp", "--", "run", &config],
            "--modules base=DIR",
        ),
        (
            vec!["--kernel", "a=debian-cloud", "--kernel", "a=debian-cloud", "--", "run", &config],
            "both kernels are labelled",
        ),
        (
            vec!["--kernel", nokernel, "--kernel", "debian-cloud", "--", "probe", "--json"],
            "must be `run CONFIG`",
        ),
        (
            vec!["--kernel", nokernel, "--kernel", "debian-cloud", "--", "run", "configs/missing.toml"],
            "configs/missing.toml",
        ),
        (
            vec!["--kernel", nokernel, "--kernel", "debian-cloud", "--rounds", "0", "--", "run", &config],
            "--rounds 0",
        ),
        (
            vec!["--kernel", nokernel, "--kernel", "debian-cloud", "--results", "out", "--", "run", &config],
            "not --results",
        ),
        (
            vec!["--kernel", nokernel, "--kernel", "debian-cloud", "--", "run", &config, "-o", "/tmp/x"],
            "relative -o DIR",
        ),
        (
            vec!["--kernel", nokernel, "--kernel", "debian-cloud", "--", "run", &config, "-o", "../x"],
            "relative -o DIR",
        ),
        (
            vec![
                "--kernel",
                nokernel,
                "--kernel",
                "debian-cloud",
                "--qemu",
                "no-such-qemu",
                "--",
                "run",
                &config,
            ],
            "--qemu no-such-qemu",
        ),
        (vec!["--kernel", "debian-cloud", "--rounds", "2", "--", "run", &config], "give two --kernel"),
    ];
    for (args, says) in cases {
        let out = fraglab_in(&dir, &[&["vm"], args.as_slice()].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(255), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should say {says:?}: {err}");
        assert!(!err.contains("fetching"), "{args:?} fetched a kernel: {err}");
        assert!(!dir.join("results").exists(), "{args:?} left a results directory");
    }
}
