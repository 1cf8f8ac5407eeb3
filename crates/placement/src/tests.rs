//! Edge cases of the public API.

use crate::*;

fn host(name: &str, osds: &[(u32, u32)]) -> HostNode {
    HostNode {
        name: name.to_string(),
        osds: osds
            .iter()
            .map(|&(id, weight)| OsdNode { id, weight })
            .collect(),
        ..Default::default()
    }
}

fn three_hosts() -> Hierarchy {
    Hierarchy {
        hosts: vec![
            host("a", &[(0, WEIGHT_ONE), (1, WEIGHT_ONE)]),
            host("b", &[(2, WEIGHT_ONE), (3, WEIGHT_ONE)]),
            host("c", &[(4, WEIGHT_ONE), (5, WEIGHT_ONE)]),
        ],
    }
}

#[test]
fn empty_hierarchy_places_nothing() {
    let h = Hierarchy { hosts: vec![] };
    for domain in [FailureDomain::Host, FailureDomain::Osd] {
        assert!(pg_osds(&h, 1, 0, 3, domain).is_empty());
    }
    assert_eq!(default_domain(&h), FailureDomain::Osd);
    let no_osds = Hierarchy {
        hosts: vec![host("a", &[]), host("b", &[])],
    };
    assert!(pg_osds(&no_osds, 1, 0, 3, FailureDomain::Host).is_empty());
    assert_eq!(default_domain(&no_osds), FailureDomain::Osd);
}

#[test]
fn all_weights_zero_places_nothing() {
    let h = Hierarchy {
        hosts: vec![host("a", &[(0, 0), (1, 0)]), host("b", &[(2, 0)])],
    };
    for domain in [FailureDomain::Host, FailureDomain::Osd] {
        for pg in 0..32 {
            assert!(pg_osds(&h, 1, pg, 3, domain).is_empty());
        }
    }
    assert_eq!(default_domain(&h), FailureDomain::Osd);
}

#[test]
fn size_zero_places_nothing() {
    assert!(pg_osds(&three_hosts(), 1, 0, 0, FailureDomain::Osd).is_empty());
}

#[test]
fn size_larger_than_osds_gives_every_eligible_osd_once() {
    let mut h = three_hosts();
    h.hosts[1].osds[0].weight = 0; // OSD 2 is out
    for pg in 0..64 {
        let mut got = pg_osds(&h, 7, pg, 100, FailureDomain::Osd);
        got.sort_unstable();
        assert_eq!(got, vec![0, 1, 3, 4, 5], "pg {pg}");
        // usize::MAX must not loop forever nor allocate for it.
        assert_eq!(pg_osds(&h, 7, pg, usize::MAX, FailureDomain::Osd).len(), 5);
    }
}

#[test]
fn size_larger_than_hosts_gives_one_osd_per_host() {
    let h = three_hosts();
    for pg in 0..64 {
        let got = pg_osds(&h, 7, pg, 5, FailureDomain::Host);
        let mut hosts: Vec<u32> = got.iter().map(|id| id / 2).collect();
        hosts.sort_unstable();
        assert_eq!(hosts, vec![0, 1, 2], "pg {pg}: {got:?}");
    }
}

#[test]
fn default_domain_needs_two_weighted_hosts() {
    let mut h = three_hosts();
    assert_eq!(default_domain(&h), FailureDomain::Host);
    for o in &mut h.hosts[1].osds {
        o.weight = 0;
    }
    assert_eq!(default_domain(&h), FailureDomain::Host);
    for o in &mut h.hosts[2].osds {
        o.weight = 0;
    }
    assert_eq!(default_domain(&h), FailureDomain::Osd);
    // Two entries with one name are one host.
    let same_name = Hierarchy {
        hosts: vec![host("a", &[(0, WEIGHT_ONE)]), host("a", &[(1, WEIGHT_ONE)])],
    };
    assert_eq!(default_domain(&same_name), FailureDomain::Osd);
}

#[test]
fn hosts_with_the_same_name_are_one_domain() {
    let h = Hierarchy {
        hosts: vec![
            host("a", &[(0, WEIGHT_ONE)]),
            host("a", &[(1, WEIGHT_ONE)]),
            host("b", &[(2, WEIGHT_ONE)]),
        ],
    };
    for pg in 0..64 {
        let got = pg_osds(&h, 1, pg, 3, FailureDomain::Host);
        assert_eq!(got.len(), 2, "pg {pg}: {got:?}");
        assert!(got.contains(&2), "pg {pg}: {got:?}");
    }
}

