//! Client behaviour against scripted fake monitors.

use super::*;
use cairn_map::MapError;
use cairn_proto::msg::mon::Unavailable;
use cairn_proto::Limits;
use cairn_transport::{accept, node_kind, read_frame, write_frame, AllowNone};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// The fake monitor's side of the handshake, checking that the client speaks it.
async fn hello(s: &mut TcpStream) {
    let a = accept(s, node_kind::MON, &AllowNone)
        .await
        .expect("handshake");
    assert_eq!(a.hello.node_kind, node_kind::CLIENT);
}

/// A fake monitor answering every command with `reply`; returns its address.
async fn fake(reply: CommandReply) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let reply = reply.clone();
            tokio::spawn(async move {
                hello(&mut s).await;
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

    let busy = fake(CommandReply::Unavailable(Unavailable::NotCommitted {
        timeout_ms: 4000,
    }))
    .await;
    let c = MonClient::new(vec![busy]).with_timeout(Duration::from_millis(300));
    let e = c.command(change()).await.unwrap_err();
    assert_eq!(
        e,
        MonClientError::Unavailable(Unavailability::Mon(Unavailable::NotCommitted {
            timeout_ms: 4000
        }))
    );
    assert_eq!(
        e.to_string(),
        "monitors unavailable: the change was not committed within 4s (it may still be): a \
         majority of the monitors must be running and reachable"
    );

    let leaderless = fake(CommandReply::NotLeader { leader: None }).await;
    let c = MonClient::new(vec![leaderless]).with_timeout(Duration::from_millis(300));
    assert_eq!(
        c.command(change()).await,
        Err(MonClientError::Unavailable(Unavailability::NoLeader))
    );

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
        hello(&mut s).await;
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
        while let Ok((mut s, _)) = l.accept().await {
            hello(&mut s).await;
            held.push(s);
        }
    });
    let c = MonClient::new(vec![addr]).with_timeout(Duration::from_millis(200));
    let t = std::time::Instant::now();
    assert_eq!(c.get_map().await, Err(MonClientError::Timeout));
    assert!(t.elapsed() < Duration::from_secs(1), "deadline honoured");
}

#[tokio::test]
async fn a_peer_that_fails_the_handshake_is_unreachable_with_the_reason() {
    // An old monitor (frames without a handshake), and an OSD (handshakes, but not as a
    // monitor).
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let old = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = l.accept().await {
            // Reads the client's handshake (so closing cannot reset the connection before
            // the client reads), answers with a frame and keeps the connection open.
            let mut theirs = [0u8; 16];
            let _ = s.read_exact(&mut theirs).await;
            let _ = write_frame(&mut s, MAP, 0, &[], &[]).await;
            held.push(s);
        }
    });
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let osd = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = accept(&mut s, node_kind::OSD, &AllowNone).await;
                let _ = read_frame(&mut s, &Limits::default()).await;
            });
        }
    });
    for (addr, why) in [(old, "magic"), (osd, "not a monitor")] {
        let c = MonClient::new(vec![addr.clone()]).with_timeout(Duration::from_millis(300));
        match c.get_map().await {
            Err(MonClientError::Unreachable { last_error, .. }) => assert!(
                last_error.starts_with(&format!("{addr}: handshake: ")) && last_error.contains(why),
                "{last_error}"
            ),
            other => panic!("{addr}: expected Unreachable, got {other:?}"),
        }
    }
}

/// A verifier that requires authentication and knows no key: every client is refused.
struct RefuseAll;

impl cairn_transport::Verifier for RefuseAll {
    fn allow_none(&self) -> bool {
        false
    }
    fn key_for(
        &self,
        _: u8,
        _: &cairn_proto::auth::AuthInit,
        _: &cairn_auth::Entity,
    ) -> Result<cairn_transport::Known, cairn_transport::VerifyError> {
        Err(cairn_transport::VerifyError::NoAuthentication)
    }
}

#[tokio::test]
async fn a_refused_subscription_is_not_asked_again_at_once() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = attempts.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            seen.fetch_add(1, Ordering::Relaxed);
            let _ = accept(&mut s, node_kind::MON, &RefuseAll).await;
        }
    });
    let c = MonClient::new(vec![addr]);
    let rx = c.follow(None);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // A monitor that only failed (not refused) is asked again within 2 s, backing off from
    // 20 ms: some ten times in 3 s. A refusal waits 30 s.
    assert_eq!(attempts.load(Ordering::Relaxed), 1);
    assert_eq!(
        rx.borrow().epoch,
        0,
        "no map from a monitor that refuses us"
    );
}

/// A verifier that knows one entity's key.
struct OneKey(cairn_auth::Entity, cairn_auth::Secret);

impl cairn_transport::Verifier for OneKey {
    fn allow_none(&self) -> bool {
        false
    }
    fn key_for(
        &self,
        _: u8,
        _: &cairn_proto::auth::AuthInit,
        e: &cairn_auth::Entity,
    ) -> Result<cairn_transport::Known, cairn_transport::VerifyError> {
        if *e != self.0 {
            return Err(cairn_auth::KeyRefusal::UnknownEntity(e.clone()).into());
        }
        Ok(cairn_transport::Known {
            entity: e.clone(),
            caps: cairn_auth::Caps::default(),
            key: self.1.clone(),
        })
    }
}

