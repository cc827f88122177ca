//! sock_diag: live dumps of this kernel's TCP sockets checked against what getsockopt and fstat say
//! of the same sockets, and real captures (this host's 6.18 and a Debian 6.1 guest's SCTP) parsed.

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use fraglab_probe::sock_diag::{self, Family, Proto, SkMem};

fn inode(fd: &impl AsRawFd) -> u32 {
    std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap().ino() as u32
}

fn getsockopt_int(fd: &impl AsRawFd, name: libc::c_int) -> u32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` is writable for `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "getsockopt {name}: {}", std::io::Error::last_os_error());
    v as u32
}

fn setsockopt_int(fd: &impl AsRawFd, name: libc::c_int, v: libc::c_int) {
    // SAFETY: `v` is readable for its size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
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
        setsockopt_int(&server, libc::SO_RCVBUF, 200 << 10);
        let unread = 30_000;
        client.write_all(&vec![7u8; unread]).unwrap();
        // Loopback delivers in the sender's context; give softirq a moment anyway.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let (c, srv) = loop {
            let dump = sock_diag::read(Proto::Tcp, family).unwrap();
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
        assert_eq!(c.skmem.tb, getsockopt_int(&client, libc::SO_SNDBUF));
        assert_eq!(c.skmem.rb, getsockopt_int(&client, libc::SO_RCVBUF));
        assert_eq!((c.skmem.tb, c.skmem.rb), (96 << 10, 160 << 10), "the kernel doubles what was asked");
        assert_eq!(srv.skmem.rb, getsockopt_int(&server, libc::SO_RCVBUF));
        assert_eq!(srv.skmem.tb, getsockopt_int(&server, libc::SO_SNDBUF));
        // r is truesize: at least the payload, at most the receive buffer.
        assert!(srv.skmem.r as usize >= unread && srv.skmem.r <= srv.skmem.rb, "{}", srv.skmem);
        assert_eq!(c.associations + srv.associations, 0);
        // The listener is in the dump too, with nothing queued.
        let dump = sock_diag::read(Proto::Tcp, family).unwrap();
        let l = dump.sockets().into_iter().find(|s| s.inode == inode(&listener)).expect("listener");
        assert_eq!(sock_diag::state_name(Proto::Tcp, false, l.state), "LISTEN");
        // The raw reply parses again to the same entries.
        let again = sock_diag::parse(Proto::Tcp, family, &dump.raw, "raw").unwrap();
        assert_eq!(again.entries, dump.entries);
    }
}

#[test]
fn skmem_prints_as_ss_prints_it() {
    let m = SkMem { r: 55040, rb: 8515000, t: 0, tb: 2626560, f: 1710336, w: 0, o: 0, bl: 0, d: 0 };
    // Seed 004's old-kernel receiver, as `ss -tm` showed it.
    assert_eq!(m.to_string(), "skmem:(r55040,rb8515000,t0,tb2626560,f1710336,w0,o0,bl0,d0)");
    assert_eq!(m.held(), 55040 + 1710336);
}
