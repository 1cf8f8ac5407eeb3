//! Values of the cluster map's and the key database's types with every field set, for the
//! golden files of the wire messages (`cairn-proto`) and of the monitor's state (`cairn-mon`),
//! which both carry them. Included with `#[path]` like `golden.rs`.

// Not every crate uses every sample.
#![allow(dead_code)]

use cairn_auth::{Caps, Entity, KeyChange, KeyDb, MonKey, Secret, StoredKey};
use cairn_map::{
    ChangeOutcome, ClusterMap, Domain, Durability, EcProfile, HostLocation, Incremental, MapChange,
    MapError, OsdInfo, PastInterval, PlacementRule, Pool, PoolSetting,
};

pub fn entity() -> Entity {
    "client.golden".parse().unwrap()
}

pub fn caps() -> Caps {
    Caps {
        mon: "rw".into(),
        osd: "rw pool=rbd, r".into(),
        nbd: "r volume=golden-vol".into(),
    }
}

pub fn osd(id: u32) -> OsdInfo {
    OsdInfo {
        id,
        addr: format!("10.0.0.{id}:6800"),
        host: format!("host-{id}"),
        up: id % 2 == 1,
        in_: id.is_multiple_of(2),
        weight: 0x1_0000 + id,
        up_from: 40 + u64::from(id),
        store_id: [id as u8 + 0x10; 16],
        lost_at: 30 + u64::from(id),
    }
}

pub fn pool(id: u32) -> Pool {
    Pool {
        id,
        name: format!("pool-{id}"),
        size: 3,
        min_size: 2,
        pg_count: 64 << id,
        durability: if id.is_multiple_of(2) {
            Durability::Memory
        } else {
            Durability::Wal
        },
        rule: if id.is_multiple_of(2) {
            PlacementRule::Tree {
                domain: Domain::Rack,
            }
        } else {
            PlacementRule::FlatV1
        },
    }
}

/// A map with two OSDs, two pools (both placement rules), a labelled host and a fence.
pub fn cluster_map() -> ClusterMap {
    ClusterMap {
        fsid: *b"golden-fsid-0001",
        epoch: 42,
        osds: [(3, osd(3)), (4, osd(4))].into_iter().collect(),
        pools: [(1, pool(1)), (2, pool(2))].into_iter().collect(),
        next_pool_id: 7,
        next_osd_id: 9,
        hosts: [(
            "host-3".to_string(),
            HostLocation {
                zone: "zone-a".into(),
                rack: "rack-b".into(),
            },
        )]
        .into_iter()
        .collect(),
        blocklist: [(0x7777_0000_1234, 1_767_229_200)].into_iter().collect(),
    }
}

pub fn incremental() -> Incremental {
    Incremental {
        epoch: 43,
        change: MapChange::OsdOut { id: 3 },
    }
}

pub fn past_interval() -> PastInterval {
    PastInterval {
        first: 10,
        last: 20,
        acting: vec![3, 5, 1],
        min_size: 2,
        maybe_went_rw: true,
    }
}

/// Every map change.
pub fn map_changes() -> Vec<(&'static str, MapChange)> {
    vec![
        (
            "OsdBoot",
            MapChange::OsdBoot {
                store_id: [0x21; 16],
                addr: "10.0.0.9:6800".into(),
                host: "host-9".into(),
                weight: 0x2_0000,
            },
        ),
        ("OsdDown", MapChange::OsdDown { id: 5, up_from: 38 }),
        ("OsdOut", MapChange::OsdOut { id: 6 }),
        ("OsdIn", MapChange::OsdIn { id: 7 }),
        (
            "OsdWeight",
            MapChange::OsdWeight {
                id: 8,
                weight: 0x8000,
            },
        ),
        (
            "PoolCreate",
            MapChange::PoolCreate {
                name: "old-pool".into(),
                size: 3,
                min_size: 2,
                pg_count: 32,
                durability: Durability::Memory,
            },
        ),
        (
            "PoolRemove",
            MapChange::PoolRemove {
                name: "gone".into(),
            },
        ),
        (
            "PoolSet",
            MapChange::PoolSet {
                name: "rbd".into(),
                setting: PoolSetting::PgCount(256),
            },
        ),
        ("OsdLost", MapChange::OsdLost { id: 11 }),
        ("TrimHistory", MapChange::TrimHistory { below: 12 }),
        (
            "OsdCreate",
            MapChange::OsdCreate {
                store_id: [0x22; 16],
                host: "host-13".into(),
                weight: 0x3_0000,
            },
        ),
        (
            "PoolCreateRule",
            MapChange::PoolCreateRule {
                name: "new-pool".into(),
                size: 4,
                min_size: 3,
                pg_count: 16,
                durability: Durability::Wal,
                domain: Some(Domain::Zone),
            },
        ),
        (
            "HostLocation",
            MapChange::HostLocation {
                host: "host-14".into(),
                rack: "rack-1".into(),
                zone: "zone-2".into(),
            },
        ),
        (
            "BlocklistAdd",
            MapChange::BlocklistAdd {
                instance: 0x1515,
                pool: "rbd".into(),
                until: 1_767_229_215,
            },
        ),
        (
            "BlocklistRemove",
            MapChange::BlocklistRemove { instance: 0x1616 },
        ),
        (
            "BlocklistExpire",
            MapChange::BlocklistExpire { now: 1_767_229_217 },
        ),
        (
            "PoolCreateEc",
            MapChange::PoolCreateEc {
                name: "ec-pool".into(),
                profile: ec_profile(),
                min_size: 5,
                pg_count: 128,
                durability: Durability::Wal,
                domain: Some(Domain::Host),
            },
        ),
    ]
}

