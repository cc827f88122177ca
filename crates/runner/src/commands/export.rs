//! `fraglab export kcidb`: results as a KCIDB submission (KernelCI's common results database), schema
//! 5.3 — the latest kcidb-io knows. A checkout and a build per kernel tested, a test per run and one
//! per workload window under it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use fraglab_results::load::{Run, Samples};
use fraglab_results::record::{RunStatus, Verdict};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::Digest;

use crate::cli::{ExportArgs, ExportFormat, KcidbArgs};
use crate::exit::Exit;
use crate::lava::console::{self, word};

/// `fraglab export`. Exit 0, or 255 on an error (nothing written).
pub fn run(args: ExportArgs) -> Result<Exit> {
    let written = match args.format {
        ExportFormat::Kcidb(k) => kcidb(k),
    };
    written.or_else(|e| {
        errln!("fraglab export: {e:#}");
        Ok(Exit::Error)
    })
}

/// The schema version written.
pub const KCIDB_VERSION: (u32, u32) = (5, 3);

/// KCIDB's status for a fraglab verdict: the kernel is faulty (reproduced), it passed (not
/// reproduced), the test could not run here (could not test: MISS, "the harness failed and the test
/// did not run"), or it did not complete (interrupted, or no verdict: ERROR).
pub fn kcidb_status(v: Option<Verdict>) -> &'static str {
    match v {
        Some(Verdict::Reproduced) => "FAIL",
        Some(Verdict::NotReproduced) => "PASS",
        Some(Verdict::CouldNotTest) => "MISS",
        Some(Verdict::Interrupted) | None => "ERROR",
    }
}

// The submission's objects, with only the fields fraglab fills. KCIDB refuses nulls and unknown
// fields: an absent value is left out, never written as null.

#[derive(Serialize)]
struct Submission {
    version: SchemaVersion,
    checkouts: Vec<Checkout>,
    builds: Vec<Build>,
    tests: Vec<Test>,
}

#[derive(Serialize)]
struct SchemaVersion {
    major: u32,
    minor: u32,
}

#[derive(Serialize)]
struct Checkout {
    id: String,
    origin: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tree_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    git_repository_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    git_repository_branch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    git_commit_hash: Option<String>,
    valid: bool,
}

#[derive(Serialize)]
struct Build {
    id: String,
    origin: String,
    checkout_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    architecture: Option<String>,
    comment: String,
    status: &'static str,
    misc: Value,
}

#[derive(Serialize)]
struct Test {
    id: String,
    origin: String,
    build_id: String,
    path: String,
    status: &'static str,
    comment: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    number: Option<Number>,
    environment: Environment,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_excerpt: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    output_files: Vec<Resource>,
    misc: Value,
}

#[derive(Serialize)]
struct Number {
    value: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<String>,
}

#[derive(Clone, Serialize)]
struct Environment {
    comment: String,
    misc: Value,
}

#[derive(Serialize)]
struct Resource {
    name: String,
    url: String,
}

/// The results files a test points at, those a run has.
const OUTPUT_FILES: [&str; 6] =
    ["run.json", "workloads.json", "alloc_failures.jsonl", "kmsg.log", "probe.jsonl", "final.json"];
/// KCIDB's limit on a log excerpt.
const LOG_EXCERPT_MAX: usize = 16384;

