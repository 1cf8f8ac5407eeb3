//! Multi-process cluster tests on 127.0.0.1: real monitors and OSDs started by
//! `cairn dev up`, driven by the client library and the CLI, killed with SIGKILL.

mod common;

use common::cluster::{runtime, Cluster};
use common::history::{check, decode, encode, Read, Write, BLOCK};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct History {
    writes: Vec<Write>,
    reads: Vec<Read>,
}

/// Several clients (own connections) write unique values to and read a few shared objects
/// for `dur`; records the history. Values: client << 32 | seq (never 0).
async fn workload(c: &Cluster, pool: u32, clients: u32, keys: u32, dur: Duration) -> History {
    let hist = Arc::new(Mutex::new(History::default()));
    let end = Instant::now() + dur;
    let mut tasks = Vec::new();
    for ci in 0..clients {
        let client = c.client().await;
        for ti in 0..2u32 {
            let (client, hist) = (client.clone(), hist.clone());
            tasks.push(tokio::spawn(async move {
                let mut seq = 0u64;
                let mut rng = 0x9e37_79b9u64 ^ ((ci as u64) << 20) ^ ti as u64;
                while Instant::now() < end {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = (rng % keys as u64) as u32;
                    let name = format!("reg-{key}");
                    if (rng >> 40) & 1 == 0 {
                        seq += 1;
                        let value = ((ci as u64 * 2 + ti as u64 + 1) << 32) | seq;
                        let start = Instant::now();
                        let r = client
                            .write_full(pool, name.as_bytes(), &encode(value))
                            .await;
                        let end = r.is_ok().then(Instant::now);
                        r.expect("write");
                        hist.lock().unwrap().writes.push(Write {
                            key,
                            value,
                            start,
                            end,
                        });
                    } else {
                        let start = Instant::now();
                        let value = match client.read(pool, name.as_bytes(), 0, BLOCK as u64).await
                        {
                            Ok(b) => decode(&b),
                            Err(cairn_client::ClientError::NoSuchObject { .. }) => 0,
                            Err(e) => panic!("read: {e}"),
                        };
                        let end = Instant::now();
                        hist.lock().unwrap().reads.push(Read {
                            key,
                            value,
                            start,
                            end,
                        });
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("client task");
    }
    Arc::try_unwrap(hist)
        .ok()
        .expect("history")
        .into_inner()
        .unwrap()
}

fn pool_create(c: &Cluster, name: &str, size: u8, min_size: u8) {
    c.pool_create(name, size, min_size, 32);
}

#[test]
fn replicated_reads_return_the_latest_acknowledged_write() {
    let c = Cluster::up("linear", 3, 4);
    pool_create(&c, "two", 2, 1);
    pool_create(&c, "three", 3, 2);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        for (pool_name, size) in [("two", 2usize), ("three", 3)] {
            // Wait until the client sees the pool.
            let deadline = Instant::now() + Duration::from_secs(10);
            let pool = loop {
                if let Ok(p) = client.pool_id(pool_name) {
                    break p;
                }
                assert!(Instant::now() < deadline, "pool {pool_name} never appeared");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let h = workload(&c, pool, 3, 6, Duration::from_secs(3)).await;
            assert!(
                h.writes.len() > 50 && h.reads.len() > 50,
                "too little I/O: {} writes {} reads",
                h.writes.len(),
                h.reads.len()
            );
            let bad = check(&h.writes, &h.reads);
            assert!(
                bad.is_empty(),
                "pool {pool_name}: {} violations, first: {:?}",
                bad.len(),
                &bad[..bad.len().min(5)]
            );
            // Every member of each PG holds the data: the map places `size` OSDs per PG.
            let map = client.map();
            let pg = map.object_pg(pool, b"reg-0").expect("pg");
            assert_eq!(map.pg_placement(pg).acting.len(), size);
        }
    });
    // The CLI sees the same objects.
    let ls = c.ok(&["obj", "ls", "three"]);
    assert!(ls.lines().any(|l| l == "reg-0"), "obj ls: {ls}");
    let st = c.status();
    assert_eq!(st["health"], "HEALTH_OK", "{st}");
    assert_eq!(st["osds"]["up"], 4);
    // Usage: every OSD answers; 6 objects of 4 KiB in two pools of 2 and 3 replicas.
    assert_eq!(st["capacity"]["osds_reporting"], 4, "{st}");
    let used = st["capacity"]["used_bytes"].as_u64().expect("used");
    assert!(used >= 5 * 6 * 4096, "used {used}: {st}");
    assert!(st["capacity"]["total_bytes"].as_u64().expect("total") > used);
}

/// Writes a value per object until `stop`, remembering the last acknowledged value of each.
async fn writer(
    client: cairn_client::Client,
    pool: u32,
    keys: u32,
    stop: Arc<std::sync::atomic::AtomicBool>,
    acked: Arc<Mutex<Vec<u64>>>,
    max_gap: Arc<Mutex<Duration>>,
) {
    let mut seq = 1u64;
    let mut last_ack = Instant::now();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let key = (seq % keys as u64) as u32;
        let name = format!("obj-{key}");
        client
            .write_full(pool, name.as_bytes(), &encode(seq))
            .await
            .expect("write during failure");
        acked.lock().unwrap()[key as usize] = seq;
        let gap = last_ack.elapsed();
        let mut g = max_gap.lock().unwrap();
        *g = (*g).max(gap);
        last_ack = Instant::now();
        seq += 1;
    }
}

async fn verify(client: &cairn_client::Client, pool: u32, acked: &[u64]) {
    for (key, v) in acked.iter().enumerate() {
        if *v == 0 {
            continue;
        }
        let b = client
            .read(pool, format!("obj-{key}").as_bytes(), 0, BLOCK as u64)
            .await
            .expect("read back");
        assert_eq!(
            decode(&b),
            *v,
            "object obj-{key} lost its last acknowledged write"
        );
    }
}

#[test]
fn killed_osd_is_marked_down_and_io_goes_on() {
    let c = Cluster::up("osdkill", 1, 4);
    pool_create(&c, "p", 3, 2);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pool = client.pool_id("p").expect("pool");
        let keys = 32;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(vec![0u64; keys as usize]));
        let gap = Arc::new(Mutex::new(Duration::ZERO));
        let w = tokio::spawn(writer(
            client.clone(),
            pool,
            keys,
            stop.clone(),
            acked.clone(),
            gap.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let killed_at = Instant::now();
        c.kill9("osd.1");
        // Marked down within the grace (4 s) plus the detection tick and slack.
        loop {
            let map = client.map();
            if map.osds.get(&1).is_some_and(|o| !o.up) {
                break;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(10),
                "osd.1 never marked down"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let down_after = killed_at.elapsed();
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        w.await.expect("writer");
        let g = *gap.lock().unwrap();
        eprintln!("osd.1 marked down after {down_after:?}; longest write stall {g:?}");
        assert!(g < Duration::from_secs(10), "I/O stalled for {g:?}");
        let acked = acked.lock().unwrap().clone();
        verify(&client, pool, &acked).await;
    });
    let st = c.status();
    assert_eq!(st["osds"]["up"], 3, "{st}");
    assert_eq!(st["health"], "HEALTH_WARN", "{st}");

    rt.block_on(async {
        // A pool whose PGs need both of their members: a write to a PG with osd.1 (down) in
        // it is never acknowledged; the client keeps retrying until its deadline.
        c.ok(&[
            "pool",
            "create",
            "strict",
            "--size",
            "2",
            "--min-size",
            "2",
            "--pgs",
            "16",
        ]);
        let mut cfg = c.client_config();
        cfg.op_timeout = Duration::from_secs(2);
        let strict = cairn_client::Client::connect(cfg).await.expect("client");
        let deadline = Instant::now() + Duration::from_secs(10);
        let sp = loop {
            if let Ok(p) = strict.pool_id("strict") {
                break p;
            }
            assert!(Instant::now() < deadline, "pool strict never appeared");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let map = strict.map();
        let name = (0..10_000)
            .map(|i| format!("s{i}"))
            .find(|n| {
                let pg = map.object_pg(sp, n.as_bytes()).expect("pg");
                map.pg_placement(pg).up_set.contains(&1)
            })
            .expect("an object placed on osd.1");
        match strict.write_full(sp, name.as_bytes(), &encode(1)).await {
            Err(cairn_client::ClientError::Timeout { last, .. }) => {
                assert!(last.contains("min_size"), "{last}")
            }
            other => panic!("a write below min_size was answered: {other:?}"),
        }
        assert!(
            matches!(
                strict.read(sp, name.as_bytes(), 0, 8).await,
                Err(cairn_client::ClientError::NoSuchObject { .. })
            ),
            "the refused write left data behind"
        );
    });
    let st = c.status();
    assert_eq!(st["health"], "HEALTH_ERR", "{st}");
    assert!(
        st["pgs"]["inactive"].as_u64().expect("inactive") > 0,
        "{st}"
    );
}

#[test]
fn monitor_leader_killed_and_restarted() {
    let c = Cluster::up("monkill", 3, 3);
    pool_create(&c, "p", 3, 2);
    let leader = c.status()["mons"]["leader"].as_u64().expect("a leader");
    c.kill9(&format!("mon.{leader}"));
    // The remaining two elect a leader; the map can still change.
    pool_create(&c, "after", 2, 1);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        for i in 0..20u64 {
            client
                .write_full(pool, format!("k{i}").as_bytes(), &encode(i + 1))
                .await
                .expect("write");
        }
    });
    c.restart_missing(3, 3);
    // The restarted monitor catches up with the map.
    let addr = c.mons()[leader as usize].clone();
    let rt2 = runtime();
    rt2.block_on(async {
        let mon = cairn_monclient::MonClient::new(vec![addr]).with_auth(c.auth());
        let want = cairn_monclient::MonClient::new(c.mons())
            .with_auth(c.auth())
            .get_map()
            .await
            .expect("map")
            .epoch;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(m) = mon.get_map().await {
                if m.epoch >= want && m.pool_by_name("after").is_some() {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "restarted monitor did not catch up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        for i in 0..20u64 {
            let b = client
                .read(pool, format!("k{i}").as_bytes(), 0, BLOCK as u64)
                .await
                .expect("read");
            assert_eq!(decode(&b), i + 1);
        }
    });
}

#[test]
fn cli_pool_osd_and_object_commands() {
    let c = Cluster::up("cli", 1, 2);
    c.ok(&["pool", "create", "p", "--size", "2", "--pgs", "8"]);
    let e = c.cairn(&["pool", "create", "p", "--size", "2"]);
    assert!(!e.status.success());
    assert!(
        common::cluster::text(&e.stderr).contains("already exists"),
        "{}",
        common::cluster::text(&e.stderr)
    );
    let ls = c.ok(&["pool", "ls", "--json"]);
    let pools: serde_json::Value = serde_json::from_str(&ls).expect("pool ls json");
    assert_eq!(pools[0]["name"], "p");
    assert_eq!(pools[0]["min_size"], 1);

    // Objects through the CLI, including stdin/stdout.
    let src = c.dir.join("src.bin");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).expect("write source");
    let srcs = src.display().to_string();
    c.ok(&["obj", "put", "p", "blob", &srcs]);
    let out = c.dir.join("out.bin");
    c.ok(&["obj", "get", "p", "blob", &out.display().to_string()]);
    assert_eq!(std::fs::read(&out).expect("read back"), data);
    // Read again once flushed (<= 50 ms): from the primary's read cache, which status counts.
    std::thread::sleep(std::time::Duration::from_millis(300));
    c.ok(&["obj", "get", "p", "blob", &out.display().to_string()]);
    let st = c.status();
    let (cache, memory) = (&st["cache"], &st["memory"]);
    assert!(cache["hits"].as_u64() >= Some(1), "{st}");
    let target = memory["target_bytes"].as_u64().expect("memory target");
    let capacity = cache["capacity_bytes"].as_u64().expect("cache capacity");
    assert!(target >= 3 * (256 << 20), "{st}");
    assert!(
        capacity <= target / 4 * 3 && capacity + 3 * 4096 * 4 >= target / 4 * 3,
        "{st}"
    );
    assert!(memory["used_bytes"].as_u64() > Some(1 << 20), "{st}");
    assert!(c.ok(&["status"]).contains("% of data reads from memory;"));
    assert!(c.ok(&["obj", "stat", "p", "blob"]).contains("100000 bytes"));
    assert_eq!(c.ok(&["obj", "ls", "p"]).trim(), "blob");
    c.ok(&["obj", "rm", "p", "blob"]);
    let e = c.cairn(&["obj", "get", "p", "blob", "-"]);
    let msg = common::cluster::text(&e.stderr);
    assert!(
        !e.status.success() && msg.contains("no object \"blob\" in pool p"),
        "{msg}"
    );
    let e = c.cairn(&["obj", "ls", "nope"]);
    assert!(common::cluster::text(&e.stderr).contains("no pool \"nope\""));

    // A size the two OSDs cannot hold is refused with the reason, unless forced; status
    // then says why its PGs take no writes.
    let e = c.cairn(&["pool", "create", "big", "--size", "3"]);
    let msg = common::cluster::text(&e.stderr);
    assert!(
        !e.status.success() && msg.contains("size 3 needs 3 failure domains, the cluster has 2"),
        "{msg}"
    );
    let e = c.cairn(&["pool", "set", "p", "size", "3"]);
    assert!(!e.status.success(), "pool set size 3 on two OSDs");
    c.ok(&[
        "pool",
        "create",
        "big",
        "--size",
        "3",
        "--min-size",
        "3",
        "--force",
    ]);
    let st = c.status();
    assert!(
        st["problems"]
            .to_string()
            .contains("pool big has size 3 but the cluster has 2 failure domains"),
        "{st}"
    );
    c.ok(&["pool", "rm", "big", "--yes-i-really-mean-it"]);

    // An erasure-coded pool: k + m shards on distinct domains, its profile fixed and shown;
    // objects in it read back; status says what is not built for it yet.
    let refused = |args: &[&str], want: &str| {
        let e = c.cairn(args);
        let msg = common::cluster::text(&e.stderr);
        assert!(!e.status.success() && msg.contains(want), "{args:?}: {msg}");
    };
    refused(
        &["pool", "create", "e", "--ec", "4+2"],
        "size 6 needs 6 failure domains, the cluster has 2",
    );
    refused(
        &[
            "pool",
            "create",
            "e",
            "--ec",
            "1+1",
            "--stripe-unit",
            "5000",
        ],
        "stripe unit 5000 is not a multiple of 4096",
    );
    refused(&["pool", "create", "e", "--ec", "4"], "written K+M");
    c.ok(&["pool", "create", "e", "--ec", "1+1", "--stripe-unit", "8K"]);
    let ls = c.ok(&["pool", "ls", "--json"]);
    let pools: serde_json::Value = serde_json::from_str(&ls).expect("pool ls json");
    let e = &pools[1];
    assert_eq!(
        (&e["name"], &e["type"], &e["size"], &e["min_size"]),
        (&"e".into(), &"erasure".into(), &2.into(), &2.into()),
        "{ls}"
    );
    assert_eq!(
        e["ec"],
        serde_json::json!({"k": 1, "m": 1, "stripe_unit": 8192})
    );
    assert!(c.ok(&["pool", "ls"]).contains("ec 1+1, unit 8 KiB"));
    refused(&["pool", "set", "e", "size", "1"], "erasure-coded");
    c.ok(&["obj", "put", "e", "x", &srcs]);
    c.ok(&["obj", "get", "e", "x", &out.display().to_string()]);
    assert_eq!(std::fs::read(&out).expect("read back"), data);
    assert!(c.ok(&["obj", "stat", "e", "x"]).contains("100000 bytes"));
    assert_eq!(c.ok(&["obj", "ls", "e"]).trim(), "x");
    let st = c.status();
    assert!(
        st["problems"].to_string().contains(
            "pool e is erasure-coded (ec 1+1, unit 8 KiB): its PGs do not read a moved shard"
        ),
        "{st}"
    );
    c.ok(&["pool", "rm", "e", "--yes-i-really-mean-it"]);
    // Its shard collections are deleted like any PG's copy.
    c.wait_status(
        "the EC pool's copies deleted",
        Duration::from_secs(60),
        |s| s["pgs"]["removed_pool_copies"] == 0,
    );

    // A pool with too few PGs for its OSDs is a warning that says what to do.
    c.ok(&[
        "pool",
        "create",
        "tiny",
        "--size",
        "1",
        "--min-size",
        "1",
        "--pgs",
        "4",
    ]);
    let st = c.status();
    let problems = st["problems"].to_string();
    assert!(
        problems.contains("pool tiny has 4 PGs for 2 OSDs")
            && problems.contains("too few to spread its data evenly (want at least 10): `cairn pool set tiny pgs 128` splits its PGs online")
            && st["health"] != "HEALTH_OK",
        "{st}"
    );
    c.ok(&["pool", "rm", "tiny", "--yes-i-really-mean-it"]);

    // Durability memory is shown as a problem; removing needs the flag.
    c.ok(&["pool", "set", "p", "durability", "memory"]);
    let st = c.status();
    assert!(
        st["problems"].to_string().contains("durability memory"),
        "{st}"
    );
    // I/O goes on in memory mode (acknowledged once held in every member's memory).
    c.ok(&["obj", "put", "p", "fast", &srcs]);
    c.ok(&["obj", "get", "p", "fast", &out.display().to_string()]);
    assert_eq!(std::fs::read(&out).expect("read back"), data);

    // Capacity: room per pool; OSDs past the near-full / full ratios (set low here, as the
    // OSDs hold only a little) are named, turning health to WARN / ERR.
    let st = c.status();
    let room = st["pools"][0]["usable_bytes"]
        .as_u64()
        .expect("usable_bytes");
    assert!(room > 100 << 20 && room < 1 << 30, "{st}");
    let near = c.status_with(&["--nearfull-ratio", "0.00001"]);
    let problems = near["problems"].to_string();
    assert!(
        problems.contains("is near full") && problems.contains("pool p is near full: room for"),
        "{near}"
    );
    assert_ne!(near["health"], "HEALTH_OK");
    let full = c.status_with(&["--nearfull-ratio", "0.00001", "--full-ratio", "0.00002"]);
    let problems = full["problems"].to_string();
    assert!(
        problems.contains("is full") && problems.contains("pool p is full"),
        "{full}"
    );
    assert_eq!(full["health"], "HEALTH_ERR");
    let e = c.cairn(&["pool", "rm", "p"]);
    assert!(!e.status.success());
    c.ok(&["pool", "rm", "p", "--yes-i-really-mean-it"]);

    // Out and in.
    c.ok(&["osd", "out", "1"]);
    let osds: serde_json::Value =
        serde_json::from_str(&c.ok(&["osd", "ls", "--json"])).expect("json");
    assert_eq!(osds[1]["in"], false);
    c.ok(&["osd", "in", "1"]);
    let e = c.cairn(&["osd", "out", "9"]);
    assert!(common::cluster::text(&e.stderr).contains("no OSD 9"));
    // A configuration that points nowhere is one clear line.
    let bad = c.dir.join("bad.toml");
    std::fs::write(&bad, "[cluster]\nfsid = \"00\"\nmons = [\"127.0.0.1:1\"]\n").expect("write");
    let e = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["-c", &bad.display().to_string(), "status"])
        .output()
        .expect("run");
    let msg = common::cluster::text(&e.stderr);
    let lines: Vec<&str> = msg.lines().collect();
    // A notice that it is still trying, then one error line naming the address.
    assert!(
        !e.status.success()
            && lines.len() == 2
            && lines[0].contains("still trying")
            && lines[1].starts_with("cairn: error: ")
            && lines[1].contains("127.0.0.1:1"),
        "{msg}"
    );
}

/// Sends raw frames to an OSD: what a buggy or hostile client could send.
/// Exclusive create through real processes: `obj put --if-absent` stores an object only if
/// it is absent, and of concurrent `vol create` of one name exactly one succeeds (each with
/// another size, so the winner's header is the one that stays).
#[test]
fn exclusive_creates_have_exactly_one_winner() {
    let c = Cluster::up("exclusive", 1, 2);
    c.ok(&["pool", "create", "p", "--size", "2", "--pgs", "8"]);
    let (a, b) = (c.dir.join("a.bin"), c.dir.join("b.bin"));
    std::fs::write(&a, b"first contents").expect("write a");
    std::fs::write(&b, b"other contents").expect("write b");
    let (a, b) = (a.display().to_string(), b.display().to_string());
    c.ok(&["obj", "put", "p", "k", &a, "--if-absent"]);
    let e = c.cairn(&["obj", "put", "p", "k", &b, "--if-absent"]);
    let msg = common::cluster::text(&e.stderr);
    assert!(
        !e.status.success() && msg.contains("object \"k\" already exists in pool p"),
        "{msg}"
    );
    // The same bytes again (what a resent create finds): success, nothing changed.
    c.ok(&["obj", "put", "p", "k", &a, "--if-absent"]);
    assert_eq!(c.ok(&["obj", "get", "p", "k", "-"]), "first contents");
    // A plain put still replaces.
    c.ok(&["obj", "put", "p", "k", &b]);
    assert_eq!(c.ok(&["obj", "get", "p", "k", "-"]), "other contents");

    for round in 0..3 {
        let name = format!("vm{round}");
        let sizes: Vec<String> = (1..=6).map(|i| format!("{i}G")).collect();
        let outs: Vec<_> = std::thread::scope(|s| {
            let runs: Vec<_> = sizes
                .iter()
                .map(|size| {
                    let (c, name) = (&c, &name);
                    s.spawn(move || c.cairn(&["vol", "create", name, "--size", size, "-p", "p"]))
                })
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("vol create thread"))
                .collect()
        });
        let winners: Vec<usize> = (0..outs.len())
            .filter(|&i| outs[i].status.success())
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outs:?}");
        for (i, o) in outs.iter().enumerate() {
            let msg = common::cluster::text(&o.stderr);
            assert!(
                winners.contains(&i) || msg.contains("already exists"),
                "round {round}: {msg}"
            );
        }
        let info = c.ok(&["vol", "info", &name, "-p", "p", "--json"]);
        let info: serde_json::Value = serde_json::from_str(&info).expect("vol info json");
        let won = (winners[0] as u64 + 1) << 30;
        assert_eq!(info["size"].as_u64(), Some(won), "{info}");
    }
}

/// `pool rm` gives the space back: every OSD deletes its copies of the removed pool's PGs in
/// the background (status counts those left), and other pools keep their data.
#[test]
fn removed_pools_give_their_space_back() {
    let c = Cluster::up("reclaim", 1, 2);
    c.ok(&["pool", "create", "keep", "--size", "2", "--pgs", "8"]);
    c.ok(&["pool", "create", "gone", "--size", "2", "--pgs", "8"]);
    let blob = c.dir.join("blob.bin");
    let data: Vec<u8> = (0..48u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&blob, &data).expect("write blob");
    let blob = blob.display().to_string();
    c.ok(&["obj", "put", "keep", "k", &blob]);
    let used = |s: &serde_json::Value| s["capacity"]["used_bytes"].as_u64().unwrap_or(0);
    let before = used(&c.status());
    for i in 0..4 {
        c.ok(&["obj", "put", "gone", &format!("o{i}"), &blob]);
    }
    let full = used(&c.status());
    // 4 objects of 48 MiB, 2 copies each.
    assert!(full >= before + (380 << 20), "{before} -> {full}");
    c.ok(&["pool", "rm", "gone", "--yes-i-really-mean-it"]);
    let s = c.wait_status(
        "the removed pool's space back",
        Duration::from_secs(60),
        |s| used(s) < before + (16 << 20) && s["pgs"]["removed_pool_copies"] == 0,
    );
    assert!(used(&s) < full, "{s}");
    assert!(
        c.logs()
            .contains("deleted this OSD's copy of a PG of a removed pool"),
        "{}",
        c.logs()
    );
    let out = c.dir.join("k.out");
    c.ok(&["obj", "get", "keep", "k", &out.display().to_string()]);
    assert!(
        std::fs::read(&out).expect("read k") == data,
        "pool keep's object changed"
    );
}

#[test]
fn osd_refuses_malformed_input_and_keeps_serving() {
    use cairn_auth::{Caps, Entity};
    use cairn_proto::msg::osd::{
        BatchedOp, OpBatch, OpKind, OpReply, OpRequest, ERROR, OP, OP_BATCH, OP_REPLY,
    };
    use cairn_proto::msg::{ErrorCode, ErrorReply};
    use cairn_transport::Credentials;
    use cairn_transport::{node_kind, read_frame, write_frame};
    async fn handshake(
        s: &mut tokio::net::TcpStream,
        kind: u8,
        creds: &Credentials,
    ) -> Result<cairn_transport::Initiated, cairn_transport::HandshakeError> {
        cairn_transport::initiate(s, kind, creds).await
    }
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = Cluster::up("osdinput", 1, 2);
    pool_create(&c, "p", 1, 1);
    let rt = runtime();
    // Tickets as the monitors would grant them: the administrator's, and each OSD's.
    let admin = c.ticket_as(Entity::admin(), Caps::admin());
    let as_osd = |i: u32| c.ticket_as(Entity::osd(i), Caps::default());
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        let map = client.map();
        let addr = |id: u32| map.osds[&id].addr.clone();
        let limits = cairn_proto::Limits::default();
        // No handshake: the OSD closes the connection.
        let mut s = tokio::net::TcpStream::connect(addr(0))
            .await
            .expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.expect("send");
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), async {
            // The OSD's own handshake may arrive first; then the connection ends.
            let mut total = 0;
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return total,
                    Ok(n) => total += n,
                }
            }
        })
        .await
        .expect("the OSD keeps a connection that sent garbage open");
        assert!(n <= 16, "the OSD answered garbage with {n} bytes");
        // A valid handshake, then a malformed op: an ERROR frame, then close.
        let mut s = tokio::net::TcpStream::connect(addr(0))
            .await
            .expect("connect");
        handshake(&mut s, node_kind::CLIENT, &admin)
            .await
            .expect("handshake");
        write_frame(&mut s, OP, 7, b"\xff\xff\xff", &[])
            .await
            .expect("send");
        let f = read_frame(&mut s, &limits).await.expect("error reply");
        assert_eq!((f.msg_type, f.request_id), (ERROR, 7));
        assert!(
            read_frame(&mut s, &limits).await.is_err(),
            "connection not closed"
        );
        // Well-formed but wrong: a PG out of range, an op sent to the OSD that is not the
        // PG's primary, and one sent with a map from before the PG's current interval (a
        // request held up in the network, which the client may have sent again since).
        let name = b"x".to_vec();
        let pg = map.object_pg(pool, &name).expect("pg");
        let primary = map.pg_placement(pg).primary().expect("primary");
        let other = if primary == 0 { 1 } else { 0 };
        for (osd, pgnum, epoch, want) in [
            (primary, 10_000, map.epoch, "invalid"),
            (other, pg.pg, map.epoch, "not primary"),
            (primary, pg.pg, 1, "not primary"),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr(osd))
                .await
                .expect("connect");
            handshake(&mut s, node_kind::CLIENT, &admin)
                .await
                .expect("handshake");
            let req = OpRequest {
                epoch,
                pool,
                pg: pgnum,
                object: name.clone(),
                kind: OpKind::Write { offset: 0 },
                instance: 1,
            };
            let control = cairn_proto::msg::encode(&req);
            write_frame(&mut s, OP, 1, &control, b"data")
                .await
                .expect("send");
            let f = read_frame(&mut s, &limits).await.expect("reply");
            assert_eq!(f.msg_type, OP_REPLY);
            let r: OpReply = cairn_proto::msg::decode("reply", &f.control).expect("decode");
            match (want, r) {
                ("invalid", OpReply::Invalid(_)) | ("not primary", OpReply::NotPrimary { .. }) => {}
                (want, r) => panic!("expected {want}, got {r:?}"),
            }
        }
        // An op batch whose data lengths do not add up: ERROR, close, nothing written.
        let batched = |id: u64, len: u32, object: &[u8]| BatchedOp {
            request_id: id,
            data_len: len,
            req: OpRequest {
                epoch: map.epoch,
                pool,
                pg: map.object_pg(pool, object).expect("pg").pg,
                object: object.to_vec(),
                kind: OpKind::Write { offset: 0 },
                instance: 1,
            },
        };
        let mut s = tokio::net::TcpStream::connect(addr(primary))
            .await
            .expect("connect");
        handshake(&mut s, node_kind::CLIENT, &admin)
            .await
            .expect("handshake");
        let bad = OpBatch {
            ops: vec![batched(1, 4, &name), batched(2, 9, &name)],
        };
        write_frame(
            &mut s,
            OP_BATCH,
            3,
            &cairn_proto::msg::encode(&bad),
            b"datadata",
        )
        .await
        .expect("send");
        let f = read_frame(&mut s, &limits).await.expect("error reply");
        assert_eq!(f.msg_type, ERROR);
        let e: ErrorReply = cairn_proto::msg::decode("error", &f.control).expect("decode");
        assert_eq!(e.code, ErrorCode::Malformed, "{}", e.message);
        assert!(read_frame(&mut s, &limits).await.is_err(), "not closed");
        // OSD_SYNC: empty, it is answered; with a body, ERROR and close.
        use cairn_proto::msg::osd::{OSD_SYNC, OSD_SYNC_REPLY};
        let mut s = tokio::net::TcpStream::connect(addr(primary))
            .await
            .expect("connect");
        handshake(&mut s, node_kind::CLIENT, &admin)
            .await
            .expect("handshake");
        write_frame(&mut s, OSD_SYNC, 7, &[], &[]).await.expect("send");
        let f = read_frame(&mut s, &limits).await.expect("sync reply");
        assert_eq!((f.msg_type, f.request_id), (OSD_SYNC_REPLY, 7));
        write_frame(&mut s, OSD_SYNC, 8, b"x", &[]).await.expect("send");
        let f = read_frame(&mut s, &limits).await.expect("error reply");
        assert_eq!(f.msg_type, ERROR);
        let e: ErrorReply = cairn_proto::msg::decode("error", &f.control).expect("decode");
        assert_eq!(e.code, ErrorCode::Malformed, "{}", e.message);
        assert!(read_frame(&mut s, &limits).await.is_err(), "not closed");
        // Peering requests: garbage -> ERROR and close; a push to a PG that does not exist
        // (claiming a future epoch) is refused and creates nothing.
        use cairn_proto::msg::peering::{PgDone, PgPush, PushKind, PG_DONE, PG_PUSH, PG_QUERY};
        let mut s = tokio::net::TcpStream::connect(addr(primary))
            .await
            .expect("connect");
        let osd0 = as_osd(0);
        handshake(&mut s, node_kind::OSD, &osd0).await.expect("handshake");
        write_frame(&mut s, PG_QUERY, 5, b"\xff\xff", &[])
            .await
            .expect("send");
        let f = read_frame(&mut s, &limits).await.expect("error reply");
        assert_eq!(f.msg_type, ERROR);
        let mut s = tokio::net::TcpStream::connect(addr(primary))
            .await
            .expect("connect");
        handshake(&mut s, node_kind::OSD, &osd0).await.expect("handshake");
        let push = PgPush {
            epoch: map.epoch + 1000,
            pool: 999,
            pg: 0,
            primary: 0,
            kind: PushKind::Recover {
                object: b"intruder".to_vec(),
                offset: 0,
                size: 4,
                reset: true,
                last: true,
                since: None,
            },
        };
        write_frame(
            &mut s,
            PG_PUSH,
            6,
            &cairn_proto::msg::encode(&push),
            b"evil",
        )
        .await
        .expect("send");
        let f = read_frame(&mut s, &limits).await.expect("push reply");
        assert_eq!(f.msg_type, PG_DONE);
        let r: PgDone = cairn_proto::msg::decode("pg done", &f.control).expect("decode");
        assert!(
            matches!(r, PgDone::Failed { code: ErrorCode::NotFound, ref why } if why.contains("does not exist")),
            "{r:?}"
        );
        // An activation claiming a future epoch (it would rank this copy first in peering)
        // is refused (once the map of that epoch proves not to exist), and so is one from an
        // OSD that is not the PG's primary.
        for (epoch, from, want) in [
            (map.epoch + 1000, primary, "newer than this OSD's map"),
            (map.epoch, other, "stale"),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr(primary))
                .await
                .expect("connect");
            handshake(&mut s, node_kind::OSD, &as_osd(from))
                .await
                .expect("handshake");
            let push = PgPush {
                epoch,
                pool,
                pg: pg.pg,
                primary: from,
                kind: PushKind::Activate { epoch },
            };
            let body = cairn_proto::msg::encode(&push);
            write_frame(&mut s, PG_PUSH, 9, &body, &[])
                .await
                .expect("send");
            let f = read_frame(&mut s, &limits).await.expect("push reply");
            let r: PgDone = cairn_proto::msg::decode("pg done", &f.control).expect("decode");
            let ok = match &r {
                PgDone::Failed { code, why } => *code == ErrorCode::Invalid && why.contains(want),
                PgDone::Stale { .. } => want == "stale",
                _ => false,
            };
            assert!(ok, "activation at {epoch} from osd.{from}: {r:?}");
        }
        // An OSD that pushes in another OSD's name, and a client that pushes at all, are
        // refused (permission denied) and cut off.
        for (creds, kind, want) in [
            (as_osd(other), node_kind::OSD, "in the name of"),
            (admin.clone(), node_kind::CLIENT, "is not an OSD"),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr(other))
                .await
                .expect("connect");
            handshake(&mut s, kind, &creds).await.expect("handshake");
            let push = PgPush {
                epoch: map.epoch,
                pool,
                pg: pg.pg,
                primary,
                kind: PushKind::Reset,
            };
            let body = cairn_proto::msg::encode(&push);
            write_frame(&mut s, PG_PUSH, 9, &body, &[])
                .await
                .expect("send");
            let f = read_frame(&mut s, &limits).await.expect("refusal");
            assert_eq!(f.msg_type, ERROR);
            let e: ErrorReply = cairn_proto::msg::decode("error", &f.control).expect("decode");
            assert_eq!(e.code, ErrorCode::Denied, "{}", e.message);
            assert!(e.message.contains(want), "{}", e.message);
            assert!(read_frame(&mut s, &limits).await.is_err(), "not closed");
        }
        // EC rebuild requests: over their limits -> ERROR Malformed and close; from a client,
        // or in another OSD's name, denied; a push to a PG that is not erasure-coded refused
        // as stale (its receiver holds no shard of it) and stores nothing.
        {
            use cairn_proto::msg::ec_rebuild::{
                EcObjectState, EcPush, EcSetLog, EcStat, EcStatWhich, EC_PUSH, EC_SET_LOG, EC_STAT,
            };
            use cairn_proto::msg::osd::{RepReply, REP_REPLY};
            let push = |primary: u32, state: Option<EcObjectState>| EcPush {
                epoch: map.epoch,
                pool,
                pg: pg.pg,
                shard: 0,
                primary,
                object: name.clone(),
                state,
                offset: 0,
                last: true,
            };
            let set_log = EcSetLog {
                epoch: map.epoch,
                pool,
                pg: pg.pg,
                shard: 0,
                primary,
                from: 9,
                version: 3,
            };
            let stat = EcStat {
                epoch: map.epoch,
                pool,
                pg: pg.pg,
                shard: 0,
                which: EcStatWhich::Named(vec![name.clone()]),
            };
            let state = Some(EcObjectState {
                size: 4,
                version: 7,
            });
            use cairn_proto::msg::encode as enc;
            // Who sends (credentials, node kind), what (type, control, data), the refusal.
            type Sender = (Credentials, u8);
            type Frame = (u16, Vec<u8>, &'static [u8]);
            type Refusal = (ErrorCode, &'static str);
            let osd_p = || (as_osd(primary), node_kind::OSD);
            let cases: Vec<(Sender, Frame, Refusal)> = vec![
                (
                    osd_p(),
                    (EC_PUSH, enc(&push(primary, None)), b"evil"),
                    (ErrorCode::Malformed, "carries bytes"),
                ),
                (
                    osd_p(),
                    (EC_SET_LOG, enc(&set_log), b""),
                    (ErrorCode::Malformed, "after its last version"),
                ),
                (
                    (as_osd(other), node_kind::OSD),
                    (EC_PUSH, enc(&push(primary, state)), b"evil"),
                    (ErrorCode::Denied, "in the name of"),
                ),
                (
                    (admin.clone(), node_kind::CLIENT),
                    (EC_STAT, enc(&stat), b""),
                    (ErrorCode::Denied, "is not an OSD"),
                ),
            ];
            for ((creds, kind), (msg, control, data), (code, want)) in cases {
                let mut s = tokio::net::TcpStream::connect(addr(primary))
                    .await
                    .expect("connect");
                handshake(&mut s, kind, &creds).await.expect("handshake");
                write_frame(&mut s, msg, 3, &control, data)
                    .await
                    .expect("send");
                let f = read_frame(&mut s, &limits).await.expect("refusal");
                assert_eq!(f.msg_type, ERROR, "message {msg}");
                let e: ErrorReply = cairn_proto::msg::decode("error", &f.control).expect("decode");
                assert_eq!(e.code, code, "message {msg}: {}", e.message);
                assert!(e.message.contains(want), "message {msg}: {}", e.message);
                assert!(read_frame(&mut s, &limits).await.is_err(), "not closed");
            }
            let mut s = tokio::net::TcpStream::connect(addr(primary))
                .await
                .expect("connect");
            handshake(&mut s, node_kind::OSD, &as_osd(primary))
                .await
                .expect("handshake");
            write_frame(&mut s, EC_PUSH, 4, &enc(&push(primary, state)), b"evil")
                .await
                .expect("send");
            let f = read_frame(&mut s, &limits).await.expect("push reply");
            assert_eq!(f.msg_type, REP_REPLY);
            let r: RepReply = cairn_proto::msg::decode("rep reply", &f.control).expect("decode");
            assert!(matches!(r, RepReply::Stale { .. }), "{r:?}");
            assert!(
                matches!(
                    client.stat(pool, &name).await,
                    Err(cairn_client::ClientError::NoSuchObject { .. })
                ),
                "an EC push to a replicated PG stored an object"
            );
        }
        let mut s = tokio::net::TcpStream::connect(addr(primary))
            .await
            .expect("connect");
        handshake(&mut s, node_kind::OSD, &osd0).await.expect("handshake");
        // Scrub requests: garbage -> ERROR; a map of a PG that does not exist, or of more
        // names than allowed, is refused; so is a scrub of a PG that does not exist.
        use cairn_proto::msg::scrub::{PgScrub, ScrubPg, PG_SCRUB, SCRUB_PG};
        write_frame(&mut s, PG_SCRUB, 7, b"\x01", &[])
            .await
            .expect("send");
        let f = read_frame(&mut s, &limits).await.expect("error reply");
        assert_eq!(f.msg_type, ERROR);
        for (pool, names, code, want) in [
            (999, Vec::new(), ErrorCode::NotFound, "does not exist"),
            (pool, vec![b"x".to_vec(); 1000], ErrorCode::Invalid, "at most 256"),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr(primary))
                .await
                .expect("connect");
            handshake(&mut s, node_kind::OSD, &osd0).await.expect("handshake");
            let q = PgScrub {
                epoch: map.epoch,
                pool,
                pg: 0,
                after: None,
                names,
            };
            write_frame(&mut s, PG_SCRUB, 8, &cairn_proto::msg::encode(&q), &[])
                .await
                .expect("send");
            let f = read_frame(&mut s, &limits).await.expect("scrub reply");
            let r: PgDone = cairn_proto::msg::decode("pg done", &f.control).expect("decode");
            assert!(
                matches!(r, PgDone::Failed { code: c, ref why } if c == code && why.contains(want)),
                "{r:?}"
            );
        }
        let mut s = tokio::net::TcpStream::connect(addr(primary))
            .await
            .expect("connect");
        handshake(&mut s, node_kind::CLIENT, &admin)
            .await
            .expect("handshake");
        let q = ScrubPg {
            pool: 999,
            pg: 0,
            repair: true,
        };
        write_frame(&mut s, SCRUB_PG, 9, &cairn_proto::msg::encode(&q), &[])
            .await
            .expect("send");
        let f = read_frame(&mut s, &limits).await.expect("error reply");
        assert_eq!(f.msg_type, ERROR);
        // A replicated write whose version does not follow the replica's last one (it missed
        // one) is refused with Gap and not applied; one claiming a map epoch that does not
        // exist is refused as stale (after the replica looked for that map).
        use cairn_proto::msg::osd::{RepOp, RepReply, REP, REP_REPLY};
        let mut s = tokio::net::TcpStream::connect(addr(other))
            .await
            .expect("connect");
        handshake(&mut s, node_kind::OSD, &as_osd(primary))
            .await
            .expect("handshake");
        // And one of an object that hashes to another PG (a primary from before a split) is
        // refused as stale: it would be stranded in this PG.
        let elsewhere = (0..)
            .map(|i| format!("elsewhere-{i}").into_bytes())
            .find(|o| map.object_pg(pool, o) != Some(pg))
            .expect("an object of another PG");
        for (epoch, object, want) in [
            (map.epoch, name.clone(), RepReply::Gap { have: 0 }),
            (map.epoch + 1000, name.clone(), RepReply::Stale { epoch: map.epoch }),
            (map.epoch, elsewhere, RepReply::Stale { epoch: map.epoch }),
        ] {
            let rep = RepOp {
                epoch,
                pool,
                pg: pg.pg,
                version: if epoch == map.epoch { 5 } else { 1 },
                primary,
                object,
                kind: OpKind::WriteFull,
            };
            write_frame(&mut s, REP, 10, &cairn_proto::msg::encode(&rep), b"data")
                .await
                .expect("send");
            let f = read_frame(&mut s, &limits).await.expect("rep reply");
            assert_eq!(f.msg_type, REP_REPLY);
            let r: RepReply = cairn_proto::msg::decode("rep reply", &f.control).expect("decode");
            assert_eq!(r, want, "REP at epoch {epoch}");
        }
        // Recovery requests to an OSD that holds no copy of the PG: a pull is refused (never
        // answered "absent", which would delete the object at the puller); a PG_CLEAN is
        // answered Stale (it is not the primary), Busy by the primary at another epoch, and
        // garbage is refused.
        use cairn_proto::msg::peering::{PgPull, PgQuery, PG_CLEAN, PG_PULL};
        let call = |to: u32, t: u16, control: Vec<u8>| {
            let (a, creds) = (addr(to), osd0.clone());
            async move {
                let mut s = tokio::net::TcpStream::connect(a).await.expect("connect");
                handshake(&mut s, node_kind::OSD, &creds).await.expect("handshake");
                write_frame(&mut s, t, 11, &control, &[])
                    .await
                    .expect("send");
                read_frame(&mut s, &cairn_proto::Limits::default())
                    .await
                    .expect("reply")
            }
        };
        let pull = PgPull {
            epoch: map.epoch,
            pool,
            pg: pg.pg,
            object: name.clone(),
            offset: 0,
            len: 4,
        };
        let f = call(other, PG_PULL, cairn_proto::msg::encode(&pull)).await;
        assert_eq!(f.msg_type, ERROR);
        let e: cairn_proto::msg::ErrorReply =
            cairn_proto::msg::decode("error", &f.control).expect("decode");
        assert_eq!(e.code, cairn_proto::msg::ErrorCode::NotFound);
        assert!(e.message.contains("holds no copy"), "{}", e.message);
        let clean = |epoch| {
            cairn_proto::msg::encode(&PgQuery {
                epoch,
                pool,
                pg: pg.pg,
                since: 0,
            })
        };
        let answer = |f: cairn_proto::Frame| -> PgDone {
            assert_eq!(f.msg_type, PG_DONE);
            cairn_proto::msg::decode("pg done", &f.control).expect("decode")
        };
        let r = answer(call(other, PG_CLEAN, clean(map.epoch)).await);
        assert!(matches!(r, PgDone::Stale { .. }), "{r:?}");
        let r = answer(call(primary, PG_CLEAN, clean(map.epoch + 1000)).await);
        assert_eq!(r, PgDone::Busy);
        let f = call(primary, PG_CLEAN, b"\xff".to_vec()).await;
        assert_eq!(f.msg_type, ERROR);
        // Nothing of it was written, and the OSDs still serve.
        assert!(matches!(
            client.read(pool, &name, 0, 4).await,
            Err(cairn_client::ClientError::NoSuchObject { .. })
        ));
        client
            .write_full(pool, &name, b"fine")
            .await
            .expect("write after garbage");
        assert_eq!(client.read(pool, &name, 0, 4).await.expect("read"), b"fine");
    });
}

