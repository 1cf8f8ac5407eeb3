//! Map subscriptions: every epoch is pushed, incrementals rebuild the leader's map, and a
//! follower moves to another monitor when its monitor stops.

use crate::common::*;
use cairn_map::ClusterMap;
use cairn_proto::msg::mon::{MapUpdate, Subscribe, MAP, SUBSCRIBE};
use cairn_proto::msg::{decode, encode};
use cairn_proto::Limits;
use cairn_transport::{read_frame, write_frame};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_see_every_epoch_and_follow_across_a_monitor_failure() {
    let mut c = Cluster::start("follow", 3, Duration::from_secs(4)).await;
    let leader = c.leader().await;
    let follower = (leader + 1) % 3;
    let client = c.client();
    client.command(pool("first")).await.expect("command");

    // A raw subscription to a follower: a full map first, then every epoch in order.
    let mut raw = raw_connect(&c.mons[follower].addr()).await;
    write_frame(
        &mut raw,
        SUBSCRIBE,
        77,
        &encode(&Subscribe { have: 0 }),
        &[],
    )
    .await
    .expect("subscribe");
    // The map via follow(), starting from nothing, through the follower only.
    let mut followed = c.client_of(follower).follow(None);
    // And one that starts from an old map of its own (gets incrementals).
    let old = client.get_map().await.expect("map");
    let mut from_old = c.client().follow(Some(old.clone()));

    for n in 0..20 {
        client
            .command(pool(&format!("p{n}")))
            .await
            .expect("command");
    }
    let target = client.get_map().await.expect("map");
    assert_eq!(target.epoch, old.epoch + 20);

    let mut map: Option<ClusterMap> = None;
    within(
        "raw subscription reaches the last epoch",
        Duration::from_secs(10),
        async {
            while map.as_ref().map(|m| m.epoch) != Some(target.epoch) {
                let f = read_frame(&mut raw, &Limits::default())
                    .await
                    .expect("frame");
                assert_eq!((f.msg_type, f.request_id), (MAP, 77));
                match decode::<MapUpdate>("map", &f.control).expect("update") {
                    MapUpdate::Full(m) => {
                        assert!(map.is_none(), "only the first update is a full map");
                        map = Some(m);
                    }
                    MapUpdate::Incrementals(incs) => {
                        let m = map.as_mut().expect("a full map first");
                        for inc in incs {
                            assert_eq!(inc.epoch, m.epoch + 1, "epochs arrive consecutively");
                            m.apply_incremental(&inc).expect("incremental applies");
                        }
                    }
                }
            }
        },
    )
    .await;
    assert_eq!(
        map.as_ref(),
        Some(&target),
        "incrementals rebuild the leader's map"
    );

    within(
        "follow() reaches the last epoch",
        Duration::from_secs(10),
        followed.wait_for(|m| m.epoch == target.epoch),
    )
    .await
    .expect("follower alive");
    assert_eq!(**followed.borrow(), target);
    within(
        "follow(Some(old)) reaches the last epoch",
        Duration::from_secs(10),
        from_old.wait_for(|m| m.epoch == target.epoch),
    )
    .await
    .expect("follower alive");
    assert_eq!(**from_old.borrow(), target);

    // `from_old` subscribed to the first monitor: stop it and keep changing the map.
    c.stop(0).await;
    for n in 0..3 {
        client
            .command(pool(&format!("q{n}")))
            .await
            .expect("command after a monitor stopped");
    }
    let target = client.get_map().await.expect("map");
    within(
        "follow() moves to another monitor",
        Duration::from_secs(10),
        from_old.wait_for(|m| m.epoch == target.epoch),
    )
    .await
    .expect("follower alive");
    assert_eq!(**from_old.borrow(), target);
    for i in 1..3 {
        c.stop(i).await;
    }
}
