//! Benchmark, not a test (never run in CI): how long fraglab takes to reach a max-free-order target,
//! side by side with the physical limit (populate only) and the naive every-other-page method.
//!
//! ```text
//! sudo cargo run --release -p fraglab-fragmenter --example fragment_bench -- --sizes 4GiB,8GiB --repeat 3
//! ```
//!
//! For each size and repetition, one after the other, each giving its memory back before the next
//! (each repetition starts with the next variant in turn: on a VM that hands freed memory back to
//! its host, whichever runs first after a pause touches colder memory):
//! - `populate`: mmap anonymous + MADV_NOHUGEPAGE + MADV_POPULATE_WRITE ([`Arena::populate`], in the
//!   fragmenter's 64 MiB chunks) on one thread, then drop — the reference;
//! - `populate-all`: the same with fraglab's pool of one worker per CPU ([`Pool`]), no pagemap read,
//!   no lock — the machine's limit for taking the memory;
//! - `fraglab`: [`Fragmenter::start`] with `Target::MaxFreeOrder { order: 4, free_bytes: size/16*15 }`,
//!   budget = size, pin mlock; timed until `start` returns (settling included), split by the
//!   [`Progress`] callbacks;
//! - `whole` (only with `--sizes whole`, for a qemu guest): the same without a budget — all of
//!   MemAvailable above fraglab's default reserve, then the keeper's rings take the reserve's
//!   high-order blocks — beside `populate` and `populate-all` of that much;
//! - `whole-fill`: `whole` with `keep = false`, so order-0 pipe pages break the reserve's blocks up
//!   instead: the method before the rings, whose pages come out of the cut's small blocks;
//! - `naive`: populate the same way, then `madvise(MADV_DONTNEED)` on every other page, one call per
//!   page (munmap per page would split the mapping into one VMA per page and stop at
//!   vm.max_map_count), then the wait fraglab uses without PFNs: buddyinfo the same twice 200 ms
//!   apart, or 3 s.
//!
//! After the tables: fraglab's median over each populate median, and with two sizes or more a
//! least-squares line of each variant's medians (seconds = a + b × GiB, r²).
//!
//! Between variants the per-CPU free lists are drained and buddyinfo settles, so each starts alike.
//! Budget mode may take up to 4× the budget to find whole aligned regions; `--max-take` (default
//! 8 GiB) caps every variant, and `--keep` (default 4 GiB) is MemAvailable never taken.
//!
//! Needs root (pagemap PFNs, mlock, sysctls). Sysctls go through a journal in a private run dir
//! (default /tmp/fraglab-bench), so they are restored on exit, on Ctrl-C, and — after a SIGKILL — by
//! the next run of this benchmark. The sysctls are machine-wide: before each variant it waits until
//! no other fragmenter (a fraglab test in its own run dir) holds them, and reports runs one overlapped.
//! Prints markdown tables on stdout, progress on stderr. Results: docs/benchmarks.md.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fraglab_fragmenter::arena::page_floor;
use fraglab_fragmenter::arena::{Arena, PAGE_SIZE};
use fraglab_fragmenter::fragment::{
    default_reserve, max_freeable, mem_available, Fragmenter, Pin, Plan, Progress,
};
use fraglab_fragmenter::instance::{Instance, RUN_DIR};
use fraglab_fragmenter::populate::{self, Pool};
use fraglab_fragmenter::shape;
use fraglab_fragmenter::sysctl::{self, Journal};
use fraglab_fragmenter::Target;
use fraglab_probe::buddyinfo::BuddyInfo;
use memmap2::{MmapMut, MmapOptions};

/// Populate in the same steps as the fragmenter, checking MemAvailable before each.
const CHUNK: usize = 64 << 20;

/// What a fragmenter changes: the whole-machine variant also sets the DMA zone's lowmem reserve.
const WATCHED: [&str; 4] = [
    "vm.compact_unevictable_allowed",
    "vm.percpu_pagelist_high_fraction",
    "vm.compaction_proactiveness",
    "vm.lowmem_reserve_ratio",
];

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

const USAGE: &str = "usage: fragment_bench [--sizes 4GiB,8GiB | --sizes whole] [--repeat 3] [--order 4] [--keep 4GiB] \
                     [--max-take 8GiB] [--run-dir /tmp/fraglab-bench] \
                     [--variants populate,populate-all,fraglab,naive | populate,populate-all,whole,whole-fill] [--no-warmup] \
                     [--compact] [--force]";

