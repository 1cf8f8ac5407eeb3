//! Writes. The primary assigns the PG version, sends the write to every replica and commits
//! it locally in parallel; the write completes when every member of the acting set holds it
//! at the pool's durability level (`inflight.rs`). Replicas apply the same transaction.

use super::{reply, txn};
use crate::mailbox::OnDurable;
use crate::peers::Link;
use crate::pgstate::WaitingOp;
use crate::shard::Shard;
use cairn_map::{ClusterMap, Durability, PgId};
use cairn_proto::msg::osd::{FailCode, OpKind, OpReply, OpRequest, RepOp, RepReply, REP};
use cairn_store::SharedBytes;
use cairn_transport::FrameSender;

/// Runs a client write on the primary (the caller checked that this OSD is primary).
pub fn primary_write(
    shard: &mut Shard,
    map: &ClusterMap,
    to: FrameSender,
    req_id: u64,
    req: OpRequest,
    data: SharedBytes,
) {
    let osd = shard.osd.clone();
    let Some(pool) = map.pools.get(&req.pool) else {
        return reply(&to, req_id, &OpReply::NoSuchPool, &[]);
    };
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let me = osd.id();
    let here = shard.index;
    let st = shard.pg(map, pg);
    let acting = st.placement.acting.clone();
    if acting.len() < pool.min_size as usize {
        let r = OpReply::Degraded {
            acting: acting.len() as u8,
            min_size: pool.min_size,
        };
        return reply(&to, req_id, &r, &[]);
    }
    if req.kind == OpKind::Remove
        && !(st.coll_exists
            && osd
                .store
                .stat(crate::pgstate::coll_of(pg), &req.object)
                .is_ok())
    {
        return reply(&to, req_id, &OpReply::NoSuchObject, &[]);
    }
    if req.kind == OpKind::Create && st.coll_exists {
        let coll = crate::pgstate::coll_of(pg);
        if let Some(r) = create_conflict(&osd.store, coll, &req.object, &data) {
            return reply(&to, req_id, &r, &[]);
        }
    }
    if let Some(r) = compare(&osd.store, st.coll_exists, pg, &req) {
        return reply(&to, req_id, &r, &[]);
    }
    if let Some(r) = admission(&osd, pg, &acting[1..], &req.kind, &data) {
        return reply(&to, req_id, &r, &[]);
    }
    let mut links = Vec::with_capacity(acting.len());
    for &member in &acting[1..] {
        match osd.peers.link(&osd.inflight, here, map, member) {
            Link::Up(to_member) => links.push(to_member),
            Link::Opening => {
                // Applied nowhere until every member can be sent it; runs again when the
                // connection is up (or has failed).
                let op = WaitingOp {
                    reply: to,
                    req_id,
                    req,
                    data,
                };
                return shard.pg(map, pg).link_waiting.push(op);
            }
            Link::Down => {
                // A member that cannot be reached would refuse every later write as after a
                // gap. Not applied here either: this OSD's copy must never be newer than
                // every other (a primary still catching up could not be the authority for
                // what it lacks). The PG peers again; the client sends the write again.
                tracing::warn!(pg = %pg, member, "a write cannot be sent to a member; peering the PG again");
                reply(&to, req_id, &OpReply::Retry, &[]);
                crate::peering::unpeer(shard, pg);
                return;
            }
        }
    }
    let st = shard.pg(map, pg);
    let version = st.last_version + 1;
    let t = match txn::build(
        pg,
        !st.coll_exists,
        version,
        map.epoch,
        &req.object,
        &req.kind,
        &data,
    ) {
        Ok(t) => t,
        Err(r) => return reply(&to, req_id, &r, &[]),
    };
    let what =
        crate::inflight::WriteWhat::now(crate::metrics::op_name(&req.kind), data.len() as u64);
    let w = osd
        .inflight
        .register(pg, version, acting.clone(), to, req_id, what);
    st.note_write(&req.object, w.clone());
    let rep = RepOp {
        epoch: map.epoch,
        pool: req.pool,
        pg: req.pg,
        version,
        primary: me,
        object: req.object,
        kind: req.kind,
    };
    let control = cairn_proto::msg::encode(&rep);
    let unsent = links
        .iter()
        // The replicas' frames hold the payload's buffer if they wait in a queue: no copy.
        .filter(|l| l.send_held(REP, w.tid, &control, data.clone()).is_err())
        .count();
    if unsent > 0 {
        // The connection broke just now: as for a member that cannot be reached (above).
        osd.inflight.fail(w.tid, &OpReply::Retry);
        tracing::warn!(pg = %pg, version, unsent, "a write could not be sent to every member; peering the PG again");
        crate::peering::unpeer(shard, pg);
        return;
    }
    let memory = pool.durability == Durability::Memory;
    match osd.store.submit(&t) {
        Ok(seq) => {
            // Sent to every member and applied here, not yet synced to this OSD's WAL.
            fail::fail_point!("osd_primary_before_wal_sync");
            osd.note_applied(pg.pool, true);
            st.coll_exists = true;
            st.last_version = version;
            // At the shard's next sync (end of the run of requests being handled): durability
            // `memory` once the WAL record is written (safe from any process crash), `wal`
            // once it is flushed.
            if memory {
                shard.after_write(seq, OnDurable::Local { tid: w.tid });
            } else {
                shard.after_sync(seq, OnDurable::Local { tid: w.tid });
            }
        }
        Err(e) => {
            tracing::error!(pg = %pg, error = %e, "local commit failed");
            osd.inflight.fail(w.tid, &super::store_failed(&e));
            osd.note_store_error(&e);
        }
    }
}

