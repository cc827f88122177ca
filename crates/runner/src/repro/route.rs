//! How to reach a reported allocation in a guest: the call-site table.
//!
//! Each row names the kernel functions that identify a path in a report's call trace (any frame from
//! the call site outwards) and the fraglab workload that makes the kernel allocate through that path
//! again. A report that names one of them is reproduced at its **same call site**: the catcher must
//! see the failure with one of the row's functions on its stack. Any other call site gets a
//! **same-order proxy**: a trigger that makes one allocation of exactly the report's order through
//! another path — it shows the machine fails that order as the reporter's did, not that the
//! reporter's code path does — and the reason the real path cannot be driven is said (a device
//! driver needs its device, a filesystem its disk). docs/repro.md prints this table for users.

use serde::Serialize;

use fraglab_workload::trigger::Pages;

/// Why [`choose`] found no way to the allocation.
#[derive(Debug)]
pub enum Refusal {
    /// No fault of the report's: the lab cannot test it (exit 125).
    CannotTest(String),
    /// The report's kernel is not one an x86-64 guest can stand for (exit 255).
    Unlike(String),
}

/// Whether the workload goes through the report's own call site or only makes an allocation of its
/// order elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reach {
    SameSite,
    Proxy,
}

impl Reach {
    pub fn name(self) -> &'static str {
        match self {
            Reach::SameSite => "same call site",
            Reach::Proxy => "same-order proxy",
        }
    }
}

/// A `[[workload]]` table, as the config will say it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// `key = value` lines, values already TOML (`kind = "trigger"`, `repeat = 10`).
    pub keys: Vec<(String, String)>,
    /// What it does, for the config's comment.
    pub what: String,
    /// The kernel must have SCTP (the guest loads the module).
    pub needs_sctp: bool,
}

/// The chosen way to the allocation.
#[derive(Clone, Debug, Serialize)]
pub struct Route {
    pub reach: Reach,
    pub workload: Workload,
    /// `[expect] failed_in`: a caught failure counts only with one of these on its stack.
    pub failed_in: Vec<String>,
    /// Why this row (the report's frame it matched), in words.
    pub reason: String,
    /// For a proxy: what the report's own path needs that a guest lacks.
    pub missing: Option<String>,
}

/// One row of the table.
pub struct Row {
    /// Functions that pick this row when a report's trace names one (the compiler's `.isra.0` and
    /// `.constprop.0` clones included).
    pub functions: &'static [&'static str],
    /// The path, for the table in docs/repro.md.
    pub path: &'static str,
    /// The functions a current kernel's allocation on this path has on its stack: what the
    /// catcher looks for, beside the report's own frames that are among `functions`.
    pub now_in: &'static [&'static str],
    /// The workload for an allocation of `order`, or why this path cannot make one of that order.
    pub workload: fn(u32, &Pages) -> Result<Workload, String>,
}

