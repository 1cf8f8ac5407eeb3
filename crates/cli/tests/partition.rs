//! A network partition cuts a primary OSD, and a client with it, off from the monitors and
//! the other OSDs. The monitors mark the OSD down, its PGs get new primaries and a client on
//! the majority side writes new values there. The cut-off client still reads from the old
//! primary (its map cannot change), but the old primary stops serving before any new one
//! starts (its lease ran out), so no read ever returns a value an acknowledged write had
//! replaced; after the partition heals nothing acknowledged is lost.
//!
//! The cut-off OSD listens (and connects) from 127.0.0.9, the cut-off client from
//! 127.0.0.7; nftables drops every packet between those two and any other address. Needs
//! root and nft.

mod common;

use common::cluster::{runtime, Cluster};
use common::history::{check, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const VICTIM_IP: &str = "127.0.0.9";
const CLIENT_IP: &str = "127.0.0.7";
const BLOCK: usize = 4096;

fn encode(v: u64) -> Vec<u8> {
    v.to_le_bytes().repeat(BLOCK / 8)
}

fn decode(b: &[u8]) -> u64 {
    assert_eq!(b.len(), BLOCK, "short read");
    let v = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    assert!(
        b.chunks(8).all(|c| c == v.to_le_bytes()),
        "torn block for value {v}"
    );
    v
}

/// An OSD process the test started itself (killed when dropped).
struct Victim(Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nftables rules isolating 127.0.0.9 and 127.0.0.7 from everything but each other
/// (removed when dropped).
struct Partition {
    table: String,
}

impl Partition {
    fn start() -> Partition {
        let table = format!("cairn_partition_{}", std::process::id());
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
        for rule in [
            format!("ip saddr {VICTIM_IP} ip daddr != {{ {VICTIM_IP}, {CLIENT_IP} }} drop"),
            format!("ip daddr {VICTIM_IP} ip saddr != {{ {VICTIM_IP}, {CLIENT_IP} }} drop"),
            format!("ip saddr {CLIENT_IP} ip daddr != {{ {VICTIM_IP}, {CLIENT_IP} }} drop"),
            format!("ip daddr {CLIENT_IP} ip saddr != {{ {VICTIM_IP}, {CLIENT_IP} }} drop"),
        ] {
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

#[derive(Default)]
struct History {
    writes: Vec<Write>,
    reads: Vec<Read>,
}

/// Registers: `keys` objects, the first half led by osd.3 (the victim) at the start.
fn registers(map: &cairn_map::ClusterMap, pool: u32, keys: u32) -> Vec<String> {
    let (mut mine, mut others) = (Vec::new(), Vec::new());
    for i in 0.. {
        let name = format!("reg-{i}");
        let pg = map.object_pg(pool, name.as_bytes()).expect("pg");
        let list = if map.pg_placement(pg).primary() == Some(3) {
            &mut mine
        } else {
            &mut others
        };
        if list.len() < keys as usize / 2 {
            list.push(name);
        }
        if mine.len() + others.len() == keys as usize {
            break;
        }
    }
    mine.extend(others);
    mine
}

/// `writers` writers of unique values (never 0) and `readers` readers on `names` until
/// `stop`; task ids from `first` (they make the values unique).
struct Roles {
    first: u64,
    writers: u64,
    readers: u64,
}

fn workload(
    client: &cairn_client::Client,
    pool: u32,
    names: &Arc<Vec<String>>,
    hist: &Arc<Mutex<History>>,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    roles: Roles,
) -> Vec<tokio::task::JoinHandle<()>> {
    let writers_end = roles.first + roles.writers;
    (roles.first..writers_end + roles.readers)
        .map(|t| {
            let (client, names, hist, stop) =
                (client.clone(), names.clone(), hist.clone(), stop.clone());
            tokio::spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t << 32);
                let mut seq = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = (rng % names.len() as u64) as u32;
                    let name = names[key as usize].as_bytes();
                    let start = Instant::now();
                    if t < writers_end {
                        seq += 1;
                        let value = ((t + 1) << 32) | seq;
                        let r = client.write_full(pool, name, &encode(value)).await;
                        let end = r.is_ok().then(Instant::now);
                        hist.lock().expect("lock").writes.push(Write {
                            key,
                            value,
                            start,
                            end,
                        });
                    } else {
                        let value = match client.read(pool, name, 0, BLOCK as u64).await {
                            Ok(b) => decode(&b),
                            Err(cairn_client::ClientError::NoSuchObject { .. }) => 0,
                            Err(_) => continue,
                        };
                        hist.lock().expect("lock").reads.push(Read {
                            key,
                            value,
                            start,
                            end: Instant::now(),
                        });
                    }
                }
            })
        })
        .collect()
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
    let c = Cluster::up("partition", 1, 3);
    let victim_dir = c.dir.join("osd.3");
    let log = std::fs::File::create(c.dir.join("log").join("osd.3.log")).expect("log file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
    cmd.args(["osd", "run", "--dir"]).arg(&victim_dir).args([
        "--data-size",
        "1G",
        "--listen",
        &format!("{VICTIM_IP}:0"),
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
        // The cut-off client: short op deadline, so its reads that cannot be served give up.
        let mut cfg = cairn_client::ClientConfig::new(c.mons());
        cfg.source = Some(CLIENT_IP.parse().expect("ip"));
        cfg.op_timeout = Duration::from_secs(3);
        let cut_off = cairn_client::Client::connect(cfg).await.expect("client");
        wait_up(&client, 3, true, Duration::from_secs(30)).await;
        c.ok(&[
            "pool",
            "create",
            "p",
            "--size",
            "3",
            "--min-size",
            "2",
            "--pgs",
            "16",
        ]);
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
        let names = Arc::new(registers(&client.map(), pool, 16));
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

        // Cut osd.3 off; the monitors stop hearing from it and mark it down.
        let partition = Partition::start();
        let cut = Instant::now();
        let down_after = wait_up(&client, 3, false, Duration::from_secs(15)).await;
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
        let mut h = Arc::try_unwrap(hist)
            .ok()
            .expect("history")
            .into_inner()
            .expect("lock");
        for (key, name) in names.iter().enumerate() {
            let start = Instant::now();
            let b = client
                .read(pool, name.as_bytes(), 0, BLOCK as u64)
                .await
                .expect("final read");
            h.reads.push(Read {
                key: key as u32,
                value: decode(&b),
                start,
                end: Instant::now(),
            });
        }
        let acked = h.writes.iter().filter(|w| w.end.is_some()).count();
        assert!(acked > 100, "only {acked} writes were acknowledged");
        let bad = check(&h.writes, &h.reads);
        assert!(bad.is_empty(), "{}\n{}", bad.join("\n"), c.logs());
        eprintln!(
            "partition: osd.3 down after {down_after:?}, writes resumed {resumed:?} after the cut; \
             {acked} writes acknowledged, {} reads checked",
            h.reads.len()
        );
    });
    // The replicas agree after healing.
    let out = c.cairn(&["pg", "scrub", "--json", "-p", "p"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scrub json");
    assert_eq!(v["inconsistent"], 0, "{v}");
    assert_eq!(v["pgs_failed"], 0, "{v}");
}
