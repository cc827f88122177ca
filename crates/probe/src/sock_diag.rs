//! `NETLINK_SOCK_DIAG`: every TCP or SCTP socket of one address family with its memory, the source
//! `ss -tm` reads (`skmem:(r0,rb131072,t0,tb16384,f0,w0,o0,bl0,d0)`).
//!
//! One `SOCK_DIAG_BY_FAMILY` dump with the `INET_DIAG_SKMEMINFO` extension asked for. The request
//! and the replies are built and decoded by netlink-packet-sock-diag; sending, receiving and
//! stitching the reply's datagrams together is here, so a dump can be saved as bytes
//! ([`Dump::raw`]) and parsed again ([`parse`]) — tests read real captures that way.
//!
//! # What the kernel reports per socket
//! `sk_get_meminfo()` (TCP, through inet_diag) and `inet_sctp_diag_fill()` (SCTP) fill the same nine
//! numbers, all bytes but `d` (a count of packets):
//!
//! | field | kernel | what |
//! |---|---|---|
//! | r | sk_rmem_alloc | received data queued, skb truesize |
//! | rb | sk_rcvbuf | receive buffer limit (SO_RCVBUF × 2, or autotuned) |
//! | t | sk_wmem_alloc | sent skbs still below the socket (qdisc, driver, loopback) — TCP's are clones of what `w` holds; SCTP counts a chunk here and in `w` until it is acknowledged |
//! | tb | sk_sndbuf | send buffer limit |
//! | f | sk_forward_alloc | memory charged to the protocol's pool but not yet used by this socket |
//! | w | sk_wmem_queued | the write queue: data sent by the application, not yet acknowledged |
//! | o | sk_omem_alloc | option memory (filters, MD5 keys, …) |
//! | bl | sk_backlog.len | bytes waiting in the backlog while the socket was owned by a process |
//! | d | sk_drops | packets dropped |
//!
//! `f` is what seed 004 is about: before Linux 6.0 a TCP socket kept up to 2 MiB of such reserve
//! (`SK_RECLAIM_THRESHOLD`) "to be efficient"; since Eric Dumazet's series "net: reduce
//! tcp_memory_allocated inflation" (6.0) the cushion is per CPU instead — each CPU batches its
//! changes to the protocol's counter (`per_cpu_fw_alloc`, up to 1 MiB) — and a socket's `f` holds
//! only the remainder of a page.
//!
//! # SCTP
//! sctp_diag (a module of its own, `sctp_diag.ko`) answers with one message per endpoint and one per
//! association. The listener pass sends every endpoint; then the association pass sends a socket
//! that has associations again, as its endpoint and then once per association. [`Dump::sockets`] folds these
//! into one [`Socket`] per socket cookie (the kernel's unique id of a socket): the memory of its first message (the socket's own, where an
//! association's message may carry that association's share in `t` and `r`), the addresses of its
//! first association. An association's `state` is SCTP's own (`SCTP_STATE_ESTABLISHED` = 3), an
//! endpoint's the socket's (`TCP_LISTEN` = 10 for a listener).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla as _, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_SCTP, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::nlas::Nla;
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket as NetlinkSocket, SocketAddr as NetlinkAddr};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `INET_DIAG_PEERS` (13; `INET_DIAG_LOCALS`, 12, is on endpoints too): an SCTP association's peer
/// addresses, which only association messages carry.
const INET_DIAG_PEERS: u16 = 13;
/// The most datagrams one dump may take: 1 M of about a page each, some 20 million sockets — far
/// past any machine fraglab runs on. With [`REPLY_TIMEOUT`] it bounds the loop if a kernel never
/// says DONE.
const MAX_DATAGRAMS: usize = 1 << 20;
/// Longest one reply may take to come (SO_RCVTIMEO): a dump of a million sockets comes in well
/// under a second; past this the dump fails with EAGAIN instead of hanging its caller.
const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A protocol sock_diag can dump with inet_diag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Sctp,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Sctp => "sctp",
        }
    }

    fn number(self) -> u8 {
        match self {
            Proto::Tcp => IPPROTO_TCP,
            Proto::Sctp => IPPROTO_SCTP,
        }
    }
}

/// The address family of the sockets dumped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    #[serde(rename = "ipv4")]
    V4,
    #[serde(rename = "ipv6")]
    V6,
}

