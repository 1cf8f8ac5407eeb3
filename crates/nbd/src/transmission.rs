//! The transmission phase of one connection: a reader parses requests and starts each command
//! as its own task; one writer sends replies in completion order. Replies are whole buffers
//! handed to the writer, so one reply's bytes are never interleaved with another's.
//!
//! In-flight work is bounded by two semaphores: [`MAX_IN_FLIGHT`] requests and
//! [`MAX_IN_FLIGHT_BYTES`] of READ/WRITE payload. The reader takes permits before reading a
//! write's payload or starting a command, so a client that floods requests (or stops reading
//! replies) only stalls its own reader. A permit is released once its reply is written.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::command::{check_request, Op, Rejection, Session};
use crate::conn::{skip, wait_shutdown, ConnError, End};
use crate::exec::{execute, Reply};
use crate::export::Export;
use crate::proto::{parse_request, Errno, Request, REQUEST_LEN};
use crate::unwind::CatchPanic;

/// Requests in flight per connection before the reader pauses.
pub const MAX_IN_FLIGHT: usize = 128;
/// READ/WRITE payload bytes in flight per connection before the reader pauses (at least one
/// maximal request always fits).
pub const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;

/// A reply and the permits it holds until written.
struct Outgoing {
    reply: Reply,
    _permits: Permits,
}

struct Permits {
    _count: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// What the reader and the command tasks share.
struct Ctx<X> {
    session: Session,
    contexts: Arc<[crate::handshake::MetaContext]>,
    export: Arc<X>,
    peer: Arc<str>,
    tx: mpsc::UnboundedSender<Outgoing>,
    count: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
}

/// Serves requests until the client disconnects (NBD_CMD_DISC or EOF), breaks the protocol,
/// or the server shuts down; in every case the commands already started finish and their
/// replies are sent before the connection closes.
pub(crate) async fn run<R, W, X>(
    rd: R,
    wr: W,
    session: Session,
    export: Arc<X>,
    peer: Arc<str>,
    shutdown: watch::Receiver<bool>,
) -> Result<End, ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    X: Export,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let ctx = Ctx {
        contexts: session.contexts.clone().into(),
        session,
        export,
        peer,
        tx,
        count: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        bytes: Arc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES)),
    };
    let writer = write_replies(wr, rx);
    tokio::pin!(writer);
    tokio::select! {
        // The reader owns `ctx` (and its sender): when it returns, the writer ends as soon as
        // the last command task has sent its reply.
        end = read_requests(rd, ctx, shutdown) => {
            let written = writer.await;
            let end = end?;
            written?;
            Ok(end)
        }
        // Only a write error ends the writer early: the client is gone. Dropping the reader
        // stops reading; command tasks still run to completion (their replies are dropped).
        written = &mut writer => {
            written?;
            Ok(End::Eof)
        }
    }
}

async fn read_requests<R, X>(
    mut rd: R,
    ctx: Ctx<X>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<End, ConnError>
where
    R: AsyncRead + Unpin,
    X: Export,
{
    loop {
        let mut head = [0u8; REQUEST_LEN];
        tokio::select! {
            biased;
            () = wait_shutdown(&mut shutdown) => return Ok(End::Shutdown),
            r = rd.read_exact(&mut head) => match r {
                Ok(_) => {}
                // A client may close without NBD_CMD_DISC (a partial header is dropped too).
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(End::Eof),
                Err(e) => return Err(e.into()),
            },
        }
        let req = parse_request(&head)?;
        match check_request(&req, &ctx.session) {
            Ok(Op::Disconnect) => return Ok(End::Disconnect),
            Ok(op) => start(&mut rd, &ctx, &req, op).await?,
            Err(Rejection::Fail {
                errno,
                discard,
                reason,
            }) => refuse(&mut rd, &ctx, &req, errno, discard, reason).await?,
            Err(Rejection::Close { reason }) => {
                return Err(ConnError::Request {
                    reason,
                    kind: req.kind,
                    len: req.len,
                })
            }
        }
    }
}

/// Reads a write's payload of `len` bytes (checked against the payload limit before) into a
/// new buffer without zero-filling it first: the bytes are written once, by the read.
async fn read_payload<R: AsyncRead + Unpin>(rd: &mut R, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        // `read_buf` fills the spare capacity; limited so it never reads past the payload.
        let mut part = (&mut *rd).take((len - buf.len()) as u64);
        if part.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf)
}

