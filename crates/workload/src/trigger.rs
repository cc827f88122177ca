//! `fraglab workload trigger KIND`: syscalls that make the kernel do one allocation of a known order,
//! so a user can *see* fragmentation bite: unfragmented they succeed, fragmented they fail.
//!
//! Every trigger validates its options before it touches anything, reports the order it asks for
//! (`details.order`), calls, successes, failures by errno and per-call latency, and puts back any
//! sysctl it raised. Sysctls go through their own journal (`trigger.journal` in the run directory),
//! not the fragmenter's: a trigger is meant to run *while* a fragmenter holds memory and the instance
//! lock. A trigger that raises a sysctl holds `trigger.lock` (an flock) for as long as its journal
//! lives; the kernel drops the flock when the process dies, so a journal whose lock is free was left
//! by a dead trigger and [`recover_if_stale`] (run by every `fraglab` command) puts it back.

use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use fraglab_fragmenter::sysctl::{self, Journal, Restored};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::signals::{signal_name, DeferSignals};
use fraglab_results::workload::{latency_histogram, wall_now, Errors, Latency, Rusage, WorkloadResult};
use fraglab_units::{format_size, parse_size};

/// Journal of the sysctls a trigger raised, in the run directory.
pub const JOURNAL: &str = "trigger.journal";
/// flock held by a trigger while its journal lives; machine-wide whatever `--run-dir` says, since the
/// sysctls it guards are. Its content names the holder's pid and run directory (where its journal is).
pub const LOCK_FILE: &str = "/run/fraglab/trigger.lock";

/// sizeof(struct pipe_buffer) on 64-bit: page*, offset, len, ops*, flags (+pad), private.
const PIPE_BUFFER_SIZE: u64 = 40;
/// F_SETPIPE_SZ rounds to a power of two and refuses above 2^31 bytes.
const PIPE_MAX_BYTES: u64 = 1 << 31;
/// sctp_setsockopt() trims optlen to PAGE_ALIGN(USHRT_MAX + sizeof(u16) * sizeof(struct
/// sctp_reset_streams)) = PAGE_ALIGN(65535 + 16) before memdup_sockptr().
const SCTP_OPTLEN_TRIM: u64 = 69632;
const SOL_SCTP: libc::c_int = 132;
const SCTP_SOCKOPT_BINDX_ADD: libc::c_int = 100;
/// IORING_MAX_ENTRIES; sizeof(struct io_uring_sqe).
const IORING_MAX_ENTRIES: u32 = 32768;
const IO_URING_SQE_SIZE: u64 = 64;
/// How long a trigger waits for another trigger's sysctl lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// `fraglab workload trigger <kind>`. In a config: `trigger = "pipe-resize"` beside the options.
#[derive(Debug, Clone, Subcommand, Serialize, Deserialize)]
#[serde(tag = "trigger", rename_all = "kebab-case")]
pub enum Kind {
    /// fcntl(F_SETPIPE_SZ) on a fresh pipe: the kernel kcallocs the pipe_buffer array, order 6/8/9/10
    /// for 16/64/128/256 MiB. Raises fs.pipe-max-size when needed (journaled, restored).
    PipeResize(PipeResizeArgs),
    /// setsockopt(IP_MSFILTER) with a large optlen: order get_order(bytes) (1 MiB = 8). Raises
    /// net.core.optmem_max. EINVAL means the kernel allocated and copied, then rejected the content.
    IpMsfilter(IpMsfilterArgs),
    /// sendmsg() on a UDP socket to 127.0.0.1 with a large control buffer: order get_order(bytes).
    /// Raises net.core.optmem_max. EINVAL: allocated; ENOBUFS: the allocation failed.
    UdpCmsg(UdpCmsgArgs),
    /// Raise vm.nr_hugepages one page at a time: each is an order-9 (2 MiB) block. Restored after.
    Hugetlb(HugetlbArgs),
    /// SCTP setsockopt(SCTP_SOCKOPT_BINDX_ADD): the kernel trims optlen to 69632 (order 5) and
    /// allocates it. Needs a kernel with SCTP.
    SctpBindx(SctpBindxArgs),
    /// io_uring_setup(): order-9 SQ/CQ rings for 32768 entries; the kernel falls back to single pages
    /// when no order-9 block is free, so this one succeeds either way.
    IoUring(IoUringArgs),
}

fn default_repeat() -> u64 {
    10
}
fn default_pipe_bytes() -> String {
    "64MiB".into()
}
fn default_optmem_bytes() -> String {
    "1MiB".into()
}
fn default_sctp_bytes() -> String {
    "64KiB".into()
}
fn default_pages() -> u64 {
    64
}
fn default_entries() -> u32 {
    IORING_MAX_ENTRIES
}

/// A size as configs may write it: `"64MiB"` or a plain number of bytes.
fn size_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Text(String),
        Bytes(u64),
    }
    Ok(match Size::deserialize(d)? {
        Size::Text(t) => t,
        Size::Bytes(b) => b.to_string(),
    })
}

#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipeResizeArgs {
    /// Pipe size to ask for; the kernel rounds it up to a power of two (at most 256MiB: order 10).
    #[arg(long, default_value = "64MiB", value_name = "SIZE")]
    #[serde(default = "default_pipe_bytes", deserialize_with = "size_text")]
    pub bytes: String,
    /// Calls, each on a fresh pipe.
    #[arg(long, default_value_t = default_repeat(), value_name = "N")]
    #[serde(default = "default_repeat")]
    pub repeat: u64,
    /// Leave fs.pipe-max-size alone: without CAP_SYS_RESOURCE the kernel then refuses with EPERM.
    #[arg(long)]
    #[serde(default)]
    pub no_raise: bool,
}

