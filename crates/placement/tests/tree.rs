//! Properties of placement version 2 (the hierarchical draw, `Placer::pg_osds_tree`):
//! failure domains at every level, weights honoured through the levels, minimal movement,
//! independence from input order, and arbitrary input handled.

mod common;

use cairn_placement::*;
use common::shuffle;
use proptest::prelude::*;
use std::collections::BTreeSet;

const W: u32 = WEIGHT_ONE;

/// A host as (zone index, rack index, OSD weights).
type HostSpec = (u8, u8, Vec<u32>);

/// Hosts "h<i>" in zone "z<zone>", rack "r<rack>"; OSD ids in order from 0.
fn build(specs: &[HostSpec]) -> Hierarchy {
    let mut next = 0;
    let hosts = specs
        .iter()
        .enumerate()
        .map(|(i, (zone, rack, ws))| HostNode {
            name: format!("h{i}"),
            rack: format!("r{rack}"),
            zone: format!("z{zone}"),
            osds: ws
                .iter()
                .map(|&weight| {
                    next += 1;
                    OsdNode {
                        id: next - 1,
                        weight,
                    }
                })
                .collect(),
        })
        .collect();
    Hierarchy { hosts }
}

/// For every OSD id: the key of each domain it belongs to.
fn domain_of(h: &Hierarchy, d: FailureDomain) -> Vec<String> {
    let mut out = Vec::new();
    for host in &h.hosts {
        for o in &host.osds {
            let key = match d {
                FailureDomain::Osd => o.id.to_string(),
                FailureDomain::Host => host.name.clone(),
                FailureDomain::Rack => format!("{}/{}", host.zone, host.rack),
                FailureDomain::Zone => host.zone.clone(),
            };
            out.push(key);
        }
    }
    out
}

fn specs() -> impl Strategy<Value = Vec<HostSpec>> {
    let weight = prop_oneof![1 => Just(0u32), 4 => 1u32..=8 * W];
    prop::collection::vec(
        (0u8..3, 0u8..3, prop::collection::vec(weight, 0..=4)),
        0..=8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// No two replicas in one domain, only weighted OSDs, and sets full whenever enough
    /// domains hold weighted OSDs; `domain_count` counts exactly those domains.
    #[test]
    fn every_level_keeps_copies_apart(
        specs in specs(),
        size in 0usize..7,
        pool in any::<u32>(),
        first_pg in any::<u32>(),
    ) {
        let h = build(&specs);
        let placer = Placer::new(&h);
        let weight: Vec<u32> = specs.iter().flat_map(|s| s.2.clone()).collect();
        for d in FailureDomain::ALL {
            let keys = domain_of(&h, d);
            let domains: BTreeSet<&String> =
                keys.iter().zip(&weight).filter(|(_, &w)| w > 0).map(|(k, _)| k).collect();
            prop_assert_eq!(placer.domain_count(d), domains.len(), "{:?}", d);
            for pg in (0..16).map(|i| first_pg.wrapping_add(i)) {
                let set = placer.pg_osds_tree(pool, pg, size, d);
                prop_assert_eq!(set.len(), size.min(domains.len()), "{:?} {:?}", d, set);
                prop_assert!(set.iter().all(|&id| weight[id as usize] > 0));
                let used: BTreeSet<&String> = set.iter().map(|&id| &keys[id as usize]).collect();
                prop_assert_eq!(used.len(), set.len(), "{:?} {:?}", d, set);
            }
        }
    }

    /// The order of hosts and OSDs in the input changes nothing.
    #[test]
    fn input_order_does_not_matter(specs in specs(), seed in any::<u64>(), pool in any::<u32>()) {
        let h = build(&specs);
        let mut s = h.clone();
        let mut seed = seed;
        shuffle(&mut s.hosts, &mut seed);
        for host in &mut s.hosts {
            shuffle(&mut host.osds, &mut seed);
        }
        let (a, b) = (Placer::new(&h), Placer::new(&s));
        for pg in 0..32 {
            for d in FailureDomain::ALL {
                prop_assert_eq!(a.pg_osds_tree(pool, pg, 3, d), b.pg_osds_tree(pool, pg, 3, d));
            }
        }
    }

    /// Arbitrary input (duplicate ids and names, extreme weights, huge sizes) never panics
    /// and never returns an OSD twice.
    #[test]
    fn arbitrary_input_is_handled(
        hosts in prop::collection::vec(
            (0u8..3, 0u8..3, 0u8..3, prop::collection::vec((0u32..6, prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()]), 0..5)),
            0..6,
        ),
        size in prop_oneof![0usize..8, Just(usize::MAX)],
        pool in any::<u32>(),
        pg in any::<u32>(),
    ) {
        let h = Hierarchy {
            hosts: hosts
                .iter()
                .map(|(zone, rack, name, osds)| HostNode {
                    name: format!("h{name}"),
                    rack: format!("r{rack}"),
                    zone: format!("z{zone}"),
                    osds: osds.iter().map(|&(id, weight)| OsdNode { id, weight }).collect(),
                })
                .collect(),
        };
        let placer = Placer::new(&h);
        for d in FailureDomain::ALL {
            let set = placer.pg_osds_tree(pool, pg, size, d);
            prop_assert!(set.len() <= size);
            let unique: BTreeSet<u32> = set.iter().copied().collect();
            prop_assert_eq!(unique.len(), set.len());
        }
    }
}

