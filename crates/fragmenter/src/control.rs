//! The control socket of a holding fragmenter: line-delimited JSON over a Unix socket in the run
//! directory, mode 0600, peers checked with SO_PEERCRED.
//!
//! ```text
//! → {"cmd":"status"}        ← {"ok":true,"status":{...}}
//! → {"cmd":"release"}       ← {"ok":true,"released":true}
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub const SOCKET: &str = "fraglab.sock";

/// A request is one short line; anything longer is refused rather than buffered.
pub const MAX_REQUEST: usize = 4096;

/// How long the fragmenter waits for a connected peer's request line.
const REQUEST_WAIT: Duration = Duration::from_secs(2);
/// How long [`call`] waits for the fragmenter's reply.
const REPLY_WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Release,
}

/// Bind the socket, owner-only. The instance lock removed any stale socket file already.
pub fn listen(dir: &Path) -> Result<UnixListener> {
    let path = dir.join(SOCKET);
    let listener = UnixListener::bind(&path).with_context(|| format!("cannot bind {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Connections answered in one call at most, and no new one taken after [`SERVE_FOR`]: a client
/// that keeps connecting (a tight loop of `fraglab status`) must not keep the holder from its
/// keeper's looks and its guard; the rest wait in the backlog for the holder's next pass.
pub const MAX_PER_SERVE: usize = 8;
const SERVE_FOR: Duration = Duration::from_millis(100);

/// Once a release is asked for, the connections still waiting are answered too (a second
/// `fraglab release` must hear that it is released, not find its connection reset), up to this.
const MAX_AFTER_RELEASE: usize = 64;

/// Accept and answer the pending connections (bounded: [`MAX_PER_SERVE`]); `answer` turns a
/// request into a JSON reply. Returns true when a release was requested. A bad peer or request gets
/// an error reply and changes nothing.
pub fn serve_pending(listener: &UnixListener, mut answer: impl FnMut(&Request) -> serde_json::Value) -> bool {
    let mut release = false;
    let start = std::time::Instant::now();
    for served in 0.. {
        let more = if release {
            served < MAX_PER_SERVE + MAX_AFTER_RELEASE
        } else {
            served < MAX_PER_SERVE && start.elapsed() < SERVE_FOR
        };
        if !more {
            break;
        }
        let Ok((stream, _)) = listener.accept() else { break };
        let reply = match read_request(&stream) {
            Ok(req) => {
                release |= req == Request::Release;
                answer(&req)
            }
            Err(e) => serde_json::json!({ "ok": false, "error": format!("{e:#}") }),
        };
        let mut s = &stream;
        let _ = writeln!(s, "{reply}");
        // Unread input at close makes the kernel reset the connection and the client lose the reply:
        // stop sending, then swallow what is left (bounded, under the read timeout).
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let _ = std::io::copy(&mut (&stream).take(1 << 20), &mut std::io::sink());
    }
    release
}

fn read_request(stream: &UnixStream) -> Result<Request> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(REQUEST_WAIT))?;
    let cred = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)?;
    let me = nix::unistd::geteuid().as_raw();
    if cred.uid() != 0 && cred.uid() != me {
        bail!("peer uid {} (pid {}) may not control this fraglab", cred.uid(), cred.pid());
    }
    let mut line = String::new();
    BufReader::new(stream.take(MAX_REQUEST as u64 + 1))
        .read_line(&mut line)
        .map_err(|e| within("no request", REQUEST_WAIT, e))?;
    if line.len() > MAX_REQUEST {
        bail!("request longer than {MAX_REQUEST} bytes");
    }
    serde_json::from_str(line.trim()).with_context(|| {
        format!("not a request: {:?} (expected {{\"cmd\":\"status\"|\"release\"}})", line.trim())
    })
}

/// Nothing answers on the socket: no fragmenter holds in this run directory (none started, or the
/// one that did has let go — released, stopped, or dead: no socket, nobody listening, or the
/// connection closed without a reply). Every other error of [`call`] is a holder that is there but
/// did not answer as it should, or a socket this user may not use.
#[derive(Debug, thiserror::Error)]
#[error("no fraglab is holding memory (cannot connect to {})", path.display())]
pub struct NotHolding {
    path: std::path::PathBuf,
    #[source]
    source: std::io::Error,
}

/// Send one request to the fragmenter holding `dir` and return its reply.
pub fn call(dir: &Path, req: &Request) -> Result<serde_json::Value> {
    call_within(dir, req, REPLY_WAIT)
}

