//! TCP workloads: `tcp-stream` (T connections each streaming messages, like super_netperf — seed
//! 002), `tcp-rr` (C clients doing blocking request/response transactions — seed 004), `tcp-crr` (a
//! new connection per transaction), and [`Server`], their server side.
//!
//! The server runs in-process on an ephemeral port of 127.0.0.1 unless `--peer HOST:PORT` names a
//! `fraglab serve` ([`super::serve`]) on another host. Both are the same code and speak the same
//! protocol.
//!
//! # Wire protocol
//! Every connection opens with one header line of exactly [`HEADER_LEN`] bytes from the client,
//! ASCII, space-padded, ending in `\n`:
//!
//! ```text
//! FRAGLAB-TCP/1 <stream|rr|crr> <req> <resp> <sndbuf> <rcvbuf>
//! ```
//!
//! `sndbuf`/`rcvbuf` are the client's `--sndbuf`/`--rcvbuf` (0 = not set), which the server applies to
//! its own end. Then:
//! - **stream**: the client sends bytes until it shuts down its write side; the server reads and counts
//!   them, answers with its count as 8 bytes big-endian, and closes. `req` is the message size.
//! - **rr**, **crr**: the client sends `req` bytes, the server answers `resp` bytes, repeated until the
//!   client closes. A crr client closes after one transaction, with SO_LINGER 0 (an RST), so neither
//!   end keeps a TIME_WAIT socket and a long run does not exhaust ephemeral ports.
//!
//! # Hot path
//! Each worker owns its socket, its one preallocated buffer, its counters, histogram and errno table;
//! the only shared state it touches while running is a relaxed load of the stop flag. Everything is
//! merged after the workers have been joined.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::json;
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use super::opts::{self, opt_size_text, size_text, Wording};
use super::result::{
    latency_histogram, wall_now, Cpu, CpuSample, ErrnoCount, Errors, Latency, Rusage, Spread, WorkloadResult,
};
use crate::units::format_size;

/// Length of the header line every connection opens with.
pub const HEADER_LEN: usize = 64;
const MAGIC: &str = "FRAGLAB-TCP/1";
/// The receiving side reads this much per recv(): large enough that the receiver costs a fraction
/// of the sender (see docs/benchmarks.md), small enough to stay in L2.
const RECV_BUF: usize = 256 << 10;
/// Longest a client blocks in one connect/send/recv before counting ETIMEDOUT/EAGAIN.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a server connection waits for its client before giving up on it.
const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause after a failed connect before a worker tries again.
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Upper bound for --threads / --clients.
const MAX_WORKERS: u64 = 4096;
/// TCP's kinds word option errors `--flag: why`.
const TCP: Wording = Wording::Tcp;
/// Upper bound for --msg / --req / --resp.
const MAX_MSG: u64 = 64 << 20;
/// Largest --sndbuf / --rcvbuf (an int the kernel doubles).
const MAX_SOCKBUF: u64 = (i32::MAX / 2) as u64;
const WORKER_STACK: usize = 256 << 10;
/// A server keeps at most this many idle acceptor threads; more exit.
const SERVER_MAX_IDLE: usize = 64;
const SERVER_MAX_THREADS: usize = 8192;

/// `fraglab workload tcp-stream`.
#[derive(Debug, Clone, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamArgs {
    /// Connections, each with its own sending thread (super_netperf's N).
    #[arg(long, default_value_t = 1, value_name = "N", allow_hyphen_values = true)]
    pub threads: usize,
    /// How long to send (e.g. 15s, 500ms).
    #[arg(long, default_value = "10s", value_name = "DURATION", allow_hyphen_values = true)]
    pub duration: String,
    /// Bytes per send() (netperf -m), e.g. 1452, 64KiB.
    #[arg(long, default_value = "16KiB", value_name = "SIZE", allow_hyphen_values = true)]
    #[serde(deserialize_with = "size_text")]
    pub msg: String,
    /// SO_SNDBUF on both ends of every connection (default: kernel autotuning).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    #[serde(deserialize_with = "opt_size_text")]
    pub sndbuf: Option<String>,
    /// SO_RCVBUF on both ends of every connection (default: kernel autotuning).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    #[serde(deserialize_with = "opt_size_text")]
    pub rcvbuf: Option<String>,
    /// A `fraglab serve` to send to, instead of the in-process server on 127.0.0.1.
    #[arg(long, value_name = "HOST:PORT")]
    pub peer: Option<String>,
}

impl Default for StreamArgs {
    fn default() -> Self {
        StreamArgs {
            threads: 1,
            duration: "10s".into(),
            msg: "16KiB".into(),
            sndbuf: None,
            rcvbuf: None,
            peer: None,
        }
    }
}

/// `fraglab workload tcp-rr` and `tcp-crr`.
#[derive(Debug, Clone, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RrArgs {
    /// Concurrent clients, each a thread doing one transaction at a time.
    #[arg(long, default_value_t = 1, value_name = "N", allow_hyphen_values = true)]
    pub clients: usize,
    /// How long to run (e.g. 10s).
    #[arg(long, default_value = "10s", value_name = "DURATION", allow_hyphen_values = true)]
    pub duration: String,
    /// Request size (netperf -r's first number).
    #[arg(long, default_value = "1", value_name = "SIZE", allow_hyphen_values = true)]
    #[serde(deserialize_with = "size_text")]
    pub req: String,
    /// Response size (netperf -r's second number).
    #[arg(long, default_value = "1", value_name = "SIZE", allow_hyphen_values = true)]
    #[serde(deserialize_with = "size_text")]
    pub resp: String,
    /// SO_SNDBUF on both ends of every connection (default: kernel autotuning).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    #[serde(deserialize_with = "opt_size_text")]
    pub sndbuf: Option<String>,
    /// SO_RCVBUF on both ends of every connection (default: kernel autotuning).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    #[serde(deserialize_with = "opt_size_text")]
    pub rcvbuf: Option<String>,
    /// A `fraglab serve` to talk to, instead of the in-process server on 127.0.0.1.
    #[arg(long, value_name = "HOST:PORT")]
    pub peer: Option<String>,
}