/// Temporal merge: with many small ops in flight, the client sends them in batches (each op
/// still answered on its own, every value written); with merging off it never does.
#[test]
fn temporal_merge_batches_small_ops_and_each_completes() {
    let c = Cluster::up("merge", 1, 2);
    pool_create(&c, "m", 2, 1);
    let rt = runtime();
    rt.block_on(async {
        for threshold in [2usize, 0] {
            let mut cfg = c.client_config();
            cfg.merge_threshold = threshold;
            let client = cairn_client::Client::connect(cfg).await.expect("client");
            let pool = client.pool_id("m").expect("pool");
            for o in 0..4 {
                let name = format!("obj{o}").into_bytes();
                client
                    .write(pool, &name, 0, &[0])
                    .await
                    .expect("warm-up write");
            }
            // 4 objects: many ops in flight on each OSD connection.
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..256u64 {
                let client = client.clone();
                tasks.spawn(async move {
                    let name = format!("obj{}", i % 4).into_bytes();
                    let block = vec![(i % 251) as u8; 4096];
                    client
                        .write(pool, &name, (i / 4) * 4096, &block)
                        .await
                        .expect("write");
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.expect("task");
            }
            for i in 0..256u64 {
                let name = format!("obj{}", i % 4).into_bytes();
                let got = client
                    .read(pool, &name, (i / 4) * 4096, 4096)
                    .await
                    .expect("read");
                assert!(
                    got == vec![(i % 251) as u8; 4096],
                    "block {i} of threshold {threshold}"
                );
            }
            let m = client.merge_stats();
            if threshold == 0 {
                assert_eq!(m.batches, 0, "merging is off");
            } else {
                assert!(
                    m.batches > 0,
                    "nothing merged with 256 writes in flight: {m:?}"
                );
                assert!(
                    m.ops >= 2 * m.batches && m.ops <= 8 * m.batches,
                    "batches of 2..=8 ops: {m:?}"
                );
            }
        }
    });
}

/// Bytes of object `o` at version `v`, `len` long.
fn direct_pattern(o: u32, v: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ (o as u8).wrapping_mul(31) ^ v ^ (i >> 12) as u8)
        .collect()
}

/// Large writes going straight to the data devices (`dev up --direct-write-min`, handed to
/// every OSD) survive kill -9 of every OSD at once, byte for byte, together with the small
/// writes that went through the WAL between them.
#[test]
fn large_writes_written_once_survive_kill9_of_every_osd() {
    let c = Cluster::up_with("direct", 1, 3, &["--direct-write-min", "256K"]);
    for i in 0..3 {
        let pid = c.pid(&format!("osd.{i}"));
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        assert!(cmd.contains("--direct-write-min 262144"), "osd.{i}: {cmd}");
    }
    pool_create(&c, "big", 3, 2);
    const MIB: usize = 1 << 20;
    let rt = runtime();
    let mut want = Vec::new();
    rt.block_on(async {
        let client = c.client().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pool = client.pool_id("big").expect("pool");
        for o in 0..6u32 {
            let v = direct_pattern(o, 1, MIB);
            let name = format!("big-{o}");
            client
                .write_full(pool, name.as_bytes(), &v)
                .await
                .expect("write 1 MiB");
            want.push(v);
        }
        for o in 0..3u32 {
            let name = format!("big-{o}");
            let part = direct_pattern(o, 2, 256 << 10);
            client
                .write(pool, name.as_bytes(), 256 << 10, &part)
                .await
                .expect("overwrite 256 KiB");
            want[o as usize][256 << 10..512 << 10].copy_from_slice(&part);
            let small = direct_pattern(o, 3, 4096);
            client
                .write(pool, name.as_bytes(), 300 << 10, &small)
                .await
                .expect("overwrite 4 KiB");
            want[o as usize][300 << 10..(300 << 10) + 4096].copy_from_slice(&small);
        }
    });
    for i in 0..3 {
        c.kill9(&format!("osd.{i}"));
    }
    c.restart_missing(1, 3);
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("big").expect("pool");
        for (o, w) in want.iter().enumerate() {
            let name = format!("big-{o}");
            let deadline = Instant::now() + Duration::from_secs(60);
            let got = loop {
                match client.read(pool, name.as_bytes(), 0, MIB as u64).await {
                    Ok(b) => break b,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("read of {name} after the restart: {e}; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("{name} unreadable after the restart: {e}"),
                }
            };
            assert!(got == *w, "{name} differs after kill -9 of every OSD");
        }
    });
    let st = c.status();
    assert_eq!(st["scrub"]["unrepaired"], 0, "{st}");
}

