//! A shard member's side of an EC PG: it applies the primary's sub-writes to its shard
//! object (in version order, as replicas do), serves reads of its shard, and says what it
//! holds when the primary peers. The primary applies its own shard's sub-writes here too.

use super::{read_padded, shard_coll, shard_size, shard_version, SIZE_ATTR, VERSION_ATTR};
use crate::mailbox::OnDurable;
use crate::pglog::{self, LogEntry, LogOp};
use crate::pgstate::VERSION_KEY;
use crate::shard::Shard;
use cairn_map::{ClusterMap, Durability, PgId};
use cairn_proto::msg::ec::{
    EcInfo, EcQuery, EcRead, EcReadReply, EcShardOp, EcSubWrite, EC_INFO, EC_READ_REPLY,
};
use cairn_proto::msg::osd::{FailCode, RepReply};
use cairn_store::{SharedBytes, Transaction};
use cairn_transport::FrameSender;

/// Whether this OSD's map has `primary` as primary of `pg` and this OSD holding `shard`:
/// `Err` is the member's epoch (the sender is stale, or this OSD is).
pub(crate) fn check_role(
    shard: &mut Shard,
    map: &ClusterMap,
    pg: PgId,
    primary: Option<u32>,
    which: u8,
) -> Result<(), u64> {
    let me = shard.osd.id();
    let pool = map.pools.get(&pg.pool).filter(|p| p.ec().is_some());
    if pool.is_none_or(|p| pg.pg >= p.pg_count) {
        return Err(map.epoch);
    }
    let st = shard.pg(map, pg);
    if primary.is_some() && st.placement.primary() != primary {
        return Err(map.epoch);
    }
    let shards = map.pg_shards(pg, &st.placement);
    if shards.get(usize::from(which)).copied().flatten() != Some(me) {
        return Err(map.epoch);
    }
    Ok(())
}

/// The last version of shard `which` of `pg` here.
pub fn version(shard: &mut Shard, map: &ClusterMap, pg: PgId, which: u8) -> u64 {
    let osd = shard.osd.clone();
    *shard
        .pg(map, pg)
        .ec_versions
        .entry(which)
        .or_insert_with(|| shard_version(&osd.store, shard_coll(pg, which)))
}

/// A sub-write from the primary: applied and answered once durable, or refused.
pub fn handle_write(
    shard: &mut Shard,
    to: FrameSender,
    req_id: u64,
    sub: EcSubWrite,
    data: SharedBytes,
) {
    let map = shard.osd.map();
    let pg = PgId {
        pool: sub.pool,
        pg: sub.pg,
    };
    let reply = |r: &RepReply| crate::op::reply::rep_reply(&to, req_id, r);
    if map.epoch < sub.epoch {
        return reply(&RepReply::Stale { epoch: map.epoch });
    }
    if let Err(epoch) = check_role(shard, &map, pg, Some(sub.primary), sub.shard) {
        return reply(&RepReply::Stale { epoch });
    }
    let have = version(shard, &map, pg, sub.shard);
    if sub.version <= have {
        return reply(&RepReply::Stale { epoch: map.epoch });
    }
    if sub.version > have + 1 {
        tracing::warn!(pg = %pg, shard = sub.shard, have, got = sub.version, "EC sub-write after a gap; asking the primary to peer again");
        return reply(&RepReply::Gap { have });
    }
    match apply(shard, &map, &sub, &data) {
        Ok(applied) => applied.then(shard, OnDurable::Ack { to, req_id }),
        Err(r) => reply(&r),
    }
}

/// A sub-write submitted to the store: what to do once it is durable at its pool's level.
pub struct Applied {
    seq: u64,
    memory: bool,
}

impl Applied {
    /// `then` once durable: `memory` pools once written to the WAL, others once flushed.
    pub fn then(self, shard: &mut Shard, then: OnDurable) {
        if self.memory {
            shard.after_write(self.seq, then);
        } else {
            shard.after_sync(self.seq, then);
        }
    }
}