fn kcidb(args: KcidbArgs) -> Result<Exit> {
    // Check every flag before reading a run.
    if !args.origin.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        || args.origin.is_empty()
    {
        bail!("--origin {:?}: KCIDB takes lowercase letters, digits and '_' only", args.origin);
    }
    if let Some(c) = &args.git_commit {
        if c.len() != 40 || !c.chars().all(|c| c.is_ascii_hexdigit()) {
            bail!("--git-commit {c}: give the full 40-hex-digit SHA-1 (git rev-parse HEAD)");
        }
    }
    // KCIDB takes lowercase hex only.
    let git_commit = args.git_commit.as_ref().map(|c| c.to_ascii_lowercase());
    if let Some(u) = &args.git_url {
        if !u.starts_with("https://") {
            bail!("--git-url {u}: KCIDB takes https:// repository URLs only");
        }
    }
    if let Some(u) = &args.results_url {
        if !u.contains("://") {
            bail!("--results-url {u}: give a URL (https://lab.example/results/), where the results directories are served");
        }
    }
    let mut dirs = Vec::new();
    for d in &args.dirs {
        let found = fraglab_results::load::find_runs(d, 4);
        if found.is_empty() {
            fraglab_results::load::require_results_dir(d)?;
        }
        dirs.extend(found);
    }
    let runs: Vec<Run> = dirs.iter().map(|d| Run::load_with(d, Samples::Ends)).collect::<Result<_>>()?;
    let releases: std::collections::BTreeSet<&str> =
        runs.iter().map(|r| r.record.kernel_release.as_str()).collect();
    if args.git_commit.is_some() && releases.len() > 1 {
        bail!(
            "--git-commit names one kernel, but the runs tested {}: export each kernel's runs with its own commit",
            releases.into_iter().collect::<Vec<_>>().join(", ")
        );
    }

    let origin = &args.origin;
    let mut submission = Submission {
        version: SchemaVersion { major: KCIDB_VERSION.0, minor: KCIDB_VERSION.1 },
        checkouts: Vec::new(),
        builds: Vec::new(),
        tests: Vec::new(),
    };
    let mut builds: BTreeMap<(String, String), String> = BTreeMap::new();
    for run in &runs {
        let r = &run.record;
        let release = if r.kernel_release.is_empty() { "unknown" } else { r.kernel_release.as_str() };
        let checkout_id = format!("{origin}:{}", git_commit.as_deref().unwrap_or(release));
        if !submission.checkouts.iter().any(|c| c.id == checkout_id) {
            submission.checkouts.push(Checkout {
                id: checkout_id.clone(),
                origin: origin.clone(),
                tree_name: args.tree.clone(),
                git_repository_url: args.git_url.clone(),
                git_repository_branch: args.git_branch.clone(),
                git_commit_hash: git_commit.clone(),
                valid: true,
            });
        }
        let build_id = builds
            .entry((release.to_string(), r.arch.clone()))
            .or_insert_with(|| {
                // The checkout is the release when no commit is given: the build adds nothing to it
                // but the architecture.
                let mut id = match &git_commit {
                    Some(commit) => format!("{origin}:{commit}:{release}"),
                    None => checkout_id.clone(),
                };
                if !r.arch.is_empty() {
                    id += &format!(":{}", r.arch);
                }
                submission.builds.push(Build {
                    id: id.clone(),
                    origin: origin.clone(),
                    checkout_id: checkout_id.clone(),
                    architecture: Some(r.arch.clone()).filter(|a| !a.is_empty()),
                    comment: format!("kernel {release}"),
                    status: "PASS",
                    misc: json!({"kernel_release": release}),
                });
                id
            })
            .clone();
        submission.tests.extend(tests(run, origin, &build_id, args.results_url.as_deref())?);
    }

    let text = serde_json::to_string_pretty(&submission)? + "\n";
    match &args.output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
            errln!(
                "fraglab export kcidb: {} runs, {} tests into {}",
                runs.len(),
                submission.tests.len(),
                path.display()
            );
        }
        None => out!("{text}"),
    }
    Ok(Exit::Ok)
}

