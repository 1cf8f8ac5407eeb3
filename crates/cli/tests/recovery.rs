//! Peering and recovery with real processes: an OSD that was down comes back, is brought up
//! to date from the PG log (only the objects that changed move), and never serves what it
//! missed.

mod common;

use common::cluster::{runtime, wait_osd, Cluster};
use common::tools::find_block;
use common::unique::{acked_blocks, unique_writes_with, verify_unique};
use std::time::{Duration, Instant};

fn value(object: u32, generation: u32) -> Vec<u8> {
    format!("object {object} generation {generation} ")
        .repeat(50)
        .into_bytes()
}

fn name(object: u32) -> Vec<u8> {
    format!("obj-{object}").into_bytes()
}

/// Creates pool `p` (size 3, this min_size and PG count) and returns a client and its id.
async fn pool(c: &Cluster, min_size: u8, pgs: u32) -> (cairn_client::Client, u32) {
    c.pool_create("p", 3, min_size, pgs);
    let client = c.client().await;
    let id = client.pool_id("p").expect("pool");
    (client, id)
}

/// Writes generation 0 of objects `0..n`.
async fn fill(client: &cairn_client::Client, pool: u32, n: u32) {
    for o in 0..n {
        client
            .write_full(pool, &name(o), &value(o, 0))
            .await
            .expect("first write");
    }
}

/// A counter of `OSD_STATS` summed over the up OSDs that answer.
async fn stats_sum(client: &cairn_client::Client, f: fn(&cairn_client::OsdStats) -> u64) -> u64 {
    let map = client.map();
    let mut total = 0;
    for o in map.osds.values().filter(|o| o.up) {
        if let Ok(s) = cairn_client::osd_stats(&o.addr, client.auth(), Duration::from_secs(2)).await
        {
            total += f(&s);
        }
    }
    total
}

/// Objects recovered so far.
async fn recovered(client: &cairn_client::Client) -> u64 {
    stats_sum(client, |s| s.recovered_objects).await
}

/// Object bytes recovery moved so far.
async fn recovery_bytes(client: &cairn_client::Client) -> u64 {
    stats_sum(client, |s| s.recovery_bytes).await
}

#[test]
fn an_osd_back_from_down_is_recovered_by_log_and_serves_no_stale_data() {
    let c = Cluster::up("recovery-delta", 1, 3);
    // min_size 1: at the end, the returning OSD alone must serve everything.
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 1, 16).await;
        let objects = 120u32;
        let mut latest: Vec<Option<u32>> = vec![Some(0); objects as usize];
        fill(&client, pool, objects).await;
        // osd.2 goes down; meanwhile 20 objects change, 5 are removed, 6 are new.
        c.kill9("osd.2");
        wait_osd(&client, 2, false).await;
        let before = recovered(&client).await;
        for o in 0..20 {
            client
                .write_full(pool, &name(o), &value(o, 1))
                .await
                .expect("write while osd.2 is down");
            latest[o as usize] = Some(1);
        }
        for o in 20..25 {
            client.remove(pool, &name(o)).await.expect("remove");
            latest[o as usize] = None;
        }
        for o in objects..objects + 6 {
            client
                .write_full(pool, &name(o), &value(o, 1))
                .await
                .expect("new object");
            latest.push(Some(1));
        }
        let changed = 20 + 5 + 6;
        // osd.2 comes back: the primaries recover it; exactly the changed objects move.
        c.restart_missing(1, 3);
        wait_osd(&client, 2, true).await;
        let start = Instant::now();
        while recovered(&client).await - before < changed {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "recovery moved {} of {changed} objects within 30 s\n{}",
                recovered(&client).await - before,
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Settle, then nothing more moved: a backfill would have copied all ~125 objects.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            recovered(&client).await - before,
            changed,
            "recovery must move only the objects that changed"
        );
        // `cairn status` shows it: objects recovered, no PG left peering.
        let st = c.status();
        assert!(
            st["recovery"]["objects_recovered"].as_u64() >= Some(changed),
            "{st}"
        );
        assert_eq!(st["pgs"]["peering"], 0, "{st}");
        assert_eq!(st["recovery"]["objects_degraded"], 0, "{st}");
        // The other two OSDs die: osd.2 alone serves every object's latest value.
        only_osd_left(&c, &client, 2).await;
        for (o, want) in latest.iter().enumerate() {
            let got = client.read(pool, &name(o as u32), 0, 1 << 20).await;
            match (want, got) {
                (Some(g), Ok(v)) => assert!(v == value(o as u32, *g), "object {o}: stale value"),
                (None, Err(cairn_client::ClientError::NoSuchObject { .. })) => {}
                (want, got) => panic!("object {o}: want {want:?}, got {got:?}"),
            }
        }
    });
}

/// Writers of unique values to `objects` objects, remembering the last acknowledged
/// generation of each and the longest time without any acknowledgement.
struct Load {
    acked: std::sync::Arc<std::sync::Mutex<Vec<Option<u32>>>>,
    longest_stall: std::sync::Arc<std::sync::Mutex<Duration>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(client: &cairn_client::Client, pool: u32, objects: u32, writers: u32) -> Load {
        use std::sync::{atomic::AtomicBool, Arc, Mutex};
        let acked = Arc::new(Mutex::new(vec![None; objects as usize]));
        let last_ack = Arc::new(Mutex::new(Instant::now()));
        let longest_stall = Arc::new(Mutex::new(Duration::ZERO));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..writers)
            .map(|w| {
                let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
                let (last_ack, longest) = (last_ack.clone(), longest_stall.clone());
                tokio::spawn(async move {
                    let mut generation = 1;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        for o in (w..objects).step_by(writers as usize) {
                            let v = value(o, generation);
                            if client.write_full(pool, &name(o), &v).await.is_ok() {
                                acked.lock().expect("lock")[o as usize] = Some(generation);
                                let mut l = last_ack.lock().expect("lock");
                                let mut s = longest.lock().expect("lock");
                                *s = (*s).max(l.elapsed());
                                *l = Instant::now();
                            }
                        }
                        generation += 1;
                    }
                })
            })
            .collect();
        Load {
            acked,
            longest_stall,
            stop,
            tasks,
        }
    }

    async fn stop(self) -> (Vec<Option<u32>>, Duration) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("writer");
        }
        let acked = self.acked.lock().expect("lock").clone();
        let stall = *self.longest_stall.lock().expect("lock");
        (acked, stall)
    }
}

