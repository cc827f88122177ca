//! Pipe pages: unmovable order-0 allocations. Once the unmovable free lists run dry the kernel
//! serves them by stealing the *largest* free block of another migratetype (`__rmqueue_fallback`
//! searches from the top order down), whereas our own movable pages would come from the smallest
//! blocks — the very fragments we made. Filling pipes is how the high-order blocks left in the
//! reserve we did not take get broken up in whole-machine mode.
//!
//! A fill can be many GiB (the default reserve of a 256 GiB server is 4 GiB), and every pipe costs a
//! file descriptor, so the fill is sized to the descriptors this process may open: only the write end
//! of a full pipe is kept (a pipe's buffers live until its last end closes, `put_pipe_info`), and
//! pipes grow beyond `fs.pipe-max-size` — raised through the journal — when the descriptors would
//! not hold the fill at 1 MiB a pipe.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::{bail, Context, Result};

use crate::arena::PAGE_SIZE;
use crate::sysctl::Journal;

/// The smallest pipe a fill asks for: the default `fs.pipe-max-size`, needing no sysctl change.
const MIN_PIPE_BYTES: usize = 1 << 20;

/// A pipe as created, before F_SETPIPE_SZ: 16 slots (`PIPE_DEF_BUFFERS`).
const DEFAULT_PIPE_BYTES: usize = 16 * PAGE_SIZE;

/// The largest pipe a fill asks for. Its slot array is one kcalloc of 40 bytes a slot (order 6 for
/// 16 MiB); larger ones would need blocks that a fragmented machine no longer has.
const MAX_PIPE_BYTES: usize = 16 << 20;

/// Descriptors left for the rest of fraglab while it holds (the control socket, the log, /proc
/// files, a run's workloads).
const REST_MARGIN: u64 = 256;

/// Descriptors the whole-machine pipe fill leaves the keeper ([`crate::keeper`]), one per block
/// re-broken: more than any run measured needed (64). Past them the keeper takes more only while the
/// descriptor limit leaves the rest of fraglab its margin, so under the common limit of 1024 the fill
/// still gets most of them.
pub const KEEPER_FDS: usize = 128;

/// Descriptors the fill leaves: the rest of fraglab's, and the keeper's one pipe a block re-broken.
const FD_MARGIN: u64 = REST_MARGIN + KEEPER_FDS as u64;

/// Pipes kept full; dropping them frees their pages.
pub struct PipeFill {
    /// The write end of each pipe and the bytes written into it; the read ends are closed.
    pipes: Vec<(OwnedFd, u64)>,
    bytes: u64,
    /// What F_SETPIPE_SZ asks for next; halves when the kernel cannot allocate the slot array.
    pipe_bytes: usize,
    /// The most pipes the descriptors allow, leaving [`FD_MARGIN`] for everything else ([`PipeFill::fit`]).
    max_pipes: Option<u64>,
}

impl Default for PipeFill {
    fn default() -> Self {
        PipeFill { pipes: Vec::new(), bytes: 0, pipe_bytes: MIN_PIPE_BYTES, max_pipes: None }
    }
}

/// RLIMIT_NOFILE as it was before a fill raised it, for children that should not inherit the raise
/// (an `exec` workload: a million descriptors breaks programs that still use select(2)).
static NOFILE_BEFORE: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();

/// RLIMIT_NOFILE as it was before any fill raised it; `None` when none did.
pub fn nofile_before_fill() -> Option<(u64, u64)> {
    NOFILE_BEFORE.get().copied()
}

impl PipeFill {
    /// Get ready to hold up to `expected` bytes: raise the descriptor limit as far as the kernel lets
    /// this process, and size pipes so that many bytes fit in the descriptors left, raising
    /// `fs.pipe-max-size` through `journal` when they must be larger than it allows. Returns the
    /// bytes the fill can hold at most.
    pub fn fit(&mut self, expected: u64, journal: &mut Journal) -> Result<u64> {
        let fds = raise_nofile_limit().saturating_sub(open_fds() + FD_MARGIN).max(1);
        let per_pipe = expected.div_ceil(fds).max(MIN_PIPE_BYTES as u64);
        let size = (per_pipe.next_power_of_two() as usize).min(MAX_PIPE_BYTES);
        let max = crate::sysctl::read("fs.pipe-max-size")?.parse::<usize>().unwrap_or(MIN_PIPE_BYTES);
        if size > max {
            journal.set("fs.pipe-max-size", &size.to_string())?;
        }
        self.pipe_bytes = size;
        self.max_pipes = Some(fds);
        Ok(fds * size as u64)
    }

