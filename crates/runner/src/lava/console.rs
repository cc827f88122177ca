//! What a LAVA job's guest says on its console, and reading it back: lines LAVA's `monitors` test
//! action turns into test cases, and the guest's results directory as text lines that
//! `fraglab lava-results` takes back out of the job's log.
//!
//! ```text
//! fraglab: ready                                   the boot action's prompt
//! FRAGLAB-START                                    the monitor's start
//! … the run's own output, init's and the kernel's messages …
//! FRAGLAB-RESULT sctp-connect-1 fail 0.0 failed_ops
//! FRAGLAB-RESULT verdict fail 3 failed_allocations
//! FRAGLAB-ARCHIVE-BEGIN 88 6279                    lines, bytes (gzip of a cpio newc of /results)
//! FRAGLAB-ARCHIVE 0 H4sIAAAAAAAA/+y9C3xU…           base64, numbered: a log may repeat or drop one
//! FRAGLAB-ARCHIVE-END
//! FRAGLAB-END reproduced                           the monitor's end
//! ```

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};
use base64::Engine;
use fraglab_results::load::{Run, Samples};
use fraglab_results::record::{Verdict, WorkloadRecord};

use crate::vm::channel;

/// The boot action's prompt: init is up.
pub const READY: &str = "fraglab: ready";
/// The monitor's start: the command is about to run.
pub const START: &str = "FRAGLAB-START";
/// The monitor's end: every result line is out.
pub const END: &str = "FRAGLAB-END";
const RESULT: &str = "FRAGLAB-RESULT";
const ARCHIVE: &str = "FRAGLAB-ARCHIVE";
/// The monitor's pattern for [`RESULT`] lines: LAVA's named groups. Every line carries a
/// measurement and its units (LAVA logs a missing optional group as a null measurement). It ends at
/// the line's end: LAVA matches the console as it streams in, and a bare `\S+` took `faile` of a
/// `failed_allocations` whose rest had not arrived yet. Not `\r?\n`: through the pty LAVA reads
/// qemu from, a console line ends `\r\r\n`.
pub const PATTERN: &str = r"FRAGLAB-RESULT (?P<test_case_id>\S+) (?P<result>pass|fail|skip|unknown) (?P<measurement>[-+0-9.eE]+) (?P<units>\S+)[\r\n]";
/// Base64 characters per archive line: well under any console's or log's line limit.
const ARCHIVE_LINE: usize = 96;

/// LAVA's result for a fraglab verdict: the kernel failed the test (reproduced), passed it (not
/// reproduced), the test did not run (could not test), or no verdict (interrupted, or none).
pub fn lava_result(v: Option<Verdict>) -> &'static str {
    match v {
        Some(Verdict::Reproduced) => "fail",
        Some(Verdict::NotReproduced) => "pass",
        Some(Verdict::CouldNotTest) => "skip",
        Some(Verdict::Interrupted) | None => "unknown",
    }
}

/// One test case: a workload window, or the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// `sctp-connect-1`, `tcp-stream-threads-4-2`, `verdict`: letters, digits, `-` and `_` only, so
    /// that it is a KCIDB path component as it is, and LAVA's case name once lowercased with `-`
    /// made `_`.
    pub name: String,
    pub verdict: Option<Verdict>,
    pub reason: String,
    pub measurement: f64,
    pub units: &'static str,
}

/// A name made of letters, digits, `-` and `_`: everything else becomes `_`, runs of it one.
pub fn word(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    out.trim_matches('_').to_string()
}

/// A window's case name: its kind (with its place among the config's workloads when the kind comes
/// twice), its sweep point, its iteration.
pub fn window_case(w: &WorkloadRecord, kind_repeats: bool) -> String {
    let mut name = word(&w.result.kind);
    if kind_repeats {
        name += &format!("-w{}", w.index + 1);
    }
    if !w.point.axes.is_empty() {
        name += &format!("-{}", word(&w.point.label()).replace('_', "-"));
    }
    format!("{name}-{}", w.iteration)
}

