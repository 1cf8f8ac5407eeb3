//! The commit path, run to completion by the submitting thread:
//! validate -> resolve into effects and apply them to the index -> encode one WAL record ->
//! group-commit it (the first waiting thread writes and flushes everyone's records) -> return.
//! `submit` + `sync_through` split the last step, so one thread can group its own commits.
//! No data-device I/O happens here under a lock: old blocks a read-modify-write needs are read
//! with no lock held (`edges.rs`), and a batch that carries large writes written once
//! (`direct.rs`) has its writer write their data and flush the data devices, outside the locks
//! too, before the WAL.

use crate::copies::CopyCounters;
use crate::device::BLOCK_SIZE;
use crate::direct::{self, Placement, Placements};
use crate::edges::EdgeBlocks;
use crate::effect::{self, Effect, Name, Payload};
use crate::error::{Result, StoreError};
use crate::index::{ApplyOut, Freed, Index};
use crate::shared::SharedBytes;
use crate::store::{Shared, State, Store, WalQueue};
use crate::txn::{limits, CollId, Op, Transaction};
use crate::wal::{self, layout_batch, RecordBuf};
use cairn_failstop::CondvarOrDie;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

const B: u64 = BLOCK_SIZE as u64;
/// The largest WAL batch buffer kept for the next batch (a batch of large records can be
/// tens of MiB, which would otherwise stay allocated).
const BATCH_SPARE_MAX: usize = 4 << 20;

impl Store {
    /// Commits a transaction atomically; returns its sequence number once it is durable in
    /// the WAL. On error nothing of the transaction is applied.
    pub fn commit(&self, txn: &Transaction) -> Result<u64> {
        let seq = submit(&self.sh, txn)?;
        wait_durable(&self.sh, seq)
    }

    /// Applies a transaction and queues its WAL record without waiting for it to be durable;
    /// returns its sequence number. Its effects are visible to reads at once. A caller that
    /// submits several transactions and then calls [`Store::sync_through`] with the last
    /// sequence number makes them all durable with one WAL write and flush (a thread that
    /// handles many requests in a row commits them as one group). On error nothing of the
    /// transaction is applied.
    pub fn submit(&self, txn: &Transaction) -> Result<u64> {
        submit(&self.sh, txn)
    }

    /// The sequence number of the last transaction submitted (0 before any).
    pub fn last_submitted(&self) -> u64 {
        self.sh.wal_lock().next_seq.saturating_sub(1)
    }

    /// Waits until every transaction up to sequence `seq` is durable, writing the queued
    /// records itself when no other thread is.
    pub fn sync_through(&self, seq: u64) -> Result<u64> {
        let wq = self.sh.wal_lock();
        // A number never handed out would never become durable: wait for the last one.
        let seq = seq.min(wq.next_seq.saturating_sub(1));
        // Wait on the batch after the durable prefix, not on `seq`: the records of a thread
        // that submitted several may be neither in the batch being written nor the first
        // queued after it, the only ones a writer wakes.
        wait_until_durable(&self.sh, wq, seq, |wq| wq.durable_seq + 1)
    }
}

fn too_large(what: &'static str, size: usize, limit: usize) -> StoreError {
    StoreError::TooLarge {
        what,
        size: size as u64,
        limit: limit as u64,
    }
}

fn check_name(obj: &[u8]) -> Result<()> {
    if obj.is_empty() {
        return Err(StoreError::Invalid("empty object name".into()));
    }
    if obj.len() > limits::OBJECT_NAME {
        return Err(too_large("object name", obj.len(), limits::OBJECT_NAME));
    }
    Ok(())
}

fn check_range(off: u64, len: u64) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= limits::OBJECT_SIZE => Ok(()),
        _ => Err(StoreError::TooLarge {
            what: "object offset + length",
            size: off.saturating_add(len),
            limit: limits::OBJECT_SIZE,
        }),
    }
}

/// Checks limits and collection existence; returns (new data blocks the WAL path carries,
/// encoded size estimate). Ops with a placement in `placed` carry only their metadata.
pub(crate) fn validate(
    idx: &Index,
    txn: &Transaction,
    placed: &[Option<Placement>],
) -> Result<(u64, u64)> {
    check(Some(idx), txn, placed)
}

/// [`validate`] without the index: the limits and what the transaction needs (new data blocks,
/// record size estimate), which depend on its ops only. Whether its collections exist is left
/// to [`validate`].
fn sizes(txn: &Transaction, placed: &[Option<Placement>]) -> Result<(u64, u64)> {
    check(None, txn, placed)
}

