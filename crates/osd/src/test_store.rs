//! A store on memory devices for unit tests.

use cairn_store::{Devices, MemDevice, Store, StoreConfig};
use std::sync::Arc;

/// A formatted, open store of 256 MiB data and 64 MiB WAL, in memory.
pub fn mem_store() -> Store {
    let devs = Devices {
        data: vec![Arc::new(MemDevice::new("data", 256 << 20))],
        wal: Some(Arc::new(MemDevice::new("wal", 64 << 20))),
    };
    let cfg = StoreConfig::default();
    Store::mkfs(&devs, &cfg).expect("mkfs");
    Store::open(&devs, cfg).expect("open")
}
