//! A member's side of peering and recovery, run on the shard owning the PG: answer queries
//! and pulls from the store, apply pushes durably before answering. The primary applies its
//! own recovery with the same functions.

pub use super::refusal::Refusal;

use super::copy::{
    info, last_epoch_started, last_version, list, missing_key, pg_id, MISSING_END, MISSING_PREFIX,
};
use crate::failure::Failure;
use crate::pglog;
use crate::pgstate::{coll_of, LES_KEY, VERSION_KEY};
use crate::shard::Shard;
use cairn_map::PgId;
use cairn_proto::msg::peering::{
    PgDone, PgList, PgMarkLost, PgPush, PgQuery, PushKind, MAX_NAMES, PG_CLEAN, PG_DONE, PG_INFO,
    PG_LIST, PG_MARK_LOST, PG_NAMES, PG_PUSH, PG_QUERY, PG_STATUS, PG_STATUS_REPLY,
};
use cairn_proto::msg::scrub::{PgScrub, MAX_SCRUB_OBJECTS, PG_SCRUB, PG_SCRUB_MAP};
use cairn_proto::msg::ErrorCode;
use cairn_store::{Store, Transaction};
use cairn_transport::FrameSender;

/// Answers one peering request (the caller checked the message type is one of ours).
pub fn handle(
    shard: &mut Shard,
    to: FrameSender,
    req_id: u64,
    msg_type: u16,
    control: &[u8],
    data: Vec<u8>,
) -> Result<(), Refusal> {
    let store = &shard.osd.store;
    match msg_type {
        PG_QUERY => {
            let q: PgQuery = decode("pg query", control)?;
            not_splitting(&shard.osd, pg_id(q.pool, q.pg))?;
            let (info, entries) =
                shard
                    .osd
                    .stop_if_corrupt(info(store, pg_id(q.pool, q.pg), q.since))?;
            send(
                &to,
                PG_INFO,
                req_id,
                &info,
                &cairn_proto::msg::encode(&entries),
            );
        }
        PG_LIST => {
            let l: PgList = decode("pg list", control)?;
            not_splitting(&shard.osd, pg_id(l.pool, l.pg))?;
            let names =
                shard
                    .osd
                    .stop_if_corrupt(list(store, pg_id(l.pool, l.pg), l.after.as_deref()))?;
            send(&to, PG_NAMES, req_id, &names, &[]);
        }
        PG_PUSH => {
            let p: PgPush = decode("pg push", control)?;
            let pg = pg_id(p.pool, p.pg);
            not_splitting(&shard.osd, pg)?;
            let map = shard.osd.map();
            check_pg(&map, pg)?;
            let r = if let Some(why) = bad_activation(&p, map.epoch) {
                Refusal::new(ErrorCode::Invalid, why).reply()
            } else if map.epoch < p.epoch
                || shard.pg(&map, pg).placement.primary() != Some(p.primary)
                || !pushed_object_belongs(&map, pg, &p.kind)
            {
                // A push from a map this OSD could not get (the connection waited for it)
                // cannot be checked: refused like one from a deposed primary.
                PgDone::Stale { epoch: map.epoch }
            } else {
                apply(shard, pg, &p.kind, &data)
            };
            send(&to, PG_DONE, req_id, &r, &[]);
        }
        PG_CLEAN => {
            let q: PgQuery = decode("pg clean query", control)?;
            let pg = pg_id(q.pool, q.pg);
            check_pg(&shard.osd.map(), pg)?;
            let r = super::stray::answer(shard, pg, q.epoch);
            send(&to, PG_DONE, req_id, &r, &[]);
        }
        PG_STATUS => {
            let q: PgQuery = decode("pg status query", control)?;
            let pg = pg_id(q.pool, q.pg);
            check_pg(&shard.osd.map(), pg)?;
            let status = super::status::of(shard, pg);
            send(&to, PG_STATUS_REPLY, req_id, &status, &[]);
        }
        PG_MARK_LOST => {
            let q: PgMarkLost = decode("pg mark lost", control)?;
            let pg = pg_id(q.pool, q.pg);
            check_pg(&shard.osd.map(), pg)?;
            let r = super::mark_lost::order(shard, pg, q.delete);
            send(&to, PG_DONE, req_id, &r, &[]);
        }
        PG_SCRUB => {
            let q: PgScrub = decode("pg scrub", control)?;
            let pg = pg_id(q.pool, q.pg);
            check_pg(&shard.osd.map(), pg)?;
            if q.names.len() > MAX_SCRUB_OBJECTS as usize {
                let why = format!(
                    "a scrub asks for {} objects; at most {MAX_SCRUB_OBJECTS} are allowed",
                    q.names.len()
                );
                return Err(Refusal::new(ErrorCode::Invalid, why));
            }
            let m = shard
                .osd
                .stop_if_corrupt(crate::scrub::map::build(store, pg, &q))?;
            send(&to, PG_SCRUB_MAP, req_id, &m, &[]);
        }
        other => {
            let why = format!("message type {other} is not a peering request");
            return Err(Refusal::new(ErrorCode::Unsupported, why));
        }
    }
    Ok(())
}

