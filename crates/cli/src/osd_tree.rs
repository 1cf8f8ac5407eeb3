//! `cairn osd tree`: the placement hierarchy (zones, racks, hosts and their OSDs) with
//! weights, states and how many PGs each OSD holds (and leads), and each pool's failure
//! domain, so an operator sees the failure domains and the balance in one view.

use anyhow::Result;
use cairn_map::{ClusterMap, HostLocation, PgId};
use cairn_placement::FailureDomain;
use std::collections::BTreeMap;
use std::path::Path;

/// PG copies and primaries per OSD over every pool.
#[derive(Default, Clone, Copy)]
struct Held {
    pgs: u64,
    primaries: u64,
}

fn held(map: &ClusterMap) -> BTreeMap<u32, Held> {
    let h = map.placer();
    let mut out: BTreeMap<u32, Held> = BTreeMap::new();
    for pool in map.pools.values() {
        for pg in 0..pool.pg_count {
            let place = map.pg_placement_in(&h, PgId { pool: pool.id, pg });
            for (i, osd) in place.up_set.iter().enumerate() {
                if *osd == cairn_map::NO_OSD {
                    continue;
                }
                let e = out.entry(*osd).or_default();
                e.pgs += 1;
                if i == 0 {
                    e.primaries += 1;
                }
            }
        }
    }
    out
}

fn weight(w: u64) -> f64 {
    w as f64 / f64::from(cairn_placement::WEIGHT_ONE)
}

fn state(up: bool, lost_at: u64) -> &'static str {
    match (up, lost_at) {
        (true, _) => "up",
        (false, 0) => "down",
        (false, _) => "lost",
    }
}

/// Prints the tree of the cluster's map (JSON with `json`).
pub fn run(conf: Option<&Path>, json: bool) -> Result<()> {
    let map = crate::admin::get_map(conf)?;
    let held = held(&map);
    // Sorted by (zone, rack, host): the tree prints in that order.
    let mut hosts: BTreeMap<(HostLocation, &str), Vec<&cairn_map::OsdInfo>> = BTreeMap::new();
    for o in map.osds.values() {
        let at = map.host_location(&o.host);
        hosts.entry((at, &o.host)).or_default().push(o);
    }
    let placer = map.placer();
    let host_weight = |osds: &[&cairn_map::OsdInfo]| -> u64 {
        osds.iter().map(|o| u64::from(o.placement_weight())).sum()
    };
    if json {
        let hosts: Vec<_> = hosts
            .iter()
            .map(|((at, name), osds)| {
                let w = weight(host_weight(osds));
                let osds: Vec<_> = osds
                    .iter()
                    .map(|o| {
                        let h = held.get(&o.id).copied().unwrap_or_default();
                        serde_json::json!({"id": o.id, "weight": weight(u64::from(o.weight)),
                            "up": o.up, "in": o.in_, "lost": o.lost_at > 0,
                            "pgs": h.pgs, "primary_pgs": h.primaries})
                    })
                    .collect();
                serde_json::json!({"name": name, "rack": at.rack, "zone": at.zone,
                    "weight": w, "osds": osds})
            })
            .collect();
        let domains: serde_json::Map<String, serde_json::Value> = FailureDomain::ALL
            .iter()
            .map(|d| (d.name().to_string(), placer.domain_count(*d).into()))
            .collect();
        let pools: Vec<_> = map
            .pools
            .values()
            .map(|p| {
                let (n, kind) = ClusterMap::failure_domains(&placer, p.rule);
                serde_json::json!({"name": p.name, "size": p.size, "domain": kind, "domains": n,
                    "placement_version": if p.rule == cairn_map::PlacementRule::FlatV1 { 1 } else { 2 },
                    "type": p.type_name()})
            })
            .collect();
        let v = serde_json::json!({"domains": domains, "pools": pools, "hosts": hosts});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<22} {:>8} {:<5} {:<4} {:>6} {:>8}",
        "NAME", "WEIGHT", "STATE", "IN", "PGS", "PRIMARY"
    );
    let total: u64 = map
        .osds
        .values()
        .map(|o| u64::from(o.placement_weight()))
        .sum();
    println!("{:<22} {:>8.2}", "root", weight(total));
    let mut last: Option<&HostLocation> = None;
    for ((at, name), osds) in &hosts {
        if last.is_none_or(|l| l.zone != at.zone) && !at.zone.is_empty() {
            println!("  zone {}", at.zone);
        }
        if last.is_none_or(|l| l != at) && !at.rack.is_empty() {
            println!("   rack {}", at.rack);
        }
        last = Some(at);
        println!("  host {:<15} {:>8.2}", name, weight(host_weight(osds)));
        for o in osds {
            let h = held.get(&o.id).copied().unwrap_or_default();
            println!(
                "    osd.{:<13} {:>8.2} {:<5} {:<4} {:>6} {:>8}",
                o.id,
                weight(u64::from(o.weight)),
                state(o.up, o.lost_at),
                if o.in_ { "in" } else { "out" },
                h.pgs,
                h.primaries
            );
        }
    }
    for p in map.pools.values() {
        let (n, kind) = ClusterMap::failure_domains(&placer, p.rule);
        let kinds = crate::admin::plural(kind);
        let copies = match p.ec() {
            Some(e) => format!("{} shards ({})", p.size, e.describe()),
            None => format!("{} copies", p.size),
        };
        println!(
            "pool {}: {copies} on distinct {kinds} ({n} {kinds} hold in OSDs)",
            p.name
        );
    }
    Ok(())
}
