//! Where an OSD's shards sync the WAL (`crates/osd/src/wal_pace.rs`): themselves while it is
//! memory, on the syncer thread once it is on a device, so that reads the cache can answer
//! do not queue behind device writes. A real cluster with its WALs on the data devices.

mod common;

use common::cluster::{runtime, Cluster};
use std::time::Duration;

/// Whether `path` is on a file system in memory (tmpfs), where no write waits for a device.
fn in_memory(path: &std::path::Path) -> bool {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output()
        .expect("stat");
    String::from_utf8_lossy(&out.stdout).trim() == "tmpfs"
}

#[test]
fn a_wal_on_a_device_is_synced_off_the_shards_and_reads_are_still_served() {
    // A bound below this VM's disk (~80 us per sync; memory takes ~5 us) and above memory,
    // so that the test sees the hand-off whatever the default.
    let c = Cluster::up_with(
        "walpace",
        1,
        1,
        &["--wal-on-data", "--wal-inline-max-us", "30"],
    );
    if in_memory(&std::env::temp_dir()) {
        // The data device is then memory as well: nothing to hand off.
        println!("skipped: the test directory is on tmpfs");
        return;
    }
    c.pool_create("p", 1, 1, 8);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        client
            .write_full(pool, b"cached", &[5u8; 4096])
            .await
            .expect("write");
        // Small writes, each waiting for the WAL on the disk, with reads between them.
        let mut tasks = tokio::task::JoinSet::new();
        for lane in 0..4u8 {
            let client = client.clone();
            tasks.spawn(async move {
                for i in 0..100u64 {
                    let name = format!("w-{lane}-{}", i % 8);
                    client
                        .write(pool, name.as_bytes(), (i / 8) * 4096, &[lane; 4096])
                        .await
                        .expect("write");
                    let got = client.read(pool, b"cached", 0, 4096).await.expect("read");
                    assert_eq!(got, vec![5u8; 4096]);
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.expect("lane");
        }
        let o = &client.map().osds[&0];
        let s = cairn_client::osd_stats(&o.addr, client.auth(), Duration::from_secs(5))
            .await
            .expect("stats");
        println!(
            "quickest of the last 64 WAL syncs: {} us; syncs handed to the syncer: {}",
            s.wal_sync_floor_us, s.wal_syncs_handed_off
        );
        assert!(
            s.wal_sync_floor_us > 30,
            "a WAL on the disk synced in {} us",
            s.wal_sync_floor_us
        );
        // The first window of 64 syncs is measured on the shard; the later ones move off.
        assert!(
            s.wal_syncs_handed_off > 0,
            "the shards kept syncing the slow WAL themselves ({} handed off)",
            s.wal_syncs_handed_off
        );
    });
}
