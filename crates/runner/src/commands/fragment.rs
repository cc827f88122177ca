//! `fraglab fragment`, `fraglab status`, `fraglab release`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fraglab_fragmenter::control::{self, NotHolding, Request};
use fraglab_fragmenter::fragment::{Fragmenter, Progress, Stopped};
use fraglab_fragmenter::hold::{GuardPace, Looks};
use fraglab_fragmenter::instance::Instance;
use fraglab_fragmenter::keeper::KEEP_EVERY;
use fraglab_fragmenter::sysctl::Journal;
use fraglab_fragmenter::{Plan, Status};

use crate::cli::{FragmentArgs, StatusArgs};
use crate::resolve::{self, FragmentSpec, Machine};
use fraglab_fragmenter::describe;
use fraglab_units::{format_size, order_size};

use crate::exit::Exit;

/// The daemon child says this on stdout once it holds the target, followed by its status as JSON.
const READY: &str = "FRAGLAB-HOLDING ";

/// The daemon child says this on stdout when it was stopped before it held, followed by why.
const STOPPED: &str = "FRAGLAB-STOPPED ";

/// The control socket while [`Fragmenter::start`] shapes: `status` says where shaping stands,
/// `release` sets the stop flag that shaping looks at between steps.
struct Shaping {
    progress: Arc<Mutex<String>>,
    released: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Shaping {
    fn serve(listener: &UnixListener, stop: Arc<AtomicBool>) -> Result<Shaping> {
        let listener = listener.try_clone().context("cannot share the control socket")?;
        let progress = Arc::new(Mutex::new("starting".to_string()));
        let (released, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (p, r, d) = (Arc::clone(&progress), Arc::clone(&released), Arc::clone(&done));
        let thread = std::thread::Builder::new().name("fraglab-shaping".into()).spawn(move || {
            while !d.load(Ordering::Relaxed) {
                let release = control::serve_pending(&listener, |req| match req {
                    Request::Status => serde_json::json!({
                        "ok": true,
                        "shaping": *p.lock().unwrap_or_else(|e| e.into_inner()),
                        "pid": std::process::id(),
                    }),
                    Request::Release => serde_json::json!({
                        "ok": true,
                        "released": true,
                        "shaping": *p.lock().unwrap_or_else(|e| e.into_inner()),
                    }),
                });
                if release {
                    r.store(true, Ordering::Relaxed);
                    stop.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })?;
        Ok(Shaping { progress, released, done, thread: Some(thread) })
    }

    /// Pass a step on to the progress bar and keep it for `status`.
    fn progress(&self, p: Progress, bar: &mut impl FnMut(Progress)) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = describe::progress(&p);
        bar(p);
    }

    /// Stop answering; true when a release came while shaping.
    fn finish(mut self) -> bool {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.released.load(Ordering::Relaxed)
    }
}

pub fn run(args: FragmentArgs, run_dir: &Path) -> Result<Exit> {
    let machine = Machine::read()?;
    let plan = resolve::fragment(&FragmentSpec::from(&args), &machine, None, &|k| {
        format!("--{}", k.replace('_', "-"))
    })?;
    if args.dry_run {
        print_plan(&plan, &machine, args.json)?;
        return Ok(Exit::Ok);
    }
    if !args.daemon_child {
        // Before anything is taken, where the user is looking (the daemon child's stderr is a log).
        if let Some(note) = whole_machine_note(&plan, machine.mem_available) {
            err!("{note}");
        }
    }
    if args.daemon && !args.daemon_child {
        return spawn_daemon(run_dir);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let (instance, restored) = Instance::acquire(run_dir, &command)?;
    for r in restored {
        errln!("fraglab: restored {r} left by a fraglab that died");
    }
    let journal = Journal::create(run_dir)?;
    let listener = control::listen(run_dir)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }

    // Shaping a whole machine takes a while: the socket is answered from the start, and a release
    // then stops it between two steps.
    let shaping = Shaping::serve(&listener, Arc::clone(&stop))?;
    let mut bar = crate::progress::progress_bar();
    let started = Fragmenter::start(plan, journal, &mut |p| shaping.progress(p, &mut bar), &stop);
    drop(bar);
    let released_early = shaping.finish();
    // A release the shaping thread answered after `start` had looked at the flag for the last time:
    // it was told "released while still shaping", so it is that, not a hold.
    let started = match started {
        Ok(f) if released_early => {
            f.release().and_then(|restored| Err(Stopped { phase: "finishing the hold", restored }.into()))
        }
        other => other,
    };
    let mut fragmenter = match started {
        Ok(f) => f,
        Err(e) => {
            drop(listener);
            let _ = std::fs::remove_file(run_dir.join(control::SOCKET));
            drop(instance);
            let Some(stopped) = e.downcast_ref::<Stopped>() else { return Err(e) };
            let by = if released_early { "`fraglab release`" } else { "a signal" };
            let msg = format!("stopped by {by}: {stopped}; nothing is held");
            if args.daemon_child {
                outln!("{STOPPED}{msg}");
            } else {
                errln!("fraglab: {msg}");
            }
            return Ok(Exit::Failed);
        }
    };

    if args.daemon_child {
        // Tell the foreground half we hold, then cut loose from its terminal.
        outln!("{READY}{}", serde_json::to_string(fragmenter.status())?);
        std::io::stdout().flush()?;
        detach(run_dir)?;
    } else {
        report(fragmenter.status(), args.json)?;
        errln!("holding; Ctrl-C (or `fraglab release`) gives it back, `fraglab status` shows it");
    }

    // The hold: answer the socket, keep the target, guard against memory pressure, stop on release
    // or a signal.
    let mut keeping = Looks::default();
    let (mut pace, mut next_guard) = (GuardPace::default(), Instant::now());
    while !stop.load(Ordering::Relaxed) {
        let release = control::serve_pending(&listener, |req| match req {
            Request::Status => {
                // The keeper's look first, as it would take one 10 ms on: a block it takes back at
                // once is not what "lost now" means, and the answer is the keeper's record, which a
                // run's verdict is judged by. A look that failed leaves that record of unknown age:
                // no answer from it.
                let looked = fragmenter.look_for_status();
                let failed = looked.as_ref().err().map(|e| format!("the keeper could not look: {e:#}"));
                if let Some(line) = keeping.said(looked, "the keeper could not look at buddyinfo") {
                    errln!("fraglab: {line}");
                }
                if let Some(error) = failed {
                    return serde_json::json!({ "ok": false, "error": error });
                }
                match fragmenter.refresh() {
                    Ok(s) => serde_json::json!({ "ok": true, "status": s }),
                    Err(e) => serde_json::json!({ "ok": false, "error": format!("{e:#}") }),
                }
            }
            Request::Release => serde_json::json!({ "ok": true, "released": true }),
        });
        if release {
            break;
        }
        if let Some(line) = keeping.said(fragmenter.keep(), "the keeper could not look at buddyinfo") {
            errln!("fraglab: {line}");
        }
        // A guard that cannot look cannot keep the OOM killer away: the hold ends (and everything is
        // given back) rather than go on unguarded.
        let now = Instant::now();
        if now >= next_guard {
            let look = fragmenter.guard()?;
            next_guard = now + pace.next(now, &look);
            if let Some(line) = look.gave_back {
                errln!("fraglab: {line}");
            }
        }
        std::thread::sleep(KEEP_EVERY);
    }
    let restored = fragmenter.release()?;
    drop(listener);
    let _ = std::fs::remove_file(run_dir.join(control::SOCKET));
    drop(instance);
    errln!("released; restored {}", restored.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", "));
    Ok(Exit::Ok)
}

/// Run this same command again in the background and wait until it holds (or fails).
fn spawn_daemon(run_dir: &Path) -> Result<Exit> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.push("--daemon-child".into());
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(&args).stdin(Stdio::null()).stdout(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; the child leaves our session so a closing terminal
    // does not SIGHUP it.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = cmd.spawn().context("cannot start the background fragmenter")?;
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(json) = line.strip_prefix(READY) {
            let status: Status = serde_json::from_str(json)?;
            report(&status, false)?;
            errln!(
                "holding in the background (pid {}); `fraglab status`, `fraglab release`; log: {}",
                child.id(),
                run_dir.join("fraglab.log").display()
            );
            return Ok(Exit::Ok);
        }
        if let Some(why) = line.strip_prefix(STOPPED) {
            errln!("fraglab: the background fragmenter: {why}");
            child.wait()?;
            return Ok(Exit::Failed);
        }
    }
    let code = child.wait()?;
    bail!("the background fragmenter stopped before holding ({code})");
}

/// Point stdout and stderr at the log so the daemon outlives the terminal.
fn detach(run_dir: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let log = std::fs::OpenOptions::new().create(true).append(true).open(run_dir.join("fraglab.log"))?;
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: dup2 onto the standard descriptors; the log file stays open.
        if unsafe { libc::dup2(log.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error()).context("dup2 to the log");
        }
    }
    // A write that failed before (the foreground half gone already) must not silence the log.
    fraglab_stdio::reset();
    Ok(())
}