/// Kills every OSD of a 3-OSD cluster but `keep` and waits until they are marked down.
async fn only_osd_left(c: &Cluster, client: &cairn_client::Client, keep: u32) {
    let others: Vec<u32> = (0..3).filter(|o| *o != keep).collect();
    for o in &others {
        c.kill9(&format!("osd.{o}"));
    }
    for o in &others {
        wait_osd(client, *o, false).await;
    }
}

/// Every acknowledged object reads back with its last acknowledged value.
async fn verify(client: &cairn_client::Client, pool: u32, acked: &[Option<u32>]) {
    for (o, g) in acked.iter().enumerate() {
        if let Some(g) = g {
            let got = client
                .read(pool, &name(o as u32), 0, 1 << 20)
                .await
                .unwrap_or_else(|e| panic!("object {o}: {e}"));
            assert!(
                got == value(o as u32, *g),
                "object {o}: lost its acknowledged value {g}"
            );
        }
    }
}

#[test]
fn a_primary_killed_under_load_loses_nothing_and_comes_back_current() {
    let c = Cluster::up("recovery-primary", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 1, 16).await;
        let map = client.map();
        let pg = map.object_pg(pool, &name(0)).expect("pg");
        let primary = map.pg_placement(pg).primary().expect("primary");
        let load = Load::start(&client, pool, 24, 4);
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.kill9(&format!("osd.{primary}"));
        wait_osd(&client, primary, false).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.restart_missing(1, 3);
        wait_osd(&client, primary, true).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (acked, stall) = load.stop().await;
        assert!(
            stall < Duration::from_secs(10),
            "writes stalled {stall:?} (at most 10 s)"
        );
        assert!(
            acked.iter().all(|a| a.is_some()),
            "some object never written"
        );
        verify(&client, pool, &acked).await;
        // The restarted primary alone (the others killed) serves every latest value.
        only_osd_left(&c, &client, primary).await;
        verify(&client, pool, &acked).await;
    });
}

#[test]
fn with_two_of_three_down_writes_stop_and_resume_when_one_returns() {
    let c = Cluster::up("recovery-minsize", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 2, 16).await;
        // osd.0 goes down first and misses what is written while osd.1 and osd.2 serve.
        let load = Load::start(&client, pool, 24, 4);
        tokio::time::sleep(Duration::from_millis(500)).await;
        c.kill9("osd.0");
        wait_osd(&client, 0, false).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (acked, _) = load.stop().await;
        c.kill9("osd.1");
        wait_osd(&client, 1, false).await;
        // One member left of three, min_size 2: no write is acknowledged.
        let mut cfg = c.client_config();
        cfg.op_timeout = Duration::from_secs(2);
        let short = cairn_client::Client::connect(cfg).await.expect("client");
        let mut attempts = tokio::task::JoinSet::new();
        for o in 0..24u32 {
            let short = short.clone();
            attempts.spawn(async move {
                let r = short
                    .write_full(pool, &name(o), b"must not be acknowledged")
                    .await;
                (o, r.is_ok())
            });
        }
        while let Some(r) = attempts.join_next().await {
            let (o, acknowledged) = r.expect("task");
            assert!(
                !acknowledged,
                "object {o}: a write was acknowledged below min_size"
            );
        }
        // The stale osd.0 returns: PGs have 2 members again; osd.0 is recovered first.
        c.restart_missing(1, 3);
        wait_osd(&client, 0, true).await;
        verify(&client, pool, &acked).await;
        let start = Instant::now();
        client
            .write_full(pool, &name(0), &value(0, 999))
            .await
            .expect("writes resume");
        assert!(start.elapsed() < Duration::from_secs(10));
        // osd.1 returns too; everything is still there.
        let mut acked = acked;
        acked[0] = Some(999);
        verify(&client, pool, &acked).await;
    });
}

