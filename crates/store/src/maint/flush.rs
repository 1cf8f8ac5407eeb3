//! The flusher: writes pending data (held in memory since its commit) to the data devices in
//! large sequential segment writes, and points the index at where it went.

use super::*;
use crate::copies::CopyCounters;
#[cfg(test)]
use cairn_failstop::LockOrDie;

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
        // A batch, or all a commit may leave pending (on a small data device the limit is
        // below a batch: commits would wait for the flusher until the oldest data aged).
        let full = st.pending_blocks >= sh.pending_limit_blocks();
        let due = !st.dirty.is_empty() && (st.pending_blocks * B >= batch || full || aged);
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
        let budget = budget.min(MAX_FLUSH_BLOCKS);
        let mut pieces = Vec::new();
        let mut taken = 0u64;
        loop {
            let (dirty, n) = take_dirty(&mut st, budget - taken, PIECES_PER_HOLD);
            taken += n;
            // What is still pending of them is looked up in their collections, with `st`
            // released (collections come first in lock order). Commits go on meanwhile;
            // what they overwrite of the pieces taken is found stale when the pieces are
            // pointed at their new place, as for commits made while they are written.
            drop(st);
            collect_pieces(sh, &dirty, &mut pieces);
            between_holds(sh, "take");
            st = sh.lock();
            if taken >= budget || st.dirty.is_empty() {
                break;
            }
        }
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
        // A flush batch written to its segment, the index still pointing at the pending
        // copies.
        fail::fail_point!("store_flusher_written");
        // Data just written is read from memory once it leaves the pending set; a replica's
        // copies are not kept (`Dirty::cache`).
        cache_written(sh, &buf[..at], &pieces, &runs, |p, _| p.cache);
        Ok::<(), StoreError>(())
    })?;
    let mut pos = 0u64; // block position within the laid-out batch
    for chunk in pieces.chunks(PIECES_PER_HOLD) {
        // Each chunk is pointed at its new place and accounted under one hold of the
        // collections' table, so that a checkpoint's snapshot sees it either before it
        // moved or after it was accounted.
        let moves = moves_over_runs(chunk, &runs, &mut pos);
        let table = sh.colls.read();
        let moved = relocate_all(sh, &table, &moves);
        let mut st = sh.lock();
        for (m, moved) in moves.iter().zip(moved) {
            account_moved(sh, &mut st, m, &moved);
            let count: u64 = moved.iter().map(|m| m.1 as u64).sum();
            st.pending_blocks = st.pending_blocks.saturating_sub(count);
        }
        if st.cv_waiters > 0 {
            sh.space_cv.notify_all();
        }
        drop(st);
        drop(table);
        between_holds(sh, "repoint");
    }
    let mut guard = sh.lock();
    let st = &mut *guard;
    // Only now may the cleaner pick these segments: until every piece is in the index, its
    // blocks are counted live with no summary naming them.
    st.segs.in_flight(&runs, false);
    // What is left is younger than what was written (roughly): restart its clock, or every
    // later round would count as overdue and flush a few blocks at a time.
    st.dirty_since = (!st.dirty.is_empty()).then(Instant::now);
    if st.cv_waiters > 0 {
        sh.space_cv.notify_all();
    }
    Ok(total)
}

/// A test's look at the flusher with the store's lock released in the middle of a batch.
#[cfg(test)]
#[allow(clippy::type_complexity)]
static BETWEEN_HOLDS: std::sync::Mutex<Option<([u8; 16], Arc<dyn Fn(&str) + Send + Sync>)>> =
    std::sync::Mutex::new(None);

fn between_holds(_sh: &Shared, _phase: &str) {
    #[cfg(test)]
    {
        let hook = BETWEEN_HOLDS
            .lock_or_die()
            .as_ref()
            .filter(|(id, _)| *id == _sh.store_id)
            .map(|(_, f)| f.clone());
        if let Some(f) = hook {
            f(_phase);
        }
    }
}

