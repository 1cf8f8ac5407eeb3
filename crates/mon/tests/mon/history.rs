//! The map history: past intervals served from it, trimmed only as far as the PGs' primaries
//! report they went active, never by a client.

use crate::common::*;
use cairn_map::{Durability, MapChange, MapError, PgId};
use cairn_monclient::{MonClient, MonClientError, PgStarted};
use std::time::Duration;

/// Heartbeats of OSD `osd` (life `up_from`) reporting `pg` started at `epoch`.
async fn report(client: &MonClient, osd: u32, up_from: u64, pg: PgId, epoch: u64) {
    let started = PgStarted {
        pool: pg.pool,
        pg: pg.pg,
        epoch,
    };
    client
        .heartbeat(osd, up_from, vec![started])
        .await
        .expect("heartbeat");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_trimmed_only_to_what_the_pgs_primaries_report() {
    let c = Cluster::start_with("history", 1, |cfg| {
        cfg.osd_grace = Duration::from_secs(30);
        cfg.history_keep = 0;
    })
    .await;
    let client = c.client();
    let lives: Vec<u64> = vec![
        changed_epoch(client.command(osd_boot(1)).await.expect("boot")),
        changed_epoch(client.command(osd_boot(2)).await.expect("boot")),
    ];
    let create = MapChange::PoolCreate {
        name: "p".into(),
        size: 2,
        min_size: 1,
        pg_count: 1,
        durability: Durability::Wal,
    };
    let created = changed_epoch(client.command(create).await.expect("pool"));
    let pg = PgId { pool: 1, pg: 0 };
    let map = client.get_map().await.expect("map");
    let primary = map.pg_placement(pg).primary().expect("primary");
    let other = 1 - primary;

    // The intervals since the pool exists: one, both OSDs acting.
    let (from, ivs) = client
        .past_intervals(pg, 0, map.epoch)
        .await
        .expect("intervals");
    assert_eq!(from, 1, "nothing trimmed yet");
    assert_eq!(ivs.len(), 1);
    assert_eq!((ivs[0].first, ivs[0].last), (created, map.epoch));
    assert!(ivs[0].maybe_went_rw);

    // A client cannot trim.
    let e = client
        .command(MapChange::TrimHistory { below: map.epoch })
        .await;
    assert_eq!(e, Err(MonClientError::Refused(MapError::MonitorsOnly)));

    // A report from the OSD that is not the primary is not taken.
    report(&client, other, lives[other as usize], pg, created).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(client.status().await.expect("status").history_oldest, 1);

    // The primary's report: trimmed to that epoch, not further, however many epochs pass
    // while it keeps reporting it (a PG down for long holds the history).
    report(&client, primary, lives[primary as usize], pg, created).await;
    eventually("history trimmed", Duration::from_secs(10), || async {
        (client.status().await.ok()?.history_oldest == created).then_some(())
    })
    .await;
    for i in 0..20u32 {
        let weight = if i % 2 == 0 { 0x8000 } else { 0x10000 };
        client
            .command(MapChange::OsdWeight { id: other, weight })
            .await
            .expect("reweight");
        report(&client, primary, lives[primary as usize], pg, created).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = client.get_map().await.expect("map").epoch;
    assert_eq!(
        client.status().await.expect("status").history_oldest,
        created
    );
    let (from, ivs) = client
        .past_intervals(pg, created, now)
        .await
        .expect("intervals after many epochs");
    assert_eq!(from, created);
    assert_eq!(ivs.first().map(|i| i.first), Some(created));

    // A new pool not reported yet holds the history too, whatever the first PG reports.
    client.command(pool("q")).await.expect("pool q");
    report(&client, primary, lives[primary as usize], pg, now).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        client.status().await.expect("status").history_oldest,
        created
    );

    // Asking past the monitor's epoch is answered "behind" (the client retries, then fails).
    let quick = client.clone().with_timeout(Duration::from_millis(500));
    assert!(quick.past_intervals(pg, 0, now + 100).await.is_err());
}
