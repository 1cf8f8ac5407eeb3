//! Background work, on one thread: writing pending data to segments (the flusher), taking
//! checkpoints (which flush the data devices and reclaim WAL space) and cleaning segments.
//! Foreground commits never wait for it except when the WAL is full.

use crate::checkpoint::{self, Root};
use crate::device::{align_up, AlignedBuf, BLOCK_SIZE};
use crate::error::{Result, StoreError};
use crate::format::WalHeader;
use crate::index::{Dirty, Loc, LocMatch};
use crate::segments::{Head, Summary};
use crate::store::{Shared, State};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

const B: u64 = BLOCK_SIZE as u64;
/// Largest single segment write of pending data.
const MAX_FLUSH_BLOCKS: u64 = 1024;
/// Checkpoint bodies are written in pieces of at most this size.
const PIECE: usize = 1 << 20;

/// The maintenance loop; returns on shutdown or failure. A panic (a bug) stops writes
/// instead of leaving committers waiting for a thread that is gone.
pub(crate) fn run(sh: Arc<Shared>) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_loop(&sh)));
    if let Err(p) = r {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let mut st = sh.lock();
        sh.fail(&mut st, format!("maintenance thread panicked: {what}"));
    }
}

/// Rounds of making space that gain no free segment before the store gives up (a space
/// accounting bug would otherwise spin here while commits wait forever).
const MAX_FRUITLESS_ROUNDS: u32 = 256;

fn run_loop(sh: &Arc<Shared>) {
    let sh = sh.as_ref();
    let mut fruitless = 0;
    loop {
        let work = next_work(sh);
        let r = match work {
            Work::Stop { final_ckpt } => {
                if final_ckpt {
                    if let Err(e) = checkpoint(sh) {
                        let mut st = sh.lock();
                        sh.fail(&mut st, format!("final checkpoint failed: {e}"));
                    }
                }
                return;
            }
            Work::Flush => match flush_some(sh, false) {
                Err(StoreError::NoSpace { .. }) => {
                    let progress = |st: &State| (st.segs.free_segments(), st.pending_blocks);
                    let before = progress(&sh.lock());
                    let r = match make_space(sh) {
                        // Nothing to clean: all used space is live, so the cleaner's segment
                        // is not needed and the flusher may use it.
                        Ok(false) => flush_some(sh, true).map(|_| ()),
                        r => r.map(|_| ()),
                    };
                    let after = progress(&sh.lock());
                    let gained = after.0 > before.0 || after.1 < before.1;
                    fruitless = if gained { 0 } else { fruitless + 1 };
                    if fruitless > MAX_FRUITLESS_ROUNDS {
                        Err(StoreError::Failed(format!(
                            "{MAX_FRUITLESS_ROUNDS} rounds of making space neither freed a segment nor \
                             wrote pending data (space accounting bug)"
                        )))
                    } else {
                        r
                    }
                }
                r => {
                    fruitless = 0;
                    r.map(|_| ())
                }
            },
            Work::Checkpoint => checkpoint(sh),
            Work::Clean { throttle } => clean_one(sh, throttle),
        };
        if let Err(e) = r {
            let mut st = sh.lock();
            sh.fail(&mut st, format!("background work failed: {e}"));
            return;
        }
    }
}

enum Work {
    Stop { final_ckpt: bool },
    Flush,
    Checkpoint,
    Clean { throttle: bool },
}

