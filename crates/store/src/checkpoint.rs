//! Checkpoints: the whole index serialised into data segments, plus a root that lists where
//! the pieces are. The WAL header points to the root. Data still only in memory at snapshot
//! time is written inline, so a checkpoint never depends on WAL records before its replay
//! point. Format: `docs/format/store.md`.

use crate::codec::{DecodeError, Reader, Writer};
use crate::device::BLOCK_SIZE;
use crate::effect::Name;
use crate::index::{block_crcs, Collection, Dirty, Extent, Index, Loc, MemRef, Object};
use crate::txn::limits;
use std::collections::HashMap;
use std::sync::Arc;

/// Magic at the start of a checkpoint body.
pub const CKPT_MAGIC: &[u8; 8] = b"CAIRNCK1";
/// Magic of a checkpoint root (after its crc).
pub const ROOT_MAGIC: &[u8; 8] = b"CAIRNCR1";
/// Checkpoint format version.
pub const CKPT_VERSION: u32 = 1;
const EXT_DISK: u8 = 0;
const EXT_INLINE: u8 = 1;

/// Serialises a snapshot of the index into `v` (cleared first; its capacity is reused);
/// `replay_seq` is the first WAL record not in it. Returns how many of the body's bytes are
/// inline data. `direct` maps in-memory extents of direct writes (by id) to (offset in their
/// buffer, data-device offset): those are encoded as disk extents.
#[cfg(test)]
pub fn encode(
    index: &Index,
    replay_seq: u64,
    direct: &HashMap<u64, (usize, u64)>,
    v: &mut Vec<u8>,
) -> usize {
    let mut keep = |_: &mut Vec<u8>| Ok::<(), std::convert::Infallible>(());
    match encode_in_pieces(index, replay_seq, direct, v, usize::MAX, &mut keep) {
        Ok(inline) => inline,
        Err(never) => match never {},
    }
}

/// [`encode`], handing the body out in pieces: whenever `v` holds at least `piece` bytes
/// (between two objects or entries, so a piece may be somewhat larger) and once at the end,
/// `spill(v)` takes them and leaves `v` empty. The concatenated pieces are the body. A
/// checkpoint is then written as it is encoded, from one buffer of about `piece` bytes,
/// instead of from a body the size of the index in fresh memory (which the kernel cleared
/// page by page: ~2 % of the machine under 4 KiB random writes).
pub fn encode_in_pieces<E>(
    index: &Index,
    replay_seq: u64,
    direct: &HashMap<u64, (usize, u64)>,
    v: &mut Vec<u8>,
    piece: usize,
    spill: &mut dyn FnMut(&mut Vec<u8>) -> Result<(), E>,
) -> Result<usize, E> {
    v.clear();
    let mut w = Writer(v);
    w.bytes(CKPT_MAGIC);
    w.u32(CKPT_VERSION);
    w.u64(replay_seq);
    w.u64(index.colls.len() as u64);
    let mut out = Spill { v, piece, spill };
    let mut inline = 0;
    for (id, c) in &index.colls {
        inline += encode_coll(&mut out, *id, c, direct)?;
    }
    if !out.v.is_empty() {
        (out.spill)(out.v)?;
    }
    Ok(inline)
}

/// The body being encoded and where its full pieces go.
struct Spill<'a, E> {
    v: &'a mut Vec<u8>,
    piece: usize,
    spill: &'a mut dyn FnMut(&mut Vec<u8>) -> Result<(), E>,
}

impl<E> Spill<'_, E> {
    fn maybe_spill(&mut self) -> Result<(), E> {
        if self.v.len() >= self.piece {
            (self.spill)(self.v)?;
        }
        Ok(())
    }
}

fn encode_coll<E>(
    out: &mut Spill<'_, E>,
    id: u64,
    c: &Collection,
    direct: &HashMap<u64, (usize, u64)>,
) -> Result<usize, E> {
    Writer(out.v).u64(id);
    Writer(out.v).u64(c.kv.len() as u64);
    for (k, val) in &c.kv {
        Writer(out.v).name(k);
        Writer(out.v).blob(val);
        out.maybe_spill()?;
    }
    Writer(out.v).u64(c.objects.len() as u64);
    let mut inline = 0;
    for (name, o) in &c.objects {
        inline += encode_obj(out.v, name, o, direct);
        out.maybe_spill()?;
    }
    Ok(inline)
}

