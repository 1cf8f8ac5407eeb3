//! Client ops: the checks every op passes (map epoch, pool, primary), then reads
//! (`read.rs`) or writes (`write.rs`).

pub mod read;
pub mod reply;
pub mod txn;
pub mod write;

pub use reply::{rep_store_failed, reply, reply_data, store_failed};

use crate::shard::Shard;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::osd::{OpReply, OpRequest, MAX_OBJECT_NAME};
use cairn_store::SharedBytes;
use cairn_transport::FrameSender;
use std::sync::Arc;

/// Where a read that needs a data device reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceReads {
    /// On a reader thread (`readers.rs`), the shard going on meanwhile.
    Readers,
    /// On the shard's thread (a read a reader thread gave back).
    InPlace,
}

/// Runs one client op on the shard owning its PG.
pub fn handle_client_op(
    shard: &mut Shard,
    to: FrameSender,
    req_id: u64,
    req: OpRequest,
    data: SharedBytes,
) {
    handle_client_op_at(shard, to, req_id, req, data, DeviceReads::Readers)
}

/// [`handle_client_op`], with reads that need a device read `at` a chosen place.
pub fn handle_client_op_at(
    shard: &mut Shard,
    to: FrameSender,
    req_id: u64,
    req: OpRequest,
    data: SharedBytes,
    at: DeviceReads,
) {
    shard.osd.recovery.note_client_op();
    if !shard.osd.lease.valid() {
        // Cut off from the monitors: another OSD may be primary by now (lease.rs).
        reply(&to, req_id, &OpReply::Retry, &[]);
        return;
    }
    let map = shard.osd.map();
    if let Err(r) = check(shard, &map, &req) {
        reply(&to, req_id, &r, &[]);
        return;
    }
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let ready = crate::peering::ready(shard, &map, pg);
    if !ready {
        if let Some(waiting_for) = crate::peering::down_waiting_for(shard.pg(&map, pg)) {
            reply(&to, req_id, &OpReply::PgDown { waiting_for }, &[]);
            return;
        }
    }
    if !ready || crate::peering::must_catch_up(shard.pg(&map, pg), &req) {
        shard.pg(&map, pg).waiting.push(crate::pgstate::WaitingOp {
            reply: to,
            req_id,
            req,
            data,
        });
        return;
    }
    if req.kind.is_write() && !shard.pg(&map, pg).link_waiting.is_empty() {
        // Behind a write waiting for a peer connection: PG order is kept.
        shard
            .pg(&map, pg)
            .link_waiting
            .push(crate::pgstate::WaitingOp {
                reply: to,
                req_id,
                req,
                data,
            });
        return;
    }
    let ec = map.pools.get(&req.pool).is_some_and(|p| p.ec().is_some());
    match (req.kind.is_write(), ec) {
        (true, false) => write::primary_write(shard, &map, to, req_id, req, data),
        (false, false) => read::read(shard, &map, to, req_id, req, at),
        (true, true) => crate::ec::write(shard, &map, to, req_id, req, data),
        (false, true) => crate::ec::read(shard, &map, to, req_id, req),
    }
}

/// Refuses an op this OSD must not serve at its current map.
fn check(shard: &mut Shard, map: &Arc<ClusterMap>, req: &OpRequest) -> Result<(), OpReply> {
    if req.epoch > map.epoch {
        // The client knows a newer map: this OSD may no longer be primary.
        return Err(OpReply::NotPrimary { epoch: map.epoch });
    }
    if map.is_blocklisted(req.instance) {
        // A newer holder took the data over: nothing of this client may land after it.
        return Err(OpReply::Fenced);
    }
    let Some(pool) = map.pools.get(&req.pool) else {
        return Err(OpReply::NoSuchPool);
    };
    if req.pg >= pool.pg_count {
        return Err(OpReply::Invalid(format!(
            "pg {} out of range (pool {} has {})",
            req.pg, pool.name, pool.pg_count
        )));
    }
    if req.object.len() > MAX_OBJECT_NAME {
        return Err(OpReply::Invalid(format!(
            "object name of {} bytes is over the limit of {MAX_OBJECT_NAME}",
            req.object.len()
        )));
    }
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    if !req.object.is_empty() && map.object_pg(req.pool, &req.object) != Some(pg) {
        if req.epoch < map.epoch {
            // The client's map is older: the PG count grew since (a split).
            return Err(OpReply::NotPrimary { epoch: map.epoch });
        }
        return Err(OpReply::Invalid(format!(
            "object does not belong to pg {pg}: client placement differs (versions?)"
        )));
    }
    let me = shard.osd.id();
    let st = shard.pg(map, pg);
    if st.placement.primary() != Some(me) {
        return Err(OpReply::NotPrimary { epoch: map.epoch });
    }
    if req.epoch < st.interval_since {
        // Sent to an earlier interval of the PG: the client may have sent it again since,
        // to another primary (this one was cut off), and a copy held up in the network or
        // in a queue here must not run after newer writes. A client still waiting resends
        // it with the current map.
        return Err(OpReply::NotPrimary { epoch: map.epoch });
    }
    Ok(())
}
