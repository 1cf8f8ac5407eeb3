//! Records written to the WAL device but not flushed yet: what a pool with `memory`
//! durability acknowledges. Written records survive the crash of any process (they are in the
//! device, or in the kernel's page cache for a file on tmpfs); only a power loss before their
//! flush can take them. The maintenance thread flushes them within `wal_flush_delay`, and
//! anyone who waits for durability ([`Store::sync_through`], [`Store::commit`]) flushes them
//! at once.

use crate::commit::write_batch_then;
use crate::error::{Result, StoreError};
use crate::store::{Shared, Store, WalQueue, SEQ_CVS};
use std::sync::MutexGuard;

impl Store {
    /// Returns once every transaction up to sequence `seq` is written to the WAL device, not
    /// necessarily flushed: safe from a crash of this process, not from a power loss until
    /// the flush that follows within `StoreConfig::wal_flush_delay`. Writes the queued
    /// records itself when no other thread is.
    pub fn write_through(&self, seq: u64) -> Result<()> {
        let sh = &*self.sh;
        let mut wq = sh.wal_lock();
        let seq = seq.min(wq.next_seq.saturating_sub(1));
        loop {
            if wq.written_seq >= seq {
                return Ok(());
            }
            if let Some(f) = &wq.failed {
                return Err(StoreError::Failed(f.clone()));
            }
            if !wq.writing && !wq.queue.is_empty() {
                wq = write_batch_then(sh, wq, false);
                continue;
            }
            // Batches are written in order: the one after the written prefix wakes this.
            let cv = sh.seq_cv(wq.written_seq + 1);
            wq = crate::commit::wait_wal(cv, wq);
        }
    }
}

/// Flushes the WAL device so that the records written without a flush become durable.
/// Called with no batch being written (`!wq.writing`); holds `writing` meanwhile, so that no
/// batch starts while the flush is outside the lock.
pub(crate) fn flush_written<'a>(
    sh: &'a Shared,
    mut wq: MutexGuard<'a, WalQueue>,
) -> MutexGuard<'a, WalQueue> {
    debug_assert!(!wq.writing);
    let target = wq.written_seq;
    let from = wq.durable_seq + 1;
    wq.writing = true;
    drop(wq);
    if let Err(e) = sh.wal.flush() {
        return crate::commit::wal_failed(sh, format!("WAL flush failed: {e}"));
    }
    let mut wq = sh.wal_lock();
    wq.writing = false;
    sh.wal_counters
        .flushes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    wq.durable_seq = wq.durable_seq.max(target);
    if wq.written_seq == target {
        wq.unflushed_since = None;
    }
    if wq.cut == Some(target + 1) {
        // A checkpoint snapshotted while this flush held `writing`, with every record
        // before it written: no batch will end at its cut, and none needs to (the
        // records before it are durable and the log ends where they do).
        wq.cut = None;
        wq.cut_point = Some((wq.tail_lsn, wq.last_crc));
        sh.durable_cv.notify_all();
    }
    if wq.cv_waiters > 0 {
        // The committers of the records just made durable, and the first one queued
        // meanwhile (it writes the next batch now that no one is writing: also one that
        // waits to drain direct writes).
        for s in from..=target.min(from + SEQ_CVS as u64 - 1) {
            sh.seq_cv(s).notify_all();
        }
        if !wq.queue.is_empty() {
            sh.seq_cv(wq.written_seq + 1).notify_all();
        }
    }
    wq
}

/// Whether written records have waited for their flush for `wal_flush_delay` (the
/// maintenance thread flushes them then), and otherwise how long until they will have.
pub(crate) fn flush_due(sh: &Shared, wq: &WalQueue) -> Option<std::time::Duration> {
    let since = wq.unflushed_since?;
    Some(sh.cfg.wal_flush_delay.saturating_sub(since.elapsed()))
}