fn encode_obj(
    v: &mut Vec<u8>,
    name: &[u8],
    o: &Object,
    direct: &HashMap<u64, (usize, u64)>,
) -> usize {
    let mut w = Writer(v);
    w.name(name);
    w.u64(o.size);
    w.u64(o.attrs.len() as u64);
    for (k, val) in &o.attrs {
        w.name(k);
        w.blob(val);
    }
    w.u64(o.extents.len() as u64);
    let mut inline = 0;
    for (first, e) in &o.extents {
        w.u64(*first);
        w.u32(e.nblocks);
        let on_disk = match &e.loc {
            Loc::Disk(off) => Ok(*off),
            Loc::Mem(m) => direct
                .get(&m.id)
                .map(|&(buf_off, disk)| disk + (m.off - buf_off) as u64)
                .ok_or(m),
        };
        match on_disk {
            Ok(off) => {
                w.u8(EXT_DISK);
                w.u64(off);
            }
            Err(m) => {
                w.u8(EXT_INLINE);
                w.bytes(&m.buf[m.off..m.off + e.nblocks as usize * BLOCK_SIZE]);
                inline += e.nblocks as usize * BLOCK_SIZE;
            }
        }
        for c in e.crcs.iter() {
            w.u32(*c);
        }
    }
    inline
}

/// A decoded checkpoint.
pub struct Decoded {
    pub index: Index,
    pub replay_seq: u64,
    /// Inline (not yet flushed) extents, for the flusher.
    pub dirty: Vec<Dirty>,
}

/// Decodes a checkpoint body; `next_id` numbers in-memory extents.
pub fn decode(buf: &[u8], next_id: &mut u64) -> Result<Decoded, DecodeError> {
    let mut r = Reader::new(buf);
    if r.take(8)? != CKPT_MAGIC {
        return Err(DecodeError("bad checkpoint magic".into()));
    }
    let version = r.u32()?;
    if version != CKPT_VERSION {
        return Err(DecodeError(format!(
            "checkpoint version {version} is not supported"
        )));
    }
    let replay_seq = r.u64()?;
    let ncoll = r.count(buf.len() as u64)?;
    let mut index = Index::default();
    let mut dirty = Vec::new();
    for _ in 0..ncoll {
        let id = r.u64()?;
        let c = decode_coll(&mut r, id, buf.len() as u64, next_id, &mut dirty)?;
        index.colls.insert(id, Arc::new(c));
    }
    if r.remaining() != 0 {
        return Err(DecodeError(format!(
            "{} trailing bytes in checkpoint",
            r.remaining()
        )));
    }
    Ok(Decoded {
        index,
        replay_seq,
        dirty,
    })
}

fn decode_coll(
    r: &mut Reader,
    id: u64,
    max: u64,
    next_id: &mut u64,
    dirty: &mut Vec<Dirty>,
) -> Result<Collection, DecodeError> {
    let mut c = Collection::default();
    for _ in 0..r.count(max)? {
        let k = r.name(limits::KV_KEY)?.into();
        c.kv.insert(k, r.blob(limits::KV_VALUE)?.into());
    }
    for _ in 0..r.count(max)? {
        let name: Name = Arc::from(r.name(limits::OBJECT_NAME)?);
        let o = decode_obj(r, id, &name, max, next_id, dirty)?;
        c.objects.insert(name, Arc::new(o));
    }
    Ok(c)
}

