//! Never serving the past: a PG whose newest acknowledged writes may be on OSDs that are all
//! down waits (`down`) instead of going active with older copies, until one of them returns
//! or an operator declares them lost; the monitors keep the map history such a PG needs.

mod common;

use cairn_client::{Client, ClientError};
use common::cluster::{runtime, wait_osd, Cluster};
use std::time::{Duration, Instant};

/// A client whose ops give up after `secs` (a down PG answers only at the deadline).
async fn client_with_deadline(c: &Cluster, secs: u64) -> Client {
    let mut cfg = c.client_config();
    cfg.op_timeout = Duration::from_secs(secs);
    Client::connect(cfg).await.expect("connect a client")
}

/// Polls `cairn status --json` until `f` holds (30 s at most).
fn wait_status(
    c: &Cluster,
    what: &str,
    f: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let s = c.status();
        if f(&s) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "status never showed {what}: {s:#}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `cairn pg query PG --json` parsed.
fn pg_query(c: &Cluster, pg: &str) -> serde_json::Value {
    serde_json::from_str(&c.ok(&["pg", "query", pg, "--json"])).expect("pg query json")
}

/// The story on two OSDs (pool `pi`, size 2, min_size 1, one PG): `x` = v1 on both;
/// osd.1 killed, `x` = v2 acknowledged by osd.0 alone; osd.0 killed; osd.1 started alone.
/// Returns the client (osd.1 up, osd.0 down) and the pool id.
async fn story(c: &Cluster) -> (Client, u32) {
    c.pool_create("pi", 2, 1, 1);
    let client = c.client().await;
    let pool = client.pool_id("pi").expect("pool");
    client.write_full(pool, b"x", b"v1").await.expect("v1");
    c.kill9("osd.1");
    wait_osd(&client, 1, false).await;
    client
        .write_full(pool, b"x", b"v2")
        .await
        .expect("v2 on osd.0 alone");
    c.kill9("osd.0");
    wait_osd(&client, 0, false).await;
    c.start_osd(1);
    wait_osd(&client, 1, true).await;
    (client, pool)
}

/// The PG is down waiting for osd.0: reads and writes fail at their deadline with the
/// reason, nothing older is served, and status and `pg query` say why.
async fn assert_down_waiting_for_osd0(c: &Cluster, pool: u32) {
    let short = client_with_deadline(c, 6).await;
    match short.read(pool, b"x", 0, 1024).await {
        Err(ClientError::Timeout { last, .. }) => assert!(
            last.contains("PG 1.0 is down: waiting for osd.0 (may hold newer writes"),
            "unexpected reason: {last}"
        ),
        other => panic!(
            "a read of a down PG must wait and fail, got {:?}\n{}",
            other.map(|v| String::from_utf8_lossy(&v).into_owned()),
            c.logs()
        ),
    }
    // A write must not be taken either: it would make osd.1's older history the newest.
    let w = short.write_full(pool, b"x", b"v3").await;
    assert!(
        matches!(w, Err(ClientError::Timeout { .. })),
        "write to a down PG: {w:?}"
    );
    let s = wait_status(c, "pg 1.0 down", |s| s["pgs"]["down"] == 1);
    assert_eq!(s["health"], "HEALTH_ERR");
    assert_eq!(s["down_pgs"][0]["pg"], "1.0");
    assert_eq!(s["down_pgs"][0]["osds"], serde_json::json!([0]));
    let q = pg_query(c, "1.0");
    assert_eq!(q["state"], "down", "{q:#}");
    assert_eq!(q["waiting_for"], serde_json::json!([0]));
    let waiting: Vec<&serde_json::Value> = q["intervals"]
        .as_array()
        .expect("intervals")
        .iter()
        .filter(|i| i["waiting_for"] == serde_json::json!([0]))
        .collect();
    assert_eq!(waiting.len(), 1, "one interval (osd.0 alone) waits: {q:#}");
    assert_eq!(waiting[0]["interval"]["acting"], serde_json::json!([0]));
    assert_eq!(waiting[0]["interval"]["maybe_went_rw"], true);
}

#[test]
fn a_pg_whose_newest_writes_are_on_a_down_osd_waits_and_serves_them_when_it_returns() {
    // The history is trimmed as soon as no PG needs it (keep 0 epochs beyond that).
    let c = Cluster::up_with("pi-wait", 1, 2, &["--history-keep", "0"]);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = story(&c).await;
        assert_down_waiting_for_osd0(&c, pool).await;
        // Many epochs pass while the PG is down (the down OSD's weight toggled; with two
        // OSDs and two copies placement does not change): the monitors trim their history,
        // but never past what the down PG needs.
        let needed = pg_query(&c, "1.0")["last_epoch_started"]
            .as_u64()
            .expect("les");
        for i in 0..30 {
            let w = if i % 2 == 0 { "0.5" } else { "1" };
            c.ok(&["osd", "reweight", "0", w]);
        }
        let s = wait_status(&c, "a trimmed map history", |s| {
            s["mons"]["history_oldest_epoch"].as_u64() > Some(1)
        });
        let oldest = s["mons"]["history_oldest_epoch"].as_u64().expect("oldest");
        assert!(
            oldest <= needed,
            "history trimmed to epoch {oldest}, past epoch {needed} the down PG needs"
        );
        // osd.0 returns: the PG peers with it and serves v2, the last acknowledged value.
        c.start_osd(0);
        wait_osd(&client, 0, true).await;
        let v = client
            .read(pool, b"x", 0, 1024)
            .await
            .expect("read once osd.0 is back");
        assert_eq!(v, b"v2", "the newest acknowledged value");
        let s = wait_status(&c, "no pg down", |s| s["pgs"]["down"] == 0);
        assert!(s["lost_write_pgs"].as_array().is_some_and(|v| v.is_empty()));
        assert_eq!(pg_query(&c, "1.0")["state"], "active");
        // With the PG active again, the history is trimmed past that epoch.
        wait_status(&c, "the history trimmed further", |s| {
            s["mons"]["history_oldest_epoch"].as_u64() > Some(needed)
        });
    });
}