fn check(
    idx: Option<&Index>,
    txn: &Transaction,
    placed: &[Option<Placement>],
) -> Result<(u64, u64)> {
    if txn.ops.len() > limits::OPS {
        return Err(too_large(
            "transaction (operations)",
            txn.ops.len(),
            limits::OPS,
        ));
    }
    // Collections this transaction creates or removes, in order (a transaction names few, so
    // a vector beats a map; nothing is allocated for the common case of none).
    let mut changed: Vec<(CollId, bool)> = Vec::new();
    let (mut blocks, mut bytes) = (0u64, 64u64);
    for (i, op) in txn.ops.iter().enumerate() {
        let c = op.coll();
        let present = idx.map(|idx| {
            changed
                .iter()
                .rev()
                .find(|(id, _)| *id == c)
                .map_or_else(|| idx.colls.contains_key(&c), |&(_, e)| e)
        });
        // Upper bound of the effects' encoding: up to three effects naming the object, two
        // edge blocks of read-modify-write, and the payloads.
        bytes += 96 + rmw_bytes(op) + 3 * (2 + op_name_len(op));
        match op {
            Op::CreateCollection(_) if present == Some(true) => {
                return Err(StoreError::CollectionExists(c))
            }
            Op::CreateCollection(_) => {
                changed.push((c, true));
                continue;
            }
            _ if present == Some(false) => return Err(StoreError::NoCollection(c)),
            Op::RemoveCollection(_) => {
                changed.push((c, false));
            }
            Op::Touch { obj, .. } | Op::Remove { obj, .. } => check_name(obj)?,
            Op::Write {
                obj, offset, data, ..
            } => {
                check_name(obj)?;
                check_range(*offset, data.len() as u64)?;
                let first = offset / B;
                let end = (offset + data.len() as u64).div_ceil(B);
                if let Some(Some(p)) = placed.get(i) {
                    // An effect per run (or part of one): header, name, offset and a crc
                    // per block.
                    let effects =
                        p.runs.len() as u64 + (end - first) / effect::MAX_BLOCKS_PER_EFFECT as u64;
                    bytes += effects * (40 + obj.len() as u64) + 4 * (end - first);
                } else {
                    blocks += end.saturating_sub(first);
                    bytes += data.len() as u64;
                }
            }
            Op::Zero {
                obj, offset, len, ..
            } => {
                check_name(obj)?;
                check_range(*offset, *len)?;
            }
            Op::Truncate { obj, size, .. } => {
                check_name(obj)?;
                check_range(*size, 0)?;
            }
            Op::SetAttr {
                obj, name, value, ..
            } => {
                check_name(obj)?;
                if name.len() > limits::ATTR_NAME {
                    return Err(too_large("attribute name", name.len(), limits::ATTR_NAME));
                }
                if value.len() > limits::ATTR_VALUE {
                    return Err(too_large(
                        "attribute value",
                        value.len(),
                        limits::ATTR_VALUE,
                    ));
                }
                bytes += (6 + name.len() + value.len()) as u64;
            }
            Op::RmAttr { obj, name, .. } => {
                check_name(obj)?;
                if name.len() > limits::ATTR_NAME {
                    return Err(too_large("attribute name", name.len(), limits::ATTR_NAME));
                }
            }
            Op::KvSet { key, value, .. } => {
                if key.len() > limits::KV_KEY {
                    return Err(too_large("collection key", key.len(), limits::KV_KEY));
                }
                if value.len() > limits::KV_VALUE {
                    return Err(too_large("collection value", value.len(), limits::KV_VALUE));
                }
                bytes += (6 + key.len() + value.len()) as u64;
            }
            Op::KvRm { key: a, .. } | Op::KvRmRange { start: a, .. } => {
                if a.len() > limits::KV_KEY {
                    return Err(too_large("collection key", a.len(), limits::KV_KEY));
                }
                if let Op::KvRmRange { end, .. } = op {
                    if end.len() > limits::KV_KEY {
                        return Err(too_large("collection key", end.len(), limits::KV_KEY));
                    }
                }
            }
        }
    }
    Ok((blocks, bytes))
}

/// Whether resolving the op may read old edge blocks (read-modify-write).
fn may_rmw(op: &Op) -> bool {
    match op {
        Op::Write { offset, data, .. } => {
            !offset.is_multiple_of(B) || !(data.len() as u64).is_multiple_of(B)
        }
        // The end is clipped to the object's size, which may be unaligned.
        Op::Zero { .. } => true,
        Op::Truncate { size, .. } => !size.is_multiple_of(B),
        _ => false,
    }
}

/// Bytes of whole edge blocks an op may add by read-modify-write.
fn rmw_bytes(op: &Op) -> u64 {
    if may_rmw(op) {
        2 * B
    } else {
        0
    }
}

fn op_name_len(op: &Op) -> u64 {
    match op {
        Op::Touch { obj, .. }
        | Op::Remove { obj, .. }
        | Op::Write { obj, .. }
        | Op::Zero { obj, .. }
        | Op::Truncate { obj, .. }
        | Op::SetAttr { obj, .. }
        | Op::RmAttr { obj, .. } => obj.len() as u64,
        Op::KvRm { key, .. } => key.len() as u64,
        Op::KvRmRange { start, end, .. } => (start.len() + end.len()) as u64,
        _ => 0,
    }
}

fn has_block(idx: &Index, coll: CollId, obj: &[u8], block: u64) -> bool {
    idx.object(coll, obj)
        .is_some_and(|o| !o.extents_in(block, block + 1).is_empty())
}

