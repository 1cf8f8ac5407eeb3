//! Which peers said their store is full (`RepReply::DoneButFull`), so that a primary stops
//! admitting writes they could not take. A replica must take every write its primary applied
//! (else its copy falls behind with no room to catch up); the store keeps headroom for those
//! copies, and this keeps primaries from using it up. See "A full store" in
//! `docs/format/wire.md`.

use cairn_failstop::LockOrDie;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a peer's "full" holds without news: then one write goes through and asks again
/// (space freed by another primary's removes reaches this primary no other way).
const HOLDS_FOR: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
struct Mark {
    metadata_too: bool,
    at: Instant,
}

/// Peers whose last answer said "full", by OSD id.
#[derive(Debug, Default)]
pub struct FullMembers {
    /// Whether any mark may hold: writes take the lock only then.
    any: AtomicBool,
    marks: Mutex<HashMap<u32, Mark>>,
}

impl FullMembers {
    /// Records a peer's answer to a replicated write: full (for data, or for metadata too) or
    /// not.
    pub fn note(&self, peer: u32, full: Option<bool>) {
        if full.is_none() && !self.any.load(Ordering::Relaxed) {
            return;
        }
        let mut marks = self.marks.lock_or_die();
        match full {
            Some(metadata_too) => {
                if !marks.contains_key(&peer) {
                    tracing::warn!(
                        peer,
                        metadata_too,
                        "a replica is full: refusing new writes to the PGs it serves"
                    );
                }
                let at = Instant::now();
                marks.insert(peer, Mark { metadata_too, at });
            }
            None => {
                if marks.remove(&peer).is_some() {
                    tracing::info!(peer, "a replica has room again");
                }
            }
        }
        self.any.store(!marks.is_empty(), Ordering::Relaxed);
    }

    /// The first of `members` known full for a write of this kind (`metadata`: a small whole
    /// object), if any.
    pub fn full_member(&self, members: &[u32], metadata: bool) -> Option<u32> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let mut marks = self.marks.lock_or_die();
        let now = Instant::now();
        marks.retain(|_, m| now.duration_since(m.at) < HOLDS_FOR);
        self.any.store(!marks.is_empty(), Ordering::Relaxed);
        members.iter().copied().find(|m| {
            marks
                .get(m)
                .is_some_and(|mark| !metadata || mark.metadata_too)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_mark_refuses_its_kind_until_the_peer_has_room_again() {
        let f = FullMembers::default();
        assert_eq!(f.full_member(&[1, 2], false), None);
        f.note(2, Some(false));
        assert_eq!(f.full_member(&[1, 2], false), Some(2));
        // Full for data only: small metadata still goes.
        assert_eq!(f.full_member(&[1, 2], true), None);
        assert_eq!(f.full_member(&[1, 3], false), None);
        f.note(2, Some(true));
        assert_eq!(f.full_member(&[2], true), Some(2));
        f.note(2, None);
        assert_eq!(f.full_member(&[2], false), None);
        assert!(!f.any.load(Ordering::Relaxed));
    }

    #[test]
    fn a_full_mark_expires_without_news() {
        let f = FullMembers::default();
        f.note(4, Some(true));
        let old = Instant::now() - HOLDS_FOR - Duration::from_millis(1);
        f.marks.lock().unwrap().get_mut(&4).unwrap().at = old;
        assert_eq!(f.full_member(&[4], false), None);
        assert!(!f.any.load(Ordering::Relaxed));
    }
}
