//! Option checks shared by the socket workloads ([`super::tcp`], [`super::sctp`]): worker counts,
//! durations, message sizes, socket buffer sizes and `--peer` addresses, each parsed and range-checked
//! here, once, before any socket is opened — plus the serde helper that lets configs write a size as
//! a number or a string.
//!
//! The two families word a refusal differently and those texts stay as they are: tests,
//! docs/workloads.md and users' scripts match them. [`Wording::Tcp`] names the flag and quotes the
//! value inside the sentence (`--msg: "0" is 0 bytes; give at least 1 byte`); [`Wording::Sctp`] puts
//! flag and value first (`--msg 0: a message is 1 byte to 16 MiB`). What is checked, and in which
//! order, is the same for both.

use std::fmt::Display;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::{anyhow, Result};
use serde::{Deserialize, Deserializer};

use fraglab_units::{format_size, parse_duration, parse_size};

/// How a family of workloads words its option errors (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wording {
    /// `--flag: why`, the value quoted in `why` where it helps: tcp-stream, tcp-rr, tcp-crr, serve.
    Tcp,
    /// `--flag value: why`: sctp-connect, sctp-stream, sctp-rr.
    Sctp,
}

impl Wording {
    /// The error for `flag` given as `text`, refused because of `why`.
    fn refuse(self, flag: &str, text: &str, why: impl Display) -> anyhow::Error {
        match self {
            Wording::Tcp => anyhow!("{flag}: {why}"),
            Wording::Sctp => anyhow!("{flag} {text}: {why}"),
        }
    }
}

/// A number of workers — threads, clients, concurrent associations: 1 to `max`.
pub(crate) fn count(w: Wording, flag: &str, n: u64, max: u64) -> Result<usize> {
    if (1..=max).contains(&n) {
        return Ok(n as usize);
    }
    let why = match (w, n) {
        (Wording::Tcp, 0) => "0 is not allowed; give 1 or more".to_string(),
        (Wording::Tcp, _) => format!("{n} is more than the {max} fraglab allows"),
        (Wording::Sctp, 0) => "must be at least 1".to_string(),
        (Wording::Sctp, _) => format!("at most {max}"),
    };
    Err(w.refuse(flag, &n.to_string(), why))
}

/// A duration above zero, as humans write it (`10s`, `500ms`, `2m`).
pub(crate) fn duration(w: Wording, flag: &str, text: &str) -> Result<Duration> {
    let d = parse_duration(text).map_err(|e| w.refuse(flag, text, e))?;
    if d.is_zero() {
        let why = match w {
            Wording::Tcp => format!("{text:?} is zero; give a positive duration like 10s"),
            Wording::Sctp => "must be longer than zero".to_string(),
        };
        return Err(w.refuse(flag, text, why));
    }
    Ok(d)
}

/// A message, request or response size in binary units (`1452`, `64KiB`): 1 byte to `max`.
pub(crate) fn msg_size(w: Wording, flag: &str, text: &str, max: u64) -> Result<usize> {
    let n = parse_size(text).map_err(|e| w.refuse(flag, text, e))?;
    if (1..=max).contains(&n) {
        return Ok(n as usize);
    }
    let why = match (w, n) {
        (Wording::Tcp, 0) => format!("{text:?} is 0 bytes; give at least 1 byte"),
        (Wording::Tcp, _) => format!("{text:?} is more than {} per message", format_size(max)),
        (Wording::Sctp, _) => format!("a message is 1 byte to {}", whole_size(max)),
    };
    Err(w.refuse(flag, text, why))
}

