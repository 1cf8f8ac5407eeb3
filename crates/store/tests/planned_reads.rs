//! Reads planned under the index lock and finished without it (`Store::plan_read`,
//! `Store::finish_read`), as the OSD's reader threads do.

mod common;

use cairn_store::{BlockDevice, Devices, MemDevice, Store, StoreConfig, StoreError, Transaction};
use common::{small_cfg, MemDevs, Rng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

fn no_cache() -> StoreConfig {
    StoreConfig {
        read_cache_bytes: 0,
        ..small_cfg()
    }
}

/// Writes `data` to object `name` of collection 1 and waits until the flusher has put it on
/// the data device (a checkpoint flushes everything pending first).
fn write_flushed(s: &Store, name: &[u8], data: &[u8]) {
    let mut t = Transaction::new();
    t.write(1, name, 0, data);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
}

#[test]
fn a_plan_of_flushed_data_reads_the_device_and_returns_the_bytes_asked_for() {
    let s = MemDevs::new(1, 8 << 20, None).mkfs_open(no_cache());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 253) as u8).collect();
    write_flushed(&s, b"o", &data);

    let plan = s.plan_read(1, b"o", 1000, 9000).unwrap();
    assert!(
        plan.needs_device(),
        "flushed data with no cache is on the device"
    );
    assert_eq!(plan.object_size(), data.len() as u64);
    assert_eq!(s.finish_read(plan).unwrap(), &data[1000..10_000]);

    // Past the end: shorter, then empty, and no device read.
    let tail = s.plan_read(1, b"o", 12_000, 4096).unwrap();
    assert_eq!(s.finish_read(tail).unwrap(), &data[12_000..]);
    let none = s.plan_read(1, b"o", 20_000, 10).unwrap();
    assert!(!none.needs_device());
    assert!(s.finish_read(none).unwrap().is_empty());
    assert!(matches!(
        s.plan_read(1, b"missing", 0, 10),
        Err(StoreError::NoObject { .. })
    ));
}

#[test]
fn a_plan_answered_from_memory_needs_no_device() {
    let s = MemDevs::new(1, 8 << 20, None).mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1).write(1, b"o", 0, &[7; 8192]);
    s.commit(&t).unwrap();
    // Cached after a first read from the device (or still in memory before the flush).
    assert_eq!(s.read(1, b"o", 0, 8192).unwrap(), vec![7; 8192]);
    let plan = s.plan_read(1, b"o", 0, 8192).unwrap();
    assert!(!plan.needs_device());
    assert_eq!(s.finish_read(plan).unwrap(), vec![7; 8192]);
}

#[test]
fn a_plan_whose_blocks_were_reused_fails_verification_and_never_returns_other_data() {
    let s = MemDevs::new(1, 4 << 20, None).mkfs_open(no_cache());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    write_flushed(&s, b"victim", &[0xAA; 4096]);
    let plan = s.plan_read(1, b"victim", 0, 4096).unwrap();
    assert!(plan.needs_device());

    // The object is overwritten, and random writes ~10x the device's size make the cleaner
    // reuse every segment, the victim's old place included.
    write_flushed(&s, b"victim", &[0xBB; 4096]);
    let mut rng = Rng(7);
    for i in 0..10 * 4 * 64 {
        let mut t = Transaction::new();
        let off = rng.below(64) * 4096;
        t.write(
            1,
            format!("f{}", i % 4).as_bytes(),
            off,
            &[(i % 251) as u8; 4096],
        );
        s.commit(&t).unwrap();
    }
    s.checkpoint().unwrap();
    assert!(s.stats().segments_cleaned > 0);

    match s.finish_read(plan) {
        Err(StoreError::CorruptData { .. }) => {}
        other => panic!("a plan of reused blocks must fail its crc check, got {other:?}"),
    }
    // Planned again, the read finds the new place.
    assert_eq!(s.read(1, b"victim", 0, 4096).unwrap(), vec![0xBB; 4096]);
}

/// A data device whose reads wait while the gate is closed.
struct GatedDevice {
    inner: MemDevice,
    closed: AtomicBool,
    waiting: Mutex<usize>,
    cv: Condvar,
}

impl GatedDevice {
    fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        let _g = self.waiting.lock().unwrap();
        self.cv.notify_all();
    }

    fn wait_for_reader(&self) {
        let mut w = self.waiting.lock().unwrap();
        while *w == 0 {
            let (g, timeout) = self.cv.wait_timeout(w, Duration::from_secs(10)).unwrap();
            assert!(!timeout.timed_out(), "no read reached the device");
            w = g;
        }
    }
}