/// Refuses a request on a PG whose pool still has copies to split here (`split/`): its
/// objects may still be in a parent's collection. The asker tries again.
pub fn not_splitting(osd: &crate::context::Osd, pg: PgId) -> Result<(), Refusal> {
    if osd.splits.pool_pending(pg.pool) {
        let why = format!(
            "pool {}'s PGs are being split on osd.{}: ask again shortly",
            pg.pool,
            osd.id()
        );
        return Err(Refusal::new(ErrorCode::Internal, why));
    }
    Ok(())
}

/// Whether the object a recovery push names hashes to `pg` in `map` (after a split it may
/// not: the push comes from a primary with an older map, and must not enter the parent).
pub(crate) fn pushed_object_belongs(
    map: &cairn_map::ClusterMap,
    pg: PgId,
    kind: &PushKind,
) -> bool {
    let object = match kind {
        PushKind::Recover { object, .. } | PushKind::RecoverRemove { object, .. } => object,
        _ => return true,
    };
    map.object_pg(pg.pool, object) == Some(pg)
}

/// Why an `Activate` push must be refused: its epoch ranks this copy's history (authority goes
/// by it first), so it is taken only for the push's own epoch, and only once this OSD's map
/// has reached it, so that the sender was checked to be the PG's primary at that epoch.
fn bad_activation(p: &PgPush, map_epoch: u64) -> Option<String> {
    let PushKind::Activate { epoch } = p.kind else {
        return None;
    };
    if epoch != p.epoch {
        return Some(format!(
            "activation at epoch {epoch} sent in a push of epoch {}",
            p.epoch
        ));
    }
    (epoch > map_epoch).then(|| {
        format!(
            "activation at epoch {epoch} is newer than this OSD's map (epoch {map_epoch}): \
             retry once it has caught up"
        )
    })
}

/// Refuses a PG this OSD's map does not have (a push must never create one).
pub(crate) fn check_pg(map: &cairn_map::ClusterMap, pg: PgId) -> Result<(), Refusal> {
    match map.pools.get(&pg.pool) {
        Some(p) if pg.pg < p.pg_count => Ok(()),
        _ => Err(Refusal::new(
            ErrorCode::NotFound,
            format!("pg {pg} does not exist in map epoch {}", map.epoch),
        )),
    }
}

fn decode<T: serde::de::DeserializeOwned>(what: &'static str, b: &[u8]) -> Result<T, Refusal> {
    cairn_proto::msg::decode(what, b).map_err(|e| Refusal::new(ErrorCode::Malformed, e.to_string()))
}

fn send<T: serde::Serialize>(to: &FrameSender, t: u16, id: u64, msg: &T, data: &[u8]) {
    let _ = to.send(t, id, &cairn_proto::msg::encode(msg), data);
}

/// Applies one push to this OSD's copy of `pg`, durably.
pub fn apply(shard: &mut Shard, pg: PgId, kind: &PushKind, data: &[u8]) -> PgDone {
    let guard = match kind {
        PushKind::Repair { object, since, .. } | PushKind::RepairRemove { object, since } => {
            Some((object, *since))
        }
        PushKind::Recover {
            object,
            since: Some(since),
            ..
        }
        | PushKind::RecoverRemove {
            object,
            since: Some(since),
        } => Some((object, *since)),
        _ => None,
    };
    let r = match guard.map(|(o, since)| changed_since(&shard.osd.store, pg, o, since)) {
        Some(Ok(true)) => return PgDone::Busy,
        Some(Err(e)) => Err(e),
        None | Some(Ok(false)) => apply_store(shard, pg, kind, data),
    };
    match shard.osd.stop_if_corrupt(r) {
        Ok(()) => PgDone::Done,
        Err(e) => Refusal::from(e).reply(),
    }
}

/// Whether a log entry after `since` touched `object` (also when the log no longer reaches
/// back to `since`: it cannot tell).
fn changed_since(store: &Store, pg: PgId, object: &[u8], since: u64) -> Result<bool, Failure> {
    let coll = coll_of(pg);
    let last = last_version(store, pg);
    if last <= since {
        return Ok(false);
    }
    let tail = pglog::tail(store, coll)?;
    if tail.is_none_or(|t| t > since.saturating_add(1)) {
        return Ok(true);
    }
    let entries = pglog::read_after(store, coll, since, pglog::LOG_KEEP as usize)?;
    Ok(entries.iter().any(|e| e.object == object))
}

