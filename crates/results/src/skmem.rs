//! The memory of a workload's own sockets while it ran — what `ss -tm` shows as `skmem:(…)`,
//! sampled through sock_diag (`fraglab_probe::sock_diag`) — as a result records it: per socket the
//! max and mean of every field over the samples it was seen in, per sample the sum over the sockets
//! beside the protocol's own count (sockstat's `TCP: mem`, /proc/net/protocols' SCTP memory), and a
//! summary compare and report read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use fraglab_probe::sock_diag::{self, Family, Proto, SkMem, Socket};
use fraglab_units::format_size;

/// The nine skmem fields, each a `T`: `i64` for maxima and sums (`f` may be negative), `f64` for
/// means. Field names are
/// `ss`'s (see `fraglab_probe::sock_diag` for what each is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Fields<T> {
    pub r: T,
    pub rb: T,
    pub t: T,
    pub tb: T,
    pub f: T,
    pub w: T,
    pub o: T,
    pub bl: T,
    pub d: T,
}

impl<T: Copy> Fields<T> {
    fn from_fn(mut f: impl FnMut(usize) -> T) -> Fields<T> {
        Fields { r: f(0), rb: f(1), t: f(2), tb: f(3), f: f(4), w: f(5), o: f(6), bl: f(7), d: f(8) }
    }

    fn get(&self, i: usize) -> T {
        [self.r, self.rb, self.t, self.tb, self.f, self.w, self.o, self.bl, self.d][i]
    }
}

impl Fields<i64> {
    fn of(m: &SkMem) -> Fields<i64> {
        let v = m.fields();
        Fields::from_fn(|i| v[i].1)
    }

    /// Bytes charged: `r + w + f` (as [`SkMem::held`]).
    pub fn held(&self) -> i64 {
        self.r + self.w + self.f
    }
}

/// Which end of the workload's connections a socket is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Opened by the workload's workers.
    Client,
    /// Accepted (or, for SCTP one-to-many, the one socket) of the in-process server.
    Server,
}

/// One socket over the samples it was seen in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SocketStat {
    pub role: Role,
    /// As `ss` names it, when first seen (for SCTP, the socket's state, not an association's).
    pub state: String,
    pub local: String,
    pub remote: String,
    /// 0 while the connection waited in the listener's accept queue.
    pub inode: u32,
    /// The kernel's socket cookie: what tells sockets apart (an unaccepted one has no inode yet).
    pub cookie: u64,
    /// SCTP associations on it when last seen (0 for TCP).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub associations: u32,
    pub samples: u64,
    pub max: Fields<i64>,
    pub mean: Fields<f64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One sample: the workload's sockets summed, beside the protocol's own count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds from the start of the window.
    pub t_s: f64,
    pub sockets: u64,
    pub sum: Fields<i64>,
    /// The protocol's memory_allocated at the same moment, bytes (sockstat `TCP: mem`, or the SCTP
    /// row of /proc/net/protocols, × page size): every socket of the protocol on the machine, not
    /// only these, and give or take what each CPU has not yet added to it (up to 1 MiB a CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto_mem_bytes: Option<u64>,
}

/// Over the whole window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Sockets seen.
    pub sockets: u64,
    /// Mean over sockets of each socket's mean: what one socket typically held.
    pub per_socket_mean: Fields<f64>,
    /// The largest any one socket held at a sample (over every socket seen, listed or not).
    pub per_socket_max: Fields<i64>,
    /// The largest sum over the sockets at a sample (each field's own peak).
    pub sum_max: Fields<i64>,
    /// The sum over the sockets, averaged over the samples.
    pub sum_mean: Fields<f64>,
    /// The largest charged sum — r + w + f over the sockets at one sample (`t` is data `w` holds).
    pub held_max: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto_mem_max_bytes: Option<u64>,
}

