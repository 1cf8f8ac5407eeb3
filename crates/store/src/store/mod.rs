//! The store: its public handle, lifecycle and counters. Formatting and opening are in
//! `open.rs` (device checks) and `recover.rs` (checkpoint load, WAL replay), the shared state
//! every thread works on in `state.rs`, the read-side API in [`crate::read`]; the commit path
//! is in [`crate::commit`], background work in [`crate::maint`].

mod config;
mod open;
mod recover;
mod state;

use cairn_failstop::CondvarOrDie;
pub use config::StoreConfig;
pub(crate) use state::{Shared, State, WalQueue, SEQ_CVS};

use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Result, StoreError};
use crate::mirror::IoStats;
use crate::txn::CollId;
use std::sync::Arc;
use std::thread::JoinHandle;

const BLOCK: u64 = BLOCK_SIZE as u64;

/// The devices of a store.
#[derive(Clone)]
pub struct Devices {
    /// One data device, or two forming a mirror.
    pub data: Vec<Arc<dyn BlockDevice>>,
    /// A separate (fast) WAL device; without it the WAL lives on data device 0.
    pub wal: Option<Arc<dyn BlockDevice>>,
}

/// Counters for benchmarks and `status`.
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    pub data_io: IoStats,
    pub wal_io: IoStats,
    pub commits: u64,
    pub checkpoints: u64,
    /// Microseconds checkpoints spent writing their body and root to the data devices, and
    /// flushing the data devices after (which can hold every write to them meanwhile).
    pub checkpoint_write_micros: u64,
    pub checkpoint_flush_micros: u64,
    /// Most data that may wait in memory for the flusher before commits wait
    /// ([`crate::StoreConfig::pending_limit_bytes`], capped by the device's size).
    pub pending_limit_bytes: u64,
    pub segments_total: u32,
    pub segments_free: u32,
    /// Bytes of the segment area.
    pub capacity_bytes: u64,
    /// Bytes data and checkpoints may fill before ordinary writes fail with `NoSpace` (the
    /// segment area less the reserve for the cleaner, the flusher and checkpoints, and less
    /// the part kept for small metadata writes, `CLIENT_RESERVE_PERCENT`).
    pub writable_bytes: u64,
    /// Bytes of that in use (live and pending data, checkpoints): at `writable_bytes`, full.
    pub used_bytes: u64,
    /// The read cache (all zero without one).
    pub read_cache: crate::cache::CacheStats,
    pub segments_cleaned: u64,
    pub cleaned_bytes: u64,
    pub live_bytes: u64,
    pub pending_bytes: u64,
    pub checkpoint_bytes: u64,
    pub wal_used_bytes: u64,
    pub wal_size: u64,
    /// Times a commit waited because the flusher was behind (pending data at its limit).
    pub waits_for_flusher: u64,
    /// Times a commit waited for WAL space (a checkpoint to reclaim it).
    pub waits_for_wal_space: u64,
    /// Transactions whose large writes went straight to the data devices (written once, not
    /// through the WAL), and the bytes of those writes.
    pub direct_writes: u64,
    pub direct_bytes: u64,
    /// Bytes of those writes copied into an aligned buffer first (their payload was not
    /// where `O_DIRECT` needs it in memory); the rest were written from the payload itself.
    pub direct_staged_bytes: u64,
    /// Object bytes copied in memory since the store opened, by where.
    pub copies: crate::CopyStats,
    /// The heap the index takes, estimated from its objects and extents
    /// ([`INDEX_BYTES_PER_OBJECT`], [`INDEX_BYTES_PER_EXTENT`]).
    pub index_bytes: u64,
    /// Waits for the store's state lock, for its WAL queue's lock and for the locks of its
    /// collections (`docs/operator/store.md`, "Lock waits").
    pub lock_waits: crate::LockWaitStats,
    pub wal_lock_waits: crate::LockWaitStats,
    pub coll_lock_waits: crate::LockWaitStats,
    /// Waits for collections' locks by the flusher, the cleaner and batches finishing direct
    /// writes (not on a commit's path).
    pub coll_lock_waits_background: crate::LockWaitStats,
}

