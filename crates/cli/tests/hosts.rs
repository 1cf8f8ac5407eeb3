//! Clusters spanning hosts: each host a network namespace with its own address
//! (`common::hosts`), every daemon a real process on its host. Skipped, with the reason
//! printed, where network namespaces cannot be created (not root).

mod common;

use cairn_client::Client;
use common::cluster::{runtime, text, wait_osd, Cluster};
use common::hosts::Hosts;
use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

/// A cluster on `hosts`: `cairn dev up` on host 0 (the monitor and osd.0, bound to host 0's
/// address), then one OSD on each other host, started there with its own key.
fn cluster_on(hosts: &Hosts, name: &str, n: usize) -> Cluster {
    cluster_with_down_out(hosts, name, n, 5)
}

/// [`cluster_on`] with OSDs marked out `down_out` seconds after they go down.
fn cluster_with_down_out(hosts: &Hosts, name: &str, n: usize, down_out: u32) -> Cluster {
    let c = Cluster::at(name);
    dev_up_on_host0(&c, hosts, down_out);
    for i in 1..n {
        add_osd(&c, hosts, i);
    }
    wait_status(&c, &format!("{n} OSDs up"), |s| s["osds"]["up"] == n);
    c
}

/// Pool `p` (3 copies, min 2) of `pgs` PGs, once active.
fn pool_active(c: &Cluster, pgs: u32) {
    c.pool_create("p", 3, 2, pgs);
    wait_status(c, "the pool active", |s| {
        s["pgs"]["inactive"] == 0 && s["pgs"]["peering"] == 0
    });
}

