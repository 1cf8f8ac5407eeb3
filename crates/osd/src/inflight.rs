//! Writes waiting for the members of their acting set.
//!
//! A write is registered before it is sent to the replicas; each member's answer (the local
//! commit, a replica's reply) removes that member from its waiting list, on whatever thread
//! delivers it. The last one sends the client's reply directly: replica answers never queue
//! behind client ops. A write can also fail as a whole (a member's connection broke, the
//! acting set changed): the client then resends it.

use cairn_failstop::LockOrDie;
use cairn_map::PgId;
use cairn_proto::msg::osd::{OpReply, OP_REPLY};
use cairn_transport::FrameSender;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Notifies the shard owning a PG that a write it may have parked reads behind is done.
pub type DoneHook = Box<dyn Fn(PgId) + Send + Sync>;

/// One write in flight.
pub struct InflightWrite {
    pub tid: u64,
    pub pg: PgId,
    pub version: u64,
    client_req: u64,
    /// What the client asked, for metrics and slow-op reports.
    pub what: WriteWhat,
    state: Mutex<WriteState>,
}

/// A write in flight for too long, and where it stands.
#[derive(Debug, Clone)]
pub struct SlowWrite {
    pub pg: PgId,
    pub version: u64,
    pub what: WriteWhat,
    pub age: std::time::Duration,
    /// Members that do not hold it yet.
    pub waiting: Vec<u32>,
    /// How many members hold it, and when the last of them answered.
    pub held: (u32, Option<std::time::Duration>),
}

/// A write's kind, size and start (when its op reached the shard).
#[derive(Debug, Clone, Copy)]
pub struct WriteWhat {
    pub op: &'static str,
    pub bytes: u64,
    pub started: std::time::Instant,
}

struct WriteState {
    waiting: Vec<u32>,
    /// How many members hold the write, and when the last answered (since it started): no
    /// allocation per write for what only a slow-write report reads.
    held: (u32, Option<std::time::Duration>),
    /// Reported slow (`slow_writes`).
    slow: bool,
    done: bool,
    readers_waiting: bool,
    /// Where the answer goes; taken when it is sent. A done write stays referenced (the PG
    /// keeps the last write of each object) and must not keep its request counted against
    /// the client's connection (`cairn_transport::load`).
    client: Option<FrameSender>,
}

impl WriteWhat {
    /// An op of kind `op` carrying `bytes`, started now.
    pub fn now(op: &'static str, bytes: u64) -> WriteWhat {
        WriteWhat {
            op,
            bytes,
            started: std::time::Instant::now(),
        }
    }
}

impl InflightWrite {
    fn lock(&self) -> MutexGuard<'_, WriteState> {
        self.state.lock_or_die()
    }

    /// Whether the write has completed (acknowledged or failed).
    pub fn is_done(&self) -> bool {
        self.lock().done
    }

    /// Asks for a done notification; returns false when it is already done (read now).
    pub fn park_reader(&self) -> bool {
        let mut st = self.lock();
        if st.done {
            return false;
        }
        st.readers_waiting = true;
        true
    }
}

/// All writes in flight on this OSD, by transaction id.
pub struct Inflight {
    next_tid: AtomicU64,
    table: Vec<Mutex<HashMap<u64, Arc<InflightWrite>>>>,
    done_hook: std::sync::OnceLock<DoneHook>,
    repeer_hook: std::sync::OnceLock<DoneHook>,
    /// Members whose answers said their store is full.
    pub full: crate::fullness::FullMembers,
    metrics: std::sync::OnceLock<Arc<crate::metrics::OsdMetrics>>,
    /// Totals of completed client ops (writes here, reads by the read path).
    pub totals: crate::optotals::OpTotals,
}

const TABLE_SHARDS: usize = 16;

