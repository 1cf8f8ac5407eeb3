//! One connection to an OSD, a `cairn_transport::Session`: ops are written directly by the
//! calling task; the session's reader matches replies to waiting ops by request id.
//!
//! Temporal merge: while more than `merge_threshold` ops are in flight on the connection, a
//! small op (<= 16 KiB) is not sent by itself but added to a pending batch; the batch leaves
//! as one `OP_BATCH` message when it holds 8 ops or when the merge task next runs (after the
//! tasks that are ready now, so ops issued in the same turn of the event loop travel
//! together). Below the threshold nothing waits.

use cairn_failstop::LockOrDie;
use cairn_proto::msg::call::Empty;
use cairn_proto::msg::osd::{
    BatchedOp, OpBatch, OpReply, OpRequest, OP, OP_BATCH, OP_CALL, SYNC_CALL,
};
use cairn_proto::Limits;
use cairn_transport::{node_kind, Dialer, FrameSender, SendClosed, Session};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An op's answer: the reply and its raw data.
pub type Answer = (OpReply, Vec<u8>);

/// A connection to one OSD.
pub struct OsdConn {
    pub addr: String,
    session: Arc<Session>,
    merge: Arc<Merge>,
}

/// Most ops one merged message carries.
pub const MERGE_MAX_OPS: usize = 8;
/// Largest op (payload or read length) that is merged.
pub const MERGE_MAX_BYTES: u64 = 16 << 10;

/// How much temporal merge happened (over all of a client's connections).
#[derive(Debug, Default)]
pub struct MergeCounters {
    /// `OP_BATCH` messages sent.
    pub batches: AtomicU64,
    /// Ops that travelled in them.
    pub ops: AtomicU64,
}

/// The pending batch of small ops (temporal merge).
struct Merge {
    /// Merge when more ops than this are in flight; 0 turns merging off.
    threshold: usize,
    counters: Arc<MergeCounters>,
    pending: Mutex<Pending>,
    wake: tokio::sync::Notify,
}

/// A request's data part: borrowed from the caller (copied if the request must wait in the
/// connection's send queue), or a shared buffer the queue holds instead.
#[derive(Clone, Copy)]
pub enum Payload<'a> {
    Slice(&'a [u8]),
    Shared(&'a bytes::Bytes),
}

impl Payload<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::Slice(s) => s,
            Payload::Shared(b) => b,
        }
    }
}

/// The connection broke or could not be opened.
#[derive(Debug, Clone)]
pub struct ConnError {
    pub why: String,
    /// The OSD refused this client's credentials: retrying with them cannot help.
    pub refused: bool,
}

