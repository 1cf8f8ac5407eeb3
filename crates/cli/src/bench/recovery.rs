//! `cairn bench recovery`: how fast a cluster heals after kill -9 of an OSD, how much data
//! delta recovery moves compared with a backfill, and what clients keep of their IOPS.

use super::report::{round, Obj};
use crate::admin::pg_counts;
use anyhow::{bail, Context, Result};
use cairn_client::Client;
use cairn_map::{Durability, MapChange};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const LONG_ABOUT: &str = "\
Benchmark self-healing on a throw-away local cluster this command starts and removes
(--osds OSDs, WALs on /dev/shm, pool size 3 / min_size 2, 64 PGs).

It writes --data bytes in 4 MiB objects, measures client 4 KiB random-write IOPS (--qd in
flight, --seconds) as the baseline, then, killing an OSD with kill -9 (the last one
unless said otherwise):
  delta-under-load   the OSD is down --down-secs while clients write, then restarts: time
                     until every PG is active+clean, bytes recovery moved against the bytes a
                     backfill would copy (what the OSD held), client IOPS while recovering
  delta-under-light-load  the same with clients writing --light-iops writes/s in all
  backfill-idle      the OSD is killed and marked out (no client I/O): time to clean and MB/s
                     (the OSD then comes back and is marked in; the rebalance is waited for)
  backfill-under-load  the same with clients writing, killing the next-to-last OSD (one
                     that did not just take part in a rebalance): time, MB/s, client IOPS
                     while healing
Targets: delta moves < 5% of a backfill; client IOPS while recovering >= 50% of the baseline.
A PG counts as clean when it has `size` OSDs up and no OSD reports it peering or objects left
to recover (polled every 200 ms, confirmed 1 s later).

JSON (--json): {\"data_bytes\", \"baseline_iops\", \"scenarios\": [{\"name\", \"seconds_to_clean\",
\"bytes_moved\", \"recovery_mb_per_s\", \"client_iops\", \"client_iops_ratio\", ...}]}.";

#[derive(Args)]
pub struct BenchRecoveryArgs {
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
    /// Object data written before the failures (4 MiB objects).
    #[arg(long, default_value = "2G", value_parser = crate::size::parse_size, allow_hyphen_values = true)]
    pub data: u64,
    /// OSDs of the cluster (the last one is the one killed).
    #[arg(long, default_value_t = 4)]
    pub osds: u32,
    /// Seconds the OSD stays down in the delta scenario.
    #[arg(long, default_value_t = 30)]
    pub down_secs: u64,
    /// Seconds of the baseline client load.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Client writes in flight.
    #[arg(long, default_value_t = 16)]
    pub qd: usize,
    /// Client writes per second in the light-load delta scenario (a busy VM or two).
    #[arg(long, default_value_t = 500)]
    pub light_iops: u64,
}

const OBJECT: u64 = 4 << 20;
const POOL: &str = "bench-recovery";

pub fn run(a: BenchRecoveryArgs) -> Result<()> {
    if a.osds < 4 {
        bail!("--osds must be at least 4 (pool size 3 plus the one killed)");
    }
    let dir = std::env::temp_dir().join(format!("cairn-bench-recovery.{}", std::process::id()));
    let cluster = DevCluster::up(&dir, a.osds)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(&a, &cluster))
}

