//! Monitor-to-monitor Raft traffic: openraft's RPCs carried in frames on the monitors' one
//! TCP port (message types 100..=199), client side (`RaftNetworkFactory`) and server side.
//!
//! Every request is a [`PeerRequest`] naming the sender's cluster (fsid) and id, so monitors
//! of different clusters never mix their logs. A request is answered by the matching reply
//! type with the same request id; a peer that refuses a request (other cluster, malformed
//! message) answers `ERROR` and closes the connection.
//!
//! openraft creates clients freely (one per replication stream, one per election round); they
//! all share one multiplexed session per peer (`cairn_transport::Session`: replies matched by
//! request id, so a late reply to an RPC that timed out is dropped, never read as another's).
//! A session is dialed as a monitor and the peer must answer as one.

use crate::types::{BasicNode, MonRaft, NodeId, Raft};
use cairn_failstop::LockOrDie;
use cairn_proto::msg::{decode, encode, ErrorCode, ErrorReply};
use cairn_proto::{Frame, Limits};
use cairn_transport::{node_kind, CallError, DialError, Dialer, Session};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::RPCTypes;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Request: [`PeerRequest`] of an `AppendEntriesRequest`; reply [`RAFT_APPEND_REPLY`].
pub const RAFT_APPEND: u16 = 100;
/// Request: [`PeerRequest`] of a `VoteRequest`; reply [`RAFT_VOTE_REPLY`].
pub const RAFT_VOTE: u16 = 101;
/// Request: [`PeerRequest`] of an `InstallSnapshotRequest` (one chunk); reply
/// [`RAFT_SNAPSHOT_REPLY`].
pub const RAFT_SNAPSHOT: u16 = 102;
/// Reply: `Result<AppendEntriesResponse, RaftError>`.
pub const RAFT_APPEND_REPLY: u16 = 110;
/// Reply: `Result<VoteResponse, RaftError>`.
pub const RAFT_VOTE_REPLY: u16 = 111;
/// Reply: `Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>>`.
pub const RAFT_SNAPSHOT_REPLY: u16 = 112;

/// Whether a message type belongs to the monitor-to-monitor range.
pub fn is_peer_msg(msg_type: u16) -> bool {
    (100..=199).contains(&msg_type)
}

/// Largest snapshot chunk sent in one frame: well under the default 1 MiB control limit.
pub(crate) const SNAPSHOT_CHUNK: u64 = 256 << 10;

/// Largest snapshot a monitor takes from a peer. A snapshot is the map and its history:
/// far below this on any cluster. Chunks are written at their offset into memory, so an
/// offset past this (a forged or corrupt chunk) would allocate without bound: refused.
pub(crate) const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// Refuses a snapshot chunk that reaches past [`MAX_SNAPSHOT_BYTES`].
fn check_snapshot_chunk(rpc: &InstallSnapshotRequest<MonRaft>) -> Result<(), ErrorReply> {
    let end = rpc.offset.checked_add(rpc.data.len() as u64);
    if end.is_some_and(|e| e <= MAX_SNAPSHOT_BYTES) {
        return Ok(());
    }
    Err(ErrorReply::new(
        ErrorCode::Invalid,
        format!(
            "snapshot chunk at offset {} of {} bytes reaches past the largest snapshot taken ({MAX_SNAPSHOT_BYTES} bytes)",
            rpc.offset,
            rpc.data.len()
        ),
    ))
}

/// Largest `MapChange` a client may propose (encoded); larger commands are refused as
/// malformed. Together with [`MAX_ENTRIES_PER_APPEND`] this bounds an append request well
/// under [`SERVER_LIMITS`], so no command can make replication frames too large to send.
pub const MAX_COMMAND: usize = 16 << 10;

/// Log entries per append request.
pub(crate) const MAX_ENTRIES_PER_APPEND: u64 = 64;

/// Frame limits of the monitor port. The monitor protocol has no raw data parts; the largest
/// control parts are append requests (<= 64 entries of <= 16 KiB) and snapshot chunks.
pub const SERVER_LIMITS: Limits = Limits {
    max_control: 4 << 20,
    max_data: 0,
};

