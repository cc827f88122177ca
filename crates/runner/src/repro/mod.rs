//! `fraglab repro REPORT`: from a pasted bug report to a verdict. Read the report ([`report`]),
//! choose how to reach its failed allocation ([`route`]), shape a guest like the reporter's machine
//! with the free areas its Mem-Info printed, write the scenario as an ordinary config, run it in
//! `fraglab vm` up to `--rounds` times, and answer: reproduced (same call site or same-order proxy),
//! not reproduced (the target held for every window), or could not test. docs/repro.md has the flow.

pub mod report;
pub mod route;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;
use fraglab_fragmenter::target::parse_profile_file;
use fraglab_results::load::{find_runs, Run};
use fraglab_results::record::Verdict;
use fraglab_workload::trigger::Pages;

use crate::cli::{Cli, Command, ReproArgs};
use crate::exit::Exit;
use report::Report;
use route::{Reach, Route};

/// The file the target's free-area lines are written to, beside the config.
pub const TARGET_FILE: &str = "target.meminfo";
/// The config.
pub const CONFIG_FILE: &str = "repro.toml";
/// Said in the plan and the config when the target is a max free order.
const NO_FREE_AREAS: &str = "no free areas to build (none printed, or only DMA's)";

/// A report read whole whose failure no guest can test: exit 125, not a bad-input 255.
#[derive(Debug)]
pub struct CannotTest(pub String);

impl std::fmt::Display for CannotTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CannotTest {}

/// Everything decided before anything is booted: what `--dry-run` prints.
pub struct Plan {
    pub report: Report,
    pub route: Route,
    /// The free-area lines to reproduce (the chosen failure's Mem-Info, DMA left to the kernel), as
    /// the kernel printed them; empty when the report had none (then the target is max free order).
    pub target_lines: Vec<String>,
    /// What about the target a reader should know: a zone that still had blocks of the failed order.
    pub target_notes: Vec<String>,
    /// `fraglab vm` flags that shape the guest, and why.
    pub guest: Vec<String>,
    pub guest_why: String,
    pub config: String,
    pub output: PathBuf,
}

pub fn run(args: ReproArgs) -> Result<Exit> {
    let plan = match plan(&args) {
        Ok(p) => p,
        Err(e) if e.downcast_ref::<CannotTest>().is_some() => {
            errln!("fraglab repro: could not test: {e:#}");
            return Ok(Exit::CouldNotTest);
        }
        Err(e) => {
            errln!("fraglab repro: {e:#}");
            return Ok(Exit::Error);
        }
    };
    out!("{}", describe(&plan, &args));
    if args.dry_run {
        return Ok(Exit::Ok);
    }
    std::fs::create_dir_all(&plan.output)
        .with_context(|| format!("cannot create {}", plan.output.display()))?;
    if !plan.target_lines.is_empty() {
        write(&plan.output.join(TARGET_FILE), &(plan.target_lines.join("\n") + "\n"))?;
    }
    write(&plan.output.join(CONFIG_FILE), &plan.config)?;
    outln!("wrote {} (rerun it: {})", plan.output.join(CONFIG_FILE).display(), rerun(&plan, &args));

    let mut rounds = Vec::new();
    for n in 1..=args.rounds {
        outln!("\nround {n} of {}: fraglab {}", args.rounds, vm_argv(&plan, &args, n).join(" "));
        let argv = std::iter::once("fraglab".to_string()).chain(vm_argv(&plan, &args, n));
        let cli = Cli::try_parse_from(argv).context("the vm command repro builds")?;
        let Command::Vm(vm) = cli.command else { bail!("the vm command repro builds is not `vm`") };
        let exit = crate::vm::run(vm)?;
        let round = judge(&plan, &plan.output.join(format!("round-{n}")), exit);
        outln!("round {n}: {}", round.1);
        let done = matches!(round.0, Verdict::Reproduced | Verdict::Interrupted);
        rounds.push(round);
        if done {
            break;
        }
    }
    let (verdict, why) = answer(&rounds, args.rounds);
    outln!("\nfraglab repro: {}: {why}", verdict_name(verdict));
    Ok(match verdict {
        Verdict::Reproduced => Exit::Failed,
        Verdict::NotReproduced => Exit::Ok,
        Verdict::Interrupted => Exit::Interrupted,
        Verdict::CouldNotTest => Exit::CouldNotTest,
    })
}

