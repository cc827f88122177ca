//! A results directory read back, whole and typed: every reader starts here.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use fraglab_probe::snapshot::Snapshot;
use fraglab_probe::tracefs::AllocFailure;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::record::{RunRecord, Window, WorkloadRecord, WorkloadsFile};
use crate::sample::SampleLine;
use crate::{Versioned, SCHEMA};

/// One run's results.
#[derive(Clone, Debug)]
pub struct Run {
    pub dir: PathBuf,
    /// run.json. In a schema-1 run its phases' windows are filled from their names and `plan` is
    /// None (schema 1 stored only the config text).
    pub record: RunRecord,
    /// workloads.json; empty when the run had no workload or ended before one finished.
    pub workloads: Vec<WorkloadRecord>,
    /// probe.jsonl, in the order written.
    pub samples: Vec<SampleLine>,
    /// alloc_failures.jsonl, as caught (failures, and successes when the catcher was asked for them).
    pub failures: Vec<AllocFailure>,
    pub baseline: Option<Snapshot>,
    pub final_: Option<Snapshot>,
    /// What the reader should know about the data: unreadable lines, missing or unreadable files.
    pub notes: Vec<String>,
}

/// How much of probe.jsonl to read: a long run's series can be gigabytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Samples {
    /// Every line (the report draws them).
    All,
    /// The first and the last line only (compare's counter fallback); the summary needs no more.
    Ends,
}

impl Run {
    /// Read `dir`. An error names the file and what to do; damage a killed run can leave (a torn
    /// last line, a missing snapshot) becomes a note instead.
    pub fn load(dir: &Path) -> Result<Run> {
        Run::load_with(dir, Samples::All)
    }

    /// [`Run::load`], reading only as much of probe.jsonl as `samples` says.
    pub fn load_with(dir: &Path, samples: Samples) -> Result<Run> {
        require_results_dir(dir)?;
        let path = dir.join("run.json");
        let record = parse_run(
            &std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?,
            &path,
        )?;
        let mut notes = Vec::new();
        let path = dir.join("workloads.json");
        let workloads = if path.exists() { read_workloads(&path)? } else { Vec::new() };
        let samples: Vec<SampleLine> = match samples {
            Samples::All => read_lines(&dir.join("probe.jsonl"), &mut notes)?,
            Samples::Ends => read_ends(&dir.join("probe.jsonl"), &mut notes)?,
        };
        let failures: Vec<Versioned<AllocFailure>> =
            read_lines(&dir.join("alloc_failures.jsonl"), &mut notes)?;
        let mut failures: Vec<AllocFailure> = failures.into_iter().map(|f| f.body).collect();
        fraglab_probe::tracefs::fill_unknown_comms(&mut failures);
        // A snapshot a killed run left torn is a note; one of a newer schema is refused like any file.
        let mut snapshot = |file: &str| -> Result<Option<Snapshot>> {
            let p = dir.join(file);
            if !p.exists() {
                return Ok(None);
            }
            Ok(match read_json::<Versioned<Snapshot>>(&p) {
                Ok(s) => Some(s.body),
                Err(e) if e.is::<NewerSchema>() => return Err(e),
                Err(e) => {
                    notes.push(format!("{e:#}"));
                    None
                }
            })
        };
        let (baseline, final_) = (snapshot("baseline.json")?, snapshot("final.json")?);
        Ok(Run { dir: dir.to_path_buf(), record, workloads, samples, failures, baseline, final_, notes })
    }

    /// The failed allocations (the catcher records successes too when asked).
    pub fn failed(&self) -> impl Iterator<Item = &AllocFailure> {
        self.failures.iter().filter(|f| f.failed)
    }
}

/// Check `dir` is one run's results directory (it has run.json) before reading it; if not, say
/// what it is instead: missing, or a parent of results directories (then name them, so the user
/// can pick one).
pub fn require_results_dir(dir: &Path) -> Result<()> {
    if dir.join("run.json").exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        bail!("{}: no such directory", dir.display());
    }
    let mut inside: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().join("run.json").exists())
                .map(|e| e.path().display().to_string())
                .collect()
        })
        .unwrap_or_default();
    inside.sort();
    if inside.is_empty() {
        bail!("{} is not a fraglab results directory: it has no run.json", dir.display());
    }
    bail!(
        "{} is not a fraglab results directory but holds {}; pass one of them:\n  {}",
        dir.display(),
        inside.len(),
        inside.join("\n  ")
    )
}

