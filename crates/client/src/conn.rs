//! One connection to an OSD: ops are written directly by the calling task; a reader task
//! matches replies to waiting ops by request id.
//!
//! Temporal merge: while more than `merge_threshold` ops are in flight on the connection, a
//! small op (<= 16 KiB) is not sent by itself but added to a pending batch; the batch leaves
//! as one `OP_BATCH` message when it holds 8 ops or when the merge task next runs (after the
//! tasks that are ready now, so ops issued in the same turn of the event loop travel
//! together). Below the threshold nothing waits.

use cairn_proto::msg::osd::{BatchedOp, OpBatch, OpReply, OpRequest, OP, OP_BATCH, OP_REPLY};
use cairn_proto::stream::{handshake, node_kind, read_frame, FrameSender, SendClosed};
use cairn_proto::Limits;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// An op's answer: the reply and its raw data.
pub type Answer = (OpReply, Vec<u8>);

type Waiters = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>>;

/// A connection to one OSD.
pub struct OsdConn {
    pub addr: String,
    sender: FrameSender,
    waiters: Waiters,
    next_id: AtomicU64,
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

/// The connection broke or could not be opened.
#[derive(Debug, Clone)]
pub struct ConnError(pub String);

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl OsdConn {
    /// Connects to the OSD at `addr`.
    pub async fn connect(
        addr: &str,
        from: Option<std::net::IpAddr>,
        merge_threshold: usize,
        counters: Arc<MergeCounters>,
    ) -> Result<Arc<OsdConn>, ConnError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, cairn_proto::net::connect(addr, from))
            .await
            .map_err(|_| ConnError(format!("connecting to {addr} timed out")))?
            .map_err(|e| ConnError(format!("cannot connect to {addr}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let mut stream = stream;
        handshake(&mut stream, node_kind::CLIENT)
            .await
            .map_err(|e| ConnError(format!("{addr}: handshake: {e}")))?;
        let (r, w) = stream.into_split();
        let waiters: Waiters = Arc::new(Mutex::new(Some(HashMap::new())));
        let merge = Arc::new(Merge {
            threshold: merge_threshold,
            counters,
            pending: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        });
        let conn = Arc::new(OsdConn {
            addr: addr.to_string(),
            sender: FrameSender::new(w),
            waiters: waiters.clone(),
            next_id: AtomicU64::new(1),
            merge: merge.clone(),
        });
        tokio::spawn(read_replies(r, waiters.clone(), conn.sender.clone()));
        if merge_threshold > 0 {
            tokio::spawn(send_merged(merge, conn.sender.clone(), waiters));
        }
        Ok(conn)
    }

    /// Whether the connection is still usable.
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }

    /// Sends an op and waits for its answer. `small` ops may be merged with others.
    pub async fn call(
        &self,
        req: &OpRequest,
        data: &[u8],
        small: bool,
    ) -> Result<Answer, ConnError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let in_flight = {
            let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            match w.as_mut() {
                Some(map) => {
                    map.insert(id, tx);
                    map.len()
                }
                None => return Err(ConnError(format!("connection to {} is closed", self.addr))),
            }
        };
        let m = &self.merge;
        let sent = if small && m.threshold > 0 && in_flight > m.threshold {
            m.add(id, req, data, &self.sender, &self.waiters)
        } else {
            // Merged ops issued before this one leave first.
            m.send_pending(&self.sender, &self.waiters);
            let control = cairn_proto::msg::encode(req);
            // Alone on the connection: write now (lowest latency). With others in flight,
            // let the ops issued in this turn of the event loop go out in one write.
            if in_flight > 1 {
                self.sender.send_deferred(OP, id, &control, data)
            } else {
                self.sender.send(OP, id, &control, data)
            }
        };
        if sent.is_err() {
            self.forget(id);
            return Err(ConnError(format!("connection to {} is closed", self.addr)));
        }
        rx.await
            .map_err(|_| ConnError(format!("connection to {} broke", self.addr)))
    }

    fn forget(&self, id: u64) {
        if let Some(map) = self
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            map.remove(&id);
        }
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
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an op to the pending batch; sends the batch at once when it is full.
    fn add(
        &self,
        id: u64,
        req: &OpRequest,
        data: &[u8],
        sender: &FrameSender,
        waiters: &Waiters,
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
            Some(p) => self.send(p, sender, waiters),
            None => Ok(()),
        }
    }

    /// Sends whatever is pending.
    fn send_pending(&self, sender: &FrameSender, waiters: &Waiters) {
        let p = std::mem::take(&mut *self.lock());
        let _ = self.send(p, sender, waiters);
    }

    fn send(&self, p: Pending, sender: &FrameSender, waiters: &Waiters) -> Result<(), SendClosed> {
        let n = p.batch.ops.len() as u64;
        if n > 1 {
            self.counters.batches.fetch_add(1, Ordering::Relaxed);
            self.counters.ops.fetch_add(n, Ordering::Relaxed);
        }
        send_batch(p, sender, waiters)
    }
}

/// Sends ops as one message (one op: a plain `OP`). On a closed connection their waiters are
/// dropped, which fails their calls.
fn send_batch(p: Pending, sender: &FrameSender, waiters: &Waiters) -> Result<(), SendClosed> {
    let r = match p.batch.ops.as_slice() {
        [] => return Ok(()),
        [op] => {
            let control = cairn_proto::msg::encode(&op.req);
            sender.send(OP, op.request_id, &control, &p.data)
        }
        _ => {
            let control = cairn_proto::msg::encode(&p.batch);
            sender.send(OP_BATCH, 0, &control, &p.data)
        }
    };
    if r.is_err() {
        if let Some(map) = waiters.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            for op in &p.batch.ops {
                map.remove(&op.request_id);
            }
        }
    }
    r
}

/// Sends the pending batch each time it is woken: it runs after the tasks that are ready,
/// so everything they add goes in the same message.
async fn send_merged(merge: Arc<Merge>, sender: FrameSender, waiters: Waiters) {
    loop {
        merge.wake.notified().await;
        // Woken by the first op of a batch: let every task that is ready run first (on a
        // multi-threaded runtime the woken task would otherwise run right after that op's).
        tokio::task::yield_now().await;
        if sender.is_closed() {
            return;
        }
        merge.send_pending(&sender, &waiters);
    }
}

impl Drop for OsdConn {
    fn drop(&mut self) {
        self.sender.close();
    }
}

async fn read_replies(r: tokio::net::tcp::OwnedReadHalf, waiters: Waiters, sender: FrameSender) {
    let limits = Limits::default();
    // Buffered: one receive call brings in every reply that has arrived.
    let mut r = tokio::io::BufReader::with_capacity(cairn_proto::stream::READ_BUFFER, r);
    loop {
        let frame = match read_frame(&mut r, &limits).await {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "OSD connection ended");
                break;
            }
        };
        if frame.msg_type != OP_REPLY {
            tracing::warn!(msg_type = frame.msg_type, "unexpected message from OSD");
            break;
        }
        let Ok(reply) = cairn_proto::msg::decode::<OpReply>("op reply", &frame.control) else {
            tracing::warn!("malformed op reply from OSD");
            break;
        };
        let waiter = waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&frame.request_id));
        if let Some(tx) = waiter {
            let _ = tx.send((reply, frame.data));
        }
    }
    sender.close();
    // Dropping the senders wakes every waiting op with an error.
    waiters.lock().unwrap_or_else(|p| p.into_inner()).take();
}