/// Room for client data below which a replica tells its primaries it is full: a volume
/// object's size, the most one ordinary write brings.
const FULL_BELOW: u64 = 4 << 20;

/// A replica's answer for a write it holds: `Done`, or `DoneButFull` when its store would
/// not admit a write of `FULL_BELOW` bytes of client data as a primary (or a small metadata
/// object).
pub fn held_reply(store: &cairn_store::Store) -> RepReply {
    let (data, metadata) = store.admissible_bytes();
    if data >= FULL_BELOW {
        return RepReply::Done;
    }
    RepReply::DoneButFull {
        metadata_too: metadata < txn::SMALL_OBJECT as u64,
    }
}

/// What a write must answer instead of being applied when there is no room for it: on this
/// OSD (as a primary admits writes), or on a member that said it is full. Writes that free
/// space (removes, truncates, zeroing) are always admitted.
fn admission(
    osd: &crate::context::Osd,
    pg: PgId,
    acting: &[u32],
    kind: &OpKind,
    data: &[u8],
) -> Option<OpReply> {
    if !matches!(
        kind,
        OpKind::Write { .. } | OpKind::WriteFull | OpKind::Create | OpKind::WriteFullIf { .. }
    ) {
        return None;
    }
    let metadata = txn::is_metadata(kind, data.len());
    if let Err(e) = osd.store.admits(data.len() as u64, metadata) {
        return Some(super::store_failed(&e));
    }
    let full = osd.inflight.full.full_member(acting, metadata)?;
    Some(OpReply::Failed {
        code: FailCode::NoSpace,
        why: format!(
            "no space for the write on osd.{full}, a member of pg {pg}: it is full (free \
             space: remove snapshots or data, or add capacity)"
        ),
    })
}

/// Largest object whose bytes a create compares with its own to recognise its own resend;
/// a larger existing object is simply `Exists`.
const CREATE_COMPARE_MAX: u64 = 1 << 20;

/// What a create of `obj` must answer instead of writing, if the object exists: `Ok` when it
/// already holds exactly `data` (this create, sent again), else `Exists`. Ops on one PG run in
/// order on its shard and a write is in the store's index once submitted, so no other create
/// can slip in between this check and this create's own write.
fn create_conflict(
    store: &cairn_store::Store,
    coll: u64,
    obj: &[u8],
    data: &[u8],
) -> Option<OpReply> {
    let stat = store.stat(coll, obj).ok()?;
    let same = stat.size == data.len() as u64
        && stat.size <= CREATE_COMPARE_MAX
        && store
            .read(coll, obj, 0, stat.size)
            .is_ok_and(|have| have == data);
    Some(if same {
        OpReply::Ok {
            version: 0,
            size: 0,
        }
    } else {
        OpReply::Exists
    })
}

