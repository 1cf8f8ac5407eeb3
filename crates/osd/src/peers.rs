//! Connections from this OSD to its peers, for replication. One connection per peer,
//! opened on first use; answers arrive on a task per connection and go straight to the
//! in-flight table (never through a shard's queue). A broken connection fails the writes
//! waiting on that peer so their clients resend.

use crate::inflight::Inflight;
use cairn_map::ClusterMap;
use cairn_proto::msg::osd::{OpReply, RepReply, REP_REPLY};
use cairn_proto::stream::{
    begin_batch, end_batch, frame_buffered, handshake_blocking, node_kind, read_frame, FrameSender,
};
use cairn_proto::Limits;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long opening a peer connection (connect + handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
struct PeerConn {
    addr: String,
    sender: FrameSender,
}

type ConnTable = Arc<Mutex<HashMap<(usize, u32), PeerConn>>>;

/// Outgoing peer connections by (shard, OSD id): each shard has its own, so answers arrive
/// on the thread that sent the write.
#[derive(Default)]
pub struct Peers {
    conns: ConnTable,
    /// Local address to connect from (the OSD's listening address).
    from: Option<std::net::IpAddr>,
}

/// The peer cannot be reached now.
#[derive(Debug)]
pub struct PeerDown;

impl Peers {
    /// No connections yet.
    pub fn new(from: Option<std::net::IpAddr>) -> Peers {
        Peers {
            from,
            ..Peers::default()
        }
    }

    /// Sends a frame to OSD `peer` at the address `map` gives, connecting if needed. Called
    /// on shard `shard`'s thread (inside its runtime); blocks at most the connect timeout.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &self,
        inflight: &Arc<Inflight>,
        shard: usize,
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
        let sender = match self.cached(shard, peer, &addr) {
            Some(s) => s,
            None => self.connect(inflight, shard, peer, &addr)?,
        };
        sender
            .send(msg_type, req_id, control, data)
            .map_err(|_| PeerDown)
    }

    fn cached(&self, shard: usize, peer: u32, addr: &str) -> Option<FrameSender> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .get(&(shard, peer))
            .filter(|c| c.addr == addr && !c.sender.is_closed())
            .map(|c| c.sender.clone())
    }

    fn connect(
        &self,
        inflight: &Arc<Inflight>,
        shard: usize,
        peer: u32,
        addr: &str,
    ) -> Result<FrameSender, PeerDown> {
        let stream = open(addr, self.from).map_err(|e| {
            tracing::warn!(peer, addr, error = %e, "cannot connect to peer");
            PeerDown
        })?;
        let (r, w) = stream.into_split();
        let sender = FrameSender::new(w);
        tokio::spawn(read_answers(
            r,
            (shard, peer),
            sender.clone(),
            inflight.clone(),
            self.conns.clone(),
        ));
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let conn = PeerConn {
            addr: addr.to_string(),
            sender: sender.clone(),
        };
        if let Some(old) = conns.insert((shard, peer), conn) {
            old.sender.close();
        }
        Ok(sender)
    }
}

/// Connects and handshakes on a blocking socket, then hands it to the current runtime.
fn open(addr: &str, from: Option<std::net::IpAddr>) -> Result<tokio::net::TcpStream, String> {
    let mut s = cairn_proto::net::connect_blocking(addr, from, CONNECT_TIMEOUT)
        .map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(CONNECT_TIMEOUT))
        .map_err(|e| e.to_string())?;
    handshake_blocking(&mut s, node_kind::OSD).map_err(|e| format!("handshake: {e}"))?;
    s.set_read_timeout(None).map_err(|e| e.to_string())?;
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    tokio::net::TcpStream::from_std(s).map_err(|e| e.to_string())
}

/// Delivers a peer's answers to the in-flight table until the connection ends.
async fn read_answers(
    r: tokio::net::tcp::OwnedReadHalf,
    key: (usize, u32),
    sender: FrameSender,
    inflight: Arc<Inflight>,
    conns: ConnTable,
) {
    let peer = key.1;
    let limits = Limits::default();
    // Buffered: one receive call brings in every answer that has arrived.
    let mut r = tokio::io::BufReader::with_capacity(cairn_proto::stream::READ_BUFFER, r);
    loop {
        let frame = match read_frame(&mut r, &limits).await {
            Ok(f) => f,
            Err(e) => {
                tracing::info!(peer, error = %e, "peer connection ended");
                break;
            }
        };
        // Replies to clients completed by a run of buffered answers go out together.
        let more = frame_buffered(r.buffer());
        if more {
            begin_batch();
        }
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
                inflight.member_failed(frame.request_id, peer, &OpReply::Retry);
            }
            Ok(RepReply::Gap { have }) => {
                tracing::warn!(peer, have, "peer missed a write; peering the PG again");
                inflight.gap(frame.request_id, peer);
            }
            Ok(RepReply::Failed { code, why }) => {
                let why = format!("replica osd.{peer}: {why}");
                let failed = OpReply::Failed { code, why };
                inflight.member_failed(frame.request_id, peer, &failed);
            }
            Err(e) => {
                tracing::warn!(peer, error = %e, "bad reply from peer");
                break;
            }
        }
        if !more {
            end_batch();
        }
    }
    end_batch();
    sender.close();
    {
        let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
        if c.get(&key).is_some_and(|pc| pc.sender.is_closed()) {
            c.remove(&key);
        }
    }
    inflight.fail_waiting_on(|m| m == peer, &OpReply::Retry);
}
