//! Running a monitor: storage, Raft, cluster formation, the server and background tasks.

use crate::auth::MonKeys;
use crate::config::{fsid_hex, MonConfig};
use crate::ctx::{Ctx, Proposed};
use crate::error::MonError;
use crate::failure::FailureDetector;
use crate::log_store::LogStore;
use crate::raft_net::{self, Network};
use crate::state_machine::StateMachine;
use crate::types::{BasicNode, Proposal, Raft};
use crate::{server, store};
use cairn_failstop::LockOrDie;
use cairn_transport::{AllowNone, Auth, NoAuth, Verifier};
use openraft::error::{InitializeError, RaftError};
use openraft::{ServerState, SnapshotPolicy};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Runs a monitor, serving clients and peers on `listener`, until `shutdown` resolves.
///
/// On first start (no database in `cfg.dir`) the monitor with the lowest id forms the cluster
/// with all `cfg.members`; the others wait to be contacted by it. On restart the monitor
/// resumes from its database. Safe to kill at any time: whatever it acknowledged is on disk.
/// Stop it through `shutdown` (dropping the future instead leaves its Raft tasks running);
/// when it returns, the data dir can be opened again.
pub async fn run(
    cfg: MonConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), MonError> {
    cfg.validate()?;
    let metrics_endpoint = match &cfg.metrics_listen {
        Some(m) => Some(
            cairn_metrics::Endpoint::bind(m).map_err(|source| MonError::Metrics {
                addr: m.addr,
                source,
            })?,
        ),
        None => None,
    };
    let db = store::open(&cfg.dir, cfg.id, cfg.fsid)?;
    let store_err = |e: store::StoreError| MonError::Store {
        path: cfg.dir.join(store::DB_FILE),
        reason: e.to_string(),
    };
    let sm = StateMachine::open(db.clone(), cfg.fsid).map_err(store_err)?;
    let view = sm.view();
    let keys = match &cfg.keyring {
        Some(path) => Some(Arc::new(
            MonKeys::load(path, cfg.id, view.clone())?.with_frames(cfg.frames),
        )),
        None => None,
    };
    let (verifier, peer_auth): (Arc<dyn Verifier>, Auth) = match &keys {
        Some(k) => (k.clone(), k.clone()),
        None => (Arc::new(AllowNone), Arc::new(NoAuth)),
    };
    let raft = Raft::new(
        cfg.id,
        Arc::new(raft_config(&cfg)?),
        Network::new(cfg.fsid, cfg.id, (peer_auth, cfg.frames)),
        LogStore::new(db.clone()),
        sm,
    )
    .await
    .map_err(|e| MonError::Raft(format!("starting: {e}")))?;
    tracing::info!(
        id = cfg.id,
        fsid = %fsid_hex(&cfg.fsid),
        dir = %cfg.dir.display(),
        epoch = view.epoch(),
        "monitor starting"
    );
    if let Err(e) = form_cluster(&raft, &cfg).await {
        let _ = raft.shutdown().await;
        drop(raft);
        release(&db).await;
        return Err(e);
    }

    let ctx = Arc::new(Ctx {
        id: cfg.id,
        fsid: cfg.fsid,
        metrics: raft.metrics(),
        raft: raft.clone(),
        view,
        failure: FailureDetector::new(cfg.osd_grace, cfg.down_out_interval),
        command_timeout: cfg.command_timeout,
        starts: Default::default(),
        history_keep: cfg.history_keep,
        verifier,
        keys,
        admission: cairn_transport::Admission::new(cfg.conn_limits),
        stats: crate::metrics::MonMetrics::new(),
    });
    let mut background = JoinSet::new();
    if let Some(endpoint) = metrics_endpoint {
        println!("mon.{} metrics on http://{}/metrics", cfg.id, endpoint.addr);
        background.spawn(cairn_metrics::serve(
            endpoint,
            crate::metrics::exporter(&ctx),
        ));
    }
    background.spawn(log_leadership(ctx.clone()));
    background.spawn(failure_ticker(ctx.clone()));
    background.spawn(history_ticker(ctx.clone()));
    background.spawn(seed_keys(ctx.clone()));
    background.spawn(sync_keyring(ctx.clone()));

    let mut metrics = raft.metrics();
    let fatal = async move {
        // Resolves when the Raft node stops on its own (a storage failure or a bug).
        let r = metrics
            .wait_for(|m| m.running_state.is_err() || m.state == ServerState::Shutdown)
            .await;
        match r {
            Ok(m) => match &m.running_state {
                Err(e) => e.to_string(),
                Ok(()) => "raft shut down".to_string(),
            },
            Err(_) => "raft stopped".to_string(),
        }
    };
    let failed = std::sync::Mutex::new(None);
    let stop = async {
        tokio::select! {
            _ = shutdown => {}
            why = fatal => {
                tracing::error!("raft stopped unexpectedly: {why}; stopping the monitor");
                *failed.lock_or_die() = Some(why);
            }
        }
    };
    server::serve(listener, ctx.clone(), stop).await;
    background.shutdown().await;
    // An Option<String> set in one assignment: a panic cannot leave it half-written.
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    drop(ctx);
    if let Err(e) = raft.shutdown().await {
        tracing::warn!("stopping raft: {e}");
    }
    drop(raft);
    release(&db).await;
    tracing::info!(id = cfg.id, "monitor stopped");
    match failed {
        Some(why) => Err(MonError::Raft(why)),
        None => Ok(()),
    }
}