/// What a conditional op must answer instead of writing, if its condition fails. Ops on one
/// PG run in order on its shard and a write is in the store's index once submitted, so the
/// contents compared are those every earlier write left.
fn compare(
    store: &cairn_store::Store,
    coll_exists: bool,
    pg: PgId,
    req: &OpRequest,
) -> Option<OpReply> {
    let (expected, removing) = match req.kind {
        OpKind::WriteFullIf { expected_tag } => (expected_tag, false),
        OpKind::RemoveIf { expected_tag } => (expected_tag, true),
        _ => return None,
    };
    let coll = crate::pgstate::coll_of(pg);
    let (exists, tag) = match super::read::contents_tag(store, coll_exists, coll, &req.object) {
        Ok(c) => c,
        Err(r) => return Some(r),
    };
    if removing && !exists {
        return Some(OpReply::NoSuchObject);
    }
    if tag == expected {
        return None;
    }
    Some(OpReply::Conflict)
}

pub use super::reply::rep_reply;

/// Applies a write forwarded by a primary.
pub fn handle_rep(shard: &mut Shard, to: FrameSender, req_id: u64, op: RepOp, data: SharedBytes) {
    let osd = shard.osd.clone();
    let map = osd.map();
    let pg = PgId {
        pool: op.pool,
        pg: op.pg,
    };
    let pool = map.pools.get(&op.pool);
    // Refuse a primary our (newer or equal) map does not know as primary: a deposed primary
    // must not get writes acknowledged. A write from a map this OSD could not get (the
    // connection waited for it) is refused too: the sender's role cannot be checked.
    let primary = pool.and_then(|_| shard.pg(&map, pg).placement.primary());
    // An object that hashes to another PG in this map was split off `pg`: writing it there
    // would strand it in the parent.
    let moved = map.object_pg(op.pool, &op.object) != Some(pg);
    if map.epoch < op.epoch || primary != Some(op.primary) || moved {
        return rep_reply(&to, req_id, &RepReply::Stale { epoch: map.epoch });
    }
    let memory = pool.is_some_and(|p| p.durability == Durability::Memory);
    let st = shard.pg(&map, pg);
    if op.version <= st.last_version {
        // A write from before the last recovery of this PG (or a duplicate): applying it
        // would take the PG back; the primary's client resends it as a new version.
        return rep_reply(&to, req_id, &RepReply::Stale { epoch: map.epoch });
    }
    if op.version > st.last_version.saturating_add(1) {
        // A write before this one never arrived: applying this one would leave a hole in
        // the PG's history here. The primary peers again, which fills it.
        tracing::warn!(pg = %pg, have = st.last_version, got = op.version, "replicated write after a gap; asking the primary to peer again");
        return rep_reply(
            &to,
            req_id,
            &RepReply::Gap {
                have: st.last_version,
            },
        );
    }
    let t = match txn::build(
        pg,
        !st.coll_exists,
        op.version,
        op.epoch,
        &op.object,
        &op.kind,
        &data,
    ) {
        // This OSD serves no reads of the PG: its copy stays out of the read cache.
        Ok(mut t) => {
            t.replica_copy();
            t
        }
        Err(r) => {
            let failed = RepReply::Failed {
                code: FailCode::Other,
                why: format!("{r:?}"),
            };
            return rep_reply(&to, req_id, &failed);
        }
    };
    match osd.store.submit(&t) {
        Ok(seq) => {
            // A replica applied a write, not yet synced nor answered.
            fail::fail_point!("osd_replica_applied");
            osd.note_applied(pg.pool, false);
            st.coll_exists = true;
            st.last_version = st.last_version.max(op.version);
            if memory {
                shard.after_write(seq, OnDurable::Ack { to, req_id });
            } else {
                shard.after_sync(seq, OnDurable::Ack { to, req_id });
            }
        }
        Err(e) => {
            tracing::error!(pg = %pg, error = %e, "replica commit failed");
            rep_reply(&to, req_id, &super::rep_store_failed(&e));
            osd.note_store_error(&e);
        }
    }
}
