//! The guest → host channel: one byte stream on the guest's second serial port (`/dev/ttyS1`,
//! put in raw mode), which qemu hands to a Unix socket the host listens on.
//!
//! The stream is a magic line, then frames: a tag byte, a little-endian `u32` length, the payload.
//! The guest command's stdout and stderr, init's own messages, the results directory (a cpio newc
//! archive) and finally the exit status all travel here, in order, so the host can replay stdout and
//! stderr as they come and knows the status is the last word. Kernel messages never reach this port
//! (the console is `ttyS0`), so nothing else can interleave.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Written once by the guest's init before any frame; the host ignores anything before it.
pub const MAGIC: &[u8] = b"\nFRAGLAB-VM-CHANNEL-1\n";

/// The largest payload one frame carries (a frame is assembled in memory on both sides).
pub const MAX_FRAME: usize = 64 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// The guest command's stdout.
    Stdout,
    /// The guest command's stderr.
    Stderr,
    /// Init's progress (shown with --verbose).
    Log,
    /// Init's warnings (always shown).
    Warn,
    /// A piece of the results archive (cpio newc of the guest's results directory).
    Results,
    /// The verdict, as JSON ([`Verdict`]); the last frame.
    Exit,
}

impl Tag {
    fn byte(self) -> u8 {
        match self {
            Tag::Stdout => b'O',
            Tag::Stderr => b'E',
            Tag::Log => b'L',
            Tag::Warn => b'W',
            Tag::Results => b'R',
            Tag::Exit => b'X',
        }
    }

    fn from_byte(b: u8) -> Option<Tag> {
        Some(match b {
            b'O' => Tag::Stdout,
            b'E' => Tag::Stderr,
            b'L' => Tag::Log,
            b'W' => Tag::Warn,
            b'R' => Tag::Results,
            b'X' => Tag::Exit,
            _ => return None,
        })
    }
}

/// How the guest command ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// It exited with this status.
    Exited(i32),
    /// A signal killed it.
    Signaled(i32),
    /// Init could not run it (a missing program, a broken initramfs).
    InitFailed(String),
    /// Still running at the guest-side deadline (this many seconds of guest uptime): init killed
    /// every process and sent the results written so far.
    TimedOut(u64),
}

impl Verdict {
    /// The host's exit status: the command's own, a shell's 128 + N for a signal, 125 when the guest
    /// could not run it.
    pub fn exit_code(&self) -> u8 {
        match self {
            Verdict::Exited(c) => (*c & 0xff) as u8,
            Verdict::Signaled(s) => (128 + *s).clamp(0, 255) as u8,
            Verdict::InitFailed(_) | Verdict::TimedOut(_) => crate::exit::Exit::CouldNotTest.code(),
        }
    }
}

/// Write one frame (splitting payloads above [`MAX_FRAME`]).
pub fn write_frame(w: &mut impl Write, tag: Tag, payload: &[u8]) -> io::Result<()> {
    for chunk in payload.chunks(MAX_FRAME) {
        let mut buf = Vec::with_capacity(5 + chunk.len());
        buf.push(tag.byte());
        buf.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        buf.extend_from_slice(chunk);
        w.write_all(&buf)?;
    }
    w.flush()
}

/// Reads frames from the host's end of the channel.
pub struct Reader<R> {
    inner: R,
    synced: bool,
}

impl<R: Read> Reader<R> {
    pub fn new(inner: R) -> Self {
        Reader { inner, synced: false }
    }

    /// Skip everything up to [`MAGIC`]. Returns false at end of stream.
    fn sync(&mut self) -> io::Result<bool> {
        let mut matched = 0;
        let mut byte = [0u8; 1];
        while matched < MAGIC.len() {
            if self.inner.read(&mut byte)? == 0 {
                return Ok(false);
            }
            if byte[0] == MAGIC[matched] {
                matched += 1;
            } else {
                matched = usize::from(byte[0] == MAGIC[0]);
            }
        }
        self.synced = true;
        Ok(true)
    }

    /// The next frame; `None` at a clean end of stream (between frames).
    pub fn next_frame(&mut self) -> io::Result<Option<(Tag, Vec<u8>)>> {
        if !self.synced && !self.sync()? {
            return Ok(None);
        }
        let mut head = [0u8; 5];
        match self.inner.read(&mut head[..1])? {
            0 => return Ok(None),
            _ => self.inner.read_exact(&mut head[1..])?,
        }
        let tag = Tag::from_byte(head[0]).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("unknown frame tag {:#04x}", head[0]))
        })?;
        let len = u32::from_le_bytes(head[1..].try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
        }
        let mut payload = vec![0u8; len];
        self.inner.read_exact(&mut payload)?;
        Ok(Some((tag, payload)))
    }

    /// True once the magic line has been seen: the guest's init is running.
    pub fn synced(&self) -> bool {
        self.synced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_after_noise() {
        let mut stream = b"garbage\nFRAGLAB\n".to_vec();
        stream.extend_from_slice(MAGIC);
        write_frame(&mut stream, Tag::Stdout, b"hello\n").unwrap();
        let big = vec![7u8; MAX_FRAME + 10];
        write_frame(&mut stream, Tag::Results, &big).unwrap();
        let verdict = serde_json::to_vec(&Verdict::Exited(3)).unwrap();
        write_frame(&mut stream, Tag::Exit, &verdict).unwrap();

        let mut r = Reader::new(&stream[..]);
        assert_eq!(r.next_frame().unwrap(), Some((Tag::Stdout, b"hello\n".to_vec())));
        assert!(r.synced());
        let (t, a) = r.next_frame().unwrap().unwrap();
        assert_eq!((t, a.len()), (Tag::Results, MAX_FRAME));
        let (t, b) = r.next_frame().unwrap().unwrap();
        assert_eq!((t, b.len()), (Tag::Results, 10));
        let (t, v) = r.next_frame().unwrap().unwrap();
        assert_eq!(t, Tag::Exit);
        assert_eq!(serde_json::from_slice::<Verdict>(&v).unwrap().exit_code(), 3);
        assert_eq!(r.next_frame().unwrap(), None);
    }

    #[test]
    fn no_magic_no_frames() {
        let mut r = Reader::new(&b"[    0.000000] Linux version 6.1.0\n"[..]);
        assert_eq!(r.next_frame().unwrap(), None);
        assert!(!r.synced());
    }

    #[test]
    fn verdicts_map_like_a_shell() {
        assert_eq!(Verdict::Exited(0).exit_code(), 0);
        assert_eq!(Verdict::Exited(1).exit_code(), 1);
        assert_eq!(Verdict::Signaled(9).exit_code(), 137);
        assert_eq!(Verdict::InitFailed("x".into()).exit_code(), 125);
        assert_eq!(Verdict::TimedOut(280).exit_code(), 125);
    }
}
