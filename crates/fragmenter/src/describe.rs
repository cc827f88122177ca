//! The fragmenter's plan and status in words — kernel vocabulary, human sizes — for the human output
//! of `fraglab fragment`, `fraglab status` and `fraglab run` (its `--dry-run` and its summary).
//! `--json` prints the structures themselves; nothing here changes them.

use crate::arena::PAGE_SIZE;
use crate::fragment::{fill_time_bound, Progress};
use crate::keeper::{Keep, Keeping, MIN_RING_ORDER};
use crate::shape::{profile_pages, scale_profile};
use crate::target::profile_free_bytes;
use crate::{Pin, Plan, Target};

use fraglab_units::{format_size, order_size};

const PAGE: u64 = PAGE_SIZE as u64;

/// `no free block of order ≥ 4 (64K), 960.00 MiB free below it`, or
/// `profile of Node 0, zone Normal: free blocks per order 40773 37 34 29 0 0 0 0 0 0 0 (161.00 MiB free)`.
pub fn target(t: &Target) -> String {
    match t {
        Target::MaxFreeOrder { order, free_bytes } => format!(
            "no free block of order ≥ {order} ({}), {} free below it",
            order_size(*order),
            format_size(*free_bytes)
        ),
        Target::Profile { node, zone, free } => format!(
            "profile{}: free blocks per order {} ({} free)",
            match (node, zone) {
                (Some(n), Some(z)) => format!(" of Node {n}, zone {z}"),
                (Some(n), None) => format!(" of node {n}"),
                (None, Some(z)) => format!(" of zone {z}"),
                (None, None) => String::new(),
            },
            counts(free),
            format_size(profile_free_bytes(free))
        ),
        Target::Zones { zones, .. } => format!(
            "profile of {} ({} free)",
            zones_text(zones),
            format_size(zones.iter().map(|z| profile_free_bytes(&z.free)).sum())
        ),
    }
}

/// One line per zone of a zone-placed target: `Node 1, zone DMA32: planned 3000 400 … intact 2873
/// 400 … missing 0 …`, with its scale when it was scaled.
pub fn zone_cuts(zones: &[crate::fragment::ZoneCut]) -> Vec<String> {
    zones
        .iter()
        .map(|z| {
            let top = z.planned.iter().zip(&z.missing).rposition(|(p, m)| p + m > 0).map_or(0, |o| o + 1);
            let cut = |v: &[u64]| counts(&v[..top.min(v.len())]);
            format!(
                "{}: planned {} | intact {} | missing {}{}",
                z.zone,
                cut(&z.planned),
                cut(&z.intact),
                cut(&z.missing),
                if z.scale < 1.0 {
                    format!(" (scaled by {:.4} to the pages taken there)", z.scale)
                } else {
                    String::new()
                }
            )
        })
        .collect()
}

/// Whole machine, profile: what the reserve's high-order blocks were traded for.
pub fn traded(bytes: u64) -> Option<String> {
    (bytes > 0).then(|| {
        format!(
            "traded {} of held memory, freed in blocks below the region order, for the reserve's free blocks \
             at or above it (the keeper's rings hold those)",
            format_size(bytes)
        )
    })
}

/// `3 zones: Node 0, zone DMA32 1440 1444 …; Node 1, zone DMA32 …`.
fn zones_text(zones: &[crate::target::ZoneProfile]) -> String {
    let each: Vec<String> = zones.iter().map(|z| format!("{} {}", z.label(), counts(&z.free))).collect();
    format!("{} zone{}: {}", zones.len(), if zones.len() == 1 { "" } else { "s" }, each.join("; "))
}

/// Where shaping stands, for `fraglab status` while a fragmenter has not reached its target yet.
pub fn progress(p: &Progress) -> String {
    match p {
        Progress::Populating { done, total } => {
            format!("populating, {} of {}", format_size(*done), format_size(*total))
        }
        Progress::Cutting => "cutting: choosing the pages to free".into(),
        Progress::Freeing { pages } => format!("freeing {}", format_size(pages * PAGE)),
        Progress::Settling => "settling: waiting for the per-CPU lists to drain".into(),
        Progress::Filling { bytes, leftover_pages } => format!(
            "filling the reserve's high-order blocks with pipe pages: {} so far, {} still free at order ≥ k",
            format_size(*bytes),
            format_size(leftover_pages * PAGE)
        ),
        Progress::Rebreaking { bytes, leftover_pages } => format!(
            "re-breaking the reserve's high-order blocks, one ring of each block's order: {} taken so far, \
             {} still free at order ≥ k",
            format_size(*bytes),
            format_size(leftover_pages * PAGE)
        ),
    }
}