/// Heap bytes of the index per object besides its extents (a name of ~40 bytes included), and
/// per extent (its share of the extent B-tree and its segment summary), as
/// `tests/index_memory.rs` measures them (docs/format/store.md, "Index memory"), which checks
/// that the estimate stays close. An OSD's memory target counts the index by these.
pub const INDEX_BYTES_PER_OBJECT: u64 = 810;
pub const INDEX_BYTES_PER_EXTENT: u64 = 150;

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The index's heap, estimated: objects from the collections' trees (one length per
/// collection), extents from the segment summaries (one entry per extent written to a
/// segment, kept until the cleaner frees it: extents overwritten but not yet cleaned count
/// too, and data not yet flushed does not).
fn index_bytes(st: &State, objects: u64) -> u64 {
    let extents: u64 = st.segs.summaries.iter().map(|s| s.len() as u64).sum();
    objects * INDEX_BYTES_PER_OBJECT + extents * INDEX_BYTES_PER_EXTENT
}

/// Facts about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStat {
    pub size: u64,
    /// Bytes of data blocks held (holes excluded).
    pub allocated: u64,
    pub attrs: usize,
}

/// A local object store on one or two data devices and an optional WAL device.
/// Thread-safe; share it behind an `Arc`.
pub struct Store {
    pub(crate) sh: Arc<Shared>,
    /// The maintenance and flusher threads, until stopped.
    threads: Vec<JoinHandle<()>>,
}

impl Store {
    /// Flushes everything, writes a final checkpoint and stops background work.
    pub fn close(mut self) -> Result<()> {
        self.stop(true)
    }

