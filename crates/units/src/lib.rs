//! Sizes and durations as people write them in flags and configs: `512MiB`, `4G`, `10s`.

/// Parse a size in bytes. Binary units only (`K`/`KiB` = 1024): decimal `KB`/`MB`/`GB` are refused
/// rather than guessed, because the kernel's own numbers (`4kB` pages, meminfo `kB`) are binary.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 =
        num.parse().map_err(|_| format!("{text:?} is not a size: write e.g. 512MiB, 4GiB, 1048576"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" | "k" | "kiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        u @ ("KB" | "kB" | "MB" | "GB" | "TB") => {
            return Err(format!(
                "{text:?}: write binary units ({}iB) — fraglab does not guess whether {u} means 1000 or 1024",
                &u[..1].to_uppercase()
            ))
        }
        u => return Err(format!("{text:?}: unknown unit {u:?}; use B, KiB, MiB, GiB or TiB")),
    };
    let bytes = num * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// `1.5 GiB`, `960 MiB`, `4 KiB`: the largest binary unit that keeps the number ≥ 1.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Block size of an order on this kernel: with 4 KiB pages order 0 = `4K`, order 10 = `4M`.
pub fn order_size(order: usize) -> String {
    let kb = (procfs::page_size() >> 10) << order;
    if kb >= 1024 {
        format!("{}M", kb / 1024)
    } else {
        format!("{kb}K")
    }
}

/// Parse a duration: `10s`, `500ms`, `2m`, `1h 30m`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 1s, 500ms, 2m"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("1GB").unwrap_err().contains("binary"));
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(format_size(960 << 20), "960.00 MiB");
        assert_eq!(order_size(0), "4K");
        assert_eq!(order_size(10), "4M");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap().as_secs(), 10);
        assert!(parse_duration("-3s").is_err());
    }
}