impl Default for RrArgs {
    fn default() -> Self {
        RrArgs {
            clients: 1,
            duration: "10s".into(),
            req: "1".into(),
            resp: "1".into(),
            sndbuf: None,
            rcvbuf: None,
            peer: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Validation: every flag is checked before any socket is opened.

#[derive(Clone, Copy, Debug, Default)]
struct Bufs {
    snd: Option<usize>,
    rcv: Option<usize>,
}

impl Bufs {
    fn resolve(snd: Option<&str>, rcv: Option<&str>) -> Result<Bufs> {
        let check = |flag, text| -> Result<_> {
            Ok(opts::sockbuf(TCP, flag, text, MAX_SOCKBUF)?.map(|n| n as usize))
        };
        Ok(Bufs { snd: check("--sndbuf", snd)?, rcv: check("--rcvbuf", rcv)? })
    }
}

#[derive(Debug)]
struct StreamPlan {
    threads: usize,
    duration: Duration,
    msg: usize,
    bufs: Bufs,
    peer: Option<SocketAddr>,
}

#[derive(Debug)]
struct RrPlan {
    clients: usize,
    duration: Duration,
    req: usize,
    resp: usize,
    bufs: Bufs,
    peer: Option<SocketAddr>,
}

impl StreamPlan {
    fn resolve(a: &StreamArgs) -> Result<StreamPlan> {
        Ok(StreamPlan {
            threads: opts::count(TCP, "--threads", a.threads as u64, MAX_WORKERS)?,
            duration: opts::duration(TCP, "--duration", &a.duration)?,
            msg: opts::msg_size(TCP, "--msg", &a.msg, MAX_MSG)?,
            bufs: Bufs::resolve(a.sndbuf.as_deref(), a.rcvbuf.as_deref())?,
            peer: opts::peer(TCP, a.peer.as_deref())?,
        })
    }
}

impl RrPlan {
    fn resolve(a: &RrArgs) -> Result<RrPlan> {
        Ok(RrPlan {
            clients: opts::count(TCP, "--clients", a.clients as u64, MAX_WORKERS)?,
            duration: opts::duration(TCP, "--duration", &a.duration)?,
            req: opts::msg_size(TCP, "--req", &a.req, MAX_MSG)?,
            resp: opts::msg_size(TCP, "--resp", &a.resp, MAX_MSG)?,
            bufs: Bufs::resolve(a.sndbuf.as_deref(), a.rcvbuf.as_deref())?,
            peer: opts::peer(TCP, a.peer.as_deref())?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The header line.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnKind {
    Stream,
    Rr,
    Crr,
}

impl ConnKind {
    fn name(self) -> &'static str {
        match self {
            ConnKind::Stream => "stream",
            ConnKind::Rr => "rr",
            ConnKind::Crr => "crr",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    kind: ConnKind,
    req: u64,
    resp: u64,
    bufs_snd: u64,
    bufs_rcv: u64,
}

impl Header {
    fn new(kind: ConnKind, req: usize, resp: usize, bufs: Bufs) -> Header {
        Header {
            kind,
            req: req as u64,
            resp: resp as u64,
            bufs_snd: bufs.snd.unwrap_or(0) as u64,
            bufs_rcv: bufs.rcv.unwrap_or(0) as u64,
        }
    }

    fn encode(&self) -> [u8; HEADER_LEN] {
        let line = format!(
            "{MAGIC} {} {} {} {} {}",
            self.kind.name(),
            self.req,
            self.resp,
            self.bufs_snd,
            self.bufs_rcv
        );
        let mut out = [b' '; HEADER_LEN];
        assert!(line.len() < HEADER_LEN, "header line {line:?} too long");
        out[..line.len()].copy_from_slice(line.as_bytes());
        out[HEADER_LEN - 1] = b'\n';
        out
    }

    fn decode(raw: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let text = std::str::from_utf8(raw).map_err(|_| "header is not ASCII".to_string())?;
        let f: Vec<&str> = text.split_ascii_whitespace().collect();
        if raw[HEADER_LEN - 1] != b'\n' || f.len() != 6 || f[0] != MAGIC {
            return Err(format!("not a {MAGIC} header: {:?}", text.trim_end()));
        }
        let kind = match f[1] {
            "stream" => ConnKind::Stream,
            "rr" => ConnKind::Rr,
            "crr" => ConnKind::Crr,
            k => return Err(format!("unknown kind {k:?}")),
        };
        let num = |s: &str, max: u64| match s.parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(format!("bad number {s:?} in header")),
        };
        let h = Header {
            kind,
            req: num(f[2], MAX_MSG)?,
            resp: num(f[3], MAX_MSG)?,
            bufs_snd: num(f[4], MAX_SOCKBUF)?,
            bufs_rcv: num(f[5], MAX_SOCKBUF)?,
        };
        if kind != ConnKind::Stream && (h.req == 0 || h.resp == 0) {
            return Err("rr/crr header with a 0-byte request or response".into());
        }
        Ok(h)
    }
}

// ---------------------------------------------------------------------------------------------
// Sockets.

fn set_bufs(s: &SockRef<'_>, bufs: Bufs) -> io::Result<()> {
    if let Some(n) = bufs.snd {
        s.set_send_buffer_size(n)?;
    }
    if let Some(n) = bufs.rcv {
        s.set_recv_buffer_size(n)?;
    }
    Ok(())
}

/// A blocking client socket with the buffer sizes set before connect() (so they shape the window
/// from the SYN on) and IO_TIMEOUT on connect, send and recv.
fn connect_to(addr: SocketAddr, bufs: Bufs, linger0: bool) -> io::Result<TcpStream> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    set_bufs(&SockRef::from(&s), bufs)?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    if linger0 {
        s.set_linger(Some(Duration::ZERO))?;
    }
    match s.connect(&SockAddr::from(addr)) {
        Ok(()) => Ok(s.into()),
        // A blocking connect that outlives SO_SNDTIMEO fails with EINPROGRESS: it timed out.
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
            Err(io::Error::from_raw_os_error(libc::ETIMEDOUT))
        }
        Err(e) => Err(e),
    }
}

fn listen_on(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&SockAddr::from(addr))?;
    // Capped by net.core.somaxconn; many crr clients must not overflow it.
    s.listen(4096)?;
    Ok(s.into())
}

/// End of stream from the peer where bytes were still due. Counted as ECONNRESET (and separately as
/// `peer_eof` in details) so it has an errno name.
fn peer_eof() -> io::Error {
    io::Error::from_raw_os_error(libc::ECONNRESET)
}

/// Fill `buf` completely. `Ok(false)`: the peer closed before the first byte.
fn recv_exact(s: &mut TcpStream, buf: &mut [u8], eof: &mut u64) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                *eof += 1;
                return Err(peer_eof());
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Segments this connection has retransmitted (TCP_INFO `tcpi_total_retrans`); 0 if unknown.
fn retransmits(s: &TcpStream) -> u64 {
    // SAFETY: all-zero bytes are a valid tcp_info (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes and the kernel writes at most `len`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        u64::from(info.tcpi_total_retrans)
    } else {
        0
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS | libc::ENOMEM | libc::ETIMEDOUT)
    )
}

fn micros(d: Duration) -> u64 {
    (d.as_nanos() as u64).saturating_add(500) / 1000
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

// ---------------------------------------------------------------------------------------------
// Running workers: spawn, start together, stop together, join.

/// Workers connect, then wait here until all have arrived; then the clock starts.
struct Gate {
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl Gate {
    fn new() -> Gate {
        Gate { state: Mutex::new((0, false)), cv: Condvar::new() }
    }

    fn arrive_and_wait(&self) {
        let mut g = self.state.lock().unwrap();
        g.0 += 1;
        self.cv.notify_all();
        while !g.1 {
            g = self.cv.wait(g).unwrap();
        }
    }

    fn open_when(&self, arrived: usize) {
        let mut g = self.state.lock().unwrap();
        while g.0 < arrived {
            g = self.cv.wait(g).unwrap();
        }
        g.1 = true;
        self.cv.notify_all();
    }
}

/// What every worker of a run shares: read-only, apart from the stop flag.
struct Ctl {
    stop: AtomicBool,
    gate: Gate,
    /// The workload's start, for errno first-seen times.
    t0: Instant,
}

impl Ctl {
    fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }

    /// Sleep RETRY_PAUSE unless the run ends first.
    fn pause(&self) {
        let end = Instant::now() + RETRY_PAUSE;
        while !self.stopped() {
            let now = Instant::now();
            if now >= end {
                break;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(2)));
        }
    }
}

struct Driven<O> {
    outs: Vec<O>,
    cpu: Option<(CpuSample, CpuSample)>,
    rusage: Rusage,
    /// From the gate opening to every worker joined.
    wall: Duration,
    /// The run's stop flag ended the workers before `duration`.
    stopped: bool,
    /// Failures of the driver itself (a thread that could not be spawned).
    errors: Errors,
}

/// Spawn `n` workers running `work`, start them together once all have connected, stop them after
/// `duration` — or as soon as `stop` (the run's stop flag) is raised — and join them.
fn drive<O: Send>(
    n: usize,
    duration: Duration,
    t0: Instant,
    stop: &AtomicBool,
    work: impl Fn(&Ctl) -> O + Sync,
) -> Driven<O> {
    let ctl = Ctl { stop: AtomicBool::new(false), gate: Gate::new(), t0 };
    let mut errors = Errors::new(t0);
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            let b = std::thread::Builder::new().name(format!("fraglab-tcp-{i}")).stack_size(WORKER_STACK);
            match b.spawn_scoped(scope, || work(&ctl)) {
                Ok(h) => handles.push(h),
                Err(e) => errors.record(&e),
            }
        }
        ctl.gate.open_when(handles.len());
        let cpu0 = CpuSample::now().ok();
        let ru0 = Rusage::now();
        let start = Instant::now();
        let stopped = super::wait_or_stop(start + duration, stop);
        ctl.stop.store(true, Relaxed);
        let outs: Vec<O> = handles.into_iter().map(|h| h.join().expect("tcp worker panicked")).collect();
        let wall = start.elapsed();
        let rusage = Rusage::now().since(&ru0);
        let cpu = cpu0.zip(CpuSample::now().ok());
        Driven { outs, cpu, rusage, wall, stopped, errors }
    })
}

