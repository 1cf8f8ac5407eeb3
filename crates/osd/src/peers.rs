//! Connections from this OSD to its peers, for replication. One connection per peer,
//! opened on first use by a task of the shard's event loop (the shard never waits for a
//! connect: frames sent meanwhile queue in the sender); answers arrive on that task and go
//! straight to the in-flight table (never through a shard's queue). A connection that breaks
//! or cannot be opened fails the writes waiting on that peer so their clients resend.

use crate::inflight::Inflight;
use cairn_failstop::LockOrDie;
use cairn_map::ClusterMap;
use cairn_proto::msg::ec::EC_READ_REPLY;
use cairn_proto::msg::osd::{OpReply, RepReply, REP_REPLY};
use cairn_proto::Frame;
use cairn_proto::Limits;
use cairn_transport::{
    begin_batch, end_batch, frame_buffered_with, node_kind, read_guarded, Dialer, FrameSender,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long opening a peer connection (connect + handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

struct PeerConn {
    addr: String,
    sender: FrameSender,
    /// When opening it failed (the sender is then closed): for a short while the peer is
    /// reported down instead of being dialed again by every write.
    failed_at: Option<Instant>,
}

type ConnTable = Arc<Mutex<HashMap<(usize, u32), PeerConn>>>;

/// Called with (shard, peer) when a connection that shard opened is up or has failed.
pub type LinkHook = Box<dyn Fn(usize, u32) + Send + Sync>;

/// Outgoing peer connections by (shard, OSD id): each shard has its own, so answers arrive
/// on the thread that sent the write.
pub struct Peers {
    /// EC shard reads sent on these links, waiting for their answers.
    pub reads: Arc<PendingReads>,
    conns: ConnTable,
    /// How to connect: as an OSD, from the OSD's listening address, with its credentials.
    dialer: Dialer,
    link_hook: Arc<OnceLock<LinkHook>>,
}

/// Where the connection to a peer stands.
pub enum Link {
    /// Connected: frames go out now.
    Up(FrameSender),
    /// Being opened: the link hook is called when it is up or has failed.
    Opening,
    /// Not in the map, or opening it failed a moment ago.
    Down,
}

impl Peers {
    /// No connections yet.
    pub fn new(dialer: Dialer) -> Peers {
        Peers {
            reads: Arc::default(),
            conns: ConnTable::default(),
            dialer: dialer.timeout(CONNECT_TIMEOUT),
            link_hook: Arc::default(),
        }
    }

    /// Sets what to call when a connection is up or has failed (once).
    pub fn set_link_hook(&self, hook: LinkHook) {
        let _ = self.link_hook.set(hook);
    }

    /// The connection of shard `shard` to OSD `peer` at the address `map` gives; starts
    /// opening it (in the background) when there is none. Called on the shard's thread,
    /// inside its runtime; never blocks.
    pub fn link(
        &self,
        inflight: &Arc<Inflight>,
        shard: usize,
        map: &ClusterMap,
        peer: u32,
    ) -> Link {
        let Some(addr) = map.osds.get(&peer).map(|o| o.addr.as_str()) else {
            return Link::Down;
        };
        // Decided under the lock; only the sender is cloned (this runs for every write).
        let known = {
            let conns = self.conns.lock_or_die();
            match conns.get(&(shard, peer)).filter(|c| c.addr == addr) {
                Some(c) if !c.sender.is_closed() && c.sender.is_attached() => {
                    Some(Link::Up(c.sender.clone()))
                }
                Some(c) if !c.sender.is_closed() => Some(Link::Opening),
                Some(c) if c.failed_at.is_some_and(|t| t.elapsed() < CONNECT_TIMEOUT) => {
                    Some(Link::Down)
                }
                _ => None,
            }
        };
        known.unwrap_or_else(|| {
            self.connect(inflight, shard, peer, addr);
            Link::Opening
        })
    }

    /// Opens a connection to `peer` in a task of the current runtime.
    fn connect(&self, inflight: &Arc<Inflight>, shard: usize, peer: u32, addr: &str) {
        let sender = FrameSender::unconnected();
        let dialer = self.dialer.clone();
        {
            let mut conns = self.conns.lock_or_die();
            let conn = PeerConn {
                addr: addr.to_string(),
                sender: sender.clone(),
                failed_at: None,
            };
            if let Some(old) = conns.insert((shard, peer), conn) {
                old.sender.close();
            }
        }
        let conn = Conn {
            key: (shard, peer),
            sender,
            inflight: inflight.clone(),
            reads: self.reads.clone(),
            conns: self.conns.clone(),
        };
        let (addr, hook) = (addr.to_string(), self.link_hook.clone());
        let linked = move || {
            if let Some(h) = hook.get() {
                h(shard, peer);
            }
        };
        tokio::spawn(async move {
            match dialer.dial(&addr, node_kind::OSD).await {
                Ok(c) => {
                    let (sealer, opener) = cairn_transport::split_guards(c.guards);
                    let (r, w) = c.stream.into_split();
                    // A fresh sender has no socket, so this cannot fail.
                    let _ = conn.sender.attach_guarded(w, sealer);
                    linked();
                    read_answers(r, opener, &conn).await;
                    conn.end(false);
                }
                Err(e) => {
                    tracing::warn!(peer, error = %e, "cannot connect to peer");
                    conn.end(true);
                    linked();
                }
            }
        });
    }
}

/// One connection to a peer and what its end must clean up.
struct Conn {
    key: (usize, u32),
    sender: FrameSender,
    inflight: Arc<Inflight>,
    reads: Arc<PendingReads>,
    conns: ConnTable,
}

impl Conn {
    /// The connection is over: it is forgotten (or, when it could not be opened, remembered
    /// as failed for a moment), and the writes waiting on the peer fail (their clients
    /// resend).
    fn end(self, failed: bool) {
        self.sender.close();
        {
            let mut c = self.conns.lock_or_die();
            let ours = c
                .get(&self.key)
                .is_some_and(|pc| pc.sender.ptr_eq(&self.sender));
            if ours && failed {
                if let Some(pc) = c.get_mut(&self.key) {
                    pc.failed_at = Some(Instant::now());
                }
            } else if ours {
                c.remove(&self.key);
            }
        }
        let peer = self.key.1;
        self.inflight
            .fail_waiting_on(|m| m == peer, &OpReply::Retry);
        self.reads.fail_peer(peer);
    }
}

/// Delivers a peer's answers to the in-flight table until the connection ends.
async fn read_answers(
    r: tokio::net::tcp::OwnedReadHalf,
    mut opener: Option<cairn_auth::Opener>,
    conn: &Conn,
) {
    let (peer, inflight) = (conn.key.1, &conn.inflight);
    let limits = Limits::default();
    // Buffered: one receive call brings in every answer that has arrived.
    let mut r = cairn_transport::RecvBuf::with_capacity(cairn_transport::READ_BUFFER, r);
    loop {
        let frame = match read_guarded(&mut r, &limits, opener.as_mut()).await {
            Ok(f) => f,
            Err(e) => {
                tracing::info!(peer, error = %e, "peer connection ended");
                break;
            }
        };
        // Replies to clients completed by a run of buffered answers go out together.
        let more = frame_buffered_with(r.buffer(), opener.is_some());
        if more {
            begin_batch();
        }
        if frame.msg_type == EC_READ_REPLY {
            conn.reads.complete(frame.request_id, peer, frame);
            if !more {
                end_batch();
            }
            continue;
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
            Ok(RepReply::Done) => {
                if inflight.member_done(frame.request_id, peer) {
                    inflight.full.note(peer, None);
                }
            }
            Ok(RepReply::DoneButFull { metadata_too }) => {
                // Believed only as the answer of a write that waited on this peer.
                if inflight.member_done(frame.request_id, peer) {
                    inflight.full.note(peer, Some(metadata_too));
                }
            }
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
}

/// Requests sent on the links that wait for an answer frame (EC shard reads), by request
/// id. An answer is taken only from the peer the request went to.
#[derive(Default)]
pub struct PendingReads {
    next: std::sync::atomic::AtomicU64,
    table: Mutex<HashMap<u64, (u32, tokio::sync::oneshot::Sender<Frame>)>>,
}

impl PendingReads {
    /// A request id for a request to `peer`, and where its answer arrives (closed, with no
    /// answer, if the link to `peer` ends first).
    pub fn register(&self, peer: u32) -> (u64, tokio::sync::oneshot::Receiver<Frame>) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.table.lock_or_die().insert(id, (peer, tx));
        (id, rx)
    }

    /// Forgets a request whose answer is no longer awaited.
    pub fn cancel(&self, id: u64) {
        self.table.lock_or_die().remove(&id);
    }

    fn complete(&self, id: u64, peer: u32, frame: Frame) {
        let mut t = self.table.lock_or_die();
        if t.get(&id).is_some_and(|(to, _)| *to == peer) {
            if let Some((_, tx)) = t.remove(&id) {
                let _ = tx.send(frame);
            }
        }
    }

    fn fail_peer(&self, peer: u32) {
        self.table.lock_or_die().retain(|_, (to, _)| *to != peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_map::{OsdInfo, PgId};
    use cairn_proto::msg::osd::REP;
    use tokio::net::TcpListener;

    fn map_with(peer: u32, addr: String) -> ClusterMap {
        let mut map = ClusterMap::new([7; 16]);
        map.osds.insert(
            peer,
            OsdInfo {
                id: peer,
                addr,
                host: "h".into(),
                up: true,
                in_: true,
                weight: cairn_placement::WEIGHT_ONE,
                up_from: 1,
                store_id: [1; 16],
                lost_at: 0,
            },
        );
        map
    }

    /// A client-side sender over loopback (its replies go nowhere anyone reads).
    async fn client_sender() -> (FrameSender, tokio::net::TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let c = tokio::net::TcpStream::connect(l.local_addr().expect("addr"));
        let (c, a) = tokio::join!(c, l.accept());
        let (_, w) = c.expect("connect").into_split();
        (FrameSender::new(w), a.expect("accept").0)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// The (shard, peer) pairs a link hook was called with.
    type Calls = Arc<Mutex<Vec<(usize, u32)>>>;

    /// Peers whose link hook records the (shard, peer) pairs it was called with.
    fn peers_with_hook() -> (Peers, Calls) {
        let peers = Peers::new(Dialer::new(
            node_kind::OSD,
            Arc::new(cairn_transport::NoAuth),
        ));
        let called = Arc::new(Mutex::new(Vec::new()));
        let c = called.clone();
        peers.set_link_hook(Box::new(move |shard, peer| {
            c.lock().expect("lock").push((shard, peer));
        }));
        (peers, called)
    }

    async fn hook_called(called: &Mutex<Vec<(usize, u32)>>, want: (usize, u32)) {
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT * 5;
        while !called.lock().expect("lock").contains(&want) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "link hook not called"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// A peer that accepts but never answers the handshake: a blocking connect would hold
    /// the shard for the whole connect timeout. Asking for the link returns at once; when
    /// the connect gives up, the hook is called, the writes waiting on that peer fail, and
    /// the peer is reported down (not dialed again by every write) for a while.
    #[test]
    fn a_silent_peer_never_blocks_the_shard_and_is_reported_down() {
        runtime().block_on(async {
            let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let map = map_with(5, silent.local_addr().expect("addr").to_string());
            let (client, _c) = client_sender().await;
            let inflight = Arc::new(Inflight::new());
            let what = crate::inflight::WriteWhat::now("write", 0);
            let w = inflight.register(PgId { pool: 1, pg: 0 }, 1, vec![5], client, 1, what);
            let (peers, called) = peers_with_hook();
            let started = std::time::Instant::now();
            assert!(matches!(peers.link(&inflight, 3, &map, 5), Link::Opening));
            assert!(matches!(peers.link(&inflight, 3, &map, 5), Link::Opening));
            assert!(
                started.elapsed() < CONNECT_TIMEOUT / 2,
                "asking for the link waited {:?} for the connect",
                started.elapsed()
            );
            hook_called(&called, (3, 5)).await;
            assert!(
                w.is_done(),
                "the write waiting on the unreachable peer did not fail"
            );
            assert!(matches!(peers.link(&inflight, 3, &map, 5), Link::Down));
            assert_eq!(called.lock().expect("lock").len(), 1, "one dial, one call");
        });
    }

    /// A peer that answers: the hook says the link is up, and frames sent on it arrive.
    #[test]
    fn a_link_comes_up_and_carries_frames_in_order() {
        runtime().block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let map = map_with(6, l.local_addr().expect("addr").to_string());
            let inflight = Arc::new(Inflight::new());
            let (peers, called) = peers_with_hook();
            assert!(matches!(peers.link(&inflight, 0, &map, 6), Link::Opening));
            let (mut s, _) = l.accept().await.expect("accept");
            cairn_transport::accept(&mut s, node_kind::OSD, &cairn_transport::AllowNone)
                .await
                .expect("handshake");
            hook_called(&called, (0, 6)).await;
            let Link::Up(sender) = peers.link(&inflight, 0, &map, 6) else {
                panic!("the link is not up after its hook");
            };
            for i in 1..=3u64 {
                sender.send(REP, i, b"op", &[i as u8; 3]).expect("send");
            }
            for i in 1..=3u64 {
                let f = cairn_transport::read_frame(&mut s, &Limits::default())
                    .await
                    .expect("frame");
                assert_eq!((f.msg_type, f.request_id), (REP, i));
                assert_eq!(f.data, vec![i as u8; 3]);
            }
            // An OSD the map does not have is down.
            assert!(matches!(peers.link(&inflight, 0, &map, 99), Link::Down));
        });
    }
}
