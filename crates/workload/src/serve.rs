//! `fraglab serve`: the server side of the socket workloads for a client on another host — the tcp
//! kinds' (`tcp::Server`) by default, the sctp kinds' ([`sctp::Server`]) with `--proto sctp`. These
//! are the servers the workloads start in-process when no `--peer` is given, so a remote client meets
//! the same code; here one runs on its own until SIGINT/SIGTERM or `--duration`, then says what it
//! served.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::opts::{self, Wording};
use crate::{sctp, tcp};
use fraglab_results::workload::ErrnoCount;
use fraglab_units::format_size;

/// `--listen` and `--duration` are refused in the tcp kinds' words, for either protocol; the SCTP
/// server's own flags in the sctp kinds' (they are resolved by [`sctp::ServeArgs::resolve`]).
const WORDING: Wording = Wording::Tcp;

/// `fraglab serve`: which protocol's server side, where, for how long, and SCTP's server options.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct ServeCommand {
    /// tcp: the server side of tcp-stream, tcp-rr and tcp-crr; sctp: of sctp-connect, sctp-stream and
    /// sctp-rr.
    #[arg(long, value_enum, default_value_t = Proto::Tcp)]
    pub proto: Proto,
    #[command(flatten)]
    pub common: ServeArgs,
    #[command(flatten, next_help_heading = "With --proto sctp")]
    pub sctp: sctp::ServeArgs,
}

/// The protocol `fraglab serve` serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    #[default]
    Tcp,
    Sctp,
}

/// The flags alone: `--proto tcp`.
impl From<ServeArgs> for ServeCommand {
    fn from(common: ServeArgs) -> ServeCommand {
        ServeCommand { common, ..Default::default() }
    }
}

/// `fraglab serve`'s flags for every protocol: where to listen and for how long.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (the one chosen is printed) [default:
    /// 0.0.0.0:12866, [::]:12866 with --ipv6].
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Listen on IPv6: [::]:12866 unless --listen says where (which must then be an IPv6 address).
    #[arg(long)]
    pub ipv6: bool,
    /// Stop after this long (default: until SIGINT or SIGTERM).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub duration: Option<String>,
}

/// netperf's netserver listens on 12865; fraglab one above.
const DEFAULT_LISTEN: &str = "0.0.0.0:12866";
/// The same port on every IPv6 address (and, unless net.ipv6.bindv6only is set, IPv4 too).
const DEFAULT_LISTEN6: &str = "[::]:12866";

/// `fraglab serve`: the server side for `--peer`, until SIGINT/SIGTERM or `--duration`. Every flag
/// is checked first; then, for `--proto sctp` on a kernel without SCTP, it says so and exits 125.
/// [`ServeArgs`] alone is `--proto tcp`.
pub fn serve(a: impl Into<ServeCommand>) -> Result<()> {
    let a = a.into();
    let c = &a.common;
    let listen = c.listen.as_deref().unwrap_or(if c.ipv6 { DEFAULT_LISTEN6 } else { DEFAULT_LISTEN });
    let addr = opts::address(WORDING, "--listen", listen, c.ipv6)?;
    let duration =
        a.common.duration.as_deref().map(|d| opts::duration(WORDING, "--duration", d)).transpose()?;
    let sctp = match a.proto {
        Proto::Sctp => Some(a.sctp.resolve()?),
        Proto::Tcp => match a.sctp.first_given() {
            Some(flag) => anyhow::bail!("{flag}: only with --proto sctp"),
            None => None,
        },
    };
    if sctp.is_some() {
        // No SCTP here is `Unsupported`: the binary says "could not test" (125).
        sctp::check_kernel()?;
    }
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while the server winds down ends fraglab at once (128 + the signal).
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&term))
            .context("installing a signal handler")?;
        signal_hook::flag::register(sig, Arc::clone(&term)).context("installing a signal handler")?;
    }
    let until = match duration {
        Some(d) => format!("for {}", humantime::format_duration(d)),
        None => "until SIGINT/SIGTERM".into(),
    };
    let wait = || {
        let start = Instant::now();
        while !term.load(Relaxed) && duration.is_none_or(|d| start.elapsed() < d) {
            std::thread::sleep(Duration::from_millis(50));
        }
        start
    };
    match sctp {
        Some(o) => serve_sctp(addr, o, &until, wait),
        None => serve_tcp(addr, &until, wait),
    }
}

/// `fraglab serve` (`--proto tcp`): [`tcp::Server`], the tcp kinds' own server, on `addr`.
fn serve_tcp(addr: SocketAddr, until: &str, wait: impl FnOnce() -> Instant) -> Result<()> {
    let server = tcp::Server::start(addr, 4).with_context(|| format!("listening on {addr}"))?;
    outln!("fraglab serve: listening on {} (tcp-stream, tcp-rr, tcp-crr) {until}", server.addr);
    let start = wait();
    // Running connections get 2 s to end.
    let rep = server.stop();
    let [stream, rr, crr] = rep.conns;
    outln!(
        "fraglab serve: {:.1} s, {} connections (stream {stream}, rr {rr}, crr {crr}), {} received, \
         {} transactions, {} bad headers",
        start.elapsed().as_secs_f64(),
        stream + rr + crr,
        format_size(rep.bytes),
        rep.transactions,
        rep.bad_headers
    );
    print_errors(&rep.errors);
    Ok(())
}

