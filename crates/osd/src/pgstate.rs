//! What a shard keeps per PG: its version counter, the last write in flight per object
//! (reads wait for it, so a read never returns a value that is not acknowledged yet), and
//! the reads parked behind such writes.

use crate::inflight::InflightWrite;
use cairn_map::{PgId, PgPlacement};
use cairn_proto::msg::osd::OpRequest;
use cairn_store::CollId;
use cairn_transport::FrameSender;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Collection key holding the PG's last version (u64 little-endian).
pub const VERSION_KEY: &[u8] = b"pg_version";
/// Collection key holding the map epoch the PG last went active with this OSD acting
/// (`last_epoch_started`, u64 little-endian).
pub const LES_KEY: &[u8] = b"pg_les";

/// EC: damaged shard objects a scrub found, by object: the shards to rebuild.
pub type EcRepairs = std::collections::BTreeMap<Vec<u8>, std::collections::BTreeSet<u8>>;

/// The store collection of a PG.
pub fn coll_of(pg: PgId) -> CollId {
    ((pg.pool as u64) << 32) | pg.pg as u64
}

/// The PG a store collection holds (inverse of [`coll_of`]; also of an EC PG's shard
/// collections, `ec::shard_coll`, which carry the shard in bits 24..32).
pub fn pg_of(coll: CollId) -> PgId {
    PgId {
        pool: (coll >> 32) as u32,
        pg: (coll as u32) & 0x00ff_ffff,
    }
}

/// A read waiting for a write to the same object to complete.
pub struct ParkedRead {
    pub reply: FrameSender,
    pub req_id: u64,
    pub req: OpRequest,
}

/// A watch (`OpKind::Watch`) waiting for a write to its object, until `until`.
pub struct Watcher {
    pub reply: FrameSender,
    pub req_id: u64,
    pub until: std::time::Instant,
}

/// Most watches one PG keeps waiting (each is a reply handle): more are refused.
pub const MAX_WATCHERS_PER_PG: usize = 4096;

/// A client op waiting for its PG to finish peering.
pub struct WaitingOp {
    pub reply: FrameSender,
    pub req_id: u64,
    pub req: OpRequest,
    pub data: cairn_store::SharedBytes,
}

/// An EC object with shard reads under way (`PgState::ec_busy`). A write waits for them: a
/// read that decodes across shards must not see some of them with a newer write than
/// others, and a write's old bytes must come from after every earlier write.
#[derive(Default)]
pub struct EcBusy {
    /// Reads under way.
    pub tasks: u32,
    /// Writes to the object waiting for them, in arrival order.
    pub queued: std::collections::VecDeque<WaitingOp>,
}

/// A down PG: what it waits for, and the map epoch it found so at (it peers again on a new
/// epoch, or when its retry timer fires; client ops meanwhile are answered at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    pub epoch: u64,
    pub waiting_for: Vec<u32>,
}

/// Per-PG state owned by one shard.
pub struct PgState {
    /// Placement cached for `placement_epoch`.
    pub placement: PgPlacement,
    pub placement_epoch: u64,
    /// The acting members with their lives at `placement_epoch`, and the first epoch this
    /// OSD saw them so (`interval_since`): a client op sent with an older map was sent to
    /// an earlier interval, and may have been sent again elsewhere since (a request held up
    /// in the network through a partition), so it is not run (`op::check`).
    pub acting_lives: crate::peering::outcome::Interval,
    pub interval_since: u64,
    /// Whether the store collection exists.
    pub coll_exists: bool,
    pub last_version: u64,
    /// Last write per object still possibly in flight.
    pub writes: HashMap<Vec<u8>, Arc<InflightWrite>>,
    pub parked: Vec<ParkedRead>,
    /// Watches waiting for a write, by object (`op::read::watch`).
    pub watchers: HashMap<Vec<u8>, Vec<Watcher>>,
    /// The interval (acting members and their lives) this OSD, as primary, last peered.
    pub peered: Option<crate::peering::outcome::Interval>,
    /// The map epoch at which `peered` was last found current (saves the check per op).
    pub active_epoch: u64,
    /// The peering task running, and the interval it peers.
    pub peering: Option<(crate::peering::outcome::Interval, tokio::task::AbortHandle)>,
    /// The background recovery task running (members still lack objects), and its interval.
    pub recovering: Option<(crate::peering::outcome::Interval, tokio::task::AbortHandle)>,
    /// Client ops waiting for peering, or for an object the primary lacks.
    pub waiting: Vec<WaitingOp>,
    /// Writes waiting, in order, for a connection to a member to open (`peers.rs`): a write
    /// is applied here only once every member can be sent it. Later writes queue behind.
    pub link_waiting: Vec<WaitingOp>,
    /// Objects this OSD, as primary, lacks (marked missing) and is pulling in the background;
    /// true once an op that needs its bytes waits for it (writes to it then wait too, so the
    /// pull is not refused over and over).
    pub missing: HashMap<Vec<u8>, bool>,
    /// Asks the background recovery to pull an object next (a client op waits for it).
    pub urgent: Option<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
    /// Objects background recovery is copying (to a member, or from one to this OSD): client
    /// writes to them wait the copy out, so that it is not refused for being overtaken.
    pub copying: HashSet<Vec<u8>>,
    /// This OSD holds a copy but is no longer a member: the task asking the primary whether
    /// the copy may go (`peering/stray.rs`).
    pub stray_watch: Option<tokio::task::AbortHandle>,
    /// The PG is down, waiting for one of these OSDs (this OSD as primary).
    pub down: Option<Down>,
    /// What the last peering found about the past intervals.
    pub report: Option<crate::peering::outcome::Report>,
    /// Why the last peering failed, while it has not succeeded since.
    pub failure: Option<crate::failure::Failure>,
    /// The map epoch of that failure, and how many peerings in a row failed (the backoff).
    pub failure_epoch: u64,
    pub failures: u32,
    /// Objects its newest history lacks that no answering OSD has (its last peering's).
    pub unfound: Vec<Vec<u8>>,
    /// An operator gave them up (`cairn pg mark-unfound-lost`): delete (`true`) or revert;
    /// the next peering does it.
    pub give_up_unfound: Option<bool>,
    /// Intervals (first, last epoch) given up since this OSD started: their OSDs were
    /// declared lost, so writes acknowledged in them may be lost.
    pub lost_intervals: Vec<cairn_map::PastInterval>,
    /// EC: the last version of each shard of the PG this OSD holds (loaded on first use).
    pub ec_versions: HashMap<u8, u64>,
    /// EC, as primary: objects with reads of their shards under way (a write's old bytes, a
    /// client read), and the writes to them queued until those end.
    pub ec_busy: HashMap<Vec<u8>, EcBusy>,
    /// EC, as primary: damaged shard objects a scrub found, rebuilt at the next peering.
    pub ec_repair: EcRepairs,
}