/// Turns one op into effects against the current index (which already holds the effects
/// of the transaction's earlier ops).
fn resolve(
    sh: &Shared,
    edges: &mut EdgeBlocks,
    idx: &Index,
    op: &Op,
    placed: Option<&Placement>,
    out: &mut Vec<Effect>,
) {
    let name = |o: &[u8]| -> Name { Arc::from(o) };
    match op {
        Op::CreateCollection(c) => out.push(Effect::CreateColl(*c)),
        Op::RemoveCollection(c) => out.push(Effect::RemoveColl(*c)),
        Op::Touch { coll, obj } => out.push(Effect::Touch {
            coll: *coll,
            obj: name(obj),
        }),
        Op::Remove { coll, obj } => out.push(Effect::Remove {
            coll: *coll,
            obj: name(obj),
        }),
        Op::Write {
            coll,
            obj,
            offset,
            data,
        } => {
            let o = name(obj);
            if data.is_empty() {
                out.push(Effect::Touch {
                    coll: *coll,
                    obj: o,
                });
                return;
            }
            let end = offset + data.len() as u64;
            let (first, last) = (offset / B, end.div_ceil(B));
            if let Some(p) = placed {
                place_effects(*coll, &o, first, p, out);
            } else {
                out.push(Effect::SetBlocks {
                    coll: *coll,
                    obj: o.clone(),
                    first_block: first,
                    nblocks: (last - first) as u32,
                    data: Payload::Owned(whole_blocks(sh, edges, idx, *coll, obj, *offset, data)),
                });
            }
            let size = idx.object(*coll, obj).map_or(0, |x| x.size);
            if end > size || idx.object(*coll, obj).is_none() {
                out.push(Effect::SetSize {
                    coll: *coll,
                    obj: o,
                    size: end.max(size),
                });
            }
        }
        Op::Zero {
            coll,
            obj,
            offset,
            len,
        } => {
            let Some(cur) = idx.object(*coll, obj) else {
                return;
            };
            let end = (offset + len).min(cur.size);
            if *offset >= end {
                return;
            }
            zero_range(edges, idx, *coll, &name(obj), *offset, end, out);
        }
        Op::Truncate { coll, obj, size } => {
            let o = name(obj);
            let cur = idx.object(*coll, obj).map_or(0, |x| x.size);
            if *size < cur {
                zero_range(edges, idx, *coll, &o, *size, cur.div_ceil(B) * B, out);
            }
            out.push(Effect::SetSize {
                coll: *coll,
                obj: o,
                size: *size,
            });
        }
        Op::SetAttr {
            coll,
            obj,
            name: n,
            value,
        } => out.push(Effect::SetAttr {
            coll: *coll,
            obj: name(obj),
            name: n.clone(),
            value: value.clone(),
        }),
        Op::RmAttr { coll, obj, name: n } => out.push(Effect::RmAttr {
            coll: *coll,
            obj: name(obj),
            name: n.clone(),
        }),
        Op::KvSet { coll, key, value } => out.push(Effect::KvSet {
            coll: *coll,
            key: key.clone(),
            value: value.clone(),
        }),
        Op::KvRm { coll, key } => out.push(Effect::KvRm {
            coll: *coll,
            key: key.clone(),
        }),
        Op::KvRmRange { coll, start, end } => out.push(Effect::KvRmRange {
            coll: *coll,
            start: start.clone(),
            end: end.clone(),
        }),
    }
}

/// The whole blocks a write of `data` at `offset` covers: the data itself when it is
/// block-aligned, else merged with the old contents of its edge blocks.
fn whole_blocks(
    sh: &Shared,
    edges: &mut EdgeBlocks,
    idx: &Index,
    coll: CollId,
    obj: &[u8],
    offset: u64,
    data: &SharedBytes,
) -> SharedBytes {
    let end = offset + data.len() as u64;
    if offset.is_multiple_of(B) && end.is_multiple_of(B) {
        // Whole blocks: the data is the blocks, shared as it came (no copy).
        return data.clone();
    }
    let (first, last) = (offset / B, end.div_ceil(B));
    let mut buf = vec![0u8; ((last - first) * B) as usize];
    if !offset.is_multiple_of(B) {
        edges.old_block(idx, coll, obj, first, &mut buf[..BLOCK_SIZE]);
    }
    if !end.is_multiple_of(B) && (last - 1 != first || offset.is_multiple_of(B)) {
        let tail = buf.len() - BLOCK_SIZE;
        edges.old_block(idx, coll, obj, last - 1, &mut buf[tail..]);
    }
    let at = (offset - first * B) as usize;
    buf[at..at + data.len()].copy_from_slice(data);
    CopyCounters::add(&sh.copies.partial_block, buf.len());
    SharedBytes::new(buf)
}

/// One [`Effect::PlaceBlocks`] per run of a direct write that starts at object block `first`.
fn place_effects(coll: CollId, obj: &Name, first: u64, p: &Placement, out: &mut Vec<Effect>) {
    let mut blk = first;
    let mut at = 0usize;
    for &(run_off, run_n) in &p.runs {
        // A run spans at most a segment, which mkfs may make larger than one effect may carry.
        let mut done = 0u32;
        while done < run_n {
            let n = (run_n - done).min(effect::MAX_BLOCKS_PER_EFFECT);
            out.push(Effect::PlaceBlocks {
                coll,
                obj: obj.clone(),
                first_block: blk,
                nblocks: n,
                off: run_off + done as u64 * B,
                crcs: p.crcs[at..at + n as usize].into(),
            });
            blk += n as u64;
            at += n as usize;
            done += n;
        }
    }
}