#[test]
fn an_added_osd_takes_its_share_and_all_data_verifies() {
    let c = Cluster::up("recovery-add", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 2, 32).await;
        let objects = 96u32;
        fill(&client, pool, objects).await;
        let before = recovered(&client).await;
        let map_before = client.map();
        // Writers keep going while osd.3 joins.
        let load = Load::start(&client, pool, 16, 2);
        c.restart_missing(1, 4);
        wait_osd(&client, 3, true).await;
        // The OSDs that gave PGs to osd.3 keep their copies at first (reported misplaced).
        let start = Instant::now();
        while stats_sum(&client, |s| s.pgs_misplaced).await == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "no misplaced PG copy reported after osd.3 joined"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let map = client.mon().get_map().await.expect("map");
        let moved = (0..32)
            .filter(|&pg| {
                let id = cairn_map::PgId { pool, pg };
                map.pg_placement(id).acting.contains(&3)
                    && !map_before.pg_placement(id).acting.contains(&3)
            })
            .count();
        assert!(moved > 0, "no PG moved to the new OSD");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (acked, stall) = load.stop().await;
        assert!(stall < Duration::from_secs(10), "writes stalled {stall:?}");
        // Every PG that gained osd.3 copied its objects there before serving again.
        let start = Instant::now();
        while recovered(&client).await == before {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "nothing was copied"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut latest: Vec<Option<u32>> = vec![Some(0); objects as usize];
        for (o, a) in acked.iter().enumerate() {
            if a.is_some() {
                latest[o] = *a;
            }
        }
        verify(&client, pool, &latest).await;
        // Once the moved PGs are clean on their new members, the old owners delete their
        // copies: every PG (each went active, so each member holds one, if only to record
        // the epoch it went active at) is then held by exactly its 3 members.
        let want = 3 * 32;
        let start = Instant::now();
        loop {
            let held = stats_sum(&client, |s| s.pgs_held).await;
            if held == want {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{held} PG copies held, {want} expected: old owners kept theirs\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let st = tokio::task::block_in_place(|| c.status());
        assert_eq!(st["pgs"]["misplaced_copies"], 0, "{st}");
        // The old OSDs that left a PG are not needed for it: stop one that lost PGs to
        // osd.3 and read everything again (min_size 2 of the 3 members still holds).
        let gone = (0..3u32)
            .find(|&osd| {
                (0..32).any(|pg| {
                    let id = cairn_map::PgId { pool, pg };
                    map_before.pg_placement(id).acting.contains(&osd)
                        && !map.pg_placement(id).acting.contains(&osd)
                })
            })
            .expect("an OSD gave a PG to osd.3");
        c.kill9(&format!("osd.{gone}"));
        wait_osd(&client, gone, false).await;
        verify(&client, pool, &latest).await;
    });
}

#[test]
fn a_hung_osd_is_marked_down_and_rejoins_without_serving_stale_data() {
    let c = Cluster::up("recovery-sigstop", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 1, 16).await;
        let map = client.map();
        let pg = map.object_pg(pool, &name(0)).expect("pg");
        let hung = map.pg_placement(pg).primary().expect("primary");
        let load = Load::start(&client, pool, 24, 4);
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Hung, not dead: its connections stay open, it just stops answering.
        c.signal(&format!("osd.{hung}"), libc::SIGSTOP);
        wait_osd(&client, hung, false).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        c.signal(&format!("osd.{hung}"), libc::SIGCONT);
        // It learns it was marked down, boots again, and is recovered by its PGs' primaries.
        wait_osd(&client, hung, true).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (acked, stall) = load.stop().await;
        assert!(stall < Duration::from_secs(10), "writes stalled {stall:?}");
        verify(&client, pool, &acked).await;
        // It alone (the others killed) serves every latest value.
        only_osd_left(&c, &client, hung).await;
        verify(&client, pool, &acked).await;
    });
}

#[test]
fn an_osd_lost_for_good_is_marked_out_and_its_data_rebuilt_elsewhere() {
    let c = Cluster::up_with("recovery-wiped", 1, 4, &["--down-out-interval", "2"]);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 1, 32).await;
        let objects = 64u32;
        fill(&client, pool, objects).await;
        let before = recovered(&client).await;
        // osd.3 dies and its disk is lost.
        c.kill9("osd.3");
        let dev: toml::Value =
            toml::from_str(&std::fs::read_to_string(c.dir.join("dev.toml")).expect("dev.toml"))
                .expect("parse dev.toml");
        std::fs::remove_dir_all(c.dir.join("osd.3")).expect("wipe osd.3");
        if let Some(w) = dev.get("wal_dir").and_then(|w| w.as_str()) {
            let _ = std::fs::remove_file(std::path::Path::new(w).join("osd.3.wal"));
        }
        // Down after the grace, out after the down-out interval.
        let start = Instant::now();
        loop {
            let map = client.mon().get_map().await.expect("map");
            if map.osds.get(&3).is_some_and(|o| !o.up && !o.in_) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "osd.3 not marked out within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Every PG is on osd.0..2 again; the ones that lost osd.3 are rebuilt.
        let start = Instant::now();
        while recovered(&client).await == before {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "nothing was rebuilt"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let latest = vec![Some(0); objects as usize];
        verify(&client, pool, &latest).await;
        // osd.2 alone holds every object: those it had, and those rebuilt on it.
        only_osd_left(&c, &client, 2).await;
        verify(&client, pool, &latest).await;
    });
}

/// Block `b` of the scrub test's object `o`: 4 KiB no other block has.
fn scrub_block(o: u32, b: u32) -> Vec<u8> {
    let mut v = format!("scrub test object {o} block {b} ")
        .repeat(200)
        .into_bytes();
    v.truncate(4096);
    v
}

/// Writes the scrub test's objects `0..n` (16 distinct blocks each).
async fn fill_blocks(client: &cairn_client::Client, pool: u32, n: u32) {
    for o in 0..n {
        let data: Vec<u8> = (0..16).flat_map(|b| scrub_block(o, b)).collect();
        client
            .write_full(pool, &name(o), &data)
            .await
            .expect("write");
    }
}

/// Flips bytes of a block of `obj-0` in the data file (not the WAL) of the PG's first
/// replica once its store has written it there: silent corruption on the device. Returns
/// the PG, its primary and the damaged replica.
async fn corrupt_replica_block(
    c: &Cluster,
    client: &cairn_client::Client,
    pool: u32,
) -> (cairn_map::PgId, u32, u32) {
    let map = client.map();
    let pg = map.object_pg(pool, &name(0)).expect("pg");
    let acting = map.pg_placement(pg).acting;
    let (primary, victim) = (acting[0], acting[1]);
    corrupt_block_of(c, victim, &scrub_block(0, 5)).await;
    (pg, primary, victim)
}

