//! Frame protection after the handshake, over real TCP on 127.0.0.1: the mode both ends
//! agree on, request/reply sessions in each mode, and a relay in the middle that reads the
//! traffic (secure mode hides the payload, signed mode does not) or changes one byte (the
//! connection is closed and the changed frame never delivered).

use cairn_auth::{Caps, Entity, FrameMode, KeyRefusal, Secret};
use cairn_proto::auth::{AuthInit, AUTH_KEY};
use cairn_proto::Limits;
use cairn_transport::{
    accept, initiate_with, node_kind, ConnReader, Credentials, Dialer, Fixed, FrameSender, Known,
    Session, Verifier, VerifyError,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Knows one key, requires `frames` at least.
struct OneKey {
    entity: Entity,
    key: Secret,
    frames: FrameMode,
}

impl Verifier for OneKey {
    fn allow_none(&self) -> bool {
        false
    }
    fn key_for(&self, method: u8, _: &AuthInit, entity: &Entity) -> Result<Known, VerifyError> {
        assert_eq!(method, AUTH_KEY);
        if entity != &self.entity {
            return Err(KeyRefusal::UnknownEntity(entity.clone()).into());
        }
        Ok(Known {
            entity: entity.clone(),
            caps: Caps::default(),
            key: self.key.clone(),
        })
    }
    fn frames(&self) -> FrameMode {
        self.frames
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn alice() -> (Entity, Secret) {
    (
        Entity::parse("client.alice").expect("entity"),
        Secret::generate(),
    )
}

/// A server that requires `min` and answers every frame with the same frame (type + 1);
/// returns its address.
async fn echo_server(who: (Entity, Secret), min: FrameMode) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let v = Arc::new(OneKey {
        entity: who.0,
        key: who.1,
        frames: min,
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let v = v.clone();
            tokio::spawn(async move {
                let Ok(a) = accept(&mut s, node_kind::OSD, v.as_ref()).await else {
                    return;
                };
                let (sealer, opener) = cairn_transport::split_guards(a.guards);
                let (r, w) = s.into_split();
                let sender = FrameSender::new_guarded(w, sealer);
                let mut r = ConnReader::new(r, Duration::from_secs(30)).guarded(opener);
                // Any error ends the connection: a tampered frame (`ReadError::Tampered`)
                // is never answered.
                while let Ok(f) = r.next(&Limits::default()).await {
                    // Replies are held back while more requests are buffered, as an OSD's
                    // are: they wait in the send queue, their payloads held, in every mode.
                    if r.frame_buffered() {
                        cairn_transport::begin_batch();
                    }
                    let _ = sender.send_held(f.msg_type + 1, f.request_id, &f.control, f.data);
                    if !r.frame_buffered() {
                        cairn_transport::end_batch();
                    }
                }
                sender.close();
            });
        }
    });
    addr
}

fn dialer(who: &(Entity, Secret), wish: FrameMode) -> Dialer {
    let creds = Credentials::Key {
        entity: who.0.clone(),
        secret: who.1.clone(),
    };
    Dialer::new(node_kind::CLIENT, Arc::new(Fixed(creds))).frames(wish)
}

/// A session to `addr` as `who`, asking for `mode`.
async fn open_session(
    who: &(Entity, Secret),
    mode: FrameMode,
    addr: std::net::SocketAddr,
) -> Session {
    Session::open(
        &dialer(who, mode),
        &addr.to_string(),
        node_kind::OSD,
        Limits::default(),
    )
    .await
    .expect("session")
}

#[test]
fn both_ends_agree_on_the_stronger_mode() {
    rt().block_on(async {
        let who = alice();
        for (wish, min, want) in [
            (FrameMode::Plain, FrameMode::Plain, FrameMode::Plain),
            (FrameMode::Secure, FrameMode::Plain, FrameMode::Secure),
            (FrameMode::Plain, FrameMode::Signed, FrameMode::Signed),
            (FrameMode::Signed, FrameMode::Secure, FrameMode::Secure),
        ] {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = l.local_addr().expect("addr");
            let v = OneKey {
                entity: who.0.clone(),
                key: who.1.clone(),
                frames: min,
            };
            let creds = Credentials::Key {
                entity: who.0.clone(),
                secret: who.1.clone(),
            };
            let client = async move {
                let mut s = TcpStream::connect(addr).await.expect("connect");
                initiate_with(&mut s, node_kind::CLIENT, &creds, wish).await
            };
            let server = async {
                let (mut s, _) = l.accept().await.expect("accept");
                accept(&mut s, node_kind::OSD, &v).await
            };
            let (i, a) = tokio::join!(client, server);
            let (i, a) = (i.expect("initiator"), a.expect("acceptor"));
            assert_eq!((i.frames, a.peer.frames), (want, want), "{wish} / {min}");
            assert_eq!(i.guards.is_some(), want != FrameMode::Plain);
            assert_eq!(a.guards.is_some(), want != FrameMode::Plain);
        }
        // Protection needs authentication, on either side.
        let mut s = TcpStream::connect(echo_server(who.clone(), FrameMode::Plain).await)
            .await
            .expect("connect");
        let e = initiate_with(
            &mut s,
            node_kind::CLIENT,
            &Credentials::None,
            FrameMode::Signed,
        )
        .await
        .expect_err("no key");
        assert!(e.to_string().contains("need authentication"), "{e}");
    });
}

#[test]
fn sessions_carry_requests_and_replies_in_every_mode() {
    rt().block_on(async {
        let who = alice();
        for mode in [FrameMode::Plain, FrameMode::Signed, FrameMode::Secure] {
            let addr = echo_server(who.clone(), FrameMode::Plain).await;
            let s = open_session(&who, mode, addr).await;
            // Many in flight at once, large and small, in both parts.
            let s = Arc::new(s);
            let mut calls = tokio::task::JoinSet::new();
            for i in 0..64u32 {
                let s = s.clone();
                calls.spawn(async move {
                    let control = vec![i as u8; (i as usize * 37) % 300];
                    let data = vec![(i as u8) ^ 0x5a; (i as usize * 4099) % (1 << 17)];
                    let f = s
                        .call(40, &control, &data, Duration::from_secs(10))
                        .await
                        .expect("reply");
                    assert_eq!(
                        (f.msg_type, f.control, f.data),
                        (41, control, data),
                        "{mode}"
                    );
                });
            }
            while let Some(r) = calls.join_next().await {
                r.expect("call");
            }
        }
    });
}

/// Copies `from` to `to`, recording what passes in `seen` and XORing byte `flip.0` (counted
/// from the first byte) with `flip.1` when given.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    seen: Arc<Mutex<Vec<u8>>>,
    flip: Option<(usize, u8)>,
) {
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0usize;
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if let Some((at, x)) = flip.filter(|(at, _)| (total..total + n).contains(at)) {
            buf[at - total] ^= x;
        }
        seen.lock().expect("seen").extend_from_slice(&buf[..n]);
        total += n;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

/// A relay between a client and `server`: records every byte the client sends in `seen`,
/// and changes one byte of it (`up`) when given.
async fn relay(
    server: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<u8>>>,
    up: Option<(usize, u8)>,
) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((c, _)) = l.accept().await else { return };
        let s = TcpStream::connect(server).await.expect("connect server");
        let (cr, cw) = c.into_split();
        let (sr, sw) = s.into_split();
        tokio::join!(pump(cr, sw, seen, up), pump(sr, cw, Arc::default(), None));
    });
    addr
}

