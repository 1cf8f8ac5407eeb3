//! Copies the previous owners of a PG keep after it moved (rebalancing, an OSD marked out and
//! back): such an OSD asks the PG's primary every few seconds whether the PG is clean (every
//! acting member current, as many as the pool's size) and deletes its copy once it is. Until
//! then the copy stays: it may be the only current one, and peering may still read from it.

use super::rpc::Rpc;
use crate::context::Osd;
use crate::failure::Failure;
use crate::pgstate::coll_of;
use crate::shard::Shard;
use cairn_map::{ClusterMap, PgId, PgPlacement};
use cairn_proto::msg::peering::{PgDone, PgQuery, CLEAN_CALL};
use cairn_store::Transaction;
use std::sync::Arc;
use std::time::Duration;

/// How often a previous owner asks the primary.
const CHECK_EVERY: Duration = Duration::from_secs(3);

/// Whether `osd`, up in `map`, is neither in the up nor in the acting set of a PG. (An OSD
/// marked down keeps its copies: it is a member again when it comes back.)
pub fn is_stray(map: &ClusterMap, p: &PgPlacement, osd: u32) -> bool {
    map.osds.get(&osd).is_some_and(|o| o.up) && !p.up_set.contains(&osd) && !p.acting.contains(&osd)
}

/// Starts watching `pg`, of which this OSD holds a copy but is no longer a member (once).
pub fn watch(shard: &mut Shard, map: &ClusterMap, pg: PgId) {
    let osd = shard.osd.clone();
    let Some(rt) = osd.shard_runtime(shard.index) else {
        return;
    };
    let st = shard.pg(map, pg);
    if st.stray_watch.as_ref().is_some_and(|t| !t.is_finished()) {
        return;
    }
    st.stray_watch = Some(rt.spawn(run(osd, pg)).abort_handle());
}

/// Asks until the copy is deleted or this OSD is a member again.
async fn run(osd: Arc<Osd>, pg: PgId) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let map = osd.map();
        let p = osd.placement(&map, pg);
        if !is_stray(&map, &p, osd.id()) || !osd.store.collection_exists(coll_of(pg)) {
            return;
        }
        let Some(primary) = p.primary() else {
            continue;
        };
        match ask(&osd, &map, pg, primary).await {
            Ok(PgDone::Done) => {
                match crate::shard::with_pg(&osd, pg, |s| drop_copy(s, pg, map.epoch)) {
                    Some(Ok(true)) => return,
                    Some(Ok(false)) | None => {}
                    Some(Err(e)) => {
                        tracing::warn!(pg = %pg, error = %e, "deleting this OSD's old copy of the PG failed; retrying")
                    }
                }
            }
            Ok(answer) => {
                tracing::debug!(pg = %pg, primary, ?answer, "PG not clean yet: keeping this OSD's old copy")
            }
            Err(e) => {
                tracing::debug!(pg = %pg, primary, error = %e, "asking whether the PG is clean")
            }
        }
    }
}

async fn ask(osd: &Osd, map: &ClusterMap, pg: PgId, primary: u32) -> Result<PgDone, Failure> {
    let mut rpc = Rpc::connect_osd(map, primary, &osd.dialer).await?;
    let q = PgQuery {
        epoch: map.epoch,
        pool: pg.pool,
        pg: pg.pg,
        since: 0,
    };
    Ok(rpc.ask(CLEAN_CALL, &q, &[]).await?.0)
}

/// Deletes this OSD's copy of `pg` if the map is still the one (`epoch`) the primary said
/// the PG is clean at; returns whether it did.
fn drop_copy(shard: &mut Shard, pg: PgId, epoch: u64) -> Result<bool, Failure> {
    let map = shard.osd.map();
    let me = shard.osd.id();
    let coll = coll_of(pg);
    if map.epoch != epoch || !is_stray(&map, &shard.pg(&map, pg).placement, me) {
        return Ok(false);
    }
    if !shard.osd.store.collection_exists(coll) {
        return Ok(true);
    }
    let mut t = Transaction::new();
    t.remove_collection(coll);
    let store = &shard.osd.store;
    let seq = store.submit(&t)?;
    store.sync_through(seq)?;
    shard.pgs.remove(&pg);
    tracing::info!(pg = %pg, epoch, "deleted this OSD's old copy of the PG: it is clean on its members");
    Ok(true)
}

/// The primary's answer to a previous owner asking at map `epoch` whether `pg` is clean.
pub fn answer(shard: &mut Shard, pg: PgId, epoch: u64) -> PgDone {
    let map = shard.osd.map();
    let me = shard.osd.id();
    let size = map
        .pools
        .get(&pg.pool)
        .map_or(usize::MAX, |p| p.size as usize);
    if shard.pg(&map, pg).placement.primary() != Some(me) {
        return PgDone::Stale { epoch: map.epoch };
    }
    // Both sides must see the same placement.
    if map.epoch != epoch || !super::ready(shard, &map, pg) {
        return PgDone::Busy;
    }
    let st = shard.pg(&map, pg);
    let clean =
        st.recovering.is_none() && st.missing.is_empty() && st.placement.acting.len() >= size;
    if clean {
        PgDone::Done
    } else {
        PgDone::Busy
    }
}
