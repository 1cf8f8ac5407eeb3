//! Connection limits over real loopback sockets: caps per host and in all, slots freed when
//! connections end, idle connections and trickled frames cut off.

use cairn_proto::Limits;
use cairn_transport::{write_frame, Admission, ConnLimits, ConnReader, ReadError};
use std::net::IpAddr;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

#[test]
fn admission_caps_connections_per_host_and_in_all() {
    let adm = Admission::new(ConnLimits {
        max_total: 5,
        max_per_host: 3,
        idle: Duration::from_secs(60),
    });
    let a: IpAddr = "127.0.0.2".parse().expect("ip");
    let b: IpAddr = "127.0.0.3".parse().expect("ip");
    let from_a: Vec<_> = (0..4).filter_map(|_| adm.admit(a)).collect();
    assert_eq!(from_a.len(), 3, "a host gets at most its share");
    let from_b: Vec<_> = (0..4).filter_map(|_| adm.admit(b)).collect();
    assert_eq!(from_b.len(), 2, "and all hosts together at most the total");
    assert_eq!(adm.count(), 5);
    drop(from_a);
    assert_eq!(adm.count(), 2, "ended connections free their slots");
    assert!(adm.admit(b).is_some(), "a freed slot is taken again");
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
    (c.expect("connect"), s.expect("accept").0)
}

#[test]
fn a_quiet_connection_is_cut_off_after_the_idle_limit_and_a_busy_one_is_not() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let limits = Limits::default();
        let idle = Duration::from_millis(1500);
        // Frames every 400 ms for 3 s (past the idle limit in all, never within one gap),
        // each read; then silence, and the connection ends within the limit.
        let (mut c, s) = pair().await;
        let (r, _w) = s.into_split();
        let mut reader = ConnReader::new(r, idle);
        let writer = tokio::spawn(async move {
            for i in 0..8u64 {
                write_frame(&mut c, 7, i, b"ping", &[]).await.expect("send");
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            c
        });
        for i in 0..8u64 {
            let f = reader.next(&limits).await.expect("a frame");
            assert_eq!(f.request_id, i);
        }
        let _c = writer.await.expect("writer");
        let quiet = Instant::now();
        match reader.next(&limits).await {
            Err(ReadError::Idle(d)) => assert_eq!(d, idle),
            other => panic!("expected idle, got {other:?}"),
        }
        let waited = quiet.elapsed();
        assert!(waited >= Duration::from_millis(1000), "{waited:?}");
        assert!(waited < Duration::from_secs(4), "{waited:?}");
        // A peer that starts a frame and never finishes it gets no longer than the limit.
        let (mut c, s) = pair().await;
        let (r, _w) = s.into_split();
        let mut reader = ConnReader::new(r, idle);
        c.write_all(b"CRNF\x05").await.expect("half a header");
        let started = Instant::now();
        assert!(matches!(
            reader.next(&limits).await,
            Err(ReadError::Idle(_))
        ));
        assert!(started.elapsed() < Duration::from_secs(4));
    });
}