/// `fraglab status`: the holder's answer, refreshed now. Exit 0 while the target holds, 1 when it is
/// lost — and when nothing holds it in shape (still shaping, or no fragmenter) — so a script can
/// check it. `--watch` asks again every interval until the hold ends, Ctrl-C, or nobody reads.
pub fn status(args: StatusArgs, run_dir: &Path) -> Result<Exit> {
    let Some(every) = args.watch else {
        let reply = Reply::ask(run_dir)?;
        reply.print(args.json, true, false)?;
        return Ok(reply.exit());
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    // The exit status of the last answer; `None` before the first.
    let mut exit = None;
    loop {
        match Reply::ask(run_dir) {
            Ok(reply) => {
                reply.print(args.json, exit.is_none(), true)?;
                exit = Some(reply.exit());
            }
            // Nothing answers on the socket after something did: released, stopped by a signal,
            // or dead (the next fraglab command restores what it left).
            Err(e) if exit.is_some() && e.is::<NotHolding>() => {
                errln!("fraglab status: the hold ended ({e:#})");
                return Ok(Exit::Failed);
            }
            Err(e) if exit.is_none() => return Err(e),
            // The holder is there but did not answer as it should (a refresh that failed, no reply
            // within the bound while its guard was giving memory back): said, and asked again. No
            // answer says it holds, so until one does the watch would exit 1.
            Err(e) => {
                errln!("fraglab status: {e:#}");
                exit = Some(Exit::Failed);
            }
        }
        let next = Instant::now().checked_add(every).context("the --watch interval is too long")?;
        while Instant::now() < next && !stop.load(Ordering::Relaxed) {
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
        }
        if stop.load(Ordering::Relaxed) || fraglab_stdio::stdout_closed() {
            return Ok(exit.unwrap_or(Exit::Failed));
        }
    }
}

/// What a holder answers to `status`.
enum Reply {
    /// Still taking memory or cutting: nothing held in shape yet.
    Shaping {
        pid: u64,
        what: String,
        raw: serde_json::Value,
    },
    Holding(Box<Status>),
}

impl Reply {
    fn ask(run_dir: &Path) -> Result<Reply> {
        let reply = control::call(run_dir, &Request::Status)?;
        if let Some(what) = reply["shaping"].as_str() {
            let pid = reply["pid"].as_u64().unwrap_or(0);
            return Ok(Reply::Shaping { pid, what: what.to_string(), raw: reply.clone() });
        }
        Ok(Reply::Holding(Box::new(serde_json::from_value(reply["status"].clone())?)))
    }

    fn exit(&self) -> Exit {
        match self {
            Reply::Holding(s) if holds(s) => Exit::Ok,
            _ => Exit::Failed,
        }
    }

    /// The whole account (the first answer of a watch too), then a line an answer; JSON pretty,
    /// or one object a line when watching.
    fn print(&self, json: bool, first: bool, watching: bool) -> Result<()> {
        match self {
            Reply::Shaping { raw, .. } if json => outln!("{}", json_text(raw, watching)?),
            Reply::Holding(s) if json => outln!("{}", json_text(s, watching)?),
            Reply::Shaping { pid, what, .. } => {
                outln!("fraglab pid {pid} is still shaping: {what}; nothing is held in shape yet")
            }
            Reply::Holding(s) if first => report(s, false)?,
            Reply::Holding(s) => outln!("{}", watch_line(s)),
        }
        Ok(())
    }
}

fn json_text(v: &impl serde::Serialize, watching: bool) -> Result<String> {
    Ok(if watching { serde_json::to_string(v)? } else { serde_json::to_string_pretty(v)? })
}

/// Whether the hold's target holds at its last refresh (a holder too old to say: unless it was
/// lost to memory pressure).
fn holds(s: &Status) -> bool {
    s.now.as_ref().map_or(s.target_lost.is_none(), |n| n.holds)
}

/// Memory the holder has locked now, when it could tell.
fn locked(s: &Status) -> Option<String> {
    s.now.as_ref().and_then(|n| n.locked_bytes).map(format_size)
}

/// One line of `status --watch`: the time, holds or LOST, and what changes while holding.
fn watch_line(s: &Status) -> String {
    let time = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let clock = time.get(11..19).unwrap_or(&time);
    let mut parts = Vec::new();
    match &s.now {
        Some(n) if n.holds => {
            // Free blocks at or above the order that do not count (DMA; anywhere in regions mode):
            // what changes while it holds. Nothing when there are none.
            let free: Vec<String> = n
                .zones
                .iter()
                .filter(|z| z.pages > 0)
                .map(|z| format!("{} {}", z.zone.replace(", zone", ""), z.pages))
                .collect();
            parts.push(if free.is_empty() {
                "holds".to_string()
            } else {
                format!("holds (not counted, free pages at order ≥ {}: {})", n.order, free.join(", "))
            });
        }
        Some(n) => parts.push(format!("LOST: {}", n.why.as_deref().unwrap_or("?"))),
        None => parts.push(if holds(s) { "holds".into() } else { "LOST".into() }),
    }
    let locked = locked(s).map(|l| format!(", {l} locked")).unwrap_or_default();
    parts.push(format!("held {}{locked}", format_size(s.held_bytes)));
    if let Some(k) = &s.keeping {
        let rebroken: u64 = k.rebroken.iter().sum();
        if rebroken > 0 {
            parts.push(format!("re-broken {rebroken} ({})", format_size(k.added_bytes)));
        }
        parts.push(format!("lost {:.3} s in {}", k.lost_ns as f64 / 1e9, k.losses));
    }
    if !s.give_backs.is_empty() {
        let bytes: u64 = s.give_backs.iter().map(|g| g.bytes).sum();
        parts.push(format!("gave back {} in {}", format_size(bytes), s.give_backs.len()));
    }
    format!("{clock}  {}", parts.join("; "))
}

pub fn release(run_dir: &Path) -> Result<Exit> {
    let holder = Instance::holder();
    let socket = run_dir.join(control::SOCKET);
    if UnixStream::connect(&socket).is_err() {
        // Nothing held here is what a cleanup trap wants to hear (exit 0), unless another fraglab
        // does hold the machine: then this release did not do what the caller meant.
        if let Some(h) = holder.as_ref().filter(|h| !h.is_recovery() && h.still_holding()) {
            // A fragmenter answers on its control socket; a `fraglab run` holds until it ends.
            let how =
                match h.run_dir.as_ref().filter(|d| UnixStream::connect(d.join(control::SOCKET)).is_ok()) {
                    Some(dir) => format!("release it with: fraglab --run-dir {} release", dir.display()),
                    None => format!("it gives everything back when it ends, or on: kill -INT {}", h.pid),
                };
            bail!("no fragmenter to release in {}: {h} holds the machine; {how}", run_dir.display());
        }
        errln!("nothing to release: no fraglab is holding memory");
        return Ok(Exit::Ok);
    }
    // What it changed, to say what was put back once it has let go.
    let journal = run_dir.join(Journal::FILE);
    let changed = fraglab_fragmenter::sysctl::read_journal(&journal).ok().flatten().unwrap_or_default();
    let reply = control::call(run_dir, &Request::Release)?;
    let shaping = reply["shaping"].as_str().map(String::from);
    // The holder releases after replying; wait until it has let go of the lock so the caller can rely
    // on it — by watching its record, not by taking the lock, which is machine-wide: a fraglab starting
    // elsewhere at that moment must not be refused because release peeked.
    let ours = std::path::absolute(run_dir).ok();
    let holder = holder.filter(|h| h.run_dir.is_some() && h.run_dir == ours);
    for _ in 0..300 {
        // Without a record naming it (written by an older fraglab, or this run directory spelt
        // through a symlink), its socket going away is the sign: it closes that after restoring.
        let holding = match &holder {
            Some(h) => h.still_holding(),
            None => UnixStream::connect(&socket).is_ok(),
        };
        if !holding {
            // A journal of the released holder's own is one it could not restore; a fraglab that
            // took the machine right after it may have started a new one here.
            let left = fraglab_fragmenter::sysctl::read_journal(&journal).ok().flatten().unwrap_or_default();
            let pid = holder.as_ref().map(|h| h.pid).or_else(|| changed.first().map(|e| e.pid));
            if left.iter().any(|e| Some(e.pid) == pid) {
                bail!(
                    "the fragmenter let go but left {} (a sysctl could not be restored); the next fraglab \
                     command retries it",
                    journal.display()
                );
            }
            let restored = changed.iter().map(|e| format!("{} = {}", e.name, e.original)).collect::<Vec<_>>();
            errln!(
                "released{}: memory given back{}",
                shaping.map(|s| format!(" while still shaping ({s})")).unwrap_or_default(),
                if restored.is_empty() {
                    String::new()
                } else {
                    format!(", restored {}", restored.join(", "))
                }
            );
            return Ok(Exit::Ok);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the fragmenter acknowledged the release but still holds its lock after 30 s")
}

fn print_plan(plan: &Plan, machine: &Machine, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(plan)?);
        return Ok(());
    }
    for (key, value) in describe::plan(plan, machine.mem_available) {
        outln!("{:<9} {value}", format!("{key}:"));
    }
    if let Some(note) = whole_machine_note(plan, machine.mem_available) {
        out!("{note}");
    }
    outln!("dry run: nothing taken, nothing changed");
    Ok(())
}

/// The whole-machine warning for `fraglab fragment` on a host.
fn whole_machine_note(plan: &Plan, mem_available: u64) -> Option<String> {
    describe::whole_machine_note(
        plan,
        mem_available,
        crate::vm::init::in_guest(),
        "fraglab vm --kernel debian-cloud --script SCRIPT (fragment --daemon, your test, release: docs/vm.md)",
        "add --budget SIZE",
    )
}

/// The human (or JSON) account of a hold.
pub fn report(s: &Status, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    let since = std::time::UNIX_EPOCH + Duration::from_secs(s.since);
    let for_how_long = since.elapsed().map(|d| Duration::from_secs(d.as_secs())).unwrap_or_default();
    outln!(
        "fraglab pid {}: {}, {}; holding since {} ({})",
        s.pid,
        describe::extent(s.budget),
        describe::target(&s.target),
        humantime::format_rfc3339_seconds(since),
        humantime::format_duration(for_how_long)
    );
    if let Some(n) = &s.now {
        match &n.why {
            None if n.zones.iter().any(|z| z.in_play) => outln!(
                "  target holds now: no free block of order ≥ {} ({}) in the zones it covers",
                n.order,
                order_size(n.order)
            ),
            None => outln!("  target holds now: every kept page is where the cut left it"),
            Some(why) => outln!("  TARGET LOST now: {why}"),
        }
    } else if let Some(lost) = &s.target_lost {
        outln!("  TARGET LOST: {lost}");
    }
    let locked = locked(s).map(|l| format!(" ({l} locked)")).unwrap_or_default();
    outln!(
        "  holding {}{locked}, freed {} in planned blocks; pin {}",
        format_size(s.held_bytes),
        format_size(s.freed_bytes),
        describe::pin(s.pin)
    );
    if s.naive {
        outln!(
            "  PFNs hidden (not root?): freed every other page, the naive pattern; no order is guaranteed"
        );
    }
    let mut rows = vec![["order", "planned", "intact", "missing"].map(String::from).to_vec()];
    for o in (0..s.planned.len()).filter(|&o| s.planned[o] + s.missing[o] > 0) {
        rows.push(vec![
            format!("{o} {}", order_size(o)),
            s.planned[o].to_string(),
            s.intact[o].to_string(),
            s.missing[o].to_string(),
        ]);
    }
    for line in fraglab_stdio::columns(&rows, &[true; 4]) {
        outln!("  {line}");
    }
    if s.missing_bytes > 0 {
        outln!(
            "  {} of the target could not be cut: the memory taken is not all in whole aligned regions",
            format_size(s.missing_bytes)
        );
    }
    if let Some(scaled) = describe::scaled_profile(&s.target, s.scale, s.budget, &s.planned, &s.missing) {
        outln!("  {scaled}");
    }
    for z in describe::zone_cuts(&s.zones) {
        outln!("  {z}");
    }
    if let Some(t) = describe::traded(s.traded_bytes) {
        outln!("  {t}");
    }
    outln!("  held pages moved since the cut: {}", s.moved_pages);
    if let Some(left) = s.leftover_pages {
        let how = match (&s.keeping, s.fill_bytes) {
            (Some(k), 0) => format!(
                "the keeper's rings hold {} of the reserve's high-order blocks ({} rings)",
                format_size(k.added_bytes),
                k.pipes
            ),
            (_, fill) => {
                format!("{} of pipe pages broke up the reserve's high-order blocks", format_size(fill))
            }
        };
        outln!(
            "  whole machine: {how}; {} still free at order ≥ k{}",
            format_size(left * 4096),
            if left == 0 { " (target reached)" } else { " — TARGET NOT REACHED" }
        );
    }
    if let Some(k) = &s.keeping {
        outln!("  {}", describe::keeping(k));
    }
    for (f, when) in [(&s.fidelity_at_hold, "when the hold began"), (&s.fidelity, "now")] {
        for line in f.iter().flat_map(|f| describe::fidelity(f, when)) {
            outln!("  {line}");
        }
    }
    for line in buddyinfo_table(s) {
        outln!("  {line}");
    }
    for b in &s.bounds {
        outln!("  ended {b}");
    }
    for e in &s.sysctls {
        outln!("  sysctl {} = {} (was {}, restored on release)", e.name, e.set_to, e.original);
    }
    if let (Some(first), Some(last)) = (s.give_backs.first(), s.give_backs.last()) {
        let at = |t: u64| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(t));
        outln!(
            "  guard: gave back {} in {} give-back(s), {} to {}, each when MemAvailable fell below the floor {}",
            format_size(s.give_backs.iter().map(|g| g.bytes).sum()),
            s.give_backs.len(),
            at(first.at),
            at(last.at),
            format_size(last.floor_bytes)
        );
    }
    // The latest events; a guard under steady pressure can log many (all are in --json).
    const EVENTS: usize = 5;
    if s.events.len() > EVENTS {
        outln!("  ({} earlier events: fraglab status --json)", s.events.len() - EVENTS);
    }
    for e in s.events.iter().skip(s.events.len().saturating_sub(EVENTS)) {
        outln!("  event: {e}");
    }
    Ok(())
}

/// /proc/buddyinfo at the refresh, a zone a row, with the free pages at or above the target order
/// and whether the zone counts toward the target.
fn buddyinfo_table(s: &Status) -> Vec<String> {
    let orders = s.buddyinfo_now.nr_orders();
    let mut head = vec!["buddyinfo now".to_string()];
    head.extend((0..orders).map(|o| o.to_string()));
    let above = s.now.as_ref().filter(|n| n.zones.iter().any(|z| z.in_play));
    if let Some(n) = above {
        head.push(format!("≥ {}", n.order));
    }
    let mut rows = vec![head];
    for z in &s.buddyinfo_now.zones {
        let mut row = vec![z.label()];
        row.extend(z.free.iter().map(u64::to_string));
        if let Some(n) = above {
            let label = z.label();
            row.push(match n.zones.iter().find(|a| a.zone == label) {
                Some(a) if a.in_play => a.pages.to_string(),
                _ => "(not counted)".into(),
            });
        }
        rows.push(row);
    }
    let mut right = vec![false];
    right.extend(std::iter::repeat_n(true, orders + 1));
    fraglab_stdio::columns(&rows, &right)
}
