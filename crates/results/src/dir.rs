//! A run's results directory: `<output>/<name>-<UTC timestamp>/` with run.json, probe.jsonl,
//! workloads.json, alloc_failures.jsonl and kmsg.log. JSON documents are replaced atomically
//! (write, fsync, rename), so an interrupted run leaves valid files behind.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::record::{RunRecord, RunStatus};

#[derive(Clone)]
pub struct ResultsDir {
    pub dir: PathBuf,
}

impl ResultsDir {
    /// Create a fresh directory for run `name` under `output`.
    pub fn create(output: &Path, name: &str) -> Result<ResultsDir> {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace([':', '-'], "");
        fs::create_dir_all(output).with_context(|| format!("cannot create {}", output.display()))?;
        // create_dir, not exists-then-create: two runs started in the same second (CI starting jobs
        // together) must never share a directory, and only the kernel can say which one made it.
        for n in 1..=1000 {
            let dir = match n {
                1 => output.join(format!("{name}-{stamp}")),
                n => output.join(format!("{name}-{stamp}-{n}")),
            };
            match fs::create_dir(&dir) {
                Ok(()) => return Ok(ResultsDir { dir }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
            }
        }
        anyhow::bail!(
            "cannot create a results directory for {name} in {}: 1000 exist for {stamp}",
            output.display()
        )
    }

    /// Replace `file` with `value` as pretty JSON, atomically.
    pub fn write_json(&self, file: &str, value: &impl Serialize) -> Result<()> {
        let path = self.dir.join(file);
        // Per process: two fraglabs may write one run's run.json (a run, and the command that finds
        // it dead), and must not truncate each other's temporary file.
        let tmp = self.dir.join(format!(".{file}.{}.tmp", std::process::id()));
        let mut f = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        serde_json::to_writer_pretty(&mut f, value)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }

    /// A run whose fraglab died mid-way (SIGKILL, OOM kill, crash) left run.json saying "running":
    /// say instead that it was cut short, and why, so report/compare/summary never take it for one
    /// still going or complete. Returns whether run.json was changed.
    pub fn mark_cut_short(&self, why: &str) -> Result<bool> {
        let Some(mut record) = self.running_record()? else { return Ok(false) };
        let reason = match record.phase.take() {
            Some(phase) => format!("{why}; it was in phase `{phase}`"),
            None => why.into(),
        };
        let verdict = record.verdict;
        record.end(RunStatus::Incomplete, verdict, reason);
        self.write_json("run.json", &record)?;
        Ok(true)
    }

    /// Note in run.json the phase a running run has reached, so one that dies says where: the
    /// record written when the run ends replaces it with the full list of phases.
    pub fn mark_phase(&self, phase: &str) -> Result<()> {
        let Some(mut record) = self.running_record()? else { return Ok(()) };
        record.phase = Some(phase.into());
        self.write_json("run.json", &record)
    }

    /// run.json, if it still says the run is `running`. A newer fraglab's record (a newer schema) is
    /// left alone, for that fraglab to mark: this one would not know what it rewrites.
    fn running_record(&self) -> Result<Option<RunRecord>> {
        let path = self.dir.join("run.json");
        let text = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let record = match crate::load::parse_run(&text, &path) {
            Ok(record) => record,
            Err(e) if e.is::<crate::load::NewerSchema>() => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok((record.status == RunStatus::Running).then_some(record))
    }

    /// An append-only JSON-lines file; each line is flushed as it is written.
    pub fn lines(&self, file: &str) -> Result<JsonLines> {
        let path = self.dir.join(file);
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(JsonLines { out: BufWriter::new(f) })
    }

    /// An append-only text file.
    pub fn text(&self, file: &str) -> Result<File> {
        let path = self.dir.join(file);
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))
    }
}

pub struct JsonLines {
    out: BufWriter<File>,
}

impl JsonLines {
    pub fn push(&mut self, value: &impl Serialize) -> Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")?;
        // A line at a time: a killed run keeps every complete line.
        self.out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str, run_json: &str) -> ResultsDir {
        let dir = std::env::temp_dir().join(format!("fraglab-results-dir-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("run.json"), run_json).unwrap();
        ResultsDir { dir }
    }

    fn read(d: &ResultsDir) -> serde_json::Value {
        serde_json::from_slice(&fs::read(d.dir.join("run.json")).unwrap()).unwrap()
    }

    #[test]
    fn a_dead_run_is_marked_cut_short_keeping_what_this_fraglab_does_not_know() {
        let d = dir(
            "cut",
            r#"{"schema": 2, "name": "r", "status": "running", "phase": "workload exec - #1 1",
                "phases": [], "from_a_newer_fraglab": {"kept": true}}"#,
        );
        assert!(d.mark_cut_short("fraglab pid 7 died").unwrap());
        let r = read(&d);
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["reason"], "fraglab pid 7 died; it was in phase `workload exec - #1 1`");
        assert!(r.get("phase").is_none(), "{r}");
        assert_eq!(r["from_a_newer_fraglab"]["kept"], true, "{r}");
        assert!(!d.mark_cut_short("again").unwrap(), "marked once");
        fs::remove_dir_all(&d.dir).unwrap();
    }

    #[test]
    fn a_newer_schemas_running_record_is_left_for_its_fraglab() {
        let text = r#"{"schema": 99, "name": "r", "status": "running", "shape": "unknown"}"#;
        let d = dir("newer", text);
        assert!(!d.mark_cut_short("fraglab pid 7 died").unwrap());
        d.mark_phase("release").unwrap();
        assert_eq!(fs::read_to_string(d.dir.join("run.json")).unwrap(), text, "untouched");
        fs::remove_dir_all(&d.dir).unwrap();
    }
}
