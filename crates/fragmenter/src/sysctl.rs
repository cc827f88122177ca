//! `/proc/sys`: every sysctl fraglab changes goes through a journal, so it is restored on release,
//! on exit, on a signal — and, if fraglab was SIGKILLed, by the next fraglab command.
//!
//! The original value is written to the journal and fsynced *before* the sysctl is changed: a crash
//! between the two leaves a journal entry whose restore is a harmless no-op, never a lost original.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// `vm.compact_unevictable_allowed` → `/proc/sys/vm/compact_unevictable_allowed`.
pub fn path(name: &str) -> PathBuf {
    Path::new("/proc/sys").join(name.replace('.', "/"))
}

/// The current value of a sysctl, whitespace-trimmed (multi-field values keep their inner spaces).
pub fn read(name: &str) -> Result<String> {
    let p = path(name);
    let v = fs::read_to_string(&p).with_context(|| format!("cannot read sysctl {name} ({})", p.display()))?;
    Ok(v.trim().to_string())
}

fn write(name: &str, value: &str) -> Result<()> {
    let p = path(name);
    fs::write(&p, value).with_context(|| format!("cannot set sysctl {name} = {value:?} ({})", p.display()))
}

/// One sysctl as it was before fraglab changed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub original: String,
    pub set_to: String,
    pub pid: u32,
}

/// A sysctl put back, for the user to read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restored {
    pub name: String,
    pub value: String,
}

impl std::fmt::Display for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} = {}", self.name, self.value)
    }
}

/// The journal of sysctls this process changed. Dropping it restores them.
#[derive(Debug)]
pub struct Journal {
    file: PathBuf,
    entries: Vec<Entry>,
}

impl Journal {
    /// File name of the journal inside the runtime directory.
    pub const FILE: &'static str = "sysctl.journal";

    /// Start an empty journal in `dir`. Call only while holding the instance lock, after
    /// [`recover`] has put back whatever a dead fraglab left.
    pub fn create(dir: &Path) -> Result<Self> {
        Self::create_named(dir, Self::FILE)
    }

    /// Start an empty journal in `dir` under its own file `name`: for a process that changes sysctls
    /// without the instance lock (a trigger runs beside a holding fragmenter), so neither truncates
    /// the other's journal. Put back with [`recover_named`] once its writer is known dead.
    pub fn create_named(dir: &Path, name: &str) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let file = dir.join(name);
        File::create(&file).with_context(|| format!("cannot create {}", file.display()))?;
        Ok(Journal { file, entries: Vec::new() })
    }

    /// Set `name` to `value`, journaling the original first. Setting the same sysctl twice keeps the
    /// first original, so restore always returns to the value fraglab found.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let original = read(name)?;
        if !self.entries.iter().any(|e| e.name == name) {
            let entry = Entry { name: name.into(), original, set_to: value.into(), pid: std::process::id() };
            let mut f = OpenOptions::new()
                .append(true)
                .open(&self.file)
                .with_context(|| format!("cannot append to {}", self.file.display()))?;
            writeln!(f, "{}", serde_json::to_string(&entry)?)?;
            f.sync_all()?;
            self.entries.push(entry);
        }
        write(name, value)
    }

    /// The sysctls changed so far.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Put every sysctl back, newest first, and empty the journal. Keeps going past a failure so one
    /// stubborn sysctl does not strand the others; the first error is returned.
    pub fn restore(&mut self) -> Result<Vec<Restored>> {
        let (restored, err) = restore_entries(&self.entries);
        if err.is_none() {
            self.entries.clear();
            let _ = fs::remove_file(&self.file);
        }
        match err {
            Some(e) => Err(e),
            None => Ok(restored),
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        if !self.entries.is_empty() {
            if let Err(e) = self.restore() {
                errln!("fraglab: restoring sysctls failed: {e:#}");
            }
        }
    }
}

fn restore_entries(entries: &[Entry]) -> (Vec<Restored>, Option<anyhow::Error>) {
    let mut restored = Vec::new();
    let mut first_err = None;
    for e in entries.iter().rev() {
        match write(&e.name, &e.original) {
            Ok(()) => restored.push(Restored { name: e.name.clone(), value: e.original.clone() }),
            Err(err) => {
                first_err.get_or_insert(err);
            }
        }
    }
    (restored, first_err)
}

/// Restore what a dead fraglab's journal in `dir` recorded, and remove the journal. Call only while
/// holding the instance lock: a live fraglab's journal is not stale.
pub fn recover(dir: &Path) -> Result<Vec<Restored>> {
    recover_named(dir, Journal::FILE)
}

/// [`recover`] for a journal started with [`Journal::create_named`]. Call only when its writer is
/// known dead (e.g. it no longer holds the lock it journals under).
pub fn recover_named(dir: &Path, name: &str) -> Result<Vec<Restored>> {
    let file = dir.join(name);
    let Some(entries) = read_journal(&file)? else { return Ok(Vec::new()) };
    let (restored, err) = restore_entries(&entries);
    if let Some(e) = err {
        return Err(e.context(format!("journal {} kept for the next try", file.display())));
    }
    fs::remove_file(&file).with_context(|| format!("cannot remove {}", file.display()))?;
    Ok(restored)
}

/// The entries of the journal at `file`; `None` when there is none (nothing changed, or all
/// restored).
pub fn read_journal(file: &Path) -> Result<Option<Vec<Entry>>> {
    let text = match fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        // A torn last line is what a crash mid-append leaves; its sysctl had not been changed yet.
        match serde_json::from_str::<Entry>(line) {
            Ok(e) => entries.push(e),
            Err(_) if i + 1 == text.lines().count() => {}
            Err(e) => {
                return Err(e).with_context(|| format!("{}:{}: not a journal entry", file.display(), i + 1))
            }
        }
    }
    Ok(Some(entries))
}