struct Args {
    sizes: Vec<u64>,
    repeat: usize,
    order: usize,
    /// MemAvailable that every variant leaves untouched.
    keep: u64,
    /// The most memory any variant may take. fraglab's budget mode takes up to 4× its budget to find
    /// whole aligned regions; this caps it through the reserve.
    max_take: u64,
    run_dir: PathBuf,
    variants: Vec<Variant>,
    /// Populate the largest size once, unmeasured, before anything is timed.
    warmup: bool,
    /// `echo 1 > /proc/sys/vm/compact_memory` before each variant (untimed).
    compact: bool,
    /// Run even though the fragmenter sysctls are not at their kernel defaults.
    force: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Populate,
    PopulateAll,
    Fraglab,
    Whole,
    /// The whole machine with `keep = false`: the reserve's high-order blocks broken up by the
    /// order-0 pipe fill instead of the keeper's rings — the method before the rings, for reference.
    WholeFill,
    Naive,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Populate => "populate only",
            Variant::PopulateAll => "populate only, every CPU",
            Variant::Fraglab => "fraglab",
            Variant::Whole => "fraglab, whole machine",
            Variant::WholeFill => "fraglab, whole machine, pipe fill",
            Variant::Naive => "naive (every other page)",
        }
    }
}

fn parse_size(t: &str) -> Result<u64> {
    let t = t.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().with_context(|| format!("{t:?} is not a size (write e.g. 512MiB, 4GiB)"))?;
    let shift = match unit {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => bail!("{t:?}: unknown unit {unit:?}; use B, KiB, MiB or GiB"),
    };
    Ok(n << shift)
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        sizes: vec![4 << 30, 8 << 30],
        repeat: 3,
        order: 4,
        keep: 4 << 30,
        max_take: 8 << 30,
        run_dir: PathBuf::from("/tmp/fraglab-bench"),
        variants: vec![Variant::Populate, Variant::Fraglab, Variant::Naive],
        warmup: true,
        compact: false,
        force: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--no-warmup" => {
                a.warmup = false;
                continue;
            }
            "--compact" => {
                a.compact = true;
                continue;
            }
            "--force" => {
                a.force = true;
                continue;
            }
            _ => {}
        }
        let value = it.next().with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--sizes" if value == "whole" => a.sizes.clear(),
            "--sizes" => a.sizes = value.split(',').map(parse_size).collect::<Result<_>>()?,
            "--repeat" => a.repeat = value.parse().context("--repeat")?,
            "--order" => a.order = value.parse().context("--order")?,
            "--keep" => a.keep = parse_size(&value)?,
            "--max-take" => a.max_take = parse_size(&value)?,
            "--run-dir" => a.run_dir = value.into(),
            "--variants" => {
                a.variants = value
                    .split(',')
                    .map(|v| match v {
                        "populate" => Ok(Variant::Populate),
                        "populate-all" => Ok(Variant::PopulateAll),
                        "fraglab" => Ok(Variant::Fraglab),
                        "whole" => Ok(Variant::Whole),
                        "whole-fill" => Ok(Variant::WholeFill),
                        "naive" => Ok(Variant::Naive),
                        _ => bail!(
                            "--variants: unknown {v:?}; use populate, populate-all, fraglab, whole, whole-fill, naive"
                        ),
                    })
                    .collect::<Result<_>>()?
            }
            _ => bail!("unknown flag {flag:?}\n{USAGE}"),
        }
    }
    if a.repeat == 0 || a.sizes.iter().any(|&s| s < (16 << 20) || s > a.max_take) {
        bail!("--repeat must be ≥ 1 and every size within 16MiB ..= --max-take\n{USAGE}");
    }
    if a.sizes.is_empty() != a.variants.iter().any(|v| matches!(v, Variant::Whole | Variant::WholeFill)) {
        bail!("the whole variant takes every free byte above the reserve: give it with --sizes whole, and only then\n{USAGE}");
    }
    Ok(a)
}

/// One measured run of one variant.
struct Run {
    variant: Variant,
    size: u64,
    taken: u64,
    /// fraglab: taken only to find whole regions, given back after the cut.
    surplus: u64,
    freed: u64,
    /// Time to target: populate + shape + settle.
    total: Duration,
    populate: Duration,
    cut: Option<Duration>,
    free: Option<Duration>,
    settle: Option<Duration>,
    /// Whole machine: the pipe fill or the keeper's rings taking the reserve's high-order blocks
    /// (inside `settle`'s span, which runs to the end).
    fill: Option<Duration>,
    release: Duration,
    before: Vec<u64>,
    populated: Vec<u64>,
    after: Vec<u64>,
    /// fraglab: planned, intact, missing bytes, moved pages.
    planned: Vec<u64>,
    intact: Vec<u64>,
    missing_bytes: u64,
    /// naive: free blocks the freed pages form among themselves, from their PFNs.
    model: Vec<u64>,
    /// Pages in the per-CPU free lists (invisible to buddyinfo) right after populating / shaping.
    pcp_populated: u64,
    pcp_after: u64,
}