/// Frame limits of replies from a peer monitor (the same as the requests it serves).
const PEER_LIMITS: Limits = SERVER_LIMITS;

/// A Raft RPC from one monitor to another.
#[derive(Debug, Serialize, Deserialize)]
pub struct PeerRequest<T> {
    /// The sender's cluster: requests from another cluster are refused.
    pub fsid: [u8; 16],
    /// The sending monitor.
    pub from: NodeId,
    /// The openraft request.
    pub rpc: T,
}

type AppendReply = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
type VoteReply = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
type SnapshotReply =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

/// Creates clients to the other monitors; one multiplexed session per peer, shared by
/// every client openraft creates for it.
#[derive(Clone)]
pub(crate) struct Network {
    fsid: [u8; 16],
    me: NodeId,
    sessions: Arc<Mutex<HashMap<NodeId, Arc<Session>>>>,
    /// How this monitor proves itself to its peers.
    auth: cairn_transport::Auth,
    /// The frame protection asked for.
    frames: cairn_transport::FrameMode,
}

impl Network {
    pub(crate) fn new(
        fsid: [u8; 16],
        me: NodeId,
        (auth, frames): (cairn_transport::Auth, cairn_transport::FrameMode),
    ) -> Self {
        Network {
            auth,
            frames,
            fsid,
            me,
            sessions: Arc::default(),
        }
    }

    /// The open session to `target` at `addr`, if there is one.
    fn session(&self, target: NodeId, addr: &str) -> Option<Arc<Session>> {
        let sessions = self.sessions.lock_or_die();
        sessions
            .get(&target)
            .filter(|s| s.is_open() && s.addr() == addr)
            .cloned()
    }

    /// Opens a session to `target` (as a monitor, to a monitor) and keeps it.
    async fn open(
        &self,
        target: NodeId,
        addr: &str,
        timeout: Duration,
    ) -> Result<Arc<Session>, DialError> {
        let dialer = Dialer::new(node_kind::MON, self.auth.clone())
            .timeout(timeout)
            .frames(self.frames);
        let s = Arc::new(Session::open(&dialer, addr, node_kind::MON, PEER_LIMITS).await?);
        let mut sessions = self.sessions.lock_or_die();
        sessions.insert(target, s.clone());
        Ok(s)
    }
}

impl RaftNetworkFactory<MonRaft> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            net: self.clone(),
            target,
            node: node.clone(),
        }
    }
}

/// Why an RPC to a peer failed before an answer arrived.
#[derive(Debug, thiserror::Error)]
enum PeerError {
    #[error("monitor {target}: {source}")]
    Dial { target: NodeId, source: DialError },
    #[error("monitor {target}: {source}")]
    Call { target: NodeId, source: CallError },
    #[error("monitor {target}: malformed reply: {reason}")]
    Malformed { target: NodeId, reason: String },
    #[error("timed out")]
    Timeout,
}

/// A client to one peer; openraft uses it for one RPC at a time.
pub(crate) struct Peer {
    net: Network,
    target: NodeId,
    node: BasicNode,
}

