//! The network driver the socket workloads share ([`super::tcp`], [`super::sctp`]): the protocol code
//! opens sockets and moves bytes; running the workers and turning what they did into a result is
//! here, once, so a tcp and an sctp result are measured and recorded alike.
//!
//! - [`drive`] spawns the workers, lets each set its connection or association up, opens the gate
//!   so they start together, and ends the run at its deadline, when the run's stop flag goes up, or
//!   when every worker has returned. CPU and rusage are sampled over that window.
//! - Each worker keeps a [`Tally`]: operations, failures by errno, payload bytes, latency.
//!   [`Driven::merge`] sums them into the fields every kind fills alike.
//! - [`transient`] is the one retry policy, [`record_latency`] the one way the socket kinds record
//!   a latency (the triggers still truncate theirs).
//! - Client and server bits both protocols use: [`SockBufs`], [`server_or_peer`], [`ServerErrors`].
//!
//! # Hot path
//! A worker owns its socket, its buffers and its tally; the only shared state it touches while
//! running is a relaxed load of the stop flag. Everything is merged after the workers are joined.

use std::cell::Cell;
use std::fmt::Display;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use socket2::SockRef;

use crate::opts::{self, Wording};
pub(crate) use crate::skmem::Watch;
use fraglab_results::skmem::SockMem;
use fraglab_results::workload::{
    latency_histogram, CpuSample, ErrnoCount, Errors, Latency, Rusage, Spread, WorkloadResult,
};

/// Upper bound for workers (threads, clients, concurrent associations) of one run.
pub(super) const MAX_WORKERS: u64 = 4096;
/// Stack of a worker or server thread. They keep their buffers on the heap, and 4096 workers at
/// the default 2 MiB would reserve 8 GiB of address space.
pub(super) const WORKER_STACK: usize = 256 << 10;
/// The receiving side reads this much per recv(): large enough that the receiver costs a fraction
/// of the sender (see docs/benchmarks.md), small enough to stay in L2.
pub(super) const RECV_BUF: usize = 256 << 10;
/// How often the driver, waiting out the run, looks at the run's stop flag.
const STOP_POLL: Duration = Duration::from_millis(10);
/// Pause before a socket whose call failed transiently is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------------------------
// The retry policy and the latency recording.

/// The one retry policy: whether a call that failed with `e` leaves its socket worth another try —
/// the connection or association still stands, only this call came up short. Every failure is
/// counted by errno in the result either way; this decides only whether the same socket is used
/// again (after [`RETRY_PAUSE`], see [`Ctl::retry_after`]).
///
/// - ENOMEM, ENOBUFS: the kernel could not allocate for this one call (an skb, an SCTP chunk, a
///   page frag — what a fragmented machine refuses). Nothing on the socket changed, and carrying on
///   is the point: the run measures how often it happens.
/// - EAGAIN: a blocking send waited out SO_SNDTIMEO for send-buffer space and queued nothing: the
///   peer stopped reading, or the socket's memory was not granted (sk_stream_wait_memory,
///   sctp_wait_for_sndbuf) — how TCP in particular fails for memory, where SCTP may say ENOMEM.
/// - EINTR: a signal interrupted the call before it did anything (the send and recv wrappers
///   mostly retry it themselves).
///
/// Not ETIMEDOUT: from a TCP socket it is the kernel giving up on the connection (retransmissions
/// timed out, the socket closed), so another send only earns EPIPE; on SCTP it is what fraglab
/// calls a response or an association that did not come in time, after which the association is
/// out of step. Not ECONNRESET, EPIPE and the rest: the connection is gone.
pub(super) fn transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOMEM | libc::ENOBUFS | libc::EAGAIN | libc::EINTR))
}

/// Record one operation's latency into `h`, in microseconds.
pub(super) fn record_latency(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(micros(d));
}

