//! Peering and recovery with real processes: an OSD that was down comes back, is brought up
//! to date from the PG log (only the objects that changed move), and never serves what it
//! missed.

mod common;

use common::cluster::Cluster;
use std::time::{Duration, Instant};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn value(object: u32, generation: u32) -> Vec<u8> {
    format!("object {object} generation {generation} ")
        .repeat(50)
        .into_bytes()
}

fn name(object: u32) -> Vec<u8> {
    format!("obj-{object}").into_bytes()
}

/// Waits until `osd` is marked down (`want_up` false) or up again in the map.
async fn wait_osd(client: &cairn_client::Client, osd: u32, want_up: bool) {
    let start = Instant::now();
    loop {
        let map = client.mon().get_map().await.expect("map");
        if map.osds.get(&osd).is_some_and(|o| o.up == want_up) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "osd.{osd} not marked {} within 30 s",
            if want_up { "up" } else { "down" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Objects recovered so far, summed over the OSDs that answer.
async fn recovered(client: &cairn_client::Client) -> u64 {
    let map = client.map();
    let mut total = 0;
    for o in map.osds.values().filter(|o| o.up) {
        if let Ok(s) = cairn_client::osd_stats(&o.addr, Duration::from_secs(2)).await {
            total += s.recovered_objects;
        }
    }
    total
}

#[test]
fn an_osd_back_from_down_is_recovered_by_log_and_serves_no_stale_data() {
    let c = Cluster::up("recovery-delta", 1, 3);
    // min_size 1: at the end, the returning OSD alone must serve everything.
    c.ok(&[
        "pool",
        "create",
        "p",
        "--size",
        "3",
        "--min-size",
        "1",
        "--pgs",
        "16",
    ]);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        let objects = 120u32;
        let mut latest: Vec<Option<u32>> = vec![Some(0); objects as usize];
        for o in 0..objects {
            client
                .write_full(pool, &name(o), &value(o, 0))
                .await
                .expect("first write");
        }
        // osd.2 goes down; meanwhile 20 objects change, 5 are removed, 6 are new.
        c.kill9("osd.2");
        wait_osd(&client, 2, false).await;
        let before = recovered(&client).await;
        for o in 0..20 {
            client
                .write_full(pool, &name(o), &value(o, 1))
                .await
                .expect("write while osd.2 is down");
            latest[o as usize] = Some(1);
        }
        for o in 20..25 {
            client.remove(pool, &name(o)).await.expect("remove");
            latest[o as usize] = None;
        }
        for o in objects..objects + 6 {
            client
                .write_full(pool, &name(o), &value(o, 1))
                .await
                .expect("new object");
            latest.push(Some(1));
        }
        let changed = 20 + 5 + 6;
        // osd.2 comes back: the primaries recover it; exactly the changed objects move.
        c.restart_missing(1, 3);
        wait_osd(&client, 2, true).await;
        let start = Instant::now();
        while recovered(&client).await - before < changed {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "recovery moved {} of {changed} objects within 30 s\n{}",
                recovered(&client).await - before,
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Settle, then nothing more moved: a backfill would have copied all ~125 objects.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            recovered(&client).await - before,
            changed,
            "recovery must move only the objects that changed"
        );
        // The other two OSDs die: osd.2 alone serves every object's latest value.
        c.kill9("osd.0");
        c.kill9("osd.1");
        wait_osd(&client, 0, false).await;
        wait_osd(&client, 1, false).await;
        for (o, want) in latest.iter().enumerate() {
            let got = client.read(pool, &name(o as u32), 0, 1 << 20).await;
            match (want, got) {
                (Some(g), Ok(v)) => assert!(v == value(o as u32, *g), "object {o}: stale value"),
                (None, Err(cairn_client::ClientError::NoSuchObject { .. })) => {}
                (want, got) => panic!("object {o}: want {want:?}, got {got:?}"),
            }
        }
    });
}
