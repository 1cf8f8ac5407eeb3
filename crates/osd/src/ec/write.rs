//! Client writes on an EC PG, on its primary: the write's old bytes are read first when it
//! changes part of a stripe below the object's end (from the data shard, over the link its
//! sub-writes take, or decoded from k others), then every present shard is sent its
//! sub-write under one PG version and the write completes when all of them hold it, as for
//! replicated writes (`inflight.rs`). Writes to an object wait while reads of its shards
//! are under way (`PgState::ec_busy`).

use super::gather::{gather, Source};
use super::plan::{self, Change, OldBytes};
use super::{member, read_padded, shard_coll, shard_size};
use crate::mailbox::{OnDurable, ShardMsg};
use crate::peers::Link;
use crate::pgstate::WaitingOp;
use crate::shard::Shard;
use cairn_ec::Codec;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::ec::{EcSubWrite, EC_WRITE};
use cairn_proto::msg::osd::{FailCode, OpKind, OpReply, OpRequest};
use cairn_store::{limits, SharedBytes};
use cairn_transport::FrameSender;
use std::sync::Arc;

/// What a write on an EC PG works with, read from the map and this OSD's shard.
pub(super) struct Ctx {
    pub pg: PgId,
    pub codec: Arc<Codec>,
    /// Per shard, its OSD when it is up.
    pub shards: Vec<Option<u32>>,
    /// The shard this OSD (the primary) holds.
    pub mine: u8,
    /// The object's size, `None` when it does not exist.
    pub size: Option<u64>,
    pub min_size: u8,
}

impl Ctx {
    pub(super) fn new(
        shard: &mut Shard,
        map: &ClusterMap,
        req: &OpRequest,
    ) -> Result<Ctx, OpReply> {
        let pg = PgId {
            pool: req.pool,
            pg: req.pg,
        };
        let pool = map.pools.get(&req.pool).ok_or(OpReply::NoSuchPool)?;
        let profile = pool.ec().ok_or(OpReply::NoSuchPool)?;
        let codec = super::codec(profile).ok_or_else(|| {
            OpReply::Invalid(format!("pool {} has a profile no codec takes", pool.name))
        })?;
        let me = shard.osd.id();
        let st = shard.pg(map, pg);
        let shards = map.pg_shards(pg, &st.placement);
        let mine = shards
            .iter()
            .position(|s| *s == Some(me))
            .ok_or(OpReply::NotPrimary { epoch: map.epoch })? as u8;
        let coll = shard_coll(pg, mine);
        let size = shard_size(&shard.osd.store, coll, &req.object)
            .map_err(|e| crate::op::reply::store_failed(&e))?;
        Ok(Ctx {
            pg,
            codec,
            shards,
            mine,
            size,
            min_size: pool.min_size,
        })
    }

    /// The OSDs of the shards that are up, this one first.
    pub(super) fn present(&self) -> Vec<u32> {
        let me = self.shards[self.mine as usize];
        me.into_iter()
            .chain(
                self.shards
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|s| Some(*s) != me),
            )
            .collect()
    }
}

/// The change an op makes, or the answer refusing it.
fn change_of<'a>(kind: &OpKind, data: &'a [u8], exists: bool) -> Result<Change<'a>, OpReply> {
    let in_range = |off: u64, len: u64| match off.checked_add(len) {
        Some(end) if end <= limits::OBJECT_SIZE => Ok(()),
        _ => Err(OpReply::Invalid(format!(
            "range {off}+{len} is beyond the largest object size ({} bytes)",
            limits::OBJECT_SIZE
        ))),
    };
    Ok(match *kind {
        OpKind::Write { offset } => {
            in_range(offset, data.len() as u64)?;
            Change::Write { offset, data }
        }
        OpKind::WriteFull => {
            in_range(0, data.len() as u64)?;
            Change::Full { data }
        }
        OpKind::Zero { offset, len } => {
            in_range(offset, len)?;
            Change::Zero { offset, len }
        }
        OpKind::Truncate { size } => {
            in_range(size, 0)?;
            Change::Truncate { size }
        }
        OpKind::Remove if !exists => return Err(OpReply::NoSuchObject),
        OpKind::Remove => Change::Remove,
        // Unlike on replicated pools, an existing object is `Exists` even when it holds these
        // very bytes (comparing would read and decode it): a resent create is told `Exists`.
        OpKind::Create if exists => return Err(OpReply::Exists),
        OpKind::Create => {
            in_range(0, data.len() as u64)?;
            Change::Full { data }
        }
        ref other => {
            return Err(OpReply::Invalid(format!(
                "{} is not served on erasure-coded pools: keep objects that need it (volume \
                 headers, leases) on a replicated pool",
                crate::metrics::op_name(other)
            )))
        }
    })
}