fn next_work(sh: &Shared) -> Work {
    let cfg = &sh.cfg;
    let mut st = sh.lock();
    loop {
        if st.failed.is_some() {
            return Work::Stop { final_ckpt: false };
        }
        if st.shutdown {
            return Work::Stop {
                final_ckpt: st.ckpt_wanted,
            };
        }
        let wal_full =
            sh.wal_used(&st) * 100 >= sh.wal.ring_size * cfg.checkpoint_wal_percent as u64;
        let free = st.segs.free_segments() as u64;
        let keep = sh.flusher_keep_segments(&st);
        let low = free < keep + cfg.clean_below_free_segments as u64;
        let critical = free <= keep + 1;
        let can_clean = free >= keep;
        let aged = st
            .dirty_since
            .is_some_and(|t| t.elapsed() >= cfg.flush_max_delay);
        // A due checkpoint goes first: it writes all pending data itself, and under a steady
        // stream of writes the flusher always has work, which must not starve it.
        let wal_busy = st.tail_lsn != st.head_lsn || !st.queue.is_empty();
        let periodic = wal_busy && st.last_ckpt.elapsed() >= cfg.checkpoint_interval;
        if st.ckpt_wanted || wal_full || periodic || (low && st.segs.limbo_segments() > 0) {
            return Work::Checkpoint;
        }
        if !st.dirty.is_empty() && (st.pending_blocks * B >= cfg.flush_batch_bytes || aged) {
            return Work::Flush;
        }
        if low && can_clean && st.segs.clean_candidate().is_some() {
            return Work::Clean {
                throttle: !critical,
            };
        }
        // Idle with nothing pending: the flusher's staging buffer is not held meanwhile
        // (freed outside the lock, then everything is looked at again).
        if st.dirty.is_empty() {
            if let Some(buf) = FLUSH_BUF.with_borrow_mut(Option::take) {
                drop(st);
                drop(buf);
                st = sh.lock();
                continue;
            }
        }
        let tick = cfg.flush_max_delay.max(Duration::from_millis(5)) / 2;
        st.maint_idle = true;
        st = sh
            .maint_cv
            .wait_timeout(st, tick)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
        st.maint_idle = false;
    }
}

/// A run of pending blocks of one object to write.
struct Piece {
    coll: u64,
    obj: crate::effect::Name,
    first: u64,
    nblocks: u32,
    from: LocMatch,
    data: Arc<Vec<u8>>,
    data_off: usize,
}

/// Who allocates: the flusher leaves a few segments to the cleaner and checkpoints, so that
/// they can always make room.
#[derive(PartialEq, Eq, Clone, Copy)]
pub(crate) enum Use {
    Flush,
    /// A large write going straight to its place: it leaves what the flusher leaves.
    Direct,
    /// The flusher when nothing can be cleaned, and a checkpoint writing pending data: it
    /// leaves only what a checkpoint needs.
    FlushRelaxed,
    Clean,
    Ckpt,
}

/// Blocks the next checkpoint's index part is expected to need, from the last one's size.
pub(crate) fn ckpt_estimate(index_bytes: u64) -> u64 {
    let last = index_bytes.div_ceil(B);
    last + last / 4 + 4
}

pub(crate) fn alloc(sh: &Shared, st: &mut State, n: u32, user: Use) -> Result<Vec<(u64, u32)>> {
    let no_space = |st: &State| StoreError::NoSpace {
        needed: n as u64 * B,
        available: st.segs.free_segments() as u64 * st.segs.seg_blocks as u64 * B,
    };
    let keep = match user {
        Use::Flush | Use::Direct => sh.flusher_keep_segments(st),
        // Only the cleaner's segment may be used: the checkpoint's room (for its index part
        // and for pending data it may have to carry inline) stays.
        Use::FlushRelaxed => sh.flusher_keep_segments(st) - 1,
        Use::Clean | Use::Ckpt => 0,
    };
    let segs_needed = (n as u64).div_ceil(st.segs.seg_blocks as u64) + 1;
    if keep > 0 && (st.segs.free_segments() as u64) < segs_needed + keep {
        return Err(no_space(st));
    }
    let head = match user {
        Use::Ckpt => Head::Ckpt,
        Use::Direct => Head::Direct,
        _ => Head::Data,
    };
    let r = st.segs.alloc(n, head);
    if r.is_none() && keep > 0 {
        return Err(no_space(st));
    }
    r.ok_or_else(|| {
        let who = if user == Use::Ckpt { "checkpoint" } else { "cleaner" };
        StoreError::Failed(format!(
            "the {who} found no room for {n} blocks: {} free and {} limbo segments, {} blocks pending, \
             checkpoint estimate {} blocks (space accounting bug)",
            st.segs.free_segments(),
            st.segs.limbo_segments(),
            st.pending_blocks,
            st.ckpt_est_blocks
        ))
    })
}

