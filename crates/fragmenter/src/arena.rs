//! The memory the fragmenter takes: anonymous mappings populated page by page, their physical frame
//! numbers from `/proc/self/pagemap`, and the madvise calls that free chosen pages back to the buddy
//! allocator.

use anyhow::{bail, Context, Result};
use memmap2::{MmapMut, MmapOptions};

pub const PAGE_SIZE: usize = 4096;

/// `bytes` rounded down to whole pages: every byte figure that a loop counts pages towards is
/// aligned where it is computed, so the last step is never asked for less than a page.
pub fn page_floor(bytes: u64) -> u64 {
    bytes / PAGE_SIZE as u64 * PAGE_SIZE as u64
}

/// One anonymous mapping. Chunks keep each mapping small enough that giving memory back under
/// pressure can drop whole chunks, and never split into per-page VMAs (vm.max_map_count).
struct Chunk {
    map: MmapMut,
    /// Index of this chunk's first page in the arena.
    first_page: usize,
    /// Pages still mapped in: after a cut a chunk keeps only a fraction of its pages, and giving it
    /// back frees only those.
    resident: usize,
}

/// All memory the fragmenter holds, addressed by page index across chunks.
#[derive(Default)]
pub struct Arena {
    chunks: Vec<Chunk>,
    pages: usize,
    locked: bool,
}

impl Arena {
    /// Map and fault in `bytes` more memory (rounded down to whole pages) as small pages. Transparent
    /// huge pages are refused so every page is an order-0 allocation the cut can free one by one.
    /// Returns the pages added: 0 only when `bytes` is less than a page, which a caller looping until
    /// it holds some figure must treat as the end, not as a step.
    pub fn populate(&mut self, bytes: usize) -> Result<usize> {
        let len = bytes / PAGE_SIZE * PAGE_SIZE;
        if len == 0 {
            return Ok(0);
        }
        let mut map = MmapOptions::new().len(len).map_anon().context("mmap of anonymous memory failed")?;
        map.advise(memmap2::Advice::NoHugePage).context("madvise(MADV_NOHUGEPAGE)")?;
        let ptr = map.as_mut_ptr();
        // SAFETY: the range is exactly our fresh mapping.
        if unsafe { libc::madvise(ptr.cast(), len, libc::MADV_POPULATE_WRITE) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINVAL) {
                return Err(err).context("madvise(MADV_POPULATE_WRITE)");
            }
            // Before 5.14 there is no MADV_POPULATE_WRITE: touch every page instead.
            for off in (0..len).step_by(PAGE_SIZE) {
                map[off] = 1;
            }
        }
        if self.locked {
            lock(&map)?;
        }
        self.chunks.push(Chunk { map, first_page: self.pages, resident: len / PAGE_SIZE });
        self.pages += len / PAGE_SIZE;
        Ok(len / PAGE_SIZE)
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn bytes(&self) -> u64 {
        (self.pages * PAGE_SIZE) as u64
    }

    /// mlock everything held now and populated later. Locked pages are unevictable; with
    /// `vm.compact_unevictable_allowed = 0` compaction will not migrate them either.
    pub fn lock(&mut self) -> Result<()> {
        for c in &self.chunks {
            lock(&c.map)?;
        }
        self.locked = true;
        Ok(())
    }

    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// The PFN of every page (0 where the kernel hides it: without CAP_SYS_ADMIN pagemap reports 0).
    ///
    /// One pread(2) per chunk straight into a u64 buffer: procfs's PageMap decodes entry by entry
    /// through a BufReader, which costs seconds per GiB in a debug build; this is ~10 ms.
    pub fn pfns(&self) -> Result<Vec<u64>> {
        use std::os::unix::fs::FileExt;
        const PRESENT: u64 = 1 << 63;
        const PFN_MASK: u64 = (1 << 55) - 1;
        let pagemap = std::fs::File::open("/proc/self/pagemap").context("cannot open /proc/self/pagemap")?;
        let mut pfns = Vec::with_capacity(self.pages);
        for c in &self.chunks {
            let n = c.map.len() / PAGE_SIZE;
            let mut raw = vec![0u8; n * 8];
            let offset = (c.map.as_ptr() as usize / PAGE_SIZE * 8) as u64;
            pagemap.read_exact_at(&mut raw, offset).context("cannot read /proc/self/pagemap")?;
            pfns.extend(raw.chunks_exact(8).map(|e| {
                let entry = u64::from_ne_bytes(e.try_into().expect("8-byte chunks"));
                if entry & PRESENT != 0 {
                    entry & PFN_MASK
                } else {
                    0
                }
            }));
        }
        Ok(pfns)
    }