fn raft_config(cfg: &MonConfig) -> Result<openraft::Config, MonError> {
    let (lo, hi) = cfg.election_timeout_ms;
    openraft::Config {
        cluster_name: format!("cairn-mon-{}", fsid_hex(&cfg.fsid)),
        election_timeout_min: lo,
        election_timeout_max: hi,
        heartbeat_interval: (lo / 3).max(10),
        install_snapshot_timeout: (hi * 4).max(1000),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_logs),
        max_in_snapshot_log_to_keep: cfg.snapshot_logs,
        snapshot_max_chunk_size: raft_net::SNAPSHOT_CHUNK,
        max_payload_entries: raft_net::MAX_ENTRIES_PER_APPEND,
        ..Default::default()
    }
    .validate()
    .map_err(|e| MonError::Config(format!("raft settings: {e}")))
}

/// Forms the cluster on first start, from the lowest-id monitor only: two monitors
/// initializing with different views would split the cluster.
async fn form_cluster(raft: &Raft, cfg: &MonConfig) -> Result<(), MonError> {
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| MonError::Raft(e.to_string()))?;
    if initialized {
        tracing::info!("resuming the monitor cluster from the data dir");
        return Ok(());
    }
    if cfg.join {
        tracing::info!(
            id = cfg.id,
            "joining monitor: waiting for the leader to add it (cairn mon add)"
        );
        return Ok(());
    }
    let first = cfg.bootstrapper();
    if cfg.id != first {
        tracing::info!("new monitor: waiting for monitor {first} to form the cluster");
        return Ok(());
    }
    let nodes: BTreeMap<u64, BasicNode> = cfg
        .members
        .iter()
        .map(|(id, addr)| (*id, BasicNode::new(addr)))
        .collect();
    match raft.initialize(nodes).await {
        Ok(()) => {
            tracing::info!(members = ?cfg.members, "formed a new monitor cluster");
            Ok(())
        }
        // Another monitor reached us first: the cluster exists.
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(MonError::Raft(format!("forming the cluster: {e}"))),
    }
}

/// Waits (bounded) until the Raft tasks have dropped their handles on the database, so the
/// same data dir can be opened again as soon as `run` returns.
async fn release(db: &Arc<redb::Database>) {
    let until = Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(db) > 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if Arc::strong_count(db) > 1 {
        tracing::warn!("the monitor database is still in use after shutdown");
    }
}