#[test]
fn duplicate_osd_ids_are_never_returned_twice() {
    let h = Hierarchy {
        hosts: vec![
            host("a", &[(5, WEIGHT_ONE), (6, WEIGHT_ONE)]),
            host("b", &[(5, 3 * WEIGHT_ONE)]),
            host("c", &[(7, u32::MAX)]),
        ],
    };
    for domain in [FailureDomain::Host, FailureDomain::Osd] {
        for pg in 0..64 {
            let got = pg_osds(&h, 1, pg, 4, domain);
            let mut dedup = got.clone();
            dedup.sort_unstable();
            dedup.dedup();
            assert_eq!(dedup.len(), got.len(), "pg {pg}: {got:?}");
        }
    }
}

#[test]
fn pg_count_one_or_zero_maps_everything_to_pg_zero() {
    for name in [&b""[..], b"a", b"object-1", &[0xff; 100]] {
        assert_eq!(object_pg(name, 1), 0);
        assert_eq!(object_pg(name, 0), 0);
    }
}

#[test]
fn object_pg_is_in_range_for_any_count() {
    for count in [2, 3, 5, 7, 100, 128, 1000, (1 << 31) + 1, u32::MAX] {
        for i in 0..200u32 {
            assert!(object_pg(&i.to_le_bytes(), count) < count);
        }
    }
}

#[test]
fn object_pg_is_hash_mod_count_for_powers_of_two() {
    for shift in 0..32 {
        let count = 1u32 << shift;
        for i in 0..50u32 {
            let name = format!("obj-{i}");
            assert_eq!(
                object_pg(name.as_bytes(), count),
                object_hash(name.as_bytes()) % count
            );
        }
    }
}

#[test]
fn growing_pg_count_only_splits_pgs() {
    // stable_mod: going from n to n + 1 PGs moves objects only into the new PG.
    for n in 1..70u32 {
        for i in 0..100u32 {
            let name = format!("obj-{i}");
            let before = object_pg(name.as_bytes(), n);
            let after = object_pg(name.as_bytes(), n + 1);
            assert!(after == before || after == n, "n {n}: {before} -> {after}");
        }
    }
}

#[test]
fn stable_mod_folds_the_top_of_the_range() {
    // n = 5: mask 7, low values 5..=7 fold to 1..=3.
    assert_eq!(stable_mod(4, 5), 4);
    assert_eq!(stable_mod(5, 5), 1);
    assert_eq!(stable_mod(7, 5), 3);
    assert_eq!(stable_mod(8, 5), 0);
    assert_eq!(stable_mod(u32::MAX, u32::MAX), u32::MAX >> 1);
}

#[test]
fn single_host_single_osd() {
    let h = Hierarchy {
        hosts: vec![host("only", &[(42, 1)])],
    };
    assert_eq!(pg_osds(&h, 0, 0, 3, FailureDomain::Host), vec![42]);
    assert_eq!(pg_osds(&h, 0, 0, 3, FailureDomain::Osd), vec![42]);
}

#[test]
fn heavier_osd_is_primary_more_often() {
    let h = Hierarchy {
        hosts: vec![host("a", &[(0, WEIGHT_ONE), (1, 3 * WEIGHT_ONE)])],
    };
    let heavy = (0..4000)
        .filter(|&pg| pg_osds(&h, 1, pg, 1, FailureDomain::Osd) == [1])
        .count();
    // Expected 3000, binomial sigma ~27.
    assert!((2850..=3150).contains(&heavy), "{heavy}");
}

#[test]
fn placer_gives_the_free_functions_results() {
    let mut h = three_hosts();
    h.hosts[2].osds[1].weight = 5 * WEIGHT_ONE;
    let placer = Placer::new(&h);
    assert_eq!(placer.default_domain(), default_domain(&h));
    for domain in [FailureDomain::Host, FailureDomain::Osd] {
        for pg in 0..64 {
            for size in 0..5 {
                assert_eq!(
                    placer.pg_osds(3, pg, size, domain),
                    pg_osds(&h, 3, pg, size, domain)
                );
            }
        }
    }
}

#[test]
fn replicas_keep_their_rank_when_size_grows() {
    // Rank r's draw does not depend on size, so a larger size only appends.
    let h = three_hosts();
    for domain in [FailureDomain::Host, FailureDomain::Osd] {
        for pg in 0..64 {
            let two = pg_osds(&h, 1, pg, 2, domain);
            let three = pg_osds(&h, 1, pg, 3, domain);
            assert_eq!(two[..], three[..2], "pg {pg}");
        }
    }
}

#[test]
fn an_objects_pg_after_a_split_descends_from_its_pg_before() {
    for big in 1..=129u32 {
        for small in 1..=big {
            for h in (0..4096u32).chain([u32::MAX, u32::MAX - 1, 1 << 31]) {
                let child = crate::stable_mod(h, big);
                assert_eq!(
                    crate::pg_ancestor(child, small),
                    crate::stable_mod(h, small)
                );
            }
        }
    }
}
