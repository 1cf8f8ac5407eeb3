//! One monitor: commands, persistence across restart, identity checks.

use crate::common::*;
use cairn_map::{ChangeOutcome, MapError};
use cairn_mon::{MonConfig, MonError};
use cairn_monclient::MonClientError;
use std::time::Duration;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_are_created_listed_and_survive_a_restart() {
    let mut c = Cluster::start("single", 1, Duration::from_secs(4)).await;
    let client = c.client();
    let fresh = within("first map", Duration::from_secs(10), client.get_map())
        .await
        .expect("map");
    assert_eq!(fresh.fsid, FSID);
    assert_eq!(fresh.epoch, 1, "a new cluster starts at epoch 1");

    let o = client.command(pool("rbd")).await.expect("pool create");
    assert_eq!(o, ChangeOutcome::Changed { epoch: 2, id: 1 });
    let o = client.command(pool("data")).await.expect("pool create");
    assert_eq!(o, ChangeOutcome::Changed { epoch: 3, id: 2 });
    let e = client.command(pool("rbd")).await.unwrap_err();
    assert_eq!(
        e,
        MonClientError::Refused(MapError::PoolExists("rbd".into()))
    );

    let before = client.get_map().await.expect("map");
    let names: Vec<&str> = before.pools.values().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["rbd", "data"]);
    assert_eq!(before.epoch, 3);

    c.stop(0).await;
    let down = c.client_of(0).with_timeout(Duration::from_millis(300));
    assert!(
        matches!(
            down.get_map().await,
            Err(MonClientError::Unreachable { .. })
        ),
        "a stopped monitor is reported unreachable"
    );
    c.restart(0).await;
    let after = within(
        "map after restart",
        Duration::from_secs(10),
        client.get_map(),
    )
    .await
    .expect("map after restart");
    assert_eq!(
        after, before,
        "same map and epoch after reopening the data dir"
    );
    // And it still takes commands, continuing the epochs.
    let o = client
        .command(pool("more"))
        .await
        .expect("pool create after restart");
    assert_eq!(o, ChangeOutcome::Changed { epoch: 4, id: 3 });
    c.stop(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_refuses_another_cluster_or_monitor() {
    let mut c = Cluster::start("identity", 1, Duration::from_secs(4)).await;
    c.client().get_map().await.expect("map");
    c.stop(0).await;
    let base = c.mons[0].cfg.clone();

    let mut other_fsid: MonConfig = base.clone();
    other_fsid.fsid = [7; 16];
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let e = within(
        "refusal",
        Duration::from_secs(5),
        cairn_mon::run(other_fsid, l, std::future::pending()),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, MonError::FsidMismatch { .. }), "{e}");
    assert!(e.to_string().contains("--fsid"), "says what to do: {e}");

    let mut other_id = base.clone();
    other_id.id = 2;
    other_id.members.insert(2, "127.0.0.1:1".into());
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let e = within(
        "refusal",
        Duration::from_secs(5),
        cairn_mon::run(other_id, l, std::future::pending()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e,
            MonError::IdMismatch {
                stored: 0,
                given: 2,
                ..
            }
        ),
        "{e}"
    );

    let id = cairn_mon::stored_identity(&base.dir)
        .expect("identity")
        .expect("some");
    assert_eq!((id.id, id.fsid), (0, FSID));
}
