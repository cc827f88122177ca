//! One sample of every monitor, and a sampler that adds counter deltas since its first sample.
//!
//! Each monitor reads its file once per sample; the indices are derived from that same buddyinfo
//! read, so a sample is self-consistent even though the files are not read atomically together.

use std::collections::BTreeSet;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::buddyinfo::BuddyInfo;
use crate::extfrag::{self, ZoneIndices};
use crate::meminfo::FreeTable;
use crate::page_reporting::PageReporting;
use crate::pagetypeinfo::PageTypeInfo;
use crate::slabinfo::SlabInfo;
use crate::sockstat::SockStat;
use crate::vmstat::VmCounters;
use crate::zoneinfo::ZoneInfo;
use crate::{Error, Result};

/// A kernel interface the probe can sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Monitor {
    Buddyinfo,
    Pagetypeinfo,
    Meminfo,
    Vmstat,
    Slabinfo,
    Sockstat,
    Zoneinfo,
}

impl Monitor {
    pub const ALL: [Monitor; 7] = [
        Monitor::Buddyinfo,
        Monitor::Pagetypeinfo,
        Monitor::Meminfo,
        Monitor::Vmstat,
        Monitor::Slabinfo,
        Monitor::Sockstat,
        Monitor::Zoneinfo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Monitor::Buddyinfo => "buddyinfo",
            Monitor::Pagetypeinfo => "pagetypeinfo",
            Monitor::Meminfo => "meminfo",
            Monitor::Vmstat => "vmstat",
            Monitor::Slabinfo => "slabinfo",
            Monitor::Sockstat => "sockstat",
            Monitor::Zoneinfo => "zoneinfo",
        }
    }

    /// The file whose readability decides whether this monitor can run here.
    pub fn path(self) -> &'static str {
        match self {
            Monitor::Buddyinfo => crate::buddyinfo::PATH,
            Monitor::Pagetypeinfo => crate::pagetypeinfo::PATH,
            Monitor::Meminfo => crate::meminfo::PATH,
            Monitor::Vmstat => crate::vmstat::PATH,
            Monitor::Slabinfo => crate::slabinfo::PATH,
            Monitor::Sockstat => crate::sockstat::SOCKSTAT_PATH,
            Monitor::Zoneinfo => crate::zoneinfo::PATH,
        }
    }

    /// Parse a monitor name as a user types it.
    pub fn parse(name: &str) -> std::result::Result<Monitor, String> {
        Monitor::ALL.into_iter().find(|m| m.name() == name.trim()).ok_or_else(|| {
            let all: Vec<_> = Monitor::ALL.iter().map(|m| m.name()).collect();
            format!("unknown monitor {name:?}; choose from {}", all.join(", "))
        })
    }

    /// Every monitor whose file this process can read (pagetypeinfo and slabinfo are root-only),
    /// with the reason for each one left out.
    pub fn available() -> (BTreeSet<Monitor>, Vec<String>) {
        let mut ok = BTreeSet::new();
        let mut skipped = Vec::new();
        for m in Monitor::ALL {
            match std::fs::File::open(m.path()) {
                Ok(_) => {
                    ok.insert(m);
                }
                Err(e) => skipped.push(format!("{}: {} ({e})", m.name(), m.path())),
            }
        }
        (ok, skipped)
    }
}

/// Everything the selected monitors read at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Wall-clock time, RFC 3339 with milliseconds, UTC.
    pub wall: String,
    /// CLOCK_MONOTONIC in nanoseconds: for intervals, immune to clock changes.
    pub monotonic_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buddyinfo: Option<BuddyInfo>,
    /// Free page reporting, read with buddyinfo: while it is on, blocks of its order and above
    /// leave the free lists for a moment to be reported, and buddyinfo and MemFree dip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_reporting: Option<PageReporting>,
    /// Unusable free space and fragmentation indices per zone and order, from `buddyinfo`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub indices: Option<Vec<ZoneIndices>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pagetypeinfo: Option<PageTypeInfo>,
    /// The `free` table (KiB), from /proc/meminfo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free: Option<FreeTable>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vmstat: Option<VmCounters>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slabinfo: Option<SlabInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockstat: Option<SockStat>,
    /// Watermarks, zone sizes, lowmem reserve and per-CPU lists, from /proc/zoneinfo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zoneinfo: Option<ZoneInfo>,
}

impl Snapshot {
    /// Read every monitor in `monitors` now.
    pub fn take(monitors: &BTreeSet<Monitor>) -> Result<Snapshot> {
        let mut s = Snapshot { wall: wall_now(), monotonic_ns: monotonic_ns()?, ..Default::default() };
        for m in monitors {
            match m {
                Monitor::Buddyinfo => {
                    let b = BuddyInfo::read()?;
                    s.indices = Some(extfrag::indices(&b));
                    s.buddyinfo = Some(b);
                    s.page_reporting = page_reporting()?;
                }
                Monitor::Pagetypeinfo => s.pagetypeinfo = Some(PageTypeInfo::read()?),
                Monitor::Meminfo => s.free = Some(FreeTable::read()?),
                Monitor::Vmstat => s.vmstat = Some(VmCounters::read()?),
                Monitor::Slabinfo => s.slabinfo = Some(SlabInfo::read()?),
                Monitor::Sockstat => s.sockstat = Some(SockStat::read()?),
                Monitor::Zoneinfo => s.zoneinfo = Some(ZoneInfo::read()?),
            }
        }
        Ok(s)
    }
}

/// One line of a time series: the snapshot, plus counter deltas since the series began.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    #[serde(flatten)]
    pub snapshot: Snapshot,
    /// Seconds since the first sample (monotonic).
    pub elapsed: f64,
    /// vmstat counters minus the first sample's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vmstat_delta: Option<VmCounters>,
}

/// Takes samples and remembers the first, so every later sample carries deltas since it.
pub struct Sampler {
    monitors: BTreeSet<Monitor>,
    first: Option<(u64, Option<VmCounters>)>,
}

impl Sampler {
    pub fn new(monitors: BTreeSet<Monitor>) -> Self {
        Sampler { monitors, first: None }
    }

    pub fn sample(&mut self) -> Result<Sample> {
        let snapshot = Snapshot::take(&self.monitors)?;
        let (t0, v0) = self.first.get_or_insert_with(|| (snapshot.monotonic_ns, snapshot.vmstat.clone()));
        let vmstat_delta = match (&snapshot.vmstat, v0) {
            (Some(now), Some(first)) => Some(now.delta(first)),
            _ => None,
        };
        let elapsed = (snapshot.monotonic_ns - *t0) as f64 / 1e9;
        Ok(Sample { snapshot, elapsed, vmstat_delta })
    }
}

/// Free page reporting, read once a process: a balloon's features are negotiated when its driver
/// binds, and a sampler at 10 ms should not walk sysfs every time.
fn page_reporting() -> Result<Option<PageReporting>> {
    static READ: std::sync::OnceLock<Option<PageReporting>> = std::sync::OnceLock::new();
    if let Some(r) = READ.get() {
        return Ok(r.clone());
    }
    let r = PageReporting::read()?;
    Ok(READ.get_or_init(|| r).clone())
}

fn wall_now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// CLOCK_MONOTONIC in nanoseconds, the clock every sample and run phase carries.
pub fn monotonic_ns() -> Result<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        let source = std::io::Error::last_os_error();
        return Err(Error::Io { path: "CLOCK_MONOTONIC".into(), source });
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}