/// `budget 1.00 GiB`, or `whole machine` when there is no budget.
pub fn extent(budget: Option<u64>) -> String {
    match budget {
        Some(b) => format!("budget {}", format_size(b)),
        None => "whole machine".into(),
    }
}

/// The pin mode as `--pin` and `[fragment] pin` spell it.
pub fn pin(p: Pin) -> &'static str {
    match p {
        Pin::Mlock => "mlock",
        Pin::None => "none",
    }
}

/// Free-block counts per order, space-separated like a buddyinfo line.
/// A profile target's fidelity, `when` it was measured (`when the hold began`, `now`): a headline and
/// a line per zone with the profile's counts, the zone's and whether they are within the tolerance.
pub fn fidelity(f: &crate::fidelity::Fidelity, when: &str) -> Vec<String> {
    use crate::fidelity::{Measure, TOLERANCE_BLOCKS, TOLERANCE_PERCENT};
    let (what, has) = match f.measure {
        Measure::Buddyinfo => ("each zone's buddyinfo line", "free"),
        Measure::Intact => ("the cut's blocks still free", "intact"),
    };
    let mut lines = vec![format!(
        "profile fidelity {when} ({what} against the profile, orders 0–{}, ± {TOLERANCE_PERCENT} % and \
         {TOLERANCE_BLOCKS} blocks per order): {}",
        f.orders.saturating_sub(1),
        if f.within { "within" } else { "OFF THE PROFILE" }
    )];
    for z in &f.zones {
        lines.push(format!(
            "  {}: asked {} | {has} {} | {}",
            z.zone,
            counts(&z.target),
            counts(&z.achieved),
            if z.within { "within".to_string() } else { format!("off: {}", z.off(f.measure).join(", ")) }
        ));
    }
    lines
}

pub fn counts(free: &[u64]) -> String {
    free.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
}

/// MemAvailable − reserve: what a whole-machine fragmenter takes, as of `mem_available`.
pub fn takeable(plan: &Plan, mem_available: u64) -> u64 {
    mem_available.saturating_sub(plan.reserve)
}

