//! `cairn bench objects`: object writes and reads against a running cluster, each workload
//! next to a bare loopback echo of the same payload at the same queue depth (run in the same
//! invocation), with the CPU time all cluster processes spent per op.

use super::echo;
use super::measure::new_hist;
use super::report::{lat, q, ratio, round, Obj};
use super::target::Target;
use crate::admin::pg_counts;
use anyhow::{bail, Context, Result};
use cairn_client::Client;
use cairn_map::Durability;
use clap::Args;
use hdrhistogram::Histogram;
use std::path::Path;
use std::time::{Duration, Instant};

pub const LONG_ABOUT: &str = "\
Benchmark object I/O against a running cluster (found with -c FILE or CAIRN_CONF).

Creates its own pool (size 3 unless --size, durability wal unless --durability), fills a
working set of --objects objects of 1 MiB, then runs for --seconds each, waiting 3 s before
each (so the OSDs finish flushing what the fill or the previous workload wrote outside any
measurement):
  write-4k-qd1   4 KiB writes at random aligned offsets, 1 in flight
  write-4k-qd32  the same, 32 in flight
  read-4k-qd1    4 KiB reads at random aligned offsets, 1 in flight
  read-4k-qd32   the same, 32 in flight
  write-128k-qd8 128 KiB writes at random aligned offsets, 8 in flight
  write-1m-qd8   1 MiB writes of whole objects, 8 in flight (last: it leaves the OSDs
                 flushing for a while)
Each workload is followed by its baseline: a bare request/response echo of the same payload
over loopback TCP at the same queue depth; write-1m-qd8 also measures the data disk
itself (`device`, as in `cairn bench nbd --help`: fio writing 1 MiB at QD8 with O_DIRECT
to files beside the OSDs' data, one job per replica, together, without and with an fdatasync
per 8 writes; the unflushed MB/s over the replicas bounds replicated writes here). Then two connection workloads, one connection
after another (at most 5000), each followed by a bare loopback TCP connect + accept:
  connect-mon    connect, handshake and key authentication to a monitor
  connect-osd    connect, handshake and ticket authentication to an OSD
The pool is removed at the end.

With --frames plain,signed,secure each I/O workload runs once per mode (a client each, 3 s
apart like the workloads; each workload starts with the next mode in turn, since the first
run after another workload pays for what that one left to clean), then its baseline once.