/// The in-process server, or the peer.
fn target(peer: Option<SocketAddr>, prespawn: usize) -> Result<(SocketAddr, Option<Server>)> {
    match peer {
        Some(a) => Ok((a, None)),
        None => {
            let server = Server::start("127.0.0.1:0".parse().unwrap(), prespawn)
                .context("starting the in-process server on 127.0.0.1")?;
            Ok((server.addr, Some(server)))
        }
    }
}

fn buf_notes(bufs: Bufs, effective: Option<(usize, usize)>, notes: &mut Vec<String>) {
    if bufs.snd.is_none() && bufs.rcv.is_none() {
        return;
    }
    notes.push("--sndbuf/--rcvbuf are set on both ends of every connection (the kernel doubles them)".into());
    let Some((snd, rcv)) = effective else { return };
    if bufs.snd.is_some_and(|r| snd < 2 * r) {
        notes.push(format!("SO_SNDBUF capped by net.core.wmem_max: effective {snd} bytes"));
    }
    if bufs.rcv.is_some_and(|r| rcv < 2 * r) {
        notes.push(format!("SO_RCVBUF capped by net.core.rmem_max: effective {rcv} bytes"));
    }
}

fn effective_bufs(s: &TcpStream) -> Option<(usize, usize)> {
    let r = SockRef::from(s);
    Some((r.send_buffer_size().ok()?, r.recv_buffer_size().ok()?))
}

