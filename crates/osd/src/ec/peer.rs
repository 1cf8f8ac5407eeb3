//! Peering an EC PG: the primary asks every present shard for its last version. The PG
//! goes active when enough shards answer that any acknowledged write is on at least one of
//! them (an acknowledged write is on `min_size` shards, so `k + m - min_size + 1` answering
//! shards include one that holds it), at least `k` (to decode), and all of them hold the
//! same history.

use super::{shard_coll, shard_version};
use crate::context::Osd;
use crate::failure::{FailClass, Failure};
use crate::peering::outcome::{Backlog, PeerError, PeerResult, Peered, Report};
use crate::peering::rpc::Rpc;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::ec::{EcInfo, EcQuery, EC_QUERY_CALL};
use std::sync::Arc;

/// The shards of `pg` that must answer for it to go active: enough to meet every write
/// acknowledged on `min_size` of its `n` shards, and at least `k`.
pub fn quorum(k: usize, n: usize, min_size: usize) -> usize {
    k.max((n + 1).saturating_sub(min_size))
}

/// What a shard holds, asked of the OSD holding it (this one's own store for its shard).
async fn query(
    osd: &Arc<Osd>,
    map: &ClusterMap,
    pg: PgId,
    shard: u8,
    id: u32,
) -> Result<EcInfo, Failure> {
    if id == osd.id() {
        let coll = shard_coll(pg, shard);
        return Ok(EcInfo {
            exists: osd.store.collection_exists(coll),
            last_version: shard_version(&osd.store, coll),
        });
    }
    let q = EcQuery {
        epoch: map.epoch,
        pool: pg.pool,
        pg: pg.pg,
        shard,
    };
    let what = |e: crate::peering::rpc::RpcError| {
        let f = Failure::from(e);
        Failure::new(
            f.class,
            format!("querying osd.{id} for shard {shard} of pg {pg}: {f}"),
        )
    };
    let mut rpc = Rpc::connect_osd(map, id, &osd.dialer).await.map_err(what)?;
    let (info, _) = rpc.ask(EC_QUERY_CALL, &q, &[]).await.map_err(what)?;
    Ok(info)
}

/// Peers `pg`, of which this OSD is the primary.
pub async fn peer(osd: Arc<Osd>, pg: PgId) -> PeerResult {
    let map = osd.map();
    let Some(pool) = map.pools.get(&pg.pool) else {
        return Err(Failure::stale(format!("pool {} of pg {pg} is gone", pg.pool)).into());
    };
    let Some(profile) = pool.ec() else {
        return Err(Failure::stale(format!("pg {pg} is not erasure-coded")).into());
    };
    let placement = osd.placement(&map, pg);
    let shards = map.pg_shards(pg, &placement);
    let n = shards.len();
    let need = quorum(profile.k.into(), n, pool.min_size.into());
    let mut report = Report {
        from: map.epoch,
        ..Report::default()
    };
    let mut versions = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        let Some(id) = *s else { continue };
        let info = query(&osd, &map, pg, i as u8, id).await?;
        report.answered.insert(id);
        versions.push((i, id, info.last_version));
    }
    if versions.len() < need {
        report.waiting_for = placement
            .up_set
            .iter()
            .copied()
            .filter(|id| !report.answered.contains(id))
            .collect();
        report.reason = Some(format!(
            "an EC PG of {} needs {need} of its {n} shards to answer, {} are up",
            profile.describe(),
            versions.len()
        ));
        return Err(PeerError::Down(report));
    }
    let newest = versions.iter().map(|v| v.2).max().unwrap_or(0);
    let behind: Vec<String> = versions
        .iter()
        .filter(|v| v.2 != newest)
        .map(|(i, id, v)| format!("shard {i} on osd.{id} at version {v}"))
        .collect();
    if !behind.is_empty() {
        return Err(PeerError::Failed(Failure::new(
            FailClass::Protocol,
            format!(
                "pg {pg}: shards hold different histories (newest version {newest}; {}): \
                 rebuilding EC shards is not built yet",
                behind.join(", ")
            ),
        )));
    }
    Ok(Peered {
        backlog: Backlog::default(),
        report,
    })
}

/// The PG version of an EC PG on its primary once peered: its own shard's.
pub fn pg_version(osd: &Osd, map: &ClusterMap, pg: PgId) -> u64 {
    super::my_shard(map, pg, osd.id()).map_or(0, |s| shard_version(&osd.store, shard_coll(pg, s)))
}