/// The results directories at or under `root` (at most `depth` levels down), sorted: a run's own
/// directory, an output directory of runs, an A/B's rounds. A run's directory is not searched
/// further; unreadable directories are passed over.
pub fn find_runs(root: &Path, depth: usize) -> Vec<PathBuf> {
    if root.join("run.json").is_file() {
        return vec![root.to_path_buf()];
    }
    let mut runs = Vec::new();
    if depth > 0 {
        if let Ok(entries) = std::fs::read_dir(root) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    runs.extend(find_runs(&e.path(), depth - 1));
                }
            }
        }
    }
    runs.sort();
    runs
}

/// What every file says of itself. Read apart from the body, which is parsed straight from the
/// text: through `serde_json::Value` a sweep point's axes would come back sorted, not in sweep order.
#[derive(Deserialize)]
struct Head {
    schema: Option<u64>,
    fraglab_version: Option<String>,
}

/// A file written in a results schema newer than this fraglab reads: refused, never misread.
#[derive(Debug)]
pub struct NewerSchema(String);

impl std::fmt::Display for NewerSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NewerSchema {}

/// The schema a document says it is in; refuse one newer than this fraglab reads.
fn check_schema(text: &str, path: &Path) -> Result<(u32, Option<String>)> {
    let head: Head = serde_json::from_str(text).map_err(|e| {
        let why = if e.is_eof() { "cut short (a run killed mid-write?)".to_string() } else { e.to_string() };
        anyhow::anyhow!("{}: {why}: not what fraglab run writes", path.display())
    })?;
    let schema = head.schema.unwrap_or(1) as u32;
    if schema == 0 {
        bail!(
            "{}: results schema 0 does not exist (fraglab writes 1 and up): not a file fraglab run wrote",
            path.display()
        );
    }
    if schema > SCHEMA {
        return Err(NewerSchema(format!(
            "{}: written in results schema {schema}, by a newer fraglab; this one ({}) reads schemas 1 to {SCHEMA}: \
             read it with the fraglab that wrote it, or a newer one",
            path.display(),
            env!("CARGO_PKG_VERSION")
        ))
        .into());
    }
    Ok((schema, head.fraglab_version))
}

/// run.json's text, of any schema this fraglab reads, as the current [`RunRecord`].
pub fn parse_run(text: &[u8], path: &Path) -> Result<RunRecord> {
    let text = std::str::from_utf8(text).with_context(|| format!("{} is not UTF-8 text", path.display()))?;
    let (schema, version) = check_schema(text, path)?;
    let mut record: RunRecord = serde_json::from_str(text).map_err(|e| {
        anyhow::anyhow!(
            "{}: results schema {schema} (written by fraglab {}), but {e}: read it with the fraglab that wrote it",
            path.display(),
            version.as_deref().unwrap_or("of unknown version")
        )
    })?;
    record.schema = schema;
    if schema == 1 {
        for p in &mut record.phases {
            p.workload = Window::from_legacy_phase(&p.name);
        }
    }
    Ok(record)
}

/// workloads.json: an object with `schema` (2), or the bare list schema 1 wrote.
fn read_workloads(path: &Path) -> Result<Vec<WorkloadRecord>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text).map_err(|e| bad(path, 1, e));
    }
    let (schema, _) = check_schema(&text, path)?;
    let file: WorkloadsFile = serde_json::from_str(&text).map_err(|e| bad(path, schema, e))?;
    Ok(file.workloads)
}

fn bad(path: &Path, schema: u32, e: serde_json::Error) -> anyhow::Error {
    anyhow::anyhow!("{}: results schema {schema}, but {e}: not what fraglab run writes", path.display())
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (schema, _) = check_schema(&text, path)?;
    serde_json::from_str(&text).map_err(|e| bad(path, schema, e))
}

