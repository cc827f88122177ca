//! Workload results against the sweep variable: one series per A/B side and per combination of the
//! other sweep axes (seed 002: throughput against threads, one line per high_order_alloc_disable
//! value), each point the mean and sample standard deviation over the iterations.

use std::collections::BTreeMap;

use fraglab_results::point::{plain, Point};
use fraglab_results::record::WorkloadRecord;
use fraglab_results::workload::Latency;
use serde_json::Value;

use super::data::RunData;
use crate::summary::{mean_stddev, metric};

/// A sweep value as a number, when it is one (`4`, or `"4"` as a sysctl value is written).
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// An axis key as a legend shows it: `sysctl.net.core.high_order_alloc_disable` →
/// `high_order_alloc_disable`.
pub fn short_key(key: &str) -> &str {
    match key.strip_prefix("sysctl.") {
        Some(name) => name.rsplit('.').next().unwrap_or(name),
        None => key,
    }
}

/// What the x axis is.
#[derive(Clone, Debug, PartialEq)]
pub enum XAxis {
    /// A sweep key whose values are numbers.
    Numeric { key: String },
    /// Point labels in order of first appearance (no numeric sweep).
    Categorical { labels: Vec<String> },
}

impl XAxis {
    pub fn title(&self) -> String {
        match self {
            XAxis::Numeric { key } => key.clone(),
            XAxis::Categorical { labels } if labels.len() == 1 && labels[0] == "-" => "(no sweep)".into(),
            XAxis::Categorical { .. } => "sweep point".into(),
        }
    }

    /// x of a row and the label of its series group (the other axes).
    pub fn place(&self, point: &Point) -> Option<(f64, String)> {
        match self {
            XAxis::Numeric { key } => {
                let x = number(point.get(key)?)?;
                let rest: Vec<String> = point
                    .without(key)
                    .axes
                    .iter()
                    .map(|(k, v)| format!("{}={}", short_key(k), plain(v)))
                    .collect();
                Some((x, rest.join(" ")))
            }
            XAxis::Categorical { labels } => {
                Some((labels.iter().position(|l| *l == point.label())? as f64, String::new()))
            }
        }
    }
}

/// The x axis for a workload kind: a numeric sweep key with at least two values, preferring one
/// that is an option of the workload itself, then one that is not a sysctl.
pub fn choose_x(rows: &[&WorkloadRecord]) -> XAxis {
    let mut values: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    for r in rows {
        if !labels.contains(&r.point.label()) {
            labels.push(r.point.label());
        }
        for (k, v) in &r.point.axes {
            if !order.contains(k) {
                order.push(k.clone());
            }
            let e = values.entry(k.clone()).or_default();
            if !e.contains(v) {
                e.push(v.clone());
            }
        }
    }
    let numeric = |k: &String| {
        let v = &values[k];
        v.len() >= 2 && v.iter().all(|x| number(x).is_some())
    };
    let own = |k: &String| rows.first().is_some_and(|r| r.result.params.get(k.as_str()).is_some());
    let pick = order
        .iter()
        .filter(|k| numeric(k))
        .min_by_key(|k| (!own(k), k.starts_with("sysctl."), order.iter().position(|o| o == *k)));
    match pick {
        Some(key) => XAxis::Numeric { key: key.clone() },
        None => XAxis::Categorical { labels },
    }
}

/// One point of a series.
#[derive(Clone, Debug)]
pub struct Stat {
    pub x: f64,
    pub point: String,
    pub values: Vec<f64>,
    pub mean: f64,
    pub sd: f64,
}

#[derive(Clone, Debug)]
pub struct Series {
    /// `data-series`: `[A ]<kind>[ <other axes>]`.
    pub name: String,
    pub side: usize,
    pub group: String,
    pub points: Vec<Stat>,
}

/// One plot: a workload kind's metric against the sweep.
#[derive(Clone, Debug)]
pub struct Plot {
    pub kind: String,
    pub unit: String,
    pub x: XAxis,
    pub series: Vec<Series>,
}

