//! Failure detection: heartbeating OSDs stay up, silent ones are marked down after the grace.

use crate::common::*;
use cairn_map::MapError;
use cairn_monclient::MonClientError;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_osds_are_marked_down_after_the_grace() {
    let grace = Duration::from_millis(800);
    let mut c = Cluster::start("heartbeat", 1, grace).await;
    let client = c.client();
    let up_from = changed_epoch(client.command(osd_boot(1)).await.expect("boot"));
    let map = client.get_map().await.expect("map");
    assert!(map.osds[&0].up);
    assert_eq!(map.osds[&0].up_from, up_from);

    // Heartbeating every grace/4 for three graces keeps it up.
    let t = Instant::now();
    while t.elapsed() < grace * 3 {
        client
            .heartbeat(0, up_from, Vec::new())
            .await
            .expect("heartbeat");
        tokio::time::sleep(grace / 4).await;
    }
    let map = client.get_map().await.expect("map");
    assert!(map.osds[&0].up, "a heartbeating OSD stays up");
    assert_eq!(map.epoch, up_from, "and the map does not move");

    // An unknown OSD's heartbeat is refused.
    let e = client.heartbeat(9, 1, Vec::new()).await.unwrap_err();
    assert_eq!(e, MonClientError::Refused(MapError::NoSuchOsd(9)));

    // Silence (heartbeats of a stale life do not count): down within grace + tick + slack.
    let last = Instant::now();
    let down_after = eventually("the OSD marked down", grace * 4, || async {
        let stale = client.heartbeat(0, up_from - 1, Vec::new()).await;
        assert_eq!(
            stale,
            Err(MonClientError::Refused(MapError::NotUp { osd: 0 })),
            "a stale life's heartbeat must not look accepted (it would renew a lease)"
        );
        let m = client.get_map().await.ok()?;
        (!m.osds[&0].up).then(|| last.elapsed())
    })
    .await;
    assert!(
        down_after >= grace - grace / 8,
        "marked down too early: {down_after:?}"
    );
    assert!(
        down_after <= grace + grace / 4 + Duration::from_millis(700),
        "marked down too late: {down_after:?}"
    );
    // A reboot brings it back in a new life; the old life's heartbeats are still ignored.
    let new_life = changed_epoch(client.command(osd_boot(1)).await.expect("reboot"));
    assert!(new_life > up_from);
    assert!(client.get_map().await.expect("map").osds[&0].up);
    assert_eq!(
        client.heartbeat(0, up_from, Vec::new()).await,
        Err(MonClientError::Refused(MapError::NotUp { osd: 0 }))
    );
    client
        .heartbeat(0, new_life, Vec::new())
        .await
        .expect("the new life's heartbeat");
    c.stop(0).await;
}