impl Run {
    fn new(variant: Variant, size: u64, before: Vec<u64>) -> Self {
        Run {
            variant,
            size,
            taken: 0,
            surplus: 0,
            freed: 0,
            total: Duration::ZERO,
            populate: Duration::ZERO,
            cut: None,
            free: None,
            settle: None,
            fill: None,
            release: Duration::ZERO,
            populated: before.clone(),
            after: before.clone(),
            before,
            planned: Vec::new(),
            intact: Vec::new(),
            missing_bytes: 0,
            model: Vec::new(),
            pcp_populated: 0,
            pcp_after: 0,
        }
    }

    /// Free blocks per order gained by shaping (after − populated).
    fn delta(&self) -> Vec<i64> {
        self.after.iter().zip(&self.populated).map(|(&a, &p)| a as i64 - p as i64).collect()
    }
}

/// Free blocks per order, summed over every zone.
fn totals(b: &BuddyInfo) -> Vec<u64> {
    let mut t = vec![0u64; b.nr_orders()];
    for z in &b.zones {
        for (o, n) in z.free.iter().enumerate() {
            t[o] += n;
        }
    }
    t
}

fn buddy() -> Result<Vec<u64>> {
    Ok(totals(&BuddyInfo::read()?))
}

/// fraglab's settle rule without PFNs (no planned blocks to check): buddyinfo stops changing for
/// 200 ms, or 3 s pass.
fn settle() -> Result<Vec<u64>> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = buddy()?;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = buddy()?;
        if now == last || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// Free pages parked in the per-CPU lists of every zone (`count:` under `pagesets` in zoneinfo).
fn pcp_pages() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/zoneinfo").context("cannot read /proc/zoneinfo")?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("count:"))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum())
}

/// Between variants: empty the per-CPU lists and let buddyinfo settle, so every variant starts alike.
/// Left alone, the lists keep hundreds of MiB of the previous variant's freed pages (their `high` is
/// autotuned up while a process frees a lot, and decays slowly), which the next populate would take
/// first. They are drained the way fraglab does it — a huge `vm.percpu_pagelist_high_fraction`
/// shrinks `high` and the vmstat worker trims the lists within a second or two — and the sysctl is
/// put back at once through the journal.
fn quiesce(run_dir: &Path) -> Result<()> {
    let mut journal = Journal::create(run_dir)?;
    journal.set("vm.percpu_pagelist_high_fraction", "100000")?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while pcp_pages()? > 2048 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    journal.restore()?;
    settle()?;
    Ok(())
}

fn watched() -> Result<Vec<String>> {
    WATCHED.iter().map(|s| sysctl::read(s)).collect()
}

/// The sysctls are machine-wide and every fragmenter journals what it finds: two at once record
/// each other's values as originals, and whichever restores last leaves them changed. Before each
/// variant, wait (up to 15 min) until the watched sysctls have been back at the values found at the
/// start for 3 s: another fragmenter — a fraglab test in its own run dir — is then done.
fn wait_for_others(found: &[String]) -> Result<Duration> {
    let t = Instant::now();
    if watched()? == found {
        return Ok(Duration::ZERO);
    }
    let mut clear = 0;
    while clear < 3 && !STOP.load(Ordering::Relaxed) {
        if t.elapsed() > Duration::from_secs(900) {
            bail!("another fragmenter has held the sysctls for 15 min: {WATCHED:?} = {:?}", watched()?);
        }
        std::thread::sleep(Duration::from_secs(1));
        clear = if watched()? == found { clear + 1 } else { 0 };
    }
    Ok(t.elapsed())
}

fn check_room(size: u64, keep: u64) -> Result<()> {
    let avail = mem_available()?;
    if avail < size + keep {
        bail!(
            "MemAvailable is {} MiB: {} MiB + the {} MiB kept free do not fit; lower --sizes",
            avail >> 20,
            size >> 20,
            keep >> 20
        );
    }
    Ok(())
}

/// Refuse to race a holding `fraglab`: the sysctls are global.
fn check_no_fraglab_holding() -> Result<()> {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(PathBuf::from(RUN_DIR).join("lock")) else { return Ok(()) };
    // SAFETY: flock on a descriptor we own; it is dropped (and the lock with it) at once.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!("a fraglab is holding memory ({RUN_DIR}/lock is locked): `fraglab release` it first");
    }
    Ok(())
}

