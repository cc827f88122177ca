//! What sampling costs: CPU time (getrusage) and wall time per sample of the probe, beside references
//! that read the same files without parsing them. Prints markdown tables for docs/benchmarks.md.
//!
//! ```sh
//! cargo build --release -p fraglab          # optional: also measures the real `fraglab probe --watch`
//! cargo run --release -p fraglab-probe --example probe_bench                 # 30 s per series
//! cargo run --release -p fraglab-probe --example probe_bench -- --seconds 5 --only a
//! cargo run --release -p fraglab-probe --example probe_bench -- --only f --fragment-mib 1024
//! ```
//!
//! Parts, run one after the other (never concurrently, so they do not share the two cores):
//!
//! - `hot`: each monitor read + parsed back to back for 2 s, beside a bare read of its file(s): the
//!   floor, with caches hot; over so many calls the user/sys split separates parsing from the kernel.
//! - `a`: every monitor at 1 Hz. Each tick runs, in a rotating order: the probe's `Sampler` + JSON line
//!   (what `fraglab probe --watch 1s` does per tick), a bare read of the same files, `cat FILES >
//!   /dev/null` spawned (a shell loop's body), and every monitor on its own, parsed and bare — so all
//!   of them see the same free lists. Then the real binary, if built, in a window of its own.
//! - `b`: buddyinfo alone at 100 Hz: `Sampler` + JSON beside a bare open/read/close, the cost of the
//!   100 Hz tick itself, then the real binary with `--monitors buddyinfo`.
//! - `f` (only with `--fragment-mib N`): 2N MiB of anonymous memory touched and every second page
//!   handed back with MADV_DONTNEED (the seed's "free every second page"), then the monitors at 1 Hz
//!   while that holds: pagetypeinfo's cost follows the number of free blocks it walks.
//!
//! CPU is user + sys from `getrusage(RUSAGE_SELF)` (+ `RUSAGE_CHILDREN` for spawned processes), as %
//! of one core over the series' wall time and as µs per sample. The sum is the scheduler's exact
//! runtime; the user/sys split is sampled at the tick (250 Hz here), so it means something only over
//! many samples.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fraglab_probe::snapshot::{Monitor, Sampler, Snapshot};

/// The files each monitor reads (sockstat reads three).
fn files(m: Monitor) -> &'static [&'static str] {
    match m {
        Monitor::Buddyinfo => &["/proc/buddyinfo"],
        Monitor::Pagetypeinfo => &["/proc/pagetypeinfo"],
        Monitor::Meminfo => &["/proc/meminfo"],
        Monitor::Vmstat => &["/proc/vmstat"],
        Monitor::Slabinfo => &["/proc/slabinfo"],
        Monitor::Sockstat => &["/proc/net/sockstat", "/proc/net/sockstat6", "/proc/net/protocols"],
        Monitor::Zoneinfo => &["/proc/zoneinfo"],
    }
}

/// user and sys CPU time in µs.
#[derive(Clone, Copy, Default)]
struct Cpu {
    user: f64,
    sys: f64,
}

impl Cpu {
    fn total(self) -> f64 {
        self.user + self.sys
    }

    fn minus(self, earlier: Cpu) -> Cpu {
        Cpu { user: self.user - earlier.user, sys: self.sys - earlier.sys }
    }

    fn plus(self, other: Cpu) -> Cpu {
        Cpu { user: self.user + other.user, sys: self.sys + other.sys }
    }
}

fn rusage(who: libc::c_int) -> Cpu {
    // SAFETY: getrusage only writes the rusage we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(who, &mut ru) }, 0, "getrusage");
    let us = |tv: libc::timeval| tv.tv_sec as f64 * 1e6 + tv.tv_usec as f64;
    Cpu { user: us(ru.ru_utime), sys: us(ru.ru_stime) }
}

/// CPU of this process and of its waited-for children.
fn cpu_now() -> Cpu {
    rusage(libc::RUSAGE_SELF).plus(rusage(libc::RUSAGE_CHILDREN))
}

/// Free blocks (all orders, all zones) in /proc/buddyinfo: what pagetypeinfo has to walk.
fn free_blocks() -> u64 {
    fraglab_probe::buddyinfo::BuddyInfo::read()
        .map(|b| b.zones.iter().flat_map(|z| z.free.iter()).sum())
        .unwrap_or(0)
}

