//! Resolve a parsed config into a [`RunPlan`]: every size, duration, sysctl name, workload option and
//! sweep key checked against this machine before anything is taken or changed.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use fraglab_probe::snapshot::Monitor;

use crate::config::{Config, Source};
use crate::resolve::{self, Machine};
use fraglab_results::point::{plain, Point};
use fraglab_results::record::{PlanRecord, RunRecord, SweepAxis, WorkloadSpec};
use fraglab_units::parse_duration;
use fraglab_workload::room::{Limits, Room};
use fraglab_workload::Kind;

/// Everything `fraglab run` will do, validated.
#[derive(Debug)]
pub struct RunPlan {
    pub name: String,
    pub description: Option<String>,
    pub iterations: u32,
    pub output: PathBuf,
    pub config_path: PathBuf,
    pub config_text: String,
    pub fragment: Option<fraglab_fragmenter::Plan>,
    /// A workload window whose target was lost for longer than this cannot say "not reproduced".
    pub lost_tolerance: Duration,
    pub monitors: BTreeSet<Monitor>,
    pub interval: Duration,
    pub catch_min_order: u32,
    pub kmsg: bool,
    pub points: Vec<SweepPoint>,
    pub expect: Expect,
    /// The plan as run.json stores it, for readers that must not re-resolve the config text.
    pub record: PlanRecord,
}

/// One cell of the sweep matrix: sysctls to set and the workloads to run there.
#[derive(Debug)]
pub struct SweepPoint {
    /// `{threads: 4, sysctl.net.core.high_order_alloc_disable: 1}`; empty when there is no sweep.
    pub point: Point,
    /// `threads=4 sysctl.net.core.high_order_alloc_disable=1`, or `-` when there is no sweep.
    pub label: String,
    pub sysctls: Vec<(String, String)>,
    pub workloads: Vec<Workload>,
}

#[derive(Debug)]
pub struct Workload {
    /// `tcp-stream`, `trigger`, ...
    pub kind_name: String,
    pub kind: Kind,
}

pub use fraglab_results::record::Expect;

/// How long a workload's window may see the target lost and still say "not reproduced": ten of the
/// keeper's looks — a block seen and re-broken at one look counts from the look before it.
pub const DEFAULT_LOST_TOLERANCE: Duration = Duration::from_millis(100);

/// A config's `profile_file`, relative to the config's own directory as a path in a file reads.
pub fn profile_file_beside(src: &Source, spec: &resolve::FragmentSpec) -> Option<String> {
    spec.profile_file.as_ref().map(|p| match src.path.parent() {
        Some(dir) if std::path::Path::new(p).is_relative() => dir.join(p).display().to_string(),
        _ => p.clone(),
    })
}

