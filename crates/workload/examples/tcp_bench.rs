//! `fraglab workload tcp-stream` against iperf3 on loopback, side by side in one run, with the same
//! threads (`-P`) and message size (`-l`). Prints a markdown table for docs/benchmarks.md.
//!
//! ```text
//! apt-get install -y iperf3
//! cargo run --release -p fraglab-workload --example tcp_bench -- [--duration 10] [--reps 3] \
//!     [--threads 1,2,8] [--msgs 1452,65536]
//! ```
//!
//! Each cell is the median of `--reps` runs; iperf3 and fraglab alternate (which goes first flips
//! every rep) so that drift in the machine's load hits both. CPU is machine-wide from /proc/stat
//! for both tools, so their service demands compare like for like.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fraglab_results::workload::CpuSample;
use fraglab_workload::tcp::{stream, StreamArgs};
use serde_json::Value;

const PORT: u16 = 52011;

struct Sample {
    mbit: f64,
    util: f64,
    sd: f64,
    /// CPU seconds the tool's own processes/threads used per GB sent (getrusage): what the tool
    /// costs, whatever share of the machine the scheduler gave it.
    cpu_s_per_gb: f64,
}

fn arg(args: &[String], flag: &str, default: &str) -> String {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned().unwrap_or(default.into())
}

fn list(text: &str) -> Vec<u64> {
    text.split(',').map(|s| s.trim().parse().expect("a comma-separated list of numbers")).collect()
}

fn iperf3(threads: u64, msg: u64, secs: u64) -> Sample {
    let cpu0 = CpuSample::now().expect("/proc/stat");
    let out = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", &PORT.to_string(), "-J"])
        .args(["-P", &threads.to_string(), "-l", &msg.to_string(), "-t", &secs.to_string()])
        .output()
        .expect("run iperf3 (apt-get install -y iperf3)");
    let cpu1 = CpuSample::now().expect("/proc/stat");
    let v: Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J prints JSON");
    let sent = &v["end"]["sum_sent"];
    let bytes = sent["bytes"].as_u64().unwrap_or_else(|| panic!("iperf3 failed: {v}"));
    let cpu = cpu0.until(&cpu1, bytes);
    // Client and server process CPU (getrusage), as iperf3 reports it, over the test.
    let pct = &v["end"]["cpu_utilization_percent"];
    let busy = (pct["host_total"].as_f64().unwrap() + pct["remote_total"].as_f64().unwrap()) / 100.0;
    let secs = sent["seconds"].as_f64().unwrap();
    Sample {
        mbit: sent["bits_per_second"].as_f64().unwrap() / 1e6,
        util: cpu.util_pct,
        sd: cpu.service_demand_us_per_kb.unwrap_or(f64::NAN),
        cpu_s_per_gb: busy * secs / (bytes as f64 / 1e9),
    }
}

fn fraglab(threads: u64, msg: u64, secs: u64) -> Sample {
    let args = StreamArgs {
        threads: threads as usize,
        duration: format!("{secs}s"),
        msg: msg.to_string(),
        ..Default::default()
    };
    let r = stream(&args).expect("fraglab tcp-stream");
    assert!(r.errors.is_empty(), "fraglab tcp-stream failed: {:?}", r.errors);
    assert_eq!(r.details["receiver_bytes"].as_u64(), Some(r.bytes), "receiver and sender disagree");
    let cpu = r.cpu.expect("/proc/stat");
    Sample {
        mbit: r.throughput_mbit.unwrap(),
        util: cpu.util_pct,
        sd: cpu.service_demand_us_per_kb.unwrap_or(f64::NAN),
        cpu_s_per_gb: (r.rusage.user_s + r.rusage.sys_s) / (r.bytes as f64 / 1e9),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 0 {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = arg(&args, "--duration", "10").parse().expect("--duration in seconds");
    let reps: usize = arg(&args, "--reps", "3").parse().expect("--reps");
    let threads = list(&arg(&args, "--threads", "1,2,8"));
    let msgs = list(&arg(&args, "--msgs", "1452,65536"));

    let _server = Server(
        Command::new("iperf3")
            .args(["-s", "-p", &PORT.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("start iperf3 -s (apt-get install -y iperf3)"),
    );
    std::thread::sleep(Duration::from_millis(500));

    let version = Command::new("iperf3").arg("--version").output().map(|o| o.stdout).unwrap_or_default();
    let version = String::from_utf8_lossy(&version).lines().next().unwrap_or("?").to_string();
    eprintln!("{version}; {reps} reps of {secs} s each");
    println!(
        "| threads | msg | iperf3 Mbit/s | fraglab Mbit/s | fraglab / iperf3 | machine CPU %, µs/KB: iperf3 \
         | fraglab | own CPU s/GB: iperf3 | fraglab |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &msg in &msgs {
        for &t in &threads {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for rep in 0..reps {
                if rep % 2 == 0 {
                    a.push(iperf3(t, msg, secs));
                    b.push(fraglab(t, msg, secs));
                } else {
                    b.push(fraglab(t, msg, secs));
                    a.push(iperf3(t, msg, secs));
                }
                let (x, y) = (a.last().unwrap(), b.last().unwrap());
                eprintln!(
                    "  T={t} msg={msg} rep {rep}: iperf3 {:.0} Mbit/s {:.3} s/GB, fraglab {:.0} Mbit/s {:.3} s/GB",
                    x.mbit, x.cpu_s_per_gb, y.mbit, y.cpu_s_per_gb
                );
            }
            let m = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
            let (ia, fa) = (m(&a, |s| s.mbit), m(&b, |s| s.mbit));
            println!(
                "| {t} | {msg} | {ia:.0} | {fa:.0} | {:.2}× | {:.0}, {:.3} | {:.0}, {:.3} | {:.3} | {:.3} |",
                fa / ia,
                m(&a, |s| s.util),
                m(&a, |s| s.sd),
                m(&b, |s| s.util),
                m(&b, |s| s.sd),
                m(&a, |s| s.cpu_s_per_gb),
                m(&b, |s| s.cpu_s_per_gb)
            );
        }
    }
}
