//! Kernel call chains as the failure catcher and the kernel log print them, reduced to what a
//! kernel engineer groups failures by: the function that asked for the memory and its caller.
//!
//! ```text
//! tracefs `stacktrace` trigger:   => __kmalloc_noprof
//! kernel log `Call Trace:`:        ? __alloc_pages_direct_compact+0x181/0x1a0
//!                                  [<ffffffff8113c09a>] __alloc_pages_nodemask+0x22a/0x240
//!                                  dc_create_state+0x1f/0x60 [amdgpu]
//! ```
//!
//! [`function_name`] turns any of those into the bare function (`sctp_datamsg_from_user.isra.0`
//! → `sctp_datamsg_from_user`: the compiler's clones are the same source function), the one
//! normalisation both the `[expect] failed_in` matcher and the by-caller grouping use.

use serde::{Deserialize, Serialize};

/// The function a printed frame names, without offset (`+0x1f/0x60`), module (`[amdgpu]`, with a
/// build id or not), address (`[<ffffffff…>]`), unreliable-frame mark (`? `) or compiler-clone
/// suffix (`.isra.15`, `.constprop.0`, `.part.0`, `.cold`, `.cold.140`, `.llvm.…`, `.cfi_jt`: kernel
/// function names have no `.`). A 32-bit ARM frame (`[<c000dc44>] (unwind_backtrace) from
/// [<c000cb00>] (show_stack+0x10/0x18)`) names its own function first.
///
/// `None` for what is no frame: an empty line, `<IRQ>` / `</IRQ>` / `<TASK>` context markers.
pub fn function_name(frame: &str) -> Option<&str> {
    let mut f = frame.trim();
    // `<IRQ>  [<ffffffff81123daf>] ? __alloc_pages_nodemask+0x77f/0x940` (2.6 kernels put the
    // marker on the first frame's line).
    while let Some(rest) = f.strip_prefix('<') {
        let close = rest.find('>')?;
        f = rest[close + 1..].trim_start();
    }
    if let Some(rest) = f.strip_prefix("[<") {
        let close = rest.find(">]")?;
        f = rest[close + 2..].trim_start();
    }
    // powerpc: `[c00000000108fb10] [c0000000007fac88] dump_stack+0xb0/0xf0`, stack pointer then pc.
    while let Some((inside, rest)) = f.strip_prefix('[').and_then(|r| r.split_once(']')) {
        if inside.is_empty() || !inside.bytes().all(|b| b.is_ascii_hexdigit()) {
            break;
        }
        f = rest.trim_start();
    }
    f = f.strip_prefix("? ").unwrap_or(f).trim_start();
    // 32-bit ARM: `(show_stack+0x10/0x14) from [<c0011a5c>] (dump_stack+…)`, or `(show_stack) from …`
    // since v4.x: the frame's own function is the first one in parentheses.
    f = f.strip_prefix('(').unwrap_or(f);
    let end = f.find(|c: char| c == '+' || c == '.' || c == ')' || c.is_whitespace()).unwrap_or(f.len());
    let name = &f[..end];
    // `(0x0)`, the end of an ARM trace, is an address, not a function.
    let ok = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    ok.then_some(name)
}

/// The functions a printed frame names: one, or two on a 32-bit ARM line, which names the frame's
/// function and, after ` from `, its caller (the next line's function, or, on the last line of a
/// trace cut short, the only mention of it).
pub fn frame_names(frame: &str) -> impl Iterator<Item = &str> {
    let caller = frame.split_once(") from ").and_then(|(_, from)| function_name(from));
    function_name(frame).into_iter().chain(caller)
}

/// Whether a kernel-log frame is marked `?`: an address found on the stack that the unwinder could
/// not prove is a return address (stale data, or a frame-pointer-less 2.6 kernel, which marks all).
pub fn is_unreliable(frame: &str) -> bool {
    let mut f = frame.trim();
    while let Some(rest) = f.strip_prefix('<') {
        match rest.find('>') {
            Some(close) => f = rest[close + 1..].trim_start(),
            None => return false,
        }
    }
    if let Some(rest) = f.strip_prefix("[<") {
        if let Some(close) = rest.find(">]") {
            f = rest[close + 2..].trim_start();
        }
    }
    f.starts_with("? ")
}