/// Build the plan. `m` is what the machine allows, read once by the caller.
pub fn resolve(src: &Source, cfg: &Config, m: &Machine) -> Result<RunPlan> {
    if cfg.run.name.trim().is_empty() || cfg.run.name.contains('/') {
        bail!("{}: {:?} must be a non-empty name without '/'", src.locate(&["run", "name"]), cfg.run.name);
    }
    if cfg.run.iterations == 0 {
        bail!("{}: must be at least 1", src.locate(&["run", "iterations"]));
    }
    let lost_tolerance = match cfg.fragment.as_ref().and_then(|f| f.lost_tolerance.as_deref()) {
        None => DEFAULT_LOST_TOLERANCE,
        Some(t) => parse_duration(t)
            .map_err(|e| anyhow::anyhow!("{}: {e}", src.locate(&["fragment", "lost_tolerance"])))?,
    };
    let interval = parse_duration(&cfg.probe.interval)
        .map_err(|e| anyhow::anyhow!("{}: {e}", src.locate(&["probe", "interval"])))?;
    if interval.is_zero() {
        bail!("{}: the sampling interval must be above zero", src.locate(&["probe", "interval"]));
    }
    let (mut available, _) = Monitor::available();
    let monitors = if cfg.probe.monitors.is_empty() {
        // pagetypeinfo holds the zone lock with interrupts off while it walks every free list: in
        // a series only when the config asks for it (baseline and final snapshots have it).
        available.remove(&Monitor::Pagetypeinfo);
        available
    } else {
        let mut set = BTreeSet::new();
        for (i, name) in cfg.probe.monitors.iter().enumerate() {
            let m = Monitor::parse(name).map_err(|e| {
                anyhow::anyhow!("{}: {e}", src.locate(&["probe", "monitors", &i.to_string()]))
            })?;
            if !available.contains(&m) {
                bail!("{}: cannot read {} here (root only?)", src.locate(&["probe", "monitors"]), m.path());
            }
            set.insert(m);
        }
        set
    };
    let fragmenting = cfg.fragment.as_ref().is_some_and(|f| f.enabled);
    if cfg.workload.is_empty() && !fragmenting {
        bail!("{}: nothing to do: add a [[workload]] table or a [fragment] target", src.path.display());
    }
    let expect = Expect {
        errno: cfg.expect.errno.clone(),
        failed_order: cfg.expect.failed_order,
        failed_in: cfg.expect.failed_in.clone(),
    };
    for (i, f) in expect.failed_in.iter().enumerate() {
        if f.is_empty() || !f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            bail!(
                "{}: {f:?} is not a kernel function name as stack traces show it (e.g. sctp_packet_transmit)",
                src.locate(&["expect", "failed_in", &i.to_string()])
            );
        }
    }
    for (i, e) in expect.errno.iter().enumerate() {
        if !known_errno(e) {
            bail!(
                "{}: {e:?} is not an errno name (e.g. ENOMEM, ENOBUFS)",
                src.locate(&["expect", "errno", &i.to_string()])
            );
        }
    }
    if let Some(o) = expect.failed_order {
        if o as usize >= m.nr_orders {
            bail!(
                "{}: order {o} is above this kernel's largest order {}",
                src.locate(&["expect", "failed_order"]),
                m.nr_orders - 1
            );
        }
    }

    // Each workload as JSON options, so sweep values can be set by name and re-validated.
    let mut base = Vec::new();
    for (i, table) in cfg.workload.iter().enumerate() {
        let at = src.locate(&["workload", &i.to_string()]);
        let kind_name = table
            .get("kind")
            .and_then(|k| k.as_str())
            .with_context(|| {
                format!("{at}: every [[workload]] needs kind = \"tcp-stream\" (or another kind)")
            })?
            .to_string();
        let mut options = serde_json::to_value(table)?;
        options.as_object_mut().expect("a TOML table is an object").remove("kind");
        let kind =
            fraglab_workload::from_options(&kind_name, &options).map_err(|e| at_option(src, i, table, &e))?;
        fraglab_workload::validate(&kind).map_err(|e| at_option(src, i, table, &e))?;
        base.push((kind_name, options));
    }

    let axes = sweep_axes(src, cfg, &base)?;
    let mut points = Vec::new();
    for combo in cross(&axes) {
        let mut sysctls = Vec::new();
        let mut workloads = Vec::new();
        let point = Point { axes: combo.clone() };
        let label = point.label();
        for (kind_name, options) in &base {
            let mut options = options.clone();
            for (key, value) in &combo {
                if !key.starts_with("sysctl.") && has_option(kind_name, &options, key) {
                    options[key.as_str()] = value.clone();
                }
            }
            let kind = fraglab_workload::from_options(kind_name, &options)
                .and_then(|k| fraglab_workload::validate(&k).map(|_| k))
                .map_err(|e| anyhow::anyhow!("{}: sweep point {label}: {e:#}", src.locate(&["sweep"])))?;
            workloads.push(Workload { kind_name: kind_name.clone(), kind });
        }
        for (key, value) in &combo {
            if let Some(name) = key.strip_prefix("sysctl.") {
                sysctls.push((name.to_string(), plain(value)));
            }
        }
        points.push(SweepPoint { point, label, sysctls, workloads });
    }
    // Checked once every workload and sweep point is: the room they need beside the target is part
    // of the fragment plan's reserve.
    let fragment = match &cfg.fragment {
        Some(spec) if spec.enabled => {
            let spec = resolve::FragmentSpec { profile_file: profile_file_beside(src, spec), ..spec.clone() };
            let room = workload_room(&points)?;
            Some(resolve::fragment(&spec, m, room.as_ref(), &|k| src.locate(&["fragment", k]))?)
        }
        _ => None,
    };
    let record = PlanRecord {
        fragmenter: fragment.clone(),
        lost_tolerance_s: lost_tolerance.as_secs_f64(),
        interval_s: interval.as_secs_f64(),
        monitors: monitors.iter().map(|m| m.name().to_string()).collect(),
        expect: expect.clone(),
        iterations: cfg.run.iterations,
        catch_min_order: cfg.probe.catch_min_order,
        kmsg: cfg.probe.kmsg,
        // The text parsed as `cfg` did; the raw tables give `[fragment]` as written.
        ..plan_record(&toml::from_str(&src.text).unwrap_or_default(), &base, &axes)
    };

    Ok(RunPlan {
        name: cfg.run.name.clone(),
        description: cfg.run.description.clone(),
        iterations: cfg.run.iterations,
        output: cfg.run.output.clone(),
        config_path: src.path.clone(),
        config_text: src.text.clone(),
        fragment,
        lost_tolerance,
        monitors,
        interval,
        catch_min_order: cfg.probe.catch_min_order,
        kmsg: cfg.probe.kmsg,
        points,
        expect,
        record,
    })
}