/// A workload's socket memory: see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SockMem {
    /// `tcp` or `sctp`.
    pub proto: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    pub interval_ms: u64,
    /// Dumps that came back.
    pub samples: u64,
    /// Dumps that failed; the first one's error is in `error`.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub failed_samples: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub summary: Summary,
    /// Every socket, in the order first seen (at most [`MAX_LISTED`]).
    pub sockets: Vec<SocketStat>,
    /// Sockets seen past [`MAX_LISTED`]: in the sums, not listed.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub not_listed: u64,
    pub series: Vec<Sample>,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Sockets listed one by one: two per worker at fraglab's 4096 workers, and the listener's few. A
/// tcp-crr run opens a connection per transaction; past this they are summed, not listed.
pub const MAX_LISTED: usize = 2 * 4096 + 16;

/// One socket's running figures, listed or not: the per-socket statistics cover every socket.
#[derive(Debug)]
struct Acc {
    samples: u64,
    max: Fields<i64>,
    total: Fields<i64>,
    /// Its place in `SockMem::sockets`, when listed.
    listed: Option<usize>,
}

/// Builds a [`SockMem`] sample by sample.
#[derive(Debug)]
pub struct Builder {
    rec: SockMem,
    proto: Proto,
    /// By socket cookie, every socket seen.
    seen: BTreeMap<u64, Acc>,
    sum_total: [i64; 9],
}

impl Builder {
    pub fn new(proto: Proto, family: Family, interval_ms: u64) -> Builder {
        let rec = SockMem {
            proto: proto.name().into(),
            family: family.key().into(),
            interval_ms,
            ..Default::default()
        };
        Builder { rec, proto, seen: BTreeMap::new(), sum_total: [0; 9] }
    }

    /// One dump's worth: the workload's sockets with their roles, at `t_s` into the window.
    pub fn add(&mut self, t_s: f64, sockets: &[(Role, Socket)], proto_mem_bytes: Option<u64>) {
        let mut sum = Fields::<i64>::default();
        for (role, s) in sockets {
            let v = Fields::of(&s.skmem);
            sum = Fields::from_fn(|i| sum.get(i) + v.get(i));
            match self.seen.get_mut(&s.cookie) {
                Some(a) => {
                    a.samples += 1;
                    a.max = Fields::from_fn(|k| a.max.get(k).max(v.get(k)));
                    a.total = Fields::from_fn(|k| a.total.get(k) + v.get(k));
                    if let Some(st) = a.listed.map(|i| &mut self.rec.sockets[i]) {
                        // Accepted since the last sample: it has a file now.
                        st.inode = s.inode;
                        st.associations = s.associations;
                    }
                }
                None => {
                    let listed = (self.rec.sockets.len() < MAX_LISTED).then(|| {
                        self.rec.sockets.push(SocketStat {
                            role: *role,
                            state: sock_diag::state_name(self.proto, false, s.state).into(),
                            local: s.local.to_string(),
                            remote: s.remote.to_string(),
                            inode: s.inode,
                            cookie: s.cookie,
                            associations: s.associations,
                            samples: 0,
                            max: v,
                            mean: Fields::default(),
                        });
                        self.rec.sockets.len() - 1
                    });
                    self.seen.insert(s.cookie, Acc { samples: 1, max: v, total: v, listed });
                }
            }
        }
        for (i, total) in self.sum_total.iter_mut().enumerate() {
            *total += sum.get(i);
        }
        let m = &mut self.rec.summary;
        // The first sample sets the peaks: a sum of forward allocations may be below zero.
        let first = self.rec.samples == 0;
        m.sum_max = Fields::from_fn(|i| if first { sum.get(i) } else { m.sum_max.get(i).max(sum.get(i)) });
        m.held_max = if first { sum.held() } else { m.held_max.max(sum.held()) };
        if let Some(b) = proto_mem_bytes {
            m.proto_mem_max_bytes = Some(m.proto_mem_max_bytes.unwrap_or(0).max(b));
        }
        self.rec.samples += 1;
        self.rec.series.push(Sample { t_s, sockets: sockets.len() as u64, sum, proto_mem_bytes });
    }

    /// A dump that failed; the first error is kept.
    pub fn failed(&mut self, error: String) {
        self.rec.failed_samples += 1;
        self.rec.error.get_or_insert(error);
    }

