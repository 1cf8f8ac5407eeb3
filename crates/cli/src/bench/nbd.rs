//! `cairn bench nbd`: fio's nbd engine against a Cairn volume served by `cairn nbd serve`,
//! each workload next to the same fio job against `nbdkit memory` (the protocol-overhead
//! ceiling: an NBD server that keeps everything in RAM) run in the same invocation.

use super::objects::{cpu_total, host_cpu_seconds};
use super::report::{ratio, round, Obj};
use super::target::Target;
use crate::admin::pg_counts;
use anyhow::{bail, Context, Result};
use cairn_client::Client;
use cairn_map::Durability;
use clap::Args;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const LONG_ABOUT: &str = "\
Benchmark block I/O over NBD against a running cluster (found with -c FILE or CAIRN_CONF),
with fio's nbd engine (apt-get install fio nbdkit).

Creates a pool (size 3 unless --size, durability wal) and a volume in it, starts its own
`cairn nbd serve` for it and an `nbdkit memory` server of the same size, fills both with
sequential 1 MiB writes, then runs each workload for --ramp + --seconds against Cairn and then
against nbdkit, measuring only the last --seconds, and waiting 3 s before each (so the OSDs
finish flushing outside any measurement):
  randwrite-4k-qd1     4 KiB random writes, 1 in flight
  randwrite-4k-qd32    the same, 32 in flight (temporal merge on)
  randwrite-4k-qd32-nomerge  the same against a server with temporal merge off
  randread-4k-qd1      4 KiB random reads, 1 in flight
  randread-4k-qd32     the same, 32 in flight
  read-1m-qd8          1 MiB sequential reads, 8 in flight
  write-1m-qd8         1 MiB sequential writes, 8 in flight
