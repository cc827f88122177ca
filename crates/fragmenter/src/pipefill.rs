//! Pipe pages: unmovable order-0 allocations. Once the unmovable free lists run dry the kernel
//! serves them by stealing the *largest* free block of another migratetype (`__rmqueue_fallback`
//! searches from the top order down), whereas our own movable pages would come from the smallest
//! blocks — the very fragments we made. Filling pipes is how the high-order blocks left in the
//! reserve we did not take get broken up in whole-machine mode.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::{Context, Result};

/// Bytes per pipe: the default `fs.pipe-max-size`, which root may exceed but need not.
const PIPE_BYTES: usize = 1 << 20;

/// Pipes kept full; dropping them frees their pages.
#[derive(Default)]
pub struct PipeFill {
    /// Read end, write end, bytes written into it.
    pipes: Vec<(OwnedFd, OwnedFd, u64)>,
    bytes: u64,
}

impl PipeFill {
    /// Write `bytes` more (rounded up to a page) into new pipes. Returns the bytes now held.
    pub fn fill(&mut self, bytes: u64) -> Result<u64> {
        raise_nofile_limit();
        let page = vec![0x5au8; 4096];
        let mut left = bytes.div_ceil(4096) * 4096;
        while left > 0 {
            let (r, w) = nix::unistd::pipe().context("pipe() failed (out of file descriptors?)")?;
            // SAFETY: F_SETPIPE_SZ on a pipe we own.
            let size = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int) };
            if size < 0 {
                return Err(std::io::Error::last_os_error()).context("fcntl(F_SETPIPE_SZ)");
            }
            let mut file = std::fs::File::from(w);
            let mut n = 0u64;
            while n < size as u64 && left > 0 {
                file.write_all(&page).context("write to pipe")?;
                n += 4096;
                left -= 4096;
            }
            self.bytes += n;
            self.pipes.push((r, OwnedFd::from(file), n));
        }
        Ok(self.bytes)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Close the newest pipes until at least `bytes` are freed (or none are left). Returns the bytes
    /// freed.
    pub fn shrink(&mut self, bytes: u64) -> u64 {
        let mut given = 0;
        while given < bytes {
            let Some((_, _, n)) = self.pipes.pop() else { break };
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

/// Every pipe costs two descriptors; the soft limit (often 1024) would stop a fill at 512 MiB.
fn raise_nofile_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}
