//! One lock per collection: a commit that is stuck applying its transaction (held at the
//! `store_index_apply` failpoint, its collection locked) holds up the commits and reads of
//! its own collection only. With one lock for the whole index, every commit waited for it.
//! Its own test binary: the failpoint registry is per process.
#![cfg(feature = "failpoints")]

mod common;

use cairn_store::Transaction;
use common::{small_cfg, MemDevs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(20);

fn write(s: &cairn_store::Store, coll: u64, obj: &[u8], byte: u8) -> cairn_store::Result<u64> {
    let mut t = Transaction::new();
    t.write(coll, obj, 0, &[byte; 4096]);
    s.commit(&t)
}

#[test]
fn a_commit_stuck_applying_holds_up_its_own_collection_only() {
    let devs = MemDevs::new(1, 64 << 20, None);
    let s = Arc::new(devs.mkfs_open(small_cfg()));
    let mut t = Transaction::new();
    t.create_collection(1).create_collection(2);
    s.commit(&t).expect("create");
    write(&s, 2, b"before", 1).expect("write before");

    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let hook = Mutex::new((entered_tx, released));
    let once = AtomicBool::new(false);
    fail::cfg_callback("store_index_apply", move || {
        let stuck = std::thread::current().name() == Some("stuck");
        if stuck && !once.swap(true, Ordering::SeqCst) {
            if let Ok(h) = hook.lock() {
                let _ = h.0.send(());
                let _ = h.1.recv_timeout(PATIENCE);
            }
        }
    })
    .expect("failpoint");

    let s1 = s.clone();
    let stuck = std::thread::Builder::new()
        .name("stuck".into())
        .spawn(move || write(&s1, 1, b"a", 7))
        .expect("spawn");
    entered
        .recv_timeout(PATIENCE)
        .expect("the stuck commit never reached the failpoint");

    // Another collection: commits and reads go on while collection 1 is locked.
    let (done_tx, done) = mpsc::channel();
    let s2 = s.clone();
    let other = std::thread::spawn(move || {
        let r = write(&s2, 2, b"b", 9).and_then(|_| s2.read(2, b"before", 0, 4096));
        let _ = done_tx.send(());
        r
    });
    let finished = done.recv_timeout(Duration::from_secs(10));
    // The same collection: a commit waits for the stuck one.
    let (same_tx, same_done) = mpsc::channel();
    let s3 = s.clone();
    let same = std::thread::spawn(move || {
        let r = write(&s3, 1, b"c", 3);
        let _ = same_tx.send(());
        r
    });
    let same_early = same_done.recv_timeout(Duration::from_millis(300)).is_ok();
    let _ = release.send(());

    let other = other.join().expect("other thread");
    stuck.join().expect("stuck thread").expect("stuck commit");
    same.join()
        .expect("same thread")
        .expect("same-collection commit");
    fail::remove("store_index_apply");
    assert!(
        finished.is_ok(),
        "a commit of collection 2 waited for one of collection 1 that was applying"
    );
    assert_eq!(
        other.expect("collection 2 commit and read"),
        vec![1u8; 4096]
    );
    assert!(
        !same_early,
        "a commit of collection 1 finished while another one of it was half-applied"
    );
    assert_eq!(s.read(1, b"a", 0, 4096).expect("read a"), vec![7u8; 4096]);
    assert_eq!(s.read(1, b"c", 0, 4096).expect("read c"), vec![3u8; 4096]);
    assert_eq!(s.read(2, b"b", 0, 4096).expect("read b"), vec![9u8; 4096]);
    s.check_space_accounting().expect("space accounting");
}