#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpMsfilterArgs {
    /// optlen: the kernel kmallocs this much (1MiB = order 8, at most 4MiB = order 10).
    #[arg(long, default_value = "1MiB", value_name = "SIZE")]
    #[serde(default = "default_optmem_bytes", deserialize_with = "size_text")]
    pub bytes: String,
    /// Calls.
    #[arg(long, default_value_t = default_repeat(), value_name = "N")]
    #[serde(default = "default_repeat")]
    pub repeat: u64,
    /// Leave net.core.optmem_max alone: an optlen above it gets ENOBUFS before any allocation.
    #[arg(long)]
    #[serde(default)]
    pub no_raise: bool,
}

#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UdpCmsgArgs {
    /// Control buffer length: the kernel sock_kmallocs this much (1MiB = order 8, at most 4MiB).
    #[arg(long, default_value = "1MiB", value_name = "SIZE")]
    #[serde(default = "default_optmem_bytes", deserialize_with = "size_text")]
    pub bytes: String,
    /// Calls.
    #[arg(long, default_value_t = default_repeat(), value_name = "N")]
    #[serde(default = "default_repeat")]
    pub repeat: u64,
    /// Leave net.core.optmem_max alone: a buffer above it gets ENOBUFS before any allocation.
    #[arg(long)]
    #[serde(default)]
    pub no_raise: bool,
}

#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HugetlbArgs {
    /// 2 MiB huge pages to ask for, one vm.nr_hugepages write each.
    #[arg(long, default_value_t = default_pages(), value_name = "N")]
    #[serde(default = "default_pages")]
    pub pages: u64,
}

#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SctpBindxArgs {
    /// optlen; the kernel trims it to 69632 bytes (order 5). 64KiB = order 4.
    #[arg(long, default_value = "64KiB", value_name = "SIZE")]
    #[serde(default = "default_sctp_bytes", deserialize_with = "size_text")]
    pub bytes: String,
    /// Calls.
    #[arg(long, default_value_t = default_repeat(), value_name = "N")]
    #[serde(default = "default_repeat")]
    pub repeat: u64,
}

#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoUringArgs {
    /// SQ entries (1..=32768; the kernel rounds up to a power of two). 32768 = order-9 SQE array.
    #[arg(long, default_value_t = default_entries(), value_name = "N")]
    #[serde(default = "default_entries")]
    pub entries: u32,
    /// Calls, each a fresh ring.
    #[arg(long, default_value_t = default_repeat(), value_name = "N")]
    #[serde(default = "default_repeat")]
    pub repeat: u64,
}

impl Kind {
    /// `pipe-resize`, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::PipeResize(_) => "pipe-resize",
            Kind::IpMsfilter(_) => "ip-msfilter",
            Kind::UdpCmsg(_) => "udp-cmsg",
            Kind::Hugetlb(_) => "hugetlb",
            Kind::SctpBindx(_) => "sctp-bindx",
            Kind::IoUring(_) => "io-uring",
        }
    }
}

static RUN_DIR: RwLock<Option<PathBuf>> = RwLock::new(None);

/// Where [`run`] keeps its journal and lock: `fraglab --run-dir` (main sets it), else /run/fraglab.
pub fn set_run_dir(dir: &Path) {
    *RUN_DIR.write().unwrap_or_else(|e| e.into_inner()) = Some(dir.to_path_buf());
}

fn run_dir() -> PathBuf {
    RUN_DIR
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| PathBuf::from(fraglab_fragmenter::instance::RUN_DIR))
}

/// Check options without touching anything: what `fraglab run` does before it fragments.
pub fn validate(kind: &Kind) -> Result<()> {
    plan(kind, &Pages::read()?).map(drop)
}

/// Run one trigger, journaling sysctls in the run directory set by [`set_run_dir`]. The calls stop
/// early when `stop` (the run's stop flag) is raised, as they do on a signal to `fraglab workload`.
pub fn run(kind: &Kind, stop: &AtomicBool) -> Result<WorkloadResult> {
    run_in(kind, &run_dir(), stop)
}

/// Run one trigger with its sysctl journal and lock in `run_dir`.
pub fn run_in(kind: &Kind, run_dir: &Path, stop: &AtomicBool) -> Result<WorkloadResult> {
    // Everything is validated before anything is touched.
    let plan = plan(kind, &Pages::read()?)?;
    // What this kernel lacks is found here, not in plan(): a config naming the kind is valid, and a
    // run gives "could not test" (125) for it rather than refusing the config (255).
    if matches!(plan.call, Call::Hugetlb { .. }) && !sysctl::path("vm.nr_hugepages").exists() {
        return Err(crate::unsupported::Unsupported(
            "this kernel has no hugetlb (no /proc/sys/vm/nr_hugepages): build it with CONFIG_HUGETLBFS"
                .into(),
        )
        .into());
    }
    let params = serde_json::to_value(kind)?;
    execute(plan, params, run_dir, stop)
}

/// What a trigger does, resolved from its options.
struct Plan {
    name: &'static str,
    call: Call,
    repeat: u64,
    order: u32,
    /// The sysctl that limits the call and the value it must have at least.
    limit: Option<(&'static str, u64)>,
    /// Raise `limit` when it is lower (journaled); `--no-raise` leaves it.
    raise: bool,
    details: Vec<(&'static str, serde_json::Value)>,
    notes: Vec<String>,
    /// EINVAL proves the kernel allocated and copied: count it as success.
    einval_is_success: bool,
}

#[derive(Clone, Copy)]
enum Call {
    PipeResize { size: u64 },
    IpMsfilter { bytes: u64 },
    UdpCmsg { bytes: u64 },
    Hugetlb { pages: u64 },
    SctpBindx { bytes: u64 },
    IoUring { entries: u32 },
}

/// The page geometry the orders depend on, read from the running kernel: x86-64 has 4 KiB pages and
/// a largest block of order 10 (4 MiB), arm64 with 64 KiB pages order 13 (512 MiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pages {
    pub page_size: u64,
    /// MAX_PAGE_ORDER: the largest block the buddy allocator has; kmalloc refuses anything larger.
    pub max_order: u32,
    /// The huge page size vm.nr_hugepages allocates (meminfo Hugepagesize).
    pub huge_page_size: u64,
}

impl Pages {
    /// x86-64's, for tests of the arithmetic.
    pub const X86_64: Pages = Pages { page_size: 4096, max_order: 10, huge_page_size: 2 << 20 };

