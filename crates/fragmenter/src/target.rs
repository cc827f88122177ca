//! What the fragmenter is asked to reach: a ceiling on the free order, or a whole buddyinfo profile.

use serde::{Deserialize, Serialize};

/// The shape free memory should have once the fragmenter is done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Target {
    /// No free block of order `order` or above, while `free_bytes` stay free in smaller blocks —
    /// the seeds' state: plenty of free memory, none of it contiguous.
    MaxFreeOrder { order: usize, free_bytes: u64 },
    /// Reproduce these free-block counts per order (index = order), as read from a bug report.
    Profile {
        /// The zone the line came from (`Normal`), when the line said.
        zone: Option<String>,
        free: Vec<u64>,
    },
}

/// Parse a profile as a user pastes it from a bug report.
///
/// Two forms are accepted:
/// - a `/proc/buddyinfo` line: `Node 0, zone Normal 40773 37 34 29 0 0 0 0 0 0 0`, or just the counts;
/// - a kernel Mem-Info free-area line, as printed with a page allocation failure:
///   `Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) 0*32kB ... = 3016kB`.
pub fn parse_profile(text: &str) -> Result<(Option<String>, Vec<u64>), String> {
    let text = text.trim();
    if text.contains("kB") && text.contains('*') {
        return parse_meminfo_line(text);
    }
    if text.starts_with("Node") {
        let zone = fraglab_probe::buddyinfo::parse_line(text)?;
        return Ok((Some(zone.zone), zone.free));
    }
    let free = text
        .split_whitespace()
        .enumerate()
        .map(|(order, f)| f.parse::<u64>().map_err(|_| format!("order {order}: {f:?} is not a count")))
        .collect::<Result<Vec<_>, _>>()?;
    if free.is_empty() {
        return Err("the profile is empty: give a buddyinfo line or a Mem-Info line".into());
    }
    Ok((None, free))
}

/// `Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) 0*32kB 0*64kB ... = 3016kB`
fn parse_meminfo_line(text: &str) -> Result<(Option<String>, Vec<u64>), String> {
    let (zone, rest) = match text.split_once(':') {
        Some((zone, rest)) if !zone.contains('*') => (Some(zone.trim().to_string()), rest),
        _ => (None, text),
    };
    // The total after '=' is the kernel's own sum; it is checked, not trusted blindly.
    let (areas, total) = match rest.split_once('=') {
        Some((areas, total)) => (areas, Some(total.trim())),
        None => (rest, None),
    };
    let mut free = Vec::new();
    for field in areas.split_whitespace() {
        if field.starts_with('(') {
            continue; // migratetype letters such as (UME)
        }
        let (count, size) = field.split_once('*').ok_or_else(|| format!("{field:?} is not COUNT*SIZEkB"))?;
        let count: u64 = count.parse().map_err(|_| format!("{field:?}: {count:?} is not a count"))?;
        let kb: u64 = size
            .strip_suffix("kB")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{field:?}: {size:?} is not a size in kB"))?;
        let page_kb = 4;
        let pages = kb / page_kb;
        if kb % page_kb != 0 || !pages.is_power_of_two() {
            return Err(format!("{field:?}: {kb}kB is not a power-of-two number of 4kB pages"));
        }
        let order = pages.trailing_zeros() as usize;
        if order != free.len() {
            return Err(format!(
                "{field:?}: expected the order-{} entry ({}kB) here",
                free.len(),
                4 << free.len()
            ));
        }
        free.push(count);
    }
    if free.is_empty() {
        return Err("no COUNT*SIZEkB entries found".into());
    }
    if let Some(total) = total {
        let total_kb: u64 = total
            .strip_suffix("kB")
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| format!("total {total:?}"))?;
        let sum: u64 = free.iter().enumerate().map(|(o, n)| n * (4 << o)).sum();
        if sum != total_kb {
            return Err(format!("the entries add up to {sum}kB but the line says = {total_kb}kB"));
        }
    }
    Ok((zone, free))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_buddyinfo_line() {
        let (zone, free) = parse_profile("Node 0, zone Normal 40773 37 34 29 0 0 0 0 0 0 0").unwrap();
        assert_eq!(zone.as_deref(), Some("Normal"));
        assert_eq!(free, vec![40773, 37, 34, 29, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn meminfo_line() {
        let line = "Normal: 512*4kB (UME) 97*8kB (UM) 12*16kB (M) 0*32kB 0*64kB 0*128kB 0*256kB \
                    0*512kB 0*1024kB 0*2048kB 0*4096kB = 3016kB";
        let (zone, free) = parse_profile(line).unwrap();
        assert_eq!(zone.as_deref(), Some("Normal"));
        assert_eq!(free, vec![512, 97, 12, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn meminfo_line_with_wrong_total_is_refused() {
        let err = parse_profile("Normal: 1*4kB 1*8kB = 16kB").unwrap_err();
        assert!(err.contains("12kB"), "{err}");
    }

    #[test]
    fn bare_counts_and_garbage() {
        assert_eq!(parse_profile("3 2 1").unwrap().1, vec![3, 2, 1]);
        assert!(parse_profile("3 x 1").unwrap_err().contains("order 1"));
        assert!(parse_profile("").is_err());
    }
}
