use super::*;
use cairn_placement::WEIGHT_ONE;
use std::collections::BTreeSet;

fn boot(m: &mut ClusterMap, n: u8, host: &str) -> u32 {
    let change = MapChange::OsdBoot {
        store_id: [n; 16],
        addr: format!("127.0.0.1:{}", 7000 + n as u16),
        host: host.into(),
        weight: WEIGHT_ONE,
    };
    match m.apply(&change) {
        Ok(ChangeOutcome::Changed { id, .. }) => id,
        other => panic!("boot: {other:?}"),
    }
}

fn pool(m: &mut ClusterMap, name: &str, size: u8) -> u32 {
    let change = MapChange::PoolCreate {
        name: name.into(),
        size,
        min_size: 1,
        pg_count: 32,
        durability: Durability::Wal,
    };
    match m.apply(&change) {
        Ok(ChangeOutcome::Changed { id, .. }) => id,
        other => panic!("pool create: {other:?}"),
    }
}

#[test]
fn version_1_failure_domains_are_hosts_when_several_else_osds() {
    let v1 = |m: &ClusterMap| ClusterMap::failure_domains(&m.placer(), PlacementRule::FlatV1);
    let mut m = ClusterMap::new([1; 16]);
    assert_eq!(v1(&m), (0, "osd"));
    boot(&mut m, 1, "a");
    boot(&mut m, 2, "a");
    assert_eq!(v1(&m), (2, "osd"));
    boot(&mut m, 3, "b");
    assert_eq!(v1(&m), (2, "host"));
    m.apply(&MapChange::OsdOut { id: 2 }).unwrap();
    assert_eq!(v1(&m), (2, "osd"), "host b has no OSD in");
}

fn pool_in(m: &mut ClusterMap, name: &str, size: u8, domain: Option<Domain>) -> u32 {
    let change = MapChange::PoolCreateRule {
        name: name.into(),
        size,
        min_size: 1,
        pg_count: 64,
        durability: Durability::Wal,
        domain,
    };
    match m.apply(&change) {
        Ok(ChangeOutcome::Changed { id, .. }) => id,
        other => panic!("pool create: {other:?}"),
    }
}

fn label(
    m: &mut ClusterMap,
    host: &str,
    rack: &str,
    zone: &str,
) -> Result<ChangeOutcome, MapError> {
    m.apply(&MapChange::HostLocation {
        host: host.into(),
        rack: rack.into(),
        zone: zone.into(),
    })
}

#[test]
fn a_new_pool_defaults_to_hosts_only_when_there_are_enough() {
    let mut m = ClusterMap::new([1; 16]);
    for (n, host) in [(1, "a"), (2, "a"), (3, "b")] {
        boot(&mut m, n, host);
    }
    let two = pool_in(&mut m, "two", 2, None);
    let three = pool_in(&mut m, "three", 3, None);
    let tree = |d| PlacementRule::Tree { domain: d };
    assert_eq!(m.pools[&two].rule, tree(Domain::Host));
    assert_eq!(
        m.pools[&three].rule,
        tree(Domain::Osd),
        "2 hosts cannot hold 3 copies"
    );
    for pg in 0..64 {
        let p = m.pg_placement(PgId { pool: two, pg });
        let hosts: BTreeSet<&str> = p.up_set.iter().map(|id| m.osds[id].host.as_str()).collect();
        assert_eq!(hosts.len(), 2, "{p:?}");
        assert_eq!(m.pg_placement(PgId { pool: three, pg }).up_set.len(), 3);
    }
}

#[test]
fn racks_come_from_host_labels_and_keep_copies_apart() {
    let mut m = ClusterMap::new([1; 16]);
    for (n, host) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
        boot(&mut m, n, host);
    }
    for (host, rack) in [("a", "r1"), ("b", "r1"), ("c", "r2"), ("d", "r2")] {
        label(&mut m, host, rack, "").unwrap();
    }
    assert_eq!(label(&mut m, "a", "r1", ""), Ok(ChangeOutcome::Unchanged));
    assert_eq!(
        label(&mut m, "nope", "r1", ""),
        Err(MapError::NoSuchHost("nope".into()))
    );
    assert!(matches!(
        label(&mut m, "a", "r 1", ""),
        Err(MapError::BadLabel(_))
    ));
    let id = pool_in(&mut m, "racked", 2, Some(Domain::Rack));
    let rack_of = |m: &ClusterMap, osd: &u32| m.host_location(&m.osds[osd].host).rack;
    for pg in 0..64 {
        let p = m.pg_placement(PgId { pool: id, pg });
        let racks: BTreeSet<String> = p.up_set.iter().map(|o| rack_of(&m, o)).collect();
        assert_eq!(racks.len(), 2, "{p:?}");
    }
    // Unlabelled again: one rack left, so one copy per PG.
    for host in ["a", "b", "c", "d"] {
        label(&mut m, host, "", "").unwrap();
    }
    assert!(m.hosts.is_empty());
    assert_eq!(m.pg_placement(PgId { pool: id, pg: 0 }).up_set.len(), 1);
}