/// `fraglab serve --proto sctp`: [`sctp::Server`], the sctp kinds' own server, on `addr`.
fn serve_sctp(
    addr: SocketAddr,
    o: sctp::ServerOpts,
    until: &str,
    wait: impl FnOnce() -> Instant,
) -> Result<()> {
    let what = o.describe();
    let server = sctp::Server::start(addr, o).with_context(|| format!("listening on SCTP {addr}"))?;
    outln!(
        "fraglab serve: listening on {} (SCTP {what}: sctp-connect, sctp-stream, sctp-rr) {until}",
        server.addr()
    );
    let start = wait();
    // Open associations get up to 10 s to close; what is still open then is counted as unfinished.
    let rep = server.stop();
    outln!(
        "fraglab serve: {:.1} s, {} associations, {} messages ({}) received, {} replies, {} unfinished",
        start.elapsed().as_secs_f64(),
        rep.associations,
        rep.messages,
        format_size(rep.bytes),
        rep.replies,
        rep.unfinished
    );
    print_errors(&rep.errors);
    Ok(())
}

fn print_errors(errors: &[ErrnoCount]) {
    for e in errors {
        outln!("  error {} ({}) × {}, first at {:.3} s", e.errno, e.code, e.count, e.first_seen_s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct V {
        #[command(flatten)]
        a: ServeArgs,
    }

    #[test]
    fn serde_defaults_equal_clap_defaults() {
        assert_eq!(V::parse_from(["x"]).a, ServeArgs::default());
        let a: ServeArgs = toml::from_str("duration = \"5s\"").unwrap();
        assert_eq!(a, ServeArgs { duration: Some("5s".into()), ..Default::default() });
    }

    #[derive(Parser)]
    struct C {
        #[command(flatten)]
        a: ServeCommand,
    }

    #[test]
    fn serve_parses_both_protocols() {
        use sctp::Style;
        C::command().debug_assert();
        assert_eq!(C::parse_from(["x"]).a, ServeCommand::from(ServeArgs::default()));
        let a = C::parse_from([
            "x",
            "--proto",
            "sctp",
            "--listen",
            "127.0.0.1:9",
            "--streams",
            "65535",
            "--style",
            "one-to-many",
            "--rcvbuf",
            "1MiB",
        ])
        .a;
        assert_eq!(
            (a.proto, a.common.listen.as_deref(), a.common.duration),
            (Proto::Sctp, Some("127.0.0.1:9"), None)
        );
        assert_eq!((a.sctp.streams, a.sctp.style), (Some(65535), Some(Style::OneToMany)));
        assert_eq!((a.sctp.sndbuf, a.sctp.rcvbuf.as_deref()), (None, Some("1MiB")));
    }

    /// Every flag is checked before the kernel is asked for SCTP; without SCTP (this host) serve says
    /// so and exits 125, as the sctp workloads do.
    #[test]
    fn serve_checks_flags_then_the_kernel() {
        fn err(args: &[&str]) -> String {
            let a = C::try_parse_from([&["x"][..], args].concat()).unwrap().a;
            serve(a).unwrap_err().to_string()
        }
        fn sctp<'a>(more: &[&'a str]) -> Vec<&'a str> {
            [&["--proto", "sctp", "--listen", "127.0.0.1:0"][..], more].concat()
        }
        assert_eq!(err(&["--streams", "65535"]), "--streams: only with --proto sctp");
        assert_eq!(err(&["--sndbuf", "64KiB"]), "--sndbuf: only with --proto sctp");
        assert_eq!(
            err(&sctp(&["--streams", "0"])),
            "--streams 0: must be 1 to 65535 (SCTP stream numbers are 16-bit)"
        );
        assert_eq!(err(&sctp(&["--rcvbuf", "2GiB"])), "--rcvbuf 2GiB: a socket buffer is 1 byte to 1 GiB");
        assert_eq!(
            err(&sctp(&["--duration", "0s"])),
            "--duration: \"0s\" is zero; give a positive duration like 10s"
        );
        assert_eq!(
            err(&["--proto", "sctp", "--listen", "nohost"]),
            "--listen: \"nohost\" is not HOST:PORT (invalid socket address)"
        );
        assert_eq!(
            err(&["--ipv6", "--listen", "127.0.0.1:0", "--duration", "1s"]),
            "--listen: \"127.0.0.1:0\" has no IPv6 address and --ipv6 asks for one; write [ADDR]:PORT"
        );
        if !sctp::kernel_has_sctp() {
            let a = C::try_parse_from([&["x"][..], &sctp(&["--duration", "1s"])].concat()).unwrap().a;
            let e = serve(a).unwrap_err();
            assert!(e.downcast_ref::<crate::unsupported::Unsupported>().is_some(), "{e:#}");
        }
    }
}
