//! Background work, on two threads: the flusher writes pending data to segments
//! (`flush.rs`); the maintenance thread takes checkpoints, which flush the data devices and
//! reclaim WAL space (`ckpt.rs`), cleans segments (`clean.rs`) and makes space when the
//! flusher runs short. Two threads, so that pending data keeps being written while a
//! checkpoint encodes the index and waits for the data devices' flush (100-300 ms on a
//! fragmented 4 GiB working set): on one thread, 16 MiB of pending data filled up meanwhile
//! and commits waited. Foreground commits never wait for either except when the WAL is full
//! or the flusher is behind. What the threads share is here.

use crate::checkpoint::{self, Root};
use crate::device::{align_up, AlignedBuf, BLOCK_SIZE};
use crate::error::{Result, StoreError};
use crate::format::WalHeader;
use crate::index::{Dirty, Loc, LocMatch};
use crate::segments::{Head, Summary};
use crate::store::{Shared, State};
use cairn_failstop::CondvarOrDie;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

mod ckpt;
mod clean;
mod flush;

pub(crate) use ckpt::checkpoint;
use clean::clean_one;
pub(crate) use flush::run_flusher;
use flush::{flush_all, flush_some, FLUSH_BUF};

const B: u64 = BLOCK_SIZE as u64;
/// Largest single segment write of pending data.
const MAX_FLUSH_BLOCKS: u64 = 1024;
/// Pending pieces the flusher takes or points at their new place per hold of the store's
/// lock. A batch is up to 1,024 pieces, ~1 us each: taken or repointed in one hold, the lock
/// was held 0.8 ms typically and up to 10 ms (the holder preempted on a busy machine), and
/// every commit of the store waited meanwhile.
const PIECES_PER_HOLD: usize = 64;
/// Checkpoint bodies are written in pieces of at most this size.
const PIECE: usize = 1 << 20;

/// The maintenance loop; returns on shutdown or failure. A panic (a bug) stops writes
/// instead of leaving committers waiting for a thread that is gone.
pub(crate) fn run(sh: Arc<Shared>) {
    guarded(&sh, "maintenance", run_loop);
}

/// Runs a background thread's loop; a panic in it fails the store.
fn guarded(sh: &Arc<Shared>, thread: &str, body: fn(&Arc<Shared>)) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(sh)));
    if let Err(p) = r {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let mut st = sh.lock();
        sh.fail(&mut st, format!("{thread} thread panicked: {what}"));
    }
}

/// Rounds of making space that gain no free segment before the store gives up (a space
/// accounting bug would otherwise spin here while commits wait forever).
const MAX_FRUITLESS_ROUNDS: u32 = 256;

