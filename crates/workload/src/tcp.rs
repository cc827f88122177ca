//! TCP workloads: `tcp-stream` (T connections each streaming messages, like super_netperf — seed
//! 002), `tcp-rr` (C clients doing blocking request/response transactions — seed 004), `tcp-crr` (a
//! new connection per transaction), and `Server`, their server side.
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
//! The workers run under the driver in `workload/net.rs`, as the SCTP ones do: each owns its
//! socket, its one preallocated buffer and its tally, and everything is merged after they have been
//! joined.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::json;
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use crate::net::{
    self, effective_bufs, record_latency, Ctl, Rate, ServerErrors, SockBufs, Tally, Watch, MAX_WORKERS,
    RECV_BUF, WORKER_STACK,
};
use crate::opts::{self, opt_size_text, size_text, Wording};
use crate::room::{self, Conns, Limits, Room};
use fraglab_probe::sock_diag::Proto;
use fraglab_results::workload::{latency_histogram, wall_now, Cpu, ErrnoCount, Latency, WorkloadResult};
use fraglab_units::format_size;

/// Length of the header line every connection opens with.
pub const HEADER_LEN: usize = 64;
const MAGIC: &str = "FRAGLAB-TCP/1";
/// Longest a client blocks in one connect/send/recv before counting ETIMEDOUT/EAGAIN.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a server connection waits for its client before giving up on it.
const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause after a lost connection or a failed connect before a worker connects again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);
/// TCP's kinds word option errors `--flag: why`.
const TCP: Wording = Wording::Tcp;
/// Upper bound for --msg / --req / --resp.
const MAX_MSG: u64 = 64 << 20;
/// Largest --sndbuf / --rcvbuf (an int the kernel doubles).
const MAX_SOCKBUF: u64 = (i32::MAX / 2) as u64;
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
    /// Run over IPv6: the in-process server on [::1] instead of 127.0.0.1 (with --peer, its IPv6
    /// address).
    #[arg(long)]
    pub ipv6: bool,
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
            ipv6: false,
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
    /// Run over IPv6: the in-process server on [::1] instead of 127.0.0.1 (with --peer, its IPv6
    /// address).
    #[arg(long)]
    pub ipv6: bool,
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
            ipv6: false,
            peer: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Validation: every flag is checked before any socket is opened.

#[derive(Debug)]
pub(crate) struct StreamPlan {
    threads: usize,
    duration: Duration,
    msg: usize,
    bufs: SockBufs,
    ipv6: bool,
    peer: Option<SocketAddr>,
}

#[derive(Debug)]
pub(crate) struct RrPlan {
    clients: usize,
    duration: Duration,
    req: usize,
    resp: usize,
    bufs: SockBufs,
    ipv6: bool,
    peer: Option<SocketAddr>,
}

impl StreamPlan {
    pub(crate) fn resolve(a: &StreamArgs) -> Result<StreamPlan> {
        Ok(StreamPlan {
            threads: opts::count(TCP, "--threads", a.threads as u64, MAX_WORKERS)?,
            duration: opts::duration(TCP, "--duration", &a.duration)?,
            msg: opts::msg_size(TCP, "--msg", &a.msg, MAX_MSG)?,
            bufs: SockBufs::resolve(TCP, MAX_SOCKBUF, a.sndbuf.as_deref(), a.rcvbuf.as_deref())?,
            ipv6: a.ipv6,
            peer: opts::peer(TCP, a.peer.as_deref(), a.ipv6)?,
        })
    }
}

impl StreamPlan {
    /// The room its connections' buffers can take.
    pub(crate) fn room(&self, limits: &Limits) -> Option<Room> {
        let conns =
            Conns { n: self.threads, both_ends: self.peer.is_none(), bufs: self.bufs, in_flight: None };
        Some(room::sockets(limits.tcp.as_ref()?, limits, &conns))
    }
}