/// Takes at most `entries` dirty entries worth at most `budget` blocks off the queue; an
/// entry that does not fit is split and its rest stays queued. Returns them and their blocks.
fn take_dirty(st: &mut State, budget: u64, entries: usize) -> (Vec<Dirty>, u64) {
    let mut out = Vec::new();
    let mut blocks = 0u64;
    while out.len() < entries && blocks < budget {
        let Some(mut d) = st.dirty.pop_front() else {
            break;
        };
        let room = budget - blocks;
        if d.nblocks as u64 > room {
            let take = room as u32;
            st.dirty.push_front(Dirty {
                first_block: d.first_block + take as u64,
                nblocks: d.nblocks - take,
                obj: d.obj.clone(),
                ..d
            });
            d.nblocks = take;
        }
        blocks += d.nblocks as u64;
        out.push(d);
    }
    (out, blocks)
}

/// The pieces of `dirty` entries still pending (not overwritten since), looked up in their
/// collections.
fn collect_pieces(sh: &Shared, dirty: &[Dirty], pieces: &mut Vec<Piece>) {
    let table = sh.colls.read();
    for_each_by_collection(
        dirty,
        |d| d.coll,
        |coll, group| {
            let Some(slot) = table.get(&coll) else { return };
            let g = sh.colls.lock_background(slot);
            let Some(c) = g.as_ref() else { return };
            for &k in group {
                collect_one(&dirty[k], c, pieces);
            }
        },
    );
}