/// `cairn dev up` on host 0: the monitor and osd.0, bound to host 0's address.
fn dev_up_on_host0(c: &Cluster, hosts: &Hosts, down_out: u32) {
    let dir = c.dir.display().to_string();
    let o = hosts
        .command(0, CAIRN)
        .args([
            "dev",
            "up",
            "--dir",
            &dir,
            "--bind",
            &hosts.ips[0],
            "--host",
            "h0",
        ])
        .args([
            "--osds",
            "1",
            "--osd-size",
            "1G",
            "--no-pool",
            "--timeout",
            "60",
        ])
        .args(["--down-out-interval", &down_out.to_string()])
        .output()
        .expect("run cairn dev up on host 0");
    assert!(
        o.status.success(),
        "dev up on host 0 failed:\n{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

/// A new OSD on host `i`: key, start, and its registration as osd.`i` awaited (a new OSD
/// takes the next id at its first boot, and its key is bound to that id: one at a time).
fn add_osd(c: &Cluster, hosts: &Hosts, i: usize) {
    c.osd_keyring(i as u32);
    start_osd(c, hosts, i);
    wait_status(c, &format!("osd.{i} registered"), |s| {
        s["osds"]["total"] == i + 1
    });
}

/// Starts osd.`i` on host `i` (its directory and keyring under the cluster's).
fn start_osd(c: &Cluster, hosts: &Hosts, i: usize) {
    let osd_dir = c.dir.join(format!("osd.{i}"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(c.dir.join("log").join(format!("osd.{i}.log")))
        .expect("open the OSD log");
    let mon = c.mons().join(",");
    let mut child = hosts
        .command(i, CAIRN)
        .args([
            "osd",
            "run",
            "--dir",
            &osd_dir.display().to_string(),
            "--data-size",
            "1G",
        ])
        .args([
            "--memory-target",
            "256M",
            "--mon",
            &mon,
            "--host",
            &format!("h{i}"),
        ])
        .args(["--listen", &format!("{}:0", hosts.ips[i])])
        .env("CAIRN_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start osd.{i} on host {i}: {e}"));
    // Reaped whenever it ends (killed with its host, or at the end of the test).
    std::thread::spawn(move || child.wait());
}

/// Waits until `what` holds of `cairn status --json` (60 s at most).
fn wait_status(c: &Cluster, what: &str, f: impl Fn(&serde_json::Value) -> bool) {
    c.wait_status(what, Duration::from_secs(60), f);
}

/// Every PG of `pool` has `size` copies, on as many distinct hosts, none on `not_on`.
async fn assert_spread(client: &Client, pool: u32, size: usize, not_on: Option<u32>) {
    let map = client.mon().get_map().await.expect("map");
    let pgs = map.pools[&pool].pg_count;
    for pg in 0..pgs {
        let place = map.pg_placement(cairn_map::PgId { pool, pg });
        let hosts: BTreeSet<&str> = place
            .up_set
            .iter()
            .map(|o| map.osds[o].host.as_str())
            .collect();
        assert_eq!(
            place.up_set.len(),
            size,
            "pg {pool}.{pg}: {:?}",
            place.up_set
        );
        assert_eq!(
            hosts.len(),
            size,
            "pg {pool}.{pg} has two copies on one host: {:?}",
            place.up_set
        );
        assert!(
            not_on.is_none_or(|o| !place.up_set.contains(&o)),
            "pg {pool}.{pg} still on osd.{not_on:?}"
        );
    }
}

fn payload(key: usize, round: u8) -> Vec<u8> {
    let mut v = format!("object {key} round {round} ")
        .repeat(600)
        .into_bytes();
    v.truncate(8192);
    v
}

async fn verify(client: &Client, pool: u32, written: &[(usize, u8)]) {
    for &(key, round) in written {
        let want = payload(key, round);
        let got = client
            .read(pool, format!("obj-{key}").as_bytes(), 0, want.len() as u64)
            .await
            .unwrap_or_else(|e| panic!("read obj-{key}: {e}"));
        assert!(
            got == want,
            "obj-{key} does not hold its acknowledged round {round}"
        );
    }
}

#[test]
fn a_whole_host_lost_leaves_every_write_readable_and_its_pgs_recover_elsewhere() {
    let Some(hosts) = Hosts::create(4) else {
        return;
    };
    let c = cluster_on(&hosts, "hosts-lose", 4);
    pool_active(&c, 32);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        // Each OSD serves from its own host's address, under its host's name.
        let map = client.mon().get_map().await.expect("map");
        for (i, ip) in hosts.ips.iter().enumerate() {
            let o = &map.osds[&(i as u32)];
            assert!(
                o.addr.starts_with(&format!("{ip}:")),
                "osd.{i} at {}",
                o.addr
            );
            assert_eq!(o.host, format!("h{i}"));
        }
        assert_spread(&client, pool, 3, None).await;
        let tree: serde_json::Value =
            serde_json::from_str(&c.ok(&["osd", "tree", "--json"])).expect("tree json");
        assert_eq!(tree["pools"][0]["domain"], "host", "{tree}");
        assert_eq!(tree["pools"][0]["domains"], 4, "{tree}");
        assert_eq!(tree["domains"]["host"], 4, "{tree}");
        let osds: Vec<&serde_json::Value> = tree["hosts"]
            .as_array()
            .expect("hosts")
            .iter()
            .flat_map(|h| h["osds"].as_array().expect("osds"))
            .collect();
        let sum = |k: &str| osds.iter().map(|o| o[k].as_u64().unwrap_or(0)).sum::<u64>();
        assert_eq!(
            (osds.len(), sum("pgs"), sum("primary_pgs")),
            (4, 96, 32),
            "{tree}"
        );
        let mut written = Vec::new();
        for key in 0..64 {
            client
                .write_full(pool, format!("obj-{key}").as_bytes(), &payload(key, 1))
                .await
                .expect("write");
            written.push((key, 1));
        }

        // Host 3 fails as a whole: its OSD is killed and its link cut at once.
        hosts.lose(3);
        wait_osd(&client, 3, false).await;
        // Degraded but active (2 of 3 copies, min_size 2): writes and reads go on.
        for key in 32..96 {
            client
                .write_full(pool, format!("obj-{key}").as_bytes(), &payload(key, 2))
                .await
                .expect("write while degraded");
            written.retain(|&(k, _)| k != key);
            written.push((key, 2));
        }
        verify(&client, pool, &written).await;

        // After the down-out interval (5 s) its PGs are placed on the other three hosts and
        // recovered there, one copy per host.
        tokio::task::block_in_place(|| {
            wait_status(&c, "recovered on the other hosts", |s| {
                s["osds"]["in"] == 3
                    && s["pgs"]["peering"] == 0
                    && s["pgs"]["inactive"] == 0
                    && s["recovery"]["objects_degraded"] == 0
            })
        });
        assert_spread(&client, pool, 3, Some(3)).await;
        verify(&client, pool, &written).await;

        // The host comes back: its OSD rejoins.
        hosts.heal(3);
        start_osd(&c, &hosts, 3);
        wait_osd(&client, 3, true).await;
        verify(&client, pool, &written).await;
    });
    // The cluster stops (dev down) before the namespaces go.
    drop(c);
    drop(hosts);
}

/// Every (PG, OSD) copy of `pool`.
async fn copies(client: &Client, pool: u32) -> BTreeSet<(u32, u32)> {
    let map = client.mon().get_map().await.expect("map");
    let h = map.placer();
    (0..map.pools[&pool].pg_count)
        .flat_map(|pg| {
            map.pg_placement_in(&h, cairn_map::PgId { pool, pg })
                .up_set
                .into_iter()
                .map(move |o| (pg, o))
        })
        .collect()
}

#[test]
fn a_host_added_takes_its_share_and_nothing_else_moves() {
    let Some(hosts) = Hosts::create(5) else {
        return;
    };
    let c = cluster_on(&hosts, "hosts-add", 4);
    pool_active(&c, 128);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        let written: Vec<(usize, u8)> = (0..64).map(|k| (k, 1)).collect();
        for &(key, round) in &written {
            let name = format!("obj-{key}");
            client
                .write_full(pool, name.as_bytes(), &payload(key, round))
                .await
                .expect("write");
        }
        let before = copies(&client, pool).await;

        tokio::task::block_in_place(|| add_osd(&c, &hosts, 4));
        wait_osd(&client, 4, true).await;
        let after = copies(&client, pool).await;
        // Copies that left an OSD are exactly the copies the new host took: nothing moved
        // between the old hosts.
        let gone: Vec<_> = before.difference(&after).collect();
        let new: Vec<_> = after.difference(&before).collect();
        assert!(
            new.iter().all(|&&(_, o)| o == 4),
            "copies moved between old OSDs: {new:?}"
        );
        assert_eq!(gone.len(), new.len());
        // The new host's share is 1/5 of the copies; allow 1.2x of it.
        let ideal = before.len() as f64 / 5.0;
        let moved = new.len() as f64;
        assert!(
            moved <= 1.2 * ideal && moved >= 0.8 * ideal,
            "moved {moved} of {}, ideal {ideal}",
            before.len()
        );
        assert_spread(&client, pool, 3, None).await;

        tokio::task::block_in_place(|| {
            wait_status(&c, "the moved PGs clean", |s| {
                s["pgs"]["peering"] == 0
                    && s["pgs"]["inactive"] == 0
                    && s["recovery"]["objects_degraded"] == 0
                    && s["pgs"]["misplaced_copies"] == 0
            })
        });
        verify(&client, pool, &written).await;
    });
    drop(c);
    drop(hosts);
}