fn where_note(server: &Option<Server>, addr: SocketAddr) -> String {
    if server.is_some() {
        format!("server in-process on {addr}: CPU, service demand and rusage include the server threads")
    } else {
        format!("server: fraglab serve at {addr}; CPU and rusage are this host's only")
    }
}

fn finish_server(server: Option<Server>, r: &mut WorkloadResult) {
    let Some(server) = server else { return };
    let rep = server.stop();
    if !rep.errors.is_empty() {
        r.notes.push("the in-process server saw failures: see details.server_errors".into());
        r.details.insert("server_errors".into(), json!(rep.errors));
    }
    if rep.bad_headers > 0 {
        r.details.insert("server_bad_headers".into(), json!(rep.bad_headers));
    }
    if rep.lingering > 0 {
        r.notes.push(format!("{} server threads were still running after 2 s", rep.lingering));
    }
}

// ---------------------------------------------------------------------------------------------
// tcp-stream

struct StreamOut {
    bytes: u64,
    msgs: u64,
    failed: u64,
    receiver: u64,
    unconfirmed: u64,
    connections: u64,
    retrans: u64,
    eof: u64,
    elapsed: Duration,
    effective: Option<(usize, usize)>,
    errors: Errors,
}

/// Connect and send the header; a failure is counted and leaves no connection.
fn open(
    addr: SocketAddr,
    bufs: Bufs,
    linger0: bool,
    header: &[u8],
    errors: &mut Errors,
    failed: &mut u64,
) -> Option<TcpStream> {
    match connect_to(addr, bufs, linger0).and_then(|mut s| s.write_all(header).map(|()| s)) {
        Ok(s) => Some(s),
        Err(e) => {
            errors.record(&e);
            *failed += 1;
            None
        }
    }
}

fn stream_worker(p: &StreamPlan, addr: SocketAddr, ctl: &Ctl) -> StreamOut {
    let mut o = StreamOut {
        bytes: 0,
        msgs: 0,
        failed: 0,
        receiver: 0,
        unconfirmed: 0,
        connections: 0,
        retrans: 0,
        eof: 0,
        elapsed: Duration::ZERO,
        effective: None,
        errors: Errors::new(ctl.t0),
    };
    let header = Header::new(ConnKind::Stream, p.msg, 0, p.bufs).encode();
    let buf = vec![0x5a_u8; p.msg];
    let mut conn = open(addr, p.bufs, false, &header, &mut o.errors, &mut o.failed);
    if let Some(s) = &conn {
        o.connections += 1;
        o.effective = effective_bufs(s);
    }
    ctl.gate.arrive_and_wait();
    let start = Instant::now();
    // Bytes sent on the current connection: confirmed by the receiver's count when it closes.
    let mut conn_bytes = 0u64;
    while !ctl.stopped() {
        let Some(s) = conn.as_mut() else {
            ctl.pause();
            conn = open(addr, p.bufs, false, &header, &mut o.errors, &mut o.failed);
            o.connections += conn.is_some() as u64;
            continue;
        };
        match s.write(&buf) {
            Ok(n) => {
                conn_bytes += n as u64;
                o.msgs += (n == buf.len()) as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                o.errors.record(&e);
                o.failed += 1;
                if !transient(&e) {
                    o.retrans += retransmits(s);
                    o.bytes += conn_bytes;
                    o.unconfirmed += conn_bytes;
                    conn_bytes = 0;
                    conn = None;
                }
            }
        }
    }
    o.elapsed = start.elapsed();
    o.bytes += conn_bytes;
    if let Some(mut s) = conn {
        o.retrans += retransmits(&s);
        // Half-close, then the receiver reports what it got.
        let mut count = [0u8; 8];
        let res =
            s.shutdown(Shutdown::Write).and_then(|()| match recv_exact(&mut s, &mut count, &mut o.eof) {
                Ok(true) => Ok(u64::from_be_bytes(count)),
                Ok(false) => {
                    o.eof += 1;
                    Err(peer_eof())
                }
                Err(e) => Err(e),
            });
        match res {
            Ok(n) => o.receiver += n,
            Err(e) => {
                o.errors.record(&e);
                o.failed += 1;
                o.unconfirmed += conn_bytes;
            }
        }
    }
    o
}

/// `fraglab workload tcp-stream`.
/// Check options without opening a socket: what `fraglab run` does before it fragments.
pub fn validate(kind: &super::Kind) -> Result<()> {
    match kind {
        super::Kind::TcpStream(a) => StreamPlan::resolve(a).map(drop),
        super::Kind::TcpRr(a) | super::Kind::TcpCrr(a) => RrPlan::resolve(a).map(drop),
        _ => Ok(()),
    }
}

pub fn stream(a: &StreamArgs) -> Result<WorkloadResult> {
    stream_until(a, &AtomicBool::new(false))
}