/// Logs elections and leader changes.
async fn log_leadership(ctx: Arc<Ctx>) {
    let mut metrics = ctx.metrics.clone();
    let mut last = (None, 0u64);
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            (m.current_leader, m.current_term)
        };
        if now != last {
            match now.0 {
                Some(l) if l == ctx.id => {
                    tracing::info!(term = now.1, "this monitor is the leader")
                }
                Some(l) => tracing::info!(term = now.1, leader = l, "monitor {l} is the leader"),
                None => tracing::info!(term = now.1, "no leader: election in progress"),
            }
            last = now;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// How often the leader checks whether the map history can be trimmed.
const HISTORY_TRIM_EVERY: Duration = Duration::from_secs(2);

/// While leading, trims the map history no PG needs any more.
async fn history_ticker(ctx: Arc<Ctx>) {
    let mut tick = tokio::time::interval(HISTORY_TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        ctx.starts.set_leader_term(ctx.leading_term());
        if let Some(below) = ctx.history_trim_due() {
            let reply = ctx
                .command(cairn_map::MapChange::TrimHistory { below })
                .await;
            tracing::debug!(below, ?reply, "map history trim proposal");
        }
        expire_fences(&ctx).await;
    }
}

/// How long a fence lasts (`MapChange::BlocklistAdd`): as Ceph's blocklist, an hour, far
/// longer than any op of the fenced client can stay queued or in flight.
pub(crate) const BLOCKLIST_FOR: Duration = Duration::from_secs(3600);

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// When a fence asked for now ends, by this monitor's clock.
pub(crate) fn blocklist_until() -> u64 {
    unix_now() + BLOCKLIST_FOR.as_secs()
}

/// While leading, drops the fences that ended.
async fn expire_fences(ctx: &Ctx) {
    if ctx.leading_term().is_none() {
        return;
    }
    let now = unix_now();
    if !ctx
        .view
        .with_map(|m| m.blocklist.values().any(|until| *until <= now))
    {
        return;
    }
    let reply = ctx
        .command(cairn_map::MapChange::BlocklistExpire { now })
        .await;
    tracing::debug!(now, ?reply, "blocklist expiry proposal");
}

/// How often a monitor checks whether it must seed the key database.
const SEED_EVERY: Duration = Duration::from_millis(200);

/// Seeds the key database from this monitor's keyring file, once, when it leads a cluster
/// whose database was never seeded (a new cluster, or one upgraded from format 2).
async fn seed_keys(ctx: Arc<Ctx>) {
    let Some(keys) = ctx.keys.clone() else { return };
    let mut tick = tokio::time::interval(SEED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if keys.seeded() {
            let ignored = keys.bootstrap_keys().len();
            if ignored > 0 {
                tracing::info!(ignored, "the key database is seeded: the monitors admit the keys it holds (`cairn auth ls`), not the other keys of the keyring file");
            }
            return;
        }
        if ctx.leading_term().is_none() {
            continue;
        }
        let seed = keys.bootstrap_keys();
        let n = seed.len();
        match ctx
            .propose(Proposal::Keys(cairn_auth::KeyChange::Seed(seed)))
            .await
        {
            Proposed::Applied(_) => {
                tracing::info!(keys = n, "seeded the key database from the keyring file")
            }
            Proposed::NotLeader(_) => {}
            Proposed::Unavailable(why) => tracing::warn!("seeding the key database: {why}"),
        }
    }
}

/// Keeps the keyring file's monitors' key the one the key database holds (after `cairn auth
/// rotate mon`), looking once a second; a failure to write is logged and tried again.
async fn sync_keyring(ctx: Arc<Ctx>) {
    let Some(keys) = ctx.keys.clone() else { return };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let k = keys.clone();
        match tokio::task::spawn_blocking(move || k.sync_keyring()).await {
            Ok(Ok(_)) => failing = false,
            Ok(Err(e)) if !failing => {
                failing = true;
                tracing::error!("cannot write the monitors' new key into the keyring file: {e}; this monitor keeps it in its database, but copy the key by hand before adding monitors from this file");
            }
            _ => {}
        }
    }
}

/// While leading, marks down the OSDs whose heartbeats stopped.
async fn failure_ticker(ctx: Arc<Ctx>) {
    let grace = ctx.failure.grace();
    let mut tick = tokio::time::interval((grace / 4).max(Duration::from_millis(20)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut proposals = JoinSet::new();
    loop {
        tick.tick().await;
        while proposals.try_join_next().is_some() {}
        ctx.failure.set_leader_term(ctx.leading_term());
        let now = Instant::now();
        let (due, due_out) = ctx
            .view
            .with_map(|m| (ctx.failure.due(m, now), ctx.failure.due_out(m, now)));
        for change in &due_out {
            tracing::warn!(
                ?change,
                "marking an OSD out: down for the down-out interval"
            );
        }
        for change in due.into_iter().chain(due_out) {
            if matches!(change, cairn_map::MapChange::OsdDown { .. }) {
                tracing::warn!(?change, "marking an OSD down: no heartbeat for {grace:?}");
            }
            let ctx = ctx.clone();
            proposals.spawn(async move {
                let reply = ctx.command(change).await;
                tracing::debug!(?reply, "osd down proposal");
            });
        }
    }
}