#[test]
fn an_osd_declared_lost_lets_a_down_pg_go_on_with_older_data_and_the_loss_is_reported() {
    let c = Cluster::up("pi-lost", 1, 2);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = story(&c).await;
        assert_down_waiting_for_osd0(&c, pool).await;
        // Without the confirmation flag, nothing happens.
        let o = c.cairn(&["osd", "lost", "0"]);
        assert!(!o.status.success(), "osd lost needs --yes-i-really-mean-it");
        assert!(common::cluster::text(&o.stderr).contains("--yes-i-really-mean-it"));
        // An up OSD cannot be declared lost.
        let o = c.cairn(&["osd", "lost", "1", "--yes-i-really-mean-it"]);
        assert!(!o.status.success(), "osd.1 is up");
        c.ok(&["osd", "lost", "0", "--yes-i-really-mean-it"]);
        assert!(c.ok(&["osd", "ls"]).contains("lost"));
        let v = client
            .read(pool, b"x", 0, 1024)
            .await
            .expect("read after osd lost");
        assert_eq!(v, b"v1", "what osd.1 holds: v2 was only on osd.0");
        let s = wait_status(&c, "pg 1.0 reported as having lost writes", |s| {
            s["pgs"]["lost_writes"] == 1
        });
        assert_eq!(s["lost_write_pgs"][0]["osds"], serde_json::json!([0]));
        assert_ne!(s["health"], "HEALTH_OK");
        let q = pg_query(&c, "1.0");
        assert_eq!(q["state"], "active", "{q:#}");
        assert_eq!(q["lost_intervals"][0]["acting"], serde_json::json!([0]));
        // The PG takes writes again, and they stay the newest when osd.0 comes back after
        // all: its v2 is older than the PG's activation without it.
        client
            .write_full(pool, b"x", b"v4")
            .await
            .expect("write after osd lost");
        c.start_osd(0);
        wait_osd(&client, 0, true).await;
        wait_status(&c, "both OSDs serving", |s| {
            s["osds"]["up"] == 2 && s["pgs"]["down"] == 0
        });
        let v = client
            .read(pool, b"x", 0, 1024)
            .await
            .expect("read with osd.0 back");
        assert_eq!(v, b"v4");
        // And osd.0 itself serves v4 once it is the only one left.
        c.kill9("osd.1");
        wait_osd(&client, 1, false).await;
        let v = client
            .read(pool, b"x", 0, 1024)
            .await
            .expect("read from osd.0 alone");
        assert_eq!(v, b"v4", "osd.0 was recovered to the PG's history");
    });
}

