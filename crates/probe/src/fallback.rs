//! Which failed allocations mattered. Much of what the catcher sees is the kernel trying a high
//! order first and expecting to be told no: a transparent huge page (the fault maps base pages,
//! khugepaged comes back later), kvmalloc's kmalloc step (vmalloc takes over), SLUB's preferred slab
//! order (it retries at the cache's minimum), a page-fragment cache refill (single pages instead).
//! Those *fell back*. Any other failure *surfaced*: the caller got NULL and, as far as the stack
//! and the gfp flags tell, passed it on — the ENOMEM a workload sees, a dropped packet, a connect
//! that times out because the peer could not allocate its side.
//!
//! The rules are by call site and gfp flags, the way a kernel engineer reads a trace: each fallback
//! path is recognised by a function on the stack *and* the flag its first attempt carries
//! (`__GFP_NORETRY`, or GFP_TRANSHUGE*), so the same function's last-resort attempt, made without
//! that flag, is not taken for one. docs/failures.md says where the rules can be wrong.

use serde::{Deserialize, Serialize};

use crate::stack::frame_names;

/// What a failed allocation meant to its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// No fallback is known for this call site and these flags: the caller got the failure.
    Surfaced,
    /// The caller has a way around it (the reason says which).
    FellBack,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Surfaced => "surfaced",
            Outcome::FellBack => "fell back",
        }
    }
}

/// An [`Outcome`] and, for a fallback, the path the kernel takes instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classified {
    pub outcome: Outcome,
    /// `THP: the fault maps base pages, khugepaged retries later`; `None` when it surfaced.
    pub fallback: Option<&'static str>,
}

/// A known fallback: any of these functions on the stack, a failed attempt with `flag` (any flag
/// when `None`) above order 0, and what the kernel does instead.
struct Path {
    functions: &'static [&'static str],
    flag: Option<&'static str>,
    instead: &'static str,
}

const PATHS: &[Path] = &[
    Path {
        functions: &["kvmalloc_node", "__kvmalloc_node", "kvmalloc_node_noprof", "__kvmalloc_node_noprof"],
        flag: Some("__GFP_NORETRY"),
        instead: "kvmalloc: vmalloc takes over from the contiguous attempt",
    },
    Path {
        functions: &["allocate_slab"],
        flag: Some("__GFP_NORETRY"),
        instead: "SLUB: the slab is retried at the cache's minimum order",
    },
    Path {
        functions: &[
            "skb_page_frag_refill",
            "sk_page_frag_refill",
            "page_frag_alloc",
            "page_frag_alloc_align",
            "__page_frag_alloc_align",
            "__page_frag_cache_refill",
            "page_frag_cache_refill",
        ],
        flag: Some("__GFP_NORETRY"),
        instead: "page fragments: the cache is refilled with single pages",
    },
    Path {
        functions: &["alloc_skb_with_frags"],
        flag: Some("__GFP_NORETRY"),
        instead: "skb frags: retried at a lower order",
    },
];

/// Classify a failed allocation of `order` with these gfp flag names (as the tracepoint or
/// `warn_alloc` printed them) and stack (innermost first, as printed).
pub fn classify<S: AsRef<str>>(order: u32, gfp_flags: &[String], stack: &[S]) -> Classified {
    let has_flag = |f: &str| gfp_flags.iter().any(|g| g == f);
    // GFP_TRANSHUGE_LIGHT / GFP_TRANSHUGE: only a huge page is ever asked for with these.
    if has_flag("GFP_TRANSHUGE") || has_flag("GFP_TRANSHUGE_LIGHT") {
        return fell_back("THP: the fault maps base pages, khugepaged tries again later");
    }
    let names: Vec<&str> = stack.iter().flat_map(|f| frame_names(f.as_ref())).collect();
    // Before v4.10 no flag names were printed: a huge page is then told by who asked.
    const THP: &[&str] =
        &["khugepaged", "collapse_huge_page", "alloc_charge_hpage", "do_huge_pmd_anonymous_page"];
    if gfp_flags.is_empty() && names.iter().any(|n| THP.contains(n)) {
        return fell_back("THP: the fault maps base pages, khugepaged tries again later");
    }
    if order > 0 {
        for p in PATHS {
            let on_stack = names.iter().any(|n| p.functions.contains(n));
            if on_stack && p.flag.is_none_or(has_flag) {
                return fell_back(p.instead);
            }
        }
    }
    Classified { outcome: Outcome::Surfaced, fallback: None }
}

/// Whether a caught failure surfaced ([`classify`] on its order, flags and stack).
pub fn surfaced(f: &crate::tracefs::AllocFailure) -> bool {
    classify(f.order, &f.gfp_flags, &f.stack).outcome == Outcome::Surfaced
}

/// Whether a failure the kernel log reported surfaced, as [`surfaced`] says of a caught one.
pub fn surfaced_in_log(f: &crate::kmsg::AllocFailureReport) -> bool {
    classify(f.order, f.gfp_flags(), &f.stack).outcome == Outcome::Surfaced
}

fn fell_back(instead: &'static str) -> Classified {
    Classified { outcome: Outcome::FellBack, fallback: Some(instead) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: &str) -> Vec<String> {
        s.split('|').filter(|f| !f.is_empty()).map(String::from).collect()
    }

    #[test]
    fn first_attempts_fall_back_and_last_resorts_surface() {
        let kv = [
            "__alloc_pages+0x1/0x2",
            "__kmalloc_node+0x1/0x2",
            "kvmalloc_node+0x1/0x2",
            "pipe_resize_ring+0x1/0x2",
        ];
        let c = classify(8, &flags("GFP_KERNEL_ACCOUNT|__GFP_NOWARN|__GFP_NORETRY|__GFP_COMP"), &kv);
        assert_eq!(c.outcome, Outcome::FellBack);
        // The same stack without __GFP_NORETRY is not kvmalloc's first step.
        assert_eq!(classify(8, &flags("GFP_KERNEL_ACCOUNT|__GFP_COMP"), &kv).outcome, Outcome::Surfaced);
        // Order 0 has nothing smaller to fall back to.
        assert_eq!(classify(0, &flags("GFP_KERNEL|__GFP_NORETRY"), &kv).outcome, Outcome::Surfaced);
        let slab = ["__alloc_pages", "allocate_slab", "___slab_alloc", "kmem_cache_alloc", "sk_prot_alloc"];
        assert_eq!(
            classify(3, &flags("GFP_ATOMIC|__GFP_NOWARN|__GFP_NORETRY|__GFP_COMP"), &slab).outcome,
            Outcome::FellBack
        );
        assert_eq!(classify(0, &flags("GFP_ATOMIC|__GFP_COMP"), &slab).outcome, Outcome::Surfaced);
        // 2.6-era THP with no flag names: told by the caller.
        let thp =
            ["__alloc_pages_nodemask", "alloc_pages_vma", "do_huge_pmd_anonymous_page", "handle_mm_fault"];
        assert_eq!(classify(9, &[], &thp).outcome, Outcome::FellBack);
    }
}