impl Family {
    pub fn of(addr: &SocketAddr) -> Family {
        if addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// As results and JSON write it: `ipv4`, `ipv6`.
    pub fn key(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    fn number(self) -> u8 {
        match self {
            Family::V4 => AF_INET,
            Family::V6 => AF_INET6,
        }
    }
}

/// `skmem:(r…,rb…,t…,tb…,f…,w…,o…,bl…,d…)`: one socket's memory, named as `ss -m` names it. See the
/// module documentation for what each field is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkMem {
    pub r: u32,
    pub rb: u32,
    pub t: u32,
    pub tb: u32,
    /// Signed, as the kernel's `int sk_forward_alloc`: SCTP charges a received chunk to the socket
    /// before it has scheduled memory for it, so an SCTP socket's forward allocation dips below zero
    /// (`ss` prints the u32 it was sent: `f4294963200` is −4096).
    pub f: i32,
    pub w: u32,
    pub o: u32,
    pub bl: u32,
    pub d: u32,
}

impl SkMem {
    /// The fields in `ss` order, with their names.
    pub fn fields(&self) -> [(&'static str, i64); 9] {
        [
            ("r", self.r.into()),
            ("rb", self.rb.into()),
            ("t", self.t.into()),
            ("tb", self.tb.into()),
            ("f", self.f.into()),
            ("w", self.w.into()),
            ("o", self.o.into()),
            ("bl", self.bl.into()),
            ("d", self.d.into()),
        ]
    }

    /// Bytes the socket has charged to its protocol: received (`r`), queued to send (`w`), and
    /// charged but unused (`f`, negative when it uses more than it charged). Not `t`: what is below
    /// the socket is the same data `w` still holds (a TCP clone, an unacknowledged SCTP chunk). `ss`
    /// prints no such sum; summed over sockets it is what the protocol's `memory_allocated` counts,
    /// in pages, give or take what each CPU has not yet added to it (up to 1 MiB a CPU either way).
    pub fn held(&self) -> i64 {
        i64::from(self.r) + i64::from(self.w) + i64::from(self.f)
    }
}

impl std::fmt::Display for SkMem {
    /// As `ss -m` prints it: `skmem:(r0,rb131072,t0,tb16384,f0,w0,o0,bl0,d0)`.
    fn fmt(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.fields().iter().map(|(k, v)| format!("{k}{v}")).collect();
        write!(out, "skmem:({})", parts.join(","))
    }
}

/// One message of a dump: a TCP socket, or an SCTP endpoint or association.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `idiag_state`: TCP's state, an SCTP endpoint's socket state or an SCTP association's state.
    pub state: u8,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The socket's inode (`ls -l /proc/PID/fd` shows `socket:[inode]`); 0 for a socket no process
    /// has a file for — TIME_WAIT, a request socket, or a connection still in its listener's accept
    /// queue (which does hold memory).
    pub inode: u32,
    /// `idiag_cookie`: the kernel's unique id of the socket, set on every message about it (an SCTP
    /// socket's endpoint and its associations alike), inode or not.
    pub cookie: u64,
    pub uid: u32,
    /// An SCTP association (the message carries the peers' addresses), not an endpoint.
    pub association: bool,
    /// `None` when the kernel sent no INET_DIAG_SKMEMINFO for it (TIME_WAIT and request sockets).
    pub skmem: Option<SkMem>,
}

/// One socket, its messages folded together (see [`Dump::sockets`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Socket {
    pub cookie: u64,
    /// 0 while the connection waits in its listener's accept queue.
    pub inode: u32,
    /// The state of its first message (for SCTP, the endpoint's socket state).
    pub state: u8,
    /// Its first association's ends for SCTP, else its own.
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// SCTP associations on it (0 for TCP and for an SCTP listener without any).
    pub associations: u32,
    pub skmem: SkMem,
}

/// A whole dump: the reply as received, and its messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    pub proto: Proto,
    pub family: Family,
    pub entries: Vec<Entry>,
    /// The reply's datagrams back to back, as [`parse`] reads them.
    pub raw: Vec<u8>,
}

/// What names a dump in errors: `netlink sock_diag (tcp, IPv6)`.
fn source(proto: Proto, family: Family) -> String {
    format!("netlink sock_diag ({}, {})", proto.name(), family.name())
}

/// Which sockets a dump asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum States {
    /// Every state: what `ss -a` lists, TIME-WAIT and request sockets (no memory) included.
    All,
    /// Full sockets only — not TIME-WAIT, SYN-RECV and NEW-SYN-RECV, which carry no memory and of
    /// which a long tcp-crr leaves hundreds of thousands: the workloads' sampler asks for these.
    Full,
}