#[test]
fn a_version_1_pool_keeps_its_placement_until_given_a_domain() {
    let mut m = ClusterMap::new([1; 16]);
    for n in 1..=6 {
        boot(&mut m, n, ["a", "b", "c"][usize::from(n % 3)]);
    }
    let id = pool(&mut m, "old", 2);
    assert_eq!(m.pools[&id].rule, PlacementRule::FlatV1);
    let h = m.hierarchy();
    for pg in 0..32 {
        let want = cairn_placement::pg_osds(&h, id, pg, 2, cairn_placement::FailureDomain::Host);
        assert_eq!(m.pg_placement(PgId { pool: id, pg }).up_set, want);
    }
    let set = MapChange::PoolSet {
        name: "old".into(),
        setting: PoolSetting::Domain(Domain::Host),
    };
    assert!(matches!(m.apply(&set), Ok(ChangeOutcome::Changed { .. })));
    assert_eq!(m.apply(&set), Ok(ChangeOutcome::Unchanged));
    let placer = m.placer();
    for pg in 0..32 {
        let want = placer.pg_osds_tree(id, pg, 2, cairn_placement::FailureDomain::Host);
        assert_eq!(m.pg_placement(PgId { pool: id, pg }).up_set, want);
    }
}

#[test]
fn boot_assigns_ids_and_a_restart_keeps_its_id() {
    let mut m = ClusterMap::new([1; 16]);
    assert_eq!(boot(&mut m, 1, "a"), 0);
    assert_eq!(boot(&mut m, 2, "a"), 1);
    let e = m.epoch;
    assert_eq!(boot(&mut m, 1, "a"), 0, "same store, same id");
    assert_eq!(m.epoch, e + 1);
    assert_eq!(m.osds[&0].up_from, e + 1);
}

#[test]
fn a_late_down_report_does_not_down_a_restarted_osd() {
    let mut m = ClusterMap::new([1; 16]);
    boot(&mut m, 1, "a");
    let old_life = m.osds[&0].up_from;
    boot(&mut m, 1, "a");
    let r = m.apply(&MapChange::OsdDown {
        id: 0,
        up_from: old_life,
    });
    assert_eq!(r, Ok(ChangeOutcome::Unchanged));
    assert!(m.osds[&0].up);
    let life = m.osds[&0].up_from;
    let r = m.apply(&MapChange::OsdDown {
        id: 0,
        up_from: life,
    });
    assert!(matches!(r, Ok(ChangeOutcome::Changed { .. })));
    assert!(!m.osds[&0].up);
}

#[test]
fn invalid_changes_are_refused_and_leave_the_map_alone() {
    let mut m = ClusterMap::new([1; 16]);
    pool(&mut m, "rbd", 3);
    let before = m.clone();
    let bad = [
        MapChange::PoolCreate {
            name: "rbd".into(),
            size: 3,
            min_size: 2,
            pg_count: 8,
            durability: Durability::Wal,
        },
        MapChange::PoolCreate {
            name: "bad name".into(),
            size: 3,
            min_size: 2,
            pg_count: 8,
            durability: Durability::Wal,
        },
        MapChange::PoolCreate {
            name: "x".into(),
            size: 2,
            min_size: 3,
            pg_count: 8,
            durability: Durability::Wal,
        },
        MapChange::PoolCreate {
            name: "x".into(),
            size: 2,
            min_size: 1,
            pg_count: 0,
            durability: Durability::Wal,
        },
        MapChange::PoolRemove {
            name: "nope".into(),
        },
        MapChange::OsdOut { id: 9 },
        MapChange::OsdBoot {
            store_id: [3; 16],
            addr: "not an address".into(),
            host: "h".into(),
            weight: WEIGHT_ONE,
        },
        MapChange::PoolSet {
            name: "rbd".into(),
            setting: PoolSetting::MinSize(4),
        },
    ];
    for c in &bad {
        assert!(m.apply(c).is_err(), "{c:?} accepted");
        assert_eq!(m, before, "{c:?} changed the map");
    }
}

#[test]
fn incrementals_rebuild_the_same_map() {
    let mut m = ClusterMap::new([1; 16]);
    let mut follower = m.clone();
    let changes = vec![
        MapChange::OsdBoot {
            store_id: [1; 16],
            addr: "127.0.0.1:7001".into(),
            host: "a".into(),
            weight: WEIGHT_ONE,
        },
        MapChange::PoolCreate {
            name: "p".into(),
            size: 2,
            min_size: 1,
            pg_count: 16,
            durability: Durability::Memory,
        },
        MapChange::OsdOut { id: 0 },
        MapChange::PoolSet {
            name: "p".into(),
            setting: PoolSetting::Durability(Durability::Wal),
        },
    ];
    for c in changes {
        if let Ok(ChangeOutcome::Changed { epoch, .. }) = m.apply(&c) {
            follower
                .apply_incremental(&Incremental { epoch, change: c })
                .unwrap();
        }
    }
    assert_eq!(follower, m);
    let gap = Incremental {
        epoch: m.epoch + 2,
        change: MapChange::OsdIn { id: 0 },
    };
    assert!(matches!(
        follower.apply_incremental(&gap),
        Err(MapError::EpochGap { .. })
    ));
}

