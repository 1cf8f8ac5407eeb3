//! Erasure-coded pools in the map: creation, its refusals, positional shards.

use super::*;
use cairn_placement::WEIGHT_ONE;
use std::collections::BTreeSet;

fn map_with_hosts(n: u8) -> ClusterMap {
    let mut m = ClusterMap::new([2; 16]);
    for i in 0..n {
        let change = MapChange::OsdBoot {
            store_id: [i + 1; 16],
            addr: format!("127.0.0.1:{}", 7100 + u16::from(i)),
            host: format!("h{i}"),
            weight: WEIGHT_ONE,
        };
        m.apply(&change).unwrap();
    }
    m
}

fn profile(k: u8, m: u8, stripe_unit: u32) -> EcProfile {
    EcProfile { k, m, stripe_unit }
}

fn create(m: &mut ClusterMap, name: &str, p: EcProfile, min_size: u8) -> Result<u32, MapError> {
    let change = MapChange::PoolCreateEc {
        name: name.into(),
        profile: p,
        min_size,
        pg_count: 64,
        durability: Durability::Wal,
        domain: None,
    };
    match m.apply(&change)? {
        ChangeOutcome::Changed { id, .. } => Ok(id),
        ChangeOutcome::Unchanged => panic!("a creation always changes the map"),
    }
}

fn set(m: &mut ClusterMap, name: &str, s: PoolSetting) -> Result<ChangeOutcome, MapError> {
    m.apply(&MapChange::PoolSet {
        name: name.into(),
        setting: s,
    })
}

#[test]
fn an_ec_pool_has_k_plus_m_shards_on_distinct_hosts_and_a_down_osd_leaves_a_hole() {
    let mut m = map_with_hosts(8);
    let id = create(&mut m, "ec", profile(4, 2, 16 << 10), 5).unwrap();
    let pool = m.pools[&id].clone();
    assert_eq!(pool.size, 6);
    assert_eq!(pool.ec(), Some(profile(4, 2, 16 << 10)));
    assert_eq!(
        pool.rule.domain(),
        Some(Domain::Host),
        "8 hosts >= 6 shards"
    );
    let before: Vec<(PgId, Vec<u32>)> = (0..pool.pg_count)
        .map(|pg| {
            let pg = PgId { pool: id, pg };
            (pg, m.pg_placement(pg).up_set)
        })
        .collect();
    for (pg, up) in &before {
        let hosts: BTreeSet<&str> = up.iter().map(|o| m.osds[o].host.as_str()).collect();
        assert_eq!((up.len(), hosts.len()), (6, 6), "pg {pg}: {up:?}");
        let shards = m.pg_shards(*pg, &m.pg_placement(*pg));
        assert_eq!(shards, up.iter().map(|&o| Some(o)).collect::<Vec<_>>());
    }
    let victim = before[0].1[2];
    let up_from = m.osds[&victim].up_from;
    m.apply(&MapChange::OsdDown {
        id: victim,
        up_from,
    })
    .unwrap();
    let mut holes = 0;
    for (pg, up) in &before {
        let p = m.pg_placement(*pg);
        assert_eq!(&p.up_set, up, "a down OSD moves no shard");
        let shards = m.pg_shards(*pg, &p);
        for (rank, (&osd, shard)) in up.iter().zip(&shards).enumerate() {
            if osd == victim {
                assert_eq!(*shard, None, "pg {pg} shard {rank} is a hole");
                holes += 1;
            } else {
                assert_eq!(*shard, Some(osd), "pg {pg} shard {rank} stays where it was");
            }
        }
        let present: Vec<u32> = shards.iter().flatten().copied().collect();
        assert_eq!(p.acting, present, "acting: the present shards in order");
    }
    assert!(holes > 0);
    // Marked out, the victim's shards go to OSDs of hosts the PG did not use; no other shard
    // moves (the replicated pools' ordered draw would shift the ranks after it).
    m.apply(&MapChange::OsdOut { id: victim }).unwrap();
    for (pg, up) in &before {
        let now = m.pg_placement(*pg).up_set;
        let hosts: BTreeSet<&str> = now.iter().map(|o| m.osds[o].host.as_str()).collect();
        assert_eq!(hosts.len(), 6, "pg {pg}: {now:?}");
        for (rank, (was, is)) in up.iter().zip(&now).enumerate() {
            if *was == victim {
                assert!(
                    *is != victim && !up.contains(is),
                    "pg {pg} shard {rank}: {now:?}"
                );
            } else {
                assert_eq!(was, is, "pg {pg} shard {rank} moved: {up:?} -> {now:?}");
            }
        }
    }
    // A replicated pool has no shards.
    let rep = MapChange::PoolCreateRule {
        name: "rep".into(),
        size: 3,
        min_size: 2,
        pg_count: 8,
        durability: Durability::Wal,
        domain: None,
    };
    let Ok(ChangeOutcome::Changed { id: rep, .. }) = m.apply(&rep) else {
        panic!("replicated pool");
    };
    let pg = PgId { pool: rep, pg: 0 };
    assert!(m.pg_shards(pg, &m.pg_placement(pg)).is_empty());
}