impl ConnError {
    fn broken(why: String) -> ConnError {
        ConnError {
            why,
            refused: false,
        }
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl OsdConn {
    /// Connects to the OSD at `addr` with `dialer` (within 2 s).
    pub async fn connect(
        addr: &str,
        dialer: Dialer,
        merge_threshold: usize,
        counters: Arc<MergeCounters>,
    ) -> Result<Arc<OsdConn>, ConnError> {
        let dialer = dialer.timeout(CONNECT_TIMEOUT);
        let session = Session::open(&dialer, addr, node_kind::OSD, Limits::default())
            .await
            .map_err(|e| ConnError {
                why: e.to_string(),
                refused: e.is_refusal(),
            })?;
        let session = Arc::new(session);
        let merge = Arc::new(Merge {
            threshold: merge_threshold,
            counters,
            pending: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        });
        if merge_threshold > 0 {
            tokio::spawn(send_merged(merge.clone(), Arc::downgrade(&session)));
        }
        Ok(Arc::new(OsdConn {
            addr: addr.to_string(),
            session,
            merge,
        }))
    }

    /// Whether the connection is still usable.
    pub fn is_open(&self) -> bool {
        self.session.is_open()
    }

    /// Asks the OSD to make every write it acknowledged durable (`OSD_SYNC`), within
    /// `timeout`. Merged ops waiting to leave go first.
    pub async fn sync(&self, timeout: Duration) -> Result<(), ConnError> {
        self.merge.send_pending(&self.session);
        self.session
            .ask(SYNC_CALL, &Empty, &[], timeout)
            .await
            .map_err(|e| ConnError::broken(format!("sync: {e}")))?;
        Ok(())
    }

    /// Sends an op and waits for its answer. `small` ops may be merged with others.
    pub async fn call(
        &self,
        req: &OpRequest,
        payload: Payload<'_>,
        small: bool,
    ) -> Result<Answer, ConnError> {
        let data = payload.bytes();
        let (reply, in_flight) = self
            .session
            .expect_reply()
            .map_err(|e| ConnError::broken(e.to_string()))?;
        let id = reply.id();
        let m = &self.merge;
        let sender = self.session.sender();
        let sent = if small && m.threshold > 0 && in_flight > m.threshold {
            m.add(id, req, data, &self.session)
        } else {
            // Merged ops issued before this one leave first.
            m.send_pending(&self.session);
            let control = OP_CALL.encode(req);
            // Alone on the connection: write now (lowest latency). With others in flight,
            // let the ops issued in this turn of the event loop go out in one write.
            // A shared payload is held by the queue, not copied, whenever it waits there:
            // deferred, or sent now but only partly taken by a full socket.
            match (in_flight > 1, payload) {
                (true, Payload::Shared(b)) => {
                    sender.send_deferred_held(OP, id, &control, b.clone())
                }
                (true, Payload::Slice(s)) => sender.send_deferred(OP, id, &control, s),
                (false, Payload::Shared(b)) => sender.send_held(OP, id, &control, b.clone()),
                (false, Payload::Slice(s)) => sender.send(OP, id, &control, s),
            }
        };
        if sent.is_err() {
            return Err(ConnError::broken(format!(
                "connection to {} is closed",
                self.addr
            )));
        }
        let f = reply
            .wait()
            .await
            .map_err(|e| ConnError::broken(e.to_string()))?;
        if f.msg_type != OP_CALL.reply {
            let why = format!(
                "{}: unexpected reply type {} to an op",
                self.addr, f.msg_type
            );
            self.session.close(&why);
            return Err(ConnError::broken(why));
        }
        match OP_CALL.decode_reply(&f.control) {
            Ok(r) => Ok((r, f.data)),
            Err(e) => {
                let why = format!("{}: {e}", self.addr);
                self.session.close(&why);
                Err(ConnError::broken(why))
            }
        }
    }
}

impl Drop for OsdConn {
    fn drop(&mut self) {
        // Lets the merge task see that the connection is gone.
        self.merge.wake.notify_one();
    }
}

/// Ops waiting to be merged, their data already laid out as the merged message's.
#[derive(Default)]
struct Pending {
    batch: OpBatch,
    data: Vec<u8>,
}

impl Merge {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock_or_die()
    }

    /// Adds an op to the pending batch; sends the batch at once when it is full.
    fn add(
        &self,
        id: u64,
        req: &OpRequest,
        data: &[u8],
        session: &Session,
    ) -> Result<(), SendClosed> {
        let full = {
            let mut p = self.lock();
            p.batch.ops.push(BatchedOp {
                request_id: id,
                data_len: data.len() as u32,
                req: req.clone(),
            });
            p.data.extend_from_slice(data);
            if p.batch.ops.len() == 1 {
                self.wake.notify_one();
            }
            (p.batch.ops.len() >= MERGE_MAX_OPS).then(|| std::mem::take(&mut *p))
        };
        match full {
            Some(p) => self.send(p, session),
            None => Ok(()),
        }
    }

    /// Sends whatever is pending.
    fn send_pending(&self, session: &Session) {
        let p = std::mem::take(&mut *self.lock());
        let _ = self.send(p, session);
    }

    fn send(&self, p: Pending, session: &Session) -> Result<(), SendClosed> {
        let n = p.batch.ops.len() as u64;
        if n > 1 {
            self.counters.batches.fetch_add(1, Ordering::Relaxed);
            self.counters.ops.fetch_add(n, Ordering::Relaxed);
        }
        let r = send_batch(p, session.sender());
        if r.is_err() {
            // The merged ops' callers wait on the session: end it so they fail now.
            session.close("sending merged ops failed");
        }
        r
    }
}

/// Sends ops as one message (one op: a plain `OP`).
fn send_batch(p: Pending, sender: &FrameSender) -> Result<(), SendClosed> {
    match p.batch.ops.as_slice() {
        [] => Ok(()),
        // The batch's data is its own buffer: held, not copied again, if it must wait.
        [op] => {
            let control = cairn_proto::msg::encode(&op.req);
            sender.send_held(OP, op.request_id, &control, p.data)
        }
        _ => {
            let control = cairn_proto::msg::encode(&p.batch);
            sender.send_held(OP_BATCH, 0, &control, p.data)
        }
    }
}

/// Sends the pending batch each time it is woken: it runs after the tasks that are ready,
/// so everything they add goes in the same message. Ends with the connection.
async fn send_merged(merge: Arc<Merge>, session: std::sync::Weak<Session>) {
    loop {
        merge.wake.notified().await;
        // Woken by the first op of a batch: let every task that is ready run first (on a
        // multi-threaded runtime the woken task would otherwise run right after that op's).
        tokio::task::yield_now().await;
        let Some(session) = session.upgrade().filter(|s| s.is_open()) else {
            return;
        };
        merge.send_pending(&session);
    }
}