    fn stop(&mut self, clean: bool) -> Result<()> {
        {
            let mut st = self.sh.lock();
            st.shutdown = true;
            st.ckpt_wanted = clean;
            self.sh.maint_cv.notify_all();
            self.sh.flush_cv.notify_all();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        let st = self.sh.lock();
        match &st.failed {
            Some(f) if clean => Err(StoreError::Failed(f.clone())),
            _ => Ok(()),
        }
    }

    /// The store's identity (random at mkfs; also in every superblock and WAL header).
    pub fn store_id(&self) -> [u8; 16] {
        self.sh.store_id
    }

    /// Whether making the submitted transactions durable now would wait for a data device:
    /// large writes written once are queued or being written (see `direct.rs`). A caller that
    /// must not block on a data device (an OSD shard's event loop) syncs elsewhere then.
    pub fn sync_waits_for_data_device(&self) -> bool {
        if self.sh.cfg.direct_write_min_bytes == 0 {
            return false; // no direct writes: no lock taken per sync
        }
        let wq = self.sh.wal_lock();
        !wq.direct_jobs.is_empty() || wq.writing_direct
    }

    /// Whether a primary may admit a client write of `bytes` (`metadata`: a small whole
    /// object, which may use most of the reserve); `NoSpace` when the write would not fit
    /// with the headroom its kind leaves free. The copies the write then commits are marked
    /// [`Transaction::replicated`], so a member that filled up to this point still takes
    /// them.
    pub fn admits(&self, bytes: u64, metadata: bool) -> Result<()> {
        let st = self.sh.lock();
        let room = crate::commit::room_blocks(&self.sh, &st, metadata, false);
        let needed = bytes.div_ceil(BLOCK);
        if needed > room {
            return Err(StoreError::NoSpace {
                needed: needed * BLOCK,
                available: room * BLOCK,
            });
        }
        Ok(())
    }

    /// Bytes a primary would still admit: of ordinary data, of small metadata.
    pub fn admissible_bytes(&self) -> (u64, u64) {
        let st = self.sh.lock();
        let room = |metadata| crate::commit::room_blocks(&self.sh, &st, metadata, false) * BLOCK;
        (room(false), room(true))
    }

    /// Counters and space usage.
    pub fn stats(&self) -> StoreStats {
        let objects = self.sh.colls.object_count();
        let st = self.sh.lock();
        StoreStats {
            data_io: self.sh.data.counters.get(),
            wal_io: self.sh.wal_counters.get(),
            commits: st.commits,
            checkpoints: st.checkpoints,
            segments_total: st.segs.count(),
            capacity_bytes: self.sh.data_blocks * BLOCK_SIZE as u64,
            writable_bytes: crate::commit::client_writable_blocks(&self.sh, &st) * BLOCK,
            used_bytes: crate::commit::used_blocks(&st) * BLOCK,
            read_cache: self
                .sh
                .data
                .cache
                .as_ref()
                .map(|c| c.stats())
                .unwrap_or_default(),
            segments_free: st.segs.free_segments(),
            segments_cleaned: st.cleaned_segments,
            cleaned_bytes: st.cleaned_bytes,
            live_bytes: st.segs.live_blocks() * BLOCK,
            pending_bytes: st.pending_blocks * BLOCK,
            pending_limit_bytes: self.sh.pending_limit_blocks() * BLOCK,
            checkpoint_write_micros: micros(st.ckpt_write_time),
            checkpoint_flush_micros: micros(st.ckpt_flush_time),
            checkpoint_bytes: st.segs.ckpt_blocks_total() * BLOCK,
            wal_used_bytes: self.sh.wal_lock().used(),
            wal_size: self.sh.wal.ring_size,
            waits_for_flusher: st.waits_for_flusher,
            waits_for_wal_space: st.waits_for_wal_space,
            direct_writes: st.direct_writes,
            direct_bytes: st.direct_bytes,
            direct_staged_bytes: self.sh.copies.get().direct_staged_bytes,
            copies: self.sh.copies.get(),
            index_bytes: index_bytes(&st, objects),
            lock_waits: self.sh.lock_waits.get(),
            wal_lock_waits: self.sh.wal_lock_waits.get(),
            coll_lock_waits: self.sh.colls.waits.get(),
            coll_lock_waits_background: self.sh.colls.background_waits.get(),
        }
    }

    /// WAL device writes so far (a caller that times a sync can tell whether it wrote, or
    /// found its records already written).
    pub fn wal_writes(&self) -> u64 {
        self.sh
            .wal_counters
            .writes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the read cache's capacity (none if the store was opened without a cache): a
    /// smaller one drops the blocks beyond it at once.
    pub fn set_read_cache_bytes(&self, bytes: u64) {
        if let Some(c) = &self.sh.data.cache {
            c.set_capacity(bytes);
        }
    }

    /// Writes all pending data and takes a checkpoint now; returns when it is durable.
    pub fn checkpoint(&self) -> Result<()> {
        let mut st = self.sh.lock();
        let target = st.checkpoints + 1;
        st.ckpt_wanted = true;
        self.sh.maint_cv.notify_all();
        while st.checkpoints < target {
            if let Some(f) = &st.failed {
                return Err(StoreError::Failed(f.clone()));
            }
            st.cv_waiters += 1;
            st = self.sh.space_cv.wait_or_die(st);
            st.cv_waiters -= 1;
        }
        Ok(())
    }

    /// Cross-checks the space accounting against the index (for tests): every block an
    /// extent points at must be accounted live in a segment that cannot be reused.
    #[doc(hidden)]
    pub fn check_space_accounting(&self) -> std::result::Result<(), String> {
        // The table held exclusively: no commit or relocation is half-accounted.
        let mut table = self.sh.colls.write();
        let index = crate::colls::snapshot(&mut table);
        let st = self.sh.lock();
        let mut refs = Vec::new();
        index.for_each_disk_extent(|_, _, _, e, off| refs.push((off, e.nblocks)));
        st.segs.check_refs(&refs)
    }

    /// Where a block of an object is on the data devices, if it has been written there
    /// (for fault-injection tests).
    #[doc(hidden)]
    pub fn block_location(&self, coll: CollId, obj: &[u8], block: u64) -> Option<u64> {
        self.sh.colls.with(coll, |c| {
            let o = c?.objects.get(obj)?;
            match o.extents_in(block, block + 1).first()?.1.loc {
                crate::index::Loc::Disk(off) => Some(off),
                crate::index::Loc::Mem(_) => None,
            }
        })
    }

    /// The error that stopped the store, if any.
    pub fn failure(&self) -> Option<String> {
        self.sh.lock().failed.clone()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = self.stop(false);
        }
    }
}
