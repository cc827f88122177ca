//! SCTP workloads: association set-up with up to 65535 streams on both ends (seed 000, `sctp_test -M
//! 65535 -T`), bulk transfer like `netperf -t SCTP_STREAM -- -m 12000` (seed 001) and request/response
//! like `netperf -t SCTP_RR`, against an in-process server on loopback or a `--peer`.
//!
//! The SCTP socket API is driven through libc directly: SCTP_INITMSG asks for the stream counts,
//! an SCTP_SNDINFO control message picks the stream of each message, SCTP_STATUS reports what the
//! association negotiated, SCTP_RCVINFO tells the server which association and PPID a message had.
//!
//! Wire protocol with the server (the in-process one here, or [`Server`] on another host): the server
//! consumes every message; a message whose PPID (big-endian) is N > 0 is answered with N bytes on the
//! same stream. So any SCTP server that accepts associations works for `sctp-connect` and
//! `sctp-stream`; `sctp-rr` needs one that answers.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use libc::c_int;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::net::{
    self, effective_bufs, record_latency, Ctl, Rate, ServerErrors, SockBufs, Tally, Watch, MAX_WORKERS,
    RECV_BUF, WORKER_STACK,
};
use crate::opts::{self, opt_size_text, size_text, Wording};
use crate::room::{self, Conns, Limits, Room};
use fraglab_probe::sock_diag::Proto;
use fraglab_results::workload::{wall_now, ErrnoCount, Errors, WorkloadResult};

// ---------------------------------------------------------------------------------------------
// The kernel ABI (include/uapi/linux/sctp.h), checked against Debian's linux-libc-dev 6.1 header.
// ---------------------------------------------------------------------------------------------

const IPPROTO_SCTP: c_int = 132;
const SOL_SCTP: c_int = 132;
// Socket options (level SOL_SCTP).
const SCTP_INITMSG: c_int = 2;
const SCTP_NODELAY: c_int = 3;
const SCTP_EVENTS: c_int = 11;
const SCTP_STATUS: c_int = 14;
const SCTP_RECVRCVINFO: c_int = 32;
// Control-message types (level IPPROTO_SCTP), enum sctp_cmsg_type.
const SCTP_SNDINFO: c_int = 2;
const SCTP_RCVINFO: c_int = 3;
/// recvmsg flag: the buffer holds a notification, not data.
const MSG_NOTIFICATION: c_int = 0x8000;
/// Notification types and association states.
const SCTP_ASSOC_CHANGE: u16 = 0x8001;
const SCTP_COMM_UP: u16 = 0;
const SCTP_COMM_LOST: u16 = 1;
const SCTP_RESTART: u16 = 2;
const SCTP_SHUTDOWN_COMP: u16 = 3;
const SCTP_CANT_STR_ASSOC: u16 = 4;

/// `struct sctp_initmsg`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SctpInitmsg {
    sinit_num_ostreams: u16,
    sinit_max_instreams: u16,
    sinit_max_attempts: u16,
    sinit_max_init_timeo: u16,
}

/// `struct sctp_paddrinfo`, which the header declares `__attribute__((packed, aligned(4)))`: the
/// `sockaddr_storage` sits at offset 4, not 8. The address is kept as bytes so no field needs more
/// than 4-byte alignment.
#[repr(C, packed(4))]
#[derive(Clone, Copy)]
struct SctpPaddrinfo {
    spinfo_assoc_id: i32,
    spinfo_address: [u8; 128],
    spinfo_state: i32,
    spinfo_cwnd: u32,
    spinfo_srtt: u32,
    spinfo_rto: u32,
    spinfo_mtu: u32,
}

/// `struct sctp_status`.
#[repr(C)]
#[derive(Clone, Copy)]
struct SctpStatus {
    sstat_assoc_id: i32,
    sstat_state: i32,
    sstat_rwnd: u32,
    sstat_unackdata: u16,
    sstat_penddata: u16,
    sstat_instrms: u16,
    sstat_outstrms: u16,
    sstat_fragmentation_point: u32,
    sstat_primary: SctpPaddrinfo,
}

/// `struct sctp_sndinfo` (the SCTP_SNDINFO control message).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SctpSndinfo {
    snd_sid: u16,
    snd_flags: u16,
    snd_ppid: u32,
    snd_context: u32,
    snd_assoc_id: i32,
}

/// `struct sctp_rcvinfo` (the SCTP_RCVINFO control message).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SctpRcvinfo {
    rcv_sid: u16,
    rcv_ssn: u16,
    rcv_flags: u16,
    rcv_ppid: u32,
    rcv_tsn: u32,
    rcv_cumtsn: u32,
    rcv_context: u32,
    rcv_assoc_id: i32,
}

// Sizes and offsets as gcc lays them out from /usr/include/linux/sctp.h on x86_64.
const _: () = {
    use std::mem::{align_of, offset_of};
    assert!(size_of::<SctpInitmsg>() == 8);
    assert!(size_of::<SctpPaddrinfo>() == 152 && align_of::<SctpPaddrinfo>() == 4);
    assert!(offset_of!(SctpPaddrinfo, spinfo_address) == 4);
    assert!(offset_of!(SctpPaddrinfo, spinfo_state) == 132);
    assert!(size_of::<SctpStatus>() == 176 && align_of::<SctpStatus>() == 4);
    assert!(offset_of!(SctpStatus, sstat_instrms) == 16);
    assert!(offset_of!(SctpStatus, sstat_primary) == 24);
    assert!(size_of::<SctpSndinfo>() == 16);
    assert!(size_of::<SctpRcvinfo>() == 28 && offset_of!(SctpRcvinfo, rcv_ppid) == 8);
    assert!(offset_of!(SctpRcvinfo, rcv_assoc_id) == 24);
};

/// The error every kind returns when `socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)` fails with
/// EPROTONOSUPPORT.
pub const NO_SCTP: &str = "this kernel has no SCTP (socket: EPROTONOSUPPORT): load the sctp module \
                           (modprobe sctp) or run it in a guest with `fraglab vm`";

/// Whether this kernel can open an SCTP socket (tries `socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)`).
pub fn kernel_has_sctp() -> bool {
    check_kernel().is_ok()
}

/// Whether the kernel can open an SCTP socket; without SCTP the error is
/// [`crate::unsupported::Unsupported`], naming EPROTONOSUPPORT and what to do ([`NO_SCTP`]).
pub fn check_kernel() -> Result<()> {
    match Sock::new(libc::AF_INET, Style::OneToOne) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => {
            Err(crate::unsupported::Unsupported(NO_SCTP.to_string()).into())
        }
        Err(e) => Err(anyhow!("socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): {e}")),
    }
}

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

/// SCTP socket style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Style {
    /// SOCK_STREAM: connect() sets the association up, like TCP (sctp_test -T, netperf SCTP_STREAM).
    OneToOne,
    /// SOCK_SEQPACKET: the first sendmsg to an address sets the association up, on both ends.
    OneToMany,
}

impl Style {
    fn sock_type(self) -> c_int {
        match self {
            Style::OneToOne => libc::SOCK_STREAM,
            Style::OneToMany => libc::SOCK_SEQPACKET,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Style::OneToOne => "one-to-one",
            Style::OneToMany => "one-to-many",
        }
    }
}

/// `fraglab workload sctp-connect`.
#[derive(Debug, Clone, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectArgs {
    /// Associations to set up, each closed once it is up (and its messages sent).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub associations: u64,
    /// Associations set up at a time (1: one after another).
    #[arg(long, value_name = "C", default_value_t = 1)]
    pub concurrency: u64,
    /// Streams asked for in SCTP_INITMSG, out and in, on the client and the in-process server (1-65535).
    #[arg(long, value_name = "S", default_value_t = 65535)]
    pub streams: u64,
    /// one-to-one (SOCK_STREAM, connect) or one-to-many (SOCK_SEQPACKET, set up by the first sendmsg).
    #[arg(long, value_enum, default_value_t = Style::OneToOne)]
    pub style: Style,
    /// After connecting, send one 1-byte message on every negotiated outbound stream.
    #[arg(long)]
    pub message_per_stream: bool,
    /// Run over IPv6: the in-process server on [::1] instead of 127.0.0.1 (with --peer, its IPv6
    /// address).
    #[arg(long)]
    pub ipv6: bool,
    /// Connect to this server instead of an in-process one on 127.0.0.1.
    #[arg(long, value_name = "HOST:PORT")]
    pub peer: Option<String>,
    /// Give up on an association that is not up after this long (counted as ETIMEDOUT).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub timeout: String,
}