#[test]
fn a_pg_remapped_onto_older_copies_waits_for_the_osds_that_took_the_last_writes() {
    // Four OSDs, size 3, min_size 2, one PG on three of them.
    let c = Cluster::up("pi-remap", 1, 4);
    let rt = runtime();
    rt.block_on(async {
        c.pool_create("p", 3, 2, 1);
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        client.write_full(pool, b"k", b"old").await.expect("old");
        let members = client
            .map()
            .pg_placement(cairn_map::PgId { pool, pg: 0 })
            .acting;
        assert_eq!(members.len(), 3);
        let (a, b, stale) = (members[0], members[1], members[2]);
        // `stale` misses the next write, taken by a and b (two of three: min_size).
        c.kill9(&format!("osd.{stale}"));
        wait_osd(&client, stale, false).await;
        client
            .write_full(pool, b"k", b"new")
            .await
            .expect("new, on two OSDs");
        // a and b go down and are marked out: the PG maps onto `stale` and the fourth OSD,
        // neither of which has "new". Both are down before either is out: marking one out
        // while the other still serves would let the survivor recover "new" onto the fourth
        // OSD (correct, and fast enough on a quick machine to take the test's premise away).
        for o in [a, b] {
            c.kill9(&format!("osd.{o}"));
            wait_osd(&client, o, false).await;
        }
        for o in [a, b] {
            c.ok(&["osd", "out", &o.to_string()]);
        }
        c.start_osd(stale);
        wait_osd(&client, stale, true).await;
        let acting = client
            .map()
            .pg_placement(cairn_map::PgId { pool, pg: 0 })
            .acting;
        assert!(
            !acting.contains(&a) && !acting.contains(&b) && acting.contains(&stale),
            "remapped onto the older copies: {acting:?}"
        );
        let short = client_with_deadline(&c, 6).await;
        match short.read(pool, b"k", 0, 1024).await {
            Err(ClientError::Timeout { last, .. }) => {
                assert!(last.contains("is down: waiting for"), "reason: {last}");
                // It waits for the OSDs that may hold "new" (which of them depends on how
                // far recovery had gone), never for one that answered.
                let named = |o: u32| {
                    last.contains(&format!("osd.{o} ")) || last.contains(&format!("osd.{o} ("))
                };
                assert!(named(a) || named(b), "reason: {last}");
                assert!(!named(stale), "reason: {last}");
            }
            other => panic!("the remapped PG must wait, got {other:?}\n{}", c.logs()),
        }
        // The two that took the write return (out, but up): the PG serves "new".
        for o in [a, b] {
            c.start_osd(o);
            wait_osd(&client, o, true).await;
        }
        let v = client
            .read(pool, b"k", 0, 1024)
            .await
            .expect("read once they are back");
        assert_eq!(v, b"new");
    });
}

/// A seed from `CAIRN_THRASH_SEED`, or a new one (printed either way, to replay a failure).
fn thrash_seed() -> u64 {
    let seed = match std::env::var("CAIRN_THRASH_SEED") {
        Ok(s) => s.trim().parse().expect("CAIRN_THRASH_SEED must be a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64;
            t ^ ((std::process::id() as u64) << 40)
        }
    };
    eprintln!("thrash seed {seed} (rerun with CAIRN_THRASH_SEED={seed})");
    seed
}

