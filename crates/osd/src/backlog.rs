//! Bounded shard queues: the bytes connections have queued for each shard and not yet handed
//! to it. A connection stops reading while a shard is over the bound (what it had held back
//! goes out first), so a client that sends faster than a shard serves grows no queue without
//! limit: the bound is [`SHARD_BACKLOG`] per shard, plus at most one frame per connection.
//! Messages the OSD queues itself (timers, completions, peering) are not counted: they are
//! bounded by the work in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Bytes of requests queued for one shard before the connections feeding it wait.
pub const SHARD_BACKLOG: usize = 64 << 20;

/// What a queued message costs beyond its payload (the message, its reply handle, the
/// channel slot), so a flood of empty requests is bounded too.
pub const MESSAGE_OVERHEAD: usize = 512;

/// One shard's backlog.
pub struct Backlog {
    bytes: AtomicUsize,
    limit: usize,
    room: Notify,
}

impl Backlog {
    /// An empty backlog bounded at `limit` bytes.
    pub fn new(limit: usize) -> Backlog {
        Backlog {
            bytes: AtomicUsize::new(0),
            limit,
            room: Notify::new(),
        }
    }

    /// Counts `n` bytes queued.
    pub fn add(&self, n: usize) {
        self.bytes.fetch_add(n, Ordering::AcqRel);
    }

    /// Counts `n` bytes taken by the shard; wakes the waiting connections when that makes
    /// room.
    pub fn sub(&self, n: usize) {
        let before = self.bytes.fetch_sub(n, Ordering::AcqRel);
        if before > self.limit && before.saturating_sub(n) <= self.limit {
            self.room.notify_waiters();
        }
    }

    /// Bytes queued now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// Whether connections must wait before queueing more.
    pub fn over(&self) -> bool {
        self.bytes() > self.limit
    }

    /// Returns once the backlog is within its bound.
    pub async fn wait_room(&self) {
        loop {
            let notified = self.room.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a `sub` between the check and the wait is not
            // missed.
            notified.as_mut().enable();
            if !self.over() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_connection_resumes_when_the_shard_makes_room() {
        let b = Arc::new(Backlog::new(100));
        b.add(60);
        assert!(!b.over());
        b.wait_room().await;
        b.add(60);
        assert!(b.over());
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.wait_room().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "waits while over the bound");
        b.sub(10);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "110 bytes are still over 100");
        b.sub(20);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken once within the bound")
            .expect("waiter");
        assert_eq!(b.bytes(), 90);
    }

    /// Many waiters and a shard draining concurrently: every waiter ends (no lost wake-up).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_waiter_is_forgotten_under_concurrent_draining() {
        for _ in 0..200 {
            let b = Arc::new(Backlog::new(10));
            b.add(11);
            let waiters: Vec<_> = (0..4)
                .map(|_| {
                    let b = b.clone();
                    tokio::spawn(async move { b.wait_room().await })
                })
                .collect();
            let drain = {
                let b = b.clone();
                tokio::spawn(async move { b.sub(1) })
            };
            drain.await.expect("drain");
            for w in waiters {
                tokio::time::timeout(Duration::from_secs(5), w)
                    .await
                    .expect("a waiter was not woken")
                    .expect("waiter");
            }
        }
    }
}
