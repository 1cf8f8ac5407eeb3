//! Reads, stats and listings, served by the primary from its store. A read of an object
//! with a write in flight waits for that write: a read returns only acknowledged values.

use super::reply;
use crate::pgstate::{coll_of, ParkedRead, Watcher};
use crate::shard::Shard;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::osd::{
    contents_tag as contents_tag_of, OpKind, OpReply, OpRequest, MAX_LIST, MAX_WATCH_OBJECT,
    MAX_WATCH_WAIT_MS,
};
use cairn_store::StoreError;
use cairn_transport::FrameSender;

/// Largest read one op returns.
pub const MAX_READ: u64 = 16 << 20;

/// Serves a non-write op (the caller checked that this OSD is primary).
pub fn read(shard: &mut Shard, map: &ClusterMap, to: FrameSender, req_id: u64, req: OpRequest) {
    let started = std::time::Instant::now();
    let op = crate::metrics::op_name(&req.kind);
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let st = shard.pg(map, pg);
    if !matches!(req.kind, OpKind::List { .. }) {
        if let Some(w) = st.pending_write(&req.object) {
            if w.park_reader() {
                st.parked.push(ParkedRead {
                    reply: to,
                    req_id,
                    req,
                });
                return;
            }
        }
    }
    let coll_exists = st.coll_exists;
    let store = &shard.osd.store;
    let coll = coll_of(pg);
    let result = match req.kind {
        OpKind::Read { offset, len } => {
            if len > MAX_READ {
                Err(OpReply::Invalid(format!(
                    "read of {len} bytes is over the limit of {MAX_READ}"
                )))
            } else {
                read_range(store, coll_exists, coll, &req.object, offset, len)
            }
        }
        OpKind::Stat => stat(store, coll_exists, coll, &req.object)
            .map(|size| (OpReply::Ok { version: 0, size }, Vec::new())),
        OpKind::List { after, max } => Ok((
            list(store, coll_exists, coll, after.as_deref(), max),
            Vec::new(),
        )),
        OpKind::Watch {
            known_tag,
            max_wait_ms,
        } => match contents_tag(store, coll_exists, coll, &req.object) {
            Ok((_, tag)) if tag != known_tag => Ok((
                OpReply::Ok {
                    version: 0,
                    size: 0,
                },
                Vec::new(),
            )),
            Ok(_) => {
                let wait =
                    std::time::Duration::from_millis(max_wait_ms.min(MAX_WATCH_WAIT_MS).into());
                let w = Watcher {
                    reply: to,
                    req_id,
                    until: std::time::Instant::now() + wait,
                };
                match shard.pg(map, pg).add_watcher(&req.object, w) {
                    Ok(()) => {
                        let osd = shard.osd.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(wait).await;
                            osd.queue(pg, crate::shard::ShardMsg::WatchDue(pg));
                        });
                        return;
                    }
                    Err(w) => {
                        let r = OpReply::Invalid(format!(
                            "pg {pg} has {} watches waiting, the most it keeps: poll instead",
                            crate::pgstate::MAX_WATCHERS_PER_PG
                        ));
                        return reply(&w.reply, w.req_id, &r, &[]);
                    }
                }
            }
            Err(r) => Err(r),
        },
        _ => Err(OpReply::Invalid("not a read".into())),
    };
    match result {
        Ok((r, data)) => {
            reply(&to, req_id, &r, &data);
            let out = data.len() as u64;
            let osd = &shard.osd;
            osd.inflight.totals.op(pg.pool, false, started, 0, out);
            if let Some(m) = &osd.metrics {
                m.op_done(pg.pool, op, started, (0, out));
            }
        }
        Err(r) => reply(&to, req_id, &r, &[]),
    }
}

/// Answers a watch: read the object again.
pub fn watch_answer(to: &FrameSender, req_id: u64) {
    reply(
        to,
        req_id,
        &OpReply::Ok {
            version: 0,
            size: 0,
        },
        &[],
    );
}

/// Whether an object exists, and the tag of its contents (0 when absent): what a watch
/// and a conditional write compare. Objects of at most [`MAX_WATCH_OBJECT`] bytes.
pub fn contents_tag(
    store: &cairn_store::Store,
    coll_exists: bool,
    coll: u64,
    obj: &[u8],
) -> Result<(bool, u64), OpReply> {
    match read_range(store, coll_exists, coll, obj, 0, MAX_WATCH_OBJECT + 1) {
        Ok((_, data)) if data.len() as u64 > MAX_WATCH_OBJECT => Err(OpReply::Invalid(format!(
            "a watched or conditionally written object must be at most {MAX_WATCH_OBJECT} bytes"
        ))),
        Ok((_, data)) => Ok((true, contents_tag_of(&data))),
        Err(OpReply::NoSuchObject) => Ok((false, 0)),
        Err(r) => Err(r),
    }
}

fn store_error(e: StoreError) -> OpReply {
    match e {
        StoreError::NoObject { .. } | StoreError::NoCollection(_) => OpReply::NoSuchObject,
        e => super::store_failed(&e),
    }
}

fn stat(
    store: &cairn_store::Store,
    coll_exists: bool,
    coll: u64,
    obj: &[u8],
) -> Result<u64, OpReply> {
    if !coll_exists {
        return Err(OpReply::NoSuchObject);
    }
    store.stat(coll, obj).map(|s| s.size).map_err(store_error)
}

fn read_range(
    store: &cairn_store::Store,
    coll_exists: bool,
    coll: u64,
    obj: &[u8],
    offset: u64,
    len: u64,
) -> Result<(OpReply, Vec<u8>), OpReply> {
    let size = stat(store, coll_exists, coll, obj)?;
    let len = len.min(size.saturating_sub(offset));
    let data = if len == 0 {
        Vec::new()
    } else {
        store.read(coll, obj, offset, len).map_err(store_error)?
    };
    Ok((OpReply::Ok { version: 0, size }, data))
}

fn list(
    store: &cairn_store::Store,
    coll_exists: bool,
    coll: u64,
    after: Option<&[u8]>,
    max: u32,
) -> OpReply {
    if !coll_exists {
        return OpReply::Listed {
            names: Vec::new(),
            more: false,
        };
    }
    let max = max.clamp(1, MAX_LIST) as usize;
    match store.list_objects(coll, after, max + 1) {
        Ok(mut names) => {
            let more = names.len() > max;
            names.truncate(max);
            OpReply::Listed { names, more }
        }
        Err(e) => store_error(e),
    }
}
