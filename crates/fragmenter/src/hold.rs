//! Holding while the caller does something else: the guard and the keeper on a thread of their own,
//! so memory pressure during a ten-minute workload is answered within a fraction of a second and a
//! free block that forms is taken back within milliseconds, not when the workload ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use crate::fragment::{Fragmenter, GuardLook};
use crate::keeper::{lock, Timeline, KEEP_EVERY};

/// How often the guard looks at MemAvailable while it holds steady; the same as `fraglab
/// fragment`'s hold loop. The keeper looks more often ([`KEEP_EVERY`]), on the same thread.
pub const GUARD_EVERY: Duration = Duration::from_millis(200);

/// How soon the guard looks again while MemAvailable falls: every keeper look. Socket buffers fill
/// far faster than a steady 200 ms allows for (thirty loopback TCP streams in a 1 GiB guest).
pub const GUARD_FALLING: Duration = KEEP_EVERY;

/// A fall of MemAvailable between two looks that is more than churn: the per-CPU lists alone move
/// it by a few hundred KiB.
pub const FALLING_BY: u64 = 1 << 20;

/// How long the guard keeps the fast pace after the last fall it saw.
pub const FALLING_FOR: Duration = Duration::from_secs(1);

/// When the guard looks next: at [`GUARD_EVERY`] while MemAvailable holds or rises, at
/// [`GUARD_FALLING`] for [`FALLING_FOR`] after any look that saw it fall by more than
/// [`FALLING_BY`], and whenever it is within twice the last fall of the floor.
#[derive(Default)]
pub struct GuardPace {
    last: Option<u64>,
    fast_until: Option<Instant>,
}

impl GuardPace {
    /// The wait before the next look, given what the look at `now` saw.
    pub fn next(&mut self, now: Instant, look: &GuardLook) -> Duration {
        let fell =
            self.last.replace(look.available).map_or(0, |before| before.saturating_sub(look.available));
        if fell > FALLING_BY {
            self.fast_until = Some(now + FALLING_FOR);
        }
        let near_floor = look.available.saturating_sub(look.floor) <= 2 * fell;
        if near_floor || self.fast_until.is_some_and(|until| now < until) {
            GUARD_FALLING
        } else {
            GUARD_EVERY
        }
    }
}

/// What a series of looks said. A failed look (a /proc file unreadable for a moment) must not end
/// the guarding or keeping for the rest of the run: the first of a series is told, and the next
/// look tries again.
#[derive(Default)]
pub struct Looks {
    failing: bool,
}

impl Looks {
    pub fn said(&mut self, look: Result<Option<String>>, what: &str) -> Option<String> {
        match look {
            Ok(line) => {
                self.failing = false;
                line
            }
            Err(err) if !self.failing => {
                self.failing = true;
                Some(format!("{what}: {err:#}"))
            }
            Err(_) => None,
        }
    }
}

/// What the owner asks of the guard thread.
enum Ask {
    /// A look now; the answer is what it said.
    Look(Sender<Result<Vec<String>>>),
    Stop,
}

/// How long [`Guarded::look_now`] waits for the keeper: a look re-breaks at most 64 blocks, but one
/// allocation can go through reclaim (measured once at 1.2 s in a TCG guest).
pub const LOOK_BOUND: Duration = Duration::from_secs(10);

/// How long [`Guarded::settle`] must see the target held, look after look, before a window opens.
pub const SETTLE_QUIET: Duration = Duration::from_millis(100);

/// How long [`Guarded::settle`] waits for that at most.
pub const SETTLE_BOUND: Duration = Duration::from_secs(2);

/// A fragmenter whose guard runs in the background until [`Guarded::stop`].
pub struct Guarded {
    /// `None` only once [`Guarded::stop`] has taken it back.
    fragmenter: Option<Arc<Mutex<Fragmenter>>>,
    events: Arc<Mutex<Vec<String>>>,
    ask: Sender<Ask>,
    /// `None` once joined.
    thread: Option<JoinHandle<()>>,
}

