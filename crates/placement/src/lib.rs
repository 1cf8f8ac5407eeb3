//! cairn-placement: where data lives.
//!
//! Two deterministic maps, both pure functions of their arguments:
//!
//! - object name -> PG: [`object_pg`], from the stable [`object_hash`];
//! - PG -> ordered OSD list: [`pg_osds`], a straw2 draw (as in Ceph's CRUSH) over the
//!   [`Hierarchy`] root -> hosts -> OSDs, with replicas spread over distinct failure domains.
//!
//! Every node of the cluster computes placement itself, so the results must be bit-identical
//! on every machine: only integer arithmetic is used (a fixed-point log2 replaces `f64::ln`).
//! The exact algorithm is specified in `docs/format/placement.md`; the test vectors in
//! `testdata/vectors-v1.txt` pin it, and [`PLACEMENT_VERSION`] names it.

mod draw;
mod fixed_log;
mod hash;

#[cfg(test)]
mod tests;

/// Version of the placement algorithm; bump on any change in results (test vectors pin it).
///
/// Covers [`object_hash`], [`object_pg`], [`pg_osds`] and [`default_domain`]: the hash
/// constants, the fixed-point log2 table, the straw2 draw and its tie-break, and the failure
/// domain rules.
pub const PLACEMENT_VERSION: u32 = 1;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNode {
    /// Host name; its identity for the failure domain rule.
    pub name: String,
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
    /// Eligible OSDs in the draw's canonical order.
    cands: Vec<draw::Candidate>,
}

impl Placer {
    /// Prepares `h` (O(OSDs log OSDs)).
    pub fn new(h: &Hierarchy) -> Placer {
        Placer {
            cands: draw::candidates(h),
        }
    }

    /// [`pg_osds`] over the prepared hierarchy (O(size x OSDs)).
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
            FailureDomain::Host => (draw::domain_count(&self.cands), FailureDomain::Host),
            FailureDomain::Osd => (self.cands.len(), FailureDomain::Osd),
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
