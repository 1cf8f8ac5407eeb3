//! What the dashboard shows, gathered every refresh: `cairn status --json` (run as a
//! command, so the page says exactly what the command does), the map's OSDs and pools with
//! every up OSD's totals (the page computes rates between two snapshots; an EC pool with its
//! PGs by missing shards), and every pool's volumes with the I/O rates their holders report.

use anyhow::{Context, Result};
use cairn_client::Client;
use cairn_map::ClusterMap;
use cairn_monclient::MonClient;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Longest a `status` run may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the data comes from.
pub struct Gatherer {
    pub exe: PathBuf,
    pub conf: PathBuf,
    pub mon: MonClient,
    pub client: Client,
}

impl Gatherer {
    /// One snapshot; each part that failed says why instead of its data.
    pub async fn snapshot(&self) -> Value {
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let status = self
            .status()
            .await
            .unwrap_or_else(|e| json!({"error": format!("{e:#}")}));
        let (osds, pools, volumes) = match self.mon.get_map().await {
            Ok(map) => {
                let stats = crate::capacity::up_osd_stats(&map).await;
                (
                    osds(&map, &stats),
                    pools(&map, &stats),
                    self.volumes(&map).await,
                )
            }
            Err(e) => {
                let e = json!({"error": e.to_string()});
                (e.clone(), e.clone(), e)
            }
        };
        json!({"at_ms": at_ms, "status": status, "osds": osds, "pools": pools,
               "volumes": volumes})
    }

    async fn status(&self) -> Result<Value> {
        let run = tokio::process::Command::new(&self.exe)
            .arg("-c")
            .arg(&self.conf)
            .args(["status", "--json"])
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(STATUS_TIMEOUT, run)
            .await
            .context("`cairn status` took too long")?
            .context("cannot run `cairn status`")?;
        if !out.status.success() {
            anyhow::bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
        }
        serde_json::from_slice(&out.stdout).context("`cairn status --json` printed no JSON")
    }

    async fn volumes(&self, map: &ClusterMap) -> Value {
        let mut out = Vec::new();
        for p in map.pools.values() {
            match cairn_volume::rates(&self.client, &p.name).await {
                Ok(list) => out.extend(list.into_iter().map(|v| {
                    json!({"pool": p.name, "name": v.name, "size_bytes": v.size,
                           "allocated_bytes": v.allocated_bytes,
                           "holders": v.holders, "read_ops": v.rates.read_ops,
                           "write_ops": v.rates.write_ops, "read_bytes": v.rates.read_bytes,
                           "write_bytes": v.rates.write_bytes})
                })),
                Err(e) => out.push(json!({"pool": p.name, "error": e.to_string()})),
            }
        }
        Value::Array(out)
    }
}

type Stats = [(
    u32,
    Result<cairn_client::OsdStats, cairn_client::ClientError>,
)];

fn osds(map: &ClusterMap, stats: &Stats) -> Value {
    let of = |id: u32| stats.iter().find(|(i, _)| *i == id).map(|(_, r)| r);
    map.osds
        .values()
        .map(|o| {
            let mut v = json!({"id": o.id, "host": o.host, "up": o.up, "in": o.in_,
                               "weight": f64::from(o.weight) / 65536.0});
            match of(o.id) {
                Some(Ok(s)) => {
                    let t = crate::perf::sum_pools(s.pools.iter());
                    let ops = t.reads + t.writes;
                    let op_us = t.read_latency_us + t.write_latency_us;
                    v["used_bytes"] = json!(s.used_bytes);
                    v["capacity_bytes"] = json!(s.capacity_bytes);
                    v["ops"] = json!(ops);
                    v["op_latency_us"] = json!(op_us);
                    v["commits"] = json!(s.commits);
                    v["commit_latency_us"] = json!(s.commit_latency_us);
                    v["slow_ops_total"] = json!(s.slow_ops_total);
                    v["pgs_held"] = json!(s.pgs_held);
                }
                Some(Err(e)) => v["error"] = json!(e.to_string()),
                None => {}
            }
            v
        })
        .collect()
}

fn pools(map: &ClusterMap, stats: &Stats) -> Value {
    let placer = map.placer();
    map.pools
        .values()
        .map(|p| {
            let t = crate::perf::sum_pools(
                stats
                    .iter()
                    .filter_map(|(_, r)| r.as_ref().ok())
                    .flat_map(|s| s.pools.iter())
                    .filter(|o| o.pool == p.id),
            );
            let shards = map
                .ec_pgs_by_missing_shards(&placer, p.id)
                .map(|by_missing| crate::admin::ec_shards_line(&by_missing, None));
            json!({"id": p.id, "name": p.name, "size": p.size, "min_size": p.min_size,
                   "kind": p.kind(), "shards": shards,
                   "pg_count": p.pg_count, "reads": t.reads, "writes": t.writes,
                   "bytes_in": t.bytes_in, "bytes_out": t.bytes_out,
                   "read_latency_us": t.read_latency_us, "write_latency_us": t.write_latency_us})
        })
        .collect()
}
