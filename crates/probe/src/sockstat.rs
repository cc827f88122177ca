//! `/proc/net/sockstat`, `/proc/net/sockstat6` and `/proc/net/protocols`: socket counts and the
//! memory the network stack has charged to each protocol.
//!
//! ```text
//! sockets: used 9
//! TCP: inuse 1 orphan 0 tw 0 alloc 1 mem 95
//! FRAG: inuse 0 memory 0
//! ```
//!
//! Units differ by key: `mem` is in **pages** (the protocol's `memory_allocated`, what
//! `tcp_mem`/`udp_mem` limit), while FRAG's `memory` is in **bytes**. `inuse` counts sockets of the
//! reader's network namespace; `mem`, `alloc` and `orphan` are global.
//!
//! SCTP never appears in sockstat. Its socket count and memory pages are only in
//! `/proc/net/protocols` (rows `SCTP` and `SCTPv6`, present once the sctp module is loaded):
//!
//! ```text
//! protocol  size sockets  memory press maxhdr  slab module     cl co di ac io ...
//! TCP       2304      1      95   no     192   yes  kernel      y  y  y  y  y ...
//! ```
//!
//! `memory` there is pages too, or -1 when the protocol does not account memory; `press` is
//! yes/no, or NI when it has no memory-pressure flag.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{read_to_string, Error, Result};
use crate::meminfo::error_at_end;
use crate::sock_diag::Proto;

pub const SOCKSTAT_PATH: &str = "/proc/net/sockstat";
pub const SOCKSTAT6_PATH: &str = "/proc/net/sockstat6";
pub const PROTOCOLS_PATH: &str = "/proc/net/protocols";

/// One sockstat file: label (`sockets`, `TCP`, `UDP6`, …) → key → value.
///
/// Values are signed because the kernel prints them with `%d`/`%ld`; in practice they are ≥ 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SockStatFile {
    pub lines: BTreeMap<String, BTreeMap<String, i64>>,
}

impl SockStatFile {
    /// Parse sockstat or sockstat6 text; `path` names the source in errors.
    ///
    /// Each non-blank line is `LABEL: key value [key value]…`; keys are taken as printed, so a
    /// kernel adding a key needs no change here.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        let mut lines = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let err = |reason: String| Error::parse(path, i + 1, line, reason);
            let (label, pairs) = parse_sockstat_line(line).map_err(err)?;
            if lines.insert(label.to_string(), pairs).is_some() {
                return Err(err(format!("{label} appears a second time")));
            }
        }
        Ok(SockStatFile { lines })
    }

    /// `get("TCP", "mem")`; `None` if the label or the key is absent.
    pub fn get(&self, label: &str, key: &str) -> Option<i64> {
        self.lines.get(label)?.get(key).copied()
    }
}

fn parse_sockstat_line(line: &str) -> std::result::Result<(&str, BTreeMap<String, i64>), String> {
    let mut fields = line.split_whitespace();
    let label = fields.next().ok_or("empty line")?;
    let label = label.strip_suffix(':').filter(|l| !l.is_empty()).ok_or_else(|| {
        format!("expected \"LABEL: key value ...\", {label:?} is not a label ending in a colon")
    })?;
    let mut pairs = BTreeMap::new();
    while let Some(key) = fields.next() {
        let value = fields.next().ok_or_else(|| format!("{label} key {key:?} has no value"))?;
        let value: i64 = value.parse().map_err(|_| format!("{label} {key} {value:?} is not a number"))?;
        if key.parse::<i64>().is_ok() {
            return Err(format!("{label}: expected a key name, found the number {key}"));
        }
        if pairs.insert(key.to_string(), value).is_some() {
            return Err(format!("{label} key {key} appears twice"));
        }
    }
    if pairs.is_empty() {
        return Err(format!("{label} has no \"key value\" pairs"));
    }
    Ok((label, pairs))
}

/// One row of `/proc/net/protocols`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtoRow {
    pub protocol: String,
    /// Bytes per socket object (`obj_size`).
    pub size: u64,
    /// Sockets in use in the reader's network namespace.
    pub sockets: i64,
    /// Pages charged to the protocol; `None` for -1 (the protocol does not account memory).
    pub memory_pages: Option<i64>,
    /// Memory-pressure flag; `None` for NI (not implemented by the protocol).
    pub pressure: Option<bool>,
    pub maxhdr: u64,
    /// Whether the protocol has its own slab cache.
    pub slab: bool,
    /// Owning module, `kernel` when built in.
    pub module: String,
    /// Method columns (`cl`, `co`, … as named by the header) → implemented (`y`) or not (`n`).
    pub methods: BTreeMap<String, bool>,
}

/// A parsed `/proc/net/protocols`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Protocols {
    pub rows: Vec<ProtoRow>,
}

/// The fixed leading columns of the protocols header; the method columns after them vary by kernel.
const PROTOCOLS_FIXED: [&str; 8] =
    ["protocol", "size", "sockets", "memory", "press", "maxhdr", "slab", "module"];

