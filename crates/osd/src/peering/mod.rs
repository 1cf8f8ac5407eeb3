//! Peering: before a primary serves a PG for an acting set (members and their lives), it
//! brings every member to the authoritative history (`primary.rs`), copying only the objects
//! the PG log says changed (delta recovery) or everything when a member's log is too old
//! (backfill). Client ops on the PG wait while it peers; other PGs are not affected.
//!
//! Copies that are behind (the primary's own too) get the new log with the objects they lack
//! marked missing, and those are copied in the background while the PG serves
//! (`background.rs`). A client op on an object the primary lacks waits for that object,
//! which is pulled next; a listing waits until the primary lacks nothing.
//!
//! Past intervals (`cairn_map::intervals`): every member records the epoch the PG last went
//! active with it (`last_epoch_started`). The primary asks the monitors for the PG's
//! intervals since the newest such epoch any OSD reports, and goes active only when a member
//! of every interval that may have acknowledged writes has answered; otherwise the PG is
//! `down` (client ops are answered `PgDown`) until one comes back or an operator declares
//! them lost (`cairn osd lost`). The authority is the newest history among those that
//! answered: newest `last_epoch_started` first, then newest log head.

mod background;
pub mod copy;
mod dirty;
mod mark_lost;
pub mod member;
mod members;
pub mod outcome;
mod primary;
pub(crate) mod refusal;
pub(crate) mod rpc;
mod status;
mod stray;
pub(crate) mod transfer;
mod unfound;

pub use outcome::{interval, Interval, PeerError, PeerResult, Peered, Report};

use crate::failure::FailClass;
use crate::mailbox::ShardMsg;
use crate::shard::Shard;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::osd::{OpKind, OpRequest};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// Delay before peering is tried again after a transient failure, doubled for each failure
/// in a row up to [`RETRY_MAX`].
const RETRY_AFTER: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// Delay before a down PG asks again whether the OSDs it waits for are back (a map change
/// that brings one up peers it at once).
const DOWN_RETRY_AFTER: Duration = Duration::from_secs(2);

/// Whether `pg` (of which this OSD is primary) is peered for its current acting set; if not,
/// starts peering (once) and returns false.
pub fn ready(shard: &mut Shard, map: &ClusterMap, pg: PgId) -> bool {
    let st = shard.pg(map, pg);
    if st.active_epoch == map.epoch && st.peered.is_some() {
        return true;
    }
    let iv = interval(map, &st.placement.acting);
    if st.peered.as_ref() == Some(&iv) {
        st.active_epoch = map.epoch;
        return true;
    }
    // A down PG peers again on a new map or when its retry is due, not per client op; so
    // does one whose peering failed in a way that asking again cannot fix (a full or corrupt
    // store, a protocol violation, unfound objects).
    let down_now = st.down.as_ref().is_some_and(|d| d.epoch == map.epoch)
        || st
            .failure
            .as_ref()
            .is_some_and(|f| !f.class.retries() && st.failure_epoch == map.epoch);
    if st.peering.is_none() && !down_now {
        start(shard, map, pg);
    }
    false
}

/// The OSDs a down PG waits for, when it is down and not peering again right now (a client
/// op is then answered `PgDown` instead of waiting).
pub fn down_waiting_for(st: &crate::pgstate::PgState) -> Option<Vec<u32>> {
    if st.peering.is_some() {
        return None;
    }
    // A PG whose peering failed for good answers like a down one (waiting for no OSD in
    // particular) until the map changes, rather than queueing ops it cannot serve.
    let failed = st.failure.as_ref().filter(|f| !f.class.retries());
    st.down
        .as_ref()
        .map(|d| d.waiting_for.clone())
        .or_else(|| failed.map(|_| Vec::new()))
}

fn start(shard: &mut Shard, map: &ClusterMap, pg: PgId) {
    let osd = shard.osd.clone();
    let Some(rt) = osd.shard_runtime(shard.index) else {
        return;
    };
    if osd.splits.pool_pending(pg.pool) {
        // Its objects may still be in a parent's collection here: peered once the split is
        // done (`split/` then tells every shard).
        return;
    }
    let st = shard.pg(map, pg);
    if st.placement.primary() != Some(osd.id()) {
        return;
    }
    let acting = st.placement.acting.clone();
    let give_up = st.give_up_unfound;
    let ec = map.pools.get(&pg.pool).is_some_and(|p| p.ec().is_some());
    let repair = std::mem::take(&mut st.ec_repair);
    let iv = interval(map, &acting);
    let task_iv = iv.clone();
    let task = rt.spawn(async move {
        let result = if ec {
            crate::ec::peer::peer(osd.clone(), pg, repair).await
        } else {
            primary::peer(osd.clone(), pg, acting, give_up).await
        };
        let msg = ShardMsg::PeeringDone {
            pg,
            interval: task_iv,
            result,
        };
        osd.queue(pg, msg);
    });
    st.peering = Some((iv, task.abort_handle()));
}