/// The erasure-code profile of the samples: 4+2, 16 KiB chunks.
pub fn ec_profile() -> EcProfile {
    EcProfile {
        k: 4,
        m: 2,
        stripe_unit: 16 << 10,
    }
}

/// Every pool setting.
pub fn pool_settings() -> Vec<(&'static str, PoolSetting)> {
    vec![
        ("Size", PoolSetting::Size(5)),
        ("MinSize", PoolSetting::MinSize(4)),
        ("Durability", PoolSetting::Durability(Durability::Memory)),
        ("Domain", PoolSetting::Domain(Domain::Host)),
        ("PgCount", PoolSetting::PgCount(512)),
    ]
}

pub fn domains() -> Vec<(&'static str, Domain)> {
    vec![
        ("Osd", Domain::Osd),
        ("Host", Domain::Host),
        ("Rack", Domain::Rack),
        ("Zone", Domain::Zone),
    ]
}

pub fn change_outcomes() -> Vec<(&'static str, ChangeOutcome)> {
    vec![
        ("Changed", ChangeOutcome::Changed { epoch: 43, id: 7 }),
        ("Unchanged", ChangeOutcome::Unchanged),
    ]
}

/// Every reason a map change is refused.
pub fn map_errors() -> Vec<(&'static str, MapError)> {
    vec![
        ("NoSuchOsd", MapError::NoSuchOsd(21)),
        ("NoSuchPool", MapError::NoSuchPool("nope".into())),
        ("PoolExists", MapError::PoolExists("dup".into())),
        ("BadPoolName", MapError::BadPoolName("bad name".into())),
        (
            "BadSize",
            MapError::BadSize {
                size: 12,
                min_size: 13,
            },
        ),
        ("BadPgCount", MapError::BadPgCount(0x2_0000)),
        ("BadWeight", MapError::BadWeight(0x2000_0000)),
        ("BadAddr", MapError::BadAddr("nowhere".into())),
        ("EpochGap", MapError::EpochGap { have: 22, got: 25 }),
        ("NotUp", MapError::NotUp { osd: 23 }),
        ("OsdUp", MapError::OsdUp(24)),
        ("MonitorsOnly", MapError::MonitorsOnly),
        ("Reported", MapError::Reported { osd: 26 }),
        ("Denied", MapError::Denied("no w".into())),
        ("BadLabel", MapError::BadLabel("bad label".into())),
        ("NoSuchHost", MapError::NoSuchHost("ghost".into())),
        (
            "PgCountDown",
            MapError::PgCountDown {
                pool: "rbd".into(),
                have: 64,
            },
        ),
        ("BadInstance", MapError::BadInstance),
        ("BlocklistFull", MapError::BlocklistFull),
        (
            "BadEcProfile",
            MapError::BadEcProfile("k and m must each be at least 1 (got 0+2)".into()),
        ),
        (
            "BadEcMinSize",
            MapError::BadEcMinSize {
                k: 4,
                m: 2,
                min_size: 3,
            },
        ),
        (
            "EcFixed",
            MapError::EcFixed {
                pool: "ec-pool".into(),
                what: "size (k + m)".into(),
            },
        ),
    ]
}

pub fn secret(b: u8) -> Secret {
    Secret([b; 32])
}

/// Every change of the key database.
pub fn key_changes() -> Vec<(&'static str, KeyChange)> {
    vec![
        (
            "Seed",
            KeyChange::Seed(vec![(Entity::admin(), secret(0x31), Caps::admin())]),
        ),
        (
            "Add",
            KeyChange::Add {
                entity: entity(),
                secret: secret(0x32),
                caps: caps(),
            },
        ),
        (
            "SetCaps",
            KeyChange::SetCaps {
                entity: entity(),
                caps: Caps {
                    mon: "r".into(),
                    ..caps()
                },
            },
        ),
        (
            "Rotate",
            KeyChange::Rotate {
                entity: entity(),
                secret: secret(0x33),
                keep_old_until: 1_767_229_300,
            },
        ),
        (
            "Remove",
            KeyChange::Remove {
                entity: "nbd.gw1".parse().unwrap(),
            },
        ),
        (
            "RotateMon",
            KeyChange::RotateMon {
                secret: secret(0x34),
                previous: secret(0x35),
                keep_old_until: 1_767_229_400,
            },
        ),
    ]
}

/// A seeded key database with a rotated key (its predecessor still accepted) and the
/// monitors' rotated key.
pub fn key_db() -> KeyDb {
    let admin = StoredKey {
        secret: secret(0x41),
        caps: Caps::admin(),
        previous: None,
    };
    let golden = StoredKey {
        secret: secret(0x42),
        caps: caps(),
        previous: Some((secret(0x43), 1_767_229_500)),
    };
    KeyDb {
        seeded: true,
        keys: [(Entity::admin(), admin), (entity(), golden)]
            .into_iter()
            .collect(),
        mon: Some(mon_key()),
    }
}

pub fn mon_key() -> MonKey {
    MonKey {
        secret: secret(0x44),
        previous: Some((secret(0x45), 1_767_229_600)),
    }
}
