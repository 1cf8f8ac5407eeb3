//! Starting an OSD: open (or create) its store, register with the monitors, start the
//! shards, serve.

use crate::config::OsdConfig;
use crate::error::OsdError;
use crate::inflight::Inflight;
use crate::peers::Peers;
use crate::shard::{shard_of, Shard, ShardMsg};
use cairn_map::{ClusterMap, PgId, PgPlacement};
use cairn_placement::Hierarchy;
use cairn_store::{BlockDevice, Devices, FileDevice, Store, StoreConfig, StoreError};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, RwLock};

/// State shared by the shards, the network tasks and the map watcher.
pub struct Osd {
    pub store: Store,
    map: RwLock<Arc<ClusterMap>>,
    hierarchy: Mutex<(u64, Arc<Hierarchy>)>,
    id: AtomicU32,
    /// Epoch of this OSD's current life (its last boot).
    pub up_from: AtomicU64,
    pub inflight: Arc<Inflight>,
    pub peers: Peers,
    shards: Vec<Sender<ShardMsg>>,
}

impl Osd {
    /// This OSD's id.
    pub fn id(&self) -> u32 {
        self.id.load(Ordering::Relaxed)
    }

    /// The current map.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Installs a newer map; returns false (and keeps the old one) when it is not newer.
    pub fn set_map(&self, m: Arc<ClusterMap>) -> bool {
        let mut cur = self.map.write().unwrap_or_else(|p| p.into_inner());
        if m.epoch <= cur.epoch {
            return false;
        }
        *cur = m;
        true
    }

    /// Where `pg` lives in `map` (the hierarchy is computed once per epoch).
    pub fn placement(&self, map: &ClusterMap, pg: PgId) -> PgPlacement {
        let h = {
            let mut cached = self.hierarchy.lock().unwrap_or_else(|p| p.into_inner());
            if cached.0 != map.epoch {
                *cached = (map.epoch, Arc::new(map.hierarchy()));
            }
            cached.1.clone()
        };
        map.pg_placement_in(&h, pg)
    }

    /// Queues a message on the shard owning `pg`.
    pub fn dispatch(&self, pg: PgId, msg: ShardMsg) {
        let i = shard_of(pg, self.shards.len());
        if self.shards[i].send(msg).is_err() {
            tracing::error!(shard = i, "shard thread is gone");
        }
    }

    /// Stops the process when the store has failed: serving on would risk acknowledging
    /// writes it cannot keep. Acknowledged writes are durable, so exiting loses nothing.
    pub fn note_store_error(&self, e: &StoreError) {
        if let Some(why) = self.store.failure() {
            tracing::error!(error = %e, failure = %why, "store failed; OSD exits");
            eprintln!("cairn osd.{}: store failed: {why}; exiting", self.id());
            std::process::exit(70);
        }
    }
}

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
    let store_cfg = StoreConfig::default();
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

/// Runs an OSD until it fails. Blocks the calling thread.
pub fn run(cfg: OsdConfig) -> Result<(), OsdError> {
    let store = open_store(&cfg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.net_threads.max(1))
        .thread_name("osd-net")
        .enable_all()
        .build()
        .map_err(OsdError::Runtime)?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(cfg.listen))
        .map_err(|source| OsdError::Listen {
            addr: cfg.listen.to_string(),
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| OsdError::Listen {
            addr: cfg.listen.to_string(),
            source,
        })?
        .to_string();
    let mon = cairn_monclient::MonClient::new(cfg.mons.clone());
    let store_id = store.store_id();
    let boot = crate::mapwatch::boot(&rt, &mon, store_id, &addr, &cfg)?;

    let nshards = cfg.shards.max(1);
    let mut txs = Vec::new();
    let mut rxs = Vec::new();
    for _ in 0..nshards {
        let (tx, rx) = std::sync::mpsc::channel();
        txs.push(tx);
        rxs.push(rx);
    }
    let done_txs = Mutex::new(txs.clone());
    let inflight = Arc::new(Inflight::new(Box::new(move |pg| {
        let txs = done_txs.lock().unwrap_or_else(|p| p.into_inner());
        let _ = txs[shard_of(pg, txs.len())].send(ShardMsg::WriteDone(pg));
    })));
    let osd = Arc::new(Osd {
        store,
        map: RwLock::new(boot.map.clone()),
        hierarchy: Mutex::new((0, Arc::new(Hierarchy { hosts: Vec::new() }))),
        id: AtomicU32::new(boot.id),
        up_from: AtomicU64::new(boot.up_from),
        peers: Peers::new(inflight.clone(), rt.handle().clone()),
        inflight,
        shards: txs,
    });
    for (i, rx) in rxs.into_iter().enumerate() {
        let shard = Shard {
            osd: osd.clone(),
            pgs: HashMap::new(),
        };
        std::thread::Builder::new()
            .name(format!("osd-shard-{i}"))
            .spawn(move || shard.run(rx))
            .map_err(OsdError::Runtime)?;
    }
    tracing::info!(osd = boot.id, %addr, up_from = boot.up_from, "OSD serving");
    println!("osd.{} serving on {addr}", boot.id);
    rt.spawn(crate::server::serve(osd.clone(), listener));
    rt.block_on(crate::mapwatch::watch(osd, mon, cfg, store_id, addr));
    Ok(())
}
