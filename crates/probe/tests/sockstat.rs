//! sockstat, sockstat6 and protocols on the real captures, the live system and fuzzed input.

mod common;
use common::{assert_names_line, mutated};
use std::net::{TcpListener, TcpStream};

use fraglab_probe::sockstat::{Protocols, SockStat, SockStatFile};
use fraglab_probe::Error;
use proptest::prelude::*;

const SOCKSTAT: &str = include_str!("captures/host-6.18/sockstat");
const SOCKSTAT6: &str = include_str!("captures/host-6.18/sockstat6");
const PROTOCOLS: &str = include_str!("captures/host-6.18/protocols");

#[test]
fn capture_sockstat() {
    let s = SockStatFile::parse(SOCKSTAT, "sockstat").unwrap();
    assert_eq!(s.lines.keys().collect::<Vec<_>>(), ["FRAG", "RAW", "TCP", "UDP", "UDPLITE", "sockets"]);
    assert_eq!(s.get("sockets", "used"), Some(9));
    let tcp: Vec<(&str, i64)> = s.lines["TCP"].iter().map(|(k, &v)| (k.as_str(), v)).collect();
    assert_eq!(tcp, [("alloc", 1), ("inuse", 1), ("mem", 95), ("orphan", 0), ("tw", 0)]);
    assert_eq!(s.get("UDP", "inuse"), Some(0));
    assert_eq!(s.get("UDP", "mem"), Some(0));
    assert_eq!(s.get("UDPLITE", "inuse"), Some(0));
    assert_eq!(s.get("UDPLITE", "mem"), None);
    assert_eq!(s.get("FRAG", "memory"), Some(0));
    assert_eq!(s.get("SCTP", "inuse"), None);

    let s6 = SockStatFile::parse(SOCKSTAT6, "sockstat6").unwrap();
    assert_eq!(s6.lines.keys().collect::<Vec<_>>(), ["FRAG6", "RAW6", "TCP6", "UDP6", "UDPLITE6"]);
    assert_eq!(s6.get("TCP6", "inuse"), Some(0));
    assert_eq!(s6.get("FRAG6", "memory"), Some(0));
    assert_eq!(s6.get("TCP6", "mem"), None);

    let all =
        SockStat { v4: s, v6: Some(s6), protocols: Some(Protocols::parse(PROTOCOLS, "protocols").unwrap()) };
    assert_eq!(all.sockets_used(), Some(9));
    assert_eq!(all.mem_pages("TCP"), Some(95));
    assert_eq!(all.sctp(), None, "this kernel has no sctp module loaded");
}

#[test]
fn capture_protocols() {
    let p = Protocols::parse(PROTOCOLS, "protocols").unwrap();
    assert_eq!(p.rows.len(), 18);
    let names: Vec<&str> = p.rows.iter().map(|r| r.protocol.as_str()).collect();
    assert_eq!(
        names,
        [
            "AF_VSOCK",
            "PACKET",
            "MPTCPv6",
            "PINGv6",
            "RAWv6",
            "UDPLITEv6",
            "UDPv6",
            "TCPv6",
            "XDP",
            "UNIX-STREAM",
            "UNIX",
            "UDP-Lite",
            "MPTCP",
            "PING",
            "RAW",
            "UDP",
            "TCP",
            "NETLINK"
        ]
    );
    let tcp = p.get("TCP").unwrap();
    assert_eq!(
        (tcp.size, tcp.sockets, tcp.memory_pages, tcp.pressure, tcp.maxhdr, tcp.slab, tcp.module.as_str()),
        (2304, 1, Some(95), Some(false), 192, true, "kernel")
    );
    let methods = "cl co di ac io in de sh ss gs se re bi br ha uh gp em";
    assert_eq!(tcp.methods.len(), 18);
    let flags: String = methods.split(' ').map(|m| if tcp.methods[m] { 'y' } else { 'n' }).collect();
    assert_eq!(flags, "yyyyyyyyyyyynyyyyy");
    // MPTCP and TCPv6 are charged to TCP's counter, hence the same 95 pages.
    assert_eq!(p.get("MPTCP").unwrap().memory_pages, Some(95));
    assert_eq!(p.get("TCPv6").unwrap().memory_pages, Some(95));
    // -1 means "not accounted", NI "no pressure flag".
    let vsock = p.get("AF_VSOCK").unwrap();
    assert_eq!((vsock.size, vsock.memory_pages, vsock.pressure, vsock.slab), (1240, None, None, true));
    let unix = p.get("UNIX-STREAM").unwrap();
    assert_eq!((unix.size, unix.sockets), (1152, 2));
    let udp = p.get("UDP").unwrap();
    assert_eq!((udp.memory_pages, udp.pressure, udp.maxhdr), (Some(0), None, 0));
    assert!(!p.get("PACKET").unwrap().slab);
}

/// What /proc/net/protocols looks like with sctp loaded; the row layout is the kernel's
/// proto_seq_printf, the numbers are made up (this VM has no sctp module to capture from).
#[test]
fn sctp_rows() {
    let header = PROTOCOLS.lines().next().unwrap();
    let text = format!(
        "{header}\n\
         SCTPv6    1632      2      31   no     172   yes  sctp        y  y  y  y  y  y  y  y  y  y  y  y  n  y  n  n  n  n\n\
         SCTP      1472      3      31   no     172   yes  sctp        y  y  y  y  y  y  y  y  y  y  y  y  n  y  n  n  n  n\n"
    );
    let p = Protocols::parse(&text, "p").unwrap();
    let all = SockStat { protocols: Some(p), ..Default::default() };
    assert_eq!(all.sctp(), Some((5, Some(31))));
}

