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
    // Half of a transaction's effects in the index, the store's lock held.
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
