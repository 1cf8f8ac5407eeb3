//! What the committers, the maintenance thread and readers share: the index with one lock
//! per collection (`colls.rs`), space and maintenance state under the state lock, the WAL
//! queue under a third one, and the condition variables they wait on.
//!
//! Lock order: the collections' table, their slots, `st`, `wq`. A committer checks and
//! reserves room under `st` before it locks its collections, applies its transaction to them
//! with `st` released, then, still holding its collections, takes `st` to account the space
//! and `wq` for the moment it numbers its record and queues it (so that each collection's
//! records are numbered in the order they were applied); everything after, waiting for
//! durability and writing batches, takes `wq` only. A batch writer holds no lock while it
//! writes the device.

use crate::device::BLOCK_SIZE;
use crate::index::Dirty;
use crate::mirror::{IoCounters, Mirror};
use crate::segments::Segments;
use crate::txn::limits;
use crate::wal::WalRegion;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::StoreConfig;

pub(crate) struct State {
    /// Threads waiting on `space_cv`: notifications are skipped when there are none (a
    /// condvar notify is a system call even with no waiter).
    pub cv_waiters: u32,
    /// The maintenance thread is asleep on `maint_cv` (only then is waking it worth a call).
    pub maint_idle: bool,
    /// The flusher thread is asleep on `flush_cv`.
    pub flusher_idle: bool,
    /// The flusher ran out of segments: it waits until the maintenance thread has made
    /// space (cleaned, checkpointed) and cleared this.
    pub flusher_short: bool,
    /// Flushes the flusher thread finished (the maintenance thread sees progress by it).
    pub flush_rounds: u64,
    pub segs: Segments,
    pub header_gen: u64,
    pub dirty: VecDeque<Dirty>,
    pub dirty_since: Option<Instant>,
    /// Data blocks waiting in memory for the flusher, and those that committers have
    /// reserved while they apply (checked against the limits as if pending already).
    pub pending_blocks: u64,
    pub failed: Option<String>,
    /// In-memory extents of direct writes whose jobs are not done: id -> (offset in their
    /// buffer, data-device offset), so that a checkpoint names where they are going.
    pub direct_dest: std::collections::HashMap<u64, (usize, u64)>,
    pub ckpt_wanted: bool,
    pub shutdown: bool,
    pub ckpt_runs: Vec<(u64, u32)>,
    /// Expected size of the next checkpoint's index part (without inline data), in blocks.
    pub ckpt_est_blocks: u64,
    pub last_ckpt: Instant,
    pub commits: u64,
    pub checkpoints: u64,
    /// Time checkpoints spent writing their body and root, and flushing the data devices
    /// after (the flush can hold the flusher's writes too: `docs/operator/store.md`).
    pub ckpt_write_time: std::time::Duration,
    pub ckpt_flush_time: std::time::Duration,
    pub cleaned_segments: u64,
    pub cleaned_bytes: u64,
    pub waits_for_flusher: u64,
    pub waits_for_wal_space: u64,
    /// Transactions whose large writes went straight to the data devices, and their bytes.
    pub direct_writes: u64,
    pub direct_bytes: u64,
}

/// The WAL's queue of records and where its batches stand.
pub(crate) struct WalQueue {
    /// Threads waiting on `durable_cv` or a `seq_cv`.
    pub cv_waiters: u32,
    /// Set with `State::failed` (a batch writer that fails sets it first, before it can take
    /// `st`): no record is written after it.
    pub failed: Option<String>,
    /// The sequence number of the next record queued.
    pub next_seq: u64,
    pub last_crc: u32,
    pub durable_seq: u64,
    /// Records up to this one are written to the WAL device, maybe not flushed yet
    /// (`Store::write_through`); never below `durable_seq`.
    pub written_seq: u64,
    /// Since when records are written but not flushed (the maintenance thread flushes them
    /// within `wal_flush_delay`).
    pub unflushed_since: Option<Instant>,
    /// Encoded, not yet sealed records waiting for the next batch.
    pub queue: Vec<crate::wal::QueuedRecord>,
    pub queue_bytes: u64,
    /// Room committers reserved for records they are applying (not queued yet).
    pub reserved_bytes: u64,
    /// The last WAL batch's buffer, for the next batch (the writer takes it while writing):
    /// a fresh zeroed one per batch costs page faults and page clearing.
    pub batch_spare: Option<crate::device::AlignedBuf>,
    /// A batch is being written or the device flushed (by one thread at a time).
    pub writing: bool,
    pub tail_lsn: u64,
    pub head_lsn: u64,
    /// A checkpoint snapshotted the index when this was the next sequence number: batches
    /// end before it (`commit::write_batch`), so that its records end a batch.
    pub cut: Option<u64>,
    /// Where the records before the cut end, once durable: (LSN of the next batch, crc of
    /// the last record), for the checkpoint's replay point.
    pub cut_point: Option<(u64, u32)>,
    /// Direct writes applied to the index whose data the next WAL batch writes (and flushes)
    /// before its records.
    pub direct_jobs: Vec<crate::direct::DirectJob>,
    /// The batch being written carries direct writes (it writes and flushes a data device).
    pub writing_direct: bool,
}

