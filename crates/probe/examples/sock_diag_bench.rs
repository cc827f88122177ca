//! What one sock_diag dump costs — the workloads' skmem sampler does one per interval — beside the
//! naive way, `ss -tmH` run from a loop. Opens N idle IPv6 loopback connections (2N sockets), then
//! times K dumps each way.
//!
//! `cargo run --release -p fraglab-probe --example sock_diag_bench -- [N] [K]` (defaults 256, 200).

use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Instant;

use fraglab_probe::sock_diag::{self, Family, Proto, States};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let n = args.next().unwrap_or(256);
    let k = args.next().unwrap_or(200);
    let listener = TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..n {
        let c = TcpStream::connect(addr).unwrap();
        held.push((c, listener.accept().unwrap().0));
    }
    let sockets = sock_diag::read(Proto::Tcp, Family::V6, States::Full).unwrap().sockets().len();
    let cpu = || {
        // SAFETY: getrusage fills the plain struct it is given.
        let u = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut ru);
            ru
        };
        let t = |tv: libc::timeval| tv.tv_sec as f64 * 1e6 + tv.tv_usec as f64;
        t(u.ru_utime) + t(u.ru_stime)
    };
    let (t0, c0) = (Instant::now(), cpu());
    for _ in 0..k {
        let d = sock_diag::read(Proto::Tcp, Family::V6, States::Full).unwrap();
        assert!(d.sockets().len() >= 2 * n);
    }
    let (wall, cpu_us) = (t0.elapsed().as_secs_f64() * 1e6 / k as f64, (cpu() - c0) / k as f64);
    println!("{sockets} IPv6 TCP sockets, {k} dumps each way");
    println!("fraglab sock_diag::read + sockets(): {wall:.0} µs wall, {cpu_us:.0} µs CPU per dump ({:.2} µs a socket)", wall / sockets as f64);
    let t0 = Instant::now();
    for _ in 0..k {
        let s = Command::new("ss").args(["-tmH6"]).stdout(Stdio::null()).status().expect("ss");
        assert!(s.success());
    }
    let ss = t0.elapsed().as_secs_f64() * 1e6 / k as f64;
    println!("ss -tmH6 (a process per dump, as a shell loop does): {ss:.0} µs wall per dump");
}
