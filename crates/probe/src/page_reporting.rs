//! Free page reporting (mm/page_reporting.c), from sysfs: whether a balloon driver tells the host
//! which free blocks it may take back, and from which order.
//!
//! To report a block the kernel takes it off the free list, reports up to
//! `PAGE_REPORTING_CAPACITY` (32) blocks of one order at a time, and puts them back when the host
//! answers. For that moment the blocks are missing from `/proc/buddyinfo` and MemFree, and
//! MemAvailable dips by up to 32 top-order blocks (128 MiB on x86-64). Measured on the development
//! VM (virtio-balloon, order 9) after freeing 3 GiB: MemAvailable fell 64 MiB, then 128 MiB, for
//! about 0.3 s, every 2 s or so, until every freshly freed block had been reported once.
//!
//! Only virtio-balloon is recognised (`VIRTIO_BALLOON_F_REPORTING` among the features the driver
//! negotiated). Hyper-V's hv_balloon also reports free pages on some hosts, but nothing in sysfs
//! says whether it does.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{read_to_string, Error, Result};

/// The module parameter (since 5.14; before it, reporting started at `pageblock_order`).
pub const ORDER_PATH: &str = "/sys/module/page_reporting/parameters/page_reporting_order";
/// One directory per virtio device, each with `device` (its id), `features` and a `driver` link.
pub const VIRTIO_DEVICES: &str = "/sys/bus/virtio/devices";

/// include/uapi/linux/virtio_ids.h.
const VIRTIO_ID_BALLOON: u32 = 5;
/// include/uapi/linux/virtio_balloon.h.
const VIRTIO_BALLOON_F_REPORTING: usize = 5;
/// include/linux/page_reporting.h: how many blocks one report takes off the free lists.
pub const PAGE_REPORTING_CAPACITY: u64 = 32;
/// x86-64's pageblock_order, where reporting starts on a kernel without the module parameter.
const PAGEBLOCK_ORDER: u32 = 9;

/// Free page reporting that is on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageReporting {
    /// Blocks of this order and above are reported.
    pub order: u32,
    /// The reporting device: `virtio0 (virtio_balloon)`.
    pub device: String,
}

impl PageReporting {
    /// Whether this machine reports free pages: `None` when no balloon negotiated it.
    pub fn read() -> Result<Option<PageReporting>> {
        let Some(device) = reporting_virtio_device(Path::new(VIRTIO_DEVICES))? else { return Ok(None) };
        let order = match std::fs::read_to_string(ORDER_PATH) {
            Ok(text) => parse_order(&text, ORDER_PATH)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => PAGEBLOCK_ORDER,
            Err(source) => return Err(Error::Io { path: ORDER_PATH.into(), source }),
        };
        Ok(Some(PageReporting { order, device }))
    }

    /// The most memory a report holds off the free lists at once, in pages: 32 blocks of the top
    /// order (`nr_orders - 1`) — reporting goes through every order from its own up.
    pub fn isolated_pages_at_most(&self, nr_orders: usize) -> u64 {
        PAGE_REPORTING_CAPACITY << nr_orders.saturating_sub(1)
    }

    /// `free page reporting (virtio0 (virtio_balloon), order ≥ 9)`.
    pub fn describe(&self) -> String {
        format!("free page reporting ({}, order ≥ {})", self.device, self.order)
    }
}

/// `page_reporting_order`: one number.
pub fn parse_order(text: &str, path: impl AsRef<Path>) -> Result<u32> {
    let line = text.lines().next().unwrap_or("");
    line.trim().parse().map_err(|_| Error::parse(path.as_ref(), 1, line, "expected an order"))
}

/// A virtio device's `features`: one `0`/`1` a feature bit, bit 0 first, as the driver negotiated.
pub fn parse_features(text: &str, path: impl AsRef<Path>) -> Result<Vec<bool>> {
    let line = text.lines().next().unwrap_or("");
    line.trim()
        .chars()
        .map(|c| match c {
            '0' => Ok(false),
            '1' => Ok(true),
            _ => Err(Error::parse(path.as_ref(), 1, line, format!("feature bit {c:?} is not 0 or 1"))),
        })
        .collect()
}

/// A virtio device's `device`: its id in hex (`0x0005`).
pub fn parse_device_id(text: &str, path: impl AsRef<Path>) -> Result<u32> {
    let line = text.lines().next().unwrap_or("");
    line.trim()
        .strip_prefix("0x")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| Error::parse(path.as_ref(), 1, line, "expected a device id like 0x0005"))
}

/// The first bound virtio-balloon under `devices` that negotiated reporting, as
/// `virtio0 (virtio_balloon)`. A missing directory is a machine without virtio.
pub fn reporting_virtio_device(devices: &Path) -> Result<Option<String>> {
    let entries = match std::fs::read_dir(devices) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path: devices.into(), source }),
    };
    let mut names: Vec<String> =
        entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    for name in names {
        let dir = devices.join(&name);
        let id_path = dir.join("device");
        if parse_device_id(&read_to_string(&id_path)?, &id_path)? != VIRTIO_ID_BALLOON {
            continue;
        }
        // Features are negotiated when a driver binds; an unbound balloon reports nothing.
        let Some(driver) = driver_name(&dir) else { continue };
        let features_path = dir.join("features");
        let features = parse_features(&read_to_string(&features_path)?, &features_path)?;
        if features.get(VIRTIO_BALLOON_F_REPORTING) == Some(&true) {
            return Ok(Some(format!("{name} ({driver})")));
        }
    }
    Ok(None)
}

/// The driver bound to a device: the name its `driver` link points at (a capture keeps the link,
/// dangling).
fn driver_name(dir: &Path) -> Option<String> {
    let target = std::fs::read_link(dir.join("driver")).ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}