async fn bench(a: &BenchRecoveryArgs, c: &DevCluster) -> Result<()> {
    let cfg = crate::conf::load(Some(&c.dir.join("cairn.toml")))?;
    let client = Client::connect(crate::conf::client_config(cfg.cluster.mons)).await?;
    let create = MapChange::PoolCreateRule {
        name: POOL.into(),
        size: 3,
        min_size: 2,
        pg_count: 64,
        durability: Durability::Wal,
        domain: None,
    };
    client.mon().command(create).await?;
    let pool = wait_pool(&client).await?;
    let objects = a.data.div_ceil(OBJECT).max(1);
    let say = |m: String| {
        if !a.json {
            eprintln!("{m}");
        }
    };
    say(format!("writing {objects} objects of 4 MiB"));
    fill(&client, pool, objects).await?;
    wait_clean(&client).await?;
    say(format!("baseline: {} s of 4 KiB writes", a.seconds));
    let load = Load::start(&client, pool, objects, a.qd, None);
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let baseline = load.stop().await;
    let victim = a.osds - 1;
    let mut scenarios = Vec::new();

    for (name, rate) in [
        ("delta-under-load", None),
        ("delta-under-light-load", Some(a.light_iops)),
    ] {
        say(format!("{name}: osd.{victim} down {} s", a.down_secs));
        let held = osd_used(&client, victim).await?;
        let load = Load::start(&client, pool, objects, a.qd, rate);
        c.kill9(victim)?;
        let down_after = wait_down(&client, victim).await?;
        tokio::time::sleep(Duration::from_secs(a.down_secs)).await;
        let mark = Mark::take(&client, &load).await;
        c.restart_missing()?;
        let took = wait_clean(&client).await?;
        let moved = Mark::take(&client, &load).await.since(&mark);
        let during = load.stop().await;
        let while_down = during.ops.saturating_sub(moved.ops);
        scenarios.push(
            scenario(name, took, &moved, baseline.iops, rate)
                .put("client_iops_limit", rate.unwrap_or(0))
                .put("seconds_to_down", round(down_after.as_secs_f64(), 2))
                .put("seconds_down", a.down_secs)
                .put("client_writes_while_down", while_down)
                .put("client_bytes_written_while_down", while_down * 4096)
                .put("backfill_bytes", held)
                .put(
                    "moved_ratio_to_backfill",
                    round(moved.bytes as f64 / held.max(1) as f64, 4),
                ),
        );
    }

    say(format!("backfill-idle: osd.{victim} killed and marked out"));
    scenarios.push(backfill(c, &client, victim, None, baseline.iops).await?);
    say(format!(
        "osd.{victim} back and in: waiting for the rebalance"
    ));
    rejoin(c, &client, victim).await?;

    // Another OSD this time: the rebalance back to osd.{victim} may still be deleting old
    // copies elsewhere; the next-to-last OSD holds only what placement gives it.
    let victim = a.osds - 2;
    say(format!(
        "backfill-under-load: osd.{victim} killed and marked out"
    ));
    let load = Load::start(&client, pool, objects, a.qd, None);
    scenarios.push(backfill(c, &client, victim, Some(&load), baseline.iops).await?);
    load.stop().await;

    let report = Obj::new()
        .put("osds", a.osds)
        .put("data_bytes", objects * OBJECT)
        .put("object_bytes", OBJECT)
        .put("qd", a.qd as u64)
        .put("baseline_iops", round(baseline.iops, 1))
        .put_arr("scenarios", &scenarios);
    println!("{}", report.render());
    Ok(())
}

/// Kills `victim`, marks it out, and measures until the cluster is clean again.
async fn backfill(
    c: &DevCluster,
    client: &Client,
    victim: u32,
    load: Option<&Load>,
    baseline_iops: f64,
) -> Result<Obj> {
    let held = osd_used(client, victim).await?;
    c.kill9(victim)?;
    let down_after = wait_down(client, victim).await?;
    let idle = Load::idle();
    let load = load.unwrap_or(&idle);
    let mark = Mark::take(client, load).await;
    client
        .mon()
        .command(MapChange::OsdOut { id: victim })
        .await?;
    let took = wait_clean(client).await?;
    let moved = Mark::take(client, load).await.since(&mark);
    let name = if load.is_idle() {
        "backfill-idle"
    } else {
        "backfill-under-load"
    };
    Ok(scenario(name, took, &moved, baseline_iops, None)
        .put("seconds_to_down", round(down_after.as_secs_f64(), 2))
        .put("osd_held_bytes", held))
}

/// Restarts `victim`, marks it in and waits until its PGs are back and clean.
async fn rejoin(c: &DevCluster, client: &Client, victim: u32) -> Result<()> {
    c.restart_missing()?;
    client
        .mon()
        .command(MapChange::OsdIn { id: victim })
        .await?;
    wait_clean(client).await?;
    Ok(())
}

/// One scenario's report; the client IOPS ratio is against the baseline, or against
/// `limit` for a rate-limited load.
fn scenario(name: &str, took: Duration, m: &Moved, baseline_iops: f64, limit: Option<u64>) -> Obj {
    let secs = took.as_secs_f64().max(1e-3);
    let iops = m.ops as f64 / secs;
    let before = limit.map_or(baseline_iops, |l| baseline_iops.min(l as f64));
    let mut o = Obj::new()
        .put("name", name)
        .put("seconds_to_clean", round(secs, 2))
        .put("bytes_moved", m.bytes)
        .put("objects_moved", m.objects)
        .put("recovery_mb_per_s", round(m.bytes as f64 / secs / 1e6, 1));
    if m.ops > 0 {
        o = o
            .put("client_iops", round(iops, 1))
            .put("client_iops_ratio", round(iops / before.max(1e-9), 3))
            .put("client_errors", m.errors);
    }
    o
}

