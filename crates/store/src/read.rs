//! The read path: plan under the index lock, read devices without it, verify every block.

use crate::device::{AlignedBuf, BLOCK_SIZE};
use crate::error::{Result, StoreError};
use crate::index::{Extent, Loc};
use crate::store::{lookup, read_verified, Shared};
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
