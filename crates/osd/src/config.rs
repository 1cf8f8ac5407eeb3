//! OSD settings.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Settings of one OSD.
#[derive(Debug, Clone)]
pub struct OsdConfig {
    /// Directory holding the data device file (`data.img`) unless `data` is given.
    pub dir: PathBuf,
    /// Data device (file or block device). Default `<dir>/data.img`.
    pub data: Option<PathBuf>,
    /// Size of the data file when it is created. Default 4 GiB (sparse).
    pub data_size: u64,
    /// WAL device (file or block device); None keeps the WAL on the data device.
    pub wal: Option<PathBuf>,
    /// Size of the WAL file when it is created. Default 128 MiB ([`default_wal_size`] is what
    /// `cairn osd run` gives when none is set).
    pub wal_size: u64,
    /// Address to accept clients and peers on. Default 127.0.0.1:0 (any free port).
    pub listen: SocketAddr,
    /// Monitor addresses.
    pub mons: Vec<String>,
    /// Host name (failure domain). Default: the machine's host name.
    pub host: String,
    /// Placement weight, 16.16 fixed point. Default 1.0.
    pub weight: u32,
    /// Shards: threads each running an event loop that owns a share of the PGs and of the
    /// connections (network I/O runs on them too). Default 1.
    pub shards: usize,
    /// Reader threads: client reads that need a data device run on them, so the device sees
    /// this many reads at once and no shard waits for it (`readers.rs`); 0 = reads run on
    /// their shard. Default [`crate::readers::DEFAULT_READ_THREADS`].
    pub read_threads: usize,
    /// Interval between heartbeats to the monitors. Default 1 s.
    pub heartbeat_interval: Duration,
    /// How often each PG this OSD leads is scrubbed (and repaired); `None`: never by itself.
    /// Default 7 days.
    pub scrub_interval: Option<Duration>,
    /// Fraction of the time recovery may take while clients send ops to this OSD (it pauses
    /// for the rest); 1 = never paused. Default 0.5.
    pub recovery_share: f64,
    /// Pause after every object recovery copies, whatever the load. Default 0.
    pub recovery_sleep: Duration,
    /// Object copies recovery runs at once over all PGs (copies client ops wait for aside).
    /// Default 2.
    pub recovery_max_active: u32,
    /// How long after a heartbeat the monitors accepted this OSD keeps serving client ops
    /// (`lease.rs`); at most half the monitors' OSD grace, whatever this says. Default 2 s.
    pub lease: Duration,
    /// Memory this OSD aims to use; the read cache gets [`cache_share`] of it. Default
    /// [`default_memory_target`].
    pub memory_target: u64,
    /// Writes of whole blocks at least this large go straight to the data device, with only
    /// their metadata in the WAL (`StoreConfig::direct_write_min_bytes`); 0 = off. Default
    /// [`DEFAULT_DIRECT_WRITE_MIN`] (what was measured: docs/operator/store.md).
    pub direct_write_min: u64,
    /// Shards write their WAL batches themselves while the quickest of the last 64 WAL syncs
    /// took at most this (zero: never); else the syncer thread does (`wal_pace.rs`). Default
    /// 30 us.
    pub wal_inline_max: std::time::Duration,
    /// Writes of pools with `memory` durability are acknowledged once written to the WAL
    /// device and flushed at most this long after (`StoreConfig::wal_flush_delay`): the
    /// window in which a power loss of every member could take them. Default 5 ms.
    pub memory_flush_delay: Duration,
    /// This OSD's key (`osd.N`): it proves it to the monitors, gets the service keys with it
    /// and then requires a ticket of every connection. Default: none (a cluster without
    /// authentication: no credentials presented, none required).
    pub key: Option<crate::auth::OsdKey>,
    /// How every connection's frames are protected at least (its own, and those it accepts:
    /// a peer asking for more gets more). Needs a key. Default plain.
    pub frames: cairn_transport::FrameMode,
    /// Connection caps and the idle limit of the OSD's port (`ConnLimits` says each
    /// default).
    pub conn_limits: cairn_transport::ConnLimits,
    /// Caps on the requests in flight per connection and the bytes they carry or read
    /// (`RequestLimits` says each default): a connection over them is not read until some
    /// of its requests are done.
    pub request_limits: cairn_transport::RequestLimits,
    /// Most scrubs asked by clients (`SCRUB_PG`) running at once; a connection asking for
    /// more waits (is not read) until one ends. Default 2.
    pub max_client_scrubs: usize,
    /// Most recovery pulls (`PG_PULL`, up to 4 MiB read each) served at once; a peer asking
    /// for more waits. Default 8.
    pub max_pulls: usize,
    /// Where to serve Prometheus metrics over HTTP (`GET /metrics`), and the token a scrape
    /// must show; `None`: no endpoint and no op-path metrics kept. Default none.
    pub metrics_listen: Option<cairn_metrics::Listen>,
    /// A write this OSD leads that takes longer is reported as slow (logged with where it
    /// waits, counted in `cairn status`). Default 1 s.
    pub slow_op: Duration,
    /// Where this OSD's crash reports are (`cairn_failstop`); the recent ones are in its
    /// stats. Default none.
    pub crash_dir: Option<PathBuf>,
}