/// Takes a peering result: the PG goes active (its waiting ops run) if the acting set is
/// still the one peered, else peering starts over.
pub fn done(shard: &mut Shard, pg: PgId, iv: Interval, result: PeerResult) {
    let map = shard.osd.map();
    let osd = shard.osd.clone();
    let rt = osd.shard_runtime(shard.index);
    let st = shard.pg(&map, pg);
    match &st.peering {
        Some((running, _)) if *running == iv => st.peering = None,
        // A result of a peering task that was cancelled (a newer one may run).
        _ => return,
    }
    match result {
        Ok(Peered { backlog, report }) if interval(&map, &st.placement.acting) == iv => {
            st.down = None;
            st.failure = None;
            st.failures = 0;
            st.unfound.clear();
            st.give_up_unfound = None;
            note_given_up(pg, st, &report);
            st.report = Some(report);
            st.peered = Some(iv.clone());
            st.last_version = if map.pools.get(&pg.pool).is_some_and(|p| p.ec().is_some()) {
                crate::ec::peer::pg_version(&osd, &map, pg)
            } else {
                copy::last_version(&osd.store, pg)
            };
            st.coll_exists = osd.store.collection_exists(crate::pgstate::coll_of(pg));
            tracing::info!(pg = %pg, version = st.last_version, "PG active");
            if let Some((_, old)) = st.recovering.take() {
                old.abort();
            }
            st.missing = backlog.own_missing().map(|o| (o.clone(), false)).collect();
            st.copying.clear();
            st.urgent = None;
            if !backlog.is_empty() {
                if let Some(rt) = &rt {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    let task_iv = iv.clone();
                    let run = background::run(osd.clone(), pg, map.epoch, task_iv, backlog, rx);
                    let task = rt.spawn(run);
                    st.recovering = Some((iv, task.abort_handle()));
                    st.urgent = Some(tx);
                }
            }
            replay_waiting(shard, pg);
        }
        // The acting set changed meanwhile: the waiting ops peer again (or learn that this
        // OSD is no longer primary).
        Ok(_) => replay_waiting(shard, pg),
        Err(e) => {
            let after = match e {
                PeerError::Down(report) => {
                    let waiting_for = report.waiting_for.clone();
                    if st.down.as_ref().map(|d| &d.waiting_for) != Some(&waiting_for) {
                        let why = report.reason.as_deref().unwrap_or(
                            "an interval that may have acknowledged writes has no member up",
                        );
                        tracing::warn!(pg = %pg, ?waiting_for, why, "PG down: waiting for one of these OSDs (or `cairn osd lost`)");
                    }
                    st.down = Some(crate::pgstate::Down {
                        epoch: map.epoch,
                        waiting_for,
                    });
                    st.report = Some(report);
                    answer_down(shard, pg);
                    DOWN_RETRY_AFTER
                }
                PeerError::Unfound { objects, failure } => {
                    tracing::error!(pg = %pg, objects = objects.len(), error = %failure, "unfound objects: the PG waits for an OSD that has them, or `cairn pg mark-unfound-lost`");
                    st.unfound = objects;
                    st.failures = st.failures.saturating_add(1);
                    st.failure_epoch = map.epoch;
                    st.failure = Some(failure);
                    answer_failed(shard, pg);
                    return;
                }
                PeerError::Failed(e) => {
                    if e.local_store && e.class == FailClass::StoreCorrupt {
                        osd.store_corrupt(&e);
                    }
                    st.failures = st.failures.saturating_add(1);
                    st.failure_epoch = map.epoch;
                    let retries = e.class.retries();
                    st.failure = Some(e.clone());
                    if !retries {
                        tracing::error!(pg = %pg, class = %e.class, error = %e, "peering failed; not retried until the map changes");
                        answer_failed(shard, pg);
                        return;
                    }
                    let after = backoff(st.failures);
                    tracing::warn!(pg = %pg, class = %e.class, error = %e, ?after, "peering failed; retrying");
                    after
                }
            };
            if let Some(rt) = osd.shard_runtime(shard.index) {
                rt.spawn(async move {
                    tokio::time::sleep(after).await;
                    osd.queue(pg, ShardMsg::Repeer(pg));
                });
            }
        }
    }
}

/// Logs and remembers the intervals a peering gave up (their OSDs declared lost).
fn note_given_up(pg: PgId, st: &mut crate::pgstate::PgState, report: &Report) {
    for iv in &report.coverage.given_up {
        if st.lost_intervals.contains(iv) {
            continue;
        }
        tracing::error!(pg = %pg, first = iv.first, last = iv.last, acting = ?iv.acting, "PG went active without the writes of an interval whose OSDs were declared lost: writes acknowledged then may be lost");
        st.lost_intervals.push(iv.clone());
    }
}