/// [`stream`], ended early when `stop` (the run's stop flag) is raised.
pub fn stream_until(a: &StreamArgs, stop: &AtomicBool) -> Result<WorkloadResult> {
    let p = StreamPlan::resolve(a)?;
    let mut r = WorkloadResult::new("tcp-stream", serde_json::to_value(a)?, wall_now());
    let t0 = Instant::now();
    let (addr, server) = target(p.peer, p.threads + 1)?;
    let d = drive(p.threads, p.duration, t0, stop, |ctl| stream_worker(&p, addr, ctl));

    // Failures of the driver itself (a worker thread that could not be spawned).
    let mut errors = d.errors;
    r.failed = errors.total();
    let (mut sent, mut received, mut unconfirmed, mut conns, mut eof, mut retrans) = (0, 0, 0, 0, 0, 0);
    let mut per_thread = Vec::with_capacity(d.outs.len());
    let mut window = Duration::ZERO;
    let mut effective = None;
    for o in d.outs {
        sent += o.bytes;
        received += o.receiver;
        unconfirmed += o.unconfirmed;
        conns += o.connections;
        eof += o.eof;
        retrans += o.retrans;
        r.ok += o.msgs;
        r.failed += o.failed;
        window = window.max(o.elapsed);
        effective = effective.or(o.effective);
        let secs = o.elapsed.as_secs_f64().max(1e-9);
        per_thread.push(round1(o.bytes as f64 * 8.0 / secs / 1e6));
        errors.merge(o.errors);
    }
    let secs = window.as_secs_f64().max(1e-9);
    r.duration_s = secs;
    r.bytes = sent;
    r.throughput_mbit = Some(sent as f64 * 8.0 / secs / 1e6);
    r.ops_per_sec = Some(r.ok as f64 / secs);
    r.per_worker = Spread::of(&per_thread);
    r.cpu = d.cpu.as_ref().map(|(c0, c1)| c0.until(c1, sent));
    r.errors = errors.into_vec();
    r.rusage = d.rusage;
    r.details.insert("server".into(), json!(addr.to_string()));
    r.details.insert("connections".into(), json!(conns));
    r.details.insert("sender_bytes".into(), json!(sent));
    r.details.insert("receiver_bytes".into(), json!(received));
    r.details.insert("per_thread_mbit".into(), json!(per_thread));
    r.details.insert("retransmits".into(), json!(retrans));
    if let Some((snd, rcv)) = effective {
        r.details.insert("sndbuf_effective".into(), json!(snd));
        r.details.insert("rcvbuf_effective".into(), json!(rcv));
    }
    if unconfirmed > 0 {
        r.details.insert("unconfirmed_bytes".into(), json!(unconfirmed));
        r.notes.push(format!(
            "{} were sent on connections that failed before the receiver reported its count",
            format_size(unconfirmed)
        ));
    }
    if eof > 0 {
        r.details.insert("peer_eof".into(), json!(eof));
        r.notes.push("an early end of stream from the peer is counted as ECONNRESET".into());
    }
    r.notes.push(where_note(&server, addr));
    r.notes.push("ok counts whole messages sent; bytes are the sender's count".into());
    if r.cpu.is_none() {
        r.notes.push("/proc/stat could not be read: no CPU figures".into());
    }
    if conns == 0 || r.failed > 0 {
        r.notes.push("a worker without a connection retries every 10 ms until the duration ends".into());
    }
    if d.stopped {
        r.mark_stopped(format_args!("{secs:.1} s of the {} asked for", a.duration));
    }
    buf_notes(p.bufs, effective, &mut r.notes);
    finish_server(server, &mut r);
    Ok(r)
}

// ---------------------------------------------------------------------------------------------
// tcp-rr and tcp-crr

struct RrOut {
    ok: u64,
    failed: u64,
    connections: u64,
    retrans: u64,
    eof: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
    connect: Histogram<u64>,
    effective: Option<(usize, usize)>,
    errors: Errors,
}

impl RrOut {
    fn new(ctl: &Ctl) -> RrOut {
        RrOut {
            ok: 0,
            failed: 0,
            connections: 0,
            retrans: 0,
            eof: 0,
            elapsed: Duration::ZERO,
            latency: latency_histogram(),
            connect: latency_histogram(),
            effective: None,
            errors: Errors::new(ctl.t0),
        }
    }

    fn fail(&mut self, e: &io::Error) {
        self.errors.record(e);
        self.failed += 1;
    }
}

/// One request, one whole response.
fn transact(s: &mut TcpStream, req: &[u8], resp: &mut [u8], eof: &mut u64) -> io::Result<()> {
    s.write_all(req)?;
    if recv_exact(s, resp, eof)? {
        Ok(())
    } else {
        *eof += 1;
        Err(peer_eof())
    }
}

fn rr_worker(p: &RrPlan, addr: SocketAddr, ctl: &Ctl) -> RrOut {
    let mut o = RrOut::new(ctl);
    let header = Header::new(ConnKind::Rr, p.req, p.resp, p.bufs).encode();
    let req = vec![0x5a_u8; p.req];
    let mut resp = vec![0_u8; p.resp];
    let mut conn = open(addr, p.bufs, false, &header, &mut o.errors, &mut o.failed);
    if let Some(s) = &conn {
        o.connections += 1;
        o.effective = effective_bufs(s);
    }
    ctl.gate.arrive_and_wait();
    let start = Instant::now();
    while !ctl.stopped() {
        let Some(s) = conn.as_mut() else {
            ctl.pause();
            conn = open(addr, p.bufs, false, &header, &mut o.errors, &mut o.failed);
            o.connections += conn.is_some() as u64;
            continue;
        };
        let t = Instant::now();
        match transact(s, &req, &mut resp, &mut o.eof) {
            Ok(()) => {
                o.latency.saturating_record(micros(t.elapsed()));
                o.ok += 1;
            }
            Err(e) => {
                o.fail(&e);
                o.retrans += retransmits(s);
                conn = None;
            }
        }
    }
    o.elapsed = start.elapsed();
    if let Some(s) = &conn {
        o.retrans += retransmits(s);
    }
    o
}

