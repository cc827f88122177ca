//! Holding while the caller does something else: the guard on a thread of its own, so memory pressure
//! during a ten-minute workload is answered within a fraction of a second, not when the workload ends.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::fragment::Fragmenter;

/// How often the guard looks at MemAvailable; the same as `fraglab fragment`'s hold loop.
pub const GUARD_EVERY: Duration = Duration::from_millis(200);

/// A fragmenter whose guard runs in the background until [`Guarded::stop`].
pub struct Guarded {
    /// `None` only once [`Guarded::stop`] has taken it back.
    fragmenter: Option<Arc<Mutex<Fragmenter>>>,
    events: Arc<Mutex<Vec<String>>>,
    stop: Sender<()>,
    /// `None` once joined.
    thread: Option<JoinHandle<()>>,
}

impl Guarded {
    pub fn start(fragmenter: Fragmenter) -> Guarded {
        let fragmenter = Arc::new(Mutex::new(fragmenter));
        let events = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = mpsc::channel::<()>();
        let (f, e) = (Arc::clone(&fragmenter), Arc::clone(&events));
        let thread = std::thread::Builder::new()
            .name("fraglab-guard".into())
            .spawn(move || {
                let mut failing = false;
                loop {
                    match stopped.recv_timeout(GUARD_EVERY) {
                        Err(RecvTimeoutError::Timeout) => {}
                        // Asked to stop, or the owner is gone.
                        _ => return,
                    }
                    // A failed look (MemAvailable unreadable for a moment) must not end the guarding
                    // for the rest of the run: record the first of a series and look again.
                    let event = match lock(&f).guard() {
                        Ok(event) => {
                            failing = false;
                            event
                        }
                        Err(err) if !failing => {
                            failing = true;
                            Some(format!("the guard could not look at memory: {err:#}"))
                        }
                        Err(_) => None,
                    };
                    if let Some(event) = event {
                        lock(&e).push(event);
                    }
                }
            })
            .expect("spawning the guard thread");
        Guarded { fragmenter: Some(fragmenter), events, stop, thread: Some(thread) }
    }

    /// Work on the fragmenter (set a sysctl through its journal, read its status); the guard waits.
    pub fn with<R>(&self, f: impl FnOnce(&mut Fragmenter) -> R) -> R {
        f(&mut lock(self.fragmenter.as_ref().expect("held until stop")))
    }

    /// What the guard did since the last call, oldest first.
    pub fn take_events(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.events))
    }

    /// Stop the guard and hand the fragmenter back, with the events not yet taken.
    pub fn stop(mut self) -> Result<(Fragmenter, Vec<String>)> {
        let mut events = self.join();
        events.extend(std::mem::take(&mut *lock(&self.events)));
        let fragmenter = self.fragmenter.take().expect("held until stop");
        let fragmenter = Arc::try_unwrap(fragmenter)
            .map_err(|_| anyhow!("the guard thread still holds the fragmenter"))?
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        Ok((fragmenter, events))
    }

    /// Stop the thread and wait for it; what went wrong with it, as events.
    fn join(&mut self) -> Vec<String> {
        let _ = self.stop.send(());
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(_)) => vec!["the guard thread panicked; memory was not guarded after that".into()],
            _ => Vec::new(),
        }
    }
}

impl Drop for Guarded {
    /// On an error or panic part-way through a run: stop the thread here, so the fragmenter — and
    /// with it the journal's restore — is dropped on the caller's thread, before the caller lets go
    /// of the instance lock, never by a detached thread racing the process's exit.
    fn drop(&mut self) {
        self.join();
    }
}

/// A panic elsewhere must not stop the guard or the release: the data under the lock stays valid.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