/// `d` in microseconds, rounded to the nearest and never 0. Rounding, not truncating: loopback
/// transactions take tens of µs and a sendmsg a few, so dropping the fraction lowers every sample by
/// half a µs on average — a few percent there, and a bias that differed between TCP (rounded) and
/// SCTP (truncated), so it read as a difference between the protocols. Never 0: a completed
/// operation took time, the histogram's lowest discernible value is 1 µs, and the report plots
/// percentiles on a log axis; a sub-µs call overstated by less than 1 µs beats one that vanishes.
fn micros(d: Duration) -> u64 {
    let us = d.as_nanos().saturating_add(500) / 1000;
    u64::try_from(us).unwrap_or(u64::MAX).max(1)
}

/// `x` to one decimal, as per-worker rates are listed in `details`.
fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

// ---------------------------------------------------------------------------------------------
// One worker's tally.

/// What one worker did, in the terms every kind reports.
pub(super) struct Tally {
    /// Operations that completed (messages, transactions, associations).
    pub(super) ok: u64,
    pub(super) failed: u64,
    /// Payload bytes moved.
    pub(super) bytes: u64,
    /// From the gate opening to the worker's last operation.
    pub(super) elapsed: Duration,
    pub(super) latency: Histogram<u64>,
    pub(super) errors: Errors,
}

impl Tally {
    fn new(t0: Instant) -> Tally {
        Tally {
            ok: 0,
            failed: 0,
            bytes: 0,
            elapsed: Duration::ZERO,
            latency: latency_histogram(),
            errors: Errors::new(t0),
        }
    }

    /// An operation begun at `began` completed, moving `bytes` of payload.
    pub(super) fn done(&mut self, began: Instant, bytes: u64) {
        self.ok += 1;
        self.bytes += bytes;
        record_latency(&mut self.latency, began.elapsed());
    }

    /// A call failed: counted, by errno.
    pub(super) fn fail(&mut self, e: &io::Error) {
        self.failed += 1;
        self.errors.record(e);
    }

    fn rate(&self, rate: Rate) -> f64 {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        match rate {
            Rate::Mbit => self.bytes as f64 * 8.0 / 1e6 / secs,
            Rate::Ops => self.ok as f64 / secs,
        }
    }
}

/// What a worker's rate in `per_worker` counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rate {
    /// Payload Mbit/s; the run also gets `throughput_mbit`.
    Mbit,
    /// Operations per second.
    Ops,
}

// ---------------------------------------------------------------------------------------------
// The gate and the workers' handle on their run.

/// Workers set their sockets up, then wait here until all have arrived; then the clock starts. It
/// also counts the workers that have returned, so the driver knows when all are done.
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Workers at the gate, or gone without reaching it: one that dies setting up must not keep
    /// the others waiting.
    arrived: usize,
    open: bool,
    /// Workers that have returned.
    left: usize,
}