fn decode_obj(
    r: &mut Reader,
    coll: u64,
    name: &Name,
    max: u64,
    next_id: &mut u64,
    dirty: &mut Vec<Dirty>,
) -> Result<Object, DecodeError> {
    let mut o = Object {
        size: r.u64()?,
        ..Default::default()
    };
    if o.size > limits::OBJECT_SIZE {
        return Err(DecodeError(format!(
            "object size {} over the limit",
            o.size
        )));
    }
    for _ in 0..r.count(max)? {
        let k = r.name(limits::ATTR_NAME)?.into();
        o.attrs.insert(k, r.blob(limits::ATTR_VALUE)?.into());
    }
    for _ in 0..r.count(max)? {
        let first = r.u64()?;
        let nblocks = r.u32()?;
        let bytes = nblocks as usize * BLOCK_SIZE;
        let in_object = first.checked_add(nblocks as u64);
        if nblocks == 0 || in_object.is_none_or(|end| end > limits::OBJECT_SIZE / BLOCK_SIZE as u64)
        {
            return Err(DecodeError(format!(
                "bad extent of {nblocks} blocks at block {first}"
            )));
        }
        let loc = match r.u8()? {
            EXT_DISK => Loc::Disk(r.u64()?),
            EXT_INLINE => {
                if bytes as u64 > max {
                    return Err(DecodeError(format!(
                        "inline extent of {nblocks} blocks overruns"
                    )));
                }
                *next_id += 1;
                let data = r.take(bytes)?.to_vec();
                dirty.push(Dirty {
                    coll,
                    obj: name.clone(),
                    first_block: first,
                    nblocks,
                    id: *next_id,
                    cache: true,
                });
                Loc::Mem(MemRef {
                    id: *next_id,
                    buf: Arc::new(data),
                    off: 0,
                })
            }
            k => return Err(DecodeError(format!("unknown extent kind {k}"))),
        };
        if nblocks as usize * 4 > r.remaining() {
            return Err(DecodeError(format!(
                "extent of {nblocks} blocks overruns the checkpoint"
            )));
        }
        let mut crcs = Vec::with_capacity(nblocks as usize);
        for _ in 0..nblocks {
            crcs.push(r.u32()?);
        }
        if let Loc::Mem(m) = &loc {
            if *block_crcs(&m.buf) != *crcs {
                return Err(DecodeError(
                    "inline extent data does not match its crcs".into(),
                ));
            }
        }
        o.extents.insert(
            first,
            Extent {
                nblocks,
                loc,
                crcs: crcs.into(),
            },
        );
    }
    Ok(o)
}

/// Where the pieces of a checkpoint body are on the data devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub generation: u64,
    pub total_len: u64,
    /// (byte offset, length, crc32c) of each piece, in order.
    pub pieces: Vec<(u64, u32, u32)>,
}

/// Most pieces a root may list (bounds the decoder's allocation).
pub const MAX_PIECES: u64 = 1 << 20;

