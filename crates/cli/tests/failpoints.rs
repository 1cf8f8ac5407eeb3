//! Failing stop at named failpoints (`cargo test -p cairn-cli --features failpoints --test
//! failpoints`; `./test.sh` enables the feature). Each store failpoint is reached by a real
//! `cairn store torture` process under load, round after round on the same store:
//! - set to `panic`, the process must abort by itself (not go on beside a half-applied
//!   index), log the panic with where and what, and leave a crash report naming it;
//! - set to `sleep`, the process stalls exactly there and is killed -9 while it does.
//!
//! After each round the store is opened here and every acknowledged commit is checked
//! against the model, as kill9.rs does after a kill at a random time.

// The shared harness has parts only kill9.rs uses (its random plans and kill timers).
#![allow(dead_code)]

#[path = "../src/torture/workload.rs"]
mod workload;

include!("harness/store.rs");

/// The store's failpoints, each inside a step that a crash must not tear.
const STORE_POINTS: [&str; 4] = [
    // Half of a transaction's effects in the index, its collections' locks held (every
    // transaction of the workload names the counters' collection: all threads stall there).
    "store_index_apply",
    // A flush batch on its segment, the index still pointing at the pending copies.
    "store_flusher_written",
    // A checkpoint's body written, its root and the WAL header naming it not.
    "store_checkpoint_body_written",
    // A direct write's data durable on the data device, its WAL record not written.
    "store_direct_data_written",
];

fn harness(name: &'static str) -> Harness {
    let files = Files::new(name, 1, true);
    let mut h = Harness::new(name, files, &["--size", "256M", "--wal-size", "64M"]);
    // Large writes go to the data device directly, so that the direct-write point is
    // reached.
    h.direct_write_min = Some(8192);
    h
}

fn plan(r: &mut Rng) -> Plan {
    Plan {
        threads: 2 + r.below(3) as usize,
        from: KillFrom::Open,
        delay: Duration::ZERO,
        // Frequent checkpoints and flushes, so that their points are reached soon.
        checkpoint_ms: Some(20 + r.below(80)),
        flush_ms: Some(r.below(20)),
        close: r.below(2) == 0,
    }
}

fn each_store_point(name: &'static str, action: &'static str) {
    let mut h = harness(name);
    let mut r = Rng::new(h.seed);
    for point in STORE_POINTS {
        h.failpoint = Some(Failpoint {
            name: point,
            action,
            skip: 5 + r.below(200),
        });
        h.round(plan(&mut r));
    }
    // A last round without failpoints: the store goes on after all of them.
    h.failpoint = None;
    let mut p = plan(&mut r);
    p.delay = Duration::from_millis(300);
    h.round(p);
    h.final_scrub();
    assert!(h.total_acks > 0, "{}: nothing was acknowledged", h.ctx());
}

#[test]
fn a_panic_at_each_store_failpoint_aborts_the_process_and_loses_no_acknowledged_commit() {
    each_store_point("failpoint_panic", "panic");
}

#[test]
fn kill9_at_each_store_failpoint_loses_no_acknowledged_commit() {
    each_store_point("failpoint_kill9", "sleep(60000)");
}

mod common;