/// The plan as `key: value` lines, in the order a dry run prints them. `mem_available` is the
/// MemAvailable the plan was resolved against.
pub fn plan(plan: &Plan, mem_available: u64) -> Vec<(&'static str, String)> {
    let takeable = takeable(plan, mem_available);
    let mut lines = vec![("target", format!("{}, {}", extent(plan.budget), target(&plan.target)))];
    let take = match (plan.budget, &plan.target) {
        (Some(b), _) => format!(
            "{} (budget); where free memory is already in small blocks, up to {} to find whole aligned \
             regions — or the budget plus the free Movable blocks below the region order, when that is \
             more (the kernel hands those out first) — the surplus given back after the cut; the rest \
             of the machine keeps its free blocks",
            format_size(b),
            format_size(b.saturating_mul(4))
        ),
        (None, Target::MaxFreeOrder { order, .. }) if plan.rings_take_reserve() => format!(
            "all free memory above the reserve, about {}; then the keeper's rings take the blocks of \
             order ≥ {order} still free in the reserve, in every zone but DMA — one unmovable \
             allocation of exactly each block's order, which none of the cut's smaller blocks can \
             serve — until none is left for 1 s, MemAvailable would fall below the reserve, the \
             kernel hands out none for 2 s, or 10 s and 2 s more a GiB to take pass (a reserve that \
             is mostly high-order free blocks leaves the target unreached)",
            format_size(takeable)
        ),
        (None, Target::MaxFreeOrder { order, .. }) => format!(
            "all free memory above the reserve, about {}; then pipe pages (unmovable order-0 \
             allocations) break up the blocks of order ≥ {order} still free in the reserve, in every \
             zone but DMA, until none is left, MemAvailable would fall below the reserve, or {} s pass \
             (a reserve that is mostly high-order free blocks leaves the target unreached); pipe pages, \
             not the keeper's rings, because {}: they come from the smallest free blocks first and \
             take some of the cut's",
            format_size(takeable),
            fill_time_bound(takeable).as_secs(),
            if plan.keep {
                format!("order {order} is below the keeper's smallest ring ({MIN_RING_ORDER})")
            } else {
                "keep = false".to_string()
            }
        ),
        (None, Target::Profile { .. } | Target::Zones { .. }) if plan.trades_reserve() => format!(
            "all free memory above the reserve, about {}, cut to the profile; then the reserve's free \
             blocks of order ≥ {k} are traded: as much held memory is freed in blocks below order {k} \
             (outside the profile's zones first), and the keeper's rings take the high-order blocks",
            format_size(takeable),
            k = plan.region_order()
        ),
        (None, Target::Profile { .. } | Target::Zones { .. }) => format!(
            "all free memory above the reserve, about {}, cut to the profile; the reserve keeps its own \
             free blocks beside the profile's, high orders included: {}",
            format_size(takeable),
            if plan.region_order() < MIN_RING_ORDER {
                format!(
                    "the profile's region order {} is below the keeper's smallest ring ({MIN_RING_ORDER})",
                    plan.region_order()
                )
            } else if !plan.keep {
                "keep = false".to_string()
            } else {
                "the profile has blocks of the top order itself".to_string()
            }
        ),
    };
    lines.push(("take", take));
    if let Some(b) = &plan.place.bind {
        lines.push((
            "node",
            format!(
                "{} only: every chunk is bound to it (MPOL_BIND) and pagemap must show every page there; \
                 populating stops while the node still has {} free (its share of the reserve)",
                b.node,
                format_size(b.keep)
            ),
        ));
    }
    if !plan.place.zones.is_empty() {
        let spans: Vec<String> = plan
            .place
            .zones
            .iter()
            .map(|z| format!("{} (frames {}–{})", z.label(), z.start, z.end - 1))
            .collect();
        lines.push((
            "zone",
            format!(
                "{}: the cut frees pages there only; pages taken elsewhere are {}",
                spans.join(", "),
                if plan.budget.is_some() {
                    "given back"
                } else {
                    "held like the rest of the machine (a lower zone's profile needs the zones above it \
                     exhausted: the allocator reaches into it only then)"
                }
            ),
        ));
    }
    match &plan.target {
        Target::Profile { free, .. } => lines.push(("profile", profile_fit(free, plan.budget, takeable))),
        Target::Zones { zones, skipped } => {
            for z in zones {
                let need = profile_pages(&z.free) * PAGE;
                lines.push((
                    "profile",
                    format!(
                        "{}: {} in blocks, needs up to {} taken there (scaled to what is, if less)",
                        z.label(),
                        format_size(profile_free_bytes(&z.free)),
                        format_size(need)
                    ),
                ));
            }
            for why in skipped {
                lines.push(("skipped", why.clone()));
            }
        }
        Target::MaxFreeOrder { .. } => {}
    }
    lines.push((
        "pin",
        match plan.pin {
            Pin::Mlock => "mlock: held pages are mlocked and vm.compact_unevictable_allowed = 0, so \
                           compaction cannot move them"
                .into(),
            Pin::None => "none: held pages stay movable; compaction may migrate them and merge the \
                          freed blocks back"
                .into(),
        },
    ));
    let (how, order) = plan.keeping();
    lines.push((
        "keep",
        match how {
            Keep::Rebreak if order < MIN_RING_ORDER => format!(
                "watch: a free block of order ≥ {order} that forms while holding loses the target, and is \
                 recorded, not taken back: the keeper asks only for orders ≥ {MIN_RING_ORDER} (a smaller \
                 allocation that finds no block can call the OOM killer instead of failing)"
            ),
            Keep::Rebreak => format!(
                "re-break: a free block of order ≥ {order} that forms while holding is taken back within \
                 ~10 ms (a pipe ring of exactly its order); fs.pipe-max-size raised for the rings"
            ),
            Keep::Watch => format!(
                "watch (keep = false): a free block of order ≥ {order} that forms while holding loses the \
                 target, and is recorded, not taken back"
            ),
            Keep::Regions => format!(
                "regions: held while every page the cut kept stays where it was (checked each second); \
                 free blocks of order ≥ {order} elsewhere are reported, not chased"
            ),
        },
    ));
    lines.push((
        "reserve",
        format!(
            "{} of MemAvailable never taken{}; below {} while holding, memory is given back",
            format_size(plan.reserve),
            plan.reserve_for.as_ref().map_or(String::new(), |why| format!(" ({why})")),
            format_size(plan.floor)
        ),
    ));
    let mut sysctls = vec!["vm.percpu_pagelist_high_fraction = 100000"];
    if plan.pin == Pin::Mlock {
        sysctls.push("vm.compact_unevictable_allowed = 0");
    }
    if plan.stops_proactive_compaction() {
        sysctls.push("vm.compaction_proactiveness = 0");
    }
    if plan.budget.is_none() {
        sysctls.push("vm.lowmem_reserve_ratio (DMA entry = 1)");
    }
    lines.push(("sysctls", format!("{} (journaled, restored on release)", sysctls.join(", "))));
    lines
}