/// Racks as failure domains: 4 hosts labelled into racks b (h0, h1; the monitor is on h0)
/// and a (h2, h3). A pool of 3 copies apart by rack is refused (2 racks); one of 2 copies
/// gets one copy in each rack; then rack a is lost whole (both hosts killed and cut off)
/// and every object still reads back from rack b, and writes go on (min_size 1).
#[test]
fn a_rack_pool_survives_losing_a_whole_rack() {
    let Some(hosts) = Hosts::create(4) else {
        return;
    };
    let c = cluster_on(&hosts, "hosts-racks", 4);
    for (host, rack) in [("h0", "b"), ("h1", "b"), ("h2", "a"), ("h3", "a")] {
        let out = c.ok(&["host", "set", host, "--rack", rack, "--zone", "dc1"]);
        assert!(out.contains("done"), "{out}");
    }
    let o = c.cairn(&["pool", "create", "r3", "--size", "3", "--domain", "rack"]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "3 copies over 2 racks accepted");
    assert!(
        err.contains("distinct racks") && err.contains("the cluster has 2 (racks"),
        "{err}"
    );
    let o = c.cairn(&["host", "set", "h9", "--rack", "a"]);
    assert!(!o.status.success() && text(&o.stderr).contains("no OSD is on host \"h9\""));
    c.ok(&[
        "pool",
        "create",
        "r",
        "--size",
        "2",
        "--min-size",
        "1",
        "--pgs",
        "32",
        "--domain",
        "rack",
    ]);
    wait_status(&c, "the pool active", |s| {
        s["pgs"]["inactive"] == 0 && s["pgs"]["peering"] == 0
    });
    let tree: serde_json::Value =
        serde_json::from_str(&c.ok(&["osd", "tree", "--json"])).expect("tree json");
    assert_eq!(tree["domains"]["rack"], 2, "{tree}");
    assert_eq!(tree["domains"]["zone"], 1, "{tree}");
    assert_eq!(tree["pools"][0]["domain"], "rack", "{tree}");
    assert_eq!(tree["hosts"][0]["rack"], "a", "{tree}: rack a sorts first");
    assert_eq!(tree["hosts"][0]["name"], "h2", "{tree}");
    let text_tree = c.ok(&["osd", "tree"]);
    assert!(
        text_tree.contains("zone dc1") && text_tree.contains("rack b"),
        "{text_tree}"
    );
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("r").expect("pool");
        let map = client.mon().get_map().await.expect("map");
        for pg in 0..32 {
            let place = map.pg_placement(cairn_map::PgId { pool, pg });
            let racks: BTreeSet<u32> = place.up_set.iter().map(|o| o / 2).collect();
            assert_eq!(
                racks.len(),
                2,
                "pg {pg} not in both racks: {:?}",
                place.up_set
            );
        }
        let mut written: Vec<(usize, u8)> = Vec::new();
        for key in 0..64 {
            let name = format!("obj-{key}");
            client
                .write_full(pool, name.as_bytes(), &payload(key, 1))
                .await
                .expect("write");
            written.push((key, 1));
        }
        // Rack a fails as a whole.
        hosts.lose(2);
        hosts.lose(3);
        wait_osd(&client, 2, false).await;
        wait_osd(&client, 3, false).await;
        verify(&client, pool, &written).await;
        for key in 0..16 {
            let name = format!("obj-{key}");
            client
                .write_full(pool, name.as_bytes(), &payload(key, 2))
                .await
                .expect("write with rack a lost");
            written.retain(|&(k, _)| k != key);
            written.push((key, 2));
        }
        verify(&client, pool, &written).await;
    });
    // Rack b alone cannot hold 2 copies apart: status says so once rack a is out.
    wait_status(&c, "rack a out", |s| s["osds"]["in"] == 2);
    let st = c.ok(&["status"]);
    assert!(st.contains("has 1 failure domains for it (racks"), "{st}");
    drop(c);
    drop(hosts);
}