impl RrPlan {
    /// The room its transactions can take: one request and one response in flight a client.
    pub(crate) fn room(&self, limits: &Limits) -> Option<Room> {
        let in_flight = Some((self.req + self.resp) as u64);
        let conns = Conns { n: self.clients, both_ends: self.peer.is_none(), bufs: self.bufs, in_flight };
        Some(room::sockets(limits.tcp.as_ref()?, limits, &conns))
    }

    pub(crate) fn resolve(a: &RrArgs) -> Result<RrPlan> {
        Ok(RrPlan {
            clients: opts::count(TCP, "--clients", a.clients as u64, MAX_WORKERS)?,
            duration: opts::duration(TCP, "--duration", &a.duration)?,
            req: opts::msg_size(TCP, "--req", &a.req, MAX_MSG)?,
            resp: opts::msg_size(TCP, "--resp", &a.resp, MAX_MSG)?,
            bufs: SockBufs::resolve(TCP, MAX_SOCKBUF, a.sndbuf.as_deref(), a.rcvbuf.as_deref())?,
            ipv6: a.ipv6,
            peer: opts::peer(TCP, a.peer.as_deref(), a.ipv6)?,
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
    fn new(kind: ConnKind, req: usize, resp: usize, bufs: SockBufs) -> Header {
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

/// A blocking client socket with the buffer sizes set before connect() (so they shape the window
/// from the SYN on) and IO_TIMEOUT on connect, send and recv.
fn connect_to(addr: SocketAddr, bufs: SockBufs, linger0: bool) -> io::Result<TcpStream> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    bufs.apply(&s)?;
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

/// The in-process server (on [::1] with `ipv6`), with `prespawn` acceptors, or the peer.
fn target(peer: Option<SocketAddr>, ipv6: bool, prespawn: usize) -> Result<(SocketAddr, Option<Server>)> {
    net::server_or_peer(peer, ipv6, "TCP", |local| Server::start(local, prespawn).map(|s| (s.addr, s)))
}

/// The workload's sockets' memory, sampled over the window.
fn watch(addr: SocketAddr, server: &Option<Server>) -> Option<Watch> {
    Some(Watch::new(Proto::Tcp, addr, server.is_some()))
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

/// A stream worker's own counts, beside its tally (`ok` = whole messages, `bytes` = what its sends
/// accepted).
#[derive(Default)]
struct StreamOwn {
    /// What the receivers counted and reported back.
    receiver: u64,
    /// Sent on connections that failed before their receiver could report.
    unconfirmed: u64,
    connections: u64,
    retrans: u64,
    eof: u64,
    effective: Option<(usize, usize)>,
}

/// Connect and send the header; a failure is counted and leaves no connection.
fn open(addr: SocketAddr, bufs: SockBufs, linger0: bool, header: &[u8], t: &mut Tally) -> Option<TcpStream> {
    match connect_to(addr, bufs, linger0).and_then(|mut s| s.write_all(header).map(|()| s)) {
        Ok(s) => Some(s),
        Err(e) => {
            t.fail(&e);
            None
        }
    }
}

fn stream_worker(p: &StreamPlan, addr: SocketAddr, ctl: &Ctl) -> (Tally, StreamOwn) {
    let mut t = ctl.tally();
    let mut o = StreamOwn::default();
    let header = Header::new(ConnKind::Stream, p.msg, 0, p.bufs).encode();
    let buf = vec![0x5a_u8; p.msg];
    let mut conn = open(addr, p.bufs, false, &header, &mut t);
    if let Some(s) = &conn {
        o.connections += 1;
        o.effective = effective_bufs(s);
    }
    let start = ctl.start();
    // Bytes sent on the current connection: confirmed by the receiver's count when it closes.
    let mut conn_bytes = 0u64;
    while !ctl.stopped() {
        let Some(s) = conn.as_mut() else {
            ctl.pause(RECONNECT_PAUSE);
            conn = open(addr, p.bufs, false, &header, &mut t);
            o.connections += conn.is_some() as u64;
            continue;
        };
        match s.write(&buf) {
            Ok(n) => {
                conn_bytes += n as u64;
                t.ok += (n == buf.len()) as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                t.fail(&e);
                if !ctl.retry_after(&e) {
                    o.retrans += retransmits(s);
                    t.bytes += conn_bytes;
                    o.unconfirmed += conn_bytes;
                    conn_bytes = 0;
                    conn = None;
                }
            }
        }
    }
    t.elapsed = start.elapsed();
    t.bytes += conn_bytes;
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
                t.fail(&e);
                o.unconfirmed += conn_bytes;
            }
        }
    }
    (t, o)
}

/// `fraglab workload tcp-stream`.
pub fn stream(a: &StreamArgs) -> Result<WorkloadResult> {
    stream_until(a, &AtomicBool::new(false))
}

/// [`stream`], ended early when `stop` (the run's stop flag) is raised.
pub fn stream_until(a: &StreamArgs, stop: &AtomicBool) -> Result<WorkloadResult> {
    let p = StreamPlan::resolve(a)?;
    let r = WorkloadResult::new("tcp-stream", serde_json::to_value(a)?, wall_now());
    let t0 = Instant::now();
    let (addr, server) = target(p.peer, p.ipv6, p.threads + 1)?;
    let d = net::drive("tcp", p.threads, Some(p.duration), t0, stop, watch(addr, &server), |ctl| {
        stream_worker(&p, addr, ctl)
    });
    let mut m = d.merge(r, Rate::Mbit, |r| r.bytes);
    m.mark_if_stopped(&a.duration);
    let per_thread = m.rates_rounded();
    let r = &mut m.result;

    let (mut received, mut unconfirmed, mut conns, mut eof, mut retrans) = (0, 0, 0, 0, 0);
    let mut effective = None;
    for o in &m.own {
        received += o.receiver;
        unconfirmed += o.unconfirmed;
        conns += o.connections;
        eof += o.eof;
        retrans += o.retrans;
        effective = effective.or(o.effective);
    }
    r.details.insert("server".into(), json!(addr.to_string()));
    r.details.insert("connections".into(), json!(conns));
    r.details.insert("sender_bytes".into(), json!(r.bytes));
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
    p.bufs.notes(effective, &mut r.notes);
    finish_server(server, r);
    Ok(m.result)
}

// ---------------------------------------------------------------------------------------------
// tcp-rr and tcp-crr

/// An rr or crr client's own counts, beside its tally (`ok` = transactions, `bytes` = requests'
/// payload, latency = one transaction).
struct RrOwn {
    connections: u64,
    retrans: u64,
    eof: u64,
    /// crr: the connect() alone.
    connect: Histogram<u64>,
    effective: Option<(usize, usize)>,
}

impl RrOwn {
    fn new() -> RrOwn {
        RrOwn { connections: 0, retrans: 0, eof: 0, connect: latency_histogram(), effective: None }
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

fn rr_worker(p: &RrPlan, addr: SocketAddr, ctl: &Ctl) -> (Tally, RrOwn) {
    let mut t = ctl.tally();
    let mut o = RrOwn::new();
    let header = Header::new(ConnKind::Rr, p.req, p.resp, p.bufs).encode();
    let req = vec![0x5a_u8; p.req];
    let mut resp = vec![0_u8; p.resp];
    let mut conn = open(addr, p.bufs, false, &header, &mut t);
    if let Some(s) = &conn {
        o.connections += 1;
        o.effective = effective_bufs(s);
    }
    let start = ctl.start();
    while !ctl.stopped() {
        let Some(s) = conn.as_mut() else {
            ctl.pause(RECONNECT_PAUSE);
            conn = open(addr, p.bufs, false, &header, &mut t);
            o.connections += conn.is_some() as u64;
            continue;
        };
        let began = Instant::now();
        match transact(s, &req, &mut resp, &mut o.eof) {
            Ok(()) => t.done(began, p.req as u64),
            // Whatever the errno, not retried on this connection: a byte stream that failed
            // mid-transaction may hold part of a request or response, and the next one would be
            // read out of step.
            Err(e) => {
                t.fail(&e);
                o.retrans += retransmits(s);
                conn = None;
            }
        }
    }
    t.elapsed = start.elapsed();
    if let Some(s) = &conn {
        o.retrans += retransmits(s);
    }
    (t, o)
}

fn crr_worker(p: &RrPlan, addr: SocketAddr, ctl: &Ctl) -> (Tally, RrOwn) {
    let mut t = ctl.tally();
    let mut o = RrOwn::new();
    // Header and request go out in one send().
    let mut first = Header::new(ConnKind::Crr, p.req, p.resp, p.bufs).encode().to_vec();
    first.resize(HEADER_LEN + p.req, 0x5a);
    let mut resp = vec![0_u8; p.resp];
    let start = ctl.start();
    while !ctl.stopped() {
        let began = Instant::now();
        let mut s = match connect_to(addr, p.bufs, true) {
            Ok(s) => s,
            Err(e) => {
                t.fail(&e);
                ctl.pause(RECONNECT_PAUSE);
                continue;
            }
        };
        record_latency(&mut o.connect, began.elapsed());
        o.connections += 1;
        if o.effective.is_none() {
            o.effective = effective_bufs(&s);
        }
        match transact(&mut s, &first, &mut resp, &mut o.eof) {
            Ok(()) => t.done(began, p.req as u64),
            Err(e) => t.fail(&e),
        }
        // SO_LINGER 0: close() sends an RST and leaves no TIME_WAIT behind.
        drop(s);
    }
    t.elapsed = start.elapsed();
    (t, o)
}

fn rr_like(a: &RrArgs, crr: bool, stop: &AtomicBool) -> Result<WorkloadResult> {
    let p = RrPlan::resolve(a)?;
    let kind = if crr { "tcp-crr" } else { "tcp-rr" };
    let r = WorkloadResult::new(kind, serde_json::to_value(a)?, wall_now());
    let t0 = Instant::now();
    let (addr, server) = target(p.peer, p.ipv6, p.clients + 1)?;
    let d = net::drive("tcp", p.clients, Some(p.duration), t0, stop, watch(addr, &server), |ctl| {
        if crr {
            crr_worker(&p, addr, ctl)
        } else {
            rr_worker(&p, addr, ctl)
        }
    });
    let mut m = d.merge(r, Rate::Ops, |_| 0);
    m.mark_if_stopped(&a.duration);
    let per_client = m.rates_rounded();
    let r = &mut m.result;

    let mut connect = latency_histogram();
    let (mut conns, mut eof, mut retrans) = (0, 0, 0);
    let mut effective = None;
    for o in &m.own {
        conns += o.connections;
        eof += o.eof;
        retrans += o.retrans;
        effective = effective.or(o.effective);
        connect.add(&o.connect).expect("histograms share bounds");
    }
    if let (Some(cpu), true) = (&r.cpu, r.ok > 0) {
        r.details
            .insert("service_demand_us_per_tran".into(), json!(service_demand_per_op(cpu, m.wall, r.ok)));
    }
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
    p.bufs.notes(effective, &mut r.notes);
    finish_server(server, r);
    Ok(m.result)
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
    errors: ServerErrors,
}

impl Shared {
    fn record(&self, e: &io::Error) {
        self.errors.record(e);
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
            errors: ServerErrors::new(),
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
            errors: sh.errors.take(),
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
    let bufs = SockBufs {
        snd: (h.bufs_snd > 0).then_some(h.bufs_snd as usize),
        rcv: (h.bufs_rcv > 0).then_some(h.bufs_rcv as usize),
    };
    if let Err(e) = bufs.apply(&s) {
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
        let bufs = SockBufs { snd: Some(200000), rcv: None };
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
        let mut bad = Header::new(ConnKind::Rr, 0, 1, SockBufs::default()).encode();
        assert!(Header::decode(&bad).is_err(), "0-byte request refused");
        bad[HEADER_LEN - 1] = b' ';
        assert!(Header::decode(&bad).is_err());
    }
}