/// A free port on 127.0.0.1 (bound and released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn a_dead_monitor_is_replaced_without_downtime() {
    let c = Cluster::up("monreplace", 3, 1);
    let fsid = c.status()["fsid"].as_str().expect("fsid").to_string();
    // A fourth monitor, started to join: the monitors' keyring copied to its directory.
    let dir = c.dir.join("mon.3");
    std::fs::create_dir_all(&dir).expect("mon.3 dir");
    std::fs::copy(c.dir.join("mon.0").join("keyring"), dir.join("keyring")).expect("keyring");
    let addr = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(c.dir.join("log").join("mon.3.log")).expect("log");
    let mut mon3 = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "mon",
            "run",
            "--id",
            "3",
            "--dir",
            &dir.display().to_string(),
        ])
        .args(["--listen", &addr, "--fsid", &fsid, "--join"])
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start mon.3");
    let ring = c.add_key("client.ops", ("rw", "", ""));
    let ops = c.conf_for("client.ops", &ring);
    let (ok, out) = common::cluster::run_as(&ops, &["mon", "add", "3", &addr]);
    assert!(!ok && out.contains("lacks x on the monitors"), "{out}");
    let (ok, out) = common::cluster::run_as(&c.conf.display().to_string(), &["mon", "rm", "9"]);
    assert!(!ok && out.contains("monitor 9 is not a member"), "{out}");
    let out = c.ok(&["mon", "add", "3", &addr]);
    assert!(out.contains(&format!("mon.3 {addr}")), "{out}");
    let (ok, out) =
        common::cluster::run_as(&c.conf.display().to_string(), &["mon", "add", "3", &addr]);
    assert!(!ok && out.contains("already a member"), "{out}");

    // A monitor dies for good (the leader, the hardest case) and is removed: the cluster
    // keeps its quorum throughout and the map keeps changing.
    let leader = c.status()["mons"]["leader"].as_u64().expect("a leader");
    // A client given only that monitor learns the others from the cluster.
    let rt = runtime();
    let only_leader = cairn_monclient::MonClient::new(vec![c.mons()[leader as usize].clone()])
        .with_auth(c.auth());
    let known = rt
        .block_on(only_leader.learn_monitors())
        .expect("learn monitors");
    assert_eq!(known, 4, "{:?}", only_leader.addrs());
    c.kill9(&format!("mon.{leader}"));
    let out = c.ok(&["mon", "rm", &leader.to_string()]);
    assert!(!out.contains(&format!("mon.{leader} ")), "{out}");
    let ls: serde_json::Value =
        serde_json::from_str(&c.ok(&["mon", "ls", "--json"])).expect("mon ls json");
    let ids: Vec<u64> = ls
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m["id"].as_u64())
        .collect();
    let mut want: Vec<u64> = [0, 1, 2, 3].into_iter().filter(|i| *i != leader).collect();
    want.sort();
    assert_eq!(ids, want, "{ls}");

    // The client reaches the cluster through the monitors it learned.
    let map = rt
        .block_on(only_leader.get_map())
        .expect("map through a learned monitor");
    assert!(map.epoch > 0);
    // One more original monitor dies: the new one's vote is now needed for every commit.
    let other = want
        .iter()
        .copied()
        .find(|&i| i != 3)
        .expect("an original monitor left");
    c.kill9(&format!("mon.{other}"));
    // The new monitor alone serves a client: a pool created through it, an object stored.
    let conf = std::fs::read_to_string(&c.conf).expect("conf");
    let mons_line = conf
        .lines()
        .find(|l| l.starts_with("mons"))
        .expect("mons line");
    let only_new = conf.replace(mons_line, &format!("mons = [\"{addr}\"]"));
    let conf3 = c.dir.join("mon3.toml");
    std::fs::write(&conf3, only_new).expect("write conf");
    let conf3 = conf3.display().to_string();
    let (ok, out) = common::cluster::run_as(
        &conf3,
        &["pool", "create", "p", "--size", "1", "--pgs", "8"],
    );
    assert!(ok, "{out}");
    let file = c.dir.join("obj.txt");
    std::fs::write(&file, b"kept by the new monitors").expect("write file");
    let file = file.display().to_string();
    let (ok, out) = common::cluster::run_as(&conf3, &["obj", "put", "p", "k", &file]);
    assert!(ok, "{out}");
    let (ok, out) = common::cluster::run_as(&conf3, &["obj", "get", "p", "k", "-"]);
    assert!(ok && out.contains("kept by the new monitors"), "{out}");
    let _ = mon3.kill();
    let _ = mon3.wait();
}

