//! Records written to the WAL device but not flushed yet: what a pool with `memory`
//! durability acknowledges. Written records survive the crash of any process (they are in the
//! device, or in the kernel's page cache for a file on tmpfs); only a power loss before their
//! flush can take them. The maintenance thread flushes them within `wal_flush_delay`, and
//! anyone who waits for durability ([`Store::sync_through`], [`Store::commit`]) flushes them
//! at once.

use crate::commit::write_batch_then;
use crate::error::{Result, StoreError};
use crate::store::{Shared, State, Store, SEQ_CVS};
use cairn_failstop::CondvarOrDie;
use std::sync::MutexGuard;

impl Store {
    /// Returns once every transaction up to sequence `seq` is written to the WAL device, not
    /// necessarily flushed: safe from a crash of this process, not from a power loss until
    /// the flush that follows within `StoreConfig::wal_flush_delay`. Writes the queued
    /// records itself when no other thread is.
    pub fn write_through(&self, seq: u64) -> Result<()> {
        let sh = &*self.sh;
        let mut st = sh.lock();
        let seq = seq.min(st.next_seq.saturating_sub(1));
        loop {
            if st.written_seq >= seq {
                return Ok(());
            }
            if let Some(f) = &st.failed {
                return Err(StoreError::Failed(f.clone()));
            }
            if !st.writing && !st.queue.is_empty() {
                st = write_batch_then(sh, st, false);
                continue;
            }
            // Batches are written in order: the one after the written prefix wakes this.
            let cv = sh.seq_cv(st.written_seq + 1);
            st.cv_waiters += 1;
            st = cv.wait_or_die(st);
            st.cv_waiters -= 1;
        }
    }
}

/// Flushes the WAL device so that the records written without a flush become durable.
/// Called with no batch being written (`!st.writing`); holds `writing` meanwhile, so that no
/// batch starts while the flush is outside the lock.
pub(crate) fn flush_written<'a>(
    sh: &'a Shared,
    mut st: MutexGuard<'a, State>,
) -> MutexGuard<'a, State> {
    debug_assert!(!st.writing);
    let target = st.written_seq;
    let from = st.durable_seq + 1;
    st.writing = true;
    drop(st);
    let result = sh.wal.flush();
    let mut st = sh.lock();
    st.writing = false;
    match result {
        Ok(()) => {
            sh.wal_counters
                .flushes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            st.durable_seq = st.durable_seq.max(target);
            if st.written_seq == target {
                st.unflushed_since = None;
            }
            if st.cut == Some(target + 1) {
                // A checkpoint snapshotted while this flush held `writing`, with every record
                // before it written: no batch will end at its cut, and none needs to (the
                // records before it are durable and the log ends where they do).
                st.cut = None;
                st.cut_point = Some((st.tail_lsn, st.last_crc));
                sh.durable_cv.notify_all();
            }
        }
        Err(e) => {
            let msg = format!("WAL flush failed: {e}");
            sh.fail(&mut st, msg);
        }
    }
    if st.cv_waiters > 0 {
        // The committers of the records just made durable, and the first one queued
        // meanwhile (it writes the next batch now that no one is writing).
        for s in from..=target.min(from + SEQ_CVS as u64 - 1) {
            sh.seq_cv(s).notify_all();
        }
        if !st.queue.is_empty() {
            sh.seq_cv(st.written_seq + 1).notify_all();
            sh.space_cv.notify_all(); // committers waiting for a batch to drain direct writes
        }
    }
    st
}

/// Whether written records have waited for their flush for `wal_flush_delay` (the
/// maintenance thread flushes them then), and otherwise how long until they will have.
pub(crate) fn flush_due(sh: &Shared, st: &State) -> Option<std::time::Duration> {
    let since = st.unflushed_since?;
    Some(sh.cfg.wal_flush_delay.saturating_sub(since.elapsed()))
}