/// Runs a client write on an EC PG's primary (the caller checked the op and that the PG is
/// active here).
pub fn write(
    shard: &mut Shard,
    map: &ClusterMap,
    to: FrameSender,
    req_id: u64,
    req: OpRequest,
    data: SharedBytes,
) {
    let op = WaitingOp {
        reply: to,
        req_id,
        req,
        data,
    };
    let pg = PgId {
        pool: op.req.pool,
        pg: op.req.pg,
    };
    let st = shard.pg(map, pg);
    if let Some(busy) = st.ec_busy.get_mut(&op.req.object) {
        busy.queued.push_back(op);
        return;
    }
    let ctx = match Ctx::new(shard, map, &op.req) {
        Ok(c) => c,
        Err(r) => return super::reply(&op.reply, op.req_id, &r),
    };
    let change = match change_of(&op.req.kind, &op.data, ctx.size.is_some()) {
        Ok(c) => c,
        Err(r) => return super::reply(&op.reply, op.req_id, &r),
    };
    let p = ctx.codec.profile();
    let want = plan::reads(&p, ctx.size.unwrap_or(0), change);
    let mine = u32::from(ctx.mine);
    if want.iter().all(|r| r.shard == mine) {
        // Nothing to read, or only from this OSD's own shard: at once.
        let coll = shard_coll(pg, ctx.mine);
        let mut old = OldBytes::new();
        for r in want {
            let got = read_padded(
                &shard.osd.store,
                coll,
                &op.req.object,
                r.shard_off,
                r.len.into(),
            );
            match got {
                Ok(b) => {
                    old.insert(r, b);
                }
                Err(e) => {
                    return super::reply(&op.reply, op.req_id, &crate::op::reply::store_failed(&e))
                }
            }
        }
        return send(shard, map, op, ctx, old);
    }
    let Some(rt) = shard.osd.shard_runtime(shard.index) else {
        return super::reply(&op.reply, op.req_id, &OpReply::Retry);
    };
    st_busy(shard, map, pg, &op.req.object);
    let src = Source {
        osd: shard.osd.clone(),
        here: shard.index,
        epoch: map.epoch,
        pg,
        object: op.req.object.clone(),
        shards: ctx.shards.clone(),
        codec: ctx.codec.clone(),
    };
    rt.spawn(async move {
        let old = gather(&src, &want).await;
        let msg = ShardMsg::EcResume {
            pg,
            reply: op.reply,
            req_id: op.req_id,
            req: op.req,
            data: op.data,
            old,
        };
        src.osd.queue(pg, msg);
    });
}

/// Marks a read of `object`'s shards under way.
pub(super) fn st_busy(shard: &mut Shard, map: &ClusterMap, pg: PgId, object: &[u8]) {
    let st = shard.pg(map, pg);
    st.ec_busy.entry(object.to_vec()).or_default().tasks += 1;
}

/// A read of `object`'s shards ended: once none is under way, the writes queued behind them
/// run, in order.
pub fn unbusy(shard: &mut Shard, pg: PgId, object: &[u8]) {
    let map = shard.osd.map();
    let st = shard.pg(&map, pg);
    let Some(busy) = st.ec_busy.get_mut(object) else {
        return;
    };
    busy.tasks = busy.tasks.saturating_sub(1);
    if busy.tasks > 0 {
        return;
    }
    let queued = st
        .ec_busy
        .remove(object)
        .map(|b| b.queued)
        .unwrap_or_default();
    for op in queued {
        // Each goes through the checks again: the PG may have changed hands meanwhile.
        if let Err(r) = still_primary(shard, &map, &op.req) {
            super::reply(&op.reply, op.req_id, &r);
            continue;
        }
        write(shard, &map, op.reply, op.req_id, op.req, op.data);
    }
}

/// A write's old bytes were read (or could not be): it is sent, or answered.
pub fn resume(
    shard: &mut Shard,
    pg: PgId,
    op: WaitingOp,
    old: Result<OldBytes, super::error::GatherError>,
) {
    let map = shard.osd.map();
    let object = op.req.object.clone();
    match old {
        Err(e) => {
            tracing::warn!(pg = %pg, error = %e, "the bytes an EC write replaces could not be read; the client sends it again");
            super::reply(&op.reply, op.req_id, &OpReply::Retry);
        }
        Ok(old) => match still_primary(shard, &map, &op.req)
            .and_then(|()| Ctx::new(shard, &map, &op.req))
        {
            Ok(ctx) => send(shard, &map, op, ctx, old),
            Err(r) => super::reply(&op.reply, op.req_id, &r),
        },
    }
    unbusy(shard, pg, &object);
}

/// Whether this OSD still serves `req`'s PG as its active primary (an op that waited on it
/// runs only then).
fn still_primary(shard: &mut Shard, map: &ClusterMap, req: &OpRequest) -> Result<(), OpReply> {
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let me = shard.osd.id();
    let st = shard.pg(map, pg);
    if st.placement.primary() != Some(me) {
        return Err(OpReply::NotPrimary { epoch: map.epoch });
    }
    let iv = crate::peering::outcome::interval(map, &st.placement.acting);
    if st.peered.as_ref() != Some(&iv) {
        return Err(OpReply::Retry);
    }
    Ok(())
}

