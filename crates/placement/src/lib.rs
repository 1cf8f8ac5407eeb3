//! cairn-placement: where data lives.
//!
//! Two deterministic maps, both pure functions of their arguments:
//!
//! - object name -> PG: [`object_pg`], from the stable [`object_hash`];
//! - PG -> ordered OSD list: a straw2 draw (as in Ceph's CRUSH) over the [`Hierarchy`]
//!   root -> zones -> racks -> hosts -> OSDs, with replicas spread over distinct failure
//!   domains. Version 2 ([`Placer::pg_osds_tree`]) descends the tree level by level; version 1
//!   ([`pg_osds`], [`Placer::pg_osds`]) draws every OSD at once and is kept for the pools
//!   created before version 2 existed.
//!
//! Every node of the cluster computes placement itself, so the results must be bit-identical
//! on every machine: only integer arithmetic is used (a fixed-point log2 replaces `f64::ln`).
//! The exact algorithm is specified in `docs/format/placement.md`; the test vectors in
//! `testdata/vectors-v1.txt` and `testdata/vectors-v2.txt` pin them, and
//! [`PLACEMENT_VERSION`] names the newest.

use std::collections::BTreeSet;

mod draw;
mod fixed_log;
mod hash;
mod tree;

#[cfg(test)]
mod tests;

/// Newest version of the placement algorithm; a change in any result is a new version (test
/// vectors pin each).
///
/// Version 1: [`object_hash`], [`object_pg`], [`pg_osds`] and [`default_domain`] (the hash
/// constants, the fixed-point log2 table, the flat straw2 draw and its tie-break, the host
/// and OSD failure domains). Version 2 keeps the hashes and the log2 of version 1 and adds
/// the hierarchical draw [`Placer::pg_osds_tree`] with zone and rack domains.
pub const PLACEMENT_VERSION: u32 = 2;

/// Weight of 1.0 in the 16.16 fixed point used for OSD weights.
pub const WEIGHT_ONE: u32 = 0x10000;

/// Stable 32-bit hash of an object name (documented algorithm, must never change within a
/// version): splitmix64-style absorption of the length and 8-byte little-endian chunks.
pub fn object_hash(name: &[u8]) -> u32 {
    hash::object_hash(name)
}

/// PG of an object in a pool with `pg_count` PGs (`pg_count` >= 1; 0 is treated as 1).
///
/// Ceph's "stable mod" of [`object_hash`]: equal to `hash % pg_count` when `pg_count` is a
/// power of two (PGs then hold equal shares), and otherwise folds the hash so that growing
/// `pg_count` only splits PGs instead of reshuffling every object. With a count that is not a
/// power of two, some PGs get twice the objects of others.
pub fn object_pg(name: &[u8], pg_count: u32) -> u32 {
    stable_mod(object_hash(name), pg_count)
}

/// The PG that held PG `pg`'s objects when its pool had `pg_count` PGs (`pg_count` <= the
/// count at which `pg` exists): `pg` itself when `pg < pg_count`, else its ancestor that a
/// split divided. Every object of `pg` was in that PG, because stable mod composes:
/// `stable_mod(stable_mod(h, big), small) == stable_mod(h, small)` for `small <= big`
/// (tested exhaustively for counts up to 129).
pub fn pg_ancestor(pg: u32, pg_count: u32) -> u32 {
    stable_mod(pg, pg_count)
}

/// `x` reduced into `0..n` by masking with the next power of two minus one, and with half of
/// that mask when the first result is `>= n`.
fn stable_mod(x: u32, n: u32) -> u32 {
    if n <= 1 {
        return 0;
    }
    // u64 because the next power of two of n > 2^31 is 2^32.
    let mask = u64::from(n).next_power_of_two() - 1;
    let low = u64::from(x) & mask;
    let folded = if low < u64::from(n) {
        low
    } else {
        low & (mask >> 1)
    };
    // folded < n <= u32::MAX, so the conversion never fails.
    u32::try_from(folded).unwrap_or(0)
}