/// Dump the `states` `proto` sockets of `family` in this network namespace, with their memory.
///
/// A kernel without the protocol's diag handler (`tcp_diag`, `sctp_diag` not built or not loaded,
/// and no modprobe to load it) answers ENOENT; that comes back as an I/O error naming the dump.
///
/// Each reply is read into a buffer of exactly its size, after a peek: netlink sizes the skbs of
/// the rest of a dump to the largest read the socket has seen (up to 32 KiB, an order-3 page
/// allocation), so a big buffer would make every later reply of the dump ask the page allocator
/// for an order-3 block — on the very machine fraglab keeps without them. Read this way they stay
/// one page.
pub fn read(proto: Proto, family: Family, states: States) -> Result<Dump> {
    let what = source(proto, family);
    let io = |e: std::io::Error| Error::Io { path: what.clone().into(), source: e };
    let mut sock = NetlinkSocket::new(NETLINK_SOCK_DIAG).map_err(io)?;
    socket2::SockRef::from(&sock).set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
    sock.bind_auto().map_err(io)?;
    sock.connect(&NetlinkAddr::new(0, 0)).map_err(io)?;

    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let socket_id = match family {
        Family::V4 => SocketId::new_v4(),
        Family::V6 => SocketId::new_v6(),
    };
    let request = SockDiagMessage::InetRequest(InetRequest {
        family: family.number(),
        protocol: proto.number(),
        extensions: ExtensionFlags::SKMEMINFO,
        states: match states {
            States::All => StateFlags::all(),
            States::Full => StateFlags::all() - StateFlags::TIME_WAIT - StateFlags::SYN_RECV - new_syn_recv(),
        },
        socket_id,
    });
    let mut packet = NetlinkMessage::new(header, request.into());
    packet.finalize();
    let mut out = vec![0; packet.buffer_len()];
    packet.serialize(&mut out);
    sock.send(&out, 0).map_err(io)?;

    let mut raw = Vec::new();
    let mut buf = Vec::new();
    let timed_out = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock => {
            io(std::io::Error::other(format!("no reply within {} s (SO_RCVTIMEO)", REPLY_TIMEOUT.as_secs())))
        }
        _ => io(e),
    };
    for _ in 0..MAX_DATAGRAMS {
        // A zero-length peek with MSG_TRUNC returns the datagram's real length and leaves netlink's
        // idea of our read size alone.
        let n = sock.recv(&mut &mut buf[..0], libc::MSG_PEEK | libc::MSG_TRUNC).map_err(timed_out)?;
        buf.resize(n, 0);
        let got = sock.recv(&mut &mut buf[..], libc::MSG_TRUNC).map_err(timed_out)?;
        if got != n {
            return Err(io(std::io::Error::other(format!("a reply peeked at {n} bytes came as {got}"))));
        }
        raw.extend_from_slice(&buf);
        match last_message_type(&buf) {
            Some(Last::Done) => return parse_dump(proto, family, raw, &what),
            Some(Last::Error(code)) => return Err(io(std::io::Error::from_raw_os_error(code))),
            _ => {}
        }
    }
    Err(io(std::io::Error::other(format!("no end of dump after {MAX_DATAGRAMS} replies"))))
}

/// `TCPF_NEW_SYN_RECV` (state 12), which the crate's StateFlags does not name.
fn new_syn_recv() -> StateFlags {
    StateFlags::from_bits_retain(1 << 12)
}

enum Last {
    Done,
    Error(i32),
    More,
}

/// Whether this datagram ends the dump: its last message is NLMSG_DONE, or an error.
fn last_message_type(datagram: &[u8]) -> Option<Last> {
    let mut off = 0;
    let mut last = None;
    while off + 16 <= datagram.len() {
        let len = u32::from_ne_bytes(datagram[off..off + 4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(datagram[off + 4..off + 6].try_into().ok()?);
        // NLMSG_DONE carries the dump's error too: a kernel without the protocol's diag handler
        // ends an empty dump with -ENOENT there.
        let code = match datagram.get(off + 16..off + 20) {
            Some(b) => i32::from_ne_bytes(b.try_into().ok()?),
            None => 0,
        };
        last = Some(match kind {
            netlink_packet_core::NLMSG_DONE | netlink_packet_core::NLMSG_ERROR if code != 0 => {
                Last::Error(-code)
            }
            netlink_packet_core::NLMSG_DONE => Last::Done,
            _ => Last::More,
        });
        if len < 16 {
            break;
        }
        off += len.next_multiple_of(4);
    }
    last
}

/// Parse a dump saved as bytes (the reply's datagrams back to back, [`Dump::raw`]); `path` names
/// it in errors, which give the message's number (1-based) as the line.
pub fn parse(proto: Proto, family: Family, raw: &[u8], path: &str) -> Result<Dump> {
    parse_dump(proto, family, raw.to_vec(), path)
}

fn parse_dump(proto: Proto, family: Family, raw: Vec<u8>, path: &str) -> Result<Dump> {
    let mut entries = Vec::new();
    let mut off = 0;
    let mut n = 0;
    let mut done = false;
    while off < raw.len() {
        n += 1;
        let at = format!("message at byte {off} of {}", raw.len());
        let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&raw[off..])
            .map_err(|e| Error::parse(path, n, &at, format!("not a sock_diag message: {e}")))?;
        let len = msg.header.length as usize;
        if len < 16 {
            return Err(Error::parse(path, n, &at, format!("message length {len} is below a header")));
        }
        match msg.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => entries.push(entry(&r)),
            NetlinkPayload::Done(d) if d.code != 0 => {
                let e = std::io::Error::from_raw_os_error(d.code.saturating_neg());
                return Err(Error::parse(path, n, &at, format!("the dump ended with {e}")));
            }
            NetlinkPayload::Done(_) => {
                done = true;
                break;
            }
            NetlinkPayload::Error(e) => {
                return Err(Error::parse(path, n, &at, format!("the kernel answered {}", e.to_io())))
            }
            _ => return Err(Error::parse(path, n, &at, "not an inet_diag reply")),
        }
        off += len.next_multiple_of(4);
    }
    if !done {
        return Err(Error::parse(path, n, "end of dump", "no NLMSG_DONE: the dump is cut short"));
    }
    Ok(Dump { proto, family, entries, raw })
}

