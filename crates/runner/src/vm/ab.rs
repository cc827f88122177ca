//! `fraglab vm --kernel BASE --kernel PATCHED --rounds N -- run CONFIG`: the pre-merge A/B. Each
//! kernel boots N times for the same run, interleaved (base, patched, base, …) so drift on the host
//! hits both alike; every round's results directory lands in `<output>/<name>-ab-<timestamp>/`; the
//! rounds of each side are pooled and compared (fraglab_report::compare), judged
//! (fraglab_report::ab), drawn (report.html), and the judgement is the exit status.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use fraglab_report::ab::{self, Judgement, Round, Side};
use fraglab_report::compare::{Comparison, RunData};
use fraglab_results::record::{RunStatus, Verdict};
use fraglab_results::SCHEMA;
use serde::Serialize;

use super::boot::{boot_and_report, Booted, Guest, Plan};
use super::kernel;
use clap::Parser;

use crate::cli::{Cli, Command, VmArgs};
use crate::exit::Exit;

/// Rounds per kernel without `--rounds`: the fewest that give each side a spread for Welch's test
/// and a second chance to see a failure, and still fit a coffee under TCG.
pub const DEFAULT_ROUNDS: u32 = 3;

/// ab.json: the whole A/B in one document.
#[derive(Serialize)]
struct AbRecord<'a> {
    schema: u32,
    name: &'a str,
    /// The guest command, as given after `--`.
    command: &'a [String],
    rounds_per_kernel: u32,
    sides: &'a [Side],
    rounds: &'a [Round],
    judgement: &'a Judgement,
    /// Why there is no comparison, when there is none.
    comparison_missing: Option<&'a str>,
}

/// What the A/B runs, checked before anything boots.
struct AbPlan {
    name: String,
    /// `<output>/<name>-ab-<timestamp>`, created once the kernels resolve.
    output: PathBuf,
    rounds: u32,
}

fn check(args: &VmArgs) -> Result<AbPlan> {
    if args.script.is_some() {
        bail!("an A/B compares `fraglab run` results: give `-- run CONFIG`, not --script");
    }
    if args.results.is_some() {
        bail!(
            "an A/B writes to the run's own results directory (<output>/<name>-ab-<timestamp>/); \
             move it with `-- run CONFIG -o DIR`, not --results"
        );
    }
    let rounds = args.rounds.unwrap_or(DEFAULT_ROUNDS);
    if rounds == 0 || rounds > 100 {
        bail!("--rounds {rounds}: give 1 to 100");
    }
    let argv = std::iter::once("fraglab".to_string()).chain(args.command.iter().cloned());
    let run = match Cli::try_parse_from(argv).map(|c| c.command) {
        Ok(Command::Run(r)) => r,
        _ => bail!(
            "an A/B compares `fraglab run` results: the guest command must be `run CONFIG` (got `{}`)",
            args.command.join(" ")
        ),
    };
    if run.dry_run {
        bail!("`run --dry-run` takes nothing and judges nothing: run the A/B without it");
    }
    let cfg = crate::config::Source::read(&run.config)?.parse()?;
    let output = run.output.unwrap_or(cfg.run.output);
    // Absolute, the A/B directory would be there on the host too; `../x` leaves /results in the
    // guest as surely as `/x` does.
    if output.is_absolute() || !super::boot::comes_back(&output) {
        bail!(
            "the run writes its results under {}, outside the guest's /results, so they would not come back; \
             give a relative -o DIR below the current directory",
            output.display()
        );
    }
    // Found before the results directory is made: a missing qemu is no round that could not test.
    super::boot::find_program(&args.qemu).with_context(|| {
        format!(
            "--qemu {}: not found (install it: apt-get install --no-install-recommends qemu-system-x86)",
            args.qemu.display()
        )
    })?;
    Ok(AbPlan { name: cfg.run.name, output, rounds })
}