/// The run's cases: each workload window ([`crate::verdict::windows`]), then the run's own verdict
/// (`verdict`) with the failed allocations caught as its measurement.
pub fn cases(run: &Run) -> Vec<Case> {
    // A kind twice among the config's workloads: its windows also say which one they are.
    let repeats = |w: &WorkloadRecord| {
        let same = run.workloads.iter().filter(|o| o.result.kind == w.result.kind);
        same.map(|o| o.index).collect::<std::collections::BTreeSet<_>>().len() > 1
    };
    let mut cases: Vec<Case> = crate::verdict::windows(run)
        .into_iter()
        .map(|v| {
            let (measurement, units) = v.workload.result.headline();
            Case {
                name: window_case(v.workload, repeats(v.workload)),
                verdict: Some(v.verdict),
                reason: v.reason,
                measurement,
                units,
            }
        })
        .collect();
    cases.push(Case {
        name: "verdict".into(),
        verdict: run.record.verdict,
        reason: run.record.reason.clone(),
        measurement: run.failed().map(|f| f.count()).sum::<u64>() as f64,
        units: "failed_allocations",
    });
    cases
}

impl Case {
    /// The measurement as a number both LAVA's pattern and KCIDB's schema take: never NaN or
    /// infinite (a rate over no time), which neither has a way to write.
    pub fn value(&self) -> f64 {
        if self.measurement.is_finite() {
            self.measurement
        } else {
            0.0
        }
    }
}

/// A [`RESULT`] line. LAVA lowercases its case name and turns `-` into `_`.
pub fn result_line(case: &Case) -> String {
    format!("{RESULT} {} {} {} {}", case.name, lava_result(case.verdict), case.value(), case.units)
}

/// Init is up: the boot action's prompt.
pub fn ready() {
    outln!("{READY}");
}

/// The command is about to run: the monitor starts reading.
pub fn start() {
    outln!("{START}");
}

/// After the command: a case line for each workload window and run under `root`, the results
/// archive, the end line. Without a run, the command's exit is the one case.
pub fn report(root: &Path, exit: &channel::Verdict) {
    let runs = fraglab_results::load::find_runs(root, 4);
    let mut verdicts = Vec::new();
    for dir in &runs {
        let run = match Run::load_with(dir, Samples::Ends) {
            Ok(run) => run,
            Err(e) => {
                outln!("fraglab: cannot read {}: {e:#}", dir.display());
                continue;
            }
        };
        for mut case in cases(&run) {
            if runs.len() > 1 {
                case.name = format!("{}-{}", word(&run.record.name), case.name);
            }
            outln!("{}", result_line(&case));
            outln!(
                "fraglab: {}: {} — {}",
                case.name,
                case.verdict.map_or("no verdict", Verdict::name),
                case.reason
            );
        }
        verdicts.push(run.record.verdict.map_or("none", Verdict::name));
    }
    if verdicts.is_empty() {
        // The command's exit says what it can: 125 is fraglab's "could not test" (a kernel
        // without tracefs, a config this machine cannot run), anything else no verdict.
        let verdict =
            (exit.exit_code() == crate::exit::Exit::CouldNotTest.code()).then_some(Verdict::CouldNotTest);
        let reason = match runs.len() {
            0 => format!("no results directory under {}", root.display()),
            n => format!("{n} results directories under {} could not be read (above)", root.display()),
        };
        let case = Case {
            name: "verdict".into(),
            verdict,
            reason,
            measurement: f64::from(exit.exit_code()),
            units: "exit_status",
        };
        outln!("{}", result_line(&case));
        outln!("fraglab: {}; the command's {exit:?}", case.reason);
    }
    match archive(root) {
        Ok(lines) => {
            for l in lines {
                outln!("{l}");
            }
        }
        Err(e) => outln!("fraglab: cannot archive {}: {e:#}", root.display()),
    }
    outln!("{END} {}", if verdicts.is_empty() { "none".to_string() } else { verdicts.join(",") });
}