/// What the keeper did, in one line: `keeping order ≥ 4 (re-break): 27 blocks re-broken (order 4:
/// 10, 5: 4, 6: 7, 7: 3, 8: 3), 4.4 MiB added to the hold; lost 0.096 s in 6 losses; 1 refused`.
pub fn keeping(k: &Keeping) -> String {
    let how = match k.how {
        Keep::Rebreak => "re-break",
        Keep::Watch => "watch only",
        Keep::Regions => "the cut's regions",
    };
    let mut o = format!("keeping order ≥ {} ({how}, {} looks)", k.order, k.looks);
    let rebroken: u64 = k.rebroken.iter().sum();
    if rebroken > 0 {
        let per_order: Vec<String> = k
            .rebroken
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(order, n)| format!("{order}: {n}"))
            .collect();
        o += &format!(
            ": {rebroken} blocks re-broken (order {}), {} added to the hold",
            per_order.join(", "),
            format_size(k.added_bytes)
        );
    }
    o += &match k.losses {
        0 => "; the target never lost".to_string(),
        n => format!("; lost {:.3} s in {n} losses", k.lost_ns as f64 / 1e9),
    };
    if k.refused > 0 {
        o += &format!(
            "; {} re-breaks refused (the block was taken first, or is in the HighAtomic reserve)",
            k.refused
        );
    }
    o += &format!("; {:.2} s of CPU", k.cpu_ns as f64 / 1e9);
    if let Some(note) = &k.note {
        o += &format!("; {note}");
    }
    o
}

/// Whether a profile fits what will be shaped, and if not, to what it is scaled. With a budget the
/// fragmenter scales to the budget, so the numbers are the ones the run will use; whole-machine,
/// they follow what is actually taken.
fn profile_fit(free: &[u64], budget: Option<u64>, takeable: u64) -> String {
    let need = profile_pages(free) * PAGE;
    let (fit, what) = match budget {
        Some(b) => (b, format!("the {} budget", format_size(b))),
        None => (takeable, format!("the about {} taken", format_size(takeable))),
    };
    if need <= fit {
        return format!(
            "fits unscaled: it needs at most {} (an owned region of 2^(o+1) pages per order-o block) \
             of {what}",
            format_size(need)
        );
    }
    let (scaled, f) = scale_profile(free, fit / PAGE);
    format!(
        "SCALED by {f:.4} to fit {what} (it needs up to {} unscaled): free blocks per order {} → {} \
         ({} → {} free){}",
        format_size(need),
        counts(free),
        counts(&scaled),
        format_size(profile_free_bytes(free)),
        format_size(profile_free_bytes(&scaled)),
        if budget.is_none() { "; the factor follows what is actually taken" } else { "" }
    )
}

/// After a profile was cut: `profile scaled by 0.3975 to fit the 128.00 MiB budget: free blocks per
/// order 40773 37 … → 16206 14 …`, from the status's target and the blocks it planned or missed.
/// `None` when it was not scaled.
pub fn scaled_profile(
    t: &Target,
    scale: f64,
    budget: Option<u64>,
    planned: &[u64],
    missing: &[u64],
) -> Option<String> {
    let Target::Profile { free, .. } = t else { return None };
    if scale >= 1.0 {
        return None;
    }
    let scaled: Vec<u64> =
        (0..free.len()).map(|o| planned.get(o).unwrap_or(&0) + missing.get(o).unwrap_or(&0)).collect();
    Some(format!(
        "profile scaled by {scale:.4} to fit {}: free blocks per order {} → {} ({} → {} free)",
        budget.map_or("the memory taken".to_string(), |b| format!("the {} budget", format_size(b))),
        counts(free),
        counts(&scaled),
        format_size(profile_free_bytes(free)),
        format_size(profile_free_bytes(&scaled))
    ))
}

