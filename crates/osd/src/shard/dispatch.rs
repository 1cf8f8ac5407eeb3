//! Running a shard's messages: the dispatch of each to its handler (`op`, `peering`, ...),
//! and making the shard's submitted writes durable then completing them. Handlers take the
//! shard's state (`Shard`, in `mod.rs`) and never this module, so dispatch sits above them.

use super::Shard;
use crate::mailbox::{OnDurable, Queued, ShardMsg, ShardState};
use crate::op;
use cairn_failstop::LockOrDie;
use cairn_map::PgId;
use cairn_proto::msg::osd::{DownPg, OSD_SYNC_REPLY};
use cairn_store::SharedBytes;
use cairn_transport::{begin_batch, end_batch};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::UnboundedReceiver;

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
        let mut shard = state.lock_or_die();
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
            ShardMsg::EcWrite {
                reply,
                req_id,
                sub,
                data,
            } => crate::ec::member::handle_write(self, reply, req_id, sub, data),
            ShardMsg::EcRead { reply, req_id, req } => {
                crate::ec::member::handle_read(self, reply, req_id, req)
            }
            ShardMsg::EcQuery {
                reply,
                req_id,
                query,
            } => crate::ec::member::handle_query(self, reply, req_id, query),
            ShardMsg::EcRebuild { reply, req_id, req } => {
                crate::ec::rebuild::member::handle(self, reply, req_id, req)
            }
            ShardMsg::EcResume {
                pg,
                reply,
                req_id,
                req,
                data,
                old,
            } => {
                let op = crate::pgstate::WaitingOp {
                    reply,
                    req_id,
                    req,
                    data,
                };
                crate::ec::resume(self, pg, op, old)
            }
            ShardMsg::EcReadDone { pg, object } => crate::ec::unbusy(self, pg, &object),
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
            let job = crate::mailbox::SyncJob {
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

impl ShardState for Mutex<Shard> {
    fn handle_now(&self, msg: ShardMsg) {
        self.lock_or_die().handle(msg);
    }

    fn sync_now(&self) {
        self.lock_or_die().sync();
    }

    fn troubles(&self, me: u32, t: &mut crate::mailbox::PgTroubles) {
        let shard = self.lock_or_die();
        for (pg, st) in &shard.pgs {
            if st.placement.primary() != Some(me) {
                continue;
            }
            let entry = |osds: Vec<u32>| DownPg {
                pool: pg.pool,
                pg: pg.pg,
                osds,
            };
            if let Some(d) = &st.down {
                t.down.push(entry(d.waiting_for.clone()));
            }
            if let Some(f) = st.failure.as_ref().filter(|f| !f.class.retries()) {
                let mut why = f.what.clone();
                cairn_failstop::cut_text(&mut why, 512, "...");
                t.failed.push(cairn_proto::msg::osd::FailedPg {
                    pool: pg.pool,
                    pg: pg.pg,
                    class: f.class.name().to_string(),
                    why,
                    unfound: st.unfound.len() as u64,
                });
            }
            if !st.lost_intervals.is_empty() {
                let mut osds: Vec<u32> = st
                    .lost_intervals
                    .iter()
                    .flat_map(|iv| iv.acting.iter().copied())
                    .collect();
                osds.sort_unstable();
                osds.dedup();
                t.lost.push(entry(osds));
            }
        }
    }

    fn peering_count(&self) -> u64 {
        let shard = self.lock_or_die();
        shard.pgs.values().filter(|st| st.peering.is_some()).count() as u64
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