/// Flips bytes of `block` in the data file (not the WAL) of OSD `victim` once its store has
/// written it there.
async fn corrupt_block_of(c: &Cluster, victim: u32, block: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = c.dir.join(format!("osd.{victim}")).join("data.img");
    let start = Instant::now();
    let spots = loop {
        let spots = find_block(&file, block);
        if !spots.is_empty() {
            break spots;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the block never reached osd.{victim}'s data file"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open for writing");
    for off in &spots {
        f.write_all_at(b"CORRUPTED BY THE TEST", off + 100)
            .expect("corrupt");
    }
    f.sync_all().expect("sync");
}

/// Bit rot in one chunk of an EC object (2+1, 4 KiB units: block 5 is on data shard 1):
/// scrub names the damaged shard's OSD; repairing rebuilds the chunk from the other two
/// shards, so that with data shard 0's OSD gone the object still decodes right.
#[test]
fn a_corrupted_ec_chunk_is_found_by_scrub_and_rebuilt() {
    let c = Cluster::up("recovery-ecscrub", 1, 3);
    c.ec_pool_create("e", "2+1", None, 1);
    runtime().block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("e").expect("pool");
        fill_blocks(&client, pool, 4).await;
        let map = client.map();
        let pg = map.object_pg(pool, &name(0)).expect("pg");
        let shards = map.pg_shards(pg, &map.pg_placement(pg));
        let (data0, victim) = (shards[0].expect("shard 0"), shards[1].expect("shard 1"));
        corrupt_block_of(&c, victim, &scrub_block(0, 5)).await;
        let pgid = pg.to_string();
        let scrub = |args: &[&str]| {
            let out = c.cairn(args);
            (out.status.code(), common::cluster::text(&out.stdout))
        };
        let line = format!("pg {pgid}: object obj-0 on osd.{victim}: damaged");
        let (code, text) = scrub(&["pg", "scrub", "--no-repair", &pgid]);
        assert_eq!(code, Some(3), "{text}\n{}", c.logs());
        assert!(
            text.contains(&line) && text.contains("NOT repaired"),
            "{text}"
        );
        let (code, text) = scrub(&["pg", "scrub", &pgid]);
        assert_eq!(code, Some(0), "{text}\n{}", c.logs());
        assert!(
            text.contains(&line) && text.contains("(repaired)"),
            "{text}"
        );
        let (code, text) = scrub(&["pg", "scrub", "--no-repair", "--json", &pgid]);
        assert_eq!(code, Some(0), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["objects"], 4, "{v}");
        c.kill9(&format!("osd.{data0}"));
        wait_osd(&client, data0, false).await;
        let want: Vec<u8> = (0..16).flat_map(|b| scrub_block(0, b)).collect();
        let start = Instant::now();
        loop {
            match client.read(pool, &name(0), 0, want.len() as u64).await {
                Ok(got) => {
                    assert!(got == want, "the repaired shard decodes wrong bytes");
                    break;
                }
                Err(e) => assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "read failed: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

#[test]
fn a_corrupted_replica_block_is_found_by_scrub_and_repaired() {
    let c = Cluster::up("recovery-scrub", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 2, 8).await;
        let objects = 24u32;
        fill_blocks(&client, pool, objects).await;
        let (pg, primary, victim) = corrupt_replica_block(&c, &client, pool).await;
        let pgid = pg.to_string();

        // Wrong PG ids are one-line errors, exit status 1, nothing scrubbed.
        for (args, want) in [
            (vec!["pg", "scrub", "1.zz"], "is not a PG id"),
            (vec!["pg", "scrub", "77.0"], "no pool with id 77"),
            (vec!["pg", "scrub", &format!("{}.ff", pg.pool)], "has 8 pgs"),
            (vec!["pg", "scrub", "-p", "p", &pgid], "not both"),
            (vec!["pg", "scrub", "-p", "nope"], "no pool named"),
        ] {
            let out = c.cairn(&args);
            let err = common::cluster::text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains(want), "{args:?}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        }

        // Report only: the damaged copy is named, nothing is repaired, exit status 3.
        let out = c.cairn(&["pg", "scrub", "--no-repair", &pgid]);
        let text = common::cluster::text(&out.stdout);
        assert_eq!(out.status.code(), Some(3), "{text}\n{}", c.logs());
        let line = format!("pg {pgid}: object obj-0 on osd.{victim}: damaged");
        assert!(text.contains(&line), "{text}");
        assert!(text.contains("NOT repaired"), "{text}");
        assert!(text.contains("1 inconsistent copies, 0 repaired"), "{text}");
        let st = c.status();
        assert_eq!(st["health"], "HEALTH_ERR", "{st}");
        assert_eq!(st["scrub"]["unrepaired"], 1, "{st}");

        // Repair: the primary's copy is written over the damaged one.
        let out = c.cairn(&["pg", "scrub", &pgid]);
        let text = common::cluster::text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}\n{}", c.logs());
        assert!(text.contains(&line), "{text}");
        assert!(text.contains("(repaired)"), "{text}");
        let st = c.status();
        assert_eq!(st["scrub"]["unrepaired"], 0, "{st}");
        assert_eq!(st["scrub"]["repaired"], 1, "{st}");

        // The whole pool now agrees, every object compared.
        let out = c.cairn(&["pg", "scrub", "--json", "-p", "p"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            common::cluster::text(&out.stdout)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["inconsistent"], 0, "{v}");
        assert_eq!(v["objects"], objects, "{v}");
        assert_eq!(v["pgs_scrubbed"], 8, "{v}");

        // The repaired replica itself serves the object once the primary is gone.
        c.kill9(&format!("osd.{primary}"));
        wait_osd(&client, primary, false).await;
        let want: Vec<u8> = (0..16).flat_map(|b| scrub_block(0, b)).collect();
        let start = Instant::now();
        loop {
            match client.read(pool, &name(0), 0, want.len() as u64).await {
                Ok(got) => {
                    assert!(got == want, "osd.{victim} served wrong bytes");
                    break;
                }
                Err(e) => assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "read failed: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(client.map().pg_placement(pg).primary(), Some(victim));
    });
}

#[test]
fn periodic_scrub_repairs_a_corrupted_block_by_itself() {
    let c = Cluster::up_with("recovery-scrub-periodic", 1, 3, &["--scrub-interval", "2"]);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 2, 4).await;
        fill_blocks(&client, pool, 8).await;
        corrupt_replica_block(&c, &client, pool).await;
        let start = Instant::now();
        loop {
            let st = c.status();
            if st["scrub"]["repaired"].as_u64() >= Some(1) {
                assert_eq!(st["scrub"]["unrepaired"], 0, "{st}");
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no periodic scrub repaired the block: {st}\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let out = c.cairn(&["pg", "scrub", "--no-repair", "-p", "p"]);
        let text = common::cluster::text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
        assert!(text.contains("0 inconsistent copies"), "{text}");
    });
}

#[test]
fn scrub_under_write_load_finds_nothing_and_loses_nothing() {
    let c = Cluster::up("recovery-scrub-load", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 2, 4).await;
        // Few objects, many writers: every scrub range is written while it is compared.
        let load = Load::start(&client, pool, 12, 6);
        let mut compared = 0;
        for _ in 0..4 {
            let out =
                tokio::task::block_in_place(|| c.cairn(&["pg", "scrub", "--json", "-p", "p"]));
            let text = common::cluster::text(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{text}\n{}", c.logs());
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
            // Copies caught between two writes must not look inconsistent (nor be
            // "repaired" over a newer write).
            assert_eq!(v["inconsistent"], 0, "{v}");
            assert_eq!(v["repaired"], 0, "{v}");
            compared += v["objects"].as_u64().unwrap_or(0);
        }
        let (acked, _) = load.stop().await;
        assert!(compared > 0, "no object was ever compared");
        verify(&client, pool, &acked).await;
        let out = c.cairn(&["pg", "scrub", "--json", "-p", "p"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["inconsistent"], 0, "{v}");
        assert_eq!(v["objects"], 12, "{v}");
        assert_eq!(v["busy"], 0, "{v}");
    });
}

#[test]
fn small_writes_to_large_objects_recover_only_the_bytes_they_changed() {
    let c = Cluster::up("recovery-ranges", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 1, 8).await;
        let (objects, size) = (16u32, 1usize << 20);
        // The model: what every object must hold.
        let mut model: Vec<Vec<u8>> = (0..objects)
            .map(|o| (0..size).map(|i| (i as u32 * 7 + o * 13) as u8).collect())
            .collect();
        for o in 0..objects {
            client
                .write_full(pool, &name(o), &model[o as usize])
                .await
                .expect("fill");
        }
        c.kill9("osd.2");
        wait_osd(&client, 2, false).await;
        let before = (recovered(&client).await, recovery_bytes(&client).await);
        // While osd.2 is down: three 4 KiB writes into each of 8 objects, a 8 KiB zero in
        // one, a shrink of another and a write past the end of a third.
        let mut changed = 0u64;
        for o in 0..8u32 {
            for k in 0..3u64 {
                let off = (k * 300_000 + u64::from(o) * 4096) as usize;
                let block = vec![0xA0 + o as u8 + k as u8; 4096];
                client
                    .write(pool, &name(o), off as u64, &block)
                    .await
                    .expect("small write");
                model[o as usize][off..off + 4096].copy_from_slice(&block);
                changed += 4096;
            }
        }
        client
            .zero(pool, &name(8), 40_960, 8192)
            .await
            .expect("zero");
        model[8][40_960..40_960 + 8192].fill(0);
        changed += 8192;
        client
            .truncate(pool, &name(9), 100_000)
            .await
            .expect("shrink");
        model[9].truncate(100_000);
        let tail = vec![0x5A; 4096];
        client
            .write(pool, &name(10), size as u64 + 8192, &tail)
            .await
            .expect("write past the end");
        model[10].resize(size + 8192, 0);
        model[10].extend_from_slice(&tail);
        // The zeros between the old end and the write come from the new size, not a copy.
        changed += 4096;
        c.restart_missing(1, 3);
        wait_osd(&client, 2, true).await;
        let touched = 11;
        let start = Instant::now();
        while recovered(&client).await - before.0 < touched {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "recovery did not finish\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let moved = recovery_bytes(&client).await - before.1;
        // Exactly the bytes written or zeroed; whole-object copies would have moved 11 MiB.
        assert_eq!(
            moved, changed,
            "recovery moved {moved} bytes for {changed} changed"
        );
        // osd.2 alone serves every object exactly as the model says.
        only_osd_left(&c, &client, 2).await;
        for (o, want) in model.iter().enumerate() {
            let got = client
                .read(pool, &name(o as u32), 0, 2 << 20)
                .await
                .expect("read from osd.2");
            assert!(got == *want, "object {o} differs on osd.2");
        }
    });
}

/// Object `o`'s large value of generation `g` (256 KiB).
fn big_value(o: u32, g: u32) -> Vec<u8> {
    let mut v = format!("big object {o} generation {g} ")
        .repeat(10_000)
        .into_bytes();
    v.truncate(256 << 10);
    v
}

/// Waits until no PG peers and no object is left to recover.
async fn wait_recovered(c: &Cluster) {
    let start = Instant::now();
    loop {
        let st = tokio::task::block_in_place(|| c.status());
        if st["pgs"]["peering"] == 0 && st["recovery"]["objects_degraded"] == 0 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "recovery did not finish: {st}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn a_member_recovered_in_the_background_under_writes_ends_current() {
    let c = Cluster::up("recovery-background", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 1, 8).await;
        let objects = 300u32;
        for o in 0..objects {
            client
                .write_full(pool, &name(o), &big_value(o, 0))
                .await
                .expect("fill");
        }
        // osd.2 misses a new generation of every object (75 MiB to recover).
        c.kill9("osd.2");
        wait_osd(&client, 2, false).await;
        for o in 0..objects {
            client
                .write_full(pool, &name(o), &big_value(o, 1))
                .await
                .expect("write while osd.2 is down");
        }
        // It comes back while clients keep overwriting a sixth of the objects being copied
        // to it (the others only recovery brings it).
        let load = Load::start(&client, pool, objects / 6, 8);
        c.restart_missing(1, 3);
        wait_osd(&client, 2, true).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (acked, stall) = load.stop().await;
        assert!(stall < Duration::from_secs(5), "writes stalled {stall:?}");
        wait_recovered(&c).await;
        // osd.2 alone serves, for every object, the last value written.
        only_osd_left(&c, &client, 2).await;
        for o in 0..objects {
            let got = client
                .read(pool, &name(o), 0, 1 << 20)
                .await
                .unwrap_or_else(|e| panic!("object {o}: {e}"));
            let want = match acked.get(o as usize) {
                Some(Some(g)) => value(o, *g),
                _ => big_value(o, 1),
            };
            assert!(got == want, "object {o}: osd.2 holds a stale value");
        }
    });
}

#[test]
fn a_primary_lost_during_background_recovery_hands_it_over_by_the_missing_marks() {
    // Recovery pauses 100 ms per object: it is surely under way when the primary dies.
    let c = Cluster::up_with("recovery-marks", 1, 3, &["--recovery-sleep-ms", "100"]);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 1, 4).await;
        let objects = 60u32;
        fill(&client, pool, objects).await;
        c.kill9("osd.2");
        wait_osd(&client, 2, false).await;
        for o in 0..objects {
            client
                .write_full(pool, &name(o), &value(o, 1))
                .await
                .expect("write while osd.2 is down");
        }
        // osd.2 returns: it gets the PGs' logs at once, its stale objects marked missing.
        c.restart_missing(1, 3);
        wait_osd(&client, 2, true).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        // A primary recovering it dies; the next one finds the marks and finishes the job.
        let map = client.map();
        let victim = (0..4)
            .filter_map(|pg| map.pg_placement(cairn_map::PgId { pool, pg }).primary())
            .find(|p| *p != 2)
            .expect("a PG led by osd.0 or osd.1");
        let heir = 1 - victim;
        c.kill9(&format!("osd.{victim}"));
        wait_osd(&client, victim, false).await;
        wait_recovered(&c).await;
        let log = std::fs::read_to_string(c.dir.join("log").join(format!("osd.{heir}.log")))
            .expect("log");
        assert!(
            log.contains("marked missing"),
            "osd.{heir} never saw osd.2's missing marks:\n{}",
            c.logs()
        );
        // osd.2 alone serves every object's latest value.
        c.kill9(&format!("osd.{heir}"));
        wait_osd(&client, heir, false).await;
        let latest = vec![Some(1); objects as usize];
        verify(&client, pool, &latest).await;
    });
}