JSON (--json): {\"workloads\": [{\"name\", \"frames\", \"iops\", \"mb_per_s\", \"lat_us\": {p50,p99,p999,max},
\"cpu_us_per_op\" (all monitor and OSD processes), \"client_cpu_us_per_op\",
\"baseline_iops\", \"baseline_lat_us\": {p50,p99,p999,max}, \"ratio_to_baseline\" (IOPS),
\"lat_p50_ratio_to_baseline\", \"iops_ratio_to_plain\" (other modes, when plain ran too),
\"lat_p50_ratio_to_plain\", for write-1m-qd8 \"device\": {\"dir\", \"jobs\", \"mb_per_s\", \"lat_us\",
\"synced_mb_per_s\", \"ceiling_mb_per_s\", \"ratio_to_ceiling\", \"synced_ceiling_mb_per_s\",
\"ratio_to_synced_ceiling\"} or {\"skipped\": why}}, ...]}; a connection workload has {\"name\", \"connections\",
\"per_s\", \"lat_us\", \"baseline_per_s\", \"baseline_lat_us\", \"lat_p50_ratio_to_baseline\"}.
Every read is checked against what was written.";

#[derive(Args)]
pub struct BenchObjectsArgs {
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
    /// Seconds per workload (and per baseline).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Objects of 1 MiB in the working set.
    #[arg(long, default_value_t = 64)]
    pub objects: u32,
    /// Replicas of the bench pool.
    #[arg(long, default_value_t = 3)]
    pub size: u8,
    /// Durability of the bench pool: wal or memory.
    #[arg(long, default_value = "wal")]
    pub durability: String,
    /// Run only the workloads whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// Folder on the data disk for the device measurement of write-1m-qd8 (default: beside
    /// the first local OSD's data).
    #[arg(long, value_name = "DIR")]
    pub device_dir: Option<std::path::PathBuf>,
    /// Do not measure the data disk (it writes a file of at least 1 GiB per replica).
    #[arg(long)]
    pub no_device: bool,
    /// Frame protection modes to run each I/O workload in, comma-separated (plain, signed,
    /// secure), one client each, in the same run; entries say their mode and, with plain
    /// among them, their IOPS ratio to plain. A cluster that requires more gives more.
    #[arg(long, value_name = "MODES", default_value = "plain")]
    pub frames: String,
}

const OBJ_SIZE: u64 = 1 << 20;
/// Pause after filling the working set and between workloads (see `bench`).
const SETTLE: Duration = Duration::from_secs(3);

struct Spec {
    name: &'static str,
    write: bool,
    block: usize,
    qd: usize,
}

/// The 1 MiB writes run last: they leave the OSDs flushing and cleaning for a while, which
/// would otherwise be measured as part of the next workload.
const WORKLOADS: [Spec; 6] = [
    Spec {
        name: "write-4k-qd1",
        write: true,
        block: 4096,
        qd: 1,
    },
    Spec {
        name: "write-4k-qd32",
        write: true,
        block: 4096,
        qd: 32,
    },
    Spec {
        name: "read-4k-qd1",
        write: false,
        block: 4096,
        qd: 1,
    },
    Spec {
        name: "read-4k-qd32",
        write: false,
        block: 4096,
        qd: 32,
    },
    Spec {
        name: "write-128k-qd8",
        write: true,
        block: 128 << 10,
        qd: 8,
    },
    Spec {
        name: "write-1m-qd8",
        write: true,
        block: 1 << 20,
        qd: 8,
    },
];

/// Pids of the cluster's processes: from the `run/` directory beside the configuration
/// (`cairn dev up`), else every `cairn mon` / `cairn osd run` process on the machine.
pub(super) fn cluster_pids(conf: &Path) -> Vec<i32> {
    let run = conf.parent().map(|d| d.join("run"));
    let mut pids = Vec::new();
    if let Some(rd) = run.and_then(|r| std::fs::read_dir(r).ok()) {
        for e in rd.flatten() {
            if let Some(p) = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                pids.push(p);
            }
        }
    }
    if !pids.is_empty() {
        return pids;
    }
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Some(args) = cmdline(pid) else {
            continue;
        };
        let is_cairn = args.first().is_some_and(|a| a.ends_with("cairn"));
        let role = args.get(1).map(String::as_str).unwrap_or_default();
        if is_cairn && (role == "mon" || role == "osd") {
            pids.push(pid);
        }
    }
    pids
}

/// The arguments `pid` was started with (lossy UTF-8), or None when it is gone.
pub(super) fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    // The list ends with a NUL: no empty last argument.
    if args.last().is_some_and(String::is_empty) {
        args.pop();
    }
    Some(args)
}

/// CPU seconds used so far by `pid` (user + system).
pub(super) fn cpu_seconds(pid: i32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(rest) = s.rsplit(')').next() else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based, whole line).
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz
}

pub(super) fn cpu_total(pids: &[i32]) -> f64 {
    pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// CPU seconds the whole host has been busy so far, all CPUs and all processes (fio and the
/// kernel's network work included): the first line of /proc/stat. 0 where it cannot be read.
pub(super) fn host_cpu_seconds() -> f64 {
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| host_busy_ticks(&s))
        .map_or(0.0, |t| t as f64 / hz)
}

/// Busy ticks of the `cpu` line of /proc/stat: user, nice, system, irq and softirq (guest time
/// is inside user; idle, iowait and steal are not this host's work).
fn host_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    (f.len() >= 4).then(|| at(0) + at(1) + at(2) + at(5) + at(6))
}