/// Parse, then resolve: the report read, the path chosen, the guest shaped and the config written
/// in memory. Nothing is touched.
pub fn plan(args: &ReproArgs) -> Result<Plan> {
    if args.rounds == 0 {
        bail!("--rounds 0: give at least 1");
    }
    let bytes =
        std::fs::read(&args.report).with_context(|| format!("cannot read {}", args.report.display()))?;
    let report = report::read(&bytes, &args.report)?;
    let f = report.chosen().clone();
    let name = report.file.clone();
    if let Some(kb) = f.page_kb().filter(|&kb| kb != 4) {
        bail!(
            "{name}:{}: the report's free areas count {kb}kB pages: the guest (x86-64) has 4 kB pages, so \
             its orders are not the report's",
            f.zones[0].0
        );
    }
    let pages = Pages::X86_64;
    let route = route::choose(f.order, &f.path, &f.stack, &pages).map_err(|e| match e {
        route::Refusal::CannotTest(why) => {
            anyhow::Error::new(CannotTest(format!("{name}:{}: {why}", f.line)))
        }
        route::Refusal::Unlike(why) => anyhow::anyhow!("{name}:{}: {why}", f.line),
    })?;

    let cannot = |why: String| anyhow::Error::new(CannotTest(format!("{name}:{}: {why}", f.line)));
    let gfp = f.gfp.as_ref().map_or(&[][..], |g| &g.flags[..]);
    if gfp.iter().any(|g| g == "GFP_DMA") {
        return Err(cannot(format!(
            "the order-{} allocation was GFP_DMA: it could come from ZONE_DMA only, which fraglab never \
             shapes (the kernel keeps it for DMA)",
            f.order
        )));
    }
    // The target: the chosen failure's free areas, except DMA (the kernel keeps it for DMA).
    let zones: Vec<_> = f.zones.iter().filter(|(_, a)| a.zone.as_deref() != Some("DMA")).collect();
    if let Some((line, a)) =
        zones.iter().find(|(_, a)| !matches!(a.zone.as_deref(), Some("DMA32" | "Normal")))
    {
        return Err(cannot(format!(
            "line {line}: zone {}: an x86-64 guest's zones are DMA, DMA32 and Normal",
            a.zone.as_deref().unwrap_or("(none named)")
        )));
    }
    if let Some((line, a)) =
        zones.iter().find(|(_, a)| a.free.iter().skip(pages.max_order as usize + 1).any(|&n| n > 0))
    {
        return Err(cannot(format!(
            "line {line}: free blocks of order {} and above: the guest's largest order is {}",
            pages.max_order + 1,
            a.free.len().min(pages.max_order as usize + 1) - 1
        )));
    }
    let target_lines: Vec<String> = zones.iter().map(|(_, a)| a.to_line()).collect();
    let mut target_notes = Vec::new();
    if zones.is_empty() && !f.zones.is_empty() {
        target_notes.push(
            "the report's only free areas were DMA's, which the kernel keeps: the target is max free order"
                .into(),
        );
    }
    for (line, a) in &zones {
        let at_or_above: u64 = a.free.iter().skip(f.order as usize).sum();
        if at_or_above > 0 {
            target_notes.push(format!(
                "line {line}: {} still had {at_or_above} free block(s) of order ≥ {}: that zone did not fail \
                 for want of a block (a watermark, the allocation's zone or node limits, or another zone's)",
                a.zone.as_deref().unwrap_or("?"),
                f.order
            ));
        }
    }
    // Built as printed, every zone would still hold blocks of the failed order: the allocation would
    // find one, so a pass would say nothing about the kernel.
    if !zones.is_empty() && target_notes.len() == zones.len() {
        return Err(cannot(format!(
            "every zone of the failure's Mem-Info still had free blocks of order ≥ {}: the reporter's \
             allocation did not fail for want of a block ({}), so shaping memory like it cannot fail one",
            f.order,
            target_notes.iter().map(|n| n.split(':').next().unwrap_or("")).collect::<Vec<_>>().join(", ")
        )));
    }
    let (guest, guest_why) = guest(&report, &target_lines)?;
    let output = args.output.clone().unwrap_or_else(|| {
        let stem = args.report.file_stem().map_or("report".into(), |s| s.to_string_lossy().into_owned());
        PathBuf::from(format!("repro-{stem}"))
    });
    if !args.dry_run && std::fs::read_dir(&output).is_ok_and(|mut d| d.next().is_some()) {
        bail!(
            "{}: exists and is not empty (an earlier repro's results?): give another -o DIR or remove it",
            output.display()
        );
    }
    let config = config(&report, &route, &target_lines, &name);
    Ok(Plan { report, route, target_lines, target_notes, guest, guest_why, config, output })
}

