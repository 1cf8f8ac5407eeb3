//! Counters of the bytes this process's connections copied in memory on their way in and out
//! (an OSD reports them in `OSD_STATS`; docs/operator/cluster.md "Copy by copy" says where each
//! copy is and why). Process-wide: every connection adds to the same counters.

use std::sync::atomic::{AtomicU64, Ordering};

static RECEIVED: AtomicU64 = AtomicU64::new(0);
static RECEIVE_COPIED: AtomicU64 = AtomicU64::new(0);
static QUEUE_COPIED: AtomicU64 = AtomicU64::new(0);
static QUEUE_HELD: AtomicU64 = AtomicU64::new(0);

/// What the counters hold at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyTally {
    /// Frame bytes read from sockets through a receive buffer ([`crate::ConnReader`] and the
    /// sessions' readers), headers included.
    pub received_bytes: u64,
    /// Of those, bytes copied out of the receive buffer into the frame's own buffers (a small
    /// frame comes in with others in one receive call, then is copied; a large data part is
    /// read straight into its buffer and not counted).
    pub receive_copied_bytes: u64,
    /// Data-part bytes copied into a sender's queue (a frame the socket could not take at once,
    /// or held back for a batch, whose payload was borrowed or small).
    pub queue_copied_bytes: u64,
    /// Data-part bytes queued by reference instead ([`crate::FrameSender::send_held`]).
    pub queue_held_bytes: u64,
}

/// The counters now.
pub fn tally() -> CopyTally {
    CopyTally {
        received_bytes: RECEIVED.load(Ordering::Relaxed),
        receive_copied_bytes: RECEIVE_COPIED.load(Ordering::Relaxed),
        queue_copied_bytes: QUEUE_COPIED.load(Ordering::Relaxed),
        queue_held_bytes: QUEUE_HELD.load(Ordering::Relaxed),
    }
}

pub(crate) fn received(bytes: usize, copied: usize) {
    RECEIVED.fetch_add(bytes as u64, Ordering::Relaxed);
    if copied > 0 {
        RECEIVE_COPIED.fetch_add(copied as u64, Ordering::Relaxed);
    }
}

pub(crate) fn queued(copied: usize, held: usize) {
    if copied > 0 {
        QUEUE_COPIED.fetch_add(copied as u64, Ordering::Relaxed);
    }
    if held > 0 {
        QUEUE_HELD.fetch_add(held as u64, Ordering::Relaxed);
    }
}
