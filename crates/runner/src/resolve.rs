//! Parse, then resolve: raw flags (and later config tables) become one validated plan before
//! anything touches the kernel. Every check that can refuse bad input happens here, so a refused
//! command has taken no memory and changed no sysctl. Reading /proc to learn the machine's limits
//! is allowed; writing anything is not.

use anyhow::{bail, Result};
use fraglab_fragmenter::fragment::{self, max_freeable, Bind, Pin, Place, Plan, ZoneSpan};
use fraglab_fragmenter::target::{parse_profile, ProfileLine, Target, DMA_NOT_SHAPED};
use fraglab_probe::buddyinfo::BuddyInfo;
use fraglab_probe::page_reporting::PageReporting;
use fraglab_probe::zoneinfo::ZoneInfo;
use serde::Deserialize;

use crate::cli::{FragmentArgs, PinArg};
use fraglab_units::{format_size, parse_size};
use fraglab_workload::room::Room;

/// The fragmenter's target as written by a user: the `fraglab fragment` flags or a config's
/// `[fragment]` table. Strings are kept as typed so errors can quote them.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FragmentSpec {
    /// `false` in a config's `[fragment]` table makes a baseline run (no fragmentation).
    #[serde(default = "yes")]
    pub enabled: bool,
    pub max_free_order: Option<usize>,
    pub free: Option<String>,
    pub profile: Option<String>,
    /// A saved `/proc/buddyinfo` or a report's Mem-Info block: every node/zone line at once.
    pub profile_file: Option<String>,
    pub budget: Option<String>,
    /// The NUMA node to shape (budget mode); a profile line that names its node says it itself.
    pub node: Option<u32>,
    pub pin: Option<String>,
    pub reserve: Option<String>,
    /// Advanced: MemAvailable below this while holding makes fraglab give memory back (default
    /// 2 × min_free_kbytes).
    pub floor: Option<String>,
    #[serde(default)]
    pub no_proactive_compaction: bool,
    /// `false`: do not take back free blocks of the target order that form while holding; only
    /// watch (whole machine, max free order).
    #[serde(default = "yes")]
    pub keep: bool,
    /// A run's workload whose window saw the target lost for longer than this cannot say "not
    /// reproduced" (default 100ms). Config only.
    pub lost_tolerance: Option<String>,
}

impl From<&FragmentArgs> for FragmentSpec {
    fn from(a: &FragmentArgs) -> Self {
        FragmentSpec {
            enabled: true,
            max_free_order: a.max_free_order,
            free: a.free.clone(),
            profile: a.profile.clone(),
            profile_file: a.profile_file.as_ref().map(|p| p.display().to_string()),
            budget: a.budget.clone(),
            node: a.node,
            pin: Some(match a.pin {
                PinArg::Mlock => "mlock".into(),
                PinArg::None => "none".into(),
            }),
            reserve: a.reserve.clone(),
            floor: a.floor.clone(),
            no_proactive_compaction: a.no_proactive_compaction,
            keep: !a.no_keep,
            lost_tolerance: None,
        }
    }
}

pub fn yes() -> bool {
    true
}

/// What the machine allows, read once so every check uses the same numbers.
#[derive(Clone, Debug)]
pub struct Machine {
    pub nr_orders: usize,
    pub mem_available: u64,
    pub min_free: u64,
    pub default_reserve: u64,
    pub root: bool,
    /// The base page size; the fragmenter's cut and pagemap arithmetic are written for 4 KiB.
    pub page_size: u64,
    /// Nodes and zones: where a target can be placed.
    pub zoneinfo: ZoneInfo,
    /// A balloon taking free blocks off the free lists to report them: the hold keeps clear of
    /// the floor by as much as that can take at once.
    pub page_reporting: Option<PageReporting>,
}

impl Machine {
    pub fn read() -> Result<Self> {
        let buddy = BuddyInfo::read()?;
        Ok(Machine {
            nr_orders: buddy.nr_orders(),
            mem_available: fragment::mem_available()?,
            min_free: fraglab_fragmenter::sysctl::read("vm.min_free_kbytes")?.parse::<u64>()? * 1024,
            default_reserve: fragment::default_reserve()?,
            root: nix::unistd::geteuid().is_root(),
            page_size: procfs::page_size(),
            zoneinfo: ZoneInfo::read()?,
            page_reporting: PageReporting::read()?,
        })
    }
}