/// The guest for the report: `--numa-from` the target file when the host can give the memory its
/// lines need unscaled, else the report's node count in what the host can give (each line then
/// scaled to its zone, as the fragmenter says), and SCTP's module loaded when the path needs it.
fn guest(report: &Report, target_lines: &[String]) -> Result<(Vec<String>, String)> {
    let f = report.chosen();
    let ram = f.ram_pages.map_or_else(
        || "the report does not say its RAM".to_string(),
        |(line, p)| {
            format!(
                "the report's machine had {} (line {line}: {p} pages RAM)",
                fraglab_units::format_size(p.saturating_mul(f.page_kb().unwrap_or(4) << 10))
            )
        },
    );
    if target_lines.is_empty() {
        return Ok((
            vec!["--mem".into(), "1G".into()],
            format!("no Mem-Info free areas to shape: a 1 GiB guest; {ram}"),
        ));
    }
    let lines = parse_profile_file(&(target_lines.join("\n") + "\n"), Path::new(TARGET_FILE))
        .map_err(|e| anyhow::anyhow!("{}: the report's free areas: {e}", report.file))?;
    let available = fraglab_fragmenter::fragment::mem_available()? >> 20;
    let most = available.saturating_sub(1 << 10);
    match crate::vm::numa::nodes_for(&lines, most) {
        Ok(nodes) => {
            let each: Vec<String> = nodes.iter().map(|n| n.describe()).collect();
            Ok((
                vec!["--numa-from".into(), TARGET_FILE.into()],
                format!(
                    "a node each as the report's, sized for its lines unscaled, and a spare node for the reserve: {}; {ram}",
                    each.join(", ")
                ),
            ))
        }
        Err(e) => {
            let nodes = lines.iter().map(|l| l.node + 1).max().unwrap_or(1);
            let mib = (most.min(4 << 10) / 128) * 128;
            if mib < 1024 {
                bail!(CannotTest(format!(
                    "{e}; and this host has {available} MiB available, too little for a scaled guest of 1 GiB \
                     beside what it keeps for itself"
                )));
            }
            Ok((
                vec!["--numa".into(), nodes.to_string(), "--mem".into(), format!("{mib}M")],
                format!("SCALED: {e}; so {nodes} node(s) in {mib} MiB, each line scaled to its zone; {ram}"),
            ))
        }
    }
}

