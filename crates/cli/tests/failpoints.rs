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
