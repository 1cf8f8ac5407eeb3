//! The primary's read lease: an OSD serves client ops only while the monitors have heard
//! from it recently.
//!
//! The monitors mark an OSD down `grace` (4 s by default) after the last heartbeat they
//! received; only then can another OSD become primary of its PGs. An OSD counts its lease
//! from the moment it *sent* a heartbeat the leader accepted, and the lease is shorter than
//! the grace, so an OSD cut off from the monitors (a network partition) stops serving before
//! any new primary can start: a client that can still reach it never reads data the new
//! primary has already overwritten. Writes are safe without it (every acting member must
//! acknowledge), reads are not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Checked on every client op by every shard: atomics, no lock.
pub struct Lease {
    length: Duration,
    /// Times are nanoseconds since `base`.
    base: Instant,
    /// When the lease ends (0: never granted).
    until_ns: AtomicU64,
    /// The monitors' OSD grace in milliseconds, as their last accepted heartbeat said.
    grace_ms: AtomicU64,
}

/// The monitors' grace until one says otherwise.
const DEFAULT_GRACE: Duration = Duration::from_secs(4);

impl Lease {
    pub fn new(length: Duration) -> Lease {
        Lease {
            length,
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
            grace_ms: AtomicU64::new(DEFAULT_GRACE.as_millis() as u64),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// The monitors accepted a heartbeat sent at `sent`; they mark this OSD down `grace`
    /// after the last one they receive. The lease ends at half the grace if that is sooner.
    pub fn renew(&self, sent: Instant, grace: Duration) {
        self.grace_ms
            .store(grace.as_millis() as u64, Ordering::Relaxed);
        let new = self.ns(sent + self.length.min(grace / 2));
        // An older heartbeat answered late never shortens it.
        self.until_ns.fetch_max(new, Ordering::AcqRel);
    }

    /// The monitors' OSD grace (how long they wait for a heartbeat).
    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms.load(Ordering::Relaxed))
    }

    /// Whether client ops may be served now.
    pub fn valid(&self) -> bool {
        self.valid_at(Instant::now())
    }

    fn valid_at(&self, now: Instant) -> bool {
        self.ns(now) < self.until_ns.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_runs_from_the_accepted_heartbeat_send_time() {
        let l = Lease::new(Duration::from_secs(2));
        let t0 = Instant::now();
        assert!(!l.valid_at(t0), "no heartbeat accepted yet");
        let grace = Duration::from_secs(4);
        l.renew(t0, grace);
        assert!(l.valid_at(t0 + Duration::from_millis(1999)));
        assert!(!l.valid_at(t0 + Duration::from_secs(2)));
        // An older heartbeat answered late never shortens it.
        l.renew(t0 + Duration::from_secs(1), grace);
        l.renew(t0, grace);
        assert!(l.valid_at(t0 + Duration::from_millis(2999)));
        assert!(!l.valid_at(t0 + Duration::from_secs(3)));
        // Monitors with a short grace shorten the lease to half of it.
        let l = Lease::new(Duration::from_secs(2));
        l.renew(t0, Duration::from_millis(1000));
        assert!(l.valid_at(t0 + Duration::from_millis(499)));
        assert!(!l.valid_at(t0 + Duration::from_millis(500)));
    }
}