/// Default [`OsdConfig::direct_write_min`]: 128 KiB. Written once, large writes go 1.4-2.2x
/// faster through a whole cluster on the project's VM, and 4 KiB random I/O of data laid
/// down so measures the same as over data written through the WAL (docs/operator/store.md);
/// smaller writes keep the NVM path, where their latency is lowest.
pub const DEFAULT_DIRECT_WRITE_MIN: u64 = 128 << 10;

/// Smallest memory target: below it the read cache would be too small to matter.
pub const MIN_MEMORY_TARGET: u64 = 256 << 20;

/// The default memory target: a quarter of the machine's memory, from 256 MiB to 4 GiB (the
/// upper bound is Ceph's `osd_memory_target` default). Several OSDs on one machine should be
/// given their share explicitly (`cairn dev up` does).
pub fn default_memory_target() -> u64 {
    (machine_memory().unwrap_or(2 << 30) / 4).clamp(MIN_MEMORY_TARGET, 4 << 30)
}

/// Total memory of this machine (`MemTotal` of /proc/meminfo).
pub fn machine_memory() -> Option<u64> {
    kib_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal:")
}

/// Smallest and largest WAL [`default_wal_size`] picks for a WAL on its own device.
const WAL_DEFAULT_MIN: u64 = 128 << 20;
const WAL_DEFAULT_MAX: u64 = 1 << 30;

/// The WAL size of an OSD whose operator gave none: on its own device (NVM, /dev/shm), a
/// sixteenth of the data device's size, between 128 MiB and 1 GiB; on the data device, 128
/// MiB (there it takes capacity). A checkpoint writes the whole index and starts when the WAL
/// is half full, so with a fixed WAL the checkpoints' share of the work grows with the data
/// held; a WAL that grows with the data device keeps that share level
/// (`docs/operator/store.md`, "WAL size").
pub fn default_wal_size(data_size: u64, own_device: bool) -> u64 {
    if !own_device {
        return WAL_DEFAULT_MIN;
    }
    (data_size / 16).clamp(WAL_DEFAULT_MIN, WAL_DEFAULT_MAX) / 4096 * 4096
}

/// The read cache's part of a memory target: three quarters less the store's index (its heap
/// as the store estimates it: ~810 bytes per object and ~150 per extent), and at least a
/// sixteenth. The last quarter is for data waiting for the flusher ([`pending_share`]),
/// connections and message buffers.
pub fn cache_share(memory_target: u64, index_bytes: u64) -> u64 {
    (memory_target / 4 * 3)
        .saturating_sub(index_bytes)
        .max(memory_target / 16)
}

/// Smallest and largest [`pending_share`].
const PENDING_MIN: u64 = 16 << 20;
const PENDING_MAX: u64 = 64 << 20;

/// How much written data may wait in memory for the flusher (the store's pending limit;
/// commits wait beyond it): a sixty-fourth of the memory target, from 16 to 64 MiB. A data
/// device's flush (a checkpoint's `fdatasync`) can hold every write to it, the flusher's too,
/// for a few hundred milliseconds (100-370 ms on the project's VM): at ~120 MB/s per OSD, 16
/// MiB filled in ~130 ms and every commit stopped for the rest of the flush; 64 MiB covers
/// ~0.5 s (`docs/operator/store.md`, "A data device's flush stops the flusher").
pub fn pending_share(memory_target: u64) -> u64 {
    // Whole 4 KiB blocks: the store counts its limit in blocks.
    (memory_target / 64).clamp(PENDING_MIN, PENDING_MAX) / 4096 * 4096
}

/// Changes of the cache's share smaller than this wait (the index grows a little with every
/// object written).
const FIT_STEP: u64 = 4 << 20;

/// Fits the read cache to what the index leaves of the memory target: called at start (the
/// index was loaded) and every few seconds (it grows as objects are written).
pub fn fit_read_cache(store: &cairn_store::Store, memory_target: u64) {
    let st = store.stats();
    let want = cache_share(memory_target, st.index_bytes);
    if want.abs_diff(st.read_cache.capacity) >= FIT_STEP {
        tracing::debug!(
            index_bytes = st.index_bytes,
            cache_bytes = want,
            "read cache fitted to the memory target"
        );
        store.set_read_cache_bytes(want);
    }
}

/// This process's resident memory (`VmRSS` of /proc/self/status; 0 when unreadable).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| kib_field(&s, "VmRSS:"))
        .unwrap_or(0)
}

/// A `Name:  1234 kB` field of a /proc file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Default time between two scrubs of one PG.
pub const DEFAULT_SCRUB_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