#[test]
fn a_primary_behind_serves_its_pgs_while_it_catches_up() {
    // Background recovery pauses 200 ms per object: it takes seconds, client ops must not.
    let c = Cluster::up_with(
        "recovery-primary-behind",
        1,
        3,
        &["--recovery-sleep-ms", "200"],
    );
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 1, 8).await;
        let objects = 120u32;
        fill(&client, pool, objects).await;
        c.kill9("osd.2");
        wait_osd(&client, 2, false).await;
        // Every object is rewritten, and a few are created, while osd.2 is down.
        let created = 10u32;
        for o in 0..objects + created {
            client
                .write_full(pool, &name(o), &value(o, 1))
                .await
                .expect("write while osd.2 is down");
        }
        let objects = objects + created;
        c.restart_missing(1, 3);
        wait_osd(&client, 2, true).await;
        // The objects of the PGs osd.2 leads again: all of them stale in its copy.
        let map = client.mon().get_map().await.expect("map");
        let led: Vec<u32> = (0..objects)
            .filter(|o| {
                let pg = map.object_pg(pool, &name(*o)).expect("pg");
                map.pg_placement(pg).primary() == Some(2)
            })
            .collect();
        assert!(
            led.len() >= 10,
            "osd.2 leads PGs of only {} objects",
            led.len()
        );
        // Half of them are read and patched at once: each is pulled as the read asks for it.
        let (asked, rest) = led.split_at(led.len() / 2);
        let patch = b"patched while behind ";
        for o in asked {
            let got = client
                .read(pool, &name(*o), 0, 1 << 20)
                .await
                .expect("read");
            assert!(
                got == value(*o, 1),
                "object {o}: osd.2 served a stale value"
            );
            client
                .write(pool, &name(*o), 0, patch)
                .await
                .expect("patch");
        }
        // Half of the others are only patched: written over osd.2's stale copy, which the
        // pull must then make whole without undoing the patch.
        let blind = &rest[..rest.len() / 2];
        for o in blind {
            client
                .write(pool, &name(*o), 0, patch)
                .await
                .expect("blind patch");
        }
        let addr = map.osds[&2].addr.clone();
        let stats = cairn_client::osd_stats(&addr, &c.auth(), Duration::from_secs(2))
            .await
            .expect("osd.2 stats");
        assert!(
            stats.recovery_pending_objects > 0,
            "osd.2 had finished catching up before serving: the test proves nothing"
        );
        // A listing waits until osd.2's copy is complete: it names the objects created
        // while osd.2 was down too.
        let mut names = client.list(pool).await.expect("list");
        names.sort();
        let mut all: Vec<Vec<u8>> = (0..objects).map(name).collect();
        all.sort();
        assert_eq!(names, all, "the listing misses or invents objects");
        wait_recovered(&c).await;
        // osd.2 alone serves every latest value: patched ones, and those only recovery moved.
        only_osd_left(&c, &client, 2).await;
        for o in 0..objects {
            let mut want = value(o, 1);
            if asked.contains(&o) || blind.contains(&o) {
                want[..patch.len()].copy_from_slice(patch);
            }
            let got = client.read(pool, &name(o), 0, 1 << 20).await.expect("read");
            assert!(got == want, "object {o}: osd.2 holds a stale value");
        }
    });
}

