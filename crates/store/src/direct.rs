//! Large writes written once: a write of whole blocks of at least
//! [`StoreConfig::direct_write_min_bytes`](crate::StoreConfig) goes straight to its place in a
//! segment of its own append point, and only its metadata (where, and one crc per block) goes
//! through the WAL, as [`Effect::PlaceBlocks`](crate::effect::Effect::PlaceBlocks).
//!
//! The committing thread does no device I/O for it: it allocates the blocks, applies the write
//! to the index with the data held in memory (reads are served from there meanwhile) and queues
//! the record with a [`DirectJob`]. The thread that writes the WAL batch (`commit::write_batch`)
//! writes the batch's jobs to their blocks, flushes the data devices, then writes the WAL: a
//! record is never durable before its data, and the jobs of one batch share one flush. Then
//! the index points at the blocks on the device. A crash before the record is durable leaves
//! blocks no record names, in space the next open counts free. Small writes keep the WAL path:
//! on NVM a WAL write costs far less than a data-device flush.

use crate::copies::CopyCounters;
use crate::device::{AlignedBuf, BLOCK_SIZE};
use crate::effect::{Effect, Name};
use crate::error::Result;
use crate::index::{block_crcs, ApplyOut, Index, LocMatch, MemRef};
use crate::maint::{account_moved, alloc, relocate_all, Move, Use};
use crate::shared::SharedBytes;
use crate::store::{Shared, State};
use crate::txn::{CollId, Op, Transaction};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const B: u64 = BLOCK_SIZE as u64;
/// Largest staging buffer a thread keeps between batches.
const KEEP_STAGING: usize = 4 << 20;
/// Marks the ids of in-memory extents of direct writes (the flusher's ids never reach it):
/// freeing one is not freeing pending data, since its blocks are accounted where they go.
pub(crate) const DIRECT_ID: u64 = 1 << 63;

