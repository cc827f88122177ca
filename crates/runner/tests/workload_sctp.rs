//! The SCTP workloads. On a kernel with SCTP (the `fraglab vm` guest) they run for real against the
//! in-process server on loopback; on a kernel without it (a host whose kernel lacks the sctp module)
//! they print why and skip — except the tests of what a user sees there: the EPROTONOSUPPORT error,
//! and bad options refused before any socket is opened.
//!
//! Which run covers which: on the CI host (no SCTP) the tests of the no-SCTP error run and the SCTP
//! tests skip; `vm.rs`'s `the_sctp_workload_tests_run_in_the_guest` runs this binary in a guest that
//! has SCTP, where the SCTP tests run and only the no-SCTP error's test skips. Both runs are under
//! `FRAGLAB_REQUIRE_ALL=1`, and each names the kind of kernel the other covers in
//! `FRAGLAB_COVERED_ELSEWHERE` (scripts/test: `sctp`; vm.rs: `no-sctp`), so these skips — and no
//! others — are allowed there.
//!
//! In a guest, run this test binary directly; set FRAGLAB_BIN to the `fraglab` binary's path when it
//! is not where cargo built it.

use std::path::PathBuf;
use std::process::{Command, Output};

use fraglab_results::workload::WorkloadResult;
use fraglab_workload::sctp::{self, ConnectArgs, RrArgs, StreamArgs, Style};

mod common;

/// Try `socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)` the way a user's kernel would answer it.
fn kernel_has_sctp() -> bool {
    // SAFETY: plain syscalls on an fd this function owns.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
    if fd >= 0 {
        unsafe { libc::close(fd) };
        return true;
    }
    let e = std::io::Error::last_os_error();
    assert_eq!(e.raw_os_error(), Some(libc::EPROTONOSUPPORT), "socket(IPPROTO_SCTP) failed oddly: {e}");
    false
}

/// True when the test should run; skips otherwise (see the module's comment for who covers it).
fn sctp_or_skip() -> bool {
    let has = kernel_has_sctp();
    if !has {
        common::skip_covered_elsewhere(
            "sctp",
            "this kernel has no SCTP (EPROTONOSUPPORT)",
            "vm.rs the_sctp_workload_tests_run_in_the_guest (a guest with SCTP)",
        );
    }
    has
}

fn fraglab_bin() -> PathBuf {
    std::env::var_os("FRAGLAB_BIN").map(PathBuf::from).unwrap_or_else(|| env!("CARGO_BIN_EXE_fraglab").into())
}

fn fraglab(args: &[&str]) -> Output {
    let bin = fraglab_bin();
    Command::new(&bin).args(args).output().unwrap_or_else(|e| panic!("running {}: {e}", bin.display()))
}

fn detail(r: &WorkloadResult, key: &str) -> serde_json::Value {
    r.details.get(key).cloned().unwrap_or_else(|| panic!("details.{key} missing: {:#?}", r.details))
}