/// A run's tests: the run, then each workload window under it.
fn tests(run: &Run, origin: &str, build_id: &str, results_url: Option<&str>) -> Result<Vec<Test>> {
    let r = &run.record;
    let abs = std::path::absolute(&run.dir).unwrap_or_else(|_| run.dir.clone());
    let dir_name = abs.file_name().map_or("run".into(), |n| n.to_string_lossy().into_owned());
    let host = match word(&r.host) {
        h if h.is_empty() => "unknown".to_string(),
        h => h,
    };
    // Host and directory name do not make a run unique: every guest's hostname is `(none)`, and
    // rounds of one job started on several devices in the same second share a name. run.json's
    // hash does, and exporting the same run again gives the same id.
    let record = std::fs::read(run.dir.join("run.json"))
        .with_context(|| format!("cannot read {}", run.dir.join("run.json").display()))?;
    let hash = format!("{:x}", sha2::Sha256::digest(&record));
    let run_id = format!("{origin}:{host}:{dir_name}:{}", &hash[..12]);
    let scenario = match word(&r.name) {
        n if n.is_empty() => "run".to_string(),
        n => n,
    };
    let environment = Environment {
        comment: format!("{}, kernel {}", r.host, r.kernel_release),
        misc: json!({"host": r.host, "kernel_cmdline": r.kernel_cmdline, "fraglab_version": r.fraglab_version}),
    };
    let start = humantime::parse_rfc3339_weak(&r.started).ok();
    let duration = match (start, r.finished.as_deref().and_then(|f| humantime::parse_rfc3339_weak(f).ok())) {
        (Some(s), Some(f)) => f.duration_since(s).ok().map(|d| d.as_secs_f64()),
        _ => None,
    };
    let output_files: Vec<Resource> = OUTPUT_FILES
        .iter()
        .filter(|f| run.dir.join(f).is_file())
        .map(|f| Resource {
            name: f.to_string(),
            url: match results_url {
                Some(base) => format!("{}/{}/{f}", base.trim_end_matches('/'), percent_encoded(&dir_name)),
                None => file_url(&abs.join(f)),
            },
        })
        .collect();
    let cases = console::cases(run);
    let (run_case, window_cases) = cases.split_last().expect("cases() ends with the run's");
    let status_note = match r.status {
        RunStatus::Complete => String::new(),
        RunStatus::Incomplete => " (incomplete)".into(),
        RunStatus::Running => " (still running, or its fraglab died)".into(),
    };
    let mut tests = vec![Test {
        id: run_id.clone(),
        origin: origin.into(),
        build_id: build_id.into(),
        path: format!("fraglab.{scenario}"),
        status: kcidb_status(run_case.verdict),
        comment: format!(
            "{}{status_note}: {}",
            run_case.verdict.map_or("no verdict", Verdict::name),
            run_case.reason
        ),
        start_time: start.map(rfc3339),
        duration,
        number: Some(Number { value: run_case.value(), unit: Some(run_case.units.replace('_', " ")) }),
        environment,
        log_excerpt: failed_allocations_excerpt(run),
        output_files,
        misc: json!({
            "fraglab_verdict": run_case.verdict.map(Verdict::name),
            "status": r.status.name(),
            "config_path": r.config_path,
            "failed_allocations": failed_allocations(run),
            "target_losses": r.target_losses.len(),
            "results_dir": abs.display().to_string(),
        }),
    }];
    for (case, w) in window_cases.iter().zip(&run.workloads) {
        let result = &w.result;
        tests.push(Test {
            id: format!("{run_id}.{}", case.name),
            origin: origin.into(),
            build_id: build_id.into(),
            path: format!("fraglab.{scenario}.{}", case.name),
            status: kcidb_status(case.verdict),
            comment: format!("{}: {}", case.verdict.map_or("no verdict", Verdict::name), case.reason),
            start_time: humantime::parse_rfc3339_weak(&result.started).ok().map(rfc3339),
            duration: Some(result.duration_s),
            number: Some(Number { value: case.value(), unit: Some(case.units.replace('_', " ")) }),
            environment: tests[0].environment.clone(),
            log_excerpt: None,
            output_files: Vec::new(),
            misc: json!({
                "fraglab_verdict": case.verdict.map(Verdict::name),
                "kind": result.kind,
                "point": w.point.label(),
                "iteration": w.iteration,
                "ok": result.ok,
                "failed": result.failed,
                "errors": result.errors.iter().map(|e| json!({"errno": e.errno, "count": e.count})).collect::<Vec<_>>(),
                "target_held": w.target.as_ref().map(|t| t.held),
            }),
        });
    }
    Ok(tests)
}

/// A time as KCIDB's `date-time` takes it, whatever the stored text's form.
fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// `file://` and the path, percent-encoded.
fn file_url(path: &Path) -> String {
    format!("file://{}", percent_encoded(&path.to_string_lossy()))
}

/// Each byte outside RFC 3986's unreserved set and `/` percent-encoded: a URI has no spaces (a run's
/// name may).
fn percent_encoded(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => out.push(b as char),
            _ => out += &format!("%{b:02X}"),
        }
    }
    out
}

/// The failed allocations, grouped as the kernel reported them: order, gfp flags, task, the call
/// site outside the allocator.
fn failed_allocations(run: &Run) -> Vec<Value> {
    let mut groups: BTreeMap<(u32, String, String, String), u64> = BTreeMap::new();
    for f in run.failed() {
        let site = fraglab_probe::stack::call_site(&f.stack).map(|s| s.to_string()).unwrap_or_default();
        *groups.entry((f.order, f.gfp_flags.join("|"), f.comm.clone(), site)).or_default() += f.count();
    }
    groups
        .into_iter()
        .map(|((order, gfp, comm, site), count)| {
            json!({"order": order, "gfp": gfp, "comm": comm, "call_site": site, "count": count})
        })
        .collect()
}

/// The failed allocations' trace lines and stacks, as caught, up to KCIDB's limit.
fn failed_allocations_excerpt(run: &Run) -> Option<String> {
    let mut text = String::new();
    for f in run.failed() {
        let mut one = format!("{}\n", f.line.trim_end());
        for frame in &f.stack {
            one += &format!(" => {frame}\n");
        }
        if text.len() + one.len() > LOG_EXCERPT_MAX {
            break;
        }
        text += &one;
    }
    (!text.is_empty()).then_some(text)
}