/// A host cut off by nftables inside its namespace, then healed. osd.3 (on host 3) leads half
/// the registers; writers and a reader on the majority side (the test's namespace) and two
/// readers on host 3 itself (a client whose sockets live in host 3's namespace, connected
/// before the cut) run throughout. No read on either side returns a value an acknowledged
/// write had replaced (the cut-off primary stops serving before its successor starts),
/// writes to osd.3's PGs resume on the majority side, and after the heal osd.3 rejoins,
/// the PGs get clean, and every register reads its latest acknowledged value.
#[test]
fn a_host_cut_off_and_healed_serves_no_stale_value_and_loses_nothing() {
    use common::history::{final_check, registers, workload, History, Roles};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let Some(hosts) = Hosts::create(4) else {
        return;
    };
    let c = cluster_on(&hosts, "hosts-cut", 4);
    c.pool_create("p", 3, 2, 16);
    wait_status(&c, "the pool active", |s| {
        s["pgs"]["inactive"] == 0 && s["pgs"]["peering"] == 0
    });
    let hosts = Arc::new(hosts);
    let rt = runtime();
    let hist = Arc::new(Mutex::new(History::default()));
    let inside_hist = Arc::new(Mutex::new(History::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let (pool, names) = rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        (pool, Arc::new(registers(&client.map(), pool, 16, 3)))
    });
    // The readers on host 3: their own thread and runtime, inside its namespace.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let inside = {
        let (hosts, names, stop) = (hosts.clone(), names.clone(), stop.clone());
        let hist = inside_hist.clone();
        let mut cfg = c.client_config();
        cfg.op_timeout = Duration::from_secs(3);
        std::thread::spawn(move || {
            hosts.enter(3);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let client = cairn_client::Client::connect(cfg)
                    .await
                    .expect("client on host 3");
                let readers = Roles {
                    first: 10,
                    writers: 0,
                    readers: 2,
                };
                let tasks = workload(&client, pool, &names, &hist, &stop, readers);
                let _ = ready_tx.send(());
                for t in tasks {
                    t.await.expect("reader on host 3");
                }
            });
        })
    };
    ready_rx.recv().expect("readers on host 3 started");
    rt.block_on(async {
        let client = c.client().await;
        let roles = Roles {
            first: 0,
            writers: 3,
            readers: 1,
        };
        let tasks = workload(&client, pool, &names, &hist, &stop, roles);
        tokio::time::sleep(Duration::from_secs(2)).await;

        hosts.firewall(3);
        let cut = Instant::now();
        wait_osd(&client, 3, false).await;
        let down_after = cut.elapsed();
        let victim_keys = names.len() as u32 / 2;
        let resumed =
            loop {
                let acked =
                    hist.lock().expect("lock").writes.iter().any(|w| {
                        w.key < victim_keys && w.start > cut + down_after && w.end.is_some()
                    });
                if acked {
                    break cut.elapsed();
                }
                assert!(
                    cut.elapsed() < down_after + Duration::from_secs(10),
                    "writes to osd.3's PGs did not resume within 10 s of it going down\n{}",
                    c.logs()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
        tokio::time::sleep(Duration::from_secs(2)).await;

        hosts.unfirewall(3);
        wait_osd(&client, 3, true).await;
        tokio::task::block_in_place(|| {
            wait_status(&c, "clean after the heal", |s| {
                s["pgs"]["peering"] == 0
                    && s["pgs"]["inactive"] == 0
                    && s["recovery"]["objects_degraded"] == 0
            })
        });
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.expect("workload task");
        }
        tokio::task::block_in_place(|| inside.join().expect("host 3 readers"));
        let mut h = std::mem::take(&mut *hist.lock().expect("lock"));
        let inside = std::mem::take(&mut inside_hist.lock().expect("lock").reads);
        let inside_reads = inside.len();
        let inside_after_cut = inside.iter().filter(|r| r.start > cut).count();
        assert!(inside_reads > 0, "the readers on host 3 read nothing");
        let bad_inside = common::history::check(&h.writes, &inside);
        assert!(
            bad_inside.is_empty(),
            "on host 3: {}",
            bad_inside.join("\n")
        );
        h.reads.extend(inside);
        let (acked, reads) = final_check(&client, pool, &names, h, || c.logs()).await;
        assert!(acked > 100, "only {acked} writes were acknowledged");
        eprintln!(
            "host cut: osd.3 down after {down_after:?}, writes resumed {resumed:?} after the \
             cut; {acked} writes acknowledged, {reads} reads checked, {inside_reads} on host 3 \
             ({inside_after_cut} after the cut)"
        );
    });
    drop(c);
    drop(hosts);
}

/// Hosts lost for good while another holds only older copies: a PG on hosts 1, 2 and 3;
/// host 3 fails, writes go on to hosts 1 and 2; then both fail for good, host 3 returns, and
/// the operator marks 1 and 2 out so the PG maps to hosts 3 and 0. The PG waits (`down`,
/// naming osd.1 and osd.2) rather than serve host 3's older copies: reads of its objects
/// fail at their deadline, never return the old value. When host 1 returns, the PG goes
/// active with the newer writes.
#[test]
fn hosts_lost_with_the_newest_writes_leave_their_pgs_down_until_one_returns() {
    let Some(hosts) = Hosts::create(4) else {
        return;
    };
    // No automatic out: the operator decides, as after a site failure.
    let c = cluster_with_down_out(&hosts, "hosts-older", 4, 3600);
    pool_active(&c, 16);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        let map = client.mon().get_map().await.expect("map");
        // Objects of PGs placed on hosts 1, 2 and 3 (not on host 0, the monitor's).
        let keys: Vec<usize> = (0..400)
            .filter(|k| {
                let pg = map
                    .object_pg(pool, format!("obj-{k}").as_bytes())
                    .expect("pg");
                !map.pg_placement(pg).up_set.contains(&0)
            })
            .take(8)
            .collect();
        assert!(!keys.is_empty(), "no PG avoids host 0");
        for &k in &keys {
            let name = format!("obj-{k}");
            client
                .write_full(pool, name.as_bytes(), &payload(k, 1))
                .await
                .expect("round 1");
        }
        hosts.lose(3);
        wait_osd(&client, 3, false).await;
        for &k in &keys {
            let name = format!("obj-{k}");
            client
                .write_full(pool, name.as_bytes(), &payload(k, 2))
                .await
                .expect("round 2 on hosts 1 and 2");
        }
        hosts.lose(1);
        hosts.lose(2);
        wait_osd(&client, 1, false).await;
        wait_osd(&client, 2, false).await;
        hosts.heal(3);
        start_osd(&c, &hosts, 3);
        wait_osd(&client, 3, true).await;
        c.ok(&["osd", "out", "1"]);
        c.ok(&["osd", "out", "2"]);
        tokio::task::block_in_place(|| {
            wait_status(&c, "the PGs down, waiting for osd.1 or osd.2", |s| {
                let waits = s["down_pgs"].as_array().is_some_and(|pgs| {
                    !pgs.is_empty()
                        && pgs.iter().all(|p| {
                            let mut w: Vec<u64> = p["osds"]
                                .as_array()
                                .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
                                .unwrap_or_default();
                            w.sort_unstable();
                            w == [1, 2]
                        })
                });
                waits && s["health"] == "HEALTH_ERR"
            })
        });
        let mut cfg = c.client_config();
        cfg.op_timeout = Duration::from_secs(3);
        let impatient = Client::connect(cfg).await.expect("client");
        for &k in &keys {
            let name = format!("obj-{k}");
            match impatient.read(pool, name.as_bytes(), 0, 8192).await {
                Ok(b) => panic!("obj-{k} served while its PG is down: round {}", b[13]),
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        e.contains("is down: waiting for osd.") && e.contains("osd.2"),
                        "obj-{k}: {e}"
                    )
                }
            }
        }

        // Host 1 returns: the PG goes active with round 2.
        hosts.heal(1);
        start_osd(&c, &hosts, 1);
        wait_osd(&client, 1, true).await;
        let written: Vec<(usize, u8)> = keys.iter().map(|&k| (k, 2)).collect();
        verify(&client, pool, &written).await;
    });
    drop(c);
    drop(hosts);
}

