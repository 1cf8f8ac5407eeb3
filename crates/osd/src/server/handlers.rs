//! One handler per message type. Each checks what the peer may send, decodes what it needs
//! (a request for a shard is decoded again there), answers or hands the request on, and
//! says what it left to do.

use super::background::{background_job, start_pull, start_scrub, Background};
use super::{deny_op, refuse, refuse_for, Conn, Flow, Refusal};
use crate::access::{op_needs, Access, Denied};
use crate::mailbox::ShardMsg;
use cairn_auth::Perms;
use cairn_map::PgId;
use cairn_proto::msg::ec::{EcQuery, EcRead, EcSubWrite, EC_QUERY, EC_READ, EC_WRITE};
use cairn_proto::msg::ec_rebuild::{EcPush, EcSetLog, EcStat, EC_PUSH, EC_SET_LOG, EC_STAT};
use cairn_proto::msg::osd::{
    OpBatch, OpKind, OpRequest, RepOp, OP, OP_BATCH, OSD_PING, OSD_PONG, OSD_STATS,
    OSD_STATS_REPLY, OSD_SYNC, REP,
};
use cairn_proto::msg::peering::{
    PgList, PgMarkLost, PgPush, PgQuery, PG_CLEAN, PG_LIST, PG_MARK_LOST, PG_PULL, PG_PUSH,
    PG_QUERY, PG_STATUS,
};
use cairn_proto::msg::scrub::{PgScrub, PG_SCRUB, SCRUB_PG};
use cairn_proto::msg::{decode, ErrorCode, MsgError};
use cairn_proto::{Frame, Limits};
use cairn_store::SharedBytes;

impl Conn {
    /// Handles one request frame.
    pub(super) async fn handle(&mut self, frame: Frame) -> Flow {
        if let Err(why) = allowed(&self.access, frame.msg_type) {
            let peer = self.access.name();
            tracing::warn!(%peer, msg_type = frame.msg_type, "refused: {why}");
            refuse_for(&self.sender, frame.request_id, &why.into());
            return Flow::Close;
        }
        match frame.msg_type {
            OP => self.op(frame),
            OP_BATCH => self.op_batch(frame),
            REP => self.rep(frame).await,
            EC_WRITE => self.ec_write(frame).await,
            EC_READ => self.ec_read(frame).await,
            EC_QUERY => self.ec_query(frame).await,
            EC_STAT | EC_PUSH | EC_SET_LOG => self.ec_rebuild(frame).await,
            OSD_SYNC => self.sync(frame),
            OSD_PING => self.ping(frame),
            OSD_STATS => self.stats(frame),
            SCRUB_PG | PG_PULL => self.background(frame).await,
            PG_QUERY | PG_PUSH | PG_LIST | PG_SCRUB | PG_CLEAN | PG_STATUS | PG_MARK_LOST => {
                self.peering(frame).await
            }
            other => {
                let why = format!("message type {other} is not an OSD request");
                refuse(&self.sender, frame.request_id, ErrorCode::Unsupported, &why);
                Flow::Close
            }
        }
    }

    /// `OP`: a client's op, for the shard of its PG.
    fn op(&mut self, frame: Frame) -> Flow {
        let req = match decode::<OpRequest>("op", &frame.control) {
            Ok(r) => r,
            Err(e) => return self.malformed(frame.request_id, &e),
        };
        match self.submit_op(frame.request_id, req, SharedBytes::new(frame.data)) {
            true => Flow::Handed,
            false => Flow::Answered,
        }
    }

    /// Hands a client's op to the shard of its PG if the sender's caps allow it (else it is
    /// refused, the connection kept); returns whether it was handed on.
    fn submit_op(&mut self, req_id: u64, req: OpRequest, data: SharedBytes) -> bool {
        if let Err(why) = self.access.pool(&self.osd, req.pool, op_needs(&req.kind)) {
            deny_op(&self.sender, req_id, &why);
            return false;
        }
        let pg = PgId {
            pool: req.pool,
            pg: req.pg,
        };
        let held = op_bytes(&req.kind, data.len());
        let msg = ShardMsg::Op {
            reply: self.sender.for_request(&self.load, held),
            req_id,
            req,
            data,
        };
        self.osd.dispatch(pg, msg, self.shard);
        true
    }

    /// `OP_BATCH`: each op as if it had come in its own frame (inside the connection's send
    /// batch, so their replies and forwarded writes go out together).
    fn op_batch(&mut self, frame: Frame) -> Flow {
        let batch = match decode::<OpBatch>("op batch", &frame.control)
            .map_err(Refusal::from)
            .and_then(|b| b.check(frame.data.len()).map(|()| b).map_err(Refusal::from))
        {
            Ok(b) => b,
            Err(why) => {
                refuse_for(&self.sender, frame.request_id, &why);
                return Flow::Close;
            }
        };
        // One buffer for every op's payload: each op holds its range, none is copied.
        let data = SharedBytes::new(frame.data);
        cairn_transport::begin_batch();
        let mut at = 0usize;
        for op in batch.ops {
            let end = at + op.data_len as usize;
            // In range: `check` made the lengths add up to the buffer's.
            let payload = data.slice(at..end).unwrap_or_default();
            at = end;
            self.submit_op(op.request_id, op.req, payload);
        }
        Flow::Handed
    }