fn call_within(dir: &Path, req: &Request, wait: Duration) -> Result<serde_json::Value> {
    let path = dir.join(SOCKET);
    let stream = UnixStream::connect(&path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            anyhow::Error::new(NotHolding { path: path.clone(), source })
        }
        _ => anyhow::Error::new(source).context(format!("cannot connect to {}", path.display())),
    })?;
    stream.set_read_timeout(Some(wait))?;
    let mut s = &stream;
    writeln!(s, "{}", serde_json::to_string(req)?)?;
    let mut line = String::new();
    match BufReader::new(&stream).read_line(&mut line) {
        // Closed with no reply: the holder let go (or died) between accepting and answering.
        Ok(0) => return Err(NotHolding { path, source: std::io::ErrorKind::UnexpectedEof.into() }.into()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            return Err(NotHolding { path, source: e }.into())
        }
        Ok(_) => {}
        Err(e) => return Err(within(&format!("no reply from {}", path.display()), wait, e)),
    }
    let reply: serde_json::Value = serde_json::from_str(&line)
        .with_context(|| format!("bad reply from {}: {line:?}", path.display()))?;
    if reply["ok"] != true {
        bail!("fraglab answered: {}", reply["error"]);
    }
    Ok(reply)
}

/// A read that hit its timeout says so and names the bound (the bare error is "Resource temporarily
/// unavailable"); any other error is kept as it is.
fn within(what: &str, bound: Duration, e: std::io::Error) -> anyhow::Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            anyhow::anyhow!("{what} within the {} bound", humantime::format_duration(bound))
        }
        _ => anyhow::Error::new(e).context(what.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fragmenter that accepts but never answers: the caller stops at its bound and says which.
    #[test]
    fn a_silent_fragmenter_is_named_with_the_bound() {
        let dir = std::env::temp_dir().join(format!("fraglab-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let listener = listen(&dir).unwrap();
        let err = call_within(&dir, &Request::Status, Duration::from_millis(200)).unwrap_err();
        // Accepted only now: the connection sat in the backlog, never answered, as a stuck one would.
        let accepted = listener.accept().is_ok();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(accepted);
        let text = format!("{err:#}");
        assert!(text.starts_with("no reply from ") && text.ends_with("within the 200ms bound"), "{text}");
    }

    /// A peer that connects and sends nothing gets an error reply naming the bound.
    #[test]
    fn a_silent_peer_is_answered_with_the_bound() {
        let dir = std::env::temp_dir().join(format!("fraglab-control-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let listener = listen(&dir).unwrap();
        let client = UnixStream::connect(dir.join(SOCKET)).unwrap();
        let (stream, _) = listener.accept().unwrap();
        let err = read_request(&stream).unwrap_err();
        drop(client);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(format!("{err:#}"), "no request within the 2s bound");
    }

    /// Clients that keep connecting get answered a few at a time: the holder goes back to its
    /// keeper and guard between, and the rest are answered on the next calls, none lost. The
    /// count varies, so no figure lines up by chance.
    #[test]
    fn a_crowd_of_clients_is_answered_a_few_at_a_time() {
        for clients in [1, MAX_PER_SERVE, MAX_PER_SERVE + 1, 3 * MAX_PER_SERVE + 5] {
            let dir =
                std::env::temp_dir().join(format!("fraglab-control-crowd-{}-{clients}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let listener = listen(&dir).unwrap();
            let streams: Vec<UnixStream> = (0..clients)
                .map(|_| {
                    let mut s = UnixStream::connect(dir.join(SOCKET)).unwrap();
                    writeln!(s, "{}", serde_json::to_string(&Request::Status).unwrap()).unwrap();
                    // All it will send, as `call` does by reading and closing: the holder need not
                    // wait out its bound for more.
                    s.shutdown(std::net::Shutdown::Write).unwrap();
                    s
                })
                .collect();
            let mut answered = Vec::new();
            loop {
                let mut n = 0;
                serve_pending(&listener, |_| {
                    n += 1;
                    serde_json::json!({ "ok": true })
                });
                if n == 0 {
                    break;
                }
                answered.push(n);
            }
            std::fs::remove_dir_all(&dir).unwrap();
            assert!(answered.iter().all(|&n| n <= MAX_PER_SERVE), "{clients} clients: {answered:?}");
            assert_eq!(answered.iter().sum::<usize>(), clients, "{answered:?}");
            assert!(answered.len() >= clients.div_ceil(MAX_PER_SERVE), "{answered:?}");
            for s in streams {
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).unwrap();
                assert_eq!(line.trim(), r#"{"ok":true}"#);
            }
        }
    }

    /// Once a release is asked, everyone still waiting is answered in the same pass — a second
    /// `fraglab release` hears "released" rather than finding its connection reset as the holder
    /// closes its socket.
    #[test]
    fn a_release_answers_everyone_waiting() {
        let dir = std::env::temp_dir().join(format!("fraglab-control-release-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let listener = listen(&dir).unwrap();
        let streams: Vec<UnixStream> = [Request::Release]
            .into_iter()
            .chain(std::iter::repeat_n(Request::Status, 2 * MAX_PER_SERVE))
            .chain([Request::Release])
            .map(|req| {
                let mut s = UnixStream::connect(dir.join(SOCKET)).unwrap();
                writeln!(s, "{}", serde_json::to_string(&req).unwrap()).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
                s
            })
            .collect();
        let mut n = 0;
        let release = serve_pending(&listener, |_| {
            n += 1;
            serde_json::json!({ "ok": true })
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(release);
        assert_eq!(n, streams.len());
    }
}
