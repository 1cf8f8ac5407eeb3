//! Shards: each is a thread running its own event loop, owning the PGs that hash to it and
//! the connections assigned to it. An op for one of its PGs arriving on one of its
//! connections runs to completion right there (no hand-off between threads); an op for
//! another shard's PG is queued to that shard. The shard's state sits behind a mutex only
//! that thread takes in practice (uncontended), never one shared between shards.

use crate::context::Osd;
use crate::op;
use crate::pgstate::PgState;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::osd::{OpRequest, RepOp, OSD_SYNC_REPLY};
use cairn_store::SharedBytes;
use cairn_transport::{begin_batch, end_batch, FrameSender};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// Work for a shard.
pub enum ShardMsg {
    /// A client op on a PG of this shard.
    Op {
        reply: FrameSender,
        req_id: u64,
        req: OpRequest,
        data: SharedBytes,
    },
    /// A write forwarded by a primary.
    Rep {
        reply: FrameSender,
        req_id: u64,
        op: RepOp,
        data: SharedBytes,
    },
    /// A write with parked reads completed in this PG.
    WriteDone(PgId),
    /// A watch of this PG may have reached its time: answer the ones that did.
    WatchDue(PgId),
    /// This shard's connection to OSD `.0` is up, or opening it failed: writes waiting for
    /// it run again.
    PeerLinked(u32),
    /// A peering or recovery request from a primary.
    Peer {
        reply: FrameSender,
        req_id: u64,
        msg_type: u16,
        control: Vec<u8>,
        data: Vec<u8>,
    },
    /// Peering of `pg` for `interval` ended.
    PeeringDone {
        pg: PgId,
        interval: crate::peering::Interval,
        result: crate::peering::PeerResult,
    },
    /// Background recovery of `pg` for `interval` finished: every member is current.
    RecoveryDone {
        pg: PgId,
        interval: crate::peering::Interval,
    },
    /// The primary's copy of `object` is current again (it was pulled in the background).
    ObjectRecovered {
        pg: PgId,
        interval: crate::peering::Interval,
        object: Vec<u8>,
    },
    /// Try peering `pg` again.
    Repeer(PgId),
    /// A member of `pg` missed a write: peer it again even though the acting set is the same.
    Unpeer(PgId),
    /// The map changed: peer the PGs whose acting set changed.
    MapChanged,
    /// A client asks that every write this OSD acknowledged be durable (`OSD_SYNC`).
    Sync { reply: FrameSender, req_id: u64 },
    /// The syncer thread made writes durable (or failed to): complete them.
    Synced {
        done: Vec<OnDurable>,
        result: Result<(), Arc<cairn_store::StoreError>>,
    },
    /// A read a reader thread could not finish from its plan (a block moved since, or is
    /// damaged): run it again on the shard, reading in place (`readers.rs`).
    ReadAgain {
        reply: FrameSender,
        req_id: u64,
        req: OpRequest,
    },
}

