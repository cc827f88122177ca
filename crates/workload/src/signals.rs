//! Signals around a child process or a raised sysctl, shared by `exec` and `trigger`: a Ctrl-C that
//! arrives while either holds something the machine must get back is deferred until it is put back,
//! and a signal is named the way a result reports it.
//!
//! Both workloads use these; neither imports the other.

/// SIGINT, SIGTERM and SIGHUP blocked on this thread (and threads it spawns) until dropped: a Ctrl-C
/// while sysctls are raised or a child runs is noticed with [`DeferSignals::pending`], cleaned up
/// after, and then takes its default effect when the old mask comes back.
pub(super) struct DeferSignals {
    old: libc::sigset_t,
}

const DEFERRED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

impl DeferSignals {
    pub(super) fn block() -> DeferSignals {
        // SAFETY: sigset_t is plain data, initialised by sigemptyset before use; pthread_sigmask
        // only changes this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in DEFERRED {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            DeferSignals { old }
        }
    }

    /// The mask before [`DeferSignals::block`], for a child to start with.
    pub(super) fn original(&self) -> libc::sigset_t {
        self.old
    }

    /// A deferred signal that arrived (and was not blocked before), if any.
    pub(super) fn pending(&self) -> Option<libc::c_int> {
        // SAFETY: as above.
        unsafe {
            let mut p: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut p);
            if libc::sigpending(&mut p) != 0 {
                return None;
            }
            DEFERRED
                .into_iter()
                .find(|&s| libc::sigismember(&p, s) == 1 && libc::sigismember(&self.old, s) != 1)
        }
    }
}

impl Drop for DeferSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in block().
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

/// `SIGINT`, or `signal N` for a number nix does not name.
pub(super) fn signal_name(sig: libc::c_int) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map_or_else(|_| format!("signal {sig}"), |s| s.as_str().to_string())
}
