//! What the OSD's threads send each other, and how they reach a shard: messages to a shard
//! (`ShardMsg`, queued or run at once on its thread), what a shard does once writes are
//! durable (`OnDurable`), sync jobs for the syncer thread, and which shard owns a PG. The
//! shared context (`context.rs`) holds the shards' handles without knowing what a shard's
//! state is (`shard/`), so the handlers, which use the context, form no loop with it.

use cairn_map::PgId;
use cairn_proto::msg::osd::{OpRequest, RepOp};
use cairn_store::SharedBytes;
use cairn_transport::FrameSender;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// Work for a shard.
/// PGs in trouble, for the OSD's stats (`cairn status`).
#[derive(Default)]
pub struct PgTroubles {
    pub down: Vec<cairn_proto::msg::osd::DownPg>,
    pub lost: Vec<cairn_proto::msg::osd::DownPg>,
    pub failed: Vec<cairn_proto::msg::osd::FailedPg>,
}

pub enum ShardMsg {
    /// A client op on a PG of this shard.
    Op {
        reply: FrameSender,
        req_id: u64,
        req: OpRequest,
        data: SharedBytes,
    },
    /// A write forwarded by a primary.
    Rep {
        reply: FrameSender,
        req_id: u64,
        op: RepOp,
        data: SharedBytes,
    },
    /// A write with parked reads completed in this PG.
    WriteDone(PgId),
    /// A watch of this PG may have reached its time: answer the ones that did.
    WatchDue(PgId),
    /// This shard's connection to OSD `.0` is up, or opening it failed: writes waiting for
    /// it run again.
    PeerLinked(u32),
    /// A peering or recovery request from a primary.
    Peer {
        reply: FrameSender,
        req_id: u64,
        msg_type: u16,
        control: Vec<u8>,
        data: Vec<u8>,
    },
    /// Peering of `pg` for `interval` ended.
    PeeringDone {
        pg: PgId,
        interval: crate::peering::outcome::Interval,
        result: crate::peering::outcome::PeerResult,
    },
    /// Background recovery of `pg` for `interval` finished: every member is current.
    RecoveryDone {
        pg: PgId,
        interval: crate::peering::outcome::Interval,
    },
    /// The primary's copy of `object` is current again (it was pulled in the background).
    ObjectRecovered {
        pg: PgId,
        interval: crate::peering::outcome::Interval,
        object: Vec<u8>,
    },
    /// Try peering `pg` again.
    Repeer(PgId),
    /// A member of `pg` missed a write: peer it again even though the acting set is the same.
    Unpeer(PgId),
    /// The map changed: peer the PGs whose acting set changed.
    MapChanged,
    /// A client asks that every write this OSD acknowledged be durable (`OSD_SYNC`).
    Sync { reply: FrameSender, req_id: u64 },
    /// The syncer thread made writes durable (or failed to): complete them.
    Synced {
        done: Vec<OnDurable>,
        result: Result<(), Arc<cairn_store::StoreError>>,
    },
    /// An EC sub-write from a primary (`ec::member`).
    EcWrite {
        reply: FrameSender,
        req_id: u64,
        sub: cairn_proto::msg::ec::EcSubWrite,
        data: SharedBytes,
    },
    /// An EC shard read from a primary.
    EcRead {
        reply: FrameSender,
        req_id: u64,
        req: cairn_proto::msg::ec::EcRead,
    },
    /// A primary peering an EC PG asks what this OSD holds of a shard.
    EcQuery {
        reply: FrameSender,
        req_id: u64,
        query: cairn_proto::msg::ec::EcQuery,
    },
    /// A primary rebuilding an EC PG's shards asks, pushes or sets a log (`ec::rebuild`).
    EcRebuild {
        reply: FrameSender,
        req_id: u64,
        req: crate::ec::rebuild::request::Request,
    },
    /// The bytes an EC write replaces were read (or why not): it goes on (`ec::resume`).
    EcResume {
        pg: PgId,
        reply: FrameSender,
        req_id: u64,
        req: OpRequest,
        data: SharedBytes,
        old: Result<crate::ec::plan::OldBytes, crate::ec::error::GatherError>,
    },
    /// A read of an EC object's shards ended: writes queued behind it may run.
    EcReadDone { pg: PgId, object: Vec<u8> },
    /// A read a reader thread could not finish from its plan (a block moved since, or is
    /// damaged): run it again on the shard, reading in place (`readers.rs`).
    ReadAgain {
        reply: FrameSender,
        req_id: u64,
        req: OpRequest,
    },
}

/// The shard index of a PG among `n` shards.
pub fn shard_of(pg: PgId, n: usize) -> usize {
    let h = (pg.pool as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ pg.pg as u64;
    (h % n.max(1) as u64) as usize
}

/// Something to do once the shard's submitted writes are durable.
pub enum OnDurable {
    /// This OSD's copy of in-flight write `tid` is durable.
    Local { tid: u64 },
    /// Acknowledge a replicated write to its primary.
    Ack { to: FrameSender, req_id: u64 },
    /// Answer an `OSD_SYNC` request.
    SyncReply { to: FrameSender, req_id: u64 },
}

/// A queued message and the bytes it counts in the shard's backlog (0 for what the OSD
/// queues itself).
pub type Queued = (ShardMsg, usize);

/// How other threads reach a shard.
pub struct ShardHandle {
    pub tx: UnboundedSender<Queued>,
    /// Its state, for what runs at once on its thread or reads it from elsewhere.
    pub state: Arc<dyn ShardState>,
    pub rt: tokio::runtime::Handle,
    /// What connections have queued for it (`crate::backlog`).
    pub backlog: Arc<crate::backlog::Backlog>,
}

impl ShardMsg {
    /// What this request costs in a shard's backlog.
    pub fn backlog_bytes(&self) -> usize {
        let payload = match self {
            ShardMsg::Op { data, .. } | ShardMsg::Rep { data, .. } => data.len(),
            ShardMsg::Peer { control, data, .. } => control.len() + data.len(),
            _ => 0,
        };
        payload + crate::backlog::MESSAGE_OVERHEAD
    }
}

/// A shard's state as the rest of the OSD reaches it (`shard/` implements it).
pub trait ShardState: Send + Sync {
    /// Runs `msg` on the state at once (the caller runs on the shard's thread).
    fn handle_now(&self, msg: ShardMsg);
    /// Makes the writes the shard submitted durable and completes them.
    fn sync_now(&self);
    /// Adds the PGs led by OSD `me` that are down (with the OSDs each waits for) to `down`,
    /// and those that went active giving up intervals of lost OSDs (with those OSDs) to `lost`.
    fn troubles(&self, me: u32, t: &mut crate::mailbox::PgTroubles);
    /// PGs whose peering (or recovery) is under way.
    fn peering_count(&self) -> u64;
    /// The state itself, for `shard::with_pg`.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Writes of shard `shard` up to store sequence `seq`, and what to do once they are durable.
pub struct SyncJob {
    pub shard: usize,
    pub seq: u64,
    pub done: Vec<OnDurable>,
    /// Flush the WAL (some write asked for durability against power loss); else written
    /// through to the device is enough (`memory` durability).
    pub flush: bool,
    /// Whether the sync's time tells how fast the WAL is (not when it also writes large
    /// writes' data to a data device).
    pub paced: bool,
}

/// The queue to the syncer thread.
pub type SyncTx = Sender<SyncJob>;