/// The shard index of a PG among `n` shards.
pub fn shard_of(pg: PgId, n: usize) -> usize {
    let h = (pg.pool as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ pg.pg as u64;
    (h % n.max(1) as u64) as usize
}

/// Something to do once the shard's submitted writes are durable.
pub enum OnDurable {
    /// This OSD's copy of in-flight write `tid` is durable.
    Local { tid: u64 },
    /// Acknowledge a replicated write to its primary.
    Ack { to: FrameSender, req_id: u64 },
    /// Answer an `OSD_SYNC` request.
    SyncReply { to: FrameSender, req_id: u64 },
}

/// One shard's state.
pub struct Shard {
    pub osd: Arc<Osd>,
    /// This shard's index.
    pub index: usize,
    pub pgs: HashMap<PgId, PgState>,
    /// Writes submitted to the store, not yet known durable, with what to do then.
    pub unsynced: Vec<OnDurable>,
    /// Writes of pools with `memory` durability, submitted to the store and not yet known
    /// written to its WAL device, with what to do then.
    pub unwritten: Vec<OnDurable>,
    /// Store sequence number of the last submitted write.
    pub last_seq: u64,
    /// Syncs handed to the syncer thread and not completed yet: later ones follow them
    /// there, so that completions keep their order and this thread never waits behind one.
    pub syncing: usize,
    /// Deletions of this OSD's copies of removed pools' PGs (`crate::reclaim`).
    pub reclaiming: HashMap<PgId, tokio::task::AbortHandle>,
}

/// A queued message and the bytes it counts in the shard's backlog (0 for what the OSD
/// queues itself).
pub type Queued = (ShardMsg, usize);

/// How other threads reach a shard.
pub struct ShardHandle {
    pub tx: UnboundedSender<Queued>,
    pub state: Arc<Mutex<Shard>>,
    pub rt: tokio::runtime::Handle,
    /// What connections have queued for it (`crate::backlog`).
    pub backlog: Arc<crate::backlog::Backlog>,
}

impl ShardMsg {
    /// What this request costs in a shard's backlog.
    pub fn backlog_bytes(&self) -> usize {
        let payload = match self {
            ShardMsg::Op { data, .. } | ShardMsg::Rep { data, .. } => data.len(),
            ShardMsg::Peer { control, data, .. } => control.len() + data.len(),
            _ => 0,
        };
        payload + crate::backlog::MESSAGE_OVERHEAD
    }
}

/// Runs the messages queued to a shard, on its thread, until every sender is gone.
pub async fn serve_queue(
    state: Arc<Mutex<Shard>>,
    mut rx: UnboundedReceiver<Queued>,
    backlog: Arc<crate::backlog::Backlog>,
) {
    while let Some((msg, counted)) = rx.recv().await {
        if counted > 0 {
            backlog.sub(counted);
        }
        let mut shard = state.lock().unwrap_or_else(|p| p.into_inner());
        shard.handle(msg);
        if rx.is_empty() {
            shard.sync();
        }
    }
}

impl Shard {
    /// Runs one message to completion.
    pub fn handle(&mut self, msg: ShardMsg) {
        match msg {
            ShardMsg::Op {
                reply,
                req_id,
                req,
                data,
            } => op::handle_client_op(self, reply, req_id, req, data),
            ShardMsg::Rep {
                reply,
                req_id,
                op,
                data,
            } => op::write::handle_rep(self, reply, req_id, op, data),
            ShardMsg::WriteDone(pg) => self.retry_parked(pg),
            ShardMsg::WatchDue(pg) => {
                if let Some(st) = self.pgs.get_mut(&pg) {
                    st.expire_watchers();
                }
            }
            ShardMsg::PeerLinked(peer) => {
                tracing::debug!(
                    peer,
                    "peer connection up or failed; retrying the writes waiting for it"
                );
                self.retry_link_waiting();
            }
            ShardMsg::Peer {
                reply,
                req_id,
                msg_type,
                control,
                data,
            } => {
                let r = crate::peering::member::handle(
                    self,
                    reply.clone(),
                    req_id,
                    msg_type,
                    &control,
                    data,
                );
                if let Err(refusal) = r {
                    tracing::warn!(msg_type, code = %refusal.code, error = %refusal.why, "refusing a peering request");
                    let done = refusal.reply();
                    let control = cairn_proto::msg::encode(&done);
                    let _ = reply.send(cairn_proto::msg::peering::PG_DONE, req_id, &control, &[]);
                }
            }
            ShardMsg::PeeringDone {
                pg,
                interval,
                result,
            } => crate::peering::done(self, pg, interval, result),
            ShardMsg::RecoveryDone { pg, interval } => {
                crate::peering::recovery_done(self, pg, interval)
            }
            ShardMsg::ObjectRecovered {
                pg,
                interval,
                object,
            } => crate::peering::object_recovered(self, pg, interval, object),
            ShardMsg::Repeer(pg) => crate::peering::repeer(self, pg),
            ShardMsg::Unpeer(pg) => crate::peering::unpeer(self, pg),
            ShardMsg::MapChanged => crate::peering::on_map(self),
            ShardMsg::Sync { reply, req_id } => {
                // Every record the store has, whichever shard submitted it: the writes of
                // `memory` pools acknowledged so far are among them, written, maybe not flushed.
                self.last_seq = self.last_seq.max(self.osd.store.last_submitted());
                self.unsynced
                    .push(OnDurable::SyncReply { to: reply, req_id });
            }
            ShardMsg::Synced { done, result } => {
                self.syncing = self.syncing.saturating_sub(1);
                self.complete(done, result.as_ref().map_err(|e| e.as_ref()));
            }
            ShardMsg::ReadAgain { reply, req_id, req } => op::handle_client_op_at(
                self,
                reply,
                req_id,
                req,
                SharedBytes::default(),
                op::DeviceReads::InPlace,
            ),
        }
    }

    /// The state of `pg`, loaded on first use, with its placement current for `map`.
    pub fn pg(&mut self, map: &ClusterMap, pg: PgId) -> &mut PgState {
        let osd = &self.osd;
        let st = self
            .pgs
            .entry(pg)
            .or_insert_with(|| PgState::load(&osd.store, pg));
        if !st.coll_exists && osd.store.collection_exists(crate::pgstate::coll_of(pg)) {
            // Made since it was loaded without a copy: a split here gave it one.
            let fresh = PgState::load(&osd.store, pg);
            st.coll_exists = fresh.coll_exists;
            st.last_version = fresh.last_version;
        }
        if st.placement_epoch != map.epoch {
            st.placement = osd.placement(map, pg);
            st.placement_epoch = map.epoch;
            let lives = crate::peering::interval(map, &st.placement.acting);
            if lives != st.acting_lives || st.interval_since == 0 {
                st.acting_lives = lives;
                st.interval_since = map.epoch;
            }
        }
        st
    }

    /// Remembers a write submitted to the store (sequence `seq`) and what to do when it is
    /// durable.
    pub fn after_sync(&mut self, seq: u64, then: OnDurable) {
        self.last_seq = self.last_seq.max(seq);
        self.unsynced.push(then);
    }

    /// Remembers a write of a pool with `memory` durability submitted to the store (sequence
    /// `seq`) and what to do once it is written to the WAL device (not necessarily flushed).
    pub fn after_write(&mut self, seq: u64, then: OnDurable) {
        self.last_seq = self.last_seq.max(seq);
        self.unwritten.push(then);
    }

    /// Makes every submitted write durable (one WAL write and flush for all of them) and
    /// completes them; on the syncer thread when that would wait for a data device, when the
    /// WAL is on a device rather than in memory (`wal_pace.rs`), or when a sync is already
    /// there, so that this thread goes on serving meanwhile (cache hits included). Writes of
    /// `memory` pools alone are only written to the WAL device (the store flushes them
    /// within its `wal_flush_delay`), which a crash of any process cannot undo.
    pub fn sync(&mut self) {
        if self.unsynced.is_empty() && self.unwritten.is_empty() {
            return;
        }
        let direct = self.osd.store.sync_waits_for_data_device();
        let slow_wal = !self.osd.wal_pace.inline();
        let off_thread = self.syncing > 0 || direct || slow_wal;
        let flush = !self.unsynced.is_empty();
        // A flush makes them written too.
        let mut done = std::mem::take(&mut self.unsynced);
        done.append(&mut self.unwritten);
        let done = if off_thread {
            let job = crate::syncer::SyncJob {
                shard: self.index,
                seq: self.last_seq,
                done,
                flush,
                paced: !direct,
            };
            match self.osd.syncer.send(job) {
                Ok(()) => {
                    self.syncing += 1;
                    if slow_wal {
                        self.osd.wal_pace.handed_off();
                    }
                    return;
                }
                // The syncer is gone (the OSD is stopping): sync here.
                Err(back) => back.0.done,
            }
        } else {
            done
        };
        let t0 = std::time::Instant::now();
        let (store, seq) = (&self.osd.store, self.last_seq);
        let result = self.osd.wal_pace.timed(store, || {
            if flush {
                store.sync_through(seq).map(|_| ())
            } else {
                store.write_through(seq)
            }
        });
        self.osd.note_commit(t0);
        self.complete(done, result.as_ref());
    }

    /// Completes writes whose durability is known.
    fn complete(&mut self, done: Vec<OnDurable>, result: Result<&(), &cairn_store::StoreError>) {
        begin_batch();
        // How full this store is, told to primaries with every replica's answer; looked up
        // once for the batch.
        let mut held = None;
        for d in done {
            match (&result, d) {
                (Ok(_), OnDurable::Local { tid }) => {
                    let _ = self.osd.inflight.member_done(tid, self.osd.id());
                }
                (Ok(_), OnDurable::Ack { to, req_id }) => {
                    let r = held.get_or_insert_with(|| op::write::held_reply(&self.osd.store));
                    op::write::rep_reply(&to, req_id, r)
                }
                (Err(e), OnDurable::Local { tid }) => {
                    self.osd.inflight.fail(tid, &op::store_failed(e))
                }
                (Err(e), OnDurable::Ack { to, req_id }) => {
                    op::write::rep_reply(&to, req_id, &op::rep_store_failed(e))
                }
                (Ok(_), OnDurable::SyncReply { to, req_id }) => {
                    let _ = to.send(OSD_SYNC_REPLY, req_id, &[], &[]);
                }
                (Err(e), OnDurable::SyncReply { to, req_id }) => {
                    let why = format!("osd.{}: WAL flush failed: {e}", self.osd.id());
                    let refusal = cairn_proto::msg::ErrorReply::new(
                        cairn_proto::msg::ErrorCode::Internal,
                        &why,
                    );
                    let control = cairn_proto::msg::encode(&refusal);
                    let _ = to.send(cairn_proto::msg::osd::ERROR, req_id, &control, &[]);
                }
            }
        }
        end_batch();
        if let Err(e) = result {
            tracing::error!(error = %e, "WAL sync failed");
            self.osd.note_store_error(e);
        }
    }

    /// Runs the writes that waited for a peer connection again, in order (each waits again
    /// if another of its members is still being connected to).
    fn retry_link_waiting(&mut self) {
        let pgs: Vec<PgId> = self
            .pgs
            .iter()
            .filter(|(_, st)| !st.link_waiting.is_empty())
            .map(|(pg, _)| *pg)
            .collect();
        for pg in pgs {
            let ops = match self.pgs.get_mut(&pg) {
                Some(st) => std::mem::take(&mut st.link_waiting),
                None => continue,
            };
            for w in ops {
                op::handle_client_op(self, w.reply, w.req_id, w.req, w.data);
            }
        }
    }

    fn retry_parked(&mut self, pg: PgId) {
        let Some(st) = self.pgs.get_mut(&pg) else {
            return;
        };
        for p in std::mem::take(&mut st.parked) {
            op::handle_client_op(self, p.reply, p.req_id, p.req, SharedBytes::default());
        }
    }
}