/// Workload kinds in order of first appearance over all sides.
pub fn kinds(sides: &[&RunData]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in sides {
        for w in &r.workloads {
            if !out.contains(&w.result.kind) {
                out.push(w.result.kind.clone());
            }
        }
    }
    out
}

/// x (as bits) → (x, point label, values).
type Cells = BTreeMap<u64, (f64, String, Vec<f64>)>;

/// `value(row)` for every row of `kind`, grouped into series. `letters` name the sides when there
/// is more than one.
fn collect(
    sides: &[&RunData],
    letters: &[String],
    kind: &str,
    value: &dyn Fn(&WorkloadRecord) -> Option<f64>,
) -> (XAxis, Vec<Series>) {
    let rows: Vec<&WorkloadRecord> =
        sides.iter().flat_map(|r| r.workloads.iter()).filter(|w| w.result.kind == kind).collect();
    let x = choose_x(&rows);
    let mut series: Vec<Series> = Vec::new();
    for (side, run) in sides.iter().enumerate() {
        // group → x → (point label, values)
        let mut groups: Vec<(String, Cells)> = Vec::new();
        for w in run.workloads.iter().filter(|w| w.result.kind == kind) {
            let (Some((px, group)), Some(v)) = (x.place(&w.point), value(w)) else { continue };
            let g = match groups.iter().position(|(name, _)| *name == group) {
                Some(i) => i,
                None => {
                    groups.push((group.clone(), BTreeMap::new()));
                    groups.len() - 1
                }
            };
            groups[g].1.entry(px.to_bits()).or_insert_with(|| (px, w.point.label(), Vec::new())).2.push(v);
        }
        for (group, points) in groups {
            let mut pts: Vec<Stat> = points
                .into_values()
                .map(|(x, point, values)| {
                    let (mean, sd) = mean_stddev(&values);
                    Stat { x, point, values, mean, sd }
                })
                .collect();
            pts.sort_by(|a, b| a.x.total_cmp(&b.x));
            let mut name = String::new();
            if sides.len() > 1 {
                name += &letters[side];
                name.push(' ');
            }
            name += kind;
            if !group.is_empty() {
                name.push(' ');
                name += &group;
            }
            series.push(Series { name, side, group, points: pts });
        }
    }
    (x, series)
}

/// Throughput (or rate) of `kind` against the sweep; `None` for kinds whose only number is a count
/// of successes (exec), which is not a rate.
pub fn throughput(sides: &[&RunData], letters: &[String], kind: &str) -> Option<Plot> {
    let unit = sides
        .iter()
        .flat_map(|r| r.workloads.iter())
        .find(|w| w.result.kind == kind)
        .map(|w| metric(&w.result).1)?;
    if unit == "ok" {
        return None;
    }
    let (x, series) = collect(sides, letters, kind, &|w| {
        let (v, u) = metric(&w.result);
        (u == unit).then_some(v)
    });
    Some(Plot { kind: kind.into(), unit: unit.into(), x, series })
}

/// One field of a latency record.
pub type Percentile = fn(&Latency) -> u64;

/// The latency percentiles the report draws: (label, its field of `latency_us`).
pub const PERCENTILES: [(&str, Percentile); 4] =
    [("p50", |l| l.p50), ("p90", |l| l.p90), ("p99", |l| l.p99), ("p99.9", |l| l.p999)];

/// Latency percentiles of `kind` against the sweep (µs, mean over iterations of each iteration's
/// percentile): one series per side/group and percentile. `None` when the kind measures none.
pub fn latency(sides: &[&RunData], letters: &[String], kind: &str) -> Option<Plot> {
    let has = sides
        .iter()
        .flat_map(|r| r.workloads.iter())
        .any(|w| w.result.kind == kind && w.result.latency_us.is_some());
    if !has {
        return None;
    }
    let mut all = Vec::new();
    let mut x_axis = None;
    for (label, field) in PERCENTILES {
        let (x, series) =
            collect(sides, letters, kind, &|w| w.result.latency_us.as_ref().map(|l| field(l) as f64));
        x_axis.get_or_insert(x);
        all.extend(series.into_iter().map(|mut s| {
            s.name = format!("{} {label}", s.name);
            s
        }));
    }
    Some(Plot { kind: kind.into(), unit: "µs".into(), x: x_axis?, series: all })
}

