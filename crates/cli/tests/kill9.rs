//! kill -9 of a real `cairn store torture` process mid-workload, then verification after
//! restart, round after round on the same store (so recovery after recovery is tested).
//!
//! Each round spawns the torture process, waits a random time, SIGKILLs it, then opens the
//! store in this process and checks, for every workload thread, that:
//! - the counter the store holds is at least the last one ACKed (durable) and at most the
//!   last one tried, and never older than what the previous round verified;
//! - every object, attribute and key the thread owns equals the model after replaying the
//!   thread's transactions up to that counter, byte for byte (so no transaction is lost,
//!   and none is present in part);
//! - scrub finds no damaged block and the space accounting matches the index.
//!
//! The seed is printed and is in every failure message; rerun one with
//! `CAIRN_KILL9_SEED=<seed> cargo test -p cairn-cli --test kill9`. On failure the store files
//! are kept and their paths printed.

#[path = "../src/torture/workload.rs"]
mod workload;

include!("harness/store.rs");

/// Data file on local disk, WAL on /dev/shm: the layout an OSD runs with.
#[test]
fn kill9_mid_workload_then_verify_after_restart() {
    let files = Files::new("single", 1, true);
    let mut h = Harness::new(
        "kill9_single",
        files,
        &["--size", "256M", "--wal-size", "64M"],
    );
    let mut r = Rng::new(h.seed);
    let open_ms = |r: &mut Rng| ms(r, 300, 1500);
    let plans = [
        Plan {
            threads: 2,
            from: KillFrom::Open,
            delay: open_ms(&mut r),
            checkpoint_ms: None,
            flush_ms: None,
            close: true,
        },
        Plan {
            threads: 3,
            from: KillFrom::Open,
            delay: open_ms(&mut r),
            checkpoint_ms: Some(50 + r.below(200)),
            flush_ms: None,
            close: false,
        },
        // Heavy: four threads in full flow, frequent flushes and checkpoints.
        Plan {
            threads: 4,
            from: KillFrom::AllAcked(20),
            delay: ms(&mut r, 100, 900),
            checkpoint_ms: Some(100 + r.below(200)),
            flush_ms: Some(1 + r.below(10)),
            close: false,
        },
        // The kill may land while the store is opening (replaying the WAL the last round
        // left, which the verification opened but did not checkpoint).
        Plan {
            threads: 2,
            from: KillFrom::Spawn,
            delay: ms(&mut r, 0, 250),
            checkpoint_ms: None,
            flush_ms: None,
            close: true,
        },
        Plan {
            threads: 1 + r.below(4) as usize,
            from: KillFrom::Open,
            delay: open_ms(&mut r),
            checkpoint_ms: Some(20 + r.below(100)),
            flush_ms: Some(r.below(60)),
            close: false,
        },
        Plan {
            threads: 5,
            from: KillFrom::AllAcked(5),
            delay: ms(&mut r, 0, 600),
            checkpoint_ms: None,
            flush_ms: None,
            close: true,
        },
    ];
    for p in plans {
        h.round(p);
    }
    for _ in 0..extra_rounds() {
        h.round(random_plan(&mut r));
    }
    h.final_scrub();
    assert!(h.total_acks > 0, "{}: no commit was acknowledged", h.ctx());
}

/// Two mirrored data files with the WAL on the first, small segments so the cleaner runs:
/// kills land during cleaning too.
#[test]
fn kill9_mirror_with_cleaning() {
    let files = Files::new("mirror", 2, false);
    let mut h = Harness::new(
        "kill9_mirror",
        files,
        &[
            "--size",
            "24M",
            "--wal-size",
            "4M",
            "--segment-size",
            "128K",
        ],
    );
    let mut r = Rng::new(h.seed ^ 0x3141_5926);
    for i in 0..4 {
        h.round(Plan {
            threads: 2 + r.below(3) as usize,
            from: if i == 2 {
                KillFrom::Spawn
            } else {
                KillFrom::AllAcked(10)
            },
            delay: if i == 2 {
                ms(&mut r, 0, 300)
            } else {
                ms(&mut r, 200, 1200)
            },
            checkpoint_ms: Some(50 + r.below(500)),
            flush_ms: None,
            close: i % 2 == 1,
        });
    }
    for _ in 0..extra_rounds() {
        h.round(random_plan(&mut r));
    }
    h.final_scrub();
}

/// Whole-block writes of two blocks or more go straight to the data file (only their
/// metadata through the WAL), one-block and unaligned ones through the WAL: kills land
/// between a direct write's data and its record too.
#[test]
fn kill9_with_large_writes_written_once() {
    let files = Files::new("direct", 1, true);
    let mut h = Harness::new(
        "kill9_direct",
        files,
        &["--size", "256M", "--wal-size", "64M"],
    );
    h.direct_write_min = Some(8192);
    let mut r = Rng::new(h.seed ^ 0x2718_2818);
    for i in 0..4 {
        h.round(Plan {
            threads: 2 + r.below(3) as usize,
            from: if i == 1 {
                KillFrom::Spawn
            } else {
                KillFrom::AllAcked(10)
            },
            delay: if i == 1 {
                ms(&mut r, 0, 300)
            } else {
                ms(&mut r, 100, 1000)
            },
            checkpoint_ms: (i % 2 == 0).then(|| 50 + r.below(300)),
            flush_ms: None,
            close: i == 3,
        });
    }
    for _ in 0..extra_rounds() {
        h.round(random_plan(&mut r));
    }
    h.final_scrub();
    assert!(h.total_acks > 0, "{}: no commit was acknowledged", h.ctx());
    assert!(
        h.direct_writes > 0,
        "{}: no write went straight to the data file",
        h.ctx()
    );
}
