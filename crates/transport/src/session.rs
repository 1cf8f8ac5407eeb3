//! Request/reply multiplexing over one connection: many requests in flight, each reply
//! matched to its request by request id, a deadline per call. A reader task routes replies;
//! a request whose caller gave up (deadline, cancelled) is forgotten and its late reply
//! dropped. `ERROR` replies become [`CallError::Refused`] with their typed code.

use crate::dial::{DialError, Dialer};
use crate::frames::{read_guarded, READ_BUFFER};
use crate::sender::FrameSender;
use cairn_failstop::LockOrDie;
use cairn_proto::msg::call::Call;
use cairn_proto::msg::{decode, is_error, ErrorCode, ErrorReply, MsgError};
use cairn_proto::{Frame, Limits};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Why a call got no reply of the kind it wanted. Every variant names the peer's address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("{addr}: connection closed: {why}")]
    Closed { addr: String, why: String },
    #[error("{addr}: no reply within {after:?}")]
    Timeout { addr: String, after: Duration },
    #[error("{addr} refused the request ({code}): {message}")]
    Refused {
        addr: String,
        code: ErrorCode,
        message: String,
    },
    #[error("{addr}: unexpected reply of type {got} (wanted {want})")]
    Unexpected { addr: String, got: u16, want: u16 },
    /// The reply was of the right type but its control part does not decode.
    #[error("{addr}: {error}")]
    Malformed { addr: String, error: MsgError },
}

/// One multiplexed connection.
pub struct Session {
    addr: Arc<str>,
    sender: FrameSender,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    reader: JoinHandle<()>,
}

struct Shared {
    waiters: Mutex<Waiters>,
}

struct Waiters {
    map: HashMap<u64, oneshot::Sender<Frame>>,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock_or_die()
    }

    fn why_closed(&self) -> String {
        self.lock()
            .closed
            .clone()
            .unwrap_or_else(|| "the connection ended".into())
    }
}

impl Session {
    /// Dials `addr` (whose node must be of kind `expect`) and starts routing its replies;
    /// frames from it are checked against `limits`.
    pub async fn open(
        dialer: &Dialer,
        addr: &str,
        expect: u8,
        limits: Limits,
    ) -> Result<Session, DialError> {
        let c = dialer.dial(addr, expect).await?;
        Ok(Session::over(c.stream, c.guards, addr, limits))
    }

    /// A session over a connection that has done its handshake, its frames protected by
    /// `guards` when given.
    pub fn over(
        stream: TcpStream,
        guards: crate::handshake::Guards,
        addr: &str,
        limits: Limits,
    ) -> Session {
        let (sealer, opener) = crate::handshake::split_guards(guards);
        let (r, w) = stream.into_split();
        let sender = FrameSender::new_guarded(w, sealer);
        let shared = Arc::new(Shared {
            waiters: Mutex::new(Waiters {
                map: HashMap::new(),
                closed: None,
            }),
        });
        let reader = tokio::spawn(route_replies(
            r,
            (limits, opener),
            shared.clone(),
            sender.clone(),
        ));
        Session {
            addr: addr.into(),
            sender,
            shared,
            next_id: AtomicU64::new(1),
            reader,
        }
    }