/// The table. The first row whose functions the report's trace names wins, so narrower rows come
/// first (SCTP's skb paths before the generic skb one).
pub const TABLE: &[Row] = &[
    Row {
        functions: &["pipe_fcntl", "pipe_set_size", "pipe_resize_ring", "alloc_pipe_info"],
        path: "pipe buffers: F_SETPIPE_SZ resizes the pipe_buffer array (kcalloc of 40 B a slot)",
        now_in: &["pipe_fcntl", "pipe_set_size", "pipe_resize_ring"],
        workload: pipe,
    },
    Row {
        functions: &[
            "sctp_stream_init",
            "sctp_stream_alloc_out",
            "sctp_stream_alloc_in",
            "sctp_stream_new",
            "sctp_association_init",
            "sctp_association_new",
            "sctp_process_init",
            "sctp_make_temp_asoc",
            "sctp_sf_do_5_1B_init",
        ],
        path: "SCTP association setup: the stream tables for the INIT's stream counts",
        now_in: &["sctp_stream_init", "sctp_association_new", "sctp_process_init"],
        workload: sctp_connect,
    },
    Row {
        functions: &["sctp_setsockopt_bindx", "sctp_bindx_add"],
        path: "SCTP_SOCKOPT_BINDX_ADD: the address list copied in (memdup_sockptr)",
        now_in: &["sctp_setsockopt"],
        workload: sctp_bindx,
    },
    Row {
        functions: &[
            "sctp_datamsg_from_user",
            "_sctp_make_chunk",
            "sctp_make_datafrag_empty",
            "sctp_packet_transmit",
            "sctp_packet_pack",
            "sctp_sendmsg",
            "sctp_sendmsg_to_asoc",
        ],
        path: "SCTP data: one linear skb per chunk and per packet, up to the path MTU (lo: 64 KiB)",
        now_in: &["sctp_datamsg_from_user", "sctp_packet_transmit"],
        workload: sctp_stream,
    },
    Row {
        functions: &["ip_mc_msfilter", "do_ip_setsockopt"],
        path: "IP_MSFILTER: the filter copied in (memdup_sockptr)",
        now_in: &["do_ip_setsockopt"],
        workload: ip_msfilter,
    },
    Row {
        functions: &["____sys_sendmsg", "___sys_sendmsg"],
        path: "sendmsg control data: sock_kmalloc of msg_controllen",
        now_in: &["____sys_sendmsg", "___sys_sendmsg"],
        workload: |order, pages| Ok(udp_cmsg(order, pages)),
    },
    Row {
        functions: &[
            "alloc_fresh_huge_page",
            "alloc_buddy_huge_page",
            "alloc_pool_huge_page",
            "alloc_pool_huge_folio",
            "set_max_huge_pages",
            "nr_hugepages_store_common",
            "__nr_hugepages_store_common",
        ],
        path: "hugetlb pool growth: vm.nr_hugepages asks for one huge page at a time",
        now_in: &["set_max_huge_pages"],
        workload: hugetlb,
    },
    Row {
        functions: &["io_mem_alloc", "io_pages_map", "io_allocate_scq_urings"],
        path: "io_uring_setup: the SQE array and the CQ ring, one block each",
        now_in: &["io_allocate_scq_urings", "io_uring_create"],
        workload: io_uring,
    },
    Row {
        functions: &["skb_page_frag_refill", "sk_page_frag_refill", "tcp_sendmsg_locked", "tcp_sendmsg"],
        path: "TCP sendmsg: order-3 page frags (falls back to single pages)",
        now_in: &["skb_page_frag_refill", "tcp_sendmsg_locked"],
        workload: tcp_stream,
    },
];

/// Frames of a device driver, by module or function prefix: a guest has no such device.
const DRIVERS: &[(&str, &str)] = &[
    ("radeon", "an AMD Radeon GPU (qemu emulates none)"),
    ("amdgpu", "an AMD GPU (qemu emulates none)"),
    ("dc_", "an AMD GPU's display core (qemu emulates none)"),
    ("dm_", "an AMD GPU's display manager (qemu emulates none)"),
    ("i915", "an Intel GPU (qemu emulates none)"),
    ("nouveau", "an NVIDIA GPU (qemu emulates none)"),
    ("drm_", "a GPU with a DRM driver (qemu's are not the reporter's)"),
    ("mhi_", "a Qualcomm MHI device (ath11k/ath12k Wi-Fi, a modem) on PCIe (qemu emulates none)"),
    ("ath1", "a Qualcomm Atheros Wi-Fi card (qemu emulates none)"),
    ("ath9k", "a Qualcomm Atheros Wi-Fi card (qemu emulates none)"),
    ("iwl", "an Intel Wi-Fi card (qemu emulates none)"),
    ("mt76", "a MediaTek Wi-Fi chip (qemu emulates none)"),
    ("mt7", "a MediaTek Wi-Fi chip (qemu emulates none)"),
    ("r8152", "a Realtek USB Ethernet adapter (qemu emulates none)"),
    ("rtl8152", "a Realtek USB Ethernet adapter (qemu emulates none)"),
    ("rtl", "a Realtek network chip (qemu emulates none)"),
    ("uvc_", "a USB video camera (qemu emulates none)"),
    ("vb2_", "a V4L2 capture device (qemu emulates none)"),
    ("fec_", "a Freescale/NXP FEC Ethernet controller (an i.MX board)"),
    ("mlx", "a Mellanox/NVIDIA NIC (qemu emulates none)"),
    ("ixgbe", "an Intel 10GbE NIC (qemu emulates none)"),
    ("i40e", "an Intel 40GbE NIC (qemu emulates none)"),
    ("e1000", "an Intel NIC driver (qemu's e1000 is not the reporter's NIC)"),
    ("xhci", "a USB 3 host controller"),
    ("usb_", "a USB device"),
    ("nvme", "an NVMe drive"),
    ("dma_pool", "a device's DMA pool (the driver that made it)"),
    ("dmam_pool", "a device's DMA pool (the driver that made it)"),
    ("hid_", "a HID device"),
    ("kgsl", "a Qualcomm Adreno GPU (Android)"),
    ("binder", "Android's binder (CONFIG_ANDROID_BINDER_IPC, not in Debian's cloud kernel)"),
    ("zs_", "zsmalloc/zram"),
    ("privcmd", "Xen's privcmd device (a Xen dom0)"),
    ("xen", "a Xen hypervisor"),
    ("RTMP", "a Ralink USB Wi-Fi adapter (its vendor driver)"),
];

