//! Byte sizes on the command line: `4096`, `64K`, `4MiB`, `1G`, `1.5GiB` (powers of 1024).

/// Parses a size; suffixes K, M, G, T mean powers of 1024 and may be followed by `iB` or `B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{s:?} is not a size: use a number of bytes with an optional K, M, G or T suffix (powers of 1024), e.g. 64M"
            ))
        }
    };
    let bad = || format!("{s:?} is not a size: the number part {num:?} is not a number");
    let v = if num.contains('.') {
        let f: f64 = num.parse().map_err(|_| bad())?;
        let b = f * mult as f64;
        if !b.is_finite() || b < 0.0 || b > u64::MAX as f64 {
            return Err(format!("{s:?} is out of range"));
        }
        b as u64
    } else {
        let n: u64 = num.parse().map_err(|_| bad())?;
        n.checked_mul(mult)
            .ok_or_else(|| format!("{s:?} is out of range"))?
    };
    Ok(v)
}

/// A size for people: `1.5 GiB`, `4 KiB`, `512 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2 MB"), Ok(2 << 20));
        assert!(parse_size("12abc").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn sizes_print() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
