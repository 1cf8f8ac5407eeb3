//! The store's tunables.

use std::time::Duration;

/// Tunables. Fields marked "format" are fixed when the devices are formatted.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Format: segment size in bytes (multiple of 4 KiB). Default 4 MiB.
    pub segment_size: u64,
    /// Format: WAL size when the WAL lives on data device 0. Default 256 MiB.
    pub wal_size: u64,
    /// Pending data that triggers a segment write. Default 1 MiB.
    pub flush_batch_bytes: u64,
    /// Most data that may wait in memory for the flusher; commits wait beyond it, and a
    /// transaction may carry at most this much data. Default 16 MiB; at most 1/16 of the data
    /// area is used.
    pub pending_limit_bytes: u64,
    /// Longest time data waits in memory before it is written to a segment. Default 50 ms.
    pub flush_max_delay: Duration,
    /// WAL fill level (percent) that triggers a checkpoint. Default 50.
    pub checkpoint_wal_percent: u8,
    /// A checkpoint is also taken this often when the WAL is not empty. Default 30 s.
    pub checkpoint_interval: Duration,
    /// Serve reads of a mirror from the device that is not flushing. Default true.
    pub read_flush_separation: bool,
    /// Memory for the read cache of data blocks (blocks just flushed and blocks read from the
    /// data devices); 0 turns it off. Default 128 MiB.
    pub read_cache_bytes: u64,
    /// The cleaner runs at full speed when fewer segments than this are free beyond the
    /// flusher's reserve (it starts earlier, throttled: `maint::cleaner_pace`). Default 8.
    pub clean_below_free_segments: u32,
    /// Cleaner copy rate while it cleans ahead (above `clean_below_free_segments`), bytes
    /// per second. Default 64 MiB/s.
    pub clean_rate: u64,
    /// Segments kept free for the cleaner and checkpoints; writes get ENOSPC before
    /// touching them. Default 4.
    pub reserve_segments: u32,
    /// Writes of whole blocks at least this large go straight to the data devices (data
    /// written once, then only their metadata through the WAL; the WAL batch that carries
    /// them flushes the data devices first) instead of through the WAL and the flusher; 0
    /// turns this off. Default 0: durability then waits for the data device's write and
    /// flush, which pays where it takes large blocks about as fast as the WAL
    /// (docs/operator/store.md).
    pub direct_write_min_bytes: u64,
    /// Records written to the WAL device without a flush ([`crate::Store::write_through`]:
    /// what a pool with `memory` durability acknowledges) are flushed at most this long after
    /// they were written. Default 5 ms.
    pub wal_flush_delay: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            segment_size: 4 << 20,
            wal_size: 256 << 20,
            flush_batch_bytes: 1 << 20,
            pending_limit_bytes: 16 << 20,
            flush_max_delay: Duration::from_millis(50),
            checkpoint_wal_percent: 50,
            checkpoint_interval: Duration::from_secs(30),
            read_flush_separation: true,
            read_cache_bytes: 128 << 20,
            clean_below_free_segments: 8,
            clean_rate: 64 << 20,
            reserve_segments: 4,
            direct_write_min_bytes: 0,
            wal_flush_delay: Duration::from_millis(5),
        }
    }
}