/// An OSD of a `dev up` cluster whose every peering panics (`osd_peering_mid`): it aborts
/// with a crash report, its supervisor starts it again, and after five crashes gives up.
/// Started again without the failpoint, it reports those crashes, which `cairn status`
/// (HEALTH_WARN, one line naming where it panicked) and `cairn crash ls` show.
#[test]
fn a_panicking_osd_is_restarted_until_its_crash_loop_limit_and_status_names_its_crashes() {
    use common::cluster::{text, Cluster};
    let c = Cluster::at("crashloop");
    let d = c.dir.display().to_string();
    let up = |failpoints: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["dev", "up", "--dir", &d, "--osds", "1", "--osd-size", "1G"])
            .args(["--no-pool", "--timeout", "60"]);
        if let Some(f) = failpoints {
            cmd.env("FAILPOINTS", f);
        }
        let o = cmd.output().expect("run dev up");
        assert!(
            o.status.success(),
            "dev up: {}\n{}",
            text(&o.stderr),
            c.logs()
        );
    };
    up(Some("osd_peering_mid=panic"));
    c.pool_create("p", 1, 1, 1);
    let log = c.dir.join("log").join("osd.0.log");
    let t0 = Instant::now();
    loop {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        if l.contains("not starting it again") {
            assert_eq!(l.matches("starting it again in").count(), 4, "{l}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "no crash loop:\n{l}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (reports, bad) = cairn_failstop::pending_reports(&c.dir.join("crash"));
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(reports.len(), 5, "one report per crash: {reports:?}");
    for (_, r) in &reports {
        assert_eq!(r.entity, "osd.0", "{r:?}");
        assert!(r.message.contains("osd_peering_mid"), "{r:?}");
        assert!(r.backtrace.contains("peering::primary"), "{r:?}");
    }
    // Up again without the failpoint: the PG goes active, the crashes are reported.
    up(None);
    let s = c.wait_status("the crashes", Duration::from_secs(60), |s| {
        s["pgs"]["active_clean"] == 1 && s["capacity"]["osds_reporting"] == 1
    });
    assert_eq!(s["health"], "HEALTH_WARN", "{s}");
    let crashes = s["crashes"].as_array().expect("crashes");
    assert_eq!(crashes.len(), 5, "{s}");
    assert!(crashes.iter().all(|x| x["osd"] == 0), "{s}");
    let plain = c.ok(&["status"]);
    assert!(
        plain.contains("osd.0 crashed 5 time(s)") && plain.contains("peering"),
        "{plain}"
    );
    let ls = c.ok(&["crash", "ls"]);
    assert_eq!(ls.lines().count(), 6, "a header and five crashes: {ls}");
    assert!(ls.contains(&reports[0].1.id), "{ls}");
}

/// `cairn pg query PG --json` of a test cluster.
fn pg_query(c: &common::cluster::Cluster, pg: &str) -> serde_json::Value {
    let out = c.ok(&["pg", "query", pg, "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("pg query output: {e}: {out}"))
}

/// Waits until `pg query` shows the PG failing with `class`; returns the query. A write (in
/// the background: it waits for the PG) makes the primary peer it again.
fn wait_failure_class(c: &common::cluster::Cluster, pg: &str, class: &str) -> serde_json::Value {
    let conf = c.conf.display().to_string();
    let nudge = std::thread::spawn(move || {
        let _ = Command::new(BIN)
            .args(["-c", &conf, "obj", "put", "p", "nudge", "/etc/hostname"])
            .stdin(Stdio::null())
            .output();
    });
    let t0 = Instant::now();
    let q = loop {
        let q = pg_query(c, pg);
        if q["failure_class"] == class {
            break q;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "pg {pg} never failed with class {class}: {q:#}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // The write gives up by itself (the PG answers it PgDown until the map changes).
    drop(nudge);
    q
}

/// A replica whose store is full when its primary peers the PG again: the failure has its
/// class in `cairn pg query` and `cairn status` and is not retried every second like a
/// network blip. Then the replica's store is corrupt: the OSD stops by itself (exit status
/// 74, which supervisors do not restart) with a clear log line, and the PG goes on without it.
#[test]
fn a_full_and_a_corrupt_member_store_fail_with_their_own_class_and_are_not_retried() {
    use common::cluster::Cluster;
    let c = Cluster::up("classes", 1, 2);
    c.pool_create("p", 2, 1, 1);
    let file = c.dir.join("obj");
    std::fs::write(&file, vec![7u8; 64 << 10]).unwrap();
    let f = file.display().to_string();
    c.ok(&["obj", "put", "p", "before", &f]);
    let q = pg_query(&c, "1.0");
    let primary = q["primary"].as_u64().expect("primary") as u32;
    let replica = 1 - primary;
    let name = format!("osd.{replica}");
    // Writes while the replica is down, so that peering must push them to it.
    c.kill9(&name);
    for i in 0..4 {
        c.ok(&["obj", "put", "p", &format!("while-down-{i}"), &f]);
    }
    c.start_osd_with(replica, &[("FAILPOINTS", "store_commit_no_space=return")]);
    wait_failure_class(&c, "1.0", "store_full");
    let s = c.status();
    assert_eq!(s["health"], "HEALTH_ERR", "{s:#}");
    let failed = &s["failed_pgs"];
    assert_eq!(failed[0]["class"], "store_full", "{s:#}");
    assert_eq!(failed[0]["pg"], "1.0", "{s:#}");
    // Not tried again while the map stays as it is: one failure logged, not one a second.
    let log = c.dir.join("log").join(format!("osd.{primary}.log"));
    let failures = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("not retried until the map changes")
            .count()
    };
    let before = failures();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(failures(), before, "a full member was asked again");

    // The replica comes back with a store whose metadata fails its checks: it stops by
    // itself as soon as it reads it (at start, checking its PGs for splits), with a log line
    // that says why, instead of serving or being retried.
    c.kill9(&name);
    c.start_osd_with(replica, &[("FAILPOINTS", "store_read_corrupt=return")]);
    let pid = c.pid(&name);
    let t0 = Instant::now();
    while common::cluster::alive(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{name} kept running"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let rlog = std::fs::read_to_string(c.dir.join("log").join(format!("{name}.log"))).unwrap();
    assert!(
        rlog.contains("the store is corrupt or its device failed (store_corrupt)"),
        "{rlog}"
    );
    // Marked down, the PG goes on without it (the full store's failure is gone with it).
    c.wait_status(
        "the PG active without the corrupt OSD",
        Duration::from_secs(60),
        |s| s["pgs"]["inactive"] == 0 && s["failed_pgs"].as_array().is_some_and(|f| f.is_empty()),
    );
    // Healthy again, the replica catches up.
    c.start_osd(replica);
    c.wait_status("the PG active and clean", Duration::from_secs(60), |s| {
        s["pgs"]["active_clean"] == 1 && s["failed_pgs"].as_array().is_some_and(|f| f.is_empty())
    });
}

/// The OSD interleavings: a 3-OSD cluster, pool `p` of size 3 (min_size 2) with one PG, and
/// helpers to write, read and check it.
mod interleave {
    use super::common::cluster::{alive, Cluster};
    use std::time::{Duration, Instant};

    pub fn cluster(name: &str) -> Cluster {
        let c = Cluster::up(name, 1, 3);
        c.pool_create("p", 3, 2, 1);
        c
    }

    pub fn put(c: &Cluster, name: &str, body: &[u8]) -> bool {
        let file = c.dir.join(format!("body-{name}"));
        std::fs::write(&file, body).unwrap();
        let f = file.display().to_string();
        c.cairn(&["obj", "put", "p", name, &f]).status.success()
    }

    pub fn get(c: &Cluster, name: &str) -> Vec<u8> {
        let o = c.cairn(&["obj", "get", "p", name, "-"]);
        assert!(o.status.success(), "get {name}: {}", c.logs());
        o.stdout
    }

    pub fn acting(c: &Cluster) -> Vec<u32> {
        let q = super::pg_query(c, "1.0");
        q["acting"]
            .as_array()
            .expect("acting")
            .iter()
            .map(|v| v.as_u64().expect("osd") as u32)
            .collect()
    }

    /// Waits until the PG is active and clean on all three OSDs.
    pub fn clean(c: &Cluster) {
        clean_pgs(c, 1);
    }

    /// Waits until `pgs` PGs are active and clean on all three OSDs, none misplaced.
    pub fn clean_pgs(c: &Cluster, pgs: u64) {
        c.wait_status(
            &format!("{pgs} PG(s) active+clean on 3 OSDs"),
            Duration::from_secs(120),
            |s| {
                s["pgs"]["active_clean"] == pgs
                    && s["osds"]["up"] == 3
                    && s["recovery"]["objects_degraded"] == 0
                    && s["pgs"]["misplaced_copies"] == 0
            },
        );
    }

    /// OSD `i` restarted with `failpoints`, once the PG is clean with it.
    pub fn restart_with(c: &Cluster, i: u32, failpoints: &str) {
        c.kill9(&format!("osd.{i}"));
        c.start_osd_with(i, &[("FAILPOINTS", failpoints)]);
    }

    /// Waits until OSD `i` aborted at failpoint `point`, as its log says.
    pub fn aborted_at(c: &Cluster, i: u32, point: &str) {
        let name = format!("osd.{i}");
        let pid = c.pid(&name);
        let t0 = Instant::now();
        while alive(pid) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{name} did not reach {point}:\n{}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(c.dir.join("log").join(format!("{name}.log"))).unwrap();
        assert!(
            log.contains("panicked") && log.contains(point) && log.contains("aborting"),
            "{name} ended, but not at {point}:\n{log}"
        );
    }

    /// Every copy of the PG agrees (scrub without repair finds nothing).
    pub fn consistent(c: &Cluster) {
        consistent_pg(c, "1.0");
    }

    /// Every copy of PG `pg` agrees.
    pub fn consistent_pg(c: &Cluster, pg: &str) {
        let o = c.cairn(&["pg", "scrub", pg, "--no-repair", "--json"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "scrub found inconsistent copies: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("scrub json");
        assert_eq!(v["pgs"][0]["inconsistent"], 0, "{v:#}");
    }
}

/// The primary applied a write and sent it to both replicas, which applied and synced it,
/// then died before its own WAL sync (`osd_primary_before_wal_sync`). Its restart lacks the
/// write; the replicas' newer history is the authority, so the write is everywhere once the
/// PG is clean again, never on some copies only, and a write the client saw acknowledged (its
/// retry goes to the new primary) reads back.
#[test]
fn a_write_whose_primary_died_before_its_wal_sync_is_on_every_copy_or_none() {
    use interleave::*;
    let c = cluster("primsync");
    assert!(put(&c, "x", b"one"));
    let p = acting(&c)[0];
    restart_with(&c, p, "osd_primary_before_wal_sync=panic");
    clean(&c);
    let acked = put(&c, "x", b"two");
    aborted_at(&c, p, "osd_primary_before_wal_sync");
    c.start_osd(p);
    clean(&c);
    let got = get(&c, "x");
    if acked {
        assert_eq!(got, b"two", "an acknowledged write was lost");
    } else {
        assert!(got == b"one" || got == b"two", "{got:?}");
    }
    consistent(&c);
}

/// A replica applied a write and died before syncing or answering it
/// (`osd_replica_applied`): the primary never acknowledges the write on its word, the
/// client's retry is acknowledged by the members left (min_size 2), and once the replica is
/// back every copy holds it.
#[test]
fn a_write_whose_replica_died_after_applying_it_is_acknowledged_only_by_the_living() {
    use interleave::*;
    let c = cluster("repapplied");
    assert!(put(&c, "x", b"one"));
    let r = acting(&c)[1];
    restart_with(&c, r, "osd_replica_applied=panic");
    clean(&c);
    assert!(
        put(&c, "x", b"two"),
        "the write was not acknowledged by the living members"
    );
    aborted_at(&c, r, "osd_replica_applied");
    assert_eq!(get(&c, "x"), b"two");
    c.start_osd(r);
    clean(&c);
    assert_eq!(get(&c, "x"), b"two");
    consistent(&c);
}

/// The primary gathered every member's history and died before changing anything
/// (`osd_peering_mid`): another member peers and serves, and the first one, back, catches up.
#[test]
fn a_primary_that_dies_mid_peering_leaves_the_pg_to_the_next_one() {
    use interleave::*;
    let c = cluster("peermid");
    assert!(put(&c, "x", b"one"));
    let p = acting(&c)[0];
    // Its first peering after the restart aborts it.
    c.kill9(&format!("osd.{p}"));
    c.start_osd_with(p, &[("FAILPOINTS", "osd_peering_mid=panic")]);
    aborted_at(&c, p, "osd_peering_mid");
    assert!(
        put(&c, "x", b"two"),
        "the PG did not go on without the dead primary"
    );
    c.start_osd(p);
    clean(&c);
    assert_eq!(get(&c, "x"), b"two");
    consistent(&c);
}

/// The primary dies between two pushes of a recovery (`osd_recovery_push`): the recovery is
/// finished by whoever leads the PG next, and every object reads back.
#[test]
fn a_recovery_cut_by_the_primarys_death_is_finished_later() {
    use interleave::*;
    let c = cluster("recpush");
    let [p, r] = {
        let a = acting(&c);
        [a[0], a[1]]
    };
    c.kill9(&format!("osd.{r}"));
    let bodies: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 16 << 10]).collect();
    for (i, b) in bodies.iter().enumerate() {
        assert!(put(&c, &format!("o{i}"), b), "a write with one member down");
    }
    // The primary, restarted with the failpoint while the replica is still down, dies at the
    // third push of the replica's recovery.
    restart_with(&c, p, "osd_recovery_push=2*off->panic");
    c.wait_status("the PG active again", Duration::from_secs(60), |s| {
        s["pgs"]["inactive"] == 0 && s["osds"]["up"] == 2
    });
    c.start_osd(r);
    aborted_at(&c, p, "osd_recovery_push");
    c.start_osd(p);
    clean(&c);
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(&get(&c, &format!("o{i}")), b, "o{i}");
    }
    consistent(&c);
}

/// Three OSDs A (primary), B, C; `x` written twice while B was down, so that B, back, has
/// the newest log with `x` marked missing; A dies at the first push of B's recovery
/// (`osd_recovery_push=panic`), then C is killed: B is left alone with the newest history
/// and `x` missing. Returns (A, B, C).
fn alone_with_a_missing_object(c: &common::cluster::Cluster) -> (u32, u32, u32) {
    use interleave::*;
    c.pool_create("p", 3, 1, 1);
    assert!(put(c, "x", b"one"));
    let a = acting(c);
    let (pa, pb, pc) = (a[0], a[1], a[2]);
    c.kill9(&format!("osd.{pb}"));
    assert!(put(c, "x", b"two"));
    restart_with(c, pa, "osd_recovery_push=panic");
    c.wait_status("the PG active without B", Duration::from_secs(60), |s| {
        s["pgs"]["inactive"] == 0 && s["osds"]["up"] == 2
    });
    c.start_osd(pb);
    aborted_at(c, pa, "osd_recovery_push");
    c.kill9(&format!("osd.{pc}"));
    (pa, pb, pc)
}

/// The PG's only current copy of an object is on a member that is not its primary: B leads
/// and lacks `x` (marked missing), C, back, has it: the PG takes it from C and never serves
/// it stale or as lost. (Here B and C have the same history, so C is the authority by the
/// tie-break that prefers a history with nothing missing; the copy from a non-authority
/// source, `source_of_missing`, is exercised only when B's history is strictly newer.)
#[test]
fn an_object_current_only_on_a_third_member_is_recovered_from_it() {
    use interleave::*;
    let c = common::cluster::Cluster::up("third", 1, 3);
    let (_, _, pc) = alone_with_a_missing_object(&c);
    c.start_osd(pc);
    c.wait_status("the PG active with B and C", Duration::from_secs(60), |s| {
        s["pgs"]["inactive"] == 0 && s["recovery"]["objects_degraded"] == 0
    });
    assert_eq!(get(&c, "x"), b"two");
}

/// With A and C declared lost, `x` is unfound: the PG fails peering with the class
/// `unfound` (not retried every second), `cairn pg list-unfound` names it, and
/// `cairn pg mark-unfound-lost revert` gives it up to B's older copy, after which the PG
/// serves again.
#[test]
fn unfound_objects_are_listed_and_reverted_by_mark_unfound_lost() {
    use interleave::*;
    let c = common::cluster::Cluster::up("unfound", 1, 3);
    let (pa, _, pc) = alone_with_a_missing_object(&c);
    c.wait_status("A and C marked down", Duration::from_secs(60), |s| {
        s["osds"]["up"] == 1
    });
    for o in [pa, pc] {
        c.ok(&["osd", "lost", &o.to_string(), "--yes-i-really-mean-it"]);
    }
    wait_failure_class(&c, "1.0", "unfound");
    let s = c.status();
    assert_eq!(s["failed_pgs"][0]["class"], "unfound", "{s:#}");
    let listed = c.ok(&["pg", "list-unfound", "1.0", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(v["unfound"], serde_json::json!(["x"]), "{listed}");
    let o = c.cairn(&["pg", "mark-unfound-lost", "1.0", "revert"]);
    assert!(
        !o.status.success(),
        "mark-unfound-lost needs --yes-i-really-mean-it"
    );
    c.ok(&[
        "pg",
        "mark-unfound-lost",
        "1.0",
        "revert",
        "--yes-i-really-mean-it",
    ]);
    c.wait_status("the PG active on B alone", Duration::from_secs(60), |s| {
        s["pgs"]["inactive"] == 0 && s["failed_pgs"].as_array().is_some_and(|f| f.is_empty())
    });
    assert_eq!(get(&c, "x"), b"one", "reverted to B's older copy");
    let listed = c.ok(&["pg", "list-unfound", "1.0"]);
    assert!(listed.contains("no unfound objects"), "{listed}");
}

/// A replica dies in the middle of splitting its copy of the PG (`osd_split_mid`: some
/// objects moved to a child PG's collection, the rest still in the parent's). Restarted, it
/// finishes the split from where it stood: every PG of the grown pool is clean on all three
/// OSDs, every object reads back from its new PG, and every PG's copies agree.
#[test]
fn a_replica_that_dies_mid_split_finishes_it_after_its_restart() {
    use interleave::*;
    let c = cluster("splitmid");
    let bodies: Vec<Vec<u8>> = (0..24u8).map(|i| vec![i; 4096 + 17 * i as usize]).collect();
    for (i, b) in bodies.iter().enumerate() {
        assert!(put(&c, &format!("o{i}"), b), "o{i}");
    }
    let victim = acting(&c)[1];
    // Its fourth object moved to a child aborts it (1 PG into 4: about 18 objects move).
    restart_with(&c, victim, "osd_split_mid=3*off->panic");
    clean(&c);
    let out = c.ok(&["pool", "set", "p", "pgs", "4"]);
    assert!(out.contains("done"), "{out}");
    aborted_at(&c, victim, "osd_split_mid");
    c.start_osd(victim);
    clean_pgs(&c, 4);
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(&get(&c, &format!("o{i}")), b, "o{i}");
    }
    for pg in ["1.0", "1.1", "1.2", "1.3"] {
        consistent_pg(&c, pg);
    }
}

/// An EC primary (2+1, min_size 2) stalls mid-write and is killed -9 there, its client with
/// it (no retry): first after sending the sub-write to one shard only
/// (`osd_ec_primary_sent_one`: held by fewer than k, never acknowledged, rolled back), then
/// after sending it to both others (`osd_ec_primary_sent`: held by k, rolled forward onto the
/// primary's shard once it is back). Each time the object reads back as the peering decided,
/// also with any one OSD down, so every shard was brought to the same version.
#[test]
fn an_ec_write_cut_by_the_primarys_death_is_rolled_back_or_forward_on_every_shard() {
    use common::cluster::Cluster;
    let c = Cluster::up("ecroll", 1, 3);
    c.ec_pool_create("e", "2+1", Some(2), 1);
    let body = |b: u8| -> String {
        let f = c.dir.join(format!("ec-body-{b}"));
        // Two stripes and a bit: every shard holds a piece.
        std::fs::write(&f, vec![b; 2 * 8192 + 100]).unwrap();
        f.display().to_string()
    };
    let (one, two) = (body(1), body(2));
    c.ok(&["obj", "put", "e", "x", &one]);
    let active = |what: &str, up: u64| {
        c.wait_status(what, Duration::from_secs(60), |s| {
            s["pgs"]["inactive"] == 0 && s["osds"]["up"] == up
        });
    };
    let get = || {
        let o = c.cairn(&["obj", "get", "e", "x", "-"]);
        assert!(o.status.success(), "get x: {}", c.logs());
        o.stdout
    };
    for (point, want) in [("osd_ec_primary_sent_one", 1u8), ("osd_ec_primary_sent", 2)] {
        let p = pg_query(&c, "1.0")["acting"][0].as_u64().expect("primary") as u32;
        let name = format!("osd.{p}");
        c.kill9(&name);
        c.start_osd_with(p, &[("FAILPOINTS", &format!("{point}=sleep(60000)"))]);
        active("the EC PG active with its primary back", 3);
        let conf = c.conf.display().to_string();
        let mut put = Command::new(BIN)
            .args(["-c", &conf, "obj", "put", "e", "x", &two])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn put");
        // The primary stalls at the point within milliseconds of the write.
        std::thread::sleep(Duration::from_millis(1500));
        c.kill9(&name);
        let _ = put.kill();
        let _ = put.wait();
        c.start_osd(p);
        active("the EC PG active again", 3);
        assert_eq!(get(), vec![want; 2 * 8192 + 100], "after {point}");
        let log = std::fs::read_to_string(c.dir.join("log").join("osd.0.log")).unwrap_or_default()
            + &std::fs::read_to_string(c.dir.join("log").join("osd.1.log")).unwrap_or_default()
            + &std::fs::read_to_string(c.dir.join("log").join("osd.2.log")).unwrap_or_default();
        assert!(
            log.contains("EC shards rebuilt"),
            "no rebuild after {point}"
        );
        for down in 0..3u32 {
            c.kill9(&format!("osd.{down}"));
            active("the EC PG active with a shard down", 2);
            assert_eq!(
                get(),
                vec![want; 2 * 8192 + 100],
                "after {point}, with osd.{down} down"
            );
            c.start_osd(down);
            active("the EC PG active with all shards", 3);
        }
    }
}