/// `root` as [`ARCHIVE`] lines: a cpio newc, gzipped (JSON shrinks tenfold, and the console is a
/// slow UART), in base64.
pub fn archive(root: &Path) -> Result<Vec<String>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for skipped in crate::vm::initramfs::pack_dir(root, &mut gz)? {
        outln!("fraglab: results: skipped {} (not a file or directory)", skipped.display());
    }
    let bytes = gz.finish()?;
    let text = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let chunks: Vec<&str> = text
        .as_bytes()
        .chunks(ARCHIVE_LINE)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    let mut lines = vec![format!("{ARCHIVE}-BEGIN {} {}", chunks.len(), bytes.len())];
    lines.extend(chunks.iter().enumerate().map(|(i, c)| format!("{ARCHIVE} {i} {c}")));
    lines.push(format!("{ARCHIVE}-END"));
    Ok(lines)
}

/// The results archive (a cpio newc) out of a log holding [`archive`]'s lines: a console capture,
/// `lava-run`'s output, or a LAVA server's job log (YAML, each line a record whose `msg` is the
/// console line). `origin` names the log in errors.
pub fn unarchive(log: &str, origin: &Path) -> Result<Vec<u8>> {
    let b64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=');
    let number = |s: &str| -> Option<usize> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let mut begin: Option<(usize, usize, usize)> = None;
    let mut lines: BTreeMap<usize, &str> = BTreeMap::new();
    for (n, line) in log.lines().enumerate() {
        if let Some(at) = line.find(&format!("{ARCHIVE}-BEGIN ")) {
            let mut words = line[at..].split_whitespace().skip(1);
            let (count, bytes) = (words.next().and_then(number), words.next().and_then(number));
            let (Some(count), Some(bytes)) = (count, bytes) else {
                bail!(
                    "{}:{}: a {ARCHIVE}-BEGIN line without its line and byte counts",
                    origin.display(),
                    n + 1
                )
            };
            if let Some((_, _, first)) = begin.filter(|b| (b.0, b.1) != (count, bytes)) {
                bail!(
                    "{}:{}: a second results archive (the first began at line {first}): give one job's log",
                    origin.display(),
                    n + 1
                );
            }
            begin.get_or_insert((count, bytes, n + 1));
        } else if let Some(at) = line.find(&format!("{ARCHIVE} ")) {
            let mut words = line[at + ARCHIVE.len() + 1..].splitn(2, ' ');
            let (Some(seq), Some(data)) = (words.next().and_then(number), words.next()) else {
                bail!("{}:{}: a {ARCHIVE} line without its number and data", origin.display(), n + 1)
            };
            let data = &data[..data.find(|c: char| !b64(c)).unwrap_or(data.len())];
            if let Some(other) = lines.insert(seq, data).filter(|o| *o != data) {
                bail!("{}:{}: archive line {seq} twice, differing ({other:?})", origin.display(), n + 1);
            }
        }
    }
    let Some((count, bytes, _)) = begin else {
        bail!(
            "{}: no results archive ({ARCHIVE}-BEGIN): not the log of a `fraglab lava-job` job, or the guest \
             never got that far (see the log's end)",
            origin.display()
        )
    };
    let missing: Vec<String> = (0..count).filter(|i| !lines.contains_key(i)).map(|i| i.to_string()).collect();
    if !missing.is_empty() {
        bail!(
            "{}: {} of the archive's {count} lines are missing (first: {}): the log was cut, or the console \
             dropped them",
            origin.display(),
            missing.len(),
            missing[..missing.len().min(5)].join(", ")
        );
    }
    let text: String = lines.range(..count).map(|(_, l)| *l).collect();
    let gz = base64::engine::general_purpose::STANDARD
        .decode(text)
        .with_context(|| format!("{}: the archive's base64 is damaged", origin.display()))?;
    if gz.len() != bytes {
        bail!("{}: the archive has {} bytes, its first line says {bytes}", origin.display(), gz.len());
    }
    let mut cpio = Vec::new();
    // The gzip trailer's CRC-32 and length are checked at its end: a damaged line cannot pass.
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut cpio)
        .with_context(|| format!("{}: the archive does not decompress", origin.display()))?;
    Ok(cpio)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A results tree of a few sizes (the archive's last line is short or full), its archive lines
    /// as a LAVA job log carries them: each line a YAML record, the records out of order, one
    /// repeated.
    #[test]
    fn the_archive_comes_back_out_of_a_job_log_whole_or_not_at_all() {
        for size in [0usize, 1, 71, 72, 5000, 300_000] {
            let root = std::env::temp_dir().join(format!("fraglab-archive-{}-{size}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("results/run-1")).unwrap();
            // Incompressible bytes, so the archive spans many lines.
            let data: Vec<u8> =
                (0..size).map(|i| (i as u64).wrapping_mul(2654435761).to_le_bytes()[3]).collect();
            std::fs::write(root.join("results/run-1/run.json"), &data).unwrap();
            let lines = archive(&root).unwrap();
            assert!(lines.iter().all(|l| l.len() <= ARCHIVE_LINE + 30), "{lines:?}");
            let mut log: Vec<String> = lines
                .iter()
                .map(|l| {
                    format!("- {{\"dt\": \"2026-12-04T23:29:10\", \"lvl\": \"target\", \"msg\": \"{l}\"}}")
                })
                .collect();
            let n = log.len();
            log.swap(1, n - 2);
            log.push(log[1].clone());
            log.insert(0, "[    1.7] kernel line".into());
            let cpio = unarchive(&log.join("\n"), Path::new("job.log")).unwrap();
            let out = root.join("out");
            crate::vm::initramfs::unpack(&cpio, &out).unwrap();
            assert_eq!(std::fs::read(out.join("results/run-1/run.json")).unwrap(), data, "{size} bytes");

            // A missing line, a damaged one, none at all: refused, saying which.
            if lines.len() > 3 {
                let mut cut = lines.clone();
                cut.remove(2);
                let e = unarchive(&cut.join("\n"), Path::new("job.log")).unwrap_err();
                assert!(
                    format!("{e:#}").contains("1 of the archive's") && format!("{e:#}").contains("first: 1"),
                    "{e:#}"
                );
                let mut bad = lines.clone();
                let l = &mut bad[2];
                let flip = if l.ends_with('A') { 'B' } else { 'A' };
                l.pop();
                l.push(flip);
                let e = unarchive(&bad.join("\n"), Path::new("job.log")).unwrap_err();
                assert!(format!("{e:#}").starts_with("job.log: the archive"), "{e:#}");
            }
            std::fs::remove_dir_all(&root).unwrap();
        }
        let e =
            unarchive("FRAGLAB-RESULT verdict pass 0 failed_allocations\n", Path::new("x.log")).unwrap_err();
        assert!(format!("{e:#}").contains("x.log: no results archive"), "{e:#}");
    }

    #[test]
    fn case_names_are_words_lava_and_kcidb_both_keep() {
        assert_eq!(word("trigger pipe-resize"), "trigger_pipe-resize");
        assert_eq!(word("(none)"), "none");
        assert_eq!(word("sysctl.net.core.x=1 threads=4"), "sysctl_net_core_x_1_threads_4");
        let verdicts = [
            (Some(Verdict::Reproduced), "fail"),
            (Some(Verdict::NotReproduced), "pass"),
            (Some(Verdict::CouldNotTest), "skip"),
            (Some(Verdict::Interrupted), "unknown"),
            (None, "unknown"),
        ];
        for (v, r) in verdicts {
            assert_eq!(lava_result(v), r);
        }
        let case = Case {
            name: "verdict".into(),
            verdict: Some(Verdict::Reproduced),
            reason: String::new(),
            measurement: f64::NAN,
            units: "failed_allocations",
        };
        assert_eq!(result_line(&case), "FRAGLAB-RESULT verdict fail 0 failed_allocations");
    }
}