/// One measured series.
struct Row {
    what: String,
    samples: u64,
    wall: Duration,
    cpu: Cpu,
    /// Wall time of each sample, µs (empty when only the total is known).
    per_sample_wall: Vec<f64>,
    note: String,
}

impl Row {
    fn new(what: &str, wall: Duration, cpu: Cpu, per_sample_wall: Vec<f64>) -> Row {
        let samples = per_sample_wall.len() as u64;
        Row { what: what.into(), samples, wall, cpu, per_sample_wall, note: String::new() }
    }

    fn cpu_percent(&self) -> f64 {
        self.cpu.total() / self.wall.as_micros() as f64 * 100.0
    }

    fn cpu_us_per_sample(&self) -> f64 {
        self.cpu.total() / self.samples.max(1) as f64
    }

    fn wall_stats(&self) -> String {
        if self.per_sample_wall.is_empty() {
            return "—".into();
        }
        let mut v = self.per_sample_wall.clone();
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        format!("{mean:.0} / {:.0} / {:.0}", v[v.len() / 2], v[v.len() - 1])
    }

    fn markdown(&self) -> String {
        let user = if self.cpu.total() > 0.0 { self.cpu.user / self.cpu.total() * 100.0 } else { 0.0 };
        format!(
            "| {} | {} | {:.1} s | {:.3} % | {:.0} | {:.0} % | {} | {} |",
            self.what,
            self.samples,
            self.wall.as_secs_f64(),
            self.cpu_percent(),
            self.cpu_us_per_sample(),
            user,
            self.wall_stats(),
            self.note
        )
    }
}

const TABLE_HEAD: &str = "| series | samples | wall | CPU, % of one core | CPU µs / sample | user share | \
                          wall µs / sample (mean / p50 / max) | notes |\n\
                          |---|---:|---:|---:|---:|---:|---:|---|";

/// One thing measured inside a shared schedule.
struct Activity<'a> {
    name: String,
    run: Box<dyn FnMut() + 'a>,
    cpu: Cpu,
    walls: Vec<f64>,
    /// (free blocks at the start of the tick, CPU µs) of every run, for [`walk_fit`].
    points: Vec<(f64, f64)>,
    note: String,
}

impl<'a> Activity<'a> {
    fn new(name: impl Into<String>, run: impl FnMut() + 'a) -> Self {
        Activity {
            name: name.into(),
            run: Box::new(run),
            cpu: Cpu::default(),
            walls: Vec::new(),
            points: Vec::new(),
            note: String::new(),
        }
    }
}

/// What [`interleave`] measured over the whole series.
struct Series {
    wall: Duration,
    ticks: u64,
    /// All CPU of the series, the activities' included.
    cpu: Cpu,
    free_blocks: (u64, u64),
}

/// Every `interval` for `length` (the fixed-rate schedule `fraglab probe --watch` uses: the next tick is
/// due one interval after the last was due; a late tick restarts the schedule), run every activity once,
/// starting with a different one each tick so none is always first (or always reads what another just
/// brought into the cache). All activities see the same kernel state, which matters because the free
/// lists the expensive files walk change by the second on a busy machine. CPU is `RUSAGE_SELF` +
/// `RUSAGE_CHILDREN` around each run; `RUSAGE_SELF` brings the caller's runtime up to date, so short
/// runs are measured exactly (`RUSAGE_THREAD` would not: it reads the runtime as of the last tick).
fn interleave(
    interval: Duration,
    length: Duration,
    track_free_blocks: bool,
    acts: &mut [Activity],
) -> Series {
    let cpu0 = cpu_now();
    let start = Instant::now();
    let mut next = start;
    let mut ticks = 0u64;
    let (mut lo, mut hi) = (u64::MAX, 0);
    while start.elapsed() < length {
        let fb = if track_free_blocks { free_blocks() } else { 0 };
        (lo, hi) = (lo.min(fb), hi.max(fb));
        let n = acts.len();
        for k in 0..n {
            let a = &mut acts[(ticks as usize + k) % n];
            let (c, t) = (cpu_now(), Instant::now());
            (a.run)();
            let wall = t.elapsed().as_secs_f64() * 1e6;
            let used = cpu_now().minus(c);
            a.cpu = a.cpu.plus(used);
            a.walls.push(wall);
            a.points.push((fb as f64, used.total()));
        }
        ticks += 1;
        next += interval;
        match next.checked_duration_since(Instant::now()) {
            Some(wait) => std::thread::sleep(wait),
            None => next = Instant::now(),
        }
    }
    Series { wall: start.elapsed(), ticks, cpu: cpu_now().minus(cpu0), free_blocks: (lo, hi) }
}