impl Inflight {
    /// An empty table.
    pub fn new() -> Inflight {
        Inflight {
            next_tid: AtomicU64::new(1),
            table: (0..TABLE_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            done_hook: std::sync::OnceLock::new(),
            repeer_hook: std::sync::OnceLock::new(),
            full: Default::default(),
            metrics: std::sync::OnceLock::new(),
            totals: Default::default(),
        }
    }

    /// Counts completed writes in these metrics (once).
    pub fn set_metrics(&self, m: Arc<crate::metrics::OsdMetrics>) {
        let _ = self.metrics.set(m);
    }

    /// Sets what to call when a replica reports a gap in a PG's history (once).
    pub fn set_repeer_hook(&self, hook: DoneHook) {
        let _ = self.repeer_hook.set(hook);
    }

    /// Replica `member` of write `tid`'s PG missed a write: fails it (the client resends) and
    /// has the PG peered again. Ignored unless the write waits on `member`.
    pub fn gap(&self, tid: u64, member: u32) {
        if !self.waits_on(tid, member) {
            return;
        }
        let pg = self.pg_of(tid);
        self.fail(tid, &OpReply::Retry);
        if let (Some(pg), Some(hook)) = (pg, self.repeer_hook.get()) {
            hook(pg);
        }
    }

    /// Sets what to call when a write with parked readers completes (once).
    pub fn set_done_hook(&self, hook: DoneHook) {
        let _ = self.done_hook.set(hook);
    }

    fn slot(&self, tid: u64) -> MutexGuard<'_, HashMap<u64, Arc<InflightWrite>>> {
        self.table[(tid as usize) % TABLE_SHARDS].lock_or_die()
    }

    /// Registers a write waiting for `members` (this OSD included).
    pub fn register(
        &self,
        pg: PgId,
        version: u64,
        members: Vec<u32>,
        client: FrameSender,
        client_req: u64,
        what: WriteWhat,
    ) -> Arc<InflightWrite> {
        let tid = self.next_tid.fetch_add(1, Ordering::Relaxed);
        let w = Arc::new(InflightWrite {
            tid,
            pg,
            version,
            client_req,
            what,
            state: Mutex::new(WriteState {
                waiting: members,
                held: (0, None),
                slow: false,
                done: false,
                readers_waiting: false,
                client: Some(client),
            }),
        });
        self.slot(tid).insert(tid, w.clone());
        w
    }

    /// Records that `member` holds write `tid`; completes it when it was the last. Whether the
    /// write waited on that member (a peer's request id is a claim: only then is its answer
    /// believed for anything else, e.g. that it is full).
    pub fn member_done(&self, tid: u64, member: u32) -> bool {
        let Some(w) = self.slot(tid).get(&tid).cloned() else {
            return false; // already failed or completed
        };
        let mut st = w.lock();
        let waited = st.waiting.contains(&member);
        if waited {
            st.waiting.retain(|m| *m != member);
            st.held = (st.held.0 + 1, Some(w.what.started.elapsed()));
        }
        if st.waiting.is_empty() && !st.done {
            let reply = OpReply::Ok {
                version: w.version,
                size: 0,
            };
            self.finish(&w, st, &reply);
        }
        waited
    }

    /// The PG of write `tid`, if it is still known.
    pub fn pg_of(&self, tid: u64) -> Option<PgId> {
        self.slot(tid).get(&tid).map(|w| w.pg)
    }

    /// Whether write `tid` still waits on `member`: only such a member's answer may end it
    /// (a peer's reply names a request id, a claim checked here).
    fn waits_on(&self, tid: u64, member: u32) -> bool {
        let Some(w) = self.slot(tid).get(&tid).cloned() else {
            return false;
        };
        let waits = w.lock().waiting.contains(&member);
        waits
    }

    /// Member `member` failed write `tid`: ends it with `reply`, unless it does not wait on
    /// that member (or already completed).
    pub fn member_failed(&self, tid: u64, member: u32, reply: &OpReply) {
        if self.waits_on(tid, member) {
            self.fail(tid, reply);
        }
    }