    /// The address the session was opened to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the connection still works (a broken one is replaced, never reused). A
    /// session whose reader is gone (the runtime it was opened on has ended) is not: its
    /// replies would never be routed.
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
            && self.shared.lock().closed.is_none()
            && !self.reader.is_finished()
    }

    /// The sender, for callers that lay out their own frames (batches of requests).
    pub fn sender(&self) -> &FrameSender {
        &self.sender
    }

    /// Reserves a request id and registers for its reply. Send the request with that id,
    /// then wait on the [`Reply`]; dropping it forgets the request. Also says how many
    /// requests are in flight with it.
    pub fn expect_reply(&self) -> Result<(Reply, usize), CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut w = self.shared.lock();
        if w.closed.is_none() && self.reader.is_finished() {
            w.closed = Some("its reader stopped (the runtime it was opened on ended)".into());
        }
        if let Some(why) = &w.closed {
            return Err(CallError::Closed {
                addr: self.addr.to_string(),
                why: why.clone(),
            });
        }
        w.map.insert(id, tx);
        let in_flight = w.map.len();
        let reply = Reply {
            rx,
            delivered: false,
            id,
            shared: self.shared.clone(),
            addr: self.addr.clone(),
        };
        Ok((reply, in_flight))
    }

    /// Requests being waited for.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().map.len()
    }

    /// Sends a request and waits up to `timeout` for its reply.
    pub async fn call(
        &self,
        msg_type: u16,
        control: &[u8],
        data: &[u8],
        timeout: Duration,
    ) -> Result<Frame, CallError> {
        let (reply, _) = self.expect_reply()?;
        if self.sender.send(msg_type, reply.id, control, data).is_err() {
            return Err(self.closed());
        }
        reply.wait_for(timeout).await
    }

    /// [`call`](Self::call) whose reply must be of type `want`.
    pub async fn call_for(
        &self,
        msg_type: u16,
        want: u16,
        control: &[u8],
        data: &[u8],
        timeout: Duration,
    ) -> Result<Frame, CallError> {
        let f = self.call(msg_type, control, data, timeout).await?;
        if f.msg_type != want {
            return Err(CallError::Unexpected {
                addr: self.addr.to_string(),
                got: f.msg_type,
                want,
            });
        }
        Ok(f)
    }

    /// Sends `req` as `call`'s request (with `data`) and waits up to `timeout` for its reply:
    /// the reply decoded, and its data part.
    pub async fn ask<Req: serde::Serialize, Rep: serde::de::DeserializeOwned>(
        &self,
        call: Call<Req, Rep>,
        req: &Req,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(Rep, Vec<u8>), CallError> {
        let control = call.encode(req);
        let f = self
            .call_for(call.request, call.reply, &control, data, timeout)
            .await?;
        let rep = call
            .decode_reply(&f.control)
            .map_err(|error| CallError::Malformed {
                addr: self.addr.to_string(),
                error,
            })?;
        Ok((rep, f.data))
    }

    /// Ends the session: every waiting call fails with `why`, later calls fail at once.
    pub fn close(&self, why: &str) {
        self.sender.close();
        self.reader.abort();
        let mut w = self.shared.lock();
        w.closed.get_or_insert_with(|| why.to_string());
        w.map.clear();
    }

    fn closed(&self) -> CallError {
        CallError::Closed {
            addr: self.addr.to_string(),
            why: self.shared.why_closed(),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
        self.sender.close();
    }
}

/// The reply to one request, once it comes.
pub struct Reply {
    rx: oneshot::Receiver<Frame>,
    /// The reader removed its entry (it delivered the reply): nothing to forget on drop.
    delivered: bool,
    id: u64,
    shared: Arc<Shared>,
    addr: Arc<str>,
}

impl Reply {
    /// The request id to send the request with.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits for the reply (as long as the connection lives).
    pub async fn wait(mut self) -> Result<Frame, CallError> {
        let got = (&mut self.rx).await;
        self.delivered = got.is_ok();
        let addr = self.addr.to_string();
        match got {
            Ok(f) if is_error(f.msg_type) => Err(refusal(addr, &f)),
            Ok(f) => Ok(f),
            Err(_) => Err(CallError::Closed {
                addr,
                why: self.shared.why_closed(),
            }),
        }
    }

    /// Waits up to `timeout` for the reply.
    pub async fn wait_for(self, timeout: Duration) -> Result<Frame, CallError> {
        let addr = self.addr.to_string();
        tokio::time::timeout(timeout, self.wait())
            .await
            .unwrap_or(Err(CallError::Timeout {
                addr,
                after: timeout,
            }))
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.delivered {
            self.shared.lock().map.remove(&self.id);
        }
    }
}

/// The typed refusal an `ERROR` frame carries.
fn refusal(addr: String, f: &Frame) -> CallError {
    let (code, message) = decode_refusal(f);
    CallError::Refused {
        addr,
        code,
        message,
    }
}

/// An `ERROR` frame's code and message (an undecodable one is itself malformed).
fn decode_refusal(f: &Frame) -> (ErrorCode, String) {
    match decode::<ErrorReply>("error", &f.control) {
        Ok(e) => (e.code, e.message),
        Err(e) => (
            ErrorCode::Malformed,
            format!("the refusal itself is unreadable: {e}"),
        ),
    }
}

/// Routes each reply to its waiter until the connection ends, then fails every waiter with
/// the reason.
async fn route_replies(
    r: tokio::net::tcp::OwnedReadHalf,
    (limits, mut opener): (Limits, Option<cairn_auth::Opener>),
    shared: Arc<Shared>,
    sender: FrameSender,
) {
    // Buffered: one receive call brings in every reply that has arrived.
    let mut r = crate::RecvBuf::with_capacity(READ_BUFFER, r);
    let why = loop {
        let f = match read_guarded(&mut r, &limits, opener.as_mut()).await {
            Ok(f) => f,
            Err(e) => break e.to_string(),
        };
        let waiter = shared.lock().map.remove(&f.request_id);
        match waiter {
            Some(w) => {
                let _ = w.send(f);
            }
            // A refusal of the connection itself (a bad frame has no request to answer).
            None if is_error(f.msg_type) => {
                let (code, message) = decode_refusal(&f);
                break format!("the peer refused the connection ({code}): {message}");
            }
            // The caller gave up on it.
            None => tracing::trace!(request = f.request_id, "late reply dropped"),
        }
    };
    tracing::debug!(reason = %why, "session ended");
    sender.close();
    let mut w = shared.lock();
    w.closed = Some(why);
    // Dropping the senders wakes every waiter with the reason.
    w.map.clear();
}
