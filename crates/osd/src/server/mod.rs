//! Accepts connections (clients and primaries) and hands each frame to the shard owning
//! its PG. Malformed input gets an error reply and the connection is closed.
//!
//! `connection` reads frames and decides when held-back replies go out and when the shard's
//! writes are made durable (group commit); `handlers` has one function per message type,
//! each saying what it left to do ([`Flow`]).

mod background;
mod handlers;
mod stats;

pub use stats::{osd_stats, osd_stats_with};

use crate::access::{Access, Denied};
use crate::context::Osd;
use cairn_proto::msg::osd::{BatchError, OpReply, ERROR, OP_REPLY};
use cairn_proto::msg::{ErrorCode, ErrorReply, MsgError};
use cairn_proto::Limits;
use cairn_transport::{
    accept, begin_batch, end_batch, node_kind, ConnLoad, ConnReader, FrameSender, ReadError,
};
use std::sync::Arc;
use tokio::net::TcpListener;

/// Reply bytes a connection may have queued (not yet taken by the socket) before its next
/// request is read: backpressure on a peer that does not read.
const MAX_QUEUED_REPLIES: usize = 32 << 20;

/// Serves connections forever: shakes hands on the calling runtime (the OSD's service
/// thread, so the shards only ever see connections that completed a handshake), then hands
/// each connection to a shard in turn.
pub async fn serve(osd: Arc<Osd>, listener: TcpListener) {
    let mut next = 0usize;
    loop {
        match listener.accept().await {
            Ok((mut stream, peer)) => {
                // Over the caps: closed at once (the refusal is logged by `admit`).
                let Some(slot) = osd.admission.admit(peer.ip()) else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tracing::debug!(%peer, "connection accepted");
                let shard = next % osd.shard_count().max(1);
                next = next.wrapping_add(1);
                let Some(rt) = osd.shard_runtime(shard) else {
                    continue;
                };
                let osd = osd.clone();
                tokio::spawn(async move {
                    let (who, guards) = match accept(
                        &mut stream,
                        node_kind::OSD,
                        osd.verifier.as_ref(),
                    )
                    .await
                    {
                        Ok(a) => (a.peer, a.guards),
                        Err(e) => {
                            tracing::warn!(%peer, error = %e, "handshake failed; closing connection");
                            return;
                        }
                    };
                    // Re-register the socket with the shard's own event loop.
                    let Ok(std) = stream.into_std() else { return };
                    rt.spawn(async move {
                        match tokio::net::TcpStream::from_std(std) {
                            Ok(s) => {
                                connection(osd, s, shard, (Access::new(who), guards)).await;
                                drop(slot);
                            }
                            Err(e) => tracing::warn!(error = %e, "cannot adopt a connection"),
                        }
                    });
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// What handling one frame left to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Answered or refused here (the connection stays open): held-back replies go out once
    /// no more requests are buffered.
    Answered,
    /// Work handed to a shard: once no more requests are buffered, held-back replies and
    /// forwarded writes go out, then one WAL flush makes every write of the batch durable.
    Handed,
    /// Close the connection (its refusal was sent).
    Close,
}

/// One connection's side of the server: who is on it and where its replies go.
struct Conn {
    osd: Arc<Osd>,
    sender: FrameSender,
    /// Every request handed on holds a reply handle counted here until it is answered.
    load: Arc<ConnLoad>,
    /// The shard whose event loop runs this connection.
    shard: usize,
    access: Access,
}

impl Conn {
    /// Sends what is held back and makes the shard's writes durable: done before the
    /// connection waits for anything, so no reply waits on it.
    fn flush(&self) {
        end_batch();
        self.osd.sync_shard(self.shard);
    }

    /// Waits until this connection may read its next request.
    async fn wait_for_room(&self) {
        if self.load.over() {
            // Too much of this connection's work is waiting (on replicas, on peering, ...).
            self.flush();
            self.load.wait_room().await;
        }
        if self.sender.queued_bytes() > MAX_QUEUED_REPLIES {
            // A peer that sends requests and does not read the replies is not read either
            // (the held-back batch goes out first, or it could never drain).
            self.flush();
            self.sender.wait_below(MAX_QUEUED_REPLIES).await;
        }
        // A shard is behind on requests from connections by more than its bound.
        while let Some(backlog) = self.osd.backlogged_shard() {
            self.flush();
            backlog.wait_room().await;
        }
    }
}

async fn connection(
    osd: Arc<Osd>,
    stream: tokio::net::TcpStream,
    shard: usize,
    (access, guards): (Access, cairn_transport::Guards),
) {
    let (sealer, opener) = cairn_transport::split_guards(guards);
    let (r, w) = stream.into_split();
    let limits = Limits::default();
    // Buffered: one receive call brings in every request that has arrived (the buffer is
    // released while the peer is quiet).
    let mut r = ConnReader::new(r, osd.admission.limits().idle).guarded(opener);
    let mut conn = Conn {
        sender: FrameSender::new_guarded(w, sealer),
        load: ConnLoad::new(osd.request_limits),
        osd,
        shard,
        access,
    };
    loop {
        conn.wait_for_room().await;
        let frame = match r.next(&limits).await {
            Ok(f) => f,
            Err(ReadError::Closed) => break,
            Err(ReadError::Idle(after)) => {
                tracing::debug!(peer = %conn.access.name(), ?after, "closing an idle connection");
                break;
            }
            Err(ReadError::Tampered(e)) => {
                // Not from the peer that authenticated, or changed in flight: nothing more
                // is read or answered on this connection.
                tracing::warn!(peer = %conn.access.name(), "closing a connection: {e}");
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "bad frame; closing connection");
                refuse(&conn.sender, 0, ErrorCode::Malformed, &e.to_string());
                break;
            }
        };
        // While more requests are already buffered, replies and forwarded writes are held
        // back and written together when the last one is handled.
        let more = r.frame_buffered();
        if more {
            begin_batch();
        }
        match conn.handle(frame).await {
            Flow::Close => break,
            _ if more => {}
            Flow::Answered => end_batch(),
            Flow::Handed => conn.flush(),
        }
    }
    conn.flush();
    conn.sender.close();
}

/// Why a request is refused before it reaches a shard.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// Its control part does not decode.
    #[error(transparent)]
    Malformed(#[from] MsgError),
    /// An op batch that does not fit its frame or limits.
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// The peer may not send it.
    #[error(transparent)]
    Denied(#[from] Denied),
}

impl Refusal {
    /// The code its `ERROR` reply carries.
    fn code(&self) -> ErrorCode {
        match self {
            Refusal::Malformed(_) => ErrorCode::Malformed,
            Refusal::Batch(e) => e.code(),
            Refusal::Denied(e) => e.class().code(),
        }
    }
}

/// Answers `ERROR` with the code and text of `why`.
fn refuse_for(to: &FrameSender, req_id: u64, why: &Refusal) {
    refuse(to, req_id, why.code(), &why.to_string());
}

/// Answers `ERROR` with `code` and the reason `why`.
fn refuse(to: &FrameSender, req_id: u64, code: ErrorCode, why: &str) {
    let control = cairn_proto::msg::encode(&ErrorReply::new(code, why));
    let _ = to.send(ERROR, req_id, &control, &[]);
}

/// Refuses an op the sender's caps do not allow (the connection stays open).
fn deny_op(to: &FrameSender, req_id: u64, why: &Denied) {
    let control = cairn_proto::msg::encode(&OpReply::Denied(why.to_string()));
    let _ = to.send(OP_REPLY, req_id, &control, &[]);
}
