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
    /// pagemap windows for [`Arena::moved`], one per CPU, faulted in by [`Arena::prepare_checks`].
    windows: Vec<std::sync::Mutex<Vec<u8>>>,
}

/// Pages a [`Arena::moved`] window reads at once (its buffer is 8 bytes a page).
const WINDOW_PAGES: usize = 4096;

impl Arena {
    /// Map and fault in `bytes` more memory (rounded down to whole pages) on this thread: one
    /// [`take`], as each worker of [`crate::populate`] does, without reading pagemap. Returns the
    /// pages added: 0 only when `bytes` is less than a page, which a caller looping until it holds
    /// some figure must treat as the end, not as a step.
    pub fn populate(&mut self, bytes: usize) -> Result<usize> {
        if bytes < PAGE_SIZE {
            return Ok(0);
        }
        Ok(self.adopt(take(bytes, self.locked, None, None)?.map))
    }

    /// Hold a mapping [`take`] made; returns its pages.
    pub fn adopt(&mut self, map: MmapMut) -> usize {
        let pages = map.len() / PAGE_SIZE;
        self.chunks.push(Chunk { map, first_page: self.pages, resident: pages });
        self.pages += pages;
        pages
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

    /// Fault in what [`Arena::moved`] reads pagemap into, before populating. Once a hold has begun,
    /// any memory fraglab faults in is served from the smallest free blocks — the cut's: a status
    /// refresh that copied the whole arena's pagemap (megabytes) took 1 833 of a profile's 2 500
    /// order-0 blocks in a 5 GiB guest, and the allocator kept them for the next refresh.
    pub fn prepare_checks(&mut self) {
        // Written byte by byte, not `vec![0; n]`: calloc can hand out a fresh mapping untouched.
        self.windows =
            crate::cpu::cpus().iter().map(|_| std::sync::Mutex::new(vec![0xff; WINDOW_PAGES * 8])).collect();
    }

    /// How many of `kept` (arena page index and the PFN it had, sorted by index) are not at that
    /// PFN now: migrated, or hidden (pagemap shows no frame). Reads pagemap a window at a time into
    /// the buffers [`Arena::prepare_checks`] made, one share of `kept` per CPU, so a check during
    /// the hold copies no pagemap into fresh memory (what is left is a few stack pages a thread);
    /// without those buffers it says so rather than allocate.
    pub fn moved(&self, kept: &[(usize, u64)]) -> Result<u64> {
        debug_assert!(kept.is_sorted(), "kept pages are listed in arena order");
        if self.windows.is_empty() {
            bail!("the arena's pagemap windows were not prepared before populating");
        }
        // Pages given back under pressure ([`Arena::shrink`]) are no longer ours to check.
        let kept = &kept[..kept.partition_point(|&(i, _)| i < self.pages)];
        let share = kept.len().div_ceil(self.windows.len()).max(1);
        let parts: Vec<_> = kept.chunks(share).zip(&self.windows).collect();
        let mut moved = 0;
        for part in crate::cpu::each(&parts, false, |(kept, window)| self.moved_in(kept, window)) {
            moved += part?;
        }
        Ok(moved)
    }

    fn moved_in(&self, kept: &[(usize, u64)], window: &std::sync::Mutex<Vec<u8>>) -> Result<u64> {
        use std::os::unix::fs::FileExt;
        let mut raw = window.lock().unwrap_or_else(|e| e.into_inner());
        let pagemap = open_pagemap()?;
        let (mut moved, mut k) = (0, 0);
        while k < kept.len() {
            // A window from this kept page to the end of its chunk, at most WINDOW_PAGES.
            let first = kept[k].0;
            let c = &self.chunks[self.chunks.partition_point(|c| c.first_page <= first) - 1];
            let end = (c.first_page + c.map.len() / PAGE_SIZE).min(first + WINDOW_PAGES);
            let bytes = &mut raw[..(end - first) * 8];
            let offset = ((c.map.as_ptr() as usize / PAGE_SIZE + first - c.first_page) * 8) as u64;
            pagemap.read_exact_at(bytes, offset).context("cannot read /proc/self/pagemap")?;
            while k < kept.len() && kept[k].0 < end {
                let at = (kept[k].0 - first) * 8;
                let entry = u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8-byte entries"));
                if frame(entry) != kept[k].1 {
                    moved += 1;
                }
                k += 1;
            }
        }
        Ok(moved)
    }

    /// The PFN of every page (0 where the kernel hides it: without CAP_SYS_ADMIN pagemap reports 0).
    ///
    /// The kernel walks the page tables as pagemap is read (~15 ms a GiB here), so the chunks are
    /// read in one share per CPU.
    pub fn pfns(&self) -> Result<Vec<u64>> {
        let share = self.chunks.len().div_ceil(crate::cpu::cpus().len()).max(1);
        let parts: Vec<&[Chunk]> = self.chunks.chunks(share).collect();
        let read = crate::cpu::each(&parts, false, |chunks| -> Result<Vec<u64>> {
            let pagemap = open_pagemap()?;
            let mut pfns = Vec::with_capacity(chunks.iter().map(|c| c.map.len() / PAGE_SIZE).sum());
            for c in *chunks {
                pfns.extend(map_pfns(&c.map, &pagemap)?);
            }
            Ok(pfns)
        });
        let mut pfns = Vec::with_capacity(self.pages);
        for part in read {
            pfns.extend(part?);
        }
        Ok(pfns)
    }

    /// Give the pages in `runs` (arena page indices, `[start, end)`) back to the kernel. Mapped
    /// ranges stay mapped, so no VMA is split and vm.max_map_count is never approached.
    pub fn free(&mut self, runs: &[(usize, usize)]) -> Result<()> {
        let advice = if self.locked { libc::MADV_DONTNEED_LOCKED } else { libc::MADV_DONTNEED };
        let mut iovecs: Vec<IoVec> = Vec::with_capacity(runs.len());
        for &(start, end) in runs {
            // A run of page indices may straddle two chunks that are not virtually adjacent.
            let mut s = start;
            while s < end {
                let ci = self.chunks.partition_point(|c| c.first_page <= s) - 1;
                let c = &mut self.chunks[ci];
                let chunk_end = c.first_page + c.map.len() / PAGE_SIZE;
                let e = end.min(chunk_end);
                let base = c.map.as_ptr() as usize + (s - c.first_page) * PAGE_SIZE;
                iovecs.push(IoVec(libc::iovec { iov_base: base as *mut _, iov_len: (e - s) * PAGE_SIZE }));
                // The runs a cut frees are disjoint, so each page is counted out once.
                c.resident = c.resident.saturating_sub(e - s);
                s = e;
            }
        }
        if iovecs.is_empty() {
            return Ok(());
        }
        // Zapping pages is per-page work in the kernel (unmapping, uncharging, freeing to the
        // per-CPU lists): one thread a CPU, each on an equal share of the pages. Each is pinned to
        // its CPU, so the pages a later call frees on a CPU are the last that CPU's per-CPU list
        // saw: those stay there (up to its `high`) rather than in the buddy lists, and a budget's
        // surplus, freed after the cut, pushes the cut's out on every CPU it reaches.
        let parts = split_even(&iovecs, crate::cpu::cpus().len());
        crate::cpu::each(&parts, true, |part| madvise_many(part, advice)).into_iter().collect()
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

/// Map and fault in `bytes` (rounded down to whole pages) as small pages. Transparent huge pages
/// are refused so every page is an order-0 allocation the cut can free one by one. With `locked`
/// the pages are mlocked as they fault in (MLOCK_ONFAULT: one pass over the range, where mlock
/// after populating walks it twice and moves every page to the unevictable list a second time).
/// With `pagemap`, where each page landed is read right away, while the next chunk is being taken.
/// With `bind`, the mapping is bound to that NUMA node before a page faults in.
pub fn take(bytes: usize, locked: bool, pagemap: Option<&std::fs::File>, bind: Option<u32>) -> Result<Taken> {
    let len = bytes / PAGE_SIZE * PAGE_SIZE;
    let mib = len >> 20;
    let mut map = MmapOptions::new()
        .len(len)
        .map_anon()
        .with_context(|| format!("mmap of {mib} MiB anonymous memory failed"))?;
    map.advise(memmap2::Advice::NoHugePage)
        .with_context(|| format!("madvise(MADV_NOHUGEPAGE) of {mib} MiB failed"))?;
    let ptr = map.as_mut_ptr();
    if let Some(node) = bind {
        mbind(ptr, len, node).with_context(|| format!("mbind of {mib} MiB to node {node} failed"))?;
    }
    // nix has no mlock2(2); libc's binding is used as it is.
    // SAFETY: the range is exactly our fresh mapping.
    let locked_on_fault = locked && unsafe { libc::mlock2(ptr.cast(), len, libc::MLOCK_ONFAULT) } == 0;
    // SAFETY: the range is exactly our fresh mapping.
    if unsafe { libc::madvise(ptr.cast(), len, libc::MADV_POPULATE_WRITE) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(err).with_context(|| format!("madvise(MADV_POPULATE_WRITE) of {mib} MiB failed"));
        }
        // Before 5.14 there is no MADV_POPULATE_WRITE: touch every page instead.
        for off in (0..len).step_by(PAGE_SIZE) {
            map[off] = 1;
        }
    }
    if locked && !locked_on_fault {
        // Before 4.4 there is no mlock2: lock what is now populated.
        lock(&map)?;
    }
    let pfns = match pagemap {
        Some(f) => map_pfns(&map, f)?,
        None => Vec::new(),
    };
    Ok(Taken { map, pfns })
}

/// Bind `[ptr, ptr + len)` to `node` (MPOL_BIND): its pages come from that node or the fault fails.
///
/// Neither nix nor libc wraps mbind(2) (libnuma does, in C); the raw syscall takes a node bitmap of
/// `maxnode` bits, one past the last it reads.
fn mbind(ptr: *mut u8, len: usize, node: u32) -> std::io::Result<()> {
    let bits = libc::c_ulong::BITS as usize;
    let node = node as usize;
    let mut mask = vec![0 as libc::c_ulong; node / bits + 1];
    mask[node / bits] |= 1 << (node % bits);
    let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
    // SAFETY: the range is exactly a fresh mapping of ours; the mask outlives the call and holds
    // `maxnode - 1` bits. Every argument is passed at the width the kernel reads it (unsigned long,
    // or a pointer), as a variadic call must.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len as libc::c_ulong,
            libc::MPOL_BIND as libc::c_ulong,
            mask.as_ptr(),
            maxnode,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One mapping [`take`] made, and the frame of each of its pages as pagemap showed them right after
/// (none when it was not asked to read them).
pub struct Taken {
    pub map: MmapMut,
    pub pfns: Vec<u64>,
}

pub fn open_pagemap() -> Result<std::fs::File> {
    std::fs::File::open("/proc/self/pagemap").context("cannot open /proc/self/pagemap")
}

/// The PFN of every page of `map` (0 where the kernel hides it).
///
/// One pread(2) straight into a buffer: procfs's PageMap decodes entry by entry through a
/// BufReader, which costs seconds per GiB in a debug build.
fn map_pfns(map: &MmapMut, pagemap: &std::fs::File) -> Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let n = map.len() / PAGE_SIZE;
    let mut raw = vec![0u8; n * 8];
    let offset = (map.as_ptr() as usize / PAGE_SIZE * 8) as u64;
    pagemap.read_exact_at(&mut raw, offset).context("cannot read /proc/self/pagemap")?;
    Ok(raw.chunks_exact(8).map(|e| frame(u64::from_ne_bytes(e.try_into().expect("8-byte chunks")))).collect())
}

/// A pagemap entry's PFN, 0 when the page is not present or the kernel hides its frame.
fn frame(entry: u64) -> u64 {
    const PRESENT: u64 = 1 << 63;
    const PFN_MASK: u64 = (1 << 55) - 1;
    if entry & PRESENT != 0 {
        entry & PFN_MASK
    } else {
        0
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

/// `iovecs` cut into up to `parts` lists of about equal bytes, splitting a range at a page boundary
/// where a share ends inside it.
fn split_even(iovecs: &[IoVec], parts: usize) -> Vec<Vec<IoVec>> {
    let total: usize = iovecs.iter().map(|v| v.0.iov_len).sum();
    let share = (total / PAGE_SIZE).div_ceil(parts.max(1)).max(1) * PAGE_SIZE;
    let mut out: Vec<Vec<IoVec>> = vec![Vec::new()];
    let mut room = share;
    for v in iovecs {
        let (mut base, mut len) = (v.0.iov_base as usize, v.0.iov_len);
        while len > 0 {
            if room == 0 {
                out.push(Vec::new());
                room = share;
            }
            let take = len.min(room);
            let last = out.last_mut().expect("one list at least");
            last.push(IoVec(libc::iovec { iov_base: base as *mut _, iov_len: take }));
            (base, len, room) = (base + take, len - take, room - take);
        }
    }
    out
}

/// The most ranges process_madvise(2) takes in one call.
const UIO_MAXIOV: usize = 1024;

/// A range of our own mappings, for madvise. `libc::iovec` holds a raw pointer, so it cannot cross
/// to a worker thread as it is.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct IoVec(libc::iovec);

// SAFETY: an IoVec only names a range of the arena's mappings, which outlive the scoped threads
// that advise on it; no thread dereferences the pointer, the kernel does.
unsafe impl Send for IoVec {}
// SAFETY: shared IoVecs are only read (copied into system call arguments), never written.
unsafe impl Sync for IoVec {}

/// process_madvise(2) takes up to UIO_MAXIOV ranges per call; on kernels before 6.13 it refuses
/// MADV_DONTNEED for the caller itself (EINVAL), so fall back to one madvise(2) per range.
fn madvise_many(iovecs: &[IoVec], advice: libc::c_int) -> Result<()> {
    // SAFETY: pidfd_open on our own pid returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) } as libc::c_int;
    let mut batched = pidfd >= 0;
    let mut done = 0;
    while batched && done < iovecs.len() {
        let batch = &iovecs[done..iovecs.len().min(done + UIO_MAXIOV)];
        let want: usize = batch.iter().map(|v| v.0.iov_len).sum();
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

fn madvise_each(iovecs: &[IoVec], advice: libc::c_int) -> Result<()> {
    for v in iovecs {
        // SAFETY: each iovec is a range of our own mapping.
        if unsafe { libc::madvise(v.0.iov_base, v.0.iov_len, advice) } != 0 {
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
