//! The read path: plan under the index lock, read devices without it, verify every block.

use crate::device::{align_up, AlignedBuf, BLOCK_SIZE};
use crate::error::{Result, StoreError};
use crate::index::{Extent, Index, Loc};
use crate::mirror::Mirror;
use crate::store::{ObjectStat, Shared, Store};
use crate::txn::CollId;

const B: u64 = BLOCK_SIZE as u64;

/// Reads `len` bytes at `offset` of an object (shorter past its end). `cached`: whether the
/// read cache may answer (a scrub must see what the device holds).
pub(crate) fn read(
    sh: &Shared,
    coll: CollId,
    obj: &[u8],
    offset: u64,
    len: u64,
    cached: bool,
) -> Result<Vec<u8>> {
    // A block can move (cleaner) between planning and reading; a mismatch on the old
    // location is then retried once with a fresh plan before it counts as corruption.
    let mut attempt = 0;
    loop {
        let (start, end, plan) = {
            let st = sh.lock();
            let o = lookup(&st.index, coll, obj)?;
            let end = offset.saturating_add(len).min(o.size);
            if offset >= end {
                return Ok(Vec::new());
            }
            let (first, last) = (offset / B, end.div_ceil(B));
            (offset, end, (first, o.extents_in(first, last)))
        };
        let (first, extents) = plan;
        let last = end.div_ceil(B);
        let mut buf = vec![0u8; ((last - first) * B) as usize];
        match fill(sh, coll, obj, first, &extents, &mut buf, cached) {
            Ok(()) => {
                let s = (start - first * B) as usize;
                buf.truncate(s + (end - start) as usize);
                buf.drain(..s);
                return Ok(buf);
            }
            Err(e @ StoreError::CorruptData { .. }) if attempt > 0 => return Err(e),
            Err(StoreError::CorruptData { .. }) => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

fn fill(
    sh: &Shared,
    coll: CollId,
    obj: &[u8],
    first: u64,
    extents: &[(u64, Extent)],
    buf: &mut [u8],
    cached: bool,
) -> Result<()> {
    for (blk, e) in extents {
        let at = ((blk - first) * B) as usize;
        let n = e.nblocks as usize * BLOCK_SIZE;
        match &e.loc {
            Loc::Mem(m) => buf[at..at + n].copy_from_slice(&m.buf[m.off..m.off + n]),
            Loc::Disk(off) => {
                let out = &mut buf[at..at + n];
                read_disk(sh, coll, obj, *blk, e, *off, out, cached)?
            }
        }
    }
    Ok(())
}

/// Reads an on-disk extent from the preferred device; a block that does not verify, or the
/// whole extent when that device fails, is read from whichever copy verifies.
#[allow(clippy::too_many_arguments)]
fn read_disk(
    sh: &Shared,
    coll: CollId,
    obj: &[u8],
    blk: u64,
    e: &Extent,
    off: u64,
    out: &mut [u8],
    cached: bool,
) -> Result<()> {
    let cache = sh.data.cache.as_ref().filter(|_| cached);
    if let Some(c) = cache {
        // Hits are verified like device reads: a stale block can never be returned.
        if c.get_all(off, out, |i, b| {
            e.crcs.get(i).is_some_and(|crc| crc32c::crc32c(b) == *crc)
        }) {
            return Ok(());
        }
    }
    let generation = cache.map(|c| c.generation());
    let dev = sh.data.pick_reader();
    let mut abuf = AlignedBuf::zeroed(out.len());
    let whole = sh.data.read_from(dev, &mut abuf, off);
    for (i, crc) in e.crcs.iter().enumerate() {
        let r = i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE;
        if whole.is_ok() && crc32c::crc32c(&abuf[r.clone()]) == *crc {
            if let (Some(c), Some(g)) = (cache, generation) {
                c.insert_if_current(g, off + r.start as u64, &abuf[r.clone()]);
            }
            out[r.clone()].copy_from_slice(&abuf[r]);
            continue;
        }
        let b = read_block(
            sh,
            coll,
            obj,
            blk + i as u64,
            off + (i * BLOCK_SIZE) as u64,
            *crc,
        )?;
        out[r].copy_from_slice(&b[..BLOCK_SIZE]);
    }
    Ok(())
}

/// One data block from the first device copy that verifies. A block no copy verifies is
/// [`StoreError::CorruptData`]; I/O errors on every copy stay I/O errors.
pub(crate) fn read_block(
    sh: &Shared,
    coll: CollId,
    obj: &[u8],
    block: u64,
    off: u64,
    crc: u32,
) -> Result<AlignedBuf> {
    read_verified(&sh.data, off, B, "object data", |b| {
        crc32c::crc32c(b) == crc
    })
    .map_err(|e| match e {
        StoreError::Corrupt { device, .. } => StoreError::CorruptData {
            coll,
            object: String::from_utf8_lossy(obj).into_owned(),
            block,
            device,
        },
        e => e,
    })
}

/// The read-side API of the store.
impl Store {
    /// Reads up to `len` bytes at `offset`; the result is shorter past the end of the object.
    pub fn read(&self, coll: CollId, obj: &[u8], offset: u64, len: u64) -> Result<Vec<u8>> {
        crate::read::read(&self.sh, coll, obj, offset, len, true)
    }

    /// Like [`Store::read`], but every block comes from a device and is verified there,
    /// never from the read cache (scrub: the cache may hold a good copy of a damaged block).
    pub fn read_uncached(
        &self,
        coll: CollId,
        obj: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        crate::read::read(&self.sh, coll, obj, offset, len, false)
    }

    /// Size and allocation of an object.
    pub fn stat(&self, coll: CollId, obj: &[u8]) -> Result<ObjectStat> {
        let st = self.sh.lock();
        let o = lookup(&st.index, coll, obj)?;
        Ok(ObjectStat {
            size: o.size,
            allocated: o.allocated_blocks() * B,
            attrs: o.attrs.len(),
        })
    }

    /// One attribute of an object.
    pub fn get_attr(&self, coll: CollId, obj: &[u8], name: &[u8]) -> Result<Option<Vec<u8>>> {
        let st = self.sh.lock();
        Ok(lookup(&st.index, coll, obj)?
            .attrs
            .get(name)
            .map(|v| v.to_vec()))
    }

    /// All attributes of an object.
    pub fn attrs(&self, coll: CollId, obj: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let st = self.sh.lock();
        let o = lookup(&st.index, coll, obj)?;
        Ok(o.attrs
            .iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect())
    }

    /// One collection entry.
    pub fn kv_get(&self, coll: CollId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let st = self.sh.lock();
        let c = st.index.coll(coll).ok_or(StoreError::NoCollection(coll))?;
        Ok(c.kv.get(key).map(|v| v.to_vec()))
    }

    /// Collection entries with keys in `start..end` (all when `end` is `None`), at most `limit`.
    pub fn kv_range(
        &self,
        coll: CollId,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let st = self.sh.lock();
        let c = st.index.coll(coll).ok_or(StoreError::NoCollection(coll))?;
        Ok(c.kv
            .range::<[u8], _>((std::ops::Bound::Included(start), std::ops::Bound::Unbounded))
            .take_while(|(k, _)| end.is_none_or(|e| &k[..] < e))
            .take(limit)
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect())
    }

    /// All collections, in id order.
    pub fn list_collections(&self) -> Vec<CollId> {
        self.sh.lock().index.colls.keys().copied().collect()
    }

    /// Whether a collection exists.
    pub fn collection_exists(&self, coll: CollId) -> bool {
        self.sh.lock().index.colls.contains_key(&coll)
    }

    /// Object names of a collection in byte order, starting after `after`, at most `limit`.
    /// The order is stable, so a listing can be resumed from its last name.
    pub fn list_objects(
        &self,
        coll: CollId,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>> {
        use std::ops::Bound;
        let st = self.sh.lock();
        let c = st.index.coll(coll).ok_or(StoreError::NoCollection(coll))?;
        let lower: Bound<&[u8]> = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        Ok(c.objects
            .range::<[u8], _>((lower, Bound::Unbounded))
            .take(limit)
            .map(|(k, _)| k.to_vec())
            .collect())
    }
}

pub(crate) fn lookup<'a>(
    idx: &'a Index,
    coll: CollId,
    obj: &[u8],
) -> Result<&'a crate::index::Object> {
    let c = idx.coll(coll).ok_or(StoreError::NoCollection(coll))?;
    c.objects
        .get(obj)
        .map(|o| o.as_ref())
        .ok_or_else(|| StoreError::NoObject {
            coll,
            object: String::from_utf8_lossy(obj).into_owned(),
        })
}

/// Reads `len` bytes at `off` from the first device copy whose bytes pass `ok`.
pub(crate) fn read_verified(
    data: &Mirror,
    off: u64,
    len: u64,
    what: &'static str,
    ok: impl Fn(&[u8]) -> bool,
) -> Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(align_up(len) as usize);
    let mut last = None;
    for i in 0..data.count() {
        match data.read_from(i, &mut buf, off) {
            Ok(()) if ok(&buf[..len as usize]) => return Ok(buf),
            Ok(()) => {
                last = Some(StoreError::corrupt(
                    what,
                    data.name(i),
                    off,
                    "checksum mismatch",
                ))
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| StoreError::Config("no data devices".into())))
}
