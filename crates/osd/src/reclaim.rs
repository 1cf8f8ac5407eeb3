//! Space of removed pools. `pool rm` only changes the map; every OSD then deletes its copies
//! of that pool's PGs in the background, a batch of objects per store transaction with the
//! shard's I/O served between batches, and finally the empty collection. `cairn status` shows
//! how many copies are left (`OsdStats::pgs_reclaiming`).
//!
//! Pool ids are never reused, so a collection whose pool id is below the map's next pool id
//! but not in the map belongs to a removed pool. An OSD whose map predates a new pool cannot
//! mistake that pool's first writes for leftovers: its id is not below that map's next id.

use crate::context::Osd;
use crate::pgstate::{coll_of, pg_of};
use crate::shard::Shard;
use cairn_map::{ClusterMap, PgId};
use cairn_store::{CollId, StoreError, Transaction};
use std::sync::Arc;
use std::time::Duration;

/// Objects removed per store transaction.
const BATCH: usize = 128;

/// Whether `pg`'s pool was removed from the cluster `map` describes.
pub fn pool_removed(map: &ClusterMap, pg: PgId) -> bool {
    pg.pool < map.next_pool_id && !map.pools.contains_key(&pg.pool)
}

/// How many of the store collections `held` are copies of removed pools' PGs.
pub fn removed_copies(map: &ClusterMap, held: &[CollId]) -> u64 {
    held.iter()
        .filter(|c| pool_removed(map, pg_of(**c)))
        .count() as u64
}

/// Starts deleting this OSD's copy of `pg`, a PG of a removed pool (once: a running deletion
/// is left alone).
pub fn start(shard: &mut Shard, pg: PgId) {
    if shard.reclaiming.get(&pg).is_some_and(|t| !t.is_finished()) {
        return;
    }
    let osd = shard.osd.clone();
    let Some(rt) = osd.shard_runtime(shard.index) else {
        return;
    };
    shard.pgs.remove(&pg);
    shard.reclaiming.retain(|_, t| !t.is_finished());
    let task = rt.spawn(run(osd, pg)).abort_handle();
    shard.reclaiming.insert(pg, task);
}

async fn run(osd: Arc<Osd>, pg: PgId) {
    let mut removed = 0u64;
    loop {
        match crate::shard::with_pg(&osd, pg, |s| delete_some(s, pg)) {
            None => return,
            Some(Ok(None)) => {
                tracing::info!(pg = %pg, objects = removed, "deleted this OSD's copy of a PG of a removed pool");
                return;
            }
            // Lets the shard's other tasks (client I/O) run between batches.
            Some(Ok(Some(n))) => {
                removed += n;
                tokio::task::yield_now().await;
            }
            Some(Err(e)) => {
                tracing::warn!(pg = %pg, error = %e, "deleting a PG of a removed pool failed; retrying");
                osd.note_store_error(&e);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Removes up to [`BATCH`] objects of `pg`'s copy, or a collection once it is empty; `None`
/// when the collections are gone (the PG's own, and an EC PG's shard collections).
fn delete_some(shard: &mut Shard, pg: PgId) -> Result<Option<u64>, StoreError> {
    let store = &shard.osd.store;
    let coll = if store.collection_exists(coll_of(pg)) {
        coll_of(pg)
    } else {
        match store
            .list_collections()
            .into_iter()
            .find(|c| pg_of(*c) == pg)
        {
            Some(c) => c,
            None => return Ok(None),
        }
    };
    let names = store.list_objects(coll, None, BATCH)?;
    let mut t = Transaction::new();
    for name in &names {
        t.remove(coll, name);
    }
    if names.is_empty() {
        t.remove_collection(coll);
    }
    store.submit(&t)?;
    Ok(Some(names.len() as u64))
}
