//! `fraglab run`: from fragmentation to verdict, in one function that reads top to bottom.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fraglab_fragmenter::fragment::{Fragmenter, Progress, Stopped};
use fraglab_fragmenter::hold::Guarded;
use fraglab_fragmenter::instance::Instance;
use fraglab_fragmenter::keeper::{Lost, Timeline};
use fraglab_fragmenter::sysctl::Journal;
use fraglab_probe::kmsg::{KmsgEvent, KmsgWatcher};
use fraglab_probe::snapshot::{Monitor, Sampler, Snapshot};
use fraglab_probe::tracefs::Catcher;
use fraglab_results::dir::ResultsDir;
use fraglab_results::record::{Phase, RunRecord, RunStatus, Window, WorkloadRecord, WorkloadsFile};
use fraglab_results::sample::{SampleLine, SampleTarget};
use fraglab_results::{Versioned, SCHEMA};

use crate::runplan::RunPlan;

/// A failed allocation the keeper made itself: a pipe ring it asked for after another task took the
/// block. Fraglab's, not the kernel failing a workload, so it must not count as a reproduction. The
/// thread alone does not say it: an allocation in softirq context (a retransmit timer's skb) is
/// traced under whichever task it interrupted, the keeper's thread too — so the stack must be the
/// pipe resize as well.
fn by_the_keeper(f: &fraglab_probe::tracefs::AllocFailure, keeper_tid: i32) -> bool {
    let resize = |frame: &String| {
        matches!(
            fraglab_probe::stack::function_name(frame),
            Some("pipe_resize_ring" | "pipe_set_size" | "pipe_fcntl")
        )
    };
    f.pid == keeper_tid && f.stack.iter().any(resize)
}

pub use fraglab_results::record::Verdict;
use fraglab_results::record::WindowTarget;

/// A run an error stopped after it began, once it released and restored: run.json already says
/// what ran, what was put back and why it stopped, and the summary can be printed from it.
#[derive(Debug)]
pub struct PartWay {
    pub dir: std::path::PathBuf,
}

impl std::fmt::Display for PartWay {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "the run stopped part-way; what it had is in {}", self.dir.display())
    }
}

/// Run the plan. Returns the verdict and the results directory; on an error part-way the directory
/// is still left valid, its run.json marked incomplete with the error ([`PartWay`] when the run
/// got to release and restore, so run.json has the phases and the restored sysctls).
pub fn run(
    plan: &RunPlan,
    run_dir: &std::path::Path,
    stop: Arc<AtomicBool>,
) -> Result<(Verdict, ResultsDir)> {
    // Preflight: what the run needs must be here before anything is taken. A run that cannot test
    // here still leaves its verdict (could not test, 125 for `git bisect run`) without taking the
    // machine.
    // The machine is ours before anything else is written: a run refused because another fraglab
    // holds it leaves no results directory behind.
    let held = match preflight(plan, Check::Use) {
        Ok(()) => Ok(Instance::acquire(run_dir, &format!("fraglab run {}", plan.config_path.display()))?),
        Err(reason) => Err(reason),
    };
    let results = ResultsDir::create(&plan.output, &plan.name)?;
    let record = new_record(plan);
    let (mut instance, restored) = match held {
        Ok(held) => held,
        Err(reason) => {
            results.write_json("run.json", &record)?;
            return finish(results, record, Verdict::CouldNotTest, reason);
        }
    };
    // Named in the lock record before run.json says "running": if this process is killed from here
    // on, the next fraglab finds it dead and marks these results as cut short.
    instance.set_results(&results.dir)?;
    results.write_json("run.json", &record)?;
    let dir = results.dir.clone();
    let out = pipeline(plan, run_dir, restored, stop, results, record.clone()).map_err(|e| {
        if e.is::<PartWay>() {
            return e;
        }
        let mut record = record;
        record.end(RunStatus::Incomplete, None, format!("{e:#}"));
        let _ = ResultsDir { dir: dir.clone() }.write_json("run.json", &record);
        e.context(format!("the run stopped part-way; what it had is in {}", dir.display()))
    });
    // Only now, with run.json saying how the run ended, may another fraglab take the machine.
    drop(instance);
    out
}