impl Root {
    /// Encodes the root; the crc32c at offset 0 covers the rest.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        let mut w = Writer(&mut v);
        w.u32(0);
        w.bytes(ROOT_MAGIC);
        w.u32(CKPT_VERSION);
        w.u64(self.generation);
        w.u64(self.total_len);
        w.u64(self.pieces.len() as u64);
        for (off, len, crc) in &self.pieces {
            w.u64(*off);
            w.u32(*len);
            w.u32(*crc);
        }
        crate::format::seal(&mut v);
        v
    }

    /// Decodes and verifies a root of exactly `buf.len()` bytes.
    pub fn decode(buf: &[u8]) -> Result<Root, DecodeError> {
        if !crate::format::sealed_ok(buf) {
            return Err(DecodeError("checkpoint root checksum mismatch".into()));
        }
        let mut r = Reader::new(&buf[4..]);
        if r.take(8)? != ROOT_MAGIC || r.u32()? != CKPT_VERSION {
            return Err(DecodeError("bad checkpoint root magic or version".into()));
        }
        let generation = r.u64()?;
        let total_len = r.u64()?;
        let n = r.count(MAX_PIECES)?;
        let mut pieces = Vec::with_capacity(n.min(4096) as usize);
        for _ in 0..n {
            pieces.push((r.u64()?, r.u32()?, r.u32()?));
        }
        let sum: u64 = pieces.iter().map(|p| p.1 as u64).sum();
        if sum != total_len {
            return Err(DecodeError("checkpoint piece lengths do not add up".into()));
        }
        Ok(Root {
            generation,
            total_len,
            pieces,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effect::{Effect, Payload};
    use crate::index::ApplyOut;

    #[test]
    fn snapshot_round_trips_with_inline_data() {
        let mut idx = Index::default();
        let rec: crate::wal::RecordBuf = Arc::new(vec![5u8; 2 * BLOCK_SIZE]);
        let (mut id, mut out) = (0, ApplyOut::default());
        let ids = std::sync::atomic::AtomicU64::new(0);
        let o: Name = Arc::from(&b"o"[..]);
        for e in [
            Effect::CreateColl(3),
            Effect::SetBlocks {
                coll: 3,
                obj: o.clone(),
                first_block: 1,
                nblocks: 2,
                data: Payload::InRecord(0),
            },
            Effect::SetSize {
                coll: 3,
                obj: o.clone(),
                size: 3 * 4096,
            },
            Effect::SetAttr {
                coll: 3,
                obj: o.clone(),
                name: b"n".to_vec(),
                value: b"v".to_vec(),
            },
            Effect::KvSet {
                coll: 3,
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            },
        ] {
            idx.apply(&e, &rec, &ids, &mut out);
        }
        // A reused buffer: what it held before is not part of the body.
        let mut bytes = vec![0xaa; 100];
        let inline = encode(&idx, 9, &HashMap::new(), &mut bytes);
        assert_eq!(inline, 2 * BLOCK_SIZE);
        let d = decode(&bytes, &mut id).unwrap();
        assert_eq!(d.replay_seq, 9);
        assert_eq!(d.dirty.len(), 1);
        let back = d.index.object(3, b"o").unwrap();
        assert_eq!(back.size, 3 * 4096);
        assert_eq!(&back.attrs.get(&b"n"[..]).unwrap()[..], b"v");
        assert_eq!(d.index.coll(3).unwrap().kv.len(), 1);
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut], &mut id).is_err());
        }
        let root = Root {
            generation: 2,
            total_len: 10,
            pieces: vec![(4096, 10, 7)],
        };
        assert_eq!(Root::decode(&root.encode()).unwrap(), root);
    }

    /// Written in pieces, the body is the same bytes as in one buffer, and no piece waits
    /// for more than one object or entry beyond the piece size.
    #[test]
    fn a_body_encoded_in_pieces_is_the_whole_body_cut_between_objects() {
        let mut idx = Index::default();
        let rec: crate::wal::RecordBuf = Arc::new(vec![5u8; BLOCK_SIZE]);
        let mut out = ApplyOut::default();
        let ids = std::sync::atomic::AtomicU64::new(0);
        idx.apply(&Effect::CreateColl(1), &rec, &ids, &mut out);
        for i in 0..50u32 {
            let obj: Name = Arc::from(format!("object-{i}").as_bytes());
            let key = format!("log.{i:08}").into_bytes();
            for e in [
                Effect::SetSize {
                    coll: 1,
                    obj,
                    size: 4096,
                },
                Effect::KvSet {
                    coll: 1,
                    key,
                    value: vec![i as u8; 40],
                },
            ] {
                idx.apply(&e, &rec, &ids, &mut out);
            }
        }
        let mut whole = Vec::new();
        encode(&idx, 4, &HashMap::new(), &mut whole);
        for piece in [1, 100, 1000, whole.len(), usize::MAX] {
            let mut parts: Vec<Vec<u8>> = Vec::new();
            let mut buf = Vec::new();
            let mut take = |v: &mut Vec<u8>| {
                assert!(!v.is_empty(), "an empty piece");
                parts.push(std::mem::take(v));
                Ok::<(), ()>(())
            };
            encode_in_pieces(&idx, 4, &HashMap::new(), &mut buf, piece, &mut take).unwrap();
            assert!(buf.is_empty());
            assert_eq!(parts.concat(), whole, "piece size {piece}");
            // An object or entry here encodes in under 100 bytes; the body's and the
            // collection's headers (44 bytes) go with the entry after them.
            assert!(parts.iter().all(|p| p.len() < piece.saturating_add(150)));
            if piece <= 1000 {
                assert!(parts.len() > 1, "piece size {piece}: one piece");
            }
        }
        // A failing writer stops the encoding with its error.
        let mut fail = |_: &mut Vec<u8>| Err("device gone");
        let r = encode_in_pieces(&idx, 4, &HashMap::new(), &mut Vec::new(), 100, &mut fail);
        assert_eq!(r, Err("device gone"));
    }
}