/// Whether `name` (a [`function_name`]) belongs to the allocator or to the code that reports its
/// failure, rather than to whoever asked for memory: the tracepoint, `warn_alloc` and the stack
/// dumpers of every era and architecture (`dump_trace`, `show_trace_log_lvl`, ARM's
/// `unwind_backtrace`), the page allocator with its 3.x/4.x wrappers (`alloc_pages_current`,
/// `alloc_pages_vma`, `alloc_kmem_pages`, `kmalloc_order_trace`), SLAB, SLUB and SLOB, kmalloc,
/// kvmalloc and vmalloc, folio allocation, the page-fragment cache, zsmalloc, and the DMA API
/// (`dma_alloc_coherent` and what it goes through): a driver's order-5 failure is the driver's, not
/// `__dma_direct_alloc_pages`'s. `__alloc_skb` and friends are *not* here: which skb allocator
/// failed matters to a network developer, and its caller comes with it.
pub fn is_allocator(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "trace_event_raw_event_",
        "warn_alloc",
        "dump_stack",
        "__dump_stack",
        "dump_backtrace",
        "dump_trace",
        "show_stack",
        "show_trace",
        "unwind_backtrace",
        "__alloc_pages",
        "get_page_from_freelist",
        "alloc_kmem_pages",
        "slob_",
        "__kmem_cache_alloc",
        "refill_objects",
        "__pcs_",
        "page_frag_alloc",
        "__page_frag_alloc",
        "__page_frag_cache_refill",
        "page_frag_cache_refill",
        "zs_malloc",
        "alloc_zspage",
        "dma_alloc",
        "__dma_alloc",
        "dma_direct_alloc",
        "__dma_direct_alloc",
        "arm_dma_alloc",
        "__arm_dma_alloc",
        "remap_allocator_alloc",
        "simple_allocator_alloc",
        "cma_allocator_alloc",
        "pool_allocator_alloc",
        "__alloc_remap_buffer",
        "__alloc_simple_buffer",
        "__alloc_from_contiguous",
        "__alloc_from_pool",
        "alloc_single_sgt",
        "dma_common_alloc_pages",
        "iommu_dma_alloc",
        "__iommu_dma_alloc",
        "cma_alloc",
        "usb_alloc_coherent",
        "usb_alloc_noncoherent",
        "hcd_buffer_alloc",
        "alloc_pages",
        "__alloc_frozen_pages",
        "alloc_frozen_pages",
        "__get_free_pages",
        "get_zeroed_page",
        "__folio_alloc",
        "alloc_page_interleave",
        "vma_alloc_folio",
        "alloc_slab_page",
        "allocate_slab",
        "new_slab",
        "___slab_alloc",
        "__slab_alloc",
        "slab_alloc",
        "kmem_cache_alloc",
        "kmem_getpages",
        "cache_grow",
        "cache_alloc_refill",
        "fallback_alloc",
        "____cache_alloc",
        "___kmalloc",
        "__kmalloc",
        "kmalloc_",
        "__do_kmalloc",
        "kvmalloc",
        "__kvmalloc",
        "__vmalloc",
        "vmalloc",
        "kmalloc_large",
        "kmalloc_order",
    ];
    // Whole names where a prefix would take in others: `folio_alloc_swap` allocates swap space.
    const NAMES: &[&str] =
        &["kmalloc", "folio_alloc", "folio_alloc_noprof", "folio_alloc_mpol", "folio_alloc_mpol_noprof"];
    NAMES.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Where an allocation came from: the first frame outside the allocator and its caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CallSite {
    /// The first function (innermost first) that is not [`is_allocator`]: `pipe_resize_ring`,
    /// `__alloc_skb`, `dc_create_state`.
    pub function: String,
    /// The function that called it, when the stack goes on.
    pub caller: Option<String>,
}

