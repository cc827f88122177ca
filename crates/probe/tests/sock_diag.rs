//! sock_diag: live dumps of this kernel's TCP sockets checked against what getsockopt and fstat say
//! of the same sockets, and real captures (this host's 6.18 and a Debian 6.1 guest's SCTP) parsed.

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use fraglab_probe::sock_diag::{self, Family, Proto, SkMem, States};

fn inode(fd: &impl AsRawFd) -> u32 {
    std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap().ino() as u32
}

/// SO_SNDBUF and SO_RCVBUF as getsockopt reports them (the doubled values).
fn buffers(s: &impl std::os::fd::AsFd) -> (u32, u32) {
    let s = socket2::SockRef::from(s);
    (s.send_buffer_size().unwrap() as u32, s.recv_buffer_size().unwrap() as u32)
}

/// A loopback connection of `family` whose client has SO_SNDBUF/SO_RCVBUF set and has sent `unread`
/// bytes the server has not read; a dump then shows both ends as getsockopt and fstat see them.
#[test]
fn a_live_dump_agrees_with_getsockopt_and_fstat() {
    for (family, ip) in [(Family::V4, Ipv4Addr::LOCALHOST.into()), (Family::V6, Ipv6Addr::LOCALHOST.into())] {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        // Set before connect, as the workloads do; the kernel doubles them.
        let s =
            socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None).unwrap();
        s.set_send_buffer_size(48 << 10).unwrap();
        s.set_recv_buffer_size(80 << 10).unwrap();
        s.connect(&addr.into()).unwrap();
        let mut client: TcpStream = s.into();
        let (server, _) = listener.accept().unwrap();
        socket2::SockRef::from(&server).set_recv_buffer_size(200 << 10).unwrap();
        let unread = 30_000;
        client.write_all(&vec![7u8; unread]).unwrap();
        // Loopback delivers in the sender's context; give softirq a moment anyway.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let (c, srv) = loop {
            let dump = sock_diag::read(Proto::Tcp, family, States::All).unwrap();
            assert_eq!((dump.proto, dump.family), (Proto::Tcp, family));
            let socks = dump.sockets();
            let find = |ino: u32| socks.iter().find(|s| s.inode == ino).cloned();
            let (c, srv) =
                (find(inode(&client)).expect("client in dump"), find(inode(&server)).expect("server"));
            if srv.skmem.r as usize >= unread || std::time::Instant::now() > deadline {
                break (c, srv);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!((c.local, c.remote), (client.local_addr().unwrap(), addr), "{family:?}");
        assert_eq!((srv.local, srv.remote), (addr, client.local_addr().unwrap()));
        assert_eq!(sock_diag::state_name(Proto::Tcp, false, c.state), "ESTAB");
        assert_eq!((c.skmem.tb, c.skmem.rb), buffers(&client));
        assert_eq!((c.skmem.tb, c.skmem.rb), (96 << 10, 160 << 10), "the kernel doubles what was asked");
        assert_eq!((srv.skmem.tb, srv.skmem.rb), buffers(&server));
        // r is truesize: at least the payload, at most the receive buffer.
        assert!(srv.skmem.r as usize >= unread && srv.skmem.r <= srv.skmem.rb, "{}", srv.skmem);
        assert_eq!(c.associations + srv.associations, 0);
        // The listener is in the dump too, with nothing queued.
        let dump = sock_diag::read(Proto::Tcp, family, States::All).unwrap();
        let l = dump.sockets().into_iter().find(|s| s.inode == inode(&listener)).expect("listener");
        assert_eq!(sock_diag::state_name(Proto::Tcp, false, l.state), "LISTEN");
        // The raw reply parses again to the same entries.
        let again = sock_diag::parse(Proto::Tcp, family, &dump.raw, "raw").unwrap();
        assert_eq!(again.entries, dump.entries);
    }
}

