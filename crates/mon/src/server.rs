//! The monitor's TCP server: one port for clients and peers. Each connection has a reader
//! (this task) and a writer task fed by a channel, so slow requests (commands waiting for a
//! commit, subscriptions) run in their own tasks while the reader keeps reading, and replies
//! leave in whatever order they are ready, matched by request id.
//!
//! Every connection starts with the handshake and its authentication
//! (`cairn_transport::accept`): a peer whose first bytes are not a valid handshake is closed
//! without a reply (it does not speak the framing); one whose credentials are refused gets a
//! refusal hello with the reason. Every request is then checked against the peer's entity
//! (`crate::auth::check`). After the handshake, anything malformed (bad frame, undecodable
//! message, unknown or out-of-place message type) is answered with `ERROR` and the connection
//! is closed: after a framing error the stream position cannot be trusted, and a peer sending
//! garbage is not worth guessing about.

use crate::auth::{check, grant_service_keys, grant_ticket, Need};
use crate::ctx::Ctx;
use crate::raft_net;
use cairn_map::MapChange;
use cairn_proto::msg::mon::{
    AuthRequest, CommandReply, ErrorCode, ErrorReply, FailureReport, GetMap, Heartbeat, MapUpdate,
    MembersRequest, PastIntervalsQuery, Subscribe, AUTH_COMMAND, AUTH_REPLY, COMMAND,
    COMMAND_REPLY, ERROR, FAILURE_REPORT, GET_MAP, GET_SERVICE_KEYS, GET_TICKET, HEARTBEAT, MAP,
    MAX_HEARTBEAT_PGS, MEMBERS_COMMAND, MEMBERS_REPLY, MON_STATUS, MON_STATUS_REPLY,
    PAST_INTERVALS, PAST_INTERVALS_REPLY, SERVICE_KEYS, SUBSCRIBE, TICKET,
};
use cairn_proto::msg::{decode, encode};
use cairn_proto::Frame;
use cairn_transport::{
    accept, encode_parts, node_kind, read_guarded, seal_encoded, HandshakeError, Peer, ReadError,
};
use serde::Serialize;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Idle subscriptions get an empty update this often, so subscribers can tell a silent
/// monitor from a dead connection.
pub const KEEPALIVE: Duration = Duration::from_secs(5);

/// Frames queued per connection before senders wait for the client to read.
const OUTBOX: usize = 256;

/// How long a closing connection may take to send what is queued (e.g. an `ERROR`).
const FLUSH_ON_CLOSE: Duration = Duration::from_secs(2);

