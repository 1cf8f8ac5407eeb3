//! Starting an OSD: open (or create) its store, register with the monitors, start the
//! shards, serve. The shared context they all use is `context.rs`.

use crate::config::OsdConfig;
use crate::context::Osd;
use crate::error::OsdError;
use crate::inflight::Inflight;
use crate::mailbox::{ShardHandle, ShardMsg};
use crate::peers::Peers;
use crate::shard::{serve_queue, Shard};
use cairn_placement::{Hierarchy, Placer};
use cairn_store::{BlockDevice, Devices, FileDevice, Store, StoreConfig};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

fn open_device(
    path: &Path,
    size: u64,
    what: &'static str,
) -> Result<Arc<dyn BlockDevice>, OsdError> {
    FileDevice::open(path, size, what)
        .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
        .map_err(|source| OsdError::Device {
            what,
            path: path.display().to_string(),
            source,
        })
}

/// Opens the OSD's store, formatting it first when its data file is new.
pub fn open_store(cfg: &OsdConfig) -> Result<Store, OsdError> {
    let data_path = cfg.data_path();
    let fresh = !data_path.exists();
    if let Some(parent) = data_path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| OsdError::Device {
            what: "data directory",
            path: parent.display().to_string(),
            source,
        })?;
    }
    let data = open_device(&data_path, cfg.data_size, "data")?;
    let wal = match &cfg.wal {
        Some(p) => Some(open_device(p, cfg.wal_size, "wal")?),
        None => None,
    };
    let devs = Devices {
        data: vec![data],
        wal,
    };
    let store_cfg = StoreConfig {
        read_cache_bytes: crate::config::cache_share(cfg.memory_target, 0),
        direct_write_min_bytes: cfg.direct_write_min,
        wal_flush_delay: cfg.memory_flush_delay,
        pending_limit_bytes: crate::config::pending_share(cfg.memory_target),
        ..StoreConfig::default()
    };
    let err = |source| OsdError::Store {
        path: data_path.display().to_string(),
        source,
    };
    if fresh {
        Store::mkfs(&devs, &store_cfg).map_err(err)?;
        tracing::info!(path = %data_path.display(), "formatted a new store");
    }
    Store::open(&devs, store_cfg).map_err(err)
}

/// Starts shard `i`'s thread and event loop; returns its runtime handle.
fn start_shard(
    i: usize,
    state: Arc<Mutex<Shard>>,
    rx: tokio::sync::mpsc::UnboundedReceiver<crate::mailbox::Queued>,
    backlog: Arc<crate::backlog::Backlog>,
) -> Result<(tokio::runtime::Handle, std::thread::JoinHandle<()>), OsdError> {
    runtime_thread(format!("osd-shard-{i}"), serve_queue(state, rx, backlog))
}

/// Starts a thread named `name` running `main` on a single-threaded runtime of its own;
/// returns the runtime's handle.
fn runtime_thread(
    name: String,
    main: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(tokio::runtime::Handle, std::thread::JoinHandle<()>), OsdError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OsdError::Runtime)?;
    let handle = rt.handle().clone();
    let thread = std::thread::Builder::new()
        .name(name)
        .spawn(move || rt.block_on(main))
        .map_err(OsdError::Runtime)?;
    Ok((handle, thread))
}

/// What this OSD presents and what it requires: with a key, its key to the monitors, tickets
/// it mints to its peers, and a ticket of everyone who connects; without, nothing.
fn credentials(
    cfg: &OsdConfig,
    service: &Arc<cairn_auth::ServiceKeys>,
) -> (cairn_transport::Auth, Arc<dyn cairn_transport::Verifier>) {
    match &cfg.key {
        Some(key) => (
            Arc::new(crate::auth::OsdAuth {
                key: key.clone(),
                service: service.clone(),
            }),
            Arc::new(cairn_transport::TicketVerifier {
                keys: service.clone(),
                frames: cfg.frames,
            }),
        ),
        None => (
            Arc::new(cairn_transport::NoAuth),
            Arc::new(cairn_transport::AllowNone),
        ),
    }
}

