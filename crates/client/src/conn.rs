//! One connection to an OSD: ops are written directly by the calling task; a reader task
//! matches replies to waiting ops by request id.

use cairn_proto::msg::osd::{OpReply, OP, OP_REPLY};
use cairn_proto::stream::{handshake, node_kind, read_frame, FrameSender};
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
}

/// The connection broke or could not be opened.
#[derive(Debug, Clone)]
pub struct ConnError(pub String);

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl OsdConn {
    /// Connects to the OSD at `addr`.
    pub async fn connect(addr: &str) -> Result<Arc<OsdConn>, ConnError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
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
        let conn = Arc::new(OsdConn {
            addr: addr.to_string(),
            sender: FrameSender::new(w),
            waiters: waiters.clone(),
            next_id: AtomicU64::new(1),
        });
        tokio::spawn(read_replies(r, waiters, conn.sender.clone()));
        Ok(conn)
    }

    /// Whether the connection is still usable.
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }

    /// Sends an op and waits for its answer.
    pub async fn call(&self, control: &[u8], data: &[u8]) -> Result<Answer, ConnError> {
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
        // Alone on the connection: write now (lowest latency). With others in flight, let
        // the ops issued in this turn of the event loop go out in one write.
        let sent = if in_flight > 1 {
            self.sender.send_deferred(OP, id, control, data)
        } else {
            self.sender.send(OP, id, control, data)
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
