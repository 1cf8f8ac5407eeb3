//! Mutual authentication in the handshake, over real TCP on 127.0.0.1: who gets in, who is
//! refused and why, and that nothing recorded from one connection opens another.

use cairn_auth::{seal_ticket, unix_now, Caps, Entity, KeyRefusal, Secret, ServiceKey, TicketBody};
use cairn_proto::auth::{AuthInit, AUTH_KEY, AUTH_TICKET};
use cairn_transport::{
    accept, initiate, node_kind, AllowNone, Credentials, HandshakeError, Known, Verifier,
    VerifyError,
};
use std::collections::HashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A monitor-like verifier (entity keys) that also opens tickets (an OSD's job).
struct Keys {
    keys: HashMap<Entity, Secret>,
    service: Vec<ServiceKey>,
}

impl Verifier for Keys {
    fn allow_none(&self) -> bool {
        false
    }
    fn key_for(&self, method: u8, init: &AuthInit, entity: &Entity) -> Result<Known, VerifyError> {
        if method == AUTH_TICKET {
            let t = cairn_auth::open_ticket(&self.service, &init.ticket, unix_now()).map_err(
                |error| VerifyError::Ticket {
                    entity: entity.clone(),
                    error,
                },
            )?;
            if &t.entity != entity {
                return Err(VerifyError::TicketOfAnother {
                    entity: entity.clone(),
                    holder: t.entity,
                });
            }
            return Ok(Known {
                entity: t.entity,
                caps: t.caps,
                key: t.session,
            });
        }
        assert_eq!(method, AUTH_KEY);
        let key = self
            .keys
            .get(entity)
            .ok_or_else(|| KeyRefusal::UnknownEntity(entity.clone()))?;
        Ok(Known {
            entity: entity.clone(),
            caps: Caps::admin(),
            key: key.clone(),
        })
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs one handshake between `creds` and a server with `verifier`; returns both outcomes.
async fn pair(
    verifier: &dyn Verifier,
    kind: u8,
    creds: Credentials,
) -> (
    Result<cairn_transport::Initiated, HandshakeError>,
    Result<cairn_transport::Accepted, HandshakeError>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let client = async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        initiate(&mut s, kind, &creds).await
    };
    let server = async {
        let (mut s, _) = l.accept().await.expect("accept");
        accept(&mut s, node_kind::OSD, verifier).await
    };
    tokio::join!(client, server)
}

fn setup() -> (Keys, Entity, Secret) {
    let me = Entity::parse("client.alice").expect("entity");
    let key = Secret::generate();
    let keys = Keys {
        keys: HashMap::from([(me.clone(), key.clone())]),
        service: vec![ServiceKey {
            id: 1,
            secret: Secret::generate(),
        }],
    };
    (keys, me, key)
}

#[test]
fn the_right_key_gets_in_and_both_sides_share_a_fresh_session_key() {
    rt().block_on(async {
        let (v, me, key) = setup();
        let creds = Credentials::Key {
            entity: me.clone(),
            secret: key,
        };
        let (i, a) = pair(&v, node_kind::CLIENT, creds.clone()).await;
        let (i, a) = (i.expect("initiator"), a.expect("acceptor"));
        assert_eq!(a.peer.entity.as_ref(), Some(&me));
        assert_eq!(a.peer.caps, Caps::admin());
        assert_eq!(i.session.as_ref(), a.peer.session.as_ref());
        let (i2, _) = pair(&v, node_kind::CLIENT, creds).await;
        assert_ne!(
            i.session,
            i2.expect("again").session,
            "fresh per connection"
        );
    });
}

#[test]
fn wrong_unknown_missing_and_misplaced_credentials_are_refused_with_a_reason() {
    rt().block_on(async {
        let (v, me, _) = setup();
        // The wrong key: the server's proof does not check out for the client, and the server
        // sees the client give up without a proof.
        let (i, a) = pair(
            &v,
            node_kind::CLIENT,
            Credentials::Key {
                entity: me.clone(),
                secret: Secret::generate(),
            },
        )
        .await;
        assert!(matches!(i, Err(HandshakeError::PeerProof(_))), "{i:?}");
        let e = a.expect_err("a wrong key is refused").to_string();
        assert!(e.contains("client.alice"), "{e}");
        // An entity the server does not know.
        let bob = Entity::parse("client.bob").expect("entity");
        let (i, a) = pair(
            &v,
            node_kind::CLIENT,
            Credentials::Key {
                entity: bob,
                secret: Secret::generate(),
            },
        )
        .await;
        let e = i.expect_err("unknown").to_string();
        assert!(e.contains("unknown entity client.bob"), "{e}");
        assert!(matches!(a, Err(HandshakeError::Denied(_))));
        // No credentials at a server that requires them.
        let (i, a) = pair(&v, node_kind::CLIENT, Credentials::None).await;
        let e = i.expect_err("none").to_string();
        assert!(e.contains("requires authentication"), "{e}");
        assert!(a.is_err());
        // A client key claiming to be an OSD node.
        let (i, _) = pair(
            &v,
            node_kind::OSD,
            Credentials::Key {
                entity: me.clone(),
                secret: v.keys[&me].clone(),
            },
        )
        .await;
        let e = i.expect_err("kind").to_string();
        assert!(e.contains("client.alice cannot connect as a OSD"), "{e}");
        // A server without authentication refuses credentials it cannot check...
        let keyed = Credentials::Key {
            entity: me.clone(),
            secret: v.keys[&me].clone(),
        };
        let (i, _) = pair(&AllowNone, node_kind::CLIENT, keyed.clone()).await;
        let e = i.expect_err("refused").to_string();
        assert!(e.contains("runs without authentication"), "{e}");
        // ...and a client holding a key refuses a server that answers with a plain hello
        // (an impostor that cannot prove the key).
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let impostor = async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let mut head = [0u8; 16];
            let _ = s.read_exact(&mut head).await;
            let plain = cairn_proto::Hello::ours(node_kind::OSD)
                .encode()
                .expect("hello");
            let _ = s.write_all(&plain).await;
            s
        };
        let client = async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            initiate(&mut s, node_kind::CLIENT, &keyed).await
        };
        let (i, _s) = tokio::join!(client, impostor);
        assert!(
            matches!(i, Err(HandshakeError::Unauthenticated)),
            "a server that does not authenticate is refused: {i:?}"
        );
        // And the server that allows none lets an anonymous peer in, as anonymous.
        let (i, a) = pair(&AllowNone, node_kind::CLIENT, Credentials::None).await;
        assert!(i.is_ok());
        assert_eq!(a.expect("none").peer.entity, None);
    });
}

