//! `cairn bench scale --mon`: a real monitor process with simulated OSDs. The OSDs are tasks
//! speaking the real protocol through monitor clients (boot, heartbeat every second), with no
//! data path. Measures the monitor's CPU under the heartbeats (against the same monitor idle,
//! in the same run), map commit latency with and without the heartbeat load, and how long the
//! monitor takes to mark down an OSD whose heartbeats stop (against its grace).

use super::objects::cpu_seconds;
use super::report::{lat, ratio, round, Obj};
use anyhow::{bail, Context, Result};
use cairn_failstop::RwLockOrDie;
use cairn_map::{ChangeOutcome, Durability, MapChange};
use cairn_monclient::MonClient;
use hdrhistogram::Histogram;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The monitor's default grace (`cairn mon run --osd-grace-ms`).
const GRACE: Duration = Duration::from_millis(4000);
/// Monitor clients the simulated OSDs share (each a connection).
const CONNECTIONS: usize = 8;
/// Map changes timed in each commit-latency phase.
const COMMITS: u32 = 50;

/// The monitor process, killed (and its directory removed) on drop.
struct Monitor {
    child: Child,
    dir: std::path::PathBuf,
    addr: String,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_monitor() -> Result<Monitor> {
    let port = crate::dev::free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let dir = std::env::temp_dir().join(format!("cairn-bench-scale-mon-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let exe = std::env::current_exe().context("cannot find the cairn executable")?;
    let child = Command::new(exe)
        .args([
            "mon", "run", "--id", "0", "--auth", "none", "--listen", &addr, "--dir",
        ])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the monitor")?;
    Ok(Monitor { child, dir, addr })
}

/// The simulated OSDs booted so far: (id, up_from).
type Booted = Arc<RwLock<Vec<(u32, u64)>>>;

/// Boots `n` OSDs (10 per host), one map commit each; returns the commit latencies.
async fn boot_all(mon: &MonClient, n: u32, booted: &Booted) -> Result<Histogram<u64>> {
    let mut h = Histogram::<u64>::new(3)?;
    for i in 0..n {
        let mut store_id = [0u8; 16];
        store_id[..4].copy_from_slice(&i.to_be_bytes());
        let change = MapChange::OsdBoot {
            store_id,
            addr: format!("10.{}.{}.{}:6800", i >> 16, (i >> 8) & 255, i & 255),
            host: format!("host-{}", i / 10),
            weight: cairn_placement::WEIGHT_ONE,
        };
        let t = Instant::now();
        let ChangeOutcome::Changed { epoch, id } = mon.command(change).await? else {
            bail!("the monitor did not boot simulated osd {i}");
        };
        h.record(t.elapsed().as_nanos() as u64)?;
        booted.write_or_die().push((id, epoch));
    }
    Ok(h)
}

/// Heartbeats every booted OSD once a second over connection `k` of `CONNECTIONS`, except
/// the one named by `silent`, until `stop`.
async fn heartbeats(
    mon: MonClient,
    k: usize,
    booted: Booted,
    silent: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::Relaxed) {
        let round = Instant::now();
        let mine: Vec<(u32, u64)> = booted
            .read_or_die()
            .iter()
            .skip(k)
            .step_by(CONNECTIONS)
            .copied()
            .collect();
        let pace = Duration::from_secs(1) / (mine.len().max(1) as u32);
        for (i, (id, up_from)) in mine.into_iter().enumerate() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if id != silent.load(Ordering::Relaxed)
                && mon.heartbeat(id, up_from, Vec::new()).await.is_ok()
            {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            let due = round + pace * (i as u32 + 1);
            tokio::time::sleep_until(due.into()).await;
        }
        // A round lasts a second even with no OSD to heartbeat yet.
        tokio::time::sleep_until((round + Duration::from_secs(1)).into()).await;
    }
}

/// `COMMITS` weight changes, one at a time; their commit latencies.
async fn commits(mon: &MonClient, n: u32, salt: u32) -> Result<Histogram<u64>> {
    let mut h = Histogram::<u64>::new(3)?;
    for i in 0..COMMITS {
        let id = (i * 7919 + salt) % n;
        let weight = cairn_placement::WEIGHT_ONE - 1 - (i + salt) % 64;
        let t = Instant::now();
        mon.command(MapChange::OsdWeight { id, weight }).await?;
        h.record(t.elapsed().as_nanos() as u64)?;
    }
    Ok(h)
}

/// Runs the monitor part at `n` OSDs with a pool of `pgs` PGs for `seconds` of heartbeats.
pub fn run(n: u32, pgs: u32, seconds: f64) -> Result<Obj> {
    let monitor = start_monitor()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mon = MonClient::new(vec![monitor.addr.clone()]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while mon
            .status()
            .await
            .map(|s| s.leader.is_none())
            .unwrap_or(true)
        {
            if Instant::now() > deadline {
                bail!("the bench monitor did not start within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        mon.command(MapChange::PoolCreateRule {
            name: "bench".into(),
            size: 3,
            min_size: 2,
            pg_count: pgs,
            durability: Durability::Wal,
            domain: None,
        })
        .await?;
        let pid = monitor.child.id() as i32;
        let idle_window = Duration::from_secs_f64(seconds.min(5.0));
        let c0 = cpu_seconds(pid);
        tokio::time::sleep(idle_window).await;
        let idle_cpu = (cpu_seconds(pid) - c0) / idle_window.as_secs_f64();

        let booted: Booted = Arc::default();
        let silent = Arc::new(AtomicU32::new(u32::MAX));
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for k in 0..CONNECTIONS {
            let c = MonClient::new(vec![monitor.addr.clone()]);
            let args = (booted.clone(), silent.clone(), stop.clone(), sent.clone());
            tasks.push(tokio::spawn(heartbeats(
                c, k, args.0, args.1, args.2, args.3,
            )));
        }
        let boot = boot_all(&mon, n, &booted).await?;
        let quiet = commits(&mon, n, 1).await?;

        // Steady heartbeats: the monitor's CPU over the window, then commits under load.
        let (c0, s0, t0) = (
            cpu_seconds(pid),
            sent.load(Ordering::Relaxed),
            Instant::now(),
        );
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        let window = t0.elapsed().as_secs_f64();
        let busy_cpu = (cpu_seconds(pid) - c0) / window;
        let rate = (sent.load(Ordering::Relaxed) - s0) as f64 / window;
        let loaded = commits(&mon, n, 2).await?;

        // One OSD stops heartbeating: how long until the map says it is down.
        let victim = n / 2;
        silent.store(victim, Ordering::Relaxed);
        let t = Instant::now();
        let detected = loop {
            let map = mon.get_map().await?;
            if map.osds.get(&victim).is_some_and(|o| !o.up) {
                break t.elapsed();
            }
            if t.elapsed() > GRACE * 4 {
                bail!("osd.{victim} was not marked down within {:?}", GRACE * 4);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        let map = mon.get_map().await?;
        let spurious = map
            .osds
            .values()
            .filter(|o| !o.up && o.id != victim)
            .count();
        Ok(Obj::new()
            .put("osds", n)
            .put("heartbeats_per_s", round(rate, 1))
            .put("cpu_cores", round(busy_cpu, 3))
            .put("idle_cpu_cores", round(idle_cpu, 3))
            .put_obj("boot_commit_us", lat(&boot))
            .put_obj("commit_us", lat(&loaded))
            .put_obj("baseline_commit_us", lat(&quiet))
            .put(
                "commit_p99_ratio_to_baseline",
                ratio(
                    loaded.value_at_quantile(0.99) as f64,
                    quiet.value_at_quantile(0.99) as f64,
                    2,
                ),
            )
            .put("down_detected_ms", round(detected.as_secs_f64() * 1e3, 0))
            .put("grace_ms", GRACE.as_millis() as u64)
            .put("spurious_downs", spurious))
    })
}