fn crr_worker(p: &RrPlan, addr: SocketAddr, ctl: &Ctl) -> RrOut {
    let mut o = RrOut::new(ctl);
    // Header and request go out in one send().
    let mut first = Header::new(ConnKind::Crr, p.req, p.resp, p.bufs).encode().to_vec();
    first.resize(HEADER_LEN + p.req, 0x5a);
    let mut resp = vec![0_u8; p.resp];
    ctl.gate.arrive_and_wait();
    let start = Instant::now();
    while !ctl.stopped() {
        let t = Instant::now();
        let mut s = match connect_to(addr, p.bufs, true) {
            Ok(s) => s,
            Err(e) => {
                o.fail(&e);
                ctl.pause();
                continue;
            }
        };
        o.connect.saturating_record(micros(t.elapsed()));
        o.connections += 1;
        if o.effective.is_none() {
            o.effective = effective_bufs(&s);
        }
        match transact(&mut s, &first, &mut resp, &mut o.eof) {
            Ok(()) => {
                o.latency.saturating_record(micros(t.elapsed()));
                o.ok += 1;
            }
            Err(e) => o.fail(&e),
        }
        // SO_LINGER 0: close() sends an RST and leaves no TIME_WAIT behind.
        drop(s);
    }
    o.elapsed = start.elapsed();
    o
}

fn rr_like(a: &RrArgs, crr: bool, stop: &AtomicBool) -> Result<WorkloadResult> {
    let p = RrPlan::resolve(a)?;
    let kind = if crr { "tcp-crr" } else { "tcp-rr" };
    let mut r = WorkloadResult::new(kind, serde_json::to_value(a)?, wall_now());
    let t0 = Instant::now();
    let (addr, server) = target(p.peer, p.clients + 1)?;
    let d = drive(p.clients, p.duration, t0, stop, |ctl| {
        if crr {
            crr_worker(&p, addr, ctl)
        } else {
            rr_worker(&p, addr, ctl)
        }
    });

    // Failures of the driver itself (a worker thread that could not be spawned).
    let mut errors = d.errors;
    r.failed = errors.total();
    let mut latency = latency_histogram();
    let mut connect = latency_histogram();
    let (mut conns, mut eof, mut retrans) = (0, 0, 0);
    let mut per_client = Vec::with_capacity(d.outs.len());
    let mut window = Duration::ZERO;
    let mut effective = None;
    for o in d.outs {
        r.ok += o.ok;
        r.failed += o.failed;
        conns += o.connections;
        eof += o.eof;
        retrans += o.retrans;
        window = window.max(o.elapsed);
        effective = effective.or(o.effective);
        per_client.push(round1(o.ok as f64 / o.elapsed.as_secs_f64().max(1e-9)));
        latency.add(&o.latency).expect("histograms share bounds");
        connect.add(&o.connect).expect("histograms share bounds");
        errors.merge(o.errors);
    }
    let secs = window.as_secs_f64().max(1e-9);
    r.duration_s = secs;
    r.bytes = r.ok * p.req as u64;
    r.ops_per_sec = Some(r.ok as f64 / secs);
    r.per_worker = Spread::of(&per_client);
    r.latency_us = Latency::of(&latency);
    r.cpu = d.cpu.as_ref().map(|(c0, c1)| c0.until(c1, 0));
    if let (Some(cpu), true) = (&r.cpu, r.ok > 0) {
        r.details
            .insert("service_demand_us_per_tran".into(), json!(service_demand_per_op(cpu, d.wall, r.ok)));
    }
    r.errors = errors.into_vec();
    r.rusage = d.rusage;
    r.details.insert("server".into(), json!(addr.to_string()));
    r.details.insert("connections".into(), json!(conns));
    r.details.insert("transactions".into(), json!(r.ok));
    r.details.insert("response_bytes".into(), json!(r.ok * p.resp as u64));
    r.details.insert("per_client_tps".into(), json!(per_client));
    if !crr {
        r.details.insert("retransmits".into(), json!(retrans));
    }
    if crr {
        if let Some(l) = Latency::of(&connect) {
            r.details.insert("connect_latency_us".into(), serde_json::to_value(l)?);
        }
        r.notes.push(
            "each transaction is connect + request + response + close; latency includes the connect".into(),
        );
        r.notes.push(
            "clients close with SO_LINGER 0 (an RST, not a FIN): no TIME_WAIT, so ephemeral ports are \
             not exhausted however long the run"
                .into(),
        );
    }
    if let Some((snd, rcv)) = effective {
        r.details.insert("sndbuf_effective".into(), json!(snd));
        r.details.insert("rcvbuf_effective".into(), json!(rcv));
    }
    if eof > 0 {
        r.details.insert("peer_eof".into(), json!(eof));
        r.notes.push("an early end of stream from the peer is counted as ECONNRESET".into());
    }
    r.notes.push(where_note(&server, addr));
    r.notes.push("bytes are the requests' payload; response_bytes in details".into());
    if r.cpu.is_none() {
        r.notes.push("/proc/stat could not be read: no CPU figures".into());
    }
    if r.failed > 0 {
        r.notes.push("a client whose connect fails retries every 10 ms until the duration ends".into());
    }
    if d.stopped {
        r.mark_stopped(format_args!("{secs:.1} s of the {} asked for", a.duration));
    }
    buf_notes(p.bufs, effective, &mut r.notes);
    finish_server(server, &mut r);
    Ok(r)
}

/// Busy CPU µs per operation over the run, netperf's RR service demand (µs/Tr).
fn service_demand_per_op(cpu: &Cpu, wall: Duration, ops: u64) -> f64 {
    let busy_us = cpu.util_pct / 100.0 * cpu.cpus as f64 * wall.as_secs_f64() * 1e6;
    (busy_us / ops as f64 * 1000.0).round() / 1000.0
}

/// `fraglab workload tcp-rr`.
pub fn rr(a: &RrArgs) -> Result<WorkloadResult> {
    rr_like(a, false, &AtomicBool::new(false))
}

/// [`rr`], ended early when `stop` (the run's stop flag) is raised.
pub fn rr_until(a: &RrArgs, stop: &AtomicBool) -> Result<WorkloadResult> {
    rr_like(a, false, stop)
}

