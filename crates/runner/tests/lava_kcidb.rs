//! fraglab beyond one box: every job `fraglab lava-job` writes passes lava_common's job schema; one
//! runs end to end under Debian's lava-run (offline, on a local qemu device: scripts/lava-run), its
//! test cases are the run's verdicts as documented, and its results come back out of the job's log;
//! `fraglab export kcidb`'s output passes kcidb-io's validator for KCIDB 5.3, statuses mapped as
//! documented. The Python side (kcidb-io from PyPI, lava-common and lava-dispatcher from Debian) is
//! set up by scripts/python-tools, which scripts/test runs first.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use common::{repo, FRAGLAB};
use fraglab_results::load::Run;

/// One lava-job at a time: each fetches (once) and copies the same Debian kernel.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-lava-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// scripts/python-tools' `python` (set up now if it is not yet): None when it cannot be (then the
/// test skips, which under FRAGLAB_REQUIRE_ALL fails it).
fn python() -> Option<PathBuf> {
    let setup = Command::new(repo().join("scripts/python-tools"))
        .arg("--quiet")
        .output()
        .expect("run scripts/python-tools");
    let tools = std::env::var_os("FRAGLAB_PYTHON_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/python-tools"));
    if !setup.status.success() {
        common::skip(format!("scripts/python-tools failed: {}", text(&setup)));
        return None;
    }
    Some(tools.join("python"))
}

fn py(python: &Path, code: &str, args: &[&Path]) -> Output {
    Command::new(python).arg("-c").arg(code).args(args).output().expect("run python")
}

/// Validates each job file with lava_common's schema, strictly (unknown keys refused), as LAVA's
/// server does on submission; prints `valid PATH` or the error.
const VALIDATE_JOBS: &str = r#"
import sys, yaml
from lava_common.schemas import validate
bad = 0
for path in sys.argv[1:]:
    try:
        validate(yaml.safe_load(open(path)), strict=True, extra_context_variables=[])
        print("valid", path)
    except Exception as e:
        bad += 1
        print("invalid", path, type(e).__name__, e)
sys.exit(1 if bad else 0)
"#;

fn lava_job(args: &[&str]) -> Output {
    let _one = serial();
    Command::new(FRAGLAB)
        .arg("lava-job")
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run fraglab lava-job")
}

