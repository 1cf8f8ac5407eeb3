//! Helpers shared by the store's integration tests.
#![allow(dead_code)]

use cairn_store::fault::{FaultDevice, Power};
use cairn_store::{BlockDevice, Devices, MemDevice, Store, StoreConfig};
use std::sync::Arc;
use std::time::Duration;

/// A small configuration that exercises segment changes, cleaning and checkpoints quickly.
pub fn small_cfg() -> StoreConfig {
    StoreConfig {
        segment_size: 64 * 1024,
        wal_size: 1 << 20,
        flush_batch_bytes: 64 * 1024,
        pending_limit_bytes: 128 * 1024,
        flush_max_delay: Duration::from_millis(5),
        checkpoint_interval: Duration::from_millis(200),
        clean_below_free_segments: 6,
        clean_rate: 0,
        reserve_segments: 4,
        // Small, so eviction and invalidation by segment reuse happen in every test.
        read_cache_bytes: 128 * 1024,
        ..StoreConfig::default()
    }
}

/// In-memory devices: `data` data devices of `size` bytes and optionally a WAL device.
pub struct MemDevs {
    pub data: Vec<Arc<MemDevice>>,
    pub wal: Option<Arc<MemDevice>>,
}

impl MemDevs {
    pub fn new(data: usize, size: u64, wal: Option<u64>) -> Self {
        Self::with_wal_on_nvm(data, size, wal, false)
    }

    /// With `nvm`, the device holding the WAL (the WAL device, else data device 0) is
    /// byte-addressable: WAL batches are packed at 64 bytes, not a block.
    pub fn with_wal_on_nvm(data: usize, size: u64, wal: Option<u64>, nvm: bool) -> Self {
        let dev = |name: &str, size, nvm| {
            Arc::new(if nvm {
                MemDevice::nvm(name, size)
            } else {
                MemDevice::new(name, size)
            })
        };
        MemDevs {
            data: (0..data)
                .map(|i| dev(&format!("data{i}"), size, nvm && i == 0 && wal.is_none()))
                .collect(),
            wal: wal.map(|w| dev("wal", w, nvm)),
        }
    }

    pub fn devices(&self) -> Devices {
        Devices {
            data: self
                .data
                .iter()
                .map(|d| d.clone() as Arc<dyn BlockDevice>)
                .collect(),
            wal: self.wal.clone().map(|w| w as Arc<dyn BlockDevice>),
        }
    }

    /// The same devices behind fault injectors sharing one power switch.
    pub fn faulty(&self, power: &Arc<Power>) -> (Devices, Vec<Arc<FaultDevice>>) {
        let mut all = Vec::new();
        let mut wrap = |d: Arc<MemDevice>| {
            let f = Arc::new(FaultDevice::new(d as Arc<dyn BlockDevice>, power.clone()));
            all.push(f.clone());
            f as Arc<dyn BlockDevice>
        };
        let data = self.data.iter().map(|d| wrap(d.clone())).collect();
        let wal = self.wal.clone().map(&mut wrap);
        (Devices { data, wal }, all)
    }

    /// The data devices behind pass-through fault injectors (slow flushes, no crash
    /// simulation), the WAL device as it is.
    pub fn passthrough_data(&self) -> (Devices, Vec<Arc<FaultDevice>>) {
        let power = Power::new();
        let faults: Vec<Arc<FaultDevice>> = self
            .data
            .iter()
            .map(|d| {
                Arc::new(FaultDevice::passthrough(
                    d.clone() as Arc<dyn BlockDevice>,
                    power.clone(),
                ))
            })
            .collect();
        let data = faults
            .iter()
            .map(|f| f.clone() as Arc<dyn BlockDevice>)
            .collect();
        let wal = self.wal.clone().map(|w| w as Arc<dyn BlockDevice>);
        (Devices { data, wal }, faults)
    }

    pub fn mkfs_open(&self, cfg: StoreConfig) -> Store {
        Store::mkfs(&self.devices(), &cfg).unwrap();
        Store::open(&self.devices(), cfg).unwrap()
    }
}

/// A deterministic pseudo-random generator (splitmix64) so failures replay from a seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