/// `--sndbuf` / `--rcvbuf` when given: 1 byte to `max` (absent: the kernel's autotuning).
pub(crate) fn sockbuf(w: Wording, flag: &str, text: Option<&str>, max: u64) -> Result<Option<u64>> {
    let Some(text) = text else { return Ok(None) };
    let n = parse_size(text).map_err(|e| w.refuse(flag, text, e))?;
    if (1..=max).contains(&n) {
        return Ok(Some(n));
    }
    let why = match (w, n) {
        (Wording::Tcp, 0) => format!("{text:?} is 0 bytes; leave the flag out for the kernel's autotuning"),
        (Wording::Tcp, _) => {
            format!("{text:?} is more than {} (the kernel doubles an int)", format_size(max))
        }
        (Wording::Sctp, _) => format!("a socket buffer is 1 byte to {}", whole_size(max)),
    };
    Err(w.refuse(flag, text, why))
}

/// `HOST:PORT` (`HOST` may be a name): the first address it resolves to — with `ipv6`, the first
/// IPv6 one. Port 0 is allowed here — `fraglab serve --listen 127.0.0.1:0` picks a free port;
/// [`peer`] refuses it.
pub(crate) fn address(w: Wording, flag: &str, text: &str, ipv6: bool) -> Result<SocketAddr> {
    let addrs = text.to_socket_addrs().map_err(|e| {
        let why = match w {
            Wording::Tcp => format!("{text:?} is not HOST:PORT ({e})"),
            Wording::Sctp => format!("{e}; write HOST:PORT, e.g. 10.0.0.2:9000"),
        };
        w.refuse(flag, text, why)
    })?;
    let mut addrs = addrs.peekable();
    let any = addrs.peek().is_some();
    addrs.find(|a| !ipv6 || a.is_ipv6()).ok_or_else(|| {
        let why = match (w, any) {
            (Wording::Tcp, false) => format!("{text:?} resolves to no address"),
            (Wording::Sctp, false) => "the name has no address".to_string(),
            (Wording::Tcp, true) => {
                format!("{text:?} has no IPv6 address and --ipv6 asks for one; write [ADDR]:PORT")
            }
            (Wording::Sctp, true) => {
                "no IPv6 address, and --ipv6 asks for one; write [ADDR]:PORT".to_string()
            }
        };
        w.refuse(flag, text, why)
    })
}

/// `--peer HOST:PORT` when given: a server to talk to instead of the in-process one; port 0 refused,
/// and with `--ipv6` an IPv6 address.
pub(crate) fn peer(w: Wording, text: Option<&str>, ipv6: bool) -> Result<Option<SocketAddr>> {
    let Some(text) = text else { return Ok(None) };
    let a = address(w, "--peer", text, ipv6)?;
    if a.port() == 0 {
        let why = match w {
            Wording::Tcp => format!("{text:?} has port 0; give the port `fraglab serve` printed"),
            Wording::Sctp => "needs a port".to_string(),
        };
        return Err(w.refuse("--peer", text, why));
    }
    Ok(Some(a))
}

/// A limit written as people write it: `16 MiB`, `1 GiB` (whole units; [`format_size`] otherwise).
fn whole_size(n: u64) -> String {
    match n {
        _ if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        _ if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        _ if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        _ => format_size(n),
    }
}

/// A size as configs may write it: `msg = 1452` or `msg = "64KiB"`, kept as text so the checks above
/// see what the user wrote. For `#[serde(deserialize_with = "size_text")]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeText {
    Number(u64),
    Text(String),
}

impl SizeText {
    fn into_string(self) -> String {
        match self {
            SizeText::Number(n) => n.to_string(),
            SizeText::Text(s) => s,
        }
    }
}

/// Deserialize a size option (number or string) into its text.
pub(crate) fn size_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(SizeText::deserialize(d)?.into_string())
}