    /// Ends write `tid` with `reply` (a failure) unless it already completed.
    pub fn fail(&self, tid: u64, reply: &OpReply) {
        let Some(w) = self.slot(tid).get(&tid).cloned() else {
            return;
        };
        let st = w.lock();
        if !st.done {
            self.finish(&w, st, reply);
        }
    }

    /// Fails every write still waiting for a member `is_gone` says is gone.
    pub fn fail_waiting_on(&self, is_gone: impl Fn(u32) -> bool, reply: &OpReply) {
        let mut victims = Vec::new();
        for slot in &self.table {
            let slot = slot.lock_or_die();
            for w in slot.values() {
                if w.lock().waiting.iter().any(|m| is_gone(*m)) {
                    victims.push(w.tid);
                }
            }
        }
        for tid in victims {
            self.fail(tid, reply);
        }
    }

    fn finish(&self, w: &InflightWrite, mut st: MutexGuard<'_, WriteState>, reply: &OpReply) {
        st.done = true;
        if st.slow {
            let took = w.what.started.elapsed();
            tracing::warn!(pg = %w.pg, version = w.version, op = w.what.op, ?took, ?reply, "slow write completed");
        }
        let wake_readers = st.readers_waiting;
        let client = st.client.take();
        drop(st);
        self.slot(w.tid).remove(&w.tid);
        let control = cairn_proto::msg::encode(reply);
        // A client that went away does not need its answer.
        if let Some(client) = client {
            let _ = client.send(OP_REPLY, w.client_req, &control, &[]);
        }
        if let OpReply::Ok { .. } = reply {
            let what = &w.what;
            self.totals.op(w.pg.pool, true, what.started, what.bytes, 0);
            if let Some(m) = self.metrics.get() {
                m.op_done(w.pg.pool, what.op, what.started, (what.bytes, 0));
            }
        }
        if wake_readers {
            if let Some(hook) = self.done_hook.get() {
                hook(w.pg);
            }
        }
    }

    /// Writes in flight for longer than `threshold` not reported yet: each is reported once.
    pub fn slow_writes(&self, threshold: std::time::Duration) -> Vec<SlowWrite> {
        let mut out = Vec::new();
        for slot in &self.table {
            let writes: Vec<Arc<InflightWrite>> = {
                let s = slot.lock_or_die();
                s.values().cloned().collect()
            };
            for w in writes {
                let age = w.what.started.elapsed();
                if age < threshold {
                    continue;
                }
                let mut st = w.lock();
                if st.done || st.slow {
                    continue;
                }
                st.slow = true;
                out.push(SlowWrite {
                    pg: w.pg,
                    version: w.version,
                    what: w.what,
                    age,
                    waiting: st.waiting.clone(),
                    held: st.held,
                });
            }
        }
        out
    }

    /// Writes in flight.
    pub fn count(&self) -> usize {
        self.table.iter().map(|s| s.lock_or_die().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender over a loopback connection (its replies go nowhere anyone reads).
    async fn sender() -> (FrameSender, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap());
        let (c, a) = tokio::join!(c, l.accept());
        let (_, w) = c.unwrap().into_split();
        (FrameSender::new(w), a.unwrap().0)
    }

    #[test]
    fn only_a_member_the_write_waits_on_can_fail_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (to, _peer) = sender().await;
            let inf = Inflight::new();
            let pg = PgId { pool: 1, pg: 2 };
            let w = inf.register(pg, 7, vec![0, 1, 2], to, 9, WriteWhat::now("write", 0));
            let failed = OpReply::Retry;
            // A reply naming this write from an OSD outside its acting set changes nothing.
            inf.member_failed(w.tid, 5, &failed);
            inf.gap(w.tid, 5);
            assert!(!w.is_done());
            // Nor does one from a member that already answered.
            inf.member_done(w.tid, 1);
            inf.member_failed(w.tid, 1, &failed);
            assert!(!w.is_done());
            // A member it waits on ends it.
            inf.member_failed(w.tid, 2, &failed);
            assert!(w.is_done());
        });
    }
}