/// Runs an OSD until it fails. Blocks the calling thread.
pub fn run(cfg: OsdConfig) -> Result<(), OsdError> {
    if cfg.key.is_none() && cfg.frames != cairn_transport::FrameMode::Plain {
        // Protection comes from the handshake's keys: without a key every frame would go
        // out plain, whatever was asked.
        return Err(OsdError::Config(format!(
            "{} frames need authentication: give the OSD its key (or plain frames)",
            cfg.frames
        )));
    }
    let store = open_store(&cfg)?;
    let boot_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OsdError::Runtime)?;
    let std_listener =
        std::net::TcpListener::bind(cfg.listen).map_err(|source| OsdError::Listen {
            addr: cfg.listen.to_string(),
            source,
        })?;
    let addr = std_listener
        .local_addr()
        .map_err(|source| OsdError::Listen {
            addr: cfg.listen.to_string(),
            source,
        })?
        .to_string();
    let metrics_endpoint = match &cfg.metrics_listen {
        Some(m) => Some(
            cairn_metrics::Endpoint::bind(m).map_err(|source| OsdError::Listen {
                addr: format!("{} (metrics)", m.addr),
                source,
            })?,
        ),
        None => None,
    };
    let source = cairn_transport::net::source_for(cfg.listen);
    let service = Arc::new(cairn_auth::ServiceKeys::default());
    let (auth, verifier) = credentials(&cfg, &service);
    let mon = cairn_monclient::MonClient::new(cfg.mons.clone())
        .with_source(source)
        .with_auth(auth.clone())
        .with_frames(cfg.frames);
    let dialer = cairn_transport::Dialer::new(cairn_transport::node_kind::OSD, auth)
        .from(source)
        .frames(cfg.frames);
    let store_id = store.store_id();
    let boot = crate::mapwatch::boot(&boot_rt, &mon, store_id, &addr, &cfg)?;
    if let Some(key) = &cfg.key {
        boot_rt
            .block_on(crate::auth::fetch_service_keys(&mon, key, &service))
            .map_err(|e| OsdError::Boot(format!("getting the service keys: {e}")))?;
    }
    drop(boot_rt);

    let (sync_tx, sync_rx) = std::sync::mpsc::channel();
    let osd = Arc::new(Osd {
        store,
        map: RwLock::new(boot.map.clone()),
        placer: Mutex::new((0, Arc::new(Placer::new(&Hierarchy { hosts: Vec::new() })))),
        id: AtomicU32::new(boot.id),
        up_from: AtomicU64::new(boot.up_from),
        peers: Peers::new(dialer.clone()),
        lease: crate::lease::Lease::new(cfg.lease),
        dialer,
        verifier,
        admission: cairn_transport::Admission::new(cfg.conn_limits),
        scrub_slots: Arc::new(tokio::sync::Semaphore::new(cfg.max_client_scrubs.max(1))),
        pull_slots: Arc::new(tokio::sync::Semaphore::new(cfg.max_pulls.max(1))),
        inflight: Arc::new(Inflight::new()),
        shards: OnceLock::new(),
        recovery: crate::recovery::Recovery::new(
            cfg.recovery_share,
            cfg.recovery_sleep,
            cfg.recovery_max_active,
        ),
        scrub: crate::scrub::stats::ScrubStats::default(),
        mon: mon.clone(),
        memory_target: cfg.memory_target,
        request_limits: cfg.request_limits,
        syncer: sync_tx,
        wal_pace: crate::wal_pace::WalPace::new(cfg.wal_inline_max),
        readers: crate::readers::Readers::start(cfg.read_threads).map_err(OsdError::Runtime)?,
        splits: crate::split::pending::Splits::default(),
        metrics: crate::metrics::op_metrics(metrics_endpoint.is_some()),
        slow: crate::slowops::SlowOps::new(cfg.slow_op),
        crashes: crate::crashes::recent(cfg.crash_dir.as_deref()),
    });
    if let Some(m) = &osd.metrics {
        osd.inflight.set_metrics(m.clone());
    }
    // The OSD may have been down while PGs split: every copy it holds is checked.
    osd.splits.note(&osd.store, None, &boot.map);
    crate::syncer::start(Arc::downgrade(&osd), sync_rx).map_err(OsdError::Runtime)?;
    let weak = Arc::downgrade(&osd);
    osd.inflight.set_done_hook(Box::new(move |pg| {
        if let Some(osd) = weak.upgrade() {
            osd.queue(pg, ShardMsg::WriteDone(pg));
        }
    }));
    let weak = Arc::downgrade(&osd);
    osd.peers.set_link_hook(Box::new(move |shard, peer| {
        if let Some(osd) = weak.upgrade() {
            osd.queue_shard(shard, ShardMsg::PeerLinked(peer));
        }
    }));
    let weak = Arc::downgrade(&osd);
    osd.inflight.set_repeer_hook(Box::new(move |pg| {
        if let Some(osd) = weak.upgrade() {
            osd.queue(pg, ShardMsg::Unpeer(pg));
        }
    }));
    let mut handles = Vec::new();
    let mut threads = Vec::new();
    for i in 0..cfg.shards.max(1) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let state = Arc::new(Mutex::new(Shard {
            osd: osd.clone(),
            index: i,
            pgs: HashMap::new(),
            reclaiming: HashMap::new(),
            unsynced: Vec::new(),
            unwritten: Vec::new(),
            last_seq: 0,
            syncing: 0,
        }));
        let backlog = Arc::new(crate::backlog::Backlog::new(crate::backlog::SHARD_BACKLOG));
        let (rt, thread) = start_shard(i, state.clone(), rx, backlog.clone())?;
        handles.push(ShardHandle {
            tx,
            state: state as Arc<dyn crate::mailbox::ShardState>,
            rt,
            backlog,
        });
        threads.push(thread);
    }
    let _ = osd.shards.set(handles);
    // The PGs this OSD leads in the map it booted with peer now (later maps do it in mapwatch).
    osd.queue_all(|| ShardMsg::MapChanged);
    tracing::info!(osd = boot.id, %addr, up_from = boot.up_from, "OSD serving");
    println!("osd.{} serving on {addr}", boot.id);
    // Accepting connections, monitor heartbeats and timers run on a thread of their own: a
    // shard busy with a long request must not delay them.
    let (rt0, service_thread) = runtime_thread("osd-service".into(), std::future::pending())?;
    threads.push(service_thread);
    let osd2 = osd.clone();
    rt0.spawn(async move {
        match std_listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(std_listener))
        {
            Ok(l) => crate::server::serve(osd2, l).await,
            Err(e) => tracing::error!(error = %e, "cannot serve on the listener"),
        }
    });
    if let Some(endpoint) = metrics_endpoint {
        println!(
            "osd.{} metrics on http://{}/metrics",
            boot.id, endpoint.addr
        );
        rt0.spawn(cairn_metrics::serve(
            endpoint,
            crate::metrics::exporter(osd.metrics.as_ref(), scrape_sample(&osd)),
        ));
    }
    let ticking = osd.clone();
    rt0.spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        for second in 0u64.. {
            every.tick().await;
            if second % 5 == 0 {
                crate::config::fit_read_cache(&ticking.store, ticking.memory_target);
            }
            ticking.recovery.tick();
            let slow = ticking.inflight.slow_writes(ticking.slow.threshold);
            ticking.slow.check(ticking.id(), slow);
        }
    });
    if let Some(key) = cfg.key.clone() {
        rt0.spawn(crate::auth::refresh_service_keys(mon.clone(), key, service));
    }
    if let Some(every) = cfg.scrub_interval {
        rt0.spawn(crate::scrub::periodic(osd.clone(), every));
    }
    rt0.spawn(crate::mapwatch::watch(osd, mon, cfg, store_id, addr));
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// What `osd`'s metrics read at each scrape, while it runs.
fn scrape_sample(osd: &Arc<Osd>) -> impl Fn() -> Option<crate::metrics::Sample> + Send + Sync {
    let weak = Arc::downgrade(osd);
    move || {
        let osd = weak.upgrade()?;
        // Read once: taking them means the store's lock and a walk of its collections.
        let store = osd.store.stats();
        Some(crate::metrics::Sample {
            osd: crate::server::osd_stats_with(&osd, &store),
            store,
            data_room: osd.store.admissible_bytes().0,
            up_from: osd.up_from.load(std::sync::atomic::Ordering::Relaxed),
            slow_recent: osd.slow.recent_count(),
        })
    }
}