/// The ```sh blocks of a page that start with `# on hostN` or `# on every host`: (hosts,
/// command lines), hosts counted from 0.
fn host_blocks(page: &str, hosts: usize) -> Vec<(Vec<usize>, Vec<String>)> {
    let mut out = Vec::new();
    let mut lines = page.lines();
    while let Some(l) = lines.next() {
        if l.trim() != "```sh" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        let Some(target) = block.first().and_then(|h| h.trim().strip_prefix("# on ")) else {
            continue;
        };
        let on: Vec<usize> = match target.trim() {
            "every host" => (0..hosts).collect(),
            h => vec![
                h.trim_start_matches("host")
                    .parse::<usize>()
                    .expect("# on hostN")
                    - 1,
            ],
        };
        let cmds = block[1..]
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        out.push((on, cmds));
    }
    out
}

/// Runs docs/operator/deploy.md on `hosts` (3): each host's /etc/cairn and /var/lib/cairn
/// live under the returned directory, `hostN/...` (removed when the guard drops).
fn deploy(hosts: &Hosts, tag: &str) -> RemoveOnDrop {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/operator/deploy.md"
    ))
    .expect("docs/operator/deploy.md");
    let blocks = host_blocks(&page, 3);
    assert!(blocks.len() >= 5, "deploy.md lost its host blocks");
    let base = std::env::temp_dir().join(format!("cairn-deploy-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let cleanup = RemoveOnDrop(base.clone());
    // Each host's /etc/cairn and /var/lib/cairn live under BASE/hostN; `cairn` is this build.
    let bin = base.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::os::unix::fs::symlink(CAIRN, bin.join("cairn")).expect("symlink cairn");
    let root = |k: usize| base.join(format!("host{}", k + 1));
    let map_line = |line: &str, k: usize| {
        let mut l = line.to_string();
        for j in 0..3 {
            let r = root(j).display().to_string();
            for p in ["/etc/cairn", "/var/lib/cairn"] {
                l = l.replace(&format!("10.0.0.{}:{p}", j + 1), &format!("{r}{p}"));
            }
        }
        let r = root(k).display().to_string();
        for p in ["/etc/cairn", "/var/lib/cairn"] {
            l = l.replace(&format!(" {p}"), &format!(" {r}{p}"));
            l = l.replace(&format!(">{p}"), &format!(">{r}{p}"));
        }
        l = l.replacen("scp ", "cp ", 1);
        for j in 0..3 {
            l = l.replace(&format!("10.0.0.{}", j + 1), &hosts.ips[j]);
        }
        l
    };
    for k in 0..3 {
        std::fs::create_dir_all(root(k).join("var/lib/cairn")).expect("host dir");
    }
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
    for (on, cmds) in &blocks {
        for &k in on {
            for cmd in cmds {
                let line = map_line(cmd, k);
                let log = base.join(format!("step-host{}.log", k + 1));
                let out = std::fs::File::create(&log).expect("step log");
                let conf = root(k).join("etc/cairn/cairn.toml");
                let status = hosts
                    .command(k, "sh")
                    .args(["-c", &line])
                    .env("PATH", &path)
                    .env("HOST_IP", &hosts.ips[k])
                    .env("N", (k + 1).to_string())
                    .env("CAIRN_CONF", &conf)
                    .stdin(Stdio::null())
                    .stdout(out.try_clone().expect("log"))
                    .stderr(out)
                    .status()
                    .expect("run a deploy.md line");
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                assert!(
                    status.success(),
                    "host{} `{cmd}` ({line}) failed:\n{said}",
                    k + 1
                );
            }
        }
    }
    cleanup
}

/// The configuration file of host `k` (0-based) after [`deploy`].
fn host_conf(d: &RemoveOnDrop, k: usize) -> String {
    d.0.join(format!("host{}/etc/cairn/cairn.toml", k + 1))
        .display()
        .to_string()
}

#[test]
fn deploy_md_walkthrough_runs_on_three_hosts() {
    let Some(hosts) = Hosts::create(3) else {
        return;
    };
    let d = deploy(&hosts, "walk");
    // The cluster the page built: three monitors, one OSD per host, the object kept.
    let conf = host_conf(&d, 0);
    let (ok, out) = common::cluster::run_as(&conf, &["mon", "ls", "--json"]);
    assert!(ok, "{out}");
    let mons: serde_json::Value = serde_json::from_str(&out).expect("mon ls");
    assert_eq!(mons.as_array().map(Vec::len), Some(3), "{out}");
    let (ok, out) = common::cluster::run_as(&conf, &["osd", "tree", "--json"]);
    assert!(ok, "{out}");
    let tree: serde_json::Value = serde_json::from_str(&out).expect("osd tree");
    assert_eq!(tree["domains"]["host"], 3, "{out}");
    assert_eq!(tree["pools"][0]["domain"], "host", "{out}");
    let (ok, out) = common::cluster::run_as(&conf, &["obj", "get", "vms", "hello", "-"]);
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert!(ok && out.contains(hostname.trim()), "{out}");
    // `osd activate` again (as at a second boot) starts nothing twice.
    let root = d.0.join("host1/var/lib/cairn").display().to_string();
    let (ok, out) = common::cluster::run_as(&conf, &["osd", "activate", "--all", "--root", &root]);
    assert!(ok && out.contains("already running"), "{out}");
    drop(hosts);
}

/// The leader monitor's id and address, asked through `conf`.
fn leader(conf: &str) -> Option<(u64, String)> {
    // Stdout only: the command says on stderr when it waits for an answer.
    let o = std::process::Command::new(CAIRN)
        .args(["-c", conf, "mon", "ls", "--json"])
        .output()
        .ok()?;
    let ls: serde_json::Value = serde_json::from_slice(&o.stdout)
        .ok()
        .filter(|_| o.status.success())?;
    ls.as_array()?
        .iter()
        .find(|m| m["leader"] == true)
        .map(|m| {
            let id = m["id"].as_u64().unwrap_or(u64::MAX);
            (id, m["addr"].as_str().unwrap_or_default().to_string())
        })
}

#[test]
fn the_leader_monitors_host_lost_a_new_leader_within_10_s_and_io_goes_on() {
    // Hosts 1-3 run deploy.md; host 4 later replaces the lost monitor.
    let Some(hosts) = Hosts::create(4) else {
        return;
    };
    let d = deploy(&hosts, "leader");
    let conf0 = host_conf(&d, 0);
    let (old, addr) = leader(&conf0).expect("a leader after the walkthrough");
    let lost = hosts
        .ips
        .iter()
        .position(|ip| addr.starts_with(&format!("{ip}:")))
        .expect("the leader on one of the hosts");
    // The whole host goes: its monitor and its OSD.
    let t = Instant::now();
    hosts.lose(lost);
    let conf = host_conf(&d, (lost + 1) % 3);
    let elected = loop {
        if let Some((id, _)) = leader(&conf).filter(|(id, _)| *id != old) {
            break (id, t.elapsed());
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no new leader after 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        elected.1 < Duration::from_secs(10),
        "new leader mon.{} after {:?}",
        elected.0,
        elected.1
    );
    // Clients and OSDs follow: the host's OSD is marked down, the pool (3 copies, min 2)
    // takes writes on the two hosts left, and what was written before reads back.
    let file = d.0.join("after.txt");
    std::fs::write(&file, b"written after the leader's host was lost").expect("write file");
    let file = file.display().to_string();
    let put = Instant::now();
    let (ok, out) = common::cluster::run_as(&conf, &["obj", "put", "vms", "after", &file]);
    assert!(ok, "{out}");
    eprintln!("write after the loss took {:?}", put.elapsed());
    let (ok, out) = common::cluster::run_as(&conf, &["obj", "get", "vms", "after", "-"]);
    assert!(
        ok && out.contains("written after the leader's host was lost"),
        "{out}"
    );
    let (ok, out) = common::cluster::run_as(&conf, &["obj", "get", "vms", "hello", "-"]);
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert!(ok && out.contains(hostname.trim()), "{out}");
    let o = std::process::Command::new(CAIRN)
        .args(["-c", &conf, "status", "--json"])
        .output()
        .expect("cairn status");
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status json");
    assert!(o.status.success() && st["osds"]["up"] == 2, "{st}");
    eprintln!(
        "new leader mon.{} {:?} after its host was lost",
        elected.0, elected.1
    );
    replace_lost_monitor(&hosts, &d, lost, old);
    drop(hosts);
}

/// docs/operator/mon.md's replacement on the hosts of [`deploy`]: a new monitor (id 3) on
/// host 4 joins and is added, the lost one (`lost_id`, on host `lost`) is removed; then a
/// surviving original monitor is stopped too, so that the map changes only with the new
/// monitor's vote.
fn replace_lost_monitor(hosts: &Hosts, d: &RemoveOnDrop, lost: usize, lost_id: u64) {
    let survivor = (lost + 1) % 3;
    let conf = host_conf(d, survivor);
    let host4 = d.0.join("host4");
    let mon_dir = host4.join("var/lib/cairn/mon.3");
    std::fs::create_dir_all(host4.join("etc/cairn")).expect("host4 etc");
    std::fs::create_dir_all(&mon_dir).expect("host4 mon dir");
    let from = d.0.join(format!("host{}", survivor + 1));
    for f in ["cairn.toml", "keyring"] {
        std::fs::copy(
            from.join("etc/cairn").join(f),
            host4.join("etc/cairn").join(f),
        )
        .expect("copy the host configuration");
    }
    let mon_keyring = from.join(format!("var/lib/cairn/mon.{survivor}/keyring"));
    std::fs::copy(&mon_keyring, mon_dir.join("keyring")).expect("copy the monitors' keyring");
    let conf4 = host4.join("etc/cairn/cairn.toml").display().to_string();
    let listen = format!("{}:6789", hosts.ips[3]);
    let log = std::fs::File::create(host4.join("mon.3.log")).expect("mon log");
    let mut mon = hosts
        .command(3, CAIRN)
        .args(["-c", &conf4, "mon", "run", "--join", "--id", "3", "--dir"])
        .arg(&mon_dir)
        .args(["--listen", &listen])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start mon.3 on host 4");
    let run = |args: &[&str]| {
        let (ok, out) = common::cluster::run_as(&conf, args);
        assert!(ok, "cairn {args:?}: {out}");
        out
    };
    run(&["mon", "add", "3", &listen]);
    run(&["mon", "rm", &lost_id.to_string()]);
    let o = std::process::Command::new(CAIRN)
        .args(["-c", &conf, "mon", "ls", "--json"])
        .output()
        .expect("cairn mon ls");
    let ls: serde_json::Value = serde_json::from_slice(&o.stdout).expect("mon ls json");
    let ids: BTreeSet<u64> = ls
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m["id"].as_u64())
        .collect();
    let want: BTreeSet<u64> = (0..4).filter(|id| *id != lost_id).collect();
    assert_eq!(ids, want, "{ls}");
    // A surviving original monitor stops: the two left (one of them the new one) are a
    // majority of three, and the map still changes.
    let other = (0..3u64).find(|id| *id != lost_id && *id != survivor as u64);
    let other_host = other.expect("a third monitor") as usize;
    let stopped = hosts.pids(other_host);
    let mon_pid = stopped.iter().copied().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.windows(9).any(|w| w == b"mon\0run\0-"))
    });
    let mon_pid = mon_pid.expect("the third monitor's process");
    unsafe { libc::kill(mon_pid, libc::SIGKILL) };
    let t = Instant::now();
    loop {
        let (ok, out) = common::cluster::run_as(&conf, &["pool", "set", "vms", "min_size", "1"]);
        if ok {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no map change with the new monitor's vote: {out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = mon.kill();
    let _ = mon.wait();
}

/// Removes a directory when dropped (also when the test fails).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `bench/scale-out.sh` (cluster CPU per 4 KiB write on N OSD hosts) runs as documented, with
/// this build and tiny settings (3 and 4 hosts, 1 s per workload): JSON with a run per size,
/// each with the two write workloads and their CPU per op, and the ratio between sizes.
#[test]
fn the_scale_out_benchmark_reports_cpu_per_write_for_each_cluster_size() {
    let Some(probe) = Hosts::create(1) else {
        return;
    };
    drop(probe);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/scale-out.sh");
    let o = std::process::Command::new(script)
        .args(["--seconds", "1", "--objects", "8"])
        .env("CAIRN", CAIRN)
        .env("HOSTS", "3 4")
        .env("OSD_SIZE", "1G")
        .output()
        .expect("run bench/scale-out.sh");
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(&out).expect("scale-out JSON");
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{out}");
    for (run, hosts) in runs.iter().zip([3, 4]) {
        assert_eq!(run["hosts"], hosts, "{out}");
        let names: Vec<&str> = run["workloads"]
            .as_array()
            .expect("workloads")
            .iter()
            .map(|w| {
                assert!(w["cpu_us_per_op"].as_f64().is_some_and(|c| c > 0.0), "{w}");
                w["name"].as_str().expect("name")
            })
            .collect();
        assert_eq!(names, ["write-4k-qd1", "write-4k-qd32"], "{out}");
    }
    for k in ["write-4k-qd1", "write-4k-qd32"] {
        assert!(
            v["cpu_us_per_op_ratio"][k]
                .as_f64()
                .is_some_and(|r| r >= 1.0),
            "{out}"
        );
    }
}

/// A pool's PGs split from 32 to 128 under a write load on 4 hosts (one OSD each, 3 copies,
/// host domain): every acknowledged register write is in a checked history, every object
/// reads back, and the copies spread over the hosts within 10% of even.
#[test]
fn a_pool_split_from_32_to_128_pgs_under_load_spreads_over_the_hosts() {
    use common::history::{final_check, workload, History, Roles};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let Some(hosts) = Hosts::create(4) else {
        return;
    };
    let c = cluster_on(&hosts, "hosts-split", 4);
    pool_active(&c, 32);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        let written: Vec<(usize, u8)> = (0..400).map(|k| (k, 1)).collect();
        for &(key, round) in &written {
            let name = format!("obj-{key}");
            client
                .write_full(pool, name.as_bytes(), &payload(key, round))
                .await
                .expect("write");
        }
        let names: Arc<Vec<String>> = Arc::new((0..32).map(|i| format!("reg-{i}")).collect());
        let hist = Arc::new(Mutex::new(History::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let roles = Roles { first: 0, writers: 3, readers: 2 };
        let tasks = workload(&client, pool, &names, &hist, &stop, roles);
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::block_in_place(|| c.ok(&["pool", "set", "p", "pgs", "128"]));
        tokio::task::block_in_place(|| {
            wait_status(&c, "the split pool clean", |s| {
                s["pgs"]["total"] == 128
                    && s["pgs"]["peering"] == 0
                    && s["pgs"]["inactive"] == 0
                    && s["pgs"]["active_degraded"] == 0
                    && s["pgs"]["misplaced_copies"] == 0
                    && s["recovery"]["objects_degraded"] == 0
            })
        });
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.expect("workload");
        }
        verify(&client, pool, &written).await;
        let h = std::mem::take(&mut *hist.lock().expect("lock"));
        let (acked, _) = final_check(&client, pool, &names, h, || c.logs()).await;
        // Copies per host, from where the (clean) PGs are: within 10% of even.
        let map = client.mon().get_map().await.expect("map");
        let mut per_host = [0usize; 4];
        for &(key, _) in &written {
            let pg = map.object_pg(pool, format!("obj-{key}").as_bytes()).expect("pg");
            for o in map.pg_placement(pg).up_set {
                per_host[o as usize] += 1;
            }
        }
        let mean = per_host.iter().sum::<usize>() as f64 / 4.0;
        for (i, n) in per_host.iter().enumerate() {
            let off = (*n as f64 - mean).abs() / mean;
            assert!(off <= 0.10, "host {i} holds {n} copies, mean {mean}: {per_host:?}");
        }
        eprintln!("split 32 -> 128 on 4 hosts: {acked} register writes checked, copies per host {per_host:?}");
    });
    drop(c);
    drop(hosts);
}