/// Sends every present shard its sub-write and applies this OSD's own.
fn send(shard: &mut Shard, map: &ClusterMap, op: WaitingOp, ctx: Ctx, old: OldBytes) {
    let osd = shard.osd.clone();
    let (pg, here, me) = (ctx.pg, shard.index, osd.id());
    let present = ctx.present();
    if present.len() < usize::from(ctx.min_size) {
        let r = OpReply::Degraded {
            acting: present.len() as u8,
            min_size: ctx.min_size,
        };
        return super::reply(&op.reply, op.req_id, &r);
    }
    let change = match change_of(&op.req.kind, &op.data, ctx.size.is_some()) {
        Ok(c) => c,
        Err(r) => return super::reply(&op.reply, op.req_id, &r),
    };
    let growing = matches!(op.req.kind, OpKind::Write { .. } | OpKind::WriteFull);
    if growing {
        if let Some(r) = admission(&osd, pg, &present[1..], op.data.len()) {
            return super::reply(&op.reply, op.req_id, &r);
        }
    }
    let plan = match plan::plan(&ctx.codec, ctx.size.unwrap_or(0), change, &old) {
        Ok(p) => p,
        Err(e) => {
            let r = OpReply::Failed {
                code: FailCode::Other,
                why: format!("pg {pg}: planning an EC write failed: {e}"),
            };
            return super::reply(&op.reply, op.req_id, &r);
        }
    };
    let mut links = Vec::with_capacity(present.len());
    for (i, member) in ctx.shards.iter().enumerate() {
        let Some(member) = *member else { continue };
        if member == me {
            continue;
        }
        match osd.peers.link(&osd.inflight, here, map, member) {
            Link::Up(l) => links.push((i, l)),
            Link::Opening => {
                // Sent to no shard until every one can be: runs again once the link is up.
                return shard.pg(map, pg).link_waiting.push(op);
            }
            Link::Down => {
                tracing::warn!(pg = %pg, member, "an EC sub-write cannot be sent to a shard; peering the PG again");
                super::reply(&op.reply, op.req_id, &OpReply::Retry);
                osd.queue(pg, ShardMsg::Unpeer(pg));
                return;
            }
        }
    }
    let st = shard.pg(map, pg);
    let version = st.last_version + 1;
    let what = crate::inflight::WriteWhat::now(
        crate::metrics::op_name(&op.req.kind),
        op.data.len() as u64,
    );
    let w = osd
        .inflight
        .register(pg, version, present, op.reply, op.req_id, what);
    st.note_write(&op.req.object, w.clone());
    let mut shard_writes = plan.shards;
    let mut sub_of = |i: usize| {
        let part = std::mem::take(&mut shard_writes[i]);
        let sub = EcSubWrite {
            epoch: map.epoch,
            pool: pg.pool,
            pg: pg.pg,
            shard: i as u8,
            version,
            primary: me,
            object: op.req.object.clone(),
            size: plan.size,
            ops: part.ops,
        };
        (sub, part.payload)
    };
    let mut unsent = 0;
    for (i, link) in &links {
        let (sub, payload) = sub_of(*i);
        let control = cairn_proto::msg::encode(&sub);
        if link.send_held(EC_WRITE, w.tid, &control, payload).is_err() {
            unsent += 1;
        }
        // Sent to one shard, not yet to the others: a crash here leaves that one ahead.
        fail::fail_point!("osd_ec_primary_sent_one");
    }
    if unsent > 0 {
        osd.inflight.fail(w.tid, &OpReply::Retry);
        tracing::warn!(pg = %pg, version, unsent, "an EC write could not be sent to every shard; peering the PG again");
        osd.queue(pg, ShardMsg::Unpeer(pg));
        return;
    }
    // Sent to every other shard; a crash here leaves them ahead of this one (peering rolls
    // the write forward or back).
    fail::fail_point!("osd_ec_primary_sent");
    let (own, payload) = sub_of(usize::from(ctx.mine));
    let payload = SharedBytes::new(payload);
    match member::apply(shard, map, &own, &payload) {
        Ok(applied) => {
            osd.note_applied(pg.pool, true);
            shard.pg(map, pg).last_version = version;
            applied.then(shard, OnDurable::Local { tid: w.tid });
        }
        Err(r) => {
            let failed = match r {
                cairn_proto::msg::osd::RepReply::Failed { code, why } => {
                    OpReply::Failed { code, why }
                }
                _ => OpReply::Retry,
            };
            osd.inflight.fail(w.tid, &failed);
        }
    }
}

/// The answer refusing a write that brings data when this OSD, or a shard member that said
/// so, has no room for it.
fn admission(osd: &crate::context::Osd, pg: PgId, members: &[u32], len: usize) -> Option<OpReply> {
    if let Err(e) = osd.store.admits(len as u64, false) {
        return Some(crate::op::reply::store_failed(&e));
    }
    let full = osd.inflight.full.full_member(members, false)?;
    Some(OpReply::Failed {
        code: FailCode::NoSpace,
        why: format!(
            "no space for the write on osd.{full}, a shard of pg {pg}: it is full (free space: \
             remove snapshots or data, or add capacity)"
        ),
    })
}