impl Gate {
    fn new() -> Gate {
        Gate { state: Mutex::new(GateState::default()), cv: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        // A worker that panics drops its Ctl during the unwind, which takes this lock: the counts
        // are whole either way (each change is one statement under the lock).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn arrive(&self) {
        let mut g = self.lock();
        g.arrived += 1;
        self.cv.notify_all();
        while !g.open {
            g = self.cv.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn leave(&self, arrived: bool) {
        let mut g = self.lock();
        g.arrived += usize::from(!arrived);
        g.left += 1;
        self.cv.notify_all();
    }

    fn open_when(&self, arrived: usize) {
        let mut g = self.lock();
        while g.arrived < arrived {
            g = self.cv.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        g.open = true;
        self.cv.notify_all();
    }

    /// Wait until all `n` workers have returned, `deadline` passes or `stop` goes up. Returns
    /// whether `stop` ended the wait.
    fn wait_done(&self, n: usize, deadline: Option<Instant>, stop: &AtomicBool) -> bool {
        let mut g = self.lock();
        loop {
            if g.left >= n {
                return false;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return false;
            }
            if stop.load(Relaxed) {
                return true;
            }
            let step = deadline.map_or(STOP_POLL, |d| (d - now).min(STOP_POLL));
            g = self.cv.wait_timeout(g, step).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

/// What the workers of one run share: read-only, apart from the stop flag.
struct Shared {
    gate: Gate,
    /// Raised by the driver when the run ends; the workers' only shared state while running.
    stop: AtomicBool,
    /// The workload's start, for errno first-seen times.
    t0: Instant,
}

/// A worker's handle on its run: [`Ctl::start`] once its socket is set up, [`Ctl::stopped`] before
/// every operation. Dropped when the worker returns, which the driver waits for.
pub(super) struct Ctl<'a> {
    run: &'a Shared,
    arrived: Cell<bool>,
}

impl Ctl<'_> {
    /// A tally whose errno first-seen times count from the workload's start.
    pub(super) fn tally(&self) -> Tally {
        Tally::new(self.run.t0)
    }

    /// Wait at the gate until every worker has set up; returns the moment this worker's clock
    /// starts.
    pub(super) fn start(&self) -> Instant {
        if !self.arrived.replace(true) {
            self.run.gate.arrive();
        }
        Instant::now()
    }

    /// Whether the run is over: its duration is up or its stop flag went up (a relaxed load).
    pub(super) fn stopped(&self) -> bool {
        self.run.stop.load(Relaxed)
    }

    /// Sleep `d` unless the run ends first.
    pub(super) fn pause(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stopped() {
            let now = Instant::now();
            if now >= end {
                break;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(2)));
        }
    }

    /// [`transient`] applied: whether the socket whose call failed with `e` is worth another try,
    /// and if so after [`RETRY_PAUSE`] — so a machine that refuses every allocation is asked about
    /// a thousand times a second per worker, however fast the CPU, and failure counts compare
    /// across protocols and machines.
    pub(super) fn retry_after(&self, e: &io::Error) -> bool {
        let retry = transient(e);
        if retry {
            self.pause(RETRY_PAUSE);
        }
        retry
    }
}

impl Drop for Ctl<'_> {
    fn drop(&mut self) {
        self.run.gate.leave(self.arrived.get());
    }
}

// ---------------------------------------------------------------------------------------------
// The driver.

/// What the workers of a run did, before merging.
pub(super) struct Driven<X> {
    /// Each worker's tally and its protocol's own counts, in spawn order.
    workers: Vec<(Tally, X)>,
    /// The workload's sockets' memory over the window, when watched.
    skmem: Option<SockMem>,
    cpu: Option<(CpuSample, CpuSample)>,
    rusage: Rusage,
    /// From the gate opening to every worker joined.
    wall: Duration,
    /// The run's stop flag ended the workers before their time.
    stopped: bool,
    /// Failures of the driver itself (a worker thread that could not be spawned).
    errors: Errors,
}

/// Spawn `n` workers (threads `fraglab-{proto}-{i}`) running `work`, open the gate once all have set
/// up, and end the run `duration` later — with `None`, once every worker has returned — or as soon
/// as `stop` (the run's stop flag) is raised; then join them. A worker that returns early, its
/// socket lost, ends nothing but itself; the run ends early when all have.
///
/// With a `watch`, a sampler thread records the memory of the workload's sockets from the gate
/// opening to the end of the window (the result's `skmem`).
pub(super) fn drive<X: Send>(
    proto: &str,
    n: usize,
    duration: Option<Duration>,
    t0: Instant,
    stop: &AtomicBool,
    watch: Option<Watch>,
    work: impl Fn(&Ctl) -> (Tally, X) + Sync,
) -> Driven<X> {
    let run = Shared { gate: Gate::new(), stop: AtomicBool::new(false), t0 };
    let mut errors = Errors::new(t0);
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            let b = std::thread::Builder::new().name(format!("fraglab-{proto}-{i}")).stack_size(WORKER_STACK);
            match b.spawn_scoped(scope, || work(&Ctl { run: &run, arrived: Cell::new(false) })) {
                Ok(h) => handles.push(h),
                Err(e) => errors.record(&e),
            }
        }
        run.gate.open_when(handles.len());
        let window_over = &run.stop;
        // A sampler that cannot start leaves the window unsampled, saying why; it is not one of the
        // workload's failed operations.
        let sampler = watch.map(|w| {
            let b = std::thread::Builder::new().name("fraglab-skmem".into()).stack_size(WORKER_STACK);
            let interval = Watch::interval(duration);
            b.spawn_scoped(scope, move || w.run(interval, window_over))
                .map_err(|e| Box::new(crate::skmem::unsampled(&w, &e)))
        });
        let cpu0 = CpuSample::now().ok();
        let ru0 = Rusage::now();
        let start = Instant::now();
        let stopped = run.gate.wait_done(handles.len(), duration.map(|d| start + d), stop);
        run.stop.store(true, Relaxed);
        let workers: Vec<_> = handles.into_iter().map(|h| h.join().expect("a worker panicked")).collect();
        let wall = start.elapsed();
        let rusage = Rusage::now().since(&ru0);
        let cpu = cpu0.zip(CpuSample::now().ok());
        let skmem = sampler.map(|h| match h {
            Ok(h) => h.join().expect("the socket memory sampler panicked"),
            Err(unsampled) => *unsampled,
        });
        Driven { workers, skmem, cpu, rusage, wall, stopped, errors }
    })
}

