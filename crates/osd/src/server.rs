//! Accepts connections (clients and primaries) and hands each frame to the shard owning
//! its PG. Malformed input gets an error reply and the connection is closed.

use crate::access::{op_needs, Access, Denied};
use crate::context::Osd;
use crate::mailbox::ShardMsg;
use cairn_auth::Perms;
use cairn_map::PgId;
use cairn_proto::msg::osd::BatchError;
use cairn_proto::msg::osd::{
    OpBatch, OpKind, OpReply, OpRequest, OsdStats, RepOp, ERROR, OP, OP_BATCH, OP_REPLY, OSD_PING,
    OSD_PONG, OSD_STATS, OSD_STATS_REPLY, OSD_SYNC, REP,
};
use cairn_proto::msg::peering::{
    PgList, PgMarkLost, PgPull, PgPush, PgQuery, PG_CLEAN, PG_LIST, PG_MARK_LOST, PG_OBJECT,
    PG_PULL, PG_PUSH, PG_QUERY, PG_STATUS,
};
use cairn_proto::msg::scrub::{PgScrub, ScrubPg, PG_SCRUB, SCRUB_PG, SCRUB_REPORT};
use cairn_proto::msg::{ErrorCode, ErrorReply, MsgError};
use cairn_proto::Limits;
use cairn_store::SharedBytes;
use cairn_transport::{
    accept, begin_batch, end_batch, node_kind, ConnLoad, ConnReader, FrameSender, ReadError,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Reply bytes a connection may have queued (not yet taken by the socket) before its next
/// request is read: backpressure on a peer that does not read.
const MAX_QUEUED_REPLIES: usize = 32 << 20;

/// Serves connections forever: shakes hands on the calling runtime (the OSD's service
/// thread, so the shards only ever see connections that completed a handshake), then hands
/// each connection to a shard in turn.
pub async fn serve(osd: Arc<Osd>, listener: TcpListener) {
    let mut next = 0usize;
    loop {
        match listener.accept().await {
            Ok((mut stream, peer)) => {
                // Over the caps: closed at once (the refusal is logged by `admit`).
                let Some(slot) = osd.admission.admit(peer.ip()) else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tracing::debug!(%peer, "connection accepted");
                let shard = next % osd.shard_count().max(1);
                next = next.wrapping_add(1);
                let Some(rt) = osd.shard_runtime(shard) else {
                    continue;
                };
                let osd = osd.clone();
                tokio::spawn(async move {
                    let (who, guards) = match accept(
                        &mut stream,
                        node_kind::OSD,
                        osd.verifier.as_ref(),
                    )
                    .await
                    {
                        Ok(a) => (a.peer, a.guards),
                        Err(e) => {
                            tracing::warn!(%peer, error = %e, "handshake failed; closing connection");
                            return;
                        }
                    };
                    // Re-register the socket with the shard's own event loop.
                    let Ok(std) = stream.into_std() else { return };
                    rt.spawn(async move {
                        match tokio::net::TcpStream::from_std(std) {
                            Ok(s) => {
                                connection(osd, s, shard, (Access::new(who), guards)).await;
                                drop(slot);
                            }
                            Err(e) => tracing::warn!(error = %e, "cannot adopt a connection"),
                        }
                    });
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection(
    osd: Arc<Osd>,
    stream: tokio::net::TcpStream,
    shard: usize,
    (mut access, guards): (Access, cairn_transport::Guards),
) {
    let (sealer, opener) = cairn_transport::split_guards(guards);
    let (r, w) = stream.into_split();
    let sender = FrameSender::new_guarded(w, sealer);
    let limits = Limits::default();
    // Buffered: one receive call brings in every request that has arrived (the buffer is
    // released while the peer is quiet).
    let mut r = ConnReader::new(r, osd.admission.limits().idle).guarded(opener);
    // Every request handed on holds a reply handle counted here until it is answered.
    let load = ConnLoad::new(osd.request_limits);
    loop {
        if load.over() {
            // Too much of this connection's work is waiting (on replicas, on peering, ...):
            // read nothing more until some is done (what was held back goes out first).
            end_batch();
            osd.sync_shard(shard);
            load.wait_room().await;
        }
        if sender.queued_bytes() > MAX_QUEUED_REPLIES {
            // A peer that sends requests and does not read the replies is not read either
            // (the held-back batch goes out first, or it could never drain).
            end_batch();
            osd.sync_shard(shard);
            sender.wait_below(MAX_QUEUED_REPLIES).await;
        }
        // A shard is behind on requests from connections by more than its bound: read nothing
        // more until it catches up (held-back replies and writes go out first).
        while let Some(backlog) = osd.backlogged_shard() {
            end_batch();
            osd.sync_shard(shard);
            backlog.wait_room().await;
        }
        let frame = match r.next(&limits).await {
            Ok(f) => f,
            Err(ReadError::Closed) => break,
            Err(ReadError::Idle(after)) => {
                tracing::debug!(peer = %access.name(), ?after, "closing an idle connection");
                break;
            }
            Err(ReadError::Tampered(e)) => {
                // Not from the peer that authenticated, or changed in flight: nothing more
                // is read or answered on this connection.
                tracing::warn!(peer = %access.name(), "closing a connection: {e}");
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "bad frame; closing connection");
                refuse(&sender, 0, ErrorCode::Malformed, &e.to_string());
                break;
            }
        };
        if let Err(why) = allowed(&access, frame.msg_type) {
            tracing::warn!(peer = %access.name(), msg_type = frame.msg_type, "refused: {why}");
            refuse_for(&sender, frame.request_id, &why.into());
            break;
        }
        // While more requests are already buffered, replies and forwarded writes are held
        // back and written together when the last one is handled.
        let more = r.frame_buffered();
        if more {
            begin_batch();
        }
        let msg = match frame.msg_type {
            OSD_STATS => {
                if let Err(why) = access.cluster_read() {
                    refuse_for(&sender, frame.request_id, &why.into());
                    if !more {
                        end_batch();
                    }
                    continue;
                }
                let reply = osd_stats(&osd);
                let control = cairn_proto::msg::encode(&reply);
                let _ = sender.send(OSD_STATS_REPLY, frame.request_id, &control, &[]);
                if !more {
                    end_batch();
                }
                continue;
            }
            OSD_SYNC => {
                if !frame.control.is_empty() || !frame.data.is_empty() {
                    let why = "OSD_SYNC carries no control or data part";
                    refuse(&sender, frame.request_id, ErrorCode::Malformed, why);
                    break;
                }
                // Run here, on this connection's shard (its queue is not grown by a client
                // that sends many); answered by the sync below, with the writes before it.
                let msg = ShardMsg::Sync {
                    reply: sender.for_request(&load, 0),
                    req_id: frame.request_id,
                };
                osd.handle_on_shard(shard, msg);
                if !more {
                    end_batch();
                    osd.sync_shard(shard);
                }
                continue;
            }
            OSD_PING => {
                let _ = sender.send(OSD_PONG, frame.request_id, &[], &[]);
                if !more {
                    end_batch();
                }
                continue;
            }
            OP_BATCH => {
                let (control, data) = (&frame.control, frame.data);
                let to = (&sender, &load);
                if let Err(why) = dispatch_batch(&osd, to, control, data, shard, &mut access) {
                    refuse_for(&sender, frame.request_id, &why);
                    break;
                }
                if !more {
                    end_batch();
                    osd.sync_shard(shard);
                }
                continue;
            }
            // Served off the shards, a bounded number at a time: they answer when done.
            t @ (SCRUB_PG | PG_PULL) => {
                let id = frame.request_id;
                let job = match background_job(t, &frame.control) {
                    Ok(j) => j,
                    Err(e) => {
                        refuse_for(&sender, id, &e.into());
                        break;
                    }
                };
                if let Background::Scrub(req) = &job {
                    if let Err(why) = access.pool(&osd, req.pool, Perms::X) {
                        refuse_for(&sender, id, &why.into());
                        if !more {
                            end_batch();
                        }
                        continue;
                    }
                }
                let slots = match job {
                    Background::Scrub(_) => &osd.scrub_slots,
                    Background::Pull(_) => &osd.pull_slots,
                };
                let slot = match slots.clone().try_acquire_owned() {
                    Ok(s) => s,
                    Err(_) => {
                        // Every slot is taken: this connection is not read until one frees
                        // (what was held back goes out first).
                        end_batch();
                        osd.sync_shard(shard);
                        match slots.clone().acquire_owned().await {
                            Ok(s) => s,
                            Err(_) => break,
                        }
                    }
                };
                match job {
                    Background::Scrub(req) => start_scrub(&osd, &sender, id, req, slot),
                    Background::Pull(req) => start_pull(&osd, &sender, id, req, slot),
                }
                if !more {
                    end_batch();
                }
                continue;
            }
            t @ (PG_QUERY | PG_PUSH | PG_LIST | PG_SCRUB | PG_CLEAN | PG_STATUS | PG_MARK_LOST) => {
                match peering_pg(t, &frame.control) {
                    Ok(pg) => {
                        // A client may ask a PG's status where it may read.
                        let checked = match t {
                            PG_STATUS => access.pool(&osd, pg.pool, Perms::R),
                            // Giving up data: who may write (and so remove) the pool's
                            // objects.
                            PG_MARK_LOST => access.pool(&osd, pg.pool, Perms::W),
                            _ => Ok(()),
                        };
                        if let Err(why) = checked {
                            refuse_for(&sender, frame.request_id, &why.into());
                            if !more {
                                end_batch();
                            }
                            continue;
                        }
                        if let Some(claim) = push_claim(t, &frame.control) {
                            let r = from_primary(&osd, &access, shard, claim, "PG_PUSH").await;
                            if let Err(why) = r {
                                tracing::warn!(peer = %access.name(), "refused: {why}");
                                refuse_for(&sender, frame.request_id, &why.into());
                                break;
                            }
                        }
                        (
                            pg,
                            ShardMsg::Peer {
                                reply: sender.for_request(&load, frame.data.len()),
                                req_id: frame.request_id,
                                msg_type: t,
                                control: frame.control,
                                data: frame.data,
                            },
                        )
                    }
                    Err(e) => {
                        refuse_for(&sender, frame.request_id, &e.into());
                        break;
                    }
                }
            }
            OP => match cairn_proto::msg::decode::<OpRequest>("op", &frame.control) {
                Ok(req) => {
                    if let Err(why) = access.pool(&osd, req.pool, op_needs(&req.kind)) {
                        deny_op(&sender, frame.request_id, &why);
                        if !more {
                            end_batch();
                        }
                        continue;
                    }
                    let pg = PgId {
                        pool: req.pool,
                        pg: req.pg,
                    };
                    (
                        pg,
                        ShardMsg::Op {
                            reply: sender.for_request(&load, op_bytes(&req.kind, frame.data.len())),
                            req_id: frame.request_id,
                            req,
                            data: SharedBytes::new(frame.data),
                        },
                    )
                }
                Err(e) => {
                    refuse(
                        &sender,
                        frame.request_id,
                        ErrorCode::Malformed,
                        &e.to_string(),
                    );
                    break;
                }
            },
            REP => match cairn_proto::msg::decode::<RepOp>("replicated write", &frame.control) {
                Ok(op) => {
                    let claim = (op.primary, op.epoch);
                    if let Err(why) = from_primary(&osd, &access, shard, claim, "REP").await {
                        tracing::warn!(peer = %access.name(), "refused: {why}");
                        refuse_for(&sender, frame.request_id, &why.into());
                        break;
                    }
                    let pg = PgId {
                        pool: op.pool,
                        pg: op.pg,
                    };
                    (
                        pg,
                        ShardMsg::Rep {
                            reply: sender.for_request(&load, frame.data.len()),
                            req_id: frame.request_id,
                            op,
                            data: SharedBytes::new(frame.data),
                        },
                    )
                }
                Err(e) => {
                    refuse(
                        &sender,
                        frame.request_id,
                        ErrorCode::Malformed,
                        &e.to_string(),
                    );
                    break;
                }
            },
            other => {
                refuse(
                    &sender,
                    frame.request_id,
                    ErrorCode::Unsupported,
                    &format!("message type {other} is not an OSD request"),
                );
                break;
            }
        };
        osd.dispatch(msg.0, msg.1, shard);
        if !more {
            // Forwarded writes and replies go out first, then one WAL flush makes every
            // write of the batch durable.
            end_batch();
            osd.sync_shard(shard);
        }
    }
    end_batch();
    osd.sync_shard(shard);
    sender.close();
}

/// Handles each op of an [`OpBatch`] as if it had come in its own frame (inside the caller's
/// send batch, so their replies and forwarded writes go out together).
fn dispatch_batch(
    osd: &Arc<Osd>,
    (sender, load): (&FrameSender, &Arc<ConnLoad>),
    control: &[u8],
    data: Vec<u8>,
    shard: usize,
    access: &mut Access,
) -> Result<(), Refusal> {
    let batch = cairn_proto::msg::decode::<OpBatch>("op batch", control)?;
    batch.check(data.len())?;
    // One buffer for every op's payload: each op holds its range, none is copied.
    let data = SharedBytes::new(data);
    begin_batch();
    let mut at = 0usize;
    for op in batch.ops {
        let end = at + op.data_len as usize;
        if let Err(why) = access.pool(osd, op.req.pool, op_needs(&op.req.kind)) {
            deny_op(sender, op.request_id, &why);
            at = end;
            continue;
        }
        let pg = PgId {
            pool: op.req.pool,
            pg: op.req.pg,
        };
        let msg = ShardMsg::Op {
            reply: sender.for_request(load, op_bytes(&op.req.kind, op.data_len as usize)),
            req_id: op.request_id,
            req: op.req,
            // In range: `check` made the lengths add up to the buffer's.
            data: data.slice(at..end).unwrap_or_default(),
        };
        osd.dispatch(pg, msg, shard);
        at = end;
    }
    Ok(())
}

/// What an op holds while in flight: the bytes it carries, or the bytes it asks to read (at
/// most what one reply frame can carry).
fn op_bytes(kind: &OpKind, data_len: usize) -> usize {
    match kind {
        OpKind::Read { len, .. } => {
            let most = Limits::default().max_data as u64;
            data_len.saturating_add((*len).min(most) as usize)
        }
        _ => data_len,
    }
}

/// A request served off the shards.
enum Background {
    Scrub(ScrubPg),
    Pull(PgPull),
}

fn background_job(msg_type: u16, control: &[u8]) -> Result<Background, MsgError> {
    use cairn_proto::msg::decode;
    match msg_type {
        SCRUB_PG => decode::<ScrubPg>("scrub pg", control).map(Background::Scrub),
        _ => decode::<PgPull>("pg pull", control).map(Background::Pull),
    }
}

/// Reads the bytes a recovery pulls off the shard's thread (up to 4 MiB from the device: the
/// shard's client ops must not wait for that), and answers. The PG version is read before the
/// bytes, so a copy guarded by it is refused if a write landed meanwhile.
fn start_pull(
    osd: &Arc<Osd>,
    to: &FrameSender,
    req_id: u64,
    req: PgPull,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let (osd, to) = (osd.clone(), to.clone());
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let map = osd.map();
        if map.pools.get(&pg.pool).is_none_or(|p| pg.pg >= p.pg_count) {
            let why = format!("pg {pg} does not exist in map epoch {}", map.epoch);
            return refuse(&to, req_id, ErrorCode::NotFound, &why);
        }
        if let Err(r) = crate::peering::member::not_splitting(&osd, pg) {
            return refuse(&to, req_id, r.code, &r.why);
        }
        match crate::peering::copy::pull(&osd.store, pg, &req.object, req.offset, req.len) {
            Ok((obj, bytes)) => {
                let control = cairn_proto::msg::encode(&obj);
                let _ = to.send_held(PG_OBJECT, req_id, &control, bytes);
            }
            Err(r) => refuse(&to, req_id, r.code, &r.why),
        }
    });
}

/// Scrubs a PG in the background and answers with its report when done.
fn start_scrub(
    osd: &Arc<Osd>,
    to: &FrameSender,
    req_id: u64,
    req: ScrubPg,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let map = osd.map();
    if map.pools.get(&pg.pool).is_none_or(|p| pg.pg >= p.pg_count) {
        refuse(
            to,
            req_id,
            ErrorCode::NotFound,
            &format!("pg {pg} does not exist in map epoch {}", map.epoch),
        );
        return;
    }
    let (osd, to) = (osd.clone(), to.clone());
    tokio::spawn(async move {
        let _slot = slot;
        let rep = crate::scrub::scrub_pg(osd, pg, req.repair).await;
        let _ = to.send(SCRUB_REPORT, req_id, &cairn_proto::msg::encode(&rep), &[]);
    });
}

/// The primary and epoch a `PG_PUSH` claims (`None` for other messages, or one that does not
/// decode: the shard refuses it as malformed).
fn push_claim(msg_type: u16, control: &[u8]) -> Option<(u32, u64)> {
    (msg_type == PG_PUSH)
        .then(|| cairn_proto::msg::decode::<PgPush>("pg push", control).ok())
        .flatten()
        .map(|p| (p.primary, p.epoch))
}

/// The PG a peering request is about (the request is decoded again on its shard).
fn peering_pg(msg_type: u16, control: &[u8]) -> Result<PgId, MsgError> {
    use cairn_proto::msg::decode;
    let (pool, pg) = match msg_type {
        PG_QUERY | PG_CLEAN | PG_STATUS => {
            decode::<PgQuery>("pg query", control).map(|q| (q.pool, q.pg))
        }
        PG_PULL => decode::<PgPull>("pg pull", control).map(|q| (q.pool, q.pg)),
        PG_PUSH => decode::<PgPush>("pg push", control).map(|q| (q.pool, q.pg)),
        PG_SCRUB => decode::<PgScrub>("pg scrub", control).map(|q| (q.pool, q.pg)),
        PG_MARK_LOST => decode::<PgMarkLost>("pg mark lost", control).map(|q| (q.pool, q.pg)),
        _ => decode::<PgList>("pg list", control).map(|q| (q.pool, q.pg)),
    }?;
    Ok(PgId { pool, pg })
}

/// Refuses an op the sender's caps do not allow (the connection stays open).
fn deny_op(to: &FrameSender, req_id: u64, why: &Denied) {
    let control = cairn_proto::msg::encode(&OpReply::Denied(why.to_string()));
    let _ = to.send(OP_REPLY, req_id, &control, &[]);
}

/// Checks that the peer may send this kind of message at all (caps on pools are checked
/// where the pool is known). `Err`: the refusal; the connection is closed after it.
fn allowed(access: &Access, msg_type: u16) -> Result<(), Denied> {
    match msg_type {
        REP => access.osd_only("a replicated write"),
        PG_PUSH => access.osd_only("a PG push"),
        PG_QUERY | PG_LIST | PG_SCRUB | PG_CLEAN | PG_PULL => access.osd_only("peering"),
        _ => Ok(()),
    }
}

/// Checks a daemon message that acts for the PG's primary at `epoch`: its sender must be the
/// OSD it names as primary (the shard checks that one against the map), and the map of that
/// epoch must be here first. `Err`: the refusal; the connection is closed after it.
async fn from_primary(
    osd: &Osd,
    access: &Access,
    shard: usize,
    (primary, epoch): (u32, u64),
    what: &'static str,
) -> Result<(), Denied> {
    access.speaks_for(primary, what)?;
    if epoch > osd.map().epoch {
        // What was held back goes out before the wait.
        end_batch();
        osd.sync_shard(shard);
        crate::mapwatch::catch_up(osd, epoch).await;
    }
    Ok(())
}

/// Why a request is refused before it reaches a shard.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// Its control part does not decode.
    #[error(transparent)]
    Malformed(#[from] MsgError),
    /// An op batch that does not fit its frame or limits.
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// The peer may not send it.
    #[error(transparent)]
    Denied(#[from] Denied),
}

impl Refusal {
    /// The code its `ERROR` reply carries.
    fn code(&self) -> ErrorCode {
        match self {
            Refusal::Malformed(_) => ErrorCode::Malformed,
            Refusal::Batch(e) => e.code(),
            Refusal::Denied(e) => e.class().code(),
        }
    }
}

/// Answers `ERROR` with the code and text of `why`.
fn refuse_for(to: &FrameSender, req_id: u64, why: &Refusal) {
    refuse(to, req_id, why.code(), &why.to_string());
}

fn refuse(to: &FrameSender, req_id: u64, code: ErrorCode, why: &str) {
    let control = cairn_proto::msg::encode(&ErrorReply::new(code, why));
    let _ = to.send(ERROR, req_id, &control, &[]);
}

/// This OSD's usage and state, as `cairn status` and the metrics show them.
pub fn osd_stats(osd: &Osd) -> OsdStats {
    osd_stats_with(osd, &osd.store.stats())
}

/// [`osd_stats`] from the store's figures `st`, read once by a caller that needs them too.
pub fn osd_stats_with(osd: &Osd, st: &cairn_store::StoreStats) -> OsdStats {
    let (scrub_unrepaired, scrub_repaired, scrubbed_pgs) = osd.scrub.totals();
    let progress = osd.recovery.progress();
    let held = osd.store.list_collections();
    let troubles = osd.pg_troubles();
    let (pools, commits, commit_latency_us) = osd.inflight.totals.snapshot();
    let (wal_sync_floor_us, wal_syncs_handed_off) = osd.wal_pace.figures();
    OsdStats {
        osd: osd.id(),
        // What fills up to a NoSpace refusal, so the full ratio means what it says.
        used_bytes: st.used_bytes,
        memory_target_bytes: osd.memory_target,
        memory_used_bytes: crate::config::resident_bytes(),
        index_bytes: st.index_bytes,
        cache_bytes: st.read_cache.bytes,
        cache_capacity_bytes: st.read_cache.capacity,
        cache_hits: st.read_cache.hits,
        cache_misses: st.read_cache.misses,
        capacity_bytes: st.writable_bytes,
        inflight: osd.inflight.count() as u64,
        recovered_objects: osd.recovery.objects.load(Ordering::Relaxed),
        recovery_bytes: osd.recovery.bytes.load(Ordering::Relaxed),
        recovery_pending_objects: progress.pending_objects,
        recovery_bytes_per_sec: progress.bytes_per_sec,
        recovery_objects_per_sec: progress.objects_per_sec,
        peering_pgs: osd.peering_pgs(),
        scrub_unrepaired,
        scrub_repaired,
        scrubbed_pgs,
        pgs_held: held.len() as u64,
        pgs_misplaced: crate::peering::misplaced_copies(osd, &held),
        pgs_reclaiming: crate::reclaim::removed_copies(&osd.map(), &held),
        down_pgs: troubles.down,
        failed_pgs: troubles.failed,
        crashes: osd.crashes.clone(),
        lost_write_pgs: troubles.lost,
        slow_ops: osd.slow.summary(),
        slow_ops_total: osd.slow.total(),
        pools,
        commits,
        commit_latency_us,
        wal_sync_floor_us,
        wal_syncs_handed_off,
        copies: payload_copies(&st.copies),
    }
}

fn payload_copies(store: &cairn_store::CopyStats) -> cairn_proto::msg::osd::PayloadCopies {
    let net = cairn_transport::copies::tally();
    cairn_proto::msg::osd::PayloadCopies {
        received_bytes: net.received_bytes,
        receive_copied_bytes: net.receive_copied_bytes,
        send_queue_copied_bytes: net.queue_copied_bytes,
        send_queue_held_bytes: net.queue_held_bytes,
        wal_batch_bytes: store.wal_batch_bytes,
        partial_block_bytes: store.partial_block_bytes,
        flush_staged_bytes: store.flush_staged_bytes,
        direct_staged_bytes: store.direct_staged_bytes,
    }
}
