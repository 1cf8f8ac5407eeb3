//! Deterministic fixed-point log2 (docs/format/placement.md, section "Fixed-point log2").
//!
//! straw2 needs ln(u). `f64::ln` comes from the platform's libm, whose last-bit rounding is
//! not specified and does differ between libms; a one-ulp difference could flip which OSD
//! wins a draw on one machine but not on another. Everything here is integer arithmetic, so
//! the result is bit-identical everywhere. log2 is used instead of ln: the two differ by the
//! constant factor ln 2, which scales every straw equally and so never changes a winner.

/// Fractional bits of the results (32.32 fixed point).
pub(crate) const FRAC_BITS: u32 = 32;

/// log2 of the table's interval count (1024 intervals over the mantissa range [1, 2)).
const TABLE_BITS: u32 = 10;

/// Bits of a normalized mantissa below the table index (63 fractional bits - TABLE_BITS).
const REM_BITS: u32 = 63 - TABLE_BITS;

/// `LOG2_TABLE[i]` = log2(1 + i/1024) in 0.32 fixed point, for i in 0..=1024, computed at
/// compile time by [`log2_mantissa`] (integer-only, so the table is part of the format and
/// not of any platform's floating point).
static LOG2_TABLE: [u64; (1 << TABLE_BITS) + 1] = build_table();

/// log2 of a mantissa `m / 2^63` (`m` in [2^63, 2^64), i.e. a value in [1, 2)) in 0.32 fixed
/// point, by repeated squaring: squaring doubles the log, so whether the square reaches 2
/// gives the next binary digit of the log. Truncating (each square keeps 64 bits).
const fn log2_mantissa(mut m: u64) -> u64 {
    let mut frac = 0u64;
    let mut i = 0;
    while i < FRAC_BITS {
        // (m / 2^63)^2 scaled back by 2^63; in [2^63, 2^65).
        let sq = ((m as u128) * (m as u128)) >> 63;
        frac <<= 1;
        if sq >> 64 != 0 {
            frac |= 1;
            m = (sq >> 1) as u64;
        } else {
            m = sq as u64;
        }
        i += 1;
    }
    frac
}

/// Builds [`LOG2_TABLE`]; the last entry is log2(2) = 1 exactly.
const fn build_table() -> [u64; (1 << TABLE_BITS) + 1] {
    let mut table = [0u64; (1 << TABLE_BITS) + 1];
    let mut i = 0;
    while i < (1 << TABLE_BITS) {
        table[i] = log2_mantissa((1u64 << 63) | ((i as u64) << REM_BITS));
        i += 1;
    }
    table[1 << TABLE_BITS] = 1 << FRAC_BITS;
    table
}

/// log2(y) in 32.32 fixed point for y >= 1 (0 for y = 0, which callers never pass).
///
/// Integer part from the position of the highest set bit; fractional part from
/// [`LOG2_TABLE`] at the top 10 mantissa bits, linearly interpolated with the remaining 53
/// (max error about 1.7e-7, far below anything that could bias a draw measurably).
pub(crate) fn log2_fixed(y: u64) -> u64 {
    if y == 0 {
        return 0;
    }
    let int_part = 63 - y.leading_zeros();
    let mantissa = (y << (63 - int_part)) & !(1u64 << 63);
    let idx = (mantissa >> REM_BITS) as usize;
    let rem = mantissa & ((1u64 << REM_BITS) - 1);
    let lo = LOG2_TABLE[idx];
    let hi = LOG2_TABLE[idx + 1];
    // The table is non-decreasing (tested); saturating keeps this panic-free regardless.
    let step = (u128::from(hi.saturating_sub(lo)) * u128::from(rem)) >> REM_BITS;
    (u64::from(int_part) << FRAC_BITS) + lo + step as u64
}

/// log2(u) in 32.32 fixed point for u = (x + 1) / 2^32, a uniform value in (0, 1] derived
/// from a 32-bit hash `x`. The result is in [-32 * 2^32, 0] (0 only for x = 2^32 - 1).
pub(crate) fn log2_unit(x: u32) -> i64 {
    let l = log2_fixed(u64::from(x) + 1);
    // l <= 32 * 2^32 < 2^38, so the conversion cannot fail; 0 is the (unreachable) fallback.
    i64::try_from(l).unwrap_or(0) - (32i64 << FRAC_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: f64 = (1u64 << FRAC_BITS) as f64;

    #[test]
    fn table_is_monotonic_and_exact_at_ends() {
        assert_eq!(LOG2_TABLE[0], 0);
        assert_eq!(LOG2_TABLE[1 << TABLE_BITS], 1 << FRAC_BITS);
        assert!(LOG2_TABLE.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn table_matches_float_log2() {
        // f64 is fine in a test: it only checks the integer code, it does not define it.
        for (i, &v) in LOG2_TABLE.iter().enumerate() {
            let exact = (1.0 + i as f64 / 1024.0).log2() * ONE;
            assert!((v as f64 - exact).abs() <= 2.0, "entry {i}: {v} vs {exact}");
        }
    }

    #[test]
    fn log2_fixed_powers_of_two_are_exact() {
        for k in 0u32..64 {
            assert_eq!(log2_fixed(1u64 << k), u64::from(k) << FRAC_BITS);
        }
        assert_eq!(log2_fixed(0), 0);
    }

    #[test]
    fn log2_fixed_is_accurate_and_monotonic() {
        let mut prev = 0;
        // A multiplicative sweep over [1, 2^32 + 1], plus the neighbours of each point.
        let mut y: u64 = 1;
        while y <= (1u64 << 32) + 1 {
            for v in [y, y + 1] {
                let got = log2_fixed(v);
                let exact = (v as f64).log2() * ONE;
                // 2e-7 in log2 units: interpolation error bound (1/1024)^2 / 8 / ln 2.
                assert!(
                    (got as f64 - exact).abs() <= 2e-7 * ONE,
                    "{v}: {got} vs {exact}"
                );
            }
            let got = log2_fixed(y);
            assert!(got >= prev, "not monotonic at {y}");
            prev = got;
            y += y / 97 + 1;
        }
    }

    #[test]
    fn log2_unit_range() {
        assert_eq!(log2_unit(u32::MAX), 0);
        assert_eq!(log2_unit(0), -(32i64 << FRAC_BITS));
        assert_eq!(log2_unit((1 << 31) - 1), -(1i64 << FRAC_BITS));
    }
}