/// Run the A/B. Bad input — flags, a config that does not parse — is refused with 255 before
/// anything boots, as `fraglab run` refuses a bad config (a bisection stops rather than skips); a
/// kernel that cannot be fetched, read or booted is 125, as for one kernel.
pub(super) fn run(args: &VmArgs) -> Result<Exit> {
    let checked = super::boot::kernel_args(args).and_then(|k| {
        if k.len() != 2 {
            bail!("--rounds repeats an A/B: give two --kernel (the base first, then the patched)");
        }
        Ok((k, super::boot::check(args)?, check(args)?))
    });
    let (kernels, plan, ab_plan) = match checked {
        Ok(c) => c,
        Err(e) => {
            errln!("fraglab vm: {e:#}");
            return Ok(Exit::Error);
        }
    };
    let cache = kernel::cache_dir();
    let mut guests = Vec::new();
    for (arg, modules) in &kernels {
        let label = arg.label.clone().expect("two kernels are labelled");
        let k = kernel::resolve(&arg.spec, modules.as_deref(), &cache, args.verbose)
            .with_context(|| format!("kernel {label}"))?;
        guests.push((label, arg.spec.clone(), k));
    }
    let mut prepared = Vec::new();
    for (label, spec, k) in guests {
        match Guest::prepare(args, &plan, k) {
            Ok(g) => prepared.push((label, spec, g)),
            Err(e) => {
                for (_, _, g) in &prepared {
                    g.clean_up(args.keep);
                }
                return Err(e);
            }
        }
    }
    let result = rounds(args, plan, &ab_plan, &prepared, &cache);
    for (_, _, g) in &prepared {
        g.clean_up(args.keep);
    }
    result
}

