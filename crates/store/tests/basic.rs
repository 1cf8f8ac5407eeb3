//! Functional tests of the store API on in-memory and file devices.

mod common;

use cairn_store::{Devices, FileDevice, Store, StoreConfig, StoreError, Transaction};
use common::{small_cfg, MemDevs};
use std::sync::Arc;

#[test]
fn write_read_all_ops_and_reopen() {
    let devs = MemDevs::new(1, 8 << 20, None);
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1)
        .write(1, b"a", 0, &[1u8; 10_000])
        .write(1, b"a", 5, b"hello")
        .set_attr(1, b"a", b"color", b"blue")
        .kv_set(1, b"log.0001", b"entry1")
        .kv_set(1, b"log.0002", b"entry2")
        .kv_set(1, b"info", b"x")
        .touch(1, b"empty");
    s.commit(&t).unwrap();
    let check = |s: &Store| {
        let a = s.read(1, b"a", 0, 20_000).unwrap();
        assert_eq!(a.len(), 10_000);
        assert_eq!(&a[..5], &[1; 5]);
        assert_eq!(&a[5..10], b"hello");
        assert_eq!(&a[10..], &[1u8; 9990][..]);
        assert_eq!(s.get_attr(1, b"a", b"color").unwrap().unwrap(), b"blue");
        let log = s.kv_range(1, b"log.", Some(b"log/"), 10).unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(s.stat(1, b"empty").unwrap().size, 0);
        assert_eq!(
            s.list_objects(1, None, 10).unwrap(),
            vec![b"a".to_vec(), b"empty".to_vec()]
        );
        assert_eq!(
            s.list_objects(1, Some(b"a"), 10).unwrap(),
            vec![b"empty".to_vec()]
        );
    };
    check(&s);
    drop(s); // no clean shutdown: the WAL is replayed
    let s = Store::open(&devs.devices(), small_cfg()).unwrap();
    check(&s);
    s.checkpoint().unwrap();
    s.close().unwrap();
    let s = Store::open(&devs.devices(), small_cfg()).unwrap();
    check(&s);
    assert!(s.scrub().issues.is_empty());
}

#[test]
fn zero_truncate_remove_and_kv_range_removal() {
    let devs = MemDevs::new(1, 8 << 20, None);
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(7).write(7, b"o", 0, &[9u8; 5 * 4096]);
    for i in 0..10u8 {
        t.kv_set(7, &[b'k', i], &[i]);
    }
    s.commit(&t).unwrap();
    s.checkpoint().unwrap(); // the data is now on the data device
    let mut t = Transaction::new();
    t.zero(7, b"o", 100, 2 * 4096)
        .truncate(7, b"o", 4 * 4096 + 10)
        .kv_rm_range(7, &[b'k', 2], &[b'k', 8]);
    s.commit(&t).unwrap();
    let d = s.read(7, b"o", 0, u64::MAX).unwrap();
    assert_eq!(d.len(), 4 * 4096 + 10);
    assert!(d[..100].iter().all(|&b| b == 9));
    assert!(d[100..100 + 2 * 4096].iter().all(|&b| b == 0));
    assert!(d[100 + 2 * 4096..].iter().all(|&b| b == 9));
    // Extending after a truncate reads zeros in the gap, not old bytes.
    let mut t = Transaction::new();
    t.truncate(7, b"o", 10).write(7, b"o", 8000, b"z");
    s.commit(&t).unwrap();
    let d = s.read(7, b"o", 0, u64::MAX).unwrap();
    assert_eq!(d.len(), 8001);
    assert!(d[..10].iter().all(|&b| b == 9) && d[10..8000].iter().all(|&b| b == 0));
    assert_eq!(s.kv_range(7, b"", None, 100).unwrap().len(), 4);
    let mut t = Transaction::new();
    t.remove(7, b"o");
    s.commit(&t).unwrap();
    assert!(matches!(
        s.read(7, b"o", 0, 1),
        Err(StoreError::NoObject { .. })
    ));
    let mut t = Transaction::new();
    t.remove_collection(7);
    s.commit(&t).unwrap();
    assert!(!s.collection_exists(7));
}

#[test]
fn failed_transaction_applies_nothing() {
    let devs = MemDevs::new(1, 8 << 20, None);
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1).write(1, b"x", 0, b"before");
    s.commit(&t).unwrap();
    let mut t = Transaction::new();
    t.write(1, b"x", 0, b"after!")
        .write(2, b"y", 0, b"no such collection");
    assert!(matches!(s.commit(&t), Err(StoreError::NoCollection(2))));
    let mut t = Transaction::new();
    t.create_collection(1);
    assert!(matches!(s.commit(&t), Err(StoreError::CollectionExists(1))));
    let mut t = Transaction::new();
    t.write(1, &[b'n'; 2000], 0, b"name too long");
    assert!(matches!(s.commit(&t), Err(StoreError::TooLarge { .. })));
    let mut t = Transaction::new();
    t.write(1, b"x", u64::MAX - 1, b"overflow");
    assert!(matches!(s.commit(&t), Err(StoreError::TooLarge { .. })));
    assert_eq!(s.read(1, b"x", 0, 100).unwrap(), b"before");
}

