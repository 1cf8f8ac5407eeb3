//! The integer hashes used by placement (docs/format/placement.md, section "Hashes").
//!
//! Both hashes are built from the splitmix64 finalizer, absorbing one 64-bit word at a time.
//! They are part of the placement format: changing a constant or the absorption order changes
//! every object's PG and every PG's OSDs, so it requires a new `PLACEMENT_VERSION`.

/// splitmix64's increment (2^64 / golden ratio). Added before each word so that the all-zero
/// state is not a fixed point of the absorption step.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Initial state of [`object_hash`]: the ASCII bytes "cairnobj".
const OBJECT_SEED: u64 = 0x6361_6972_6E6F_626A;

/// Initial state of [`DrawKey`]: the ASCII bytes "cairndrw". Distinct from
/// [`OBJECT_SEED`] so that object names and draw inputs live in unrelated hash spaces.
const DRAW_SEED: u64 = 0x6361_6972_6E64_7277;

/// The splitmix64 finalizer: a bijection on u64 with full avalanche.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One absorption step: `mix64((h + GOLDEN) ^ word)`.
fn absorb(h: u64, word: u64) -> u64 {
    mix64(h.wrapping_add(GOLDEN) ^ word)
}

/// The 32-bit result of a 64-bit state: its high half (the best-mixed bits of `mix64`).
fn fold(h: u64) -> u32 {
    (h >> 32) as u32
}

/// Hash of an object name: absorb the length, then each 8-byte little-endian chunk (the last
/// one zero-padded; the length absorbed first keeps "a" and "a\0" apart).
pub(crate) fn object_hash(name: &[u8]) -> u32 {
    let mut h = absorb(OBJECT_SEED, name.len() as u64);
    for chunk in name.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h = absorb(h, u64::from_le_bytes(word));
    }
    fold(h)
}

/// The hash state of a draw after absorbing (pool, pg): computed once per PG, then extended
/// per candidate by [`DrawKey::hash`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct DrawKey(u64);

impl DrawKey {
    /// Absorbs pool then pg into the draw seed.
    pub fn new(pool: u32, pg: u32) -> DrawKey {
        DrawKey(absorb(absorb(DRAW_SEED, u64::from(pool)), u64::from(pg)))
    }

    /// The uniform 32-bit value behind one straw: the hash of (pool, pg, OSD id, rank).
    pub fn hash(self, osd: u32, rank: u32) -> u32 {
        fold(absorb(absorb(self.0, u64::from(osd)), u64::from(rank)))
    }
}

/// [`DrawKey`] in one call (tests and documentation: the absorption order in full).
#[cfg(test)]
pub(crate) fn draw_hash(pool: u32, pg: u32, osd: u32, rank: u32) -> u32 {
    let mut h = DRAW_SEED;
    for word in [pool, pg, osd, rank] {
        h = absorb(h, u64::from(word));
    }
    fold(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix64_matches_reference_splitmix64() {
        // First output of the reference splitmix64 generator seeded with 0 is
        // mix64(0 + GOLDEN) = 0xE220A8397B1DCDAF (Vigna's splitmix64.c).
        assert_eq!(mix64(GOLDEN), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn object_hash_separates_padding_and_length() {
        assert_ne!(object_hash(b"a"), object_hash(b"a\0"));
        assert_ne!(object_hash(b""), object_hash(b"\0"));
        assert_ne!(object_hash(b"12345678"), object_hash(b"12345678\0"));
    }

    #[test]
    fn draw_hash_depends_on_every_input() {
        let base = draw_hash(1, 2, 3, 4);
        assert_ne!(base, draw_hash(0, 2, 3, 4));
        assert_ne!(base, draw_hash(1, 0, 3, 4));
        assert_ne!(base, draw_hash(1, 2, 0, 4));
        assert_ne!(base, draw_hash(1, 2, 3, 0));
        // Swapping inputs must not commute (pool 1/pg 2 is not pool 2/pg 1).
        assert_ne!(base, draw_hash(2, 1, 3, 4));
    }

    #[test]
    fn draw_key_is_the_one_call_hash() {
        for (pool, pg, osd, rank) in [(0, 0, 0, 0), (1, 2, 3, 4), (u32::MAX, 7, 9, 2)] {
            assert_eq!(
                DrawKey::new(pool, pg).hash(osd, rank),
                draw_hash(pool, pg, osd, rank)
            );
        }
    }
}
