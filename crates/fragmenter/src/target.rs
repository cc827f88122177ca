//! What the fragmenter is asked to reach: a ceiling on the free order, or a whole buddyinfo profile.

use fraglab_probe::kmsg::{split_log_line, strip_mail_quote};
use serde::{Deserialize, Serialize};

use crate::arena::PAGE_SIZE;

/// The shape free memory should have once the fragmenter is done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Target {
    /// No free block of order `order` or above, while `free_bytes` stay free in smaller blocks —
    /// the seeds' state: plenty of free memory, none of it contiguous.
    MaxFreeOrder { order: usize, free_bytes: u64 },
    /// Reproduce these free-block counts per order (index = order), as read from a bug report.
    Profile {
        /// The NUMA node the line came from (`Node 1, zone Normal …`), when the line said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
        /// The zone the line came from (`Normal`), when the line said.
        zone: Option<String>,
        free: Vec<u64>,
    },
    /// A whole machine's state: every node/zone line of a saved `/proc/buddyinfo` or a report's
    /// Mem-Info block, each reproduced in its own zone at once (`--profile-file`).
    Zones {
        zones: Vec<ZoneProfile>,
        /// Lines of the file that are not shaped, and why (`Node 0, zone DMA: …`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        skipped: Vec<String>,
    },
}

impl Target {
    /// Bytes the target leaves free (in its blocks below the order, or its profiles' blocks).
    pub fn free_bytes(&self) -> u64 {
        match self {
            Target::MaxFreeOrder { free_bytes, .. } => *free_bytes,
            Target::Profile { free, .. } => profile_free_bytes(free),
            Target::Zones { zones, .. } => {
                zones.iter().map(|z| profile_free_bytes(&z.free)).fold(0, u64::saturating_add)
            }
        }
    }
}

/// Bytes free in a profile's blocks.
pub fn profile_free_bytes(free: &[u64]) -> u64 {
    let page = PAGE_SIZE as u64;
    free.iter().enumerate().map(|(o, &n)| n.saturating_mul(page << o)).fold(0, u64::saturating_add)
}

/// One zone's line of a [`Target::Zones`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneProfile {
    pub node: u32,
    pub zone: String,
    pub free: Vec<u64>,
    /// Where the line was in the file (1-based).
    pub line: usize,
}

impl ZoneProfile {
    /// `Node 1, zone Normal`, as buddyinfo labels it.
    pub fn label(&self) -> String {
        format!("Node {}, zone {}", self.node, self.zone)
    }
}

/// Every node/zone line of a profile file: a saved `/proc/buddyinfo`, or a report's Mem-Info block
/// (`Node 0 DMA32: 2137*4kB (UME) … = 48892kB`), as pasted, with log prefixes — read by the same
/// scanner as `fraglab scan`, so a line scan reads is one this takes. A line without a node (a
/// kernel without NUMA) is node 0's. Anything else in the file is read past, failure reports the
/// scanner cannot read included; a free-area or buddyinfo line that does not parse, a zone given
/// twice (two reports pasted together: keep one report's block) or a file with no line is an error
/// naming the file and line.
pub fn parse_profile_file(text: &str, path: &std::path::Path) -> Result<Vec<ZoneProfile>, String> {
    use fraglab_probe::kmsg::{scan_log, KmsgEvent};
    let scan = scan_log(text, path);
    let profile_line = |t: &str| {
        let m = split_log_line(strip_mail_quote(t)).message.trim().to_string();
        (m.contains("kB") && m.contains('*')) || m.starts_with("Node ")
    };
    let bad = scan.warnings.iter().find(|w| match w {
        fraglab_probe::Error::Parse { text, .. } => profile_line(text),
        _ => true,
    });
    if let Some(w) = bad {
        return Err(format!("{w}: fix or remove the line"));
    }
    let mut zones: Vec<ZoneProfile> = Vec::new();
    for found in scan.events {
        let z = match found.event {
            KmsgEvent::BuddyInfo(z) => {
                ZoneProfile { node: z.node, zone: z.zone, free: z.free, line: found.line }
            }
            KmsgEvent::FreeArea(a) => {
                let at = format!("{}:{}", path.display(), found.line);
                let Some(zone) = a.zone else {
                    return Err(format!("{at}: the free-area line names no zone"));
                };
                if a.page_kb != 4 {
                    return Err(format!(
                        "{at}: the line's order-0 blocks are {}kB: only 4kB-page profiles can be reproduced here",
                        a.page_kb
                    ));
                }
                ZoneProfile { node: a.node.unwrap_or(0), zone, free: a.free, line: found.line }
            }
            _ => continue,
        };
        plausible(&z.free).map_err(|e| format!("{}:{}: {e}", path.display(), z.line))?;
        if let Some(first) = zones.iter().find(|o| o.node == z.node && o.zone == z.zone) {
            return Err(format!(
                "{}:{}: {} is given a second time (first on line {}): keep one report's block or one \
                 buddyinfo in the file",
                path.display(),
                z.line,
                z.label(),
                first.line
            ));
        }
        zones.push(z);
    }
    if zones.is_empty() {
        return Err(format!(
            "{}: no buddyinfo line (`Node 0, zone Normal 1 2 3 …`) and no Mem-Info free-area line \
             (`Node 0 Normal: 1*4kB … = 4kB`) in it",
            path.display()
        ));
    }
    Ok(zones)
}

