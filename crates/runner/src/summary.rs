//! The summary a run prints, read back from its results directory (so it is also what a later
//! reader of the directory would see): like the seeds' tables, one row per sweep point and workload.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use fraglab_probe::stack::group_by_caller;
use fraglab_probe::tracefs::AllocFailure;
use serde_json::Value;

fn load(dir: &Path, file: &str) -> Result<Value> {
    let p = dir.join(file);
    let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", p.display()))
}

/// The main number of a workload result and its unit: throughput, else rate, else successes.
pub fn metric(result: &Value) -> (f64, &'static str) {
    if let Some(t) = result["throughput_mbit"].as_f64() {
        (t, "Mbit/s")
    } else if let Some(r) = result["ops_per_sec"].as_f64() {
        (r, "ops/s")
    } else {
        (result["ok"].as_f64().unwrap_or(0.0), "ok")
    }
}

/// Mean and sample standard deviation.
pub fn mean_stddev(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Sweep points in value order: `msg=4KiB` before `msg=16KiB`, `clients=2` before `clients=10`.
/// Labels are `KEY=VALUE` words (`-` without a sweep); values that read as numbers or sizes compare
/// by value, others as text.
pub fn point_order(a: &str, b: &str) -> std::cmp::Ordering {
    let value =
        |v: &str| v.parse::<f64>().ok().or_else(|| crate::units::parse_size(v).ok().map(|b| b as f64));
    let mut wa = a.split_whitespace();
    let mut wb = b.split_whitespace();
    loop {
        let (x, y) = match (wa.next(), wb.next()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => (x, y),
        };
        let (kx, vx) = x.split_once('=').unwrap_or((x, ""));
        let (ky, vy) = y.split_once('=').unwrap_or((y, ""));
        let by_value = match (value(vx), value(vy)) {
            (Some(p), Some(q)) => p.total_cmp(&q),
            _ => vx.cmp(vy),
        };
        let o = kx.cmp(ky).then(by_value).then_with(|| x.cmp(y));
        if o.is_ne() {
            return o;
        }
    }
}

/// One summary row's values, unit and errno counts.
type Row = (Vec<f64>, &'static str, BTreeMap<String, u64>);

/// `fragment: budget 512.00 MiB, no free block of order ≥ 4 (64K), 480.00 MiB free below it; pin
/// mlock`, and the scaling of a profile target. A target this fraglab cannot read (a results
/// directory from another version) is quoted as its JSON.
fn fragment_line(f: &Value) -> String {
    let budget = f["budget"].as_u64();
    let Ok(target) = serde_json::from_value::<fraglab_fragmenter::Target>(f["target"].clone()) else {
        return format!("fragment: target {}\n", f["target"]);
    };
    let mut o =
        format!("fragment: {}, {}", crate::describe::extent(budget), crate::describe::target(&target));
    if let Some(pin) = f["pin"].as_str() {
        o += &format!("; pin {pin}");
    }
    o += "\n";
    let orders = |v: &Value| -> Vec<u64> {
        v.as_array().map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect()).unwrap_or_default()
    };
    let scale = f["scale"].as_f64().unwrap_or(1.0);
    if let Some(s) = crate::describe::scaled_profile(
        &target,
        scale,
        budget,
        &orders(&f["planned"]),
        &orders(&f["missing"]),
    ) {
        o += &format!("  {s}\n");
    }
    o
}

pub fn render(dir: &Path) -> Result<String> {
    let run = load(dir, "run.json")?;
    let workloads =
        if dir.join("workloads.json").exists() { load(dir, "workloads.json")? } else { Value::Array(vec![]) };
    let mut o = String::new();
    o += &format!(
        "{} on {} — {}; verdict: {} ({})\n",
        run["name"].as_str().unwrap_or("?"),
        run["kernel_release"].as_str().unwrap_or("?"),
        run["status"].as_str().unwrap_or("?"),
        run["verdict"].as_str().unwrap_or("none"),
        run["reason"].as_str().unwrap_or("")
    );
    let f = &run["fragment"];
    if f.is_object() {
        let cells = |v: &Value| {
            v.as_array()
                .map(|a| a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        o += &fragment_line(f);
        o += &format!("  planned free blocks per order: {}\n", cells(&f["planned"]));
        o += &format!("  intact at the end:             {}\n", cells(&f["intact"]));
        for z in f["buddyinfo_now"]["zones"].as_array().into_iter().flatten() {
            o += &format!(
                "  buddyinfo Node {}, zone {:<8} {}\n",
                z["node"],
                z["zone"].as_str().unwrap_or("?"),
                cells(&z["free"])
            );
        }
        if let Ok(k) = serde_json::from_value::<fraglab_fragmenter::keeper::Keeping>(f["keeping"].clone()) {
            o += &format!("  {}\n", crate::describe::keeping(&k));
        }
        let windows: Vec<&Value> =
            workloads.as_array().into_iter().flatten().filter(|w| w["target"].is_object()).collect();
        let lost: Vec<&&Value> = windows.iter().filter(|w| w["target"]["held"] == false).collect();
        if !windows.is_empty() {
            o += &format!(
                "  target held in {} of {} workload windows\n",
                windows.len() - lost.len(),
                windows.len()
            );
        }
        for w in lost {
            o += &format!(
                "    lost in {} {} #{}: {:.3} s of {:.3} s ({})\n",
                w["result"]["kind"].as_str().unwrap_or("?"),
                w["point"].as_str().unwrap_or("-"),
                w["iteration"],
                w["target"]["lost_s"].as_f64().unwrap_or(0.0),
                w["target"]["window_s"].as_f64().unwrap_or(0.0),
                w["target"]["worst"].as_str().unwrap_or("")
            );
        }
    }
    // (point, kind) → values; printed in sweep order (see `point_order`).
    let mut table: BTreeMap<(String, String), Row> = BTreeMap::new();
    for w in workloads.as_array().into_iter().flatten() {
        let key = (
            w["point"].as_str().unwrap_or("-").to_string(),
            w["result"]["kind"].as_str().unwrap_or("?").to_string(),
        );
        let (value, unit) = metric(&w["result"]);
        let entry = table.entry(key).or_insert_with(|| (Vec::new(), unit, BTreeMap::new()));
        entry.0.push(value);
        for e in w["result"]["errors"].as_array().into_iter().flatten() {
            *entry.2.entry(e["errno"].as_str().unwrap_or("?").to_string()).or_default() +=
                e["count"].as_u64().unwrap_or(0);
        }
    }
    if !table.is_empty() {
        o += &format!(
            "\n{:<40} {:<22} {:>3} {:>8} {:>12} {:>10}  errors\n",
            "point", "workload", "n", "unit", "mean", "stddev"
        );
        let mut rows: Vec<_> = table.iter().collect();
        rows.sort_by(|a, b| point_order(&a.0 .0, &b.0 .0).then_with(|| a.0 .1.cmp(&b.0 .1)));
        for ((point, kind), (values, unit, errors)) in rows {
            let (mean, sd) = mean_stddev(values);
            let errs = errors.iter().map(|(e, n)| format!("{e}×{n}")).collect::<Vec<_>>().join(" ");
            o += &format!(
                "{point:<40} {kind:<22} {:>3} {unit:>8} {mean:>12.2} {sd:>10.2}  {errs}\n",
                values.len()
            );
        }
    }
    let path = dir.join("alloc_failures.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut failures: Vec<AllocFailure> = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        failures.push(
            serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not a failed allocation record", path.display(), i + 1))?,
        );
    }
    fraglab_probe::tracefs::fill_unknown_comms(&mut failures);
    let mut by_order: BTreeMap<u32, (u64, BTreeMap<String, u64>)> = BTreeMap::new();
    for f in &failures {
        let e = by_order.entry(f.order).or_default();
        e.0 += 1;
        *e.1.entry(f.comm.clone()).or_default() += 1;
    }
    if by_order.is_empty() {
        o += "\nkernel: no failed allocation caught\n";
    } else {
        o += "\nkernel: failed allocations by order\n";
        for (order, (n, comms)) in &by_order {
            let c = comms.iter().map(|(c, n)| format!("{c}×{n}")).collect::<Vec<_>>().join(" ");
            o += &format!("  order {order}: {n} ({c})\n");
        }
        o += "kernel: failed allocations by caller (first function outside the allocator ← its caller)\n";
        for g in group_by_caller(failures.iter().map(|f| (f.order, &f.stack[..]))) {
            o += &format!("  {}\n", g.describe());
        }
    }
    for e in run["errors"].as_array().into_iter().flatten() {
        o += &format!("error: {}\n", e.as_str().unwrap_or(""));
    }
    for r in run["sysctls_restored"].as_array().into_iter().flatten() {
        o += &format!("restored {}\n", r.as_str().unwrap_or(""));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A results directory with run.json and the real sctp-stream capture as alloc_failures.jsonl.
    fn results_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("fraglab-summary-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("run.json"),
            r#"{"name":"sctp-lo-mtu64k","kernel_release":"6.1.0-57-cloud-amd64","status":"complete",
               "verdict":"reproduced","reason":"r",
               "fragment":{"target":{"free_bytes":503316480,"kind":"max_free_order","order":4},
                           "planned":[7841,7841,7841,7841,0],"intact":[7841,7841,7841,7841,0]}}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("alloc_failures.jsonl"),
            include_str!("../tests/captures/alloc_failures-sctp-stream-6.1.jsonl"),
        )
        .unwrap();
        d
    }

    #[test]
    fn failures_by_caller_one_name_per_task_and_target_in_words() {
        let d = results_dir("caller");
        let out = render(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert!(
            out.contains(
                "fragment: whole machine, no free block of order ≥ 4 (64K), 480.00 MiB free below it\n"
            ),
            "{out}"
        );
        // pid 93 is `<...>` once and `fraglab` once in the capture: one task, one name. Pids 87
        // and 36 have no name anywhere, so they stay `<...>`.
        assert!(out.contains("  order 4: 2 (fraglab×2)\n"), "{out}");
        assert!(out.contains("  order 9: 2 (<...>×2)\n"), "{out}");
        assert!(
            out.contains(
                "  order 4 ×2 from __alloc_skb ← _sctp_make_chunk, then sctp_make_datafrag_empty ← \
                 sctp_datamsg_from_user ← sctp_sendmsg_to_asoc ← sctp_sendmsg\n"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "  order 9 ×1 from do_huge_pmd_anonymous_page ← __handle_mm_fault, then handle_mm_fault"
            ),
            "{out}"
        );
        assert!(out.contains("  order 9 ×1 from alloc_charge_hpage ← collapse_huge_page, then hpage_collapse_scan_pmd ← khugepaged\n"), "{out}");
    }

    #[test]
    fn sweep_points_in_value_order() {
        let mut v = vec!["msg=32KiB", "msg=4KiB", "msg=16KiB", "msg=1MiB"];
        v.sort_by(|a, b| point_order(a, b));
        assert_eq!(v, ["msg=4KiB", "msg=16KiB", "msg=32KiB", "msg=1MiB"]);
        let mut v = vec![
            "clients=10 sysctl.net.core.high_order_alloc_disable=1",
            "clients=2 sysctl.net.core.high_order_alloc_disable=1",
            "clients=10 sysctl.net.core.high_order_alloc_disable=0",
            "clients=2 sysctl.net.core.high_order_alloc_disable=0",
        ];
        v.sort_by(|a, b| point_order(a, b));
        assert_eq!(
            v,
            [
                "clients=2 sysctl.net.core.high_order_alloc_disable=0",
                "clients=2 sysctl.net.core.high_order_alloc_disable=1",
                "clients=10 sysctl.net.core.high_order_alloc_disable=0",
                "clients=10 sysctl.net.core.high_order_alloc_disable=1",
            ]
        );
        // Text values stay in text order, after nothing surprising.
        assert_eq!(point_order("style=one-to-many", "style=one-to-one"), std::cmp::Ordering::Less);
    }

    #[test]
    fn mean_and_sample_stddev() {
        // Seed 000's three fragmented runs, real seconds: 14.159 15.252 15.826.
        let (m, sd) = mean_stddev(&[14.159, 15.252, 15.826]);
        assert!((m - 15.079).abs() < 1e-3, "{m}");
        assert!((sd - 0.8470).abs() < 1e-3, "{sd}");
    }
}
