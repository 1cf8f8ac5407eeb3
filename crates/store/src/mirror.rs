//! The data devices: one, or two as a mirror with read/flush separation.
//!
//! Every write goes to every device. A flush goes to one device at a time, and while a device
//! flushes, reads are served by the other one, so a read never waits behind a flush of a
//! commodity SSD (TECHNIQUES.md section 2). Without separation, reads alternate between the
//! devices whatever they are doing and both flush at once.

use crate::device::BlockDevice;
use crate::error::{Result, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// I/O counters of the data devices (summed over the mirror).
#[derive(Debug, Default)]
pub struct IoCounters {
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub flushes: AtomicU64,
}

/// A copy of [`IoCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    pub writes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub flushes: u64,
}

impl IoCounters {
    /// Current values.
    pub fn get(&self) -> IoStats {
        IoStats {
            writes: self.writes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }
}

/// The data devices of a store.
pub struct Mirror {
    devs: Vec<Arc<dyn BlockDevice>>,
    /// Read cache of data blocks (None when configured off).
    pub cache: Option<crate::cache::BlockCache>,
    flushing: Vec<AtomicBool>,
    separation: bool,
    next: AtomicUsize,
    pub counters: IoCounters,
}

impl Mirror {
    /// One or two devices; `separation` enables read/flush separation.
    pub fn new(devs: Vec<Arc<dyn BlockDevice>>, separation: bool, cache_bytes: u64) -> Self {
        let flushing = devs.iter().map(|_| AtomicBool::new(false)).collect();
        Mirror {
            devs,
            cache: (cache_bytes > 0).then(|| crate::cache::BlockCache::new(cache_bytes)),
            flushing,
            separation,
            next: AtomicUsize::new(0),
            counters: IoCounters::default(),
        }
    }

    /// Number of devices.
    pub fn count(&self) -> usize {
        self.devs.len()
    }

    /// The memory alignment a buffer needs to be written to every device
    /// ([`BlockDevice::mem_align`]).
    pub fn mem_align(&self) -> usize {
        self.devs.iter().map(|d| d.mem_align()).max().unwrap_or(1)
    }

    /// Size of the smallest device.
    pub fn device_size(&self) -> u64 {
        self.devs.iter().map(|d| d.size()).min().unwrap_or(0)
    }

    /// Name of device `i`.
    pub fn name(&self, i: usize) -> &str {
        self.devs[i].name()
    }

    /// Writes object data blocks at `off` on every device and keeps them in the read cache.
    pub fn write_data(&self, buf: &[u8], off: u64) -> Result<()> {
        self.write(buf, off)?;
        if let Some(c) = &self.cache {
            c.insert(off, buf);
        }
        Ok(())
    }

    /// Writes `buf` at `off` on every device (dropping cached blocks it overwrites first).
    pub fn write(&self, buf: &[u8], off: u64) -> Result<()> {
        if let Some(c) = &self.cache {
            c.invalidate(off, buf.len() as u64);
        }
        for d in &self.devs {
            d.write_at(buf, off)
                .map_err(|e| StoreError::io(d.name(), off, e))?;
            self.counters.writes.fetch_add(1, Ordering::Relaxed);
            self.counters
                .write_bytes
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The device a read should go to now.
    pub fn pick_reader(&self) -> usize {
        let n = self.devs.len();
        if n == 1 {
            return 0;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        if self.separation {
            for k in 0..n {
                let i = (start + k) % n;
                if !self.flushing[i].load(Ordering::Acquire) {
                    return i;
                }
            }
        }
        start
    }

    /// Reads from device `i`.
    pub fn read_from(&self, i: usize, buf: &mut [u8], off: u64) -> Result<()> {
        let d = &self.devs[i];
        d.read_at(buf, off)
            .map_err(|e| StoreError::io(d.name(), off, e))?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters
            .read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Makes all writes durable on every device.
    pub fn flush(&self) -> Result<()> {
        if self.separation || self.devs.len() == 1 {
            for (i, d) in self.devs.iter().enumerate() {
                self.flushing[i].store(true, Ordering::Release);
                let r = d.flush();
                self.flushing[i].store(false, Ordering::Release);
                self.counters.flushes.fetch_add(1, Ordering::Relaxed);
                r.map_err(|e| StoreError::io(d.name(), 0, e))?;
            }
            return Ok(());
        }
        let results: Vec<std::io::Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = self.devs.iter().map(|d| s.spawn(|| d.flush())).collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(std::io::Error::other("flush thread panicked")))
                })
                .collect()
        });
        for (d, r) in self.devs.iter().zip(results) {
            self.counters.flushes.fetch_add(1, Ordering::Relaxed);
            r.map_err(|e| StoreError::io(d.name(), 0, e))?;
        }
        Ok(())
    }
}