/// Populate `size` on this thread. With `upto` (whole machine), stop where fraglab stops, at a step
/// that MemAvailable cannot give above `keep`; otherwise that is an error.
fn populate_only(size: u64, keep: u64, upto: bool) -> Result<Run> {
    let run = Run::new(Variant::Populate, size, buddy()?);
    let t0 = Instant::now();
    let mut arena = Arena::default();
    while arena.bytes() < size {
        let step = CHUNK.min((size - arena.bytes()) as usize);
        if mem_available()? < keep + step as u64 {
            if upto {
                break;
            }
            bail!("MemAvailable fell to the --keep line while populating; stopped");
        }
        arena.populate(step)?;
    }
    populated(run, t0, arena)
}

/// A populate-only run's record once `arena` holds what it took since `t0`; the release is timed.
fn populated(mut run: Run, t0: Instant, arena: Arena) -> Result<Run> {
    run.populate = t0.elapsed();
    run.total = run.populate;
    run.taken = arena.bytes();
    run.populated = buddy()?;
    run.after = run.populated.clone();
    run.pcp_populated = pcp_pages()?;
    run.pcp_after = run.pcp_populated;
    let t = Instant::now();
    drop(arena);
    run.release = t.elapsed();
    Ok(run)
}

/// Populate only, with fraglab's pool of one worker per CPU (no pagemap read, no lock): the physical
/// limit of taking the memory with the whole machine.
fn populate_all(size: u64, keep: u64, upto: bool) -> Result<Run> {
    let run = Run::new(Variant::PopulateAll, size, buddy()?);
    let t0 = Instant::now();
    let mut arena = Arena::default();
    let mut pool = Pool::new(populate::workers(), false, false, None)?;
    let mut handed = 0u64;
    loop {
        if handed < size && pool.idle() {
            let step = CHUNK.min((size - handed) as usize);
            if mem_available()? < keep + step as u64 + pool.in_flight_bytes() {
                // What is in flight may not show in MemAvailable yet: take it in and look again;
                // with nothing in flight the line is reached.
                if pool.in_flight_bytes() == 0 {
                    if upto {
                        break;
                    }
                    bail!("MemAvailable fell to the --keep line while populating; stopped");
                }
            } else {
                pool.send(step);
                handed += step as u64;
                continue;
            }
        }
        match pool.recv() {
            Some(t) => {
                arena.adopt(t?.map);
            }
            None => break,
        }
    }
    drop(pool);
    populated(run, t0, arena)
}

fn fraglab(size: u64, args: &Args, nr_orders: usize, variant: Variant) -> Result<Run> {
    let whole = matches!(variant, Variant::Whole | Variant::WholeFill);
    let min_free = sysctl::read("vm.min_free_kbytes")?.parse::<u64>()? * 1024;
    // For order 4: size/16*15, the most a max-free-order cut can free (one page of every 16 kept).
    let free_bytes = max_freeable(size / PAGE_SIZE as u64, args.order) * PAGE_SIZE as u64;
    let plan = Plan {
        target: Target::MaxFreeOrder { order: args.order, free_bytes },
        budget: (!whole).then_some(size),
        pin: Pin::Mlock,
        // Whatever fraglab may take beyond the budget stays within --max-take: the reserve it never
        // goes below is set so that MemAvailable − reserve is the cap (as of now). The whole machine
        // keeps fraglab's default reserve, as `fraglab fragment` without --budget does.
        reserve: if whole {
            default_reserve()?
        } else {
            args.keep.max(mem_available()?.saturating_sub(args.max_take.min(4 * size).max(size)))
        },
        reserve_for: None,
        floor: 2 * min_free,
        no_proactive_compaction: false,
        nr_orders,
        keep: variant != Variant::WholeFill,
        place: Default::default(),
        page_reporting: fraglab_probe::page_reporting::PageReporting::read().unwrap(),
    };
    let mut run = Run::new(variant, size, buddy()?);
    // fraglab has shrunk the per-CPU lists by the time it has populated; this is the count before.
    run.pcp_populated = pcp_pages()?;
    let journal = Journal::create(&args.run_dir)?;
    let (mut cutting, mut freeing, mut settling, mut filling) = (None, None, None, None);
    let t0 = Instant::now();
    let f = Fragmenter::start(
        plan,
        journal,
        &mut |p| match p {
            Progress::Cutting => cutting = Some(Instant::now()),
            Progress::Freeing { .. } => freeing = Some(Instant::now()),
            Progress::Settling => settling = Some(Instant::now()),
            Progress::Filling { .. } | Progress::Rebreaking { .. } => {
                filling.get_or_insert_with(Instant::now);
            }
            _ => {}
        },
        &std::sync::atomic::AtomicBool::new(false),
    )?;
    let end = Instant::now();
    let (cutting, freeing, settling) = (
        cutting.context("no Cutting progress")?,
        freeing.context("no Freeing progress")?,
        settling.context("no Settling progress")?,
    );
    run.total = end - t0;
    run.populate = cutting - t0;
    run.cut = Some(freeing - cutting);
    run.free = Some(settling - freeing);
    run.settle = Some(end - settling);
    run.fill = filling.map(|t| end - t);
    let s = f.status();
    eprint!("[{}] ", s.bounds.join("; "));
    // Whole machine: how much of the cut the reserve's high-order blocks cost (pipe pages come
    // from the smallest free blocks, the cut's; rings of a block's order cannot).
    if whole {
        let (planned, intact): (u64, u64) = (s.planned.iter().sum(), s.intact.iter().sum());
        eprint!(
            "[planned blocks intact {intact} of {planned} ({:.2} %); pipe fill {} MiB; rings {} MiB; \
             left at order ≥ {}: {} pages] ",
            100.0 * intact as f64 / planned.max(1) as f64,
            s.fill_bytes >> 20,
            s.keeping.as_ref().map_or(0, |k| k.added_bytes) >> 20,
            args.order,
            s.leftover_pages.unwrap_or(0)
        );
    }
    run.taken = s.held_bytes + s.freed_bytes + s.surplus_bytes;
    run.surplus = s.surplus_bytes;
    run.freed = s.freed_bytes;
    run.populated = totals(&s.buddyinfo_populated);
    run.after = totals(&s.buddyinfo_now);
    run.planned = s.planned.clone();
    run.intact = s.intact.clone();
    run.missing_bytes = s.missing_bytes;
    run.pcp_after = pcp_pages()?;
    let t = Instant::now();
    f.release()?;
    run.release = t.elapsed();
    Ok(run)
}