/// Takes the permits for a command, reads its payload, and runs it in its own task.
async fn start<R, X>(rd: &mut R, ctx: &Ctx<X>, req: &Request, op: Op) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin,
    X: Export,
{
    let bytes = match op {
        Op::Read { len, .. } | Op::Write { len, .. } => len,
        _ => 0,
    };
    let permits = acquire(ctx, bytes).await?;
    let mut payload = Vec::new();
    if let Op::Write { len, .. } = op {
        payload = match read_payload(rd, len as usize).await {
            Ok(p) => p,
            // The write is dropped unexecuted: half a payload must never reach the export.
            Err(e) => {
                return Err(match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => ConnError::TruncatedPayload,
                    _ => e.into(),
                })
            }
        };
    }
    let export = Arc::clone(&ctx.export);
    let peer = Arc::clone(&ctx.peer);
    let tx = ctx.tx.clone();
    let contexts = Arc::clone(&ctx.contexts);
    let (cookie, structured) = (req.cookie, ctx.session.structured);
    tokio::spawn(async move {
        // A panicking export becomes an EIO reply instead of a request the client waits for
        // forever.
        let run = CatchPanic::new(async move { execute(&*export, op, payload, &contexts).await });
        let result = match run.await {
            Ok(r) => r,
            Err(panic) => Err((Errno::Io, panic.to_string())),
        };
        let reply = match result {
            Ok(done) => Reply::done(cookie, structured, done),
            Err((errno, message)) => {
                // A refused FAST_ZERO is routine (clients probe with it); the rest is worth a
                // warning.
                if errno == Errno::NotSup {
                    debug!(peer = %peer, cookie, ?op, error = %message, "nbd: fast zero refused");
                } else {
                    warn!(peer = %peer, cookie, ?op, ?errno, error = %message, "nbd: command failed");
                }
                Reply::error(cookie, structured, errno, &message)
            }
        };
        // A send error means the writer is gone (client disconnected): nothing to do.
        let _ = tx.send(Outgoing {
            reply,
            _permits: permits,
        });
    });
    Ok(())
}

/// Replies with an error to a request the server will not run, after skipping its payload.
async fn refuse<R, X>(
    rd: &mut R,
    ctx: &Ctx<X>,
    req: &Request,
    errno: Errno,
    discard: u32,
    reason: &'static str,
) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin,
    X: Export,
{
    warn!(
        peer = %ctx.peer, cookie = req.cookie, kind = req.kind, flags = req.flags,
        offset = req.offset, len = req.len, ?errno, reason, "nbd: refusing request"
    );
    if discard > 0 && !skip(rd, discard).await? {
        return Err(ConnError::TruncatedPayload);
    }
    // Error replies take a permit too, so a client sending only bad requests while not
    // reading replies cannot grow the reply queue without bound.
    let permits = acquire(ctx, 0).await?;
    let reply = Reply::error(req.cookie, ctx.session.structured, errno, reason);
    let _ = ctx.tx.send(Outgoing {
        reply,
        _permits: permits,
    });
    Ok(())
}

async fn acquire<X>(ctx: &Ctx<X>, bytes: u32) -> Result<Permits, ConnError> {
    // The semaphores are never closed, so acquiring cannot fail; map it rather than unwrap.
    let closed = |_| ConnError::Internal("in-flight semaphore closed");
    let count = Arc::clone(&ctx.count)
        .acquire_owned()
        .await
        .map_err(closed)?;
    let bytes = match bytes {
        0 => None,
        n => Some(
            Arc::clone(&ctx.bytes)
                .acquire_many_owned(n)
                .await
                .map_err(closed)?,
        ),
    };
    Ok(Permits {
        _count: count,
        _bytes: bytes,
    })
}

/// Writes replies as they arrive, batching whatever is queued into one flush. Returns once
/// every sender is gone and everything is written.
async fn write_replies<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> std::io::Result<()> {
    let mut wr = BufWriter::with_capacity(64 << 10, wr);
    while let Some(out) = rx.recv().await {
        put(&mut wr, out).await?;
        while let Ok(out) = rx.try_recv() {
            put(&mut wr, out).await?;
        }
        wr.flush().await?;
    }
    debug!("nbd: all replies written");
    wr.shutdown().await
}

async fn put<W: AsyncWrite + Unpin>(wr: &mut W, out: Outgoing) -> std::io::Result<()> {
    wr.write_all(&out.reply.head).await?;
    wr.write_all(&out.reply.data).await
    // `out` (with its permits) is dropped here, once its bytes are in the buffer or socket.
}
