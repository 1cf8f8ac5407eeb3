//! Client behaviour against scripted fake monitors.

use super::*;
use cairn_map::MapError;
use cairn_proto::stream::{read_frame, write_frame};
use cairn_proto::Limits;
use tokio::net::TcpListener;

/// A fake monitor answering every command with `reply`; returns its address.
async fn fake(reply: CommandReply) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let reply = reply.clone();
            tokio::spawn(async move {
                while let Ok(f) = read_frame(&mut s, &Limits::default()).await {
                    let body = encode(&reply);
                    if write_frame(&mut s, COMMAND_REPLY, f.request_id, &body, &[])
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn dead_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().to_string()
}

fn change() -> MapChange {
    MapChange::OsdOut { id: 1 }
}

#[tokio::test]
async fn follows_the_leader_hint_past_dead_monitors() {
    let done = ChangeOutcome::Changed { epoch: 9, id: 1 };
    let leader = fake(CommandReply::Done(done)).await;
    let follower = fake(CommandReply::NotLeader {
        leader: Some(leader.clone()),
    })
    .await;
    let c = MonClient::new(vec![dead_addr().await, follower]).with_timeout(Duration::from_secs(5));
    assert_eq!(c.command(change()).await, Ok(done));
    // The leader connection is kept: the next command goes straight there.
    assert_eq!(c.command(change()).await, Ok(done));
}

#[tokio::test]
async fn errors_say_what_happened() {
    let refused = fake(CommandReply::Refused(MapError::NoSuchOsd(1))).await;
    let c = MonClient::new(vec![refused]);
    assert_eq!(
        c.command(change()).await,
        Err(MonClientError::Refused(MapError::NoSuchOsd(1)))
    );

    let busy = fake(CommandReply::Unavailable("no quorum".into())).await;
    let c = MonClient::new(vec![busy]).with_timeout(Duration::from_millis(300));
    assert_eq!(
        c.command(change()).await,
        Err(MonClientError::Unavailable("no quorum".into()))
    );

    let leaderless = fake(CommandReply::NotLeader { leader: None }).await;
    let c = MonClient::new(vec![leaderless]).with_timeout(Duration::from_millis(300));
    assert!(matches!(
        c.command(change()).await,
        Err(MonClientError::Unavailable(_))
    ));

    let dead = dead_addr().await;
    let c = MonClient::new(vec![dead.clone()]).with_timeout(Duration::from_millis(300));
    let e = c.command(change()).await.unwrap_err();
    assert!(matches!(e, MonClientError::Unreachable { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&dead) && msg.contains("CAIRN_CONF"), "{msg}");

    // A "monitor" that answers with the wrong message type.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let f = read_frame(&mut s, &Limits::default()).await.unwrap();
        write_frame(&mut s, MAP, f.request_id, &[1, 2, 3], &[])
            .await
            .unwrap();
    });
    let c = MonClient::new(vec![addr]).with_timeout(Duration::from_secs(2));
    assert!(matches!(
        c.command(change()).await,
        Err(MonClientError::Protocol(_))
    ));
}

#[tokio::test]
async fn a_monitor_that_never_answers_is_a_timeout() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    let c = MonClient::new(vec![addr]).with_timeout(Duration::from_millis(200));
    let t = std::time::Instant::now();
    assert_eq!(c.get_map().await, Err(MonClientError::Timeout));
    assert!(t.elapsed() < Duration::from_secs(1), "deadline honoured");
}