/// A fake monitor answering every `GET_TICKET` with `reply(n)` (n counts the requests);
/// returns its address and the task serving it (abort it to take the monitor away).
async fn ticket_monitor(
    key: (cairn_auth::Entity, cairn_auth::Secret),
    reply: fn(usize, &cairn_auth::Secret) -> cairn_proto::msg::mon::TicketReply,
) -> (String, tokio::task::JoinHandle<()>) {
    use cairn_proto::msg::mon::{GET_TICKET, TICKET};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let served = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut s, _)) = l.accept().await {
            let (key, served) = (key.clone(), served.clone());
            conns.spawn(async move {
                if accept(&mut s, node_kind::MON, &OneKey(key.0, key.1.clone()))
                    .await
                    .is_err()
                {
                    return;
                }
                while let Ok(f) = read_frame(&mut s, &Limits::default()).await {
                    assert_eq!(f.msg_type, GET_TICKET);
                    let n = served.fetch_add(1, Ordering::Relaxed);
                    let body = encode(&reply(n, &key.1));
                    let _ = write_frame(&mut s, TICKET, f.request_id, &body, &[]).await;
                }
            });
        }
    });
    (addr, task)
}

/// A granted ticket `n` (its bytes say which), good for `ttl` seconds.
fn granted(n: usize, secret: &cairn_auth::Secret, ttl: u64) -> cairn_proto::msg::mon::TicketReply {
    let aad = cairn_proto::msg::mon::ticket_session_aad("client.t");
    cairn_proto::msg::mon::TicketReply::Granted {
        ticket: vec![n as u8; 100],
        session: cairn_auth::seal(secret, &aad, &[n as u8; 32]),
        ttl_secs: ttl,
    }
}

/// A monitor client presenting `key`, giving up after half a second.
fn keyed_mons(addr: String, key: &(cairn_auth::Entity, cairn_auth::Secret)) -> MonClient {
    let creds = cairn_transport::Credentials::Key {
        entity: key.0.clone(),
        secret: key.1.clone(),
    };
    MonClient::new(vec![addr])
        .with_timeout(Duration::from_millis(500))
        .with_auth(Arc::new(cairn_transport::Fixed(creds)))
}

/// The key of `client.t`, which the fake monitors know.
fn test_key() -> (cairn_auth::Entity, cairn_auth::Secret) {
    let e = cairn_auth::Entity::parse("client.t").expect("entity");
    (e, cairn_auth::Secret::generate())
}

#[tokio::test]
async fn a_ticket_is_kept_while_the_monitors_cannot_renew_it_and_dropped_when_they_refuse() {
    use cairn_transport::Authenticator;
    let key = test_key();
    let (addr, monitor) = ticket_monitor(key.clone(), |n, s| granted(n, s, 4)).await;
    let mons = MonClient::new(vec![addr]).with_timeout(Duration::from_millis(500));
    let k = auth::EntityKey::asking(auth::KeySource::fixed(key.0.clone(), key.1.clone()), mons);
    let first = k.ticket().await.expect("a ticket");
    assert_eq!(first.ticket, vec![0u8; 100]);
    assert_eq!(
        first.session.0, [0u8; 32],
        "the session secret opens with our key"
    );
    assert_eq!(
        k.ticket().await.expect("held").ticket,
        first.ticket,
        "no new request"
    );
    // The monitor goes away; past half-life the renewal fails and the held ticket serves.
    monitor.abort();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let kept = k.ticket().await.expect("the held ticket");
    assert_eq!(kept.ticket, first.ticket);
    // Past its expiry there is none, and the dialer may retry (not a refusal).
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let e = k.credentials(node_kind::OSD).await.expect_err("expired");
    assert!(!e.refused, "{}", e.why);
    // Monitors that refuse: no ticket, and a refusal the dialer does not retry.
    let (addr, _m) = ticket_monitor(key.clone(), |_, _| {
        cairn_proto::msg::mon::TicketReply::Refused("no".into())
    })
    .await;
    let mons = MonClient::new(vec![addr]).with_timeout(Duration::from_millis(500));
    let k = auth::EntityKey::asking(auth::KeySource::fixed(key.0.clone(), key.1.clone()), mons);
    let e = k.credentials(node_kind::OSD).await.expect_err("refused");
    assert!(e.refused, "{}", e.why);
}

#[tokio::test]
async fn a_monitors_ticket_claims_are_bounded() {
    let key = test_key();
    // A lifetime that would overflow the clock is taken as a day at most.
    let (addr, _m) = ticket_monitor(key.clone(), |n, s| granted(n, s, u64::MAX)).await;
    let mons = keyed_mons(addr, &key);
    let t = mons
        .get_ticket(&key.0, std::slice::from_ref(&key.1))
        .await
        .expect("a ticket");
    assert!(t.expires_at <= tokio::time::Instant::now() + Duration::from_secs(86_400));
    // An oversized ticket, and a session secret sealed with another key, are refused.
    let (addr, _m) = ticket_monitor(key.clone(), |_, s| {
        let cairn_proto::msg::mon::TicketReply::Granted { session, .. } = granted(0, s, 60) else {
            unreachable!()
        };
        cairn_proto::msg::mon::TicketReply::Granted {
            ticket: vec![1; cairn_auth::MAX_TICKET + 1],
            session,
            ttl_secs: 60,
        }
    })
    .await;
    let mons = keyed_mons(addr, &key);
    let e = mons
        .get_ticket(&key.0, std::slice::from_ref(&key.1))
        .await
        .expect_err("too large");
    assert!(e.to_string().contains("at most"), "{e}");
    let (addr, _m) = ticket_monitor(key.clone(), |n, _| {
        granted(n, &cairn_auth::Secret::generate(), 60)
    })
    .await;
    let mons = keyed_mons(addr, &key);
    let e = mons
        .get_ticket(&key.0, std::slice::from_ref(&key.1))
        .await
        .expect_err("wrong key");
    assert!(e.to_string().contains("does not open with our key"), "{e}");
}