/// A watch (`Client::watch`) returns at once when the object differs from what the watcher
/// knows, at the next write otherwise, and after its wait when nothing changes; it survives
/// its primary being killed.
#[test]
fn a_watch_wakes_at_the_next_write_and_not_before() {
    let c = Cluster::up("watch", 1, 3);
    c.pool_create("w", 3, 2, 8);
    let rt = runtime();
    rt.block_on(async {
        let watcher = c.client().await;
        let writer = c.client().await;
        let pool = watcher.pool_id("w").expect("pool");
        let obj = b"watched".as_slice();
        let long = Duration::from_secs(10);
        // Absent: its CRC is 0; another CRC is answered at once.
        let t = Instant::now();
        watcher.watch(pool, obj, 1, long).await.expect("watch");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // Nothing changes: it waits its time out (asked 1 s).
        let t = Instant::now();
        watcher
            .watch(pool, obj, 0, Duration::from_secs(1))
            .await
            .expect("watch");
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );
        for (round, body) in [b"one".as_slice(), b"two"].into_iter().enumerate() {
            let known = match watcher.read(pool, obj, 0, 64).await {
                Ok(b) => cairn_client::contents_tag(&b),
                Err(_) => 0,
            };
            let w = watcher.clone();
            let waiting =
                tokio::spawn(
                    async move { (w.watch(pool, obj, known, long).await, Instant::now()) },
                );
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(
                !waiting.is_finished(),
                "round {round}: woke without a write"
            );
            if round == 1 {
                // The primary dies while the watch waits: it is sent again to the next one.
                let pg = writer.map().object_pg(pool, obj).expect("pg");
                let primary = writer.map().pg_placement(pg).primary().expect("primary");
                c.kill9(&format!("osd.{primary}"));
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let wrote = Instant::now();
            writer.write_full(pool, obj, body).await.expect("write");
            let done = Instant::now();
            let (r, woke) = waiting.await.expect("join");
            r.expect("watch");
            assert!(woke >= wrote, "round {round}: woke before the write");
            assert!(
                woke.saturating_duration_since(done) < Duration::from_secs(2),
                "round {round}: woke {:?} after the write was done",
                woke.saturating_duration_since(done)
            );
            assert_eq!(watcher.read(pool, obj, 0, 64).await.expect("read"), body);
        }
    });
}

