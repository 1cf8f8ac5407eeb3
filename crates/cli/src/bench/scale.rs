//! `cairn bench scale`: what a cluster of 100, 300 and 1,000 OSDs costs the map and
//! placement, computed on this machine with real maps (no daemons): placement time for every
//! PG (against a trivial hash placement in the same run), the encoded map and incremental
//! sizes, PG balance, and how many copies move when a host is added or lost (against the
//! ideal fraction).

use super::report::{round, Obj};
use anyhow::{bail, Result};
use cairn_map::{ClusterMap, Durability, Incremental, MapChange, PgId};
use cairn_placement::WEIGHT_ONE;
use clap::Args;
use std::collections::BTreeSet;
use std::time::Instant;

pub const LONG_ABOUT: &str = "\
What the map and placement cost at scale, on real maps built in this process (no daemons):
for 100, 300 and 1,000 OSDs (10 per host) and one pool of --pgs PGs, size 3:
  placement      time to place every PG (one core; placement v2, host domain), and a trivial
                 placement (3 distinct OSDs by hash, no failure domains) of the same PGs as
                 the baseline; placement_v1_ms is the flat draw of pools made before v2
  map            encoded size of the full map, and of the incremental marking one OSD down
  balance        PG copies per OSD: min, mean, max
  host_added     copies that move when a host of 10 OSDs joins, against the ideal fraction
                 (the new host's share of the weight)
  host_lost      copies that move when a host's OSDs are marked out, against the ideal
                 fraction (the copies that host held)
With --mon, also a real monitor process (`--auth none`) with the OSDs simulated by tasks
speaking the real protocol (boot, then a heartbeat per OSD per second over 8 connections, no
data path), for --seconds: the monitor's CPU (cores) under the heartbeats against the same
monitor idle, map commit latency with the heartbeats against without them (OSD weight
changes), the boot commits, and how long after an OSD's heartbeats stop the map marks it
down (against the monitor's grace of 4 s).
Targets (issue 16): 65,536 PGs over 1,000 OSDs placed in < 1 s; map < 1 MiB; incremental
< 1 KiB; movement within 1.2x of ideal; the monitor under 1,000 OSDs < 25% of a core,
commit p99 < 50 ms, a dead OSD down within grace + 1 s.

JSON (--json): {\"pgs\", \"scales\": [{\"osds\", \"hosts\", \"placement_ms\", \"placement_v1_ms\",
\"baseline_placement_ms\", \"ratio_to_baseline\", \"map_bytes\", \"incremental_bytes\",
\"pgs_per_osd\": {min, mean, max}, \"host_added\": {\"moved_fraction\", \"ideal_fraction\",
\"ratio_to_ideal\"}, \"host_lost\": {...}, with --mon \"monitor\": {\"heartbeats_per_s\", \"cpu_cores\",
\"idle_cpu_cores\", \"boot_commit_us\", \"commit_us\", \"baseline_commit_us\" (each {p50, p99, p999, max}),
\"commit_p99_ratio_to_baseline\", \"down_detected_ms\", \"grace_ms\", \"spurious_downs\"}}]}.";

#[derive(Args)]
pub struct BenchScaleArgs {
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
    /// PGs in the pool at every scale.
    #[arg(long, default_value_t = 65_536)]
    pub pgs: u32,
    /// OSD counts to measure (multiples of 10: 10 OSDs per host).
    #[arg(long, value_delimiter = ',', default_value = "100,300,1000")]
    pub osds: Vec<u32>,
    /// Also run a monitor with simulated OSDs at each scale (see above).
    #[arg(long)]
    pub mon: bool,
    /// Seconds of steady heartbeats measured with --mon.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
}

const OSDS_PER_HOST: u32 = 10;
const SIZE: usize = 3;

fn boot(map: &mut ClusterMap, n: u32, host: u32) -> Result<()> {
    let mut store_id = [0u8; 16];
    store_id[..4].copy_from_slice(&n.to_be_bytes());
    let change = MapChange::OsdBoot {
        store_id,
        addr: format!("10.{}.{}.{}:6800", n >> 16, (n >> 8) & 255, n & 255),
        host: format!("host-{host}"),
        weight: WEIGHT_ONE,
    };
    map.apply(&change)?;
    Ok(())
}

fn build(osds: u32, pgs: u32) -> Result<ClusterMap> {
    let mut map = ClusterMap::new([7; 16]);
    for n in 0..osds {
        boot(&mut map, n, n / OSDS_PER_HOST)?;
    }
    map.apply(&MapChange::PoolCreateRule {
        name: "bench".into(),
        size: SIZE as u8,
        min_size: 2,
        pg_count: pgs,
        durability: Durability::Wal,
        domain: None,
    })?;
    Ok(map)
}

/// Every (PG, OSD) copy of pool 1.
fn copies(map: &ClusterMap, pgs: u32) -> BTreeSet<(u32, u32)> {
    let h = map.placer();
    (0..pgs)
        .flat_map(|pg| {
            map.pg_placement_in(&h, PgId { pool: 1, pg })
                .up_set
                .into_iter()
                .map(move |o| (pg, o))
        })
        .collect()
}

/// 3 distinct OSDs by hash: the floor any placement costs.
fn trivial(osds: u32, pg: u32) -> [u32; SIZE] {
    let mut out = [u32::MAX; SIZE];
    let mut r = 0u32;
    for slot in 0..SIZE {
        loop {
            let h = cairn_placement::object_hash(&[pg.to_le_bytes(), r.to_le_bytes()].concat());
            r += 1;
            let o = h % osds;
            if !out[..slot].contains(&o) {
                out[slot] = o;
                break;
            }
        }
    }
    out
}

fn movement(before: &BTreeSet<(u32, u32)>, after: &BTreeSet<(u32, u32)>, ideal: f64) -> Obj {
    let moved = after.difference(before).count() as f64 / before.len().max(1) as f64;
    Obj::new()
        .put("moved_fraction", round(moved, 5))
        .put("ideal_fraction", round(ideal, 5))
        .put("ratio_to_ideal", round(moved / ideal, 3))
}

fn scale(osds: u32, pgs: u32) -> Result<Obj> {
    let mut map = build(osds, pgs)?;
    let h = map.placer();
    let t = Instant::now();
    let mut sink = 0u64;
    for pg in 0..pgs {
        let p = map.pg_placement_in(&h, PgId { pool: 1, pg });
        sink = sink.wrapping_add(u64::from(p.up_set.first().copied().unwrap_or(0)));
    }
    let placement = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let v1_domain = h.default_domain();
    for pg in 0..pgs {
        let set = h.pg_osds(1, pg, SIZE, v1_domain);
        sink = sink.wrapping_add(u64::from(set.first().copied().unwrap_or(0)));
    }
    let placement_v1 = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    for pg in 0..pgs {
        sink = sink.wrapping_add(u64::from(trivial(osds, pg)[0]));
    }
    let baseline = t.elapsed().as_secs_f64() * 1e3;
    std::hint::black_box(sink);

    let map_bytes = cairn_proto::msg::encode(&map).len();
    let down = Incremental {
        epoch: map.epoch + 1,
        change: MapChange::OsdDown { id: 0, up_from: 1 },
    };
    let inc_bytes = cairn_proto::msg::encode(&down).len();

    let before = copies(&map, pgs);
    let mut per_osd = vec![0u64; osds as usize];
    for (_, o) in &before {
        per_osd[*o as usize] += 1;
    }
    let mean = before.len() as f64 / f64::from(osds);
    let balance = Obj::new()
        .put("min", per_osd.iter().min().copied().unwrap_or(0))
        .put("mean", round(mean, 1))
        .put("max", per_osd.iter().max().copied().unwrap_or(0));

    let hosts = osds / OSDS_PER_HOST;
    let mut added = map.clone();
    for n in osds..osds + OSDS_PER_HOST {
        boot(&mut added, n, hosts)?;
    }
    let ideal_add = f64::from(OSDS_PER_HOST) / f64::from(osds + OSDS_PER_HOST);
    let host_added = movement(&before, &copies(&added, pgs), ideal_add);

    let lost_host: Vec<u32> = (0..OSDS_PER_HOST).collect();
    let held = before.iter().filter(|(_, o)| lost_host.contains(o)).count() as f64;
    for id in &lost_host {
        map.apply(&MapChange::OsdOut { id: *id })?;
    }
    let host_lost = movement(&before, &copies(&map, pgs), held / before.len() as f64);

    Ok(Obj::new()
        .put("osds", osds)
        .put("hosts", hosts)
        .put("placement_ms", round(placement, 1))
        .put("placement_v1_ms", round(placement_v1, 1))
        .put("baseline_placement_ms", round(baseline, 1))
        .put(
            "ratio_to_baseline",
            round(placement / baseline.max(1e-9), 2),
        )
        .put("map_bytes", map_bytes)
        .put("incremental_bytes", inc_bytes)
        .put_obj("pgs_per_osd", balance)
        .put_obj("host_added", host_added)
        .put_obj("host_lost", host_lost))
}

pub fn run(a: BenchScaleArgs) -> Result<()> {
    if a.pgs == 0 || a.pgs > cairn_map::MAX_PG_COUNT {
        bail!("--pgs {}: 1 to {}", a.pgs, cairn_map::MAX_PG_COUNT);
    }
    if a.osds.iter().any(|n| *n == 0 || n % OSDS_PER_HOST != 0) {
        bail!("--osds: multiples of {OSDS_PER_HOST} (10 OSDs per host)");
    }
    let mut scales = Vec::new();
    for &n in &a.osds {
        if !a.json {
            eprintln!("{n} OSDs...");
        }
        let mut s = scale(n, a.pgs)?;
        if a.mon {
            s = s.put_obj("monitor", super::scale_mon::run(n, a.pgs, a.seconds)?);
        }
        scales.push(s);
    }
    println!(
        "{}",
        Obj::new()
            .put("pgs", a.pgs)
            .put_arr("scales", &scales)
            .render()
    );
    Ok(())
}
