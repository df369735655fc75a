//! Units: sizes and durations as flags give them and as messages say them.

/// A non-negative, finite number of seconds from a flag.
pub fn seconds(value: f64, name: &str) -> anyhow::Result<std::time::Duration> {
    if !value.is_finite() || value < 0.0 {
        anyhow::bail!("{name} must be a non-negative number of seconds, got {value}");
    }
    std::time::Duration::try_from_secs_f64(value)
        .map_err(|_| anyhow::anyhow!("{name} is too large: {value} seconds"))
}

/// A size for people: "4 GiB", "512 MiB", "1.5 MiB", "12.3 KiB", "512 B"
/// (whole units without a fraction).
pub fn human_bytes(b: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        let size = 1u64 << shift;
        if b >= size {
            return if b.is_multiple_of(size) {
                format!("{} {unit}", b >> shift)
            } else {
                format!("{:.1} {unit}", b as f64 / size as f64)
            };
        }
    }
    format!("{b} B")
}

/// "4G", "512M", "100K", "123" (bytes) or "off".
pub fn parse_bytes(s: &str) -> anyhow::Result<Option<u64>> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") || t == "0" {
        return Ok(None);
    }
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_uppercase();
            let mult: u64 = match unit.trim_end_matches(['B', 'I']) {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => anyhow::bail!("cannot read size {s:?}: use a number with K, M, G or T"),
            };
            (&t[..i], mult)
        }
        None => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("cannot read size {s:?}: use a number with K, M, G or T"))?;
    if !n.is_finite() || n < 0.0 {
        anyhow::bail!("size {s:?} must be positive");
    }
    Ok(Some((n * mult as f64) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_and_print() {
        assert_eq!(human_bytes(4 << 30), "4 GiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
        assert_eq!(human_bytes(2048), "2 KiB");
        assert_eq!(human_bytes(1100), "1.1 KiB");
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(parse_bytes("512M").ok().flatten(), Some(512 << 20));
        assert_eq!(parse_bytes("off").ok().flatten(), None);
        assert!(parse_bytes("-1G").is_err());
        assert!(seconds(-1.0, "--x").is_err());
    }
}
