//! Turning one client write on an EC object into each shard's sub-write (docs/format/ec.md,
//! "Write path"), apart from how the old bytes are fetched: `reads` says which bytes of which
//! data shards the write replaces (its partial stripes, below the object's old end), and
//! `plan` makes the shards' ops from them. Whole stripes, and stripes wholly past the old
//! end, are encoded without reading.

use cairn_ec::{layout, Codec, Profile};
use cairn_proto::msg::ec::EcShardOp;
use std::collections::HashMap;

/// A client write, in object bytes.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// `data` at `offset` (the object grows to cover it).
    Write { offset: u64, data: &'a [u8] },
    /// The whole object becomes `data`.
    Full { data: &'a [u8] },
    /// Bytes `offset..offset + len` become zeros (within the object; its size is kept).
    Zero { offset: u64, len: u64 },
    /// The object's size becomes `size` (cut, or grown with zeros).
    Truncate { size: u64 },
    /// The object goes.
    Remove,
}

/// Bytes of one data shard a write replaces: `len` bytes at `shard_off` of data shard `shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OldRange {
    pub shard: u32,
    pub shard_off: u64,
    pub len: u32,
}

/// The old bytes read for a write, by range.
pub type OldBytes = HashMap<OldRange, Vec<u8>>;

/// One shard's part of a write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardWrite {
    pub ops: Vec<EcShardOp>,
    pub payload: Vec<u8>,
}

impl ShardWrite {
    fn write(&mut self, offset: u64, bytes: &[u8]) {
        self.ops.push(EcShardOp::Write {
            offset,
            len: bytes.len() as u32,
        });
        self.payload.extend_from_slice(bytes);
    }

    fn xor(&mut self, offset: u64, bytes: &[u8]) {
        self.ops.push(EcShardOp::Xor {
            offset,
            len: bytes.len() as u32,
        });
        self.payload.extend_from_slice(bytes);
    }
}

/// Every shard's part of a write, and the object's size after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub shards: Vec<ShardWrite>,
    pub size: u64,
}

/// Why a write cannot be planned: a bug between `reads` and `plan` (an old range missing), or
/// the codec refusing. Fails the write, never the OSD.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("old bytes of data shard {0:?} were not read for the write")]
    NotRead(OldRange),
    #[error(transparent)]
    Codec(#[from] cairn_ec::EcError),
}

/// The written range a change amounts to (bytes set to `data`, or to zeros when `None`),
/// given the object's old size.
fn range_of<'a>(
    p: &Profile,
    change: Change<'a>,
    old_size: u64,
) -> Option<(u64, u64, Option<&'a [u8]>)> {
    match change {
        Change::Write { offset, data } => Some((offset, data.len() as u64, Some(data))),
        Change::Full { data } => Some((0, data.len() as u64, Some(data))),
        Change::Zero { offset, len } => {
            let end = offset.saturating_add(len).min(old_size);
            (offset < end).then(|| (offset, end - offset, None))
        }
        // The bytes cut off the stripe the new end falls in leave its parity as if zeroed;
        // the stripes after it are cut off every shard whole.
        Change::Truncate { size } if size < old_size => {
            let end = size.next_multiple_of(p.stripe_width()).min(old_size);
            (size < end).then(|| (size, end - size, None))
        }
        Change::Truncate { .. } | Change::Remove => None,
    }
}

/// The old size a change's range is applied over (a whole-object write starts from nothing).
fn base_size(change: Change<'_>, old_size: u64) -> u64 {
    match change {
        Change::Full { .. } => 0,
        _ => old_size,
    }
}

/// The bytes of the written range stripe `s` holds: `lo..hi` in object bytes.
fn written_in(p: &Profile, s: u64, off: u64, end: u64) -> (u64, u64) {
    let w = p.stripe_width();
    ((s * w).max(off), ((s + 1) * w).min(end))
}

/// Whether stripe `s` is encoded whole: written whole, or past the old end (its old bytes
/// are all zeros), so nothing is read for it.
fn encoded_whole(p: &Profile, s: u64, off: u64, end: u64, old_size: u64) -> bool {
    let w = p.stripe_width();
    let (lo, hi) = written_in(p, s, off, end);
    (lo == s * w && hi == (s + 1) * w) || s * w >= old_size
}

/// The old bytes `change` replaces that must be read first.
pub fn reads(p: &Profile, old_size: u64, change: Change<'_>) -> Vec<OldRange> {
    let old = base_size(change, old_size);
    let Some((off, len, _)) = range_of(p, change, old_size) else {
        return Vec::new();
    };
    let end = off + len;
    let mut out = Vec::new();
    for s in layout::stripes(p, off, len) {
        if encoded_whole(p, s, off, end, old) {
            continue;
        }
        let (lo, hi) = written_in(p, s, off, end);
        for piece in layout::pieces(p, lo, hi - lo) {
            let at = lo + piece.buf_off;
            if at >= old {
                continue; // past the old end: zeros
            }
            let len = (u64::from(piece.len)).min(old - at) as u32;
            out.push(OldRange {
                shard: piece.chunk,
                shard_off: piece.shard_off(p),
                len,
            });
        }
    }
    out
}

