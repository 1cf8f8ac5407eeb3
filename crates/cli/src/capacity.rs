//! Capacity as an operator reads it: how full each OSD is, and how much new data a pool can
//! still take with its copies.
//!
//! Placement spreads a pool's data over the OSDs that are in, by weight, so the pool is full
//! when its fullest OSD (relative to its weight) is: usable = min over OSDs of
//! (free / weight share) / raw bytes per byte (the copies; (k + m) / k for an EC pool). The
//! same estimate Ceph shows as MAX AVAIL.

use cairn_map::ClusterMap;
use std::time::Duration;

/// Default fraction of an OSD's capacity at which status warns (`HEALTH_WARN`).
pub const NEARFULL_RATIO: f64 = 0.85;
/// Default fraction at which status reports it full (`HEALTH_ERR`): writes to it soon fail.
pub const FULL_RATIO: f64 = 0.95;

/// One OSD's use as it reported it.
#[derive(Debug, Clone, Copy)]
pub struct OsdUse {
    pub osd: u32,
    pub used: u64,
    pub capacity: u64,
}

impl OsdUse {
    /// Used fraction of its capacity.
    pub fn ratio(&self) -> f64 {
        if self.capacity == 0 {
            return 1.0;
        }
        self.used as f64 / self.capacity as f64
    }
}

/// Bytes of new data a pool storing `raw_per_byte` raw bytes per byte (`Pool::raw_per_byte`)
/// can take, from the OSDs that reported (only those in, with a weight, count); `None` when
/// none did.
pub fn usable(map: &ClusterMap, osds: &[OsdUse], raw_per_byte: f64) -> Option<u64> {
    let placed: Vec<(OsdUse, f64)> = osds
        .iter()
        .filter_map(|u| {
            let w = map.osds.get(&u.osd)?.placement_weight();
            (w > 0).then_some((*u, f64::from(w)))
        })
        .collect();
    let total_w: f64 = placed.iter().map(|(_, w)| w).sum();
    if placed.is_empty() || total_w == 0.0 || raw_per_byte <= 0.0 {
        return None;
    }
    // Counted up to the full ratio, where status reports the OSD full.
    let raw = placed
        .iter()
        .map(|(u, w)| {
            let limit = u.capacity as f64 * FULL_RATIO;
            (limit - u.used as f64).max(0.0) / (w / total_w)
        })
        .fold(f64::INFINITY, f64::min);
    Some((raw / raw_per_byte) as u64)
}

/// What a pool storing `raw_per_byte` raw bytes per byte could hold in all, empty (the base
/// thin overcommit is measured against).
pub fn pool_capacity(map: &ClusterMap, osds: &[OsdUse], raw_per_byte: f64) -> Option<u64> {
    let empty: Vec<OsdUse> = osds.iter().map(|u| OsdUse { used: 0, ..*u }).collect();
    usable(map, &empty, raw_per_byte)
}

/// Default ratio of provisioned volume sizes to a pool's capacity above which status warns.
pub const OVERCOMMIT_RATIO: f64 = 1.0;

/// How long status waits for a pool listing (it must answer even when PGs are stuck).
const LIST_TIMEOUT: Duration = Duration::from_secs(3);

/// Sum of the sizes of each pool's volumes (thin: what they could take if written full), by
/// pool name, or why it could not be found out.
pub async fn provisioned(
    mons: &[String],
    map: &ClusterMap,
) -> std::collections::BTreeMap<String, Result<u64, String>> {
    let mut out = std::collections::BTreeMap::new();
    let mut cfg = crate::conf::client_config(mons.to_vec());
    cfg.op_timeout = LIST_TIMEOUT;
    let client = match cairn_client::Client::connect(cfg).await {
        Ok(c) => c,
        Err(e) => {
            for p in map.pools.values() {
                out.insert(p.name.clone(), Err(e.to_string()));
            }
            return out;
        }
    };
    for p in map.pools.values() {
        let sum = cairn_volume::list(&client, &p.name).await.map(|vols| {
            vols.iter()
                .filter_map(|v| v.header.as_ref().ok())
                .map(|h| h.size)
                .sum()
        });
        out.insert(p.name.clone(), sum.map_err(|e| e.to_string()));
    }
    out
}

/// What every up OSD of `map` answers to `OSD_STATS` (or why it did not).
pub async fn up_osd_stats(
    map: &ClusterMap,
) -> Vec<(
    u32,
    Result<cairn_client::OsdStats, cairn_client::ClientError>,
)> {
    let mut out = Vec::new();
    for o in map.osds.values().filter(|o| o.up) {
        let r =
            cairn_client::osd_stats(&o.addr, &crate::conf::auth(), Duration::from_secs(2)).await;
        out.push((o.id, r));
    }
    out
}

/// The use of the OSDs among `stats` that answered.
pub fn uses_of(
    stats: &[(
        u32,
        Result<cairn_client::OsdStats, cairn_client::ClientError>,
    )],
) -> Vec<OsdUse> {
    stats
        .iter()
        .filter_map(|(id, r)| r.as_ref().ok().map(|s| (*id, s)))
        .map(|(osd, s)| OsdUse {
            osd,
            used: s.used_bytes,
            capacity: s.capacity_bytes,
        })
        .collect()
}

/// The use of every up OSD of `map` that answers (an unreachable one is left out).
pub async fn osd_uses(map: &ClusterMap) -> Vec<OsdUse> {
    uses_of(&up_osd_stats(map).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_map::MapChange;

    fn map(osds: u8) -> ClusterMap {
        let mut m = ClusterMap::new([1; 16]);
        for n in 0..osds {
            m.apply(&MapChange::OsdBoot {
                store_id: [n; 16],
                addr: format!("127.0.0.1:{}", 7000 + n as u16),
                host: "h".into(),
                weight: 0x10000,
            })
            .unwrap();
        }
        m
    }

    fn used(osd: u32, used: u64, capacity: u64) -> OsdUse {
        OsdUse {
            osd,
            used,
            capacity,
        }
    }

    #[test]
    fn the_fullest_osd_limits_what_a_pool_can_take() {
        let m = map(3);
        let g = 1u64 << 30;
        // Three empty 4 GiB OSDs, 3 copies: about 3.8 GiB (95% of 4 GiB).
        let even = [used(0, 0, 4 * g), used(1, 0, 4 * g), used(2, 0, 4 * g)];
        let u = usable(&m, &even, 3.0).unwrap();
        assert_eq!(u, (4.0 * g as f64 * FULL_RATIO) as u64);
        // One OSD half full: it fills first.
        let skewed = [used(0, 2 * g, 4 * g), used(1, 0, 4 * g), used(2, 0, 4 * g)];
        assert!(usable(&m, &skewed, 3.0).unwrap() < u / 2 + g / 8);
        // One copy: three times as much.
        assert_eq!(usable(&m, &even, 1.0).unwrap(), 3 * u);
        // An EC 4+2 pool stores 1.5 raw bytes per byte: twice what size 3 holds.
        assert_eq!(usable(&m, &even, 1.5).unwrap(), 2 * u);
        // An OSD out does not count.
        let mut out = m.clone();
        out.apply(&MapChange::OsdOut { id: 2 }).unwrap();
        assert_eq!(usable(&out, &even, 1.0).unwrap(), 2 * u);
        assert_eq!(usable(&m, &[], 3.0), None);
        // Capacity counts the OSDs as if empty.
        assert_eq!(pool_capacity(&m, &skewed, 3.0), Some(u));
        assert!((used(0, 87, 100).ratio() - 0.87).abs() < 1e-9);
    }
}