/// The wait before the `n`th retry in a row: 1 s, 2 s, 4 s ... at most 30 s.
fn backoff(n: u32) -> Duration {
    RETRY_AFTER
        .saturating_mul(1 << n.saturating_sub(1).min(5))
        .min(RETRY_MAX)
}

/// Answers the client ops waiting for a PG whose peering failed for good (until the map
/// changes): as for a down PG, the client retries until its deadline.
fn answer_failed(shard: &mut Shard, pg: PgId) {
    let Some(st) = shard.pgs.get_mut(&pg) else {
        return;
    };
    for w in std::mem::take(&mut st.waiting) {
        let r = cairn_proto::msg::osd::OpReply::PgDown {
            waiting_for: Vec::new(),
        };
        crate::op::reply(&w.reply, w.req_id, &r, &[]);
    }
}

/// Answers the client ops waiting for a down PG: the client retries until its deadline.
fn answer_down(shard: &mut Shard, pg: PgId) {
    let Some(st) = shard.pgs.get_mut(&pg) else {
        return;
    };
    let Some(waiting_for) = st.down.as_ref().map(|d| d.waiting_for.clone()) else {
        return;
    };
    for w in std::mem::take(&mut st.waiting) {
        let r = cairn_proto::msg::osd::OpReply::PgDown {
            waiting_for: waiting_for.clone(),
        };
        crate::op::reply(&w.reply, w.req_id, &r, &[]);
    }
}

/// Background recovery of `pg` finished.
pub fn recovery_done(shard: &mut Shard, pg: PgId, iv: Interval) {
    if let Some(st) = shard.pgs.get_mut(&pg) {
        if st
            .recovering
            .as_ref()
            .is_some_and(|(running, _)| *running == iv)
        {
            st.recovering = None;
            st.urgent = None;
            st.missing.clear();
            if !st.waiting.is_empty() {
                replay_waiting(shard, pg);
            }
        }
    }
}

/// The primary's copy of `object` in `pg` is current again: the ops waiting for it run.
pub fn object_recovered(shard: &mut Shard, pg: PgId, iv: Interval, object: Vec<u8>) {
    let Some(st) = shard.pgs.get_mut(&pg) else {
        return;
    };
    if st.peered.as_ref() != Some(&iv) || st.missing.remove(&object).is_none() {
        return;
    }
    if !st.waiting.is_empty() {
        replay_waiting(shard, pg);
    }
}

/// Whether a client op on `pg` (peered, this OSD primary) must wait for the primary's copy
/// to catch up: a listing while it lacks any object; an op that needs the bytes of an object
/// it lacks (a read, a stat, a remove), which is then pulled next. Writes to such an object
/// go on: applied everywhere, also over the primary's stale copy, which the pull (refused if
/// a write came after it read) later makes whole.
pub fn must_catch_up(st: &mut crate::pgstate::PgState, req: &OpRequest) -> bool {
    waits_for_copy(&st.copying, req) || waits_for_missing(&mut st.missing, st.urgent.as_ref(), req)
}

/// A write to an object background recovery is copying waits for the copy.
fn waits_for_copy(copying: &HashSet<Vec<u8>>, req: &OpRequest) -> bool {
    req.kind.is_write() && copying.contains(&req.object)
}

/// Marks `object` of `pg` as being copied by background recovery (`copying`), or no longer
/// (then the writes that waited for it run).
pub fn set_copying(shard: &mut Shard, pg: PgId, object: &[u8], on: bool) {
    let Some(st) = shard.pgs.get_mut(&pg) else {
        return;
    };
    if on {
        st.copying.insert(object.to_vec());
    } else if st.copying.remove(object) && !st.waiting.is_empty() {
        replay_waiting(shard, pg);
    }
}

fn waits_for_missing(
    missing: &mut HashMap<Vec<u8>, bool>,
    urgent: Option<&UnboundedSender<Vec<u8>>>,
    req: &OpRequest,
) -> bool {
    if missing.is_empty() {
        return false;
    }
    if matches!(req.kind, OpKind::List { .. }) {
        return true;
    }
    let Some(wanted) = missing.get_mut(&req.object) else {
        return false;
    };
    // A write need not wait for the object's old copy, except one that depends on whether it
    // exists (a remove, an exclusive create).
    let conditional = matches!(
        req.kind,
        OpKind::Remove | OpKind::Create | OpKind::WriteFullIf { .. } | OpKind::RemoveIf { .. }
    );
    if !*wanted && req.kind.is_write() && !conditional {
        return false;
    }
    if !*wanted {
        *wanted = true;
        if let Some(tx) = urgent {
            let _ = tx.send(req.object.clone());
        }
    }
    true
}