/// Compare-and-swap (`Client::write_full_if`): counters incremented by many clients at once
/// lose no increment, a stale expectation changes nothing, and a conditional remove of
/// changed contents is refused.
#[test]
fn conditional_writes_lose_no_update_among_racing_clients() {
    let c = Cluster::up("cas", 1, 3);
    c.pool_create("cas", 3, 2, 8);
    let rt = runtime();
    rt.block_on(async {
        let obj = b"counter".as_slice();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let client = c.client().await;
            let pool = client.pool_id("cas").expect("pool");
            tasks.push(tokio::spawn(async move {
                let (mut done, mut conflicts) = (0u64, 0u64);
                while done < 25 {
                    let (n, crc) = match client.read(pool, obj, 0, 8).await {
                        Ok(b) => (
                            u64::from_le_bytes(b.as_slice().try_into().expect("8 bytes")),
                            cairn_client::contents_tag(&b),
                        ),
                        Err(cairn_client::ClientError::NoSuchObject { .. }) => (0, 0),
                        Err(e) => panic!("read: {e}"),
                    };
                    let next = (n + 1).to_le_bytes();
                    match client.write_full_if(pool, obj, crc, &next).await {
                        Ok(()) => done += 1,
                        Err(cairn_client::ClientError::Conflict { .. }) => conflicts += 1,
                        Err(e) => panic!("conditional write: {e}"),
                    }
                }
                conflicts
            }));
        }
        let mut conflicts = 0;
        for t in tasks {
            conflicts += t.await.expect("join");
        }
        let client = c.client().await;
        let pool = client.pool_id("cas").expect("pool");
        let b = client.read(pool, obj, 0, 8).await.expect("read");
        assert_eq!(u64::from_le_bytes(b.clone().try_into().expect("8")), 100);
        eprintln!("100 increments, {conflicts} conflicts");
        // A stale expectation changes nothing; nor does a conditional remove.
        let stale = client.write_full_if(pool, obj, 12345, b"x").await;
        assert!(
            matches!(stale, Err(cairn_client::ClientError::Conflict { .. })),
            "{stale:?}"
        );
        let r = client.remove_if(pool, obj, 12345).await;
        assert!(
            matches!(r, Err(cairn_client::ClientError::Conflict { .. })),
            "{r:?}"
        );
        assert_eq!(client.read(pool, obj, 0, 8).await.expect("read"), b);
        client
            .remove_if(pool, obj, cairn_client::contents_tag(&b))
            .await
            .expect("remove if unchanged");
        assert!(client.stat(pool, obj).await.is_err());
    });
}

