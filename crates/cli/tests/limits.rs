//! Bounded resources on a real OSD: thousands of connections that never finish their
//! handshake or authenticate and then idle, a client that never reads its replies, a flood
//! of scrub requests. The OSD's memory (RSS, measured) stays bounded and another client is
//! served throughout.

mod common;

use cairn_auth::{Caps, Entity};
use cairn_proto::msg::osd::{OpKind, OpRequest, OP};
use cairn_proto::msg::scrub::{ScrubPg, SCRUB_PG};
use cairn_transport::{initiate, node_kind, write_frame};
use common::cluster::{runtime, Cluster};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib / 1024
}

async fn connect_from(src: &str, addr: &str) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(format!("{src}:0").parse().expect("source"))?;
    s.connect(addr.parse().expect("addr")).await
}

/// Whether the peer closed `s` (within `wait`).
async fn closed(s: &mut TcpStream, wait: Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(wait, s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// A write and a read by an ordinary client, within 15 s.
async fn served(client: &cairn_client::Client, pool: u32, what: &str) {
    let name = format!("still-served-{what}").into_bytes();
    let io = async {
        client.write_full(pool, &name, b"yes").await?;
        client.read(pool, &name, 0, 3).await
    };
    let got = tokio::time::timeout(Duration::from_secs(15), io)
        .await
        .unwrap_or_else(|_| panic!("{what}: the other client was not served within 15 s"))
        .unwrap_or_else(|e| panic!("{what}: the other client failed: {e}"));
    assert_eq!(got, b"yes");
}

/// A cluster of `osds` OSDs with pool `p` of (size, min_size, PGs), a runtime and a client.
fn cluster_with_pool(
    name: &str,
    osds: u32,
    (size, min_size, pgs): (u8, u8, u32),
) -> (Cluster, tokio::runtime::Runtime, cairn_client::Client, u32) {
    let c = Cluster::up(name, 1, osds);
    c.pool_create("p", size, min_size, pgs);
    let rt = runtime();
    let client = rt
        .block_on(cairn_client::Client::connect(c.client_config()))
        .expect("client");
    let pool = client.pool_id("p").expect("pool");
    (c, rt, client, pool)
}

#[test]
fn an_osd_stays_bounded_under_idle_connections_unread_replies_and_scrub_floods() {
    let (c, rt, client, pool) = cluster_with_pool("limits", 1, (1, 1, 8));
    let pid = c.pid("osd.0");
    let big = vec![7u8; 1 << 20];
    rt.block_on(client.write_full(pool, b"big", &big))
        .expect("write");
    let addr = client.map().osds[&0].addr.clone();
    let ticket = c.ticket_as(Entity::admin(), Caps::admin());
    let base = rss_mib(pid);
    let mut report = vec![format!("\"base_mib\": {base}")];
    rt.block_on(async {
        // 5,000 connections that never send their hello, from one host.
        let mut stalled = Vec::new();
        for _ in 0..5000 {
            stalled.push(connect_from("127.0.0.2", &addr).await.expect("connect"));
        }
        // 2,000 that authenticate and then idle, from another.
        let mut idle = Vec::new();
        for _ in 0..2000 {
            let Ok(mut s) = connect_from("127.0.0.3", &addr).await else {
                continue;
            };
            if initiate(&mut s, node_kind::CLIENT, &ticket).await.is_ok() {
                idle.push(s);
            }
        }
        let per_host = cairn_transport::ConnLimits::default().max_per_host;
        assert_eq!(
            idle.len(),
            per_host,
            "admitted idle connections from one host"
        );
        served(&client, pool, "idle").await;
        let grown = rss_mib(pid).saturating_sub(base);
        report.push(format!("\"idle_connections_mib\": {grown}"));
        assert!(grown < 48, "7,000 connections grew the OSD by {grown} MiB");
        // Past the handshake deadline every stalled connection is closed (those over the
        // per-host cap at once).
        tokio::time::sleep(Duration::from_secs(6)).await;
        let mut open = 0;
        for s in &mut stalled {
            if !closed(s, Duration::from_millis(50)).await {
                open += 1;
            }
        }
        assert_eq!(open, 0, "stalled handshakes still held after the deadline");
        drop(stalled);
        drop(idle);

        // A client that asks for 2 GiB of reads and never reads the answers.
        let mut greedy = connect_from("127.0.0.4", &addr).await.expect("connect");
        initiate(&mut greedy, node_kind::CLIENT, &ticket)
            .await
            .expect("handshake");
        let map = client.map();
        let pg = map.object_pg(pool, b"big").expect("pg");
        let read = OpRequest {
            epoch: map.epoch,
            pool,
            pg: pg.pg,
            object: b"big".to_vec(),
            kind: OpKind::Read {
                offset: 0,
                len: 1 << 20,
            },
            instance: 1,
        };
        let body = cairn_proto::msg::encode(&read);
        let flood = tokio::spawn(async move {
            for i in 0..2048u64 {
                if write_frame(&mut greedy, OP, i, &body, &[]).await.is_err() {
                    break;
                }
            }
            greedy
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        served(&client, pool, "unread replies").await;
        let grown = rss_mib(pid).saturating_sub(base);
        report.push(format!("\"unread_replies_mib\": {grown}"));
        assert!(grown < 160, "unread replies grew the OSD by {grown} MiB");
        flood.abort();

        // 10,000 scrub requests on one connection, answers never read.
        let mut scrubber = connect_from("127.0.0.5", &addr).await.expect("connect");
        initiate(&mut scrubber, node_kind::CLIENT, &ticket)
            .await
            .expect("handshake");
        let flood = tokio::spawn(async move {
            for i in 0..10_000u64 {
                let q = ScrubPg {
                    pool,
                    pg: (i % 8) as u32,
                    repair: false,
                };
                let body = cairn_proto::msg::encode(&q);
                if write_frame(&mut scrubber, SCRUB_PG, i, &body, &[])
                    .await
                    .is_err()
                {
                    break;
                }
            }
            scrubber
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        served(&client, pool, "scrub flood").await;
        let grown = rss_mib(pid).saturating_sub(base);
        report.push(format!("\"scrub_flood_mib\": {grown}"));
        assert!(grown < 160, "a scrub flood grew the OSD by {grown} MiB");
        flood.abort();
    });
    println!("{{{}}}", report.join(", "));
}

/// Writes held up by a hung replica pile up on their primary: one connection may have at most
/// `--max-requests-per-connection` of them (and their bytes) in flight; past that the OSD
/// reads nothing more from it, while other clients are served. The writes complete once the
/// replica answers again.
#[test]
fn a_connection_cannot_pile_up_requests_behind_a_hung_replica() {
    let (c, rt, client, pool) = cluster_with_pool("limits-inflight", 3, (2, 1, 16));
    let map = client.map();
    let pg = map.object_pg(pool, b"piled").expect("pg");
    let acting = map.pg_placement(pg).acting;
    let (primary, replica) = (acting[0], acting[1]);
    // An object whose PG the hung OSD has no part in, for the client that must be served.
    let free = (0..1000)
        .map(|i| format!("still-served-{i}"))
        .find(|n| {
            let pg = map.object_pg(pool, n.as_bytes()).expect("pg");
            !map.pg_placement(pg).acting.contains(&replica)
        })
        .expect("an object the hung OSD does not hold");
    let addr = map.osds[&primary].addr.clone();
    let ticket = c.ticket_as(Entity::admin(), Caps::admin());
    let pid = c.pid(&format!("osd.{primary}"));
    let limits = cairn_transport::RequestLimits::default();
    rt.block_on(async {
        let mut flooder = connect_from("127.0.0.6", &addr).await.expect("connect");
        initiate(&mut flooder, node_kind::CLIENT, &ticket)
            .await
            .expect("handshake");
        // The PG is active (peered) before its replica hangs: the writes then wait on the
        // replica, in the primary's table of writes in flight.
        client
            .write_full(pool, b"piled", b"first")
            .await
            .expect("first write");
        let base = rss_mib(pid);
        c.signal(&format!("osd.{replica}"), libc::SIGSTOP);
        let data = vec![5u8; 64 << 10];
        let flood = tokio::spawn(async move {
            for i in 0..3000u64 {
                let w = OpRequest {
                    epoch: map.epoch,
                    pool,
                    pg: pg.pg,
                    object: b"piled".to_vec(),
                    kind: OpKind::Write {
                        offset: (i % 64) * (64 << 10),
                    },
                    instance: 1,
                };
                let body = cairn_proto::msg::encode(&w);
                if write_frame(&mut flooder, OP, i, &body, &data)
                    .await
                    .is_err()
                {
                    break;
                }
            }
            flooder
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let stats = cairn_client::osd_stats(&addr, client.auth(), Duration::from_secs(2))
            .await
            .expect("stats");
        let grown = rss_mib(pid).saturating_sub(base);
        println!(
            "{{\"inflight\": {}, \"cap\": {}, \"rss_growth_mib\": {grown}}}",
            stats.inflight, limits.max_requests
        );
        assert!(
            stats.inflight as usize <= limits.max_requests,
            "{} writes in flight on the primary, over the per-connection cap of {}",
            stats.inflight,
            limits.max_requests
        );
        assert!(!flood.is_finished(), "all 3,000 writes were read");
        // The payloads (at most the 64 MiB byte cap) and their copies queued for the hung
        // replica; 3,000 such writes would be 375 MiB.
        assert!(grown < 220, "held-up writes grew the OSD by {grown} MiB");
        let io = async {
            client.write_full(pool, free.as_bytes(), b"yes").await?;
            client.read(pool, free.as_bytes(), 0, 3).await
        };
        let got = tokio::time::timeout(Duration::from_secs(5), io)
            .await
            .expect("another client served within 5 s")
            .expect("another client's write and read");
        assert_eq!(got, b"yes");
        c.signal(&format!("osd.{replica}"), libc::SIGCONT);
        // The flood gets read to its end once the replica answers (or is replaced).
        tokio::time::timeout(Duration::from_secs(60), flood)
            .await
            .expect("the rest of the flood read within 60 s")
            .expect("flood task");
    });
}

/// A request stops counting against its connection when it is answered, whatever the OSD
/// keeps of it afterwards (the last write of each object stays known to its PG): more
/// distinct objects than the per-connection cap are written one after another without a
/// stall, all to one PG: one connection to its primary, and one from the primary to each
/// replica, carry every write.
#[test]
fn answered_requests_stop_counting_against_their_connection() {
    let (_c, rt, client, pool) = cluster_with_pool("limits-answered", 3, (3, 2, 1));
    let writes = cairn_transport::RequestLimits::default().max_requests * 3 / 2;
    rt.block_on(async {
        for i in 0..writes {
            let name = format!("obj-{i}").into_bytes();
            tokio::time::timeout(
                Duration::from_secs(10),
                client.write_full(pool, &name, b"x"),
            )
            .await
            .unwrap_or_else(|_| panic!("write {i} of {writes} not answered within 10 s"))
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        }
    });
}