/// Accepts connections until `shutdown` resolves, then closes them all.
pub(crate) async fn serve(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    shutdown: impl Future<Output = ()>,
) {
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    // Over the caps: closed at once (`admit` logs it).
                    let Some(slot) = ctx.admission.admit(peer.ip()) else { continue };
                    let _ = stream.set_nodelay(true);
                    let ctx = ctx.clone();
                    conns.spawn(async move {
                        connection(stream, peer, ctx).await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    // Usually out of file descriptors: wait rather than spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

/// Encodes one frame.
pub(crate) fn frame<T: Serialize>(msg_type: u16, request_id: u64, msg: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_parts(&mut out, msg_type, request_id, &encode(msg), &[]);
    out
}

/// Writes the connection's frames (each buffer one frame), protecting them with `sealer`
/// on a protected connection.
async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Vec<u8>>,
    mut sealer: Option<cairn_auth::Sealer>,
) {
    while let Some(mut buf) = rx.recv().await {
        if let Some(s) = sealer.as_mut() {
            if let Err(e) = seal_encoded(&mut buf, s) {
                tracing::warn!("cannot protect a frame ({e}); closing the connection");
                return;
            }
        }
        if wr.write_all(&buf).await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}

async fn connection(mut stream: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>) {
    // No ERROR frame is possible on failure: the peer does not speak the framing (yet).
    let (who, guards) = match accept(&mut stream, node_kind::MON, ctx.verifier.as_ref()).await {
        Ok(a) => {
            tracing::trace!(%peer, kind = a.hello.node_kind, a.version, who = %a.peer.name(), frames = %a.peer.frames, "handshake done");
            (a.peer, a.guards)
        }
        // Connected and closed (or reset) without a word: a probe, or a peer that gave up.
        Err(HandshakeError::Io(e)) => {
            tracing::debug!(%peer, "connection closed before its handshake: {e}");
            return;
        }
        Err(e) => {
            tracing::warn!(%peer, "closing a connection whose handshake failed: {e}");
            return;
        }
    };
    let (sealer, mut opener) = cairn_transport::split_guards(guards);
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel(OUTBOX);
    let writer = tokio::spawn(write_loop(wr, rx, sealer));
    let mut rd = BufReader::new(rd);
    let limits = raft_net::SERVER_LIMITS;
    let mut tasks = JoinSet::new();
    let idle = ctx.admission.limits().idle;
    loop {
        // A connection with a subscription or a command in flight is waiting for us.
        let read = if tasks.is_empty() {
            tokio::time::timeout(idle, read_guarded(&mut rd, &limits, opener.as_mut()))
                .await
                .unwrap_or(Err(ReadError::Idle(idle)))
        } else {
            read_guarded(&mut rd, &limits, opener.as_mut()).await
        };
        let f = match read {
            Ok(f) => f,
            Err(ReadError::Closed) => break,
            Err(ReadError::Idle(after)) => {
                tracing::debug!(%peer, ?after, "closing an idle connection");
                break;
            }
            Err(ReadError::Io(e)) => {
                tracing::debug!(%peer, "connection lost: {e}");
                break;
            }
            Err(ReadError::Tampered(e)) => {
                // Not from the peer that authenticated, or changed in flight: nothing more
                // is read or answered on this connection.
                tracing::warn!(%peer, who = %who.name(), "closing a connection: {e}");
                break;
            }
            Err(ReadError::Frame(e)) => {
                tracing::warn!(%peer, "closing a connection that sent a bad frame: {e}");
                let e = ErrorReply::new(ErrorCode::Malformed, e.to_string());
                let _ = tx.send(error_frame(0, &e)).await;
                break;
            }
        };
        let rid = f.request_id;
        if let Err(why) = dispatch(f, &ctx, &who, &tx, &mut tasks).await {
            tracing::warn!(%peer, code = %why.code, "closing a connection that sent a bad request: {}", why.message);
            let _ = tx.send(error_frame(rid, &why)).await;
            break;
        }
        while tasks.try_join_next().is_some() {}
    }
    // Subscriptions and pending commands of this connection end with it.
    tasks.shutdown().await;
    drop(tx);
    let _ = tokio::time::timeout(FLUSH_ON_CLOSE, writer).await;
}

fn error_frame(rid: u64, e: &ErrorReply) -> Vec<u8> {
    frame(ERROR, rid, e)
}

/// Handles one request; `Err` says why the connection must be closed.
async fn dispatch(
    f: Frame,
    ctx: &Arc<Ctx>,
    who: &Peer,
    tx: &mpsc::Sender<Vec<u8>>,
    tasks: &mut JoinSet<()>,
) -> Result<(), ErrorReply> {
    let rid = f.request_id;
    let allowed = |need: Need<'_>| {
        check(who, need, &ctx.view).map_err(|why| {
            tracing::warn!(peer = %who.name(), "refused: {why}");
            ErrorReply::new(why.code(), why.to_string())
        })
    };
    if matches!(f.msg_type, COMMAND | MEMBERS_COMMAND | AUTH_COMMAND)
        && f.control.len() > raft_net::MAX_COMMAND
    {
        // Checked before decoding: what they carry goes into Raft entries or replies.
        return Err(ErrorReply::new(
            ErrorCode::Invalid,
            format!(
                "command of {} bytes is over the limit of {}",
                f.control.len(),
                raft_net::MAX_COMMAND
            ),
        ));
    }
    match f.msg_type {
        GET_MAP | SUBSCRIBE | MON_STATUS | PAST_INTERVALS => allowed(Need::Read)?,
        t if raft_net::is_peer_msg(t) => allowed(Need::Monitor)?,
        _ => {}
    }
    let reply = match f.msg_type {
        GET_MAP => {
            let req: GetMap = decode("get map", &f.control).map_err(malformed)?;
            let update = ctx
                .view
                .update_since(req.have)
                .unwrap_or(MapUpdate::Incrementals(Vec::new()));
            frame(MAP, rid, &update)
        }
        SUBSCRIBE => {
            let req: Subscribe = decode("subscribe", &f.control).map_err(malformed)?;
            tasks.spawn(subscription(ctx.clone(), rid, req.have, tx.clone()));
            return Ok(());
        }
        COMMAND => {
            let mut change: MapChange = decode("command", &f.control).map_err(malformed)?;
            if let MapChange::BlocklistAdd { until, .. } = &mut change {
                *until = crate::node::blocklist_until();
            }
            if let Err(e) = allowed(Need::Change(&change)) {
                let reply = CommandReply::Refused(cairn_map::MapError::Denied(e.message));
                return send(tx, frame(COMMAND_REPLY, rid, &reply)).await;
            }
            if matches!(
                change,
                MapChange::TrimHistory { .. } | MapChange::BlocklistExpire { .. }
            ) {
                let reply = CommandReply::Refused(cairn_map::MapError::MonitorsOnly);
                return send(tx, frame(COMMAND_REPLY, rid, &reply)).await;
            }
            let (ctx, tx) = (ctx.clone(), tx.clone());
            tasks.spawn(async move {
                let reply = ctx.command(change).await;
                let _ = tx.send(frame(COMMAND_REPLY, rid, &reply)).await;
            });
            return Ok(());
        }
        MEMBERS_COMMAND => {
            let req: MembersRequest = decode("members command", &f.control).map_err(malformed)?;
            let (ctx, tx, who) = (ctx.clone(), tx.clone(), who.clone());
            tasks.spawn(async move {
                let reply = crate::members_cmd::serve(&ctx, &who, req).await;
                let _ = tx.send(frame(MEMBERS_REPLY, rid, &reply)).await;
            });
            return Ok(());
        }
        AUTH_COMMAND => {
            let req: AuthRequest = decode("auth command", &f.control).map_err(malformed)?;
            let (ctx, tx, who) = (ctx.clone(), tx.clone(), who.clone());
            tasks.spawn(async move {
                let reply = crate::keys_cmd::serve(&ctx, &who, req).await;
                let _ = tx.send(frame(AUTH_REPLY, rid, &reply)).await;
            });
            return Ok(());
        }
        HEARTBEAT => {
            let hb: Heartbeat = decode("heartbeat", &f.control).map_err(malformed)?;
            allowed(Need::OsdItself(hb.osd))?;
            if hb.pgs.len() > MAX_HEARTBEAT_PGS {
                return Err(ErrorReply::new(
                    ErrorCode::Invalid,
                    format!(
                        "heartbeat reports {} PGs, over the limit of {MAX_HEARTBEAT_PGS}",
                        hb.pgs.len()
                    ),
                ));
            }
            frame(COMMAND_REPLY, rid, &ctx.heartbeat(hb))
        }
        FAILURE_REPORT => {
            let r: FailureReport = decode("failure report", &f.control).map_err(malformed)?;
            allowed(Need::OsdItself(r.reporter))?;
            frame(COMMAND_REPLY, rid, &ctx.failure_report(r))
        }
        MON_STATUS => frame(MON_STATUS_REPLY, rid, &ctx.status()),
        GET_TICKET => frame(TICKET, rid, &grant_ticket(ctx.keys.as_deref(), who)),
        GET_SERVICE_KEYS => frame(
            SERVICE_KEYS,
            rid,
            &grant_service_keys(ctx.keys.as_deref(), who),
        ),
        PAST_INTERVALS => {
            let q: PastIntervalsQuery =
                decode("past intervals query", &f.control).map_err(malformed)?;
            frame(PAST_INTERVALS_REPLY, rid, &ctx.past_intervals(&q))
        }
        t if raft_net::is_peer_msg(t) => {
            let (reply_type, body) = raft_net::serve(&ctx.raft, &ctx.fsid, &f).await?;
            let mut out = Vec::new();
            encode_parts(&mut out, reply_type, rid, &body, &[]);
            out
        }
        t => {
            return Err(ErrorReply::new(
                ErrorCode::Unsupported,
                format!("message type {t} is not a monitor request"),
            ))
        }
    };
    send(tx, reply).await
}

async fn send(tx: &mpsc::Sender<Vec<u8>>, frame: Vec<u8>) -> Result<(), ErrorReply> {
    tx.send(frame)
        .await
        .map_err(|_| ErrorReply::new(ErrorCode::Internal, "the connection's writer stopped"))
}

fn malformed(e: cairn_proto::msg::MsgError) -> ErrorReply {
    ErrorReply::new(ErrorCode::Malformed, e.to_string())
}

/// Pushes every new epoch to a subscriber, starting with what it lacks now.
async fn subscription(ctx: Arc<Ctx>, rid: u64, have: u64, tx: mpsc::Sender<Vec<u8>>) {
    let mut epochs = ctx.view.subscribe();
    let mut sent = have;
    loop {
        // Mark the current epoch seen before reading the map, so a change that lands in
        // between is both in this update or the next and signalled again.
        epochs.borrow_and_update();
        let update = ctx.view.update_since(sent);
        let msg = match &update {
            Some(u) => {
                sent = match u {
                    MapUpdate::Full(m) => m.epoch,
                    MapUpdate::Incrementals(v) => v.last().map_or(sent, |i| i.epoch),
                };
                frame(MAP, rid, u)
            }
            None => Vec::new(),
        };
        if !msg.is_empty() && tx.send(msg).await.is_err() {
            return;
        }
        tokio::select! {
            r = epochs.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(KEEPALIVE) => {
                let empty = MapUpdate::Incrementals(Vec::new());
                if tx.send(frame(MAP, rid, &empty)).await.is_err() {
                    return;
                }
            }
            _ = tx.closed() => return,
        }
    }
}
