//! One multiplexed connection to a monitor: many requests in flight, replies matched by
//! request id. A reader task routes each reply to its waiter; a request whose caller gave up
//! (deadline) is forgotten, so its late reply is dropped. Every connection starts with the
//! handshake (`cairn_proto::Hello`, as a client; the peer must answer as a monitor).

use cairn_proto::stream::{encode_parts, handshake, node_kind, read_frame, write_frame};
use cairn_proto::{Frame, Limits};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Limits for frames from monitors: a full map travels in a control part and can exceed the
/// default 1 MiB on large clusters.
pub(crate) fn limits() -> Limits {
    Limits {
        max_control: 256 << 20,
        max_data: 1 << 20,
    }
}

/// The local address connections are made from (`None`: the system's choice).
pub(crate) type Source = Option<std::net::IpAddr>;

/// Connects and exchanges handshakes, both within `timeout`.
async fn connect(addr: &str, timeout: Duration, from: Source) -> Result<TcpStream, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let dial = cairn_proto::net::connect(addr, from);
    let mut stream = match tokio::time::timeout_at(deadline, dial).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("{addr}: {e}")),
        Err(_) => return Err(format!("{addr}: connect timed out")),
    };
    let _ = stream.set_nodelay(true);
    let hello =
        match tokio::time::timeout_at(deadline, handshake(&mut stream, node_kind::CLIENT)).await {
            Ok(Ok((hello, _version))) => hello,
            Ok(Err(e)) => return Err(format!("{addr}: handshake: {e}")),
            Err(_) => return Err(format!("{addr}: handshake: timed out")),
        };
    if hello.node_kind != node_kind::MON {
        return Err(format!(
            "{addr}: handshake: the peer is not a monitor (node kind {})",
            hello.node_kind
        ));
    }
    Ok(stream)
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Frame>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection to one monitor.
pub(crate) struct Conn {
    /// The address it was opened to.
    pub addr: String,
    /// Encoded frames for the writer task: queuing a whole frame is cancel-safe, so a caller
    /// that gives up mid-call can never leave half a frame on the wire.
    outbox: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    next_rid: AtomicU64,
    dead: Arc<AtomicBool>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

/// Removes a request's waiter when the call ends, however it ends.
struct Forget<'a> {
    pending: &'a Pending,
    rid: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.pending).remove(&self.rid);
    }
}

impl Conn {
    /// Connects and handshakes (bounded by `timeout`).
    pub(crate) async fn open(addr: &str, timeout: Duration, from: Source) -> Result<Conn, String> {
        let stream = connect(addr, timeout, from).await?;
        let (rd, wr) = stream.into_split();
        let pending: Pending = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn(read_loop(BufReader::new(rd), pending.clone(), dead.clone()));
        let (outbox, rx) = mpsc::channel(64);
        let writer = tokio::spawn(write_loop(wr, rx, dead.clone()));
        Ok(Conn {
            addr: addr.to_string(),
            outbox,
            pending,
            next_rid: AtomicU64::new(1),
            dead,
            reader,
            writer,
        })
    }

    /// Whether the connection broke (it is then replaced, never reused).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Sends a request and waits for its reply (the caller bounds the wait).
    pub(crate) async fn call(&self, msg_type: u16, control: &[u8]) -> Result<Frame, String> {
        let rid = self.next_rid.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(rid, tx);
        let _forget = Forget {
            pending: &self.pending,
            rid,
        };
        let mut buf = Vec::new();
        encode_parts(&mut buf, msg_type, rid, control, &[]);
        if self.outbox.send(buf).await.is_err() {
            return Err(format!("{}: connection closed", self.addr));
        }
        rx.await
            .map_err(|_| format!("{}: connection closed", self.addr))
    }
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Vec<u8>>,
    dead: Arc<AtomicBool>,
) {
    while let Some(buf) = rx.recv().await {
        if wr.write_all(&buf).await.is_err() {
            // The reader sees the connection fail too and wakes the waiters.
            dead.store(true, Ordering::Release);
            return;
        }
    }
}

async fn read_loop(
    mut rd: BufReader<tokio::net::tcp::OwnedReadHalf>,
    pending: Pending,
    dead: Arc<AtomicBool>,
) {
    let limits = limits();
    loop {
        match read_frame(&mut rd, &limits).await {
            Ok(f) => {
                let waiter = lock(&pending).remove(&f.request_id);
                if let Some(w) = waiter {
                    let _ = w.send(f);
                }
            }
            Err(e) => {
                tracing::debug!("monitor connection closed: {e}");
                break;
            }
        }
    }
    dead.store(true, Ordering::Release);
    // Waking every waiter: their senders drop, so they see the connection closed.
    lock(&pending).clear();
}

/// A dedicated subscription stream (not multiplexed): `follow` reads its pushes directly.
pub(crate) struct Stream {
    rd: BufReader<tokio::net::tcp::OwnedReadHalf>,
    _wr: OwnedWriteHalf,
}

impl Stream {
    /// Connects, handshakes (bounded by `timeout`) and sends one request.
    pub(crate) async fn open(
        addr: &str,
        (timeout, from): (Duration, Source),
        msg_type: u16,
        rid: u64,
        control: &[u8],
    ) -> Result<Stream, String> {
        let stream = connect(addr, timeout, from).await?;
        let (rd, mut wr) = stream.into_split();
        write_frame(&mut wr, msg_type, rid, control, &[])
            .await
            .map_err(|e| format!("{addr}: sending: {e}"))?;
        Ok(Stream {
            rd: BufReader::new(rd),
            _wr: wr,
        })
    }

    /// The next frame, or why the stream ended.
    pub(crate) async fn next(&mut self) -> Result<Frame, String> {
        read_frame(&mut self.rd, &limits())
            .await
            .map_err(|e| e.to_string())
    }
}