/// A connection still in its listener's accept queue is a full socket holding what its peer sent,
/// with no file yet (inode 0): it is kept, told apart from others by its cookie. (Seen in a TCG guest:
/// a 256-thread stream's server had accepted 187 of its connections when the window ended.)
#[test]
fn a_connection_not_yet_accepted_is_a_socket_with_memory() {
    let listener = TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut clients: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for c in &mut clients {
        c.write_all(&[1u8; 5000]).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let socks = sock_diag::read(Proto::Tcp, Family::V6, States::Full).unwrap().sockets();
        let queued: Vec<_> = socks.iter().filter(|s| s.local == addr && s.inode == 0).collect();
        let full = queued.len() == 3 && queued.iter().all(|s| s.skmem.r >= 5000);
        if full || std::time::Instant::now() > deadline {
            assert_eq!(queued.len(), 3, "{queued:?}");
            let mut cookies: Vec<u64> = queued.iter().map(|s| s.cookie).collect();
            cookies.sort();
            cookies.dedup();
            assert_eq!(cookies.len(), 3, "one cookie each");
            for s in &queued {
                assert!(clients.iter().any(|c| c.local_addr().unwrap() == s.remote), "{s:?}");
                assert!(s.skmem.r >= 5000, "the 5000 bytes its peer sent: {}", s.skmem);
            }
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn skmem_prints_as_ss_prints_it() {
    let m = SkMem { r: 55040, rb: 8515000, t: 0, tb: 2626560, f: 1710336, w: 0, o: 0, bl: 0, d: 0 };
    // Seed 004's old-kernel receiver, as `ss -tm` showed it.
    assert_eq!(m.to_string(), "skmem:(r55040,rb8515000,t0,tb2626560,f1710336,w0,o0,bl0,d0)");
    assert_eq!(m.held(), 55040 + 1710336);
    // t is data w still holds (a TCP clone below the socket, an unacknowledged SCTP chunk): not twice.
    let sending = SkMem { t: 4096, w: 6000, f: -512, ..m };
    assert_eq!(sending.held(), 55040 + 6000 - 512);
}

fn capture(name: &str) -> (Vec<u8>, String) {
    let path = format!("{}/tests/captures/sock_diag/{name}", env!("CARGO_MANIFEST_DIR"));
    (std::fs::read(&path).unwrap(), path)
}

/// A Debian 6.1 guest's SCTP sockets (see captures/sock_diag/README.md): one-to-one over IPv4 (a
/// listener, two clients, the two sockets it accepted), one-to-many over IPv6 (the server's one
/// socket with both associations, two clients). Each endpoint-and-association pair is one socket
/// with the association's ends; a listener alone has none; a client's forward allocation is below
/// zero and reads so.
#[test]
fn a_guest_sctp_dump_folds_into_sockets() {
    let (raw, path) = capture("guest-6.1-sctp.ipv4");
    let d = sock_diag::parse(Proto::Sctp, Family::V4, &raw, &path).unwrap();
    let socks = d.sockets();
    let line = |s: &sock_diag::Socket| {
        format!(
            "{} {} {} {}",
            s.local,
            s.remote,
            s.associations,
            sock_diag::state_name(Proto::Sctp, false, s.state)
        )
    };
    let mut got: Vec<String> = socks.iter().map(line).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "127.0.0.1:35204 127.0.0.1:9000 1 ESTAB",
            "127.0.0.1:36810 127.0.0.1:9000 1 ESTAB",
            "127.0.0.1:9000 0.0.0.0:0 0 LISTEN",
            "127.0.0.1:9000 127.0.0.1:35204 1 ESTAB",
            "127.0.0.1:9000 127.0.0.1:36810 1 ESTAB",
        ]
    );
    assert!(d
        .entries
        .iter()
        .any(|e| e.association && sock_diag::state_name(Proto::Sctp, true, e.state) == "ESTAB"));
    let (raw, path) = capture("guest-6.1-sctp.ipv6");
    let d = sock_diag::parse(Proto::Sctp, Family::V6, &raw, &path).unwrap();
    let socks = d.sockets();
    let server = socks.iter().find(|s| s.local.port() == 9001).expect("the one-to-many server");
    assert_eq!(server.associations, 2);
    let clients: Vec<_> = socks.iter().filter(|s| s.remote.port() == 9001).collect();
    assert_eq!(clients.len(), 2);
    for c in clients {
        assert_eq!((c.associations, c.remote.ip().to_string().as_str()), (1, "::1"));
        assert!(c.skmem.f < 0, "SCTP's forward allocation below zero: {}", c.skmem);
    }
}

/// This host's TCP sockets during a tcp-stream over IPv4 and a tcp-rr over IPv6.
#[test]
fn a_host_tcp_dump_parses() {
    for (name, family) in [("host-6.18-tcp.ipv4", Family::V4), ("host-6.18-tcp.ipv6", Family::V6)] {
        let (raw, path) = capture(name);
        let d = sock_diag::parse(Proto::Tcp, family, &raw, &path).unwrap();
        let socks = d.sockets();
        assert!(socks.len() >= 5, "{name}: {socks:?}");
        assert!(socks.iter().all(|s| s.skmem.rb > 0 && s.skmem.tb > 0 && s.associations == 0));
        assert!(socks.iter().all(|s| Family::of(&s.local) == family));
        let listeners =
            socks.iter().filter(|s| sock_diag::state_name(Proto::Tcp, false, s.state) == "LISTEN");
        assert!(listeners.count() >= 1);
    }
}

/// A dump cut short, or bytes that are no dump, are refused naming the file and the message.
#[test]
fn a_cut_dump_is_refused_with_its_place() {
    let (raw, path) = capture("host-6.18-tcp.ipv4");
    // Where each message starts, from the headers' lengths (4-byte aligned).
    let mut starts = vec![0];
    while let Some(&at) = starts.last().filter(|&&at| at < raw.len()) {
        let len = u32::from_ne_bytes(raw[at..at + 4].try_into().unwrap()) as usize;
        starts.push(at + len.next_multiple_of(4));
    }
    let done = starts[starts.len() - 2];
    let e = sock_diag::parse(Proto::Tcp, Family::V4, &raw[..done], &path).unwrap_err().to_string();
    assert!(e.contains("host-6.18-tcp.ipv4") && e.contains("no NLMSG_DONE"), "{e}");
    let mid = starts[1] + 10;
    let e = sock_diag::parse(Proto::Tcp, Family::V4, &raw[..mid], &path).unwrap_err().to_string();
    assert!(e.contains("host-6.18-tcp.ipv4:2: ") && e.contains("message at byte"), "{e}");
    let e = sock_diag::parse(Proto::Tcp, Family::V4, b"not a netlink reply at all", "junk")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("junk:1: "), "{e}");
}