    /// This kernel's: the page size, the number of orders /proc/buddyinfo lists, Hugepagesize.
    pub fn read() -> Result<Pages> {
        let orders = fraglab_probe::buddyinfo::BuddyInfo::read()?.nr_orders();
        let huge_page_size = meminfo()?.hugepagesize.unwrap_or(2 << 20);
        Ok(Pages { page_size: procfs::page_size(), max_order: orders as u32 - 1, huge_page_size })
    }

    /// The page order of a `size`-byte allocation: get_order().
    pub fn order(&self, size: u64) -> u32 {
        let pages = size.div_ceil(self.page_size).max(1);
        pages.next_power_of_two().trailing_zeros()
    }

    /// The order of the pipe_buffer array F_SETPIPE_SZ allocates for `bytes` (one slot a page), and
    /// the pipe size the kernel rounds `bytes` to.
    pub fn pipe_resize_order(&self, bytes: u64) -> (u32, u64) {
        let size = bytes.max(self.page_size).next_power_of_two();
        let slots = size / self.page_size;
        (self.order(slots * PIPE_BUFFER_SIZE), size)
    }

    /// SLUB serves kmalloc() up to two pages from kmalloc-N caches (KMALLOC_SHIFT_HIGH = PAGE_SHIFT
    /// + 1); above that, kmalloc_large() asks the page allocator for a fresh block.
    fn kmalloc_max_cache_size(&self) -> u64 {
        2 * self.page_size
    }