impl Peer {
    /// Sends one request and reads its reply, on the peer's session (opened when there is
    /// none). A session may have been closed by the peer since (it restarted): then the
    /// request is tried once more on a new one.
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        msg_type: u16,
        reply_type: u16,
        rpc: Req,
        ttl: Duration,
    ) -> Result<Resp, PeerError> {
        let body = encode(&PeerRequest {
            fsid: self.net.fsid,
            from: self.net.me,
            rpc,
        });
        let deadline = tokio::time::Instant::now() + ttl;
        let (target, addr) = (self.target, self.node.addr.as_str());
        let mut retried = false;
        let frame = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let (session, reused) = match self.net.session(target, addr) {
                Some(s) => (s, true),
                None => {
                    let s = self
                        .net
                        .open(target, addr, left)
                        .await
                        .map_err(|e| match e {
                            DialError::Timeout { .. } => PeerError::Timeout,
                            source => PeerError::Dial { target, source },
                        })?;
                    (s, false)
                }
            };
            match session
                .call_for(msg_type, reply_type, &body, &[], left)
                .await
            {
                Ok(f) => break f,
                Err(CallError::Timeout { .. }) => return Err(PeerError::Timeout),
                Err(CallError::Closed { .. }) if reused && !retried => retried = true,
                Err(source) => return Err(PeerError::Call { target, source }),
            }
        };
        decode("raft reply", &frame.control).map_err(|e| PeerError::Malformed {
            target,
            reason: e.to_string(),
        })
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        e: PeerError,
        action: RPCTypes,
        ttl: Duration,
    ) -> RPCError<NodeId, BasicNode, E> {
        match e {
            PeerError::Timeout => RPCError::Timeout(Timeout {
                action,
                id: self.net.me,
                target: self.target,
                timeout: ttl,
            }),
            PeerError::Call {
                source: CallError::Refused { .. },
                ..
            } => {
                tracing::warn!(target_mon = self.target, "{e}");
                RPCError::Unreachable(Unreachable::new(&e))
            }
            PeerError::Dial { .. } => RPCError::Unreachable(Unreachable::new(&e)),
            PeerError::Call { .. } | PeerError::Malformed { .. } => {
                RPCError::Network(NetworkError::new(&e))
            }
        }
    }

    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<NodeId, BasicNode, E> {
        RPCError::RemoteError(RemoteError::new_with_node(
            self.target,
            self.node.clone(),
            e,
        ))
    }
}

impl RaftNetwork<MonRaft> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<MonRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let ttl = option.hard_ttl();
        let r: AppendReply = self
            .call(RAFT_APPEND, RAFT_APPEND_REPLY, rpc, ttl)
            .await
            .map_err(|e| self.rpc_error(e, RPCTypes::AppendEntries, ttl))?;
        r.map_err(|e| self.remote(e))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<MonRaft>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let ttl = option.hard_ttl();
        let r: SnapshotReply = self
            .call(RAFT_SNAPSHOT, RAFT_SNAPSHOT_REPLY, rpc, ttl)
            .await
            .map_err(|e| self.rpc_error(e, RPCTypes::InstallSnapshot, ttl))?;
        r.map_err(|e| self.remote(e))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let ttl = option.hard_ttl();
        let r: VoteReply = self
            .call(RAFT_VOTE, RAFT_VOTE_REPLY, rpc, ttl)
            .await
            .map_err(|e| self.rpc_error(e, RPCTypes::Vote, ttl))?;
        r.map_err(|e| self.remote(e))
    }
}

fn peer_request<T: DeserializeOwned>(
    what: &'static str,
    frame: &Frame,
    fsid: &[u8; 16],
) -> Result<T, ErrorReply> {
    let req: PeerRequest<T> = decode(what, &frame.control)
        .map_err(|e| ErrorReply::new(ErrorCode::Malformed, e.to_string()))?;
    if &req.fsid != fsid {
        return Err(ErrorReply::new(
            ErrorCode::Denied,
            format!(
                "monitor {} belongs to cluster {}, this monitor to {}: check --fsid",
                req.from,
                crate::config::fsid_hex(&req.fsid),
                crate::config::fsid_hex(fsid)
            ),
        ));
    }
    Ok(req.rpc)
}

/// A peer's Raft request, decoded and checked.
pub(crate) enum PeerRpc {
    Append(AppendEntriesRequest<MonRaft>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<MonRaft>),
}

/// Decodes a peer's request and checks what can be checked before openraft sees it (its
/// cluster, a snapshot chunk's reach); `Err` is the refusal.
pub(crate) fn decode_peer_rpc(fsid: &[u8; 16], frame: &Frame) -> Result<PeerRpc, ErrorReply> {
    match frame.msg_type {
        RAFT_APPEND => Ok(PeerRpc::Append(peer_request("raft append", frame, fsid)?)),
        RAFT_VOTE => Ok(PeerRpc::Vote(peer_request("raft vote", frame, fsid)?)),
        RAFT_SNAPSHOT => {
            let rpc: InstallSnapshotRequest<MonRaft> = peer_request("raft snapshot", frame, fsid)?;
            check_snapshot_chunk(&rpc)?;
            Ok(PeerRpc::Snapshot(rpc))
        }
        t => Err(ErrorReply::new(
            ErrorCode::Unsupported,
            format!("unknown monitor-to-monitor message type {t}"),
        )),
    }
}