/// [`size_text`] for an optional size (`sndbuf`, `rcvbuf`).
pub(crate) fn opt_size_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<SizeText>::deserialize(d)?.map(SizeText::into_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal text of both wordings, exactly as it was before the checks moved here; tests,
    /// docs/workloads.md and users' scripts match them.
    #[test]
    fn refusals_keep_their_words() {
        use crate::{sctp, serve, tcp, validate, Kind};
        let ts = |f: fn(&mut tcp::StreamArgs)| {
            let mut a = tcp::StreamArgs::default();
            f(&mut a);
            Kind::TcpStream(a)
        };
        let tr = |f: fn(&mut tcp::RrArgs)| {
            let mut a = tcp::RrArgs::default();
            f(&mut a);
            Kind::TcpRr(a)
        };
        let sc = |f: fn(&mut sctp::ConnectArgs)| {
            let mut a = sctp::ConnectArgs::default();
            f(&mut a);
            Kind::SctpConnect(a)
        };
        let ss = |f: fn(&mut sctp::StreamArgs)| {
            let mut a = sctp::StreamArgs::default();
            f(&mut a);
            Kind::SctpStream(a)
        };
        let sr = |f: fn(&mut sctp::RrArgs)| {
            let mut a = sctp::RrArgs::default();
            f(&mut a);
            Kind::SctpRr(a)
        };
        let cases = [
            (ts(|a| a.threads = 0), "--threads: 0 is not allowed; give 1 or more"),
            (ts(|a| a.threads = 4097), "--threads: 4097 is more than the 4096 fraglab allows"),
            (tr(|a| a.clients = 0), "--clients: 0 is not allowed; give 1 or more"),
            (
                ts(|a| a.duration = "-1s".into()),
                "--duration: \"-1s\" is not a duration (expected number at 0); write e.g. 1s, 500ms, 2m",
            ),
            (ts(|a| a.duration = "0ms".into()), "--duration: \"0ms\" is zero; give a positive duration like 10s"),
            (ts(|a| a.msg = "0".into()), "--msg: \"0\" is 0 bytes; give at least 1 byte"),
            (ts(|a| a.msg = "65MiB".into()), "--msg: \"65MiB\" is more than 64.00 MiB per message"),
            (tr(|a| a.resp = "zz".into()), "--resp: \"zz\" is not a size: write e.g. 512MiB, 4GiB, 1048576"),
            (
                ts(|a| a.sndbuf = Some("1KB".into())),
                "--sndbuf: \"1KB\": write binary units (KiB) — fraglab does not guess whether KB means 1000 or \
                 1024",
            ),
            (
                ts(|a| a.rcvbuf = Some("0".into())),
                "--rcvbuf: \"0\" is 0 bytes; leave the flag out for the kernel's autotuning",
            ),
            (
                tr(|a| a.sndbuf = Some("1073741824".into())),
                "--sndbuf: \"1073741824\" is more than 1024.00 MiB (the kernel doubles an int)",
            ),
            (ts(|a| a.peer = Some("nohost".into())), "--peer: \"nohost\" is not HOST:PORT (invalid socket address)"),
            (
                tr(|a| a.peer = Some("[::1]:0".into())),
                "--peer: \"[::1]:0\" has port 0; give the port `fraglab serve` printed",
            ),
            (sc(|a| a.associations = 0), "--associations 0: must be at least 1"),
            (sc(|a| a.concurrency = 4097), "--concurrency 4097: at most 4096"),
            (ss(|a| a.threads = 0), "--threads 0: must be at least 1"),
            (sr(|a| a.clients = 4097), "--clients 4097: at most 4096"),
            (sc(|a| a.streams = 70000), "--streams 70000: must be 1 to 65535 (SCTP stream numbers are 16-bit)"),
            (
                sc(|a| a.timeout = "soon".into()),
                "--timeout soon: \"soon\" is not a duration (expected number at 0); write e.g. 1s, 500ms, 2m",
            ),
            (sc(|a| a.timeout = "0s".into()), "--timeout 0s: must be longer than zero"),
            (sr(|a| a.duration = "0s".into()), "--duration 0s: must be longer than zero"),
            (ss(|a| a.msg = "0".into()), "--msg 0: a message is 1 byte to 16 MiB"),
            (sr(|a| a.resp = "17MiB".into()), "--resp 17MiB: a message is 1 byte to 16 MiB"),
            (
                sr(|a| a.req = "12KB".into()),
                "--req 12KB: \"12KB\": write binary units (KiB) — fraglab does not guess whether KB means 1000 \
                 or 1024",
            ),
            (ss(|a| a.sndbuf = Some("0".into())), "--sndbuf 0: a socket buffer is 1 byte to 1 GiB"),
            (ss(|a| a.rcvbuf = Some("2GiB".into())), "--rcvbuf 2GiB: a socket buffer is 1 byte to 1 GiB"),
            (
                sc(|a| a.peer = Some("127.0.0.1".into())),
                "--peer 127.0.0.1: invalid socket address; write HOST:PORT, e.g. 10.0.0.2:9000",
            ),
            (ss(|a| a.peer = Some("127.0.0.1:0".into())), "--peer 127.0.0.1:0: needs a port"),
            (
                ts(|a| (a.ipv6, a.peer) = (true, Some("127.0.0.1:9".into()))),
                "--peer: \"127.0.0.1:9\" has no IPv6 address and --ipv6 asks for one; write [ADDR]:PORT",
            ),
            (
                sr(|a| (a.ipv6, a.peer) = (true, Some("127.0.0.1:9".into()))),
                "--peer 127.0.0.1:9: no IPv6 address, and --ipv6 asks for one; write [ADDR]:PORT",
            ),
        ];
        for (kind, want) in cases {
            assert_eq!(validate(&kind).unwrap_err().to_string(), want);
        }
        let serve = |listen: &str, duration: &str| {
            let a = serve::ServeArgs {
                listen: Some(listen.into()),
                ipv6: false,
                duration: Some(duration.into()),
            };
            serve::serve(a).unwrap_err().to_string()
        };
        assert_eq!(serve("nohost", "1s"), "--listen: \"nohost\" is not HOST:PORT (invalid socket address)");
        assert_eq!(
            serve("127.0.0.1:0", "0s"),
            "--duration: \"0s\" is zero; give a positive duration like 10s"
        );
    }

    #[test]
    fn limits_read_as_written() {
        assert_eq!(whole_size(16 << 20), "16 MiB");
        assert_eq!(whole_size(1 << 30), "1 GiB");
        assert_eq!(whole_size(64 << 10), "64 KiB");
        assert_eq!(whole_size(1000), "1000 B");
    }

    #[test]
    fn both_wordings_check_the_same_ranges() {
        for w in [Wording::Tcp, Wording::Sctp] {
            assert_eq!(count(w, "--n", 4096, 4096).unwrap(), 4096);
            assert!(count(w, "--n", 0, 4096).is_err() && count(w, "--n", 4097, 4096).is_err());
            assert_eq!(duration(w, "--d", "1ms").unwrap(), Duration::from_millis(1));
            assert!(duration(w, "--d", "0s").is_err());
            assert_eq!(msg_size(w, "--m", "16MiB", 16 << 20).unwrap(), 16 << 20);
            assert!(msg_size(w, "--m", "0", 16 << 20).is_err());
            assert_eq!(sockbuf(w, "--b", None, 1 << 30).unwrap(), None);
            assert_eq!(sockbuf(w, "--b", Some("1GiB"), 1 << 30).unwrap(), Some(1 << 30));
            assert!(sockbuf(w, "--b", Some("0"), 1 << 30).is_err());
            assert_eq!(address(w, "--listen", "127.0.0.1:0", false).unwrap().port(), 0);
            assert!(peer(w, Some("127.0.0.1:0"), false).is_err());
            assert_eq!(peer(w, Some("[::1]:9"), false).unwrap(), Some("[::1]:9".parse().unwrap()));
            assert_eq!(peer(w, Some("[::1]:9"), true).unwrap(), Some("[::1]:9".parse().unwrap()));
            assert!(peer(w, Some("127.0.0.1:9"), true).is_err());
        }
    }
}