fn entry(r: &InetResponse) -> Entry {
    let h = &r.header;
    let id = &h.socket_id;
    let mut skmem = None;
    let mut association = false;
    for nla in &r.nlas {
        match nla {
            Nla::MemInfo(m) => {
                skmem = Some(SkMem {
                    r: m.receive_queue,
                    rb: m.receive_queue_max,
                    t: m.bottom_send_queues,
                    tb: m.send_queue_max,
                    // The kernel's int, sent as a u32.
                    f: m.cache as i32,
                    w: m.send_queue,
                    o: m.options,
                    bl: m.backlog_queue_length,
                    d: m.drops,
                })
            }
            Nla::Other(a) if a.kind() == INET_DIAG_PEERS => association = true,
            _ => {}
        }
    }
    let addr = |ip: IpAddr, port: u16| SocketAddr::new(ip, port);
    Entry {
        state: h.state,
        local: addr(id.source_address, id.source_port),
        remote: addr(id.destination_address, id.destination_port),
        inode: h.inode,
        cookie: u64::from_ne_bytes(id.cookie),
        uid: h.uid,
        association,
        skmem,
    }
}

impl Dump {
    /// One [`Socket`] per cookie, in the order first seen: an SCTP socket's endpoint and association
    /// messages folded together, TCP sockets as they are. Messages without memory (TIME_WAIT and
    /// request sockets: no INET_DIAG_SKMEMINFO) are left out; a connection not yet accepted is
    /// kept, with inode 0.
    pub fn sockets(&self) -> Vec<Socket> {
        let mut out: Vec<Socket> = Vec::new();
        let mut at: BTreeMap<u64, usize> = BTreeMap::new();
        for e in &self.entries {
            let Some(skmem) = e.skmem else { continue };
            match at.get(&e.cookie) {
                None => {
                    at.insert(e.cookie, out.len());
                    out.push(Socket {
                        cookie: e.cookie,
                        inode: e.inode,
                        state: e.state,
                        local: e.local,
                        remote: e.remote,
                        associations: u32::from(e.association),
                        skmem,
                    });
                }
                Some(&i) if e.association => {
                    let s = &mut out[i];
                    if s.associations == 0 {
                        (s.local, s.remote) = (e.local, e.remote);
                    }
                    s.associations += 1;
                }
                Some(_) => {}
            }
        }
        out
    }
}

/// A state number as `ss` names it, for the protocol and the kind of message it came from.
pub fn state_name(proto: Proto, association: bool, state: u8) -> &'static str {
    const TCP: [&str; 14] = [
        "UNKNOWN",
        "ESTAB",
        "SYN-SENT",
        "SYN-RECV",
        "FIN-WAIT-1",
        "FIN-WAIT-2",
        "TIME-WAIT",
        "UNCONN",
        "CLOSE-WAIT",
        "LAST-ACK",
        "LISTEN",
        "CLOSING",
        "NEW-SYN-RECV",
        "BOUND-INACTIVE",
    ];
    // enum sctp_state (include/net/sctp/constants.h); endpoints use the TCP numbers above.
    const SCTP: [&str; 8] = [
        "CLOSED",
        "COOKIE_WAIT",
        "COOKIE_ECHOED",
        "ESTAB",
        "SHUTDOWN_PENDING",
        "SHUTDOWN_SENT",
        "SHUTDOWN_RECEIVED",
        "SHUTDOWN_ACK_SENT",
    ];
    let table: &[&str] = if proto == Proto::Sctp && association { &SCTP } else { &TCP };
    table.get(usize::from(state)).copied().unwrap_or("UNKNOWN")
}