/// Effects that make bytes `start..end` read as zeros: whole blocks become holes, partial
/// edge blocks that hold data are rewritten.
fn zero_range(
    edges: &mut EdgeBlocks,
    idx: &Index,
    coll: CollId,
    obj: &Name,
    start: u64,
    end: u64,
    out: &mut Vec<Effect>,
) {
    let (full_first, full_end) = (start.div_ceil(B), end / B);
    if full_first < full_end {
        out.push(Effect::PunchBlocks {
            coll,
            obj: obj.clone(),
            first_block: full_first,
            nblocks: full_end - full_first,
        });
    }
    let mut edge_blks = Vec::new();
    if !start.is_multiple_of(B) {
        edge_blks.push(start / B);
    }
    if !end.is_multiple_of(B) && (edge_blks.first() != Some(&(end / B))) {
        edge_blks.push(end / B);
    }
    for blk in edge_blks {
        if !has_block(idx, coll, obj, blk) {
            continue;
        }
        let mut b = vec![0u8; BLOCK_SIZE];
        edges.old_block(idx, coll, obj, blk, &mut b);
        let (bs, be) = (blk * B, blk * B + B);
        let (zs, ze) = (start.max(bs) - bs, end.min(be) - bs);
        b[zs as usize..ze as usize].fill(0);
        out.push(Effect::SetBlocks {
            coll,
            obj: obj.clone(),
            first_block: blk,
            nblocks: 1,
            data: Payload::Owned(SharedBytes::new(b)),
        });
    }
}

/// Applies space accounting and flusher work for applied effects.
pub(crate) fn account(st: &mut State, out: ApplyOut) {
    for p in out.placed {
        if let Some(s) = st.segs.seg_of(p.off) {
            st.segs.summaries[s as usize].push(crate::segments::Summary {
                coll: p.coll,
                obj: p.obj,
                first_block: p.first_block,
                nblocks: p.nblocks,
            });
        }
    }
    // New pending blocks first: a transaction may overwrite its own new data, and those
    // blocks are freed from what it added.
    if !out.dirty.is_empty() && st.dirty.is_empty() {
        st.dirty_since = Some(std::time::Instant::now());
    }
    for d in out.dirty {
        st.pending_blocks += d.nblocks as u64;
        st.dirty.push_back(d);
    }
    for f in out.freed {
        match f {
            Freed::Disk { off, nblocks } => st.segs.free_live(off, nblocks),
            Freed::Mem { nblocks } => {
                st.pending_blocks = st.pending_blocks.saturating_sub(nblocks as u64)
            }
        }
    }
}

/// Drops the read cache's copies of data blocks nothing points to any more.
fn forget_freed(sh: &Shared, freed: &[Freed]) {
    let Some(c) = &sh.data.cache else { return };
    c.forget(freed.iter().filter_map(|f| match f {
        Freed::Disk { off, nblocks } => Some((*off, *nblocks as u64 * B)),
        Freed::Mem { .. } => None,
    }));
}

fn wait<'a>(cv: &std::sync::Condvar, mut g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    g.cv_waiters += 1;
    let mut g = cv.wait_or_die(g);
    g.cv_waiters -= 1;
    g
}

/// [`wait`] for a condition variable of the WAL queue.
pub(crate) fn wait_wal<'a>(
    cv: &std::sync::Condvar,
    mut g: MutexGuard<'a, WalQueue>,
) -> MutexGuard<'a, WalQueue> {
    g.cv_waiters += 1;
    let mut g = cv.wait_or_die(g);
    g.cv_waiters -= 1;
    g
}

/// Wakes the maintenance thread if it sleeps.
pub(crate) fn wake_maint(sh: &Shared, st: &State) {
    if st.maint_idle {
        sh.maint_cv.notify_all();
    }
}

/// Wakes the flusher thread if it sleeps.
pub(crate) fn wake_flusher(sh: &Shared, st: &State) {
    if st.flusher_idle {
        sh.flush_cv.notify_all();
    }
}

/// Blocks data and checkpoints may fill: all segments but the reserve kept for the cleaner,
/// the flusher and the next checkpoints.
pub(crate) fn writable_blocks(sh: &Shared, st: &State) -> u64 {
    let seg = st.segs.seg_blocks as u64;
    let reserve = (sh.cfg.reserve_segments as u64 + sh.flusher_keep_segments(st)) * seg;
    st.segs.total_blocks().saturating_sub(reserve)
}

/// Blocks in use by data (flushed and pending) and checkpoints: what fills the writable space.
pub(crate) fn used_blocks(st: &State) -> u64 {
    st.segs.live_blocks() + st.pending_blocks + st.segs.ckpt_blocks_total()
}

/// Space left for new data blocks before the reserve.
pub(crate) fn available_blocks(sh: &Shared, st: &State) -> u64 {
    writable_blocks(sh, st).saturating_sub(used_blocks(st))
}

/// Blocks kept for small metadata writes ([`Transaction::use_reserve`]).
fn client_reserve_blocks(sh: &Shared, st: &State) -> u64 {
    (writable_blocks(sh, st) * crate::CLIENT_RESERVE_PERCENT / 100).max(16)
}