#[test]
fn tickets_get_in_only_while_valid_and_only_for_their_entity() {
    rt().block_on(async {
        let (v, me, _) = setup();
        let session = Secret::generate();
        let body = |entity: Entity, expires| TicketBody {
            entity,
            caps: Caps {
                osd: "r pool=a".into(),
                ..Caps::default()
            },
            session: session.clone(),
            expires,
        };
        let good = seal_ticket(&v.service[0], &body(me.clone(), unix_now() + 60));
        let creds = |ticket: Vec<u8>, entity: Entity| Credentials::Ticket {
            entity,
            ticket,
            session: session.clone(),
        };
        let (i, a) = pair(&v, node_kind::CLIENT, creds(good.clone(), me.clone())).await;
        assert!(i.is_ok(), "{i:?}");
        assert_eq!(a.expect("ticket").peer.caps.osd, "r pool=a");
        let expired = seal_ticket(&v.service[0], &body(me.clone(), unix_now() - 10));
        let (i, _) = pair(&v, node_kind::CLIENT, creds(expired, me.clone())).await;
        assert!(i.expect_err("expired").to_string().contains("expired"));
        // Someone else's ticket, without its session secret: refused.
        let bob = Entity::parse("client.bob").expect("entity");
        let (i, _) = pair(&v, node_kind::CLIENT, creds(good.clone(), bob)).await;
        assert!(i
            .expect_err("stolen")
            .to_string()
            .contains("client.bob presented a ticket issued to"));
        let (i, a) = pair(
            &v,
            node_kind::CLIENT,
            Credentials::Ticket {
                entity: me.clone(),
                ticket: good,
                session: Secret::generate(),
            },
        )
        .await;
        assert!(i.is_err() && a.is_err(), "a ticket without its secret");
    });
}