/// The most memory any one workload can have the kernel hold in socket buffers at any sweep point
/// (a point's workloads run one after another), read with that point's sysctls in place — a sweep
/// of `net.ipv4.tcp_mem` changes it.
fn workload_room(points: &[SweepPoint]) -> Result<Option<Room>> {
    let mut most: Option<Room> = None;
    for p in points {
        let limits = Limits::read(&p.sysctls);
        for w in &p.workloads {
            if let Some(room) = fraglab_workload::room(&w.kind, &limits)? {
                if most.as_ref().is_none_or(|m| room.bytes > m.bytes) {
                    let at = if p.label == "-" { String::new() } else { format!(" at {}", p.label) };
                    most = Some(Room { why: format!("{}{at}: {}", w.kind_name, room.why), ..room });
                }
            }
        }
    }
    Ok(most)
}

/// What run.json stores of a plan, from the config's tables and its workloads and sweep axes as
/// resolved; the caller adds what needs the machine. Read from the raw tables, defaults as
/// config.rs has them, so the same code serves a schema-1 run's stored text, which today's
/// `Config` may no longer accept.
fn plan_record(
    table: &toml::Table,
    base: &[(String, serde_json::Value)],
    axes: &[(String, Vec<serde_json::Value>)],
) -> PlanRecord {
    let workloads = base
        .iter()
        .map(|(kind, options)| {
            // Every option with its default filled in, so one written out and one left to its
            // default compare equal; a kind this fraglab does not know keeps its options as written.
            let resolved = fraglab_workload::from_options(kind, options)
                .map(|k| fraglab_workload::options(&k))
                .unwrap_or(options.clone());
            WorkloadSpec { kind: kind.clone(), options: resolved.as_object().cloned().unwrap_or_default() }
        })
        .collect();
    let get = |section: &str, key: &str| table.get(section).and_then(|s| s.get(key));
    let strings = |section: &str, key: &str| -> Vec<String> {
        get(section, key)
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let probe = crate::config::ProbeSection::default();
    PlanRecord {
        iterations: get("run", "iterations").and_then(|v| v.as_integer()).map_or(1, |n| n as u32),
        workloads,
        sweep: axes
            .iter()
            .map(|(axis, values)| SweepAxis { axis: axis.clone(), values: values.clone() })
            .collect(),
        points: cross(axes).into_iter().map(|axes| Point { axes }).collect(),
        // The [fragment] table as written: what two runs applied, whatever a machine made of it.
        fragment: table.get("fragment").and_then(|f| serde_json::to_value(f).ok()),
        fragmenter: None,
        lost_tolerance_s: 0.0,
        interval_s: 0.0,
        monitors: Vec::new(),
        catch_min_order: get("probe", "catch_min_order")
            .and_then(|v| v.as_integer())
            .map_or(probe.catch_min_order, |n| n as u32),
        kmsg: get("probe", "kmsg").and_then(|v| v.as_bool()).unwrap_or(probe.kmsg),
        expect: Expect {
            errno: strings("expect", "errno"),
            failed_order: get("expect", "failed_order").and_then(|v| v.as_integer()).map(|n| n as u32),
            failed_in: strings("expect", "failed_in"),
        },
    }
}

/// The plan of a run recorded in results schema 1, which stored only its config text: resolved from
/// that text with this fraglab's defaults, and without the machine (nothing is checked against it).
/// Read leniently — only `[[workload]]`, `[sweep]` and the keys compare uses — so a config an older
/// fraglab accepted still compares. `fraglab compare` says when it had to do this.
pub fn legacy_plan(record: &RunRecord) -> Result<PlanRecord> {
    let table: toml::Table = toml::from_str(&record.config)
        .with_context(|| format!("the config stored in run.json ({}) is not TOML", record.config_path))?;
    let base = table
        .get("workload")
        .and_then(|w| w.as_array())
        .into_iter()
        .flatten()
        .map(|w| {
            let mut options = serde_json::to_value(w)?;
            let kind = options.as_object_mut().and_then(|o| o.remove("kind"));
            Ok((kind.as_ref().and_then(|k| k.as_str()).unwrap_or("?").to_string(), options))
        })
        .collect::<Result<Vec<_>>>()?;
    // In the order `sweep_axes` gives a run: workload options, then sysctls, each by name.
    let mut axes = Vec::new();
    let mut sysctls = Vec::new();
    for (key, values) in table.get("sweep").and_then(|s| s.as_table()).into_iter().flatten() {
        match (key.as_str(), values) {
            ("sysctl", toml::Value::Table(t)) => {
                for (name, values) in t {
                    sysctls.push((format!("sysctl.{name}"), json_list(values)?));
                }
            }
            _ => axes.push((key.clone(), json_list(values)?)),
        }
    }
    axes.extend(sysctls);
    Ok(plan_record(&table, &base, &axes))
}

/// A TOML sweep list as JSON values (a scalar, which no run would have accepted, as one value).
fn json_list(v: &toml::Value) -> Result<Vec<serde_json::Value>> {
    Ok(match v {
        toml::Value::Array(a) => a.iter().map(serde_json::to_value).collect::<Result<_, _>>()?,
        other => vec![serde_json::to_value(other)?],
    })
}

/// The sweep's axes in a stable order: workload options first, then sysctls.
fn sweep_axes(
    src: &Source,
    cfg: &Config,
    base: &[(String, serde_json::Value)],
) -> Result<Vec<(String, Vec<serde_json::Value>)>> {
    let mut axes = Vec::new();
    for (key, values) in &cfg.sweep.options {
        let at = src.locate(&["sweep", key]);
        if values.is_empty() {
            bail!("{at}: an empty list sweeps nothing; give at least one value");
        }
        if !base.iter().any(|(k, o)| has_option(k, o, key)) {
            let kinds: Vec<_> = base.iter().map(|(k, _)| k.as_str()).collect();
            bail!("{at}: no workload here has an option {key:?} (workloads: {})", kinds.join(", "));
        }
        axes.push((key.clone(), values.iter().map(serde_json::to_value).collect::<Result<_, _>>()?));
    }
    for (name, values) in &cfg.sweep.sysctl {
        let at = src.locate(&["sweep", "sysctl", name]);
        if values.is_empty() {
            bail!("{at}: an empty list sweeps nothing; give at least one value");
        }
        let path = fraglab_fragmenter::sysctl::path(name);
        if !path.exists() {
            bail!("{at}: sysctl {name} does not exist on this kernel ({} is missing)", path.display());
        }
        axes.push((
            format!("sysctl.{name}"),
            values.iter().map(serde_json::to_value).collect::<Result<_, _>>()?,
        ));
    }
    Ok(axes)
}

/// Every combination of the axes' values (one empty combination when there is no sweep).
fn cross(axes: &[(String, Vec<serde_json::Value>)]) -> Vec<Vec<(String, serde_json::Value)>> {
    let mut combos = vec![Vec::new()];
    for (key, values) in axes {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((key.clone(), v.clone()));
                    c
                })
            })
            .collect();
    }
    combos
}