#[test]
fn memory_pool_writes_survive_kill9_of_every_member_right_after_their_ack() {
    let c = Cluster::up("recovery-memory", 1, 3);
    let rt = runtime();
    rt.block_on(async {
        let (client, pool) = pool(&c, 2, 8).await;
        c.ok(&["pool", "set", "p", "durability", "memory"]);
        let start = Instant::now();
        while client.map().pools[&pool].durability != cairn_map::Durability::Memory {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "map never changed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fill(&client, pool, 50).await;
        // No other write follows that could carry these in its WAL batch: kill at once.
        for i in 0..3 {
            c.kill9(&format!("osd.{i}"));
        }
        c.restart_missing(1, 3);
        for i in 0..3 {
            wait_osd(&client, i, true).await;
        }
        let acked: Vec<Option<u32>> = vec![Some(0); 50];
        verify(&client, pool, &acked).await;
        // FLUSH of a memory pool (what NBD FLUSH and FUA wait for) reaches every OSD.
        client.sync_pool(pool).await.expect("sync of a memory pool");
    });
}

/// Runs the unique-value writer on `uri`, kills `kill` after 2 s, and stops it `secs` later;
/// returns its output.
fn unique_writes(
    c: &Cluster,
    uri: &str,
    stop: &std::path::Path,
    secs: u64,
    kill: &[u32],
) -> String {
    unique_writes_with(c, uri, stop, secs, || {
        for id in kill {
            c.kill9(&format!("osd.{id}"));
        }
    })
}

/// A volume whose data is on a 4+2 pool of 6 OSDs (min_size 4): two OSDs killed under a
/// unique-value write load over NBD lose no acknowledged write and writes and reads go on; a
/// third makes every PG down (reads fail, never return a wrong value); back, the OSDs' shards
/// are rebuilt, so that with the two others killed everything still reads back.
#[test]
fn a_4_2_volume_survives_two_osds_killed_under_nbd_writes_and_a_third_makes_it_down() {
    let c = Cluster::up_with_nbd("recovery-ec42", 6);
    c.ec_pool_create("e", "4+2", Some(4), 8);
    // The volume's header and lease live in the replicated pool: it must survive two
    // failures as well.
    c.ok(&["pool", "set", "default", "size", "4"]);
    c.ok(&["vol", "create", "v", "--size", "64M", "--data-pool", "e"]);
    let uri = c.nbd_uri("v");
    let stop = common::tools::scratch("recovery-ec42").join("stop");
    runtime().block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("e").expect("pool");
        let probe = value(7, 7);
        let read_probe = |client: &cairn_client::Client| {
            let client = client.clone();
            async move {
                client
                    .read(pool, b"probe", 0, 1 << 20)
                    .await
                    .expect("read the probe object")
            }
        };
        client
            .write_full(pool, b"probe", &probe)
            .await
            .expect("probe");
        // Two OSDs killed mid-load (every PG has a shard on each of the six).
        let mut out = unique_writes(&c, &uri, &stop, 3, &[1, 2]);
        wait_osd(&client, 1, false).await;
        wait_osd(&client, 2, false).await;
        let missing = |c: &Cluster| {
            let st = c.status();
            let pools = st["pools"].as_array().cloned().unwrap_or_default();
            let e = pools.iter().find(|p| p["name"] == "e").cloned();
            e.map(|p| p["pgs_by_missing_shards"].clone())
        };
        assert_eq!(missing(&c), Some(serde_json::json!([0, 0, 8, 0, 0, 0, 0])));
        let text = c.ok(&["status"]);
        assert!(
            text.contains("shards: 0 PGs with every shard, 8 missing 2 (read by decoding"),
            "{text}"
        );
        // With both down, writes go on (4 shards = min_size) and everything reads back.
        let degraded = unique_writes(&c, &uri, &stop, 3, &[]);
        let acks = degraded.lines().filter(|l| l.starts_with("a ")).count();
        assert!(
            acks >= 20,
            "{acks} writes acknowledged with two OSDs down\n{degraded}"
        );
        out.push_str(&degraded);
        let acked = acked_blocks(&out);
        eprintln!(
            "{} blocks written, {acks} writes with two OSDs down",
            acked.len()
        );
        verify_unique(&c, &uri, &acked);
        // A third: fewer than k shards, every PG down; a read fails, never answers wrong.
        c.kill9("osd.3");
        wait_osd(&client, 3, false).await;
        assert!(c
            .ok(&["status"])
            .contains("8 missing 3 (fewer than k left: down)"));
        let mut cfg = c.client_config();
        cfg.op_timeout = Duration::from_secs(3);
        let short = cairn_client::Client::connect(cfg).await.expect("client");
        match short.read(pool, b"probe", 0, 1 << 20).await {
            Ok(got) => panic!(
                "a read with 3 of 6 shards answered ({} bytes, same: {})",
                got.len(),
                got == probe
            ),
            Err(e) => eprintln!("read with three OSDs down: {e}"),
        }
        // Back, their shards are rebuilt from the others: with the two never killed down,
        // every acknowledged write still reads back.
        for id in [1, 2, 3] {
            c.start_osd(id);
        }
        for id in [1, 2, 3] {
            wait_osd(&client, id, true).await;
        }
        verify_unique(&c, &uri, &acked);
        assert_eq!(read_probe(&client).await, probe);
        for id in [0, 5] {
            c.kill9(&format!("osd.{id}"));
        }
        wait_osd(&client, 0, false).await;
        wait_osd(&client, 5, false).await;
        verify_unique(&c, &uri, &acked);
        assert_eq!(read_probe(&client).await, probe);
    });
}