/// The method from the netdev seed: take memory, free every other page one call at a time.
fn naive(size: u64, keep: u64, nr_orders: usize) -> Result<Run> {
    let mut run = Run::new(Variant::Naive, size, buddy()?);
    let t0 = Instant::now();
    let mut maps: Vec<MmapMut> = Vec::new();
    let mut taken = 0u64;
    while taken < size {
        let len = CHUNK.min((size - taken) as usize);
        if mem_available()? < keep + len as u64 {
            bail!("MemAvailable fell to the --keep line while populating; stopped");
        }
        let mut map = MmapOptions::new().len(len).map_anon()?;
        map.advise(memmap2::Advice::NoHugePage)?;
        // SAFETY: the range is exactly our fresh mapping.
        if unsafe { libc::madvise(map.as_mut_ptr().cast(), len, libc::MADV_POPULATE_WRITE) } != 0 {
            return Err(std::io::Error::last_os_error()).context("madvise(MADV_POPULATE_WRITE)");
        }
        taken += len as u64;
        maps.push(map);
    }
    run.populate = t0.elapsed();
    run.taken = taken;

    // Outside the timing: where the pages to be freed are, to model what they can merge into.
    let me = procfs::process::Process::myself()?;
    let mut pagemap = me.pagemap()?;
    let mut freed_pfns = Vec::with_capacity((size / PAGE_SIZE as u64 / 2) as usize);
    for m in &maps {
        let first = m.as_ptr() as usize / PAGE_SIZE;
        let infos = pagemap.get_range_info(first..first + m.len() / PAGE_SIZE)?;
        for info in infos.into_iter().step_by(2) {
            if let procfs::process::PageInfo::MemoryPage(f) = info {
                freed_pfns.push(f.get_page_frame_number().0);
            }
        }
    }
    run.model = shape::buddy_blocks(&freed_pfns, nr_orders);
    drop(freed_pfns);
    run.populated = buddy()?;
    run.pcp_populated = pcp_pages()?;

    let t = Instant::now();
    let mut freed = 0u64;
    for m in &mut maps {
        let base = m.as_mut_ptr();
        for off in (0..m.len()).step_by(2 * PAGE_SIZE) {
            // SAFETY: one page of our own mapping; nothing reads it afterwards.
            if unsafe { libc::madvise(base.add(off).cast(), PAGE_SIZE, libc::MADV_DONTNEED) } != 0 {
                return Err(std::io::Error::last_os_error()).context("madvise(MADV_DONTNEED)");
            }
            freed += PAGE_SIZE as u64;
        }
    }
    let freed_at = Instant::now();
    run.free = Some(freed_at - t);
    run.after = settle()?;
    let end = Instant::now();
    run.settle = Some(end - freed_at);
    run.pcp_after = pcp_pages()?;
    run.total = end - t0;
    run.freed = freed;
    let t = Instant::now();
    drop(maps);
    run.release = t.elapsed();
    Ok(run)
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

fn gib(b: u64) -> String {
    if b % (1 << 30) == 0 {
        format!("{} GiB", b >> 30)
    } else {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// `median (min–max)` of a duration over repetitions, in seconds.
fn spread(mut v: Vec<Duration>) -> String {
    if v.is_empty() {
        return "—".into();
    }
    v.sort();
    let med = v[v.len() / 2];
    if v.len() == 1 {
        secs(med)
    } else {
        format!("{} ({}–{})", secs(med), secs(v[0]), secs(v[v.len() - 1]))
    }
}

fn report(runs: &[Run], args: &Args, sizes: &[u64], nr_orders: usize) {
    let k = args.order;
    println!("\n### Time to target (seconds: median (min–max) of {} runs)\n", args.repeat);
    println!(
        "| size | variant | time to target | populate | pagemap + cut | free | settle + check | of which fill | release |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &size in sizes {
        for &v in &args.variants {
            let rs: Vec<&Run> = runs.iter().filter(|r| r.size == size && r.variant == v).collect();
            if rs.is_empty() {
                continue;
            }
            let col = |f: &dyn Fn(&Run) -> Option<Duration>| spread(rs.iter().filter_map(|r| f(r)).collect());
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                gib(size),
                v.name(),
                col(&|r| Some(r.total)),
                col(&|r| Some(r.populate)),
                col(&|r| r.cut),
                col(&|r| r.free),
                col(&|r| r.settle),
                col(&|r| r.fill),
                col(&|r| Some(r.release)),
            );
        }
    }
    ratios_and_fit(runs, args, sizes);

    println!("\n### Free-block profile (last run of each)\n");
    println!(
        "Δ = free blocks per order in /proc/buddyinfo (all zones) after shaping minus right after \
         populating. fraglab target: no free block of order ≥ {k}."
    );
    let orders: Vec<String> = (0..nr_orders).map(|o| format!("Δ o{o}")).collect();
    println!(
        "\n| size | variant | taken | freed | largest order grown | free pages ≥ o{k} Δ | per-CPU lists \
         (pages, before → after) | {} |",
        orders.join(" | ")
    );
    println!("|---|---|---|---|---|---|---|{}", "---|".repeat(nr_orders));
    for &size in sizes {
        for &v in &args.variants {
            let Some(r) = runs.iter().rev().find(|r| r.size == size && r.variant == v) else { continue };
            if matches!(v, Variant::Populate | Variant::PopulateAll) {
                // Nothing is shaped: show what taking the memory cost the machine instead.
                let lost: Vec<String> = r
                    .populated
                    .iter()
                    .zip(&r.before)
                    .map(|(&p, &b)| format!("{:+}", p as i64 - b as i64))
                    .collect();
                println!(
                    "| {} | {} (Δ = populated − before) | {} | — | — | {:+} | {} | {} |",
                    gib(size),
                    v.name(),
                    gib(r.taken),
                    pages_at_or_above(&r.populated, k) as i64 - pages_at_or_above(&r.before, k) as i64,
                    r.pcp_after,
                    lost.join(" | ")
                );
                continue;
            }
            let d = r.delta();
            let grown = d.iter().rposition(|&n| n > 0).map_or("none".into(), |o| o.to_string());
            println!(
                "| {} | {} | {} | {} | {} | {:+} | {} → {} | {} |",
                gib(size),
                v.name(),
                if r.surplus > 0 {
                    format!("{} ({} surplus given back)", gib(r.taken), gib(r.surplus))
                } else {
                    gib(r.taken)
                },
                mib(r.freed),
                grown,
                pages_at_or_above(&r.after, k) as i64 - pages_at_or_above(&r.populated, k) as i64,
                r.pcp_populated,
                r.pcp_after,
                d.iter().map(|n| format!("{n:+}")).collect::<Vec<_>>().join(" | ")
            );
        }
    }

    println!("\n### fraglab: planned vs intact (last run of each size and variant)\n");
    println!("| size | variant | order | planned | intact | intact % |");
    println!("|---|---|---|---|---|---|");
    for (&size, v) in
        sizes.iter().flat_map(|s| [Variant::Fraglab, Variant::Whole, Variant::WholeFill].map(|v| (s, v)))
    {
        let Some(r) = runs.iter().rev().find(|r| r.size == size && r.variant == v) else {
            continue;
        };
        for o in 0..r.planned.len() {
            if r.planned[o] > 0 {
                println!(
                    "| {} | {} | {o} | {} | {} | {:.2} |",
                    gib(size),
                    v.name(),
                    r.planned[o],
                    r.intact[o],
                    100.0 * r.intact[o] as f64 / r.planned[o] as f64
                );
            }
        }
        println!(
            "| {} | {} | missing | {} asked for but not cuttable ({:.3} % of the target) | | |",
            gib(size),
            v.name(),
            mib(r.missing_bytes),
            100.0 * r.missing_bytes as f64 / (r.freed + r.missing_bytes).max(1) as f64
        );
    }

    if runs.iter().any(|r| r.variant == Variant::Naive) {
        println!("\n### naive: what the freed pages could form among themselves (from their PFNs)\n");
        println!("| size | {} |", (0..nr_orders).map(|o| format!("o{o}")).collect::<Vec<_>>().join(" | "));
        println!("|---|{}", "---|".repeat(nr_orders));
        for &size in sizes {
            if let Some(r) = runs.iter().rev().find(|r| r.size == size && r.variant == Variant::Naive) {
                println!(
                    "| {} | {} |",
                    gib(size),
                    r.model.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" | ")
                );
            }
        }
    }
}

/// Median time to target of one variant at one size.
fn median(runs: &[Run], size: u64, v: Variant) -> Option<f64> {
    let mut t: Vec<f64> =
        runs.iter().filter(|r| r.size == size && r.variant == v).map(|r| r.total.as_secs_f64()).collect();
    t.sort_by(f64::total_cmp);
    t.get(t.len() / 2).copied()
}

/// fraglab's median against each populate-only median, size by size; and, over the sizes, the
/// least-squares line of each variant's medians with its r² — how the cost grows.
fn ratios_and_fit(runs: &[Run], args: &Args, sizes: &[u64]) {
    println!("\n### fraglab against populating alone (ratio of medians)\n");
    println!("| size | fraglab | ÷ populate only (one thread) | ÷ populate only, every CPU |");
    println!("|---|---|---|---|");
    for &size in sizes {
        for v in [Variant::Fraglab, Variant::Whole, Variant::WholeFill] {
            let Some(f) = median(runs, size, v) else { continue };
            let ratio =
                |reference| median(runs, size, reference).map_or("—".into(), |r| format!("{:.2}×", f / r));
            println!(
                "| {} | {} s ({}) | {} | {} |",
                gib(size),
                secs(Duration::from_secs_f64(f)),
                v.name(),
                ratio(Variant::Populate),
                ratio(Variant::PopulateAll)
            );
        }
    }
    if sizes.len() < 2 {
        return;
    }
    println!("\n### Growth: time to target = a + b × size (least squares over the medians)\n");
    println!("| variant | a (s) | b (s per GiB) | r² | GiB/s at the largest size |");
    println!("|---|---|---|---|---|");
    for &v in &args.variants {
        let pts: Vec<(f64, f64)> = sizes
            .iter()
            .filter_map(|&size| median(runs, size, v).map(|t| (size as f64 / (1u64 << 30) as f64, t)))
            .collect();
        if pts.len() < 2 {
            continue;
        }
        let n = pts.len() as f64;
        let (mx, my) = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let syy: f64 = pts.iter().map(|p| (p.1 - my).powi(2)).sum();
        let b = sxy / sxx;
        let a = my - b * mx;
        let r2 = if syy == 0.0 { 1.0 } else { sxy * sxy / (sxx * syy) };
        let last = pts.last().expect("two points at least");
        println!("| {} | {a:.3} | {b:.3} | {r2:.3} | {:.2} |", v.name(), last.0 / last.1);
    }
}

fn pages_at_or_above(t: &[u64], order: usize) -> u64 {
    t.iter().enumerate().skip(order).map(|(o, &n)| n << o).sum()
}

fn main() -> Result<()> {
    let args = parse_args()?;
    if !nix::unistd::geteuid().is_root() {
        bail!("fragment_bench needs root: pagemap PFNs, mlock, sysctls");
    }
    check_no_fraglab_holding()?;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let (_instance, restored) = Instance::acquire(&args.run_dir, "fragment_bench")?;
    for r in restored {
        eprintln!("fragment_bench: restored {r} left by a run that died");
    }
    // Start only while no other fragmenter holds: every fragmenter sets the per-CPU fraction, and
    // with mlock the unevictable switch; their kernel defaults are 0 and 1.
    if !args.force {
        let mut defaults = watched()?;
        defaults[0] = "1".into();
        defaults[1] = "0".into();
        let w = wait_for_others(&defaults)?;
        if w > Duration::ZERO {
            eprintln!("fragment_bench: waited {} s for another fragmenter to finish", w.as_secs());
        }
    }
    let found = watched()?;
    // As fraglab itself: if the OOM killer must choose, it should choose us.
    std::fs::write("/proc/self/oom_score_adj", "1000")?;
    let nr_orders = BuddyInfo::read()?.nr_orders();
    let uname = nix::sys::utsname::uname()?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_total = <procfs::Meminfo as procfs::Current>::current().map(|m| m.mem_total).unwrap_or(0);
    println!(
        "fragment_bench: {} {}, {cpus} CPUs, MemTotal {}, MemAvailable {} at start; order {}; {} repeats",
        uname.sysname().to_string_lossy(),
        uname.release().to_string_lossy(),
        gib_f(mem_total),
        gib_f(mem_available()?),
        args.order,
        args.repeat
    );

    // Whole machine: every variant takes what fraglab would, MemAvailable above its default reserve.
    let (sizes, keep) = if args.sizes.is_empty() {
        let reserve = default_reserve()?;
        let size = page_floor(mem_available()?.saturating_sub(reserve));
        println!("whole machine: MemAvailable − reserve ({}) = {}", gib(reserve), gib(size));
        (vec![size], reserve)
    } else {
        (args.sizes.clone(), args.keep)
    };
    if args.warmup {
        // The first touch of memory can cost far more than later ones (a kernel that initialises
        // struct pages lazily, a hypervisor backing guest memory on demand): pay it untimed.
        let largest = *sizes.iter().max().expect("one size at least");
        check_room(largest, keep)?;
        let w = populate_only(largest, keep, args.sizes.is_empty())?;
        println!("warm-up: populated {} once, untimed in the tables: {} s", gib(largest), secs(w.populate));
        quiesce(&args.run_dir)?;
    }

    println!(
        "free blocks per order at the start (all zones): {}",
        buddy()?.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
    );
    let mut runs = Vec::new();
    let mut overlapped = Vec::new();
    let mut waited = Duration::ZERO;
    'all: for &size in &sizes {
        for rep in 0..args.repeat {
            // Each repetition starts with the next variant: on a VM that hands freed memory back to
            // its host (free page reporting), whichever runs first after a pause touches colder memory.
            let mut order = args.variants.clone();
            let first = rep % order.len();
            order.rotate_left(first);
            for &v in &order {
                if STOP.load(Ordering::Relaxed) {
                    eprintln!("fragment_bench: interrupted; restoring and reporting what ran");
                    break 'all;
                }
                waited += wait_for_others(&found)?;
                // Whole machine: MemAvailable moves between runs (a guest's page cache, slab); each
                // run takes what is there above the reserve now, and is listed under the first figure.
                let take = if args.sizes.is_empty() {
                    page_floor(mem_available()?.saturating_sub(keep))
                } else {
                    size
                };
                // A size asked for must fit; a whole-machine take was just read from MemAvailable,
                // which a second read would show a little either way.
                if !args.sizes.is_empty() {
                    check_room(take, keep)?;
                }
                if args.compact {
                    std::fs::write("/proc/sys/vm/compact_memory", "1").context("vm.compact_memory")?;
                    settle()?;
                }
                eprint!("{} {} run {}/{} … ", gib(size), v.name(), rep + 1, args.repeat);
                let run = match v {
                    Variant::Populate => populate_only(take, keep, args.sizes.is_empty())?,
                    Variant::PopulateAll => populate_all(take, keep, args.sizes.is_empty())?,
                    v @ (Variant::Fraglab | Variant::Whole | Variant::WholeFill) => {
                        fraglab(take, &args, nr_orders, v)?
                    }
                    Variant::Naive => naive(take, keep, nr_orders)?,
                };
                let run = Run { size, ..run };
                let clean = watched()? == found;
                eprintln!(
                    "{} s{}",
                    secs(run.total),
                    if clean { "" } else { " (another fragmenter overlapped)" }
                );
                if !clean {
                    overlapped.push(format!("{} {} run {}", gib(size), v.name(), rep + 1));
                }
                runs.push(run);
                quiesce(&args.run_dir)?;
            }
        }
    }

    report(&runs, &args, &sizes, nr_orders);
    println!(
        "\nWaited {} s in all for other fragmenters to finish before variants; runs another fragmenter \
         overlapped: {}",
        waited.as_secs(),
        if overlapped.is_empty() { "none".to_string() } else { overlapped.join(", ") }
    );
    if watched()? != found {
        eprintln!("fragment_bench: the sysctls are not back yet; waiting for the other fragmenter to finish");
        let _ = wait_for_others(&found);
    }
    let now = watched()?;
    println!();
    for ((name, was), is) in WATCHED.iter().zip(&found).zip(&now) {
        println!("after the run: {name} = {is} (found {was}){}", if was == is { "" } else { "  ← CHANGED" });
    }
    if now != found {
        bail!("sysctls differ from what the benchmark found");
    }
    Ok(())
}

fn gib_f(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}