/// Every shard's ops for `change`, given the old bytes `reads` asked for (`old`, by range;
/// shorter than asked when the shard ended sooner: the rest is zeros).
pub fn plan(
    codec: &Codec,
    old_size: u64,
    change: Change<'_>,
    old: &OldBytes,
) -> Result<Plan, PlanError> {
    let p = codec.profile();
    let n = p.shards() as usize;
    let mut shards = vec![ShardWrite::default(); n];
    let size = match change {
        Change::Write { offset, data } => old_size.max(offset.saturating_add(data.len() as u64)),
        Change::Full { data } => data.len() as u64,
        Change::Zero { .. } => old_size,
        Change::Truncate { size } => size,
        Change::Remove => {
            for s in &mut shards {
                s.ops.push(EcShardOp::Remove);
            }
            return Ok(Plan { shards, size: 0 });
        }
    };
    if matches!(change, Change::Full { .. }) {
        for s in &mut shards {
            s.ops.push(EcShardOp::Truncate { len: 0 });
        }
    }
    let base = base_size(change, old_size);
    if let Some((off, len, data)) = range_of(&p, change, old_size) {
        let end = off + len;
        for s in layout::stripes(&p, off, len) {
            if encoded_whole(&p, s, off, end, base) {
                encode_stripe(codec, &mut shards, s, (off, end), data, size)?;
            } else {
                delta_stripe(codec, &mut shards, s, (off, end), data, (base, old))?;
            }
        }
    }
    if let Change::Truncate { size } = change {
        for (i, s) in shards.iter_mut().enumerate() {
            let len = layout::shard_len(&p, i as u32, size);
            s.ops.push(EcShardOp::Truncate { len });
        }
    }
    Ok(Plan { shards, size })
}

/// The new bytes of object range `at..at + len` (zeros for a zeroing change).
fn new_bytes(data: Option<&[u8]>, range_off: u64, at: u64, len: usize) -> Vec<u8> {
    match data {
        Some(d) => {
            let from = (at - range_off) as usize;
            d[from..from + len].to_vec()
        }
        None => vec![0; len],
    }
}

/// Stripe `s` encoded whole: its data chunks (zeros where not written: past the old end, or
/// nothing there) and its parity, cut at the shards' ends for the new size.
fn encode_stripe(
    codec: &Codec,
    shards: &mut [ShardWrite],
    s: u64,
    (off, end): (u64, u64),
    data: Option<&[u8]>,
    size: u64,
) -> Result<(), PlanError> {
    let p = codec.profile();
    let unit = p.unit() as usize;
    let (lo, hi) = written_in(&p, s, off, end);
    let mut chunks = vec![vec![0u8; unit]; p.k() as usize];
    for piece in layout::pieces(&p, lo, hi - lo) {
        let at = lo + piece.buf_off;
        let bytes = new_bytes(data, off, at, piece.len as usize);
        let c = piece.chunk_off as usize;
        chunks[piece.chunk as usize][c..c + bytes.len()].copy_from_slice(&bytes);
        shards[piece.chunk as usize].write(piece.shard_off(&p), &bytes);
    }
    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    let parity = codec.encode(&refs)?;
    let shard_off = s * p.unit() as u64;
    for (j, chunk) in parity.iter().enumerate() {
        let shard = p.k() + j as u32;
        let keep = layout::shard_len(&p, shard, size).saturating_sub(shard_off);
        let keep = (keep as usize).min(unit);
        shards[shard as usize].write(shard_off, &chunk[..keep]);
    }
    Ok(())
}

/// Stripe `s` updated in place: each data piece written, each parity chunk XORed with the
/// pieces' parity deltas (old bytes from `old`, zeros past the old end `base`), merged into
/// one range per parity chunk so that no two ops of a sub-write overlap.
fn delta_stripe(
    codec: &Codec,
    shards: &mut [ShardWrite],
    s: u64,
    (off, end): (u64, u64),
    data: Option<&[u8]>,
    (base, old): (u64, &OldBytes),
) -> Result<(), PlanError> {
    let p = codec.profile();
    let unit = p.unit() as usize;
    let (lo, hi) = written_in(&p, s, off, end);
    let mut parity = vec![vec![0u8; unit]; p.m() as usize];
    let (mut from, mut to) = (unit, 0usize);
    for piece in layout::pieces(&p, lo, hi - lo) {
        let at = lo + piece.buf_off;
        let len = piece.len as usize;
        let new = new_bytes(data, off, at, len);
        let mut before = vec![0u8; len];
        if at < base {
            let range = OldRange {
                shard: piece.chunk,
                shard_off: piece.shard_off(&p),
                len: (piece.len as u64).min(base - at) as u32,
            };
            let got = old.get(&range).ok_or(PlanError::NotRead(range))?;
            let n = got.len().min(len);
            before[..n].copy_from_slice(&got[..n]);
        }
        shards[piece.chunk as usize].write(piece.shard_off(&p), &new);
        let deltas = codec.parity_delta(piece.chunk, &before, &new)?;
        let c = piece.chunk_off as usize;
        for (acc, d) in parity.iter_mut().zip(&deltas) {
            cairn_ec::codec::xor_into(&mut acc[c..c + len], d);
        }
        (from, to) = (from.min(c), to.max(c + len));
    }
    if from < to {
        let shard_off = s * p.unit() as u64 + from as u64;
        for (j, acc) in parity.iter().enumerate() {
            shards[(p.k() + j as u32) as usize].xor(shard_off, &acc[from..to]);
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