/// Applies a sub-write to this OSD's shard (checked by the caller: its role, its version
/// following the shard's last): submitted to the store, not yet durable.
pub fn apply(
    shard: &mut Shard,
    map: &ClusterMap,
    sub: &EcSubWrite,
    data: &SharedBytes,
) -> Result<Applied, RepReply> {
    let osd = shard.osd.clone();
    let pg = PgId {
        pool: sub.pool,
        pg: sub.pg,
    };
    if let Some(op) = sub.ops.iter().find(|op| !in_object(op)) {
        return Err(RepReply::Failed {
            code: FailCode::Other,
            why: format!(
                "EC sub-write op {op:?} reaches past the largest object size ({} bytes)",
                cairn_store::limits::OBJECT_SIZE
            ),
        });
    }
    let t = transaction(&osd.store, pg, sub, data).map_err(|e| {
        osd.note_store_error(&e);
        crate::op::reply::rep_store_failed(&e)
    })?;
    let seq = match osd.store.submit(&t) {
        Ok(seq) => seq,
        Err(e) => {
            tracing::error!(pg = %pg, shard = sub.shard, error = %e, "EC sub-write failed");
            osd.note_store_error(&e);
            return Err(crate::op::reply::rep_store_failed(&e));
        }
    };
    // A member applied a sub-write, not yet durable nor answered.
    fail::fail_point!("osd_ec_shard_applied");
    shard.pg(map, pg).ec_versions.insert(sub.shard, sub.version);
    let memory = map
        .pools
        .get(&pg.pool)
        .is_some_and(|p| p.durability == Durability::Memory);
    Ok(Applied { seq, memory })
}

/// Whether an op stays within the largest object a store holds (a primary's claim, checked).
fn in_object(op: &EcShardOp) -> bool {
    let end = match *op {
        EcShardOp::Write { offset, len } | EcShardOp::Xor { offset, len } => {
            offset.checked_add(u64::from(len))
        }
        EcShardOp::Truncate { len } => Some(len),
        EcShardOp::Remove => Some(0),
    };
    end.is_some_and(|e| e <= cairn_store::limits::OBJECT_SIZE)
}

/// The store transaction of a sub-write: its ops on the shard object, the object's size, the
/// shard's version and log entry.
fn transaction(
    store: &cairn_store::Store,
    pg: PgId,
    sub: &EcSubWrite,
    data: &SharedBytes,
) -> Result<Transaction, cairn_store::StoreError> {
    let coll = shard_coll(pg, sub.shard);
    let obj = sub.object.as_slice();
    let mut t = Transaction::new();
    if !store.collection_exists(coll) {
        t.create_collection(coll);
    }
    let removes = sub.ops.iter().any(|op| matches!(op, EcShardOp::Remove));
    if !removes {
        t.touch(coll, obj);
    }
    let mut at = 0usize;
    for op in &sub.ops {
        let len = op.payload_len() as usize;
        // In range: the server checked the ops against the payload (`EcSubWrite::check`).
        let bytes = data.slice(at..at + len).unwrap_or_default();
        at += len;
        match *op {
            EcShardOp::Write { offset, .. } => {
                t.write_shared(coll, obj, offset, bytes);
            }
            EcShardOp::Xor { offset, len } => {
                let mut parity = read_padded(store, coll, obj, offset, u64::from(len))?;
                cairn_ec::codec::xor_into(&mut parity, &bytes);
                t.write(coll, obj, offset, &parity);
            }
            EcShardOp::Truncate { len } => {
                t.truncate(coll, obj, len);
            }
            EcShardOp::Remove => {
                if shard_size(store, coll, obj)?.is_some() {
                    t.remove(coll, obj);
                }
            }
        }
    }
    if !removes {
        t.set_attr(coll, obj, SIZE_ATTR, &sub.size.to_le_bytes());
        t.set_attr(coll, obj, VERSION_ATTR, &sub.version.to_le_bytes());
    }
    t.replicated();
    t.kv_set(coll, VERSION_KEY, &sub.version.to_le_bytes());
    let entry = LogEntry {
        version: sub.version,
        epoch: sub.epoch,
        object: sub.object.clone(),
        op: if removes {
            LogOp::Remove
        } else {
            LogOp::Modify
        },
    };
    pglog::append(&mut t, coll, &entry);
    Ok(t)
}