/// Makes free segments when the flusher ran short: clean while there is room to copy into
/// (keeping what a checkpoint needs), then checkpoint to release what cleaning freed.
/// Returns false when there was nothing to clean or release.
fn make_space(sh: &Shared) -> Result<bool> {
    let mut cleaned = 0;
    loop {
        // Cleaning one victim takes at most one segment; what must stay is the room of the
        // checkpoint that follows (its index part and pending data carried inline), so a
        // cycle of cleaning + checkpoint always fits and frees the victims.
        let (free, need, candidate) = {
            let st = sh.lock();
            (
                st.segs.free_segments() as u64,
                sh.ckpt_need_segments(&st),
                st.segs.clean_candidate(),
            )
        };
        if candidate.is_none() || free <= need || cleaned >= 64 {
            break;
        }
        clean_one(sh, false)?;
        cleaned += 1;
    }
    let releasable = {
        let st = sh.lock();
        st.segs.limbo_segments() + st.segs.ckpt_only_segments()
    };
    if releasable > 0 || cleaned > 0 {
        checkpoint(sh)?;
        return Ok(true);
    }
    Ok(false)
}

thread_local! {
    /// The flusher's staging buffer, reused from one flush to the next.
    static FLUSH_BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
    /// The length of the last checkpoint body.
    static CKPT_BODY_LEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Writes up to one batch of pending data; returns the number of blocks written.
fn flush_some(sh: &Shared, relaxed: bool) -> Result<u64> {
    let (pieces, runs) = {
        let mut st = sh.lock();
        // Write only what fits above the segments the flusher keeps.
        let keep = sh.flusher_keep_segments(&st) - u64::from(relaxed);
        let seg = st.segs.seg_blocks as u64;
        let budget = (st.segs.free_segments() as u64).saturating_sub(keep + 1) * seg;
        if budget == 0 && !st.dirty.is_empty() {
            return Err(StoreError::NoSpace {
                needed: st.pending_blocks * B,
                available: 0,
            });
        }
        let pieces = take_pieces(&mut st, budget.min(MAX_FLUSH_BLOCKS));
        if pieces.is_empty() {
            return Ok(0);
        }
        let total: u64 = pieces.iter().map(|p| p.nblocks as u64).sum();
        let user = if relaxed {
            Use::FlushRelaxed
        } else {
            Use::Flush
        };
        let runs = match alloc(sh, &mut st, total as u32, user) {
            Ok(r) => r,
            Err(e) => {
                // Put the work back; the caller makes room and retries.
                let mut back: Vec<Dirty> = Vec::new();
                for p in &pieces {
                    if let LocMatch::Mem { id, .. } = p.from {
                        back.push(Dirty {
                            coll: p.coll,
                            obj: p.obj.clone(),
                            first_block: p.first,
                            nblocks: p.nblocks,
                            id,
                        });
                    }
                }
                for d in back.into_iter().rev() {
                    st.dirty.push_front(d);
                }
                return Err(e);
            }
        };
        (pieces, runs)
    };
    let total: u64 = pieces.iter().map(|p| p.nblocks as u64).sum();
    // Lay the pieces out contiguously over the runs, in a buffer kept from the last flush
    // (every byte of it is overwritten: the pieces cover `total` whole blocks).
    FLUSH_BUF.with_borrow_mut(|slot| {
        let buf = AlignedBuf::reuse(slot, (total * B) as usize);
        let mut at = 0;
        for p in &pieces {
            let n = p.nblocks as usize * BLOCK_SIZE;
            buf[at..at + n].copy_from_slice(&p.data[p.data_off..p.data_off + n]);
            at += n;
        }
        write_runs(sh, &buf[..at], &runs)
    })?;
    let mut st = sh.lock();
    let st = &mut *st;
    let mut pos = 0u64; // block position within the laid-out batch
    for p in &pieces {
        for (blk, n, disk) in split_over_runs(&runs, pos, p.first, p.nblocks) {
            let rel = (blk - p.first) as usize * BLOCK_SIZE;
            let from = match &p.from {
                LocMatch::Mem { id, off } => LocMatch::Mem {
                    id: *id,
                    off: off + rel,
                },
                LocMatch::Disk(d) => LocMatch::Disk(d + rel as u64),
            };
            let moved = repoint(st, p, blk, n, &from, disk);
            let count: u64 = moved.iter().map(|m| m.1 as u64).sum();
            st.pending_blocks = st.pending_blocks.saturating_sub(count);
        }
        pos += p.nblocks as u64;
    }
    // What is left is younger than what was written (roughly): restart its clock, or every
    // later round would count as overdue and flush a few blocks at a time.
    st.dirty_since = (!st.dirty.is_empty()).then(Instant::now);
    if st.cv_waiters > 0 {
        sh.space_cv.notify_all();
    }
    Ok(total)
}

/// Points the blocks `blk..blk + n` of a piece that still are at `from` to their new copy at
/// `disk`, frees the copies nothing points to, and records the run for the cleaner.
/// Returns the moved runs (blocks from `blk`, count).
fn repoint(
    st: &mut State,
    p: &Piece,
    blk: u64,
    n: u32,
    from: &LocMatch,
    disk: u64,
) -> Vec<(u64, u32)> {
    let moved = st
        .index
        .existing_object_mut(p.coll, &p.obj)
        .map_or_else(Vec::new, |o| o.relocate(blk, blk + n as u64, from, disk));
    free_unmoved(st, disk, n, &moved);
    if let Some(s) = st.segs.seg_of(disk) {
        st.segs.summaries[s as usize].push(Summary {
            coll: p.coll,
            obj: p.obj.clone(),
            first_block: blk,
            nblocks: n,
        });
    }
    moved
}

/// Frees the blocks of a written run that no longer back anything (overwritten meanwhile):
/// the complement of the `moved` runs within `n` blocks at `disk`.
pub(crate) fn free_unmoved(st: &mut State, disk: u64, n: u32, moved: &[(u64, u32)]) {
    let mut at = 0u64;
    for &(rel, k) in moved.iter().chain(std::iter::once(&(n as u64, 0))) {
        if rel > at {
            st.segs.free_live(disk + at * B, (rel - at) as u32);
        }
        at = rel + k as u64;
    }
}

/// Writes `buf` over the allocated runs, in order.
fn write_runs(sh: &Shared, buf: &[u8], runs: &[(u64, u32)]) -> Result<()> {
    let mut done = 0usize;
    for &(off, n) in runs {
        let len = n as usize * BLOCK_SIZE;
        sh.data.write_data(&buf[done..done + len], off)?;
        done += len;
    }
    Ok(())
}

/// Splits a piece that starts at block `pos` of the batch over the allocated runs:
/// (object block, blocks, disk offset) triples.
fn split_over_runs(runs: &[(u64, u32)], pos: u64, first: u64, n: u32) -> Vec<(u64, u32, u64)> {
    let mut out = Vec::new();
    let (mut run_start, mut left, mut cur, mut blk) = (0u64, n as u64, pos, first);
    for &(off, rn) in runs {
        let run_end = run_start + rn as u64;
        if left > 0 && cur < run_end && cur >= run_start {
            let take = left.min(run_end - cur);
            out.push((blk, take as u32, off + (cur - run_start) * B));
            left -= take;
            cur += take;
            blk += take;
        }
        run_start = run_end;
    }
    out
}

/// Takes dirty entries (up to one batch) and collects what of them is still pending.
/// Takes dirty entries worth at most `budget` blocks; an entry that does not fit is split
/// and its rest stays queued.
fn take_pieces(st: &mut State, budget: u64) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut blocks = 0u64;
    while blocks < budget {
        let Some(d) = st.dirty.pop_front() else { break };
        let mut found = Vec::new();
        collect_dirty(st, &d, &mut found);
        for mut p in found {
            let room = budget - blocks;
            if room == 0 || (p.nblocks as u64) > room {
                let take = room.min(p.nblocks as u64) as u32;
                let end = d.first_block + d.nblocks as u64;
                let rest_first = p.first + take as u64;
                st.dirty.push_front(Dirty {
                    coll: d.coll,
                    obj: d.obj.clone(),
                    first_block: rest_first,
                    nblocks: (end - rest_first) as u32,
                    id: d.id,
                });
                if take > 0 {
                    p.nblocks = take;
                    pieces.push(p);
                }
                return pieces;
            }
            blocks += p.nblocks as u64;
            pieces.push(p);
        }
    }
    pieces
}