/// (preflight and the instance lock, in [`run`]) → baseline probe → fragment to target → verify →
/// monitors → workloads × sweep × iterations → stop monitors → release → restore sysctls → final
/// probe → verdict.
fn pipeline(
    plan: &RunPlan,
    run_dir: &std::path::Path,
    restored: Vec<fraglab_fragmenter::sysctl::Restored>,
    stop: Arc<AtomicBool>,
    results: ResultsDir,
    mut record: RunRecord,
) -> Result<(Verdict, ResultsDir)> {
    let mut phases = Phases::new(&results);

    record.sysctls_restored.extend(restored.iter().map(|r| format!("{r} (left by a dead fraglab)")));
    let journal = Journal::create(run_dir)?;

    phases.begin("baseline");
    results.write_json("baseline.json", &Versioned::now(Snapshot::take(&Monitor::available().0)?))?;

    phases.begin("fragment");
    // One journal for the run: the fragmenter's sysctls and the sweep's, restored together.
    let mut kernel = match &plan.fragment {
        Some(fp) => {
            let avail = fraglab_fragmenter::fragment::mem_available()?;
            if let Some(note) = crate::runplan::whole_machine_note(plan, avail, crate::vm::init::in_guest()) {
                err!("{note}");
            }
            let mut bar = crate::progress::progress_bar();
            let mut step = "";
            let mut progress = |p: Progress| {
                if p.step() != step {
                    step = p.step();
                    phases.mark(&format!("fragment: {step}"));
                }
                bar(p);
            };
            let started = Fragmenter::start(fp.clone(), journal, &mut progress, &stop);
            drop(bar);
            let f = match started {
                Ok(f) => f,
                Err(e) => {
                    let Some(stopped) = e.downcast_ref::<Stopped>() else { return Err(e) };
                    record.phases = phases.done();
                    record.sysctls_restored.extend(stopped.restored.iter().map(|r| r.to_string()));
                    return interrupted(results, record, format!("interrupted by a signal: {stopped}"));
                }
            };
            record.fragment = Some(f.status().clone());
            if let Some(why) = target_missed(f.status()) {
                phases.end();
                record.phases = phases.done();
                record.sysctls_restored.extend(f.release()?.iter().map(|r| r.to_string()));
                return finish(results, record, Verdict::CouldNotTest, why);
            }
            // From here on memory pressure is answered within 200 ms, also in the middle of a workload.
            Held::Fragmented(Guarded::start(f))
        }
        None => Held::Baseline(journal),
    };

    phases.begin("monitors");
    let timeline = match &kernel {
        Held::Fragmented(g) => Some(g.timeline()),
        Held::Baseline(_) => None,
    };
    let sampler = BackgroundSampler::start(&results, plan, timeline.clone())?;
    let catcher = Catcher::start(plan.catch_min_order).context("starting the failure catcher (tracefs)")?;
    let kmsg = if plan.kmsg { Some(KmsgTail::start(&results)?) } else { None };
    // A loss counts against a window when its blocks could have served what the run is about: the
    // target's order, or the higher order an `[expect] failed_order` names (a free order-5 block
    // cannot have let an order-8 allocation succeed).
    let counted_order = plan
        .fragment
        .as_ref()
        .map_or(0, |f| f.keeping().1)
        .max(plan.expect.failed_order.unwrap_or(0) as usize);
    // Rewritten whole after every window, so a killed run keeps every result so far.
    let mut written = WorkloadsFile::new();
    let mut interrupted = None;
    let mut failed_to_run = Vec::new();

    let mut refused = None;
    'points: for point in &plan.points {
        for (name, value) in &point.sysctls {
            // A value the kernel refuses ends the sweep here, but not the run's record: what ran,
            // the release and what was put back are still written.
            if let Err(e) = kernel.set_sysctl(name, value) {
                refused = Some(e.context(format!("sweep point {}", point.label)));
                break 'points;
            }
        }
        for iteration in 1..=plan.iterations {
            for (index, w) in point.workloads.iter().enumerate() {
                if stop.load(Ordering::Relaxed) {
                    interrupted = Some("interrupted by a signal".to_string());
                    break 'points;
                }
                phases.begin_window(Window {
                    kind: w.kind_name.clone(),
                    point: point.point.clone(),
                    iteration,
                    index,
                });
                if let Held::Fragmented(g) = &kernel {
                    // Open the window on a target seen held, from a fresh look, so a loss found
                    // after it is not charged from a look before it began. A target that did not
                    // settle, or looks that kept failing, are named here; the window is judged as
                    // it is.
                    match g.settle(&stop) {
                        Ok(None) => {}
                        Ok(Some(why)) => record.errors.push(format!("{}: {why}", w.kind_name)),
                        Err(e) => {
                            record.errors.push(format!("{}: settling before the window: {e:#}", w.kind_name))
                        }
                    }
                }
                let start_ns = monotonic_ns();
                let result = match fraglab_workload::run(&w.kind, &stop) {
                    Ok(r) => r,
                    Err(e) => {
                        let what = format!("{} at {} iteration {iteration}: {e:#}", w.kind_name, point.label);
                        record.errors.push(what.clone());
                        failed_to_run.push(what);
                        continue;
                    }
                };
                let end_ns = monotonic_ns();
                let target = match (&kernel, &timeline) {
                    (Held::Fragmented(g), Some(t)) => {
                        let lost = lost_in_window(g, t, start_ns, end_ns, counted_order);
                        // A profile's free blocks as the window left them: a measurement that
                        // cannot be made is named, and the window judged by its losses alone.
                        let fidelity = g.with(|f| f.fidelity_now()).unwrap_or_else(|e| {
                            record.errors.push(format!("{}: the profile's fidelity: {e:#}", w.kind_name));
                            None
                        });
                        let (tolerance, order) = (plan.lost_tolerance, counted_order);
                        Some(WindowTarget::judge(lost, start_ns, end_ns, tolerance, order, fidelity))
                    }
                    _ => None,
                };
                err!("{}", fraglab_results::workload::summary(&result));
                if let Some(t) = target.as_ref().filter(|t| !t.held) {
                    errln!("  target    {}", t.lost_text());
                }
                if let Held::Fragmented(g) = &kernel {
                    record.errors.extend(g.take_events());
                }
                written.workloads.push(WorkloadRecord {
                    point: point.point.clone(),
                    sysctls: point.sysctls.clone(),
                    iteration,
                    index,
                    result,
                    target,
                });
                results.write_json("workloads.json", &written)?;
            }
        }
    }

    let workloads = written.workloads;

    // A signal that stopped the last workload is seen only here: the loop's check comes before each.
    if interrupted.is_none() && stop.load(Ordering::Relaxed) {
        interrupted = Some("interrupted by a signal".to_string());
    }

    phases.begin("release");
    let mut failures = catcher.stop()?.failures;
    if let Held::Fragmented(g) = &kernel {
        if let Some(tid) = g.with(|f| f.keeper_tid()) {
            failures.retain(|f| !by_the_keeper(f, tid));
        }
    }
    // Written before the release, which can fail: the failures are the run's evidence.
    let mut lines = results.lines("alloc_failures.jsonl")?;
    for f in &failures {
        lines.push(&Versioned::now(f))?;
    }
    let kernel_log = kmsg.map(|k| k.stop()).transpose()?.unwrap_or_default();
    sampler.stop()?;
    let restored = match kernel {
        Held::Fragmented(g) => {
            let (mut f, events) = g.stop()?;
            record.errors.extend(events);
            record.fragment = Some(f.refresh()?.clone());
            record.target_losses = f.timeline().lock().unwrap_or_else(|e| e.into_inner()).losses.clone();
            f.release()?
        }
        Held::Baseline(mut journal) => journal.restore()?,
    };
    record.sysctls_restored.extend(restored.iter().map(|r| r.to_string()));
    // The instance lock stays held (by `run`) until run.json has its verdict: a run killed after this
    // point (in the final probe) is still found dead by the next fraglab and its record marked
    // incomplete.

    phases.begin("final");
    results.write_json("final.json", &Versioned::now(Snapshot::take(&Monitor::available().0)?))?;
    phases.end();
    record.phases = phases.done();
    if let Some(e) = refused {
        record.errors.push(format!("{e:#}"));
        record.end(RunStatus::Incomplete, None, format!("{e:#}"));
        results.write_json("run.json", &record)?;
        return Err(e.context(PartWay { dir: results.dir.clone() }));
    }

    let (mut verdict, mut reason) =
        crate::verdict::run(&plan.expect, plan.catch_min_order, &workloads, &failures, &kernel_log);
    // A run that did not do all it set out to cannot say "not reproduced".
    if verdict == Verdict::NotReproduced {
        let lost = record.fragment.as_ref().and_then(|f| f.target_lost.clone());
        let lost_window = workloads.iter().find_map(|w| Some((w, w.target.as_ref().filter(|t| !t.held)?)));
        if let Some(lost) = lost {
            (verdict, reason) =
                (Verdict::CouldNotTest, format!("the target was lost during the run: {lost}"));
        } else if let Some((w, t)) = lost_window {
            let windows = workloads.iter().filter(|w| w.target.as_ref().is_some_and(|t| !t.held)).count();
            (verdict, reason) = (
                Verdict::CouldNotTest,
                format!(
                    "{reason}, but the target was {}, in {} ({windows} of {} workload windows lost it): \
                     \"not reproduced\" needs the target held",
                    t.lost_text(),
                    w.window_name(),
                    workloads.len()
                ),
            );
        } else if let Some(first) = failed_to_run.first() {
            (verdict, reason) = (
                Verdict::CouldNotTest,
                format!("{} workload run(s) failed to run; first: {first}", failed_to_run.len()),
            );
        }
    }
    if let Some(why) = interrupted {
        return self::interrupted(results, record, format!("{why}; what ran so far: {reason}"));
    }
    finish(results, record, verdict, reason)
}