#[test]
fn every_lava_job_passes_lava_commons_schema_and_bad_input_writes_nothing() {
    let Some(python) = python() else { return };
    let base = scratch("jobs");
    let dir = |n: &str| base.join(n).display().to_string();
    let config = "configs/quickstart.toml";
    // A qemu device with the defaults; one with other memory, CPUs, timeout, kernel arguments that
    // need quoting, a lab's image URL and a name with quotes; two x86 boards, one on GRUB and
    // an x86 one on iPXE.
    let variants: Vec<Vec<String>> = vec![
        vec!["--kernel", "debian-cloud", "--config", config, "-o", &dir("qemu")],
        vec![
            "--kernel",
            "debian-cloud",
            "--config",
            config,
            "-o",
            &dir("qemu-lab"),
            "--mem",
            "1536M",
            "--cpus",
            "1",
            "--timeout",
            "90s",
            "--no-kvm",
            "--append",
            "sysctl.vm.x=\"a b\" numa=off",
            "--image-url",
            "https://lab.example/fraglab/",
            "--job-name",
            "quick \"start\": on a lab",
        ],
        vec![
            "--kernel",
            "debian-cloud",
            "--config",
            "configs/pipe-highorder.toml",
            "-o",
            &dir("uboot"),
            "--device-type",
            "x86-grub-board",
            "--boot-method",
            "grub",
            "--timeout",
            "45m",
        ],
        vec![
            "--kernel",
            "debian-cloud",
            "--config",
            config,
            "-o",
            &dir("ipxe"),
            "--device-type",
            "minnowboard-turbot-E3826",
            "--boot-method",
            "ipxe",
            "--image-url",
            "http://10.0.0.1/f",
        ],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(String::from).collect())
    .collect();
    let mut jobs = Vec::new();
    for v in &variants {
        let args: Vec<&str> = v.iter().map(String::as_str).collect();
        let out = lava_job(&args);
        assert_eq!(out.status.code(), Some(0), "lava-job {args:?}: {}", text(&out));
        let job = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(job.ends_with("job.yaml") && job.is_file(), "{}", text(&out));
        jobs.push(job);
    }
    let refs: Vec<&Path> = jobs.iter().map(PathBuf::as_path).collect();
    let checked = py(&python, VALIDATE_JOBS, &refs);
    assert!(checked.status.success(), "{}", text(&checked));

    // The validator does refuse: the same job without its device type, and with an action that
    // outlasts the job.
    let job = std::fs::read_to_string(&jobs[0]).unwrap();
    let broken = base.join("broken.yaml");
    std::fs::write(&broken, job.replace("device_type: \"qemu\"\n", "")).unwrap();
    let long = base.join("long.yaml");
    std::fs::write(
        &long,
        job.replace("timeout: {minutes: 10}\n    monitors", "timeout: {minutes: 500}\n    monitors"),
    )
    .unwrap();
    let refused = py(&python, VALIDATE_JOBS, &[&broken, &long]);
    assert_eq!(String::from_utf8_lossy(&refused.stdout).matches("invalid").count(), 2, "{}", text(&refused));

    // What the job says: images named by URL with their checksums (file:// by default, the lab's
    // when given), the monitor's pattern matching a whole result line and only a whole one (LAVA
    // matches the console as it streams in, through a pty that ends lines \r\r\n).
    let check = r#"
import hashlib, re, sys, yaml
job = yaml.safe_load(open(sys.argv[1]))
deploy = job["actions"][0]["deploy"]
images = deploy["images"] if deploy["to"] == "tmpfs" else {k: deploy[k] for k in ("kernel", "ramdisk")}
for name, image in images.items():
    url = image["url"]
    if url.startswith("file://"):
        assert hashlib.sha256(open(url[7:], "rb").read()).hexdigest() == image["sha256sum"], name
    print(name, url)
pattern = re.compile(job["actions"][-1]["test"]["monitors"][0]["pattern"])
m = pattern.search("FRAGLAB-RESULT verdict fail 30 failed_allocations\r\r\n")
assert m and m.group("units") == "failed_allocations" and m.group("measurement") == "30", m
assert pattern.search("FRAGLAB-RESULT verdict fail 30 faile") is None
print("timeouts", job["timeouts"]["job"]["minutes"], job["actions"][-1]["test"]["timeout"]["minutes"])
"#;
    let seen = py(&python, check, &[&jobs[0]]);
    assert!(seen.status.success(), "{}", text(&seen));
    let said = String::from_utf8_lossy(&seen.stdout);
    assert!(said.contains(&format!("ramdisk file://{}/fraglab-initramfs.cpio", dir("qemu"))), "{said}");
    // 600 s of test: 10 minutes, and the job 10 more for deploy and boot.
    assert!(said.contains("timeouts 20 10"), "{said}");
    let lab = std::fs::read_to_string(&jobs[1]).unwrap();
    assert!(lab.contains("url: \"https://lab.example/fraglab/fraglab-initramfs.cpio\""), "{lab}");
    assert!(
        lab.contains("-smp\", \"1\"") && lab.contains("memory: 1536") && lab.contains("no_kvm: true"),
        "{lab}"
    );
    // The kernel command line, as LAVA's qemu boot hands it to pexpect, which splits it again.
    let split = r#"
import sys, yaml
from pexpect.utils import split_command_line
arg = yaml.safe_load(open(sys.argv[1]))["actions"][0]["deploy"]["images"]["kernel"]["image_arg"]
words = split_command_line(arg.replace("{kernel}", "/k"))
print(words[words.index("-append") + 1])
"#;
    let append = py(&python, split, &[&jobs[1]]);
    assert_eq!(
        String::from_utf8_lossy(&append.stdout).trim_end(),
        "console=ttyS0,115200 loglevel=6 sysctl.vm.x=\"a b\" numa=off",
        "{}",
        text(&append)
    );
    // A board: TFTP, its boot method, LAVA told to leave the ramdisk as it is (no overlay to
    // repack), and the boot action's timeout covering the test's (it is the console's).
    let board = std::fs::read_to_string(&jobs[2]).unwrap();
    assert!(board.contains("to: tftp") && board.contains("method: \"grub\""), "{board}");
    assert!(board.contains("install_overlay: false") && board.contains("install_modules: false"), "{board}");
    assert!(board.contains("commands: ramdisk\n    timeout: {minutes: 50}"), "{board}");

    // Bad input: 255, a message naming the flag, and no directory written.
    let long_name = "x".repeat(201);
    for (args, says) in [
        (vec!["--device-type", "myboard"], "needs --boot-method"),
        (vec!["--boot-method", "u-boot"], "a qemu device boots with method qemu"),
        (vec!["--timeout", "30s"], "--timeout 30s: give at least 1m"),
        (vec!["--image-url", "lab.example/x"], "--image-url lab.example/x: give a URL"),
        (vec!["--device-type", "my board", "--boot-method", "ipxe"], "--device-type \"my board\""),
        (vec!["--mem", "64M"], "--mem 64.00 MiB: give at least 128MiB"),
        (
            vec!["--device-type", "b", "--boot-method", "ipxe", "--append", "x=1"],
            "--append: a board's kernel command line",
        ),
        (vec!["--device-type", "b", "--boot-method", "ipxe", "--no-kvm"], "--no-kvm is for a qemu device"),
        (vec!["--job-name", &long_name], "LAVA takes 1 to 200 characters"),
    ] {
        let out_dir = dir("refused");
        let mut all = vec!["--kernel", "debian-cloud", "--config", config, "-o", &out_dir];
        all.extend(args.iter().copied());
        let out = lava_job(&all);
        assert_eq!(out.status.code(), Some(255), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
        assert!(!Path::new(&out_dir).exists(), "{args:?} wrote {out_dir}");
    }
    let out =
        lava_job(&["--kernel", "debian-cloud", "--config", "configs/no-such.toml", "-o", &dir("refused")]);
    assert_eq!(out.status.code(), Some(255), "{}", text(&out));
    assert!(
        text(&out).contains("configs/no-such.toml") && !Path::new(&dir("refused")).exists(),
        "{}",
        text(&out)
    );
    std::fs::remove_dir_all(&base).unwrap();
}

/// KCIDB's status for fraglab's verdict, as docs/scale.md documents it.
fn documented_status(verdict: Option<&str>) -> &'static str {
    match verdict {
        Some("reproduced") => "FAIL",
        Some("not-reproduced") => "PASS",
        Some("could-not-test") => "MISS",
        _ => "ERROR",
    }
}

