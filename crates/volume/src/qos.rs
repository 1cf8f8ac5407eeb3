//! Per-volume I/O limits (`vol qos set`), enforced where the volume is served: one token
//! bucket for requests and one for bytes, shared by every connection of the serving process.
//! A request takes its tokens when it arrives, going into debt if there are too few, and
//! waits until the debt is paid off at the limit's rate: requests are admitted in arrival
//! order at exactly the rate, with bursts up to the bucket's size after a quiet spell.

use crate::snaps::Qos;
use cairn_failstop::LockOrDie;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

struct Bucket {
    rate: f64,
    size: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: u64, burst: u64, now: Instant) -> Option<Bucket> {
        (rate > 0).then(|| {
            let size = if burst > 0 { burst } else { rate } as f64;
            Bucket {
                rate: rate as f64,
                size,
                tokens: size,
                last: now,
            }
        })
    }

    /// Takes `n` tokens; how long the taker must wait for them.
    fn take(&mut self, n: f64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.size) - n;
        self.last = now;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

#[derive(Default)]
struct Buckets {
    qos: Qos,
    iops: Option<Bucket>,
    bps: Option<Bucket>,
}

/// The limiter of one open volume.
#[derive(Default)]
pub(crate) struct Limiter {
    state: Mutex<Buckets>,
}

impl Limiter {
    /// Admits one request of `bytes` under `qos` (the limits may change between calls: new
    /// limits start with full buckets); how long it must wait first.
    pub fn admit(&self, qos: &Qos, bytes: u64) -> Duration {
        self.admit_at(qos, bytes, Instant::now())
    }

    fn admit_at(&self, qos: &Qos, bytes: u64, now: Instant) -> Duration {
        if !qos.is_limited() {
            return Duration::ZERO;
        }
        let mut s = self.state.lock_or_die();
        if s.qos != *qos {
            *s = Buckets {
                qos: *qos,
                iops: Bucket::new(qos.iops, qos.iops_burst, now),
                bps: Bucket::new(qos.bps, qos.bps_burst, now),
            };
        }
        let ops = s.iops.as_mut().map_or(Duration::ZERO, |b| b.take(1.0, now));
        let data = s
            .bps
            .as_mut()
            .map_or(Duration::ZERO, |b| b.take(bytes as f64, now));
        ops.max(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_at_the_rate_after_the_burst() {
        let l = Limiter::default();
        let t0 = Instant::now();
        let qos = Qos {
            iops: 100,
            iops_burst: 10,
            ..Qos::default()
        };
        // The burst passes at once; then one request every 10 ms.
        for _ in 0..10 {
            assert_eq!(l.admit_at(&qos, 4096, t0), Duration::ZERO);
        }
        let waits: Vec<Duration> = (0..5).map(|_| l.admit_at(&qos, 4096, t0)).collect();
        let ms: Vec<u128> = waits.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![10, 20, 30, 40, 50]);
        // After a quiet second the bucket is full again (no more than its size).
        let t1 = t0 + Duration::from_secs(2);
        for _ in 0..10 {
            assert_eq!(l.admit_at(&qos, 4096, t1), Duration::ZERO);
        }
        assert!(l.admit_at(&qos, 4096, t1) > Duration::ZERO);
    }

    #[test]
    fn bytes_limit_large_requests_and_unlimited_is_free() {
        let l = Limiter::default();
        let t0 = Instant::now();
        let qos = Qos {
            bps: 1 << 20,
            ..Qos::default()
        };
        assert_eq!(l.admit_at(&qos, 1 << 20, t0), Duration::ZERO);
        assert_eq!(l.admit_at(&qos, 2 << 20, t0), Duration::from_secs(2));
        assert_eq!(l.admit_at(&Qos::default(), 1 << 30, t0), Duration::ZERO);
        // New limits start with full buckets.
        let more = Qos {
            bps: 2 << 20,
            ..Qos::default()
        };
        assert_eq!(l.admit_at(&more, 2 << 20, t0), Duration::ZERO);
    }
}