/// What a socket's forward allocation is summarised by in the plot: (label, its value in a result).
pub type FwdStat = fn(&fraglab_results::skmem::Summary) -> f64;

/// Forward allocation per socket: the mean over sockets of each one's mean, and the largest any one
/// socket held.
pub const FWD_ALLOC: [(&str, FwdStat); 2] =
    [("mean per socket", |s| s.per_socket_mean.f), ("max per socket", |s| s.per_socket_max.f as f64)];

/// Forward allocation (`sk_forward_alloc`, skmem's `f`) of `kind`'s sockets against the sweep, in
/// bytes: one series per side/group and statistic. `None` when no result of the kind sampled its
/// sockets.
pub fn forward_alloc(sides: &[&RunData], letters: &[String], kind: &str) -> Option<Plot> {
    fn sampled(w: &WorkloadRecord) -> Option<&fraglab_results::skmem::SockMem> {
        w.result.skmem.as_ref().filter(|m| m.samples > 0)
    }
    let has =
        sides.iter().flat_map(|r| r.workloads.iter()).any(|w| w.result.kind == kind && sampled(w).is_some());
    if !has {
        return None;
    }
    let mut all = Vec::new();
    let mut x_axis = None;
    for (label, stat) in FWD_ALLOC {
        let (x, series) = collect(sides, letters, kind, &|w| sampled(w).map(|m| stat(&m.summary)));
        x_axis.get_or_insert(x);
        all.extend(series.into_iter().map(|mut s| {
            s.name = format!("{} {label}", s.name);
            s
        }));
    }
    Some(Plot { kind: kind.into(), unit: "bytes".into(), x: x_axis?, series: all })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(point: &str, iteration: u32, kind: &str, mbit: f64) -> WorkloadRecord {
        WorkloadRecord {
            point: Point::from_legacy_label(point),
            sysctls: vec![],
            iteration,
            index: 0,
            result: serde_json::from_value(
                json!({"kind": kind, "params": {"threads": 1, "duration": "15s"}, "throughput_mbit": mbit}),
            )
            .unwrap(),
            target: None,
        }
    }

    fn run(workloads: Vec<WorkloadRecord>) -> RunData {
        RunData {
            dir: "x".into(),
            info: Default::default(),
            workloads,
            timeline: vec![],
            phases: vec![],
            failures: vec![],
            t0_ns: 0,
            notes: vec![],
        }
    }

    /// Seed 002's table (super_netperf TCP_STREAM over loopback, 1..30 threads; T0 with
    /// high_order_alloc_disable=0, T1 with =1), as a fraglab sweep would record it.
    const SEED_002: [(u32, f64, f64); 30] = [
        (1, 49979.0, 37267.0),
        (2, 98745.0, 76286.0),
        (3, 141088.0, 110051.0),
        (4, 177414.0, 144772.0),
        (5, 197587.0, 173563.0),
        (6, 215377.0, 208448.0),
        (7, 241061.0, 234087.0),
        (8, 267155.0, 263373.0),
        (9, 295069.0, 297402.0),
        (10, 312393.0, 335213.0),
        (11, 340462.0, 368778.0),
        (12, 371366.0, 403954.0),
        (13, 412344.0, 443713.0),
        (14, 426617.0, 473580.0),
        (15, 474418.0, 507861.0),
        (16, 503261.0, 538539.0),
        (17, 522331.0, 563096.0),
        (18, 532409.0, 567084.0),
        (19, 550824.0, 605240.0),
        (20, 525493.0, 641988.0),
        (21, 564574.0, 665843.0),
        (22, 567349.0, 690868.0),
        (23, 583846.0, 710917.0),
        (24, 588715.0, 736306.0),
        (25, 603212.0, 763494.0),
        (26, 604083.0, 792654.0),
        (27, 602241.0, 796450.0),
        (28, 604291.0, 797993.0),
        (29, 611610.0, 833249.0),
        (30, 577356.0, 841062.0),
    ];

    fn seed_002_rows() -> Vec<WorkloadRecord> {
        let mut rows = Vec::new();
        for (thr, t0, t1) in SEED_002 {
            rows.push(row(
                &format!("threads={thr} sysctl.net.core.high_order_alloc_disable=0"),
                1,
                "tcp-stream",
                t0,
            ));
            rows.push(row(
                &format!("threads={thr} sysctl.net.core.high_order_alloc_disable=1"),
                1,
                "tcp-stream",
                t1,
            ));
        }
        rows
    }

    #[test]
    fn seed_002_becomes_two_lines_against_threads() {
        let r = run(seed_002_rows());
        let p = throughput(&[&r], &["A".into()], "tcp-stream").unwrap();
        assert_eq!(p.x, XAxis::Numeric { key: "threads".into() });
        assert_eq!(p.unit, "Mbit/s");
        let names: Vec<&str> = p.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["tcp-stream high_order_alloc_disable=0", "tcp-stream high_order_alloc_disable=1"]);
        for (s, col) in p.series.iter().zip([1, 2]) {
            assert_eq!(s.points.len(), 30);
            for (pt, row) in s.points.iter().zip(SEED_002) {
                assert_eq!(pt.x, row.0 as f64);
                assert_eq!(pt.mean, if col == 1 { row.1 } else { row.2 });
            }
        }
    }

    #[test]
    fn iterations_average_and_sides_get_their_own_lines() {
        let a = run(vec![
            row("threads=1", 1, "tcp-stream", 10.0),
            row("threads=1", 2, "tcp-stream", 14.0),
            row("threads=2", 1, "tcp-stream", 20.0),
        ]);
        let b = run(vec![row("threads=1", 1, "tcp-stream", 8.0), row("threads=2", 1, "tcp-stream", 30.0)]);
        let p = throughput(&[&a, &b], &["A".into(), "B".into()], "tcp-stream").unwrap();
        let names: Vec<&str> = p.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["A tcp-stream", "B tcp-stream"]);
        let first = &p.series[0].points[0];
        assert_eq!((first.mean, first.values.len()), (12.0, 2));
        assert!((first.sd - 8f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn no_sweep_is_one_categorical_point_and_counts_are_not_rates() {
        let mut r = run(vec![row("-", 1, "tcp-stream", 5.0)]);
        r.workloads.push(WorkloadRecord {
            point: Point::none(),
            sysctls: vec![],
            iteration: 1,
            index: 1,
            result: serde_json::from_value(json!({"kind": "exec", "params": {}, "ok": 1})).unwrap(),
            target: None,
        });
        let p = throughput(&[&r], &["A".into()], "tcp-stream").unwrap();
        assert_eq!(p.x, XAxis::Categorical { labels: vec!["-".into()] });
        assert_eq!(p.x.title(), "(no sweep)");
        assert!(throughput(&[&r], &["A".into()], "exec").is_none());
    }

    #[test]
    fn the_workloads_own_option_is_preferred_over_a_sysctl() {
        let rows =
            [row("sysctl.a=0 clients=1", 1, "tcp-rr", 1.0), row("sysctl.a=1 clients=8", 1, "tcp-rr", 1.0)];
        let mut rows = rows.to_vec();
        for r in &mut rows {
            r.result.params = json!({"clients": 1});
        }
        let refs: Vec<&WorkloadRecord> = rows.iter().collect();
        assert_eq!(choose_x(&refs), XAxis::Numeric { key: "clients".into() });
    }
}
