//! The OSD's shared context: what the shards, the network tasks and the map watcher all
//! reach (the store, the map, the in-flight table, the peers, the shard mailboxes). Startup
//! is in `daemon.rs`.

use crate::inflight::Inflight;
use crate::mailbox::{shard_of, ShardHandle, ShardMsg, ShardState};
use crate::peers::Peers;
use cairn_failstop::{LockOrDie, RwLockOrDie};
use cairn_map::{ClusterMap, PgId, PgPlacement};
use cairn_placement::Placer;
use cairn_store::{Store, StoreError};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// State shared by the shards, the network tasks and the map watcher.
pub struct Osd {
    pub store: Store,
    pub(crate) map: RwLock<Arc<ClusterMap>>,
    pub(crate) placer: Mutex<(u64, Arc<Placer>)>,
    pub(crate) id: AtomicU32,
    /// Epoch of this OSD's current life (its last boot).
    pub up_from: AtomicU64,
    pub inflight: Arc<Inflight>,
    pub peers: Peers,
    pub(crate) shards: OnceLock<Vec<ShardHandle>>,
    /// Client ops are served only while it is valid.
    pub lease: crate::lease::Lease,
    /// How this OSD connects to its peers: as an OSD, from its listening address, with its
    /// credentials.
    pub dialer: cairn_transport::Dialer,
    /// Who may connect: holders of a ticket the service keys open (or anyone, in a cluster
    /// without authentication).
    pub verifier: Arc<dyn cairn_transport::Verifier>,
    /// Connections held on the OSD's port, against their caps.
    pub admission: Arc<cairn_transport::Admission>,
    /// Slots for scrubs clients ask for, and for recovery pulls peers ask for.
    pub scrub_slots: Arc<tokio::sync::Semaphore>,
    pub pull_slots: Arc<tokio::sync::Semaphore>,
    /// Recovery progress and pacing.
    pub recovery: crate::recovery::Recovery,
    /// What this OSD's scrubs found.
    pub scrub: crate::scrub::stats::ScrubStats,
    /// The monitors, for peering's questions (past intervals).
    pub mon: cairn_monclient::MonClient,
    /// Memory this OSD aims to use (`OsdConfig::memory_target`), reported in its stats.
    pub memory_target: u64,
    /// Per-connection caps on requests in flight (`OsdConfig::request_limits`).
    pub request_limits: cairn_transport::RequestLimits,
    /// The reader threads (`readers.rs`), for client reads that need a data device.
    pub readers: crate::readers::Readers,
    /// The syncer thread (`syncer.rs`), for syncs that would wait for a device.
    pub syncer: crate::mailbox::SyncTx,
    /// How long WAL syncs take, and so whether shards sync inline (`wal_pace.rs`).
    pub wal_pace: crate::wal_pace::WalPace,
    /// Collections still to split after a pool's PG count grew (`split/pending.rs`).
    pub splits: crate::split::pending::Splits,
    /// Writes that took too long (`slowops.rs`).
    pub slow: crate::slowops::SlowOps,
    /// Op-path metrics, when this OSD serves metrics (`metrics.rs`).
    pub metrics: Option<Arc<crate::metrics::OsdMetrics>>,
    /// Its recent crashes, read from its crash directory when it started (`crashes.rs`).
    pub crashes: Vec<cairn_proto::msg::osd::CrashSummary>,
}

impl Osd {
    /// Counts a WAL write (and flush) started at `t0` and done now in the commit latency.
    pub fn note_commit(&self, t0: std::time::Instant) {
        self.inflight.totals.commit(t0);
        if let Some(m) = &self.metrics {
            m.committed(t0);
        }
    }

    /// Counts a write committed to the store (`primary`: as the PG's primary).
    pub fn note_applied(&self, pool: u32, primary: bool) {
        if let Some(m) = &self.metrics {
            m.write_applied(pool, primary);
        }
    }

    /// This OSD's id.
    pub fn id(&self) -> u32 {
        self.id.load(Ordering::Relaxed)
    }

