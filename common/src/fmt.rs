//! Numbers and bytes for people: hex, thousands separators, sizes.

/// Parses a size such as `65536`, `64K`, `64KiB`, `1MiB`, `1.5M` (binary
/// units: K = 1024).
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => anyhow::bail!("bad size {text:?} (use e.g. 65536, 64KiB or 1MiB)"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("bad size {text:?} (use e.g. 65536, 64KiB or 1MiB)"))?;
    if !(v > 0.0) || !v.is_finite() {
        anyhow::bail!("size {text:?} must be positive");
    }
    Ok((v * mult as f64) as u64)
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Thousands separators: 1234567 -> "1,234,567".
pub fn commas(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_commas() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(commas(0), "0");
        assert_eq!(commas(999), "999");
        assert_eq!(commas(1000), "1,000");
        assert_eq!(commas(1234567), "1,234,567");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert_eq!(parse_size("1.5M").unwrap(), 1572864);
        assert!(parse_size("0").is_err());
        assert!(parse_size("64 parsecs").is_err());
        assert!(parse_size("").is_err());
    }
}