/// `radeon_cs_ioctl+0x2a/0x90 [radeon]` → `radeon`: the module a frame names.
fn module_of(stack: &[String]) -> Option<String> {
    stack.iter().find_map(|f| {
        let (_, rest) = f.rsplit_once('[')?;
        // `[<c0100159>]` is an ARM frame's address, not a module.
        let m = rest.strip_suffix(']')?.trim();
        let name = !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        name.then(|| m.to_string())
    })
}

/// The row for a report's path, and the frame that matched it: the call site or its caller must
/// be one of the row's functions. Frames further out are entry points many paths share (every
/// sendmsg passes ____sys_sendmsg, whatever it allocates).
pub fn lookup(path: &[String]) -> Option<(&'static Row, String)> {
    let name = |f: &str| fraglab_probe::stack::function_name(f).unwrap_or(f).to_string();
    for row in TABLE {
        if let Some(f) = path.iter().take(2).map(|f| name(f)).find(|f| row.functions.contains(&f.as_str())) {
            return Some((row, f));
        }
    }
    None
}

/// Choose how to reach an allocation of `order` that failed at `site` with `path` (from the call
/// site outwards) and this `stack` (as printed, for module names).
pub fn choose(order: u32, path: &[String], stack: &[String], pages: &Pages) -> Result<Route, Refusal> {
    if order > pages.max_order {
        return Err(Refusal::Unlike(format!(
            "order {order}: the guest (x86-64) has orders 0–{}: the report's kernel had a larger largest \
             order (MAX_PAGE_ORDER: arm64 with 16 or 64 KiB pages, or a custom CONFIG_ARCH_FORCE_MAX_ORDER)",
            pages.max_order
        )));
    }
    // Every row's workload, and the proxy, can rely on this: kmalloc sizes are only exact from 2.
    if order < 2 {
        return Err(Refusal::CannotTest(format!(
            "order {order}: no workload makes a page-allocator block of order {order} \
             (kmalloc serves up to two pages from its slab caches), and an order-{order} failure is \
             memory running out, not fragmentation: fraglab shapes free memory, it does not exhaust a \
             machine"
        )));
    }
    if let Some((row, matched)) = lookup(path) {
        let workload = match (row.workload)(order, pages) {
            Ok(w) => w,
            Err(e) => {
                let unreachable = format!("the report's trace names {matched} ({}), but {e}", row.path);
                return Ok(proxy_route(order, path, Some(unreachable), stack, pages));
            }
        };
        let mut failed_in: Vec<String> =
            path.iter().filter_map(|f| fraglab_probe::stack::function_name(f)).map(String::from).collect();
        failed_in.retain(|f| row.functions.contains(&f.as_str()) || row.now_in.contains(&f.as_str()));
        for f in row.now_in {
            if !failed_in.iter().any(|x| x == f) {
                failed_in.push(f.to_string());
            }
        }
        return Ok(Route {
            reach: Reach::SameSite,
            workload,
            failed_in,
            reason: format!("the report's trace names {matched}: {}", row.path),
            missing: None,
        });
    }
    Ok(proxy_route(order, path, None, stack, pages))
}