/// The byte pattern of write `step` (each write's bytes differ from every other's).
fn ec_bytes(step: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (step.wrapping_mul(131) ^ (i as u64).wrapping_mul(7)) as u8)
        .collect()
}

/// Random writes, zeroing and cuts on a few objects of EC pool `pool`, each applied to the
/// model too, then every object read back whole and in pieces.
async fn ec_writes_and_check(
    client: &cairn_client::Client,
    pool: u32,
    models: &mut [Vec<u8>],
    seed: u64,
) {
    let mut x = seed;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    let stripe = 8192u64; // 2+1, unit 4 KiB
    for step in 0..120u64 {
        let o = rnd(models.len() as u64) as usize;
        let name = format!("ec-{o}").into_bytes();
        let model = &mut models[o];
        let offset = if rnd(3) == 0 {
            rnd(8) * stripe
        } else {
            rnd(8 * stripe)
        };
        let len = 1 + rnd(3 * stripe);
        match rnd(8) {
            0 if !model.is_empty() => {
                client.zero(pool, &name, offset, len).await.expect("zero");
                let end = ((offset + len) as usize).min(model.len());
                if (offset as usize) < end {
                    model[offset as usize..end].fill(0);
                }
            }
            1 if !model.is_empty() => {
                let size = rnd(8 * stripe);
                client.truncate(pool, &name, size).await.expect("truncate");
                model.resize(size as usize, 0);
            }
            _ => {
                let data = ec_bytes(step + seed, len as usize);
                client
                    .write(pool, &name, offset, &data)
                    .await
                    .expect("write");
                let end = (offset + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[offset as usize..end].copy_from_slice(&data);
            }
        }
    }
    ec_check(client, pool, models).await;
}

/// Every object of `models` reads back whole and in part, and stats, as its model.
async fn ec_check(client: &cairn_client::Client, pool: u32, models: &[Vec<u8>]) {
    for (o, model) in models.iter().enumerate() {
        let name = format!("ec-{o}").into_bytes();
        if model.is_empty() {
            continue;
        }
        let got = client.read(pool, &name, 0, 1 << 20).await.expect("read");
        assert!(got == *model, "object {o} differs from the model");
        let info = client.stat(pool, &name).await.expect("stat");
        assert_eq!(info.size, model.len() as u64, "size of object {o}");
        let (at, n) = (model.len() as u64 / 3, 5000u64);
        let part = client.read(pool, &name, at, n).await.expect("read part");
        let end = ((at + n) as usize).min(model.len());
        assert!(part == model[at as usize..end], "a range of object {o}");
    }
}

#[test]
fn an_ec_pool_serves_partial_writes_and_reads_on_when_a_shard_is_down() {
    let c = Cluster::up("ec-io", 1, 3);
    // min_size 2 = k: writes go on with a shard down (parity holds the lost data shard's).
    c.ec_pool_create("e", "2+1", Some(2), 8);
    // One PG, for more writes than its log keeps.
    c.ec_pool_create("b", "2+1", Some(2), 1);
    runtime().block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("e").expect("pool");
        let b = client.pool_id("b").expect("pool b");
        let mut b_models: Vec<Option<Vec<u8>>> = vec![None; 40];
        for (o, m) in b_models.iter_mut().enumerate().take(12) {
            let data = ec_bytes(o as u64 + 1000, 20_000);
            let name = format!("b-{o}").into_bytes();
            client.write_full(b, &name, &data).await.expect("write b");
            *m = Some(data);
        }
        let mut models = vec![Vec::new(); 6];
        ec_writes_and_check(&client, pool, &mut models, 0x9e37).await;
        // A shard down: every object still reads back (decoded where a data shard is
        // lost), and writes go on (their bytes for the lost shard live in the parity).
        c.kill9("osd.1");
        common::cluster::wait_osd(&client, 1, false).await;
        ec_writes_and_check(&client, pool, &mut models, 0x51ed).await;
        // Back, its shards missed those writes: peering rebuilds them from the other two
        // (decoded), so that with another OSD down every object still reads back.
        c.start_osd(1);
        common::cluster::wait_osd(&client, 1, true).await;
        ec_writes_and_check(&client, pool, &mut models, 0x7f4a).await;
        c.kill9("osd.2");
        common::cluster::wait_osd(&client, 2, false).await;
        ec_check(&client, pool, &models).await;
        // osd.2's shard of pool b misses more writes than the PG log keeps (4096), removals
        // of objects it holds among them: back, it is backfilled (every object checked), so
        // that with osd.0 down pool b reads back from osd.1 and osd.2 alone.
        ec_many_writes(&client, b, &mut b_models, 5000).await;
        c.start_osd(2);
        common::cluster::wait_osd(&client, 2, true).await;
        // A read waits for the PG's peering, and so for the backfill.
        client
            .stat(b, b"b-5")
            .await
            .expect("stat after the backfill");
        let logs: String = (0..3)
            .map(|i| {
                std::fs::read_to_string(c.dir.join(format!("log/osd.{i}.log"))).unwrap_or_default()
            })
            .collect();
        assert!(
            logs.contains("backfill=true"),
            "pool b's shard on osd.2 was not backfilled"
        );
        c.kill9("osd.0");
        common::cluster::wait_osd(&client, 0, false).await;
        for (o, m) in b_models.iter().enumerate() {
            let name = format!("b-{o}").into_bytes();
            match m {
                Some(m) => {
                    let got = client.read(b, &name, 0, 1 << 20).await.expect("read b");
                    assert!(got == *m, "object b-{o} differs from its model");
                }
                None => assert!(
                    matches!(
                        client.stat(b, &name).await,
                        Err(cairn_client::ClientError::NoSuchObject { .. })
                    ),
                    "b-{o} is back"
                ),
            }
        }
    });
}

