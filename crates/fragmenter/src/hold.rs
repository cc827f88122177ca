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
    fragmenter: Arc<Mutex<Fragmenter>>,
    events: Arc<Mutex<Vec<String>>>,
    stop: Sender<()>,
    thread: JoinHandle<Result<()>>,
}

impl Guarded {
    pub fn start(fragmenter: Fragmenter) -> Guarded {
        let fragmenter = Arc::new(Mutex::new(fragmenter));
        let events = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = mpsc::channel::<()>();
        let (f, e) = (Arc::clone(&fragmenter), Arc::clone(&events));
        let thread = std::thread::Builder::new()
            .name("fraglab-guard".into())
            .spawn(move || loop {
                match stopped.recv_timeout(GUARD_EVERY) {
                    Err(RecvTimeoutError::Timeout) => {}
                    // Asked to stop, or the owner is gone.
                    _ => return Ok(()),
                }
                if let Some(event) = lock(&f).guard()? {
                    lock(&e).push(event);
                }
            })
            .expect("spawning the guard thread");
        Guarded { fragmenter, events, stop, thread }
    }

    /// Work on the fragmenter (set a sysctl through its journal, read its status); the guard waits.
    pub fn with<R>(&self, f: impl FnOnce(&mut Fragmenter) -> R) -> R {
        f(&mut lock(&self.fragmenter))
    }

    /// What the guard did since the last call, oldest first.
    pub fn take_events(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.events))
    }

    /// Stop the guard and hand the fragmenter back, with the events not yet taken. An error the guard
    /// met (MemAvailable unreadable) ends it early and is returned here.
    pub fn stop(self) -> Result<(Fragmenter, Vec<String>)> {
        let _ = self.stop.send(());
        let guarded = self.thread.join().map_err(|_| anyhow!("the guard thread panicked"));
        let events = std::mem::take(&mut *lock(&self.events));
        let fragmenter = Arc::try_unwrap(self.fragmenter)
            .map_err(|_| anyhow!("the guard thread still holds the fragmenter"))?
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        guarded??;
        Ok((fragmenter, events))
    }
}

/// A panic elsewhere must not stop the guard or the release: the data under the lock stays valid.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