    /// Write `bytes` more (rounded up to a page) into new pipes. Returns the bytes now held.
    pub fn fill(&mut self, bytes: u64) -> Result<u64> {
        raise_nofile_limit();
        let buf = vec![0x5au8; 16 * PAGE_SIZE];
        let mut left = bytes.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
        while left > 0 {
            if let Some(max) = self.max_pipes.filter(|&m| self.pipes.len() as u64 >= m) {
                bail!(
                    "the descriptor budget is spent: {max} pipes hold {} MiB ({} KiB a pipe), and {FD_MARGIN} \
                     descriptors stay free for the rest of fraglab; RLIMIT_NOFILE is {}",
                    self.bytes >> 20,
                    self.pipe_bytes >> 10,
                    nofile_limit()
                );
            }
            // Close-on-exec: a workload's child holding a copy of a write end would keep the pipe's
            // pages allocated after the guard or a release "gave them back".
            let (r, w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
                Ok(p) => p,
                Err(nix::errno::Errno::EMFILE | nix::errno::Errno::ENFILE) => bail!(
                    "out of file descriptors after {} pipes holding {} MiB ({} KiB a pipe): \
                     RLIMIT_NOFILE is {}; raise it (ulimit -n) or fs.pipe-max-size",
                    self.pipes.len(),
                    self.bytes >> 20,
                    self.pipe_bytes >> 10,
                    nofile_limit()
                ),
                Err(e) => return Err(e).context("pipe() failed"),
            };
            let size = self.resize(&w)?;
            let mut file = std::fs::File::from(w);
            let mut n = 0u64;
            while n < size as u64 && left > 0 {
                let len = (size as u64 - n).min(left).min(buf.len() as u64) as usize;
                file.write_all(&buf[..len]).context("write to pipe")?;
                n += len as u64;
                left -= len as u64;
            }
            // The buffers outlive the read end: keep one descriptor a pipe, not two.
            drop(r);
            self.bytes += n;
            self.pipes.push((OwnedFd::from(file), n));
        }
        Ok(self.bytes)
    }

    /// Grow a new pipe to the fill's pipe size; when the kernel cannot allocate the slot array (one
    /// kcalloc, of an order the fragmented machine may lack) try half the size, down to the 16 slots
    /// every pipe already has. Returns the pipe's size.
    fn resize(&mut self, w: &OwnedFd) -> Result<usize> {
        while self.pipe_bytes > DEFAULT_PIPE_BYTES {
            // SAFETY: F_SETPIPE_SZ on a pipe we own.
            let size =
                unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, self.pipe_bytes as libc::c_int) };
            if size >= 0 {
                return Ok(size as usize);
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENOMEM) {
                return Err(err).with_context(|| format!("fcntl(F_SETPIPE_SZ, {})", self.pipe_bytes));
            }
            self.pipe_bytes /= 2;
        }
        Ok(DEFAULT_PIPE_BYTES)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Pipes held now.
    pub fn pipes(&self) -> usize {
        self.pipes.len()
    }

    /// What F_SETPIPE_SZ asks for next.
    pub fn pipe_bytes(&self) -> usize {
        self.pipe_bytes
    }

    /// Close the newest pipes until at least `bytes` are freed (or none are left). Returns the bytes
    /// freed.
    pub fn shrink(&mut self, bytes: u64) -> u64 {
        let mut given = 0;
        while given < bytes {
            let Some((_, n)) = self.pipes.pop() else { break };
            given += n;
        }
        self.bytes -= given;
        given
    }

    /// Free every pipe page.
    pub fn release(&mut self) {
        self.pipes.clear();
        self.bytes = 0;
    }
}

/// Raise the soft descriptor limit to the hard one, and the hard one towards `fs.nr_open` where
/// the kernel allows it (CAP_SYS_RESOURCE). Every pipe costs a descriptor; the common soft limit of
/// 1024 would stop a fill at 1 GiB. Done once per process; returns the limit now in force.
pub(crate) fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if NOFILE_BEFORE.get().is_some() {
        return nofile_limit();
    }
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 1024 };
    NOFILE_BEFORE.get_or_init(|| (soft, hard));
    let nr_open = crate::sysctl::read("fs.nr_open").ok().and_then(|v| v.parse().ok()).unwrap_or(hard);
    if nr_open > hard && setrlimit(Resource::RLIMIT_NOFILE, nr_open, nr_open).is_ok() {
        return nr_open;
    }
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

fn nofile_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_or(0, |(soft, _)| soft)
}

/// Whether one more descriptor leaves the rest of fraglab its margin (the keeper's, past
/// [`KEEPER_FDS`]).
pub fn descriptors_to_spare() -> bool {
    open_fds() + REST_MARGIN < nofile_limit()
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}
