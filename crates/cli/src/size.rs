//! Byte sizes (and dates) on the command line: `4096`, `64K`, `4MiB`, `1G`, `1.5GiB`, `1P` (powers of
//! 1024). Decimal units (`GB`) are refused rather than guessed: tools disagree on them.

/// Parses a size: a number of bytes, or with a suffix K, M, G, T or P (powers of 1024,
/// optionally followed by `iB`). `GB` and the like are refused (ambiguous), as are negative
/// sizes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("{s:?}: a size cannot be negative"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        "p" | "pib" => 50,
        "kb" | "mb" | "gb" | "tb" | "pb" => {
            let p = &unit[..1];
            return Err(format!(
                "{s:?} is ambiguous ({unit} means powers of 1000 to some tools, of 1024 to \
                 others): write {num}{p} or {num}{p}iB for powers of 1024, or a number of bytes"
            ));
        }
        _ => {
            return Err(format!(
                "{s:?} is not a size: use a number of bytes with an optional K, M, G, T or P \
                 suffix (powers of 1024), e.g. 64M"
            ))
        }
    };
    let mult = 1u64 << shift;
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

/// Unix seconds as an ISO 8601 UTC date and time: `2026-11-23T20:41:24Z`.
pub fn iso8601(unix: u64) -> String {
    let (days, secs) = (unix / 86_400, unix % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm, era = 400 years).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
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
        assert_eq!(parse_size("2 MiB"), Ok(2 << 20));
        assert_eq!(parse_size("1P"), Ok(1 << 50));
        assert_eq!(parse_size("1PiB"), Ok(1 << 50));
        let e = parse_size("10GB").unwrap_err();
        assert!(e.contains("ambiguous") && e.contains("10G or 10GiB"), "{e}");
        assert!(parse_size("2 mb").unwrap_err().contains("ambiguous"));
        assert!(parse_size("-5G").unwrap_err().contains("negative"));
        assert!(parse_size("12abc").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn dates_print_as_iso8601() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_795_552_884), "2026-11-24T20:41:24Z");
        assert_eq!(iso8601(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn sizes_print() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