impl std::fmt::Display for CallSite {
    /// `__alloc_skb ← _sctp_make_chunk`, read as "allocated in … called from …".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.function)?;
        if let Some(c) = &self.caller {
            write!(f, " ← {c}")?;
        }
        Ok(())
    }
}

/// The [`CallSite`] of a stack, innermost frame first, as printed (tracefs or kernel log).
///
/// Frames marked `?` are skipped unless nothing outside the allocator is left without them (some
/// kernels mark every frame: 2.6 without frame pointers, 5.x ORC traces that lost the unwind). `None`
/// when there is no frame outside the allocator.
pub fn call_site<S: AsRef<str>>(stack: &[S]) -> Option<CallSite> {
    let mut names = outside_allocator(stack).into_iter();
    let function = names.next()?.to_string();
    Some(CallSite { function, caller: names.next().map(str::to_string) })
}

/// The frames above the call site, from it outwards, up to `max` of them and stopping at the
/// system-call or kernel-thread entry: context printed beside a [`CallSite`] group.
pub fn path_from_site<S: AsRef<str>>(stack: &[S], max: usize) -> Vec<String> {
    outside_allocator(stack).into_iter().take_while(|n| !is_entry(n)).take(max).map(str::to_string).collect()
}

/// The function names from the call site outwards: past the allocator's frames at the top of the
/// stack, and past one or two frames caught between two of them. Those are allocator internals
/// this list does not name, or stale words an unwinder without frame pointers printed as frames
/// (2.6: `kmem_getpages`, `tcp_v4_route_req`, `cache_grow`): the allocator calls nothing of its
/// caller's. Only at the top: an allocation that failed inside another one's direct reclaim is
/// its own caller's, many frames below the outer allocator.
fn outside_allocator<S: AsRef<str>>(stack: &[S]) -> Vec<&str> {
    let names = |reliable_only: bool| -> Vec<&str> {
        let mut names: Vec<&str> = stack
            .iter()
            .map(AsRef::as_ref)
            .filter(|f| !reliable_only || !is_unreliable(f))
            .flat_map(frame_names)
            .collect();
        // An ARM line's caller is the next line's function: one frame, named twice.
        names.dedup();
        names
    };
    let reliable = past(names(true));
    if !reliable.is_empty() {
        return reliable;
    }
    // Only when the trace goes on past its last reliable frame with `?` ones alone (every frame
    // marked): a trace cut inside the allocator has no call site, and none is made up from the
    // stale words beside its frames.
    let last_reliable = stack.iter().rposition(|f| !is_unreliable(f.as_ref()));
    if last_reliable.is_some_and(|i| i + 1 == stack.len()) {
        return Vec::new();
    }
    past(names(false))
}

/// `names` from the first one past the allocator (see [`outside_allocator`]).
fn past(names: Vec<&str>) -> Vec<&str> {
    const ISLAND: usize = 2;
    let mut start = 0;
    while start < names.len() {
        if is_allocator(names[start]) {
            start += 1;
            continue;
        }
        // A short run of others with an allocator frame right after it is still the allocator.
        let run = names[start..].iter().take_while(|n| !is_allocator(n)).count();
        if start > 0 && run <= ISLAND && start + run < names.len() {
            start += run;
            continue;
        }
        break;
    }
    names[start..].to_vec()
}

/// Failures of one order from one [`CallSite`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerGroup {
    pub order: u32,
    /// `None`: no stack was captured, or it held allocator frames only.
    pub site: Option<CallSite>,
    pub count: usize,
    /// The first such failure's frames beyond the caller, outwards, up to the system-call or
    /// kernel-thread entry (at most four): the path that led there, as an example.
    pub then: Vec<String>,
    /// The group's failures had no stack at all.
    pub no_stack: bool,
}