/// Blocks a write of its kind leaves free: ordinary data the whole reserve, metadata a quarter.
/// A replicated copy of an admitted write ([`Transaction::replicated`]) leaves half of that:
/// the other half is the room replicas have for what their primaries admitted while their
/// own store was fuller (until the primaries hear they are full).
pub(crate) fn headroom_blocks(sh: &Shared, st: &State, metadata: bool, replicated: bool) -> u64 {
    let reserve = client_reserve_blocks(sh, st);
    let kept = if metadata { reserve / 4 } else { reserve };
    if replicated {
        kept / 2
    } else {
        kept
    }
}

/// Space left for a write of its kind (see [`headroom_blocks`]).
pub(crate) fn room_blocks(sh: &Shared, st: &State, metadata: bool, replicated: bool) -> u64 {
    available_blocks(sh, st).saturating_sub(headroom_blocks(sh, st, metadata, replicated))
}

/// What ordinary writes may fill: [`writable_blocks`] less the metadata reserve.
pub(crate) fn client_writable_blocks(sh: &Shared, st: &State) -> u64 {
    writable_blocks(sh, st).saturating_sub(client_reserve_blocks(sh, st))
}

fn submit(sh: &Shared, txn: &Transaction) -> Result<u64> {
    // A store with no space left (`return`), for the tests of how its users class that.
    fail::fail_point!("store_commit_no_space", |_| Err(StoreError::NoSpace {
        needed: 1,
        available: 0
    }));
    let placed = direct::place(sh, txn)?;
    let r = submit_placed(sh, txn, &placed);
    if r.is_err() && !placed.is_empty() {
        direct::abandon(&mut sh.lock(), &placed);
    }
    r
}

fn submit_placed(sh: &Shared, txn: &Transaction, placed: &Placements) -> Result<u64> {
    // What the transaction needs depends on its ops only: the room is reserved before its
    // collections are locked, so that a commit holds them to apply only.
    let (new_blocks, est) = sizes(txn, placed).map_err(|e| first_error(sh, txn, placed, e))?;
    let placed_blocks: u64 = placed.iter().flatten().map(|p| p.crcs.len() as u64).sum();
    let mut edges = EdgeBlocks::default();
    loop {
        let reserved = reserve(sh, txn, new_blocks, est, placed_blocks)
            .map_err(|e| first_error(sh, txn, placed, e))?;
        let applied = sh.colls.with_txn(txn, |idx| {
            // Validation is repeated after every wait: other transactions may have changed
            // what this one depends on (a removed collection).
            if let Err(e) = validate(idx, txn, placed) {
                reserved.release(sh);
                return Err(e);
            }
            apply_and_log(sh, idx, txn, placed, reserved, &mut edges)
        })?;
        match applied {
            Some(seq) => return Ok(seq),
            // Old blocks to read first, with no lock; then everything is looked at again.
            None => edges.read_missing(sh),
        }
    }
}

/// The error a refused transaction reports: that of its first op that fails, whether its
/// collection exists included (as [`validate`] against the index finds it), else `e` (no room,
/// a failed store).
fn first_error(sh: &Shared, txn: &Transaction, placed: &Placements, e: StoreError) -> StoreError {
    sh.colls
        .with_txn(txn, |idx| validate(idx, txn, placed))
        .err()
        .unwrap_or(e)
}

/// Waits until the WAL, the pending data and the queued direct writes have room for a
/// transaction of `est` record bytes, `new_blocks` pending blocks and `placed_blocks` blocks
/// written directly, and reserves it (before `st` is released, so that the room seen stays
/// the transaction's until its record is queued). Holds no collection.
fn reserve(
    sh: &Shared,
    txn: &Transaction,
    new_blocks: u64,
    est: u64,
    placed_blocks: u64,
) -> Result<Reserved> {
    let mut st = sh.lock();
    loop {
        check_limits(sh, &st, new_blocks, est, txn)?;
        let full = room_for(sh, &st, est, new_blocks, placed_blocks);
        if !full.any() {
            st.pending_blocks += new_blocks;
            sh.wal_lock().reserved_bytes += est;
            return Ok(Reserved {
                blocks: new_blocks,
                bytes: est,
            });
        }
        if let Some(f) = &st.failed {
            return Err(StoreError::Failed(f.clone()));
        }
        if full.direct && !full.wal && !full.pending {
            // Only a batch write drains them: write it here, or wait for the one being
            // written (its writer wakes the first record it writes). Either without `st`: a
            // batch of direct writes takes it to finish them.
            let busy = {
                let wq = sh.wal_lock();
                wq.writing || !wq.queue.is_empty()
            };
            if !busy {
                st = wait(&sh.space_cv, st);
                continue;
            }
            drop(st);
            let wq = sh.wal_lock();
            if !wq.writing && !wq.queue.is_empty() {
                drop(write_batch(sh, wq));
            } else if wq.writing && wq.failed.is_none() {
                let cv = sh.seq_cv(wq.written_seq + 1);
                drop(wait_wal(cv, wq));
            }
            st = sh.lock();
            continue;
        }
        // A full WAL needs a checkpoint; too much pending data only needs the flusher.
        if full.wal {
            st.ckpt_wanted = true;
            st.waits_for_wal_space += 1;
        } else if full.pending {
            st.waits_for_flusher += 1;
        }
        wake_maint(sh, &st);
        wake_flusher(sh, &st);
        st = wait(&sh.space_cv, st);
    }
}