impl OsdConfig {
    /// Defaults for an OSD in `dir` talking to `mons`.
    pub fn new(dir: PathBuf, mons: Vec<String>) -> OsdConfig {
        OsdConfig {
            dir,
            data: None,
            data_size: 4 << 30,
            wal: None,
            wal_size: 128 << 20,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            mons,
            host: default_host(),
            weight: 0x10000,
            shards: 1,
            read_threads: crate::readers::DEFAULT_READ_THREADS,
            heartbeat_interval: Duration::from_secs(1),
            scrub_interval: Some(DEFAULT_SCRUB_INTERVAL),
            recovery_share: 0.5,
            recovery_sleep: Duration::ZERO,
            recovery_max_active: 2,
            lease: Duration::from_secs(2),
            memory_target: default_memory_target(),
            direct_write_min: DEFAULT_DIRECT_WRITE_MIN,
            wal_inline_max: crate::wal_pace::DEFAULT_INLINE_MAX,
            memory_flush_delay: Duration::from_millis(5),
            key: None,
            frames: cairn_transport::FrameMode::Plain,
            conn_limits: cairn_transport::ConnLimits::default(),
            request_limits: cairn_transport::RequestLimits::default(),
            max_client_scrubs: 2,
            max_pulls: 8,
            metrics_listen: None,
            slow_op: crate::slowops::DEFAULT_SLOW_OP,
            crash_dir: None,
        }
    }

    /// The data device path.
    pub fn data_path(&self) -> PathBuf {
        self.data
            .clone()
            .unwrap_or_else(|| self.dir.join("data.img"))
    }
}

/// The machine's host name, "localhost" when it cannot be read.
pub fn default_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pending_limit_grows_with_the_memory_target_within_its_bounds() {
        assert_eq!(pending_share(MIN_MEMORY_TARGET), 16 << 20);
        assert_eq!(pending_share(2 << 30), 32 << 20);
        assert_eq!(pending_share(4 << 30), 64 << 20);
        assert_eq!(pending_share(64 << 30), 64 << 20);
        assert_eq!(pending_share(3 << 30 | 12345), 48 << 20);
        assert_eq!(pending_share((3 << 30) + (65 << 12)), (48 << 20) + 4096);
    }

    #[test]
    fn memory_figures() {
        let meminfo = "MemTotal:       24558420 kB\nMemFree:  100 kB\n";
        assert_eq!(kib_field(meminfo, "MemTotal:"), Some(24_558_420 * 1024));
        assert_eq!(kib_field(meminfo, "VmRSS:"), None);
        assert_eq!(kib_field("MemTotal: lots kB", "MemTotal:"), None);
        let t = default_memory_target();
        assert!((MIN_MEMORY_TARGET..=4 << 30).contains(&t), "{t}");
        assert!(resident_bytes() > 0);
    }

    #[test]
    fn the_index_takes_its_memory_from_the_cache_down_to_a_sixteenth() {
        assert_eq!(cache_share(4 << 30, 0), 3 << 30);
        assert_eq!(cache_share(4 << 30, 1 << 30), 2 << 30);
        assert_eq!(cache_share(4 << 30, 3 << 30), 256 << 20);
        assert_eq!(cache_share(4 << 30, u64::MAX), 256 << 20);
    }

    /// A store's cache shrinks as its index grows, by what the index takes, in steps.
    #[test]
    fn the_read_cache_is_fitted_to_what_the_index_leaves() {
        use cairn_store::{Devices, MemDevice, Store, StoreConfig, Transaction};
        let target = 64 << 20;
        let cfg = StoreConfig {
            read_cache_bytes: cache_share(target, 0),
            ..StoreConfig::default()
        };
        let devs = Devices {
            data: vec![std::sync::Arc::new(MemDevice::new("data", 512 << 20))],
            wal: None,
        };
        Store::mkfs(&devs, &cfg).expect("mkfs");
        let store = Store::open(&devs, cfg).expect("open");
        fit_read_cache(&store, target);
        assert_eq!(
            store.stats().read_cache.capacity,
            48 << 20,
            "an empty index"
        );
        let mut t = Transaction::new();
        t.create_collection(1);
        store.commit(&t).expect("commit");
        // 20,000 objects: ~15 MB of index by the store's estimate.
        for batch in 0..200 {
            let mut t = Transaction::new();
            for i in 0..100 {
                t.write(1, format!("object-{batch}-{i}").as_bytes(), 0, &[7u8; 4096]);
            }
            store.commit(&t).expect("commit");
        }
        store.checkpoint().expect("checkpoint");
        fit_read_cache(&store, target);
        let st = store.stats();
        assert!(st.index_bytes >= 15_000_000, "{}", st.index_bytes);
        assert_eq!(
            st.read_cache.capacity,
            cache_share(target, st.index_bytes) / 4096 * 4096
        );
        assert!(st.read_cache.bytes <= st.read_cache.capacity);
    }

    #[test]
    fn the_default_wal_grows_with_the_data_device_only_on_its_own_device() {
        assert_eq!(default_wal_size(8 << 30, true), 512 << 20);
        assert_eq!(default_wal_size(2 << 30, true), 128 << 20);
        assert_eq!(default_wal_size(1 << 40, true), 1 << 30);
        assert_eq!(default_wal_size(8 << 30, false), 128 << 20);
        assert_eq!(default_wal_size((10 << 30) + 12345, true) % 4096, 0);
    }
}
