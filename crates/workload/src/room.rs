//! How much memory a workload can have the kernel hold in socket buffers at once, by the kernel's
//! own limits — so that a run leaves that room beside the target (in the reserve) instead of having
//! its guard give the target up, or the OOM killer act, when the buffers fill.
//!
//! MemAvailable while a target is held is the reserve plus the target's own free blocks. A target
//! with little free memory — a reporter's profile of nearly full zones — leaves a workload the
//! reserve alone. Measured in a 1 GiB Debian 6.1 guest: 30 loopback TCP streams had up to 59 MiB
//! charged to TCP (`memory_allocated`, with `net.core.high_order_alloc_disable = 1`), against a
//! hard limit (`tcp_mem[2]`, which the kernel sets to 3/32 of the memory buffers may use) of
//! 82.7 MiB and a default reserve of 132 MiB there.
//!
//! Only the memory the protocols charge to their sockets is bounded here: SCTP's stream tables
//! (kmalloc'd when an association is set up, `sctp_stream_init`), a trigger's allocations and an
//! exec'd command's memory have no kernel limit to read, and the guard answers for them.

use std::fmt;

use fraglab_units::format_size;

use crate::net::SockBufs;

/// The per-CPU share of a protocol's memory counter that is not yet added to it
/// (`SK_MEMORY_PCPU_RESERVE`, 1 MiB since Linux 6.0): memory a protocol can hold past its limit.
const PCPU_RESERVE: u64 = 1 << 20;

/// What a socket may hold past its buffer: the segment being queued or received when the limit
/// was checked (`sk_stream_memory_free` and `tcp_try_rmem_schedule` look before adding it) — up to
/// a 64 KiB GSO segment, loopback's MTU, and its skb — and as much again charged ahead for it
/// (`sk_forward_alloc`: up to 65.78 KiB a socket measured under 30 streams in a 1 GiB guest).
/// Measured on this host: three streams with 200 KiB buffers had up to 91 % of 2 × 400 KiB and
/// 2 × 68 KiB a connection.
const OVERSHOOT: u64 = 136 << 10;

/// One protocol's limits, from its sysctls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proto {
    /// `net.ipv4.tcp_mem`, `net.sctp.sctp_mem`.
    pub mem_sysctl: &'static str,
    /// Its third figure, in bytes: past it the protocol refuses to charge more to any socket
    /// (`sk_under_memory_pressure` → `__sk_mem_raise_allocated` suppresses, but for each socket's
    /// minimum).
    pub mem_max: u64,
    /// The largest send and receive buffer a socket grows to without SO_SNDBUF/SO_RCVBUF
    /// (`tcp_wmem[2]`/`tcp_rmem[2]`: TCP's autotuning; `sctp_wmem[2]`/`sctp_rmem[2]`).
    pub wmem_max: u64,
    pub rmem_max: u64,
}

/// What the kernel lets sockets hold, read once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `None` when the kernel has no TCP sysctls (no network namespace support for them) or no SCTP
    /// (the module is not loaded): no bound for that protocol's kinds.
    pub tcp: Option<Proto>,
    pub sctp: Option<Proto>,
    /// `net.core.wmem_max`/`rmem_max`: what SO_SNDBUF/SO_RCVBUF are capped at before doubling.
    pub core_wmem_max: u64,
    pub core_rmem_max: u64,
    /// Online CPUs, for the per-CPU part of a protocol's counter.
    pub cpus: u64,
    pub page_size: u64,
}

impl Limits {
    /// Read them from `/proc/sys`, with a run's sweep sysctls (`net.ipv4.tcp_mem = "…"`) in place of
    /// the running values.
    pub fn read(overrides: &[(String, String)]) -> Limits {
        let sysctl = |name: &str| -> Option<Vec<u64>> {
            let text = match overrides.iter().find(|(n, _)| n == name) {
                Some((_, v)) => v.clone(),
                None => std::fs::read_to_string(format!("/proc/sys/{}", name.replace('.', "/"))).ok()?,
            };
            text.split_whitespace().map(|f| f.parse().ok()).collect()
        };
        let page_size = procfs::page_size();
        let proto = |mem: &'static str, wmem: &str, rmem: &str| -> Option<Proto> {
            let (m, w, r) = (sysctl(mem)?, sysctl(wmem)?, sysctl(rmem)?);
            Some(Proto {
                mem_sysctl: mem,
                mem_max: m.get(2)?.saturating_mul(page_size),
                wmem_max: *w.get(2)?,
                rmem_max: *r.get(2)?,
            })
        };
        let one = |name: &str| sysctl(name).and_then(|v| v.first().copied()).unwrap_or(u64::MAX);
        Limits {
            tcp: proto("net.ipv4.tcp_mem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_rmem"),
            sctp: proto("net.sctp.sctp_mem", "net.sctp.sctp_wmem", "net.sctp.sctp_rmem"),
            core_wmem_max: one("net.core.wmem_max"),
            core_rmem_max: one("net.core.rmem_max"),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            page_size,
        }
    }
}

/// Memory a workload can have the kernel hold at once, and why that much.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Room {
    pub bytes: u64,
    pub why: String,
}

impl fmt::Display for Room {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", format_size(self.bytes), self.why)
    }
}

/// The connections of a socket workload, as the room is reckoned from them.
pub(crate) struct Conns {
    /// Connections (a stream's threads, an RR's clients).
    pub n: usize,
    /// Both ends are here (the in-process server), or only the sending one (`--peer`).
    pub both_ends: bool,
    pub bufs: SockBufs,
    /// At most this much in flight on one connection at a time (an RR's request and response), or
    /// `None` when the sender keeps its buffer full (a stream).
    pub in_flight: Option<u64>,
}

/// The room `c` needs on protocol `p`: each connection's buffers filled — the sender's send buffer
/// and the receiver's receive buffer; on loopback a segment is charged to one of them at a time —
/// capped at the protocol's hard limit.
pub(crate) fn sockets(p: &Proto, limits: &Limits, c: &Conns) -> Room {
    // SO_SNDBUF/SO_RCVBUF: capped at net.core's max, then doubled for the kernel's overhead.
    let snd = c.bufs.snd.map_or(p.wmem_max, |n| 2 * (n as u64).min(limits.core_wmem_max));
    let rcv = c.bufs.rcv.map_or(p.rmem_max, |n| 2 * (n as u64).min(limits.core_rmem_max));
    let buffers = if c.both_ends { snd + rcv + 2 * OVERSHOOT } else { snd + OVERSHOOT };
    // A small segment costs more than its bytes (its skb's truesize): twice them, a page at least.
    let one = c.in_flight.map_or(buffers, |b| buffers.min((2 * b).max(limits.page_size)));
    let all = one.saturating_mul(c.n as u64);
    let hard = p.mem_max.saturating_add(limits.cpus.saturating_mul(PCPU_RESERVE));
    if all <= hard {
        Room { bytes: all, why: format!("{} connection(s) × {} of socket buffers", c.n, format_size(one)) }
    } else {
        Room {
            bytes: hard,
            why: format!(
                "{}'s hard limit {}, and {} CPU(s) × {} not yet counted in it ({} connection(s) × {} of \
                 socket buffers would be more)",
                p.mem_sysctl,
                format_size(p.mem_max),
                limits.cpus,
                format_size(PCPU_RESERVE),
                c.n,
                format_size(one)
            ),
        }
    }
}