/// A run merged: the result with the fields every kind fills alike, and what the protocol adds.
pub(super) struct Merged<X> {
    pub(super) result: WorkloadResult,
    /// Each worker's own counts, in spawn order.
    pub(super) own: Vec<X>,
    /// Each worker's rate, as `per_worker` summarises them.
    pub(super) rates: Vec<f64>,
    /// From the gate opening to every worker joined.
    pub(super) wall: Duration,
    /// The run's stop flag ended the workers before their time.
    pub(super) stopped: bool,
}

impl<X> Driven<X> {
    /// Sum the workers' tallies into `r`: `ok`, `failed` (the driver's own failures too), `bytes`,
    /// `errors`, `latency_us`, and over the window — from the gate to the last worker's last
    /// operation — `duration_s`, `ops_per_sec`, `throughput_mbit` (for [`Rate::Mbit`]), `per_worker`;
    /// `cpu` with its service demand over `cpu_bytes(r)`, and `rusage`.
    pub(super) fn merge(
        self,
        mut r: WorkloadResult,
        rate: Rate,
        cpu_bytes: impl FnOnce(&WorkloadResult) -> u64,
    ) -> Merged<X> {
        let mut errors = self.errors;
        let (mut ok, mut failed, mut bytes) = (0, errors.total(), 0);
        let mut latency = latency_histogram();
        let mut window = Duration::ZERO;
        let mut rates = Vec::with_capacity(self.workers.len());
        let mut own = Vec::with_capacity(self.workers.len());
        for (t, x) in self.workers {
            ok += t.ok;
            failed += t.failed;
            bytes += t.bytes;
            window = window.max(t.elapsed);
            rates.push(t.rate(rate));
            latency.add(&t.latency).expect("histograms share bounds");
            errors.merge(t.errors);
            own.push(x);
        }
        let secs = window.as_secs_f64().max(1e-9);
        (r.ok, r.failed, r.bytes, r.duration_s) = (ok, failed, bytes, secs);
        r.ops_per_sec = Some(ok as f64 / secs);
        if rate == Rate::Mbit {
            r.throughput_mbit = Some(bytes as f64 * 8.0 / 1e6 / secs);
        }
        r.per_worker = Spread::of(&rates);
        r.latency_us = Latency::of(&latency);
        r.errors = errors.into_vec();
        let cpu_bytes = cpu_bytes(&r);
        r.cpu = self.cpu.map(|(c0, c1)| c0.until(&c1, cpu_bytes));
        r.rusage = self.rusage;
        r.skmem = self.skmem;
        Merged { result: r, own, rates, wall: self.wall, stopped: self.stopped }
    }
}