    /// Give the pages in `runs` (arena page indices, `[start, end)`) back to the kernel. Mapped
    /// ranges stay mapped, so no VMA is split and vm.max_map_count is never approached.
    pub fn free(&mut self, runs: &[(usize, usize)]) -> Result<()> {
        let advice = if self.locked { libc::MADV_DONTNEED_LOCKED } else { libc::MADV_DONTNEED };
        let mut iovecs: Vec<libc::iovec> = Vec::with_capacity(runs.len());
        for &(start, end) in runs {
            // A run of page indices may straddle two chunks that are not virtually adjacent.
            let mut s = start;
            while s < end {
                let ci = self.chunks.partition_point(|c| c.first_page <= s) - 1;
                let c = &mut self.chunks[ci];
                let chunk_end = c.first_page + c.map.len() / PAGE_SIZE;
                let e = end.min(chunk_end);
                let base = c.map.as_ptr() as usize + (s - c.first_page) * PAGE_SIZE;
                iovecs.push(libc::iovec { iov_base: base as *mut _, iov_len: (e - s) * PAGE_SIZE });
                // The runs a cut frees are disjoint, so each page is counted out once.
                c.resident = c.resident.saturating_sub(e - s);
                s = e;
            }
        }
        madvise_many(&iovecs, advice)
    }

    /// Give back whole chunks from the end until at least `bytes` of resident memory are returned,
    /// or nothing is left. Returns the resident bytes given back: after a cut a 64 MiB chunk may
    /// hold 4 MiB, and counting its mapping would stop the guard after freeing a sixteenth of what
    /// it meant to.
    pub fn shrink(&mut self, bytes: u64) -> u64 {
        let mut given = 0;
        while given < bytes {
            let Some(c) = self.chunks.pop() else { break };
            given += (c.resident * PAGE_SIZE) as u64;
            self.pages = c.first_page;
        }
        given
    }

    /// Unmap everything.
    pub fn release(&mut self) {
        self.chunks.clear();
        self.pages = 0;
    }
}

fn lock(map: &MmapMut) -> Result<()> {
    // SAFETY: locking our own mapping's range.
    if unsafe { libc::mlock(map.as_ptr().cast(), map.len()) } != 0 {
        let err = std::io::Error::last_os_error();
        bail!("mlock of {} MiB failed: {err} (RLIMIT_MEMLOCK? run as root)", map.len() >> 20);
    }
    Ok(())
}

/// process_madvise(2) takes up to UIO_MAXIOV ranges per call; on kernels before 6.13 it refuses
/// MADV_DONTNEED for the caller itself (EINVAL), so fall back to one madvise(2) per range.
fn madvise_many(iovecs: &[libc::iovec], advice: libc::c_int) -> Result<()> {
    const UIO_MAXIOV: usize = 1024;
    // SAFETY: pidfd_open on our own pid returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) } as libc::c_int;
    let mut batched = pidfd >= 0;
    let mut done = 0;
    while batched && done < iovecs.len() {
        let batch = &iovecs[done..iovecs.len().min(done + UIO_MAXIOV)];
        let want: usize = batch.iter().map(|v| v.iov_len).sum();
        // SAFETY: the iovecs describe ranges of our own mappings.
        let n = unsafe {
            libc::syscall(libc::SYS_process_madvise, pidfd, batch.as_ptr(), batch.len(), advice, 0)
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if done == 0 && matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EPERM)) {
                batched = false;
                break;
            }
            // SAFETY: closing the descriptor we opened.
            unsafe { libc::close(pidfd) };
            return Err(err).context("process_madvise(MADV_DONTNEED) failed");
        }
        if (n as usize) < want {
            // A partial advise: finish the batch range by range rather than guess where it stopped.
            madvise_each(batch, advice)?;
        }
        done += batch.len();
    }
    if pidfd >= 0 {
        // SAFETY: closing the descriptor we opened.
        unsafe { libc::close(pidfd) };
    }
    if !batched {
        madvise_each(&iovecs[done..], advice)?;
    }
    Ok(())
}

fn madvise_each(iovecs: &[libc::iovec], advice: libc::c_int) -> Result<()> {
    for v in iovecs {
        // SAFETY: each iovec is a range of our own mapping.
        if unsafe { libc::madvise(v.iov_base, v.iov_len, advice) } != 0 {
            return Err(std::io::Error::last_os_error()).context("madvise(MADV_DONTNEED) failed");
        }
    }
    Ok(())
}

/// MemAvailable in bytes.
pub fn mem_available() -> Result<u64> {
    use procfs::Current;
    let m = procfs::Meminfo::current().context("cannot read /proc/meminfo")?;
    m.mem_available.context("/proc/meminfo has no MemAvailable (kernel older than 3.14)")
}
