//! Placement version 2: the hierarchical straw2 draw (docs/format/placement.md, section 11).
//!
//! The hierarchy has four levels below the root: zones, racks, hosts, OSDs. The failure
//! domain is a level: no two replicas in one node of that level. A replica is drawn in two
//! steps: one straw2 draw among every node of the domain level not used yet (weighted by the
//! OSD weight below it), then a descent from that node, one straw2 draw among its children
//! per level down to an OSD. A PG with the host domain costs (hosts + OSDs per host) straws
//! per replica instead of one per OSD. Levels above the domain are not drawn: a node's weight
//! changing there would move data between nodes that did not change (CRUSH's known cost),
//! while a flat draw among the domain nodes moves only what the changed node gains or loses.

use crate::draw::Straw;
use crate::fixed_log::log2_unit;
use crate::hash::{object_hash, DrawKey};
use crate::{FailureDomain, Hierarchy};
use std::ops::Range;

/// Levels below the root, top down.
const LEVELS: usize = 4;
const ZONE: usize = 0;
const RACK: usize = 1;
const HOST: usize = 2;
const OSD: usize = 3;

/// Level index of a failure domain.
fn level(d: FailureDomain) -> usize {
    match d {
        FailureDomain::Zone => ZONE,
        FailureDomain::Rack => RACK,
        FailureDomain::Host => HOST,
        FailureDomain::Osd => OSD,
    }
}

/// A node of the tree: a bucket (zone, rack, host) or an OSD, always with weight > 0.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    /// What the draw hashes: the OSD id, or the bucket's key (`bucket_key`).
    key: u32,
    /// Sum of the weights of the OSDs below (the OSD's own weight for an OSD).
    weight: u64,
    /// Children: indices into the next level (empty for OSDs).
    children: Range<usize>,
}

/// Stable hash key of a bucket: its level's name, a zero byte, then its labels from the top
/// (a rack is named within its zone, a host by its name alone).
fn bucket_key(parts: &[&str]) -> u32 {
    let mut bytes = Vec::new();
    for p in parts {
        bytes.extend_from_slice(p.as_bytes());
        bytes.push(0);
    }
    object_hash(&bytes)
}

/// The prepared tree: every level's weighted nodes, children contiguous and in canonical
/// order (sorted by labels, OSDs by id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tree {
    levels: [Vec<Node>; LEVELS],
}

/// One OSD with its location, the unit the tree is built from.
type Row<'a> = (&'a str, &'a str, &'a str, u32, u32);

impl Tree {
    /// Builds the tree of the OSDs of `h` with weight > 0. Buckets without such OSDs do not
    /// exist. Hosts with the same (zone, rack, name) are one host; an OSD id that appears
    /// twice is kept once.
    pub fn new(h: &Hierarchy) -> Tree {
        let mut rows: Vec<Row> = Vec::new();
        for host in &h.hosts {
            for o in host.osds.iter().filter(|o| o.weight > 0) {
                rows.push((&host.zone, &host.rack, &host.name, o.id, o.weight));
            }
        }
        rows.sort_unstable();
        // An OSD id listed twice (a broken hierarchy) is kept once, where it sorts first, so
        // that no PG can get it twice.
        let mut seen = std::collections::BTreeSet::new();
        rows.retain(|r| seen.insert(r.3));
        let mut levels: [Vec<Node>; LEVELS] = Default::default();
        let mut prev: Option<Row> = None;
        for row in &rows {
            let (zone, rack, host, id, weight) = *row;
            let new_zone = prev.is_none_or(|p| p.0 != zone);
            let new_rack = new_zone || prev.is_some_and(|p| p.1 != rack);
            let new_host = new_rack || prev.is_some_and(|p| p.2 != host);
            let keys = [
                (new_zone, bucket_key(&["zone", zone])),
                (new_rack, bucket_key(&["rack", zone, rack])),
                (new_host, bucket_key(&["host", host])),
                (true, id),
            ];
            for (lvl, (new, key)) in keys.into_iter().enumerate() {
                if new {
                    let child_start = levels.get(lvl + 1).map_or(0, Vec::len);
                    levels[lvl].push(Node {
                        key,
                        weight: 0,
                        children: child_start..child_start,
                    });
                }
            }
            // Every level now ends with this row's path: add the OSD to each ancestor.
            for lvl in 0..LEVELS {
                let child_len = levels.get(lvl + 1).map_or(0, Vec::len);
                if let Some(n) = levels[lvl].last_mut() {
                    n.weight += u64::from(weight);
                    n.children.end = child_len;
                }
            }
            prev = Some(*row);
        }
        Tree { levels }
    }