/// What a commit found full.
#[derive(Clone, Copy)]
struct Full {
    wal: bool,
    pending: bool,
    direct: bool,
}

impl Full {
    fn any(self) -> bool {
        self.wal || self.pending || self.direct
    }
}

/// Whether the WAL, the pending data or the queued direct writes are too full for a
/// transaction of `est` record bytes, `new_blocks` pending blocks and `placed_blocks`
/// blocks written directly.
fn room_for(sh: &Shared, st: &State, est: u64, new_blocks: u64, placed_blocks: u64) -> Full {
    let (wal, direct_queued) = {
        let wq = sh.wal_lock();
        // A wrap can cost up to one more batch, hence the factor two.
        let wal = wq.used() + 2 * (wq.queue_bytes + est + B) > sh.wal.ring_size;
        (wal, direct::queued_blocks(&wq))
    };
    Full {
        wal,
        // Too much data waits for the flusher.
        pending: st.pending_blocks + new_blocks > sh.pending_limit_blocks(),
        // Direct writes waiting for their batch hold their data in memory: bounded alike
        // (one always goes, however large).
        direct: placed_blocks > 0
            && direct_queued > 0
            && direct_queued + placed_blocks > sh.pending_limit_blocks(),
    }
}

/// Room a committer reserved for its transaction: pending data blocks (in
/// `State::pending_blocks`) and WAL bytes (in `WalQueue::reserved_bytes`).
#[derive(Clone, Copy)]
struct Reserved {
    blocks: u64,
    bytes: u64,
}

impl Reserved {
    /// Gives the room back (a transaction that failed or has to resolve again).
    fn release(self, sh: &Shared) {
        let mut st = sh.lock();
        st.pending_blocks = st.pending_blocks.saturating_sub(self.blocks);
        let mut wq = sh.wal_lock();
        wq.reserved_bytes = wq.reserved_bytes.saturating_sub(self.bytes);
        drop(wq);
        if st.cv_waiters > 0 {
            sh.space_cv.notify_all();
        }
    }
}

/// Size limits and free space for a validated transaction.
fn check_limits(
    sh: &Shared,
    st: &State,
    new_blocks: u64,
    est: u64,
    txn: &Transaction,
) -> Result<()> {
    if est > sh.max_record() {
        return Err(StoreError::TooLarge {
            what: "transaction",
            size: est,
            limit: sh.max_record(),
        });
    }
    if new_blocks > sh.pending_limit_blocks() {
        return Err(StoreError::TooLarge {
            what: "transaction data",
            size: new_blocks * B,
            limit: sh.pending_limit_blocks() * B,
        });
    }
    let avail = room_blocks(sh, st, txn.use_reserve, txn.replicated);
    if new_blocks > avail {
        return Err(StoreError::NoSpace {
            needed: new_blocks * B,
            available: avail * B,
        });
    }
    Ok(())
}

/// Resolves and applies a validated transaction to its collections (`idx`, taken out of
/// their slots and locked) and queues its record; returns its sequence number, or None
/// (nothing applied) if it needs old blocks from a data device that `edges` does not hold
/// yet. On error (an old block that cannot be read) nothing is applied. Either way the room
/// it reserved is given back or used.
fn apply_and_log(
    sh: &Shared,
    idx: &mut Index,
    txn: &Transaction,
    placed: &Placements,
    reserved: Reserved,
    edges: &mut EdgeBlocks,
) -> Result<Option<u64>> {
    // Only a transaction that may read a device while resolving can fail half-way; it gets a
    // copy-on-write snapshot to roll back to.
    let rollback = txn.ops.iter().any(may_rmw).then(|| idx.clone());
    let mut effects = Vec::with_capacity(txn.ops.len() + 1);
    let mut out = ApplyOut::default();
    let no_record: RecordBuf = Arc::new(Vec::new());
    let mut jobs = Vec::new();
    let mut orphans = Vec::new();
    for (i, op) in txn.ops.iter().enumerate() {
        let start = effects.len();
        let p = placed.get(i).and_then(Option::as_ref);
        resolve(sh, edges, idx, op, p, &mut effects);
        if edges.incomplete() {
            // Only ops that may read old blocks lack one, and they have a snapshot.
            if let Some(snap) = rollback {
                *idx = snap;
            }
            reserved.release(sh);
            return edges.take_error().map_or(Ok(None), Err);
        }
        for e in &effects[start..] {
            match (e, p) {
                (Effect::PlaceBlocks { .. }, Some(pl)) => {
                    match direct::apply_run(sh, idx, e, op, pl, &mut out) {
                        direct::Applied::Job(j) => jobs.push(j),
                        direct::Applied::Orphan(run) => orphans.push(run),
                        direct::Applied::NotARun => {}
                    }
                }
                _ => idx.apply(e, &no_record, &sh.next_id, &mut out),
            }
            // Half of a transaction's effects applied to the index, its collections locked.
            fail::fail_point!("store_index_apply");
        }
    }
    if txn.replica_copy {
        // A replica's copy is read only if this OSD becomes the PG's primary: in the read
        // cache it would push out what this OSD does serve (two thirds of what a size-3
        // pool writes to an OSD are such copies).
        out.dirty.iter_mut().for_each(|d| d.cache = false);
        jobs.iter_mut().for_each(|j| j.cache = false);
    }
    // The record without its data: a header and a few fields per effect, as a rule.
    let mut rec = wal::QueuedRecord {
        meta: Vec::with_capacity(256),
        payloads: Vec::new(),
    };
    // Numbered when queued; laid out, chained and sealed by the thread that writes the batch.
    wal::record_header(&mut rec.meta, wal::KIND_TXN, 0, 0);
    effect::encode_deferring(&effects, &mut rec.meta, &mut rec.payloads);
    debug_assert!(
        rec.len() as u64 <= reserved.bytes,
        "record {} over estimate {}",
        rec.len(),
        reserved.bytes
    );
    forget_freed(sh, &out.freed);
    // Accounted and queued while the collections are still locked: a later transaction of
    // theirs frees what this one added only after it was counted, and is numbered after it.
    let mut st = sh.lock();
    let st_ref = &mut *st;
    st_ref.commits += 1;
    for p in placed.iter().flatten() {
        st_ref.direct_writes += 1;
        st_ref.direct_bytes += p.data.len() as u64;
    }
    for j in &jobs {
        st_ref.direct_dest.insert(j.id, (j.buf_off, j.disk));
    }
    direct::release_orphans(st_ref, &orphans);
    st_ref.pending_blocks = st_ref.pending_blocks.saturating_sub(reserved.blocks);
    account(st_ref, out);
    let (seq, wal_used) = {
        let mut wq = sh.wal_lock();
        let seq = wq.next_seq;
        wq.next_seq += 1;
        wal::set_record_seq(&mut rec.meta, seq);
        wq.direct_jobs.extend(jobs);
        wq.reserved_bytes = wq.reserved_bytes.saturating_sub(reserved.bytes);
        wq.queue_bytes += rec.len() as u64;
        wq.queue.push(rec);
        (seq, wq.used())
    };
    wake_maint_if_needed(sh, st_ref, wal_used);
    Ok(Some(seq))
}

