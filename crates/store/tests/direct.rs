//! Large writes written once: whole-block writes above `direct_write_min_bytes` go straight to
//! the data devices and only their metadata through the WAL. These tests check that path
//! directly, including the two crash cases it adds: data written but its record not, and a
//! record durable over data the device lost or damaged.

mod common;

use cairn_store::fault::{CrashMode, Power};
use cairn_store::{BlockDevice, SharedBytes, Store, StoreConfig, StoreError, Transaction};
use common::{small_cfg, MemDevs};

const MIB: usize = 1 << 20;

fn cfg() -> StoreConfig {
    StoreConfig {
        direct_write_min_bytes: 64 * 1024,
        pending_limit_bytes: 4 << 20,
        ..small_cfg()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed ^ (i >> 12) as u8)
        .collect()
}

fn write(s: &Store, obj: &[u8], off: u64, data: &[u8]) -> Result<u64, StoreError> {
    let mut t = Transaction::new();
    t.write(1, obj, off, data).kv_set(1, b"last", obj);
    s.commit(&t)
}

/// `data` in a shared buffer, placed at `misalign` bytes past a 4 KiB boundary in memory.
fn placed(data: &[u8], misalign: usize) -> SharedBytes {
    let mut v = Vec::with_capacity(data.len() + 2 * 4096);
    let pad = (4096 - v.as_ptr() as usize % 4096) % 4096 + misalign;
    v.resize(pad, 0);
    v.extend_from_slice(data);
    let s = SharedBytes::new(v).slice(pad..pad + data.len()).unwrap();
    assert_eq!(s.as_ptr() as usize % 4096, misalign);
    s
}

#[test]
fn an_aligned_payload_is_written_from_where_it_is_and_any_other_is_copied_first() {
    // The data device fails writes from buffers not 4 KiB-aligned in memory, as a disk
    // opened with O_DIRECT may: the unaligned payloads below must go through a copy.
    let devs = MemDevs::new(1, 64 << 20, Some(4 << 20));
    let s = devs.mkfs_open(cfg());
    s.commit(Transaction::new().create_collection(1)).unwrap();
    let (a, b) = (pattern(MIB, 3), pattern(256 * 1024, 4));
    let mut t = Transaction::new();
    t.write_shared(1, b"aligned", 0, placed(&a, 0));
    s.commit(&t).unwrap();
    assert_eq!(
        s.stats().direct_staged_bytes,
        0,
        "an aligned payload was copied"
    );
    for (i, misalign) in [1, 16, 512].into_iter().enumerate() {
        let mut t = Transaction::new();
        t.write_shared(1, b"unaligned", i as u64 * MIB as u64, placed(&b, misalign));
        s.commit(&t).unwrap();
    }
    let st = s.stats();
    assert_eq!(
        (st.direct_writes, st.direct_staged_bytes),
        (4, 3 * b.len() as u64)
    );
    drop(s);
    let s = Store::open(&devs.devices(), cfg()).unwrap();
    assert_eq!(s.read(1, b"aligned", 0, MIB as u64).unwrap(), a);
    for i in 0..3u64 {
        let got = s
            .read(1, b"unaligned", i * MIB as u64, b.len() as u64)
            .unwrap();
        assert!(got == b, "unaligned payload {i} read back wrong");
    }
}

#[test]
fn large_writes_skip_the_wal_and_survive_a_crash() {
    let devs = MemDevs::new(1, 64 << 20, Some(4 << 20));
    let s = devs.mkfs_open(cfg());
    s.commit(Transaction::new().create_collection(1)).unwrap();
    let wal_before = s.stats().wal_io.write_bytes;
    let data = pattern(MIB, 1);
    write(&s, b"big", 4096, &data).unwrap();
    // A small write keeps the WAL path.
    write(&s, b"small", 0, &pattern(8192, 2)).unwrap();
    let st = s.stats();
    assert_eq!((st.direct_writes, st.direct_bytes), (1, MIB as u64));
    let wal_bytes = st.wal_io.write_bytes - wal_before;
    assert!(
        wal_bytes < 64 * 1024,
        "the WAL took {wal_bytes} bytes for a 1 MiB direct write and an 8 KiB one"
    );
    // On the data device at once, not pending for the flusher.
    assert!(s.block_location(1, b"big", 1).is_some());
    assert!(s.block_location(1, b"big", 256).is_some());
    assert_eq!(s.read(1, b"big", 4096, MIB as u64).unwrap(), data);
    assert_eq!(s.read(1, b"big", 0, 4096).unwrap(), vec![0; 4096]);
    // Power cut right after the commits: everything unflushed is lost.
    drop(s);
    let s = Store::open(&devs.devices(), cfg()).unwrap();
    assert_eq!(s.read(1, b"big", 4096, MIB as u64).unwrap(), data);
    assert_eq!(s.read(1, b"small", 0, 8192).unwrap(), pattern(8192, 2));
    s.check_space_accounting().unwrap();
    // Overwrite part of it both ways, then again after a checkpoint and reopen.
    let over = pattern(256 * 1024, 3);
    write(&s, b"big", 4096 + 128 * 1024, &over).unwrap();
    write(&s, b"big", 4096, &pattern(4096, 4)).unwrap();
    let mut want = data.clone();
    want[128 * 1024..384 * 1024].copy_from_slice(&over);
    want[..4096].copy_from_slice(&pattern(4096, 4));
    assert_eq!(s.read(1, b"big", 4096, MIB as u64).unwrap(), want);
    s.checkpoint().unwrap();
    s.close().unwrap();
    let s = Store::open(&devs.devices(), cfg()).unwrap();
    assert_eq!(s.read(1, b"big", 4096, MIB as u64).unwrap(), want);
    assert!(s.scrub().issues.is_empty());
    s.check_space_accounting().unwrap();
}

