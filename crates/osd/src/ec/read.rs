//! Reads, stats and listings on an EC PG, on its primary. A read fetches only the data
//! pieces its range covers, from the data shards (this OSD's own from its store), or decodes
//! them from any k shards when one is absent or fails. Like replicated reads it waits for a
//! write to its object in flight; writes to the object wait for it in turn
//! (`PgState::ec_busy`), so the shards it reads hold the same writes.

use super::gather::{gather, Source};
use super::plan::OldRange;
use super::write::{st_busy, Ctx};
use super::{read_padded, shard_coll};
use crate::mailbox::ShardMsg;
use crate::pgstate::ParkedRead;
use crate::shard::Shard;
use cairn_ec::layout;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::osd::{OpKind, OpReply, OpRequest, MAX_LIST};
use cairn_transport::FrameSender;
use std::time::Instant;

/// Largest read one op returns (as for replicated pools).
const MAX_READ: u64 = 16 << 20;

/// Serves a non-write op on an EC PG (the caller checked that this OSD is its primary).
pub fn read(shard: &mut Shard, map: &ClusterMap, to: FrameSender, req_id: u64, req: OpRequest) {
    let started = Instant::now();
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let st = shard.pg(map, pg);
    let read = ParkedRead {
        reply: to,
        req_id,
        req,
    };
    let Some(ParkedRead {
        reply: to,
        req_id,
        req,
    }) = st.park_behind_write(read)
    else {
        return;
    };
    let ctx = match Ctx::new(shard, map, &req) {
        Ok(c) => c,
        Err(r) => return super::reply(&to, req_id, &r),
    };
    let (offset, len) = match req.kind {
        OpKind::Read { len, .. } if len > MAX_READ => {
            let r = OpReply::Invalid(format!(
                "read of {len} bytes is over the limit of {MAX_READ}"
            ));
            return super::reply(&to, req_id, &r);
        }
        OpKind::Read { offset, len } => (offset, len),
        OpKind::Stat => {
            let r = match ctx.size {
                Some(size) => OpReply::Ok { version: 0, size },
                None => OpReply::NoSuchObject,
            };
            return super::reply(&to, req_id, &r);
        }
        OpKind::List { ref after, max } => {
            let r = list(shard, &ctx, after.as_deref(), max);
            return super::reply(&to, req_id, &r);
        }
        ref other => {
            let r = OpReply::Invalid(format!(
                "{} is not served on erasure-coded pools: keep objects that need it on a \
                 replicated pool",
                crate::metrics::op_name(other)
            ));
            return super::reply(&to, req_id, &r);
        }
    };
    let Some(size) = ctx.size else {
        return super::reply(&to, req_id, &OpReply::NoSuchObject);
    };
    let end = offset.saturating_add(len).min(size);
    let len = end.saturating_sub(offset);
    let p = ctx.codec.profile();
    let pieces: Vec<layout::Piece> = layout::pieces(&p, offset, len).collect();
    let want: Vec<OldRange> = pieces
        .iter()
        .map(|pc| OldRange {
            shard: pc.chunk,
            shard_off: pc.shard_off(&p),
            len: pc.len,
        })
        .collect();
    let answer = Answer {
        osd: shard.osd.clone(),
        pg,
        to,
        req_id,
        started,
        size,
        len,
        pieces,
    };
    let mine = u32::from(ctx.mine);
    if want.iter().all(|r| r.shard == mine) {
        let coll = shard_coll(pg, ctx.mine);
        let mut buf = Vec::with_capacity(len as usize);
        for r in &want {
            match read_padded(
                &shard.osd.store,
                coll,
                &req.object,
                r.shard_off,
                r.len.into(),
            ) {
                Ok(b) => buf.extend_from_slice(&b),
                Err(e) => {
                    return super::reply(&answer.to, req_id, &crate::op::reply::store_failed(&e))
                }
            }
        }
        return answer.send(buf);
    }
    let Some(rt) = shard.osd.shard_runtime(shard.index) else {
        return super::reply(&answer.to, req_id, &OpReply::Retry);
    };
    st_busy(shard, map, pg, &req.object);
    let src = Source {
        osd: shard.osd.clone(),
        here: shard.index,
        epoch: map.epoch,
        pg,
        object: req.object.clone(),
        shards: ctx.shards,
        codec: ctx.codec,
    };
    rt.spawn(async move {
        match gather(&src, &want).await {
            Ok(mut got) => {
                let mut buf = vec![0u8; answer.len as usize];
                for (pc, r) in answer.pieces.iter().zip(&want) {
                    let bytes = got.remove(r).unwrap_or_default();
                    let at = pc.buf_off as usize;
                    let n = bytes.len().min(pc.len as usize);
                    buf[at..at + n].copy_from_slice(&bytes[..n]);
                }
                answer.send(buf);
            }
            Err(e) => {
                tracing::warn!(pg = %pg, error = %e, "an EC read failed; the client sends it again");
                super::reply(&answer.to, answer.req_id, &OpReply::Retry);
            }
        }
        let object = src.object;
        src.osd.queue(pg, ShardMsg::EcReadDone { pg, object });
    });
}

/// What a read's reply needs.
struct Answer {
    osd: std::sync::Arc<crate::context::Osd>,
    pg: PgId,
    to: FrameSender,
    req_id: u64,
    started: Instant,
    size: u64,
    len: u64,
    pieces: Vec<layout::Piece>,
}

impl Answer {
    fn send(self, data: Vec<u8>) {
        let out = data.len() as u64;
        let r = OpReply::Ok {
            version: 0,
            size: self.size,
        };
        crate::op::reply::reply_data(&self.to, self.req_id, &r, data);
        self.osd
            .inflight
            .totals
            .op(self.pg.pool, false, self.started, 0, out);
        if let Some(m) = &self.osd.metrics {
            m.op_done(self.pg.pool, "read", self.started, (0, out));
        }
    }
}

/// The objects of the PG, from this OSD's shard (every shard holds every object).
fn list(shard: &Shard, ctx: &Ctx, after: Option<&[u8]>, max: u32) -> OpReply {
    let coll = shard_coll(ctx.pg, ctx.mine);
    if !shard.osd.store.collection_exists(coll) {
        return OpReply::Listed {
            names: Vec::new(),
            more: false,
        };
    }
    let max = max.clamp(1, MAX_LIST) as usize;
    match shard.osd.store.list_objects(coll, after, max + 1) {
        Ok(mut names) => {
            let more = names.len() > max;
            names.truncate(max);
            OpReply::Listed { names, more }
        }
        Err(e) => crate::op::reply::store_failed(&e),
    }
}
