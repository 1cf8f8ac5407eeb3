//! What one connection's requests hold on a server while it works on them: a cap on the
//! requests in flight per connection and on the bytes they carry or will be answered with,
//! so one peer cannot fill a server's memory with work that waits (writes held up by a slow
//! replica, ops queued behind peering). The server reads nothing more from a connection over
//! its cap until some of its requests are done.
//!
//! A request is counted from when it is read until every reply handle made for it
//! ([`FrameSender::for_request`](crate::FrameSender::for_request)) is dropped: whoever ends a
//! request (answers it, refuses it, or drops it) ends its count, with no bookkeeping of its
//! own.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// A server's per-connection caps (`cairn osd run` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Requests in flight on one connection (`--max-requests-per-connection`, default 1024).
    pub max_requests: usize,
    /// Bytes those requests carry plus the bytes they ask to read
    /// (`--max-bytes-per-connection`, default 64 MiB).
    pub max_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_requests: 1024,
            max_bytes: 64 << 20,
        }
    }
}

/// What a request costs beyond its bytes (its message, reply handle, queue slot), so that a
/// flood of empty requests counts too.
pub const REQUEST_OVERHEAD: usize = 256;

/// One connection's requests in flight.
#[derive(Debug)]
pub struct ConnLoad {
    limits: RequestLimits,
    requests: AtomicUsize,
    bytes: AtomicUsize,
    /// Set while the connection waits for room, so that requests ending otherwise wake no
    /// one (the common case costs two atomic subtractions).
    waiting: AtomicBool,
    freed: Notify,
}

/// One request's share of its connection's load; dropping the last handle holding it ends
/// the request's count.
#[derive(Debug)]
pub struct RequestTicket {
    load: Arc<ConnLoad>,
    bytes: usize,
}

impl Drop for RequestTicket {
    fn drop(&mut self) {
        let l = &self.load;
        l.bytes.fetch_sub(self.bytes, Ordering::SeqCst);
        l.requests.fetch_sub(1, Ordering::SeqCst);
        if l.waiting.load(Ordering::SeqCst) {
            l.freed.notify_waiters();
        }
    }
}

impl ConnLoad {
    /// An idle connection's load, capped by `limits`.
    pub fn new(limits: RequestLimits) -> Arc<ConnLoad> {
        Arc::new(ConnLoad {
            limits,
            requests: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            waiting: AtomicBool::new(false),
            freed: Notify::new(),
        })
    }

    /// Counts a request of `bytes` (what it carries plus what it will be answered with).
    pub fn ticket(self: &Arc<Self>, bytes: usize) -> Arc<RequestTicket> {
        let bytes = bytes.saturating_add(REQUEST_OVERHEAD);
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        Arc::new(RequestTicket {
            load: self.clone(),
            bytes,
        })
    }

    /// Requests in flight now.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Bytes of the requests in flight now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    /// Whether the connection must wait before its next request is read. One request is
    /// always let in, however large, or a request over the byte cap could never run.
    pub fn over(&self) -> bool {
        let n = self.requests();
        n > 0 && (n >= self.limits.max_requests || self.bytes() >= self.limits.max_bytes)
    }

    /// Returns once the connection is within its caps.
    pub async fn wait_room(&self) {
        // The flag is set, and the wake-up registered, before the check: a request that
        // ends in between either sees the flag or is seen by the check.
        self.waiting.store(true, Ordering::SeqCst);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if !self.over() {
                break;
            }
            freed.await;
        }
        self.waiting.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn load(max_requests: usize, max_bytes: usize) -> Arc<ConnLoad> {
        ConnLoad::new(RequestLimits {
            max_requests,
            max_bytes,
        })
    }

    #[test]
    fn a_request_counts_until_its_last_handle_is_dropped() {
        let l = load(2, 1 << 20);
        let a = l.ticket(100);
        let a2 = a.clone();
        assert_eq!((l.requests(), l.bytes()), (1, 100 + REQUEST_OVERHEAD));
        drop(a);
        assert_eq!(l.requests(), 1, "a clone still holds the request");
        drop(a2);
        assert_eq!((l.requests(), l.bytes()), (0, 0));
    }

    #[test]
    fn over_either_cap_but_one_request_always_runs() {
        let l = load(2, 1000);
        let big = l.ticket(10 << 20);
        assert!(l.over(), "over the byte cap");
        drop(big);
        assert!(!l.over(), "an idle connection is never over");
        let _a = l.ticket(0);
        assert!(!l.over());
        let _b = l.ticket(0);
        assert!(l.over(), "at the request cap");
    }

    #[tokio::test]
    async fn a_waiting_connection_wakes_when_a_request_ends() {
        let l = load(1, 1 << 20);
        let t = l.ticket(0);
        let waiter = tokio::spawn({
            let l = l.clone();
            async move { l.wait_room().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "returned while over the cap");
        drop(t);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken once the request ended")
            .expect("waiter");
    }
}