    /// Number of failure domains of kind `d` (nodes of that level).
    pub fn domain_count(&self, d: FailureDomain) -> usize {
        self.levels[level(d)].len()
    }

    /// Ordered OSDs for a PG: up to `size` replicas, no two in one node of level `d`.
    pub fn pg_osds(&self, pool: u32, pg: u32, size: usize, d: FailureDomain) -> Vec<u32> {
        let key = DrawKey::new(pool, pg);
        let d = level(d);
        let mut chosen: Vec<[usize; LEVELS]> = Vec::with_capacity(size.min(self.levels[d].len()));
        for rank in 0..size {
            let Ok(rank) = u32::try_from(rank) else {
                break;
            };
            let Some(path) = self.descend(key, rank, d, &chosen) else {
                break;
            };
            chosen.push(path);
        }
        chosen
            .iter()
            .map(|path| self.levels[OSD][path[OSD]].key)
            .collect()
    }

    /// One replica: the path (node index per level from `d` down) of the OSD drawn for
    /// `rank`. Only the domain level excludes: below it, every node of an unused domain is
    /// unused too.
    fn descend(
        &self,
        key: DrawKey,
        rank: u32,
        d: usize,
        chosen: &[[usize; LEVELS]],
    ) -> Option<[usize; LEVELS]> {
        let mut path = [0; LEVELS];
        let mut range = 0..self.levels[d].len();
        for (lvl, nodes) in self.levels.iter().enumerate().skip(d) {
            let allowed = |i: &usize| lvl > d || chosen.iter().all(|p| p[d] != *i);
            let best = if range.len() == 1 {
                // A single child wins whatever its straw: no hash needed.
                range.clone().find(allowed)
            } else {
                let mut best: Option<(usize, Straw)> = None;
                for i in range.clone().filter(allowed) {
                    let n = &nodes[i];
                    let straw = Straw {
                        log2_u: log2_unit(key.hash(n.key, rank)),
                        weight: n.weight,
                    };
                    match best {
                        Some((_, b)) if !straw.beats(b) => {}
                        _ => best = Some((i, straw)),
                    }
                }
                best.map(|(i, _)| i)
            };
            let i = best?;
            path[lvl] = i;
            range = nodes[i].children.clone();
        }
        Some(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostNode, OsdNode, WEIGHT_ONE};

    fn host(zone: &str, rack: &str, name: &str, ids: &[u32]) -> HostNode {
        HostNode {
            name: name.into(),
            rack: rack.into(),
            zone: zone.into(),
            osds: ids
                .iter()
                .map(|&id| OsdNode {
                    id,
                    weight: WEIGHT_ONE,
                })
                .collect(),
        }
    }

    #[test]
    fn tree_counts_every_level() {
        let h = Hierarchy {
            hosts: vec![
                host("z1", "r1", "a", &[0, 1]),
                host("z1", "r1", "b", &[2]),
                host("z1", "r2", "c", &[3, 4, 5]),
                host("z2", "r1", "d", &[6]),
                host("z2", "r1", "e", &[]),
            ],
        };
        let t = Tree::new(&h);
        assert_eq!(t.domain_count(FailureDomain::Zone), 2);
        assert_eq!(
            t.domain_count(FailureDomain::Rack),
            3,
            "r1 in z2 is another rack"
        );
        assert_eq!(t.domain_count(FailureDomain::Host), 4, "e has no OSD");
        assert_eq!(t.domain_count(FailureDomain::Osd), 7);
        assert_eq!(t.levels[ZONE][0].weight, 6 * u64::from(WEIGHT_ONE));
        assert_eq!(
            t.levels[RACK][1].children,
            2..3,
            "rack r2 of z1 holds host c"
        );
        assert_eq!(t.levels[HOST][2].children, 3..6, "host c holds 3 OSDs");
    }

    #[test]
    fn zone_domain_puts_one_copy_per_zone() {
        let h = Hierarchy {
            hosts: vec![
                host("z1", "", "a", &[0, 1]),
                host("z1", "", "b", &[2, 3]),
                host("z2", "", "c", &[4, 5]),
            ],
        };
        let t = Tree::new(&h);
        for pg in 0..200 {
            let set = t.pg_osds(1, pg, 3, FailureDomain::Zone);
            assert_eq!(set.len(), 2, "two zones hold two copies");
            assert_eq!(set.iter().filter(|&&id| id >= 4).count(), 1);
        }
    }
}