/// Runs the ops waiting for `pg` again: each is served, answered `NotPrimary`, or waits for
/// the (re)started peering.
fn replay_waiting(shard: &mut Shard, pg: PgId) {
    let waiting = match shard.pgs.get_mut(&pg) {
        Some(st) => std::mem::take(&mut st.waiting),
        None => return,
    };
    for w in waiting {
        crate::op::handle_client_op(shard, w.reply, w.req_id, w.req, w.data);
    }
}

/// Forgets that `pg` is peered (a member reported a gap in its history) and peers it again.
pub fn unpeer(shard: &mut Shard, pg: PgId) {
    let map = shard.osd.map();
    let me = shard.osd.id();
    let st = shard.pg(&map, pg);
    if st.peering.is_some() || st.placement.primary() != Some(me) {
        return;
    }
    st.peered = None;
    st.active_epoch = 0;
    ready(shard, &map, pg);
}

/// Starts peering `pg` again if it is still not peered (after a failure).
pub fn repeer(shard: &mut Shard, pg: PgId) {
    let map = shard.osd.map();
    if let Some(d) = shard.pg(&map, pg).down.as_mut() {
        // Its retry is due: ask again even at the same epoch.
        d.epoch = 0;
    }
    if shard.pg(&map, pg).waiting.is_empty() {
        if !ready(shard, &map, pg) {
            tracing::debug!(pg = %pg, "peering again");
        }
    } else {
        replay_waiting(shard, pg);
    }
}

/// After a map change: peers every PG of this shard this OSD is primary of, so that members
/// are recovered without waiting for client I/O, and watches the PGs it holds an old copy of.
pub fn on_map(shard: &mut Shard) {
    let map = shard.osd.map();
    crate::split::run(shard, &map);
    let me = shard.osd.id();
    let n = shard.osd.shard_count();
    let held: HashSet<PgId> = shard
        .osd
        .store
        .list_collections()
        .into_iter()
        .map(crate::pgstate::pg_of)
        .collect();
    let mut pgs: Vec<PgId> = held.iter().copied().collect();
    pgs.extend(shard.pgs.keys().copied());
    pgs.extend(led(shard, &map));
    pgs.sort_unstable_by_key(|p| (p.pool, p.pg));
    pgs.dedup();
    for pg in pgs {
        let pool = map.pools.get(&pg.pool);
        let known = pool.is_some_and(|p| pg.pg < p.pg_count);
        if crate::mailbox::shard_of(pg, n) != shard.index {
            continue;
        }
        if !known {
            if held.contains(&pg) && crate::reclaim::pool_removed(&map, pg) {
                crate::reclaim::start(shard, pg);
            }
            continue;
        }
        let st = shard.pg(&map, pg);
        // A peering task for an interval that has ended would wait on members that are gone.
        let current = interval(&map, &st.placement.acting);
        if let Some((running, task)) = &st.peering {
            if *running != current {
                task.abort();
                st.peering = None;
            }
        }
        if let Some((running, task)) = &st.recovering {
            if *running != current {
                task.abort();
                st.recovering = None;
                st.copying.clear();
            }
        }
        // EC shards that are no longer members are not watched yet (their PGs do not move).
        let ec = pool.is_some_and(|p| p.ec().is_some());
        let stray = !ec && stray::is_stray(&map, &st.placement, me);
        if !st.waiting.is_empty() && st.peering.is_none() {
            replay_waiting(shard, pg);
        } else if st.placement.primary() == Some(me) {
            ready(shard, &map, pg);
        }
        if stray && held.contains(&pg) {
            stray::watch(shard, &map, pg);
        }
    }
}

/// Of the store collections `held`, the PGs this OSD is no longer a member of.
pub fn misplaced_copies(osd: &crate::context::Osd, held: &[cairn_store::CollId]) -> u64 {
    let map = osd.map();
    held.iter()
        .map(|c| crate::pgstate::pg_of(*c))
        .filter(|pg| map.pools.get(&pg.pool).is_some_and(|p| pg.pg < p.pg_count))
        .filter(|pg| stray::is_stray(&map, &osd.placement(&map, *pg), osd.id()))
        .count() as u64
}

/// The PGs of this shard the map makes this OSD primary of (it may hold nothing of them yet:
/// a new OSD after a rebalance).
fn led(shard: &Shard, map: &ClusterMap) -> Vec<PgId> {
    let (me, n) = (shard.osd.id(), shard.osd.shard_count());
    let mut out = Vec::new();
    for (&pool, p) in map.pools.iter() {
        for pg in (0..p.pg_count).map(|pg| PgId { pool, pg }) {
            if crate::mailbox::shard_of(pg, n) == shard.index
                && shard.osd.placement(map, pg).primary() == Some(me)
            {
                out.push(pg);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