    fn largest_block(&self) -> u64 {
        self.page_size << self.max_order
    }
}

fn size_flag(flag: &str, text: &str) -> Result<u64> {
    let bytes = parse_size(text).map_err(|e| anyhow::anyhow!("--{flag} {text}: {e}"))?;
    if bytes == 0 {
        bail!("--{flag} {text}: must be more than 0 bytes");
    }
    Ok(bytes)
}

fn repeat_flag(repeat: u64) -> Result<u64> {
    if repeat == 0 {
        bail!("--repeat 0: must be at least 1");
    }
    Ok(repeat)
}

fn slab_note(bytes: u64, pages: &Pages) -> Option<String> {
    let max = pages.kmalloc_max_cache_size();
    (bytes <= max).then(|| {
        format!(
            "{bytes} bytes is served from a kmalloc slab cache, not a fresh page-allocator block per call: \
             use more than {max} bytes to exercise the buddy allocator"
        )
    })
}

fn too_big(flag: &str, text: &str, alloc: u64, order: u32, pages: &Pages) -> anyhow::Error {
    anyhow::anyhow!(
        "--{flag} {text}: the kernel would allocate {} (order {order}), above the largest block the buddy \
         allocator has (order {}, {}): it fails every time, fragmented or not",
        format_size(alloc),
        pages.max_order,
        format_size(pages.largest_block())
    )
}

fn plan(kind: &Kind, pages: &Pages) -> Result<Plan> {
    let name = kind.name();
    let mut p = match kind {
        Kind::PipeResize(a) => {
            let bytes = size_flag("bytes", &a.bytes)?;
            let repeat = repeat_flag(a.repeat)?;
            if bytes > PIPE_MAX_BYTES {
                bail!("--bytes {}: F_SETPIPE_SZ takes at most 2GiB", a.bytes);
            }
            let (order, size) = pages.pipe_resize_order(bytes);
            let slots = size / pages.page_size;
            let alloc = slots * PIPE_BUFFER_SIZE;
            if order > pages.max_order {
                return Err(too_big("bytes", &a.bytes, alloc, order, pages));
            }
            let mut notes = vec![format!(
                "F_SETPIPE_SZ {} → {slots} slots × {PIPE_BUFFER_SIZE} B struct pipe_buffer = {alloc} bytes, \
                 kcalloc(GFP_KERNEL_ACCOUNT | __GFP_NOWARN): an order-{order} block, ENOMEM when there is none \
                 (no dmesg warning)",
                format_size(size)
            )];
            notes.extend(slab_note(alloc, pages));
            Plan {
                name,
                call: Call::PipeResize { size },
                repeat,
                order,
                limit: Some(("fs.pipe-max-size", size)),
                raise: !a.no_raise,
                details: vec![
                    ("pipe_bytes", json!(size)),
                    ("nr_slots", json!(slots)),
                    ("alloc_bytes", json!(alloc)),
                ],
                notes,
                einval_is_success: false,
            }
        }
        Kind::IpMsfilter(a) => {
            let bytes = size_flag("bytes", &a.bytes)?;
            let repeat = repeat_flag(a.repeat)?;
            // IP_MSFILTER_SIZE(0): the kernel refuses anything shorter with EINVAL before allocating.
            if bytes < 16 {
                bail!("--bytes {}: IP_MSFILTER needs at least 16 bytes (struct ip_msfilter)", a.bytes);
            }
            let order = pages.order(bytes);
            if order > pages.max_order {
                return Err(too_big("bytes", &a.bytes, bytes, order, pages));
            }
            let mut notes = vec![format!(
                "setsockopt(IP_MSFILTER, optlen {bytes}): memdup_sockptr() = kmalloc(GFP_USER | __GFP_NOWARN), \
                 order {order}; the zeroed filter names no multicast group, so after the copy ip_mc_msfilter() \
                 returns EINVAL — counted as success: the kernel reached the copy. ENOMEM: the allocation \
                 failed. ENOBUFS: optlen above net.core.optmem_max, refused before allocating"
            )];
            notes.extend(slab_note(bytes, pages));
            Plan {
                name,
                call: Call::IpMsfilter { bytes },
                repeat,
                order,
                limit: Some(("net.core.optmem_max", bytes)),
                raise: !a.no_raise,
                details: vec![("alloc_bytes", json!(bytes))],
                notes,
                einval_is_success: true,
            }
        }
        Kind::UdpCmsg(a) => {
            let bytes = size_flag("bytes", &a.bytes)?;
            let repeat = repeat_flag(a.repeat)?;
            // ____sys_sendmsg() keeps a control buffer of up to 36 bytes on its stack.
            if bytes <= 36 {
                bail!("--bytes {}: a control buffer of 36 bytes or less stays on the kernel stack", a.bytes);
            }
            let order = pages.order(bytes);
            if order > pages.max_order {
                return Err(too_big("bytes", &a.bytes, bytes, order, pages));
            }
            let mut notes = vec![format!(
                "sendmsg(msg_controllen {bytes}) to 127.0.0.1: sock_kmalloc(GFP_KERNEL), order {order}; the zeroed \
                 control buffer has no valid cmsghdr, so after the copy the UDP cmsg parser returns EINVAL — \
                 counted as success: the kernel reached the copy. ENOBUFS: the allocation failed (the kernel \
                 also logs \"page allocation failure\" in dmesg) — or the buffer exceeds net.core.optmem_max"
            )];
            notes.extend(slab_note(bytes, pages));
            Plan {
                name,
                call: Call::UdpCmsg { bytes },
                repeat,
                order,
                // sock_kmalloc() wants size + the socket's option memory strictly below optmem_max.
                limit: Some(("net.core.optmem_max", bytes + pages.page_size)),
                raise: !a.no_raise,
                details: vec![("alloc_bytes", json!(bytes))],
                notes,
                einval_is_success: true,
            }
        }
        Kind::Hugetlb(a) => {
            if a.pages == 0 {
                bail!("--pages 0: must be at least 1");
            }
            let total = meminfo()?.mem_total;
            let huge = pages.huge_page_size;
            if a.pages.saturating_mul(huge) > total / 2 {
                bail!(
                    "--pages {}: {} of huge pages is more than half of this machine's {}; ask for at most {}",
                    a.pages,
                    format_size(a.pages.saturating_mul(huge)),
                    format_size(total),
                    total / 2 / huge
                );
            }
            let order = pages.order(huge);
            Plan {
                name,
                call: Call::Hugetlb { pages: a.pages },
                repeat: a.pages,
                order,
                limit: None, // vm.nr_hugepages is journaled by the calls themselves
                raise: false,
                details: vec![("requested_pages", json!(a.pages))],
                notes: vec![if order > pages.max_order {
                    format!(
                        "vm.nr_hugepages is raised one page per write; Hugepagesize is {}, above the buddy \
                         allocator's largest block (order {}): these gigantic pages come from \
                         alloc_contig_range(), not from the free lists fragmentation breaks up, so this \
                         trigger does not measure what the others do",
                        format_size(huge),
                        pages.max_order
                    )
                } else {
                    format!(
                        "vm.nr_hugepages is raised one page per write (each an order-{order} block, \
                         __GFP_RETRY_MAYFAIL: the kernel compacts before giving up); a write succeeds even \
                         when the kernel finds no page, so each page it could not find is counted as ENOMEM"
                    )
                }],
                einval_is_success: false,
            }
        }
        Kind::SctpBindx(a) => {
            let bytes = size_flag("bytes", &a.bytes)?;
            let repeat = repeat_flag(a.repeat)?;
            if bytes > i32::MAX as u64 {
                bail!("--bytes {}: optlen is an int; at most 2GiB - 1", a.bytes);
            }
            let alloc = bytes.min(SCTP_OPTLEN_TRIM);
            let order = pages.order(alloc);
            let mut notes = vec![format!(
                "setsockopt(SCTP_SOCKOPT_BINDX_ADD, optlen {bytes}): the kernel trims optlen to at most \
                 {SCTP_OPTLEN_TRIM} and memdup_sockptr()s {alloc} bytes, order {order}; the zeroed address list \
                 has no valid family, so after the copy sctp_setsockopt_bindx() returns EINVAL — counted as \
                 success: the kernel reached the copy. ENOMEM: the allocation failed"
            )];
            notes.extend(slab_note(alloc, pages));
            Plan {
                name,
                call: Call::SctpBindx { bytes: alloc },
                repeat,
                order,
                limit: None,
                raise: false,
                details: vec![("alloc_bytes", json!(alloc))],
                notes,
                einval_is_success: true,
            }
        }
        Kind::IoUring(a) => {
            let repeat = repeat_flag(a.repeat)?;
            if a.entries == 0 || a.entries > IORING_MAX_ENTRIES {
                bail!("--entries {}: io_uring takes 1 to {IORING_MAX_ENTRIES} entries", a.entries);
            }
            let sq = u64::from(a.entries.next_power_of_two());
            let sqes = sq * IO_URING_SQE_SIZE;
            let order = pages.order(sqes);
            Plan {
                name,
                call: Call::IoUring { entries: a.entries },
                repeat,
                order,
                limit: None,
                raise: false,
                details: vec![("sq_entries", json!(sq)), ("sqe_bytes", json!(sqes))],
                notes: vec![format!(
                    "io_uring_setup({}) asks for an order-{order} block for the {} SQE array (and about as much \
                     for the CQ ring); without one the kernel quietly falls back to single pages, so a call \
                     succeeds fragmented or not — only tracing (kmem:mm_page_alloc order={order}) or buddyinfo \
                     shows which it got",
                    a.entries,
                    format_size(sqes)
                )],
                einval_is_success: false,
            }
        }
    };
    p.details.insert(0, ("order", json!(p.order)));
    Ok(p)
}

/// The result of one call.
enum Outcome {
    Ok,
    /// EINVAL after the kernel allocated and copied: counted as success.
    EinvalAfterAlloc,
    Failed(io::Error),
}

fn execute(
    plan: Plan,
    params: serde_json::Value,
    run_dir: &Path,
    stop: &AtomicBool,
) -> Result<WorkloadResult> {
    let mut notes = plan.notes.clone();
    let mut details: std::collections::BTreeMap<String, serde_json::Value> =
        plan.details.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();

    // Ctrl-C / SIGTERM wait until the sysctls are back; the calls stop at the next one.
    let signals = DeferSignals::block();
    let mut raised: Option<Raised> = None;
    if let Some((name, needed)) = plan.limit {
        let current = read_u64(name)?;
        if current >= needed {
            details.insert("sysctl".into(), json!({ "name": name, "original": current, "unchanged": true }));
        } else if !plan.raise {
            details.insert("sysctl".into(), json!({ "name": name, "original": current, "not_raised": true }));
            notes.push(format!(
                "{name} = {current} is below the {needed} this call needs and was left alone (--no-raise): \
                 expect {}",
                if name == "fs.pipe-max-size" {
                    "EPERM (without CAP_SYS_RESOURCE), before any allocation"
                } else {
                    "ENOBUFS, before any allocation"
                }
            ));
        } else {
            let mut r = Raised::start(run_dir)?;
            if !r.recovered.is_empty() {
                notes.push(format!(
                    "a trigger that died earlier had left sysctls raised; put back: {}",
                    list(&r.recovered)
                ));
            }
            r.journal.set(name, &needed.to_string())?;
            details.insert("sysctl".into(), json!({ "name": name, "original": current, "set_to": needed }));
            raised = Some(r);
        }
    }
    let mut hugepages_total_before = 0;
    if let Call::Hugetlb { .. } = plan.call {
        let r = Raised::start(run_dir)?;
        if !r.recovered.is_empty() {
            notes.push(format!(
                "a trigger that died earlier had left sysctls raised; put back: {}",
                list(&r.recovered)
            ));
        }
        raised = Some(r);
        let original = read_u64("vm.nr_hugepages")?;
        hugepages_total_before = hugepages_total()?;
        details.insert("sysctl".into(), json!({ "name": "vm.nr_hugepages", "original": original }));
        details.insert("hugepages_total_before".into(), json!(hugepages_total_before));
    }

    let start = Instant::now();
    let started = wall_now();
    let rusage0 = Rusage::now();
    let mut errors = Errors::new(start);
    let mut hist = latency_histogram();
    let (mut ok, mut failed, mut einval, mut calls) = (0u64, 0u64, 0u64, 0u64);
    let mut state = CallState::open(plan.call)?;

    let mut interrupted = None;
    let mut stopped = false;
    for _ in 0..plan.repeat {
        if let Some(sig) = signals.pending() {
            interrupted = Some(sig);
            break;
        }
        // Under `fraglab run` the run's handler takes the signal (on another thread) and raises this.
        if stop.load(Ordering::Relaxed) {
            stopped = true;
            break;
        }
        let t = Instant::now();
        let outcome = state.call(raised.as_mut());
        hist.saturating_record(t.elapsed().as_micros() as u64);
        calls += 1;
        match outcome? {
            Outcome::Ok => ok += 1,
            Outcome::EinvalAfterAlloc => {
                ok += 1;
                einval += 1;
            }
            Outcome::Failed(e) => {
                failed += 1;
                errors.record(&e);
            }
        }
    }
    let duration = start.elapsed();
    let rusage = Rusage::now().since(&rusage0);
    drop(state);

    // Put back what was raised before anything else can go wrong.
    if let Some(mut r) = raised.take() {
        let restored = r.journal.restore().context("could not restore the sysctls this trigger raised")?;
        if !restored.is_empty() {
            details
                .insert("restored".into(), json!(restored.iter().map(|r| r.to_string()).collect::<Vec<_>>()));
        }
    }
    if let Call::Hugetlb { pages } = plan.call {
        hugetlb_check_freed(hugepages_total_before, &mut details, &mut notes)?;
        details.insert("obtained_pages".into(), json!(ok));
        if ok < pages {
            notes.push(format!("the kernel found {ok} of {pages} order-{} blocks", plan.order));
        }
    }
    drop(signals); // a deferred Ctrl-C takes effect here, after the restore

    details.insert("calls".into(), json!(calls));
    if plan.einval_is_success {
        details.insert("einval_after_alloc".into(), json!(einval));
        if einval > 0 {
            notes.push(format!(
                "{einval} EINVAL counted as allocation succeeded: the kernel allocated the order-{} buffer and \
                 copied into it before rejecting the content",
                plan.order
            ));
        }
    }
    let secs = duration.as_secs_f64();
    let mut result = WorkloadResult {
        kind: format!("trigger {}", plan.name),
        params,
        started,
        duration_s: secs,
        ok,
        failed,
        bytes: 0,
        throughput_mbit: None,
        ops_per_sec: (secs > 0.0).then(|| calls as f64 / secs),
        per_worker: None,
        latency_us: Latency::of(&hist),
        cpu: None,
        errors: errors.into_vec(),
        rusage,
        skmem: None,
        details,
        notes,
    };
    // Under `fraglab run` the run's handler takes the signal on another thread and raises `stop`, but
    // this thread may see it pending first: the same stop either way.
    if stopped || interrupted.is_some() {
        let by = interrupted.map_or_else(String::new, |sig| format!(" ({} to fraglab)", signal_name(sig)));
        result.mark_stopped(format_args!(
            "{secs:.1} s{by}, {calls} of {} calls; sysctls restored",
            plan.repeat
        ));
    }
    Ok(result)
}

fn list(restored: &[Restored]) -> String {
    restored.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

/// The open file descriptors and buffers the calls reuse.
enum CallState {
    PipeResize { size: u64 },
    IpMsfilter { sock: OwnedFd, buf: Vec<u8> },
    UdpCmsg { sock: OwnedFd, buf: Vec<u8> },
    Hugetlb,
    SctpBindx { sock: OwnedFd, buf: Vec<u8> },
    IoUring { entries: u32 },
}

fn socket(domain: libc::c_int, ty: libc::c_int, proto: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket() returns a new descriptor we own, or -1.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn setsockopt(sock: &OwnedFd, level: libc::c_int, name: libc::c_int, buf: &[u8]) -> io::Result<()> {
    // SAFETY: buf is valid for buf.len() bytes; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(sock.as_raw_fd(), level, name, buf.as_ptr().cast(), buf.len() as libc::socklen_t)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// EINVAL → allocated and copied, then rejected; anything else as it is.
fn einval_outcome(r: io::Result<()>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Outcome::EinvalAfterAlloc,
        Err(e) => Outcome::Failed(e),
    }
}

impl CallState {
    fn open(call: Call) -> Result<CallState> {
        Ok(match call {
            Call::PipeResize { size } => CallState::PipeResize { size },
            Call::IpMsfilter { bytes } => CallState::IpMsfilter {
                sock: socket(libc::AF_INET, libc::SOCK_DGRAM, 0).context("cannot open a UDP socket")?,
                buf: vec![0; bytes as usize],
            },
            Call::UdpCmsg { bytes } => CallState::UdpCmsg {
                sock: socket(libc::AF_INET, libc::SOCK_DGRAM, 0).context("cannot open a UDP socket")?,
                buf: vec![0; bytes as usize],
            },
            Call::Hugetlb { .. } => CallState::Hugetlb,
            Call::SctpBindx { bytes } => {
                let sock = match socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) {
                    Ok(s) => s,
                    Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => {
                        return Err(crate::unsupported::Unsupported(
                            "this kernel has no SCTP (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): EPROTONOSUPPORT): \
                             load the sctp module or use `fraglab vm`"
                                .into(),
                        )
                        .into())
                    }
                    Err(e) => return Err(e).context("cannot open an SCTP socket"),
                };
                CallState::SctpBindx { sock, buf: vec![0; bytes as usize] }
            }
            Call::IoUring { entries } => CallState::IoUring { entries },
        })
    }

    fn call(&mut self, raised: Option<&mut Raised>) -> Result<Outcome> {
        Ok(match self {
            CallState::PipeResize { size } => {
                let (r, w) =
                    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("cannot create a pipe")?;
                // SAFETY: fcntl on a pipe we own; F_SETPIPE_SZ takes an int argument.
                let got = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, *size as libc::c_int) };
                let outcome = if got < 0 { Outcome::Failed(io::Error::last_os_error()) } else { Outcome::Ok };
                drop((r, w));
                outcome
            }
            CallState::IpMsfilter { sock, buf } => {
                einval_outcome(setsockopt(sock, libc::IPPROTO_IP, libc::IP_MSFILTER, buf))
            }
            CallState::SctpBindx { sock, buf } => {
                einval_outcome(setsockopt(sock, SOL_SCTP, SCTP_SOCKOPT_BINDX_ADD, buf))
            }
            CallState::UdpCmsg { sock, buf } => {
                let mut dest: libc::sockaddr_in = unsafe { std::mem::zeroed() };
                dest.sin_family = libc::AF_INET as libc::sa_family_t;
                dest.sin_port = 9u16.to_be(); // discard; nothing is sent
                dest.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
                let mut payload = [0u8; 1];
                let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() };
                // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg() call.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_name = (&mut dest as *mut libc::sockaddr_in).cast();
                msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = buf.as_mut_ptr().cast();
                msg.msg_controllen = buf.len();
                // SAFETY: see above.
                let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
                einval_outcome(if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) })
            }
            CallState::Hugetlb => {
                let r = raised.context("hugetlb runs with a journal")?;
                let before = read_u64("vm.nr_hugepages")?;
                r.journal.set("vm.nr_hugepages", &(before + 1).to_string())?;
                let after = read_u64("vm.nr_hugepages")?;
                if after > before {
                    Outcome::Ok
                } else {
                    Outcome::Failed(io::Error::from_raw_os_error(libc::ENOMEM))
                }
            }
            CallState::IoUring { entries } => {
                let mut params = [0u32; 30]; // struct io_uring_params, 120 bytes, zeroed
                                             // SAFETY: io_uring_setup(entries, params) writes at most sizeof(io_uring_params) = 120
                                             // bytes into params.
                let fd = unsafe {
                    libc::syscall(libc::SYS_io_uring_setup, *entries as libc::c_uint, params.as_mut_ptr())
                };
                if fd < 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::ENOSYS) {
                        return Err(crate::unsupported::Unsupported(
                            "this kernel has no io_uring (io_uring_setup: ENOSYS)".into(),
                        )
                        .into());
                    }
                    Outcome::Failed(e)
                } else {
                    // SAFETY: a fresh descriptor we own; closing it frees the ring.
                    drop(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
                    Outcome::Ok
                }
            }
        })
    }
}

