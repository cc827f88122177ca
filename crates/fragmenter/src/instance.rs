//! One fraglab changes the kernel at a time, machine-wide: an flock on [`LOCK_FILE`], which the kernel
//! drops when the holder dies, so a SIGKILLed fraglab never blocks the next one and a stale journal is
//! recognisable as stale.
//!
//! The lock is at one fixed path whatever `--run-dir` says because what it guards — sysctls, free
//! memory — is machine-wide. A lock per run directory let a second fraglab with another run directory
//! take "the" lock while the first held, journal the first one's *changed* sysctls as originals and
//! "restore" those at its end, leaving the machine changed.
//!
//! Journals, the control socket and the log stay in the run directory — moving the journal to the
//! fixed directory would be as correct, but every caller and test names it by its run directory, and a
//! record is one field — so the holder writes its run directory into the lock file instead. Whoever
//! takes the lock next knows that holder is gone (the kernel dropped its flock), so the journal the
//! record names is stale whatever run directory either of them uses, and is replayed before anything
//! else — together with any journal in the taker's own run directory. The record is emptied on a clean
//! exit and kept when a journal could not be restored, so the next fraglab retries it. One lock and one
//! record are enough: only the lock holder writes `sysctl.journal`, so there is never more than one
//! live journal to tell apart from stale ones.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::sysctl::{self, Journal, Restored};

/// Where fraglab keeps its sysctl journal, control socket and log unless `--run-dir` says otherwise.
pub const RUN_DIR: &str = "/run/fraglab";

/// The machine-wide instance lock; its content is the holder's [`Holder`] record.
pub const LOCK_FILE: &str = "/run/fraglab/lock";

/// How long [`Instance::acquire`] waits for a holder to finish (a humantime duration, e.g. `10m`).
/// Unset, it refuses at once: a user who starts a second fraglab wants to hear about the first, not
/// to hang. Test suites that fragment from parallel threads and processes set it to queue instead.
pub const WAIT_ENV: &str = "FRAGLAB_LOCK_WAIT";

/// The command a holder records while it only replays a dead holder's journal.
const RECOVER: &str = "recover";

/// Who holds the lock, written into the lock file for the refusal message and for recovery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub command: String,
    /// Seconds since the Unix epoch.
    pub since: u64,
    /// The run directory holding this holder's `sysctl.journal`, absolute. Records written before the
    /// lock was machine-wide have none: the lock was then in the run directory, so it was [`RUN_DIR`].
    #[serde(default)]
    pub run_dir: Option<PathBuf>,
    /// A `fraglab run`'s results directory, so whoever finds this holder dead can mark that run as
    /// cut short instead of leaving it "running" forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<PathBuf>,
}

impl Holder {
    fn journal_dir(&self) -> PathBuf {
        self.run_dir.clone().unwrap_or_else(|| PathBuf::from(RUN_DIR))
    }

    /// Only a moment's holder: a fraglab replaying a dead one's journal, gone within moments.
    pub fn is_recovery(&self) -> bool {
        self.command == RECOVER
    }

    /// Still the holder: its record is in the lock file and its process lives. For waiting on a holder
    /// without taking the lock, which would make a concurrent fraglab refuse.
    pub fn still_holding(&self) -> bool {
        Instance::holder().as_ref() == Some(self) && alive(self.pid)
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} (`{}`), since {}", self.pid, self.command, humanize_epoch(self.since))
    }
}

/// The held instance lock. Dropping it (or dying) releases it.
#[derive(Debug)]
pub struct Instance {
    file: File,
    /// The run directory (absolute) whose journal this holder writes.
    pub dir: PathBuf,
    holder: Holder,
    /// The record of a holder that died without cleaning up, found and replaced by this one.
    pub replaced: Option<Holder>,
}

impl Instance {
    /// Take the lock or say who has it, waiting as long as [`WAIT_ENV`] says (not at all if unset).
    /// On success, dead fraglabs' sysctl journals are restored first and what was put back is
    /// returned for the user to see.
    pub fn acquire(dir: &Path, command: &str) -> Result<(Instance, Vec<Restored>)> {
        Instance::acquire_wait(dir, command, wait_from_env()?)
    }