/// The placement hierarchy: root -> hosts -> OSDs.
///
/// Order does not matter anywhere: hosts are identified by name (two entries with the same
/// name are one host) and OSDs by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// The hosts under the root.
    pub hosts: Vec<HostNode>,
}

/// A host: one failure domain holding OSDs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostNode {
    /// Host name; its identity for the failure domain rule.
    pub name: String,
    /// Rack label ("" = none: every unlabelled host of a zone is in one rack). Version 2 only.
    pub rack: String,
    /// Zone label ("" = none: every unlabelled rack is in one zone). Version 2 only.
    pub zone: String,
    /// The OSDs on this host.
    pub osds: Vec<OsdNode>,
}

/// An OSD in the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsdNode {
    /// OSD id; it is hashed by the draw, so an OSD keeps its PGs whatever else changes.
    pub id: u32,
    /// 16.16 fixed point ([`WEIGHT_ONE`] = 1.0); 0 = out, never chosen.
    pub weight: u32,
}

/// Which replicas must not share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureDomain {
    /// No two replicas of a PG on the same host.
    Host,
    /// Only no two replicas on the same OSD.
    Osd,
    /// No two replicas in one rack (version 2; version 1 treats it as `Host`).
    Rack,
    /// No two replicas in one zone (version 2; version 1 treats it as `Host`).
    Zone,
}

impl FailureDomain {
    /// Every domain, smallest first.
    pub const ALL: [FailureDomain; 4] = [
        FailureDomain::Osd,
        FailureDomain::Host,
        FailureDomain::Rack,
        FailureDomain::Zone,
    ];

    /// Name used by the CLI, the map's JSON and the docs.
    pub fn name(self) -> &'static str {
        match self {
            FailureDomain::Osd => "osd",
            FailureDomain::Host => "host",
            FailureDomain::Rack => "rack",
            FailureDomain::Zone => "zone",
        }
    }

    /// Parses [`FailureDomain::name`].
    pub fn parse(s: &str) -> Option<FailureDomain> {
        FailureDomain::ALL.into_iter().find(|d| d.name() == s)
    }
}

/// Ordered OSD list for a PG (first = primary): up to `size` distinct OSDs drawn by straw2,
/// no two in the same failure domain.
///
/// Returns fewer than `size` only when there are not enough eligible domains/OSDs (never
/// duplicates). Deterministic: depends only on the arguments, not on the order of hosts or
/// OSDs in the vectors. Each replica rank `r` is one straw2 draw: every eligible OSD (weight >
/// 0, not chosen, on a host not yet used when `domain` is [`FailureDomain::Host`]) gets the
/// straw log2(u)/weight with u uniform in (0, 1] from a hash of (pool, pg, OSD id, r), and the
/// highest straw wins. See `docs/format/placement.md`.
///
/// Prepares the hierarchy on every call; to place many PGs use [`Placer`].
pub fn pg_osds(h: &Hierarchy, pool: u32, pg: u32, size: usize, domain: FailureDomain) -> Vec<u32> {
    Placer::new(h).pg_osds(pool, pg, size, domain)
}

/// The failure domain to use by default: Host when the hierarchy has >= 2 hosts with weight,
/// else Osd (a single host can still hold several replicas, on different OSDs).
pub fn default_domain(h: &Hierarchy) -> FailureDomain {
    Placer::new(h).default_domain()
}

/// A [`Hierarchy`] prepared for placing many PGs: the same results as [`pg_osds`] and
/// [`default_domain`], without re-collecting and sorting the OSDs on every call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placer {
    /// Eligible OSDs in the draw's canonical order (version 1).
    cands: Vec<draw::Candidate>,
    /// The weighted tree (version 2).
    tree: tree::Tree,
    /// The tree of every OSD at its own weight, out ones too (EC pools draw them, then
    /// refuse them, so that an OSD going out changes no draw).
    every: tree::Tree,
    /// The OSDs in `every` that are out.
    out: BTreeSet<u32>,
}