/// An attacker who recorded a whole successful handshake replays the initiator's bytes: the
/// server's fresh nonce makes the recorded proof worthless.
#[test]
fn a_replayed_handshake_is_refused() {
    rt().block_on(async {
        let (v, me, key) = setup();
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        // Record what an honest client sends, through a relay.
        let creds = Credentials::Key {
            entity: me,
            secret: key,
        };
        let relay = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let relay_addr = relay.local_addr().expect("addr");
        let client = async move {
            let mut s = TcpStream::connect(relay_addr).await.expect("connect");
            initiate(&mut s, node_kind::CLIENT, &creds).await
        };
        let record = async {
            let (mut c, _) = relay.accept().await.expect("accept");
            let mut up = TcpStream::connect(addr).await.expect("connect");
            let (mut cr, mut cw) = c.split();
            let (mut ur, mut uw) = up.split();
            let mut sent = Vec::new();
            let mut buf = [0u8; 8192];
            // Client -> server until the client is done, server -> client alongside.
            let to_server = async {
                loop {
                    let n = cr.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    sent.extend_from_slice(&buf[..n]);
                    if uw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            };
            let to_client = async {
                let mut b = [0u8; 8192];
                loop {
                    let n = ur.read(&mut b).await.unwrap_or(0);
                    if n == 0 || cw.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
                tokio::join!(to_server, to_client)
            })
            .await;
            sent
        };
        let server = async {
            let (mut s, _) = l.accept().await.expect("accept");
            accept(&mut s, node_kind::OSD, &v).await
        };
        let (i, sent, a) = tokio::join!(client, record, server);
        assert!(
            i.is_ok() && a.is_ok(),
            "the honest handshake works through the relay"
        );
        // Replay every recorded byte on a new connection.
        let replay = async {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(&sent).await.expect("replay");
            let mut sink = Vec::new();
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(1), s.read_to_end(&mut sink))
                    .await;
        };
        let server = async {
            let (mut s, _) = l.accept().await.expect("accept");
            accept(&mut s, node_kind::OSD, &v).await
        };
        let (_, a) = tokio::join!(replay, server);
        let e = a.expect_err("a replay is refused").to_string();
        assert!(e.contains("failed to prove its key"), "{e}");
    });
}

/// Hellos no honest initiator sends: an unknown method, auth data that is no `AuthInit`, an
/// entity name that does not parse. Each is refused with its reason, none panics the acceptor.
#[test]
fn malformed_authentication_is_refused_with_its_reason() {
    use cairn_proto::msg::encode;
    use cairn_proto::Hello;
    rt().block_on(async {
        let (v, _, _) = setup();
        let init = |entity: &str| {
            encode(&AuthInit {
                entity: entity.into(),
                key_id: [0; 8],
                frames: 0,
                nonce: [0; 32],
                ticket: Vec::new(),
            })
        };
        for (method, auth, want) in [
            (7u8, Vec::new(), "authentication method 7 is not supported"),
            (AUTH_KEY, vec![0xff; 40], "malformed auth init"),
            (AUTH_KEY, init("client.a b"), "is not an entity name"),
        ] {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = l.local_addr().expect("addr");
            let hello = Hello {
                auth_method: method,
                auth,
                ..Hello::ours(node_kind::CLIENT)
            };
            let client = async move {
                let mut s = TcpStream::connect(addr).await.expect("connect");
                s.write_all(&hello.encode().expect("encode"))
                    .await
                    .expect("send");
                let mut reply = Vec::new();
                let _ = s.read_to_end(&mut reply).await;
                reply
            };
            let server = async {
                let (mut s, _) = l.accept().await.expect("accept");
                accept(&mut s, node_kind::OSD, &v).await
            };
            let (reply, a) = tokio::join!(client, server);
            let e = a.expect_err("refused").to_string();
            assert!(e.contains(want), "{e}");
            let (h, _) = Hello::decode(&reply).expect("a refusal hello");
            assert_eq!(h.auth_method, cairn_proto::auth::AUTH_REFUSED);
        }
    });
}