    /// `REP`: a primary's replicated write, for the shard of its PG.
    async fn rep(&mut self, frame: Frame) -> Flow {
        let op = match decode::<RepOp>("replicated write", &frame.control) {
            Ok(op) => op,
            Err(e) => return self.malformed(frame.request_id, &e),
        };
        if let Err(flow) = self
            .check_primary(frame.request_id, (op.primary, op.epoch), "REP")
            .await
        {
            return flow;
        }
        let pg = PgId {
            pool: op.pool,
            pg: op.pg,
        };
        let msg = ShardMsg::Rep {
            reply: self.sender.for_request(&self.load, frame.data.len()),
            req_id: frame.request_id,
            op,
            data: SharedBytes::new(frame.data),
        };
        self.osd.dispatch(pg, msg, self.shard);
        Flow::Handed
    }

    /// `EC_WRITE`: a primary's sub-write of one shard of an EC object, for the shard of its PG.
    async fn ec_write(&mut self, frame: Frame) -> Flow {
        let sub = match decode::<EcSubWrite>("ec sub-write", &frame.control) {
            Ok(s) => s,
            Err(e) => return self.malformed(frame.request_id, &e),
        };
        if let Err(why) = sub.check(frame.data.len()) {
            refuse(
                &self.sender,
                frame.request_id,
                ErrorCode::Malformed,
                &why.to_string(),
            );
            return Flow::Close;
        }
        if let Err(flow) = self
            .check_primary(frame.request_id, (sub.primary, sub.epoch), "EC_WRITE")
            .await
        {
            return flow;
        }
        let pg = PgId {
            pool: sub.pool,
            pg: sub.pg,
        };
        let msg = ShardMsg::EcWrite {
            reply: self.sender.for_request(&self.load, frame.data.len()),
            req_id: frame.request_id,
            sub,
            data: SharedBytes::new(frame.data),
        };
        self.osd.dispatch(pg, msg, self.shard);
        Flow::Handed
    }

    /// `EC_READ`: a primary reading ranges of a shard, for the shard of its PG.
    async fn ec_read(&mut self, frame: Frame) -> Flow {
        let req = match decode::<EcRead>("ec read", &frame.control) {
            Ok(r) => r,
            Err(e) => return self.malformed(frame.request_id, &e),
        };
        let held = match req.reply_len() {
            Ok(n) => n as usize,
            Err(why) => {
                let why = why.to_string();
                refuse(&self.sender, frame.request_id, ErrorCode::Malformed, &why);
                return Flow::Close;
            }
        };
        self.catch_up(req.epoch).await;
        let pg = PgId {
            pool: req.pool,
            pg: req.pg,
        };
        let msg = ShardMsg::EcRead {
            reply: self.sender.for_request(&self.load, held),
            req_id: frame.request_id,
            req,
        };
        self.osd.dispatch(pg, msg, self.shard);
        Flow::Handed
    }

    /// `EC_QUERY`: a primary peering an EC PG asks what this OSD holds of a shard.
    async fn ec_query(&mut self, frame: Frame) -> Flow {
        let query = match decode::<EcQuery>("ec query", &frame.control) {
            Ok(q) => q,
            Err(e) => return self.malformed(frame.request_id, &e),
        };
        self.catch_up(query.epoch).await;
        let pg = PgId {
            pool: query.pool,
            pg: query.pg,
        };
        let msg = ShardMsg::EcQuery {
            reply: self.sender.for_request(&self.load, 0),
            req_id: frame.request_id,
            query,
        };
        self.osd.dispatch(pg, msg, self.shard);
        Flow::Handed
    }

    /// `EC_STAT`, `EC_PUSH`, `EC_SET_LOG`: a primary rebuilding an EC PG's shards.
    async fn ec_rebuild(&mut self, frame: Frame) -> Flow {
        let req_id = frame.request_id;
        let (pg, epoch, req) = match decode_rebuild(frame) {
            Ok(r) => r,
            Err(why) => {
                refuse(&self.sender, req_id, ErrorCode::Malformed, &why.to_string());
                return Flow::Close;
            }
        };
        let claim = match &req {
            RebuildRequest::Push(p, _) => Some((p.primary, "EC_PUSH")),
            RebuildRequest::SetLog(l, _) => Some((l.primary, "EC_SET_LOG")),
            RebuildRequest::Stat(_) => None,
        };
        match claim {
            Some((primary, what)) => {
                if let Err(flow) = self.check_primary(req_id, (primary, epoch), what).await {
                    return flow;
                }
            }
            None => self.catch_up(epoch).await,
        }
        let msg = ShardMsg::EcRebuild {
            reply: self.sender.for_request(&self.load, 0),
            req_id,
            req,
        };
        self.osd.dispatch(pg, msg, self.shard);
        Flow::Handed
    }

