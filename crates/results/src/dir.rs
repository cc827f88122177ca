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
        let mut dir = output.join(format!("{name}-{stamp}"));
        let mut n = 1;
        while dir.exists() {
            n += 1;
            dir = output.join(format!("{name}-{stamp}-{n}"));
        }
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(ResultsDir { dir })
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
        record.status = RunStatus::Incomplete;
        record.reason = match record.phase.take() {
            Some(phase) => format!("{why}; it was in phase `{phase}`"),
            None => why.into(),
        };
        record.finished = Some(crate::workload::wall_now());
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

    /// run.json, if it still says the run is `running`. A record this fraglab cannot read (another
    /// schema) is left alone.
    fn running_record(&self) -> Result<Option<RunRecord>> {
        let path = self.dir.join("run.json");
        let text = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let record: RunRecord = crate::load::parse_run(&text, &path)?;
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