/// `fraglab workload tcp-crr`.
pub fn crr(a: &RrArgs) -> Result<WorkloadResult> {
    rr_like(a, true, &AtomicBool::new(false))
}

/// [`crr`], ended early when `stop` (the run's stop flag) is raised.
pub fn crr_until(a: &RrArgs, stop: &AtomicBool) -> Result<WorkloadResult> {
    rr_like(a, true, stop)
}

// ---------------------------------------------------------------------------------------------
// The server: a pool of acceptor threads on one listener that grows so one is always waiting in
// accept(); each handles the connection it accepted to the end (a crr connection is one
// transaction, a stream or rr connection lasts the run).

struct Shared {
    listener: TcpListener,
    stop: AtomicBool,
    idle: AtomicUsize,
    live: AtomicUsize,
    conns: [AtomicU64; 3],
    bytes: AtomicU64,
    transactions: AtomicU64,
    bad_headers: AtomicU64,
    /// Touched only when a connection fails, never per message.
    errors: Mutex<Errors>,
}

impl Shared {
    fn record(&self, e: &io::Error) {
        self.errors.lock().unwrap().record(e);
    }
}

/// The TCP server side: reads a connection's header, then serves it as its kind asks. In-process for
/// the workloads; `fraglab serve` runs it for a client on another host.
pub(super) struct Server {
    /// Where it listens (the port the kernel chose for port 0).
    pub(super) addr: SocketAddr,
    shared: Arc<Shared>,
}

/// What the server side saw.
pub(super) struct ServerReport {
    /// Connections by kind: stream, rr, crr.
    pub(super) conns: [u64; 3],
    pub(super) bytes: u64,
    pub(super) transactions: u64,
    pub(super) bad_headers: u64,
    pub(super) errors: Vec<ErrnoCount>,
    /// Server threads still running when it stopped waiting for them.
    pub(super) lingering: usize,
}

impl Server {
    /// Listen on `addr` with `acceptors` threads waiting in accept() (more are started as they are
    /// taken).
    pub(super) fn start(addr: SocketAddr, acceptors: usize) -> io::Result<Server> {
        let listener = listen_on(addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            listener,
            stop: AtomicBool::new(false),
            idle: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            conns: Default::default(),
            bytes: AtomicU64::new(0),
            transactions: AtomicU64::new(0),
            bad_headers: AtomicU64::new(0),
            errors: Mutex::new(Errors::new(Instant::now())),
        });
        spawn_acceptor(&shared)?;
        for _ in 1..acceptors.clamp(1, SERVER_MAX_IDLE) {
            let _ = spawn_acceptor(&shared);
        }
        Ok(Server { addr, shared })
    }

    fn report(&self) -> ServerReport {
        let sh = &self.shared;
        ServerReport {
            conns: [0, 1, 2].map(|i| sh.conns[i].load(Relaxed)),
            bytes: sh.bytes.load(Relaxed),
            transactions: sh.transactions.load(Relaxed),
            bad_headers: sh.bad_headers.load(Relaxed),
            errors: std::mem::replace(&mut *sh.errors.lock().unwrap(), Errors::new(Instant::now()))
                .into_vec(),
            lingering: sh.live.load(Relaxed),
        }
    }

    /// Stop accepting, give running connections up to 2 s to end, and report.
    pub(super) fn stop(self) -> ServerReport {
        self.shared.stop.store(true, Relaxed);
        // shutdown(SHUT_RD) on a listener wakes every thread blocked in accept() (with EINVAL).
        let _ = SockRef::from(&self.shared.listener).shutdown(Shutdown::Read);
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.shared.live.load(Relaxed) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.report()
    }
}

fn spawn_acceptor(sh: &Arc<Shared>) -> io::Result<()> {
    sh.idle.fetch_add(1, Relaxed);
    sh.live.fetch_add(1, Relaxed);
    let mine = Arc::clone(sh);
    let spawned = std::thread::Builder::new()
        .name("fraglab-serve".into())
        .stack_size(WORKER_STACK)
        .spawn(move || acceptor(mine));
    if let Err(e) = &spawned {
        sh.idle.fetch_sub(1, Relaxed);
        sh.live.fetch_sub(1, Relaxed);
        sh.record(e);
    }
    spawned.map(drop)
}

fn acceptor(sh: Arc<Shared>) {
    // Reused across the connections this thread handles: no allocation per crr transaction.
    let mut scratch: Vec<u8> = Vec::new();
    loop {
        if sh.stop.load(Relaxed) {
            break;
        }
        match sh.listener.accept() {
            Ok((s, _)) => {
                if sh.idle.fetch_sub(1, Relaxed) == 1 && sh.live.load(Relaxed) < SERVER_MAX_THREADS {
                    let _ = spawn_acceptor(&sh);
                }
                handle(s, &sh, &mut scratch);
                if sh.idle.fetch_add(1, Relaxed) >= SERVER_MAX_IDLE {
                    break;
                }
            }
            Err(_) if sh.stop.load(Relaxed) => break,
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR | libc::ECONNABORTED) => {}
                // Out of descriptors or memory: count it, let the system breathe, go on.
                _ => {
                    sh.record(&e);
                    std::thread::sleep(Duration::from_millis(10));
                }
            },
        }
    }
    sh.idle.fetch_sub(1, Relaxed);
    sh.live.fetch_sub(1, Relaxed);
}

