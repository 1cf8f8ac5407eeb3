//! An erasure-code profile: k data chunks and m parity chunks per stripe, each chunk one
//! stripe unit long. Fixed when a pool is created.

use std::fmt;

/// Most shards (k + m) a profile may have: each needs a failure domain of its own, and the
/// decoder's work grows with it.
pub const MAX_SHARDS: u32 = 32;
/// Stripe units are whole multiples of this (the store's block size: a chunk update never
/// splits a block of the shard).
pub const UNIT_ALIGN: u32 = 4096;
/// Largest stripe unit: a chunk is read and encoded whole when its stripe is rebuilt.
pub const MAX_UNIT: u32 = 1 << 20;
/// The stripe unit when none is given: small enough that a 4 KiB write touches a quarter
/// of one chunk, large enough that a 1 MiB write spans whole stripes of a 4+2 pool.
pub const DEFAULT_UNIT: u32 = 16 << 10;

/// k data chunks, m parity chunks, `unit` bytes per chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Profile {
    k: u32,
    m: u32,
    unit: u32,
}

/// Why a profile is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("an erasure-code profile is written K+M (e.g. 4+2), not {0:?}")]
    Syntax(String),
    #[error("k and m must each be at least 1 (got {k}+{m})")]
    Zero { k: u32, m: u32 },
    #[error("{k}+{m} has {} shards; at most {MAX_SHARDS} are allowed", k + m)]
    TooManyShards { k: u32, m: u32 },
    #[error(
        "stripe unit {0} is not a multiple of {UNIT_ALIGN} bytes between {UNIT_ALIGN} and {MAX_UNIT}"
    )]
    Unit(u64),
}

impl Profile {
    pub fn new(k: u32, m: u32, unit: u32) -> Result<Profile, ProfileError> {
        if k == 0 || m == 0 {
            return Err(ProfileError::Zero { k, m });
        }
        if k.saturating_add(m) > MAX_SHARDS {
            return Err(ProfileError::TooManyShards { k, m });
        }
        if unit == 0 || !unit.is_multiple_of(UNIT_ALIGN) || unit > MAX_UNIT {
            return Err(ProfileError::Unit(unit.into()));
        }
        Ok(Profile { k, m, unit })
    }

    /// Parses `K+M` (as `cairn pool create --ec` takes it) with stripe unit `unit`.
    pub fn parse(km: &str, unit: u32) -> Result<Profile, ProfileError> {
        let syntax = || ProfileError::Syntax(km.to_string());
        let (k, m) = km.trim().split_once('+').ok_or_else(syntax)?;
        let k = k.trim().parse().map_err(|_| syntax())?;
        let m = m.trim().parse().map_err(|_| syntax())?;
        Profile::new(k, m, unit)
    }

    /// Data chunks per stripe.
    pub fn k(&self) -> u32 {
        self.k
    }

    /// Parity chunks per stripe: how many shards may be lost.
    pub fn m(&self) -> u32 {
        self.m
    }

    /// Shards of a PG: k + m.
    pub fn shards(&self) -> u32 {
        self.k + self.m
    }

    /// Bytes per chunk.
    pub fn unit(&self) -> u32 {
        self.unit
    }

    /// Object bytes per stripe: k units.
    pub fn stripe_width(&self) -> u64 {
        u64::from(self.k) * u64::from(self.unit)
    }

    /// Raw bytes stored per byte of data written in whole stripes: (k + m) / k.
    pub fn overhead(&self) -> f64 {
        f64::from(self.shards()) / f64::from(self.k)
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}+{} (stripe unit {} KiB)",
            self.k,
            self.m,
            self.unit >> 10
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_bad_ones_say_why() {
        let p = Profile::parse("4+2", DEFAULT_UNIT).unwrap();
        assert_eq!((p.k(), p.m(), p.shards()), (4, 2, 6));
        assert_eq!(p.stripe_width(), 64 << 10);
        assert_eq!(p.overhead(), 1.5);
        assert_eq!(p.to_string(), "4+2 (stripe unit 16 KiB)");
        assert_eq!(Profile::parse(" 8 + 3 ", 4096).unwrap().shards(), 11);
        assert!(matches!(
            Profile::parse("4", 4096),
            Err(ProfileError::Syntax(_))
        ));
        assert!(matches!(
            Profile::parse("a+2", 4096),
            Err(ProfileError::Syntax(_))
        ));
        assert!(matches!(
            Profile::parse("4+0", 4096),
            Err(ProfileError::Zero { .. })
        ));
        assert!(matches!(
            Profile::parse("30+3", 4096),
            Err(ProfileError::TooManyShards { .. })
        ));
        for bad in [0, 1000, 4097, MAX_UNIT + UNIT_ALIGN] {
            assert_eq!(Profile::new(2, 1, bad), Err(ProfileError::Unit(bad.into())));
        }
    }
}