/// The proxy for any order from 2 (just above the kmalloc caches) to the largest: udp-cmsg's
/// control buffer (sock_kmalloc, GFP_KERNEL, logged like the reports are), caught with sendmsg's
/// entry on its stack.
fn proxy_route(
    order: u32,
    path: &[String],
    unreachable: Option<String>,
    stack: &[String],
    pages: &Pages,
) -> Route {
    let site = path.first().cloned().unwrap_or_else(|| "(no call trace)".into());
    let missing = unreachable.unwrap_or_else(|| missing(path, stack));
    Route {
        reach: Reach::Proxy,
        workload: udp_cmsg(order, pages),
        failed_in: vec!["____sys_sendmsg".into(), "___sys_sendmsg".into()],
        reason: format!(
            "no fraglab workload goes through {site}: {}; the proxy makes one order-{order} allocation \
             through another path",
            missing
        ),
        missing: Some(missing),
    }
}

/// What the report's own path needs that a guest does not have.
fn missing(path: &[String], stack: &[String]) -> String {
    let names: Vec<&str> = path.iter().map(|f| fraglab_probe::stack::function_name(f).unwrap_or(f)).collect();
    let module = module_of(stack);
    for (prefix, what) in DRIVERS {
        let hit = names.iter().take(6).any(|n| n.starts_with(prefix))
            || module.as_deref().is_some_and(|m| m.starts_with(prefix));
        if hit {
            let by = module.as_deref().map_or_else(String::new, |m| format!(" (module {m})"));
            return format!("the call site is a device driver's{by}: it needs {what}");
        }
    }
    if let Some(m) = module {
        return format!("the call site is in module {m}, whose device or filesystem a guest lacks");
    }
    match names.first() {
        Some(f) => format!("the call site {f} has no row in the call-site table (docs/repro.md)"),
        None => "the report printed no call trace".to_string(),
    }
}