impl WalQueue {
    /// Bytes of the WAL ring in use.
    pub fn used(&self) -> u64 {
        self.tail_lsn - self.head_lsn + self.queue_bytes + self.reserved_bytes
    }
}

/// Condition variables committers wait on, by sequence number.
pub(crate) const SEQ_CVS: usize = 64;

pub(crate) struct Shared {
    /// The index: collections, each under its own lock.
    pub colls: crate::colls::Colls,
    /// Numbers in-memory extents (the flusher matches on them).
    pub next_id: std::sync::atomic::AtomicU64,
    pub st: Mutex<State>,
    pub wq: Mutex<WalQueue>,
    /// WAL drained while a checkpoint waits, failure (waited on with `wq`).
    pub durable_cv: Condvar,
    /// Committers wait for their record on `seq_cvs[seq % SEQ_CVS]` (with `wq`).
    pub seq_cvs: Vec<Condvar>,
    /// Wakes the maintenance thread.
    pub maint_cv: Condvar,
    /// Wakes the flusher thread.
    pub flush_cv: Condvar,
    /// WAL space was reclaimed, the flusher made room, a checkpoint ended (with `st`).
    pub space_cv: Condvar,
    pub wal: WalRegion,
    pub data: Mirror,
    pub cfg: StoreConfig,
    pub wal_counters: IoCounters,
    pub store_id: [u8; 16],
    /// Blocks of the segment area.
    pub data_blocks: u64,
    /// The tag every WAL record of this store carries.
    pub wal_tag: u32,
    /// Object bytes copied in memory, by where.
    pub copies: crate::copies::CopyCounters,
    /// Waits for `st` and for `wq`.
    pub lock_waits: crate::lockwaits::LockWaits,
    pub wal_lock_waits: crate::lockwaits::LockWaits,
}

impl Shared {
    /// Takes the state lock, counting the wait if another thread holds it (waits after a
    /// condition variable's wake are not counted: they are part of waiting for the event).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.lock_waits.lock(&self.st)
    }

    /// Takes the WAL queue's lock (after `st`, if both are taken), counting waits.
    pub fn wal_lock(&self) -> MutexGuard<'_, WalQueue> {
        self.wal_lock_waits.lock(&self.wq)
    }

    /// Stops writes after a background failure and wakes everyone waiting. Takes `wq`: the
    /// caller holds `st` only.
    pub fn fail(&self, st: &mut State, why: String) {
        if st.failed.is_none() {
            st.failed = Some(why.clone());
        }
        self.fail_wal(&mut self.wal_lock(), why);
        self.space_cv.notify_all();
        self.maint_cv.notify_all();
        self.flush_cv.notify_all();
    }

    /// The WAL's half of [`Shared::fail`], for a thread that holds `wq` only: it must call
    /// `fail` (which repeats this harmlessly) once it has released `wq`.
    pub fn fail_wal(&self, wq: &mut WalQueue, why: String) {
        if wq.failed.is_none() {
            wq.failed = Some(why);
        }
        self.durable_cv.notify_all();
        self.seq_cvs.iter().for_each(Condvar::notify_all);
    }

    /// The condition variable the committer of record `seq` waits on.
    pub fn seq_cv(&self, seq: u64) -> &Condvar {
        &self.seq_cvs[(seq % SEQ_CVS as u64) as usize]
    }

    /// Largest record the WAL accepts.
    pub fn max_record(&self) -> u64 {
        (self.wal.ring_size / 4).min(limits::TXN_BYTES as u64)
    }

    /// Most data blocks that may wait in memory for the flusher; commits wait beyond it.
    /// Bounds memory and the inline part of a checkpoint. At most 1/16 of the data area, so
    /// that the room kept for checkpoints stays a small part of a small device.
    pub fn pending_limit_blocks(&self) -> u64 {
        let cfg = self.cfg.pending_limit_bytes.max(self.cfg.flush_batch_bytes) / BLOCK_SIZE as u64;
        cfg.min(self.data_blocks / 16).max(1)
    }

    /// Free segments one checkpoint may need: its index part, plus all pending data if it
    /// has to carry that inline (when the flusher could not write it first).
    pub fn ckpt_need_segments(&self, st: &State) -> u64 {
        let seg = st.segs.seg_blocks as u64;
        (st.ckpt_est_blocks + self.pending_limit_blocks()).div_ceil(seg) + 1
    }

    /// Free segments the flusher leaves: room for two checkpoints (a new one is written while
    /// the previous one still holds its segments) and one segment for the cleaner to copy
    /// live blocks into. Writes get ENOSPC before this room is touched.
    pub fn flusher_keep_segments(&self, st: &State) -> u64 {
        2 * self.ckpt_need_segments(st) + 1
    }
}