    /// Waits for the map of `epoch` (a primary's), sending what is held back first.
    async fn catch_up(&self, epoch: u64) {
        if epoch > self.osd.map().epoch {
            self.flush();
            crate::mapwatch::catch_up(&self.osd, epoch).await;
        }
    }

    /// `OSD_SYNC`: run on this connection's shard (its queue is not grown by a client that
    /// sends many); answered by the flush after it, with the writes before it.
    fn sync(&mut self, frame: Frame) -> Flow {
        if !frame.control.is_empty() || !frame.data.is_empty() {
            let why = "OSD_SYNC carries no control or data part";
            refuse(&self.sender, frame.request_id, ErrorCode::Malformed, why);
            return Flow::Close;
        }
        let msg = ShardMsg::Sync {
            reply: self.sender.for_request(&self.load, 0),
            req_id: frame.request_id,
        };
        self.osd.handle_on_shard(self.shard, msg);
        Flow::Handed
    }

    /// `OSD_PING`: answered at once.
    fn ping(&mut self, frame: Frame) -> Flow {
        let _ = self.sender.send(OSD_PONG, frame.request_id, &[], &[]);
        Flow::Answered
    }

    /// `OSD_STATS`: for whoever may read the cluster's state.
    fn stats(&mut self, frame: Frame) -> Flow {
        if let Err(why) = self.access.cluster_read() {
            refuse_for(&self.sender, frame.request_id, &why.into());
            return Flow::Answered;
        }
        let control = cairn_proto::msg::encode(&super::osd_stats(&self.osd));
        let _ = self
            .sender
            .send(OSD_STATS_REPLY, frame.request_id, &control, &[]);
        Flow::Answered
    }

    /// `SCRUB_PG`, `PG_PULL`: served off the shards, a bounded number at a time; they answer
    /// when done.
    async fn background(&mut self, frame: Frame) -> Flow {
        let id = frame.request_id;
        let job = match background_job(frame.msg_type, &frame.control) {
            Ok(j) => j,
            Err(e) => return self.malformed(id, &e),
        };
        if let Background::Scrub(req) = &job {
            if let Err(why) = self.access.pool(&self.osd, req.pool, Perms::X) {
                refuse_for(&self.sender, id, &why.into());
                return Flow::Answered;
            }
        }
        let slots = match job {
            Background::Scrub(_) => self.osd.scrub_slots.clone(),
            Background::Pull(_) => self.osd.pull_slots.clone(),
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => s,
            Err(_) => {
                // Every slot is taken: this connection is not read until one frees.
                self.flush();
                match slots.acquire_owned().await {
                    Ok(s) => s,
                    Err(_) => return Flow::Close,
                }
            }
        };
        match job {
            Background::Scrub(req) => start_scrub(&self.osd, &self.sender, id, req, slot),
            Background::Pull(req) => start_pull(&self.osd, &self.sender, id, req, slot),
        }
        Flow::Answered
    }

    /// Peering and PG requests, for the shard of their PG.
    async fn peering(&mut self, frame: Frame) -> Flow {
        let t = frame.msg_type;
        let pg = match peering_pg(t, &frame.control) {
            Ok(pg) => pg,
            Err(e) => return self.malformed(frame.request_id, &e),
        };
        let checked = match t {
            // A client may ask a PG's status where it may read.
            PG_STATUS => self.access.pool(&self.osd, pg.pool, Perms::R),
            // Giving up data: who may write (and so remove) the pool's objects.
            PG_MARK_LOST => self.access.pool(&self.osd, pg.pool, Perms::W),
            _ => Ok(()),
        };
        if let Err(why) = checked {
            refuse_for(&self.sender, frame.request_id, &why.into());
            return Flow::Answered;
        }
        if let Some(claim) = push_claim(t, &frame.control) {
            if let Err(flow) = self.check_primary(frame.request_id, claim, "PG_PUSH").await {
                return flow;
            }
        }
        let msg = ShardMsg::Peer {
            reply: self.sender.for_request(&self.load, frame.data.len()),
            req_id: frame.request_id,
            msg_type: t,
            control: frame.control,
            data: frame.data,
        };
        self.osd.dispatch(pg, msg, self.shard);
        Flow::Handed
    }