#[test]
fn no_sctp_gives_a_clear_error() {
    if kernel_has_sctp() {
        return common::skip_covered_elsewhere(
            "no-sctp",
            "this kernel has SCTP, so the EPROTONOSUPPORT error cannot be seen here",
            "the host's run of this binary (a kernel without SCTP, as on the CI machine)",
        );
    }
    for args in [
        &["workload", "sctp-connect", "--associations", "1"][..],
        &["workload", "sctp-connect", "--style", "one-to-many", "--json"],
        &["workload", "sctp-stream", "--duration", "1s"],
        &["workload", "sctp-rr", "--duration", "1s"],
    ] {
        let out = fraglab(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded without SCTP: {stderr}");
        assert!(stderr.contains(sctp::NO_SCTP), "{args:?}: {stderr}");
        assert!(stderr.contains("modprobe sctp") && stderr.contains("fraglab vm"), "{stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed a result: {}", String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn bad_options_are_refused_before_any_socket() {
    for (args, want) in [
        (&["workload", "sctp-connect", "--streams", "0"][..], "--streams 0: must be 1 to 65535"),
        (&["workload", "sctp-connect", "--streams", "70000"], "--streams 70000: must be 1 to 65535"),
        (&["workload", "sctp-connect", "--associations", "0"], "--associations 0: must be at least 1"),
        (&["workload", "sctp-connect", "--timeout", "soon"], "--timeout soon:"),
        (&["workload", "sctp-stream", "--msg", "0"], "--msg 0:"),
        (&["workload", "sctp-stream", "--duration", "0s"], "--duration 0s:"),
        (&["workload", "sctp-rr", "--resp", "1GB"], "--resp 1GB:"),
        (&["workload", "sctp-rr", "--clients", "0"], "--clients 0: must be at least 1"),
    ] {
        let out = fraglab(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(want), "{args:?}: want {want:?} in {stderr:?}");
        assert!(!stderr.contains("EPROTONOSUPPORT"), "{args:?} opened a socket before validating: {stderr}");
    }
    // The library refuses the same way (configs come in through it).
    let e = sctp::connect(&ConnectArgs { streams: 70000, ..Default::default() }).unwrap_err();
    assert!(e.to_string().starts_with("--streams 70000:"), "{e}");
    let e = sctp::connect(&ConnectArgs { associations: 0, ..Default::default() }).unwrap_err();
    assert!(e.to_string().starts_with("--associations 0:"), "{e}");
}

#[test]
fn connect_negotiates_65535_streams() {
    if !sctp_or_skip() {
        return;
    }
    let r = sctp::connect(&ConnectArgs { associations: 10, streams: 65535, ..Default::default() }).unwrap();
    assert_eq!((r.kind.as_str(), r.ok, r.failed), ("sctp-connect", 10, 0), "{r:#?}");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(detail(&r, "sstat_instrms"), 65535);
    assert_eq!(detail(&r, "sstat_outstrms"), 65535);
    assert_eq!(detail(&r, "sstat_association"), 0);
    assert_eq!(detail(&r, "associations_with_fewer_streams"), 0);
    assert_eq!(detail(&r, "server_associations"), 10);
    assert_eq!(r.latency_us.as_ref().unwrap().count, 10);
    assert_eq!(r.params["streams"], 65535);
}

#[test]
fn connect_json_from_the_binary() {
    if !sctp_or_skip() {
        return;
    }
    let out = fraglab(&["workload", "sctp-connect", "--associations", "10", "--streams", "65535", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: WorkloadResult = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((r.ok, r.failed), (10, 0));
    assert_eq!((detail(&r, "sstat_instrms"), detail(&r, "sstat_outstrms")), (65535.into(), 65535.into()));
}

#[test]
fn connect_one_to_many_concurrently() {
    if !sctp_or_skip() {
        return;
    }
    let a = ConnectArgs { associations: 6, concurrency: 3, style: Style::OneToMany, ..Default::default() };
    let r = sctp::connect(&a).unwrap();
    assert_eq!((r.ok, r.failed), (6, 0), "{r:#?}");
    assert_eq!(detail(&r, "style"), "one-to-many");
    assert_eq!((detail(&r, "sstat_instrms"), detail(&r, "sstat_outstrms")), (65535.into(), 65535.into()));
    assert_eq!(detail(&r, "server_associations"), 6);
    // Each association was set up by a 1-byte message on stream 0.
    assert_eq!(detail(&r, "server_messages"), 6);
    assert_eq!(r.latency_us.as_ref().unwrap().count, 6);
}

#[test]
fn connect_sends_a_message_on_every_stream() {
    if !sctp_or_skip() {
        return;
    }
    let a = ConnectArgs { associations: 2, streams: 65535, message_per_stream: true, ..Default::default() };
    let r = sctp::connect(&a).unwrap();
    assert_eq!((r.ok, r.failed), (2, 0), "{r:#?}");
    assert_eq!(detail(&r, "messages_sent"), 2 * 65535);
    assert_eq!(detail(&r, "messages_failed"), 0);
    assert_eq!(detail(&r, "server_messages"), 2 * 65535, "the server saw every message");
    assert_eq!(r.bytes, 2 * 65535);

    let a = ConnectArgs { style: Style::OneToMany, streams: 300, ..a };
    let r = sctp::connect(&a).unwrap();
    assert_eq!((r.ok, r.failed), (2, 0), "{r:#?}");
    assert_eq!(detail(&r, "messages_sent"), 600);
    assert_eq!(detail(&r, "server_messages"), 602, "600 per-stream messages and 2 set-up messages");
}

#[test]
fn stream_moves_bytes() {
    if !sctp_or_skip() {
        return;
    }
    let a =
        StreamArgs { threads: 2, duration: "1s".into(), sndbuf: Some("256KiB".into()), ..Default::default() };
    let t = std::time::Instant::now();
    let r = sctp::stream(&a).unwrap();
    let took = t.elapsed();
    assert_eq!(r.kind, "sctp-stream");
    assert!(r.bytes > 0 && r.ok > 0 && r.failed == 0, "{r:#?}");
    assert_eq!(r.bytes, r.ok * 12000);
    assert_eq!(detail(&r, "server_bytes"), r.bytes, "the server received every byte sent");
    assert!(r.throughput_mbit.unwrap() > 0.0);
    assert!(r.per_worker.as_ref().unwrap().min > 0.0, "both threads moved data: {:?}", r.per_worker);
    // It ran the 1 s asked for, and the window it reports lies within the call (not a time limit:
    // a TCG guest is slow).
    assert!(r.duration_s >= 0.9 && r.duration_s <= took.as_secs_f64(), "{} in {took:?}", r.duration_s);
    let cpu = r.cpu.as_ref().unwrap();
    assert!(cpu.util_pct > 0.0 && cpu.service_demand_us_per_kb.unwrap() > 0.0, "{cpu:?}");

    let r = sctp::stream(&StreamArgs { style: Style::OneToMany, msg: "1452".into(), ..a }).unwrap();
    assert!(r.bytes > 0 && r.failed == 0, "{r:#?}");
    // Plus the one set-up message per thread.
    assert_eq!(detail(&r, "server_bytes"), r.bytes + 2 * 1452);
}

#[test]
fn rr_counts_transactions() {
    if !sctp_or_skip() {
        return;
    }
    for style in [Style::OneToOne, Style::OneToMany] {
        let a =
            RrArgs { clients: 2, duration: "1s".into(), style, resp: "2000".into(), ..Default::default() };
        let r = sctp::rr(&a).unwrap();
        assert_eq!(r.kind, "sctp-rr");
        assert!(r.ok > 0 && r.failed == 0, "{style:?}: {r:#?}");
        let lat = r.latency_us.as_ref().unwrap();
        assert_eq!(lat.count, r.ok, "one latency sample per transaction");
        assert!(lat.min <= lat.p50 && lat.p50 <= lat.p99 && lat.p99 <= lat.max, "{lat:?}");
        assert_eq!(detail(&r, "transactions"), r.ok);
        assert!(r.ops_per_sec.unwrap() > 0.0);
        assert_eq!(r.per_worker.as_ref().map(|s| s.min > 0.0), Some(true), "both clients transacted");
        let extra = if style == Style::OneToMany { 2 } else { 0 }; // the set-up transactions
        assert_eq!(detail(&r, "server_replies"), r.ok + extra);
    }
}

/// Each SCTP socket's memory, sampled through sctp_diag, over IPv6 in both styles: one-to-one is a
/// client and an accepted socket per thread; one-to-many is a socket per client and the server's one
/// socket carrying every association. tb is what getsockopt read back (`sndbuf_bytes`) on every
/// socket; an SCTP socket's forward allocation may be below zero (it charges received chunks before
/// scheduling memory for them) and is kept signed.
#[test]
fn skmem_of_both_styles_over_ipv6() {
    if !sctp_or_skip() {
        return;
    }
    for (style, threads, sockets) in [(Style::OneToOne, 2, 4), (Style::OneToMany, 3, 4)] {
        let a = StreamArgs {
            threads,
            duration: "1500ms".into(),
            sndbuf: Some("96KiB".into()),
            style,
            ipv6: true,
            ..Default::default()
        };
        let r = sctp::stream(&a).unwrap();
        assert!(r.bytes > 0 && r.failed == 0, "{style:?}: {r:#?}");
        let server = detail(&r, "server").as_str().unwrap().to_string();
        assert!(server.contains("[::1]:"), "{server}");
        let m = r.skmem.as_ref().expect("skmem sampled");
        assert_eq!((m.proto.as_str(), m.family.as_str(), m.failed_samples), ("sctp", "ipv6", 0), "{m:#?}");
        assert!(m.samples >= 5, "{m:#?}");
        assert_eq!(m.summary.sockets, sockets, "{style:?}: {m:#?}");
        let tb = detail(&r, "sndbuf_bytes").as_i64().unwrap();
        for s in &m.sockets {
            assert_eq!(s.max.tb, tb, "{s:#?}");
            assert!(s.max.f.abs() < 1 << 20, "{s:#?}");
        }
        let clients: Vec<_> =
            m.sockets.iter().filter(|s| s.role == fraglab_results::skmem::Role::Client).collect();
        assert_eq!(clients.len() as u64, threads);
        assert!(clients.iter().all(|s| server.ends_with(&s.remote) && s.associations == 1), "{clients:#?}");
        if style == Style::OneToMany {
            let srv = m.sockets.iter().find(|s| s.role == fraglab_results::skmem::Role::Server).unwrap();
            assert_eq!(srv.associations as u64, threads, "{srv:#?}");
        }
    }
}