/// What the run holds of the kernel: fragmented memory (guarded) and its journal, or just the journal.
enum Held {
    Fragmented(Guarded),
    Baseline(Journal),
}

impl Held {
    fn set_sysctl(&mut self, name: &str, value: &str) -> Result<()> {
        match self {
            Held::Fragmented(g) => g.with(|f| f.journal().set(name, value)),
            Held::Baseline(j) => j.set(name, value),
        }
    }
}

/// run.json as a run starts: `running`, its plan, nothing measured yet.
fn new_record(plan: &RunPlan) -> RunRecord {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    RunRecord {
        description: plan.description.clone(),
        kernel_release: read("/proc/sys/kernel/osrelease"),
        kernel_cmdline: read("/proc/cmdline"),
        host: read("/proc/sys/kernel/hostname"),
        arch: std::env::consts::ARCH.into(),
        fraglab_version: env!("CARGO_PKG_VERSION").into(),
        config_path: plan.config_path.display().to_string(),
        config: plan.config_text.clone(),
        plan: Some(plan.record.clone()),
        started: fraglab_results::workload::wall_now(),
        ..RunRecord::new(&plan.name)
    }
}

/// Phases on the monotonic clock; beginning one ends the previous.
struct Phases {
    done: Vec<Phase>,
    current: Option<(String, Option<Window>, u64)>,
    results: ResultsDir,
}