/// A deterministic pattern for block `b` of object `o`.
fn pattern(o: u32, b: u64, len: usize) -> Vec<u8> {
    let seed = ((o as u64) << 40) ^ (b << 8);
    let word = |i: usize| {
        seed.wrapping_add(i as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .to_le_bytes()
    };
    // Whole words as fixed-size stores: a copy of a run-time length is a call to `memcpy`
    // per 8 bytes, which made checking a read cost the bench client more than the read.
    let mut v = Vec::with_capacity(len + 8);
    (0..len.div_ceil(8)).for_each(|i| v.extend_from_slice(&word(i)));
    v.truncate(len);
    v
}

/// The contents of `len` bytes at `offset` of object `o` (whole 4 KiB blocks).
fn contents(o: u32, offset: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let first = offset / 4096;
    for b in first..first + (len as u64).div_ceil(4096) {
        v.extend_from_slice(&pattern(o, b, 4096));
    }
    v.truncate(len);
    v
}

fn obj_name(o: u32) -> Vec<u8> {
    format!("bench-{o}").into_bytes()
}

struct Run {
    ops: u64,
    bytes: u64,
    elapsed: Duration,
    lat: Histogram<u64>,
}

async fn run_workload(
    client: &Client,
    pool: u32,
    spec: &Spec,
    objects: u32,
    dur: Duration,
) -> Result<Run> {
    let start = Instant::now();
    let end = start + dur;
    let mut tasks = Vec::new();
    for t in 0..spec.qd {
        let client = client.clone();
        let (write, block) = (spec.write, spec.block);
        tasks.push(tokio::spawn(async move {
            let mut h = new_hist();
            let mut ops = 0u64;
            let mut rng = 0x2545_f491_4f6c_dd1du64 ^ ((t as u64) << 32);
            while Instant::now() < end {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let o = (rng % objects as u64) as u32;
                let blocks = OBJ_SIZE / block as u64;
                let b = (rng >> 20) % blocks;
                let name = obj_name(o);
                let t0 = Instant::now();
                let offset = b * block as u64;
                if write {
                    let data = contents(o, offset, block);
                    client.write(pool, &name, offset, &data).await?;
                } else {
                    let got = client.read(pool, &name, offset, block as u64).await?;
                    if got != contents(o, offset, block) {
                        bail!("read of object {o} block {b} returned wrong data");
                    }
                }
                h.record(t0.elapsed().as_nanos() as u64)?;
                ops += 1;
            }
            Ok::<_, anyhow::Error>((ops, h))
        }));
    }
    let mut lat = new_hist();
    let mut ops = 0;
    for t in tasks {
        let (n, h) = t.await.context("bench task panicked")??;
        ops += n;
        lat.add(h)?;
    }
    Ok(Run {
        ops,
        bytes: ops * spec.block as u64,
        elapsed: start.elapsed(),
        lat,
    })
}

/// Writes every object of the working set with the pattern reads check.
async fn fill(client: &Client, pool: u32, objects: u32) -> Result<()> {
    for o in 0..objects {
        let data = contents(o, 0, OBJ_SIZE as usize);
        client.write_full(pool, &obj_name(o), &data).await?;
    }
    Ok(())
}

pub fn run(a: BenchObjectsArgs, conf: Option<&Path>) -> Result<()> {
    let durability = Durability::parse(&a.durability)
        .with_context(|| format!("--durability {:?}: use wal or memory", a.durability))?;
    let dur = Duration::from_secs_f64(a.seconds.max(0.1));
    let modes = a
        .frames
        .split(',')
        .map(|m| crate::daemon_auth::parse_frames(m.trim()).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()
        .context("--frames")?;
    let t = Target::connect(conf)?;
    let pool_name = format!("bench-{}", std::process::id());
    let entries = t.with_pool(&pool_name, a.size, durability, || {
        t.block_on(bench(&t, &pool_name, &a, (dur, &modes)))
    })?;
    println!("{}", Obj::new().put_arr("workloads", &entries).render());
    Ok(())
}

/// A client asking for frame protection `mode` (the configuration's credentials).
async fn client_in(t: &Target, mode: cairn_transport::FrameMode) -> Result<Client> {
    let mut cfg = crate::conf::client_config(t.client.mon().addrs().to_vec());
    cfg.frames = mode;
    Ok(Client::connect(cfg).await?)
}

async fn bench(
    t: &Target,
    pool_name: &str,
    a: &BenchObjectsArgs,
    (dur, modes): (Duration, &[cairn_transport::FrameMode]),
) -> Result<Vec<Obj>> {
    let (client, pids) = (&t.client, &t.pids[..]);
    let mut clients = Vec::new();
    for m in modes {
        clients.push((*m, client_in(t, *m).await?));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let pool = loop {
        let map = client.map();
        if let Some(p) = map.pool_by_name(pool_name) {
            let c = pg_counts(&map, &[]);
            if c.inactive == 0 {
                break p.id;
            }
        }
        if Instant::now() > deadline {
            bail!("the bench pool did not become active within 30 s; check `cairn status`");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if !a.json {
        eprintln!("filling {} objects of 1 MiB...", a.objects);
    }
    fill(client, pool, a.objects).await?;
    // The fill is set-up, not a workload: let the OSDs write it to their data devices before
    // the first measurement instead of measuring that background work as part of it.
    tokio::time::sleep(SETTLE).await;
    let device = super::device::plan(a.device_dir.as_deref(), a.no_device, pids, a.size.into());
    let mut out = Vec::new();
    for spec in WORKLOADS
        .iter()
        .filter(|s| a.only.as_deref().is_none_or(|o| s.name.contains(o)))
    {
        // Each workload starts on quiet OSDs: the flushing and cleaning the previous one left
        // behind is not measured as part of this one.
        if !out.is_empty() {
            tokio::time::sleep(SETTLE).await;
        }
        let (block, qd) = (spec.block, spec.qd);
        let mut runs = Vec::new();
        // The first mode of a workload pays for what earlier workloads left to clean (1 MiB
        // writes after 4 KiB ones, most): each workload starts with the next mode in turn.
        if !out.is_empty() && !clients.is_empty() {
            clients.rotate_left(1);
        }
        for (mode, c) in &clients {
            // Each mode starts on quiet OSDs too, so the writes of one are not measured as
            // the flushing of the next.
            if !runs.is_empty() {
                tokio::time::sleep(SETTLE).await;
            }
            let me = std::process::id() as i32;
            let (c0, m0) = (cpu_total(pids), cpu_seconds(me));
            let r = run_workload(c, pool, spec, a.objects, dur).await?;
            let (c1, m1) = (cpu_total(pids), cpu_seconds(me));
            runs.push((*mode, r, c1 - c0, m1 - m0));
        }
        runs.sort_by_key(|r| r.0);
        let base = tokio::task::spawn_blocking(move || echo::run(block, qd, dur)).await??;
        let disk = match device.clone().filter(|_| spec.block >= 1 << 20) {
            Some(plan) => {
                tokio::time::sleep(SETTLE).await;
                let ws = u64::from(a.objects) * OBJ_SIZE;
                let secs = dur.as_secs_f64();
                Some(
                    tokio::task::spawn_blocking(move || {
                        super::device::measure(&plan, block, qd, ws, (0.0, secs))
                    })
                    .await?,
                )
            }
            None => None,
        };
        if let Some(m) = disk.as_ref().filter(|_| !a.json) {
            eprintln!("{:<14} {}", spec.name, super::device::summary(m));
        }
        let biops = base.ops as f64 / base.elapsed.as_secs_f64();
        let bp50 = q(&base.lat, 0.5);
        let plain = runs
            .iter()
            .find(|r| r.0 == cairn_transport::FrameMode::Plain)
            .map(|(_, r, _, _)| (r.ops as f64 / r.elapsed.as_secs_f64(), q(&r.lat, 0.5)));
        for (mode, r, cluster_cpu, client_cpu) in &runs {
            let iops = r.ops as f64 / r.elapsed.as_secs_f64();
            let per_op = |s: f64| {
                if r.ops > 0 {
                    round(s * 1e6 / r.ops as f64, 1)
                } else {
                    0.0
                }
            };
            let p50 = q(&r.lat, 0.5);
            let mut o = Obj::new()
                .put("name", spec.name)
                .put("frames", mode.to_string())
                .put("qd", qd)
                .put("block_bytes", block)
                .put("ops", r.ops)
                .put("iops", round(iops, 1))
                .put(
                    "mb_per_s",
                    round(r.bytes as f64 / r.elapsed.as_secs_f64() / 1e6, 1),
                )
                .put_obj("lat_us", lat(&r.lat))
                .put("cpu_us_per_op", per_op(*cluster_cpu))
                .put("client_cpu_us_per_op", per_op(*client_cpu))
                .put("baseline_iops", round(biops, 1))
                .put_obj("baseline_lat_us", lat(&base.lat))
                .put("ratio_to_baseline", ratio(iops, biops, 4))
                .put("lat_p50_ratio_to_baseline", ratio(p50, bp50, 3));
            if let Some((piops, pp50)) =
                plain.filter(|_| *mode != cairn_transport::FrameMode::Plain)
            {
                o = o
                    .put("iops_ratio_to_plain", ratio(iops, piops, 4))
                    .put("lat_p50_ratio_to_plain", ratio(p50, pp50, 3));
            }
            if let Some(m) = &disk {
                let mb = r.bytes as f64 / r.elapsed.as_secs_f64() / 1e6;
                o = o.put_obj("device", super::device::report(m, mb));
            }
            if !a.json {
                eprintln!(
                    "{:<14} {:<7} {:>9.0} IOPS  p50 {:>8.1} us  p99 {:>8.1} us  cpu {:>6.1} us/op | echo {:>9.0} IOPS p50 {:>7.1} us",
                    spec.name, mode.to_string(), iops, p50, q(&r.lat, 0.99), per_op(*cluster_cpu), biops, bp50
                );
            }
            out.push(o);
        }
    }
    let keep = |name: &str| a.only.as_deref().is_none_or(|o| name.contains(o));
    out.extend(super::connect::run(client, dur, a.json, keep).await?);
    Ok(out)
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn host_busy_ticks_counts_work_and_not_idle_or_steal() {
        let stat = "cpu  100 2 30 9000 50 4 6 700 0 0\ncpu0 50 1 15 4500 25 2 3 350 0 0\n";
        assert_eq!(host_busy_ticks(stat), Some(100 + 2 + 30 + 4 + 6));
        assert_eq!(host_busy_ticks("cpu0 1 2 3 4\n"), None);
        assert_eq!(host_busy_ticks("cpu  1 x 3 4\n"), None);
    }

    #[test]
    fn cmdline_reads_this_process_arguments_and_none_for_a_gone_one() {
        let own = cmdline(std::process::id() as i32).unwrap_or_default();
        let argv: Vec<String> = std::env::args().collect();
        assert_eq!(own, argv);
        assert_eq!(cmdline(-1), None);
    }

    #[test]
    fn host_cpu_seconds_grow_while_this_process_works() {
        let t0 = host_cpu_seconds();
        let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while std::time::Instant::now() < until {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let t1 = host_cpu_seconds();
        assert!(
            t1 - t0 >= 0.2,
            "host busy time went {t0} -> {t1} over 300 ms of spinning"
        );
    }
}
