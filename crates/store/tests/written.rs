//! `Store::write_through`: records written to the WAL device before their flush (what a pool
//! with `memory` durability acknowledges). They survive a crash of the process, and a power
//! loss once the flush that follows within `wal_flush_delay` is done.

mod common;

use cairn_store::fault::CrashMode;
use cairn_store::{Store, StoreConfig, Transaction};
use common::{small_cfg, MemDevs};
use std::time::{Duration, Instant};

fn cfg(flush_delay: Duration) -> StoreConfig {
    StoreConfig {
        // No checkpoint may flush the WAL device behind the test's back.
        checkpoint_interval: Duration::from_secs(3600),
        wal_flush_delay: flush_delay,
        ..small_cfg()
    }
}

fn write(s: &Store, obj: &[u8], byte: u8) -> u64 {
    let mut t = Transaction::new();
    t.write(1, obj, 0, &[byte; 4096]);
    s.submit(&t).unwrap()
}

fn holds(s: &Store, obj: &[u8], byte: u8) -> bool {
    s.read(1, obj, 0, 4096).is_ok_and(|d| d == vec![byte; 4096])
}

/// Devices with a collection 1, formatted and committed durably.
fn formatted(c: &StoreConfig) -> MemDevs {
    let mem = MemDevs::new(1, 16 << 20, Some(4 << 20));
    let s = mem.mkfs_open(c.clone());
    let mut t = Transaction::new();
    t.create_collection(1);
    s.commit(&t).unwrap();
    s.close().unwrap();
    mem
}

#[test]
fn written_records_survive_a_crash_of_the_process_and_queued_ones_do_not() {
    let c = cfg(Duration::from_secs(3600));
    let mem = formatted(&c);
    let s = Store::open(&mem.devices(), c.clone()).unwrap();
    let seq = write(&s, b"written", 1);
    s.write_through(seq).unwrap();
    write(&s, b"queued", 2); // submitted only: its record is still in memory
    drop(s); // as kill -9: no flush, no checkpoint, nothing more written
    let s = Store::open(&mem.devices(), c).unwrap();
    assert!(holds(&s, b"written", 1), "a written record was lost");
    assert!(
        s.stat(1, b"queued").is_err(),
        "the test is void: a record only submitted reached the WAL anyway"
    );
}

/// Writes `obj` with `write_through` on a store over fault devices, runs `then`, cuts the
/// power (every unflushed write lost) and says whether `obj` survived.
fn survives_power_cut(c: &StoreConfig, then: impl FnOnce(&Store, u64)) -> bool {
    use cairn_store::fault::Power;
    let mem = formatted(c);
    let power = Power::new();
    let (devs, faults) = mem.faulty(&power);
    let s = Store::open(&devs, c.clone()).unwrap();
    let seq = write(&s, b"obj", 1);
    s.write_through(seq).unwrap();
    then(&s, seq);
    let mut rng = || 0u64;
    for f in &faults {
        f.crash(CrashMode::LoseAll, &mut rng).unwrap();
    }
    drop(s);
    let s = Store::open(&mem.devices(), c.clone()).unwrap();
    holds(&s, b"obj", 1)
}

#[test]
fn written_records_are_flushed_within_the_delay() {
    let survived = survives_power_cut(&cfg(Duration::from_millis(5)), |s, _| {
        let flushes = s.stats().wal_io.flushes;
        let start = Instant::now();
        while s.stats().wal_io.flushes == flushes {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "written records were never flushed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    assert!(survived, "flushed within the delay, then lost");
}

#[test]
fn a_sync_flushes_written_records() {
    // No flush by delay here: only the sync can make the record durable.
    let survived = survives_power_cut(&cfg(Duration::from_secs(3600)), |s, seq| {
        s.sync_through(seq).unwrap();
    });
    assert!(survived, "synced, then lost");
}

#[test]
fn a_failed_flush_of_written_records_stops_the_store() {
    use cairn_store::fault::Power;
    let c = cfg(Duration::from_secs(3600));
    let mem = formatted(&c);
    let power = Power::new();
    let (devs, faults) = mem.faulty(&power);
    let s = Store::open(&devs, c).unwrap();
    let seq = write(&s, b"obj", 1);
    s.write_through(seq).unwrap();
    let wal = faults.last().unwrap(); // the WAL device comes last
    wal.set_failures(false, false, true);
    let e = s.sync_through(seq).unwrap_err();
    assert!(e.to_string().contains("WAL flush failed"), "{e}");
    assert!(s.failure().is_some());
    // Nothing is acknowledged after that: later writes fail too.
    let mut t = Transaction::new();
    t.write(1, b"later", 0, &[2; 4096]);
    assert!(s.commit(&t).is_err());
}

#[test]
fn a_power_loss_before_the_flush_takes_written_records() {
    use cairn_store::fault::Power;
    // What `memory` durability gives up, shown so that the test above means something.
    let c = cfg(Duration::from_secs(3600));
    let mem = formatted(&c);
    let power = Power::new();
    let (devs, faults) = mem.faulty(&power);
    let s = Store::open(&devs, c.clone()).unwrap();
    let seq = write(&s, b"unflushed", 1);
    s.write_through(seq).unwrap();
    let mut rng = || 0u64;
    let lost: usize = faults
        .iter()
        .map(|f| f.crash(CrashMode::LoseAll, &mut rng).unwrap())
        .sum();
    assert!(lost > 0, "the record was flushed: nothing left to lose");
    drop(s);
    let s = Store::open(&mem.devices(), c).unwrap();
    assert!(s.stat(1, b"unflushed").is_err());
}