fn wake_maint_if_needed(sh: &Shared, st: &State, wal_used: u64) {
    let flush = st.pending_blocks * B >= sh.cfg.flush_batch_bytes;
    let ckpt = wal_used * 100 >= sh.wal.ring_size * sh.cfg.checkpoint_wal_percent as u64;
    if flush {
        wake_flusher(sh, st);
    }
    if ckpt {
        wake_maint(sh, st);
    }
}

/// Waits until record `seq` is durable, writing batches while no one else is. A committer
/// waits on its own record's condvar (the writer of its batch wakes it).
fn wait_durable(sh: &Shared, seq: u64) -> Result<u64> {
    wait_until_durable(sh, sh.wal_lock(), seq, move |_| seq)
}

/// Waits until `seq` is durable, writing queued batches itself when no one else writes, and
/// sleeping on the condvar of the sequence number `wake_on` names.
fn wait_until_durable<'a>(
    sh: &'a Shared,
    mut wq: MutexGuard<'a, WalQueue>,
    seq: u64,
    wake_on: impl Fn(&WalQueue) -> u64,
) -> Result<u64> {
    loop {
        if wq.durable_seq >= seq {
            return Ok(seq);
        }
        if let Some(f) = &wq.failed {
            return Err(StoreError::Failed(f.clone()));
        }
        if !wq.writing && !wq.queue.is_empty() {
            wq = write_batch(sh, wq);
            continue;
        }
        if !wq.writing && wq.written_seq >= seq {
            // Written without a flush (`Store::write_through`): flush it now.
            wq = crate::unflushed::flush_written(sh, wq);
            continue;
        }
        let cv = sh.seq_cv(wake_on(&wq));
        wq = wait_wal(cv, wq);
    }
}

/// Writes the queued records as one batch (all of them, or those before a checkpoint's cut)
/// and flushes the WAL device (the group commit).
/// Positions are reserved under `wq`; sealing, writing and flushing happen outside it.
pub(crate) fn write_batch<'a>(
    sh: &'a Shared,
    wq: MutexGuard<'a, WalQueue>,
) -> MutexGuard<'a, WalQueue> {
    write_batch_then(sh, wq, true)
}

