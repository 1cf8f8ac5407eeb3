//! Live views from two samples of every OSD's totals (`OsdStats`): `cairn osd perf` (per-OSD
//! commit and apply latency, like `ceph osd perf`) and `cairn top` (per-pool and per-volume
//! rates, like `rbd perf image iotop`).

use crate::admin::block_on_mon;
use anyhow::{Context, Result};
use cairn_client::OsdStats;
use cairn_map::ClusterMap;
use cairn_proto::msg::osd::PoolOps;
use clap::Args;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

/// Options of `cairn osd perf` and `cairn top`.
#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// Seconds between the two samples a line's rates and latencies come from.
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
    /// Refreshes to show (0: until interrupted). Default: until interrupted on a terminal,
    /// else one.
    #[arg(long)]
    pub count: Option<u64>,
    /// Print JSON (one object per refresh).
    #[arg(long)]
    pub json: bool,
}

fn parse_interval(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s}: {e}"))?;
    if !(0.1..=3600.0).contains(&v) {
        return Err(format!("{s}: give 0.1 to 3600 seconds"));
    }
    Ok(v)
}

/// One sample of every up OSD's totals.
struct Sample {
    at: Instant,
    osds: BTreeMap<u32, OsdStats>,
}

fn sample(map: &ClusterMap) -> Result<Sample> {
    let stats = crate::admin::block_on(crate::capacity::up_osd_stats(map))?;
    let osds = stats
        .into_iter()
        .filter_map(|(id, r)| r.ok().map(|s| (id, s)))
        .collect();
    Ok(Sample {
        at: Instant::now(),
        osds,
    })
}

/// Per-second rates and mean latencies between two totals of one pool (or one OSD).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Rates {
    pub read_ops: f64,
    pub write_ops: f64,
    pub read_mb: f64,
    pub write_mb: f64,
    pub read_lat_ms: Option<f64>,
    pub write_lat_ms: Option<f64>,
}

fn rates(a: &PoolOps, b: &PoolOps, secs: f64) -> Rates {
    let d = |x: u64, y: u64| y.saturating_sub(x) as f64;
    let (reads, writes) = (d(a.reads, b.reads), d(a.writes, b.writes));
    let mean = |us: f64, n: f64| (n > 0.0).then(|| us / n / 1000.0);
    Rates {
        read_ops: reads / secs,
        write_ops: writes / secs,
        read_mb: d(a.bytes_out, b.bytes_out) / secs / 1e6,
        write_mb: d(a.bytes_in, b.bytes_in) / secs / 1e6,
        read_lat_ms: mean(d(a.read_latency_us, b.read_latency_us), reads),
        write_lat_ms: mean(d(a.write_latency_us, b.write_latency_us), writes),
    }
}

/// The totals of several pools (or OSDs), summed.
pub fn sum_pools<'a>(it: impl Iterator<Item = &'a PoolOps>) -> PoolOps {
    let mut t = PoolOps::default();
    for p in it {
        t.reads += p.reads;
        t.writes += p.writes;
        t.bytes_in += p.bytes_in;
        t.bytes_out += p.bytes_out;
        t.read_latency_us += p.read_latency_us;
        t.write_latency_us += p.write_latency_us;
    }
    t
}

/// An OSD's line of `osd perf`.
#[derive(Debug, serde::Serialize)]
struct OsdPerf {
    osd: u32,
    commit_lat_ms: Option<f64>,
    apply_lat_ms: Option<f64>,
    /// The quickest of its last 64 WAL syncs, and the syncs per second its shards handed to
    /// its syncer thread because that is above their bound (the WAL is on a device).
    wal_sync_floor_us: u64,
    wal_syncs_handed_off_per_s: f64,
    #[serde(flatten)]
    rates: Rates,
}

fn osd_perf_lines(a: &Sample, b: &Sample) -> Vec<OsdPerf> {
    let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
    b.osds
        .iter()
        .filter_map(|(id, sb)| {
            let sa = a.osds.get(id)?;
            let r = rates(
                &sum_pools(sa.pools.iter()),
                &sum_pools(sb.pools.iter()),
                secs,
            );
            let commits = sb.commits.saturating_sub(sa.commits);
            let us = sb.commit_latency_us.saturating_sub(sa.commit_latency_us);
            Some(OsdPerf {
                osd: *id,
                commit_lat_ms: (commits > 0).then(|| us as f64 / commits as f64 / 1000.0),
                apply_lat_ms: r.write_lat_ms,
                wal_sync_floor_us: sb.wal_sync_floor_us,
                wal_syncs_handed_off_per_s: sb
                    .wal_syncs_handed_off
                    .saturating_sub(sa.wal_syncs_handed_off)
                    as f64
                    / secs,
                rates: r,
            })
        })
        .collect()
}