fn rounds(
    args: &VmArgs,
    mut plan: Plan,
    ab_plan: &AbPlan,
    guests: &[(String, String, Guest)],
    cache: &Path,
) -> Result<Exit> {
    let dir = fraglab_results::dir::ResultsDir::create(&ab_plan.output, &format!("{}-ab", ab_plan.name))?.dir;
    let width = guests.iter().map(|(l, ..)| l.len()).max().unwrap_or(0);
    errln!(
        "fraglab vm: A/B of {}: {}; {} rounds each, interleaved; results in {}",
        ab_plan.name,
        guests
            .iter()
            .map(|(l, spec, g)| format!(
                "{l} = {spec} ({})",
                g.kernel.release.as_deref().unwrap_or("release unknown")
            ))
            .collect::<Vec<_>>()
            .join(", "),
        ab_plan.rounds,
        dir.display()
    );
    let mut rounds = Vec::new();
    for n in 1..=ab_plan.rounds {
        for (label, _, guest) in guests {
            let round_dir = dir.join(format!("{label}-{n}"));
            let scratch = dir.join(format!(".{label}-{n}.incoming"));
            std::fs::create_dir_all(&scratch)
                .with_context(|| format!("cannot create {}", scratch.display()))?;
            plan.results = Some(scratch.clone());
            plan.guest_output = Some(scratch.join(GUEST_OUTPUT));
            let start = Instant::now();
            // A boot that breaks (an archive that does not unpack, a socket that cannot be made) is
            // a round that could not test, not the end of the rounds already run.
            let booted = boot_and_report(args, &plan, guest, cache);
            let seconds = start.elapsed().as_secs_f64();
            let r = match booted {
                Ok(b) => collect(label, n, &scratch, &round_dir, &guest.console_log(), &b, seconds),
                Err(e) => Err(e),
            }
            .unwrap_or_else(|e| Round {
                label: label.clone(),
                round: n,
                dir: None,
                exit: i32::from(Exit::CouldNotTest.code()),
                verdict: Verdict::CouldNotTest,
                reason: format!("the boot broke: {e:#}"),
                seconds,
                accel: String::new(),
                warnings: Vec::new(),
            });
            let _ = std::fs::remove_dir_all(&scratch);
            // The round keeps its console; the copy in the work directory is overwritten next boot.
            guest.forget_cited_console();
            errln!(
                "round {n}/{}  {label:<width$}  {:<15} exit {:<3}  {seconds:>6.1} s  {}",
                ab_plan.rounds,
                r.verdict.name(),
                r.exit,
                if r.dir.is_some() { round_dir.display().to_string() } else { r.reason.clone() },
            );
            // 255 with nothing back is bad input the host could not see (a config the guest's
            // fraglab refused): every later round would say the same, and a bisection must stop.
            let refused = r.exit == i32::from(Exit::Error.code()) && r.dir.is_none();
            rounds.push(r);
            if refused {
                errln!(
                    "fraglab vm: the guest's fraglab refused the command (exit 255; see {}): stopping the A/B",
                    round_dir.join(GUEST_OUTPUT).display()
                );
                return Ok(Exit::Error);
            }
        }
    }

    let sides: Vec<Side> = guests
        .iter()
        .map(|(label, spec, g)| Side::of(label, spec, g.kernel.release.clone(), &rounds))
        .collect();
    let comparison = pooled_comparison(&dir, &sides, &rounds).map_err(|e| format!("{e:#}"));
    let accels: Vec<&str> = rounds.iter().map(|r| r.accel.as_str()).filter(|a| !a.is_empty()).collect();
    let judgement = ab::judge(&sides[0], &sides[1], comparison.as_ref().map_err(String::as_str), &accels);

    let mut text = String::new();
    match &comparison {
        Ok(c) => {
            text += &crate::commands::compare::text(c);
            write(&dir.join("comparison.json"), &(serde_json::to_string_pretty(c)? + "\n"))?;
        }
        Err(why) => text += &format!("no comparison: {why}\n"),
    }
    text += "\nA/B\n";
    for s in &sides {
        text += &format!(
            "  {:<width$}  {} ({}): {}\n",
            s.label,
            s.kernel,
            s.release.as_deref().unwrap_or("release unknown"),
            s.tally()
        );
        for (n, why) in &s.tainted {
            text += &format!("  {:<width$}  round {n}: {why}\n", "");
        }
    }
    text += &format!(
        "verdict: {} — {} (exit {})\n",
        judgement.change.name(),
        judgement.reason,
        judgement.change.exit_code()
    );
    write(&dir.join("comparison.txt"), &text)?;
    let record = AbRecord {
        schema: SCHEMA,
        name: &ab_plan.name,
        command: &args.command,
        rounds_per_kernel: ab_plan.rounds,
        sides: &sides,
        rounds: &rounds,
        judgement: &judgement,
        comparison_missing: comparison.as_ref().err().map(String::as_str),
    };
    write(&dir.join("ab.json"), &(serde_json::to_string_pretty(&record)? + "\n"))?;
    out!("{text}");
    match write_report(&dir, &sides, &rounds) {
        Ok(Some(p)) => errln!("report: {}", p.display()),
        Ok(None) => {}
        Err(e) => errln!("fraglab vm: no report: {e:#}"),
    }
    errln!("results: {}", dir.display());
    Ok(Exit::Guest(judgement.change.exit_code()))
}

/// The guest command's stdout and stderr in a round's directory.
const GUEST_OUTPUT: &str = "guest-output.log";