fn run_loop(sh: &Arc<Shared>) {
    let sh = sh.as_ref();
    let mut fruitless = 0;
    let mut flush_rounds = 0;
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
            Work::MakeSpace => {
                let progress = |st: &State| (st.segs.free_segments(), st.pending_blocks);
                let before = {
                    let st = sh.lock();
                    // Flushes that went through since the last round are progress too.
                    if std::mem::replace(&mut flush_rounds, st.flush_rounds) != st.flush_rounds {
                        fruitless = 0;
                    }
                    progress(&st)
                };
                let r = match make_space(sh) {
                    // Nothing to clean: all used space is live, so the cleaner's segment
                    // is not needed and the flusher may use it.
                    Ok(false) => flush_some(sh, true).map(|_| ()),
                    r => r.map(|_| ()),
                };
                let mut st = sh.lock();
                let after = progress(&st);
                let gained = after.0 > before.0 || after.1 < before.1;
                fruitless = if gained { 0 } else { fruitless + 1 };
                st.flusher_short = false;
                crate::commit::wake_flusher(sh, &st);
                if fruitless > MAX_FRUITLESS_ROUNDS {
                    Err(StoreError::Failed(format!(
                        "{MAX_FRUITLESS_ROUNDS} rounds of making space neither freed a segment nor \
                         wrote pending data (space accounting bug)"
                    )))
                } else {
                    r
                }
            }
            Work::Checkpoint => checkpoint(sh),
            Work::FlushWal => {
                let wq = sh.wal_lock();
                if !wq.writing && wq.written_seq > wq.durable_seq {
                    drop(crate::unflushed::flush_written(sh, wq));
                }
                Ok(())
            }
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
    Stop {
        final_ckpt: bool,
    },
    /// The flusher ran out of segments: clean, checkpoint, or let it use the cleaner's.
    MakeSpace,
    Checkpoint,
    /// Flush WAL records written without a flush (`Store::write_through`) that are due.
    FlushWal,
    Clean {
        throttle: bool,
    },
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
        let (wal_used, wal_busy, wal_flush_in, wal_writing) = {
            let wq = sh.wal_lock();
            let busy = wq.tail_lsn != wq.head_lsn || !wq.queue.is_empty();
            let due = crate::unflushed::flush_due(sh, &wq);
            (wq.used(), busy, due, wq.writing)
        };
        let wal_full = wal_used * 100 >= sh.wal.ring_size * cfg.checkpoint_wal_percent as u64;
        let free = st.segs.free_segments() as u64;
        let keep = sh.flusher_keep_segments(&st);
        let clean_below = cfg.clean_below_free_segments as u64;
        let total = st.segs.total_blocks() / st.segs.seg_blocks as u64;
        let pace = cleaner_pace(free, keep, total, clean_below);
        let periodic = wal_busy && st.last_ckpt.elapsed() >= cfg.checkpoint_interval;
        if wal_flush_in.is_some_and(|d| d.is_zero()) && !wal_writing {
            return Work::FlushWal;
        }
        let limbo = st.segs.limbo_segments() as u64;
        let release = checkpoint_for_space(free, keep, total, clean_below, limbo);
        if st.ckpt_wanted || wal_full || periodic || release {
            return Work::Checkpoint;
        }
        if st.flusher_short {
            return Work::MakeSpace;
        }
        if let Some(throttle) = pace {
            if st.segs.clean_candidate().is_some() {
                return Work::Clean { throttle };
            }
        }
        let mut tick = cfg.flush_max_delay.max(Duration::from_millis(5)) / 2;
        if let Some(d) = wal_flush_in {
            // Due while a batch is being written: look again soon (that batch may flush).
            tick = tick.min(d.max(Duration::from_micros(200)));
        }
        // This thread flushes only for checkpoints and when making space: its staging buffer
        // is not held while it sleeps.
        let freed;
        (st, freed) = drop_staging(sh, st);
        if freed {
            continue;
        }
        st = sleep_idle(&sh.maint_cv, st, tick, |st| &mut st.maint_idle);
    }
}

/// Frees this thread's flush staging buffer, if it holds one, outside the lock; returns the
/// lock again and whether it did (the caller then looks at everything again).
fn drop_staging<'a>(sh: &'a Shared, st: MutexGuard<'a, State>) -> (MutexGuard<'a, State>, bool) {
    match FLUSH_BUF.with_borrow_mut(Option::take) {
        Some(buf) => {
            drop(st);
            drop(buf);
            (sh.lock(), true)
        }
        None => (st, false),
    }
}

/// Sleeps on `cv` for at most `tick` with the thread's idle flag set (wakers notify only
/// then).
fn sleep_idle<'a>(
    cv: &std::sync::Condvar,
    mut st: MutexGuard<'a, State>,
    tick: Duration,
    idle: fn(&mut State) -> &mut bool,
) -> MutexGuard<'a, State> {
    *idle(&mut st) = true;
    let (mut st, _) = cv.wait_timeout_or_die(st, tick);
    *idle(&mut st) = false;
    st
}

/// How the cleaner runs with `free` of `total` segments free while the flusher keeps `keep`:
/// not at all (`None`: room enough, or none to copy into without taking the checkpoints'
/// room), throttled to `clean_rate` (`Some(true)`) or at full speed (`Some(false)`, once
/// fewer than keep + `clean_below` are free). It starts well ahead of that, with a sixteenth
/// of the segments free beyond the keep: the segments it empties come back only at the next
/// checkpoint, and meanwhile the flusher (~130 MB/s per OSD under 4 KiB random writes on the
/// development VM) must not run out of segments and stop commits while space is made.
fn cleaner_pace(free: u64, keep: u64, total: u64, clean_below: u64) -> Option<bool> {
    let low = free < keep + clean_below;
    let ahead = free < keep + cleaner_lead(total, clean_below);
    (ahead && free >= keep).then_some(!low)
}

/// Free segments beyond the flusher's keep below which the cleaner starts (throttled).
fn cleaner_lead(total: u64, clean_below: u64) -> u64 {
    clean_below.max(total / 16)
}

