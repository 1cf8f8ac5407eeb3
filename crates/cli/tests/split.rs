//! PG split: `cairn pool set NAME pgs N` under a write load. Every acknowledged write stays
//! readable (a history of unique values on registers, checked), every object written before
//! and during the split reads back, and the pool ends clean with its objects in all N PGs.

mod common;

use common::cluster::{runtime, Cluster};
use common::history::{final_check, workload, History, Roles};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn payload(key: usize, round: u8) -> Vec<u8> {
    let mut v = format!("object {key} round {round} ")
        .repeat(300)
        .into_bytes();
    v.truncate(6000);
    v
}

/// Polls `cairn status --json` until `f` holds (60 s at most).
fn wait_status(c: &Cluster, what: &str, f: impl Fn(&serde_json::Value) -> bool) {
    c.wait_status(what, Duration::from_secs(60), f);
}

fn clean(s: &serde_json::Value) -> bool {
    s["pgs"]["peering"] == 0
        && s["pgs"]["inactive"] == 0
        && s["pgs"]["down"] == 0
        && s["pgs"]["active_degraded"] == 0
        && s["pgs"]["misplaced_copies"] == 0
        && s["recovery"]["objects_degraded"] == 0
}

/// One monitor, 4 OSDs and pool `s` (3 copies, min 2, 8 PGs), clean.
fn cluster(name: &str) -> Cluster {
    let c = Cluster::up(name, 1, 4);
    c.pool_create("s", 3, 2, 8);
    wait_status(&c, "the pool clean", clean);
    c
}

/// Writes round `round` of objects `keys`; `written` keeps each object's latest round.
async fn write_round(
    client: &cairn_client::Client,
    pool: u32,
    keys: impl Iterator<Item = usize>,
    round: u8,
    written: &mut Vec<(usize, u8)>,
) {
    for key in keys {
        let name = format!("obj-{key}");
        client
            .write_full(pool, name.as_bytes(), &payload(key, round))
            .await
            .unwrap_or_else(|e| panic!("write {name} round {round}: {e}"));
        written.retain(|&(k, _)| k != key);
        written.push((key, round));
    }
}

/// Every object of `written` holds its latest round; returns the PGs they are in.
async fn verify(
    c: &Cluster,
    client: &cairn_client::Client,
    pool: u32,
    written: &[(usize, u8)],
) -> BTreeSet<u32> {
    let map = client.mon().get_map().await.expect("map");
    let mut pgs = BTreeSet::new();
    for &(key, round) in written {
        let name = format!("obj-{key}");
        let want = payload(key, round);
        let got = client
            .read(pool, name.as_bytes(), 0, want.len() as u64)
            .await
            .unwrap_or_else(|e| panic!("read {name}: {e}\n{}", c.logs()));
        assert!(got == want, "{name} does not hold round {round}");
        pgs.insert(map.object_pg(pool, name.as_bytes()).expect("pg").pg);
    }
    pgs
}

#[test]
fn a_pools_pgs_split_under_writes_and_every_object_reads_back() {
    let c = cluster("split");
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("s").expect("pool");
        let mut written: Vec<(usize, u8)> = Vec::new();
        write_round(&client, pool, 0..300, 1, &mut written).await;
        let names: Arc<Vec<String>> = Arc::new((0..24).map(|i| format!("reg-{i}")).collect());
        let hist = Arc::new(Mutex::new(History::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let roles = Roles {
            first: 0,
            writers: 3,
            readers: 2,
        };
        let tasks = workload(&client, pool, &names, &hist, &stop, roles);
        tokio::time::sleep(Duration::from_secs(1)).await;

        let out = tokio::task::block_in_place(|| c.ok(&["pool", "set", "s", "pgs", "32"]));
        assert!(out.contains("done"), "{out}");
        // Writes go on during the split: half the objects get a second round.
        write_round(&client, pool, (0..300).step_by(2), 2, &mut written).await;
        tokio::task::block_in_place(|| wait_status(&c, "the split pool clean", clean));
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.expect("workload");
        }
        let map = client.mon().get_map().await.expect("map");
        assert_eq!(map.pools[&pool].pg_count, 32);
        let pgs = verify(&c, &client, pool, &written).await;
        assert_eq!(pgs.len(), 32, "objects in every PG of the split pool");
        // The listing finds every object once, in its new PG.
        let listed = client.list(pool).await.expect("list");
        let regs = listed.iter().filter(|n| n.starts_with(b"reg-")).count();
        assert_eq!(listed.len() - regs, 300, "objects listed after the split");
        let h = std::mem::take(&mut *hist.lock().expect("lock"));
        let (acked, reads) = final_check(&client, pool, &names, h, || c.logs()).await;
        assert!(acked > 50, "only {acked} register writes acknowledged");
        // The OSDs split their copies themselves (objects moved locally, not copied over).
        let mut moved = 0;
        for e in std::fs::read_dir(c.dir.join("log"))
            .expect("logs")
            .flatten()
        {
            let log = std::fs::read_to_string(e.path()).unwrap_or_default();
            moved += log.matches("PG split: objects moved").count();
        }
        assert!(moved >= 8, "only {moved} local splits logged");
        eprintln!(
            "split 8 -> 32 under load: {acked} register writes, {reads} reads checked, {moved} \
             copies split"
        );
    });
    // Shrinking is refused with the reason.
    let o = c.cairn(&["pool", "set", "s", "pgs", "16"]);
    let err = common::cluster::text(&o.stderr);
    assert!(!o.status.success() && err.contains("only grows"), "{err}");
}

/// An OSD down through the split splits its copies when it starts again (it notes every
/// copy it holds at start), and another killed with kill -9 right after the split began
/// finishes it after its restart: the PGs recover, every object reads its latest value.
#[test]
fn osds_down_or_killed_during_a_split_finish_it_when_they_return() {
    let c = cluster("split-down");
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("s").expect("pool");
        let mut written: Vec<(usize, u8)> = Vec::new();
        write_round(&client, pool, 0..200, 1, &mut written).await;
        c.kill9("osd.3");
        common::cluster::wait_osd(&client, 3, false).await;
        tokio::task::block_in_place(|| c.ok(&["pool", "set", "s", "pgs", "32"]));
        c.kill9("osd.2");
        common::cluster::wait_osd(&client, 2, false).await;
        c.start_osd(2);
        common::cluster::wait_osd(&client, 2, true).await;
        // Degraded (osd.3 down): writes go on.
        write_round(&client, pool, (0..200).step_by(3), 2, &mut written).await;
        c.start_osd(3);
        common::cluster::wait_osd(&client, 3, true).await;
        tokio::task::block_in_place(|| wait_status(&c, "clean after the returns", clean));
        verify(&c, &client, pool, &written).await;
        let log = std::fs::read_to_string(c.dir.join("log").join("osd.3.log")).unwrap_or_default();
        assert!(
            log.contains("PG split: objects moved"),
            "osd.3 did not split its copies at start"
        );
    });
}