fn handle(mut s: TcpStream, sh: &Shared, scratch: &mut Vec<u8>) {
    let _ = s.set_read_timeout(Some(SERVER_IDLE_TIMEOUT));
    let _ = s.set_write_timeout(Some(SERVER_IDLE_TIMEOUT));
    let mut raw = [0u8; HEADER_LEN];
    let mut eof = 0;
    match recv_exact(&mut s, &mut raw, &mut eof) {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => return sh.record(&e),
    }
    let h = match Header::decode(&raw) {
        Ok(h) => h,
        Err(_) => {
            sh.bad_headers.fetch_add(1, Relaxed);
            return;
        }
    };
    let bufs = Bufs {
        snd: (h.bufs_snd > 0).then_some(h.bufs_snd as usize),
        rcv: (h.bufs_rcv > 0).then_some(h.bufs_rcv as usize),
    };
    if let Err(e) = set_bufs(&SockRef::from(&s), bufs) {
        sh.record(&e);
    }
    sh.conns[h.kind as usize].fetch_add(1, Relaxed);
    match h.kind {
        ConnKind::Stream => serve_stream(s, sh, scratch),
        ConnKind::Rr | ConnKind::Crr => serve_rr(s, h, sh, scratch),
    }
}

fn serve_stream(mut s: TcpStream, sh: &Shared, scratch: &mut Vec<u8>) {
    if scratch.len() < RECV_BUF {
        scratch.resize(RECV_BUF, 0);
    }
    let buf = &mut scratch[..RECV_BUF];
    let mut n = 0u64;
    loop {
        match s.read(buf) {
            Ok(0) => break,
            Ok(k) => n += k as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                sh.bytes.fetch_add(n, Relaxed);
                return sh.record(&e);
            }
        }
    }
    sh.bytes.fetch_add(n, Relaxed);
    if let Err(e) = s.write_all(&n.to_be_bytes()) {
        sh.record(&e);
    }
}

fn serve_rr(mut s: TcpStream, h: Header, sh: &Shared, scratch: &mut Vec<u8>) {
    let (req, resp) = (h.req as usize, h.resp as usize);
    let need = req.max(resp);
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    let mut done = 0u64;
    let mut eof = 0;
    loop {
        match recv_exact(&mut s, &mut scratch[..req], &mut eof) {
            Ok(true) => {}
            Ok(false) => break,
            // A crr client resets the connection once it has its response.
            Err(e) if h.kind == ConnKind::Crr && done > 0 && e.raw_os_error() == Some(libc::ECONNRESET) => {
                break
            }
            Err(e) => {
                sh.record(&e);
                break;
            }
        }
        if let Err(e) = s.write_all(&scratch[..resp]) {
            sh.record(&e);
            break;
        }
        done += 1;
    }
    sh.transactions.fetch_add(done, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct S {
        #[command(flatten)]
        a: StreamArgs,
    }
    #[derive(Parser)]
    struct R {
        #[command(flatten)]
        a: RrArgs,
    }
    #[test]
    fn serde_defaults_equal_clap_defaults() {
        assert_eq!(S::parse_from(["x"]).a, StreamArgs::default());
        assert_eq!(R::parse_from(["x"]).a, RrArgs::default());
        let s: StreamArgs = toml::from_str("threads = 8\nmsg = \"1452\"").unwrap();
        assert_eq!(s, StreamArgs { threads: 8, msg: "1452".into(), ..Default::default() });
        let s: StreamArgs = toml::from_str("msg = 65536\nsndbuf = 200000").unwrap();
        assert_eq!((s.msg.as_str(), s.sndbuf.as_deref()), ("65536", Some("200000")));
        let r: RrArgs = toml::from_str("").unwrap();
        assert_eq!(r, RrArgs::default());
        assert!(toml::from_str::<RrArgs>("clients = 2\nthreads = 3").is_err(), "unknown field refused");
    }

    #[test]
    fn validation_names_the_flag() {
        let err = |a: StreamArgs| StreamPlan::resolve(&a).unwrap_err().to_string();
        assert!(err(StreamArgs { threads: 0, ..Default::default() }).starts_with("--threads: 0"));
        let e = err(StreamArgs { duration: "-3s".into(), ..Default::default() });
        assert!(e.starts_with("--duration: \"-3s\" is not a duration"), "{e}");
        assert!(err(StreamArgs { duration: "0s".into(), ..Default::default() }).starts_with("--duration:"));
        assert!(err(StreamArgs { msg: "0".into(), ..Default::default() }).starts_with("--msg: \"0\""));
        assert!(err(StreamArgs { sndbuf: Some("1GB".into()), ..Default::default() }).starts_with("--sndbuf:"));
        assert!(err(StreamArgs { peer: Some("nohost".into()), ..Default::default() }).starts_with("--peer:"));
        assert!(err(StreamArgs { peer: Some("127.0.0.1:0".into()), ..Default::default() }).contains("port 0"));
        let e = RrPlan::resolve(&RrArgs { resp: "0".into(), ..Default::default() }).unwrap_err();
        assert!(e.to_string().starts_with("--resp:"));
        let e = RrPlan::resolve(&RrArgs { clients: 5000, ..Default::default() }).unwrap_err();
        assert!(e.to_string().starts_with("--clients:"));
    }

    #[test]
    fn header_round_trip() {
        let bufs = Bufs { snd: Some(200000), rcv: None };
        for kind in [ConnKind::Stream, ConnKind::Rr, ConnKind::Crr] {
            let h = Header::new(kind, MAX_MSG as usize, 256, bufs);
            assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        }
        let max = Header {
            kind: ConnKind::Stream,
            req: MAX_MSG,
            resp: MAX_MSG,
            bufs_snd: MAX_SOCKBUF,
            bufs_rcv: MAX_SOCKBUF,
        };
        assert_eq!(Header::decode(&max.encode()).unwrap(), max);
        let mut junk = [b'x'; HEADER_LEN];
        assert!(Header::decode(&junk).is_err());
        junk[..20].copy_from_slice(b"GET / HTTP/1.1\r\nHost");
        assert!(Header::decode(&junk).is_err());
        let mut bad = Header::new(ConnKind::Rr, 0, 1, Bufs::default()).encode();
        assert!(Header::decode(&bad).is_err(), "0-byte request refused");
        bad[HEADER_LEN - 1] = b' ';
        assert!(Header::decode(&bad).is_err());
    }
}
