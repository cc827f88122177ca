//! The CPUs this process may run on, and work spread over them: populating, freeing and checking
//! the cut are per-page kernel work that one thread would do on one CPU while the others idle.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPUs this process may run on (its affinity mask), at least one.
pub fn cpus() -> Vec<usize> {
    match sched_getaffinity(Pid::from_raw(0)) {
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
fn pin(cpu: usize) {
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = sched_setaffinity(Pid::from_raw(0), &set);
    }
}

/// `work` on every part at once, one scoped thread a part, the i-th pinned to the i-th CPU when
/// `pinned`; results in the parts' order. A part whose thread cannot be started (a pids limit, or
/// memory short right after a whole-machine populate) runs on the calling thread instead.
pub fn each<P: Sync, T: Send>(parts: &[P], pinned: bool, work: impl Fn(&P) -> T + Sync) -> Vec<T> {
    let cpus = cpus();
    let work = &work;
    std::thread::scope(|scope| {
        let started: Vec<_> = parts
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let cpu = cpus[i % cpus.len()];
                let thread = std::thread::Builder::new().spawn_scoped(scope, move || {
                    if pinned {
                        pin(cpu);
                    }
                    work(part)
                });
                (part, thread)
            })
            .collect();
        started
            .into_iter()
            .map(|(part, thread)| match thread {
                Ok(t) => t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => work(part),
            })
            .collect()
    })
}