const MARKER: &[u8] = b"the quick brown fox jumps over the lazy dog";

#[test]
fn secure_mode_hides_what_signed_mode_shows_and_a_changed_byte_closes_the_connection() {
    rt().block_on(async {
        let who = alice();
        for (mode, visible) in [(FrameMode::Signed, true), (FrameMode::Secure, false)] {
            let server = echo_server(who.clone(), FrameMode::Plain).await;
            let seen = Arc::new(Mutex::new(Vec::new()));
            let via = relay(server, seen.clone(), None).await;
            let s = open_session(&who, mode, via).await;
            let f = s
                .call(40, MARKER, MARKER, Duration::from_secs(10))
                .await
                .expect("reply");
            assert_eq!(f.data, MARKER);
            let bytes = seen.lock().expect("seen").clone();
            let found = bytes.windows(MARKER.len()).any(|w| w == MARKER);
            assert_eq!(found, visible, "{mode}: payload visible on the wire");
            // The request is the last frame the client sent: its header's body crc is 0 (the
            // tag covers the body; a crc of the plaintext would help guess a secure body).
            let frame_len = cairn_proto::HEADER_LEN + 2 * MARKER.len() + cairn_auth::FRAME_TAGS_LEN;
            let header = &bytes[bytes.len() - frame_len..][..cairn_proto::HEADER_LEN];
            assert_eq!(&header[..4], b"CRNP", "{mode}: where the request starts");
            assert_eq!(header[24..28], [0; 4], "{mode}: body crc on the wire");
        }
        // A byte changed in flight, in the header, a part or a tag of the first frame after
        // the handshake: the server closes the connection and answers nothing.
        for mode in [FrameMode::Signed, FrameMode::Secure] {
            // Find where the handshake ends on an honest connection.
            let server = echo_server(who.clone(), FrameMode::Plain).await;
            let seen = Arc::new(Mutex::new(Vec::new()));
            let via = relay(server, seen.clone(), None).await;
            let s = open_session(&who, mode, via).await;
            s.call(40, MARKER, b"x", Duration::from_secs(10))
                .await
                .expect("honest");
            let header = cairn_proto::HEADER_LEN;
            let frame_len = header + MARKER.len() + 1 + cairn_auth::FRAME_TAGS_LEN;
            let handshake = seen.lock().expect("seen").len() - frame_len;
            // The request id, a control byte, the data byte, the last tag byte.
            for offset in [10, header + 3, header + MARKER.len(), frame_len - 1] {
                let server = echo_server(who.clone(), FrameMode::Plain).await;
                let via = relay(server, Arc::default(), Some((handshake + offset, 1))).await;
                let s = open_session(&who, mode, via).await;
                let r = s.call(40, MARKER, b"x", Duration::from_secs(5)).await;
                assert!(
                    r.is_err(),
                    "{mode}: byte {offset} changed, yet answered: {r:?}"
                );
            }
        }
    });
}

