//! Reads, stats and listings, served by the primary from its store. A read of an object
//! with a write in flight waits for that write: a read returns only acknowledged values.

use super::{reply, DeviceReads};
use crate::context::Osd;
use crate::mailbox::ShardMsg;
use crate::pgstate::{coll_of, ParkedRead, Watcher};
use crate::shard::Shard;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::osd::{
    contents_tag as contents_tag_of, OpKind, OpReply, OpRequest, MAX_LIST, MAX_WATCH_OBJECT,
    MAX_WATCH_WAIT_MS,
};
use cairn_store::{ReadPlan, StoreError};
use cairn_transport::FrameSender;
use std::sync::Arc;
use std::time::Instant;

/// Largest read one op returns.
pub const MAX_READ: u64 = 16 << 20;

/// Serves a non-write op (the caller checked that this OSD is primary). A read that needs a
/// data device goes to a reader thread `at` [`DeviceReads::Readers`], which replies itself.
pub fn read(
    shard: &mut Shard,
    map: &ClusterMap,
    to: FrameSender,
    req_id: u64,
    req: OpRequest,
    at: DeviceReads,
) {
    let started = Instant::now();
    let op = crate::metrics::op_name(&req.kind);
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
    let coll_exists = st.coll_exists;
    let store = &shard.osd.store;
    let coll = coll_of(pg);
    let result = match req.kind {
        OpKind::Read { offset, len } => {
            if len > MAX_READ {
                Err(OpReply::Invalid(format!(
                    "read of {len} bytes is over the limit of {MAX_READ}"
                )))
            } else if at == DeviceReads::InPlace {
                read_range(store, coll_exists, coll, &req.object, offset, len)
            } else {
                match plan_range(store, coll_exists, coll, &req.object, offset, len) {
                    Ok(plan) if plan.needs_device() => {
                        let read = Handed {
                            osd: shard.osd.clone(),
                            pg,
                            to,
                            req_id,
                            req,
                            started,
                        };
                        return hand_to_reader(read, plan);
                    }
                    Ok(plan) => finish_range(store, plan),
                    Err(r) => Err(r),
                }
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
                            osd.queue(pg, crate::mailbox::ShardMsg::WatchDue(pg));
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
    answer(&shard.osd, pg, op, started, &to, req_id, result);
}

/// Replies to a read op and counts it.
fn answer(
    osd: &Osd,
    pg: PgId,
    op: &'static str,
    started: Instant,
    to: &FrameSender,
    req_id: u64,
    result: Result<(OpReply, Vec<u8>), OpReply>,
) {
    match result {
        Ok((r, data)) => {
            let out = data.len() as u64;
            super::reply_data(to, req_id, &r, data);
            osd.inflight.totals.op(pg.pool, false, started, 0, out);
            if let Some(m) = &osd.metrics {
                m.op_done(pg.pool, op, started, (0, out));
            }
        }
        Err(r) => reply(to, req_id, &r, &[]),
    }
}

/// A read op handed to a reader thread, with what its reply needs.
struct Handed {
    osd: Arc<Osd>,
    pg: PgId,
    to: FrameSender,
    req_id: u64,
    req: OpRequest,
    started: Instant,
}

/// Finishes a read's device part on a reader thread (on this one when they are all busy).
/// A plan that no longer matches the device (a block moved since, or is damaged) sends the
/// op back to its shard, which reads again in place: a fresh plan made off the shard could
/// see a write its members have not all committed.
fn hand_to_reader(read: Handed, plan: ReadPlan) {
    let bytes = plan.buffer_bytes();
    let osd = read.osd.clone();
    let job = Box::new(move || {
        let size = plan.object_size();
        match read.osd.store.finish_read(plan) {
            Err(StoreError::CorruptData { .. }) => read.osd.queue(
                read.pg,
                ShardMsg::ReadAgain {
                    reply: read.to,
                    req_id: read.req_id,
                    req: read.req,
                },
            ),
            r => {
                let r = r
                    .map(|data| (OpReply::Ok { version: 0, size }, data))
                    .map_err(store_error);
                answer(
                    &read.osd,
                    read.pg,
                    "read",
                    read.started,
                    &read.to,
                    read.req_id,
                    r,
                );
            }
        }
    });
    if let Err(job) = osd.readers.submit(bytes, job) {
        job();
    }
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

/// Plans a read of an object's range: a [`ReadPlan`] holding what memory and the read cache
/// had.
fn plan_range(
    store: &cairn_store::Store,
    coll_exists: bool,
    coll: u64,
    obj: &[u8],
    offset: u64,
    len: u64,
) -> Result<ReadPlan, OpReply> {
    if !coll_exists {
        return Err(OpReply::NoSuchObject);
    }
    store.plan_read(coll, obj, offset, len).map_err(store_error)
}

/// The reply to a read whose plan needs no device.
fn finish_range(store: &cairn_store::Store, plan: ReadPlan) -> Result<(OpReply, Vec<u8>), OpReply> {
    let size = plan.object_size();
    let data = store.finish_read(plan).map_err(store_error)?;
    Ok((OpReply::Ok { version: 0, size }, data))
}

/// Reads an object's range on this thread. A block that moved between planning and reading
/// fails its check ([`StoreError::CorruptData`]): the read is planned again once before that
/// counts as damage, as [`cairn_store::Store::read`] does.
fn read_range(
    store: &cairn_store::Store,
    coll_exists: bool,
    coll: u64,
    obj: &[u8],
    offset: u64,
    len: u64,
) -> Result<(OpReply, Vec<u8>), OpReply> {
    let mut again = true;
    loop {
        let plan = plan_range(store, coll_exists, coll, obj, offset, len)?;
        let size = plan.object_size();
        match store.finish_read(plan) {
            Ok(data) => return Ok((OpReply::Ok { version: 0, size }, data)),
            Err(StoreError::CorruptData { .. }) if again => again = false,
            Err(e) => return Err(store_error(e)),
        }
    }
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