impl CallerGroup {
    /// `order 4 ×2 from __alloc_skb ← _sctp_make_chunk, then sctp_make_datafrag_empty ← …`.
    pub fn describe(&self) -> String {
        let mut s = format!("order {} ×{}", self.order, self.count);
        match &self.site {
            Some(site) => {
                s += &format!(" from {site}");
                if !self.then.is_empty() {
                    s += &format!(", then {}", self.then.join(" ← "));
                }
            }
            None if self.no_stack => s += ", no stack captured",
            None => s += ", only allocator frames in the stack",
        }
        s
    }
}

/// Group failures, given as (order, stack innermost first), by order and [`CallSite`]: most
/// frequent first, then by order and site.
pub fn group_by_caller<'a, S, I>(failures: I) -> Vec<CallerGroup>
where
    S: AsRef<str> + 'a,
    I: IntoIterator<Item = (u32, &'a [S])>,
{
    let mut groups: Vec<CallerGroup> = Vec::new();
    for (order, stack) in failures {
        let site = call_site(stack);
        // Without a site, "no stack" and "allocator frames only" are told apart.
        let no_stack = stack.is_empty();
        match groups.iter_mut().find(|g| g.order == order && g.site == site && g.no_stack == no_stack) {
            Some(g) => g.count += 1,
            None => {
                let then = if site.is_some() {
                    path_from_site(stack, 6).into_iter().skip(2).collect()
                } else {
                    Vec::new()
                };
                groups.push(CallerGroup { order, site, count: 1, then, no_stack });
            }
        }
    }
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(a.order.cmp(&b.order)).then(a.site.cmp(&b.site)));
    groups
}

/// Where every stack bottoms out and stops saying anything about the caller.
fn is_entry(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "do_syscall_",
        "entry_SYSCALL",
        "__x64_sys_",
        "__arm64_sys_",
        "__se_sys_",
        "__do_sys_",
        "ret_from_fork",
    ];
    name == "kthread" || PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_forms() {
        assert_eq!(function_name("dump_stack+0x85/0xc0"), Some("dump_stack"));
        assert_eq!(function_name(" ? _cond_resched+0x15/0x30"), Some("_cond_resched"));
        assert_eq!(function_name("dc_create_state+0x1f/0x60 [amdgpu]"), Some("dc_create_state"));
        assert_eq!(function_name("[<ffffffffab31c193>] dump_stack+0x63/0x90"), Some("dump_stack"));
        assert_eq!(
            function_name("<IRQ>  [<ffffffff81123daf>] ? __alloc_pages_nodemask+0x77f/0x940"),
            Some("__alloc_pages_nodemask")
        );
        assert_eq!(function_name("alloc_empty_pages.isra.15+0x24/0x60"), Some("alloc_empty_pages"));
        assert_eq!(function_name("warn_alloc.cold.140+0x68/0xe8"), Some("warn_alloc"));
        assert_eq!(function_name("sctp_datamsg_from_user.isra.0"), Some("sctp_datamsg_from_user"));
        assert_eq!(
            function_name("[<c000dc44>] (unwind_backtrace) from [<c000cb00>] (show_stack+0x10/0x18)"),
            Some("unwind_backtrace")
        );
        assert_eq!(
            function_name(
                "[<c0013f5c>] (unwind_backtrace+0x0/0xf8) from [<c0011a5c>] (show_stack+0x10/0x14)"
            ),
            Some("unwind_backtrace")
        );
        assert_eq!(function_name("dump_backtrace.cfi_jt+0x0/0x4"), Some("dump_backtrace"));
        assert_eq!(
            function_name("[c00000000108fb10] [c0000000007fac88] dump_stack+0xb0/0xf0 (unreliable)"),
            Some("dump_stack")
        );
        assert_eq!(function_name("[c00000000108fd40] [c000000000aecfb0]"), None);
        assert_eq!(function_name("<IRQ>"), None);
        assert_eq!(function_name(""), None);
        assert!(is_unreliable("[<ffffffffab4c7f02>] ? __netif_receive_skb_core+0x222/0xad0"));
        assert!(!is_unreliable("[<ffffffffab31c193>] dump_stack+0x63/0x90"));
    }
}