/// Resolve a fragment spec against this machine. `key` renders a key for error messages: `--budget`
/// on the command line, `[fragment] budget` in a config.
/// `room` is what a run's workloads can have the kernel hold beside the target: the default reserve
/// grows by it.
pub fn fragment(
    spec: &FragmentSpec,
    m: &Machine,
    room: Option<&Room>,
    key: &dyn Fn(&str) -> String,
) -> Result<Plan> {
    let size = |name: &str, v: &Option<String>| -> Result<Option<u64>> {
        v.as_deref().map(|t| parse_size(t).map_err(|e| anyhow::anyhow!("{}: {e}", key(name)))).transpose()
    };
    if !m.root {
        bail!(
            "fraglab fragment needs root: it reads physical frame numbers from /proc/self/pagemap, \
             mlocks memory and changes vm sysctls (run it with sudo)"
        );
    }
    if m.page_size != fraglab_fragmenter::arena::PAGE_SIZE as u64 {
        bail!(
            "this kernel uses {} pages; the fragmenter shapes 4 KiB pages only (x86-64, or an arm64 \
             kernel built with 4K pages). fraglab probe, scan, workload and a baseline run work here",
            format_size(m.page_size)
        );
    }
    let budget = size("budget", &spec.budget)?;
    let given = size("reserve", &spec.reserve)?;
    let base = given.unwrap_or(m.default_reserve);
    if base < m.min_free {
        bail!(
            "{} = {}: below vm.min_free_kbytes ({}); the kernel would start reclaiming and the OOM \
             killer could act — give at least {}",
            key("reserve"),
            format_size(base),
            format_size(m.min_free),
            format_size(m.min_free)
        );
    }
    let floor = match size("floor", &spec.floor)? {
        None => m.min_free * 2,
        Some(f) if f < m.min_free * 2 => bail!(
            "{} = {}: below 2 × vm.min_free_kbytes ({}); the guard would act too late to keep the OOM \
             killer away — give at least that",
            key("floor"),
            format_size(f),
            format_size(m.min_free * 2)
        ),
        Some(f) if f >= m.mem_available => bail!(
            "{} = {}: not below MemAvailable ({}); the guard would give everything back at once",
            key("floor"),
            format_size(f),
            format_size(m.mem_available)
        ),
        Some(f) => f,
    };
    let pin = match spec.pin.as_deref().unwrap_or("mlock") {
        "mlock" => Pin::Mlock,
        "none" => Pin::None,
        other => bail!("{} = {other:?}: must be \"mlock\" or \"none\"", key("pin")),
    };
    let line = spec
        .profile
        .as_deref()
        .map(|l| parse_profile(l).map_err(|e| anyhow::anyhow!("{} {l:?}: {e}", key("profile"))))
        .transpose()?;
    let targets: Vec<&str> = [
        ("max_free_order", spec.max_free_order.is_some()),
        ("profile", spec.profile.is_some()),
        ("profile_file", spec.profile_file.is_some()),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    if targets.len() > 1 {
        let keys: Vec<String> = targets.iter().map(|k| key(k)).collect();
        let all = if keys.len() == 2 { "both" } else { "all" };
        bail!("{} {all} given: choose one target", keys.join(" and "));
    }
    // The target as it would be beside `reserve`; `reserve_for` says why the reserve is that.
    let build = |reserve: u64, reserve_for: Option<&str>| -> Result<(Target, Place)> {
        let takeable = m.mem_available.saturating_sub(reserve);
        if let Some(b) = budget {
            if b < (1 << 20) {
                bail!("{} = {}: too small to shape; give at least 1MiB", key("budget"), format_size(b));
            }
            if b > takeable {
                bail!(
                    "{} = {}: more than this machine can give (MemAvailable {} − reserve {} = {}{}); lower it",
                    key("budget"),
                    format_size(b),
                    format_size(m.mem_available),
                    format_size(reserve),
                    format_size(takeable),
                    reserve_for.map_or(String::new(), |w| format!("; the reserve is {w}"))
                );
            }
        }
        let taken = budget.unwrap_or(takeable);
        match &spec.profile_file {
            Some(path) => profile_file(spec, path, budget, m, key),
            None => {
                line_target(spec, line.clone(), size("free", &spec.free)?, (budget, reserve, taken), m, key)
            }
        }
    };
    let (mut target, mut place) = build(base, None)?;
    // MemAvailable while the target is held is the reserve plus the target's free blocks: the
    // workloads' buffers need more reserve only where the target leaves them less than that.
    let (mut reserve, mut reserve_for) = (base, None);
    if let Some(room) = room.filter(|r| r.bytes > target.free_bytes()) {
        let short = format!(
            "{} for what the workloads can hold in socket buffers, more than the target's {} free: {}",
            format_size(room.bytes),
            format_size(target.free_bytes()),
            room.why
        );
        match given {
            None => {
                reserve = base + room.bytes;
                let why = format!("the default {} and {short}", format_size(base));
                (target, place) = build(reserve, Some(&why))?;
                reserve_for = Some(why);
            }
            Some(r) if r < m.default_reserve + room.bytes => {
                reserve_for = Some(format!(
                    "as given, less than the default {} and {short}: if they fill them, the guard gives \
                     memory back and the target is lost",
                    format_size(m.default_reserve)
                ));
            }
            Some(_) => {}
        }
    }
    Ok(Plan {
        target,
        budget,
        pin,
        reserve,
        reserve_for,
        floor,
        no_proactive_compaction: spec.no_proactive_compaction,
        nr_orders: m.nr_orders,
        keep: spec.keep,
        place,
        page_reporting: m.page_reporting.clone(),
    })
}

/// A `max_free_order` or `profile` target, and where it is built. `free` is `spec.free` parsed;
/// `budget, reserve, taken` as resolved.
fn line_target(
    spec: &FragmentSpec,
    line: Option<ProfileLine>,
    free: Option<u64>,
    (budget, reserve, taken): (Option<u64>, u64, u64),
    m: &Machine,
    key: &dyn Fn(&str) -> String,
) -> Result<(Target, Place)> {
    let place = place(spec, line.as_ref(), budget, reserve, m, key)?;
    let line_node = line.as_ref().and_then(|l| l.node);
    let target = match (spec.max_free_order, line) {
        (Some(_), Some(_)) => unreachable!("refused above: one target"),
        (None, None) => {
            bail!("no target: give {}, {} or {}", key("max_free_order"), key("profile"), key("profile_file"))
        }
        (Some(order), None) => {
            fragment::check_order(order, m.nr_orders)
                .map_err(|e| anyhow::anyhow!("{}: {e}", key("max_free_order")))?;
            let most = max_freeable(taken / 4096, order) * 4096;
            let free_bytes = match free {
                Some(f) if f > most => bail!(
                    "{} = {}: at most {} of {} taken can be free with no block of order ≥ {order} \
                     (one page of every 2^{order} is kept); lower it or raise the budget",
                    key("free"),
                    format_size(f),
                    format_size(most),
                    format_size(taken)
                ),
                Some(f) => f,
                None => most,
            };
            Target::MaxFreeOrder { order, free_bytes }
        }
        (None, Some(ProfileLine { zone, mut free, .. })) => {
            if spec.free.is_some() {
                bail!("{} applies to max_free_order targets; a profile says its own sizes", key("free"));
            }
            fit_orders(&mut free, m.nr_orders).map_err(|e| anyhow::anyhow!("{}: {e}", key("profile")))?;
            // As the line says it; where it is built is the plan's place.
            Target::Profile { node: line_node, zone, free }
        }
    };
    Ok((target, place))
}

/// The frames of a zone the cut may use: it must exist with memory, say where it starts, and share
/// no frame with another zone (the cut tells zones apart by frame number).
fn zone_span(zi: &ZoneInfo, node: u32, zone: &str) -> Result<ZoneSpan> {
    let label = format!("Node {node}, zone {zone}");
    let Some(z) = zi.zone(node, zone).filter(|z| z.populated()) else {
        let zones: Vec<String> = zi.node_zones(node).map(|z| z.zone.clone()).collect();
        bail!("{label} does not exist here: node {node} has {} (/proc/zoneinfo)", zones.join(", "));
    };
    let Some((start, end)) = z.span() else {
        bail!("/proc/zoneinfo prints no start_pfn for {label}: its frames cannot be told");
    };
    if let Some(other) = zi.overlapping(node, zone).first() {
        bail!(
            "{label}'s frames {start}–{} overlap {}'s (/proc/zoneinfo): a cut in one alone cannot be told \
             from the other by frame number",
            end - 1,
            other.label()
        );
    }
    Ok(ZoneSpan { node, zone: zone.to_string(), start, end })
}

/// How to get a guest with `nodes` nodes: `fraglab vm --numa N`, up to its 8.
fn numa_guest(nodes: u64) -> String {
    if nodes <= 8 {
        format!("`fraglab vm --numa {nodes}`")
    } else {
        format!("`fraglab vm --numa` boots at most 8 nodes, not the {nodes} this needs")
    }
}

/// Counts for this kernel's orders: a line with more orders is taken only if the extra are 0.
fn fit_orders(free: &mut Vec<u64>, nr_orders: usize) -> Result<(), String> {
    if free.len() > nr_orders {
        if free[nr_orders..].iter().any(|&n| n > 0) {
            return Err(format!(
                "the line has free blocks of order {} but this kernel's largest order is {}",
                free.len() - 1,
                nr_orders - 1
            ));
        }
        free.truncate(nr_orders);
    }
    free.resize(nr_orders, 0);
    Ok(())
}

/// A whole machine's state from a file: every node/zone line, each in its own zone. Whole machine
/// only: a lower zone's line needs the zones above it exhausted, and the lines together are the
/// machine's free memory. A line whose node or zone this machine lacks is an error naming the line;
/// DMA lines, which every Mem-Info block has, are skipped with the reason.
fn profile_file(
    spec: &FragmentSpec,
    path: &str,
    budget: Option<u64>,
    m: &Machine,
    key: &dyn Fn(&str) -> String,
) -> Result<(Target, Place)> {
    let at = format!("{} = {path:?}", key("profile_file"));
    if spec.free.is_some() || spec.node.is_some() {
        bail!(
            "{at}: {} applies to the other targets; the file's lines say their own sizes and nodes",
            if spec.free.is_some() { key("free") } else { key("node") }
        );
    }
    if budget.is_some() {
        bail!(
            "{at} with {}: a machine's state is shaped whole — each line in its own zone, and a lower \
             zone's only with the zones above it exhausted. Drop the budget and run it in a guest \
             (`fraglab vm --numa N --script …`)",
            key("budget")
        );
    }
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{at}: cannot read it: {e}"))?;
    let lines = fraglab_fragmenter::target::parse_profile_file(&text, std::path::Path::new(path))
        .map_err(|e| anyhow::anyhow!("{}: {e}", key("profile_file")))?;
    let zi = &m.zoneinfo;
    let nodes = zi.nodes();
    let (mut zones, mut spans, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    let most_nodes = lines.iter().map(|l| u64::from(l.node) + 1).max().unwrap_or(1);
    for mut l in lines {
        let here = format!("{}: {path}:{}: {}", key("profile_file"), l.line, l.label());
        if !nodes.contains(&l.node) {
            let have: Vec<String> = nodes.iter().map(|n| format!("node {n}")).collect();
            bail!(
                "{here}: node {} does not exist here: this machine has memory on {} (/proc/zoneinfo). \
                 Boot a guest with the file's nodes ({})",
                l.node,
                have.join(", "),
                numa_guest(most_nodes)
            );
        }
        if l.zone == "DMA" {
            skipped.push(format!("{} (line {}): {DMA_NOT_SHAPED}", l.label(), l.line));
            continue;
        }
        let span = zone_span(zi, l.node, &l.zone).map_err(|e| {
            anyhow::anyhow!("{here}: {e}; a guest's zones follow its memory (DMA32 below 4 GiB, Normal above: `fraglab vm --mem`)")
        })?;
        fit_orders(&mut l.free, m.nr_orders).map_err(|e| anyhow::anyhow!("{here}: {e}"))?;
        spans.push(span);
        zones.push(l);
    }
    if zones.is_empty() {
        bail!("{at}: no line left to shape once DMA is skipped");
    }
    Ok((Target::Zones { zones, skipped }, Place { bind: None, zones: spans }))
}

/// Where the memory must come from: `--node`, or the node and zone the profile line names, checked
/// against this machine's zoneinfo. A line that names a zone but no node comes from a kernel built
/// without NUMA, whose one node is node 0. With neither, the plan takes memory wherever the
/// allocator gives it, as before nodes were known.
fn place(
    spec: &FragmentSpec,
    line: Option<&ProfileLine>,
    budget: Option<u64>,
    reserve: u64,
    m: &Machine,
    key: &dyn Fn(&str) -> String,
) -> Result<Place> {
    let zi = &m.zoneinfo;
    let nodes = zi.nodes();
    let have = nodes.iter().map(|n| format!("node {n}")).collect::<Vec<_>>().join(", ");
    let line_node = line.and_then(|l| l.node);
    let zone = line.and_then(|l| l.zone.clone());
    // Which key the node came from, for the error.
    let (node, from) = match (spec.node, line_node) {
        (Some(a), Some(b)) if a != b => bail!(
            "{} = {a}, but the profile line is node {b}'s: drop {} or give the line of node {a}",
            key("node"),
            key("node")
        ),
        (Some(a), _) => (Some(a), format!("{} = {a}", key("node"))),
        (None, b) => {
            let line = spec.profile.as_deref().unwrap_or_default();
            (b.or(zone.as_ref().map(|_| 0)), format!("{} {line:?}", key("profile")))
        }
    };
    let Some(node) = node else { return Ok(Place::default()) };
    if !nodes.contains(&node) {
        bail!(
            "{from}: node {node} does not exist here: this machine has memory on {have} (/proc/zoneinfo). \
             Shape one of those with --node, or boot a guest with node {node} ({})",
            numa_guest(u64::from(node) + 1)
        );
    }
    let user = zi.user_zone(node).expect("a node with memory has a populated zone");
    if spec.max_free_order.is_some() && budget.is_none() {
        bail!(
            "{} = {node} without a budget: the whole-machine mode shapes every node; give a budget to \
             shape node {node} alone",
            key("node")
        );
    }
    let zone = match (&zone, &spec.max_free_order) {
        (_, Some(_)) => None,
        (Some(z), None) => Some(z.clone()),
        // Bare counts bound to a node: the node's user zone.
        (None, None) => Some(user.zone.clone()),
    };
    let zone = match zone {
        None => None,
        Some(z) => {
            let span = zone_span(zi, node, &z).map_err(|e| anyhow::anyhow!("{from}: {e}"))?;
            if z == "DMA" {
                bail!("{from}: {DMA_NOT_SHAPED}");
            }
            if budget.is_some() && z != user.zone {
                let top = &user.zone;
                bail!(
                    "{from}: Node {node}, zone {z} with a budget: user pages come from node {node}'s highest \
                     zone, {top}, and reach {z} only once {top} is exhausted. Shape the whole machine instead \
                     (no budget; in a guest: `fraglab vm --kernel debian-cloud -- fragment --profile …`), \
                     or target zone {top}"
                );
            }
            Some(span)
        }
    };
    // One node: every page is the node's anyway, and a kernel without NUMA has no mbind(2).
    let bind = match budget {
        Some(b) if nodes.len() > 1 => {
            let managed: u64 = zi.zones.iter().map(|z| z.managed).sum();
            let node_managed: u64 = zi.node_zones(node).map(|z| z.managed).sum();
            let high: u64 = zi.node_zones(node).map(|z| z.high).sum();
            let keep = ((reserve as u128 * node_managed as u128 / managed.max(1) as u128) as u64)
                .max(2 * high * fraglab_fragmenter::arena::PAGE_SIZE as u64);
            let free = zi.node_free_pages(node) * fraglab_fragmenter::arena::PAGE_SIZE as u64;
            if b > free.saturating_sub(keep) {
                bail!(
                    "{} = {}: more than node {node} can give (free {} − the {} it keeps = {}); lower it",
                    key("budget"),
                    format_size(b),
                    format_size(free),
                    format_size(keep),
                    format_size(free.saturating_sub(keep))
                );
            }
            // The check after populating tells nodes apart by frame number.
            if let Some(other) =
                zi.node_zones(node).flat_map(|z| zi.overlapping(node, &z.zone)).find(|o| o.node != node)
            {
                bail!(
                    "{from}: node {node}'s frames overlap {}'s (/proc/zoneinfo): where a page landed cannot be \
                     told from its frame number, so the binding cannot be checked; shape it without a node",
                    other.label()
                );
            }
            let spans = zi.node_zones(node).filter_map(|z| z.span()).collect();
            Some(Bind { node, keep, spans })
        }
        _ => None,
    };
    Ok(Place { bind, zones: zone.into_iter().collect() })
}
