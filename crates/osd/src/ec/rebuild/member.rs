//! A shard member's side of a rebuild: it says what it holds of objects, takes rebuilt shard
//! objects, and takes the authoritative log. The primary's own shard goes through here too
//! (on its shard thread). Pushes and logs are durable before they are answered: a log must
//! never be durable before the objects it vouches for.

pub use super::request::Request;
use crate::ec::member::check_role;
use crate::ec::{object_state, shard_coll, SIZE_ATTR, VERSION_ATTR};
use crate::pglog::{self, LogEntry};
use crate::pgstate::VERSION_KEY;
use crate::shard::Shard;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::ec_rebuild::{
    EcChecked, EcPush, EcSetLog, EcStat, EcStatReply, EcStatWhich, EC_STAT_REPLY, MAX_EC_STAT,
};
use cairn_proto::msg::osd::FailCode;
use cairn_proto::msg::osd::RepReply;
use cairn_proto::msg::peering::RECOVERY_CHUNK;
use cairn_store::Transaction;
use cairn_transport::FrameSender;

/// Serves a rebuild request from another OSD and answers it.
pub fn handle(shard: &mut Shard, to: FrameSender, req_id: u64, req: Request) {
    let map = shard.osd.map();
    match req {
        Request::Stat(q) => {
            let r = stat(shard, &map, &q);
            let _ = to.send(EC_STAT_REPLY, req_id, &cairn_proto::msg::encode(&r), &[]);
        }
        other => {
            let r = apply(shard, &map, &other);
            crate::op::reply::rep_reply(&to, req_id, &r);
        }
    }
}

/// Applies a push or a log (a stat is no change: refused).
pub fn apply(shard: &mut Shard, map: &ClusterMap, req: &Request) -> RepReply {
    match req {
        Request::Push(p, data) => push(shard, map, p, data),
        Request::SetLog(l, entries) => set_log(shard, map, l, entries),
        Request::Stat(_) => refused("an EC stat changes nothing".into()),
    }
}

fn pg_of(pool: u32, pg: u32) -> PgId {
    PgId { pool, pg }
}

/// The state of each object `q` names in this OSD's shard.
pub fn stat(shard: &mut Shard, map: &ClusterMap, q: &EcStat) -> EcStatReply {
    let pg = pg_of(q.pool, q.pg);
    if let Err(epoch) = check_role(shard, map, pg, None, q.shard) {
        return EcStatReply::Stale { epoch };
    }
    let coll = shard_coll(pg, q.shard);
    let store = &shard.osd.store;
    let r = match &q.which {
        EcStatWhich::Named(objects) => objects
            .iter()
            .map(|o| object_state(store, coll, o))
            .collect::<Result<Vec<_>, _>>()
            .map(EcStatReply::States),
        EcStatWhich::After(after) => list(store, coll, after),
        EcStatWhich::Verify(objects) => objects
            .iter()
            .map(|o| verify(store, coll, o))
            .collect::<Result<Vec<_>, _>>()
            .map(EcStatReply::Checked),
    };
    r.unwrap_or_else(|e| EcStatReply::Failed {
        code: crate::op::reply::fail_code(&e),
        why: format!("shard {} of pg {pg}: {e}", q.shard),
    })
}

/// What the shard holds of `obj`, read whole from the device (checked against the store's
/// block checksums).
fn verify(
    store: &cairn_store::Store,
    coll: cairn_store::CollId,
    obj: &[u8],
) -> Result<EcChecked, cairn_store::StoreError> {
    let Some(state) = object_state(store, coll, obj)? else {
        return Ok(EcChecked::Absent);
    };
    let size = match store.stat(coll, obj) {
        Ok(st) => st.size,
        Err(cairn_store::StoreError::NoObject { .. }) => return Ok(EcChecked::Absent),
        Err(e) => return Err(e),
    };
    let mut off = 0;
    while off < size {
        match store.read_uncached(coll, obj, off, RECOVERY_CHUNK) {
            Ok(b) if b.is_empty() => break,
            Ok(b) => off += b.len() as u64,
            Err(e) if crate::op::reply::fail_code(&e) == FailCode::Corrupt => {
                return Ok(EcChecked::Damaged {
                    state,
                    why: e.to_string(),
                })
            }
            Err(e) => return Err(e),
        }
    }
    Ok(EcChecked::Whole(state))
}