/// Rows for the activities of a series, CPU % taken over the series' wall time.
fn rows(series: &Series, acts: Vec<Activity>) -> Vec<Row> {
    acts.into_iter()
        .map(|a| {
            let mut row = Row::new(&a.name, series.wall, a.cpu, a.walls);
            row.note = a.note;
            row
        })
        .collect()
}

/// Least-squares line through (free blocks, CPU µs): what a pagetypeinfo read costs per free block.
fn walk_fit(points: &[(f64, f64)]) -> String {
    let n = points.len() as f64;
    let (lo, hi) = points.iter().fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    if points.len() < 3 || sxx == 0.0 {
        return format!("{lo:.0}–{hi:.0} free blocks in buddyinfo");
    }
    let slope = sxy / sxx;
    let r = sxy / (sxx * syy).sqrt();
    format!(
        "{lo:.0}–{hi:.0} free blocks in buddyinfo; CPU ≈ {:.0} µs + {:.0} µs per 1000 free blocks (r = {r:.2})",
        my - slope * mx,
        slope * 1000.0
    )
}

/// Call `f` back to back for about `length`: the cost of one call with caches hot.
fn back_to_back(what: &str, length: Duration, mut f: impl FnMut()) -> Row {
    f();
    let cpu0 = cpu_now();
    let start = Instant::now();
    let mut walls = Vec::new();
    while start.elapsed() < length {
        let t = Instant::now();
        f();
        walls.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Row::new(what, start.elapsed(), cpu_now().minus(cpu0), walls)
}

/// open + read to the end + close, no parsing; returns the bytes read.
fn bare_read(paths: &[&str], buf: &mut Vec<u8>) -> usize {
    let mut n = 0;
    for p in paths {
        buf.clear();
        let mut f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        n += f.read_to_end(buf).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    n
}

/// The probe's own pipeline: one sample, serialised as the JSON line `--watch` writes.
fn sample_to_json(sampler: &mut Sampler, line: &mut Vec<u8>) -> usize {
    let s = sampler.sample().expect("sample");
    line.clear();
    serde_json::to_writer(&mut *line, &s).expect("serialise");
    line.push(b'\n');
    line.len()
}

/// `fraglab` next to this example in the target directory, if it has been built.
fn fraglab_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("fraglab");
    bin.is_file().then_some(bin)
}

/// Run the real binary for one series and charge it its rusage (start-up included).
fn real_binary(bin: &Path, what: &str, args: &[&str]) -> Row {
    let out = std::env::temp_dir().join(format!("probe-bench-{}.jsonl", std::process::id()));
    let cpu0 = cpu_now();
    let start = Instant::now();
    let status = Command::new(bin)
        .arg("--run-dir")
        .arg(std::env::temp_dir().join("probe-bench-run"))
        .arg("probe")
        .args(args)
        .arg("--output")
        .arg(&out)
        .stderr(Stdio::null())
        .status()
        .expect("run fraglab");
    assert!(status.success(), "fraglab probe {args:?}: {status}");
    let wall = start.elapsed();
    let cpu = cpu_now().minus(cpu0);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let samples = text.lines().count() as u64;
    let bytes = text.len() as u64 / samples.max(1);
    Row {
        what: what.into(),
        samples,
        wall,
        cpu,
        per_sample_wall: Vec::new(),
        note: format!("whole process incl. start-up; {bytes} B per JSON line"),
    }
}

/// 2 × `mib` MiB touched, then every second page handed back: `mib` MiB of free order-0 pages whose
/// buddies stay allocated (256 per MiB). The per-CPU lists absorb the first of them (up to their
/// `high`, see /proc/zoneinfo), the rest reach the buddy free lists. Unmapped on drop.
struct Fragmented {
    addr: *mut libc::c_void,
    len: usize,
}

impl Fragmented {
    fn new(mib: usize) -> Fragmented {
        let page = 4096;
        let len = mib << 21;
        // SAFETY: a fresh private anonymous mapping, used only through these calls.
        unsafe {
            let prot = libc::PROT_READ | libc::PROT_WRITE;
            let addr =
                libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            assert_ne!(addr, libc::MAP_FAILED, "mmap {} MiB", 2 * mib);
            libc::madvise(addr, len, libc::MADV_NOHUGEPAGE);
            for off in (0..len).step_by(page) {
                *(addr as *mut u8).add(off) = 1;
            }
            for off in (0..len).step_by(2 * page) {
                libc::madvise((addr as *mut u8).add(off) as *mut libc::c_void, page, libc::MADV_DONTNEED);
            }
            Fragmented { addr, len }
        }
    }
}

impl Drop for Fragmented {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in new().
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn print_rows(title: &str, rows: &[Row]) {
    println!("\n{title}\n\n{TABLE_HEAD}");
    for r in rows {
        println!("{}", r.markdown());
    }
}

fn main() {
    let mut seconds = 30u64;
    let mut fragment_mib = 0usize;
    let mut parts: BTreeSet<String> = ["hot", "a", "b"].map(String::from).into();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().and_then(|s| s.parse().ok()).expect("--seconds N"),
            "--only" => parts = args.next().expect("--only hot,a,b,f").split(',').map(String::from).collect(),
            "--fragment-mib" => {
                fragment_mib = args.next().and_then(|s| s.parse().ok()).expect("--fragment-mib N");
                parts.insert("f".into());
            }
            _ => panic!("usage: probe_bench [--seconds N] [--only hot,a,b,f] [--fragment-mib N]"),
        }
    }
    let length = Duration::from_secs(seconds);
    let (available, skipped) = Monitor::available();
    for s in &skipped {
        eprintln!("probe_bench: skipping {s}");
    }
    let uname = Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    println!(
        "probe_bench: {seconds} s per series; kernel {}; {} CPUs; load average {}; {} free blocks in buddyinfo",
        uname.unwrap_or_default(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        free_blocks()
    );
    let all_files: Vec<&str> = available.iter().flat_map(|&m| files(m).iter().copied()).collect();

    if parts.contains("hot") {
        let each = Duration::from_secs(2);
        let mut buf = Vec::with_capacity(1 << 20);
        let mut line = Vec::with_capacity(1 << 20);
        let mut rows = Vec::new();
        for &m in &available {
            let bytes = bare_read(files(m), &mut buf);
            let mut row = back_to_back(&format!("{} read + parse", m.name()), each, || {
                Snapshot::take(&BTreeSet::from([m])).expect("snapshot");
            });
            row.note = format!("{bytes} B of text; {} free blocks", free_blocks());
            rows.push(row);
            rows.push(back_to_back(&format!("{} bare read", m.name()), each, || {
                bare_read(files(m), &mut buf);
            }));
        }
        let snap = Snapshot::take(&available).expect("snapshot");
        let mut row = back_to_back("all monitors: JSON serialisation only", each, || {
            line.clear();
            serde_json::to_writer(&mut line, &snap).expect("serialise");
        });
        row.note = format!("{} B", line.len());
        rows.push(row);
        print_rows("### Hot: each monitor back to back for 2 s", &rows);
    }

    if parts.contains("a") {
        let mut sampler = Sampler::new(available.clone());
        let (mut line, mut buf) = (Vec::with_capacity(1 << 20), Vec::with_capacity(1 << 20));
        let mut acts = vec![
            Activity::new("fraglab Sampler: all monitors + JSON line", || {
                sample_to_json(&mut sampler, &mut line);
            }),
            Activity::new(format!("reference: bare read of the same {} files", all_files.len()), || {
                bare_read(&all_files, &mut buf);
            }),
            Activity::new("reference: `cat FILES > /dev/null`, spawned", || {
                let st = Command::new("cat").args(&all_files).stdout(Stdio::null()).status().expect("cat");
                assert!(st.success());
            }),
        ];
        let mut per_monitor: Vec<Activity> = Vec::new();
        for &m in &available {
            per_monitor.push(Activity::new(format!("{} read + parse", m.name()), move || {
                Snapshot::take(&BTreeSet::from([m])).expect("snapshot");
            }));
            let mut buf = Vec::with_capacity(1 << 20);
            per_monitor.push(Activity::new(format!("{} bare read", m.name()), move || {
                bare_read(files(m), &mut buf);
            }));
        }
        let split = acts.len();
        acts.extend(per_monitor);
        let series = interleave(Duration::from_secs(1), length, true, &mut acts);
        for a in acts.iter_mut().filter(|a| a.name.starts_with("pagetypeinfo")) {
            a.note = walk_fit(&a.points);
        }
        let per_monitor = acts.split_off(split);
        let mut top = rows(&series, acts);
        if let Some(bin) = fraglab_binary() {
            let dur = format!("{seconds}s");
            top.push(real_binary(
                &bin,
                "`fraglab probe --watch 1s` (own window, after)",
                &["--watch", "1s", "--duration", &dur],
            ));
        }
        let (lo, hi) = series.free_blocks;
        print_rows(
            &format!("### (a) every monitor at 1 Hz ({} ticks, {lo}–{hi} free blocks)", series.ticks),
            &top,
        );
        print_rows("### (a) per monitor, same ticks", &rows(&series, per_monitor));
    }

    if parts.contains("b") {
        let mut sampler = Sampler::new(BTreeSet::from([Monitor::Buddyinfo]));
        let (mut line, mut buf) = (Vec::with_capacity(1 << 16), Vec::with_capacity(1 << 16));
        let mut size = 0;
        let mut acts = vec![
            Activity::new("fraglab Sampler: buddyinfo + indices + JSON line", || {
                size = sample_to_json(&mut sampler, &mut line);
            }),
            Activity::new("reference: bare open/read/close of /proc/buddyinfo", || {
                bare_read(&["/proc/buddyinfo"], &mut buf);
            }),
        ];
        let series = interleave(Duration::from_millis(10), length, false, &mut acts);
        let in_acts = acts.iter().fold(Cpu::default(), |sum, a| sum.plus(a.cpu));
        acts[1].note = "no parsing".into();
        let mut rows = rows(&series, acts);
        rows[0].note = format!("{size} B per JSON line");
        // What the 100 Hz schedule costs by itself: sleeping, the timer, waking up.
        let mut tick = Row::new(
            "the 100 Hz tick itself (sleep, timer, wake-up)",
            series.wall,
            series.cpu.minus(in_acts),
            Vec::new(),
        );
        tick.samples = series.ticks;
        tick.note = "series CPU minus the activities'; paid once per tick by any 100 Hz sampler".into();
        rows.push(tick);
        if let Some(bin) = fraglab_binary() {
            let dur = format!("{seconds}s");
            let args = ["--monitors", "buddyinfo", "--watch", "10ms", "--duration", &dur];
            rows.push(real_binary(
                &bin,
                "`fraglab probe --monitors buddyinfo --watch 10ms` (own window, after)",
                &args,
            ));
        }
        print_rows(&format!("### (b) buddyinfo alone at 100 Hz ({} ticks)", series.ticks), &rows);
    }

    if parts.contains("f") && fragment_mib > 0 {
        let before = free_blocks();
        let t = Instant::now();
        let held = Fragmented::new(fragment_mib);
        println!(
            "\n{} MiB touched, every second page freed ({fragment_mib} MiB) in {:.1} s: free blocks {before} -> {}",
            2 * fragment_mib,
            t.elapsed().as_secs_f64(),
            free_blocks()
        );
        let mut acts: Vec<Activity> = available
            .iter()
            .map(|&m| {
                Activity::new(format!("{} read + parse", m.name()), move || {
                    Snapshot::take(&BTreeSet::from([m])).expect("snapshot");
                })
            })
            .collect();
        let series = interleave(Duration::from_secs(1), length, true, &mut acts);
        for a in acts.iter_mut().filter(|a| a.name.starts_with("pagetypeinfo")) {
            a.note = walk_fit(&a.points);
        }
        drop(held);
        let (lo, hi) = series.free_blocks;
        print_rows(&format!("### (f) per monitor at 1 Hz, {fragment_mib} MiB freed as order-0 pages ({lo}–{hi} free blocks)"), &rows(&series, acts));
        println!("\nreleased: {} free blocks", free_blocks());
    }
    println!("\nload average at the end: {}", loadavg());
}
