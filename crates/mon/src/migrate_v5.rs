//! Format 4 -> 5, at open: the map gained the client blocklist (fenced client instances,
//! `ClusterMap::blocklist`), empty after the upgrade. Same rewrite as format 4's
//! (`crate::migrate_v4::rewrite`).

use crate::history::History;
use crate::migrate_v6::KeyDbV5;
use crate::state_machine::{SmData, SnapshotData};
use crate::store::{dec, StoreError};
use crate::types::{LogId, StoredMembership};
use cairn_map::{ClusterMap, HostLocation, Incremental, OsdInfo, Pool};
use redb::Database;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// The map of format 4 (no blocklist).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ClusterMapV4 {
    pub fsid: [u8; 16],
    pub epoch: u64,
    pub osds: BTreeMap<u32, OsdInfo>,
    pub pools: BTreeMap<u32, Pool>,
    pub next_pool_id: u32,
    pub next_osd_id: u32,
    pub hosts: BTreeMap<String, HostLocation>,
}

#[derive(Serialize, Deserialize)]
struct HistoryV4 {
    base: ClusterMapV4,
    incs: VecDeque<Incremental>,
}

#[derive(Serialize, Deserialize)]
struct SmDataV4 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    map: ClusterMapV4,
    keys: KeyDbV5,
}

#[derive(Serialize, Deserialize)]
struct SnapshotDataV4 {
    sm: SmDataV4,
    history: HistoryV4,
}

fn map_v5(m: ClusterMapV4) -> ClusterMap {
    ClusterMap {
        fsid: m.fsid,
        epoch: m.epoch,
        osds: m.osds,
        pools: m.pools,
        next_pool_id: m.next_pool_id,
        next_osd_id: m.next_osd_id,
        hosts: m.hosts,
        blocklist: BTreeMap::new(),
    }
}

fn sm_v5(v: SmDataV4) -> SmData {
    SmData {
        last_applied: v.last_applied,
        membership: v.membership,
        map: map_v5(v.map),
        keys: v.keys.into(),
    }
}

/// Rewrites a format-4 database in the current format in one transaction.
pub(crate) fn from_v4(db: &Database) -> Result<(), StoreError> {
    crate::migrate_v4::rewrite(
        db,
        &|b| Ok(sm_v5(dec::<SmDataV4>("format 4 state", b)?)),
        &|b| {
            let old: SnapshotDataV4 = dec("format 4 snapshot state", b)?;
            Ok(SnapshotData {
                sm: sm_v5(old.sm),
                history: History {
                    base: map_v5(old.history.base),
                    incs: old.history.incs,
                },
            })
        },
        &|b| Ok(map_v5(dec::<ClusterMapV4>("format 4 history base", b)?)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::StoredSnapshot;
    use crate::store::{enc, key};
    use cairn_map::{Durability, PlacementRule};

    fn v4_map() -> ClusterMapV4 {
        let pool = Pool {
            id: 1,
            name: "rbd".into(),
            size: 3,
            min_size: 2,
            pg_count: 32,
            durability: Durability::Wal,
            rule: PlacementRule::FlatV1,
        };
        let at = HostLocation {
            zone: "z1".into(),
            rack: "r1".into(),
        };
        ClusterMapV4 {
            fsid: [7; 16],
            epoch: 12,
            osds: BTreeMap::new(),
            pools: [(1, pool)].into_iter().collect(),
            next_pool_id: 2,
            next_osd_id: 0,
            hosts: [("h1".to_string(), at)].into_iter().collect(),
        }
    }

    fn v4_state() -> SmDataV4 {
        SmDataV4 {
            last_applied: None,
            membership: StoredMembership::default(),
            map: v4_map(),
            keys: KeyDbV5::default(),
        }
    }

    #[test]
    fn a_format_4_database_keeps_its_map_and_gets_an_empty_blocklist() {
        let dir = std::env::temp_dir().join(format!("cairn-mon-migrate5-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = crate::store::open(&dir, 1, [7; 16]).unwrap();
        let snap = StoredSnapshot {
            meta: openraft::SnapshotMeta::default(),
            data: enc(&SnapshotDataV4 {
                sm: v4_state(),
                history: HistoryV4 {
                    base: v4_map(),
                    incs: VecDeque::new(),
                },
            }),
        };
        crate::store::put_meta(
            &db,
            redb::Durability::Immediate,
            &[
                (key::STATE_MACHINE, &enc(&v4_state())),
                (key::SNAPSHOT, &enc(&snap)),
                (crate::history::BASE_KEY, &enc(&v4_map())),
                (key::FORMAT, &enc(&4u32)),
            ],
        )
        .unwrap();
        drop(db);
        let db = crate::store::open(&dir, 1, [7; 16]).unwrap();
        let format: u32 = crate::store::get_meta(&db, key::FORMAT).unwrap().unwrap();
        assert_eq!(format, crate::store::FORMAT);
        let snap: StoredSnapshot = crate::store::get_meta(&db, key::SNAPSHOT).unwrap().unwrap();
        let data: SnapshotData = dec("snapshot", &snap.data).unwrap();
        assert_eq!(data.sm.map.hosts["h1"].rack, "r1");
        assert!(data.history.base.blocklist.is_empty());
        let sm = crate::state_machine::StateMachine::open(db, [7; 16]).unwrap();
        sm.view().with_map(|m| {
            assert_eq!(m.epoch, 12);
            assert_eq!(m.pools[&1].name, "rbd");
            assert_eq!(m.hosts["h1"].zone, "z1");
            assert!(m.blocklist.is_empty());
        });
        drop(sm);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
