//! The summary a run prints, read back from its results directory (so it is also what a later
//! reader of the directory would see): like the seeds' tables, one row per sweep point and workload.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
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
    }
    // point → kind → values
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
        for ((point, kind), (values, unit, errors)) in &table {
            let (mean, sd) = mean_stddev(values);
            let errs = errors.iter().map(|(e, n)| format!("{e}×{n}")).collect::<Vec<_>>().join(" ");
            o += &format!(
                "{point:<40} {kind:<22} {:>3} {unit:>8} {mean:>12.2} {sd:>10.2}  {errs}\n",
                values.len()
            );
        }
    }
    let failures = std::fs::read_to_string(dir.join("alloc_failures.jsonl")).unwrap_or_default();
    let mut by_order: BTreeMap<u64, (u64, BTreeMap<String, u64>)> = BTreeMap::new();
    for line in failures.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{}: bad line", dir.join("alloc_failures.jsonl").display()))?;
        let e = by_order.entry(v["order"].as_u64().unwrap_or(0)).or_default();
        e.0 += 1;
        *e.1.entry(v["comm"].as_str().unwrap_or("?").to_string()).or_default() += 1;
    }
    if by_order.is_empty() {
        o += "\nkernel: no failed allocation caught\n";
    } else {
        o += "\nkernel: failed allocations by order\n";
        for (order, (n, comms)) in &by_order {
            let c = comms.iter().map(|(c, n)| format!("{c}×{n}")).collect::<Vec<_>>().join(" ");
            o += &format!("  order {order}: {n} ({c})\n");
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

    #[test]
    fn mean_and_sample_stddev() {
        // Seed 000's three fragmented runs, real seconds: 14.159 15.252 15.826.
        let (m, sd) = mean_stddev(&[14.159, 15.252, 15.826]);
        assert!((m - 15.079).abs() < 1e-3, "{m}");
        assert!((sd - 0.8470).abs() < 1e-3, "{sd}");
    }
}