fn next(r: &mut u64) -> u64 {
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    *r
}

#[test]
fn thrashing_osds_never_makes_a_read_return_an_overwritten_value() {
    use common::history::{check, decode, workload, History, Read, Roles, BLOCK};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let rounds: u32 = std::env::var("CAIRN_THRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let mut rng = thrash_seed() | 1;
    let c = Cluster::up("pi-thrash", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        // min_size 1 (two copies) and min_size 2 (three copies).
        c.pool_create("one", 2, 1, 8);
        c.pool_create("two", 3, 2, 8);
        // Short deadlines: ops on a down or inactive PG give up and the workers go on.
        let client = client_with_deadline(&c, 3).await;
        let names: Arc<Vec<String>> = Arc::new((0..24).map(|i| format!("reg-{i}")).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let mut runs = Vec::new();
        for (i, pool) in ["one", "two"].into_iter().enumerate() {
            let id = client.pool_id(pool).expect("pool");
            let hist = Arc::new(Mutex::new(History::default()));
            let roles = Roles {
                first: i as u64 * 10,
                writers: 3,
                readers: 2,
            };
            let tasks = workload(&client, id, &names, &hist, &stop, roles);
            runs.push((id, hist, tasks));
        }
        let mut down: Vec<u32> = Vec::new();
        for round in 0..rounds {
            // Kill one of the running OSDs (never the last), or start one that is down.
            let kill = down.len() < 2 && (down.is_empty() || next(&mut rng) & 1 == 0);
            if kill {
                let up: Vec<u32> = (0..3).filter(|o| !down.contains(o)).collect();
                let o = up[(next(&mut rng) % up.len() as u64) as usize];
                eprintln!("round {round}: kill -9 osd.{o}");
                c.kill9(&format!("osd.{o}"));
                down.push(o);
            } else {
                let i = (next(&mut rng) % down.len() as u64) as usize;
                let o = down.remove(i);
                eprintln!("round {round}: start osd.{o}");
                c.start_osd(o);
            }
            // Sometimes wait for the map to see it (a new interval), sometimes act at once.
            let pause = 1000 + next(&mut rng) % 5000;
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        // Everything back: every PG must go active (none waits for an OSD for ever).
        for o in down.drain(..) {
            c.start_osd(o);
        }
        for o in 0..3 {
            wait_osd(&client, o, true).await;
        }
        wait_status(&c, "every PG active", |s| {
            s["pgs"]["down"] == 0 && s["pgs"]["peering"] == 0 && s["pgs"]["inactive"] == 0
        });
        stop.store(true, Ordering::Relaxed);
        let reader = client_with_deadline(&c, 30).await;
        for (pool, hist, tasks) in runs {
            for t in tasks {
                t.await.expect("worker");
            }
            // A last read of every register, after everything was acknowledged or failed.
            for (key, name) in names.iter().enumerate() {
                let start = Instant::now();
                let value = match reader.read(pool, name.as_bytes(), 0, BLOCK as u64).await {
                    Ok(b) => decode(&b),
                    Err(ClientError::NoSuchObject { .. }) => 0,
                    Err(e) => panic!("final read of {name}: {e}\n{}", c.logs()),
                };
                hist.lock().expect("lock").reads.push(Read {
                    key: key as u32,
                    value,
                    start,
                    end: Instant::now(),
                });
            }
            let h = hist.lock().expect("lock");
            let acked = h.writes.iter().filter(|w| w.end.is_some()).count();
            assert!(acked > 50, "too few writes acknowledged ({acked}) to judge");
            let bad = check(&h.writes, &h.reads);
            assert!(
                bad.is_empty(),
                "pool {pool}: {} stale or impossible reads of {}, first: {:?}\n{}",
                bad.len(),
                h.reads.len(),
                &bad[..bad.len().min(5)],
                c.logs()
            );
            eprintln!(
                "pool {pool}: {acked} writes acknowledged of {}, {} reads checked",
                h.writes.len(),
                h.reads.len()
            );
        }
    });
}