impl<X> Merged<X> {
    /// When the run's stop flag ended the run early, say so in the result: `stopped by a signal
    /// after 1.2 s of the {asked} asked for`.
    pub(super) fn mark_if_stopped(&mut self, asked: impl Display) {
        if self.stopped {
            let secs = self.result.duration_s;
            self.result.mark_stopped(format_args!("{secs:.1} s of the {asked} asked for"));
        }
    }

    /// The workers' rates to one decimal, for the per-worker lists in `details`.
    pub(super) fn rates_rounded(&self) -> Vec<f64> {
        self.rates.iter().copied().map(round1).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Sockets: buffer sizes, the server or the peer, a server's failures.

/// `--sndbuf`/`--rcvbuf` as resolved: SO_SNDBUF/SO_RCVBUF to set; `None` leaves the kernel's
/// autotuning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SockBufs {
    pub(crate) snd: Option<usize>,
    pub(crate) rcv: Option<usize>,
}

impl SockBufs {
    /// Check `--sndbuf` and `--rcvbuf` (1 byte to `max`), worded as the kind words its refusals.
    pub(super) fn resolve(w: Wording, max: u64, snd: Option<&str>, rcv: Option<&str>) -> Result<SockBufs> {
        let check = |flag, text| -> Result<_> { Ok(opts::sockbuf(w, flag, text, max)?.map(|n| n as usize)) };
        Ok(SockBufs { snd: check("--sndbuf", snd)?, rcv: check("--rcvbuf", rcv)? })
    }

    /// Set them on `s`. On a client before connect(), so they shape the window from the first
    /// packet on.
    pub(super) fn apply(self, s: &impl AsFd) -> io::Result<()> {
        let s = SockRef::from(s);
        if let Some(n) = self.snd {
            s.set_send_buffer_size(n)?;
        }
        if let Some(n) = self.rcv {
            s.set_recv_buffer_size(n)?;
        }
        Ok(())
    }

    /// Notes on what the kernel made of them, given one client socket's `effective` sizes: it
    /// doubles the value asked for and caps it at net.core.wmem_max/rmem_max.
    pub(super) fn notes(self, effective: Option<(usize, usize)>, notes: &mut Vec<String>) {
        if self.snd.is_none() && self.rcv.is_none() {
            return;
        }
        notes.push(
            "--sndbuf/--rcvbuf are set on both ends of every connection (the kernel doubles them)".into(),
        );
        let Some((snd, rcv)) = effective else { return };
        if self.snd.is_some_and(|r| snd < 2 * r) {
            notes.push(format!("SO_SNDBUF capped by net.core.wmem_max: effective {snd} bytes"));
        }
        if self.rcv.is_some_and(|r| rcv < 2 * r) {
            notes.push(format!("SO_RCVBUF capped by net.core.rmem_max: effective {rcv} bytes"));
        }
    }
}

/// SO_SNDBUF and SO_RCVBUF of `s` as the kernel set them.
pub(super) fn effective_bufs(s: &impl AsFd) -> Option<(usize, usize)> {
    let s = SockRef::from(s);
    Some((s.send_buffer_size().ok()?, s.recv_buffer_size().ok()?))
}

/// Where the clients go: `peer` (a `fraglab serve` on another host), or else a server that `start`
/// opens in this process on an ephemeral port of 127.0.0.1 — of [::1] with `ipv6` — returned with
/// the address it got.
pub(super) fn server_or_peer<S>(
    peer: Option<SocketAddr>,
    ipv6: bool,
    proto: &str,
    start: impl FnOnce(SocketAddr) -> io::Result<(SocketAddr, S)>,
) -> Result<(SocketAddr, Option<S>)> {
    if let Some(peer) = peer {
        return Ok((peer, None));
    }
    let local: IpAddr = if ipv6 { Ipv6Addr::LOCALHOST.into() } else { Ipv4Addr::LOCALHOST.into() };
    let (addr, server) = start(SocketAddr::new(local, 0))
        .with_context(|| format!("starting the in-process {proto} server on {local}"))?;
    Ok((addr, Some(server)))
}

/// A server's failures by errno, from all its threads. Locked only when a connection or an
/// association fails, never per message.
pub(super) struct ServerErrors(Mutex<Errors>);

impl ServerErrors {
    pub(super) fn new() -> ServerErrors {
        ServerErrors(Mutex::new(Errors::new(Instant::now())))
    }

