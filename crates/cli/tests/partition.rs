//! Network partitions around a primary OSD (osd.3, listening and connecting from its own
//! address, 127.0.0.9 or .19),
//! made with nftables (needs root and nft):
//! - it and a client (127.0.0.7) are cut off from the monitors and the other OSDs: the
//!   monitors stop hearing from it and mark it down; the cut-off client still reads from it
//!   (its map cannot change), but it stops serving before any new primary starts (its lease
//!   ran out);
//! - it is cut off from the other OSDs only (it still reaches the monitors): its peers report
//!   it, the monitors refuse its heartbeats and mark it down a grace later, when its lease has
//!   run out.
//!
//! Either way its PGs get new primaries where a client on the majority side keeps writing, no
//! read ever returns a value an acknowledged write had replaced, and after the partition heals
//! nothing acknowledged is lost.

mod common;

use common::cluster::{runtime, Cluster};
use common::history::{final_check, registers, workload, History, Roles};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The addresses of one scenario: each test has its own (they run at the same time).
#[derive(Clone, Copy)]
struct Net {
    /// The cut-off OSD's.
    victim: &'static str,
    /// The second client's.
    client: &'static str,
}

/// An OSD process the test started itself (killed when dropped).
struct Victim(Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nftables rules cutting a scenario's addresses off (removed when dropped).
struct Partition {
    table: String,
}

impl Partition {
    /// Cuts the victim and the second client off from every other address.
    fn isolate(n: Net) -> Partition {
        let (v, c) = (n.victim, n.client);
        let others = format!("{{ {v}, {c} }}");
        Partition::start(
            n,
            &[
                format!("ip saddr {v} ip daddr != {others} drop"),
                format!("ip daddr {v} ip saddr != {others} drop"),
                format!("ip saddr {c} ip daddr != {others} drop"),
                format!("ip daddr {c} ip saddr != {others} drop"),
            ],
        )
    }

    /// Cuts the victim off from the other OSDs (on 127.0.0.1) but not from the monitor
    /// listening on `mon_port` there, nor from the second client.
    fn from_peers(n: Net, mon_port: u16) -> Partition {
        let v = n.victim;
        Partition::start(
            n,
            &[
                format!("ip saddr {v} ip daddr 127.0.0.1 tcp dport != {mon_port} drop"),
                format!("ip saddr 127.0.0.1 ip daddr {v} tcp sport != {mon_port} drop"),
            ],
        )
    }

    fn start(n: Net, rules: &[String]) -> Partition {
        let ip = n.victim.replace('.', "_");
        let table = format!("cairn_partition_{}_{ip}", std::process::id());
        let p = Partition { table };
        let t = &p.table;
        nft(&["add", "table", "inet", t]);
        nft(&[
            "add",
            "chain",
            "inet",
            t,
            "out",
            "{ type filter hook output priority 0; }",
        ]);
        for rule in rules {
            let mut args = vec!["add", "rule", "inet", t, "out"];
            args.extend(rule.split(' '));
            nft(&args);
        }
        p
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

fn nft(args: &[&str]) {
    let out = Command::new("nft")
        .args(args)
        .output()
        .expect("run nft (apt-get install nftables; the test needs root)");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn wait_up(client: &cairn_client::Client, osd: u32, up: bool, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let map = client.mon().get_map().await.expect("map");
        if map.osds.get(&osd).is_some_and(|o| o.up == up) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "osd.{osd} not marked {} within {within:?}",
            if up { "up" } else { "down" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_partitioned_primary_never_serves_beside_its_successor_and_nothing_is_lost() {
    let net = Net {
        victim: "127.0.0.9",
        client: "127.0.0.7",
    };
    run("partition", net, |_, n| Partition::isolate(n), None);
}

#[test]
fn a_primary_cut_off_from_its_peers_only_is_reported_by_them_and_replaced() {
    let net = Net {
        victim: "127.0.0.19",
        client: "127.0.0.17",
    };
    let cut = |c: &Cluster, n: Net| {
        let mon = c.mons()[0].clone();
        let port = mon.rsplit(':').next().and_then(|p| p.parse().ok());
        Partition::from_peers(n, port.expect("monitor port"))
    };
    run("partition-peers", net, cut, Some("reported unreachable by"));
}

/// The scenario of both tests: osd.3 (on `net.victim`) leads half the registers; a client on
/// 127.0.0.1 writes and reads, one on `net.client` reads; `cut` cuts osd.3 off in some way,
/// the monitors must mark it down, writes resume on new primaries, the cut heals; then no
/// read may have returned a value an acknowledged write had replaced, and none is lost.
/// `mon_says`: a line the monitor must have logged (how it decided).
fn run(name: &str, net: Net, cut: fn(&Cluster, Net) -> Partition, mon_says: Option<&str>) {
    let c = Cluster::up(name, 1, 3);
    let victim_dir = c.dir.join("osd.3");
    let keyring = c.osd_keyring(3);
    let log = std::fs::File::create(c.dir.join("log").join("osd.3.log")).expect("log file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
    cmd.args(["osd", "run", "--dir"])
        .arg(&victim_dir)
        .arg("--keyring")
        .arg(&keyring)
        .args([
            "--data-size",
            "1G",
            "--listen",
            &format!("{}:0", net.victim),
        ]);
    for m in c.mons() {
        cmd.args(["--mon", &m]);
    }
    let child = cmd
        .env("CAIRN_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start osd.3");
    let _victim = Victim(child);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        // The client on 127.0.0.7: short op deadline, so reads that cannot be served give up.
        let mut cfg = c.client_config();
        cfg.source = Some(net.client.parse().expect("ip"));
        cfg.op_timeout = Duration::from_secs(3);
        let cut_off = cairn_client::Client::connect(cfg).await.expect("client");
        wait_up(&client, 3, true, Duration::from_secs(30)).await;
        c.pool_create("p", 3, 2, 16);
        let start = Instant::now();
        let pool = loop {
            if let Ok(id) = client.pool_id("p") {
                break id;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "pool not in the map"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let names = Arc::new(registers(&client.map(), pool, 16, 3));
        let hist = Arc::new(Mutex::new(History::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = workload(
            &client,
            pool,
            &names,
            &hist,
            &stop,
            Roles {
                first: 0,
                writers: 3,
                readers: 1,
            },
        );
        let readers = Roles {
            first: 10,
            writers: 0,
            readers: 3,
        };
        tasks.extend(workload(&cut_off, pool, &names, &hist, &stop, readers));
        tokio::time::sleep(Duration::from_secs(2)).await;

        // Cut osd.3 off; the monitors mark it down.
        let partition = cut(&c, net);
        let cut = Instant::now();
        let down_after = wait_up(&client, 3, false, Duration::from_secs(20)).await;
        // The PGs osd.3 led serve again from their new primaries within 10 s.
        let victim_keys = names.len() as u32 / 2;
        let resumed = loop {
            let acked_after_down = {
                let h = hist.lock().expect("lock");
                h.writes
                    .iter()
                    .any(|w| w.key < victim_keys && w.start > cut + down_after && w.end.is_some())
            };
            if acked_after_down {
                break cut.elapsed();
            }
            assert!(
                cut.elapsed() < down_after + Duration::from_secs(10),
                "writes to osd.3's PGs did not resume\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokio::time::sleep(Duration::from_secs(2)).await;

        // Heal: osd.3 learns it was marked down, boots again and is recovered.
        drop(partition);
        wait_up(&client, 3, true, Duration::from_secs(30)).await;
        let start = Instant::now();
        loop {
            let st = c.status();
            if st["pgs"]["peering"] == 0 && st["pgs"]["active_degraded"] == 0 {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "not clean: {st}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in tasks {
            t.await.expect("workload task");
        }

        // Every read (during the partition too) returned a value no acknowledged write had
        // replaced; final reads of every register find its latest acknowledged value.
        let h = std::mem::take(&mut *hist.lock().expect("lock"));
        let (acked, reads) = final_check(&client, pool, &names, h, || c.logs()).await;
        assert!(acked > 100, "only {acked} writes were acknowledged");
        eprintln!(
            "{name}: osd.3 down after {down_after:?}, writes resumed {resumed:?} after the cut; \
             {acked} writes acknowledged, {reads} reads checked"
        );
    });
    if let Some(line) = mon_says {
        let log = std::fs::read_to_string(c.dir.join("log").join("mon.0.log")).expect("mon log");
        assert!(
            log.contains(line),
            "the monitor never logged {line:?}\n{}",
            c.logs()
        );
    }
    // The replicas agree after healing.
    let out = c.cairn(&["pg", "scrub", "--json", "-p", "p"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scrub json");
    assert_eq!(v["inconsistent"], 0, "{v}");
    assert_eq!(v["pgs_failed"], 0, "{v}");
}