/// Whether workload `kind_name` takes option `key`: its full option set is what its defaults
/// serialize to.
fn has_option(kind_name: &str, options: &serde_json::Value, key: &str) -> bool {
    fraglab_workload::from_options(kind_name, options)
        .ok()
        .and_then(|k| serde_json::to_value(fraglab_workload::options(&k)).ok())
        .is_some_and(|v| v.get(key).is_some())
}

/// A workload's option error, worded as on the command line (`--bytes 1GiB: …`), placed at the key
/// that set it and named as written there: `t.toml:7:9: [[workload]] #1 bytes 1GiB: …`. An error
/// about no single written key stays at the table.
fn at_option(src: &Source, i: usize, table: &toml::Table, e: &anyhow::Error) -> anyhow::Error {
    let text = format!("{e:#}");
    let at_key = |key: &str| src.locate(&["workload", &i.to_string(), key]);
    if let Some(rest) = text.strip_prefix("--") {
        let end = rest.find([' ', ':']).unwrap_or(rest.len());
        let key = rest[..end].replace('-', "_");
        if table.contains_key(&key) {
            return anyhow::anyhow!("{}{}", at_key(&key), &rest[end..]);
        }
    }
    // serde's "unknown field `thread`, expected one of …"
    if let Some(key) = text.strip_prefix("unknown field `").and_then(|r| r.split('`').next()) {
        if table.contains_key(key) {
            return anyhow::anyhow!("{}: {text}", at_key(key));
        }
    }
    anyhow::anyhow!("{}: {text}", src.locate(&["workload", &i.to_string()]))
}