    pub(super) fn record(&self, e: &io::Error) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).record(e);
    }

    /// What was recorded, leaving none.
    pub(super) fn take(&self) -> Vec<ErrnoCount> {
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *g, Errors::new(Instant::now())).into_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn latency_rounds_to_the_nearest_microsecond_and_never_to_0() {
        let ns = Duration::from_nanos;
        assert_eq!(micros(Duration::ZERO), 1, "a completed operation took time");
        assert_eq!(micros(ns(499)), 1);
        assert_eq!(micros(ns(1_499)), 1);
        assert_eq!(micros(ns(1_500)), 2);
        assert_eq!(micros(ns(12_501)), 13, "not truncated to 12");
        assert_eq!(micros(Duration::from_secs(7)), 7_000_000);
        assert_eq!(micros(Duration::MAX), u64::MAX);
        let mut h = latency_histogram();
        record_latency(&mut h, ns(300));
        record_latency(&mut h, ns(12_600));
        assert_eq!((h.min(), h.max(), h.len()), (1, 13, 2));
    }

    #[test]
    fn one_retry_policy() {
        let e = io::Error::from_raw_os_error;
        for code in [libc::ENOMEM, libc::ENOBUFS, libc::EAGAIN, libc::EINTR] {
            assert!(transient(&e(code)), "{code}");
        }
        for code in [libc::ETIMEDOUT, libc::ECONNRESET, libc::EPIPE, libc::ECONNREFUSED, libc::ENOTCONN] {
            assert!(!transient(&e(code)), "{code}");
        }
        assert!(!transient(&io::Error::other("no errno")));
    }

    /// A worker doing operations of 100 bytes, 1 ms each, until its run ends or it has done `ops`;
    /// its own count is how many it did.
    fn busy(ctl: &Ctl, ops: Option<u64>) -> (Tally, u64) {
        let mut t = ctl.tally();
        let start = ctl.start();
        let mut n = 0;
        while !ctl.stopped() && ops.is_none_or(|o| n < o) {
            let began = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            t.done(began, 100);
            n += 1;
        }
        t.elapsed = start.elapsed();
        (t, n)
    }

    fn result() -> WorkloadResult {
        WorkloadResult::new("test", json!({}), String::new())
    }

    #[test]
    fn the_run_ends_at_its_duration_and_merges_every_worker() {
        let t0 = Instant::now();
        let d =
            drive("test", 3, Some(Duration::from_millis(200)), t0, &AtomicBool::new(false), None, |ctl| {
                busy(ctl, None)
            });
        assert!(!d.stopped && d.wall >= Duration::from_millis(200), "{:?}", d.wall);
        let m = d.merge(result(), Rate::Mbit, |r| r.bytes);
        let r = &m.result;
        assert_eq!(m.own.iter().sum::<u64>(), r.ok);
        assert!(r.ok > 0 && r.bytes == 100 * r.ok && r.failed == 0, "{r:?}");
        assert_eq!(r.latency_us.as_ref().unwrap().count, r.ok, "one latency sample per operation");
        assert!(r.latency_us.as_ref().unwrap().min >= 1000, "{:?}", r.latency_us);
        assert!(r.duration_s >= 0.2 && r.duration_s < 1.0, "{}", r.duration_s);
        let mbit = r.bytes as f64 * 8.0 / 1e6 / r.duration_s;
        assert!((r.throughput_mbit.unwrap() - mbit).abs() < 1e-9 * mbit);
        assert_eq!(m.rates.len(), 3);
        assert!(r.cpu.is_some());
        let mut m = m;
        m.mark_if_stopped("200ms");
        assert!(!m.result.details.contains_key("stopped_by_signal") && m.result.notes.is_empty());
    }

    /// The run's stop flag ends a long run within a few polls, and the result says so.
    #[test]
    fn the_stop_flag_ends_the_run_early_and_honestly() {
        let stop = AtomicBool::new(false);
        let t0 = Instant::now();
        let (d, took) = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                stop.store(true, Relaxed);
            });
            let t = Instant::now();
            let d = drive("test", 2, Some(Duration::from_secs(60)), t0, &stop, None, |ctl| busy(ctl, None));
            (d, t.elapsed())
        });
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let mut m = d.merge(result(), Rate::Ops, |_| 0);
        assert!(m.stopped && m.result.ok > 0);
        m.mark_if_stopped("1m");
        assert_eq!(m.result.details["stopped_by_signal"], true);
        let note = m.result.notes.last().unwrap();
        assert!(
            note.starts_with("stopped by a signal after 0.") && note.ends_with("of the 1m asked for"),
            "{note}"
        );
        assert!(m.result.throughput_mbit.is_none(), "ops, not Mbit");
    }

    /// A run with no duration ends when its workers are done; so does one whose workers all lost
    /// their sockets, long before its duration, without calling that a stop.
    #[test]
    fn the_run_ends_when_every_worker_has_returned() {
        let t0 = Instant::now();
        let stop = AtomicBool::new(false);
        let d = drive("test", 4, None, t0, &stop, None, |ctl| busy(ctl, Some(5)));
        assert!(!d.stopped);
        let m = d.merge(result(), Rate::Ops, |_| 0);
        assert_eq!(m.result.ok, 20);
        assert_eq!(m.result.per_worker.as_ref().map(|s| s.min > 0.0), Some(true));

        let t = Instant::now();
        let d = drive("test", 2, Some(Duration::from_secs(60)), t0, &stop, None, |ctl| {
            let mut t = ctl.tally();
            ctl.start();
            t.fail(&io::Error::from_raw_os_error(libc::ECONNREFUSED));
            (t, ())
        });
        assert!(t.elapsed() < Duration::from_secs(2) && !d.stopped);
        let m = d.merge(result(), Rate::Ops, |_| 0);
        let r = &m.result;
        assert_eq!(
            (r.ok, r.failed, r.errors[0].errno.as_str(), r.errors[0].count),
            (0, 2, "ECONNREFUSED", 2)
        );
        assert!(r.latency_us.is_none() && r.duration_s < 1.0);
    }

    /// A worker that returns before the gate (its setup failed, or it panicked) does not keep the
    /// others waiting at it.
    #[test]
    fn a_worker_gone_before_the_gate_does_not_hold_it() {
        let d = drive(
            "test",
            3,
            Some(Duration::from_millis(100)),
            Instant::now(),
            &AtomicBool::new(false),
            None,
            |ctl| {
                if std::thread::current().name() == Some("fraglab-test-1") {
                    return (ctl.tally(), 0);
                }
                busy(ctl, None)
            },
        );
        let m = d.merge(result(), Rate::Ops, |_| 0);
        assert_eq!(m.own[1], 0);
        assert!(m.own[0] > 0 && m.own[2] > 0);
    }

    #[test]
    fn rates_listed_to_a_tenth() {
        assert_eq!(round1(812.349), 812.3);
        assert_eq!(round1(0.04), 0.0);
    }

    #[test]
    fn server_errors_are_taken_once() {
        let e = ServerErrors::new();
        e.record(&io::Error::from_raw_os_error(libc::EMFILE));
        e.record(&io::Error::from_raw_os_error(libc::EMFILE));
        let taken = e.take();
        assert_eq!((taken[0].errno.as_str(), taken[0].count), ("EMFILE", 2));
        assert!(e.take().is_empty());
    }
}