fn collect_dirty(st: &State, d: &Dirty, out: &mut Vec<Piece>) -> u64 {
    let Some(o) = st.index.object(d.coll, &d.obj) else {
        return 0;
    };
    let mut n = 0;
    for (blk, e) in o.extents_in(d.first_block, d.first_block + d.nblocks as u64) {
        if let Loc::Mem(m) = &e.loc {
            if m.id == d.id {
                out.push(Piece {
                    coll: d.coll,
                    obj: d.obj.clone(),
                    first: blk,
                    nblocks: e.nblocks,
                    from: LocMatch::Mem {
                        id: m.id,
                        off: m.off,
                    },
                    data: m.buf.clone(),
                    data_off: m.off,
                });
                n += e.nblocks as u64;
            }
        }
    }
    n
}

/// Writes pending data for a checkpoint: what was pending when called (new writes keep
/// coming while commits go on; chasing them would starve the checkpoint). It may use the
/// cleaner's segment: written data needs the same room as the checkpoint would need to carry
/// it inline, and stays written.
fn flush_all(sh: &Shared) -> Result<()> {
    let mut left = sh.lock().pending_blocks;
    loop {
        match flush_some(sh, true) {
            Ok(0) if sh.lock().dirty.is_empty() => return Ok(()),
            Ok(n) => {
                left = left.saturating_sub(n);
                if left == 0 {
                    return Ok(());
                }
            }
            // The checkpoint carries what could not be written inline.
            Err(StoreError::NoSpace { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Takes a checkpoint (also used at open, before the thread starts): write pending data,
/// snapshot the index, wait until the records it holds end a durable WAL batch, write it to
/// segments, flush the data devices, then point the WAL header at it and reclaim WAL space.
/// Commits never wait for it: the snapshot is taken under the lock at any time, and the batch
/// writers end a batch at its records (the cut) so that replay can start right after them.
pub(crate) fn checkpoint(sh: &Shared) -> Result<()> {
    flush_all(sh)?;
    let (snap, seq, gen, dest) = {
        let mut st = sh.lock();
        st.ckpt_wanted = false;
        st.segs.snap_started += 1;
        let seq = st.next_seq;
        if !st.writing && st.queue.is_empty() {
            st.cut_point = Some((st.tail_lsn, st.last_crc));
        } else {
            st.cut = Some(seq);
        }
        (
            st.index.clone(),
            seq,
            st.segs.snap_started,
            st.direct_dest.clone(),
        )
    };
    let (lsn, prev_crc) = wait_for_cut(sh)?;
    // The direct writes the snapshot holds in memory are on the data devices by now (their
    // records are durable, and a batch writes and flushes their data first): named there.
    // Sized like the last body, so it is not grown (and copied) step by step; not kept
    // between checkpoints (it is about as large as the index's extents).
    let mut body = Vec::with_capacity(CKPT_BODY_LEN.get() + CKPT_BODY_LEN.get() / 8);
    let inline_bytes = checkpoint::encode(&snap, seq, &dest, &mut body);
    drop(snap);
    CKPT_BODY_LEN.set(body.len());
    let (root, runs) = write_body(sh, &body, gen)?;
    let body_len = body.len();
    drop(body);
    let root_bytes = root.encode();
    let root_len = root_bytes.len();
    let root_runs = {
        let mut st = sh.lock();
        let blocks = (align_up(root_bytes.len() as u64) / B) as u32;
        // The root is read back in one piece: keep it within one segment.
        if st.segs.ckpt_head_room() < blocks {
            st.segs.close(Head::Ckpt);
        }
        alloc(sh, &mut st, blocks, Use::Ckpt)?
    };
    let root_off = contiguous(&root_runs)?;
    sh.data
        .write(&AlignedBuf::from_slice(&root_bytes), root_off)?;
    sh.data.flush()?;
    let header_gen = sh.lock().header_gen + 1;
    let hdr = WalHeader {
        store_id: sh.store_id,
        generation: header_gen,
        replay_seq: seq,
        replay_lsn: lsn,
        replay_prev_crc: prev_crc,
        ckpt_root_offset: root_off,
        ckpt_root_len: root_bytes.len() as u32,
        ckpt_root_crc: crc32c::crc32c(&root_bytes),
    };
    sh.wal.write_header(&hdr)?;
    let mut st = sh.lock();
    st.header_gen = header_gen;
    st.head_lsn = lsn;
    st.segs.close(Head::Ckpt);
    let old = std::mem::replace(
        &mut st.ckpt_runs,
        runs.into_iter().chain(root_runs).collect(),
    );
    for (off, n) in old {
        st.segs.ckpt_blocks(off, n, false);
    }
    st.ckpt_est_blocks = ckpt_estimate((body_len - inline_bytes) as u64 + root_len as u64);
    st.segs.snap_durable = gen;
    st.segs.release_limbo();
    st.last_ckpt = Instant::now();
    st.checkpoints += 1;
    sh.space_cv.notify_all();
    Ok(())
}

/// Waits until the records before the checkpoint's cut are durable and end a batch; returns
/// where replay resumes: (LSN, crc of the last record before it). Writes the queued batch
/// itself when no one else is writing (records submitted without a waiter).
fn wait_for_cut(sh: &Shared) -> Result<(u64, u32)> {
    let mut st = sh.lock();
    loop {
        if st.failed.is_some() {
            st.cut = None;
            return Err(StoreError::Failed("WAL failed during checkpoint".into()));
        }
        if let Some(p) = st.cut_point.take() {
            return Ok(p);
        }
        if !st.writing && !st.queue.is_empty() {
            st = crate::commit::write_batch(sh, st);
            continue;
        }
        st = sh.durable_cv.wait(st).unwrap_or_else(|p| p.into_inner());
    }
}

fn contiguous(runs: &[(u64, u32)]) -> Result<u64> {
    match runs {
        [(off, _)] => Ok(*off),
        [(a, an), (b, _), ..] if *b == a + *an as u64 * B => Ok(*a),
        _ => Err(StoreError::Failed(
            "checkpoint root does not fit in one segment run".into(),
        )),
    }
}

/// Writes the checkpoint body in pieces; returns the root and the runs it occupies.
fn write_body(sh: &Shared, body: &[u8], gen: u64) -> Result<(Root, Vec<(u64, u32)>)> {
    let total_blocks = align_up(body.len() as u64) / B;
    let runs = {
        let mut st = sh.lock();
        alloc(sh, &mut st, total_blocks as u32, Use::Ckpt)?
    };
    let mut pieces = Vec::new();
    let mut at = 0usize;
    // One buffer for every piece (a fresh zeroed 1 MiB allocation per piece costs page
    // faults and page clearing every time); freed with the checkpoint.
    let mut staging = None;
    for &(off, n) in &runs {
        let run_bytes = n as usize * BLOCK_SIZE;
        let mut r_at = 0usize;
        while r_at < run_bytes && at < body.len() {
            let len = (run_bytes - r_at).min(PIECE).min(body.len() - at);
            let chunk = &body[at..at + len];
            let doff = off + r_at as u64;
            let buf = AlignedBuf::reuse(&mut staging, len);
            buf[..len].copy_from_slice(chunk);
            // The padding to a whole block must not carry an older piece's bytes.
            buf[len..].fill(0);
            sh.data.write(buf, doff)?;
            pieces.push((doff, len as u32, crc32c::crc32c(chunk)));
            at += len;
            r_at += align_up(len as u64) as usize;
        }
    }
    let root = Root {
        generation: gen,
        total_len: body.len() as u64,
        pieces,
    };
    Ok((root, runs))
}

/// Moves the live blocks of the emptiest segment to the head so it can be reused.
fn clean_one(sh: &Shared, throttle: bool) -> Result<()> {
    let started = Instant::now();
    let (victim, pieces, runs) = {
        let mut st = sh.lock();
        let Some(victim) = st.segs.clean_candidate() else {
            return Ok(());
        };
        let pieces = live_pieces(&st, victim);
        let total: u32 = pieces.iter().map(|p| p.nblocks).sum();
        let runs = if total > 0 {
            alloc(sh, &mut st, total, Use::Clean)?
        } else {
            Vec::new()
        };
        (victim, pieces, runs)
    };
    let total: u64 = pieces.iter().map(|p| p.nblocks as u64).sum();
    let mut buf = AlignedBuf::zeroed((total * B) as usize);
    let mut at = 0;
    for p in &pieces {
        let LocMatch::Disk(off) = p.from else {
            continue;
        };
        let n = p.nblocks as usize * BLOCK_SIZE;
        // Raw copy: a corrupt block stays detectably corrupt under its old crc.
        let dev = sh.data.pick_reader();
        sh.data.read_from(dev, &mut buf[at..at + n], off)?;
        at += n;
    }
    write_runs(sh, &buf, &runs)?;
    let mut guard = sh.lock();
    let st = &mut *guard;
    let mut pos = 0u64;
    for p in &pieces {
        for (blk, n, disk) in split_over_runs(&runs, pos, p.first, p.nblocks) {
            let LocMatch::Disk(src) = p.from else {
                continue;
            };
            let from = LocMatch::Disk(src + (blk - p.first) * B);
            let moved = repoint(st, p, blk, n, &from, disk);
            let old = src + (blk - p.first) * B;
            for &(rel, k) in &moved {
                st.segs.free_live(old + rel * B, k);
            }
        }
        pos += p.nblocks as u64;
    }
    st.cleaned_segments += 1;
    st.cleaned_bytes += total * B;
    if st.segs.live_in(victim) != 0 {
        return Err(StoreError::Failed(format!(
            "segment {victim} still holds {} live blocks after cleaning (accounting bug)",
            st.segs.live_in(victim)
        )));
    }
    drop(guard);
    if throttle && sh.cfg.clean_rate > 0 {
        let budget = Duration::from_secs_f64((total * B) as f64 / sh.cfg.clean_rate as f64);
        if let Some(rest) = budget.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(())
}

fn push_run(out: &mut Vec<Piece>, sum: &Summary, run: Option<(u64, u64, u32)>) {
    if let Some((first, disk, nblocks)) = run {
        out.push(Piece {
            coll: sum.coll,
            obj: sum.obj.clone(),
            first,
            nblocks,
            from: LocMatch::Disk(disk),
            data: Arc::new(Vec::new()),
            data_off: 0,
        });
    }
}

/// The still-live extents of segment `s`, found through its summaries.
fn live_pieces(st: &MutexGuard<'_, State>, s: u32) -> Vec<Piece> {
    let seg_start = st.segs.seg_offset(s);
    let seg_end = seg_start + st.segs.seg_blocks as u64 * B;
    let mut out: Vec<Piece> = Vec::new();
    // Summaries of one segment may overlap (a range rewritten into the same segment), so
    // blocks are taken once each, as runs of blocks not seen before.
    let mut seen = std::collections::HashSet::new();
    for sum in &st.segs.summaries[s as usize] {
        let Some(o) = st.index.object(sum.coll, &sum.obj) else {
            continue;
        };
        for (blk, e) in o.extents_in(sum.first_block, sum.first_block + sum.nblocks as u64) {
            let Loc::Disk(d) = e.loc else { continue };
            if d < seg_start || d >= seg_end {
                continue;
            }
            let mut run: Option<(u64, u64, u32)> = None; // (object block, disk offset, blocks)
            for k in 0..e.nblocks as u64 {
                let fresh = seen.insert(d + k * B);
                match (&mut run, fresh) {
                    (Some(r), true) => r.2 += 1,
                    (None, true) => run = Some((blk + k, d + k * B, 1)),
                    (Some(_), false) => push_run(&mut out, sum, run.take()),
                    (None, false) => {}
                }
            }
            push_run(&mut out, sum, run);
        }
    }
    out
}
