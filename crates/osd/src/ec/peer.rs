//! Peering an EC PG: the primary asks every present shard for its log. The PG goes active
//! when enough shards answer that any acknowledged write is on at least one of them (an
//! acknowledged write is on `min_size` shards, so `k + m - min_size + 1` answering shards
//! include one that holds it), at least `k` (to decode), and once every shard that answered
//! is rebuilt to the version `rebuild::history` picks.

use super::rebuild::history::{self, Down, Plan, Refusal, ShardLog};
use super::rebuild::{self, Holder};
use super::{shard_coll, shard_version};
use crate::context::Osd;
use crate::failure::Failure;
use crate::peering::outcome::{Backlog, PeerError, PeerResult, Peered, Report};
use crate::peering::rpc::Rpc;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::ec::{EcQuery, EC_QUERY_CALL};
use std::sync::Arc;

/// The shards of `pg` that must answer for it to go active: enough to meet every write
/// acknowledged on `min_size` of its `n` shards, and at least `k`.
pub fn quorum(k: usize, n: usize, min_size: usize) -> usize {
    k.max((n + 1).saturating_sub(min_size))
}

/// What a shard holds, asked of the OSD holding it (this one's own store for its shard),
/// with the session to it for the rebuild.
async fn query(
    osd: &Arc<Osd>,
    map: &ClusterMap,
    pg: PgId,
    shard: u8,
    id: u32,
) -> Result<Holder, Failure> {
    if id == osd.id() {
        let log = rebuild::own_log(osd, pg, shard)?;
        return Ok(Holder { log, rpc: None });
    }
    let q = EcQuery {
        epoch: map.epoch,
        pool: pg.pool,
        pg: pg.pg,
        shard,
    };
    let what = |f: Failure| {
        Failure::new(
            f.class,
            format!("querying osd.{id} for shard {shard} of pg {pg}: {f}"),
        )
    };
    let mut rpc = Rpc::connect_osd(map, id, &osd.dialer)
        .await
        .map_err(|e| what(e.into()))?;
    let (info, data) = rpc
        .ask(EC_QUERY_CALL, &q, &[])
        .await
        .map_err(|e| what(e.into()))?;
    let entries = crate::pglog::decode_peer_entries(&data).map_err(what)?;
    if entries
        .last()
        .is_some_and(|e| e.version != info.last_version)
    {
        return Err(what(Failure::protocol(format!(
            "its last version {} is not its newest log entry's",
            info.last_version
        ))));
    }
    let log = ShardLog {
        shard,
        osd: id,
        head: info.last_version,
        entries,
    };
    Ok(Holder {
        log,
        rpc: Some(rpc),
    })
}

/// Peers `pg`, of which this OSD is the primary: rebuilds the shards that are not at the
/// version the PG goes on at (`rebuild/`).
/// With `repair`, the damaged shard objects scrub found are rebuilt too.
pub async fn peer(osd: Arc<Osd>, pg: PgId, repair: rebuild::Repairs) -> PeerResult {
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
    let (k, min_size) = (usize::from(profile.k), usize::from(pool.min_size));
    let need = quorum(k, n, min_size);
    let mut report = Report {
        from: map.epoch,
        ..Report::default()
    };
    let mut holders = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        let Some(id) = *s else { continue };
        holders.push(query(&osd, &map, pg, i as u8, id).await?);
        report.answered.insert(id);
    }
    let waiting_for = |report: &Report| -> Vec<u32> {
        placement
            .up_set
            .iter()
            .copied()
            .filter(|id| *id != cairn_map::NO_OSD && !report.answered.contains(id))
            .collect()
    };
    if holders.len() < need {
        report.waiting_for = waiting_for(&report);
        report.reason = Some(format!(
            "an EC PG of {} needs {need} of its {n} shards to answer, {} are up",
            profile.describe(),
            holders.len()
        ));
        return Err(PeerError::Down(report));
    }
    let logs: Vec<ShardLog> = holders.iter().map(|h| h.log.clone()).collect();
    let plan = match plan_with_intervals(&osd, &map, pg, &logs, (n, k, min_size)).await? {
        Ok(p) => p,
        Err(Down {
            version,
            holders,
            waiting_for: held_it,
        }) => {
            report.waiting_for = if held_it.is_empty() {
                waiting_for(&report)
            } else {
                held_it
            };
            report.reason = Some(format!(
                "the write of version {version} is on {holders} of the shards that answered, \
                 fewer than the {k} that can decode it, and may have been acknowledged on \
                 shards that did not"
            ));
            return Err(PeerError::Down(report));
        }
    };
    let behind = plan.shards.iter().filter(|s| !s.up_to_date).count();
    if behind > 0 || !plan.dirty.is_empty() || !repair.is_empty() {
        // Every shard's history gathered and the version chosen, nothing changed yet.
        fail::fail_point!("osd_ec_peering_mid");
        tracing::info!(pg = %pg, version = plan.version, shards = behind,
            objects = plan.dirty.len(), backfill = plan.backfill(), damaged = repair.len(),
            "rebuilding EC shards");
        let n = rebuild::run(&osd, &map, pg, profile, &mut holders, &plan, &repair).await?;
        tracing::info!(pg = %pg, version = plan.version, shard_objects = n, "EC shards rebuilt");
    }
    Ok(Peered {
        backlog: Backlog::default(),
        report,
    })
}

/// Plans the rebuild from `logs`, asking the monitors for the PG's past intervals when some
/// write must be judged (who held which shard when it was written).
async fn plan_with_intervals(
    osd: &Osd,
    map: &ClusterMap,
    pg: PgId,
    logs: &[ShardLog],
    counts: (usize, usize, usize),
) -> Result<Result<Plan, Down>, PeerError> {
    let since = match history::plan(logs, counts, None) {
        Ok(p) => return Ok(Ok(p)),
        Err(Refusal::Down(d)) => return Ok(Err(d)),
        Err(Refusal::NeedIntervals { since }) => since,
    };
    let (_, intervals) = osd
        .mon
        .past_intervals(pg, since, map.epoch)
        .await
        .map_err(|e| {
            Failure::transient(format!(
                "asking the monitors for the past intervals of pg {pg}: {e}"
            ))
        })?;
    match history::plan(logs, counts, Some(&intervals)) {
        Ok(p) => Ok(Ok(p)),
        Err(Refusal::Down(d)) => Ok(Err(d)),
        Err(Refusal::NeedIntervals { .. }) => Err(Failure::transient(format!(
            "pg {pg}: the rebuild plan asked again for the intervals it was given"
        ))
        .into()),
    }
}

/// The PG version of an EC PG on its primary once peered: its own shard's.
pub fn pg_version(osd: &Osd, map: &ClusterMap, pg: PgId) -> u64 {
    super::my_shard(map, pg, osd.id()).map_or(0, |s| shard_version(&osd.store, shard_coll(pg, s)))
}