impl Default for ConnectArgs {
    fn default() -> Self {
        ConnectArgs {
            associations: 100,
            concurrency: 1,
            streams: 65535,
            style: Style::OneToOne,
            message_per_stream: false,
            ipv6: false,
            peer: None,
            timeout: "10s".into(),
        }
    }
}

/// `fraglab workload sctp-stream`.
#[derive(Debug, Clone, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamArgs {
    /// Sending threads, each with its own association.
    #[arg(long, value_name = "T", default_value_t = 1)]
    pub threads: u64,
    /// How long to send.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub duration: String,
    /// Message size (netperf -m), 1 B to 16 MiB.
    #[arg(long, value_name = "SIZE", default_value = "12000")]
    #[serde(deserialize_with = "size_text")]
    pub msg: String,
    /// SO_SNDBUF for the client and server sockets (netperf -s/-S); default: the kernel's.
    #[arg(long, value_name = "SIZE")]
    #[serde(deserialize_with = "opt_size_text")]
    pub sndbuf: Option<String>,
    /// SO_RCVBUF for the client and server sockets.
    #[arg(long, value_name = "SIZE")]
    #[serde(deserialize_with = "opt_size_text")]
    pub rcvbuf: Option<String>,
    /// one-to-one (SOCK_STREAM) or one-to-many (SOCK_SEQPACKET, set up by the first sendmsg).
    #[arg(long, value_enum, default_value_t = Style::OneToOne)]
    pub style: Style,
    /// Run over IPv6: the in-process server on [::1] instead of 127.0.0.1 (with --peer, its IPv6
    /// address).
    #[arg(long)]
    pub ipv6: bool,
    /// Send to this server instead of an in-process one on 127.0.0.1.
    #[arg(long, value_name = "HOST:PORT")]
    pub peer: Option<String>,
}

impl Default for StreamArgs {
    fn default() -> Self {
        StreamArgs {
            threads: 1,
            duration: "10s".into(),
            msg: "12000".into(),
            sndbuf: None,
            rcvbuf: None,
            style: Style::OneToOne,
            ipv6: false,
            peer: None,
        }
    }
}

/// `fraglab workload sctp-rr`.
#[derive(Debug, Clone, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RrArgs {
    /// Clients, each with its own association, one transaction in flight each.
    #[arg(long, value_name = "C", default_value_t = 1)]
    pub clients: u64,
    /// How long to run.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub duration: String,
    /// Request size, 1 B to 16 MiB.
    #[arg(long, value_name = "SIZE", default_value = "1")]
    #[serde(deserialize_with = "size_text")]
    pub req: String,
    /// Response size, 1 B to 16 MiB.
    #[arg(long, value_name = "SIZE", default_value = "1")]
    #[serde(deserialize_with = "size_text")]
    pub resp: String,
    /// one-to-one (SOCK_STREAM) or one-to-many (SOCK_SEQPACKET, set up by the first sendmsg).
    #[arg(long, value_enum, default_value_t = Style::OneToOne)]
    pub style: Style,
    /// Run over IPv6: the in-process server on [::1] instead of 127.0.0.1 (with --peer, its IPv6
    /// address).
    #[arg(long)]
    pub ipv6: bool,
    /// Send to this server instead of an in-process one (it must answer as `fraglab serve` does).
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
            style: Style::OneToOne,
            ipv6: false,
            peer: None,
        }
    }
}

/// Largest message fraglab sends or answers with.
const MAX_MSG: u64 = 16 << 20;

/// The largest SO_SNDBUF / SO_RCVBUF asked for.
const MAX_SOCKBUF: u64 = 1 << 30;
/// SCTP's kinds word option errors `--flag value: why`.
const SCTP: Wording = Wording::Sctp;

impl Common {
    fn resolve(
        style: Style,
        ipv6: bool,
        peer: Option<&str>,
        sndbuf: Option<&str>,
        rcvbuf: Option<&str>,
    ) -> Result<Common> {
        Ok(Common {
            style,
            ipv6,
            peer: opts::peer(SCTP, peer, ipv6)?,
            bufs: SockBufs::resolve(SCTP, MAX_SOCKBUF, sndbuf, rcvbuf)?,
        })
    }
}

/// Options shared by the three kinds once validated.
struct Common {
    style: Style,
    /// The in-process server on [::1].
    ipv6: bool,
    peer: Option<SocketAddr>,
    bufs: SockBufs,
}

pub(crate) struct ConnectPlan {
    n: u64,
    workers: usize,
    streams: u16,
    message_per_stream: bool,
    timeout: Duration,
    common: Common,
}

/// `--streams`: SCTP stream numbers are 16-bit, and an association has at least one.
fn streams(n: u64) -> Result<u16> {
    match n {
        1..=65535 => Ok(n as u16),
        _ => bail!("--streams {n}: must be 1 to 65535 (SCTP stream numbers are 16-bit)"),
    }
}

impl ConnectPlan {
    pub(crate) fn resolve(a: &ConnectArgs) -> Result<ConnectPlan> {
        opts::count(SCTP, "--associations", a.associations, u64::MAX)?;
        let workers = opts::count(SCTP, "--concurrency", a.concurrency, MAX_WORKERS)?;
        let streams = streams(a.streams)?;
        Ok(ConnectPlan {
            n: a.associations,
            workers: workers.min(a.associations.min(MAX_WORKERS) as usize),
            streams,
            message_per_stream: a.message_per_stream,
            timeout: opts::duration(SCTP, "--timeout", &a.timeout)?,
            common: Common::resolve(a.style, a.ipv6, a.peer.as_deref(), None, None)?,
        })
    }
}

pub(crate) struct StreamPlan {
    threads: usize,
    duration: Duration,
    msg: usize,
    common: Common,
}

impl StreamPlan {
    pub(crate) fn resolve(a: &StreamArgs) -> Result<StreamPlan> {
        Ok(StreamPlan {
            threads: opts::count(SCTP, "--threads", a.threads, MAX_WORKERS)?,
            duration: opts::duration(SCTP, "--duration", &a.duration)?,
            msg: opts::msg_size(SCTP, "--msg", &a.msg, MAX_MSG)?,
            common: Common::resolve(
                a.style,
                a.ipv6,
                a.peer.as_deref(),
                a.sndbuf.as_deref(),
                a.rcvbuf.as_deref(),
            )?,
        })
    }
}

impl StreamPlan {
    /// The room its associations' buffers can take.
    pub(crate) fn room(&self, limits: &Limits) -> Option<Room> {
        let c = &self.common;
        let conns = Conns { n: self.threads, both_ends: c.peer.is_none(), bufs: c.bufs, in_flight: None };
        Some(room::sockets(limits.sctp.as_ref()?, limits, &conns))
    }
}

pub(crate) struct RrPlan {
    clients: usize,
    duration: Duration,
    req: usize,
    resp: usize,
    common: Common,
}

impl RrPlan {
    /// The room its transactions can take: one request and one response in flight a client.
    pub(crate) fn room(&self, limits: &Limits) -> Option<Room> {
        let (c, in_flight) = (&self.common, Some((self.req + self.resp) as u64));
        let conns = Conns { n: self.clients, both_ends: c.peer.is_none(), bufs: c.bufs, in_flight };
        Some(room::sockets(limits.sctp.as_ref()?, limits, &conns))
    }

    pub(crate) fn resolve(a: &RrArgs) -> Result<RrPlan> {
        Ok(RrPlan {
            clients: opts::count(SCTP, "--clients", a.clients, MAX_WORKERS)?,
            duration: opts::duration(SCTP, "--duration", &a.duration)?,
            req: opts::msg_size(SCTP, "--req", &a.req, MAX_MSG)?,
            resp: opts::msg_size(SCTP, "--resp", &a.resp, MAX_MSG)?,
            common: Common::resolve(a.style, a.ipv6, a.peer.as_deref(), None, None)?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Sockets
// ---------------------------------------------------------------------------------------------

fn errno(code: c_int) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn cvt(ret: c_int) -> io::Result<c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINPROGRESS))
}

fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data and large and aligned enough for either family.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: see above.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: see above.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::new(sin6.sin6_addr.s6_addr.into(), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// What one recvmsg returned.
struct Received {
    len: usize,
    flags: c_int,
    info: Option<SctpRcvinfo>,
}

impl Received {
    fn is_notification(&self) -> bool {
        self.flags & MSG_NOTIFICATION != 0
    }

    fn is_eor(&self) -> bool {
        self.flags & libc::MSG_EOR != 0
    }
}

/// An SCTP_ASSOC_CHANGE notification.
struct AssocChange {
    state: u16,
    outbound: u16,
    inbound: u16,
    assoc_id: i32,
}

fn assoc_change(buf: &[u8]) -> Option<AssocChange> {
    let u16_at = |o: usize| u16::from_ne_bytes([buf[o], buf[o + 1]]);
    if buf.len() < 20 || u16_at(0) != SCTP_ASSOC_CHANGE {
        return None;
    }
    Some(AssocChange {
        state: u16_at(8),
        outbound: u16_at(12),
        inbound: u16_at(14),
        assoc_id: i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]),
    })
}