/// LAVA's result for fraglab's verdict, as docs/scale.md documents it.
fn documented_result(verdict: Option<&str>) -> &'static str {
    match verdict {
        Some("reproduced") => "fail",
        Some("not-reproduced") => "pass",
        Some("could-not-test") => "skip",
        _ => "unknown",
    }
}

const VALIDATE_KCIDB: &str = r#"
import json, sys, kcidb_io
data = json.load(open(sys.argv[1]))
kcidb_io.schema.V5_3.validate_exactly(data)
print("valid", kcidb_io.schema.LATEST.major, kcidb_io.schema.LATEST.minor, kcidb_io.schema.LATEST.count(data))
bad = json.loads(json.dumps(data))
bad["tests"][0]["status"] = "pass"
try:
    kcidb_io.schema.LATEST.validate(bad)
    print("accepted a lowercase status")
except Exception:
    print("refused a lowercase status")
"#;

/// Export `dirs`, validate, and check each test's status against its verdict; returns the tests.
fn export_and_validate(python: &Path, dirs: &[&Path], extra: &[&str], name: &str) -> Vec<serde_json::Value> {
    let out_file = std::env::temp_dir().join(format!("fraglab-kcidb-{name}-{}.json", std::process::id()));
    let mut cmd = Command::new(FRAGLAB);
    cmd.args(["export", "kcidb"]).args(dirs).args(extra).arg("-o").arg(&out_file);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let checked = py(python, VALIDATE_KCIDB, &[&out_file]);
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{}", text(&checked));
    // The latest schema kcidb-io knows is the one written.
    assert!(said.starts_with("valid 5 3 "), "{said}");
    assert!(said.contains("refused a lowercase status"), "{said}");
    let data: serde_json::Value = serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    std::fs::remove_file(&out_file).unwrap();
    let tests = data["tests"].as_array().unwrap().clone();
    for t in &tests {
        assert_eq!(t["status"], documented_status(t["misc"]["fraglab_verdict"].as_str()), "{t}");
        assert!(t["id"].as_str().unwrap().starts_with("fraglab:"), "{t}");
    }
    tests
}

