//! One fraglab at a time: an flock on `<run dir>/lock`, which the kernel drops when the holder dies,
//! so a SIGKILLed fraglab never blocks the next one and a stale journal is recognisable as stale.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::sysctl::{self, Restored};

/// Where fraglab keeps its lock, sysctl journal, control socket and log.
pub const RUN_DIR: &str = "/run/fraglab";

/// Who holds the lock, written into the lock file for the refusal message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub command: String,
    /// Seconds since the Unix epoch.
    pub since: u64,
}

/// The held instance lock. Dropping it (or dying) releases it.
#[derive(Debug)]
pub struct Instance {
    file: File,
    pub dir: PathBuf,
}

impl Instance {
    /// Take the lock or say who has it. On success, a dead fraglab's sysctl journal is restored first
    /// and what was put back is returned for the user to see.
    pub fn acquire(dir: &Path, command: &str) -> Result<(Instance, Vec<Restored>)> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join("lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: flock on a file descriptor we own; no memory is shared with the kernel.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            match serde_json::from_str::<Holder>(&text) {
                Ok(h) => bail!(
                    "another fraglab is running: pid {} (`{}`), since {}. Stop it with `fraglab release` \
                     (or kill {}) first",
                    h.pid,
                    h.command,
                    humanize_epoch(h.since),
                    h.pid
                ),
                Err(_) => bail!("another fraglab holds {}; stop it first", path.display()),
            }
        }
        let restored = sysctl::recover(dir)?;
        // A socket left by a dead daemon would make bind() fail with EADDRINUSE.
        let _ = fs::remove_file(dir.join(crate::control::SOCKET));
        let holder = Holder { pid: std::process::id(), command: command.into(), since: now_epoch() };
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(serde_json::to_string(&holder)?.as_bytes())?;
        Ok((Instance { file, dir: dir.to_path_buf() }, restored))
    }

    /// Restore a dead fraglab's sysctls, if any, without keeping the lock: what every fraglab command
    /// does first. A live fraglab's journal is left alone.
    pub fn recover_if_stale(dir: &Path) -> Result<Vec<Restored>> {
        if !dir.join(sysctl::Journal::FILE).exists() {
            return Ok(Vec::new());
        }
        match Instance::acquire(dir, "recover") {
            Ok((_lock, restored)) => Ok(restored),
            Err(_) => Ok(Vec::new()), // held by a live fraglab: its journal is in use
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

pub fn now_epoch() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn humanize_epoch(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(t).to_string()
}