fn apply_store(shard: &mut Shard, pg: PgId, kind: &PushKind, data: &[u8]) -> Result<(), Failure> {
    let coll = coll_of(pg);
    let osd = shard.osd.clone();
    let store = &osd.store;
    let mut t = Transaction::new();
    if !store.collection_exists(coll) {
        t.create_collection(coll);
    }
    let mut new_last = None;
    match kind {
        PushKind::Reset => {
            let mut after: Option<Vec<u8>> = None;
            loop {
                let names = list(store, pg, after.as_deref())?;
                for n in &names.names {
                    t.remove(coll, n);
                }
                after = names.names.last().cloned();
                if !names.more {
                    break;
                }
            }
            t.kv_rm_range(
                coll,
                pglog::LOG_PREFIX,
                &[pglog::LOG_PREFIX, &[0xff; 9][..]].concat(),
            );
            t.kv_rm_range(coll, MISSING_PREFIX, MISSING_END);
            t.kv_set(coll, VERSION_KEY, &0u64.to_le_bytes());
            // Emptied, it no longer holds the history of its last activation: it must never be
            // taken as the authority for it (authority goes by this epoch first).
            t.kv_rm(coll, LES_KEY);
            new_last = Some(0);
        }
        PushKind::Recover {
            object,
            offset,
            size,
            reset,
            last,
            ..
        } => {
            t.touch(coll, object);
            if *reset {
                t.truncate(coll, object, 0);
            }
            if !data.is_empty() {
                t.write(coll, object, *offset, data);
            }
            t.truncate(coll, object, *size);
            if *last {
                t.kv_rm(coll, &missing_key(object));
            }
        }
        PushKind::RecoverRemove { object, .. } => {
            if store.stat(coll, object).is_ok() {
                t.remove(coll, object);
            }
            t.kv_rm(coll, &missing_key(object));
        }
        PushKind::MarkMissing { objects } => {
            if objects.len() > MAX_NAMES as usize {
                return Err(Failure::protocol(format!(
                    "{} objects to mark missing; at most {MAX_NAMES} per push",
                    objects.len()
                )));
            }
            for o in objects {
                t.kv_set(coll, &missing_key(o), &[]);
            }
        }
        PushKind::Log { last_version } => {
            let entries = pglog::decode_peer_entries(data)?;
            // Entries past the new end are divergent (never acknowledged): drop them.
            let past = pglog::key(last_version.saturating_add(1));
            t.kv_rm_range(coll, &past, &[pglog::LOG_PREFIX, &[0xff; 9][..]].concat());
            for e in &entries {
                pglog::append(&mut t, coll, e);
            }
            t.kv_set(coll, VERSION_KEY, &last_version.to_le_bytes());
            new_last = Some(*last_version);
        }
        PushKind::Repair {
            object,
            offset,
            size,
            ..
        } => {
            t.touch(coll, object);
            if !data.is_empty() {
                t.write(coll, object, *offset, data);
            }
            t.truncate(coll, object, *size);
        }
        PushKind::RepairRemove { object, .. } => {
            if store.stat(coll, object).is_ok() {
                t.remove(coll, object);
            }
        }
        PushKind::Activate { epoch } => {
            if *epoch <= last_epoch_started(store, pg) {
                return Ok(());
            }
            t.kv_set(coll, LES_KEY, &epoch.to_le_bytes());
        }
    }
    let seq = store.submit(&t)?;
    store.sync_through(seq)?;
    let map = shard.osd.map();
    let st = shard.pg(&map, pg);
    st.coll_exists = true;
    if let Some(v) = new_last {
        st.last_version = v;
    }
    Ok(())
}

#[cfg(test)]
mod activation_tests {
    use super::*;

    fn push(epoch: u64, kind: PushKind) -> PgPush {
        PgPush {
            epoch,
            pool: 1,
            pg: 0,
            primary: 0,
            kind,
        }
    }

    #[test]
    fn an_activation_is_taken_only_for_its_push_epoch_and_a_map_that_reached_it() {
        assert_eq!(
            bad_activation(&push(7, PushKind::Activate { epoch: 7 }), 7),
            None
        );
        assert_eq!(
            bad_activation(&push(7, PushKind::Activate { epoch: 7 }), 9),
            None
        );
        let e = bad_activation(&push(7, PushKind::Activate { epoch: 1000 }), 9);
        assert!(e.is_some_and(|e| e.contains("push of epoch 7")));
        let e = bad_activation(&push(10, PushKind::Activate { epoch: 10 }), 9);
        assert!(e.is_some_and(|e| e.contains("newer than this OSD's map")));
        assert_eq!(
            bad_activation(&push(10, PushKind::Reset), 9),
            None,
            "other pushes"
        );
    }
}