/// `total` small writes to the objects of `models` (`None`: absent) from 32 writers at once,
/// each with objects of its own (so the models stay exact); the first four objects are
/// removed first.
async fn ec_many_writes(
    client: &cairn_client::Client,
    pool: u32,
    models: &mut [Option<Vec<u8>>],
    total: usize,
) {
    const WRITERS: usize = 32;
    let n = models.len();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let client = client.clone();
        let mut mine: Vec<(usize, Option<Vec<u8>>)> = (w..n)
            .step_by(WRITERS)
            .map(|o| (o, models[o].take()))
            .collect();
        set.spawn(async move {
            let owned = mine.len();
            for step in 0..total / WRITERS {
                let i = step % owned.max(1);
                let Some((o, model)) = mine.get_mut(i) else {
                    return mine;
                };
                let name = format!("b-{o}").into_bytes();
                if *o < 4 && step < owned {
                    client.remove(pool, &name).await.expect("remove");
                    *model = None;
                    continue;
                }
                if *o < 4 {
                    continue;
                }
                let offset = (step * 4099 + *o * 577) % 30_000;
                let data = ec_bytes((step * 64 + *o) as u64, 512);
                client
                    .write(pool, &name, offset as u64, &data)
                    .await
                    .expect("write");
                let m = model.get_or_insert_with(Vec::new);
                if m.len() < offset + data.len() {
                    m.resize(offset + data.len(), 0);
                }
                m[offset..offset + data.len()].copy_from_slice(&data);
            }
            mine
        });
    }
    while let Some(done) = set.join_next().await {
        for (o, m) in done.expect("writer") {
            models[o] = m;
        }
    }
}