The pool (and the volume) are removed at the end. With --ec K+M a second volume of the same
size is made beside it, its data on an erasure-coded pool made for the bench (one shard per
OSD, min_size k+1; `vol create --data-pool`; removed at the end too), filled after the first,
and every workload runs on the replicated volume, then on the EC one, then on nbdkit, in the
same run (each workload's `ec` object, with its ratio to the replicated volume).
With --degraded as well (a `cairn dev` cluster only), after everything else: kill -9 of the
OSD with the highest id; once the monitors mark it down and every PG serves again, the 4 KiB
random reads run again (a read of the lost shard's chunk is decoded from k others) against
the healthy figures of the same run; the whole volume is rewritten with 1 MiB writes (so
every shard the OSD holds is stale); then `cairn dev up --dir DIR` restarts it and the time
until every PG is clean, with the bytes recovery pushed, gives the rebuild rate.

The sequential writes also measure the data disk itself (`device`): fio writes the same
block size at the same depth with O_DIRECT to files beside the OSDs' data (--device-dir), one
job per replica on that file system, together; once without flushes, once with an fdatasync
per depth of writes. A replicated write is written once per replica, so the unflushed MB/s
over the replicas bounds what a client can write through the cluster on this machine.

With --tls, each workload also runs through TLS: fio's nbd engine cannot read a PSK file
(libnbd forbids local files in its URIs), so fio talks plain NBD to an nbdkit nbd-plugin proxy
that connects to a `cairn nbd serve --tls require` with this process's key (as an NBD user).
The same proxy without TLS, in front of the plain server, is the baseline of that pair: the
`tls` object of each workload reports both and `iops_ratio_to_plain` (TLS / plain, through
the same proxy hop).

JSON (--json): {\"workloads\": [{\"name\", \"iops\", \"mb_per_s\", \"lat_us\": {p50, p99, p999},
\"cpu_us_per_op\" (monitors, OSDs and the NBD server), \"host_cpu_us_per_op\" (the whole host's busy
time from /proc/stat, fio, the kernel and everything else running included; both counted from
the end of the ramp, as fio counts operations), \"baseline_iops\", \"baseline_mb_per_s\", \"baseline_host_cpu_us_per_op\",
\"baseline_lat_us\": {p50, p99, p999}, \"ratio_to_baseline\" (IOPS), \"lat_p50_ratio_to_baseline\",
with --tls \"tls\": {\"iops\", \"mb_per_s\", \"lat_us\", \"plain_iops\", \"plain_mb_per_s\", \"plain_lat_us\",
\"iops_ratio_to_plain\"}; write-1m-qd8 also \"device\": {\"dir\", \"jobs\", \"mb_per_s\" (all jobs, no flushes), \"lat_us\",
\"synced_mb_per_s\" (all jobs, fdatasync per depth), \"ceiling_mb_per_s\" (mb_per_s / jobs), \"ratio_to_ceiling\" (the workload's MB/s / ceiling),
\"synced_ceiling_mb_per_s\" (synced_mb_per_s / jobs), \"ratio_to_synced_ceiling\"} or
{\"skipped\": why}}]}; with --snapshots also \"snapshots\": {\"create_ms_no_client\",
\"create_ms_served\", \"first_write_after_snapshot_us\" (one 4 KiB write into each data object,
QD1, right after a snapshot: each copies its object first), \"randwrite_4k_qd1_with_snapshot\",
\"randwrite_4k_qd1_without\" (same run, before the snapshot), \"qd1_p50_ratio_with_to_without\",
\"remove_two_snapshots_ms\"}; with --volumes \"volumes\": {\"victim_randwrite_4k_qd1_alone\",
\"victim_beside_unlimited_neighbour\", \"victim_beside_limited_neighbour\" (each {iops, p50, p99,
p999}), \"neighbour_iops_unlimited\", \"neighbour_limit_iops\", \"neighbour_iops_limited\",
\"neighbour_off_limit_ratio\", \"open_1t_volume_ms\" (with \"open_volume_objects\" objects in a
pool of \"open_pool_volumes\" volumes)}; with --ec each workload's \"ec\": {\"iops\", \"mb_per_s\", \"lat_us\",
\"cpu_us_per_op\", \"host_cpu_us_per_op\", \"ratio_to_replicated\" (IOPS), \"lat_p50_ratio_to_replicated\",
\"ratio_to_baseline\"} and \"ec\": {\"profile\", \"pool\", \"space\" (as \"space\", for the EC volume)}; with --degraded
\"degraded\": {\"osd\" (the one killed), \"osd_held_bytes\", \"seconds_to_down\", \"seconds_to_serving\", \"reads\":
[{\"name\", \"iops\", \"lat_us\", \"healthy_iops\", \"healthy_lat_us\", \"ratio_to_healthy\"}], \"rewrite_1m_qd8\":
{\"bytes\", \"mb_per_s\"}, \"rebuild\": {\"seconds_to_restart\", \"seconds_to_clean\", \"bytes_moved\",
\"objects_moved\", \"rebuild_mb_per_s\", \"osd_held_bytes_after\"}} (the OSD's bytes are of every pool); always
\"space\": {\"volume_bytes\", \"raw_bytes\" (object data the fill added on every up OSD, read after
a 3 s settle), \"raw_bytes_per_byte\"}.";

#[derive(Args)]
pub struct BenchNbdArgs {
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
    /// Seconds per workload (and per baseline), measured after --ramp.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Seconds each workload (and baseline) runs before its measurement starts (fio's
    /// ramp_time): what the step before left running (the fill's flushing and checkpoints,
    /// the previous workload's) is not counted against this one.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub ramp: f64,
    /// Size of the volume (and of the nbdkit disk); all of it is filled first.
    #[arg(long, default_value = "256M", value_parser = crate::size::parse_size, allow_hyphen_values = true)]
    pub volume_size: u64,
    /// Replicas of the bench pool.
    #[arg(long, default_value_t = 3)]
    pub size: u8,
    /// Run only the workloads whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// Also measure each workload over TLS-PSK against the same path without TLS.
    #[arg(long)]
    pub tls: bool,
    /// Also measure snapshots: creation time, the first write to each object after one, and
    /// 4 KiB random writes at QD1 with a snapshot against without (`nbd_snap.rs`).
    #[arg(long)]
    pub snapshots: bool,
    /// Also measure volumes side by side (`nbd_qos.rs`): the bench volume's 4 KiB QD1
    /// writes alone and beside a neighbour volume under QD32 writes, unlimited and limited to
    /// --qos-iops; then the time to open a 1 TiB volume with --open-objects data objects in
    /// a pool of --open-volumes volumes.
    #[arg(long)]
    pub volumes: bool,
    /// Folder on the data disk for the device measurement of the large sequential writes
    /// (default: beside the first local OSD's data).
    #[arg(long, value_name = "DIR")]
    pub device_dir: Option<std::path::PathBuf>,
    /// Do not measure the data disk (it writes a file of the volume's size, at least 1 GiB,
    /// per replica).
    #[arg(long)]
    pub no_device: bool,
    /// The neighbour's IOPS limit in --volumes.
    #[arg(long, default_value_t = 2000)]
    pub qos_iops: u64,
    /// Data objects of the volume opened in --volumes.
    #[arg(long, default_value_t = 10_000)]
    pub open_objects: u64,
    /// Volumes in the pool in --volumes.
    #[arg(long, default_value_t = 100)]
    pub open_volumes: u64,
    /// Also measure a volume whose data is on an erasure-coded pool of this profile (e.g. 2+1,
    /// 4+2; one shard per OSD, min_size k+1), its header on the replicated bench pool: every
    /// workload runs on both volumes in the same run.
    #[arg(long, value_name = "K+M")]
    pub ec: Option<String>,
    /// Stripe unit of the --ec pool.
    #[arg(long, default_value = "16K", value_parser = crate::size::parse_size)]
    pub ec_unit: u64,
    /// With --ec, on a `cairn dev` cluster: last, kill -9 the OSD with the highest id, run the
    /// 4 KiB random reads on the EC volume again with its shards missing (decoded from the
    /// others), rewrite the whole EC volume, then restart the OSD and measure the rebuild of
    /// its shards.
    #[arg(long, requires = "ec")]
    pub degraded: bool,
}

pub(super) struct Spec {
    name: &'static str,
    rw: &'static str,
    bs: usize,
    qd: usize,
    /// Against the server with temporal merge off.
    no_merge: bool,
}

const fn spec(name: &'static str, rw: &'static str, bs: usize, qd: usize) -> Spec {
    Spec {
        name,
        rw,
        bs,
        qd,
        no_merge: false,
    }
}

impl Spec {
    /// The workload of this name.
    pub(super) fn named(name: &str) -> Option<&'static Spec> {
        WORKLOADS.iter().find(|s| s.name == name)
    }
}

const WORKLOADS: [Spec; 7] = [
    spec("randwrite-4k-qd1", "randwrite", 4096, 1),
    spec("randwrite-4k-qd32", "randwrite", 4096, 32),
    Spec {
        no_merge: true,
        ..spec("randwrite-4k-qd32-nomerge", "randwrite", 4096, 32)
    },
    spec("randread-4k-qd1", "randread", 4096, 1),
    spec("randread-4k-qd32", "randread", 4096, 32),
    spec("read-1m-qd8", "read", 1 << 20, 8),
    spec("write-1m-qd8", "write", 1 << 20, 8),
];

pub(super) const SETTLE: Duration = Duration::from_secs(3);
const VOLUME: &str = "bench";
/// With --ec: the volume whose data is on the EC pool, beside [`VOLUME`] in the same run.
pub(super) const EC_VOLUME: &str = "bench-ec";

/// Child processes killed when the bench ends, however it ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_port(port: u16, what: &str, child: &mut Child) -> Result<()> {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited ({st}) before listening");
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("{what} did not listen on port {port} within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn require(tool: &str, package: &str) -> Result<()> {
    match Command::new(tool).arg("--version").output() {
        Ok(_) => Ok(()),
        Err(_) => bail!("{tool} is not installed: apt-get install {package}"),
    }
}

/// Starts `cairn nbd serve` for the bench pool on a free port, with extra arguments.
fn start_cairn_nbd(conf: &Path, pool: &str, extra: &[&str]) -> Result<(Child, u16, String)> {
    let port = crate::dev::free_port()?;
    let exe = std::env::current_exe().context("cannot find the cairn executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("-c")
        .arg(conf)
        .args(["nbd", "serve", "--pool", pool, "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args(extra);
    // Its log beside the cluster's configuration: a failed bench can be read afterwards.
    let log_path = conf
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!("nbd-serve-{port}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("cannot start cairn nbd serve")?;
    wait_port(port, "cairn nbd serve", &mut child)?;
    Ok((child, port, nbd_uri(port, VOLUME)))
}

/// Export `volume` of the `cairn nbd serve` on `port`.
pub(super) fn nbd_uri(port: u16, volume: &str) -> String {
    format!("nbd://127.0.0.1:{port}/{volume}")
}

/// Starts nbdkit on a free loopback port with `plugin_args`; returns it and its URI.
fn start_nbdkit(plugin_args: &[String]) -> Result<(Child, String)> {
    let port = crate::dev::free_port()?;
    let mut child = Command::new("nbdkit")
        .args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(plugin_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start nbdkit")?;
    wait_port(port, "nbdkit", &mut child)?;
    Ok((child, format!("nbd://127.0.0.1:{port}")))
}

/// What one fio run measured.
#[derive(Clone)]
pub struct Fio {
    pub iops: f64,
    pub mb_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub ops: u64,
}

/// Workload `s` against `uri` for --ramp + --seconds.
pub(super) fn timed_fio(uri: &str, s: &Spec, a: &BenchNbdArgs) -> Result<Fio> {
    fio(
        uri,
        s.rw,
        s.bs,
        s.qd,
        a.volume_size,
        Some((a.ramp, a.seconds)),
    )
}

/// [`timed_fio`], with the CPU seconds `pids` and the whole host used while fio measured:
/// sampled when the ramp ends, as fio counts its operations (`total_ios`) from there.
fn fio_with_cpu(uri: &str, s: &Spec, a: &BenchNbdArgs, pids: &[i32]) -> Result<(Fio, f64, f64)> {
    let (ramp, owned) = (a.ramp, pids.to_vec());
    let at_ramp_end = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs_f64(ramp.max(0.0)));
        cpu_now(&owned)
    });
    let r = timed_fio(uri, s, a)?;
    let (p1, h1) = cpu_now(pids);
    let (p0, h0) = at_ramp_end
        .join()
        .map_err(|_| anyhow::anyhow!("the CPU sampling thread panicked"))?;
    Ok((r, p1 - p0, h1 - h0))
}

/// CPU seconds used so far by `pids`, and by the whole host.
fn cpu_now(pids: &[i32]) -> (f64, f64) {
    (cpu_total(pids), host_cpu_seconds())
}

/// A fio result's latency percentiles (us), as JSON.
pub fn lat_us(f: &Fio) -> Obj {
    Obj::new()
        .put("p50", f.p50_us)
        .put("p99", f.p99_us)
        .put("p999", f.p999_us)
}

/// A fio result's IOPS and latency percentiles (us), as JSON.
pub fn lat_obj(f: &Fio) -> Obj {
    Obj::new()
        .put("iops", round(f.iops, 1))
        .put("p50", f.p50_us)
        .put("p99", f.p99_us)
        .put("p999", f.p999_us)
}

/// One fio job; `timed` = (seconds of ramp not measured, seconds measured), or None to run
/// through `size` once.
pub fn fio(
    uri: &str,
    rw: &str,
    bs: usize,
    qd: usize,
    size: u64,
    timed: Option<(f64, f64)>,
) -> Result<Fio> {
    fio_with(uri, rw, bs, qd, size, timed, &[])
}

/// [`fio`] with more fio options.
pub fn fio_with(
    uri: &str,
    rw: &str,
    bs: usize,
    qd: usize,
    size: u64,
    timed: Option<(f64, f64)>,
    extra: &[String],
) -> Result<Fio> {
    let mut cmd = Command::new("fio");
    cmd.args(extra);
    cmd.args([
        "--name=bench",
        "--ioengine=nbd",
        "--lat_percentiles=1",
        "--clat_percentiles=0",
        "--output-format=json",
        "--randrepeat=0",
        "--norandommap",
    ])
    .arg(format!("--uri={uri}"))
    .arg(format!("--rw={rw}"))
    .arg(format!("--bs={bs}"))
    .arg(format!("--iodepth={qd}"))
    .arg(format!("--size={size}"));
    if let Some((ramp, s)) = timed {
        cmd.args([
            "--time_based",
            &format!("--runtime={}ms", (s * 1000.0) as u64),
            &format!("--ramp_time={}ms", (ramp * 1000.0) as u64),
        ]);
    }
    run_fio(&mut cmd, rw, &format!("fio {rw} bs={bs} qd={qd} on {uri}"))
}

/// Runs a fio command given `--output-format=json` and reads the first job's `rw` side
/// (`--group_reporting` sums the jobs into it); `what` names the run in errors.
pub fn run_fio(cmd: &mut Command, rw: &str, what: &str) -> Result<Fio> {
    let out = cmd.output().context("cannot run fio")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let start = stdout.find('{').unwrap_or(0);
    let v: serde_json::Value =
        serde_json::from_str(&stdout[start..]).context("cannot parse fio's JSON output")?;
    let dir = if rw.contains("read") { "read" } else { "write" };
    let j = &v["jobs"][0][dir];
    let pct = |p: &str| j["lat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(Fio {
        iops: j["iops"].as_f64().unwrap_or(0.0),
        mb_per_s: j["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        p50_us: round(pct("50.000000"), 1),
        p99_us: round(pct("99.000000"), 1),
        p999_us: round(pct("99.900000"), 1),
        ops: j["total_ios"].as_u64().unwrap_or(0),
    })
}

pub fn run(a: BenchNbdArgs, conf: Option<&Path>) -> Result<()> {
    require("fio", "fio")?;
    require("nbdkit", "nbdkit")?;
    let t = Target::connect(conf)?;
    let dev_dir = match a.degraded {
        true => Some(super::nbd_ec::dev_dir(&t.conf)?),
        false => None,
    };
    let pool = format!("bench-nbd-{}", std::process::id());
    let ec = match &a.ec {
        Some(km) => Some(ec_pool(km, a.ec_unit, a.degraded)?),
        None => None,
    };
    let run = || {
        t.with_pool(&pool, a.size, Durability::Wal, || {
            let data = ec.as_ref().map(|e| e.name.as_str());
            t.block_on(prepare(&t.client, &pool, a.volume_size, data))?;
            bench(&a, &t, &pool, dev_dir.as_deref())
        })
    };
    let Results {
        entries,
        space,
        ec_space,
        snaps,
        vols,
        degraded,
    } = match &ec {
        Some(e) => t.with_change(e.create.clone(), &e.name, run)?,
        None => run()?,
    };
    let out = Obj::new()
        .put_arr("workloads", &entries)
        .put_obj("space", space);
    let out = match &ec {
        Some(e) => out.put_obj(
            "ec",
            Obj::new()
                .put("profile", e.describe.as_str())
                .put("pool", e.name.as_str())
                .put_obj("space", ec_space.unwrap_or_default()),
        ),
        None => out,
    };
    let out = match snaps {
        Some(s) => out.put_obj("snapshots", s),
        None => out,
    };
    let out = match vols {
        Some(v) => out.put_obj("volumes", v),
        None => out,
    };
    let out = match degraded {
        Some(d) => out.put_obj("degraded", d),
        None => out,
    };
    println!("{}", out.render());
    Ok(())
}

/// Bytes of object data on every up OSD together.
async fn used_on_osds(client: &Client) -> Result<u64> {
    let map = client.mon().get_map().await?;
    let mut total = 0;
    for (id, _) in map.osds.iter().filter(|(_, o)| o.up) {
        total += super::recovery::osd_used(client, *id).await?;
    }
    Ok(total)
}

/// The --ec data pool to create.
struct EcPool {
    name: String,
    describe: String,
    create: cairn_map::MapChange,
}

fn ec_pool(km: &str, unit: u64, degraded: bool) -> Result<EcPool> {
    let unit = u32::try_from(unit).context("--ec-unit is too large")?;
    let p = cairn_ec::Profile::parse(km, unit).with_context(|| format!("--ec {km}"))?;
    if degraded && p.m() < 2 {
        bail!(
            "--degraded needs the EC pool to stay active with one OSD down, and its min_size is              k+1: give a profile with m >= 2 (e.g. --ec 4+2), not {km}"
        );
    }
    let name = format!("bench-nbd-ec-{}", std::process::id());
    let profile = cairn_map::EcProfile {
        k: p.k() as u8,
        m: p.m() as u8,
        stripe_unit: p.unit(),
    };
    let create = cairn_map::MapChange::PoolCreateEc {
        name: name.clone(),
        profile,
        min_size: (p.k() + 1) as u8,
        pg_count: 64,
        durability: Durability::Wal,
        domain: Some(cairn_map::Domain::Osd),
    };
    Ok(EcPool {
        name,
        describe: format!("{}+{}, unit {} KiB", p.k(), p.m(), p.unit() >> 10),
        create,
    })
}

async fn prepare(client: &Client, pool: &str, size: u64, data_pool: Option<&str>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let map = client.map();
        let data_there = data_pool.is_none_or(|d| map.pool_by_name(d).is_some());
        if map.pool_by_name(pool).is_some() && data_there && pg_counts(&map, &[]).inactive == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the bench pool did not become active within 30 s; check `cairn status`");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let os = cairn_volume::DEFAULT_OBJECT_SIZE;
    cairn_volume::create_with(client, pool, VOLUME, size, os, None).await?;
    if let Some(d) = data_pool {
        cairn_volume::create_with(client, pool, EC_VOLUME, size, os, Some(d)).await?;
    }
    Ok(())
}

/// CPU microseconds per op: `secs` of CPU over `ops` operations.
fn per_op(secs: f64, ops: u64) -> f64 {
    if ops > 0 {
        round(secs * 1e6 / ops as f64, 1)
    } else {
        0.0
    }
}

/// `o` with one fio run's IOPS, MB/s, latencies and the CPU per op of the processes
/// measured (`cpu` seconds) and of the whole host (`host_cpu`).
fn with_run(o: Obj, f: &Fio, cpu: f64, host_cpu: f64) -> Obj {
    o.put("iops", round(f.iops, 1))
        .put("mb_per_s", round(f.mb_per_s, 1))
        .put_obj("lat_us", lat_us(f))
        .put("cpu_us_per_op", per_op(cpu, f.ops))
        .put("host_cpu_us_per_op", per_op(host_cpu, f.ops))
}

/// Fills `volume` (at `uri`) with sequential 1 MiB writes; returns the bytes that took on the
/// OSDs.
fn fill(t: &Target, a: &BenchNbdArgs, uri: &str, volume: &str) -> Result<Obj> {
    let before = t.block_on(used_on_osds(&t.client))?;
    fio(uri, "write", 1 << 20, 8, a.volume_size, None)?;
    std::thread::sleep(SETTLE);
    let raw = t.block_on(used_on_osds(&t.client))?.saturating_sub(before);
    if !a.json {
        eprintln!(
            "filling {volume} took {raw} bytes on the OSDs: {:.3} per byte written",
            raw as f64 / a.volume_size.max(1) as f64
        );
    }
    Ok(Obj::new()
        .put("volume_bytes", a.volume_size)
        .put("raw_bytes", raw)
        .put(
            "raw_bytes_per_byte",
            ratio(raw as f64, a.volume_size as f64, 3),
        ))
}

/// What one run measured.
struct Results {
    /// The workloads.
    entries: Vec<Obj>,
    /// The space the fill took.
    space: Obj,
    /// With --ec, the space the EC volume's fill took.
    ec_space: Option<Obj>,
    /// With --snapshots.
    snaps: Option<Obj>,
    /// With --volumes.
    vols: Option<Obj>,
    /// With --degraded.
    degraded: Option<Obj>,
}

fn bench(a: &BenchNbdArgs, t: &Target, pool: &str, dev_dir: Option<&Path>) -> Result<Results> {
    let (conf, pids) = (t.conf.as_path(), t.pids.as_slice());
    let (merge_srv, merge_port, cairn_uri) = start_cairn_nbd(conf, pool, &[])?;
    let (plain_srv, plain_port, plain_uri) =
        start_cairn_nbd(conf, pool, &["--merge-threshold", "0"])?;
    let ec_uris = a.ec.as_ref().map(|_| {
        (
            nbd_uri(merge_port, EC_VOLUME),
            nbd_uri(plain_port, EC_VOLUME),
        )
    });
    let (kit, kit_uri) = start_nbdkit(&["memory".into(), a.volume_size.to_string()])?;
    let servers = [merge_srv.id() as i32, plain_srv.id() as i32];
    let kit_pid = kit.id() as i32;
    let mut children = Children(vec![merge_srv, plain_srv, kit]);
    let tls = match a.tls {
        true => Some(TlsPair::start(conf, pool, merge_port, &mut children)?),
        false => None,
    };
    if !a.json {
        eprintln!(
            "filling the volume and the nbdkit disk ({} bytes each)...",
            a.volume_size
        );
    }
    fio(&kit_uri, "write", 1 << 20, 8, a.volume_size, None)?;
    let space = fill(t, a, &cairn_uri, VOLUME)?;
    let ec_space = match &ec_uris {
        Some((uri, _)) => Some(fill(t, a, uri, EC_VOLUME)?),
        None => None,
    };
    let device = super::device::plan(a.device_dir.as_deref(), a.no_device, pids, a.size.into());
    let mut out = Vec::new();
    let mut ec_reads = Vec::new();
    for s in WORKLOADS
        .iter()
        .filter(|s| a.only.as_deref().is_none_or(|o| s.name.contains(o)))
    {
        std::thread::sleep(SETTLE);
        let uri = if s.no_merge { &plain_uri } else { &cairn_uri };
        let measured: Vec<i32> = pids.iter().chain(&servers).copied().collect();
        let (r, cpu, host_cpu) = fio_with_cpu(uri, s, a, &measured)?;
        let ec = match &ec_uris {
            Some((merge, plain)) => {
                std::thread::sleep(SETTLE);
                let uri = if s.no_merge { plain } else { merge };
                let (x, cpu, host_cpu) = fio_with_cpu(uri, s, a, &measured)?;
                Some((x, cpu, host_cpu))
            }
            None => None,
        };
        let (b, kit_cpu, kit_host_cpu) = fio_with_cpu(&kit_uri, s, a, &[kit_pid])?;
        let o = Obj::new()
            .put("name", s.name)
            .put("qd", s.qd)
            .put("block_bytes", s.bs);
        let o = with_run(o, &r, cpu, host_cpu)
            .put("baseline_iops", round(b.iops, 1))
            .put("baseline_mb_per_s", round(b.mb_per_s, 1))
            .put_obj("baseline_lat_us", lat_us(&b))
            .put("baseline_cpu_us_per_op", per_op(kit_cpu, b.ops))
            .put("baseline_host_cpu_us_per_op", per_op(kit_host_cpu, b.ops))
            .put("ratio_to_baseline", ratio(r.iops, b.iops, 4))
            .put("lat_p50_ratio_to_baseline", ratio(r.p50_us, b.p50_us, 3));
        let o = match ec {
            Some((x, cpu, host_cpu)) => {
                if !a.json {
                    eprintln!(
                        "{:<26} {:>8.0} IOPS {:>7.1} MB/s p50 {:>8.1} us p99 {:>8.1} us on the EC volume",
                        s.name, x.iops, x.mb_per_s, x.p50_us, x.p99_us
                    );
                }
                let e = with_run(Obj::new(), &x, cpu, host_cpu)
                    .put("ratio_to_replicated", ratio(x.iops, r.iops, 3))
                    .put("lat_p50_ratio_to_replicated", ratio(x.p50_us, r.p50_us, 3))
                    .put("ratio_to_baseline", ratio(x.iops, b.iops, 4));
                if s.rw == "randread" {
                    ec_reads.push((s.name, x));
                }
                o.put_obj("ec", e)
            }
            None => o,
        };
        let o = match &tls {
            Some(pair) => o.put_obj("tls", pair.measure(s, a)?),
            None => o,
        };
        let o = match device.as_ref().filter(|_| s.rw == "write") {
            Some(plan) => {
                let timing = (a.ramp, a.seconds);
                let m = super::device::measure(plan, s.bs, s.qd, a.volume_size, timing);
                if !a.json {
                    eprintln!("{:<26} {}", s.name, super::device::summary(&m));
                }
                o.put_obj("device", super::device::report(&m, r.mb_per_s))
            }
            None => o,
        };
        if !a.json {
            eprintln!(
                "{:<26} {:>8.0} IOPS {:>7.1} MB/s p50 {:>8.1} us p99 {:>8.1} us | nbdkit {:>8.0} IOPS p50 {:>7.1} us",
                s.name, r.iops, r.mb_per_s, r.p50_us, r.p99_us, b.iops, b.p50_us
            );
        }
        out.push(o);
    }
    let snaps = match a.snapshots {
        true => Some(
            super::nbd_snap::SnapBench {
                t,
                pool,
                volume: VOLUME,
                uri: &cairn_uri,
                size: a.volume_size,
                ramp: a.ramp,
                seconds: a.seconds,
                json: a.json,
            }
            .run()?,
        ),
        false => None,
    };
    let vols = match a.volumes {
        true => Some(
            super::nbd_qos::VolumeBench {
                t,
                pool,
                uri: &cairn_uri,
                victim_size: a.volume_size,
                ramp: a.ramp,
                seconds: a.seconds,
                qos_iops: a.qos_iops,
                open_objects: a.open_objects,
                open_volumes: a.open_volumes,
                json: a.json,
            }
            .run()?,
        ),
        false => None,
    };
    let degraded = match (dev_dir, &ec_uris) {
        (Some(dir), Some((uri, _))) => Some(
            super::nbd_ec::Degraded {
                t,
                a,
                dir,
                uri,
                healthy: &ec_reads,
            }
            .run()?,
        ),
        _ => None,
    };
    Ok(Results {
        entries: out,
        space,
        ec_space,
        snaps,
        vols,
        degraded,
    })
}

/// fio through an nbdkit nbd-plugin proxy, to a TLS-requiring server and (the baseline) to
/// the plain one: the only difference between the two paths is TLS.
struct TlsPair {
    plain_uri: String,
    tls_uri: String,
    /// The PSK file; removed on drop.
    psk: std::path::PathBuf,
}

impl TlsPair {
    fn start(conf: &Path, pool: &str, plain_port: u16, children: &mut Children) -> Result<TlsPair> {
        let me = crate::conf::own_key()
            .context("--tls needs this process's key (the cluster runs without authentication)")?;
        let psk = std::env::temp_dir().join(format!("cairn-bench-nbd-{}.psk", std::process::id()));
        let line = format!(
            "{}:{}\n",
            me.entity(),
            cairn_auth::nbd_psk(&me.current()).to_hex()
        );
        cairn_auth::write_private(&psk, line.as_bytes())
            .with_context(|| format!("cannot write {}", psk.display()))?;
        let (tls_srv, tls_port, _) = start_cairn_nbd(conf, pool, &["--tls", "require"])?;
        children.0.push(tls_srv);
        let proxy = |port: u16, tls: bool| {
            let mut args = vec![
                "nbd".to_string(),
                "hostname=127.0.0.1".into(),
                format!("port={port}"),
                format!("export={VOLUME}"),
            ];
            if tls {
                args.push("tls=require".into());
                args.push(format!("tls-psk={}", psk.display()));
                args.push(format!("tls-username={}", me.entity()));
            }
            start_nbdkit(&args)
        };
        let (plain_proxy, plain_uri) = proxy(plain_port, false)?;
        children.0.push(plain_proxy);
        let (tls_proxy, tls_uri) = proxy(tls_port, true)?;
        children.0.push(tls_proxy);
        Ok(TlsPair {
            plain_uri,
            tls_uri,
            psk,
        })
    }

    fn measure(&self, s: &Spec, a: &BenchNbdArgs) -> Result<Obj> {
        let run = |uri: &str| {
            std::thread::sleep(SETTLE);
            timed_fio(uri, s, a)
        };
        let plain = run(&self.plain_uri)?;
        let tls = run(&self.tls_uri)?;
        Ok(Obj::new()
            .put("iops", round(tls.iops, 1))
            .put("mb_per_s", round(tls.mb_per_s, 1))
            .put_obj("lat_us", lat_us(&tls))
            .put("plain_iops", round(plain.iops, 1))
            .put("plain_mb_per_s", round(plain.mb_per_s, 1))
            .put_obj("plain_lat_us", lat_us(&plain))
            .put("iops_ratio_to_plain", ratio(tls.iops, plain.iops, 4)))
    }
}

impl Drop for TlsPair {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.psk);
    }
}