    pub fn finish(mut self) -> SockMem {
        let n = self.seen.len();
        let mut mean_sum = [0f64; 9];
        let mut max: Option<Fields<i64>> = None;
        for a in self.seen.values() {
            let mean = Fields::from_fn(|k| a.total.get(k) as f64 / a.samples as f64);
            for (k, acc) in mean_sum.iter_mut().enumerate() {
                *acc += mean.get(k);
            }
            max = Some(match max {
                None => a.max,
                Some(m) => Fields::from_fn(|k| m.get(k).max(a.max.get(k))),
            });
            if let Some(st) = a.listed.map(|i| &mut self.rec.sockets[i]) {
                (st.samples, st.max, st.mean) = (a.samples, a.max, mean);
            }
        }
        let m = &mut self.rec.summary;
        m.sockets = n as u64;
        if n > 0 {
            m.per_socket_mean = Fields::from_fn(|k| mean_sum[k] / n as f64);
        }
        m.per_socket_max = max.unwrap_or_default();
        let samples = self.rec.samples.max(1) as f64;
        m.sum_mean = Fields::from_fn(|k| self.sum_total[k] as f64 / samples);
        self.rec.not_listed = (n - self.rec.sockets.len()) as u64;
        self.rec
    }
}

impl SockMem {
    /// Two lines for a result's human summary: sockets and forward alloc per socket, then the sums
    /// beside the protocol's memory.
    pub fn summary_lines(&self) -> Vec<String> {
        let s = &self.summary;
        if self.samples == 0 {
            return vec![format!(
                "not sampled: {}",
                self.error.as_deref().unwrap_or("the window ended before the first sample")
            )];
        }
        let kib = |v: f64| signed_size(v.round() as i64);
        let mut out = vec![format!(
            "{} {} sockets ({}), {} samples every {} ms; per socket f mean {} max {}, w mean {}, r mean {}",
            s.sockets,
            self.proto,
            self.family,
            self.samples,
            self.interval_ms,
            kib(s.per_socket_mean.f),
            signed_size(s.per_socket_max.f),
            kib(s.per_socket_mean.w),
            kib(s.per_socket_mean.r),
        )];
        let mut line = format!(
            "sum over sockets: held (r+w+f) max {}, f max {}",
            signed_size(s.held_max),
            signed_size(s.sum_max.f)
        );
        if let Some(p) = s.proto_mem_max_bytes {
            line += &format!("; {} memory_allocated max {}", self.proto.to_uppercase(), format_size(p));
        }
        out.push(line);
        if self.failed_samples > 0 {
            out.push(format!(
                "{} samples failed: {}",
                self.failed_samples,
                self.error.as_deref().unwrap_or("?")
            ));
        }
        out
    }
}

