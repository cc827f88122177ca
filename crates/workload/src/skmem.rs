//! The memory of a workload's own sockets while it runs: [`Watch`] dumps the protocol's sockets
//! through sock_diag (what `ss -tm` reads) every interval of the window, keeps those whose one end is
//! the workload's server, and builds the result's `skmem` record from them.
//!
//! Which sockets are the workload's: those whose remote end is the server and which this process
//! has a file for (the clients: a closed one lingering in FIN-WAIT belongs to no one now), and with
//! an in-process server those whose local end is it (what it accepted or has yet to accept, or for
//! SCTP one-to-many its one socket) — listeners without a connection are left out, they hold
//! nothing. A `--peer` run sees its clients only, the server's sockets being on the other host; and
//! since another program here may talk to the same peer, its clients are the sockets among this
//! process's open files (/proc/self/fd).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use fraglab_probe::sock_diag::{self, Family, Proto, States};
use fraglab_probe::sockstat;
use fraglab_results::skmem::{Builder, Role, SockMem};

/// How often a window is sampled: often enough to see a socket's forward allocation move with its
/// traffic, and a dump of 512 loopback sockets costs about a millisecond (docs/benchmarks.md).
const INTERVAL: Duration = Duration::from_millis(250);
/// A shorter window still gets about ten samples, but no more often than this.
const MIN_INTERVAL: Duration = Duration::from_millis(20);
/// `TCP_LISTEN`, the state of a listener that is no connection.
const LISTEN: u8 = 10;

/// What to sample: `proto` sockets talking to `server`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Watch {
    proto: Proto,
    server: SocketAddr,
    /// The server runs in this process: its sockets are the workload's too.
    in_process: bool,
}

impl Watch {
    pub(crate) fn new(proto: Proto, server: SocketAddr, in_process: bool) -> Watch {
        Watch { proto, server, in_process }
    }

    /// The interval for a window of `duration` (`None`: it ends when its workers are done).
    pub(crate) fn interval(duration: Option<Duration>) -> Duration {
        duration.map_or(MIN_INTERVAL * 5, |d| (d / 10).clamp(MIN_INTERVAL, INTERVAL))
    }

    /// Sample every `interval` from now until `stop` goes up (the driver raises it when the window
    /// ends). A dump that fails is counted and its error kept; the window goes on.
    pub(crate) fn run(&self, interval: Duration, stop: &AtomicBool) -> SockMem {
        let family = Family::of(&self.server);
        let mut b = Builder::new(self.proto, family, ms(interval));
        let start = Instant::now();
        let mut next = start + interval;
        loop {
            while Instant::now() < next {
                if stop.load(Relaxed) {
                    return b.finish();
                }
                std::thread::sleep((next - Instant::now()).min(Duration::from_millis(5)));
            }
            if stop.load(Relaxed) {
                return b.finish();
            }
            let t_s = start.elapsed().as_secs_f64();
            let own_socket_inodes = if self.in_process { None } else { Some(own_socket_inodes()) };
            match sock_diag::read(self.proto, family, States::Full) {
                Ok(dump) => {
                    let mine = self.mine(dump.sockets(), &own_socket_inodes);
                    b.add(t_s, &mine, self.proto_mem_bytes());
                }
                Err(e) => b.failed(e.to_string()),
            }
            // A slow dump (thousands of sockets under TCG) pushes the next one back, never bunches them.
            next = (next + interval).max(Instant::now());
        }
    }

    /// The workload's sockets among `sockets`; `own` (with `--peer`) the inodes of this process's
    /// sockets.
    fn mine(
        &self,
        sockets: Vec<sock_diag::Socket>,
        own: &Option<BTreeSet<u32>>,
    ) -> Vec<(Role, sock_diag::Socket)> {
        sockets
            .into_iter()
            .filter_map(|s| {
                if same_end(&s.remote, &self.server)
                    && s.inode != 0
                    && own.as_ref().is_none_or(|own| own.contains(&s.inode))
                {
                    Some((Role::Client, s))
                } else if self.in_process
                    && same_end(&s.local, &self.server)
                    && !listener_only(self.proto, &s)
                {
                    Some((Role::Server, s))
                } else {
                    None
                }
            })
            .collect()
    }

    /// The protocol's memory_allocated in bytes.
    fn proto_mem_bytes(&self) -> Option<u64> {
        let pages = sockstat::memory_allocated_pages(self.proto)?;
        Some(u64::try_from(pages).ok()? * procfs::page_size())
    }
}

/// A listening socket with no connection of its own: a TCP listener, an SCTP endpoint without
/// associations. It holds nothing.
fn listener_only(proto: Proto, s: &sock_diag::Socket) -> bool {
    match proto {
        Proto::Tcp => s.state == LISTEN,
        Proto::Sctp => s.associations == 0,
    }
}

/// The same address and port; an IPv6 scope id (`fe80::1%eth0`) is not in a dump's addresses, so it
/// is not compared.
fn same_end(a: &SocketAddr, b: &SocketAddr) -> bool {
    a.ip() == b.ip() && a.port() == b.port()
}

/// The inodes of this process's sockets (`socket:[INODE]` links in /proc/self/fd); empty if it
/// cannot be read.
fn own_socket_inodes() -> BTreeSet<u32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return BTreeSet::new() };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect()
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The record of a window whose sampler thread could not be started.
pub(crate) fn unsampled(w: &Watch, why: &std::io::Error) -> SockMem {
    let mut b = Builder::new(w.proto, Family::of(&w.server), 0);
    b.failed(format!("the socket memory sampler could not start: {why}"));
    b.finish()
}
