//! Malformed input. Instead of a handshake: the monitor closes the connection without a word
//! (the peer does not speak the framing). After a valid handshake: the monitor answers ERROR
//! and closes the connection. Either way it keeps serving the others.

use crate::common::*;
use cairn_mon::raft_net::RAFT_VOTE;
use cairn_proto::msg::decode;
use cairn_proto::msg::mon::{
    ErrorCode, ErrorReply, ERROR, GET_MAP, HEARTBEAT, MAP, MON_STATUS, MON_STATUS_REPLY,
    PAST_INTERVALS,
};
use cairn_proto::{Frame, Hello, Limits};
use cairn_transport::{node_kind, read_frame, write_frame, ReadError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads what the monitor sends until it closes: the frames, and whether it closed.
async fn until_closed(s: &mut TcpStream) -> Vec<Frame> {
    within(
        "the monitor closes the connection",
        Duration::from_secs(5),
        async {
            let mut frames = Vec::new();
            loop {
                match read_frame(s, &Limits::default()).await {
                    Ok(f) => frames.push(f),
                    Err(ReadError::Closed) | Err(ReadError::Io(_)) => return frames,
                    Err(e) => panic!("the monitor sent a bad frame: {e}"),
                }
            }
        },
    )
    .await
}

/// Reads raw bytes until the monitor closes (or resets) the connection, well before the
/// handshake timeout (5 s) would have closed it.
async fn bytes_until_closed(s: &mut TcpStream) -> Vec<u8> {
    within(
        "the monitor closes the connection",
        Duration::from_secs(2),
        async {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        },
    )
    .await
}

/// Asserts that the monitor sent nothing but (part of) its own handshake: no frame.
fn only_the_monitors_hello(got: &[u8]) {
    let hello = Hello::ours(node_kind::MON).encode().expect("hello");
    assert!(
        hello.starts_with(got),
        "expected at most the monitor's handshake, got {} bytes: {got:02x?}",
        got.len()
    );
}

fn junk(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The message of an `ERROR` frame, whose code must be `code`.
fn error_message(f: &Frame, code: ErrorCode) -> String {
    assert_eq!(f.msg_type, ERROR, "expected an ERROR frame");
    let e = decode::<ErrorReply>("error", &f.control).expect("error reply");
    assert_eq!(e.code, code, "{}", e.message);
    e.message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_gets_an_error_and_a_close_and_others_are_still_served() {
    let mut c = Cluster::start("garbage", 1, Duration::from_secs(4)).await;
    let addr = c.mons[0].addr();
    let client = c.client();
    client.get_map().await.expect("map");

    // A well-behaved connection that stays open throughout.
    let mut good = raw_connect(&addr).await;

    // Random bytes instead of a handshake: closed without a frame.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let _ = s.write_all(&junk(4096)).await;
    only_the_monitors_hello(&bytes_until_closed(&mut s).await);

    // A client that does not handshake (a valid frame first): the same.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let _ = write_frame(&mut s, MON_STATUS, 1, &[], &[]).await;
    only_the_monitors_hello(&bytes_until_closed(&mut s).await);

    // A handshake with a bad checksum.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let mut bad = Hello::ours(node_kind::CLIENT).encode().expect("hello");
    bad[12] ^= 1;
    let _ = s.write_all(&bad).await;
    only_the_monitors_hello(&bytes_until_closed(&mut s).await);

    // A connection closed halfway through its handshake.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let hello = Hello::ours(node_kind::CLIENT).encode().expect("hello");
    s.write_all(&hello[..7]).await.expect("send");
    drop(s);

    // After a valid handshake, random bytes: not a frame.
    let mut s = raw_connect(&addr).await;
    let _ = s.write_all(&junk(4096)).await;
    let frames = until_closed(&mut s).await;
    assert_eq!(frames.len(), 1, "one ERROR, then close");
    let why = error_message(&frames[0], ErrorCode::Malformed);
    assert!(why.contains("magic"), "{why}");

    // A valid frame whose control part is not a GetMap.
    let mut s = raw_connect(&addr).await;
    write_frame(&mut s, GET_MAP, 5, &[0xff; 11], &[])
        .await
        .expect("send");
    let frames = until_closed(&mut s).await;
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].request_id, 5);
    assert!(error_message(&frames[0], ErrorCode::Malformed).contains("malformed"));

    // A heartbeat reporting more PGs than allowed is refused as a whole.
    let too_many = cairn_proto::msg::mon::Heartbeat {
        osd: 0,
        up_from: 1,
        pgs: vec![
            cairn_proto::msg::mon::PgStarted {
                pool: 1,
                pg: 0,
                epoch: 1
            };
            cairn_proto::msg::mon::MAX_HEARTBEAT_PGS + 1
        ],
    };
    let mut s = raw_connect(&addr).await;
    let body = cairn_proto::msg::encode(&too_many);
    write_frame(&mut s, HEARTBEAT, 8, &body, &[])
        .await
        .expect("send");
    let frames = until_closed(&mut s).await;
    assert_eq!(frames.len(), 1, "one ERROR, then close");
    assert!(error_message(&frames[0], ErrorCode::Invalid).contains("over the limit"));

    // Commands larger than a command may be are refused before they are decoded.
    let huge = vec![0u8; cairn_mon::raft_net::MAX_COMMAND + 1];
    for t in [
        cairn_proto::msg::mon::COMMAND,
        cairn_proto::msg::mon::MEMBERS_COMMAND,
        cairn_proto::msg::mon::AUTH_COMMAND,
    ] {
        let mut s = raw_connect(&addr).await;
        write_frame(&mut s, t, 9, &huge, &[]).await.expect("send");
        let frames = until_closed(&mut s).await;
        assert_eq!(frames.len(), 1, "type {t}: one ERROR, then close");
        let why = error_message(&frames[0], ErrorCode::Invalid);
        assert!(why.contains("over the limit"), "type {t}: {why}");
    }

    // Malformed past-intervals queries, heartbeats (a PG list longer than its bytes) and
    // membership commands.
    for (t, body) in [
        (cairn_proto::msg::mon::MEMBERS_COMMAND, vec![0xff; 5]),
        (PAST_INTERVALS, vec![0xff; 9]),
        (PAST_INTERVALS, vec![]),
        (HEARTBEAT, vec![1, 2, 0xff, 0xff, 0xff, 0xff, 0x0f]),
    ] {
        let mut s = raw_connect(&addr).await;
        write_frame(&mut s, t, 7, &body, &[]).await.expect("send");
        let frames = until_closed(&mut s).await;
        assert_eq!(frames.len(), 1, "type {t}: one ERROR, then close");
        assert!(error_message(&frames[0], ErrorCode::Malformed).contains("malformed"));
    }

    // An unknown message type, and a peer message that is not one.
    for (t, body, code) in [
        (999u16, vec![], ErrorCode::Unsupported),
        (RAFT_VOTE, vec![1, 2, 3], ErrorCode::Malformed),
    ] {
        let mut s = raw_connect(&addr).await;
        write_frame(&mut s, t, 6, &body, &[]).await.expect("send");
        let frames = until_closed(&mut s).await;
        assert_eq!(frames.len(), 1, "type {t}");
        error_message(&frames[0], code);
    }

    // A well-formed vote from a monitor of another cluster: refused as not allowed.
    let vote = cairn_mon::raft_net::PeerRequest {
        fsid: [0xee; 16],
        from: 9,
        rpc: openraft::raft::VoteRequest::<cairn_mon::NodeId>::new(
            openraft::Vote::new(99, 9),
            None,
        ),
    };
    let mut s = raw_connect(&addr).await;
    let body = cairn_proto::msg::encode(&vote);
    write_frame(&mut s, RAFT_VOTE, 4, &body, &[])
        .await
        .expect("send");
    let frames = until_closed(&mut s).await;
    assert_eq!(frames.len(), 1, "one ERROR, then close");
    assert!(error_message(&frames[0], ErrorCode::Denied).contains("--fsid"));

    // A header announcing a huge body is refused from the header alone.
    let mut s = raw_connect(&addr).await;
    let hdr = cairn_proto::FrameHeader {
        version: cairn_proto::PROTOCOL_VERSION,
        flags: 0,
        msg_type: GET_MAP,
        request_id: 1,
        control_len: u32::MAX,
        data_len: 0,
        body_crc: 0,
    };
    s.write_all(&hdr.encode()).await.expect("send");
    let frames = until_closed(&mut s).await;
    assert!(error_message(&frames[0], ErrorCode::Malformed).contains("limit"));

    // A connection closed halfway through a frame.
    let mut s = raw_connect(&addr).await;
    let mut buf = Vec::new();
    cairn_transport::encode_parts(&mut buf, GET_MAP, 1, &[0; 40], &[]);
    s.write_all(&buf[..20]).await.expect("send");
    drop(s);

    // The monitor still serves the connection that behaved, and new ones.
    write_frame(&mut good, MON_STATUS, 1, &[], &[])
        .await
        .expect("send");
    let f = within(
        "status",
        Duration::from_secs(5),
        read_frame(&mut good, &Limits::default()),
    )
    .await
    .expect("reply");
    assert_eq!(f.msg_type, MON_STATUS_REPLY);
    client.command(pool("still")).await.expect("command");
    c.client().get_map().await.expect("a new client is served");
    write_frame(
        &mut good,
        GET_MAP,
        2,
        &cairn_proto::msg::encode(&cairn_proto::msg::mon::GetMap { have: 0 }),
        &[],
    )
    .await
    .expect("send");
    let f = within(
        "map",
        Duration::from_secs(5),
        read_frame(&mut good, &Limits::default()),
    )
    .await
    .expect("reply");
    assert_eq!(f.msg_type, MAP);
    let mut rest = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(100), good.read(&mut rest))
            .await
            .is_err(),
        "the good connection stays open"
    );
    c.stop(0).await;
}