/// A size that may be negative (a forward allocation below zero): `-4.00 KiB`.
pub fn signed_size(v: i64) -> String {
    let s = format_size(v.unsigned_abs());
    if v < 0 {
        format!("-{s}")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sock(cookie: u64, f: i32, r: u32) -> Socket {
        Socket {
            cookie,
            inode: cookie as u32 + 1000,
            state: 1,
            local: "[::1]:40000".parse().unwrap(),
            remote: "[::1]:12866".parse().unwrap(),
            associations: 0,
            skmem: SkMem { r, rb: 131072, t: 0, tb: 16384, f, w: 0, o: 0, bl: 0, d: 0 },
        }
    }

    #[test]
    fn per_socket_max_and_mean_and_sums_per_sample() {
        let mut b = Builder::new(Proto::Tcp, Family::V6, 250);
        b.add(0.25, &[(Role::Client, sock(1, 4096, 0)), (Role::Server, sock(2, 512, 1000))], Some(8192));
        b.add(0.5, &[(Role::Client, sock(1, 0, 0))], Some(4096));
        b.failed("netlink sock_diag (tcp, IPv6): boom".into());
        let m = b.finish();
        assert_eq!((m.samples, m.failed_samples, m.sockets.len()), (2, 1, 2));
        assert_eq!(m.error.as_deref(), Some("netlink sock_diag (tcp, IPv6): boom"));
        let c = &m.sockets[0];
        assert_eq!((c.role, c.samples, c.max.f, c.mean.f), (Role::Client, 2, 4096, 2048.0));
        let s = &m.sockets[1];
        assert_eq!((s.samples, s.max.r, s.mean.r), (1, 1000, 1000.0));
        assert_eq!(m.series[0].sum.f, 4608);
        assert_eq!(m.series[0].sum.rb, 2 * 131072);
        assert_eq!(m.series[1].sockets, 1);
        let sum = &m.summary;
        assert_eq!(sum.sockets, 2);
        assert_eq!(sum.per_socket_mean.f, (2048.0 + 512.0) / 2.0);
        assert_eq!(sum.per_socket_max.f, 4096);
        assert_eq!(sum.sum_max.f, 4608);
        assert_eq!(sum.sum_mean.f, (4608.0 + 0.0) / 2.0);
        assert_eq!(sum.held_max, 4608 + 1000);
        // Each socket's own figures, and the summary's, cover every socket seen.
        assert_eq!(sum.proto_mem_max_bytes, Some(8192));
        let lines = m.summary_lines();
        assert!(
            lines[0].starts_with("2 tcp sockets (ipv6), 2 samples every 250 ms; per socket f mean 1.25 KiB")
        );
        assert!(lines[1].contains("TCP memory_allocated max 8.00 KiB"), "{lines:?}");
        assert!(lines[2].starts_with("1 samples failed"));
        let back: SockMem = serde_json::from_value(serde_json::to_value(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn sockets_past_the_listing_limit_are_counted_not_listed() {
        let mut b = Builder::new(Proto::Tcp, Family::V4, 100);
        let mut many: Vec<(Role, Socket)> =
            (1..=(MAX_LISTED as u64 + 5)).map(|i| (Role::Client, sock(i, 1, 0))).collect();
        // The last, unlisted socket holds the most: the per-socket figures still see it.
        many.last_mut().unwrap().1.skmem.f = 9000;
        b.add(0.1, &many, None);
        let m = b.finish();
        assert_eq!(m.summary.per_socket_max.f, 9000);
        let n = MAX_LISTED as f64 + 5.0;
        assert!((m.summary.per_socket_mean.f - (n - 1.0 + 9000.0) / n).abs() < 1e-9);
        assert_eq!(
            (m.sockets.len(), m.not_listed, m.summary.sockets),
            (MAX_LISTED, 5, MAX_LISTED as u64 + 5)
        );
        assert_eq!(m.series[0].sum.f, MAX_LISTED as i64 + 4 + 9000);
    }

    /// SCTP charges received chunks before it schedules memory: a forward allocation below zero is
    /// kept as it is (seen in the 6.1 guest: the kernel's int sent as a u32, 4294963200), not read as
    /// 4 GiB, and the peaks start from the first sample, not from zero.
    #[test]
    fn a_forward_allocation_below_zero_stays_below_zero() {
        let mut b = Builder::new(Proto::Sctp, Family::V4, 100);
        b.add(0.1, &[(Role::Server, sock(7, -4096, 2000))], None);
        b.add(0.2, &[(Role::Server, sock(7, -8192, 0))], None);
        let m = b.finish();
        let s = &m.summary;
        assert_eq!((s.sum_max.f, s.per_socket_max.f, s.per_socket_mean.f), (-4096, -4096, -6144.0));
        assert_eq!(s.held_max, 2000 - 4096);
        assert!(m.summary_lines()[0].contains("f mean -6.00 KiB max -4.00 KiB"), "{:?}", m.summary_lines());
    }

    #[test]
    fn no_sample_says_why() {
        let mut b = Builder::new(Proto::Sctp, Family::V4, 100);
        b.failed("netlink sock_diag (sctp, IPv4): No such file or directory (os error 2)".into());
        let m = b.finish();
        assert_eq!(
            m.summary_lines(),
            ["not sampled: netlink sock_diag (sctp, IPv4): No such file or directory (os error 2)"]
        );
    }
}