/// Reads ranges of this OSD's shard for the primary.
pub fn handle_read(shard: &mut Shard, to: FrameSender, req_id: u64, req: EcRead) {
    let map = shard.osd.map();
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let (r, data) = match check_role(shard, &map, pg, None, req.shard) {
        Err(epoch) => (EcReadReply::Stale { epoch }, Vec::new()),
        Ok(()) => read_ranges(&shard.osd.store, pg, &req),
    };
    if matches!(
        r,
        EcReadReply::Failed {
            code: FailCode::Corrupt,
            ..
        }
    ) {
        tracing::error!(pg = %pg, shard = req.shard, "a chunk of an EC shard failed its checksum");
    }
    let control = cairn_proto::msg::encode(&r);
    let _ = to.send_held(EC_READ_REPLY, req_id, &control, data);
}

/// The ranges a read asks for, back to back, zeros past the shard's end.
pub fn read_ranges(store: &cairn_store::Store, pg: PgId, req: &EcRead) -> (EcReadReply, Vec<u8>) {
    let coll = shard_coll(pg, req.shard);
    let failed = |e: cairn_store::StoreError| EcReadReply::Failed {
        code: crate::op::reply::fail_code(&e),
        why: format!("osd shard {} of pg {pg}: {e}", req.shard),
    };
    let size = match shard_size(store, coll, &req.object) {
        Ok(s) => s,
        Err(e) => return (failed(e), Vec::new()),
    };
    let mut out = Vec::new();
    for &(offset, len) in &req.ranges {
        match read_padded(store, coll, &req.object, offset, u64::from(len)) {
            Ok(d) => out.extend_from_slice(&d),
            Err(e) => return (failed(e), Vec::new()),
        }
    }
    let r = EcReadReply::Data {
        exists: size.is_some(),
        size: size.unwrap_or(0),
    };
    (r, out)
}

/// Says what this OSD holds of a shard of a PG: its last version, and its log entries as
/// the payload.
pub fn handle_query(shard: &mut Shard, to: FrameSender, req_id: u64, q: EcQuery) {
    let map = shard.osd.map();
    let pg = PgId {
        pool: q.pool,
        pg: q.pg,
    };
    let coll = shard_coll(pg, q.shard);
    let entries = match super::shard_entries(&shard.osd.store, coll) {
        Ok(e) => e,
        Err(e) => {
            let f = crate::failure::Failure::from(e);
            tracing::error!(pg = %pg, shard = q.shard, error = %f, "reading an EC shard's log");
            let r = crate::peering::refusal::Refusal::from(f).reply();
            let control = cairn_proto::msg::encode(&r);
            let _ = to.send(cairn_proto::msg::peering::PG_DONE, req_id, &control, &[]);
            return;
        }
    };
    let info = EcInfo {
        exists: shard.osd.store.collection_exists(coll),
        last_version: version(shard, &map, pg, q.shard),
    };
    let control = cairn_proto::msg::encode(&info);
    let _ = to.send(
        EC_INFO,
        req_id,
        &control,
        &cairn_proto::msg::encode(&entries),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_past_the_largest_object_are_refused() {
        let max = cairn_store::limits::OBJECT_SIZE;
        assert!(in_object(&EcShardOp::Write {
            offset: max - 4096,
            len: 4096
        }));
        assert!(!in_object(&EcShardOp::Xor {
            offset: max - 4095,
            len: 4096
        }));
        assert!(!in_object(&EcShardOp::Write {
            offset: u64::MAX,
            len: 1
        }));
        assert!(!in_object(&EcShardOp::Truncate { len: max + 1 }));
        assert!(in_object(&EcShardOp::Remove));
    }
}