/// Writes remembered before completed ones are swept.
const SWEEP_AT: usize = 4096;

impl PgState {
    /// State for a PG first seen, with what the store holds.
    pub fn load(store: &cairn_store::Store, pg: PgId) -> PgState {
        let coll = coll_of(pg);
        let coll_exists = store.collection_exists(coll);
        let last_version = if coll_exists {
            store
                .kv_get(coll, VERSION_KEY)
                .ok()
                .flatten()
                .and_then(|v| v.get(..8).and_then(|b| b.try_into().ok()))
                .map(u64::from_le_bytes)
                .unwrap_or(0)
        } else {
            0
        };
        PgState {
            placement: PgPlacement {
                up_set: Vec::new(),
                acting: Vec::new(),
            },
            placement_epoch: 0,
            acting_lives: Vec::new(),
            interval_since: 0,
            coll_exists,
            last_version,
            writes: HashMap::new(),
            parked: Vec::new(),
            watchers: HashMap::new(),
            peered: None,
            active_epoch: 0,
            peering: None,
            recovering: None,
            waiting: Vec::new(),
            link_waiting: Vec::new(),
            missing: HashMap::new(),
            urgent: None,
            copying: HashSet::new(),
            stray_watch: None,
            down: None,
            report: None,
            failure: None,
            failure_epoch: 0,
            failures: 0,
            unfound: Vec::new(),
            give_up_unfound: None,
            lost_intervals: Vec::new(),
            ec_versions: HashMap::new(),
            ec_busy: HashMap::new(),
            ec_repair: EcRepairs::new(),
        }
    }

    /// The write to `object` a read must wait for, if any.
    pub fn pending_write(&mut self, object: &[u8]) -> Option<Arc<InflightWrite>> {
        let w = self.writes.get(object)?;
        if w.is_done() {
            self.writes.remove(object);
            return None;
        }
        Some(w.clone())
    }

    /// Parks a read (not a listing) behind a write to its object still in flight; gives the
    /// read back when there is none (it runs now).
    pub fn park_behind_write(&mut self, read: ParkedRead) -> Option<ParkedRead> {
        if matches!(read.req.kind, cairn_proto::msg::osd::OpKind::List { .. }) {
            return Some(read);
        }
        match self.pending_write(&read.req.object) {
            Some(w) if w.park_reader() => {
                self.parked.push(read);
                None
            }
            _ => Some(read),
        }
    }

    /// Remembers the newest write to `object`, and wakes the watches of it: their owners
    /// read it again (that read waits for this write).
    pub fn note_write(&mut self, object: &[u8], w: Arc<InflightWrite>) {
        if self.writes.len() >= SWEEP_AT {
            self.writes.retain(|_, w| !w.is_done());
        }
        self.writes.insert(object.to_vec(), w);
        if let Some(waiting) = self.watchers.remove(object) {
            for w in waiting {
                watch_answer(&w.reply, w.req_id);
            }
        }
    }

    /// Answers the watches whose time has come.
    pub fn expire_watchers(&mut self) {
        let now = std::time::Instant::now();
        self.watchers.retain(|_, list| {
            list.retain(|w| {
                let live = w.until > now;
                if !live {
                    watch_answer(&w.reply, w.req_id);
                }
                live
            });
            !list.is_empty()
        });
    }

    /// Parks a watch of `object` (the caller arranges a `WatchDue` at its time). Gives the
    /// watch back when the PG holds too many.
    pub fn add_watcher(&mut self, object: &[u8], w: Watcher) -> Result<(), Watcher> {
        if self.watchers.values().map(Vec::len).sum::<usize>() >= MAX_WATCHERS_PER_PG {
            return Err(w);
        }
        self.watchers.entry(object.to_vec()).or_default().push(w);
        Ok(())
    }
}

/// Answers a watch: the object changed, or its time ran out (the watcher reads it again
/// either way).
pub fn watch_answer(to: &cairn_transport::FrameSender, req_id: u64) {
    let r = cairn_proto::msg::osd::OpReply::Ok {
        version: 0,
        size: 0,
    };
    crate::op::reply::reply(to, req_id, &r, &[]);
}