fn read_u64(name: &str) -> Result<u64> {
    let v = sysctl::read(name)?;
    v.parse().with_context(|| format!("sysctl {name} = {v:?} is not a number"))
}

fn meminfo() -> Result<procfs::Meminfo> {
    use procfs::Current;
    procfs::Meminfo::current().context("cannot read /proc/meminfo")
}

/// HugePages_Total: the hugetlb pool's size in pages (none without CONFIG_HUGETLB_PAGE).
fn hugepages_total() -> Result<u64> {
    meminfo()?.hugepages_total.context("/proc/meminfo has no HugePages_Total (no CONFIG_HUGETLB_PAGE)")
}

/// After vm.nr_hugepages is back: the pages must really be freed (HugePages_Total back where it was).
fn hugetlb_check_freed(
    want: u64,
    details: &mut std::collections::BTreeMap<String, serde_json::Value>,
    notes: &mut Vec<String>,
) -> Result<()> {
    // Freeing is synchronous for unused pages; give a busy kernel a moment anyway.
    let deadline = Instant::now() + Duration::from_secs(2);
    let total = loop {
        let total = hugepages_total()?;
        if total <= want || Instant::now() > deadline {
            break total;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    details.insert("hugepages_total_after".into(), json!(total));
    if total > want {
        notes.push(format!(
            "HugePages_Total is {total} after restoring vm.nr_hugepages, {want} before: {} pages are still \
             in use (surplus) and are freed when their user lets go",
            total - want
        ));
    }
    Ok(())
}

/// The journal and lock of a trigger that changes sysctls. Field order is drop order: the journal
/// restores (on an early return or panic) before the lock is released.
struct Raised {
    journal: Journal,
    _lock: TriggerLock,
    recovered: Vec<Restored>,
}

impl Raised {
    fn start(run_dir: &Path) -> Result<Raised> {
        let lock = TriggerLock::acquire(run_dir, LOCK_WAIT)?;
        // Holding the lock, any journal left here, or where the last holder said its was, was written
        // by a trigger that died.
        let mut recovered = Vec::new();
        for dir in stale_journal_dirs(&lock.previous, run_dir) {
            recovered.extend(sysctl::recover_named(&dir, JOURNAL)?);
        }
        let journal = Journal::create_named(run_dir, JOURNAL)?;
        Ok(Raised { journal, _lock: lock, recovered })
    }
}

/// [`LOCK_FILE`], flocked for as long as a trigger's journal lives. A lock per run directory let two
/// triggers with different `--run-dir`s each raise fs.pipe-max-size and journal the other's raised
/// value as the original.
struct TriggerLock {
    _file: File,
    /// The record the last holder left: `{"pid":…,"run_dir":…}`, if any.
    previous: Option<serde_json::Value>,
}

/// The journals to replay when the lock is free: the last holder's, then `run_dir`'s own.
fn stale_journal_dirs(previous: &Option<serde_json::Value>, run_dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        previous.as_ref().and_then(|r| r["run_dir"].as_str()).map(PathBuf::from).into_iter().collect();
    if !dirs.iter().any(|d| d == run_dir) {
        dirs.push(run_dir.to_path_buf());
    }
    dirs.retain(|d| d.join(JOURNAL).exists());
    dirs
}

fn read_record(file: &mut File) -> Option<serde_json::Value> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

impl TriggerLock {
    fn open() -> Result<File> {
        fraglab_fragmenter::instance::open_lock_file(Path::new(LOCK_FILE))
    }

    fn try_lock(file: &File) -> Result<bool> {
        fraglab_fragmenter::instance::try_lock(file, Path::new(LOCK_FILE))
    }

    /// Take the lock, waiting up to `wait` for another trigger to finish.
    fn acquire(run_dir: &Path, wait: Duration) -> Result<TriggerLock> {
        let mut file = Self::open()?;
        let deadline = Instant::now() + wait;
        while !Self::try_lock(&file)? {
            if Instant::now() > deadline {
                let holder = read_record(&mut file);
                let field = |k: &str| holder.as_ref().map_or("?".to_string(), |h| h[k].to_string());
                bail!(
                    "another trigger (pid {}) is changing sysctls journaled in {}, still after waiting {}; \
                     wait for it to finish",
                    field("pid"),
                    field("run_dir"),
                    humantime::format_duration(wait)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let previous = read_record(&mut file);
        fs::create_dir_all(run_dir).with_context(|| format!("cannot create {}", run_dir.display()))?;
        let record =
            serde_json::json!({ "pid": std::process::id(), "run_dir": std::path::absolute(run_dir)? });
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(record.to_string().as_bytes())?;
        Ok(TriggerLock { _file: file, previous })
    }
}

/// Put back the sysctls of a trigger that died with them raised (SIGKILL, OOM kill, power cut of the
/// process): what every `fraglab` command does first. The journal is stale when the trigger that
/// wrote it is no longer alive, i.e. no longer holds `trigger.lock` — the kernel drops an flock
/// exactly when its holder dies, which, unlike probing the recorded pid, cannot be fooled by pid reuse
/// or a pid namespace. A live trigger's journal is left alone.
pub fn recover_if_stale(run_dir: &Path) -> Result<Vec<Restored>> {
    // A hint read without the lock: in the common case there is nothing to do, and nothing is created.
    let hint = fs::File::open(LOCK_FILE).ok().and_then(|mut f| read_record(&mut f));
    if stale_journal_dirs(&hint, run_dir).is_empty() {
        return Ok(Vec::new());
    }
    let Ok(mut file) = TriggerLock::open() else { return Ok(Vec::new()) };
    if !TriggerLock::try_lock(&file)? {
        return Ok(Vec::new()); // a live trigger: its journal is in use
    }
    let mut restored = Vec::new();
    for dir in stale_journal_dirs(&read_record(&mut file), run_dir) {
        restored.extend(sysctl::recover_named(&dir, JOURNAL)?);
    }
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_stop_flag_makes_no_call_and_says_so() {
        // --no-raise: no sysctl is touched, so this runs anywhere.
        let kind = Kind::PipeResize(PipeResizeArgs { bytes: "16MiB".into(), repeat: 1000, no_raise: true });
        let dir = std::env::temp_dir().join(format!("fraglab-trigger-stop-{}", std::process::id()));
        let r = run_in(&kind, &dir, &AtomicBool::new(true)).unwrap();
        assert_eq!((r.ok, r.failed, &r.details["calls"]), (0, 0, &json!(0)));
        assert_eq!(r.details["stopped_by_signal"], true);
        let note = r.notes.last().unwrap();
        assert!(note.starts_with("stopped by a signal after 0.0 s, 0 of 1000 calls"), "{note}");
        assert!(!dir.exists(), "no journal without a sysctl to raise");
    }

    #[test]
    fn orders_match_the_measured_table() {
        // Issue 4's table, measured in a Debian 6.1 guest: 16/64/128/256 MiB → 6/8/9/10.
        let x86 = Pages::X86_64;
        for (mib, order) in [(16u64, 6u32), (64, 8), (128, 9), (256, 10)] {
            assert_eq!(x86.pipe_resize_order(mib << 20).0, order, "{mib} MiB");
        }
        assert_eq!(x86.pipe_resize_order(100 << 20), (9, 128 << 20)); // rounded up to 128 MiB
        assert_eq!(x86.order(1 << 20), 8);
        assert_eq!(x86.order(2 << 20), 9);
        assert_eq!(x86.order(4 << 20), 10);
        assert_eq!(x86.order(64 << 10), 4);
        assert_eq!(x86.order(SCTP_OPTLEN_TRIM), 5);
        assert_eq!(x86.order(u64::from(IORING_MAX_ENTRIES) * IO_URING_SQE_SIZE), 9);
        assert_eq!(x86.order(1), 0);
        assert_eq!(x86.order(4097), 1);
    }

    #[test]
    fn the_geometry_is_this_kernels() {
        let here = Pages::read().unwrap();
        if cfg!(target_arch = "x86_64") {
            assert_eq!(here, Pages::X86_64);
        }
        // arm64 with 64 KiB pages: a 64 MiB pipe is 1024 slots, 40 KiB of pipe_buffers — one page,
        // from a kmalloc cache (up to 128 KiB there), and 4 MiB is an order-6 block, not order 10.
        let arm64 = Pages { page_size: 64 << 10, max_order: 13, huge_page_size: 512 << 20 };
        assert_eq!(arm64.pipe_resize_order(64 << 20), (0, 64 << 20));
        assert!(slab_note(40 << 10, &arm64).is_some() && slab_note(40 << 10, &Pages::X86_64).is_none());
        assert_eq!(arm64.order(4 << 20), 6);
        assert_eq!(arm64.order(arm64.huge_page_size), 13);
    }

    #[test]
    fn options_are_validated_before_anything() {
        let x86 = Pages::X86_64;
        let pipe = |bytes: &str, repeat| {
            plan(&Kind::PipeResize(PipeResizeArgs { bytes: bytes.into(), repeat, no_raise: false }), &x86)
                .err()
                .map(|e| e.to_string())
        };
        assert!(pipe("lots", 1).unwrap().contains("--bytes"));
        assert!(pipe("64MiB", 0).unwrap().contains("--repeat 0"));
        assert!(pipe("512MiB", 1).unwrap().contains("order 11"));
        assert!(pipe("64MB", 1).unwrap().contains("binary"));
        assert_eq!(pipe("256MiB", 1), None);
        let msf = plan(
            &Kind::IpMsfilter(IpMsfilterArgs { bytes: "8MiB".into(), repeat: 1, no_raise: false }),
            &x86,
        );
        assert!(msf.err().unwrap().to_string().contains("order 11"));
        let io = plan(&Kind::IoUring(IoUringArgs { entries: 65536, repeat: 1 }), &x86);
        assert!(io.err().unwrap().to_string().contains("--entries 65536"));
    }

    #[test]
    fn configs_deserialize_with_cli_defaults() {
        let k: Kind = serde_json::from_value(json!({"trigger": "pipe-resize"})).unwrap();
        let Kind::PipeResize(a) = &k else { panic!("{k:?}") };
        assert_eq!((a.bytes.as_str(), a.repeat, a.no_raise), ("64MiB", 10, false));
        let k: Kind = serde_json::from_value(json!({"trigger": "udp-cmsg", "bytes": 2097152})).unwrap();
        let Kind::UdpCmsg(a) = &k else { panic!("{k:?}") };
        assert_eq!(a.bytes, "2097152");
        let k: Kind = serde_json::from_value(json!({"trigger": "hugetlb"})).unwrap();
        assert!(matches!(k, Kind::Hugetlb(HugetlbArgs { pages: 64 })));
        let bad = serde_json::from_value::<Kind>(json!({"trigger": "pipe-resize", "byte": "1MiB"}));
        assert!(bad.unwrap_err().to_string().contains("unknown field"));
        // And what clap gives without flags is the same.
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(subcommand)]
            k: Kind,
        }
        for (argv, value) in [
            (vec!["x", "pipe-resize"], json!({"trigger": "pipe-resize"})),
            (vec!["x", "ip-msfilter"], json!({"trigger": "ip-msfilter"})),
            (vec!["x", "udp-cmsg"], json!({"trigger": "udp-cmsg"})),
            (vec!["x", "hugetlb"], json!({"trigger": "hugetlb"})),
            (vec!["x", "sctp-bindx"], json!({"trigger": "sctp-bindx"})),
            (vec!["x", "io-uring"], json!({"trigger": "io-uring"})),
        ] {
            let from_cli = serde_json::to_value(Cli::parse_from(argv).k).unwrap();
            let from_config = serde_json::to_value(serde_json::from_value::<Kind>(value).unwrap()).unwrap();
            assert_eq!(from_cli, from_config);
        }
    }
}
