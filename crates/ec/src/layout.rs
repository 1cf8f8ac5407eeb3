//! Where an object's bytes live in an EC PG. Object bytes are cut into stripes of k units;
//! unit i of stripe s is data chunk i of that stripe and lives on shard i at offset
//! s * unit, so each shard is one object of its own and a stripe is the same offset range
//! on every shard. Parity chunk j of stripe s lives on shard k + j at the same offset.

use crate::profile::Profile;

/// One piece of a byte range of the object that falls in a single data chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The stripe it is in.
    pub stripe: u64,
    /// Its data chunk (and shard): 0..k.
    pub chunk: u32,
    /// Where it starts in the chunk.
    pub chunk_off: u32,
    pub len: u32,
    /// Where it starts in the caller's buffer (0 = the range's first byte).
    pub buf_off: u64,
}

impl Piece {
    /// Where it starts in its shard's object.
    pub fn shard_off(&self, p: &Profile) -> u64 {
        self.stripe * u64::from(p.unit()) + u64::from(self.chunk_off)
    }
}

/// The pieces of the object range `off..off + len`, in object order.
pub fn pieces(p: &Profile, off: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
    let unit = u64::from(p.unit());
    let end = off.saturating_add(len);
    let mut at = off;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let chunk_index = at / unit; // over the whole object
        let chunk_off = at % unit;
        let n = (unit - chunk_off).min(end - at);
        let piece = Piece {
            stripe: chunk_index / u64::from(p.k()),
            chunk: (chunk_index % u64::from(p.k())) as u32,
            chunk_off: chunk_off as u32,
            len: n as u32,
            buf_off: at - off,
        };
        at += n;
        Some(piece)
    })
}

/// The stripes the range `off..off + len` touches (empty for an empty range).
pub fn stripes(p: &Profile, off: u64, len: u64) -> std::ops::Range<u64> {
    if len == 0 {
        return 0..0;
    }
    let w = p.stripe_width();
    off / w..off.saturating_add(len).div_ceil(w)
}

/// Whether the range covers each stripe it touches whole (it can be encoded without
/// reading anything).
pub fn whole_stripes(p: &Profile, off: u64, len: u64) -> bool {
    let w = p.stripe_width();
    len > 0 && off.is_multiple_of(w) && len.is_multiple_of(w)
}

/// How long shard `shard` is for an object of `size` bytes: a data shard holds its chunks
/// up to the object's end; a parity shard is as long as the longest data shard (the first).
pub fn shard_len(p: &Profile, shard: u32, size: u64) -> u64 {
    let unit = u64::from(p.unit());
    let w = p.stripe_width();
    let full = size / w; // whole stripes
    let tail = size % w; // bytes of the last, partial stripe
    let chunk = u64::from(shard.min(p.k()));
    let in_tail = if shard >= p.k() {
        tail.min(unit)
    } else {
        tail.saturating_sub(chunk * unit).min(unit)
    };
    full * unit + in_tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn profile() -> impl Strategy<Value = Profile> {
        (1u32..=8, 1u32..=4, 1u32..=4).prop_map(|(k, m, u)| Profile::new(k, m, u * 4096).unwrap())
    }

    proptest! {
        /// The pieces tile the range in order, each inside one chunk, and put every byte
        /// where the layout rule says.
        #[test]
        fn pieces_tile_the_range(p in profile(), off in 0u64..1 << 20, len in 0u64..1 << 20) {
            let (unit, k) = (u64::from(p.unit()), u64::from(p.k()));
            let mut next = 0u64;
            for piece in pieces(&p, off, len) {
                prop_assert_eq!(piece.buf_off, next);
                prop_assert!(piece.len > 0 && piece.chunk_off + piece.len <= p.unit());
                prop_assert!(piece.chunk < p.k());
                let first = off + piece.buf_off;
                let chunk_index = piece.stripe * k + u64::from(piece.chunk);
                prop_assert_eq!(first, chunk_index * unit + u64::from(piece.chunk_off));
                prop_assert_eq!(piece.shard_off(&p), piece.stripe * unit + u64::from(piece.chunk_off));
                next += u64::from(piece.len);
            }
            prop_assert_eq!(next, len);
            let touched = stripes(&p, off, len);
            if len > 0 {
                let first = pieces(&p, off, len).next().unwrap();
                let last = pieces(&p, off, len).last().unwrap();
                prop_assert_eq!(touched, first.stripe..last.stripe + 1);
            }
        }

        /// A shard is as long as the bytes the layout puts on it.
        #[test]
        fn shard_lengths_hold_what_pieces_put_there(p in profile(), size in 0u64..1 << 20) {
            let mut longest = vec![0u64; p.k() as usize];
            for piece in pieces(&p, 0, size) {
                let end = piece.shard_off(&p) + u64::from(piece.len);
                let l = &mut longest[piece.chunk as usize];
                *l = (*l).max(end);
            }
            for (i, l) in longest.iter().enumerate() {
                prop_assert_eq!(shard_len(&p, i as u32, size), *l);
            }
            for j in 0..p.m() {
                prop_assert_eq!(shard_len(&p, p.k() + j, size), longest[0]);
            }
        }
    }

    #[test]
    fn whole_stripes_are_recognised() {
        let p = Profile::new(4, 2, 4096).unwrap();
        assert!(whole_stripes(&p, 0, 16384));
        assert!(whole_stripes(&p, 16384, 32768));
        assert!(!whole_stripes(&p, 4096, 16384));
        assert!(!whole_stripes(&p, 0, 4096));
        assert!(!whole_stripes(&p, 0, 0));
        assert_eq!(stripes(&p, 4096, 16384), 0..2);
        assert_eq!(stripes(&p, 0, 0), 0..0);
    }
}