/// An OSD hands frames to a peer connection before it is open; they are sealed in order
/// when the connection opens, and later ones after them.
#[test]
fn frames_queued_before_the_connection_opens_are_sealed_in_order() {
    rt().block_on(async {
        let who = alice();
        for mode in [FrameMode::Signed, FrameMode::Secure] {
            let addr = echo_server(who.clone(), FrameMode::Plain).await;
            let sender = FrameSender::unconnected();
            for i in 0..5u64 {
                sender
                    .send(40, i, MARKER, &[i as u8; 3000])
                    .expect("queued");
            }
            let c = dialer(&who, mode)
                .dial(&addr.to_string(), node_kind::OSD)
                .await
                .expect("dial");
            let (sealer, mut opener) = cairn_transport::split_guards(c.guards);
            let (r, w) = c.stream.into_split();
            sender.attach_guarded(w, sealer).expect("attach");
            for i in 5..8u64 {
                sender.send(40, i, MARKER, &[i as u8; 3000]).expect("sent");
            }
            let mut r = tokio::io::BufReader::new(r);
            for i in 0..8u64 {
                let f = cairn_transport::read_guarded(&mut r, &Limits::default(), opener.as_mut())
                    .await
                    .expect("answer");
                assert_eq!((f.request_id, f.data), (i, vec![i as u8; 3000]), "{mode}");
            }
        }
    });
}

/// A relay that answers for the server as an attacker would: the server's challenge with
/// its mode set to `plain` and the hello re-encoded (so its crc checks), the rest as is.
async fn weakening_relay(server: std::net::SocketAddr) -> std::net::SocketAddr {
    use cairn_proto::auth::AuthChallenge;
    use cairn_proto::msg::{decode, encode};
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((c, _)) = l.accept().await else { return };
        let s = TcpStream::connect(server).await.expect("connect server");
        let (cr, mut cw) = c.into_split();
        let (mut sr, sw) = s.into_split();
        let down = async move {
            let mut head = [0u8; cairn_proto::HELLO_LEN];
            sr.read_exact(&mut head).await.expect("server hello");
            let auth_len = u16::from_le_bytes([head[8], head[9]]) as usize;
            let mut all = head.to_vec();
            all.resize(cairn_proto::HELLO_LEN + auth_len, 0);
            sr.read_exact(&mut all[cairn_proto::HELLO_LEN..])
                .await
                .expect("server auth");
            let (mut hello, _) = cairn_proto::Hello::decode(&all).expect("hello");
            let mut ch: AuthChallenge = decode("challenge", &hello.auth).expect("challenge");
            assert_eq!(
                ch.frames,
                FrameMode::Secure.to_u8(),
                "the server agreed to secure"
            );
            ch.frames = FrameMode::Plain.to_u8();
            hello.auth = encode(&ch);
            let forged = hello.encode().expect("encode");
            if cw.write_all(&forged).await.is_ok() {
                let _ = tokio::io::copy(&mut sr, &mut cw).await;
            }
        };
        tokio::join!(pump(cr, sw, Arc::default(), None), down);
    });
    addr
}

/// Someone in between lowers the protection the server answered (the mode in its
/// challenge): the client refuses the connection, since the server's proof covers it.
#[test]
fn a_weakened_answer_is_refused() {
    rt().block_on(async {
        let who = alice();
        let server = echo_server(who.clone(), FrameMode::Plain).await;
        let via = weakening_relay(server).await;
        let e = dialer(&who, FrameMode::Secure)
            .dial(&via.to_string(), node_kind::OSD)
            .await
            .expect_err("weakened");
        assert!(e.to_string().contains("could not prove"), "{e}");
    });
}
