//! Counters of the object bytes the store copies in memory, by where (docs/operator/cluster.md
//! "Copy by copy" says why each copy is there).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of object data the store copied in memory since it opened, by where.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Payloads laid into WAL batches: the one copy of a small write on its way to the WAL
    /// (the batch is one aligned device write).
    pub wal_batch_bytes: u64,
    /// Whole blocks built for writes that cover part of a block (the old edge blocks read,
    /// the new bytes laid over them); aligned writes build none.
    pub partial_block_bytes: u64,
    /// Data the flusher laid into its staging buffer to write it to its place.
    pub flush_staged_bytes: u64,
    /// Large (direct) writes copied into an aligned buffer first, their payload not being
    /// where the data devices' `O_DIRECT` needs it in memory.
    pub direct_staged_bytes: u64,
}

#[derive(Default)]
pub(crate) struct CopyCounters {
    pub wal_batch: AtomicU64,
    pub partial_block: AtomicU64,
    pub flush_staged: AtomicU64,
    pub direct_staged: AtomicU64,
}

impl CopyCounters {
    pub fn add(counter: &AtomicU64, bytes: usize) {
        counter.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn get(&self) -> CopyStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CopyStats {
            wal_batch_bytes: g(&self.wal_batch),
            partial_block_bytes: g(&self.partial_block),
            flush_staged_bytes: g(&self.flush_staged),
            direct_staged_bytes: g(&self.direct_staged),
        }
    }
}
