//! The connection layer over real loopback sockets: dialing, multiplexed calls, deadlines,
//! typed refusals, connections that end, senders that queue until connected, backpressure.

use cairn_proto::msg::{encode, ErrorCode, ErrorReply};
use cairn_proto::Limits;
use cairn_transport::{
    accept, node_kind, read_frame, write_frame, AllowNone, CallError, DialError, Dialer,
    FrameSender, NoAuth, Session,
};
use std::time::Duration;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

const LIMITS: Limits = Limits {
    max_control: 1 << 20,
    max_data: 1 << 20,
};
const ERROR: u16 = cairn_proto::msg::osd::ERROR;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A listener and a session dialed to it, with the server's end of the connection after
/// its handshake (as an OSD).
async fn pair() -> (Session, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let server = async {
        let (mut s, _) = l.accept().await.expect("accept");
        accept(&mut s, node_kind::OSD, &AllowNone)
            .await
            .expect("handshake");
        s
    };
    let dialer = Dialer::new(node_kind::CLIENT, std::sync::Arc::new(NoAuth));
    let (session, server) = tokio::join!(
        Session::open(&dialer, &addr, node_kind::OSD, LIMITS),
        server
    );
    (session.expect("session"), server)
}

#[test]
fn replies_in_any_order_reach_their_own_callers() {
    rt().block_on(async {
        let (session, mut server) = pair().await;
        let serve = async {
            let mut reqs = Vec::new();
            for _ in 0..8 {
                reqs.push(read_frame(&mut server, &LIMITS).await.expect("request"));
            }
            // Answer last first, echoing each request's data.
            for f in reqs.iter().rev() {
                write_frame(&mut server, 2, f.request_id, b"", &f.data)
                    .await
                    .expect("reply");
            }
        };
        let calls = (0..8u8).map(|i| {
            let s = &session;
            async move {
                let f = s
                    .call_for(1, 2, b"", &[i; 5], Duration::from_secs(10))
                    .await
                    .expect("reply");
                assert_eq!(f.data, vec![i; 5], "call {i} got another call's reply");
            }
        });
        let calls = futures_join_all(calls.collect());
        tokio::join!(serve, calls);
        assert_eq!(session.in_flight(), 0);
    });
}