/// Appends the pieces of one dirty entry that are still pending to `pieces`.
fn collect_one(d: &Dirty, c: &crate::index::Collection, pieces: &mut Vec<Piece>) {
    let Some(o) = c.objects.get(&d.obj[..]) else {
        return;
    };
    for (blk, e) in o.extents_in(d.first_block, d.first_block + d.nblocks as u64) {
        let Loc::Mem(m) = &e.loc else { continue };
        if m.id == d.id {
            pieces.push(Piece {
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
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{BlockDevice, MemDevice};
    use crate::{Devices, Store, StoreConfig, Transaction};
    use std::sync::mpsc;

    const PIECES: u64 = 1024;

    fn block(i: u64, version: u8) -> Vec<u8> {
        let mut b = vec![version; BLOCK_SIZE];
        b[..8].copy_from_slice(&i.to_le_bytes());
        b
    }

    /// A data device of `size` bytes and a WAL device, in memory.
    fn mem_devices(size: u64) -> Devices {
        let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("data0", size));
        let wal: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("wal", 32 << 20));
        Devices {
            data: vec![data],
            wal: Some(wal),
        }
    }

    fn check(s: &Store, newer: &[u64]) {
        for i in 0..PIECES {
            let v = if newer.contains(&i) { 2 } else { 1 };
            let got = s.read(1, b"o", i * 2 * B, B).unwrap_or_default();
            assert!(got == block(i, v), "block {i}: want version {v}");
        }
    }

    /// A batch of 1,024 pieces is taken and pointed at its new place in holds of the store's
    /// lock of 64 pieces: between two, commits go on (here while the flusher is held there),
    /// and a piece they overwrite before it is pointed at its new place is not brought back.
    #[test]
    fn commits_go_on_between_the_flushers_holds_and_overwrites_win() {
        let devs = mem_devices(256 << 20);
        let cfg = StoreConfig {
            wal_size: 16 << 20,
            flush_batch_bytes: PIECES * B,
            pending_limit_bytes: 16 << 20,
            flush_max_delay: Duration::from_secs(3600),
            checkpoint_interval: Duration::from_secs(3600),
            ..StoreConfig::default()
        };
        let id = Store::mkfs(&devs, &cfg).expect("mkfs");
        let s = Store::open(&devs, cfg.clone()).expect("open");
        let (at_hold, held) = mpsc::channel::<()>();
        let (go, wait_go) = mpsc::channel::<()>();
        let wait_go = std::sync::Mutex::new(wait_go);
        let released = std::sync::Mutex::new(Some(at_hold));
        let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let t = timed_out.clone();
        let hook: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(move |phase: &str| {
            // The first hold of the repoint phase: 64 pieces are in place, 960 are not.
            let first = (phase == "repoint")
                .then(|| released.lock().ok().and_then(|mut g| g.take()))
                .flatten();
            if let Some(tx) = first {
                let _ = tx.send(());
                let rx = wait_go.lock_or_die();
                if rx.recv_timeout(Duration::from_secs(20)).is_err() {
                    t.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        *BETWEEN_HOLDS.lock_or_die() = Some((id, hook));
        let mut t = Transaction::new();
        t.create_collection(1);
        s.commit(&t).expect("create");
        // Every other block: 1,024 writes that stay 1,024 pieces; the last one makes the
        // flusher due.
        for i in 0..PIECES {
            let mut t = Transaction::new();
            t.write(1, b"o", i * 2 * B, &block(i, 1));
            s.commit(&t).expect("write");
        }
        held.recv_timeout(Duration::from_secs(20))
            .expect("the flusher never released the lock in the middle of the batch");
        // The flusher waits between two holds: these commits need the lock, and overwrite a
        // piece in place (0) and one not yet pointed at its new place (1023).
        let newer = [0, 1023];
        for &i in &newer {
            let mut t = Transaction::new();
            t.write(1, b"o", i * 2 * B, &block(i, 2));
            s.commit(&t).expect("overwrite");
        }
        check(&s, &newer);
        go.send(()).expect("flusher hook gone");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while s.stats().pending_bytes > 2 * B && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        *BETWEEN_HOLDS.lock_or_die() = None;
        assert!(!timed_out.load(std::sync::atomic::Ordering::SeqCst));
        assert!(
            s.stats().pending_bytes <= 2 * B,
            "the batch was not written"
        );
        check(&s, &newer);
        drop(s); // no clean shutdown: the WAL is replayed over what the flusher wrote
        let s = Store::open(&devs, cfg.clone()).expect("reopen");
        check(&s, &newer);
        s.checkpoint().expect("checkpoint");
        s.close().expect("close");
        let s = Store::open(&devs, cfg).expect("reopen after checkpoint");
        check(&s, &newer);
        assert!(s.scrub().issues.is_empty());
    }

    /// On a data device so small that the pending limit (a sixteenth of it) is below a flush
    /// batch, commits that reach the limit are not left waiting until the oldest data ages.
    #[test]
    fn the_flusher_starts_at_the_pending_limit_below_a_batch() {
        let devs = mem_devices(16 << 20);
        let cfg = StoreConfig {
            wal_size: 16 << 20,
            segment_size: 256 << 10,
            flush_batch_bytes: 4 << 20,
            flush_max_delay: Duration::from_secs(3600),
            checkpoint_interval: Duration::from_secs(3600),
            ..StoreConfig::default()
        };
        Store::mkfs(&devs, &cfg).expect("mkfs");
        let s = Arc::new(Store::open(&devs, cfg).expect("open"));
        let limit = s.stats().pending_limit_bytes;
        assert!(limit < 4 << 20, "the limit {limit} is not below a batch");
        let (done, finished) = mpsc::channel();
        let writer = s.clone();
        std::thread::spawn(move || {
            let mut t = Transaction::new();
            t.create_collection(1);
            let mut r = writer.commit(&t).map(|_| ());
            // Twice the limit: the second half waits for the flusher.
            for i in 0..2 * limit / B {
                if r.is_err() {
                    break;
                }
                let mut t = Transaction::new();
                t.write(1, b"o", i * B, &block(i, 1));
                r = writer.commit(&t).map(|_| ());
            }
            let _ = done.send(r);
        });
        let r = finished
            .recv_timeout(Duration::from_secs(60))
            .expect("commits waited for a flusher that was not due");
        assert!(r.is_ok(), "{r:?}");
        assert!(
            s.stats().waits_for_flusher > 0,
            "no commit reached the limit"
        );
    }
}
