//! Waits for the store's locks: how often a thread found one taken, how long it waited, and a
//! histogram of those waits (for p99 and the count over 1 ms), read by `stats()`, the OSD's
//! metrics and `cairn bench store`.
//!
//! An acquisition first tries the lock: one that is free costs what a plain `lock()` costs and
//! is not counted (nor timed: reading the clock on every acquisition would cost more than
//! most holds). Only a wait reads the clock, twice.

use cairn_failstop::LockOrDie;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// Sub-buckets per power of two of nanoseconds: a bucket's bounds are 19 % apart at most.
const SUB: usize = 4;
/// Powers of two covered: 2^10 ns (1 us) to 2^34 ns (17 s); shorter and longer waits fall
/// into the first and last bucket.
const FIRST_POW: u32 = 10;
const POWS: usize = 25;
pub const BUCKETS: usize = SUB * POWS;

/// Waits for one lock, counted since the store opened.
pub(crate) struct LockWaits {
    waits: AtomicU64,
    wait_nanos: AtomicU64,
    max_nanos: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl Default for LockWaits {
    fn default() -> Self {
        LockWaits {
            waits: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
            max_nanos: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl LockWaits {
    /// Locks `m`, recording the wait if it was taken. A poisoned lock panics (fail stop).
    #[track_caller]
    pub fn lock<'a, T>(&self, m: &'a Mutex<T>) -> MutexGuard<'a, T> {
        match m.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(_)) => m.lock_or_die(),
            Err(TryLockError::WouldBlock) => {
                let start = Instant::now();
                let g = m.lock_or_die();
                self.record(start.elapsed());
                g
            }
        }
    }

    fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.wait_nanos.fetch_add(ns, Ordering::Relaxed);
        self.max_nanos.fetch_max(ns, Ordering::Relaxed);
        self.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> LockWaitStats {
        LockWaitStats {
            waits: self.waits.load(Ordering::Relaxed),
            wait_nanos: self.wait_nanos.load(Ordering::Relaxed),
            max_nanos: self.max_nanos.load(Ordering::Relaxed),
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < 1 << FIRST_POW {
        return 0;
    }
    let pow = 63 - ns.leading_zeros(); // ns in [2^pow, 2^(pow+1))
    let sub = ((ns >> (pow - 2)) & (SUB as u64 - 1)) as usize;
    let i = (pow - FIRST_POW) as usize * SUB + sub;
    i.min(BUCKETS - 1)
}

/// The upper bound of a bucket, in nanoseconds.
fn bucket_top(i: usize) -> u64 {
    let pow = FIRST_POW + (i / SUB) as u32;
    let sub = (i % SUB) as u64;
    (1u64 << pow) + (sub + 1) * (1u64 << (pow - 2))
}

/// Waits for a lock since the store opened (or, after [`LockWaitStats::since`], over a span).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockWaitStats {
    /// Acquisitions that found the lock taken and waited.
    pub waits: u64,
    /// Their waits, summed.
    pub wait_nanos: u64,
    /// The longest wait since the store opened (not reset by `since`).
    pub max_nanos: u64,
    /// Waits by length: [`LockWaitStats::quantile_nanos`], [`LockWaitStats::over_nanos`].
    pub buckets: Vec<u64>,
}

impl LockWaitStats {
    /// The waits between `earlier` and `self`.
    pub fn since(&self, earlier: &LockWaitStats) -> LockWaitStats {
        LockWaitStats {
            waits: self.waits.saturating_sub(earlier.waits),
            wait_nanos: self.wait_nanos.saturating_sub(earlier.wait_nanos),
            max_nanos: self.max_nanos,
            buckets: self
                .buckets
                .iter()
                .enumerate()
                .map(|(i, b)| b.saturating_sub(earlier.buckets.get(i).copied().unwrap_or(0)))
                .collect(),
        }
    }

    /// The wait length that the fraction `q` of the waits do not exceed (to within 19 %,
    /// rounded up); 0 without waits.
    pub fn quantile_nanos(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= want {
                return bucket_top(i);
            }
        }
        bucket_top(BUCKETS - 1)
    }

    /// Waits longer than `ns` (counted by bucket: a bucket straddling `ns` counts as over).
    pub fn over_nanos(&self, ns: u64) -> u64 {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(i, _)| bucket_top(*i) > ns)
            .map(|(_, b)| b)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn buckets_cover_the_range_in_order_and_bound_their_waits() {
        let mut last = 0;
        for i in 0..BUCKETS {
            assert!(bucket_top(i) > last, "bucket {i}");
            last = bucket_top(i);
        }
        for ns in [
            1_000u64,
            1_024,
            1_500,
            999_999,
            1_000_000,
            1_300_000,
            7 << 30,
        ] {
            let i = bucket_of(ns);
            assert!(
                bucket_top(i) >= ns,
                "{ns} in bucket {i} up to {}",
                bucket_top(i)
            );
            assert!(i == 0 || bucket_top(i - 1) <= ns, "{ns} belongs lower");
            // Waits under 1 us share the first bucket.
            let floor = ns.max(1 << FIRST_POW) as f64;
            assert!(
                bucket_top(i) as f64 <= floor * 1.26,
                "{ns}: bucket too coarse"
            );
        }
    }

    #[test]
    fn a_free_lock_is_not_counted_and_a_held_one_is_timed() {
        let w = LockWaits::default();
        let m = Arc::new(Mutex::new(0u32));
        drop(w.lock(&m));
        assert_eq!(w.get().waits, 0);

        let held = m.lock().unwrap();
        let m2 = m.clone();
        let w = Arc::new(w);
        let w2 = w.clone();
        let started = Arc::new(std::sync::Barrier::new(2));
        let started2 = started.clone();
        let t = std::thread::spawn(move || {
            started2.wait();
            *w2.lock(&m2) += 1
        });
        // The waiter finds the lock taken: it is held from before the waiter starts until
        // 30 ms after.
        started.wait();
        std::thread::sleep(Duration::from_millis(30));
        drop(held);
        t.join().unwrap();
        let s = w.get();
        assert_eq!(s.waits, 1);
        assert!(s.wait_nanos >= 20_000_000, "waited {} ns", s.wait_nanos);
        assert_eq!(s.over_nanos(1_000_000), 1);
        assert!(s.quantile_nanos(0.99) >= s.wait_nanos);
        let none = s.since(&s);
        assert_eq!((none.waits, none.over_nanos(0)), (0, 0));
        assert_eq!(none.quantile_nanos(0.99), 0);
    }
}