/// Up to [`MAX_EC_STAT`] names of the shard's objects after `after` (empty: from the first).
fn list(
    store: &cairn_store::Store,
    coll: cairn_store::CollId,
    after: &[u8],
) -> Result<EcStatReply, cairn_store::StoreError> {
    if !store.collection_exists(coll) {
        return Ok(EcStatReply::Listed {
            names: Vec::new(),
            more: false,
        });
    }
    let from = (!after.is_empty()).then_some(after);
    let mut names = store.list_objects(coll, from, MAX_EC_STAT + 1)?;
    let more = names.len() > MAX_EC_STAT;
    names.truncate(MAX_EC_STAT);
    Ok(EcStatReply::Listed { names, more })
}

/// Applies a push of a rebuilt shard object (or its removal), durably.
fn push(shard: &mut Shard, map: &ClusterMap, p: &EcPush, data: &[u8]) -> RepReply {
    let pg = pg_of(p.pool, p.pg);
    if let Err(epoch) = check_role(shard, map, pg, Some(p.primary), p.shard) {
        return RepReply::Stale { epoch };
    }
    if map.object_pg(pg.pool, &p.object) != Some(pg) {
        return refused(format!(
            "object {:?} pushed to shard {} of pg {pg} belongs to another PG",
            String::from_utf8_lossy(&p.object),
            p.shard
        ));
    }
    let end = p.offset.checked_add(data.len() as u64);
    if end.is_none_or(|e| e > cairn_store::limits::OBJECT_SIZE) {
        return refused(format!(
            "EC push at {} of {} bytes reaches past the largest object",
            p.offset,
            data.len()
        ));
    }
    let coll = shard_coll(pg, p.shard);
    let store = &shard.osd.store;
    let mut t = Transaction::new();
    if !store.collection_exists(coll) {
        t.create_collection(coll);
    }
    match p.state {
        None => {
            if store.stat(coll, &p.object).is_ok() {
                t.remove(coll, &p.object);
            }
        }
        Some(state) => {
            t.touch(coll, &p.object);
            if p.offset == 0 {
                t.truncate(coll, &p.object, 0);
            }
            if !data.is_empty() {
                t.write(coll, &p.object, p.offset, data);
            }
            t.set_attr(coll, &p.object, SIZE_ATTR, &state.size.to_le_bytes());
            // Version 0 until the last piece: a push cut short leaves no whole-looking object.
            let version = if p.last { state.version } else { 0 };
            t.set_attr(coll, &p.object, VERSION_ATTR, &version.to_le_bytes());
        }
    }
    // A member is about to store one piece of a rebuilt shard object.
    fail::fail_point!("osd_ec_rebuild_push");
    durably(shard, &t)
}

/// Takes the authoritative log after `l.from`, up to `l.version`, durably.
fn set_log(shard: &mut Shard, map: &ClusterMap, l: &EcSetLog, entries: &[LogEntry]) -> RepReply {
    let pg = pg_of(l.pool, l.pg);
    if let Err(epoch) = check_role(shard, map, pg, Some(l.primary), l.shard) {
        return RepReply::Stale { epoch };
    }
    // The authority's kept entries after `from`, up to `version`, consecutive (a backfill's
    // start where the authority's log does).
    let n = entries.len() as u64;
    let fits = l.version.checked_sub(l.from).is_some_and(|span| {
        n <= span
            && (n == span || l.from == 0)
            && entries
                .iter()
                .zip(l.version + 1 - n..)
                .all(|(e, v)| e.version == v)
    });
    if !fits {
        return refused(format!(
            "EC log for shard {} of pg {pg} from {} to {} carries {} entries out of that order",
            l.shard,
            l.from,
            l.version,
            entries.len()
        ));
    }
    let coll = shard_coll(pg, l.shard);
    let mut t = Transaction::new();
    if !shard.osd.store.collection_exists(coll) {
        t.create_collection(coll);
    }
    let end = [pglog::LOG_PREFIX, &[0xff; 9][..]].concat();
    t.kv_rm_range(coll, &pglog::key(l.from.saturating_add(1)), &end);
    for e in entries {
        pglog::append(&mut t, coll, e);
    }
    t.kv_set(coll, VERSION_KEY, &l.version.to_le_bytes());
    let r = durably(shard, &t);
    if matches!(r, RepReply::Done) {
        shard.pg(map, pg).ec_versions.insert(l.shard, l.version);
    }
    r
}

fn refused(why: String) -> RepReply {
    RepReply::Failed {
        code: FailCode::Other,
        why,
    }
}

/// Submits `t` and waits until it is on stable storage.
fn durably(shard: &mut Shard, t: &Transaction) -> RepReply {
    let store = &shard.osd.store;
    let r = store.submit(t).and_then(|seq| store.sync_through(seq));
    match r {
        Ok(_) => RepReply::Done,
        Err(e) => {
            shard.osd.note_store_error(&e);
            tracing::error!(error = %e, "applying an EC rebuild step failed");
            crate::op::reply::rep_store_failed(&e)
        }
    }
}