thread_local! {
    /// The batch writer's staging buffer for direct writes.
    static STAGING: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Where one direct write goes: runs of (byte offset, blocks) on the data devices, in object
/// block order, the crc of every block and the bytes.
#[derive(Debug)]
pub(crate) struct Placement {
    pub runs: Vec<(u64, u32)>,
    pub crcs: crate::index::Crcs,
    /// The write's payload, shared with the transaction (not copied).
    pub data: SharedBytes,
}

/// Placements of a transaction's ops, by op index (`None`: the op takes the WAL path).
pub(crate) type Placements = Vec<Option<Placement>>;

/// One run of a direct write applied to the index and waiting for its batch to write it.
#[derive(Debug)]
pub(crate) struct DirectJob {
    pub coll: CollId,
    pub obj: Name,
    pub first_block: u64,
    pub nblocks: u32,
    /// Where the blocks go.
    pub disk: u64,
    /// The in-memory extent's id and bytes (from `buf_off`).
    pub id: u64,
    pub buf: Arc<Vec<u8>>,
    pub buf_off: usize,
    /// Whether the blocks enter the read cache once written (not for a replica's copy).
    pub cache: bool,
}

/// Whether `op` is a write that goes straight to the data devices.
pub(crate) fn is_direct(op: &Op, min_bytes: u64) -> bool {
    match op {
        Op::Write { offset, data, .. } => {
            let len = data.len() as u64;
            min_bytes > 0 && len >= min_bytes && offset.is_multiple_of(B) && len.is_multiple_of(B)
        }
        _ => false,
    }
}

/// Allocates blocks for the transaction's large writes. Returns no placements when the
/// transaction has no such write, and none for a write when free segments run short (the WAL
/// path then admits or refuses it as usual). The blocks are accounted live and held from the
/// cleaner until their job is done ([`finish`]) or the transaction is refused ([`abandon`]).
pub(crate) fn place(sh: &Shared, txn: &Transaction) -> Result<Placements> {
    let min = sh.cfg.direct_write_min_bytes;
    if !txn.ops.iter().any(|op| is_direct(op, min)) {
        return Ok(Vec::new());
    }
    let mut runs: Vec<Option<Vec<(u64, u32)>>> = Vec::with_capacity(txn.ops.len());
    // Refuse what the commit would refuse before allocating anything.
    sh.colls
        .with_txn(txn, |idx| crate::commit::validate(idx, txn, &[]))?;
    {
        let mut st = sh.lock();
        if let Some(f) = &st.failed {
            return Err(crate::StoreError::Failed(f.clone()));
        }
        for op in &txn.ops {
            let r = match op {
                Op::Write { data, .. } if is_direct(op, min) => {
                    match alloc_runs(sh, &mut st, data.len() as u64 / B, txn.replicated) {
                        Ok(r) => r,
                        Err(e) => {
                            release(&mut st, runs.iter().flatten(), true);
                            return Err(e);
                        }
                    }
                }
                _ => None,
            };
            runs.push(r);
        }
    }
    // Checksums outside the lock; the index serves reads from the shared payload until the
    // batch writes it.
    Ok(txn
        .ops
        .iter()
        .zip(runs)
        .map(|(op, r)| match (op, r) {
            (Op::Write { data, .. }, Some(runs)) => Some(Placement {
                runs,
                crcs: block_crcs(data),
                data: data.clone(),
            }),
            _ => None,
        })
        .collect())
}

/// Blocks for one direct write, or `None` when it must take the WAL path (free segments
/// short but dead blocks waiting for the cleaner); `NoSpace` when the store has no room for
/// it at all.
fn alloc_runs(
    sh: &Shared,
    st: &mut State,
    blocks: u64,
    replicated: bool,
) -> Result<Option<Vec<(u64, u32)>>> {
    // Large writes are data, never metadata: they leave the reserve alone.
    let avail = crate::commit::room_blocks(sh, st, false, replicated);
    if avail < blocks {
        return Err(crate::StoreError::NoSpace {
            needed: blocks * B,
            available: avail * B,
        });
    }
    match alloc(sh, st, blocks as u32, Use::Direct) {
        Ok(runs) => {
            st.segs.in_flight(&runs, true);
            Ok(Some(runs))
        }
        Err(_) => {
            let avail = crate::commit::available_blocks(sh, st);
            if avail < blocks {
                return Err(crate::StoreError::NoSpace {
                    needed: blocks * B,
                    available: avail * B,
                });
            }
            Ok(None)
        }
    }
}

/// Ends the hold on runs; frees their blocks too when nothing refers to them (`free`).
fn release<'a>(st: &mut State, runs: impl Iterator<Item = &'a Vec<(u64, u32)>>, free: bool) {
    for r in runs {
        st.segs.in_flight(r, false);
        if free {
            for &(off, n) in r {
                st.segs.free_live(off, n);
            }
        }
    }
}

/// Frees the blocks of a transaction refused after [`place`].
pub(crate) fn abandon(st: &mut State, placed: &Placements) {
    release(st, placed.iter().flatten().map(|p| &p.runs), true);
}

/// What applying one effect of a direct write did.
pub(crate) enum Applied {
    /// The run is in the index with its data in memory; the job writes it.
    Job(DirectJob),
    /// The run's collection is gone (validation rules that out): its blocks, (offset,
    /// count), are to be freed ([`release_orphans`]).
    Orphan((u64, u32)),
    /// Not a run of this write.
    NotARun,
}

/// Applies one run of a direct write (an [`Effect::PlaceBlocks`] of `op`) to the
/// transaction's collections with its data in memory.
pub(crate) fn apply_run(
    sh: &Shared,
    idx: &mut Index,
    e: &Effect,
    op: &Op,
    p: &Placement,
    out: &mut ApplyOut,
) -> Applied {
    let (
        Effect::PlaceBlocks {
            coll,
            obj,
            first_block,
            nblocks,
            off,
            crcs,
        },
        Op::Write { offset, .. },
    ) = (e, op)
    else {
        return Applied::NotARun;
    };
    let id = (sh.next_id.fetch_add(1, Ordering::Relaxed) + 1) | DIRECT_ID;
    let (buf, base) = p.data.parts();
    let buf_off = base + ((first_block - offset / B) * B) as usize;
    let mem = MemRef {
        id,
        buf: buf.clone(),
        off: buf_off,
    };
    let Some(name) = idx.place_in_memory(*coll, obj, *first_block, crcs, mem, out) else {
        return Applied::Orphan((*off, *nblocks));
    };
    Applied::Job(DirectJob {
        coll: *coll,
        obj: name,
        first_block: *first_block,
        nblocks: *nblocks,
        disk: *off,
        id,
        buf: buf.clone(),
        buf_off,
        cache: true,
    })
}

