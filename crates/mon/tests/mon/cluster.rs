//! Three monitors: redirection to the leader, convergence, failover, catch-up after restart.

use crate::common::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_monitors_redirect_converge_fail_over_and_catch_up() {
    let mut c = Cluster::start("three", 3, Duration::from_secs(4)).await;
    let leader = c.leader().await;
    let follower = (leader + 1) % 3;

    // A client that knows only a follower is sent to the leader and its change committed.
    let via_follower = c.client_of(follower);
    let epoch = changed_epoch(
        via_follower
            .command(pool("p1"))
            .await
            .expect("command via follower"),
    );
    assert_eq!(epoch, 2);
    for n in 2..=5 {
        via_follower
            .command(pool(&format!("p{n}")))
            .await
            .expect("command");
    }

    // Every monitor converges to the same map.
    let leader_map = c.map_of(leader).await.expect("leader map");
    assert_eq!(leader_map.epoch, 6);
    for i in 0..3 {
        eventually("monitors converge", Duration::from_secs(5), || async {
            c.map_of(i).await.filter(|m| *m == leader_map)
        })
        .await;
    }

    // The leader dies: another is elected and commands succeed again within seconds.
    let old = leader;
    c.stop(old).await;
    let client = c.client();
    let t = Instant::now();
    let epoch = changed_epoch(
        within(
            "command after failover",
            Duration::from_secs(8),
            client.command(pool("after")),
        )
        .await
        .expect("command after the leader stopped"),
    );
    let took = t.elapsed();
    assert_eq!(epoch, 7);
    assert!(took < Duration::from_secs(5), "failover took {took:?}");
    let new_leader = c.leader().await;
    assert_ne!(new_leader, old);
    client.command(pool("after2")).await.expect("command");

    // The old leader comes back from its data dir and catches up.
    c.restart(old).await;
    let target = c.map_of(new_leader).await.expect("map");
    assert_eq!(target.epoch, 8);
    eventually(
        "the restarted monitor catches up",
        Duration::from_secs(10),
        || async { c.map_of(old).await.filter(|m| *m == target) },
    )
    .await;
    for i in 0..3 {
        c.stop(i).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_behind_the_kept_log_catches_up_from_a_snapshot() {
    let mut c = Cluster::start_with("snapshot", 3, |cfg| cfg.snapshot_logs = 10).await;
    let leader = c.leader().await;
    let lagger = (leader + 1) % 3;
    let client = c.client();
    client.command(pool("before")).await.expect("command");
    let seen = eventually(
        "the lagger has the first change",
        Duration::from_secs(5),
        || async { c.map_of(lagger).await.filter(|m| m.epoch == 2) },
    )
    .await;
    c.stop(lagger).await;
    // Many more changes than the leader keeps in its log after a snapshot.
    for n in 0..60 {
        client
            .command(pool(&format!("p{n}")))
            .await
            .expect("command");
    }
    let target = client.get_map().await.expect("map");
    c.restart(lagger).await;
    eventually("the lagger catches up", Duration::from_secs(10), || async {
        c.map_of(lagger).await.filter(|m| *m == target)
    })
    .await;
    // A snapshot carries the map history: asked for what followed its old epoch, the
    // restarted monitor sends the incrementals, and they lead to the same map.
    let mut s = raw_connect(&c.mons[lagger].addr()).await;
    let req = cairn_proto::msg::encode(&cairn_proto::msg::mon::GetMap { have: seen.epoch });
    cairn_transport::write_frame(&mut s, cairn_proto::msg::mon::GET_MAP, 1, &req, &[])
        .await
        .expect("send");
    let f = within(
        "map reply",
        Duration::from_secs(5),
        cairn_transport::read_frame(&mut s, &cairn_proto::Limits::default()),
    )
    .await
    .expect("reply");
    let update: cairn_proto::msg::mon::MapUpdate =
        cairn_proto::msg::decode("map", &f.control).expect("update");
    let cairn_proto::msg::mon::MapUpdate::Incrementals(incs) = update else {
        panic!("expected incrementals from a snapshot-restored monitor, got {update:?}");
    };
    let mut rebuilt = seen.clone();
    for inc in &incs {
        rebuilt
            .apply_incremental(inc)
            .expect("consecutive incrementals");
    }
    assert_eq!(rebuilt, target);
    for i in 0..3 {
        c.stop(i).await;
    }
}