impl Protocols {
    /// Parse `/proc/net/protocols` text; `path` names the source in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let Some((i, header)) = lines.next() else {
            return Err(error_at_end(
                path,
                text,
                "empty input: expected the \"protocol size sockets ...\" header",
            ));
        };
        let columns: Vec<&str> = header.split_whitespace().collect();
        if columns.len() < PROTOCOLS_FIXED.len() || columns[..PROTOCOLS_FIXED.len()] != PROTOCOLS_FIXED {
            let reason = format!("expected a header starting \"{}\"", PROTOCOLS_FIXED.join(" "));
            return Err(Error::parse(path, i + 1, header, reason));
        }
        let methods = &columns[PROTOCOLS_FIXED.len()..];
        let mut rows = Vec::new();
        for (i, line) in lines {
            rows.push(
                parse_protocols_row(line, methods)
                    .map_err(|reason| Error::parse(path, i + 1, line, reason))?,
            );
        }
        Ok(Protocols { rows })
    }

    /// The row for `protocol` (`TCP`, `SCTPv6`, …).
    pub fn get(&self, protocol: &str) -> Option<&ProtoRow> {
        self.rows.iter().find(|r| r.protocol == protocol)
    }

    /// SCTP sockets and memory pages, IPv4 and IPv6 rows summed; `None` when sctp is not loaded.
    pub fn sctp(&self) -> Option<(i64, Option<i64>)> {
        let v4 = self.get("SCTP");
        let v6 = self.get("SCTPv6");
        if v4.is_none() && v6.is_none() {
            return None;
        }
        let sockets = v4.map_or(0, |r| r.sockets) + v6.map_or(0, |r| r.sockets);
        // Both rows show the one sctp_memory_allocated counter: take it once, not twice.
        let memory = v4.or(v6).and_then(|r| r.memory_pages);
        Some((sockets, memory))
    }
}

/// Pages charged to `proto` (its memory_allocated), read from the one file that has it: sockstat's
/// `TCP: mem`, or the SCTP row of /proc/net/protocols. `None` when that file cannot be read or
/// parsed, or sctp is not loaded. What the socket-memory sampler reads beside every dump.
pub fn memory_allocated_pages(proto: Proto) -> Option<i64> {
    match proto {
        Proto::Tcp => {
            SockStatFile::parse(&read_to_string(SOCKSTAT_PATH).ok()?, SOCKSTAT_PATH).ok()?.get("TCP", "mem")
        }
        Proto::Sctp => {
            Protocols::parse(&read_to_string(PROTOCOLS_PATH).ok()?, PROTOCOLS_PATH).ok()?.sctp()?.1
        }
    }
}

fn parse_protocols_row(line: &str, methods: &[&str]) -> std::result::Result<ProtoRow, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let expected = PROTOCOLS_FIXED.len() + methods.len();
    if fields.len() != expected {
        return Err(format!("{} columns, but the header names {expected}", fields.len()));
    }
    let protocol = fields[0];
    let num =
        |col: &str, s: &str| s.parse::<i64>().map_err(|_| format!("{protocol} {col} {s:?} is not a number"));
    let unsigned =
        |col: &str, s: &str| s.parse::<u64>().map_err(|_| format!("{protocol} {col} {s:?} is not a number"));
    let yes_no = |col: &str, s: &str, yes: &str, no: &str| match s {
        _ if s == yes => Ok(true),
        _ if s == no => Ok(false),
        _ => Err(format!("{protocol} {col} is {s:?}, expected {yes} or {no}")),
    };
    let memory = num("memory", fields[3])?;
    let pressure = match fields[4] {
        "NI" => None,
        s => Some(yes_no("press", s, "yes", "no").map_err(|e| e + " or NI")?),
    };
    let methods = methods
        .iter()
        .zip(&fields[PROTOCOLS_FIXED.len()..])
        .map(|(name, s)| yes_no(name, s, "y", "n").map(|b| (name.to_string(), b)))
        .collect::<std::result::Result<_, _>>()?;
    Ok(ProtoRow {
        protocol: protocol.to_string(),
        size: unsigned("size", fields[1])?,
        sockets: num("sockets", fields[2])?,
        memory_pages: (memory != -1).then_some(memory),
        pressure,
        maxhdr: unsigned("maxhdr", fields[5])?,
        slab: yes_no("slab", fields[6], "yes", "no")?,
        module: fields[7].to_string(),
        methods,
    })
}

/// All three files, read together.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SockStat {
    /// `/proc/net/sockstat`.
    pub v4: SockStatFile,
    /// `/proc/net/sockstat6`; `None` when the file does not exist (kernel without IPv6).
    pub v6: Option<SockStatFile>,
    /// `/proc/net/protocols`; `None` when it cannot be read.
    pub protocols: Option<Protocols>,
}

impl SockStat {
    /// Read the live files of the caller's network namespace.
    ///
    /// sockstat must be readable. sockstat6 may be missing (no IPv6); protocols may be unreadable.
    /// Either, once read, must parse.
    pub fn read() -> Result<Self> {
        let v4 = SockStatFile::parse(&read_to_string(SOCKSTAT_PATH)?, SOCKSTAT_PATH)?;
        let v6 = match std::fs::read_to_string(SOCKSTAT6_PATH) {
            Ok(text) => Some(SockStatFile::parse(&text, SOCKSTAT6_PATH)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(Error::Io { path: SOCKSTAT6_PATH.into(), source }),
        };
        let protocols = match std::fs::read_to_string(PROTOCOLS_PATH) {
            Ok(text) => Some(Protocols::parse(&text, PROTOCOLS_PATH)?),
            Err(_) => None,
        };
        Ok(SockStat { v4, v6, protocols })
    }

    /// `sockets: used` — sockets of all families in the reader's network namespace.
    pub fn sockets_used(&self) -> Option<i64> {
        self.v4.get("sockets", "used")
    }

    /// Pages charged to `label` in sockstat (`TCP`, `UDP`). sockstat6 prints no `mem`: IPv6 sockets
    /// are charged to the same counters as IPv4.
    pub fn mem_pages(&self, label: &str) -> Option<i64> {
        self.v4.get(label, "mem")
    }

    /// SCTP sockets and memory pages from `/proc/net/protocols` ([`Protocols::sctp`]); `None` when
    /// protocols was not read or sctp is not loaded.
    pub fn sctp(&self) -> Option<(i64, Option<i64>)> {
        self.protocols.as_ref()?.sctp()
    }
}