/// Frees the blocks of runs [`apply_run`] found no collection for.
pub(crate) fn release_orphans(st: &mut State, runs: &[(u64, u32)]) {
    for &run in runs {
        release(st, std::iter::once(&vec![run]), true);
    }
}

/// Blocks of direct writes queued and not yet written (bounded like pending data).
pub(crate) fn queued_blocks(wq: &crate::store::WalQueue) -> u64 {
    wq.direct_jobs.iter().map(|j| j.nblocks as u64).sum()
}

/// Writes the jobs' data to their blocks (not flushed: the caller flushes once for all) and
/// keeps them in the read cache (but a replica's copies), as the flusher does with its blocks.
/// One after the other: writing up to four at once from scoped threads measured no faster
/// on the benchmark machine, whose bottleneck is the data device's flush.
///
/// A payload is written from where it is when it sits as the devices need it in memory (a
/// frame's data part of whole blocks usually does: the allocator gives large buffers at page
/// boundaries); else it is copied into an aligned buffer first. That copy was 11 % of the
/// machine under `cairn bench objects` write-1m-qd8.
pub(crate) fn write_jobs(sh: &Shared, jobs: &[DirectJob]) -> Result<()> {
    let align = sh.data.mem_align();
    STAGING.with_borrow_mut(|slot| {
        for j in jobs {
            let len = j.nblocks as usize * BLOCK_SIZE;
            let payload = &j.buf[j.buf_off..j.buf_off + len];
            let buf: &[u8] = if (payload.as_ptr() as usize).is_multiple_of(align) {
                payload
            } else {
                // Kept from the last job: a fresh one costs page faults every time.
                let staged = AlignedBuf::reuse(slot, len);
                staged.copy_from_slice(payload);
                CopyCounters::add(&sh.copies.direct_staged, len);
                staged
            };
            if j.cache {
                sh.data.write_data(buf, j.disk)?;
            } else {
                sh.data.write(buf, j.disk)?;
            }
        }
        if slot.as_ref().is_some_and(|b| b.len() > KEEP_STAGING) {
            *slot = None;
        }
        Ok(())
    })
}

/// Points the index at the written blocks of durable jobs (blocks overwritten meanwhile are
/// freed), records them for the cleaner and ends their hold. Takes the collections' table:
/// the caller holds no lock.
pub(crate) fn finish(sh: &Shared, jobs: Vec<DirectJob>) {
    let moves: Vec<Move> = jobs
        .iter()
        .map(|j| Move {
            coll: j.coll,
            obj: &j.obj,
            blk: j.first_block,
            n: j.nblocks,
            from: LocMatch::Mem {
                id: j.id,
                off: j.buf_off,
            },
            disk: j.disk,
        })
        .collect();
    let table = sh.colls.read();
    let moved = relocate_all(sh, &table, &moves);
    // Accounted before the table is released: a checkpoint's snapshot sees the jobs either
    // before they moved or after they were accounted.
    let mut st = sh.lock();
    for ((j, m), moved) in jobs.iter().zip(&moves).zip(moved) {
        st.direct_dest.remove(&j.id);
        account_moved(sh, &mut st, m, &moved);
        st.segs.in_flight(&[(j.disk, j.nblocks)], false);
    }
    if st.cv_waiters > 0 {
        sh.space_cv.notify_all(); // committers waiting for direct-write room
    }
}