/// The scenario as an ordinary config, each value commented with where it came from.
fn config(report: &Report, route: &Route, target_lines: &[String], name: &str) -> String {
    let f = report.chosen();
    let mut c = String::new();
    let site = f.site_name();
    let _ = writeln!(c, "# Written by `fraglab repro {name}`: edit and rerun it as any config.");
    let _ = writeln!(c, "# The failure: {}", f.describe());
    let _ = writeln!(c, "#   call site: {site}; {}", f.outcome());
    if let Some(r) = &f.release {
        let _ = writeln!(c, "#   the reporter's kernel: {r}");
    }
    let _ = writeln!(c, "#   why this one: {}", report.why);
    let _ = writeln!(c, "# The path: {}: {}", route.reach.name(), route.reason);
    let slug: String = site
        .split(' ')
        .next()
        .unwrap_or("report")
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' { ch } else { '-' })
        .collect();
    let _ = writeln!(c, "[run]\nname = \"repro-{}-order{}\"", slug.trim_matches('-'), f.order);
    let desc = format!("{} ({name})", f.describe()).replace('\\', "\\\\").replace('"', "\\\"");
    let _ = writeln!(c, "description = \"{desc}\"\n");
    let _ = writeln!(c, "[fragment]");
    if target_lines.is_empty() {
        let _ = writeln!(c, "# The report has {NO_FREE_AREAS}: no free block of the failed order or above.");
        let _ = writeln!(c, "max_free_order = {}", f.order.max(1));
    } else {
        let lines: Vec<String> = f.zones.iter().map(|(l, _)| l.to_string()).collect();
        let _ = writeln!(
            c,
            "# The Mem-Info free areas printed with the failure (lines {} of {name}), DMA left",
            lines.join(", ")
        );
        let _ = writeln!(c, "# to the kernel; each line cut in its own node and zone.");
        let _ = writeln!(c, "profile_file = \"{TARGET_FILE}\"");
    }
    let _ = writeln!(c, "\n[probe]\ncatch_min_order = {}\n", f.order.max(1));
    let _ = writeln!(c, "[[workload]]\n# {}", route.workload.what);
    for (k, v) in &route.workload.keys {
        let _ = writeln!(c, "{k} = {v}");
    }
    let _ =
        writeln!(c, "\n# Reproduced: the order-{} failure caught with one of these on its stack.", f.order);
    let _ = writeln!(c, "[expect]\nfailed_order = {}", f.order);
    if !route.failed_in.is_empty() {
        let names: Vec<String> = route.failed_in.iter().map(|n| format!("\"{n}\"")).collect();
        let _ = writeln!(c, "failed_in = [{}]", names.join(", "));
    }
    c
}

fn vm_argv(plan: &Plan, args: &ReproArgs, round: u32) -> Vec<String> {
    let dir = |f: &str| plan.output.join(f).display().to_string();
    let mut v = vec![
        "vm".to_string(),
        "--kernel".into(),
        args.kernel.clone(),
        "--timeout".into(),
        args.timeout.clone(),
    ];
    if let Some(m) = &args.modules {
        v.extend(["--modules".into(), m.display().to_string()]);
    }
    for g in &plan.guest {
        v.push(if g == TARGET_FILE { dir(TARGET_FILE) } else { g.clone() });
    }
    v.extend([
        "--results".into(),
        dir(&format!("round-{round}")),
        "--".into(),
        "run".into(),
        dir(CONFIG_FILE),
    ]);
    v.extend(["-o".into(), "runs".into()]);
    v
}

fn rerun(plan: &Plan, args: &ReproArgs) -> String {
    let mut v = vm_argv(plan, args, 1);
    let at = v.iter().position(|a| a == "--results").expect("vm_argv gives --results");
    v.drain(at..at + 2);
    format!("fraglab {}", v.join(" "))
}

/// One round's verdict, from its run's results: reproduced only as the route means it (the failure
/// caught in the path for a same-site route).
fn judge(plan: &Plan, dir: &Path, exit: Exit) -> (Verdict, String) {
    let runs = find_runs(dir, 3);
    let Some(run) = runs.first().and_then(|d| Run::load(d).ok()) else {
        return (
            Verdict::CouldNotTest,
            format!("no run results came back from the guest (fraglab vm exit {})", exit.code()),
        );
    };
    let verdict = run.record.verdict.unwrap_or(Verdict::CouldNotTest);
    let f = plan.report.chosen();
    let mut why = format!("{} ({})", verdict_name(verdict), run.record.reason);
    let caught: Vec<_> = run
        .failures
        .iter()
        .filter(|c| c.order == f.order)
        .filter(|c| {
            plan.route
                .failed_in
                .iter()
                .any(|w| c.stack.iter().any(|s| fraglab_probe::stack::function_name(s) == Some(w)))
        })
        .collect();
    if let Some(c) = caught.first() {
        let site = fraglab_probe::stack::call_site(&c.stack).map_or_else(|| "?".into(), |s| s.to_string());
        let _ = write!(
            why,
            "\n  the report's: {}\n  caught:       {} order-{} {} in {site} (×{})",
            f.describe(),
            c.comm,
            c.order,
            c.gfp_flags.join("|"),
            caught.iter().map(|c| c.count()).sum::<u64>()
        );
    }
    // The report's free areas beside the guest's buddyinfo line when the hold began, per zone: the
    // machine the failure met, against the one the lab made (scaled when the guest is smaller).
    if let Some(fidelity) = run.record.fragment.as_ref().and_then(|s| s.fidelity_at_hold.as_ref()) {
        let nums = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
        for z in &fidelity.zones {
            let report = f.zones.iter().find(|(_, a)| {
                format!("Node {}, zone {}", a.node.unwrap_or(0), a.zone.as_deref().unwrap_or("?")) == z.zone
            });
            let _ = write!(
                why,
                "\n  {}: report {} | asked {} | had {} when the hold began ({})",
                z.zone,
                report.map_or_else(|| "-".into(), |(_, a)| nums(&a.free[..z.target.len().min(a.free.len())])),
                nums(&z.target),
                nums(&z.achieved),
                if z.within { "within" } else { "off the profile" }
            );
        }
    }
    let verdict = match (verdict, plan.route.reach, caught.is_empty()) {
        (Verdict::Reproduced, Reach::SameSite, true) => {
            why.push_str("\n  but no order-N failure was caught in the report's path: the run's reason is not the report's failure");
            Verdict::CouldNotTest
        }
        (v, _, _) => v,
    };
    (verdict, why)
}

