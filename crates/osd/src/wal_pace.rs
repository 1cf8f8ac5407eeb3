//! Whether a shard writes its WAL batch itself or hands it to the syncer thread.
//!
//! Writing it on the shard's own thread (run to completion) is fastest when the WAL is memory
//! (NVM, or tmpfs standing in for it): a few microseconds, less than handing the batch to
//! another thread. On a device the write takes from tens of microseconds to milliseconds,
//! during which the shard would serve nobody, not even a read its cache could answer at once.
//! So each OSD watches how long its WAL syncs take, and its shards write inline only while the
//! quickest sync of the last [`WINDOW`] stays under a bound ([`DEFAULT_INLINE_MAX`], `cairn
//! osd run --wal-inline-max-us`). The quickest, not the average: on memory a sync's time grows
//! with its batch (a large one under load, or one that was preempted, can take longer than the
//! bound) but small ones stay fast, while on a device even the smallest pays its latency.
//!
//! Handing over pays as soon as syncs take device time, not only milliseconds: on the
//! development VM, whose disk syncs a WAL batch in 60-80 us, a mixed load (4 KiB random writes
//! at queue depth 8 beside cached 4 KiB reads at depth 1, WALs on the data disks) ran 10.6-13.0k
//! writes/s and cached reads at p50 48-103 us with every sync handed over, against 7.8-8.9k and
//! 218-249 us with the shards syncing themselves (three fresh clusters each): the shard keeps
//! serving, and more writes join the next batch. Memory syncs in ~5 us, so the default bound
//! of 30 us keeps it inline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The default for the quickest WAL sync a shard still waits for itself: memory takes well
/// under this (~5 us), a disk's write well over.
pub const DEFAULT_INLINE_MAX: Duration = Duration::from_micros(30);

/// Syncs per measurement window.
pub const WINDOW: u64 = 64;

pub struct WalPace {
    /// Syncs at most this long (the quickest of a window, nanoseconds) stay on the shards.
    inline_max_ns: u64,
    /// The quickest sync of the last whole window, nanoseconds (0: no window yet).
    floor_ns: AtomicU64,
    /// The quickest of the window being measured (0: none yet; stored as `u64::MAX - ns`
    /// so that `fetch_max` keeps the minimum and a fresh 0 means empty).
    window: AtomicU64,
    syncs: AtomicU64,
    /// Syncs handed to the syncer thread because the WAL is slow.
    handed_off: AtomicU64,
}

impl WalPace {
    /// Shards sync inline while the quickest of the last window of syncs took at most
    /// `inline_max` (zero: never).
    pub fn new(inline_max: Duration) -> WalPace {
        WalPace {
            inline_max_ns: u64::try_from(inline_max.as_nanos()).unwrap_or(u64::MAX),
            floor_ns: AtomicU64::new(0),
            window: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            handed_off: AtomicU64::new(0),
        }
    }

    /// Counts a WAL sync (write, and flush if asked) that took `took`. Shards and the syncer
    /// call it without a lock; a sample that races with the end of a window may fall into
    /// either window.
    pub fn note(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos())
            .unwrap_or(u64::MAX - 1)
            .max(1);
        self.window.fetch_max(u64::MAX - ns, Ordering::Relaxed);
        if (self.syncs.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(WINDOW) {
            // Empty only if a racing sample's window end took this one's samples too.
            let w = self.window.swap(0, Ordering::Relaxed);
            if w != 0 {
                self.floor_ns.store(u64::MAX - w, Ordering::Relaxed);
            }
        }
    }

    /// Runs `sync` (a WAL sync of `store`) and counts how long it took if a WAL write happened
    /// meanwhile: one that found its records already written (by another shard's batch) took
    /// no device time and says nothing about the WAL.
    pub fn timed<R>(&self, store: &cairn_store::Store, sync: impl FnOnce() -> R) -> R {
        let (writes, t0) = (store.wal_writes(), std::time::Instant::now());
        let r = sync();
        if store.wal_writes() != writes {
            self.note(t0.elapsed());
        }
        r
    }

    /// Whether a shard should write its WAL batch itself.
    pub fn inline(&self) -> bool {
        let floor = self.floor_ns.load(Ordering::Relaxed);
        self.inline_max_ns > 0 && floor <= self.inline_max_ns
    }

    /// Counts a sync handed off because the WAL is slow.
    pub fn handed_off(&self) {
        self.handed_off.fetch_add(1, Ordering::Relaxed);
    }

    /// The quickest sync of the last window in microseconds, and the syncs handed off so far
    /// (`OSD_STATS`).
    pub fn figures(&self) -> (u64, u64) {
        (
            self.floor_ns.load(Ordering::Relaxed) / 1000,
            self.handed_off.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(p: &WalPace, f: impl Fn(u64) -> Duration) {
        (0..WINDOW).for_each(|i| p.note(f(i)));
    }

    #[test]
    fn memory_speed_syncs_stay_inline_and_device_speed_ones_move_off() {
        let p = WalPace::new(Duration::from_micros(50));
        assert!(p.inline(), "until measured");
        // Memory under load: most syncs are large batches or preempted, slower than the
        // bound, but the small ones stay fast.
        window(&p, |i| {
            Duration::from_micros(if i % 10 == 0 { 4 } else { 200 })
        });
        assert!(p.inline());
        assert_eq!(p.figures().0, 4);
        // A device: no sync is faster than its latency.
        window(&p, |i| Duration::from_micros(80 + i));
        assert!(!p.inline());
        assert_eq!(p.figures().0, 80);
        // Memory again (the syncer's measurements keep coming): inline after one window.
        window(&p, |_| Duration::from_micros(3));
        assert!(p.inline());
        // Zero: every sync goes to the syncer.
        assert!(!WalPace::new(Duration::ZERO).inline());
    }
}