/// The quickest recent WAL sync, marked `*` while syncs go to the syncer thread.
fn wal_sync(l: &OsdPerf) -> String {
    let off = if l.wal_syncs_handed_off_per_s > 0.0 {
        "*"
    } else {
        ""
    };
    format!("{}{off}", l.wal_sync_floor_us)
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// Runs `f` every interval on two consecutive samples, `count` times.
fn refresh(
    conf: Option<&Path>,
    a: &PerfArgs,
    mut f: impl FnMut(&ClusterMap, &Sample, &Sample) -> Result<()>,
) -> Result<()> {
    let mon = crate::admin::mon_client(conf)?;
    let tty = std::io::stdout().is_terminal();
    let count = a.count.unwrap_or(if tty && !a.json { 0 } else { 1 });
    let every = Duration::from_secs_f64(a.interval);
    let mut map = block_on_mon(&mon.addrs(), mon.get_map())??;
    let mut prev = sample(&map)?;
    let mut shown = 0;
    loop {
        std::thread::sleep(every);
        map = block_on_mon(&mon.addrs(), mon.get_map())??;
        let next = sample(&map)?;
        if tty && !a.json && count != 1 {
            print!("\x1b[2J\x1b[H");
        }
        f(&map, &prev, &next)?;
        prev = next;
        shown += 1;
        if count != 0 && shown >= count {
            return Ok(());
        }
    }
}

/// `cairn osd perf`.
pub fn osd_perf(conf: Option<&Path>, a: &PerfArgs) -> Result<()> {
    refresh(conf, a, |_, x, y| {
        let lines = osd_perf_lines(x, y);
        if a.json {
            println!(
                "{}",
                serde_json::json!({ "interval_s": a.interval, "osds": lines })
            );
            return Ok(());
        }
        println!(
            "{:<8} {:>15} {:>14} {:>13} {:>9} {:>9} {:>9} {:>9}",
            "OSD",
            "COMMIT_LAT(ms)",
            "APPLY_LAT(ms)",
            "WAL_SYNC(us)",
            "R_OPS/s",
            "W_OPS/s",
            "R_MB/s",
            "W_MB/s"
        );
        for l in &lines {
            let r = &l.rates;
            println!(
                "osd.{:<4} {:>15} {:>14} {:>13} {:>9.0} {:>9.0} {:>9.1} {:>9.1}",
                l.osd,
                ms(l.commit_lat_ms),
                ms(l.apply_lat_ms),
                wal_sync(l),
                r.read_ops,
                r.write_ops,
                r.read_mb,
                r.write_mb
            );
        }
        Ok(())
    })
}

/// `cairn top`.
pub fn top(conf: Option<&Path>, a: &PerfArgs) -> Result<()> {
    let client = crate::admin::block_on(cairn_client::Client::connect(
        crate::conf::client_config(crate::conf::load(conf)?.cluster.mons),
    ))?
    .context("cannot connect to the cluster")?;
    refresh(conf, a, |map, x, y| {
        let secs = y.at.duration_since(x.at).as_secs_f64().max(1e-3);
        let mut pools = Vec::new();
        for p in map.pools.values() {
            let total = |s: &Sample| {
                sum_pools(
                    s.osds
                        .values()
                        .flat_map(|o| o.pools.iter())
                        .filter(|o| o.pool == p.id),
                )
            };
            pools.push((p.name.clone(), rates(&total(x), &total(y), secs)));
        }
        let mut volumes = Vec::new();
        for p in map.pools.values() {
            let Ok(Ok(list)) = crate::admin::block_on(cairn_volume::rates(&client, &p.name)) else {
                continue;
            };
            for v in list.into_iter().filter(|v| v.holders > 0) {
                volumes.push((p.name.clone(), v));
            }
        }
        volumes.sort_by_key(|(_, v)| std::cmp::Reverse(v.rates.read_ops + v.rates.write_ops));
        if a.json {
            let pools: Vec<_> = pools
                .iter()
                .map(|(name, r)| serde_json::json!({"pool": name, "rates": r}))
                .collect();
            let vols: Vec<_> = volumes
                .iter()
                .map(|(pool, v)| {
                    serde_json::json!({"pool": pool, "volume": v.name, "holders": v.holders,
                        "size_bytes": v.size, "allocated_bytes": v.allocated_bytes,
                        "read_ops": v.rates.read_ops, "write_ops": v.rates.write_ops,
                        "read_bytes": v.rates.read_bytes, "write_bytes": v.rates.write_bytes})
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({"interval_s": a.interval, "pools": pools, "volumes": vols})
            );
            return Ok(());
        }
        println!(
            "{:<16} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}",
            "POOL", "R_OPS/s", "W_OPS/s", "R_MB/s", "W_MB/s", "R_LAT(ms)", "W_LAT(ms)"
        );
        for (name, r) in &pools {
            println!(
                "{:<16} {:>9.0} {:>9.0} {:>9.1} {:>9.1} {:>12} {:>12}",
                name,
                r.read_ops,
                r.write_ops,
                r.read_mb,
                r.write_mb,
                ms(r.read_lat_ms),
                ms(r.write_lat_ms)
            );
        }
        println!();
        println!(
            "{:<28} {:>9} {:>9} {:>9} {:>9}  (as its NBD servers last reported)",
            "VOLUME", "R_OPS/s", "W_OPS/s", "R_MB/s", "W_MB/s"
        );
        for (pool, v) in volumes.iter().take(20) {
            let r = &v.rates;
            println!(
                "{:<28} {:>9} {:>9} {:>9.1} {:>9.1}",
                format!("{pool}/{}", v.name),
                r.read_ops,
                r.write_ops,
                r.read_bytes as f64 / 1e6,
                r.write_bytes as f64 / 1e6
            );
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_mean_latencies_come_from_two_totals() {
        let a = PoolOps {
            pool: 1,
            reads: 100,
            writes: 50,
            bytes_in: 1_000_000,
            bytes_out: 0,
            read_latency_us: 10_000,
            write_latency_us: 5_000,
        };
        let b = PoolOps {
            pool: 1,
            reads: 300,
            writes: 50,
            bytes_in: 3_000_000,
            bytes_out: 4_000_000,
            read_latency_us: 30_000,
            write_latency_us: 5_000,
        };
        let r = rates(&a, &b, 2.0);
        assert_eq!(r.read_ops, 100.0);
        assert_eq!(r.write_ops, 0.0);
        assert_eq!(r.write_mb, 1.0);
        assert_eq!(r.read_mb, 2.0);
        assert_eq!(r.read_lat_ms, Some(0.1));
        assert_eq!(r.write_lat_ms, None);
    }
}