/// The first and the last line of a JSON-lines file, read without holding the rest; a line that
/// does not parse is a note, as in [`read_lines`].
fn read_ends<T: DeserializeOwned>(path: &Path, notes: &mut Vec<String>) -> Result<Vec<T>> {
    use std::io::BufRead;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    // The last line a killed run left may be cut short: the last one that is whole JSON counts.
    let (mut first, mut last) = (None, None);
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        if first.is_none() {
            first = Some((i + 1, line));
        } else if serde_json::from_str::<serde::de::IgnoredAny>(&line).is_ok() {
            last = Some((i + 1, line));
        }
    }
    parse_lines(first.into_iter().chain(last), path, notes)
}

/// JSON lines; a line that does not parse (a run killed mid-write) becomes a note, not an error. A
/// line of a newer schema is an error: the file is not this fraglab's to read.
fn read_lines<T: DeserializeOwned>(path: &Path, notes: &mut Vec<String>) -> Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    parse_lines(text.lines().enumerate().map(|(i, l)| (i + 1, l.to_string())), path, notes)
}

/// `(line number, line)` pairs of `path`, parsed.
fn parse_lines<T: DeserializeOwned>(
    lines: impl Iterator<Item = (usize, String)>,
    path: &Path,
    notes: &mut Vec<String>,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for (n, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let at = PathBuf::from(format!("{}:{n}", path.display()));
        match check_schema(&line, &at) {
            Ok((schema, _)) => match serde_json::from_str::<T>(&line) {
                Ok(t) => out.push(t),
                Err(e) => unreadable.push(format!("{}: results schema {schema}, but {e}", at.display())),
            },
            Err(e) if e.is::<NewerSchema>() => return Err(e),
            Err(e) => unreadable.push(format!("{e:#}")),
        }
    }
    if !unreadable.is_empty() {
        notes.push(format!("{} unreadable line(s) skipped, first: {}", unreadable.len(), unreadable[0]));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fraglab-results-load-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (f, text) in files {
            std::fs::write(d.join(f), text).unwrap();
        }
        d
    }

    const RUN: &str = r#"{"schema": 2, "name": "r", "status": "complete", "phases": []}"#;

    fn sample(ns: u64) -> String {
        format!(r#"{{"schema": 2, "wall": "t", "monotonic_ns": {ns}, "elapsed": 0.0}}"#)
    }

    /// A killed run's probe.jsonl: many samples, the last line cut short.
    #[test]
    fn the_ends_of_a_killed_runs_series_are_its_first_and_last_whole_lines() {
        let probe =
            [sample(1), sample(2), sample(3), r#"{"schema": 2, "wall": "t", "monoto"#.to_string()].join("\n");
        let d = dir("ends", &[("run.json", RUN), ("probe.jsonl", &probe)]);
        let ends = Run::load_with(&d, Samples::Ends).unwrap();
        let ns: Vec<u64> = ends.samples.iter().map(|s| s.sample.snapshot.monotonic_ns).collect();
        assert_eq!(ns, [1, 3]);
        let all = Run::load(&d).unwrap();
        assert_eq!(all.samples.len(), 3);
        assert_eq!(all.notes.len(), 1, "{:?}", all.notes);
        let note = &all.notes[0];
        assert!(note.contains("probe.jsonl:4: cut short (a run killed mid-write?)"), "{note}");
        assert_eq!(note.matches("probe.jsonl:4").count(), 1, "the place said once: {note}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn schemas_that_do_not_exist_or_are_newer_are_refused_by_name() {
        for (schema, want) in [
            ("0", "results schema 0 does not exist"),
            ("3", "written in results schema 3, by a newer fraglab"),
            ("\"2\"", "invalid type: string \"2\""),
        ] {
            let d = dir(
                "schema",
                &[("run.json", &RUN.replace("\"schema\": 2", &format!("\"schema\": {schema}")))],
            );
            let e = format!("{:#}", Run::load(&d).unwrap_err());
            assert!(
                e.contains(&format!("{}: ", d.join("run.json").display())) && e.contains(want),
                "{schema}: {e}"
            );
            std::fs::remove_dir_all(&d).unwrap();
        }
    }
}