#[test]
fn parse_errors_name_the_line() {
    for (bad, needle) in [
        ("TCP: inuse 1 orphan", "no value"),
        ("TCP: inuse x", "not a number"),
        ("TCP inuse 1", "label"),
        ("TCP: 1 2", "key name"),
        ("TCP:", "no \"key value\""),
        ("TCP: inuse 1 inuse 2", "twice"),
        ("UDP: inuse 1", "second time"),
    ] {
        let text = SOCKSTAT.replacen("TCP: inuse 1 orphan 0 tw 0 alloc 1 mem 95", bad, 1);
        let err = SockStatFile::parse(&text, "ss").unwrap_err();
        assert_names_line(&err, "ss", &text);
        let line = if needle == "second time" { 3 } else { 2 };
        assert!(matches!(err, Error::Parse { line: l, .. } if l == line), "{err}");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }

    let tcp = "TCP       2304      1      95   no     192   yes  kernel      y  y  y  y  y  y  y  y  y  y  y  y  n  y  y  y  y  y";
    let tcp_line = PROTOCOLS.lines().position(|l| l == tcp).unwrap() + 1;
    for (bad, needle) in [
        (tcp.replacen("95", "lots", 1), "memory"),
        (tcp.replacen(" no ", " maybe ", 1), "press"),
        (tcp.replacen(" yes ", " perhaps ", 1), "slab"),
        (tcp.replacen("  n  ", "  q  ", 1), "bi"),
        (tcp.strip_suffix("  y").unwrap().to_string(), "columns"),
        (tcp.replacen("2304", "-2304", 1), "size"),
    ] {
        let text = PROTOCOLS.replacen(tcp, &bad, 1);
        let err = Protocols::parse(&text, "pr").unwrap_err();
        assert_names_line(&err, "pr", &text);
        assert!(matches!(err, Error::Parse { line: l, .. } if l == tcp_line), "{err}");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    let err = Protocols::parse(&PROTOCOLS.replacen("protocol", "proto", 1), "pr").unwrap_err();
    assert!(matches!(err, Error::Parse { line: 1, .. }), "{err}");
    let err = Protocols::parse("", "pr").unwrap_err();
    assert!(matches!(err, Error::Parse { line: 1, .. }), "{err}");
}

/// A listener, a client and the accepted socket are three TCP sockets in our namespace: `inuse` in
/// sockstat and `sockets` in protocols must both go up by at least 3 while they exist. Retried since
/// another process may close TCP sockets at the same moment.
#[test]
fn live_sockstat_sees_our_tcp_sockets() {
    let tcp_counts = |s: &SockStat| {
        (
            s.v4.get("TCP", "inuse").unwrap(),
            s.protocols.as_ref().and_then(|p| p.get("TCP")).map(|r| r.sockets),
        )
    };
    let mut last = String::new();
    for _ in 0..10 {
        let before = SockStat::read().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let during = SockStat::read().unwrap();
        drop((client, server, listener));

        assert!(before.sockets_used().is_some() && before.mem_pages("TCP").is_some());
        assert!(before.v6.as_ref().is_some_and(|v6| v6.get("TCP6", "inuse").is_some()));
        let ((inuse0, proto0), (inuse1, proto1)) = (tcp_counts(&before), tcp_counts(&during));
        let protocols_ok = match (proto0, proto1) {
            (Some(a), Some(b)) => b >= a + 3,
            _ => true,
        };
        if inuse1 >= inuse0 + 3 && protocols_ok {
            return;
        }
        last = format!("TCP inuse {inuse0} -> {inuse1}, protocols TCP sockets {proto0:?} -> {proto1:?}");
    }
    panic!("never saw our 3 TCP sockets: {last}");
}

proptest! {
    #[test]
    fn arbitrary_input_never_panics(text in "\\PC*(\n\\PC*){0,5}") {
        if let Err(e) = SockStatFile::parse(&text, "arb") { assert_names_line(&e, "arb", &text) }
        if let Err(e) = Protocols::parse(&text, "arb") { assert_names_line(&e, "arb", &text) }
    }

    #[test]
    fn token_input_never_panics(body in prop::collection::vec(prop::collection::vec(
        prop_oneof![Just("TCP:"), Just("inuse"), Just("mem"), Just("1"), Just("-1"), Just("NI"), Just("yes"),
                    Just("y"), Just("n"), Just("kernel"), Just("99999999999999999999")], 0..12), 0..10)) {
        let body = body.iter().map(|l| l.join(" ")).collect::<Vec<_>>().join("\n");
        if let Err(e) = SockStatFile::parse(&body, "tok") { assert_names_line(&e, "tok", &body) }
        let header = PROTOCOLS.lines().next().unwrap();
        let text = format!("{header}\n{body}");
        if let Err(e) = Protocols::parse(&text, "tok") { assert_names_line(&e, "tok", &text) }
    }

    #[test]
    fn mutated_sockstat_never_panics(text in mutated(SOCKSTAT)) {
        if let Err(e) = SockStatFile::parse(&text, "mut") { assert_names_line(&e, "mut", &text) }
    }

    #[test]
    fn mutated_protocols_never_panics(text in mutated(PROTOCOLS)) {
        if let Err(e) = Protocols::parse(&text, "mut") { assert_names_line(&e, "mut", &text) }
    }
}