impl Placer {
    /// Prepares `h` (O(OSDs log OSDs)).
    pub fn new(h: &Hierarchy) -> Placer {
        Placer::with_out(h, BTreeSet::new())
    }

    /// Prepares `h`, every OSD at its own weight, with the OSDs of `out` out: they hold no
    /// PG, and EC pools still draw them (then refuse them), so that an OSD going out moves
    /// only the shards it held.
    pub fn with_out(h: &Hierarchy, out: BTreeSet<u32>) -> Placer {
        let mut placed = h.clone();
        for host in &mut placed.hosts {
            for o in host.osds.iter_mut().filter(|o| out.contains(&o.id)) {
                o.weight = 0;
            }
        }
        let tree = tree::Tree::new(&placed);
        // With nothing out, both trees are the same.
        let every = match out.is_empty() {
            true => tree.clone(),
            false => tree::Tree::new(h),
        };
        Placer {
            cands: draw::candidates(&placed),
            tree,
            every,
            out,
        }
    }

    /// Placement version 2: ordered OSDs for a PG (first = primary), up to `size`, no two in
    /// one `domain`, drawn by descending zones, racks, hosts and OSDs with one straw2 draw per
    /// level (O(size x (zones + racks per zone + hosts per rack + OSDs per host))). Shorter
    /// than `size` only when fewer domains hold weighted OSDs. See docs/format/placement.md.
    pub fn pg_osds_tree(&self, pool: u32, pg: u32, size: usize, domain: FailureDomain) -> Vec<u32> {
        self.tree.pg_osds(pool, pg, size, domain)
    }

    /// Version 2 for an erasure-coded pool: rank `i` (shard `i`) stays on its OSD unless that
    /// OSD goes out; `None` where no domain is left for the rank (`Tree::pg_osds_indep`).
    pub fn pg_osds_indep(
        &self,
        pool: u32,
        pg: u32,
        size: usize,
        domain: FailureDomain,
    ) -> Vec<Option<u32>> {
        self.every
            .pg_osds_indep((pool, pg, size, domain), &self.out, &self.tree)
    }

    /// Number of `domain`s holding an OSD with weight (version 2): how many copies of a PG
    /// placement can keep apart under that rule.
    pub fn domain_count(&self, domain: FailureDomain) -> usize {
        self.tree.domain_count(domain)
    }

    /// Version 1: [`pg_osds`] over the prepared hierarchy (O(size x OSDs)).
    pub fn pg_osds(&self, pool: u32, pg: u32, size: usize, domain: FailureDomain) -> Vec<u32> {
        let key = hash::DrawKey::new(pool, pg);
        let mut chosen = draw::Chosen::default();
        let mut out = Vec::with_capacity(size.min(self.cands.len()));
        for rank in 0..size {
            // Each rank consumes one candidate, so rank < cands.len() here and fits in u32
            // for any hierarchy that fits in memory; stop rather than wrap if it ever did not.
            let Ok(rank) = u32::try_from(rank) else {
                break;
            };
            let Some(winner) = draw::draw(&self.cands, &chosen, domain, key, rank) else {
                break;
            };
            chosen.push(winner);
            out.push(winner.id);
        }
        out
    }

    /// How many copies of a PG placement can put apart under [`Placer::default_domain`]:
    /// the hosts with weight, or, on a single host, its OSDs with weight.
    pub fn domains(&self) -> (usize, FailureDomain) {
        match self.default_domain() {
            FailureDomain::Osd => (self.cands.len(), FailureDomain::Osd),
            d => (draw::domain_count(&self.cands), d),
        }
    }

    /// [`default_domain`] of the prepared hierarchy.
    pub fn default_domain(&self) -> FailureDomain {
        if draw::domain_count(&self.cands) >= 2 {
            FailureDomain::Host
        } else {
            FailureDomain::Osd
        }
    }
}