impl Phases {
    fn new(results: &ResultsDir) -> Self {
        Phases { done: Vec::new(), current: None, results: results.clone() }
    }

    fn begin(&mut self, name: &str) {
        self.end();
        self.current = Some((name.to_string(), None, monotonic_ns()));
        self.mark(name);
    }

    /// A workload's window: its phase is named for people and carries the window for readers.
    fn begin_window(&mut self, window: Window) {
        self.end();
        let name = window.phase_name();
        self.mark(&name);
        self.current = Some((name, Some(window), monotonic_ns()));
    }

    /// Say in run.json where the run is. Advisory — it only tells a run that dies where it was — so
    /// a failed write is told, not fatal.
    fn mark(&self, name: &str) {
        if let Err(e) = self.results.mark_phase(name) {
            errln!("fraglab: {e:#}");
        }
    }

    fn end(&mut self) {
        if let Some((name, workload, start_ns)) = self.current.take() {
            let end_ns = monotonic_ns();
            self.done.push(Phase {
                name,
                start_ns,
                end_ns,
                secs: (end_ns - start_ns) as f64 / 1e9,
                workload,
            });
        }
    }

    fn done(&mut self) -> Vec<Phase> {
        self.end();
        std::mem::take(&mut self.done)
    }
}

/// CLOCK_MONOTONIC, the clock probe.jsonl samples carry.
fn monotonic_ns() -> u64 {
    fraglab_probe::snapshot::monotonic_ns().expect("CLOCK_MONOTONIC exists")
}

/// The part of a workload's window the target was lost for. A block that formed in the window's
/// last moments would be seen only at the keeper's next look (a kept page's move, a second later):
/// look now, then judge.
fn lost_in_window(
    g: &Guarded,
    timeline: &Mutex<Timeline>,
    start_ns: u64,
    end_ns: u64,
    min_order: usize,
) -> Lost {
    let looked = g.look_now();
    let mut lost =
        timeline.lock().unwrap_or_else(|e| e.into_inner()).lost_within(start_ns, end_ns, min_order);
    if let Err(e) = looked {
        // Nothing saw how the window ended: it cannot say the target held.
        lost.ns = end_ns - start_ns;
        lost.worst = Some(format!("the keeper's look after the window failed ({e:#}): not seen to hold"));
    }
    lost
}

