//! The flusher: writes pending data (held in memory since its commit) to the data devices in
//! large sequential segment writes, and points the index at where it went.

use super::*;
use crate::copies::CopyCounters;

thread_local! {
    /// The flusher's staging buffer, reused from one flush to the next.
    pub(super) static FLUSH_BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// The flusher thread: writes pending data once a batch of it is pending or the oldest has
/// waited `flush_max_delay`. Short of segments, it hands over to the maintenance thread
/// (`Work::MakeSpace`) and waits until that has made space.
pub(crate) fn run_flusher(sh: Arc<Shared>) {
    guarded(&sh, "flusher", flusher_loop);
}

fn flusher_loop(sh: &Arc<Shared>) {
    let sh = sh.as_ref();
    let batch = sh.cfg.flush_batch_bytes;
    let tick = sh.cfg.flush_max_delay.max(Duration::from_millis(5)) / 2;
    let mut st = sh.lock();
    loop {
        if st.failed.is_some() || st.shutdown {
            return;
        }
        let aged = st
            .dirty_since
            .is_some_and(|t| t.elapsed() >= sh.cfg.flush_max_delay);
        let due = !st.dirty.is_empty() && (st.pending_blocks * B >= batch || aged);
        if due && !st.flusher_short {
            drop(st);
            let r = flush_some(sh, false);
            st = sh.lock();
            match r {
                Ok(_) => st.flush_rounds += 1,
                Err(StoreError::NoSpace { .. }) => {
                    st.flusher_short = true;
                    crate::commit::wake_maint(sh, &st);
                }
                Err(e) => {
                    sh.fail(&mut st, format!("background flush failed: {e}"));
                    return;
                }
            }
            continue;
        }
        // Idle with nothing pending: the staging buffer is not held meanwhile.
        if st.dirty.is_empty() {
            let freed;
            (st, freed) = drop_staging(sh, st);
            if freed {
                continue;
            }
        }
        st = sleep_idle(&sh.flush_cv, st, tick, |st| &mut st.flusher_idle);
    }
}

/// Writes up to one batch of pending data; returns the number of blocks written. Called by
/// the flusher thread and, for checkpoints and when making space, by the maintenance thread:
/// each takes its own pieces off the pending queue under the lock.
pub(super) fn flush_some(sh: &Shared, relaxed: bool) -> Result<u64> {
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
            Ok(r) => {
                // Allocated but not yet in the index: the cleaner must not pick their
                // segments meanwhile (it runs on the other thread).
                st.segs.in_flight(&r, true);
                r
            }
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
                            cache: p.cache,
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
        CopyCounters::add(&sh.copies.flush_staged, at);
        write_runs(sh, &buf[..at], &runs)?;
        // Data just written is read from memory once it leaves the pending set; a replica's
        // copies are not kept (`Dirty::cache`).
        cache_written(sh, &buf[..at], &pieces, &runs, |p, _| p.cache);
        Ok::<(), StoreError>(())
    })?;
    let mut st = sh.lock();
    let st = &mut *st;
    st.segs.in_flight(&runs, false);
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
            let moved = repoint(sh, st, p, blk, n, &from, disk);
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
                    cache: d.cache,
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
                    cache: d.cache,
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
pub(super) fn flush_all(sh: &Shared) -> Result<()> {
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