/// The power fails after the data of a direct write is flushed but before its WAL record is:
/// the write was never acknowledged, the object keeps its old contents, and the blocks it
/// took are free again (the device fills up to the same point as before).
#[test]
fn data_written_but_not_logged_is_invisible_and_its_space_comes_back() {
    let devs = MemDevs::new(1, 24 << 20, Some(16 << 20));
    Store::mkfs(&devs.devices(), &cfg()).unwrap();
    let power = Power::new();
    let (fdevs, faults) = devs.faulty(&power);
    let s = Store::open(&fdevs, cfg()).unwrap();
    s.commit(Transaction::new().create_collection(1)).unwrap();
    let old = pattern(MIB, 5);
    write(&s, b"o", 0, &old).unwrap();
    s.checkpoint().unwrap();
    // The direct write's data flush is the first flush, its WAL flush the second.
    power.cut_at_flush(2);
    let r = write(&s, b"o", 0, &pattern(MIB, 6));
    assert!(
        r.is_err(),
        "a write whose record was not durable was acknowledged"
    );
    for f in &faults {
        f.crash(CrashMode::LoseAll, &mut || 0).unwrap();
    }
    drop(s);
    let s = Store::open(&devs.devices(), cfg()).unwrap();
    assert_eq!(s.read(1, b"o", 0, MIB as u64).unwrap(), old);
    assert_eq!(s.kv_get(1, b"last").unwrap().unwrap(), b"o");
    s.check_space_accounting().unwrap();
    let st = s.stats();
    assert_eq!(
        st.live_bytes + st.pending_bytes,
        MIB as u64,
        "the unlogged write's blocks are still counted"
    );
    // Fill the device: it takes as much as a store that never saw the lost write.
    let mut n = 0u64;
    loop {
        match write(&s, format!("fill{n}").as_bytes(), 0, &pattern(MIB, 7)) {
            Ok(_) => n += 1,
            Err(StoreError::NoSpace { .. }) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    let st = s.stats();
    assert!(
        st.writable_bytes - st.used_bytes < 2 * MIB as u64,
        "stopped at {n} MiB with {} of {} bytes used",
        st.used_bytes,
        st.writable_bytes
    );
    s.check_space_accounting().unwrap();
}

/// A record durable over placed data the device lost or damaged (a device that acknowledged
/// a flush it did not do, or rot): reads fail with the object and block named, never return
/// wrong bytes, and scrub reports the block.
#[test]
fn placed_blocks_damaged_on_the_device_are_detected() {
    let devs = MemDevs::new(1, 32 << 20, Some(4 << 20));
    let s = devs.mkfs_open(cfg());
    s.commit(Transaction::new().create_collection(1)).unwrap();
    write(&s, b"o", 0, &pattern(MIB, 8)).unwrap();
    let off = s.block_location(1, b"o", 100).unwrap();
    drop(s);
    // Tear the block: its second half never reached the device.
    let mut blk = cairn_store::AlignedBuf::zeroed(4096);
    devs.data[0].read_at(&mut blk, off).unwrap();
    blk[2048..].fill(0);
    devs.data[0].write_at(&blk, off).unwrap();
    let s = Store::open(&devs.devices(), cfg()).unwrap();
    match s.read(1, b"o", 100 * 4096, 4096) {
        Err(StoreError::CorruptData { object, block, .. }) => {
            assert_eq!((object.as_str(), block), ("o", 100))
        }
        r => panic!("read of a torn placed block gave {r:?}"),
    }
    assert_eq!(
        s.read(1, b"o", 0, 100 * 4096).unwrap(),
        pattern(MIB, 8)[..100 * 4096]
    );
    let rep = s.scrub();
    assert_eq!(rep.issues.len(), 1, "{:?}", rep.issues);
}

/// The committing thread does no device I/O for a large write: `submit` applies it with the
/// data in memory (reads see it at once), and the thread that writes the WAL batch writes the
/// data, flushes the data device and only then the record.
#[test]
fn submit_does_no_device_io_and_the_batch_writes_the_data() {
    let devs = MemDevs::new(1, 32 << 20, Some(4 << 20));
    let s = devs.mkfs_open(cfg());
    s.commit(Transaction::new().create_collection(1)).unwrap();
    let before = s.stats();
    let data = pattern(MIB, 9);
    let mut t = Transaction::new();
    t.write(1, b"o", 0, &data);
    let seq = s.submit(&t).unwrap();
    let mid = s.stats();
    assert_eq!(
        mid.data_io.writes, before.data_io.writes,
        "submit wrote the data device"
    );
    assert_eq!(mid.data_io.flushes, before.data_io.flushes);
    assert_eq!(s.read(1, b"o", 0, MIB as u64).unwrap(), data);
    assert!(
        s.block_location(1, b"o", 0).is_none(),
        "on the device before its batch"
    );
    // An overwrite of part of it before the batch: the older blocks it hides are freed when
    // the batch has written them.
    let mut t = Transaction::new();
    t.write(1, b"o", 64 * 1024, &pattern(64 * 1024, 10));
    let seq2 = s.submit(&t).unwrap();
    s.sync_through(seq.max(seq2)).unwrap();
    let after = s.stats();
    assert!(after.data_io.writes > mid.data_io.writes);
    assert!(after.data_io.flushes > mid.data_io.flushes);
    assert!(s.block_location(1, b"o", 0).is_some());
    let mut want = data.clone();
    want[64 * 1024..128 * 1024].copy_from_slice(&pattern(64 * 1024, 10));
    assert_eq!(s.read(1, b"o", 0, MIB as u64).unwrap(), want);
    s.check_space_accounting().unwrap();
    // The 64 KiB the overwrite hid were freed once written; the overwrite took 64 KiB.
    assert_eq!(after.live_bytes, MIB as u64);
    drop(s);
    let s = Store::open(&devs.devices(), cfg()).unwrap();
    assert_eq!(s.read(1, b"o", 0, MIB as u64).unwrap(), want);
    s.check_space_accounting().unwrap();
}

/// Direct writes submitted without a sync hold their data in memory until a batch writes it:
/// past the pending limit (4 MiB here) the submitting thread writes the queued batch itself
/// instead of queueing more, and everything stays readable and durable.
#[test]
fn queued_direct_writes_are_bounded_and_written_by_the_submitter() {
    let devs = MemDevs::new(1, 64 << 20, Some(8 << 20));
    let s = devs.mkfs_open(cfg());
    s.commit(Transaction::new().create_collection(1)).unwrap();
    let before = s.stats();
    let mut last = 0;
    for i in 0..8u8 {
        let mut t = Transaction::new();
        t.write(1, format!("q{i}").as_bytes(), 0, &pattern(MIB, 20 + i));
        last = s.submit(&t).unwrap();
    }
    let mid = s.stats();
    assert!(
        mid.data_io.writes > before.data_io.writes,
        "8 MiB of direct writes were queued in memory without a batch writing any of them"
    );
    s.sync_through(last).unwrap();
    for i in 0..8u8 {
        let name = format!("q{i}");
        assert_eq!(
            s.read(1, name.as_bytes(), 0, MIB as u64).unwrap(),
            pattern(MIB, 20 + i)
        );
    }
    s.check_space_accounting().unwrap();
    drop(s);
    let s = Store::open(&devs.devices(), cfg()).unwrap();
    for i in 0..8u8 {
        let name = format!("q{i}");
        assert_eq!(
            s.read(1, name.as_bytes(), 0, MIB as u64).unwrap(),
            pattern(MIB, 20 + i)
        );
    }
}

/// Directly written blocks enter the read cache as flushed ones do: reading them back right
/// after the write does not go to the device.
#[test]
fn directly_written_blocks_are_read_from_the_cache() {
    let devs = MemDevs::new(1, 64 << 20, Some(4 << 20));
    let cfg = StoreConfig {
        read_cache_bytes: 4 << 20,
        ..cfg()
    };
    let s = devs.mkfs_open(cfg);
    s.commit(Transaction::new().create_collection(1)).unwrap();
    let data = pattern(MIB, 9);
    write(&s, b"big", 0, &data).unwrap();
    assert_eq!(s.stats().direct_writes, 1);
    let before = s.stats();
    assert_eq!(s.read(1, b"big", 0, MIB as u64).unwrap(), data);
    let after = s.stats();
    assert!(after.read_cache.hits > before.read_cache.hits);
    assert_eq!(
        after.data_io.read_bytes, before.data_io.read_bytes,
        "a block of the write was read from the device"
    );
}