/// How many times the logs of `osds` say an EC PG peered to a rebuild (a shard behind, or a
/// write rolled back).
#[cfg(feature = "failpoints")]
fn ec_rebuilds_logged(c: &Cluster, osds: &[u32]) -> usize {
    osds.iter()
        .map(|o| {
            let log = c.dir.join("log").join(format!("osd.{o}.log"));
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .matches("rebuilding EC shards")
                .count()
        })
        .sum()
}

/// A 4+2 volume under the unique-value NBD writer, one of its PGs' primaries stalled at
/// `osd_ec_primary_sent_one` (its write sent to the next shard only: that shard's chunk, or
/// just its log entry, is there; the parity shards and the primary's own are not) and killed
/// -9 there together with a second OSD: the survivors roll the write back (its only holder
/// answered, the others present when it was made lack it), the writer's retry lands on the
/// new primary, and every acknowledged write reads back, degraded and again once both OSDs
/// are back and rebuilt and two others are down.
#[cfg(feature = "failpoints")]
#[test]
fn a_4_2_volume_loses_no_write_when_a_primary_dies_between_a_data_chunk_and_its_parity() {
    let c = Cluster::up_with_nbd("recovery-ec42-fp", 6);
    c.ec_pool_create("e", "4+2", Some(4), 8);
    c.ok(&["pool", "set", "default", "size", "4"]);
    c.ok(&["vol", "create", "v", "--size", "64M", "--data-pool", "e"]);
    let uri = c.nbd_uri("v");
    let stop = common::tools::scratch("recovery-ec42-fp").join("stop");
    runtime().block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("e").expect("pool");
        // The stalled primary leads PG e.0; the second OSD killed holds no PG's next shard
        // after a PG that primary leads, so the one shard ahead survives to be rolled back.
        let map = client.map();
        let shards = |pg: u32| {
            let id = cairn_map::PgId { pool, pg };
            map.pg_shards(id, &map.pg_placement(id))
        };
        let all: Vec<Vec<Option<u32>>> = (0..8).map(shards).collect();
        let primary = all[0][0].expect("PG e.0 has its primary");
        let ahead: Vec<u32> = all
            .iter()
            .filter(|s| s[0] == Some(primary))
            .filter_map(|s| s[1])
            .collect();
        let other = (0..6u32)
            .rev()
            .find(|o| *o != primary && !ahead.contains(o))
            .expect("an OSD that is neither");
        c.kill9(&format!("osd.{primary}"));
        wait_osd(&client, primary, false).await;
        c.start_osd_with(
            primary,
            &[("FAILPOINTS", "osd_ec_primary_sent_one=sleep(60000)")],
        );
        wait_osd(&client, primary, true).await;
        c.wait_status("every PG active", Duration::from_secs(60), |s| {
            s["pgs"]["inactive"] == 0
        });
        let survivors: Vec<u32> = (0..6).filter(|o| *o != primary && *o != other).collect();
        let rebuilds = ec_rebuilds_logged(&c, &survivors);
        let out = unique_writes(&c, &uri, &stop, 8, &[primary, other]);
        let acked = acked_blocks(&out);
        // The writer stalls within its first writes (an eighth or more go to that primary's
        // PGs) and goes on after the kill.
        let acks = out.lines().filter(|l| l.starts_with("a ")).count();
        assert!(acks >= 20, "{acks} writes acknowledged\n{out}");
        assert!(
            ec_rebuilds_logged(&c, &survivors) > rebuilds,
            "no survivor rolled back the write cut at the failpoint (osd.{primary} stalled, \
             osd.{other} killed with it)\n{}",
            c.logs()
        );
        verify_unique(&c, &uri, &acked);
        c.start_osd(primary);
        c.start_osd(other);
        wait_osd(&client, primary, true).await;
        wait_osd(&client, other, true).await;
        verify_unique(&c, &uri, &acked);
        let two: Vec<u32> = survivors.iter().copied().take(2).collect();
        for o in &two {
            c.kill9(&format!("osd.{o}"));
        }
        for o in &two {
            wait_osd(&client, *o, false).await;
        }
        verify_unique(&c, &uri, &acked);
    });
}