/// The rounds together (of `asked`; a reproduced round ends them): reproduced in any, not
/// reproduced only when every round said so.
fn answer(rounds: &[(Verdict, String)], asked: u32) -> (Verdict, String) {
    if let Some((i, r)) = rounds.iter().enumerate().find(|(_, r)| r.0 == Verdict::Reproduced) {
        return (
            Verdict::Reproduced,
            format!("in round {} of {asked}: {}", i + 1, r.1.lines().next().unwrap_or("")),
        );
    }
    if rounds.iter().all(|r| r.0 == Verdict::NotReproduced) {
        return (
            Verdict::NotReproduced,
            format!("in all {} rounds, the target held for every window", rounds.len()),
        );
    }
    let r = rounds.iter().find(|r| r.0 != Verdict::NotReproduced).expect("one round is not not-reproduced");
    (r.0, r.1.lines().next().unwrap_or("").to_string())
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Reproduced => "reproduced",
        Verdict::NotReproduced => "not reproduced",
        Verdict::CouldNotTest => "could not test",
        Verdict::Interrupted => "interrupted",
    }
}

/// What `--dry-run` prints, and a run prints first.
fn describe(plan: &Plan, args: &ReproArgs) -> String {
    let r = &plan.report;
    let f = r.chosen();
    let mut o = String::new();
    let _ = writeln!(o, "{}: {} lines, {} page allocation failure(s)", r.file, r.lines, r.failures.len());
    for (i, x) in r.failures.iter().enumerate() {
        let mark = if i == r.chosen { "*" } else { " " };
        let _ = writeln!(o, " {mark} {}; {}; {}", x.describe(), x.site_name(), x.outcome());
    }
    let _ = writeln!(o, "reproducing the one marked *: {}", r.why);
    let _ = writeln!(o, "  kernel: {}", f.release.as_deref().unwrap_or("(no CPU: line with a release)"));
    let _ = writeln!(o, "path: {}: {}", plan.route.reach.name(), plan.route.reason);
    if let Some(m) = &plan.route.missing {
        let _ = writeln!(o, "  missing for the same call site: {m}");
    }
    if plan.route.workload.needs_sctp {
        let _ = writeln!(o, "  needs SCTP (Debian's cloud kernel has the module; the guest loads it)");
    }
    let _ = writeln!(o, "target:");
    if plan.target_lines.is_empty() {
        let _ = writeln!(o, "  {NO_FREE_AREAS}: max free order {}", f.order.max(1));
    }
    for l in &plan.target_lines {
        let _ = writeln!(o, "  {l}");
    }
    for n in &plan.target_notes {
        let _ = writeln!(o, "  note: {n}");
    }
    let _ = writeln!(o, "guest: {}: {}", plan.guest.join(" "), plan.guest_why);
    let _ = writeln!(o, "kernel under test: {}, up to {} round(s)", args.kernel, args.rounds);
    let _ = writeln!(o, "config ({}):\n{}", plan.output.join(CONFIG_FILE).display(), plan.config);
    o
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