/// Whether space is better made by a checkpoint than by cleaning, with `limbo` segments whose
/// blocks all died waiting for one. A checkpoint releases them all and copies nothing; the
/// cleaner copies the live blocks of a segment and that segment then waits in limbo too. So a
/// checkpoint comes first once space is wanted and limbo holds half the cleaner's lead, and
/// whenever free space is low. Without the first rule, rewriting from start to end a volume
/// whose every segment had one dead block had the cleaner copy those nearly full segments while
/// the ones the rewrite emptied waited for a checkpoint (the store test
/// `a_sequential_overwrite_is_made_room_for_by_checkpoints_not_by_cleaning`). Not for less
/// limbo: each checkpoint encodes and writes the whole index (20-85 MB for a randomly written
/// 4 GiB volume).
fn checkpoint_for_space(free: u64, keep: u64, total: u64, clean_below: u64, limbo: u64) -> bool {
    let lead = cleaner_lead(total, clean_below);
    let wanted = free < keep + lead;
    let low = free < keep + clean_below;
    limbo > 0 && (low || (wanted && limbo >= clean_below.max(lead / 2)))
}

/// A run of pending blocks of one object to write.
struct Piece {
    /// Whether its blocks enter the read cache once written (the flusher's pieces).
    cache: bool,
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

/// One run of a piece to point at its new place: blocks `blk..blk + n` of the piece's object
/// that are still at `from` go to `disk`.
pub(crate) struct Move<'a> {
    pub coll: crate::txn::CollId,
    pub obj: &'a crate::effect::Name,
    pub blk: u64,
    pub n: u32,
    pub from: LocMatch,
    pub disk: u64,
}

/// The moves that point `pieces`, laid out one after the other from block `*pos` of the
/// allocated `runs`, at their new place (a piece that spans two runs is two moves); advances
/// `*pos` past them.
fn moves_over_runs<'a>(pieces: &'a [Piece], runs: &[(u64, u32)], pos: &mut u64) -> Vec<Move<'a>> {
    let mut moves = Vec::with_capacity(pieces.len());
    for p in pieces {
        for (blk, n, disk) in split_over_runs(runs, *pos, p.first, p.nblocks) {
            let rel = (blk - p.first) as usize * BLOCK_SIZE;
            let from = match &p.from {
                LocMatch::Mem { id, off } => LocMatch::Mem {
                    id: *id,
                    off: off + rel,
                },
                LocMatch::Disk(d) => LocMatch::Disk(d + rel as u64),
            };
            moves.push(Move {
                coll: p.coll,
                obj: &p.obj,
                blk,
                n,
                from,
                disk,
            });
        }
        *pos += p.nblocks as u64;
    }
    moves
}

/// Points each move's blocks at their new place, locking each collection once for all of
/// its moves; returns each move's moved runs (blocks from `blk`, count), in order. The
/// caller accounts them ([`account_moved`]) before it releases the table.
pub(crate) fn relocate_all(
    sh: &Shared,
    table: &crate::colls::Table,
    moves: &[Move],
) -> Vec<Vec<(u64, u32)>> {
    let mut out = vec![Vec::new(); moves.len()];
    for_each_by_collection(
        moves,
        |m| m.coll,
        |coll, group| {
            let Some(slot) = table.get(&coll) else { return };
            let mut g = sh.colls.lock_background(slot);
            let Some(c) = g.as_mut().map(Arc::make_mut) else {
                return;
            };
            for &k in group {
                let m = &moves[k];
                if let Some(o) = c.objects.get_mut(&m.obj[..]) {
                    let end = m.blk + m.n as u64;
                    out[k] = Arc::make_mut(o).relocate(m.blk, end, &m.from, m.disk);
                }
            }
        },
    );
    out
}

/// Calls `f` once per collection with the indices of `items` in it (in their order), so that
/// background work takes each collection's lock once per batch, not once per item.
fn for_each_by_collection<T>(
    items: &[T],
    coll_of: impl Fn(&T) -> crate::txn::CollId,
    mut f: impl FnMut(crate::txn::CollId, &[usize]),
) {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| coll_of(&items[i]));
    for group in order.chunk_by(|&a, &b| coll_of(&items[a]) == coll_of(&items[b])) {
        f(coll_of(&items[group[0]]), group);
    }
}

/// Frees the copies of a relocated run nothing points to and records the run for the
/// cleaner.
pub(crate) fn account_moved(sh: &Shared, st: &mut State, m: &Move, moved: &[(u64, u32)]) {
    free_unmoved(sh, st, m.disk, m.n, moved);
    if let Some(s) = st.segs.seg_of(m.disk) {
        st.segs.summaries[s as usize].push(Summary {
            coll: m.coll,
            obj: m.obj.clone(),
            first_block: m.blk,
            nblocks: m.n,
        });
    }
}

