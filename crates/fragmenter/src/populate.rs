//! Taking memory with every CPU. Faulting in and zeroing pages is the fragmenter's largest cost, and
//! one thread leaves every other CPU idle: a pool of workers, one per CPU, each maps, faults in (and
//! locks) its own chunks and reads where they landed in pagemap, while the caller decides, chunk by
//! chunk, whether to take more. Each worker's pages come from its own CPU's per-CPU lists and, with
//! the default memory policy, its own NUMA node.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use crate::arena::{open_pagemap, take, Taken};

/// Workers: one per CPU this process may run on.
pub fn workers() -> usize {
    cpus().len()
}

/// The CPUs this process may run on (its affinity mask), at least one.
pub fn cpus() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    match sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => {
            let cpus: Vec<usize> = (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect();
            if cpus.is_empty() {
                vec![0]
            } else {
                cpus
            }
        }
        Err(_) => vec![0],
    }
}

/// Keep the calling thread on `cpu`. Best effort: a CPU taken offline meanwhile leaves the thread
/// where the scheduler puts it, which costs only the per-CPU-list ordering the pin was for.
pub fn pin(cpu: usize) {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// Worker threads taking chunks of the sizes sent to them.
pub struct Pool {
    jobs: Option<Sender<usize>>,
    results: Receiver<(usize, Result<Taken>)>,
    threads: Vec<JoinHandle<()>>,
    in_flight: usize,
    in_flight_bytes: u64,
}

impl Pool {
    /// `n` workers; with `locked` every page is mlocked as it faults in, with `pfns` each chunk's
    /// frames are read from pagemap.
    pub fn new(n: usize, locked: bool, pfns: bool) -> Result<Self> {
        let (jobs, rx) = channel::<usize>();
        let rx = Arc::new(Mutex::new(rx));
        let (tx, results) = channel();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let (rx, tx) = (Arc::clone(&rx), tx.clone());
            let pagemap = if pfns { Some(open_pagemap()?) } else { None };
            let t = std::thread::Builder::new()
                .name(format!("populate-{i}"))
                .spawn(move || loop {
                    // The lock is held only to take the next job, not while populating it.
                    let job = rx.lock().map_err(|_| ()).and_then(|rx| rx.recv().map_err(|_| ()));
                    let Ok(bytes) = job else { return };
                    if tx.send((bytes, take(bytes, locked, pagemap.as_ref()))).is_err() {
                        return;
                    }
                })
                .context("cannot start a populating thread")?;
            threads.push(t);
        }
        Ok(Pool { jobs: Some(jobs), results, threads, in_flight: 0, in_flight_bytes: 0 })
    }

    /// Whether a worker is free for another chunk.
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
        // Closing the job channel ends every worker once it is done with its chunk; a chunk taken
        // and never received is unmapped when its result is dropped with the channel.
        self.jobs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
