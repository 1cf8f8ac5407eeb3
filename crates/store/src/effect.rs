//! Effects: what a committed transaction does to the index, as logged in a WAL record.
//!
//! The committing thread turns the caller's [`Op`](crate::Op)s into effects under the index lock
//! (partial-block writes become whole-block writes, truncates become size changes plus hole
//! punches), so replaying an effect never reads a device and is a pure function of the index.

use crate::codec::{DecodeError, Reader, Writer};
use crate::device::BLOCK_SIZE;
use crate::shared::SharedBytes;
use crate::txn::{limits, CollId};
use std::sync::Arc;

/// An object name, shared between the index and in-flight work.
pub type Name = Arc<[u8]>;

/// Block data carried by [`Effect::SetBlocks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Bytes held apart from the record (at commit time; the record gets a copy).
    Owned(SharedBytes),
    /// Bytes at this offset of the encoded record.
    InRecord(usize),
}

/// One change to the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    CreateColl(CollId),
    RemoveColl(CollId),
    Touch {
        coll: CollId,
        obj: Name,
    },
    /// Replaces whole blocks `first_block..first_block + nblocks` with the payload.
    SetBlocks {
        coll: CollId,
        obj: Name,
        first_block: u64,
        nblocks: u32,
        data: Payload,
    },
    /// Replaces whole blocks `first_block..first_block + nblocks` with blocks already written
    /// (and flushed) at byte `off` of the data devices, whose crcs it carries: a large write
    /// that went straight to its place, so the record holds its metadata only.
    PlaceBlocks {
        coll: CollId,
        obj: Name,
        first_block: u64,
        nblocks: u32,
        off: u64,
        crcs: crate::index::Crcs,
    },
    /// Makes whole blocks holes.
    PunchBlocks {
        coll: CollId,
        obj: Name,
        first_block: u64,
        nblocks: u64,
    },
    SetSize {
        coll: CollId,
        obj: Name,
        size: u64,
    },
    Remove {
        coll: CollId,
        obj: Name,
    },
    SetAttr {
        coll: CollId,
        obj: Name,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RmAttr {
        coll: CollId,
        obj: Name,
        name: Vec<u8>,
    },
    KvSet {
        coll: CollId,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    KvRm {
        coll: CollId,
        key: Vec<u8>,
    },
    KvRmRange {
        coll: CollId,
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

/// Most blocks one `SetBlocks` or `PlaceBlocks` effect carries (the decoder's limit).
pub(crate) const MAX_BLOCKS_PER_EFFECT: u32 = (limits::TXN_BYTES / BLOCK_SIZE) as u32;

/// Appends the encoding of `effects` to `out`. Payloads must be [`Payload::Owned`] (payloads
/// already in a record are copied from `rec`).
pub fn encode(effects: &[Effect], rec: &[u8], out: &mut Vec<u8>) {
    let mut w = Writer(out);
    w.u32(effects.len() as u32);
    for e in effects {
        encode_one(e, rec, out, None);
    }
}

/// Like [`encode`], but the data of [`Payload::Owned`] payloads is not copied into `out`: each
/// is listed in `payloads` with the offset of `out` it belongs at (for a
/// [`crate::wal::QueuedRecord`], laid out later in its batch).
pub fn encode_deferring(
    effects: &[Effect],
    out: &mut Vec<u8>,
    payloads: &mut Vec<(usize, SharedBytes)>,
) {
    let mut w = Writer(out);
    w.u32(effects.len() as u32);
    for e in effects {
        encode_one(e, &[], out, Some(&mut *payloads));
    }
}

fn encode_one(
    e: &Effect,
    rec: &[u8],
    out: &mut Vec<u8>,
    defer: Option<&mut Vec<(usize, SharedBytes)>>,
) {
    let mut w = Writer(out);
    match e {
        Effect::CreateColl(c) => {
            w.u8(1);
            w.u64(*c);
        }
        Effect::RemoveColl(c) => {
            w.u8(2);
            w.u64(*c);
        }
        Effect::Touch { coll, obj } => {
            w.u8(3);
            w.u64(*coll);
            w.name(obj);
        }
        Effect::SetBlocks {
            coll,
            obj,
            first_block,
            nblocks,
            data,
        } => {
            block_run_header(&mut w, 4, *coll, obj, *first_block, *nblocks);
            let len = *nblocks as usize * BLOCK_SIZE;
            match data {
                Payload::Owned(bytes) => match (defer, bytes.slice(0..len)) {
                    (Some(d), Some(part)) => d.push((out.len(), part)),
                    _ => out.extend_from_slice(&bytes[..len]),
                },
                Payload::InRecord(off) => out.extend_from_slice(&rec[*off..*off + len]),
            }
        }
        Effect::PlaceBlocks {
            coll,
            obj,
            first_block,
            nblocks,
            off,
            crcs,
        } => {
            block_run_header(&mut w, 13, *coll, obj, *first_block, *nblocks);
            w.u64(*off);
            for c in crcs.iter() {
                w.u32(*c);
            }
        }
        Effect::PunchBlocks {
            coll,
            obj,
            first_block,
            nblocks,
        } => {
            w.u8(5);
            w.u64(*coll);
            w.name(obj);
            w.u64(*first_block);
            w.u64(*nblocks);
        }
        Effect::SetSize { coll, obj, size } => {
            w.u8(6);
            w.u64(*coll);
            w.name(obj);
            w.u64(*size);
        }
        Effect::Remove { coll, obj } => {
            w.u8(7);
            w.u64(*coll);
            w.name(obj);
        }
        Effect::SetAttr {
            coll,
            obj,
            name,
            value,
        } => {
            w.u8(8);
            w.u64(*coll);
            w.name(obj);
            w.name(name);
            w.blob(value);
        }
        Effect::RmAttr { coll, obj, name } => {
            w.u8(9);
            w.u64(*coll);
            w.name(obj);
            w.name(name);
        }
        Effect::KvSet { coll, key, value } => {
            w.u8(10);
            w.u64(*coll);
            w.name(key);
            w.blob(value);
        }
        Effect::KvRm { coll, key } => {
            w.u8(11);
            w.u64(*coll);
            w.name(key);
        }
        Effect::KvRmRange { coll, start, end } => {
            w.u8(12);
            w.u64(*coll);
            w.name(start);
            w.name(end);
        }
    }
}

/// The start of a `SetBlocks` or `PlaceBlocks` effect (read back by `block_run`).
fn block_run_header(w: &mut Writer, tag: u8, coll: CollId, obj: &[u8], first: u64, n: u32) {
    w.u8(tag);
    w.u64(coll);
    w.name(obj);
    w.u64(first);
    w.u32(n);
}

/// Decodes the effects of a record; `payload_base` is the offset of `buf` within the record,
/// so that [`Payload::InRecord`] offsets index the whole record.
pub fn decode(buf: &[u8], payload_base: usize) -> Result<Vec<Effect>, DecodeError> {
    let mut r = Reader::new(buf);
    let n = r.u32()? as usize;
    if n > limits::OPS * 4 {
        return Err(DecodeError(format!(
            "{n} effects in one record, over the limit"
        )));
    }
    let mut v = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        v.push(decode_one(&mut r, payload_base)?);
    }
    if r.remaining() != 0 {
        return Err(DecodeError(format!(
            "{} trailing bytes after the effects",
            r.remaining()
        )));
    }
    Ok(v)
}

fn obj(r: &mut Reader) -> Result<Name, DecodeError> {
    Ok(Arc::from(r.name(limits::OBJECT_NAME)?))
}

fn decode_one(r: &mut Reader, base: usize) -> Result<Effect, DecodeError> {
    let tag = r.u8()?;
    let coll = r.u64()?;
    Ok(match tag {
        1 => Effect::CreateColl(coll),
        2 => Effect::RemoveColl(coll),
        3 => Effect::Touch { coll, obj: obj(r)? },
        4 => {
            let (obj, first_block, nblocks) = block_run(r)?;
            let off = base + r.pos();
            r.take(nblocks as usize * BLOCK_SIZE)?;
            Effect::SetBlocks {
                coll,
                obj,
                first_block,
                nblocks,
                data: Payload::InRecord(off),
            }
        }
        5 => {
            let obj = obj(r)?;
            let first_block = r.u64()?;
            let nblocks = r.u64()?;
            check_blocks(first_block, nblocks)?;
            Effect::PunchBlocks {
                coll,
                obj,
                first_block,
                nblocks,
            }
        }
        6 => {
            let obj = obj(r)?;
            let size = r.u64()?;
            if size > limits::OBJECT_SIZE {
                return Err(DecodeError(format!("object size {size} over the limit")));
            }
            Effect::SetSize { coll, obj, size }
        }
        7 => Effect::Remove { coll, obj: obj(r)? },
        8 => Effect::SetAttr {
            coll,
            obj: obj(r)?,
            name: r.name(limits::ATTR_NAME)?.to_vec(),
            value: r.blob(limits::ATTR_VALUE)?.to_vec(),
        },
        9 => Effect::RmAttr {
            coll,
            obj: obj(r)?,
            name: r.name(limits::ATTR_NAME)?.to_vec(),
        },
        10 => Effect::KvSet {
            coll,
            key: r.name(limits::KV_KEY)?.to_vec(),
            value: r.blob(limits::KV_VALUE)?.to_vec(),
        },
        11 => Effect::KvRm {
            coll,
            key: r.name(limits::KV_KEY)?.to_vec(),
        },
        12 => Effect::KvRmRange {
            coll,
            start: r.name(limits::KV_KEY)?.to_vec(),
            end: r.name(limits::KV_KEY)?.to_vec(),
        },
        13 => {
            let (obj, first_block, nblocks) = block_run(r)?;
            let off = r.u64()?;
            if !off.is_multiple_of(BLOCK_SIZE as u64) {
                return Err(DecodeError(format!("unaligned data offset {off}")));
            }
            // Sized from the input only once the input is known to hold it.
            let raw = r.take(nblocks as usize * 4)?;
            let crcs = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Effect::PlaceBlocks {
                coll,
                obj,
                first_block,
                nblocks,
                off,
                crcs,
            }
        }
        t => return Err(DecodeError(format!("unknown effect tag {t}"))),
    })
}

/// The object, first block and block count of a `SetBlocks` or `PlaceBlocks`, checked.
fn block_run(r: &mut Reader) -> Result<(Name, u64, u32), DecodeError> {
    let obj = obj(r)?;
    let first_block = r.u64()?;
    let nblocks = r.u32()?;
    if nblocks == 0 || nblocks > MAX_BLOCKS_PER_EFFECT {
        return Err(DecodeError(format!("bad block count {nblocks}")));
    }
    check_blocks(first_block, nblocks as u64)?;
    Ok((obj, first_block, nblocks))
}

fn check_blocks(first: u64, n: u64) -> Result<(), DecodeError> {
    let max = limits::OBJECT_SIZE / BLOCK_SIZE as u64;
    if first.checked_add(n).is_none_or(|end| end > max) {
        return Err(DecodeError(format!(
            "block range {first}+{n} beyond the object size limit"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record queued with its payloads left out is laid out byte for byte as the record
    /// encoded whole, and holds the payloads' buffers instead of copies.
    #[test]
    fn deferred_payloads_lay_out_as_the_whole_record() {
        let o: Name = Arc::from(&b"obj"[..]);
        let big = SharedBytes::new((0..3 * BLOCK_SIZE).map(|i| (i % 251) as u8).collect());
        let set = |first_block, nblocks, data: &SharedBytes| Effect::SetBlocks {
            coll: 4,
            obj: o.clone(),
            first_block,
            nblocks,
            data: Payload::Owned(data.clone()),
        };
        let effects = vec![
            set(0, 2, &big),
            Effect::KvSet {
                coll: 4,
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            },
            set(9, 1, &big.slice(BLOCK_SIZE..2 * BLOCK_SIZE).unwrap()),
            Effect::SetSize {
                coll: 4,
                obj: o.clone(),
                size: 40_000,
            },
        ];
        let mut whole = Vec::new();
        encode(&effects, &[], &mut whole);
        let mut q = crate::wal::QueuedRecord::default();
        encode_deferring(&effects, &mut q.meta, &mut q.payloads);
        assert_eq!(q.payloads.len(), 2);
        assert_eq!(q.len(), whole.len());
        assert_eq!(q.meta.len(), whole.len() - 3 * BLOCK_SIZE);
        let mut laid = vec![0u8; q.len()];
        q.write_into(&mut laid);
        assert_eq!(laid, whole);
        assert!(
            big.holders() >= 3,
            "the queued record holds the payload's buffer"
        );
    }

    #[test]
    fn round_trip_all_effects() {
        let o: Name = Arc::from(&b"obj"[..]);
        let effects = vec![
            Effect::CreateColl(1),
            Effect::RemoveColl(2),
            Effect::Touch {
                coll: 1,
                obj: o.clone(),
            },
            Effect::SetBlocks {
                coll: 1,
                obj: o.clone(),
                first_block: 3,
                nblocks: 1,
                data: Payload::Owned(SharedBytes::new(vec![9; BLOCK_SIZE])),
            },
            Effect::PunchBlocks {
                coll: 1,
                obj: o.clone(),
                first_block: 0,
                nblocks: 2,
            },
            Effect::PlaceBlocks {
                coll: 1,
                obj: o.clone(),
                first_block: 8,
                nblocks: 2,
                off: 1 << 20,
                crcs: vec![7, 8].into(),
            },
            Effect::SetSize {
                coll: 1,
                obj: o.clone(),
                size: 77,
            },
            Effect::Remove {
                coll: 1,
                obj: o.clone(),
            },
            Effect::SetAttr {
                coll: 1,
                obj: o.clone(),
                name: b"a".to_vec(),
                value: b"v".to_vec(),
            },
            Effect::RmAttr {
                coll: 1,
                obj: o.clone(),
                name: b"a".to_vec(),
            },
            Effect::KvSet {
                coll: 1,
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            },
            Effect::KvRm {
                coll: 1,
                key: b"k".to_vec(),
            },
            Effect::KvRmRange {
                coll: 1,
                start: b"a".to_vec(),
                end: b"z".to_vec(),
            },
        ];
        let mut out = vec![0u8; 10];
        encode(&effects, &[], &mut out);
        let back = decode(&out[10..], 10).unwrap();
        assert_eq!(back.len(), effects.len());
        assert_eq!(back[..3], effects[..3]);
        assert_eq!(back[4..], effects[4..]);
        let Effect::SetBlocks {
            data: Payload::InRecord(off),
            ..
        } = &back[3]
        else {
            panic!("payload not in record")
        };
        assert_eq!(out[*off], 9);
        for cut in 0..out.len() - 10 {
            assert!(decode(&out[10..10 + cut], 10).is_err());
        }
    }
}