impl BlockDevice for GatedDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        let mut w = self.waiting.lock().unwrap();
        *w += 1;
        self.cv.notify_all();
        while self.closed.load(Ordering::SeqCst) {
            w = self.cv.wait(w).unwrap();
        }
        *w -= 1;
        drop(w);
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, off)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[test]
fn finishing_a_read_holds_no_store_lock_while_the_device_is_slow() {
    let dev = Arc::new(GatedDevice {
        inner: MemDevice::new("data0", 8 << 20),
        closed: AtomicBool::new(false),
        waiting: Mutex::new(0),
        cv: Condvar::new(),
    });
    let devs = Devices {
        data: vec![dev.clone() as Arc<dyn BlockDevice>],
        wal: None,
    };
    Store::mkfs(&devs, &no_cache()).unwrap();
    let s = Arc::new(Store::open(&devs, no_cache()).unwrap());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    write_flushed(&s, b"cold", &[5; 4096]);

    dev.closed.store(true, Ordering::SeqCst);
    let plan = s.plan_read(1, b"cold", 0, 4096).unwrap();
    let reader = {
        let s = s.clone();
        std::thread::spawn(move || s.finish_read(plan))
    };
    dev.wait_for_reader();
    // While that read waits in the device, the store commits and serves from memory.
    let mut t = Transaction::new();
    t.write(1, b"hot", 0, &[6; 4096]);
    s.commit(&t).unwrap();
    let hot = s.plan_read(1, b"hot", 0, 4096).unwrap();
    assert!(!hot.needs_device());
    assert_eq!(s.finish_read(hot).unwrap(), vec![6; 4096]);
    assert!(
        !reader.is_finished(),
        "the device read is still held at the gate"
    );

    dev.open();
    assert_eq!(reader.join().unwrap().unwrap(), vec![5; 4096]);
}

/// Whether a read of `name` was answered from the read cache (hits counted before and after).
fn read_hits(s: &Store, name: &[u8], len: u64) -> bool {
    let before = s.stats().read_cache.hits;
    s.read(1, name, 0, len).unwrap();
    s.stats().read_cache.hits > before
}

#[test]
fn a_replicas_copies_stay_out_of_the_read_cache_and_a_primarys_enter_it() {
    let cfg = StoreConfig {
        read_cache_bytes: 1 << 20,
        direct_write_min_bytes: 64 << 10,
        ..small_cfg()
    };
    let s = MemDevs::new(1, 8 << 20, None).mkfs_open(cfg);
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    // Small writes (through the WAL and the flusher) and large ones (written once).
    for (name, len) in [(&b"small"[..], 8192usize), (&b"large"[..], 128 << 10)] {
        let mut t = Transaction::new();
        t.write(1, name, 0, &vec![1; len]);
        s.commit(&t).unwrap();
        let mut t = Transaction::new();
        t.write(1, &[name, b"-copy"].concat(), 0, &vec![2; len]);
        t.replica_copy();
        s.commit(&t).unwrap();
    }
    s.checkpoint().unwrap();
    assert_eq!(s.stats().pending_bytes, 0, "everything is on the device");
    assert!(
        read_hits(&s, b"small", 8192),
        "a primary's flushed write is cached"
    );
    assert!(
        read_hits(&s, b"large", 128 << 10),
        "and so is its large write"
    );
    assert!(
        !read_hits(&s, b"small-copy", 8192),
        "a replica's copy is not"
    );
    assert!(!read_hits(&s, b"large-copy", 128 << 10));
    // Read once, the copy is cached like any data read.
    assert!(read_hits(&s, b"small-copy", 8192));
}

#[test]
fn blocks_the_cleaner_moves_stay_cached_if_they_were() {
    let cfg = StoreConfig {
        read_cache_bytes: 1 << 20,
        clean_below_free_segments: 1000,
        ..small_cfg()
    };
    let s = MemDevs::new(1, 8 << 20, None).mkfs_open(cfg);
    let mut t = Transaction::new();
    t.create_collection(1).write(1, b"read", 0, &[3; 4096]);
    t.write(1, b"unread", 0, &[4; 4096]);
    t.replica_copy();
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    assert!(
        !read_hits(&s, b"read", 4096),
        "a replica's copy, read from the device"
    );
    assert!(read_hits(&s, b"read", 4096), "then cached");
    // Rewrites fill segments with garbage; cleaning (always on here) moves both objects'
    // blocks several times.
    let cleaned = s.stats().segments_cleaned;
    for i in 0..400u32 {
        let mut t = Transaction::new();
        t.write(1, b"churn", 0, &[(i % 251) as u8; 65536]);
        t.replica_copy();
        s.commit(&t).unwrap();
    }
    // The cleaner runs on the maintenance thread once no checkpoint is due: the commits,
    // which fill the 1 MiB WAL every few writes, may all be done before it gets a turn.
    let start = std::time::Instant::now();
    while s.stats().segments_cleaned <= cleaned {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "the cleaner never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    s.checkpoint().unwrap();
    assert!(read_hits(&s, b"read", 4096), "moved and still cached");
    assert!(
        !read_hits(&s, b"unread", 4096),
        "moved, and not cached for it"
    );
}
