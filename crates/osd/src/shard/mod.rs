//! Shards: each is a thread running its own event loop, owning the PGs that hash to it and
//! the connections assigned to it. An op for one of its PGs arriving on one of its
//! connections runs to completion right there (no hand-off between threads); an op for
//! another shard's PG is queued to that shard. The shard's state sits behind a mutex only
//! that thread takes in practice (uncontended), never one shared between shards.
//!
//! Layers: what threads send a shard is `mailbox.rs`, below the shared context
//! (`context.rs`), which holds the shards' handles without knowing this state; the handlers
//! (`op`, `peering`, `scrub`, `split`, `reclaim`) take this state (`Shard`); the dispatch of
//! each message to its handler is `dispatch.rs`, above them. `tests/layering.rs` keeps it so.

mod dispatch;

use cairn_failstop::LockOrDie;
pub use dispatch::serve_queue;

use crate::context::Osd;
use crate::mailbox::OnDurable;
use crate::pgstate::PgState;
use cairn_map::{ClusterMap, PgId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One shard's state.
pub struct Shard {
    pub osd: Arc<Osd>,
    /// This shard's index.
    pub index: usize,
    pub pgs: HashMap<PgId, PgState>,
    /// Writes submitted to the store, not yet known durable, with what to do then.
    pub unsynced: Vec<OnDurable>,
    /// Writes of pools with `memory` durability, submitted to the store and not yet known
    /// written to its WAL device, with what to do then.
    pub unwritten: Vec<OnDurable>,
    /// Store sequence number of the last submitted write.
    pub last_seq: u64,
    /// Syncs handed to the syncer thread and not completed yet: later ones follow them
    /// there, so that completions keep their order and this thread never waits behind one.
    pub syncing: usize,
    /// Deletions of this OSD's copies of removed pools' PGs (`crate::reclaim`).
    pub reclaiming: HashMap<PgId, tokio::task::AbortHandle>,
}

impl Shard {
    /// The state of `pg`, loaded on first use, with its placement current for `map`.
    pub fn pg(&mut self, map: &ClusterMap, pg: PgId) -> &mut PgState {
        let osd = &self.osd;
        let st = self
            .pgs
            .entry(pg)
            .or_insert_with(|| PgState::load(&osd.store, pg));
        if !st.coll_exists && osd.store.collection_exists(crate::pgstate::coll_of(pg)) {
            // Made since it was loaded without a copy: a split here gave it one.
            let fresh = PgState::load(&osd.store, pg);
            st.coll_exists = fresh.coll_exists;
            st.last_version = fresh.last_version;
        }
        if st.placement_epoch != map.epoch {
            st.placement = osd.placement(map, pg);
            st.placement_epoch = map.epoch;
            let lives = crate::peering::outcome::interval(map, &st.placement.acting);
            if lives != st.acting_lives || st.interval_since == 0 {
                st.acting_lives = lives;
                st.interval_since = map.epoch;
            }
        }
        st
    }

    /// Remembers a write submitted to the store (sequence `seq`) and what to do when it is
    /// durable.
    pub fn after_sync(&mut self, seq: u64, then: OnDurable) {
        self.last_seq = self.last_seq.max(seq);
        self.unsynced.push(then);
    }

    /// Remembers a write of a pool with `memory` durability submitted to the store (sequence
    /// `seq`) and what to do once it is written to the WAL device (not necessarily flushed).
    pub fn after_write(&mut self, seq: u64, then: OnDurable) {
        self.last_seq = self.last_seq.max(seq);
        self.unwritten.push(then);
    }
}

/// Runs `f` on the state of the shard owning `pg` (from a task on that shard's thread,
/// between the messages it handles, or from elsewhere: the state's mutex is then contended
/// for that moment). `None` when the OSD has no shards (it is stopping).
pub fn with_pg<R>(osd: &Osd, pg: PgId, f: impl FnOnce(&mut Shard) -> R) -> Option<R> {
    let state = osd.shard_state(pg)?;
    let cell = state.as_any().downcast_ref::<Mutex<Shard>>()?;
    let mut guard = cell.lock_or_die();
    Some(f(&mut guard))
}