/// Frees the blocks of a written run that no longer back anything (overwritten meanwhile):
/// the complement of the `moved` runs within `n` blocks at `disk`; the read cache forgets
/// them (they were cached as they were written).
fn free_unmoved(sh: &Shared, st: &mut State, disk: u64, n: u32, moved: &[(u64, u32)]) {
    let mut at = 0u64;
    for &(rel, k) in moved.iter().chain(std::iter::once(&(n as u64, 0))) {
        if rel > at {
            st.segs.free_live(disk + at * B, (rel - at) as u32);
            if let Some(c) = &sh.data.cache {
                c.forget([(disk + at * B, (rel - at) * B)]);
            }
        }
        at = rel + k as u64;
    }
}

/// Writes `buf` over the allocated runs, in order (not into the read cache: see
/// [`cache_written`]).
fn write_runs(sh: &Shared, buf: &[u8], runs: &[(u64, u32)]) -> Result<()> {
    let mut done = 0usize;
    for &(off, n) in runs {
        let len = n as usize * BLOCK_SIZE;
        sh.data.write(&buf[done..done + len], off)?;
        done += len;
    }
    Ok(())
}

/// Puts blocks just written by [`write_runs`] into the read cache: for each piece laid out
/// in `buf`, the blocks `keep(piece, block of the piece)` accepts.
fn cache_written(
    sh: &Shared,
    buf: &[u8],
    pieces: &[Piece],
    runs: &[(u64, u32)],
    keep: impl Fn(&Piece, u64) -> bool,
) {
    let Some(c) = &sh.data.cache else { return };
    let mut pos = 0u64;
    for p in pieces {
        for (blk, n, disk) in split_over_runs(runs, pos, p.first, p.nblocks) {
            // Runs of kept blocks go in with one insert (one cache lock) each.
            let mut k = 0u64;
            while k < n as u64 {
                let start = k;
                while k < n as u64 && keep(p, blk - p.first + k) {
                    k += 1;
                }
                if k > start {
                    let at = ((pos + blk - p.first + start) * B) as usize;
                    c.insert(disk + start * B, &buf[at..at + ((k - start) * B) as usize]);
                } else {
                    k += 1;
                }
            }
        }
        pos += p.nblocks as u64;
    }
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

#[cfg(test)]
mod tests {
    use super::{checkpoint_for_space, cleaner_pace};

    #[test]
    fn dead_segments_are_released_by_a_checkpoint_before_anything_is_cleaned() {
        // An 8 GiB OSD: 2,048 segments of 4 MiB; 30 kept; the cleaner starts below 30 + 128.
        let ckpt = |free, limbo| checkpoint_for_space(free, 30, 2048, 8, limbo);
        assert!(!ckpt(158, 1000), "space is not wanted yet");
        assert!(ckpt(157, 64), "half the cleaner's lead waits in limbo");
        assert!(
            !ckpt(157, 63),
            "too little in limbo for a checkpoint: clean"
        );
        assert!(!ckpt(60, 63));
        assert!(ckpt(37, 1), "low: whatever limbo holds");
        assert!(!ckpt(37, 0), "nothing to release");
        // A small store: the lead is clean_below, and so is the limbo worth a checkpoint.
        assert!(checkpoint_for_space(10 + 7, 10, 64, 8, 1));
        assert!(!checkpoint_for_space(10 + 8, 10, 64, 8, 100));
    }

    #[test]
    fn the_cleaner_starts_ahead_of_running_low_and_hurries_once_low() {
        // An 8 GiB OSD: 2,048 segments of 4 MiB; 30 kept for the flusher; clean below 8.
        let pace = |free| cleaner_pace(free, 30, 2048, 8);
        assert_eq!(pace(30 + 128), None, "room enough");
        assert_eq!(
            pace(30 + 127),
            Some(true),
            "ahead of the flusher: throttled"
        );
        assert_eq!(pace(30 + 8), Some(true));
        assert_eq!(pace(30 + 7), Some(false), "low: at full speed");
        assert_eq!(pace(30), Some(false));
        assert_eq!(pace(29), None, "no room to copy into");
        // A small store: the configured threshold rules.
        assert_eq!(cleaner_pace(10 + 7, 10, 64, 8), Some(false));
        assert_eq!(cleaner_pace(10 + 8, 10, 64, 8), None);
    }
}
