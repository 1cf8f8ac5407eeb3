//! Connections from this OSD to its peers, for replication. One connection per peer,
//! opened on first use; answers arrive on a task per connection and go straight to the
//! in-flight table (never through a shard's queue). A broken connection fails the writes
//! waiting on that peer so their clients resend.

use crate::inflight::Inflight;
use cairn_map::ClusterMap;
use cairn_proto::msg::osd::{OpReply, RepReply, REP_REPLY};
use cairn_proto::stream::{handshake, node_kind, read_frame, FrameSender};
use cairn_proto::Limits;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::runtime::Handle;

/// How long opening a peer connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
struct PeerConn {
    addr: String,
    sender: FrameSender,
}

/// Outgoing peer connections by OSD id.
pub struct Peers {
    conns: Arc<Mutex<HashMap<u32, PeerConn>>>,
    inflight: Arc<Inflight>,
    rt: Handle,
}

/// The peer cannot be reached now.
#[derive(Debug)]
pub struct PeerDown;

impl Peers {
    /// No connections yet.
    pub fn new(inflight: Arc<Inflight>, rt: Handle) -> Peers {
        Peers {
            conns: Arc::new(Mutex::new(HashMap::new())),
            inflight,
            rt,
        }
    }

    /// Sends a frame to OSD `peer` at the address `map` gives, connecting if needed.
    /// Called from shard threads (blocks at most the connect timeout).
    pub fn send(
        &self,
        map: &ClusterMap,
        peer: u32,
        msg_type: u16,
        req_id: u64,
        control: &[u8],
        data: &[u8],
    ) -> Result<(), PeerDown> {
        let addr = map
            .osds
            .get(&peer)
            .map(|o| o.addr.clone())
            .ok_or(PeerDown)?;
        let sender = match self.cached(peer, &addr) {
            Some(s) => s,
            None => self.connect(peer, &addr)?,
        };
        sender
            .send(msg_type, req_id, control, data)
            .map_err(|_| PeerDown)
    }

    fn cached(&self, peer: u32, addr: &str) -> Option<FrameSender> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .get(&peer)
            .filter(|c| c.addr == addr && !c.sender.is_closed())
            .map(|c| c.sender.clone())
    }

    fn connect(&self, peer: u32, addr: &str) -> Result<FrameSender, PeerDown> {
        let inflight = self.inflight.clone();
        let conns = self.conns.clone();
        let addr_owned = addr.to_string();
        let sender = self.rt.block_on(async move {
            let stream = tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio::net::TcpStream::connect(addr_owned.as_str()),
            )
            .await
            .map_err(|_| PeerDown)?
            .map_err(|e| {
                tracing::warn!(peer, addr = %addr_owned, error = %e, "cannot connect to peer");
                PeerDown
            })?;
            let _ = stream.set_nodelay(true);
            let mut stream = stream;
            if let Err(e) = handshake(&mut stream, node_kind::OSD).await {
                tracing::warn!(peer, addr = %addr_owned, error = %e, "handshake with peer failed");
                return Err(PeerDown);
            }
            let (r, w) = stream.into_split();
            let sender = FrameSender::new(w);
            tokio::spawn(read_answers(r, peer, sender.clone(), inflight, conns));
            Ok::<_, PeerDown>(sender)
        })?;
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = conns.insert(
            peer,
            PeerConn {
                addr: addr.to_string(),
                sender: sender.clone(),
            },
        ) {
            old.sender.close();
        }
        Ok(sender)
    }
}

/// Delivers a peer's answers to the in-flight table until the connection ends.
async fn read_answers(
    mut r: tokio::net::tcp::OwnedReadHalf,
    peer: u32,
    sender: FrameSender,
    inflight: Arc<Inflight>,
    conns: Arc<Mutex<HashMap<u32, PeerConn>>>,
) {
    let limits = Limits::default();
    loop {
        let frame = match read_frame(&mut r, &limits).await {
            Ok(f) => f,
            Err(e) => {
                tracing::info!(peer, error = %e, "peer connection ended");
                break;
            }
        };
        if frame.msg_type != REP_REPLY {
            tracing::warn!(
                peer,
                msg_type = frame.msg_type,
                "unexpected message from peer"
            );
            break;
        }
        match cairn_proto::msg::decode::<RepReply>("replica reply", &frame.control) {
            Ok(RepReply::Done) => inflight.member_done(frame.request_id, peer),
            Ok(RepReply::Stale { epoch }) => {
                tracing::info!(peer, epoch, "peer says this OSD is not primary");
                inflight.fail(frame.request_id, &OpReply::Retry);
            }
            Ok(RepReply::Failed(why)) => {
                inflight.fail(
                    frame.request_id,
                    &OpReply::Failed(format!("replica osd.{peer}: {why}")),
                );
            }
            Err(e) => {
                tracing::warn!(peer, error = %e, "bad reply from peer");
                break;
            }
        }
    }
    sender.close();
    {
        let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
        if c.get(&peer).is_some_and(|pc| pc.sender.is_closed()) {
            c.remove(&peer);
        }
    }
    inflight.fail_waiting_on(|m| m == peer, &OpReply::Retry);
}