fn keys(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

fn trigger(name: &str, more: &[(&str, String)], what: String, needs_sctp: bool) -> Workload {
    let mut k = vec![("kind", "\"trigger\"".to_string()), ("trigger", format!("\"{name}\""))];
    k.extend(more.iter().cloned());
    Workload { keys: keys(&k), what, needs_sctp }
}

/// Bytes for a kmalloc'd buffer whose page-allocator block is exactly `order`: one page past the
/// order below, so `get_order()` is `order`.
fn kmalloc_bytes(order: u32, pages: &Pages) -> u64 {
    debug_assert!(order >= 2, "choose refuses orders below 2 before any row's workload");
    (pages.page_size << (order - 1)) + pages.page_size
}

fn size(bytes: u64) -> String {
    format!(
        "\"{}\"",
        if bytes % (1 << 20) == 0 { format!("{}MiB", bytes >> 20) } else { format!("{}KiB", bytes >> 10) }
    )
}

fn pipe(order: u32, pages: &Pages) -> Result<Workload, String> {
    let bytes = (12..=40)
        .map(|s| 1u64 << s)
        .find(|&b| pages.pipe_resize_order(b).0 == order)
        .ok_or_else(|| format!("no pipe size makes an order-{order} pipe_buffer array (orders 2–10 do)"))?;
    Ok(trigger(
        "pipe-resize",
        &[("bytes", size(bytes)), ("repeat", "10".into())],
        format!(
            "F_SETPIPE_SZ to {}: an order-{order} pipe_buffer array, 10 times",
            size(bytes).trim_matches('"')
        ),
        false,
    ))
}

fn sctp_connect(order: u32, _: &Pages) -> Result<Workload, String> {
    Ok(Workload {
        keys: keys(&[
            ("kind", "\"sctp-connect\"".into()),
            ("associations", "30".into()),
            ("streams", "65535".into()),
            ("timeout", "\"2s\"".into()),
        ]),
        what: format!(
            "30 SCTP associations asking for 65535 streams each (the most SCTP_INITMSG takes; the kernel \
             that failed at order {order} sized its stream tables from them)"
        ),
        needs_sctp: true,
    })
}

fn sctp_bindx(order: u32, pages: &Pages) -> Result<Workload, String> {
    // sctp_setsockopt trims optlen to PAGE_ALIGN(65535 + 16): order 4 at 64 KiB, order 5 above.
    let bytes = match order {
        4 => 64 << 10,
        5 => 65 << 10,
        _ => return Err(format!("the address list reaches orders 4 and 5 only, not {order}")),
    };
    let _ = pages;
    Ok(trigger(
        "sctp-bindx",
        &[("bytes", size(bytes)), ("repeat", "10".into())],
        format!(
            "SCTP_SOCKOPT_BINDX_ADD with a {} address list: order {order}, 10 times",
            size(bytes).trim_matches('"')
        ),
        true,
    ))
}

fn sctp_stream(order: u32, pages: &Pages) -> Result<Workload, String> {
    // One DATA chunk per message on lo (MTU 65536): a linear skb of the message and its headers.
    if !(1..=4).contains(&order) {
        return Err(format!("lo's 64 KiB MTU makes SCTP skbs of orders 1–4, not {order}"));
    }
    let msg = (pages.page_size << (order - 1)).max(4096);
    Ok(Workload {
        keys: keys(&[("kind", "\"sctp-stream\"".into()), ("duration", "\"3s\"".into()), ("msg", size(msg))]),
        what: format!(
            "SCTP bulk transfer on lo with {} messages: each one DATA chunk in one order-{order} skb",
            size(msg).trim_matches('"')
        ),
        needs_sctp: true,
    })
}

fn ip_msfilter(order: u32, pages: &Pages) -> Result<Workload, String> {
    Ok(kmalloc_trigger("ip-msfilter", "IP_MSFILTER with a {} filter", order, pages))
}

fn udp_cmsg(order: u32, pages: &Pages) -> Workload {
    kmalloc_trigger(
        "udp-cmsg",
        "UDP sendmsg with a {} control buffer (sock_kmalloc, GFP_KERNEL)",
        order,
        pages,
    )
}

/// A trigger whose `bytes` are one kmalloc of exactly `order` (2 and up), 10 times; `what` says
/// what it does with `{}` for the size.
fn kmalloc_trigger(name: &str, what: &str, order: u32, pages: &Pages) -> Workload {
    let bytes = kmalloc_bytes(order, pages);
    let what = what.replace("{}", size(bytes).trim_matches('"'));
    trigger(
        name,
        &[("bytes", size(bytes)), ("repeat", "10".into())],
        format!("{what}: order {order}, 10 times"),
        false,
    )
}

fn hugetlb(order: u32, pages: &Pages) -> Result<Workload, String> {
    let huge = pages.order(pages.huge_page_size);
    if order != huge {
        return Err(format!("vm.nr_hugepages allocates order {huge} pages, not order {order}"));
    }
    Ok(trigger(
        "hugetlb",
        &[("pages", "16".into())],
        format!("vm.nr_hugepages += 1, 16 times: order {order}"),
        false,
    ))
}

fn io_uring(order: u32, _: &Pages) -> Result<Workload, String> {
    // entries × 64 B of SQEs: 32768 → 2 MiB, order 9; one order less per halving.
    if !(2..=9).contains(&order) {
        return Err(format!("the SQE array reaches orders 2–9 (up to 32768 entries), not {order}"));
    }
    let entries = 32768u64 >> (9 - order);
    Ok(trigger(
        "io-uring",
        &[("entries", entries.to_string()), ("repeat", "10".into())],
        format!("io_uring_setup({entries}): an order-{order} SQE array, 10 times"),
        false,
    ))
}

fn tcp_stream(order: u32, _: &Pages) -> Result<Workload, String> {
    if order != 3 {
        return Err(format!("TCP's page frags are order 3 (32 KiB), not {order}"));
    }
    Ok(Workload {
        keys: keys(&[
            ("kind", "\"tcp-stream\"".into()),
            ("threads", "2".into()),
            ("duration", "\"5s\"".into()),
        ]),
        what: "2 TCP streams over loopback for 5 s: sendmsg fills order-3 page frags".into(),
        needs_sctp: false,
    })
}