/// The loud statement a whole-machine plan gets on a host: how much it takes, what is left, and how
/// to do it in a guest or in part instead. `None` with a budget or inside a `fraglab vm` guest.
/// `guest` is the `fraglab vm …` command line that does it in a guest, `budget_hint` how to give a
/// budget (`--budget SIZE`, or the config key).
pub fn whole_machine_note(
    plan: &Plan,
    mem_available: u64,
    in_guest: bool,
    guest: &str,
    budget_hint: &str,
) -> Option<String> {
    if plan.budget.is_some() || in_guest {
        return None;
    }
    Some(format!(
        "!! WHOLE MACHINE on this host (no budget, not a `fraglab vm` guest): fraglab takes about {} of \
         MemAvailable {} and holds it; everything else here has only the {} reserve until it is \
         released.\n\
         !! To do it in a throwaway guest instead: {guest}\n\
         !! To shape only part of this host: {budget_hint}\n",
        format_size(takeable(plan, mem_available)),
        format_size(mem_available),
        format_size(plan.reserve)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(target: Target, budget: Option<u64>) -> Plan {
        Plan {
            target,
            budget,
            pin: Pin::Mlock,
            reserve: 376 << 20,
            reserve_for: None,
            floor: 132 << 20,
            no_proactive_compaction: false,
            nr_orders: 11,
            keep: true,
            place: Default::default(),
            page_reporting: None,
        }
    }

    const SEED_000: [u64; 11] = [40773, 37, 34, 29, 0, 0, 0, 0, 0, 0, 0];

    fn text(p: &Plan, avail: u64) -> String {
        super::plan(p, avail).iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
    }

    #[test]
    fn no_debug_formatting() {
        let targets = [
            Target::MaxFreeOrder { order: 3, free_bytes: 21_295_009_792 },
            Target::Profile { node: None, zone: Some("Normal".into()), free: SEED_000.to_vec() },
        ];
        for t in targets {
            for b in [None, Some(128 << 20)] {
                let s = text(&plan(t.clone(), b), 24 << 30);
                for leak in ["Some(", "None", "Mlock", "MaxFreeOrder", "Profile {", "[40773"] {
                    assert!(!s.contains(leak), "{leak:?} in:\n{s}");
                }
            }
        }
    }

    #[test]
    fn pipe_fill_is_promised_only_for_whole_machine_max_free_order_below_the_rings() {
        let mfo = text(&plan(Target::MaxFreeOrder { order: 3, free_bytes: 1 << 30 }, None), 24 << 30);
        assert!(mfo.contains("pipe pages") && mfo.contains("order ≥ 3 still free in the reserve"), "{mfo}");
        assert!(mfo.contains("because order 3 is below the keeper's smallest ring (4)"), "{mfo}");
        // From the rings' order up, the rings take the reserve's blocks: no pipe page.
        let rings = text(&plan(Target::MaxFreeOrder { order: 4, free_bytes: 1 << 30 }, None), 24 << 30);
        assert!(rings.contains("the keeper's rings take the blocks of order ≥ 4"), "{rings}");
        assert!(!rings.contains("pipe pages"), "{rings}");
        let mut no_keep = plan(Target::MaxFreeOrder { order: 4, free_bytes: 1 << 30 }, None);
        no_keep.keep = false;
        let no_keep = text(&no_keep, 24 << 30);
        assert!(no_keep.contains("pipe pages") && no_keep.contains("because keep = false"), "{no_keep}");
        let prof =
            text(&plan(Target::Profile { node: None, zone: None, free: vec![512, 97, 12] }, None), 24 << 30);
        assert!(
            prof.contains(
                "the reserve keeps its own free blocks beside the profile's, high orders included: \
                           the profile's region order 3 is below the keeper's smallest ring (4)"
            ),
            "{prof}"
        );
        assert!(!prof.contains("then pipe pages") && !prof.contains("traded"), "{prof}");
        // Region order 4: the reserve's blocks of order ≥ 4 are traded, not filled.
        let traded = text(
            &plan(Target::Profile { node: None, zone: None, free: vec![512, 97, 12, 3] }, None),
            24 << 30,
        );
        assert!(traded.contains("then the reserve's free blocks of order ≥ 4 are traded"), "{traded}");
        assert!(traded.contains("re-break"), "{traded}");
        assert!(!traded.contains("pipe pages"), "{traded}");
        let budget =
            text(&plan(Target::MaxFreeOrder { order: 3, free_bytes: 1 << 20 }, Some(64 << 20)), 24 << 30);
        assert!(!budget.contains("pipe pages"), "{budget}");
    }

    #[test]
    fn proactive_compaction_is_stopped_for_whole_machine_profiles_or_when_asked() {
        let line =
            |p: &Plan| text(p, 24 << 30).lines().find(|l| l.starts_with("sysctls: ")).unwrap().to_string();
        let zone =
            crate::target::ZoneProfile { node: 1, zone: "DMA32".into(), free: vec![2500, 350, 180], line: 1 };
        let zones = Target::Zones { zones: vec![zone], skipped: Vec::new() };
        assert!(line(&plan(zones, None)).contains("vm.compaction_proactiveness = 0"));
        let profile = Target::Profile { node: None, zone: Some("Normal".into()), free: SEED_000.to_vec() };
        assert!(line(&plan(profile.clone(), None)).contains("vm.compaction_proactiveness = 0"));
        assert!(!line(&plan(profile, Some(128 << 20))).contains("compaction_proactiveness"), "a budget");
        let mfo = Target::MaxFreeOrder { order: 4, free_bytes: 1 << 30 };
        assert!(!line(&plan(mfo.clone(), None)).contains("compaction_proactiveness"));
        let mut asked = plan(mfo, Some(128 << 20));
        asked.no_proactive_compaction = true;
        assert!(line(&asked).contains("vm.compaction_proactiveness = 0"));
    }

    #[test]
    fn a_profile_scaled_to_the_budget_says_from_what_to_what() {
        // 82430 pages needed (≈ 322 MiB); 128 MiB is 32768 pages: factor 0.3975.
        let s = text(
            &plan(Target::Profile { node: None, zone: None, free: SEED_000.to_vec() }, Some(128 << 20)),
            24 << 30,
        );
        let (scaled, f) = scale_profile(&SEED_000, 32768);
        assert!(s.contains(&format!("SCALED by {f:.4} to fit the 128.00 MiB budget")), "{s}");
        assert!(s.contains(&format!("{} → {}", counts(&SEED_000), counts(&scaled))), "{s}");
        let fits = text(
            &plan(Target::Profile { node: None, zone: None, free: SEED_000.to_vec() }, Some(512 << 20)),
            24 << 30,
        );
        assert!(fits.contains("fits unscaled") && !fits.contains("SCALED"), "{fits}");
    }

    #[test]
    fn the_whole_machine_note_is_for_hosts_only() {
        let whole = plan(Target::MaxFreeOrder { order: 3, free_bytes: 1 << 30 }, None);
        let note = whole_machine_note(
            &whole,
            20 << 30,
            false,
            "fraglab vm --kernel debian-cloud -- run x.toml",
            "-",
        )
        .unwrap();
        assert!(note.contains("about 19.63 GiB") && note.contains("376.00 MiB reserve"), "{note}");
        assert!(note.contains("fraglab vm --kernel debian-cloud -- run x.toml"), "{note}");
        assert!(whole_machine_note(&whole, 20 << 30, true, "", "").is_none());
        let budgeted = plan(Target::MaxFreeOrder { order: 3, free_bytes: 1 << 20 }, Some(64 << 20));
        assert!(whole_machine_note(&budgeted, 20 << 30, false, "", "").is_none());
    }

    #[test]
    fn a_scaled_status_names_both_profiles() {
        let t = Target::Profile { node: None, zone: None, free: vec![10, 4] };
        let s = scaled_profile(&t, 0.5, Some(1 << 20), &[4, 2], &[1, 0]).unwrap();
        assert!(s.contains("10 4 → 5 2") && s.contains("the 1.00 MiB budget"), "{s}");
        assert!(scaled_profile(&t, 1.0, None, &[10, 4], &[0, 0]).is_none());
    }
}
