//! Recovery accounting (for `cairn status`) and pacing against client I/O.
//!
//! Pacing: at most `max_active` object copies run at once over all the PGs of this OSD (each
//! holds a slot); after each copy, if clients sent ops to this OSD meanwhile, the copy keeps
//! its slot for a pause so that recovery takes at most `share` of the time (`share` 0.5: it
//! pauses as long as the copy took). Without client ops it runs at full speed.

use cairn_failstop::LockOrDie;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest pause between two recovery steps.
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// Window the rates are measured over.
const RATE_WINDOW: usize = 5;

pub struct Recovery {
    /// Objects copied (to or from this OSD) since it started.
    pub objects: AtomicU64,
    /// Object bytes sent or applied by recovery, backfill or scrub repair.
    pub bytes: AtomicU64,
    /// Objects the recoveries under way still have to copy.
    pending: AtomicU64,
    /// Client ops received (pacing looks at whether it moves).
    client_ops: AtomicU64,
    /// Fraction of the time recovery may take while clients are active (0 < share <= 1).
    share: f64,
    /// Pause after every step, whatever the load.
    sleep: Duration,
    /// (objects, bytes) once a second, newest last.
    samples: Mutex<VecDeque<(u64, u64)>>,
    /// Copies that may run at once.
    slots: tokio::sync::Semaphore,
}

/// Rates and work left, for `OSD_STATS`.
pub struct Progress {
    pub pending_objects: u64,
    pub bytes_per_sec: u64,
    pub objects_per_sec: u64,
}

impl Recovery {
    pub fn new(share: f64, sleep: Duration, max_active: u32) -> Recovery {
        Recovery {
            objects: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            client_ops: AtomicU64::new(0),
            share: if share > 0.0 && share <= 1.0 {
                share
            } else {
                1.0
            },
            sleep,
            samples: Mutex::new(VecDeque::new()),
            slots: tokio::sync::Semaphore::new(max_active.max(1) as usize),
        }
    }

    /// Waits for a free copy slot; the copy (and its pause) holds it until dropped.
    pub async fn slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        // Never closed: `None` cannot happen, and would only mean "unlimited".
        self.slots.acquire().await.ok()
    }

    pub fn note_client_op(&self) {
        self.client_ops.fetch_add(1, Ordering::Relaxed);
    }

    /// Records that `n` objects are to be copied; the guard counts them down.
    pub fn plan(&self, n: u64) -> Pending<'_> {
        self.pending.fetch_add(n, Ordering::Relaxed);
        Pending { rec: self, left: n }
    }

    /// A point to measure one recovery step from.
    pub fn step(&self) -> Step {
        Step {
            started: Instant::now(),
            client_ops: self.client_ops.load(Ordering::Relaxed),
        }
    }

    /// Waits as pacing asks after the step begun at `s`.
    pub async fn pace(&self, s: Step) {
        let p = self.pause_after(&s).unwrap_or_default() + self.sleep;
        if !p.is_zero() {
            tokio::time::sleep(p).await;
        }
    }

    /// How long to pause after step `s`: none unless clients sent ops meanwhile.
    fn pause_after(&self, s: &Step) -> Option<Duration> {
        if self.share >= 1.0 || self.client_ops.load(Ordering::Relaxed) == s.client_ops {
            return None;
        }
        let took = s.started.elapsed().as_secs_f64();
        let pause = Duration::from_secs_f64(took * (1.0 - self.share) / self.share);
        Some(pause.min(MAX_PAUSE))
    }

    /// Takes this second's sample (called once a second).
    pub fn tick(&self) {
        let now = (
            self.objects.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        );
        let mut s = self.samples.lock_or_die();
        s.push_back(now);
        while s.len() > RATE_WINDOW + 1 {
            s.pop_front();
        }
    }

    pub fn progress(&self) -> Progress {
        let s = self.samples.lock_or_die();
        let (objects_per_sec, bytes_per_sec) = match (s.front(), s.back()) {
            (Some(a), Some(b)) if s.len() > 1 => {
                let secs = (s.len() - 1) as u64;
                ((b.0 - a.0) / secs, (b.1 - a.1) / secs)
            }
            _ => (0, 0),
        };
        Progress {
            pending_objects: self.pending.load(Ordering::Relaxed),
            bytes_per_sec,
            objects_per_sec,
        }
    }
}

/// The start of one recovery step.
pub struct Step {
    started: Instant,
    client_ops: u64,
}

/// Objects a recovery still has to copy; what is left when it ends (done or not) is taken
/// off the pending count.
pub struct Pending<'a> {
    rec: &'a Recovery,
    left: u64,
}

impl Pending<'_> {
    /// One object copied.
    pub fn done_one(&mut self) {
        if self.left > 0 {
            self.left -= 1;
            self.rec.pending.fetch_sub(1, Ordering::Relaxed);
        }
        self.rec.objects.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.rec.pending.fetch_sub(self.left, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_counts_down_and_is_released_when_a_recovery_ends_early() {
        let r = Recovery::new(0.5, Duration::ZERO, 1);
        {
            let mut p = r.plan(3);
            assert_eq!(r.progress().pending_objects, 3);
            p.done_one();
            assert_eq!(r.progress().pending_objects, 2);
        }
        assert_eq!(r.progress().pending_objects, 0);
        assert_eq!(r.objects.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn rates_come_from_the_last_seconds() {
        let r = Recovery::new(0.5, Duration::ZERO, 1);
        assert_eq!(r.progress().bytes_per_sec, 0);
        for i in 0..10u64 {
            r.bytes.store(i * 1000, Ordering::Relaxed);
            r.objects.store(i * 2, Ordering::Relaxed);
            r.tick();
        }
        let p = r.progress();
        assert_eq!((p.bytes_per_sec, p.objects_per_sec), (1000, 2));
    }

    #[tokio::test]
    async fn no_more_copies_run_at_once_than_slots() {
        let r = Recovery::new(0.5, Duration::ZERO, 2);
        let a = r.slot().await;
        let _b = r.slot().await;
        let third = tokio::time::timeout(Duration::from_millis(50), r.slot()).await;
        assert!(third.is_err(), "a third copy got a slot");
        drop(a);
        let third = tokio::time::timeout(Duration::from_millis(50), r.slot()).await;
        assert!(third.is_ok(), "a freed slot was not handed on");
    }

    #[test]
    fn recovery_pauses_only_while_clients_are_active() {
        let r = Recovery::new(0.25, Duration::ZERO, 1);
        let s = r.step();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(r.pause_after(&s), None, "no client ops: no pause");
        r.note_client_op();
        let p = r.pause_after(&s).expect("a pause");
        // A quarter of the time for recovery: three times as long paused as it worked.
        assert!(p >= Duration::from_millis(60), "{p:?}");
        assert!(p <= MAX_PAUSE);
        let full = Recovery::new(1.0, Duration::ZERO, 1);
        let s = full.step();
        full.note_client_op();
        assert_eq!(full.pause_after(&s), None, "share 1: never paused");
    }
}