/// Move what one boot sent back into `<ab>/<label>-<n>/` and read its verdict. The run's results
/// directory becomes that directory; the guest's output and the kernel console go beside its files.
fn collect(
    label: &str,
    n: u32,
    scratch: &Path,
    round_dir: &Path,
    console: &Path,
    booted: &Booted,
    seconds: f64,
) -> Result<Round> {
    let exit = booted.exit;
    let runs = run_dirs(scratch);
    let (dir, verdict, reason) = match runs.as_slice() {
        [one] => {
            std::fs::rename(one, round_dir)
                .with_context(|| format!("cannot move {} to {}", one.display(), round_dir.display()))?;
            let (verdict, reason) = round_verdict(round_dir);
            (Some(round_dir.to_path_buf()), verdict, reason)
        }
        [] => {
            std::fs::create_dir_all(round_dir)
                .with_context(|| format!("cannot create {}", round_dir.display()))?;
            let why = format!(
                "no results came back (fraglab vm exit {}; see {}/{})",
                exit.code(),
                round_dir.display(),
                if std::fs::metadata(scratch.join(GUEST_OUTPUT)).is_ok_and(|m| m.len() > 0) {
                    GUEST_OUTPUT
                } else {
                    "console.log"
                }
            );
            (None, Verdict::CouldNotTest, why)
        }
        many => bail!(
            "round {n} of {label} sent back {} results directories ({}); expected the one run",
            many.len(),
            many.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    for (from, name) in [(scratch.join(GUEST_OUTPUT), GUEST_OUTPUT), (console.to_path_buf(), "console.log")] {
        if from.exists() {
            std::fs::copy(&from, round_dir.join(name))
                .with_context(|| format!("cannot copy {} into {}", from.display(), round_dir.display()))?;
        }
    }
    Ok(Round {
        label: label.to_string(),
        round: n,
        dir,
        exit: i32::from(exit.code()),
        verdict,
        reason,
        seconds,
        accel: booted.accel.to_string(),
        warnings: booted.warnings.clone(),
    })
}

/// Directories under `root` holding a run.json, not looking inside one.
fn run_dirs(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        if d.join("run.json").is_file() {
            found.push(d);
            continue;
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            todo.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    found.sort();
    found
}

/// A round's verdict from its run.json: only a complete run's verdict counts.
fn round_verdict(dir: &Path) -> (Verdict, String) {
    let path = dir.join("run.json");
    let record = std::fs::read(&path)
        .map_err(anyhow::Error::from)
        .and_then(|t| fraglab_results::load::parse_run(&t, &path));
    match record {
        Ok(r) => match (r.status, r.verdict) {
            (RunStatus::Complete, Some(v)) => (v, r.reason),
            (status, _) => (Verdict::CouldNotTest, format!("the run is {}: {}", status.name(), r.reason)),
        },
        Err(e) => (Verdict::CouldNotTest, format!("{e:#}")),
    }
}

/// Each side's rounds pooled into one run, base first, compared.
fn pooled_comparison(dir: &Path, sides: &[Side], rounds: &[Round]) -> Result<Comparison> {
    let mut pooled = Vec::new();
    for s in sides {
        // Only rounds that ran their whole window: an incomplete run's partial metrics would weigh
        // as much as a whole one's.
        let runs = rounds
            .iter()
            .filter(|r| r.label == s.label)
            .filter(|r| matches!(r.verdict, Verdict::Reproduced | Verdict::NotReproduced))
            .filter_map(|r| r.dir.as_deref())
            .map(|d| {
                let run = fraglab_results::load::Run::load_with(d, fraglab_results::load::Samples::Ends)?;
                RunData::new(run, &format!("{}-round", s.label), &crate::runplan::legacy_plan)
            })
            .collect::<Result<Vec<_>>>()?;
        if runs.is_empty() {
            bail!("{} has no round with results", s.label);
        }
        let mut side = RunData::pool(&s.label, &dir.join(format!("{}-*", s.label)), runs)?;
        side.run.record.verdict = Some(s.verdict);
        side.run.record.reason = s.tally();
        // A base and a patched build of one source report one release: name the kernel too, so
        // the comparison tells them apart (and warns of one kernel only when it is one).
        side.run.record.kernel_release = format!("{} ({})", side.run.record.kernel_release, s.kernel);
        pooled.push(side);
    }
    fraglab_report::compare::compare(&pooled)
}

/// report.html with every round that has results, the base's first.
fn write_report(dir: &Path, sides: &[Side], rounds: &[Round]) -> Result<Option<PathBuf>> {
    let dirs: Vec<PathBuf> = sides
        .iter()
        .flat_map(|s| rounds.iter().filter(move |r| r.label == s.label))
        .filter_map(|r| r.dir.clone())
        .collect();
    let Some((first, rest)) = dirs.split_first() else { return Ok(None) };
    let report = fraglab_report::generate(first, rest)?;
    let path = dir.join("report.html");
    std::fs::write(&path, report.html).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Some(path))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