/// Decodes a peer's reply of type `msg_type` as the client side does (the fuzz target's
/// entry; `false` when it does not decode).
pub(crate) fn decode_peer_reply(msg_type: u16, control: &[u8]) -> bool {
    match msg_type {
        RAFT_APPEND_REPLY => decode::<AppendReply>("raft append reply", control).is_ok(),
        RAFT_VOTE_REPLY => decode::<VoteReply>("raft vote reply", control).is_ok(),
        RAFT_SNAPSHOT_REPLY => decode::<SnapshotReply>("raft snapshot reply", control).is_ok(),
        _ => false,
    }
}

/// Serves one peer request: the reply's message type and control part, or why it is refused
/// (the connection is then answered `ERROR` and closed).
pub(crate) async fn serve(
    raft: &Raft,
    fsid: &[u8; 16],
    frame: &Frame,
) -> Result<(u16, Vec<u8>), ErrorReply> {
    match decode_peer_rpc(fsid, frame)? {
        PeerRpc::Append(rpc) => {
            let r: AppendReply = raft.append_entries(rpc).await;
            Ok((RAFT_APPEND_REPLY, encode(&r)))
        }
        PeerRpc::Vote(rpc) => {
            let r: VoteReply = raft.vote(rpc).await;
            Ok((RAFT_VOTE_REPLY, encode(&r)))
        }
        PeerRpc::Snapshot(rpc) => {
            let r: SnapshotReply = raft.install_snapshot(rpc).await;
            Ok((RAFT_SNAPSHOT_REPLY, encode(&r)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::error::{Fatal, SnapshotMismatch};
    use openraft::{SnapshotSegmentId, Vote};

    #[test]
    fn snapshot_chunks_past_the_largest_snapshot_are_refused() {
        use openraft::{LogId, SnapshotMeta, StoredMembership};
        let chunk = |offset: u64, len: usize| InstallSnapshotRequest::<MonRaft> {
            vote: Vote::new(1, 0),
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(1, 0), 5)),
                last_membership: StoredMembership::default(),
                snapshot_id: "s".into(),
            },
            offset,
            data: vec![0; len],
            done: false,
        };
        assert!(check_snapshot_chunk(&chunk(0, 1000)).is_ok());
        assert!(check_snapshot_chunk(&chunk(MAX_SNAPSHOT_BYTES - 10, 10)).is_ok());
        for (offset, len) in [(MAX_SNAPSHOT_BYTES, 1), (u64::MAX, 0), (u64::MAX - 1, 10)] {
            let e = check_snapshot_chunk(&chunk(offset, len)).unwrap_err();
            assert_eq!(e.code, ErrorCode::Invalid);
            assert!(e.message.contains("reaches past"), "{}", e.message);
        }
    }

    #[test]
    fn raft_replies_and_errors_survive_postcard() {
        let ok: VoteReply = Ok(VoteResponse {
            vote: Vote::new(3, 1),
            vote_granted: true,
            last_log_id: None,
        });
        let back: VoteReply = decode("t", &encode(&ok)).unwrap();
        assert_eq!(back.unwrap().vote, Vote::new(3, 1));
        let err: AppendReply = Err(RaftError::Fatal(Fatal::Stopped));
        let back: AppendReply = decode("t", &encode(&err)).unwrap();
        assert!(matches!(back, Err(RaftError::Fatal(Fatal::Stopped))));
        let mismatch =
            RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
                expect: SnapshotSegmentId {
                    id: "a".into(),
                    offset: 0,
                },
                got: SnapshotSegmentId {
                    id: "b".into(),
                    offset: 7,
                },
            }));
        let err: SnapshotReply = Err(mismatch.clone());
        let back: SnapshotReply = decode("t", &encode(&err)).unwrap();
        assert_eq!(back.unwrap_err().to_string(), mismatch.to_string());
    }
}