/// How [`preflight`] may look: a run uses what it checks, a dry run must change nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Open an SCTP socket, which makes the kernel load the sctp module if it has one.
    Use,
    /// Read /proc/net/protocols and the module lists instead: nothing loaded.
    Look,
}

/// What the run needs of this machine; the reason it cannot test otherwise.
pub fn preflight(plan: &RunPlan, how: Check) -> std::result::Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("fraglab run needs root (pagemap, mlock, sysctls, tracefs)".into());
    }
    let sctp = plan.points.iter().flat_map(|p| &p.workloads).any(|w| w.kind_name.starts_with("sctp"));
    if sctp {
        let missing = |why: String| {
            format!(
                "this kernel has no SCTP ({why}): load the sctp module or run the config in a guest with `fraglab vm`"
            )
        };
        match how {
            Check::Use => {
                // SAFETY: a plain socket(2) call; the descriptor is closed at once.
                let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
                if fd < 0 {
                    return Err(missing(format!("socket: {}", std::io::Error::last_os_error())));
                }
                // SAFETY: closing the descriptor just opened.
                unsafe { libc::close(fd) };
            }
            Check::Look => {
                if !sctp_registered() && !sctp_module_installed() {
                    return Err(missing(
                        "not in /proc/net/protocols, and no sctp module in /lib/modules for this kernel"
                            .into(),
                    ));
                }
            }
        }
    }
    // fs/locks.c makes /proc/locks; without it flock(2) is ENOSYS and the instance lock cannot be taken.
    if !std::path::Path::new("/proc/locks").exists() {
        return Err(
            "this kernel has no file locking (CONFIG_FILE_LOCKING; no /proc/locks): fraglab's flock \
                    keeps it the only one changing the kernel"
                .into(),
        );
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems.lines().any(|l| l.split_whitespace().last() == Some("tracefs")) {
        return Err("this kernel has no tracefs (CONFIG_TRACING): the failure catcher cannot run".into());
    }
    if plan.kmsg && std::fs::File::open("/dev/kmsg").is_err() {
        return Err(
            "cannot read /dev/kmsg for the kernel log watcher; set [probe] kmsg = false to run without it"
                .into(),
        );
    }
    Ok(())
}

/// SCTP is built in or already loaded.
fn sctp_registered() -> bool {
    let protocols = std::fs::read_to_string("/proc/net/protocols").unwrap_or_default();
    protocols.lines().any(|l| l.split_whitespace().next() == Some("SCTP"))
}

/// The running kernel has sctp as a module that a socket() would load (modules.dep lists it).
fn sctp_module_installed() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let dep =
        std::fs::read_to_string(format!("/lib/modules/{}/modules.dep", release.trim())).unwrap_or_default();
    dep.lines().any(|l| l.split(':').next().is_some_and(|m| m.contains("/sctp.ko")))
}

/// Whether the fragmenter's result is good enough to test on; the reason if not.
///
/// What makes the target hold is that every region the cut opened keeps a page in place: then no
/// free block of the target order can form there. The kernel allocating from the freed holes (it
/// serves small requests from the smallest free blocks first) uses up free memory but does not undo
/// the shape, so the intact count is reported, not judged.
fn target_missed(s: &fraglab_fragmenter::Status) -> Option<String> {
    if s.target_lost.is_some() {
        return s.target_lost.clone();
    }
    if let Some(left) = s.leftover_pages {
        if left > 0 {
            return Some(format!(
                "target not reached: {left} free pages still in blocks at or above the target order"
            ));
        }
    }
    if s.planned.iter().sum::<u64>() == 0 {
        return Some("the fragmenter made no free block: nothing to test against".into());
    }
    if s.pin == fraglab_fragmenter::Pin::Mlock && s.moved_pages > 0 {
        return Some(format!("target not held: {} pinned pages were migrated", s.moved_pages));
    }
    if let Some(f) = s.fidelity.as_ref().filter(|f| !f.within) {
        return Some(format!(
            "target not reached: the free blocks are off the profile when the hold begins, beyond the \
             tolerance of ± {} % and {} blocks per order: {}",
            fraglab_fragmenter::fidelity::TOLERANCE_PERCENT,
            fraglab_fragmenter::fidelity::TOLERANCE_BLOCKS,
            f.off_text()
        ));
    }
    None
}