/// [`write_batch`], with the flush of the WAL device left to later when `flush` is false
/// (records written, not durable against power loss: `Store::write_through`). A batch that
/// ends at a checkpoint's cut or carries large writes written once is always flushed.
pub(crate) fn write_batch_then<'a>(
    sh: &'a Shared,
    mut wq: MutexGuard<'a, WalQueue>,
    flush: bool,
) -> MutexGuard<'a, WalQueue> {
    let queued = wq.queue.len();
    let first_seq = wq.next_seq - queued as u64;
    // A checkpoint's cut ends this batch at the last record it snapshotted.
    let take = match wq.cut {
        Some(c) if c > first_seq && c - first_seq < queued as u64 => (c - first_seq) as usize,
        _ => queued,
    };
    let records: Vec<wal::QueuedRecord> = if take == queued {
        std::mem::take(&mut wq.queue)
    } else {
        wq.queue.drain(..take).collect()
    };
    let len: u64 = records.iter().map(|r| r.len() as u64).sum();
    wq.queue_bytes = wq.queue_bytes.saturating_sub(len);
    wq.writing = true;
    let (tail, prev_crc) = (wq.tail_lsn, wq.last_crc);
    let end = tail + wal::batch_footprint(&sh.wal, tail, len);
    let fits = end - wq.head_lsn <= sh.wal.ring_size;
    wq.tail_lsn = end;
    // The data of the batch's direct writes goes to its blocks and is made durable before the
    // records naming it are written (one flush for all of them; jobs of records after a cut
    // go early, which only writes their data sooner).
    let jobs = std::mem::take(&mut wq.direct_jobs);
    wq.writing_direct = !jobs.is_empty();
    let flush = flush || !jobs.is_empty() || wq.cut.is_some();
    let spare = wq.batch_spare.take();
    drop(wq);
    let layout = layout_batch(
        &sh.wal, tail, &records, first_seq, prev_crc, sh.wal_tag, spare,
    );
    debug_assert_eq!(layout.end_lsn, end);
    let payloads = records.iter().flat_map(|r| &r.payloads);
    CopyCounters::add(&sh.copies.wal_batch, payloads.map(|(_, p)| p.len()).sum());
    let result = if !fits {
        Err(StoreError::Failed(
            "WAL ring overflow (accounting bug)".into(),
        ))
    } else if !jobs.is_empty() {
        direct::write_jobs(sh, &jobs)
            .and_then(|()| sh.data.flush())
            .and_then(|()| {
                // A direct write's data durable on the data device, its record not written.
                fail::fail_point!("store_direct_data_written");
                write_layout(sh, &layout, flush)
            })
    } else {
        write_layout(sh, &layout, flush)
    };
    if let Err(e) = result {
        return wal_failed(sh, format!("WAL write failed: {e}"));
    }
    let mut wq = sh.wal_lock();
    wq.writing = false;
    wq.writing_direct = false;
    wq.last_crc = layout.last_crc;
    // Kept for the next batch unless an unusually large one grew it.
    wq.batch_spare = (layout.buf.capacity() <= BATCH_SPARE_MAX).then_some(layout.buf);
    let last_seq = first_seq + records.len() as u64 - 1;
    wq.written_seq = last_seq;
    if flush {
        // The flush also made every batch written before this one durable.
        wq.durable_seq = last_seq;
        wq.unflushed_since = None;
    } else if wq.unflushed_since.is_none() {
        wq.unflushed_since = Some(std::time::Instant::now());
        sh.maint_cv.notify_all(); // it flushes within `wal_flush_delay`
    }
    if wq.cut == Some(last_seq + 1) {
        wq.cut = None;
        wq.cut_point = Some((end, layout.last_crc));
    }
    wake_batch(sh, &wq, first_seq, last_seq);
    if wq.cut.is_some() || wq.cut_point.is_some() {
        sh.durable_cv.notify_all(); // a checkpoint waits for the records before its cut
    }
    if !jobs.is_empty() {
        // After the batch is counted durable and its committers woken: finishing takes the
        // jobs' collections (and the table before `wq`, in lock order), and a commit of
        // another collection in this batch must not wait for a busy one. Until finished, the
        // index serves the jobs' blocks from memory, and a checkpoint names them at their
        // place (`direct_dest`): their data is on the device before their records.
        drop(wq);
        direct::finish(sh, jobs);
        wq = sh.wal_lock();
    }
    wq
}

/// Wakes only the committers of a batch, and the first one queued meanwhile (it writes the
/// next batch): waking every waiter on every batch costs more than the batch itself. No one
/// to wake (a thread that submits and syncs alone) costs nothing.
fn wake_batch(sh: &Shared, wq: &WalQueue, first_seq: u64, last_seq: u64) {
    if wq.cv_waiters > 0 {
        for s in first_seq..=last_seq.min(first_seq + crate::store::SEQ_CVS as u64 - 1) {
            sh.seq_cv(s).notify_all();
        }
        if !wq.queue.is_empty() {
            sh.seq_cv(last_seq + 1).notify_all();
        }
    }
}

/// A batch or flush that failed, called with `wq` released and its `writing` still set: the
/// WAL stops first (`writing` stays set, so no later batch is written and none of its records
/// can be counted durable), then the store. Returns `wq` again.
pub(crate) fn wal_failed(sh: &Shared, msg: String) -> MutexGuard<'_, WalQueue> {
    sh.fail_wal(&mut sh.wal_lock(), msg.clone());
    sh.fail(&mut sh.lock(), msg);
    sh.wal_lock()
}

fn write_layout(sh: &Shared, layout: &wal::BatchLayout, flush: bool) -> Result<()> {
    let c = &sh.wal_counters;
    if let Some((w, lsn)) = &layout.wrap {
        sh.wal.write_at_lsn(w, *lsn)?;
        c.writes.fetch_add(1, Ordering::Relaxed);
    }
    sh.wal.write_at_lsn(&layout.buf, layout.lsn)?;
    c.writes.fetch_add(1, Ordering::Relaxed);
    c.write_bytes
        .fetch_add(layout.buf.len() as u64, Ordering::Relaxed);
    if flush {
        sh.wal.flush()?;
        c.flushes.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