impl Guarded {
    pub fn start(fragmenter: Fragmenter) -> Guarded {
        let fragmenter = Arc::new(Mutex::new(fragmenter));
        let events = Arc::new(Mutex::new(Vec::new()));
        let (ask, asked) = mpsc::channel::<Ask>();
        let (f, e) = (Arc::clone(&fragmenter), Arc::clone(&events));
        let thread = std::thread::Builder::new()
            .name("fraglab-guard".into())
            .spawn(move || {
                let (mut keeping, mut guarding) = (Looks::default(), Looks::default());
                let mut pace = GuardPace::default();
                let mut next_guard = Instant::now();
                loop {
                    let mut fragmenter;
                    let mut said = Vec::new();
                    match asked.recv_timeout(KEEP_EVERY) {
                        Err(RecvTimeoutError::Timeout) => {
                            fragmenter = lock(&f);
                            said.extend(
                                keeping.said(fragmenter.keep(), "the keeper could not look at buddyinfo"),
                            );
                        }
                        Ok(Ask::Look(reply)) => {
                            fragmenter = lock(&f);
                            let looked = fragmenter.keep_now();
                            let _ = reply.send(looked.map(|said| said.into_iter().collect()));
                        }
                        // Asked to stop, or the owner is gone.
                        Ok(Ask::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                    // Asked looks come as often as workloads end (a run of quick triggers: more than
                    // every 10 ms), so the guard is checked after those too, or it could starve.
                    let now = Instant::now();
                    if now >= next_guard {
                        let look = fragmenter.guard();
                        // A look that failed is tried again at the steady pace.
                        next_guard = now + look.as_ref().map_or(GUARD_EVERY, |l| pace.next(now, l));
                        let gave_back = look.map(|l| l.gave_back);
                        said.extend(guarding.said(gave_back, "the guard could not look at memory"));
                    }
                    drop(fragmenter);
                    lock(&e).extend(said);
                }
            })
            .expect("spawning the guard thread");
        Guarded { fragmenter: Some(fragmenter), events, ask, thread: Some(thread) }
    }

    /// Have the keeper look now, on its own thread (so every allocation it makes comes from one
    /// thread, whose failures a catcher can leave out), and wait for it: at most [`LOOK_BOUND`].
    pub fn look_now(&self) -> Result<()> {
        let (reply, answer) = mpsc::channel();
        self.ask.send(Ask::Look(reply)).map_err(|_| anyhow!("the guard thread is gone"))?;
        match answer.recv_timeout(LOOK_BOUND) {
            Ok(looked) => looked.map(|said: Vec<String>| lock(&self.events).extend(said)),
            Err(_) => Err(anyhow!("the keeper did not look within {} s (the bound)", LOOK_BOUND.as_secs())),
        }
    }

    /// Before a workload window: while the keeper re-breaks, look until the target has been seen
    /// held for [`SETTLE_QUIET`] in a row, so a window opens neither on a block the last window's
    /// memory merged into nor on one a freeing that was still under way is about to make (measured
    /// in a 1 GiB guest: 2 MiB freed 10 ms after the first window's look, as the monitors had just
    /// started, and all ten resizes found their order-8 block). Returns `None` once it held, or what
    /// was still free when [`SETTLE_BOUND`] passed — the window then opens lost and is judged so.
    pub fn settle(&self, stop: &AtomicBool) -> Result<Option<String>> {
        let start = Instant::now();
        let timeline = self.timeline();
        // A streak: since when every look saw nothing free, and how many losses were on the record
        // then — the guard thread looks too, and a block it saw and took back between two of these
        // looks ends the streak as surely as one seen here.
        let mut streak: Option<(Instant, usize)> = None;
        let mut failed = None;
        loop {
            // A failed look (a /proc file unreadable for a moment) is tried again, within the bound.
            if let Err(e) = self.look_now() {
                streak = None;
                failed = Some(format!("{e:#}"));
            } else if !self.with(|f| f.rebreaking()) {
                return Ok(None);
            }
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let (free, losses, last) = {
                let t = lock(&timeline);
                let free: u64 = t.now.iter().filter(|z| z.in_play).map(|z| z.pages).sum();
                (free, t.losses.len(), t.losses.last().map(|l| l.why.clone()))
            };
            let now = Instant::now();
            streak = match streak {
                _ if free > 0 => None,
                Some((since, n)) if n == losses => Some((since, n)),
                _ => Some((now, losses)),
            };
            if streak.is_some_and(|(since, _)| now - since >= SETTLE_QUIET) {
                return Ok(None);
            }
            if start.elapsed() >= SETTLE_BOUND {
                if let Some(e) = failed {
                    return Ok(Some(format!(
                        "the keeper's looks failed before the window opened ({} s bound): {e}",
                        SETTLE_BOUND.as_secs()
                    )));
                }
                // Held at the last look, only not for long enough: the window opens held.
                if free == 0 {
                    return Ok(None);
                }
                return Ok(Some(format!(
                    "the target was not seen held for {} ms in a row within the {} s bound before the \
                     window opened: {free} pages free at order ≥ the target's at the last look (last \
                     loss: {})",
                    SETTLE_QUIET.as_millis(),
                    SETTLE_BOUND.as_secs(),
                    last.unwrap_or_default()
                )));
            }
            std::thread::sleep(crate::keeper::KEEP_EVERY);
        }
    }

    /// Work on the fragmenter (set a sysctl through its journal, read its status); the guard waits.
    pub fn with<R>(&self, f: impl FnOnce(&mut Fragmenter) -> R) -> R {
        f(&mut lock(self.fragmenter.as_ref().expect("held until stop")))
    }

    /// When the target held, readable while the guard runs.
    pub fn timeline(&self) -> Arc<Mutex<Timeline>> {
        self.with(|f| f.timeline())
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
        let _ = self.ask.send(Ask::Stop);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn look(mib: u64) -> GuardLook {
        GuardLook { available: mib << 20, floor: 8 << 20, gave_back: None }
    }

    /// Steady, then a fall: fast for a second after the last fall, steady again after that; near
    /// the floor fast whatever the history.
    #[test]
    fn the_guard_looks_faster_while_memory_falls() {
        let mut pace = GuardPace::default();
        let t = Instant::now();
        assert_eq!(pace.next(t, &look(64)), GUARD_EVERY);
        assert_eq!(pace.next(t + GUARD_EVERY, &look(64)), GUARD_EVERY);
        // Churn: under 1 MiB.
        assert_eq!(
            pace.next(t + 2 * GUARD_EVERY, &GuardLook { available: (64 << 20) - (900 << 10), ..look(0) }),
            GUARD_EVERY
        );
        let at = t + 3 * GUARD_EVERY;
        assert_eq!(pace.next(at, &look(40)), GUARD_FALLING);
        // Held where it fell: still fast within the second, steady after it.
        assert_eq!(pace.next(at + Duration::from_millis(500), &look(40)), GUARD_FALLING);
        assert_eq!(pace.next(at + FALLING_FOR, &look(40)), GUARD_EVERY);
        // Falls of 600 KiB (churn-sized) 1 MiB above the floor: fast — two more would cross it.
        let near = |kib: u64| GuardLook { available: (8 << 20) + (kib << 10), ..look(0) };
        let mut slow = GuardPace::default();
        assert_eq!(slow.next(t, &near(2248)), GUARD_EVERY);
        assert_eq!(slow.next(t + GUARD_EVERY, &near(1648)), GUARD_EVERY);
        assert_eq!(slow.next(t + 2 * GUARD_EVERY, &near(1048)), GUARD_FALLING);
        let mut fresh = GuardPace::default();
        assert_eq!(fresh.next(t, &look(8)), GUARD_FALLING, "at the floor");
    }
}
