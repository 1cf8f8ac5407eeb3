//! The read path: plan under the collection's lock, read devices without it, verify every block.
//!
//! A read is planned under its collection's lock ([`Store::plan_read`]): blocks held in memory and
//! in the read cache are copied at once, and the extents left for a data device are kept in
//! the [`ReadPlan`]. [`Store::finish_read`] reads those without any lock, on any thread, so
//! a caller can keep its own thread for work that needs no device (the OSD hands plans that
//! need a device to its reader threads and serves cache hits in place).

use crate::device::{align_up, AlignedBuf, BLOCK_SIZE};
use crate::error::{Result, StoreError};
use crate::index::{Collection, Extent, Loc};
use crate::mirror::Mirror;
use crate::store::{ObjectStat, Shared, Store};
use crate::txn::CollId;

const B: u64 = BLOCK_SIZE as u64;

/// A read planned under its collection's lock: what memory and the read cache held is already
/// copied; the extents in `todo` are still to be read from a data device.
///
/// A plan stays valid after the lock is dropped because the store is log-structured: a
/// block's place on the device is not written again until the cleaner has moved its data
/// and its segment is reused, and every block read is checked against the crc the plan
/// took. A block that moved in between fails that check: the read is then planned again
/// ([`StoreError::CorruptData`] from [`Store::finish_read`] means "plan again once", as
/// [`Store::read`] does).
pub struct ReadPlan {
    coll: CollId,
    obj: Vec<u8>,
    size: u64,
    /// Object block of `buf`'s first byte.
    first: u64,
    /// Bytes of `buf` before the first byte asked for, and the bytes returned.
    skip: usize,
    len: usize,
    buf: Vec<u8>,
    todo: Vec<(u64, Extent)>,
    cached: bool,
}

impl ReadPlan {
    /// The object's size when the read was planned.
    pub fn object_size(&self) -> u64 {
        self.size
    }

    /// Whether [`Store::finish_read`] has device reads to do (false: it only returns the
    /// bytes already copied).
    pub fn needs_device(&self) -> bool {
        !self.todo.is_empty()
    }

    /// Bytes the plan holds (what a queue of plans costs in memory).
    pub fn buffer_bytes(&self) -> usize {
        self.buf.len()
    }

    fn into_data(mut self) -> Vec<u8> {
        self.buf.truncate(self.skip + self.len);
        self.buf.drain(..self.skip);
        self.buf
    }
}

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
        match finish(sh, plan(sh, coll, obj, offset, len, cached)?) {
            Err(e @ StoreError::CorruptData { .. }) if attempt > 0 => return Err(e),
            Err(StoreError::CorruptData { .. }) => attempt += 1,
            r => return r,
        }
    }
}

/// Plans a read (see [`ReadPlan`]) and copies what memory and, if `cached`, the read
/// cache hold.
fn plan(
    sh: &Shared,
    coll: CollId,
    obj: &[u8],
    offset: u64,
    len: u64,
    cached: bool,
) -> Result<ReadPlan> {
    let (size, end, extents) = sh.colls.with(coll, |c| {
        let o = lookup(c, coll, obj)?;
        let end = offset.saturating_add(len).min(o.size);
        let extents = if offset < end {
            o.extents_in(offset / B, end.div_ceil(B))
        } else {
            Vec::new()
        };
        Ok::<_, StoreError>((o.size, end, extents))
    })?;
    let mut p = ReadPlan {
        coll,
        // Named only in the errors of device reads: copied when there are some.
        obj: Vec::new(),
        size,
        first: offset / B,
        skip: 0,
        len: 0,
        buf: Vec::new(),
        todo: Vec::new(),
        cached,
    };
    if offset >= end {
        return Ok(p);
    }
    p.skip = (offset - p.first * B) as usize;
    p.len = (end - offset) as usize;
    p.buf = vec![0u8; ((end.div_ceil(B) - p.first) * B) as usize];
    for (blk, e) in extents {
        let at = ((blk - p.first) * B) as usize;
        let out = &mut p.buf[at..at + e.nblocks as usize * BLOCK_SIZE];
        match &e.loc {
            Loc::Mem(m) => out.copy_from_slice(&m.buf[m.off..m.off + out.len()]),
            Loc::Disk(off) if cached && from_cache(sh, &e, *off, out) => {}
            Loc::Disk(_) => p.todo.push((blk, e)),
        }
    }
    if !p.todo.is_empty() {
        p.obj = obj.to_vec();
    }
    Ok(p)
}

/// Copies an on-disk extent from the read cache when it holds every block of it.
fn from_cache(sh: &Shared, e: &Extent, off: u64, out: &mut [u8]) -> bool {
    let Some(c) = sh.data.cache.as_ref() else {
        return false;
    };
    // Hits are verified like device reads: a stale block can never be returned.
    c.get_all(off, out, |i, b| {
        e.crcs
            .get(i)
            .is_some_and(|crc| cairn_crc::crc32c(b) == *crc)
    })
}