    /// Checks a daemon message that acts for the PG's primary at `epoch`: its sender must
    /// be the OSD it names as primary (the shard checks that one against the map), and the
    /// map of that epoch must be here first. `Err`: refused, the connection is to close.
    async fn check_primary(
        &self,
        req_id: u64,
        (primary, epoch): (u32, u64),
        what: &'static str,
    ) -> Result<(), Flow> {
        if let Err(why) = self.access.speaks_for(primary, what) {
            tracing::warn!(peer = %self.access.name(), "refused: {why}");
            refuse_for(&self.sender, req_id, &why.into());
            return Err(Flow::Close);
        }
        self.catch_up(epoch).await;
        Ok(())
    }

    /// Refuses a request whose control part does not decode and closes the connection.
    fn malformed(&self, req_id: u64, e: &MsgError) -> Flow {
        refuse(&self.sender, req_id, ErrorCode::Malformed, &e.to_string());
        Flow::Close
    }
}

use crate::ec::rebuild::request::Request as RebuildRequest;

/// Why an EC rebuild request is refused as malformed.
#[derive(Debug, thiserror::Error)]
enum BadRebuild {
    #[error(transparent)]
    Decode(#[from] MsgError),
    #[error(transparent)]
    Limit(#[from] cairn_proto::msg::ec_rebuild::EcRebuildLimitError),
    #[error("EC_STAT carries no payload")]
    StatPayload,
    #[error("EC_SET_LOG entries: {0}")]
    Entries(String),
}

/// Decodes and checks an EC rebuild request: its PG, its epoch and the request (a push's
/// payload moved into it), or why it is refused.
fn decode_rebuild(frame: Frame) -> Result<(PgId, u64, RebuildRequest), BadRebuild> {
    let pg = |pool, pg| PgId { pool, pg };
    match frame.msg_type {
        EC_STAT => {
            let q = decode::<EcStat>("ec stat", &frame.control)?;
            q.check()?;
            if !frame.data.is_empty() {
                return Err(BadRebuild::StatPayload);
            }
            Ok((pg(q.pool, q.pg), q.epoch, RebuildRequest::Stat(q)))
        }
        EC_PUSH => {
            let p = decode::<EcPush>("ec push", &frame.control)?;
            p.check(frame.data.len())?;
            let (at, epoch) = (pg(p.pool, p.pg), p.epoch);
            Ok((at, epoch, RebuildRequest::Push(p, frame.data)))
        }
        _ => {
            let l = decode::<EcSetLog>("ec set log", &frame.control)?;
            l.check()?;
            let entries = crate::pglog::decode_peer_entries(&frame.data)
                .map_err(|f| BadRebuild::Entries(f.what))?;
            let (at, epoch) = (pg(l.pool, l.pg), l.epoch);
            Ok((at, epoch, RebuildRequest::SetLog(l, entries)))
        }
    }
}

/// The primary and epoch a `PG_PUSH` claims (`None` for other messages, or one that does not
/// decode: the shard refuses it as malformed).
fn push_claim(msg_type: u16, control: &[u8]) -> Option<(u32, u64)> {
    (msg_type == PG_PUSH)
        .then(|| decode::<PgPush>("pg push", control).ok())
        .flatten()
        .map(|p| (p.primary, p.epoch))
}

/// The PG a peering request is about (the request is decoded again on its shard).
fn peering_pg(msg_type: u16, control: &[u8]) -> Result<PgId, MsgError> {
    let (pool, pg) = match msg_type {
        PG_QUERY | PG_CLEAN | PG_STATUS => {
            decode::<PgQuery>("pg query", control).map(|q| (q.pool, q.pg))
        }
        PG_PUSH => decode::<PgPush>("pg push", control).map(|q| (q.pool, q.pg)),
        PG_SCRUB => decode::<PgScrub>("pg scrub", control).map(|q| (q.pool, q.pg)),
        PG_MARK_LOST => decode::<PgMarkLost>("pg mark lost", control).map(|q| (q.pool, q.pg)),
        _ => decode::<PgList>("pg list", control).map(|q| (q.pool, q.pg)),
    }?;
    Ok(PgId { pool, pg })
}

/// Checks that the peer may send this kind of message at all (caps on pools are checked
/// where the pool is known). `Err`: the refusal; the connection is closed after it.
fn allowed(access: &Access, msg_type: u16) -> Result<(), Denied> {
    match msg_type {
        REP => access.osd_only("a replicated write"),
        EC_WRITE => access.osd_only("an EC sub-write"),
        EC_READ | EC_QUERY | EC_STAT => access.osd_only("an EC shard read"),
        EC_PUSH | EC_SET_LOG => access.osd_only("an EC shard rebuild"),
        PG_PUSH => access.osd_only("a PG push"),
        PG_QUERY | PG_LIST | PG_SCRUB | PG_CLEAN | PG_PULL => access.osd_only("peering"),
        _ => Ok(()),
    }
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
