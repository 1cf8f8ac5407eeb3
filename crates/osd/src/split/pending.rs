//! The collections this OSD must still split, noted before a map that grows a pool is
//! installed and taken off as each shard splits them (the OSD's shared context holds them).

use crate::pgstate::pg_of;
use cairn_failstop::LockOrDie;
use cairn_map::{ClusterMap, PgId};
use cairn_store::Store;
use std::collections::BTreeSet;
use std::sync::Mutex;

/// The collections this OSD must still split.
#[derive(Default)]
pub struct Splits {
    pending: Mutex<BTreeSet<PgId>>,
}

impl Splits {
    /// Notes the collections of every pool whose PG count grows from `old` to `new` (every
    /// pool when `old` is `None`: at start). Call before installing `new`.
    pub fn note(&self, store: &Store, old: Option<&ClusterMap>, new: &ClusterMap) {
        let grown: BTreeSet<u32> = new
            .pools
            .iter()
            // An EC pool's PG count is fixed: its shard collections are never split.
            .filter(|(_, p)| p.ec().is_none())
            .filter(|(id, p)| match old.map(|m| m.pools.get(id)) {
                None => true,
                Some(None) => false,
                Some(Some(o)) => p.pg_count > o.pg_count,
            })
            .map(|(id, _)| *id)
            .collect();
        // Most maps grow nothing: the store is not asked.
        if grown.is_empty() {
            return;
        }
        let held: Vec<PgId> = store
            .list_collections()
            .into_iter()
            .map(pg_of)
            .filter(|pg| grown.contains(&pg.pool))
            .collect();
        if !held.is_empty() {
            let mut p = self.pending.lock_or_die();
            p.extend(held);
        }
    }

    /// Whether collections of `pool` are still to be split here.
    pub fn pool_pending(&self, pool: u32) -> bool {
        let p = self.pending.lock_or_die();
        has_pool(&p, pool)
    }

    /// The pending collections shard `index` of `n` owns.
    pub(super) fn of_shard(&self, index: usize, n: usize) -> Vec<PgId> {
        let p = self.pending.lock_or_die();
        p.iter()
            .copied()
            .filter(|pg| crate::mailbox::shard_of(*pg, n) == index)
            .collect()
    }

    /// `pg` is split; returns whether its pool has nothing left to split.
    pub(super) fn done(&self, pg: PgId) -> bool {
        let mut p = self.pending.lock_or_die();
        p.remove(&pg);
        !has_pool(&p, pg.pool)
    }
}

fn has_pool(pending: &BTreeSet<PgId>, pool: u32) -> bool {
    pending
        .range(PgId { pool, pg: 0 }..=PgId { pool, pg: u32::MAX })
        .next()
        .is_some()
}