/// Reads what the plan left for the devices and returns the bytes asked for.
fn finish(sh: &Shared, mut p: ReadPlan) -> Result<Vec<u8>> {
    for (blk, e) in std::mem::take(&mut p.todo) {
        let Loc::Disk(off) = e.loc else { continue };
        let at = ((blk - p.first) * B) as usize;
        let out = &mut p.buf[at..at + e.nblocks as usize * BLOCK_SIZE];
        read_disk(sh, p.coll, &p.obj, blk, &e, off, out, p.cached)?;
    }
    Ok(p.into_data())
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
    let generation = cache.map(|c| c.generation());
    let dev = sh.data.pick_reader();
    let mut abuf = AlignedBuf::zeroed(out.len());
    let whole = sh.data.read_from(dev, &mut abuf, off);
    for (i, crc) in e.crcs.iter().enumerate() {
        let r = i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE;
        if whole.is_ok() && cairn_crc::crc32c(&abuf[r.clone()]) == *crc {
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
        cairn_crc::crc32c(b) == crc
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

    /// Plans a read of up to `len` bytes at `offset` under the collection's lock and copies what
    /// memory and the read cache hold; [`Store::finish_read`] does the rest. Cheap unless
    /// the plan [needs a device](ReadPlan::needs_device).
    pub fn plan_read(&self, coll: CollId, obj: &[u8], offset: u64, len: u64) -> Result<ReadPlan> {
        plan(&self.sh, coll, obj, offset, len, true)
    }

    /// Reads what a plan left for the data devices, with no lock held, and returns the
    /// bytes (shorter past the object's end). [`StoreError::CorruptData`] may mean the data
    /// moved since the plan was made: plan again once (or call [`Store::read`]) before
    /// taking it for corruption.
    pub fn finish_read(&self, plan: ReadPlan) -> Result<Vec<u8>> {
        finish(&self.sh, plan)
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
        self.sh.colls.with(coll, |c| {
            let o = lookup(c, coll, obj)?;
            Ok(ObjectStat {
                size: o.size,
                allocated: o.allocated_blocks() * B,
                attrs: o.attrs.len(),
            })
        })
    }

    /// One attribute of an object.
    pub fn get_attr(&self, coll: CollId, obj: &[u8], name: &[u8]) -> Result<Option<Vec<u8>>> {
        self.sh.colls.with(coll, |c| {
            Ok(lookup(c, coll, obj)?.attrs.get(name).map(|v| v.to_vec()))
        })
    }

    /// All attributes of an object.
    pub fn attrs(&self, coll: CollId, obj: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.sh.colls.with(coll, |c| {
            let o = lookup(c, coll, obj)?;
            Ok(o.attrs
                .iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect())
        })
    }

    /// One collection entry.
    pub fn kv_get(&self, coll: CollId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.sh.colls.with(coll, |c| {
            let c = c.ok_or(StoreError::NoCollection(coll))?;
            Ok(c.kv.get(key).map(|v| v.to_vec()))
        })
    }

    /// Collection entries with keys in `start..end` (all when `end` is `None`), at most `limit`.
    pub fn kv_range(
        &self,
        coll: CollId,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        // A store whose metadata fails its checks (`return`), for the tests of how its
        // users class that.
        fail::fail_point!("store_read_corrupt", |_| Err(StoreError::corrupt(
            "collection entries",
            "data",
            0,
            "failpoint store_read_corrupt"
        )));
        self.sh.colls.with(coll, |c| {
            let c = c.ok_or(StoreError::NoCollection(coll))?;
            Ok(c.kv
                .range::<[u8], _>((std::ops::Bound::Included(start), std::ops::Bound::Unbounded))
                .take_while(|(k, _)| end.is_none_or(|e| &k[..] < e))
                .take(limit)
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect())
        })
    }

    /// All collections, in id order.
    pub fn list_collections(&self) -> Vec<CollId> {
        self.sh.colls.ids()
    }

    /// Whether a collection exists.
    pub fn collection_exists(&self, coll: CollId) -> bool {
        self.sh.colls.with(coll, |c| c.is_some())
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
        let lower: Bound<&[u8]> = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        self.sh.colls.with(coll, |c| {
            let c = c.ok_or(StoreError::NoCollection(coll))?;
            Ok(c.objects
                .range::<[u8], _>((lower, Bound::Unbounded))
                .take(limit)
                .map(|(k, _)| k.to_vec())
                .collect())
        })
    }
}

/// An object of a collection (`None`: the collection does not exist).
pub(crate) fn lookup<'a>(
    c: Option<&'a Collection>,
    coll: CollId,
    obj: &[u8],
) -> Result<&'a crate::index::Object> {
    let c = c.ok_or(StoreError::NoCollection(coll))?;
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