/// Size 1: each OSD's share of primaries is its weight share, through three levels of
/// unequal buckets (2 zones, 3 racks, 5 hosts, 10 OSDs of weights 0.5..5.0); fixed input,
/// 65,536 PGs, each share within 5% + 4 sigma.
#[test]
fn primaries_follow_weights_through_the_levels() {
    const PGS: u32 = 65_536;
    let specs: Vec<HostSpec> = vec![
        (0, 0, vec![W / 2, W]),
        (0, 0, vec![3 * W / 2]),
        (0, 1, vec![2 * W, 5 * W / 2, 3 * W]),
        (1, 0, vec![7 * W / 2]),
        (1, 0, vec![4 * W, 9 * W / 2, 5 * W]),
    ];
    let h = build(&specs);
    let weights: Vec<u32> = specs.iter().flat_map(|s| s.2.clone()).collect();
    let placer = Placer::new(&h);
    let mut counts = vec![0usize; weights.len()];
    for pg in 0..PGS {
        for id in placer.pg_osds_tree(7, pg, 1, FailureDomain::Host) {
            counts[id as usize] += 1;
        }
    }
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let mut worst = 0.0f64;
    for (i, (&c, &w)) in counts.iter().zip(&weights).enumerate() {
        let p = f64::from(w) / total;
        let obs = c as f64 / f64::from(PGS);
        let sigma = (p * (1.0 - p) / f64::from(PGS)).sqrt();
        assert!(
            (obs - p).abs() <= 0.05 * p + 4.0 * sigma,
            "osd {i}: share {obs:.4}, weight share {p:.4}"
        );
        worst = worst.max((obs - p).abs() / p);
    }
    eprintln!(
        "tree distribution: worst relative error {:.2}%",
        worst * 100.0
    );
}

/// Places `pgs` PGs of size 3, host domain.
fn place(h: &Hierarchy, pgs: u32) -> Vec<Vec<u32>> {
    let placer = Placer::new(h);
    (0..pgs)
        .map(|pg| placer.pg_osds_tree(3, pg, 3, FailureDomain::Host))
        .collect()
}

fn moved(old: &[Vec<u32>], new: &[Vec<u32>]) -> usize {
    old.iter()
        .zip(new)
        .map(|(a, b)| a.iter().filter(|id| !b.contains(id)).count())
        .sum()
}

/// A host added to 20 (4 OSDs each, 2 zones, racks of 5): the copies that move are about
/// the new host's share (within 1.2x of what it receives, which is ~1/21), and no copy
/// moves between two old hosts (a copy may change OSD inside its host when the host is drawn
/// at another rank: the OSD draw hashes the rank).
#[test]
fn a_host_added_moves_only_its_share() {
    const PGS: u32 = 16_384;
    let specs: Vec<HostSpec> = (0..21u8).map(|i| (i % 2, i / 10, vec![W; 4])).collect();
    let before = build(&specs[..20]);
    let after = build(&specs);
    let (old, new) = (place(&before, PGS), place(&after, PGS));
    let slots = (PGS * 3) as usize;
    let on_new = new.iter().flatten().filter(|&&id| id >= 80).count();
    let m = moved(&old, &new);
    eprintln!(
        "host added: moved {:.4}, new host holds {:.4}, ideal {:.4}",
        m as f64 / slots as f64,
        on_new as f64 / slots as f64,
        1.0 / 21.0
    );
    assert!(
        m as f64 <= 1.2 * on_new as f64,
        "moved {m}, new host got {on_new}"
    );
    let between_old = old
        .iter()
        .zip(&new)
        .map(|(a, b)| {
            let old_hosts: BTreeSet<u32> = a.iter().map(|id| id / 4).collect();
            b.iter()
                .filter(|&&id| id < 80 && !old_hosts.contains(&(id / 4)))
                .count()
        })
        .sum::<usize>();
    assert_eq!(between_old, 0, "copies moved between old hosts");
}

/// An OSD added to an existing host (10 hosts of 4): more moves than the new OSD receives,
/// because its host now weighs more and wins PGs that then land on the host's old OSDs too
/// (CRUSH's known cost, which version 1's one-level draw avoids; docs/format/placement.md
/// section 11). Bounded at 2x what the new OSD receives; version 1's figure is printed
/// beside it.
#[test]
fn an_osd_added_to_a_host_moves_at_most_twice_its_share() {
    const PGS: u32 = 16_384;
    let specs: Vec<HostSpec> = (0..10u8).map(|_| (0, 0, vec![W; 4])).collect();
    let before = build(&specs);
    let mut after = before.clone();
    after.hosts[0].osds.push(OsdNode { id: 40, weight: W });
    let (old, new) = (place(&before, PGS), place(&after, PGS));
    let on_new = new.iter().flatten().filter(|&&id| id == 40).count();
    let m = moved(&old, &new);
    let flat = |h: &Hierarchy| -> Vec<Vec<u32>> {
        (0..PGS)
            .map(|pg| pg_osds(h, 3, pg, 3, FailureDomain::Host))
            .collect()
    };
    let (old1, new1) = (flat(&before), flat(&after));
    let on_new1 = new1.iter().flatten().filter(|&&id| id == 40).count();
    eprintln!(
        "osd added to a host: v2 moved {m} copies for {on_new} on the new OSD ({:.2}x); v1 {:.2}x",
        m as f64 / on_new as f64,
        moved(&old1, &new1) as f64 / on_new1 as f64
    );
    assert!(
        m as f64 <= 2.0 * on_new as f64,
        "moved {m}, new OSD got {on_new}"
    );
}