fn known_errno(name: &str) -> bool {
    (1..4096).any(|c| fraglab_results::workload::errno_name(c) == name)
}

/// The plan in words, for `--dry-run` (which adds what this machine lacks and the closing line). `mem_available` is the MemAvailable the plan was resolved
/// against; `in_guest` says whether this is a `fraglab vm` guest (no whole-machine warning there).
pub fn describe(plan: &RunPlan, mem_available: u64, in_guest: bool) -> String {
    let mut o = format!(
        "run {} ({} iteration(s)), results under {}\n",
        plan.name,
        plan.iterations,
        plan.output.display()
    );
    match &plan.fragment {
        Some(f) => {
            for (key, value) in fraglab_fragmenter::describe::plan(f, mem_available) {
                if key == "target" {
                    o += &format!("fragment: {value}\n");
                } else {
                    o += &format!("  {:<9} {value}\n", format!("{key}:"));
                }
            }
            if let Some(note) = whole_machine_note(plan, mem_available, in_guest) {
                o += &note;
            }
        }
        None => o += "fragment: none (baseline run)\n",
    }
    let monitors: Vec<_> = plan.monitors.iter().map(|m| m.name()).collect();
    o += &format!(
        "probe: every {}: {}; failures of order ≥ {} caught\n",
        humantime::format_duration(plan.interval),
        monitors.join(", "),
        plan.catch_min_order
    );
    for p in &plan.points {
        // The label already names every swept sysctl (`sysctl.NAME=VALUE`).
        o += &format!("point {}:", p.label);
        o += &format!(
            " {}\n",
            p.workloads.iter().map(|w| w.kind_name.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    o += &format!("expect: {}\n", expect_rules(plan));
    o
}

/// The loud statement a whole-machine run gets on a host (none with a budget or in a guest).
pub fn whole_machine_note(plan: &RunPlan, mem_available: u64, in_guest: bool) -> Option<String> {
    let config = plan.config_path.display();
    fraglab_fragmenter::describe::whole_machine_note(
        plan.fragment.as_ref()?,
        mem_available,
        in_guest,
        &format!("fraglab vm --kernel debian-cloud -- run {config}"),
        &format!("add budget = \"2GiB\" (any size) under [fragment] in {config}"),
    )
}

/// When the run counts as reproduced, in the words of the verdict's rules (`pipeline::verdict`).
pub fn expect_rules(plan: &RunPlan) -> String {
    let e = &plan.expect;
    let errnos = if e.errno.is_empty() { "ENOMEM or ENOBUFS".to_string() } else { e.errno.join(" or ") };
    let from = if e.errno.is_empty() && e.failed_order.is_none() && e.failed_in.is_empty() {
        "; no [expect] table: these are the defaults"
    } else {
        ""
    };
    if !e.errno.is_empty() && e.failed_order.is_none() && e.failed_in.is_empty() {
        return format!(
            "reproduced if a workload sees {errnos}; failed allocations caught in the kernel do not count"
        );
    }
    let order = e.failed_order.unwrap_or(plan.catch_min_order);
    let failure = if e.failed_in.is_empty() {
        format!(
            "a failed allocation of order ≥ {order} that surfaced is caught in the kernel{} (one the kernel \
             falls back from, a THP fault or kvmalloc's first try, counts only when failed_in names its \
             call site)",
            if plan.kmsg { " (tracepoint or kernel log)" } else { "" }
        )
    } else {
        format!(
            "a failed allocation of order ≥ {order} is caught with {} in its stack (a failure caught \
             without a stack makes it could-not-test)",
            e.failed_in.join(" or ")
        )
    };
    format!("reproduced if a workload sees {errnos}, or {failure}{from}")
}