/// A 4+2 pool on 7 OSDs: an OSD killed, written around, then marked out; each of its shards
/// goes to the OSD that takes its rank, which holds nothing of it and is backfilled (decoded
/// from k others). Then with two other OSDs killed, only four shards answer per PG, the
/// backfilled ones among them: every object reads back as last written.
#[test]
fn a_4_2_pools_shards_are_rebuilt_elsewhere_once_their_osd_is_marked_out() {
    let c = Cluster::up("recovery-ec42-out", 1, 7);
    c.ec_pool_create("e", "4+2", Some(4), 8);
    runtime().block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("e").expect("pool");
        let body = |o: u32, g: u32| value(o, g).repeat(20);
        let mut model = std::collections::BTreeMap::new();
        for o in 0..40 {
            client
                .write_full(pool, &name(o), &body(o, 1))
                .await
                .expect("write");
            model.insert(o, body(o, 1));
        }
        c.kill9("osd.3");
        wait_osd(&client, 3, false).await;
        for o in (0..40).step_by(2) {
            client
                .write_full(pool, &name(o), &body(o, 2))
                .await
                .expect("degraded write");
            model.insert(o, body(o, 2));
        }
        let before = client.map();
        let recovered = |s: &serde_json::Value| s["recovery"]["objects_recovered"].as_u64();
        let recovered_before = recovered(&c.status()).expect("objects_recovered");
        c.ok(&["osd", "out", "3"]);
        let after = client.mon().get_map().await.expect("map");
        // The objects whose PG had a shard on osd.3: each is rebuilt on the shard's new OSD.
        let on_3 = (0..40)
            .filter(|o| {
                let pg = after.object_pg(pool, &name(*o)).expect("pg");
                before.pg_placement(pg).up_set.contains(&3)
            })
            .count() as u64;
        assert!(on_3 > 0);
        tokio::task::block_in_place(|| {
            c.wait_status(
                "the shards of osd.3 backfilled",
                Duration::from_secs(60),
                |s| {
                    s["osds"]["in"] == 6
                        && s["pgs"]["inactive"] == 0
                        && s["pgs"]["peering"] == 0
                        && recovered(s).is_some_and(|r| r >= recovered_before + on_3)
                },
            )
        });
        // Every PG that had a shard on osd.3 has it on another OSD now.
        let moved: Vec<(u32, u32)> = (0..8)
            .filter_map(|pg| {
                let id = cairn_map::PgId { pool, pg };
                let was = before.pg_placement(id).up_set;
                let rank = was.iter().position(|o| *o == 3)?;
                Some((pg, after.pg_placement(id).up_set[rank]))
            })
            .collect();
        assert!(
            !moved.is_empty() && moved.iter().all(|(_, o)| *o != 3),
            "{moved:?}"
        );
        // Two OSDs that never left, down: four shards answer, the moved one among them.
        for o in ["osd.0", "osd.1"] {
            c.kill9(o);
        }
        wait_osd(&client, 0, false).await;
        wait_osd(&client, 1, false).await;
        for (o, want) in &model {
            let got = client.read(pool, &name(*o), 0, 1 << 20).await;
            assert!(
                got.as_deref().ok() == Some(want.as_slice()),
                "object {o} after the backfill ({moved:?}) with osd.0 and osd.1 down: {:?}\n{}",
                got.map(|g| g.len()),
                c.logs()
            );
        }
    });
}