    /// [`Instance::acquire`], waiting up to `wait` for the holder to finish; says once on stderr whom
    /// it waits for.
    pub fn acquire_wait(dir: &Path, command: &str, wait: Duration) -> Result<(Instance, Vec<Restored>)> {
        let file = open_lock()?;
        let start = Instant::now();
        let mut told = false;
        while !try_lock(&file, Path::new(LOCK_FILE))? {
            let holder = Instance::holder();
            // An empty record under a held flock is a holder between flock and writing its record, or
            // between emptying it and closing; a `recover` holder only replays a dead one's journal.
            // Either is gone or named within moments, so look again briefly rather than refuse.
            let momentary = holder.as_ref().is_none_or(|h| h.command == RECOVER);
            if momentary && start.elapsed() < Duration::from_millis(500) {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if start.elapsed() >= wait {
                let waited = if wait.is_zero() {
                    String::new()
                } else {
                    format!(" (waited {})", humantime::format_duration(wait))
                };
                match holder {
                    Some(h) => bail!(
                        "another fraglab is running: {h}{waited}. Stop it with `fraglab release` (or kill {}) \
                         first",
                        h.pid
                    ),
                    None => bail!("another fraglab holds {LOCK_FILE}{waited}; stop it first"),
                }
            }
            if !told {
                let who = holder.map_or_else(|| "another fraglab".to_string(), |h| format!("fraglab {h}"));
                errln!(
                    "fraglab: waiting for {who} to finish ({WAIT_ENV} allows {})",
                    humantime::format_duration(wait)
                );
                told = true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Only now: a refused fraglab leaves no trace in its run directory.
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Instance::take(file, dir, command)
    }

    /// Holding the flock: replay what dead holders left, then write our own record.
    fn take(file: File, dir: &Path, command: &str) -> Result<(Instance, Vec<Restored>)> {
        let dir = std::path::absolute(dir).with_context(|| format!("{}", dir.display()))?;
        let mut dirs = Vec::new();
        // Holding the flock, a record still here is a dead holder's (a clean exit empties it).
        let replaced = Instance::holder();
        if let Some(dead) = &replaced {
            dirs.push(dead.journal_dir());
        }
        if !dirs.contains(&dir) {
            dirs.push(dir.clone());
        }
        let mut restored = Vec::new();
        for d in &dirs {
            // An error returns with the dead holder's record still in place, for the next try.
            restored.extend(sysctl::recover(d)?);
            // A socket left by a dead daemon would make bind() fail with EADDRINUSE.
            let _ = fs::remove_file(d.join(crate::control::SOCKET));
        }
        let holder = Holder {
            pid: std::process::id(),
            command: command.into(),
            since: now_epoch(),
            run_dir: Some(dir.clone()),
            results: None,
        };
        let mut instance = Instance { file, dir, holder, replaced };
        instance.write_record()?;
        Ok((instance, restored))
    }

    fn write_record(&mut self) -> Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(serde_json::to_string(&self.holder)?.as_bytes())?;
        // Where /run survives a reboot, so does the journal; the record must too, or it is found only
        // from its own run directory.
        self.file.sync_data()?;
        Ok(())
    }

    /// Name the results directory of the run this holder is doing, in its record.
    pub fn set_results(&mut self, dir: &Path) -> Result<()> {
        self.holder.results = Some(std::path::absolute(dir)?);
        self.write_record()
    }

    /// Restore dead fraglabs' sysctls, if any, without keeping the lock: what every fraglab command
    /// does first. Never waits: a live holder's journal is in use and is left alone. Creates nothing
    /// when there is nothing to restore. Returns what was put back and the dead holder's record, if
    /// this process was the one to find it — exactly one process does, under the lock.
    pub fn recover_if_stale(dir: &Path) -> Result<(Vec<Restored>, Option<Holder>)> {
        if !dir.join(Journal::FILE).exists() && Instance::holder().is_none() {
            return Ok((Vec::new(), None));
        }
        // Not root: the lock cannot be opened for writing, nor could a sysctl be restored.
        let Ok(file) = open_lock() else { return Ok((Vec::new(), None)) };
        if !try_lock(&file, Path::new(LOCK_FILE))? {
            return Ok((Vec::new(), None));
        }
        let (lock, restored) = Instance::take(file, dir, RECOVER)?;
        Ok((restored, lock.replaced.clone()))
    }

    /// The record in the lock file: the live holder's, a dead one's not yet recovered, or `None`
    /// (empty, missing, unreadable). Read without the lock, so only a hint of who holds it.
    pub fn holder() -> Option<Holder> {
        serde_json::from_str(&fs::read_to_string(LOCK_FILE).ok()?).ok()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // A journal still here could not be restored: the record keeps pointing at it so the next
        // fraglab retries, whatever its run directory.
        if !self.dir.join(Journal::FILE).exists() {
            let _ = self.file.set_len(0);
        }
    }
}

/// The wait [`WAIT_ENV`] asks for; zero when unset.
pub fn wait_from_env() -> Result<Duration> {
    match std::env::var(WAIT_ENV) {
        Ok(v) if !v.trim().is_empty() => humantime::parse_duration(v.trim())
            .with_context(|| format!("{WAIT_ENV}={v:?} is not a duration (e.g. 30s, 10m)")),
        _ => Ok(Duration::ZERO),
    }
}

fn open_lock() -> Result<File> {
    open_lock_file(Path::new(LOCK_FILE))
}

/// Open (creating it and its directory) a lock file whose content is its holder's record.
pub fn open_lock_file(path: &Path) -> Result<File> {
    let parent = path.parent().context("a lock file has a directory")?;
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// The kernel has no file locking (`CONFIG_FILE_LOCKING`): fraglab cannot make sure it is the only
/// one changing this kernel. A typed error, so commands can say "could not test" (125) rather than
/// fail: the kernel lacks something, the command is not wrong.
#[derive(Debug, thiserror::Error)]
#[error(
    "this kernel has no file locking (CONFIG_FILE_LOCKING): flock on {} failed (ENOSYS); fraglab needs it \
     to know it is the only one changing this kernel (`fraglab vm --print-kconfig` lists what a kernel needs)",
    path.display()
)]
pub struct NoFileLocking {
    pub path: PathBuf,
}

/// Take an exclusive flock without waiting; the kernel drops it when the holder dies. `Ok(false)`:
/// another process holds it. Any other failure is an error, so that a kernel that cannot lock at all
/// is never taken for one where another fraglab is running.
pub fn try_lock(file: &File, path: &Path) -> Result<bool> {
    // libc rather than nix's `Flock`, which unlocks when it drops: this lock lives as long as `file`.
    // SAFETY: flock on a file descriptor we own; no memory is shared with the kernel.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        // Without CONFIG_FILE_LOCKING flock(2) is the kernel's "not implemented" stub.
        Some(libc::ENOSYS) => Err(NoFileLocking { path: path.to_path_buf() }.into()),
        _ => bail!("cannot lock {}: flock: {err}", path.display()),
    }
}

/// A process that exists and is not a zombie (a zombie has dropped its flocks).
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

pub fn now_epoch() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn humanize_epoch(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(t).to_string()
}
