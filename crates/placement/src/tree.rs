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
use std::collections::BTreeSet;
use std::ops::Range;

/// Levels below the root, top down.
const LEVELS: usize = 4;
const ZONE: usize = 0;
const RACK: usize = 1;
const HOST: usize = 2;
const OSD: usize = 3;

/// Rounds of independent draws an erasure-coded PG's ranks get before the ones still empty
/// take what is left ([`Tree::pg_osds_indep`]).
const INDEP_ROUNDS: usize = 20;

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

    /// Positional OSDs for an erasure-coded PG: rank `i` holds shard `i`, `None` where no
    /// domain is left for it. `self` is the tree of every OSD at its own weight, in or out;
    /// `out` the OSDs that are out; `fallback` the tree of the OSDs in.
    ///
    /// Unlike [`Tree::pg_osds`], a rank does not draw among the domains the ranks before it
    /// left over (an OSD leaving would then shift every later rank, and every shift is a shard
    /// to rebuild): each rank draws among all domains with its own input (`rank + size *
    /// round`, as Ceph's `indep`), and keeps its draw unless an earlier placed rank holds that
    /// domain; otherwise it draws again in the next round. An out OSD is drawn like any other,
    /// so no draw changes when an OSD goes out: the rank that draws it first (where it would
    /// have kept it) holds its domain for the others, who go on exactly as if it were in, and
    /// draws again only once they are all placed, among what they left. So an OSD going out
    /// moves only the shards it held. Ranks still empty after [`INDEP_ROUNDS`] rounds take the
    /// best domains of `fallback` left, in rank order.
    pub fn pg_osds_indep(
        &self,
        (pool, pg, size, d): (u32, u32, usize, FailureDomain),
        out: &BTreeSet<u32>,
        fallback: &Tree,
    ) -> Vec<Option<u32>> {
        let key = DrawKey::new(pool, pg);
        let d = level(d);
        // Per rank: (domain key, OSD id); an out OSD only in the first phase.
        let mut placed: Vec<Option<(u32, u32)>> = vec![None; size];
        let taken = |placed: &[Option<(u32, u32)>], domain: u32| {
            placed.iter().flatten().any(|p| p.0 == domain)
        };
        let draw_rounds = |placed: &mut Vec<Option<(u32, u32)>>, first: usize, keep_out: bool| {
            for round in first..first + INDEP_ROUNDS {
                for rank in 0..size {
                    if placed[rank].is_some() {
                        continue;
                    }
                    let Some(input) = round
                        .checked_mul(size)
                        .and_then(|x| x.checked_add(rank))
                        .and_then(|x| u32::try_from(x).ok())
                    else {
                        continue;
                    };
                    let Some(path) = self.descend_where(key, input, d, |_| true) else {
                        return;
                    };
                    let domain = self.levels[d][path[d]].key;
                    let osd = self.levels[OSD][path[OSD]].key;
                    if !taken(placed, domain) && (keep_out || !out.contains(&osd)) {
                        placed[rank] = Some((domain, osd));
                    }
                }
                if placed.iter().all(Option::is_some) {
                    return;
                }
            }
        };
        // As if every OSD were in; then the ranks holding an out one draw again.
        draw_rounds(&mut placed, 0, true);
        for p in placed.iter_mut() {
            if p.is_some_and(|(_, osd)| out.contains(&osd)) {
                *p = None;
            }
        }
        draw_rounds(&mut placed, INDEP_ROUNDS, false);
        for rank in 0..size {
            if placed[rank].is_some() {
                continue;
            }
            let Ok(r) = u32::try_from(rank) else { break };
            let free = |i: usize| !taken(&placed, fallback.levels[d][i].key);
            placed[rank] = fallback.descend_where(key, r, d, free).map(|path| {
                (
                    fallback.levels[d][path[d]].key,
                    fallback.levels[OSD][path[OSD]].key,
                )
            });
        }
        placed.iter().map(|p| p.map(|(_, osd)| osd)).collect()
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
        self.descend_where(key, rank, d, |i| chosen.iter().all(|p| p[d] != i))
    }

    /// [`Tree::descend`] among the domain nodes (indices at level `d`) `domain_ok` allows.
    fn descend_where(
        &self,
        key: DrawKey,
        rank: u32,
        d: usize,
        domain_ok: impl Fn(usize) -> bool,
    ) -> Option<[usize; LEVELS]> {
        let mut path = [0; LEVELS];
        let mut range = 0..self.levels[d].len();
        for (lvl, nodes) in self.levels.iter().enumerate().skip(d) {
            let allowed = |i: &usize| lvl > d || domain_ok(*i);
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
    use std::collections::BTreeSet;

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

    /// `n` hosts of one OSD each (ids 0..n), OSD `out` out: (every OSD's tree, its out
    /// set, the tree of the OSDs in).
    fn hosts(n: u32, out: Option<u32>) -> (Tree, BTreeSet<u32>, Tree) {
        let mut h = Hierarchy {
            hosts: (0..n)
                .map(|i| host("z", "r", &format!("h{i}"), &[i]))
                .collect(),
        };
        let all = Tree::new(&h);
        if let Some(o) = out {
            h.hosts[o as usize].osds[0].weight = 0;
        }
        (all, out.into_iter().collect(), Tree::new(&h))
    }

    fn indep(t: &(Tree, BTreeSet<u32>, Tree), pg: u32) -> Vec<Option<u32>> {
        t.0.pg_osds_indep((1, pg, 6, FailureDomain::Host), &t.1, &t.2)
    }

    #[test]
    fn an_ec_pgs_shards_stay_on_their_osds_when_another_leaves() {
        const PGS: u32 = 512;
        let (all, without) = (hosts(8, None), hosts(8, Some(3)));
        let (mut held, mut moved_other) = (0, 0);
        for pg in 0..PGS {
            let (a, b) = (indep(&all, pg), indep(&without, pg));
            let distinct: BTreeSet<u32> = a.iter().flatten().copied().collect();
            assert_eq!(distinct.len(), 6, "pg {pg}: {a:?}");
            assert!(
                b.iter().all(|o| o.is_some_and(|o| o != 3)),
                "pg {pg}: {b:?}"
            );
            for (x, y) in a.iter().zip(&b) {
                match *x {
                    Some(3) => held += 1,
                    _ if x != y => moved_other += 1,
                    _ => {}
                }
            }
        }
        // Every shard osd.3 held moves, and no other (the ordered draw of replicated pools
        // shifts most ranks after osd.3's).
        assert!(held > 0);
        assert!(
            moved_other * 10 <= held,
            "{moved_other} other shards moved, osd.3 held {held}"
        );
    }

    #[test]
    fn an_ec_pg_with_too_few_domains_has_a_hole_and_keeps_the_rest() {
        let (mut moved_other, mut held) = (0, 0);
        for pg in 0..256 {
            // As many hosts as shards: every rank placed, whatever the draws collided on.
            let full = indep(&hosts(6, None), pg);
            assert!(full.iter().all(Option::is_some), "pg {pg}: {full:?}");
            // One host out: one hole, no OSD twice.
            let one_out = indep(&hosts(6, Some(2)), pg);
            assert_eq!(
                one_out.iter().filter(|o| o.is_none()).count(),
                1,
                "{one_out:?}"
            );
            let distinct: BTreeSet<u32> = one_out.iter().flatten().copied().collect();
            assert_eq!(distinct.len(), 5, "pg {pg}: {one_out:?}");
            for (x, y) in full.iter().zip(&one_out) {
                match x {
                    Some(2) => held += 1,
                    _ if x != y => moved_other += 1,
                    _ => {}
                }
            }
        }
        assert!(
            moved_other * 10 <= held,
            "{moved_other} other shards moved, osd.2 held {held}"
        );
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