/// Writes `objects` objects of 4 MiB, 8 at a time.
async fn fill(client: &Client, pool: u32, objects: u64) -> Result<()> {
    let data = Arc::new(vec![0x5Au8; OBJECT as usize]);
    let mut next = 0u64;
    while next < objects {
        let mut batch = Vec::new();
        for o in next..(next + 8).min(objects) {
            let (client, data) = (client.clone(), data.clone());
            batch.push(tokio::spawn(async move {
                client.write_full(pool, &object_name(o), &data).await
            }));
        }
        next += batch.len() as u64;
        for t in batch {
            t.await.context("a fill task failed")??;
        }
    }
    Ok(())
}

/// The bench pool's id, once the client's map has it.
async fn wait_pool(client: &Client) -> Result<u32> {
    let start = Instant::now();
    loop {
        match client.pool_id(POOL) {
            Ok(id) => return Ok(id),
            Err(e) if start.elapsed() > Duration::from_secs(10) => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn object_name(o: u64) -> Vec<u8> {
    format!("bench-recovery.{o:08}").into_bytes()
}

/// Clients writing 4 KiB at random offsets of random objects until stopped.
struct Load {
    ops: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
}

struct LoadResult {
    ops: u64,
    iops: f64,
}

impl Load {
    /// `qd` writers, as fast as they can (`rate` None) or `rate` writes/s in all.
    fn start(client: &Client, pool: u32, objects: u64, qd: usize, rate: Option<u64>) -> Load {
        let mut l = Load::idle();
        let gap = rate.map(|r| Duration::from_secs_f64(qd.max(1) as f64 / r.max(1) as f64));
        for w in 0..qd.max(1) {
            let (client, ops, errors, stop) = (
                client.clone(),
                l.ops.clone(),
                l.errors.clone(),
                l.stop.clone(),
            );
            l.tasks.push(tokio::spawn(async move {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1);
                let block = vec![0xC3u8; 4096];
                let mut next = tokio::time::Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if let Some(gap) = gap {
                        // No catching up after a stall: the rate is a ceiling.
                        next = (next + gap).max(tokio::time::Instant::now());
                        tokio::time::sleep_until(next).await;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let o = x % objects;
                    let off = (x >> 20) % (OBJECT / 4096) * 4096;
                    match client.write(pool, &object_name(o), off, &block).await {
                        Ok(_) => ops.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
        l
    }

    fn idle() -> Load {
        Load {
            ops: Arc::new(AtomicU64::new(0)),
            errors: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            tasks: Vec::new(),
            started: Instant::now(),
        }
    }

    fn is_idle(&self) -> bool {
        self.tasks.is_empty()
    }

    async fn stop(self) -> LoadResult {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        let ops = self.ops.load(Ordering::Relaxed);
        LoadResult {
            ops,
            iops: ops as f64 / self.started.elapsed().as_secs_f64().max(1e-3),
        }
    }
}

/// Counters at one moment: recovery totals over the OSDs, client ops of a load.
struct Mark {
    bytes: u64,
    objects: u64,
    ops: u64,
    errors: u64,
}

/// What happened between two marks.
struct Moved {
    bytes: u64,
    objects: u64,
    ops: u64,
    errors: u64,
}

impl Mark {
    async fn take(client: &Client, load: &Load) -> Mark {
        let (bytes, objects) = recovery_totals(client).await;
        Mark {
            bytes,
            objects,
            ops: load.ops.load(Ordering::Relaxed),
            errors: load.errors.load(Ordering::Relaxed),
        }
    }

    /// From `earlier` to this mark. An OSD that restarted in between starts its counters
    /// over, so recovery totals are compared with saturation.
    fn since(&self, earlier: &Mark) -> Moved {
        Moved {
            bytes: self.bytes.saturating_sub(earlier.bytes),
            objects: self.objects.saturating_sub(earlier.objects),
            ops: self.ops.saturating_sub(earlier.ops),
            errors: self.errors.saturating_sub(earlier.errors),
        }
    }
}

/// Bytes recovery moved and objects it recovered, summed over the up OSDs (each counts from
/// its start).
pub(super) async fn recovery_totals(client: &Client) -> (u64, u64) {
    let (mut bytes, mut objects) = (0, 0);
    for o in client.map().osds.values().filter(|o| o.up) {
        if let Ok(s) =
            cairn_client::osd_stats(&o.addr, &crate::conf::auth(), Duration::from_secs(2)).await
        {
            bytes += s.recovery_bytes;
            objects += s.recovered_objects;
        }
    }
    (bytes, objects)
}

/// Bytes of object data `osd` holds (what a backfill of it would copy).
pub(super) async fn osd_used(client: &Client, osd: u32) -> Result<u64> {
    let map = client.mon().get_map().await?;
    let addr = map
        .osds
        .get(&osd)
        .map(|o| o.addr.clone())
        .with_context(|| format!("osd.{osd} is not in the map"))?;
    Ok(
        cairn_client::osd_stats(&addr, &crate::conf::auth(), Duration::from_secs(5))
            .await?
            .used_bytes,
    )
}

/// Waits until the monitors mark `osd` down; returns how long that took.
pub(super) async fn wait_down(client: &Client, osd: u32) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let map = client.mon().get_map().await?;
        if map.osds.get(&osd).is_some_and(|o| !o.up) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("osd.{osd} was not marked down within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every PG has all its OSDs and none is peering or recovering (seen twice,
/// 1 s apart); returns the time to the first of the two.
pub(super) async fn wait_clean(client: &Client) -> Result<Duration> {
    wait_until(client, Want::Clean).await
}

/// Waits until every PG serves (active, none peering), some perhaps with OSDs missing.
pub(super) async fn wait_serving(client: &Client) -> Result<Duration> {
    wait_until(client, Want::Serving).await
}

#[derive(Clone, Copy, PartialEq)]
enum Want {
    Clean,
    Serving,
}

async fn wait_until(client: &Client, want: Want) -> Result<Duration> {
    let start = Instant::now();
    // Peering starts when an OSD installs the new map; give that a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut first_clean: Option<Duration> = None;
    loop {
        if start.elapsed() > Duration::from_secs(1800) {
            bail!("the cluster did not become clean within 30 minutes");
        }
        let clean = is_clean(client, want).await?;
        match (clean, first_clean) {
            (true, Some(t)) if start.elapsed() >= t + Duration::from_secs(1) => return Ok(t),
            (true, None) => first_clean = Some(start.elapsed()),
            (true, Some(_)) => {}
            (false, _) => first_clean = None,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn is_clean(client: &Client, want: Want) -> Result<bool> {
    let map = client.mon().get_map().await?;
    let pgs = pg_counts(&map, &[]);
    if (want == Want::Clean && pgs.degraded > 0) || pgs.inactive > 0 {
        return Ok(false);
    }
    for o in map.osds.values().filter(|o| o.up) {
        let settled = |s: &cairn_client::OsdStats| {
            s.peering_pgs == 0 && (want == Want::Serving || s.recovery_pending_objects == 0)
        };
        match cairn_client::osd_stats(&o.addr, &crate::conf::auth(), Duration::from_secs(2)).await {
            Ok(s) if settled(&s) => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// A local cluster started for the benchmark and purged when it ends.
struct DevCluster {
    dir: PathBuf,
    exe: PathBuf,
    osds: u32,
}

impl DevCluster {
    fn up(dir: &Path, osds: u32) -> Result<DevCluster> {
        let c = DevCluster {
            dir: dir.to_path_buf(),
            exe: std::env::current_exe().context("cannot find the cairn binary")?,
            osds,
        };
        c.dev_up()?;
        Ok(c)
    }

    fn dev_up(&self) -> Result<()> {
        let d = self.dir.display().to_string();
        let n = self.osds.to_string();
        let args = [
            "dev",
            "up",
            "--dir",
            &d,
            "--osds",
            &n,
            "--no-nbd",
            "--no-pool",
            "--timeout",
            "120",
        ];
        let out = Command::new(&self.exe).args(args).output()?;
        if !out.status.success() {
            bail!(
                "cairn dev up failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Starts whatever process of the cluster is not running.
    fn restart_missing(&self) -> Result<()> {
        self.dev_up()
    }

    fn kill9(&self, osd: u32) -> Result<()> {
        kill_osd(&self.dir, osd)
    }
}

/// kill -9 of `osd` of the `cairn dev` cluster in `dir` (by its pid file); returns once it is
/// gone.
pub(super) fn kill_osd(dir: &Path, osd: u32) -> Result<()> {
    let p = dir.join("run").join(format!("osd.{osd}.pid"));
    let pid: i32 = std::fs::read_to_string(&p)
        .with_context(|| format!("{}", p.display()))?
        .trim()
        .parse()
        .with_context(|| format!("{} holds no pid", p.display()))?;
    // SAFETY: kill(2) with a pid read from our own cluster's pid file.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        bail!("cannot kill osd.{osd} (pid {pid})");
    }
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && crate::dev::pid_alive(pid) {
        if start.elapsed() > Duration::from_secs(10) {
            bail!("osd.{osd} (pid {pid}) does not die");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let d = self.dir.display().to_string();
        let _ = Command::new(&self.exe)
            .args(["dev", "down", "--dir", &d, "--purge"])
            .output();
    }
}