/// Why a DMA line is never a target, as every command that meets one says it.
pub const DMA_NOT_SHAPED: &str = "zone DMA cannot be shaped: the kernel keeps it for DMA allocations \
                                  (lowmem_reserve), and user pages, the only ones fraglab can take and \
                                  free, never reach it";

/// A pasted profile line, read: where it came from when it says, and its counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileLine {
    /// `Node 1, zone Normal …` and `Node 1 Normal: …` say; a non-NUMA kernel's `Normal: …` does not.
    pub node: Option<u32>,
    pub zone: Option<String>,
    pub free: Vec<u64>,
}

/// Parse a profile as a user pastes it from a bug report.
///
/// Two forms are accepted:
/// - a `/proc/buddyinfo` line: `Node 0, zone Normal 40773 37 34 29 0 0 0 0 0 0 0`, or just the counts;
/// - a kernel Mem-Info free-area line, as printed with a page allocation failure:
///   `Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) 0*32kB ... = 3016kB`.
///
/// Either as the log has it: with dmesg's `[ 2161.781102] ` or `<4>`, a syslog or journal prefix,
/// a caller-id column or a mail's `> ` (the same prefixes `fraglab scan` takes off), and a line a
/// mail client wrapped pasted as its pieces, each with its own prefix.
pub fn parse_profile(text: &str) -> Result<ProfileLine, String> {
    let text: Vec<String> = text
        .lines()
        .map(|l| split_log_line(strip_mail_quote(l)).message.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let line = parse_profile_counts(&text.join(" "))?;
    plausible(&line.free)?;
    Ok(line)
}

/// Counts no machine has (they would overflow the page arithmetic) are a bad paste, not a target.
pub fn plausible(free: &[u64]) -> Result<(), String> {
    let pages = free
        .iter()
        .enumerate()
        .try_fold(0u64, |sum, (o, &n)| n.checked_mul(2 << o).and_then(|p| sum.checked_add(p)));
    if pages.is_none_or(|p| p > 1 << 40) {
        return Err(format!(
            "{} free blocks per order is more memory than any machine has (the blocks and the buddies \
             kept beside them come to over 4 PiB); check the pasted line",
            free.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
        ));
    }
    Ok(())
}

fn parse_profile_counts(text: &str) -> Result<ProfileLine, String> {
    let text = text.trim();
    if text.contains("kB") && text.contains('*') {
        return parse_meminfo_line(text);
    }
    if text.starts_with("Node") {
        let zone = fraglab_probe::buddyinfo::parse_line(text)?;
        return Ok(ProfileLine { node: Some(zone.node), zone: Some(zone.zone), free: zone.free });
    }
    let free = text
        .split_whitespace()
        .enumerate()
        .map(|(order, f)| f.parse::<u64>().map_err(|_| format!("order {order}: {f:?} is not a count")))
        .collect::<Result<Vec<_>, _>>()?;
    if free.is_empty() {
        return Err("the profile is empty: give a buddyinfo line or a Mem-Info line".into());
    }
    Ok(ProfileLine { node: None, zone: None, free })
}

/// `Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) 0*32kB 0*64kB ... = 3016kB`, or with `Node 0 `
/// before the zone. The line is read by the probe's kernel-log parser, the same one `fraglab scan`
/// uses, so every profile scan prints is one this accepts.
fn parse_meminfo_line(text: &str) -> Result<ProfileLine, String> {
    let area = fraglab_probe::kmsg::FreeArea::parse(text)?;
    // The fragmenter shapes 4kB pages; a 16kB- or 64kB-page report's orders mean other sizes here.
    if area.page_kb != 4 {
        return Err(format!(
            "the line's order-0 blocks are {}kB: only 4kB-page profiles can be reproduced here",
            area.page_kb
        ));
    }
    Ok(ProfileLine { node: area.node, zone: area.zone, free: area.free })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_no_machine_has_are_refused_not_overflowed() {
        let e = parse_profile("Node 0, zone Normal 0 0 0 0 0 0 0 0 0 0 9223372036854775807").unwrap_err();
        assert!(e.contains("more memory than any machine has"), "{e}");
        assert!(parse_profile("18446744073709551615 18446744073709551615 1").is_err());
        // Seed 000's fragmented profile, and a whole 24 GiB of order-10 blocks, are fine.
        assert!(parse_profile("Node 0, zone Normal 40773 37 34 29 0 0 0 0 0 0 0").is_ok());
        assert!(plausible(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6144]).is_ok());
    }

    #[test]
    fn seed_buddyinfo_line() {
        let p = parse_profile("Node 1, zone Normal 40773 37 34 29 0 0 0 0 0 0 0").unwrap();
        assert_eq!((p.node, p.zone.as_deref()), (Some(1), Some("Normal")));
        assert_eq!(p.free, vec![40773, 37, 34, 29, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn meminfo_line() {
        let line = "Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) 0*32kB 0*64kB 0*128kB 0*256kB \
                    0*512kB 0*1024kB 0*2048kB 0*4096kB = 3016kB";
        let p = parse_profile(line).unwrap();
        assert_eq!((p.node, p.zone.as_deref()), (None, Some("Normal")), "a non-NUMA kernel's line");
        assert_eq!(p.free, vec![512, 97, 12, 0, 0, 0, 0, 0, 0, 0, 0]);
        let p = parse_profile(&format!("Node 3 {line}")).unwrap();
        assert_eq!((p.node, p.zone.as_deref()), (Some(3), Some("Normal")));
    }

    #[test]
    fn meminfo_line_with_wrong_total_is_refused() {
        let err = parse_profile("Normal: 1*4kB 1*8kB = 16kB").unwrap_err();
        assert!(err.contains("12kB"), "{err}");
    }

    #[test]
    fn lines_as_logs_print_them() {
        let want = vec![512, 97, 12, 0, 0, 0, 0, 0, 0, 0, 0];
        let tail = "Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) 0*32kB 0*64kB 0*128kB 0*256kB \
                    0*512kB 0*1024kB 0*2048kB 0*4096kB = 3016kB";
        for prefix in [
            "[ 2161.781102] ",
            "<4>[ 2161.781102] ",
            "Jul 31 17:17:05 fs kernel: [11918.534744] ",
            "kernel: ",
            "[   14.018361][    T1] ",
            "<4>[ 6207.637280]  [3:  Binder:9343_3:22875] ",
            "> > ",
        ] {
            let p = parse_profile(&format!("{prefix}{tail}")).unwrap_or_else(|e| panic!("{prefix}: {e}"));
            assert_eq!((p.zone.as_deref(), &p.free), (Some("Normal"), &want), "{prefix}");
        }
        // Wrapped by a mail client, each piece with its stamp.
        let wrapped = "[ 3.1] Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) 0*32kB 0*64kB 0*128kB\n\
                       [ 3.1] 0*256kB 0*512kB 0*1024kB 0*2048kB 0*4096kB = 3016kB";
        assert_eq!(parse_profile(wrapped).unwrap().free, want);
        let buddy = "Jul 31 17:17:05 fs kernel: Node 0, zone Normal 40773 37 34 29 0 0 0 0 0 0 0";
        assert_eq!(parse_profile(buddy).unwrap().free[..4], [40773, 37, 34, 29]);
    }

    /// A whole report: its Mem-Info block's free-area lines are the file's lines, node by node
    /// (the 8-node SLE 15 machine of the captures), everything else in the log is read past.
    #[test]
    fn profile_file_of_a_mem_info_block() {
        let path =
            std::path::Path::new("lkml-2022-08-23-sle15-x86-swapper-order10-dmapool-callerid-8node.dmesg");
        let text = include_str!(
            "../../probe/tests/captures/kmsg/lkml-2022-08-23-sle15-x86-swapper-order10-dmapool-callerid-8node.dmesg"
        );
        let zones = parse_profile_file(text, path).unwrap();
        let labels: Vec<String> = zones.iter().map(ZoneProfile::label).collect();
        assert_eq!(labels[..3], ["Node 0, zone DMA", "Node 0, zone DMA32", "Node 0, zone Normal"]);
        assert_eq!(labels.len(), 10, "{labels:?}");
        assert_eq!(labels[9], "Node 7, zone Normal");
        assert_eq!(zones[1].free, vec![0; 11], "DMA32 had nothing free");
        assert_eq!(zones[2].free[10], 386558);
        assert!(zones.windows(2).all(|w| w[0].line < w[1].line));

        // Two reports pasted together: the same zone twice is refused, naming both lines.
        let twice = format!("{text}\n{text}");
        let e = parse_profile_file(&twice, path).unwrap_err();
        let first = zones[0].line;
        assert!(
            e.contains(&format!("Node 0, zone DMA is given a second time (first on line {first})")),
            "{e}"
        );
        assert!(e.starts_with(&format!("{}:", path.display())), "{e}");
    }

    /// A log whose failure report the scanner cannot read (its call trace lost its header) still
    /// gives its free-area line: only a profile line that does not parse refuses the file.
    #[test]
    fn profile_file_reads_past_an_unreadable_report() {
        let name = "lkml-2020-06-13-android-arm64-kswapd0-noheader-callercol.dmesg";
        let text = include_str!(
            "../../probe/tests/captures/kmsg/lkml-2020-06-13-android-arm64-kswapd0-noheader-callercol.dmesg"
        );
        assert!(!fraglab_probe::kmsg::scan_log(text, name).warnings.is_empty(), "the capture warns");
        let zones = parse_profile_file(text, std::path::Path::new(name)).unwrap();
        assert_eq!(zones.len(), 1, "{zones:?}");
        assert_eq!(zones[0].zone, "Normal");
    }

    /// A saved two-node /proc/buddyinfo (a `fraglab vm --numa 2` guest's), and files that are not.
    #[test]
    fn profile_file_of_a_buddyinfo() {
        let path = std::path::Path::new("buddyinfo");
        let text = include_str!("../../probe/tests/captures/guest-6.1-numa2/buddyinfo");
        let zones = parse_profile_file(text, path).unwrap();
        let at: Vec<(u32, &str, usize)> = zones.iter().map(|z| (z.node, z.zone.as_str(), z.line)).collect();
        assert_eq!(at, [(0, "DMA", 1), (0, "DMA32", 2), (1, "DMA32", 3)]);
        let e = parse_profile_file("nothing here\n", path).unwrap_err();
        assert!(e.contains("buddyinfo: no buddyinfo line"), "{e}");
        let e = parse_profile_file("Node 0, zone Normal 1 2\nNode 0 DMA32: 1*4kB 1*8kB = 16kB\n", path)
            .unwrap_err();
        assert!(e.starts_with("buddyinfo:2: ") && e.contains("12kB"), "{e}");
    }

    #[test]
    fn bare_counts_and_garbage() {
        assert_eq!(parse_profile("3 2 1").unwrap().free, vec![3, 2, 1]);
        assert!(parse_profile("3 x 1").unwrap_err().contains("order 1"));
        assert!(parse_profile("").is_err());
    }
}