/// Runs futures concurrently on the current task (no extra dependency for join_all).
async fn futures_join_all<F: std::future::Future<Output = ()>>(fs: Vec<F>) {
    let mut set = Vec::new();
    for f in fs {
        set.push(Box::pin(f));
    }
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

#[test]
fn a_late_reply_is_dropped_never_taken_for_the_next_one() {
    rt().block_on(async {
        let (session, mut server) = pair().await;
        let first = session.call(1, b"", b"a", Duration::from_millis(100)).await;
        assert!(matches!(first, Err(CallError::Timeout { .. })), "{first:?}");
        let late = read_frame(&mut server, &LIMITS)
            .await
            .expect("first request");
        let serve = async {
            write_frame(&mut server, 2, late.request_id, b"", b"late")
                .await
                .expect("late reply");
            let next = read_frame(&mut server, &LIMITS)
                .await
                .expect("second request");
            write_frame(&mut server, 2, next.request_id, b"", b"fresh")
                .await
                .expect("reply");
        };
        let call = session.call(1, b"", b"b", Duration::from_secs(10));
        let (_, got) = tokio::join!(serve, call);
        assert_eq!(got.expect("second call").data, b"fresh");
    });
}

#[test]
fn an_error_reply_is_a_typed_refusal() {
    rt().block_on(async {
        let (session, mut server) = pair().await;
        let serve = async {
            let f = read_frame(&mut server, &LIMITS).await.expect("request");
            let e = ErrorReply::new(ErrorCode::NotFound, "pg 9.0 does not exist");
            write_frame(&mut server, ERROR, f.request_id, &encode(&e), b"")
                .await
                .expect("reply");
        };
        let call = session.call(1, b"", b"", Duration::from_secs(10));
        let (_, got) = tokio::join!(serve, call);
        match got {
            Err(CallError::Refused { code, message, .. }) => {
                assert_eq!(code, ErrorCode::NotFound);
                assert!(message.contains("9.0"), "{message}");
            }
            other => panic!("not a refusal: {other:?}"),
        }
    });
}

#[test]
fn waiting_calls_fail_when_the_connection_ends_and_say_why() {
    rt().block_on(async {
        let (session, mut server) = pair().await;
        let serve = async {
            read_frame(&mut server, &LIMITS).await.expect("request");
            // A refusal of the connection itself (request id 0), then the close.
            let e = ErrorReply::new(ErrorCode::Malformed, "bad frame");
            write_frame(&mut server, ERROR, 0, &encode(&e), b"")
                .await
                .expect("error");
            drop(server);
        };
        let call = session.call(1, b"", b"", Duration::from_secs(10));
        let (_, got) = tokio::join!(serve, call);
        match got {
            Err(CallError::Closed { why, .. }) => assert!(why.contains("bad frame"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(!session.is_open());
        let again = session.call(1, b"", b"", Duration::from_secs(1)).await;
        assert!(matches!(again, Err(CallError::Closed { .. })), "{again:?}");
    });
}

#[test]
fn dialing_checks_the_peer_kind_and_gives_up_on_silence() {
    rt().block_on(async {
        // A monitor where an OSD was expected.
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let server = async {
            let (mut s, _) = l.accept().await.expect("accept");
            let _ = accept(&mut s, node_kind::MON, &AllowNone).await;
            s
        };
        let client = Dialer::new(node_kind::CLIENT, std::sync::Arc::new(NoAuth));
        let dial = client.dial(&addr, node_kind::OSD);
        let (got, _s) = tokio::join!(dial, server);
        match got {
            Err(DialError::WrongPeer { want, got, .. }) => {
                assert_eq!((want, got), (node_kind::OSD, node_kind::MON));
            }
            other => panic!("{other:?}"),
        }
        // A listener that never answers the handshake.
        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = silent.local_addr().expect("addr").to_string();
        let dialer = Dialer::new(node_kind::CLIENT, std::sync::Arc::new(NoAuth))
            .timeout(Duration::from_millis(200));
        let got = dialer.dial(&addr, node_kind::OSD).await;
        assert!(matches!(got, Err(DialError::Timeout { .. })), "{got:?}");
        // Nobody listening.
        drop(silent);
        let got = dialer.dial(&addr, node_kind::OSD).await;
        assert!(matches!(got, Err(DialError::Connect { .. })), "{got:?}");
    });
}

/// A loopback connection: the client's halves, and the server's end.
async fn loopback() -> (OwnedReadHalf, OwnedWriteHalf, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (c, a) = tokio::join!(
        TcpStream::connect(l.local_addr().expect("addr")),
        l.accept()
    );
    let (r, w) = c.expect("connect").into_split();
    (r, w, a.expect("accept").0)
}

#[test]
fn an_unconnected_sender_queues_until_attached_and_a_closed_one_refuses() {
    rt().block_on(async {
        let sender = FrameSender::unconnected();
        for i in 1..=3u64 {
            sender.send(7, i, b"c", &[i as u8; 2]).expect("queued");
        }
        assert!(sender.queued_bytes() > 0);
        let (_r, w, mut peer) = loopback().await;
        assert!(sender.attach(w).is_ok());
        for i in 1..=3u64 {
            let f = read_frame(&mut peer, &LIMITS).await.expect("frame");
            assert_eq!((f.msg_type, f.request_id, f.data), (7, i, vec![i as u8; 2]));
        }
        let never = FrameSender::unconnected();
        never.close();
        assert!(never.send(7, 1, b"", b"").is_err());
    });
}

#[test]
fn wait_below_holds_until_the_peer_reads() {
    rt().block_on(async {
        let (_r, w, mut peer) = loopback().await;
        let sender = FrameSender::new(w);
        let chunk = vec![0u8; 512 << 10];
        // Far more than the socket buffers take: the rest queues.
        for i in 0..64u64 {
            sender.send(1, i, b"", &chunk).expect("send");
        }
        let limit = 1 << 20;
        assert!(sender.queued_bytes() > limit);
        let held = tokio::time::timeout(Duration::from_millis(200), sender.wait_below(limit)).await;
        assert!(
            held.is_err(),
            "wait_below returned while the peer read nothing"
        );
        let read_all = async {
            for _ in 0..64 {
                read_frame(&mut peer, &LIMITS).await.expect("frame");
            }
        };
        let (_, ()) = tokio::join!(read_all, sender.wait_below(limit));
        assert!(sender.queued_bytes() <= limit);
    });
}

/// A shared payload, as an OSD holds one (the frame's buffer).
struct Shared(std::sync::Arc<Vec<u8>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[test]
fn queued_payloads_sent_held_are_not_copied_and_arrive_in_order() {
    rt().block_on(async {
        let (_r, w, mut peer) = loopback().await;
        let sender = FrameSender::new(w);
        let payloads: Vec<_> = (0..48u8)
            .map(|i| std::sync::Arc::new(vec![i; 256 << 10]))
            .collect();
        // Far more than the socket buffers take while the peer reads nothing: most frames
        // queue, held ones by reference; small and borrowed ones between them are copied.
        for (i, p) in payloads.iter().enumerate() {
            let id = i as u64;
            if i % 3 == 0 {
                sender.send(1, id, b"borrowed", p).expect("send");
            } else {
                sender
                    .send_held(1, id, b"held", Shared(p.clone()))
                    .expect("send");
            }
            sender
                .send_held(2, id, b"small", vec![i as u8; 100])
                .expect("send");
        }
        let held_in_queue = payloads
            .iter()
            .filter(|p| std::sync::Arc::strong_count(p) > 1)
            .count();
        assert!(
            held_in_queue >= 20,
            "only {held_in_queue} payloads held by the queue ({} bytes queued)",
            sender.queued_bytes()
        );
        for (i, p) in payloads.iter().enumerate() {
            let f = read_frame(&mut peer, &LIMITS).await.expect("frame");
            let ctl: &[u8] = if i % 3 == 0 { b"borrowed" } else { b"held" };
            assert_eq!(
                (f.msg_type, f.request_id, &f.control[..]),
                (1, i as u64, ctl)
            );
            assert!(f.data == **p, "payload {i} changed on the way");
            let f = read_frame(&mut peer, &LIMITS).await.expect("frame");
            assert_eq!((f.msg_type, f.data), (2, vec![i as u8; 100]));
        }
        sender.wait_below(0).await;
        assert!(
            payloads
                .iter()
                .all(|p| std::sync::Arc::strong_count(p) == 1),
            "the queue let go of every payload once written"
        );
    });
}

/// A command-line tool runs each request on a runtime of its own: a session opened on a
/// runtime that has ended must say it is closed (its reader is gone), not swallow replies.
#[test]
fn a_session_outlives_its_runtime_only_as_closed() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().expect("accept");
        s.set_nonblocking(true).expect("nonblocking");
        rt().block_on(async {
            let mut s = TcpStream::from_std(s).expect("adopt");
            accept(&mut s, node_kind::OSD, &AllowNone)
                .await
                .expect("handshake");
            while let Ok(f) = read_frame(&mut s, &LIMITS).await {
                let _ = write_frame(&mut s, 2, f.request_id, b"", b"").await;
            }
        });
    });
    let session = rt().block_on(async {
        let s = Session::open(
            &Dialer::new(node_kind::CLIENT, std::sync::Arc::new(NoAuth)),
            &addr,
            node_kind::OSD,
            LIMITS,
        )
        .await
        .expect("session");
        s.call(1, b"", b"", Duration::from_secs(10))
            .await
            .expect("first call");
        s
    });
    assert!(!session.is_open());
    let got = rt().block_on(session.call(1, b"", b"", Duration::from_secs(10)));
    assert!(matches!(got, Err(CallError::Closed { .. })), "{got:?}");
    drop(session);
    server.join().expect("server");
}

/// A typed call decodes its reply; a reply of the right type whose control part does not
/// decode is `Malformed` (naming the peer and the reply), and one of another type
/// `Unexpected`.
#[test]
fn a_typed_call_decodes_its_reply_and_refuses_one_that_does_not_decode() {
    use cairn_proto::msg::call::Call;
    const CALL: Call<u32, u64> = Call::new(1, 2, "number");
    rt().block_on(async {
        let (session, mut server) = pair().await;
        let serve = async {
            for (reply_type, control) in [(2u16, encode(&7u64)), (2, vec![0xff; 11]), (3, vec![])] {
                let f = read_frame(&mut server, &LIMITS).await.expect("request");
                assert_eq!(f.control, encode(&5u32), "the request is the encoded value");
                write_frame(&mut server, reply_type, f.request_id, &control, b"d")
                    .await
                    .expect("reply");
            }
        };
        let calls = async {
            let t = Duration::from_secs(10);
            let ok = session.ask(CALL, &5, &[], t).await.expect("a good reply");
            assert_eq!(ok, (7, b"d".to_vec()));
            match session.ask(CALL, &5, &[], t).await {
                Err(CallError::Malformed { error, .. }) => assert_eq!(error.what, "number"),
                other => panic!("a reply that does not decode gave {other:?}"),
            }
            match session.ask(CALL, &5, &[], t).await {
                Err(CallError::Unexpected {
                    got: 3, want: 2, ..
                }) => {}
                other => panic!("a reply of another type gave {other:?}"),
            }
        };
        tokio::join!(serve, calls);
    });
}