/// probe.jsonl, written by a thread at the plan's interval until stopped.
struct BackgroundSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl BackgroundSampler {
    fn start(results: &ResultsDir, plan: &RunPlan, timeline: Option<Arc<Mutex<Timeline>>>) -> Result<Self> {
        let mut out = results.lines("probe.jsonl")?;
        let mut sampler = Sampler::new(plan.monitors.clone());
        let interval = plan.interval;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || -> Result<()> {
            let mut next = Instant::now();
            let mut previous_ns = None;
            let mut sample = |sampler: &mut Sampler| -> Result<()> {
                let sample = sampler.sample()?;
                let now_ns = sample.snapshot.monotonic_ns;
                let target = timeline.as_ref().map(|t| {
                    let t = t.lock().unwrap_or_else(|e| e.into_inner());
                    let lost = t.lost_within(previous_ns.unwrap_or(now_ns), now_ns, 0);
                    SampleTarget { held: lost.ns == 0, lost_ms: lost.ns as f64 / 1e6, zones: t.now.clone() }
                });
                previous_ns = Some(now_ns);
                out.push(&SampleLine { schema: SCHEMA, sample, target })
            };
            while !flag.load(Ordering::Relaxed) {
                sample(&mut sampler)?;
                next += interval;
                while Instant::now() < next && !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20).min(interval));
                }
            }
            // One last sample so the series ends after the workloads.
            sample(&mut sampler)
        });
        Ok(BackgroundSampler { stop, thread: Some(thread) })
    }

    fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("joined once");
        thread.join().map_err(|_| anyhow::anyhow!("the probe sampler thread panicked"))?
    }
}

impl Drop for BackgroundSampler {
    // On an error path the thread must not outlive the run.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn finish(
    results: ResultsDir,
    mut record: RunRecord,
    verdict: Verdict,
    reason: String,
) -> Result<(Verdict, ResultsDir)> {
    record.end(RunStatus::Complete, Some(verdict), reason);
    results.write_json("run.json", &record)?;
    Ok((verdict, results))
}

/// Write run.json for a run a signal stopped: incomplete, verdict interrupted (exit 130).
fn interrupted(results: ResultsDir, mut record: RunRecord, reason: String) -> Result<(Verdict, ResultsDir)> {
    record.end(RunStatus::Incomplete, Some(Verdict::Interrupted), reason);
    results.write_json("run.json", &record)?;
    Ok((Verdict::Interrupted, results))
}

/// How long the kernel-log reader drains records after the run stops.
const KMSG_DRAIN_BOUND: Duration = Duration::from_secs(5);

/// /dev/kmsg from the start of the monitors to the release, copied to kmsg.log as it arrives (the
/// kernel's ring buffer can wrap during a flood of failure reports) and parsed for failures and OOM
/// kills.
struct KmsgTail {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Vec<KmsgEvent>>>>,
}

impl KmsgTail {
    fn start(results: &ResultsDir) -> Result<Self> {
        let mut watcher = KmsgWatcher::open()?;
        let mut log = results.text("kmsg.log")?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || -> Result<Vec<KmsgEvent>> {
            use std::io::Write;
            let mut events = Vec::new();
            let mut stopped_at = None;
            loop {
                // After the stop flag, read on until the log is drained so the last records are not
                // lost — but not for ever if the kernel is still flooding it.
                if stopped_at.is_none() && flag.load(Ordering::Relaxed) {
                    stopped_at = Some(Instant::now());
                }
                let records = watcher.read_available()?;
                let drained = records.len() < KmsgWatcher::MAX_RECORDS;
                for record in records {
                    writeln!(log, "{}", record.to_dmesg_line())?;
                    if let Ok(Some(event)) = fraglab_probe::kmsg::parse_message(&record.message) {
                        events.push(event);
                    }
                }
                match stopped_at {
                    Some(_) if drained => return Ok(events),
                    Some(t) if t.elapsed() > KMSG_DRAIN_BOUND => {
                        writeln!(
                            log,
                            "fraglab: the kernel log was still being written {} s after the run stopped \
                             (the drain bound); reading stopped here",
                            KMSG_DRAIN_BOUND.as_secs()
                        )?;
                        return Ok(events);
                    }
                    Some(_) => {}
                    None if drained => {
                        watcher.wait(Duration::from_millis(200))?;
                    }
                    None => {}
                }
            }
        });
        Ok(KmsgTail { stop, thread: Some(thread) })
    }

    fn stop(mut self) -> Result<Vec<KmsgEvent>> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("joined once");
        thread.join().map_err(|_| anyhow::anyhow!("the kmsg reader thread panicked"))?
    }
}

impl Drop for KmsgTail {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