/// A volume whose data is on a 4+2 pool with one shard per host, on 6 namespace hosts (its
/// header pool 4 copies on 4 hosts), served by a `cairn nbd serve` in the test's namespace:
/// two hosts lost at once (processes killed, links cut) under the unique-value writer over
/// NBD lose no acknowledged write, and writes and reads go on; a third makes every PG down (a
/// read fails, never answers wrong); the three back, their shards are rebuilt, and every
/// acknowledged write reads back again, also with two hosts never lost then lost.
#[test]
fn a_4_2_volume_on_six_hosts_survives_two_lost_hosts_under_nbd_writes_and_a_third_makes_it_down() {
    use common::unique::{acked_blocks, unique_writes_with, verify_unique};
    let Some(hosts) = Hosts::create(6) else {
        return;
    };
    // No OSD is marked out during the test: with one shard per host there is nowhere else to
    // put a lost host's shards.
    let c = cluster_with_down_out(&hosts, "hosts-ec42", 6, 600);
    c.pool_create("hdr", 4, 2, 8);
    c.ok(&[
        "pool",
        "create",
        "e",
        "--ec",
        "4+2",
        "--min-size",
        "4",
        "--pgs",
        "8",
    ]);
    wait_status(&c, "the pools active", |s| {
        s["pgs"]["inactive"] == 0 && s["pgs"]["peering"] == 0
    });
    let tree: serde_json::Value =
        serde_json::from_str(&c.ok(&["osd", "tree", "--json"])).expect("tree json");
    let e = tree["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "e"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&e["domain"], &e["domains"]),
        (&"host".into(), &6.into()),
        "{tree}"
    );
    c.ok(&[
        "vol",
        "create",
        "v",
        "--size",
        "64M",
        "--pool",
        "hdr",
        "--data-pool",
        "e",
    ]);
    let nbd = common::nbd_server::NbdServer::start(&c, "hdr");
    let uri = nbd.uri("v");
    let stop = c.dir.join("stop-writer");
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("e").expect("pool e");
        client
            .write_full(pool, b"probe", &payload(0, 1))
            .await
            .expect("probe");
        let out = tokio::task::block_in_place(|| {
            unique_writes_with(&c, &uri, &stop, 6, || {
                hosts.lose(4);
                hosts.lose(5);
            })
        });
        wait_osd(&client, 4, false).await;
        wait_osd(&client, 5, false).await;
        let acks = out.lines().filter(|l| l.starts_with("a ")).count();
        assert!(acks >= 20, "{acks} writes acknowledged\n{out}");
        let acked = acked_blocks(&out);
        tokio::task::block_in_place(|| verify_unique(&c, &uri, &acked));

        // A third host: fewer than k shards, every PG down.
        hosts.lose(3);
        wait_osd(&client, 3, false).await;
        let mut cfg = c.client_config();
        cfg.op_timeout = Duration::from_secs(3);
        let short = Client::connect(cfg).await.expect("client");
        if let Ok(got) = short.read(pool, b"probe", 0, 1 << 20).await {
            panic!(
                "a read with 3 of 6 shards answered ({} bytes, right: {})",
                got.len(),
                got == payload(0, 1)
            );
        }

        // Back: every shard rebuilt; the writes still read back, the probe too.
        for i in [3, 4, 5] {
            hosts.heal(i);
            start_osd(&c, &hosts, i);
        }
        for i in [3, 4, 5] {
            wait_osd(&client, i, true).await;
        }
        tokio::task::block_in_place(|| {
            wait_status(&c, "every PG active", |s| s["pgs"]["inactive"] == 0);
            verify_unique(&c, &uri, &acked);
        });
        // With two hosts that were never lost now lost, the rebuilt shards serve.
        hosts.lose(1);
        hosts.lose(2);
        wait_osd(&client, 1, false).await;
        wait_osd(&client, 2, false).await;
        tokio::task::block_in_place(|| verify_unique(&c, &uri, &acked));
        let got = client.read(pool, b"probe", 0, 1 << 20).await;
        assert_eq!(got.expect("read the probe"), payload(0, 1));
    });
    drop(nbd);
    drop(c);
    drop(hosts);
}
