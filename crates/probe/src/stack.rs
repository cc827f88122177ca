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

/// The function a printed frame names, without offset (`+0x1f/0x60`), module (`[amdgpu]`),
/// address (`[<ffffffff…>]`), unreliable-frame mark (`? `) or compiler-clone suffix (`.isra.15`,
/// `.constprop.0`, `.part.0`, `.cold`, `.cold.140`, `.llvm.…`: kernel function names have no `.`).
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
    f = f.strip_prefix("? ").unwrap_or(f).trim_start();
    let end = f.find(|c: char| c == '+' || c == '.' || c.is_whitespace()).unwrap_or(f.len());
    let name = &f[..end];
    let ok = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    ok.then_some(name)
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
/// dumper, the page allocator, slab/slub, kmalloc, kvmalloc and vmalloc entry points, and folio
/// allocation. `__alloc_skb` and friends are *not* here: which skb allocator failed matters to a
/// network developer, and its caller comes with it.
pub fn is_allocator(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "trace_event_raw_event_",
        "warn_alloc",
        "dump_stack",
        "dump_backtrace",
        "show_stack",
        "__alloc_pages",
        "alloc_pages",
        "__alloc_frozen_pages",
        "alloc_frozen_pages",
        "__get_free_pages",
        "get_zeroed_page",
        "__folio_alloc",
        "folio_alloc",
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
    name == "kmalloc" || PREFIXES.iter().any(|p| name.starts_with(p))
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
/// Frames marked `?` are skipped, unless every frame is (2.6 kernels without frame pointers mark
/// them all). `None` when there is no frame outside the allocator.
pub fn call_site<S: AsRef<str>>(stack: &[S]) -> Option<CallSite> {
    let all_unreliable = stack.iter().all(|f| is_unreliable(f.as_ref()));
    let mut names = stack
        .iter()
        .map(AsRef::as_ref)
        .filter(|f| all_unreliable || !is_unreliable(f))
        .filter_map(function_name)
        .skip_while(|n| is_allocator(n));
    let function = names.next()?.to_string();
    Some(CallSite { function, caller: names.next().map(str::to_string) })
}

/// The frames above the call site, from it outwards, up to `max` of them and stopping at the
/// system-call or kernel-thread entry: context printed beside a [`CallSite`] group.
pub fn path_from_site<S: AsRef<str>>(stack: &[S], max: usize) -> Vec<String> {
    let all_unreliable = stack.iter().all(|f| is_unreliable(f.as_ref()));
    stack
        .iter()
        .map(AsRef::as_ref)
        .filter(|f| all_unreliable || !is_unreliable(f))
        .filter_map(function_name)
        .skip_while(|n| is_allocator(n))
        .take_while(|n| !is_entry(n))
        .take(max)
        .map(str::to_string)
        .collect()
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
        assert_eq!(function_name("<IRQ>"), None);
        assert_eq!(function_name(""), None);
        assert!(is_unreliable("[<ffffffffab4c7f02>] ? __netif_receive_skb_core+0x222/0xad0"));
        assert!(!is_unreliable("[<ffffffffab31c193>] dump_stack+0x63/0x90"));
    }
}