#[test]
fn full_device_is_enospc_and_space_comes_back() {
    let devs = MemDevs::new(1, 4 << 20, None);
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut written = 0;
    let err = loop {
        let mut t = Transaction::new();
        t.write(1, format!("o{written}").as_bytes(), 0, &chunk);
        match s.commit(&t) {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
        s.check_space_accounting().unwrap();
        assert!(written < 1000, "the device never filled up");
    };
    assert!(matches!(err, StoreError::NoSpace { .. }), "{err}");
    assert!(written > 10);
    // Everything acknowledged is intact, after a restart too.
    for i in 0..written {
        assert_eq!(
            s.read(1, format!("o{i}").as_bytes(), 0, 1 << 20).unwrap(),
            chunk,
            "object {i}"
        );
    }
    drop(s);
    let s = Store::open(&devs.devices(), small_cfg()).unwrap();
    for i in 0..written {
        assert_eq!(
            s.read(1, format!("o{i}").as_bytes(), 0, 1 << 20).unwrap(),
            chunk,
            "object {i}"
        );
    }
    // Removing data makes room again (after the cleaner and a checkpoint).
    let mut t = Transaction::new();
    for i in 0..written / 2 {
        t.remove(1, format!("o{i}").as_bytes());
    }
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    s.checkpoint().unwrap();
    let mut t = Transaction::new();
    t.write(1, b"again", 0, &chunk);
    s.commit(&t).unwrap();
    assert!(s.scrub().issues.is_empty());
}

#[test]
fn overwrites_are_cleaned_and_data_survives() {
    let devs = MemDevs::new(1, 4 << 20, None);
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    let mut rng = common::Rng(42);
    let mut model = vec![vec![0u8; 256 * 1024]; 6];
    // Random 4 KiB writes over a 1.5 MiB working set on a ~3 MiB segment area, ~10x over.
    for i in 0..10 * 6 * 64 {
        let o = rng.below(6) as usize;
        let data = vec![(i % 251) as u8; 4096];
        let off = (rng.below(64) * 4096) as usize;
        model[o][off..off + data.len()].copy_from_slice(&data);
        let mut t = Transaction::new();
        t.write(1, format!("o{o}").as_bytes(), off as u64, &data);
        s.commit(&t).unwrap();
        s.check_space_accounting().unwrap();
    }
    let st = s.stats();
    assert!(st.segments_cleaned > 0, "the cleaner never ran: {st:?}");
    for (o, m) in model.iter().enumerate() {
        let got = s
            .read(1, format!("o{o}").as_bytes(), 0, m.len() as u64)
            .unwrap();
        assert!(got == m[..got.len()], "object {o} differs");
    }
    drop(s);
    let s = Store::open(&devs.devices(), small_cfg()).unwrap();
    for (o, m) in model.iter().enumerate() {
        let got = s
            .read(1, format!("o{o}").as_bytes(), 0, m.len() as u64)
            .unwrap();
        assert!(got == m[..got.len()], "object {o} differs after reopen");
    }
    assert!(s.scrub().issues.is_empty());
}

#[test]
fn a_sequential_overwrite_is_made_room_for_by_checkpoints_not_by_cleaning() {
    // A volume's object written in large writes, then dotted with 4 KiB overwrites (every
    // segment of it keeps a dead block, so each is a cleaning candidate), then overwritten
    // again from start to end: the segments the sweep empties wait in limbo for a checkpoint,
    // and the store must take one rather than copy the nearly full segments it could clean.
    let cfg = StoreConfig {
        direct_write_min_bytes: 64 * 1024,
        // Room for a large write to take the WAL path when segments run short.
        pending_limit_bytes: 4 << 20,
        wal_size: 8 << 20,
        checkpoint_interval: std::time::Duration::from_secs(600),
        ..small_cfg()
    };
    let devs = MemDevs::new(1, 96 << 20, None);
    let s = devs.mkfs_open(cfg);
    s.commit(Transaction::new().create_collection(1)).unwrap();
    const MIB: u64 = 1 << 20;
    let size = 64 * MIB;
    let sweep = |seed: u8| {
        for off in (0..size).step_by(MIB as usize) {
            let mut t = Transaction::new();
            t.write(
                1,
                b"volume",
                off,
                &vec![seed ^ (off / MIB) as u8; MIB as usize],
            );
            s.commit(&t).unwrap();
        }
    };
    sweep(1);
    for off in (0..size).step_by(64 * 1024) {
        let mut t = Transaction::new();
        t.write(1, b"volume", off + 4096, &[0xEE; 4096]);
        s.commit(&t).unwrap();
    }
    s.checkpoint().unwrap();
    let before = s.stats();
    let segments_swept = (size / (64 * 1024)) as u32;
    assert!(
        segments_swept > 3 * before.segments_free,
        "the sweep must need room made several times over: {before:?}"
    );
    sweep(2);
    let after = s.stats();
    assert!(
        after.checkpoints > before.checkpoints,
        "no checkpoint released the swept segments: {after:?}"
    );
    assert_eq!(
        after.cleaned_bytes - before.cleaned_bytes,
        0,
        "the cleaner copied live blocks a checkpoint would have freed"
    );
    for off in (0..size).step_by(MIB as usize) {
        let got = s.read(1, b"volume", off, MIB).unwrap();
        assert!(
            got.iter().all(|&b| b == 2 ^ (off / MIB) as u8),
            "MiB {off} differs"
        );
    }
    s.check_space_accounting().unwrap();
}

#[test]
fn wrong_devices_are_refused_with_clear_errors() {
    let a = MemDevs::new(1, 4 << 20, None);
    let b = MemDevs::new(1, 4 << 20, None);
    Store::mkfs(&a.devices(), &small_cfg()).unwrap();
    let blank = MemDevs::new(1, 4 << 20, None);
    let e = Store::open(&blank.devices(), small_cfg()).err().unwrap();
    assert!(e.to_string().contains("bad magic"), "{e}");
    Store::mkfs(&b.devices(), &small_cfg()).unwrap();
    let mixed = Devices {
        data: vec![a.devices().data[0].clone(), b.devices().data[0].clone()],
        wal: None,
    };
    let e = Store::open(&mixed, small_cfg()).err().unwrap();
    assert!(e.to_string().contains("data device"), "{e}");
    // A store formatted with a WAL device needs it.
    let w = MemDevs::new(1, 4 << 20, Some(1 << 20));
    Store::mkfs(&w.devices(), &small_cfg()).unwrap();
    let no_wal = Devices {
        data: w.devices().data,
        wal: None,
    };
    let e = Store::open(&no_wal, small_cfg()).err().unwrap();
    assert!(e.to_string().contains("separate WAL device"), "{e}");
}

#[test]
fn corruption_is_reported_with_object_and_device_and_mirror_repairs_reads() {
    let devs = MemDevs::new(2, 8 << 20, Some(1 << 20));
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(3).write(3, b"obj", 0, &[5u8; 8192]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    drop(s);
    // Find the data block on device 0 and flip a bit in it.
    let power = cairn_store::fault::Power::new();
    let (fdevs, faults) = devs.faulty(&power);
    let s = Store::open(&fdevs, small_cfg()).unwrap();
    let off = find_block(&devs.data[0], &[5u8; 4096]).expect("data block on device 0");
    faults[0].flip_bit(off + 17, 3).unwrap();
    // The mirror copy serves the read; scrub names the bad device.
    assert_eq!(s.read(3, b"obj", 0, 8192).unwrap(), vec![5u8; 8192]);
    let rep = s.scrub();
    assert_eq!(rep.issues.len(), 1, "{rep:?}");
    assert!(rep.issues[0].device.contains("data0") && rep.issues[0].object == "obj");
    // Corrupt the other copy too: the read fails and names object and device.
    faults[1].flip_bit(off + 17, 3).unwrap();
    let e = s.read(3, b"obj", 0, 8192).unwrap_err();
    assert!(matches!(e, StoreError::CorruptData { .. }), "{e}");
    assert!(
        e.to_string().contains("obj") && e.to_string().contains("data"),
        "{e}"
    );
}

fn find_block(dev: &cairn_store::MemDevice, pattern: &[u8]) -> Option<u64> {
    use cairn_store::{AlignedBuf, BlockDevice};
    let mut b = AlignedBuf::zeroed(4096);
    (0..dev.size() / 4096).map(|i| i * 4096).find(|&off| {
        dev.read_at(&mut b, off).unwrap();
        &b[..] == pattern
    })
}

#[test]
fn file_devices_with_separate_wal() {
    let dir = std::env::temp_dir().join(format!("cairn-store-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let open = || Devices {
        data: vec![Arc::new(
            FileDevice::open(&dir.join("data0"), 16 << 20, "data0").unwrap(),
        )],
        wal: Some(Arc::new(
            FileDevice::open(&dir.join("wal"), 4 << 20, "wal").unwrap(),
        )),
    };
    Store::mkfs(&open(), &small_cfg()).unwrap();
    let s = Store::open(&open(), small_cfg()).unwrap();
    let mut t = Transaction::new();
    t.create_collection(1)
        .write(1, b"f", 4096, &[3u8; 4096 * 3]);
    s.commit(&t).unwrap();
    s.close().unwrap();
    let s = Store::open(&open(), small_cfg()).unwrap();
    let d = s.read(1, b"f", 0, 1 << 20).unwrap();
    assert_eq!(d.len(), 4 * 4096);
    assert!(d[..4096].iter().all(|&b| b == 0) && d[4096..].iter().all(|&b| b == 3));
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_commits_share_wal_flushes() {
    let mem = MemDevs::new(1, 16 << 20, Some(4 << 20));
    let power = cairn_store::fault::Power::new();
    let (devs, faults) = mem.faulty(&power);
    Store::mkfs(&devs, &small_cfg()).unwrap();
    let s = Arc::new(Store::open(&devs, small_cfg()).unwrap());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    // A slow WAL flush: commits arriving meanwhile must ride on the next one.
    faults[1].set_flush_delay(std::time::Duration::from_millis(2));
    let before = s.stats();
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                for j in 0..20u32 {
                    let mut t = Transaction::new();
                    t.write(
                        1,
                        format!("t{i}").as_bytes(),
                        j as u64 * 4096,
                        &[i as u8; 4096],
                    );
                    s.commit(&t).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let after = s.stats();
    let commits = after.commits - before.commits;
    let flushes = after.wal_io.flushes - before.wal_io.flushes;
    assert_eq!(commits, 320);
    assert!(
        flushes * 3 < commits,
        "{flushes} WAL flushes for {commits} commits"
    );
}

#[test]
fn commits_do_no_data_device_io_and_unflushed_data_is_read_from_memory() {
    let mem = MemDevs::new(1, 16 << 20, Some(4 << 20));
    let power = cairn_store::fault::Power::new();
    let (devs, faults) = mem.faulty(&power);
    let mut cfg = small_cfg();
    cfg.flush_max_delay = std::time::Duration::from_secs(60);
    cfg.flush_batch_bytes = 8 << 20;
    cfg.pending_limit_bytes = 8 << 20;
    cfg.checkpoint_interval = std::time::Duration::from_secs(3600);
    Store::mkfs(&devs, &cfg).unwrap();
    let s = Store::open(&devs, cfg).unwrap();
    // Every data-device write and flush now fails: commits must not notice.
    faults[0].set_failures(true, true, true);
    let before = s.stats().data_io;
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    for i in 0..50u64 {
        let mut t = Transaction::new();
        t.write(1, b"o", i * 4096, &[i as u8; 4096]);
        s.commit(&t).unwrap();
    }
    for i in 0..50u64 {
        assert_eq!(
            s.read(1, b"o", i * 4096, 4096).unwrap(),
            vec![i as u8; 4096]
        );
    }
    let after = s.stats().data_io;
    assert_eq!(after, before, "the data devices were touched");
    assert!(s.failure().is_none());
    // The failure surfaces once background work needs the device: writes stop, loudly.
    s.checkpoint().unwrap_err();
    let mut t = Transaction::new();
    t.write(1, b"o", 0, b"x");
    assert!(matches!(s.commit(&t), Err(StoreError::Failed(_))));
}

#[test]
fn reformatted_devices_open_empty() {
    let devs = MemDevs::new(1, 8 << 20, None);
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    for i in 0..40u64 {
        let mut t = Transaction::new();
        t.write(1, b"o", i * 4096, &[1u8; 4096]);
        s.commit(&t).unwrap();
    }
    drop(s);
    // The old store's WAL records are still in the ring: they must not be replayed or taken
    // for damage in the new store's log.
    let s = devs.mkfs_open(small_cfg());
    assert!(s.list_collections().is_empty());
    drop(s);
    let s = Store::open(&devs.devices(), small_cfg()).unwrap();
    assert!(s.list_collections().is_empty());
}

#[test]
fn overwriting_own_new_data_in_one_transaction_keeps_exact_accounting() {
    let s = MemDevs::new(1, 8 << 20, None).mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1)
        .write(1, b"a", 0, b"x")
        .write(1, b"a", 1, b"y");
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    let st = s.stats();
    assert_eq!((st.live_bytes, st.pending_bytes), (4096, 0));
    assert_eq!(s.read(1, b"a", 0, 10).unwrap(), b"xy");
}

#[test]
fn cleaner_moves_blocks_of_overlapping_summaries() {
    let cfg = cairn_store::StoreConfig {
        clean_below_free_segments: 1000,
        ..small_cfg()
    };
    let s = MemDevs::new(1, 8 << 20, None).mkfs_open(cfg);
    let mut t = Transaction::new();
    t.create_collection(1).write(1, b"o", 0, &[1; 8192]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    let mut t = Transaction::new();
    t.write(1, b"o", 0, &[2; 16384]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    let mut t = Transaction::new();
    t.write(1, b"filler", 0, &[3; 65536]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    assert_eq!(s.read(1, b"o", 0, 1 << 20).unwrap(), vec![2; 16384]);
    assert!(s.failure().is_none());
    s.check_space_accounting().unwrap();
}

#[test]
fn scrub_checks_checkpoint_copies() {
    let devs = MemDevs::new(2, 8 << 20, Some(1 << 20));
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1);
    t.kv_set(1, b"checkpoint-marker", &[0xAB; 3000]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    assert!(s.scrub().issues.is_empty());
    // Damage the checkpoint copy on data device 1 (it holds the collection entry).
    let power = cairn_store::fault::Power::new();
    let (_, faults) = devs.faulty(&power);
    let off = find_containing(&devs.data[1], &[0xAB; 64]).expect("checkpoint bytes on device 1");
    faults[1].flip_bit(off + 5, 1).unwrap();
    let rep = s.scrub();
    assert_eq!(rep.issues.len(), 1, "{rep:?}");
    assert_eq!(rep.issues[0].object, "<checkpoint>");
    assert!(rep.issues[0].device.contains("data1"));
}

fn find_containing(dev: &cairn_store::MemDevice, pattern: &[u8]) -> Option<u64> {
    use cairn_store::{AlignedBuf, BlockDevice};
    let mut b = AlignedBuf::zeroed(4096);
    (0..dev.size() / 4096).map(|i| i * 4096).find_map(|off| {
        dev.read_at(&mut b, off).unwrap();
        b.windows(pattern.len())
            .position(|w| w == pattern)
            .map(|p| off + p as u64)
    })
}

#[test]
fn reads_go_to_the_mirror_device_that_is_not_flushing() {
    use std::time::{Duration, Instant};
    let mem = MemDevs::new(2, 8 << 20, Some(1 << 20));
    let (devs, faults) = mem.passthrough_data();
    let mut cfg = small_cfg();
    cfg.checkpoint_interval = Duration::from_secs(3600);
    cfg.read_cache_bytes = 0; // this test is about which device reads go to
    Store::mkfs(&devs, &cfg).unwrap();
    let s = Arc::new(Store::open(&devs, cfg).unwrap());
    let mut t = Transaction::new();
    t.create_collection(1).write(1, b"o", 0, &[7u8; 16 * 4096]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap(); // the data is on both devices now
                             // Every flush now holds its device (reads wait) for 800 ms, one device after the other.
    for f in &faults {
        f.set_flush_delay(Duration::from_millis(800));
    }
    let ckpt = {
        let s = s.clone();
        std::thread::spawn(move || s.checkpoint())
    };
    for (flushing, dev) in faults.iter().enumerate() {
        let start = Instant::now();
        while !dev.is_flushing() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "device {flushing} never flushed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Reads during the flush are served by the other device: none waits for the flush.
        for _ in 0..20 {
            assert_eq!(s.read(1, b"o", 0, 16 * 4096).unwrap(), vec![7u8; 16 * 4096]);
            assert!(
                faults[flushing].is_flushing(),
                "a read waited behind the flush of device {flushing}"
            );
        }
    }
    ckpt.join().unwrap().unwrap();
    assert!(s.stats().data_io.reads >= 40);
}

#[test]
fn a_failing_mirror_device_is_read_around_and_io_errors_stay_io_errors() {
    let devs = MemDevs::new(2, 8 << 20, Some(1 << 20));
    let cfg = StoreConfig {
        read_cache_bytes: 0, // this test is about device reads
        ..small_cfg()
    };
    Store::mkfs(&devs.devices(), &cfg).unwrap();
    let power = cairn_store::fault::Power::new();
    let (fdevs, faults) = devs.faulty(&power);
    let s = Store::open(&fdevs, cfg).unwrap();
    let mut t = Transaction::new();
    t.create_collection(1).write(1, b"o", 0, &[4u8; 3 * 4096]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    // Every read of data device 0 fails: all reads, and a read-modify-write, use device 1.
    faults[0].set_failures(true, false, false);
    for _ in 0..8 {
        assert_eq!(s.read(1, b"o", 0, 1 << 20).unwrap(), vec![4u8; 3 * 4096]);
    }
    let mut t = Transaction::new();
    t.write(1, b"o", 10, b"rmw");
    s.commit(&t).unwrap();
    assert_eq!(&s.read(1, b"o", 8, 7).unwrap(), b"\x04\x04rmw\x04\x04");
    // Both devices failing is an I/O error naming a device, not a false corruption report.
    faults[1].set_failures(true, false, false);
    let e = s.read(1, b"o", 4096, 4096).unwrap_err();
    assert!(matches!(e, StoreError::Io { .. }), "{e}");
}

#[test]
fn submitted_transactions_are_visible_and_one_sync_makes_them_durable() {
    let devs = MemDevs::new(1, 8 << 20, Some(1 << 20));
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    let flushes = s.stats().wal_io.flushes;
    let mut last = 0;
    for i in 0..10u8 {
        let mut t = Transaction::new();
        t.write(1, &[b'o', i], 0, &[i; 4096]);
        last = s.submit(&t).unwrap();
        assert_eq!(
            s.read(1, &[b'o', i], 0, 1).unwrap(),
            vec![i],
            "visible before sync"
        );
    }
    assert_eq!(
        s.stats().wal_io.flushes,
        flushes,
        "submit alone writes nothing"
    );
    s.sync_through(last).unwrap();
    assert_eq!(
        s.stats().wal_io.flushes,
        flushes + 1,
        "one flush for the group"
    );
    // A sequence number never handed out does not hang.
    s.sync_through(last + 100).unwrap();
    drop(s);
    let s = Store::open(&devs.devices(), small_cfg()).unwrap();
    for i in 0..10u8 {
        assert_eq!(s.read(1, &[b'o', i], 0, 4096).unwrap(), vec![i; 4096]);
    }
}

#[test]
fn a_checkpoint_writes_records_submitted_without_a_waiter() {
    let devs = MemDevs::new(1, 8 << 20, Some(1 << 20));
    let s = Arc::new(devs.mkfs_open(small_cfg()));
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    let mut t = Transaction::new();
    t.write(1, b"queued", 0, &[5u8; 4096]);
    s.submit(&t).unwrap();
    // No thread waits for that record; the checkpoint's barrier must drain it itself.
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = s.clone();
    std::thread::spawn(move || tx.send(s2.checkpoint()).unwrap());
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("checkpoint hung on a submitted record");
    r.unwrap();
    drop(s);
    let s = Store::open(&devs.devices(), small_cfg()).unwrap();
    assert_eq!(s.read(1, b"queued", 0, 4096).unwrap(), vec![5u8; 4096]);
}

#[test]
fn flushed_data_is_read_from_the_cache_and_only_when_it_is_on() {
    for cache in [0u64, 1 << 20] {
        let devs = MemDevs::new(1, 8 << 20, Some(1 << 20));
        let cfg = StoreConfig {
            read_cache_bytes: cache,
            ..small_cfg()
        };
        let s = devs.mkfs_open(cfg);
        let mut t = Transaction::new();
        t.create_collection(1).write(1, b"o", 0, &[3u8; 8 * 4096]);
        s.commit(&t).unwrap();
        s.checkpoint().unwrap(); // flushed: the index points at the data device
        let before = s.stats().data_io.reads;
        for _ in 0..3 {
            assert_eq!(
                s.read(1, b"o", 4096, 4 * 4096).unwrap(),
                vec![3u8; 4 * 4096]
            );
        }
        let device_reads = s.stats().data_io.reads - before;
        if cache == 0 {
            assert_eq!(
                device_reads, 3,
                "without a cache every read goes to the device"
            );
        } else {
            assert_eq!(
                device_reads, 0,
                "blocks just flushed are served from the cache"
            );
            assert!(s.stats().read_cache.bytes >= 8 * 4096);
        }
    }
}

/// A whole-block write handed in as shared bytes is held by the store as it came (the index
/// points at the caller's buffer) until the flusher has written it to its place; a write that
/// covers part of a block is laid into whole blocks (a copy). Counts the holders of each
/// buffer: a holder that copied the bytes does not count.
#[test]
fn whole_block_writes_are_held_without_a_copy() {
    use cairn_store::SharedBytes;
    use std::time::Duration;
    let devs = MemDevs::new(1, 8 << 20, None);
    let cfg = StoreConfig {
        flush_batch_bytes: 1 << 20,
        pending_limit_bytes: 4 << 20,
        flush_max_delay: Duration::from_secs(3600),
        checkpoint_interval: Duration::from_secs(3600),
        ..small_cfg()
    };
    let s = devs.mkfs_open(cfg);
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    let whole = SharedBytes::new(vec![5u8; 3 * 4096]);
    let part = SharedBytes::new(vec![6u8; 100]);
    let mut t = Transaction::new();
    t.write_shared(1, b"whole", 4096, whole.clone())
        .write_shared(1, b"part", 10, part.clone());
    s.commit(&t).unwrap();
    drop(t);
    assert_eq!(whole.holders(), 2, "the store copied a whole-block payload");
    assert_eq!(
        part.holders(),
        1,
        "a partial block is laid into a new block buffer"
    );
    assert_eq!(s.read(1, b"whole", 4096, 3 * 4096).unwrap(), &whole[..]);
    assert_eq!(s.read(1, b"part", 10, 100).unwrap(), &part[..]);
    // The counters say the same: each block copied once into the WAL batch, and one block
    // built for the partial write.
    let c = s.stats().copies;
    assert_eq!(
        (
            c.wal_batch_bytes,
            c.partial_block_bytes,
            c.flush_staged_bytes
        ),
        (4 * 4096, 4096, 0),
        "{c:?}"
    );
    // Once written to its place, the store lets the buffer go.
    s.checkpoint().unwrap();
    assert_eq!(
        whole.holders(),
        1,
        "the store still holds the flushed payload"
    );
    assert_eq!(s.read(1, b"whole", 4096, 3 * 4096).unwrap(), &whole[..]);
    let c = s.stats().copies;
    assert_eq!(
        (c.wal_batch_bytes, c.flush_staged_bytes),
        (4 * 4096, 4 * 4096),
        "the flusher copies each block once into its staging buffer: {c:?}"
    );
}

/// The tiers of a full store: a primary stops admitting data while copies of admitted writes
/// (`replicated`) still fit, small metadata fits after that, and a replicated copy of metadata
/// uses the last of it. Each refusal applies nothing.
#[test]
fn a_full_store_keeps_headroom_for_copies_of_admitted_writes() {
    // Large enough that each tier (an eighth of the 5% reserve) is larger than the checkpoint
    // room growing by two segments as objects are added.
    let devs = MemDevs::new(1, 64 << 20, None);
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    let chunk = vec![3u8; 64 * 1024];
    let small = vec![4u8; 4096];
    let mut n = 0;
    let mut put = |replicated: bool, metadata: bool| {
        let mut t = Transaction::new();
        let data = if metadata { &small } else { &chunk };
        t.write(1, format!("o{n}").as_bytes(), 0, data);
        if replicated {
            t.replicated();
        }
        if metadata {
            t.use_reserve();
        }
        n += 1;
        s.commit(&t).map(|_| ())
    };
    let fill = |put: &mut dyn FnMut() -> Result<(), StoreError>| {
        let mut count = 0;
        loop {
            match put() {
                Ok(()) => count += 1,
                Err(StoreError::NoSpace { .. }) => return count,
                Err(e) => panic!("{e}"),
            }
            assert!(count < 1000, "never filled");
        }
    };
    let admitted = fill(&mut || {
        s.admits(chunk.len() as u64, false)?;
        put(false, false)
    });
    assert!(admitted > 10, "{admitted}");
    assert!(s.admits(chunk.len() as u64, false).is_err());
    // Copies of data admitted elsewhere still fit: half the reserve.
    let copies = fill(&mut || put(true, false));
    assert!(copies > 0, "no headroom for copies");
    // Metadata a primary admits: most of the rest; then its copies, the last of it.
    assert!(s.admits(4096, true).is_ok());
    let meta = fill(&mut || {
        s.admits(4096, true)?;
        put(false, true)
    });
    assert!(meta > 0, "no room for metadata");
    let meta_copies = fill(&mut || put(true, true));
    assert!(meta_copies > 0, "no headroom for copies of metadata");
    let (data_room, meta_room) = s.admissible_bytes();
    assert!(
        data_room == 0 && meta_room < 4096,
        "{data_room} {meta_room}"
    );
    s.check_space_accounting().unwrap();
}

/// Overwritten data leaves the read cache when it dies, not when it ages out: the cache of a
/// store whose few blocks are rewritten again and again holds those blocks only (each write
/// lands elsewhere on the log-structured devices, so its old copy is dead).
#[test]
fn the_read_cache_holds_live_blocks_only_under_overwrites() {
    let devs = MemDevs::new(1, 16 << 20, Some(1 << 20));
    let cfg = StoreConfig {
        read_cache_bytes: 8 << 20,
        ..small_cfg()
    };
    let s = devs.mkfs_open(cfg);
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    let live = 4 * 4096;
    let mut flushed = 0;
    for round in 0..300u32 {
        let mut t = Transaction::new();
        t.write(1, b"o", 0, &vec![round as u8; live]);
        s.commit(&t).unwrap();
        // Now and then, let the flusher write (and cache) what is pending.
        if round % 10 == 9 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            flushed = flushed.max(s.stats().data_io.writes);
        }
        let cached = s.stats().read_cache.bytes;
        assert!(
            cached <= live as u64,
            "round {round}: {cached} bytes cached"
        );
    }
    assert!(flushed > 10, "the flusher wrote ({flushed} device writes)");
    assert_eq!(s.read(1, b"o", 0, live as u64).unwrap(), vec![43u8; live]);
}

/// A checkpoint whose body cannot be written (it is written while it is encoded, into blocks
/// allocated part by part) stops the store; opened again, the store has every commit, from
/// the last good checkpoint and the WAL, and its space accounting holds.
#[test]
fn a_checkpoint_body_that_cannot_be_written_stops_the_store_and_loses_nothing() {
    let mem = MemDevs::new(1, 32 << 20, Some(8 << 20));
    let power = cairn_store::fault::Power::new();
    let (devs, faults) = mem.faulty(&power);
    let mut cfg = small_cfg();
    cfg.checkpoint_interval = std::time::Duration::from_secs(3600);
    Store::mkfs(&devs, &cfg).unwrap();
    let s = Store::open(&devs, cfg.clone()).unwrap();
    let mut t = Transaction::new();
    t.create_collection(1).write(1, b"o", 0, &[3u8; 8 * 4096]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    // Entries only (no data for the flusher): the next checkpoint's first device write is
    // its body, of more than one 1 MiB part.
    let value = vec![9u8; 3000];
    for i in 0..500u32 {
        let mut t = Transaction::new();
        t.kv_set(1, format!("log.{i:08}").as_bytes(), &value);
        s.commit(&t).unwrap();
    }
    faults[0].set_failures(false, true, false);
    s.checkpoint().unwrap_err();
    assert!(s.failure().is_some(), "the store stopped");
    drop(s);
    let s = Store::open(&mem.devices(), cfg).unwrap();
    assert_eq!(s.read(1, b"o", 0, 8 * 4096).unwrap(), vec![3u8; 8 * 4096]);
    for i in [0u32, 250, 499] {
        let key = format!("log.{i:08}");
        assert_eq!(s.kv_get(1, key.as_bytes()).unwrap(), Some(value.clone()));
    }
    s.check_space_accounting().unwrap();
    s.checkpoint().unwrap();
    s.check_space_accounting().unwrap();
}

/// Pending data keeps going to the data device while a checkpoint waits for that device's
/// flush, so commits meanwhile never wait for the flusher. (With one background thread for
/// both, the flusher waited for the checkpoint, pending data reached its limit, and commits
/// waited for the checkpoint.)
#[test]
fn pending_data_is_written_while_a_checkpoint_waits_for_the_data_device() {
    use std::time::{Duration, Instant};
    let mem = MemDevs::new(1, 16 << 20, Some(4 << 20));
    let (devs, faults) = mem.passthrough_data();
    let data = &faults[0];
    data.let_writes_through_flush(true);
    let cfg = StoreConfig {
        checkpoint_interval: Duration::from_secs(3600),
        wal_size: 4 << 20,
        ..small_cfg()
    };
    let limit = cfg.pending_limit_bytes;
    let blocks = 4 * limit / 4096;
    Store::mkfs(&devs, &cfg).unwrap();
    let s = Arc::new(Store::open(&devs, cfg).unwrap());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    data.set_flush_delay(Duration::from_millis(1500));
    let ckpt = {
        let s = s.clone();
        std::thread::spawn(move || s.checkpoint())
    };
    let start = Instant::now();
    while !data.is_flushing() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the checkpoint never flushed the data device"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Four times the pending limit, committed while the checkpoint waits for the flush: the
    // flusher writes three limits' worth meanwhile, else a commit would wait for the
    // checkpoint.
    for i in 0..blocks {
        let mut t = Transaction::new();
        t.write(1, b"o", i * 4096, &[i as u8; 4096]);
        s.commit(&t).unwrap();
    }
    assert!(
        data.is_flushing(),
        "the commits waited for the checkpoint's flush"
    );
    // And the rest is written too, before the checkpoint's flush ends.
    while s.stats().pending_bytes > 0 {
        assert!(
            data.is_flushing(),
            "pending data waited for the checkpoint's flush"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    ckpt.join().unwrap().unwrap();
    data.set_flush_delay(Duration::ZERO);
    let st = s.stats();
    assert_eq!(st.pending_limit_bytes, limit);
    assert!(
        st.checkpoint_flush_micros >= 1_500_000,
        "the checkpoint's 1.5 s flush counted as {} us",
        st.checkpoint_flush_micros
    );
    assert!(st.checkpoint_write_micros > 0);
    for i in 0..blocks {
        assert_eq!(
            s.read(1, b"o", i * 4096, 4096).unwrap(),
            vec![i as u8; 4096]
        );
    }
    s.check_space_accounting().unwrap();
}

/// An unaligned write over a block on the data device reads that block with no lock held:
/// a commit to another collection goes through while the read is slow, and the write then
/// merges the block's old contents correctly.
#[test]
fn an_unaligned_write_reads_its_old_block_without_holding_up_other_commits() {
    let devs = MemDevs::new(1, 16 << 20, Some(2 << 20));
    let cfg = StoreConfig {
        read_cache_bytes: 0, // the old block must come from the device
        ..small_cfg()
    };
    let s = devs.mkfs_open(cfg.clone());
    let mut t = Transaction::new();
    t.create_collection(1)
        .create_collection(2)
        .write(1, b"a", 0, &[7u8; 8192]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap(); // the data is on the data device, nothing pending
    s.close().unwrap();
    let power = cairn_store::fault::Power::new();
    let (fdevs, faults) = devs.faulty(&power);
    let s = std::sync::Arc::new(Store::open(&fdevs, cfg).unwrap());
    assert!(
        s.block_location(1, b"a", 0).is_some(),
        "block 0 is on the data device"
    );
    faults[0].set_read_delay(std::time::Duration::from_secs(2));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, done2) = (s.clone(), done.clone());
    let slow = std::thread::spawn(move || {
        let mut t = Transaction::new();
        t.write(1, b"a", 100, &[9u8; 10]); // inside block 0: read-modify-write
        s2.commit(&t).unwrap();
        done2.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    std::thread::sleep(std::time::Duration::from_millis(200)); // the slow commit is reading
    let mut t = Transaction::new();
    t.write(2, b"b", 0, &[1u8; 4096]);
    s.commit(&t).unwrap();
    assert!(
        !done.load(std::sync::atomic::Ordering::SeqCst),
        "the other commit waited for the slow read (it held the store's lock)"
    );
    slow.join().unwrap();
    faults[0].set_read_delay(std::time::Duration::ZERO);
    let mut want = vec![7u8; 8192];
    want[100..110].fill(9);
    assert_eq!(s.read(1, b"a", 0, 8192).unwrap(), want);
    assert_eq!(s.read(2, b"b", 0, 4096).unwrap(), vec![1u8; 4096]);
}

/// A read-modify-write over a block that is corrupt on every copy fails with the block named
/// and applies nothing.
#[test]
fn an_unaligned_write_over_a_corrupt_block_fails_and_applies_nothing() {
    let devs = MemDevs::new(1, 8 << 20, Some(1 << 20));
    let cfg = StoreConfig {
        read_cache_bytes: 0,
        ..small_cfg()
    };
    let s = devs.mkfs_open(cfg.clone());
    let mut t = Transaction::new();
    t.create_collection(3).write(3, b"obj", 0, &[5u8; 8192]);
    s.commit(&t).unwrap();
    s.checkpoint().unwrap();
    s.close().unwrap();
    let power = cairn_store::fault::Power::new();
    let (fdevs, faults) = devs.faulty(&power);
    let s = Store::open(&fdevs, cfg).unwrap();
    let off = s
        .block_location(3, b"obj", 1)
        .expect("block 1 on the data device");
    faults[0].flip_bit(off + 5, 1).unwrap();
    let mut t = Transaction::new();
    t.set_attr(3, b"obj", b"k", b"v")
        .write(3, b"obj", 4096 + 10, &[1u8; 4]);
    match s.commit(&t) {
        Err(StoreError::CorruptData { object, block, .. }) => {
            assert_eq!((object.as_str(), block), ("obj", 1));
        }
        other => panic!("expected CorruptData, got {other:?}"),
    }
    assert!(
        s.get_attr(3, b"obj", b"k").unwrap().is_none(),
        "half applied"
    );
    assert_eq!(s.read(3, b"obj", 0, 4096).unwrap(), vec![5u8; 4096]);
    assert!(
        s.failure().is_none(),
        "a corrupt old block fails the write, not the store"
    );
}

/// A WAL batch that cannot be written stops the store: the commit in it and every commit
/// after it fail (none is acknowledged by a later batch), and what was acknowledged before
/// is there after a reopen.
#[test]
fn a_failed_wal_write_fails_its_commit_and_every_later_one() {
    let devs = MemDevs::new(1, 8 << 20, Some(1 << 20));
    let s = devs.mkfs_open(small_cfg());
    let mut t = Transaction::new();
    t.create_collection(1).write(1, b"before", 0, &[1u8; 4096]);
    s.commit(&t).unwrap();
    s.close().unwrap();
    let power = cairn_store::fault::Power::new();
    let (fdevs, faults) = devs.faulty(&power);
    let s = Arc::new(Store::open(&fdevs, small_cfg()).unwrap());
    let wal = faults.last().expect("the WAL device");
    wal.set_failures(false, true, false);
    let mut t = Transaction::new();
    t.write(1, b"lost", 0, &[2u8; 4096]);
    let e = s.commit(&t).unwrap_err();
    assert!(matches!(e, StoreError::Failed(_)), "{e}");
    assert!(s.failure().is_some_and(|f| f.contains("WAL write failed")));
    // Writes work again on the device, but the store stays stopped: a later batch would
    // otherwise count the failed one durable.
    wal.set_failures(false, false, false);
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut t = Transaction::new();
                t.write(1, format!("after{i}").as_bytes(), 0, &[3u8; 4096]);
                s.commit(&t)
            })
        })
        .collect();
    for th in threads {
        assert!(
            th.join().unwrap().is_err(),
            "a commit after the failed batch"
        );
    }
    drop(s);
    let s = Store::open(&devs.devices(), small_cfg()).unwrap();
    assert_eq!(s.read(1, b"before", 0, 4096).unwrap(), vec![1u8; 4096]);
}
