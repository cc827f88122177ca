//! Taking memory with every CPU. Faulting in and zeroing pages is the fragmenter's largest cost, and
//! one thread leaves every other CPU idle: a pool of workers, one per CPU, each maps, faults in (and
//! locks) its own chunks and reads where they landed in pagemap, while the caller decides, chunk by
//! chunk, whether to take more. A worker's pages come from the per-CPU lists of the CPU it runs on and,
//! with the default memory policy, that CPU's NUMA node (workers are not pinned: a CPU busy with
//! something else should not hold one back).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};

use crate::arena::{open_pagemap, take, Taken};

/// Workers: one per CPU this process may run on.
pub fn workers() -> usize {
    crate::cpu::cpus().len()
}

/// Worker threads taking chunks of the sizes sent to them.
pub struct Pool {
    jobs: Option<Sender<usize>>,
    results: Receiver<(usize, Result<Taken>)>,
    threads: Vec<JoinHandle<()>>,
    in_flight: usize,
    in_flight_bytes: u64,
    /// Set once no more chunks are wanted: a job still queued comes back as an error, untaken.
    cancelled: Arc<AtomicBool>,
}

impl Pool {
    /// `n` workers; with `locked` every page is mlocked as it faults in, with `pfns` each chunk's
    /// frames are read from pagemap, with `bind` every chunk's pages come from that NUMA node.
    pub fn new(n: usize, locked: bool, pfns: bool, bind: Option<u32>) -> Result<Self> {
        let (jobs, rx) = channel::<usize>();
        let rx = Arc::new(Mutex::new(rx));
        let (tx, results) = channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let (rx, tx, cancelled) = (Arc::clone(&rx), tx.clone(), Arc::clone(&cancelled));
            let pagemap = if pfns { Some(open_pagemap()?) } else { None };
            let t = std::thread::Builder::new()
                .name(format!("populate-{i}"))
                .spawn(move || loop {
                    // The lock is held only to take the next job, not while populating it.
                    let job = rx.lock().map_err(|_| ()).and_then(|rx| rx.recv().map_err(|_| ()));
                    let Ok(bytes) = job else { return };
                    let taken = if cancelled.load(Ordering::Relaxed) {
                        Err(anyhow!("cancelled before it was taken"))
                    } else {
                        // Every job is answered, even by a panic: the caller counts what is in
                        // flight and waits for each one.
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            take(bytes, locked, pagemap.as_ref(), bind)
                        }))
                        .unwrap_or_else(|_| Err(anyhow!("a populating thread panicked")))
                    };
                    if tx.send((bytes, taken)).is_err() {
                        return;
                    }
                })
                .context("cannot start a populating thread")?;
            threads.push(t);
        }
        Ok(Pool { jobs: Some(jobs), results, threads, in_flight: 0, in_flight_bytes: 0, cancelled })
    }

    /// Take no more: jobs still queued come back as errors at once, chunks being taken are finished.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether another chunk may be handed out: two in flight per worker, so none waits for the
    /// caller between chunks.
    pub fn idle(&self) -> bool {
        self.in_flight < 2 * self.threads.len()
    }

    /// Bytes asked for and not yet received: memory being faulted in that MemAvailable may not show yet.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    /// Hand a chunk of `bytes` (whole pages) to the next free worker.
    pub fn send(&mut self, bytes: usize) {
        let jobs = self.jobs.as_ref().expect("jobs are open until the pool drops");
        jobs.send(bytes).expect("workers live as long as the pool");
        self.in_flight += 1;
        self.in_flight_bytes += bytes as u64;
    }

    /// The next chunk a worker finished, or `None` when none is being taken. A worker's error is
    /// returned as it came; its chunk is not held.
    pub fn recv(&mut self) -> Option<Result<Taken>> {
        if self.in_flight == 0 {
            return None;
        }
        let (bytes, taken) = self.results.recv().expect("workers live as long as the pool");
        self.in_flight -= 1;
        self.in_flight_bytes -= bytes as u64;
        Some(taken)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Queued jobs are answered untaken; closing the job channel then ends every worker once it
        // is done with the chunk it is on. A chunk taken and never received is unmapped when its
        // result is dropped with the channel.
        self.cancel();
        self.jobs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
