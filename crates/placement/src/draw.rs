//! The straw2 draw (docs/format/placement.md, sections "Candidates" and "The draw").

use crate::fixed_log::log2_unit;
use crate::hash::DrawKey;
use crate::{FailureDomain, Hierarchy};

/// An OSD that can receive data: weight > 0, with the failure domain (host) it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Candidate {
    /// OSD id (the identity used for hashing and for "already chosen").
    pub id: u32,
    /// Index of the host's name among the distinct host names sorted bytewise, so that it
    /// does not depend on the order of `Hierarchy::hosts`. Hosts with the same name are the
    /// same failure domain.
    pub domain: u32,
    /// 16.16 weight, > 0.
    pub weight: u32,
}

/// The eligible OSDs of `h`, sorted by (id, domain, weight). Sorting makes the draw's
/// tie-break (first best in this order wins) independent of the input order.
pub(crate) fn candidates(h: &Hierarchy) -> Vec<Candidate> {
    let mut names: Vec<&str> = h.hosts.iter().map(|host| host.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut out = Vec::new();
    for host in &h.hosts {
        let domain = domain_index(&names, &host.name);
        for osd in host.osds.iter().filter(|o| o.weight > 0) {
            out.push(Candidate {
                id: osd.id,
                domain,
                weight: osd.weight,
            });
        }
    }
    out.sort_unstable();
    out
}

/// Position of `name` in the sorted, deduplicated `names` (always present by construction).
fn domain_index(names: &[&str], name: &str) -> u32 {
    let idx = names.binary_search(&name).unwrap_or(0);
    // More than 2^32 hosts cannot be built in memory; saturate rather than panic.
    u32::try_from(idx).unwrap_or(u32::MAX)
}

/// Number of distinct failure domains (hosts) among `cands`.
pub(crate) fn domain_count(cands: &[Candidate]) -> usize {
    let mut domains: Vec<u32> = cands.iter().map(|c| c.domain).collect();
    domains.sort_unstable();
    domains.dedup();
    domains.len()
}

/// What earlier replicas of the PG have used up.
#[derive(Debug, Default)]
pub(crate) struct Chosen {
    ids: Vec<u32>,
    domains: Vec<u32>,
}

impl Chosen {
    /// Records a winner.
    pub fn push(&mut self, c: &Candidate) {
        self.ids.push(c.id);
        self.domains.push(c.domain);
    }

    /// Whether `c` may still be drawn: never the same OSD twice, and with the host domain
    /// never a host that already holds a replica.
    fn allows(&self, c: &Candidate, domain: FailureDomain) -> bool {
        if self.ids.contains(&c.id) {
            return false;
        }
        match domain {
            FailureDomain::Osd => true,
            // Version 1 knows hosts only; rack and zone pools always use version 2.
            FailureDomain::Host | FailureDomain::Rack | FailureDomain::Zone => {
                !self.domains.contains(&c.domain)
            }
        }
    }
}

/// One candidate's straw: log2(u) (<= 0) over its weight, kept as a fraction so that the
/// comparison below is exact.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Straw {
    pub log2_u: i64,
    /// > 0: an OSD's 16.16 weight, or a bucket's sum of them (version 2).
    pub weight: u64,
}

impl Straw {
    /// Whether `self` (log2_a / w_a) is strictly greater than `other` (log2_b / w_b).
    /// Cross-multiplied since both weights are > 0: |log2| < 2^38 and w < 2^64, so the
    /// products fit in i128 and no division (nor its rounding) is involved.
    pub fn beats(self, other: Straw) -> bool {
        i128::from(self.log2_u) * i128::from(other.weight)
            > i128::from(other.log2_u) * i128::from(self.weight)
    }
}

/// The straw2 draw for replica `rank`: among the candidates `chosen` allows, the one with the
/// highest straw log2(u)/weight, u from `key.hash(id, rank)` (`key` holds the PG's pool and
/// pg). Ties go to the first in candidate order. `None` when nothing is allowed.
pub(crate) fn draw<'a>(
    cands: &'a [Candidate],
    chosen: &Chosen,
    domain: FailureDomain,
    key: DrawKey,
    rank: u32,
) -> Option<&'a Candidate> {
    let mut best: Option<(&Candidate, Straw)> = None;
    for c in cands.iter().filter(|c| chosen.allows(c, domain)) {
        let straw = Straw {
            log2_u: log2_unit(key.hash(c.id, rank)),
            weight: u64::from(c.weight),
        };
        match best {
            Some((_, best_straw)) if !straw.beats(best_straw) => {}
            _ => best = Some((c, straw)),
        }
    }
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavier_weight_wins_equal_u() {
        let light = Straw {
            log2_u: -100,
            weight: 1,
        };
        let heavy = Straw {
            log2_u: -100,
            weight: 2,
        };
        assert!(heavy.beats(light));
        assert!(!light.beats(heavy));
        assert!(!heavy.beats(heavy), "ties are not wins");
    }

    #[test]
    fn extreme_straws_do_not_overflow() {
        let a = Straw {
            log2_u: -(32i64 << 32),
            weight: u64::MAX,
        };
        let b = Straw {
            log2_u: 0,
            weight: 1,
        };
        assert!(b.beats(a));
        assert!(!a.beats(b));
    }
}