#[test]
fn acting_set_is_the_up_members_in_placement_order() {
    let mut m = ClusterMap::new([1; 16]);
    for n in 1..=4 {
        boot(&mut m, n, "h");
    }
    let p = pool(&mut m, "p", 3);
    let pg = PgId { pool: p, pg: 5 };
    let full = m.pg_placement(pg);
    assert_eq!(full.up_set.len(), 3);
    assert_eq!(full.acting, full.up_set);
    let first = full.up_set[0];
    let life = m.osds[&first].up_from;
    m.apply(&MapChange::OsdDown {
        id: first,
        up_from: life,
    })
    .unwrap();
    let degraded = m.pg_placement(pg);
    assert_eq!(degraded.up_set, full.up_set, "down does not move data");
    assert_eq!(degraded.acting, full.up_set[1..].to_vec());
    assert_eq!(degraded.primary(), Some(full.up_set[1]));
    m.apply(&MapChange::OsdOut { id: first }).unwrap();
    let moved = m.pg_placement(pg);
    assert!(!moved.up_set.contains(&first), "out moves data");
    assert_eq!(moved.up_set.len(), 3);
}

#[test]
fn a_created_osd_keeps_its_id_and_goes_in_at_first_boot() {
    let mut m = ClusterMap::new([1; 16]);
    boot(&mut m, 1, "a");
    let create = MapChange::OsdCreate {
        store_id: [9; 16],
        host: "b".into(),
        weight: WEIGHT_ONE,
    };
    let Ok(ChangeOutcome::Changed { id, .. }) = m.apply(&create) else {
        panic!("create")
    };
    assert_eq!(id, 1);
    let o = &m.osds[&id];
    assert!(!o.up && !o.in_ && o.up_from == 0 && o.host == "b");
    // Not placed while out: a pool's PGs avoid it.
    let p = pool(&mut m, "p", 1);
    assert!((0..32).all(|pg| !m.pg_placement(PgId { pool: p, pg }).up_set.contains(&id)));
    assert_eq!(m.apply(&create), Ok(ChangeOutcome::Unchanged));
    assert_eq!(boot(&mut m, 9, "b"), id, "its boot finds it by store");
    assert!(m.osds[&id].up && m.osds[&id].in_);
    // A later boot does not undo an operator's `out`.
    m.apply(&MapChange::OsdOut { id }).unwrap();
    boot(&mut m, 9, "b");
    assert!(!m.osds[&id].in_);
}

#[test]
fn fences_are_added_lifted_and_expire_with_the_epoch_moving_only_on_change() {
    let mut m = ClusterMap::new([1; 16]);
    pool(&mut m, "rbd", 1);
    let add = |instance, until| MapChange::BlocklistAdd {
        instance,
        pool: "rbd".into(),
        until,
    };
    let e = m.epoch;
    assert!(matches!(
        m.apply(&add(7, 100)),
        Ok(ChangeOutcome::Changed { .. })
    ));
    assert!(m.is_blocklisted(7) && !m.is_blocklisted(8));
    assert_eq!(m.apply(&add(7, 100)), Ok(ChangeOutcome::Unchanged));
    // A fence asked for again later lasts longer.
    m.apply(&add(7, 200)).expect("extend");
    m.apply(&add(9, 150)).expect("second");
    assert_eq!(m.epoch, e + 3);
    // Refused: instance 0, a pool that does not exist.
    assert_eq!(m.apply(&add(0, 100)), Err(MapError::BadInstance));
    let other = MapChange::BlocklistAdd {
        instance: 5,
        pool: "nope".into(),
        until: 1,
    };
    assert!(matches!(m.apply(&other), Err(MapError::NoSuchPool(_))));
    // Expiry drops what ended at or before `now`, nothing else.
    let expire = |now| MapChange::BlocklistExpire { now };
    assert_eq!(m.apply(&expire(149)), Ok(ChangeOutcome::Unchanged));
    m.apply(&expire(150)).expect("expire");
    assert!(m.is_blocklisted(7) && !m.is_blocklisted(9));
    m.apply(&MapChange::BlocklistRemove { instance: 7 })
        .expect("lift");
    assert!(m.blocklist.is_empty());
    assert_eq!(
        m.apply(&MapChange::BlocklistRemove { instance: 7 }),
        Ok(ChangeOutcome::Unchanged)
    );
    // The map keeps at most MAX_BLOCKLIST fences.
    for i in 1..=MAX_BLOCKLIST as u64 {
        m.blocklist.insert(i, 1000);
    }
    assert_eq!(
        m.apply(&add(MAX_BLOCKLIST as u64 + 1, 1000)),
        Err(MapError::BlocklistFull)
    );
}