/// Control-message buffer: 8-byte aligned, room for one SCTP_SNDINFO or SCTP_RCVINFO and more.
#[repr(C, align(8))]
struct Cmsg([u8; 128]);

struct Sock(OwnedFd);

impl Sock {
    fn new(family: c_int, style: Style) -> io::Result<Sock> {
        // SAFETY: plain syscall.
        let fd = cvt(unsafe { libc::socket(family, style.sock_type() | libc::SOCK_CLOEXEC, IPPROTO_SCTP) })?;
        // SAFETY: the fd was just created and is owned by nothing else.
        Ok(Sock(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn for_addr(addr: &SocketAddr, style: Style) -> io::Result<Sock> {
        Sock::new(if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 }, style)
    }

    fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn set<T>(&self, level: c_int, name: c_int, value: &T) -> io::Result<()> {
        let len = size_of::<T>() as libc::socklen_t;
        // SAFETY: value points to len readable bytes.
        cvt(unsafe { libc::setsockopt(self.fd(), level, name, value as *const T as *const _, len) }).map(drop)
    }

    fn set_int(&self, level: c_int, name: c_int, value: c_int) -> io::Result<()> {
        self.set(level, name, &value)
    }

    fn set_timeout(&self, name: c_int, d: Duration) -> io::Result<()> {
        let tv = libc::timeval { tv_sec: d.as_secs() as libc::time_t, tv_usec: d.subsec_micros() as _ };
        self.set(libc::SOL_SOCKET, name, &tv)
    }

    fn set_initmsg(&self, streams: u16) -> io::Result<()> {
        let init =
            SctpInitmsg { sinit_num_ostreams: streams, sinit_max_instreams: streams, ..Default::default() };
        self.set(SOL_SCTP, SCTP_INITMSG, &init)
    }

    /// Turn on SCTP_ASSOC_CHANGE notifications (the second byte of struct sctp_event_subscribe; the
    /// kernel accepts a prefix of the struct).
    fn subscribe_assoc_changes(&self) -> io::Result<()> {
        self.set(SOL_SCTP, SCTP_EVENTS, &[0u8, 1u8])
    }

    fn status(&self, assoc_id: i32) -> io::Result<SctpStatus> {
        // SAFETY: plain data; the kernel reads sstat_assoc_id and fills the rest.
        let mut st: SctpStatus = unsafe { zeroed() };
        st.sstat_assoc_id = assoc_id;
        let mut len = size_of::<SctpStatus>() as libc::socklen_t;
        // SAFETY: st has len writable bytes.
        cvt(unsafe {
            libc::getsockopt(self.fd(), SOL_SCTP, SCTP_STATUS, &mut st as *mut SctpStatus as *mut _, &mut len)
        })?;
        Ok(st)
    }

    fn bind(&self, addr: &SocketAddr) -> io::Result<()> {
        let (ss, len) = to_sockaddr(addr);
        // SAFETY: ss holds len bytes of a valid sockaddr.
        cvt(unsafe { libc::bind(self.fd(), &ss as *const _ as *const libc::sockaddr, len) }).map(drop)
    }

    fn listen(&self, backlog: c_int) -> io::Result<()> {
        // SAFETY: plain syscall.
        cvt(unsafe { libc::listen(self.fd(), backlog) }).map(drop)
    }

    fn connect(&self, addr: &SocketAddr) -> io::Result<()> {
        let (ss, len) = to_sockaddr(addr);
        loop {
            // SAFETY: ss holds len bytes of a valid sockaddr.
            match cvt(unsafe { libc::connect(self.fd(), &ss as *const _ as *const libc::sockaddr, len) }) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r.map(drop),
            }
        }
    }

    fn accept(&self) -> io::Result<Sock> {
        // SAFETY: plain syscall; the peer address is not wanted.
        let fd = cvt(unsafe {
            libc::accept4(self.fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
        })?;
        // SAFETY: a new fd owned by nothing else.
        Ok(Sock(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        // SAFETY: plain data.
        let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: ss has len writable bytes.
        cvt(unsafe { libc::getsockname(self.fd(), &mut ss as *mut _ as *mut libc::sockaddr, &mut len) })?;
        from_sockaddr(&ss).ok_or_else(|| errno(libc::EAFNOSUPPORT))
    }

    /// Wait up to `ms` for something to read (or accept).
    fn readable(&self, ms: c_int) -> io::Result<bool> {
        let mut p = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        match cvt(unsafe { libc::poll(&mut p, 1, ms) }) {
            Ok(n) => Ok(n > 0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One message on stream `sid` with payload protocol id `ppid`, to association `assoc_id`
    /// (one-to-many) or address `to` (one-to-many; sets the association up if there is none).
    fn send(
        &self,
        data: &[u8],
        sid: u16,
        ppid: u32,
        assoc_id: i32,
        to: Option<&SocketAddr>,
    ) -> io::Result<usize> {
        let info = SctpSndinfo {
            snd_sid: sid,
            snd_ppid: ppid.to_be(),
            snd_assoc_id: assoc_id,
            ..Default::default()
        };
        let mut cbuf = Cmsg([0; 128]);
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
        // SAFETY: msghdr is plain data.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        let dest = to.map(to_sockaddr);
        if let Some((ss, len)) = &dest {
            msg.msg_name = ss as *const _ as *mut _;
            msg.msg_namelen = *len;
        }
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        // SAFETY: CMSG_* only compute sizes and pointers inside cbuf, which is large enough for one
        // SCTP_SNDINFO; the data is written unaligned.
        unsafe {
            msg.msg_controllen = libc::CMSG_SPACE(size_of::<SctpSndinfo>() as u32) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = IPPROTO_SCTP;
            (*c).cmsg_type = SCTP_SNDINFO;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<SctpSndinfo>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut SctpSndinfo, info);
        }
        loop {
            // SAFETY: msg and everything it points to live across the call.
            let n = unsafe { libc::sendmsg(self.fd(), &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// One recvmsg: data (with its SCTP_RCVINFO when turned on) or a notification.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Received> {
        let mut cbuf = Cmsg([0; 128]);
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: msghdr is plain data.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.0.len() as _;
        let n = loop {
            // SAFETY: msg points to live buffers of the stated sizes.
            let n = unsafe { libc::recvmsg(self.fd(), &mut msg, 0) };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut info = None;
        // SAFETY: the kernel filled msg_control/msg_controllen; CMSG_* walk inside it.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == IPPROTO_SCTP
                    && (*c).cmsg_type == SCTP_RCVINFO
                    && (*c).cmsg_len as usize >= libc::CMSG_LEN(size_of::<SctpRcvinfo>() as u32) as usize
                {
                    info = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const SctpRcvinfo));
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Received { len: n, flags: msg.msg_flags, info })
    }
}

impl AsFd for Sock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

// ---------------------------------------------------------------------------------------------
// The server side
// ---------------------------------------------------------------------------------------------

/// How the server side is set up.
#[derive(Clone, Debug)]
pub struct ServerOpts {
    pub style: Style,
    /// SCTP_INITMSG out and in streams (default: the kernel's).
    pub streams: Option<u16>,
    /// SO_SNDBUF / SO_RCVBUF of the listening socket and every association's.
    pub(crate) bufs: SockBufs,
    /// SCTP_NODELAY on every association (request/response).
    pub nodelay: bool,
    pub backlog: c_int,
}

impl Default for ServerOpts {
    fn default() -> Self {
        ServerOpts {
            style: Style::OneToOne,
            streams: None,
            bufs: SockBufs::default(),
            nodelay: false,
            backlog: 1024,
        }
    }
}

/// `fraglab serve --proto sctp`: the server side's own options. Against a `--peer` a client's
/// `--sndbuf`/`--rcvbuf`/`--streams` set only its own end; these set the server's.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[group(id = "SctpServeArgs")]
#[serde(deny_unknown_fields, default)]
pub struct ServeArgs {
    /// SCTP_INITMSG out and in streams on the listening socket, 1-65535 [default: the kernel's, 10 out
    /// and 65535 in]. 65535: sctp-connect --streams 65535 gets 65535 each way, as with its in-process
    /// server.
    #[arg(long, value_name = "S")]
    pub streams: Option<u64>,
    /// one-to-one (SOCK_STREAM, a thread per association) or one-to-many (SOCK_SEQPACKET, one socket and
    /// thread for all) [default: one-to-one]. Clients of either style can use either.
    #[arg(long, value_enum, value_name = "STYLE")]
    pub style: Option<Style>,
    /// SO_SNDBUF of the server's sockets [default: the kernel's].
    #[arg(long, value_name = "SIZE")]
    #[serde(deserialize_with = "opt_size_text")]
    pub sndbuf: Option<String>,
    /// SO_RCVBUF of the server's sockets [default: the kernel's].
    #[arg(long, value_name = "SIZE")]
    #[serde(deserialize_with = "opt_size_text")]
    pub rcvbuf: Option<String>,
}

impl ServeArgs {
    /// The first of these flags that was given, for refusing them with another protocol.
    pub fn first_given(&self) -> Option<&'static str> {
        [
            ("--streams", self.streams.is_some()),
            ("--style", self.style.is_some()),
            ("--sndbuf", self.sndbuf.is_some()),
            ("--rcvbuf", self.rcvbuf.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }

    /// Check the flags (as the sctp kinds word it: `--streams 70000: must be 1 to 65535 ...`) and
    /// turn them into the server's options, without opening a socket. SCTP_NODELAY is on: a reply
    /// goes out at once, as the in-process server answers sctp-rr.
    pub fn resolve(&self) -> Result<ServerOpts> {
        let streams = self.streams.map(streams).transpose()?;
        let c = Common::resolve(
            self.style.unwrap_or(Style::OneToOne),
            false,
            None,
            self.sndbuf.as_deref(),
            self.rcvbuf.as_deref(),
        )?;
        Ok(ServerOpts { style: c.style, streams, bufs: c.bufs, nodelay: true, ..ServerOpts::default() })
    }
}

impl ServerOpts {
    /// How `fraglab serve` describes the server: `one-to-one, 65535 streams`.
    pub fn describe(&self) -> String {
        let streams = match self.streams {
            Some(n) => format!("{n} streams each way"),
            None => "the kernel's stream counts".into(),
        };
        let mut s = format!("{}, {streams}", self.style.name());
        for (name, b) in [("SO_SNDBUF", self.bufs.snd), ("SO_RCVBUF", self.bufs.rcv)] {
            if let Some(b) = b {
                s += &format!(", {name} {b}");
            }
        }
        s
    }
}

/// What the server side saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerReport {
    pub associations: u64,
    pub messages: u64,
    pub bytes: u64,
    pub replies: u64,
    /// Associations still open when the server gave up waiting for them to close.
    pub unfinished: u64,
    pub errors: Vec<ErrnoCount>,
}

struct Shared {
    stop: AtomicBool,
    /// Set when the server stops waiting for open associations to close.
    abandon: AtomicBool,
    associations: AtomicU64,
    messages: AtomicU64,
    bytes: AtomicU64,
    replies: AtomicU64,
    unfinished: AtomicU64,
    errors: ServerErrors,
}

impl Shared {
    fn record(&self, e: &io::Error) {
        self.errors.record(e);
    }
}

/// How long a stopping server waits for its associations to close.
const SERVER_GRACE: Duration = Duration::from_secs(10);
/// Receive timeout with which server loops look at the stop flags.
const SERVER_TICK: Duration = Duration::from_millis(100);

/// The SCTP server side: consumes every message and answers a message whose PPID is N > 0 with N
/// bytes on the same stream. In-process for the workloads; `fraglab serve` can run it for a client
/// on another host.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Listen on `bind` (port 0: an ephemeral port) and serve on a thread until [`Server::stop`].
    pub fn start(bind: SocketAddr, opts: ServerOpts) -> io::Result<Server> {
        let sock = Sock::for_addr(&bind, opts.style)?;
        sock.set_int(libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        if let Some(s) = opts.streams {
            sock.set_initmsg(s)?;
        }
        opts.bufs.apply(&sock)?;
        sock.set_int(SOL_SCTP, SCTP_RECVRCVINFO, 1)?;
        if opts.nodelay {
            sock.set_int(SOL_SCTP, SCTP_NODELAY, 1)?;
        }
        if opts.style == Style::OneToMany {
            // Before listen(): the server tracks open associations by their SCTP_COMM_UP, and waits
            // for each to close before it stops, so no association may come up unseen.
            sock.subscribe_assoc_changes()?;
            sock.set_timeout(libc::SO_RCVTIMEO, SERVER_TICK)?;
        }
        sock.bind(&bind)?;
        sock.listen(opts.backlog)?;
        let addr = sock.local_addr()?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            abandon: AtomicBool::new(false),
            associations: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            replies: AtomicU64::new(0),
            unfinished: AtomicU64::new(0),
            errors: ServerErrors::new(),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new().name("sctp-server".into()).stack_size(WORKER_STACK).spawn(
            move || match opts.style {
                Style::OneToOne => serve_one_to_one(sock, opts, sh),
                Style::OneToMany => serve_one_to_many(sock, sh),
            },
        )?;
        Ok(Server { addr, shared, thread: Some(thread) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting, wait (up to 10 s) for open associations to close, and report.
    pub fn stop(mut self) -> ServerReport {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let s = &self.shared;
        ServerReport {
            associations: s.associations.load(Ordering::SeqCst),
            messages: s.messages.load(Ordering::SeqCst),
            bytes: s.bytes.load(Ordering::SeqCst),
            replies: s.replies.load(Ordering::SeqCst),
            unfinished: s.unfinished.load(Ordering::SeqCst),
            errors: s.errors.take(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.abandon.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Account for one received piece; when it ends a message with a PPID, answer it.
fn serve_data(sock: &Sock, r: &Received, reply: &mut Vec<u8>, sh: &Shared) {
    sh.bytes.fetch_add(r.len as u64, Ordering::Relaxed);
    if !r.is_eor() {
        return;
    }
    sh.messages.fetch_add(1, Ordering::Relaxed);
    let Some(info) = r.info else { return };
    let want = u32::from_be(info.rcv_ppid) as usize;
    if want == 0 || want as u64 > MAX_MSG {
        return;
    }
    if reply.len() < want {
        reply.resize(want, 0x5a);
    }
    match sock.send(&reply[..want], info.rcv_sid, 0, info.rcv_assoc_id, None) {
        Ok(_) => {
            sh.replies.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => sh.record(&e),
    }
}

fn serve_one_to_one(listener: Sock, opts: ServerOpts, sh: Arc<Shared>) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    let mut stopping_since: Option<Instant> = None;
    loop {
        let stopping = sh.stop.load(Ordering::SeqCst);
        if stopping && stopping_since.get_or_insert_with(Instant::now).elapsed() > SERVER_GRACE {
            // A peer that keeps connecting keeps the listener readable: past the grace period stop
            // accepting regardless, as serve_one_to_many stops reading.
            break;
        }
        match listener.readable(SERVER_TICK.as_millis() as c_int) {
            Ok(true) => {}
            // Nothing left to accept: stop now if asked to before this wait.
            Ok(false) if stopping => break,
            Ok(false) => continue,
            Err(e) => {
                sh.record(&e);
                std::thread::sleep(SERVER_TICK);
                continue;
            }
        }
        let conn = match listener.accept() {
            Ok(c) => c,
            Err(e) if would_block(&e) => continue,
            // Out of descriptors or memory, with the connection still queued: the listener stays
            // readable, so without a pause this would spin, as the TCP server's acceptor does not.
            Err(e) => {
                sh.record(&e);
                std::thread::sleep(SERVER_TICK);
                continue;
            }
        };
        sh.associations.fetch_add(1, Ordering::Relaxed);
        let setup = conn
            .set_int(SOL_SCTP, SCTP_RECVRCVINFO, 1)
            .and_then(|_| conn.set_timeout(libc::SO_RCVTIMEO, SERVER_TICK))
            .and_then(|_| opts.bufs.apply(&conn))
            .and_then(|_| if opts.nodelay { conn.set_int(SOL_SCTP, SCTP_NODELAY, 1) } else { Ok(()) });
        if let Err(e) = setup {
            sh.record(&e);
        }
        let s = sh.clone();
        // One thread an association: at 4096 associations the default 2 MiB stacks would reserve
        // 8 GiB of address space; the buffers are on the heap.
        let conn_thread = std::thread::Builder::new().name("sctp-conn".into()).stack_size(WORKER_STACK);
        match conn_thread.spawn(move || serve_conn(conn, s)) {
            Ok(h) => conns.push(h),
            Err(e) => sh.record(&e),
        }
        conns.retain(|h| !h.is_finished());
    }
    // One grace period for the whole stop, accepting included.
    let deadline = stopping_since.unwrap_or_else(Instant::now) + SERVER_GRACE;
    while conns.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    sh.abandon.store(true, Ordering::SeqCst);
    for h in conns {
        let _ = h.join();
    }
}

fn serve_conn(sock: Sock, sh: Arc<Shared>) {
    let mut buf = vec![0u8; RECV_BUF];
    let mut reply = Vec::new();
    loop {
        // Checked on every pass, not only when the socket is quiet: a peer that never pauses would
        // otherwise hold the server past its grace period.
        if sh.abandon.load(Ordering::SeqCst) {
            sh.unfinished.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match sock.recv(&mut buf) {
            Ok(r) if r.is_notification() => {}
            Ok(r) if r.len == 0 => return, // the client shut the association down
            Ok(r) => serve_data(&sock, &r, &mut reply, &sh),
            Err(e) if would_block(&e) => {}
            Err(e) => {
                if e.raw_os_error() != Some(libc::ENOTCONN) {
                    sh.record(&e);
                }
                return;
            }
        }
    }
}

fn serve_one_to_many(sock: Sock, sh: Arc<Shared>) {
    let mut buf = vec![0u8; RECV_BUF];
    let mut reply = Vec::new();
    let mut open: HashSet<i32> = HashSet::new();
    let mut stopping_since: Option<Instant> = None;
    loop {
        if stopping_since.is_none() && sh.stop.load(Ordering::SeqCst) {
            stopping_since = Some(Instant::now());
        }
        // Past the grace period leave even while data keeps coming: a peer that never pauses would
        // otherwise hold the server forever.
        if stopping_since.is_some_and(|since| since.elapsed() > SERVER_GRACE)
            || sh.abandon.load(Ordering::SeqCst)
        {
            sh.unfinished.fetch_add(open.len() as u64, Ordering::Relaxed);
            return;
        }
        match sock.recv(&mut buf) {
            Ok(r) if r.is_notification() => {
                if let Some(c) = assoc_change(&buf[..r.len]) {
                    match c.state {
                        SCTP_COMM_UP => {
                            sh.associations.fetch_add(1, Ordering::Relaxed);
                            open.insert(c.assoc_id);
                        }
                        SCTP_COMM_LOST | SCTP_SHUTDOWN_COMP | SCTP_CANT_STR_ASSOC => {
                            open.remove(&c.assoc_id);
                        }
                        _ => {}
                    }
                }
            }
            Ok(r) => serve_data(&sock, &r, &mut reply, &sh),
            Err(e) if would_block(&e) => {
                // Quiet for a tick: when stopping, leave once every association has closed.
                if stopping_since.is_some() && open.is_empty() {
                    return;
                }
            }
            Err(e) => {
                sh.record(&e);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// The in-process server on 127.0.0.1, unless `--peer` names one.
fn server_for(common: &Common, streams: Option<u16>, nodelay: bool) -> Result<(SocketAddr, Option<Server>)> {
    let opts = ServerOpts { style: common.style, streams, bufs: common.bufs, nodelay, backlog: 1024 };
    net::server_or_peer(common.peer, common.ipv6, "SCTP", |local| {
        Server::start(local, opts).map(|s| (s.addr, s))
    })
}

fn server_details(
    details: &mut BTreeMap<String, Value>,
    common: &Common,
    addr: SocketAddr,
    report: Option<ServerReport>,
) {
    match report {
        None => {
            details.insert("peer".into(), json!(addr.to_string()));
        }
        Some(r) => {
            details.insert("server".into(), json!(format!("in-process, {}, {addr}", common.style.name())));
            details.insert("server_associations".into(), json!(r.associations));
            details.insert("server_messages".into(), json!(r.messages));
            details.insert("server_bytes".into(), json!(r.bytes));
            if r.replies > 0 {
                details.insert("server_replies".into(), json!(r.replies));
            }
            if r.unfinished > 0 {
                details.insert("server_unfinished".into(), json!(r.unfinished));
            }
            if !r.errors.is_empty() {
                details.insert("server_errors".into(), json!(r.errors));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

/// A client association, ready to send.
struct Client {
    sock: Sock,
    /// Where one-to-many sends go (the association is found by address).
    to: Option<SocketAddr>,
}

impl Client {
    fn send(&self, data: &[u8], sid: u16, ppid: u32) -> io::Result<usize> {
        self.sock.send(data, sid, ppid, 0, self.to.as_ref())
    }

    /// Send a request and wait for the whole response.
    fn transact(&self, req: &[u8], resp: usize, buf: &mut [u8]) -> io::Result<()> {
        self.send(req, 0, resp as u32)?;
        let mut got = 0;
        loop {
            let r =
                self.sock.recv(buf).map_err(|e| if would_block(&e) { errno(libc::ETIMEDOUT) } else { e })?;
            if r.is_notification() {
                continue;
            }
            if r.len == 0 {
                return Err(errno(libc::ECONNRESET));
            }
            got += r.len;
            if r.is_eor() {
                return if got == resp { Ok(()) } else { Err(errno(libc::EBADMSG)) };
            }
        }
    }
}

/// Open a client association for sctp-stream / sctp-rr. One-to-one connects; one-to-many sends its
/// first message later (the caller does that before the clock starts).
fn open_client(common: &Common, addr: SocketAddr, nodelay: bool) -> io::Result<Client> {
    let sock = Sock::for_addr(&addr, common.style)?;
    common.bufs.apply(&sock)?;
    if nodelay {
        sock.set_int(SOL_SCTP, SCTP_NODELAY, 1)?;
    }
    sock.set_timeout(libc::SO_SNDTIMEO, CLIENT_TIMEOUT)?;
    sock.set_timeout(libc::SO_RCVTIMEO, CLIENT_TIMEOUT)?;
    match common.style {
        Style::OneToOne => {
            sock.connect(&addr).map_err(|e| if would_block(&e) { errno(libc::ETIMEDOUT) } else { e })?;
            Ok(Client { sock, to: None })
        }
        Style::OneToMany => Ok(Client { sock, to: Some(addr) }),
    }
}

/// How long a stream/rr client waits for an association, a send or a response.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The measured part of a stream/rr worker: wait at the gate, then repeat `op` on the association
/// until the run ends. `op` returns the payload bytes of one operation, or `None` when it only timed
/// out so the loop can look at the stop flag. A failure is counted; one [`net::transient`] is
/// retried, anything else ends the worker. A client that could not be set up counts one failure.
fn timed_loop(
    ctl: &Ctl,
    client: io::Result<Client>,
    mut op: impl FnMut(&Client) -> io::Result<Option<u64>>,
) -> (Tally, ()) {
    let mut t = ctl.tally();
    let start = ctl.start();
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            t.fail(&e);
            return (t, ());
        }
    };
    while !ctl.stopped() {
        let began = Instant::now();
        match op(&client) {
            Ok(Some(n)) => t.done(began, n),
            Ok(None) => {}
            Err(e) => {
                t.fail(&e);
                if !ctl.retry_after(&e) {
                    break;
                }
            }
        }
    }
    t.elapsed = start.elapsed();
    (t, ())
}

// ---------------------------------------------------------------------------------------------
// sctp-connect
// ---------------------------------------------------------------------------------------------

/// One association that came up.
struct Up {
    latency: Duration,
    instrms: u16,
    outstrms: u16,
    status: Option<SctpStatus>,
    messages_ok: u64,
    messages_failed: u64,
    /// The stop flag ended its per-stream messages early.
    stopped: bool,
}

/// A connect worker's own counts, beside its tally (`ok` = associations up, latency = setting one
/// up, `bytes` = its 1-byte per-stream messages).
#[derive(Default)]
struct ConnectOwn {
    messages_failed: u64,
    fewer_streams: u64,
    /// The lowest-numbered association that came up, with its SCTP_STATUS.
    first: Option<(u64, SctpStatus)>,
    /// The stop flag left associations untried or messages unsent.
    stopped: bool,
}

/// Set one association up, read its status, send its per-stream messages (until the run stops);
/// closed on return.
fn associate(p: &ConnectPlan, addr: &SocketAddr, errors: &mut Errors, ctl: &Ctl) -> io::Result<Up> {
    let timed_out = |e: io::Error| if would_block(&e) { errno(libc::ETIMEDOUT) } else { e };
    let style = p.common.style;
    let sock = Sock::for_addr(addr, style)?;
    sock.set_initmsg(p.streams)?;
    if p.message_per_stream {
        // Without it Nagle holds the 1-byte messages back until the peer's delayed SACK (200 ms):
        // about 2 ms a message, minutes for 65535 streams.
        sock.set_int(SOL_SCTP, SCTP_NODELAY, 1)?;
    }
    sock.set_timeout(libc::SO_SNDTIMEO, p.timeout)?;
    sock.set_timeout(libc::SO_RCVTIMEO, p.timeout)?;
    let (latency, assoc_id, mut outbound, mut inbound) = match style {
        Style::OneToOne => {
            let t = Instant::now();
            sock.connect(addr).map_err(timed_out)?;
            (t.elapsed(), 0, 0, 0)
        }
        Style::OneToMany => {
            sock.subscribe_assoc_changes()?;
            let t = Instant::now();
            sock.send(b"s", 0, 0, 0, Some(addr))?;
            let mut buf = [0u8; 512];
            loop {
                let r = sock.recv(&mut buf).map_err(timed_out)?;
                let Some(c) = r.is_notification().then(|| assoc_change(&buf[..r.len])).flatten() else {
                    continue;
                };
                match c.state {
                    SCTP_COMM_UP | SCTP_RESTART => break (t.elapsed(), c.assoc_id, c.outbound, c.inbound),
                    SCTP_CANT_STR_ASSOC | SCTP_COMM_LOST => return Err(errno(libc::ECONNREFUSED)),
                    _ => {}
                }
            }
        }
    };
    let status = match sock.status(assoc_id) {
        Ok(s) => {
            outbound = s.sstat_outstrms;
            inbound = s.sstat_instrms;
            Some(s)
        }
        Err(e) => {
            errors.record(&e);
            None
        }
    };
    let (mut messages_ok, mut messages_failed, mut stopped) = (0, 0, false);
    if p.message_per_stream {
        for sid in 0..outbound {
            // 65535 messages take seconds, more than a minute under TCG: a stopped run does not wait.
            if ctl.stopped() {
                stopped = true;
                break;
            }
            match sock.send(b"m", sid, 0, assoc_id, None) {
                Ok(_) => messages_ok += 1,
                Err(e) => {
                    messages_failed += 1;
                    // Judged as counted: a send that waited out --timeout is ETIMEDOUT, and another
                    // one would only wait as long again.
                    let e = timed_out(e);
                    errors.record(&e);
                    if !ctl.retry_after(&e) {
                        break;
                    }
                }
            }
        }
    }
    Ok(Up { latency, instrms: inbound, outstrms: outbound, status, messages_ok, messages_failed, stopped })
}

fn connect_worker(p: &ConnectPlan, addr: &SocketAddr, next: &AtomicU64, ctl: &Ctl) -> (Tally, ConnectOwn) {
    let mut t = ctl.tally();
    let mut w = ConnectOwn::default();
    let start = ctl.start();
    loop {
        let i = next.fetch_add(1, Ordering::SeqCst);
        if i >= p.n {
            break;
        }
        if ctl.stopped() {
            w.stopped = true;
            break;
        }
        match associate(p, addr, &mut t.errors, ctl) {
            Ok(up) => {
                t.ok += 1;
                record_latency(&mut t.latency, up.latency);
                // A per-stream message is 1 byte: the bytes are the messages sent.
                t.bytes += up.messages_ok;
                w.stopped |= up.stopped;
                w.messages_failed += up.messages_failed;
                if up.instrms < p.streams || up.outstrms < p.streams {
                    w.fewer_streams += 1;
                }
                if let Some(s) = up.status {
                    if w.first.as_ref().is_none_or(|(j, _)| i < *j) {
                        w.first = Some((i, s));
                    }
                }
            }
            Err(e) => t.fail(&e),
        }
    }
    t.elapsed = start.elapsed();
    (t, w)
}

/// enum sctp_sstat_state.
fn state_name(state: i32) -> String {
    let names = [
        "EMPTY",
        "CLOSED",
        "COOKIE_WAIT",
        "COOKIE_ECHOED",
        "ESTABLISHED",
        "SHUTDOWN_PENDING",
        "SHUTDOWN_SENT",
        "SHUTDOWN_RECEIVED",
        "SHUTDOWN_ACK_SENT",
    ];
    names.get(state as usize).map_or_else(|| format!("state {state}"), |n| n.to_string())
}

fn status_details(details: &mut BTreeMap<String, Value>, index: u64, s: &SctpStatus) {
    let p = s.sstat_primary;
    let (srtt, rto, mtu, cwnd) = (p.spinfo_srtt, p.spinfo_rto, p.spinfo_mtu, p.spinfo_cwnd);
    details.insert("sstat_association".into(), json!(index));
    details.insert("sstat_state".into(), json!(s.sstat_state));
    details.insert("sstat_state_name".into(), json!(state_name(s.sstat_state)));
    details.insert("sstat_instrms".into(), json!(s.sstat_instrms));
    details.insert("sstat_outstrms".into(), json!(s.sstat_outstrms));
    details.insert("sstat_rwnd".into(), json!(s.sstat_rwnd));
    details.insert("sstat_fragmentation_point".into(), json!(s.sstat_fragmentation_point));
    details
        .insert("sstat_primary".into(), json!({ "srtt_ms": srtt, "rto_ms": rto, "mtu": mtu, "cwnd": cwnd }));
}

/// `fraglab workload sctp-connect`: set up N associations with up to 65535 streams each.
pub fn connect(a: &ConnectArgs) -> Result<WorkloadResult> {
    connect_until(a, &AtomicBool::new(false))
}

/// [`connect`], ended early when `stop` (the run's stop flag) is raised: no association is started
/// after it, and one sending its per-stream messages stops sending.
pub fn connect_until(a: &ConnectArgs, stop: &AtomicBool) -> Result<WorkloadResult> {
    let p = ConnectPlan::resolve(a)?;
    check_kernel()?;
    let r = WorkloadResult::new("sctp-connect", serde_json::to_value(a)?, wall_now());
    let (addr, server) = server_for(&p.common, Some(p.streams), false)?;
    let t0 = Instant::now();
    let next = AtomicU64::new(0);
    // No duration: the workers share out the associations and the run ends when all are tried.
    let watch = Some(Watch::new(Proto::Sctp, addr, server.is_some()));
    let d = net::drive("sctp", p.workers, None, t0, stop, watch, |ctl| connect_worker(&p, &addr, &next, ctl));
    let report = server.map(Server::stop);
    let mut m = d.merge(r, Rate::Ops, |_| 0);
    let r = &mut m.result;

    let (mut messages_failed, mut fewer) = (0, 0);
    let mut first: Option<(u64, SctpStatus)> = None;
    let mut stopped = false;
    for w in m.own {
        stopped |= w.stopped;
        messages_failed += w.messages_failed;
        fewer += w.fewer_streams;
        if let Some((i, s)) = w.first {
            if first.as_ref().is_none_or(|(j, _)| i < *j) {
                first = Some((i, s));
            }
        }
    }
    let d = &mut r.details;
    d.insert("style".into(), json!(p.common.style.name()));
    d.insert("streams_requested".into(), json!(p.streams));
    d.insert("concurrency".into(), json!(p.workers));
    if let Some((i, s)) = &first {
        status_details(d, *i, s);
    }
    d.insert("associations_with_fewer_streams".into(), json!(fewer));
    if p.message_per_stream {
        d.insert("messages_sent".into(), json!(r.bytes));
        d.insert("messages_failed".into(), json!(messages_failed));
    }
    server_details(d, &p.common, addr, report);
    r.notes.push(match p.common.style {
        Style::OneToOne => "latency: the connect() call (INIT to COOKIE-ACK)".into(),
        Style::OneToMany => {
            "one-to-many: each association is set up by its first sendmsg (1 byte on stream 0); latency: \
             sendmsg to the SCTP_COMM_UP notification"
                .into()
        }
    });
    if r.errno_count("ETIMEDOUT") > 0 {
        r.notes.push(format!(
            "ETIMEDOUT: an association was not up (or a send did not go out) within --timeout {}",
            a.timeout
        ));
    }
    if r.errno_count("ECONNREFUSED") > 0 && p.common.style == Style::OneToMany {
        r.notes.push("ECONNREFUSED: SCTP_CANT_STR_ASSOC or SCTP_COMM_LOST while setting up".into());
    }
    if stopped {
        let (secs, tried) = (r.duration_s, r.ok + r.failed);
        r.mark_stopped(format_args!("{secs:.1} s, {tried} of {} associations tried", p.n));
    }
    Ok(m.result)
}

// ---------------------------------------------------------------------------------------------
// sctp-stream
// ---------------------------------------------------------------------------------------------

fn stream_worker(p: &StreamPlan, addr: SocketAddr, ctl: &Ctl) -> (Tally, ()) {
    let msg = vec![0x5au8; p.msg];
    // One-to-many: the association comes up with an unmeasured first message, before the clock.
    let client = open_client(&p.common, addr, false)
        .and_then(|c| if c.to.is_some() { c.send(&msg, 0, 0).map(|_| c) } else { Ok(c) })
        .and_then(|c| c.sock.set_timeout(libc::SO_SNDTIMEO, Duration::from_millis(250)).map(|_| c));
    timed_loop(ctl, client, |c| match c.send(&msg, 0, 0) {
        Ok(n) => Ok(Some(n as u64)),
        // The send timeout only lets the loop look at the stop flag.
        Err(e) if would_block(&e) => Ok(None),
        Err(e) => Err(e),
    })
}

/// `fraglab workload sctp-stream`: like `netperf -t SCTP_STREAM -- -m 12000`.
pub fn stream(a: &StreamArgs) -> Result<WorkloadResult> {
    stream_until(a, &AtomicBool::new(false))
}

/// [`stream`], ended early when `stop` (the run's stop flag) is raised.
pub fn stream_until(a: &StreamArgs, stop: &AtomicBool) -> Result<WorkloadResult> {
    let p = StreamPlan::resolve(a)?;
    check_kernel()?;
    let r = WorkloadResult::new("sctp-stream", serde_json::to_value(a)?, wall_now());
    let t0 = Instant::now();
    let (addr, server) = server_for(&p.common, None, false)?;
    let watch = Some(Watch::new(Proto::Sctp, addr, server.is_some()));
    let d =
        net::drive("sctp", p.threads, Some(p.duration), t0, stop, watch, |ctl| stream_worker(&p, addr, ctl));
    let mut m = d.merge(r, Rate::Mbit, |r| r.bytes);
    m.mark_if_stopped(humantime::format_duration(p.duration));
    let report = server.map(Server::stop);
    let r = &mut m.result;

    let d = &mut r.details;
    d.insert("style".into(), json!(p.common.style.name()));
    d.insert("threads".into(), json!(p.threads));
    d.insert("msg_bytes".into(), json!(p.msg));
    if let Ok(sock) = Sock::for_addr(&addr, p.common.style) {
        if p.common.bufs.apply(&sock).is_ok() {
            // What the kernel made of the request (it doubles SO_SNDBUF/SO_RCVBUF).
            let (snd, rcv) = effective_bufs(&sock).unzip();
            d.insert("sndbuf_bytes".into(), json!(snd));
            d.insert("rcvbuf_bytes".into(), json!(rcv));
        }
    }
    server_details(d, &p.common, addr, report);
    r.notes.push(
        "throughput: payload bytes the clients' sendmsg calls accepted; latency: one sendmsg call".into(),
    );
    if p.common.peer.is_none() {
        r.notes.push("the receiving side runs in this process: cpu and rusage include it".into());
    }
    if p.common.style == Style::OneToMany {
        r.notes.push(
            "one-to-many: each association is set up by one unmeasured message before the clock".into(),
        );
    }
    Ok(m.result)
}

// ---------------------------------------------------------------------------------------------
// sctp-rr
// ---------------------------------------------------------------------------------------------

fn rr_worker(p: &RrPlan, addr: SocketAddr, ctl: &Ctl) -> (Tally, ()) {
    let req = vec![0x5au8; p.req];
    let mut buf = vec![0u8; p.resp.clamp(4096, RECV_BUF)];
    // One-to-many: the association comes up with an unmeasured first transaction, before the clock.
    let client = open_client(&p.common, addr, true).and_then(|c| {
        if c.to.is_some() {
            c.transact(&req, p.resp, &mut buf).map(|_| c)
        } else {
            Ok(c)
        }
    });
    timed_loop(ctl, client, |c| c.transact(&req, p.resp, &mut buf).map(|()| Some(p.req as u64)))
}

/// `fraglab workload sctp-rr`: like `netperf -t SCTP_RR`.
pub fn rr(a: &RrArgs) -> Result<WorkloadResult> {
    rr_until(a, &AtomicBool::new(false))
}

/// [`rr`], ended early when `stop` (the run's stop flag) is raised.
pub fn rr_until(a: &RrArgs, stop: &AtomicBool) -> Result<WorkloadResult> {
    let p = RrPlan::resolve(a)?;
    check_kernel()?;
    let r = WorkloadResult::new("sctp-rr", serde_json::to_value(a)?, wall_now());
    let t0 = Instant::now();
    let (addr, server) = server_for(&p.common, None, true)?;
    let watch = Some(Watch::new(Proto::Sctp, addr, server.is_some()));
    let d = net::drive("sctp", p.clients, Some(p.duration), t0, stop, watch, |ctl| rr_worker(&p, addr, ctl));
    let both_ways = |r: &WorkloadResult| r.bytes + r.ok * p.resp as u64;
    let mut m = d.merge(r, Rate::Ops, both_ways);
    m.mark_if_stopped(humantime::format_duration(p.duration));
    let report = server.map(Server::stop);
    let r = &mut m.result;

    let d = &mut r.details;
    d.insert("style".into(), json!(p.common.style.name()));
    d.insert("clients".into(), json!(p.clients));
    d.insert("req_bytes".into(), json!(p.req));
    d.insert("resp_bytes".into(), json!(p.resp));
    d.insert("transactions".into(), json!(r.ok));
    server_details(d, &p.common, addr, report);
    r.notes.push(
        "ok = transactions (request sent, whole response received); latency: one transaction; SCTP_NODELAY on \
         both ends; cpu service demand counts request and response bytes"
            .into(),
    );
    if p.common.peer.is_none() {
        r.notes.push("the answering side runs in this process: cpu and rusage include it".into());
    }
    if p.common.style == Style::OneToMany {
        r.notes.push(
            "one-to-many: each association is set up by one unmeasured transaction before the clock; the \
             in-process server answers every association from one socket and one thread"
                .into(),
        );
    }
    Ok(m.result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{FromArgMatches, Parser};

    #[derive(Parser)]
    struct Wrap<T: clap::Args> {
        #[command(flatten)]
        a: T,
    }

    fn clap_default<T: clap::Args + FromArgMatches>() -> T {
        Wrap::<T>::try_parse_from(["x"]).unwrap().a
    }

    #[test]
    fn serde_defaults_are_clap_defaults() {
        assert_eq!(clap_default::<ConnectArgs>(), serde_json::from_str("{}").unwrap());
        assert_eq!(clap_default::<StreamArgs>(), serde_json::from_str("{}").unwrap());
        assert_eq!(clap_default::<RrArgs>(), serde_json::from_str("{}").unwrap());
        assert_eq!(clap_default::<ConnectArgs>(), ConnectArgs::default());
    }

    #[test]
    fn args_round_trip_and_refuse_unknown_fields() {
        let a: StreamArgs =
            toml::from_str("threads = 4\nmsg = 1452\nsndbuf = \"200000\"\nstyle = \"one-to-many\"").unwrap();
        assert_eq!((a.threads, a.msg.as_str(), a.sndbuf.as_deref()), (4, "1452", Some("200000")));
        assert_eq!(a.style, Style::OneToMany);
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(serde_json::from_value::<StreamArgs>(v).unwrap(), a);
        assert!(toml::from_str::<ConnectArgs>("stream = 5")
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
        let c: ConnectArgs = toml::from_str("associations = 5\nmessage_per_stream = true").unwrap();
        assert!(c.message_per_stream && c.streams == 65535);
    }

    #[test]
    fn serve_args_resolve_to_server_opts() {
        let o = ServeArgs::default().resolve().unwrap();
        assert_eq!(
            (o.style, o.streams, o.bufs.snd, o.bufs.rcv, o.nodelay),
            (Style::OneToOne, None, None, None, true)
        );
        assert_eq!(o.describe(), "one-to-one, the kernel's stream counts");
        assert_eq!(ServeArgs::default().first_given(), None);
        let a = ServeArgs {
            streams: Some(65535),
            style: Some(Style::OneToMany),
            sndbuf: Some("64KiB".into()),
            rcvbuf: None,
        };
        assert_eq!(a.first_given(), Some("--streams"));
        let o = a.resolve().unwrap();
        assert_eq!((o.style, o.streams, o.bufs.snd), (Style::OneToMany, Some(65535), Some(65536)));
        assert_eq!(o.describe(), "one-to-many, 65535 streams each way, SO_SNDBUF 65536");
        let err = |a: ServeArgs| a.resolve().unwrap_err().to_string();
        assert_eq!(
            err(ServeArgs { streams: Some(65536), ..Default::default() }),
            "--streams 65536: must be 1 to 65535 (SCTP stream numbers are 16-bit)"
        );
        assert_eq!(
            err(ServeArgs { sndbuf: Some("12KB".into()), ..Default::default() }),
            "--sndbuf 12KB: \"12KB\": write binary units (KiB) — fraglab does not guess whether KB means 1000 \
             or 1024"
        );
        assert_eq!(
            ServeArgs { rcvbuf: Some("1".into()), ..Default::default() }.first_given(),
            Some("--rcvbuf")
        );
    }

    #[test]
    fn validation_names_flag_and_value() {
        let err = |a: &ConnectArgs| ConnectPlan::resolve(a).err().unwrap().to_string();
        assert!(err(&ConnectArgs { streams: 0, ..Default::default() }).starts_with("--streams 0:"));
        assert!(err(&ConnectArgs { streams: 70000, ..Default::default() }).starts_with("--streams 70000:"));
        assert!(err(&ConnectArgs { associations: 0, ..Default::default() }).starts_with("--associations 0:"));
        assert!(err(&ConnectArgs { concurrency: 0, ..Default::default() }).starts_with("--concurrency 0:"));
        assert!(
            err(&ConnectArgs { timeout: "soon".into(), ..Default::default() }).starts_with("--timeout soon:")
        );
        assert!(
            err(&ConnectArgs { peer: Some("127.0.0.1".into()), ..Default::default() }).starts_with("--peer")
        );
        let serr = |a: &StreamArgs| StreamPlan::resolve(a).err().unwrap().to_string();
        assert!(serr(&StreamArgs { msg: "0".into(), ..Default::default() }).starts_with("--msg 0:"));
        assert!(serr(&StreamArgs { msg: "12KB".into(), ..Default::default() }).starts_with("--msg 12KB:"));
        assert!(
            serr(&StreamArgs { duration: "0s".into(), ..Default::default() }).starts_with("--duration 0s:")
        );
        assert!(serr(&StreamArgs { sndbuf: Some("2GiB".into()), ..Default::default() })
            .starts_with("--sndbuf 2GiB:"));
        assert!(serr(&StreamArgs { threads: 0, ..Default::default() }).starts_with("--threads 0:"));
        let rerr = |a: &RrArgs| RrPlan::resolve(a).err().unwrap().to_string();
        assert!(rerr(&RrArgs { resp: "17MiB".into(), ..Default::default() }).starts_with("--resp 17MiB:"));
        assert!(rerr(&RrArgs { clients: 0, ..Default::default() }).starts_with("--clients 0:"));
        let ok = ConnectPlan::resolve(&ConnectArgs { associations: 3, concurrency: 8, ..Default::default() })
            .unwrap();
        assert_eq!((ok.workers, ok.streams), (3, 65535));
    }

    /// The timed loop of sctp-stream and sctp-rr under the shared driver, without SCTP (this host has
    /// none): workers stop on the run's flag long before the duration, and the result says so; a
    /// transient failure is retried on the same association and any other ends the worker; a client
    /// that could not be set up is one failure, and the run does not wait out its duration for it.
    #[test]
    fn timed_workers_stop_on_the_run_flag_and_retry_only_transient_failures() {
        // Any descriptor does: the operations below never use it.
        let dev_null = || {
            let fd = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
            Ok(Client { sock: Sock(fd), to: None })
        };
        let result = || WorkloadResult::new("sctp-stream", json!({}), wall_now());
        let stop = AtomicBool::new(false);
        let t0 = Instant::now();
        let (d, took) = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                stop.store(true, Ordering::Relaxed);
            });
            let t = Instant::now();
            let d = net::drive("sctp", 3, Some(Duration::from_secs(60)), t0, &stop, None, |ctl| {
                timed_loop(ctl, dev_null(), |_| {
                    std::thread::sleep(Duration::from_millis(1));
                    Ok(Some(100))
                })
            });
            (d, t.elapsed())
        });
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let mut m = d.merge(result(), Rate::Mbit, |r| r.bytes);
        m.mark_if_stopped(humantime::format_duration(Duration::from_secs(60)));
        let r = &m.result;
        assert!(r.ok > 0 && r.bytes == 100 * r.ok && r.failed == 0, "{r:?}");
        assert_eq!(r.latency_us.as_ref().unwrap().count, r.ok);
        assert!(r.duration_s < 2.0 && r.throughput_mbit.is_some());
        assert_eq!(r.details["stopped_by_signal"], true);
        let note = r.notes.last().unwrap();
        assert!(
            note.starts_with("stopped by a signal after 0.") && note.ends_with("of the 1m asked for"),
            "{note}"
        );

        let never = AtomicBool::new(false);
        let d = net::drive("sctp", 1, Some(Duration::from_secs(60)), t0, &never, None, |ctl| {
            let mut calls = 0;
            timed_loop(ctl, dev_null(), |_| {
                calls += 1;
                match calls {
                    1 => Err(errno(libc::ENOMEM)),
                    2 => Err(errno(libc::EAGAIN)),
                    3 => Ok(Some(1)),
                    _ => Err(errno(libc::ETIMEDOUT)),
                }
            })
        });
        let r = d.merge(result(), Rate::Ops, |_| 0).result;
        assert_eq!((r.ok, r.failed), (1, 3), "{r:?}");
        let errnos: Vec<_> = r.errors.iter().map(|e| (e.errno.as_str(), e.count)).collect();
        assert_eq!(errnos, [("EAGAIN", 1), ("ENOMEM", 1), ("ETIMEDOUT", 1)]);
        assert!(r.duration_s < 1.0 && !r.details.contains_key("stopped_by_signal"));

        let d = net::drive("sctp", 2, Some(Duration::from_secs(60)), t0, &never, None, |ctl| {
            timed_loop(ctl, Err(errno(libc::ECONNREFUSED)), |_| Ok(None))
        });
        let r = d.merge(result(), Rate::Ops, |_| 0).result;
        assert_eq!((r.ok, r.failed, r.errors[0].errno.as_str()), (0, 2, "ECONNREFUSED"));
        assert!(r.duration_s < 1.0 && !r.details.contains_key("stopped_by_signal"));
    }

    #[test]
    fn sockaddr_round_trip() {
        for a in ["127.0.0.1:9", "[::1]:65535", "10.1.2.3:22222"] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, _) = to_sockaddr(&a);
            assert_eq!(from_sockaddr(&ss), Some(a));
        }
    }

    #[test]
    fn assoc_change_parses() {
        let mut b = [0u8; 20];
        b[0..2].copy_from_slice(&SCTP_ASSOC_CHANGE.to_ne_bytes());
        b[8..10].copy_from_slice(&SCTP_COMM_UP.to_ne_bytes());
        b[12..14].copy_from_slice(&65535u16.to_ne_bytes());
        b[14..16].copy_from_slice(&10u16.to_ne_bytes());
        b[16..20].copy_from_slice(&7i32.to_ne_bytes());
        let c = assoc_change(&b).unwrap();
        assert_eq!((c.state, c.outbound, c.inbound, c.assoc_id), (SCTP_COMM_UP, 65535, 10, 7));
        assert!(assoc_change(&b[..12]).is_none());
    }
}