#[test]
fn kcidb_export_of_real_results_passes_kcidb_io_and_maps_verdicts_as_documented() {
    let Some(python) = python() else { return };
    let captures = repo().join("crates/runner/tests/captures");
    let (fragmented, baseline) =
        (captures.join("pipe-highorder-6.1-fragmented"), captures.join("pipe-highorder-6.1-baseline"));
    let tests = export_and_validate(
        &python,
        &[&fragmented, &baseline],
        &[
            "--git-commit",
            "0123456789abcdef0123456789abcdef01234567",
            "--git-url",
            "https://git.kernel.org/x.git",
            "--tree",
            "stable",
        ],
        "captures",
    );
    let runs: Vec<&serde_json::Value> =
        tests.iter().filter(|t| t["path"] == "fraglab.pipe-highorder").collect();
    let statuses: Vec<&str> = runs.iter().map(|t| t["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["FAIL", "PASS"], "{runs:?}");
    // The reproduced run's failed allocations: the trace lines in the excerpt, grouped in misc.
    assert!(runs[0]["log_excerpt"].as_str().unwrap().contains("order=8"), "{}", runs[0]);
    assert_eq!(runs[0]["misc"]["failed_allocations"][0]["order"], 8, "{}", runs[0]);
    assert_eq!(runs[0]["number"]["value"], 30.0, "{}", runs[0]);
    // Schema-1 results store no plan: a window cannot be judged again (MISS), only the run.
    assert!(
        tests.iter().filter(|t| t["path"] != "fraglab.pipe-highorder").all(|t| t["status"] == "MISS"),
        "{tests:?}"
    );

    // Bad input: 255, named, nothing written.
    for (args, says) in [
        (vec!["--git-commit", "abc123"], "--git-commit abc123: give the full 40-hex-digit SHA-1"),
        (vec!["--git-url", "git://x"], "https:// repository URLs only"),
        (vec!["--origin", "Fraglab"], "lowercase letters, digits and '_' only"),
    ] {
        let out_file = std::env::temp_dir().join(format!("fraglab-kcidb-bad-{}.json", std::process::id()));
        let out = Command::new(FRAGLAB)
            .args(["export", "kcidb"])
            .arg(&fragmented)
            .args(&args)
            .arg("-o")
            .arg(&out_file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(255), "{}", text(&out));
        assert!(text(&out).contains(says), "{}", text(&out));
        assert!(!out_file.exists());
    }
    let out = Command::new(FRAGLAB).args(["export", "kcidb"]).arg(&captures).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "a directory of results directories: {}", text(&out));
    let out = Command::new(FRAGLAB).args(["export", "kcidb", "/nonexistent-results"]).output().unwrap();
    assert_eq!(out.status.code(), Some(255), "{}", text(&out));
    assert!(text(&out).contains("/nonexistent-results: no such directory"), "{}", text(&out));
}

#[test]
fn a_lava_job_runs_under_lava_run_and_its_results_come_back() {
    let Some(python) = python() else { return };
    if !nix::unistd::Uid::effective().is_root() {
        common::skip("lava-run runs only as root");
        return;
    }
    let base = scratch("run");
    let job_dir = base.join("job");
    // 1280 MiB, not the 1 GiB every vm test boots: the run must not depend on one memory size.
    let out = lava_job(&[
        "--kernel",
        "debian-cloud",
        "--config",
        "configs/pipe-highorder.toml",
        "--no-kvm",
        "--mem",
        "1280M",
        "--timeout",
        "5m",
        "-o",
        job_dir.to_str().unwrap(),
        "--append",
        "fraglab.check=\"x y\"",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lava_out = base.join("lava");
    let run = Command::new(repo().join("scripts/lava-run"))
        .arg(job_dir.join("job.yaml"))
        .arg(&lava_out)
        .output()
        .unwrap();
    let said = text(&run);
    assert_eq!(run.status.code(), Some(0), "lava-run: {said}");
    assert!(said.contains("lava lava-test-monitor pass") && said.contains("job result: pass"), "{said}");
    let boot = std::fs::read_to_string(lava_out.join("lava.log")).unwrap();
    assert!(boot.contains("-m 1280"), "the device gets the job's memory");
    // The monitor waits on the console connection with the boot action's timeout: it must cover the
    // test's 5 minutes (a run longer than the boot's own 5 would otherwise lose every result).
    assert!(boot.contains("test monitoring timeout: 600 seconds"), "the monitor's timeout");

    // The guest's results, out of LAVA's log.
    let results = base.join("results");
    let lava_results = || {
        let log = lava_out.join("lava.log");
        Command::new(FRAGLAB).arg("lava-results").arg(log).arg("-o").arg(&results).output().unwrap()
    };
    let out = lava_results();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let runs = fraglab_results::load::find_runs(&results, 4);
    assert_eq!(runs.len(), 1, "{}", text(&out));
    let fetched = Run::load(&runs[0]).unwrap();
    assert_eq!(fetched.record.status.name(), "complete", "{:?}", fetched.record);
    assert!(fetched.record.kernel_release.starts_with("6.1.0-"), "{}", fetched.record.kernel_release);
    assert_eq!(fetched.workloads.len(), 3);
    // --append reached the kernel through the job's YAML and LAVA's qemu command line, quotes and all.
    assert!(
        fetched.record.kernel_cmdline.contains("fraglab.check=\"x y\""),
        "{}",
        fetched.record.kernel_cmdline
    );
    // Again into the same directory: refused, not merged.
    let again = lava_results();
    assert_eq!(again.status.code(), Some(255), "{}", text(&again));

    // LAVA's test cases are the run's cases, each result the documented mapping of its verdict.
    let lava: Vec<(String, String, String)> = said
        .lines()
        .filter_map(|l| l.strip_prefix("fraglab-pipe-highorder "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_string(), w[1].to_string(), w.get(3).unwrap_or(&"").to_string())
        })
        .collect();
    let cases = fraglab::lava::console::cases(&fetched);
    assert_eq!(lava.len(), cases.len(), "{said}");
    for (c, (name, result, units)) in cases.iter().zip(&lava) {
        assert_eq!(name, &c.name.to_lowercase().replace('-', "_"), "{said}");
        assert_eq!(result, documented_result(c.verdict.map(|v| v.name())), "{c:?}");
        assert_eq!(units, c.units, "{said}");
    }
    assert_eq!(cases.last().unwrap().name, "verdict");
    assert_eq!(lava.last().unwrap().1, documented_result(fetched.record.verdict.map(|v| v.name())));

    // The fetched run reads like any other: compared with the same scenario run by `fraglab vm` on
    // the same kernel, and exported to KCIDB.
    let local = repo().join("crates/runner/tests/captures/pipe-highorder-6.1-fragmented");
    let cmp = Command::new(FRAGLAB).arg("compare").arg(&local).arg(&runs[0]).output().unwrap();
    assert_eq!(cmp.status.code(), Some(0), "{}", text(&cmp));
    let tests = export_and_validate(&python, &[&results], &[], "lava");
    assert_eq!(tests.len(), 4, "{tests:?}");
    std::fs::remove_dir_all(&base).unwrap();
}