#[test]
fn ec_pools_refuse_bad_profiles_and_min_sizes_and_keep_their_profile() {
    let mut m = map_with_hosts(3);
    let bad = [
        profile(0, 2, 4096),
        profile(30, 3, 4096),
        profile(4, 2, 5000),
        profile(4, 2, 2 << 20),
    ];
    for p in bad {
        let e = create(&mut m, "bad", p, p.k).unwrap_err();
        assert!(matches!(e, MapError::BadEcProfile(_)), "{p:?}: {e}");
    }
    for min_size in [3, 7] {
        let e = create(&mut m, "bad", profile(4, 2, 4096), min_size).unwrap_err();
        assert_eq!(
            e,
            MapError::BadEcMinSize {
                k: 4,
                m: 2,
                min_size
            }
        );
    }
    assert!(m.pool_by_name("bad").is_none(), "nothing created");
    let e = create(&mut m, "no/slash", profile(4, 2, 4096), 5).unwrap_err();
    assert_eq!(e, MapError::BadPoolName("no/slash".into()));
    let id = create(&mut m, "ec", profile(4, 2, 64 << 10), 5).unwrap();
    let e = create(&mut m, "ec", profile(2, 1, 4096), 3).unwrap_err();
    assert_eq!(e, MapError::PoolExists("ec".into()));
    assert_eq!(
        m.pools[&id].rule.domain(),
        Some(Domain::Osd),
        "3 hosts < 6 shards: distinct OSDs"
    );
    for s in [PoolSetting::Size(4), PoolSetting::PgCount(128)] {
        let e = set(&mut m, "ec", s).unwrap_err();
        assert!(matches!(e, MapError::EcFixed { .. }), "{e}");
    }
    assert!(set(&mut m, "ec", PoolSetting::MinSize(3)).is_err());
    set(&mut m, "ec", PoolSetting::MinSize(4)).unwrap();
    set(&mut m, "ec", PoolSetting::Domain(Domain::Host)).unwrap();
    let p = &m.pools[&id];
    assert_eq!((p.size, p.min_size), (6, 4));
    assert_eq!(
        p.rule,
        PlacementRule::Erasure {
            domain: Domain::Host,
            profile: profile(4, 2, 64 << 10)
        }
    );
    assert_eq!(
        set(&mut m, "ec", PoolSetting::MinSize(4)),
        Ok(ChangeOutcome::Unchanged)
    );
}

#[test]
fn an_ec_pool_stores_k_plus_m_over_k_bytes_per_byte() {
    let mut m = map_with_hosts(6);
    let id = create(&mut m, "ec", profile(4, 2, 16 << 10), 5).unwrap();
    let p = &m.pools[&id];
    assert_eq!(p.raw_per_byte(), 1.5);
    assert_eq!(p.kind(), "ec 4+2, unit 16 KiB");
    assert_eq!(profile(8, 3, 1 << 20).describe(), "8+3, unit 1 MiB");
}