    /// The current map.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.read_or_die().clone()
    }

    /// Installs a newer map; returns false (and keeps the old one) when it is not newer.
    pub fn set_map(&self, m: Arc<ClusterMap>) -> bool {
        let mut cur = self.map.write_or_die();
        if m.epoch <= cur.epoch {
            return false;
        }
        *cur = m;
        true
    }

    /// Where `pg` lives in `map` (the hierarchy is computed once per epoch).
    pub fn placement(&self, map: &ClusterMap, pg: PgId) -> PgPlacement {
        let h = {
            let mut cached = self.placer.lock_or_die();
            if cached.0 != map.epoch {
                *cached = (map.epoch, Arc::new(map.placer()));
            }
            cached.1.clone()
        };
        map.pg_placement_in(&h, pg)
    }

    fn shards(&self) -> &[ShardHandle] {
        self.shards.get().map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// Runs a message on the shard owning `pg`: right here when that is the calling
    /// shard `here` (run to completion, no hand-off), else queued to it.
    pub fn dispatch(&self, pg: PgId, msg: ShardMsg, here: usize) {
        let shards = self.shards();
        if shards.is_empty() {
            return;
        }
        let i = shard_of(pg, shards.len());
        if i == here {
            self.handle_on_shard(i, msg);
            return;
        }
        let cost = msg.backlog_bytes();
        shards[i].backlog.add(cost);
        if shards[i].tx.send((msg, cost)).is_err() {
            shards[i].backlog.sub(cost);
            tracing::error!(shard = i, "shard is gone");
        }
    }

    /// A shard whose backlog is over its bound, if any: connections wait for it before they
    /// read more requests.
    pub(crate) fn backlogged_shard(&self) -> Option<&crate::backlog::Backlog> {
        self.shards()
            .iter()
            .map(|s| s.backlog.as_ref())
            .find(|b| b.over())
    }

    /// Runs a message on shard `i`'s state at once (the caller runs on that shard's thread).
    pub fn handle_on_shard(&self, i: usize, msg: ShardMsg) {
        if let Some(s) = self.shards().get(i) {
            s.state.handle_now(msg);
        }
    }

    /// Makes the writes shard `i` submitted durable and completes them.
    pub fn sync_shard(&self, i: usize) {
        if let Some(s) = self.shards().get(i) {
            s.state.sync_now();
        }
    }

    /// The state of the shard owning `pg` (`shard::with_pg` runs code on it).
    pub fn shard_state(&self, pg: PgId) -> Option<&dyn ShardState> {
        let shards = self.shards();
        let s = shards.get(shard_of(pg, shards.len()))?;
        Some(s.state.as_ref())
    }

    /// The PGs this OSD leads that are down, that went active giving up lost writes, and
    /// whose peering failed for good.
    pub fn pg_troubles(&self) -> crate::mailbox::PgTroubles {
        let me = self.id();
        let mut t = crate::mailbox::PgTroubles::default();
        for s in self.shards() {
            s.state.troubles(me, &mut t);
        }
        t
    }

    /// PGs this OSD leads whose peering (or recovery) is under way.
    pub fn peering_pgs(&self) -> u64 {
        self.shards().iter().map(|s| s.state.peering_count()).sum()
    }

    /// Queues a message to every shard.
    pub fn queue_all(&self, msg: impl Fn() -> ShardMsg) {
        for s in self.shards() {
            let _ = s.tx.send((msg(), 0));
        }
    }

    /// Queues a message to shard `i`.
    pub fn queue_shard(&self, i: usize, msg: ShardMsg) {
        if let Some(s) = self.shards().get(i) {
            let _ = s.tx.send((msg, 0));
        }
    }

    /// Queues a message to the shard owning `pg`.
    pub fn queue(&self, pg: PgId, msg: ShardMsg) {
        let shards = self.shards();
        if !shards.is_empty() {
            let _ = shards[shard_of(pg, shards.len())].tx.send((msg, 0));
        }
    }

    /// The runtime of shard `i`.
    pub fn shard_runtime(&self, i: usize) -> Option<tokio::runtime::Handle> {
        self.shards().get(i).map(|s| s.rt.clone())
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards().len()
    }

    /// Stops the process when the store has failed: serving on would risk acknowledging
    /// writes it cannot keep. Acknowledged writes are durable, so exiting loses nothing.
    /// This OSD's store failed its checks (corrupt data, a failed device): the OSD stops
    /// instead of serving or retrying on it; an operator replaces the device, or the OSD is
    /// marked out and its data rebuilt elsewhere. Exit status 74 (EX_IOERR), which supervisors
    /// do not restart.
    pub fn store_corrupt(&self, f: &crate::failure::Failure) -> ! {
        tracing::error!(class = %f.class, error = %f, "the store is corrupt or its device failed; the OSD stops (replace the device, or mark the OSD out)");
        // Also on stderr directly: the non-blocking log writer may not get its line out
        // before the process exits.
        eprintln!(
            "cairn osd.{}: the store is corrupt or its device failed ({}): {f}; exiting (replace \
             the device, or mark the OSD out)",
            self.id(),
            f.class
        );
        std::process::exit(74);
    }

    /// `r`; if it failed because this OSD's own store is corrupt, this OSD stops a moment
    /// later (time for the refusal that says so to reach the peer that asked, so that its
    /// primary classes the failure): a member must not go on serving from a store that
    /// failed its checks.
    pub fn stop_if_corrupt<T>(
        self: &Arc<Self>,
        r: Result<T, crate::failure::Failure>,
    ) -> Result<T, crate::failure::Failure> {
        if let Err(f) = &r {
            if f.local_store && f.class == crate::failure::FailClass::StoreCorrupt {
                let (osd, f) = (self.clone(), f.clone());
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    osd.store_corrupt(&f)
                });
            }
        }
        r
    }

    pub fn note_store_error(&self, e: &StoreError) {
        if let Some(why) = self.store.failure() {
            tracing::error!(error = %e, failure = %why, "store failed; OSD exits");
            eprintln!("cairn osd.{}: store failed: {why}; exiting", self.id());
            std::process::exit(70);
        }
    }
}
