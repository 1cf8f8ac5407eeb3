//! Format 3 -> 4 (and on to the current format), at open: pools gained a placement rule and
//! the map gained host labels.
//!
//! Every existing pool gets `PlacementRule::FlatV1`, the placement it always had, so no data
//! moves on upgrade (`cairn pool set NAME domain D` moves a pool to placement version 2 when
//! the operator chooses). The map has no host labels yet. Rewritten: the applied state, the
//! last snapshot and the history's base map; the Raft log and the history's incrementals are
//! unchanged (map changes only gained variants).
//!
//! The format-3 types here are also the older migrations' targets (`crate::migrate`).

use crate::migrate_v6::KeyDbV5;
use crate::state_machine::{SmData, SnapshotData, StoredSnapshot};
use crate::store::{dec, enc, key, StoreError, META};
use crate::types::{LogId, StoredMembership};
use cairn_map::{ClusterMap, Durability, Incremental, OsdInfo, PlacementRule, Pool};
use redb::{Database, ReadableTable};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// A pool before format 4 (no rule).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PoolV3 {
    pub id: u32,
    pub name: String,
    pub size: u8,
    pub min_size: u8,
    pub pg_count: u32,
    pub durability: Durability,
}

/// The map before format 4 (no host labels).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ClusterMapV3 {
    pub fsid: [u8; 16],
    pub epoch: u64,
    pub osds: BTreeMap<u32, OsdInfo>,
    pub pools: BTreeMap<u32, PoolV3>,
    pub next_pool_id: u32,
    pub next_osd_id: u32,
}

/// The map history of formats 2 and 3.
#[derive(Serialize, Deserialize)]
pub(crate) struct HistoryV3 {
    pub base: ClusterMapV3,
    pub incs: VecDeque<Incremental>,
}

/// The applied state of format 3.
#[derive(Serialize, Deserialize)]
pub(crate) struct SmDataV3 {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub map: ClusterMapV3,
    pub keys: KeyDbV5,
}

/// A snapshot's state in format 3.
#[derive(Serialize, Deserialize)]
pub(crate) struct SnapshotDataV3 {
    pub sm: SmDataV3,
    pub history: HistoryV3,
}

/// Every pool keeps placement version 1; no host has labels.
pub(crate) fn map_v4(m: ClusterMapV3) -> ClusterMap {
    let pools = m
        .pools
        .into_iter()
        .map(|(id, p)| {
            let pool = Pool {
                id: p.id,
                name: p.name,
                size: p.size,
                min_size: p.min_size,
                pg_count: p.pg_count,
                durability: p.durability,
                rule: PlacementRule::FlatV1,
            };
            (id, pool)
        })
        .collect();
    ClusterMap {
        fsid: m.fsid,
        epoch: m.epoch,
        osds: m.osds,
        pools,
        next_pool_id: m.next_pool_id,
        next_osd_id: m.next_osd_id,
        hosts: BTreeMap::new(),
        blocklist: BTreeMap::new(),
    }
}

fn sm_v4(v: SmDataV3) -> SmData {
    SmData {
        last_applied: v.last_applied,
        membership: v.membership,
        map: map_v4(v.map),
        keys: v.keys.into(),
    }
}

/// Rewrites a format-3 database in the current format in one transaction.
pub(crate) fn from_v3(db: &Database) -> Result<(), StoreError> {
    rewrite(
        db,
        &|b| Ok(sm_v4(dec::<SmDataV3>("format 3 state", b)?)),
        &|b| {
            let old: SnapshotDataV3 = dec("format 3 snapshot state", b)?;
            Ok(SnapshotData {
                sm: sm_v4(old.sm),
                history: crate::history::History {
                    base: map_v4(old.history.base),
                    incs: old.history.incs,
                },
            })
        },
        &|b| Ok(map_v4(dec::<ClusterMapV3>("format 3 history base", b)?)),
    )
}

/// Decodes one stored value of an older format into the current one.
pub(crate) type Upgrade<'a, T> = &'a dyn Fn(&[u8]) -> Result<T, StoreError>;

/// Rewrites the three stored values that hold a map (the applied state, the last snapshot's
/// state and the history's base map) with the upgrades given, and marks the database as the
/// current format, in one transaction. The Raft log and the history's incrementals are kept:
/// map changes only ever gain variants.
pub(crate) fn rewrite(
    db: &Database,
    sm: Upgrade<'_, SmData>,
    snapshot: Upgrade<'_, SnapshotData>,
    base: Upgrade<'_, ClusterMap>,
) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        let state = match meta.get(key::STATE_MACHINE)? {
            Some(v) => Some(sm(v.value())?),
            None => None,
        };
        if let Some(state) = &state {
            meta.insert(key::STATE_MACHINE, enc(state).as_slice())?;
        }
        let snap = match meta.get(key::SNAPSHOT)? {
            Some(v) => Some(dec::<StoredSnapshot>("stored snapshot", v.value())?),
            None => None,
        };
        if let Some(s) = snap {
            let stored = StoredSnapshot {
                meta: s.meta,
                data: enc(&snapshot(&s.data)?),
            };
            meta.insert(key::SNAPSHOT, enc(&stored).as_slice())?;
        }
        let map = match meta.get(crate::history::BASE_KEY)? {
            Some(v) => Some(base(v.value())?),
            None => None,
        };
        if let Some(map) = map {
            meta.insert(crate::history::BASE_KEY, enc(&map).as_slice())?;
        }
        meta.insert(key::FORMAT, enc(&crate::store::FORMAT).as_slice())?;
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3_map() -> ClusterMapV3 {
        let pool = PoolV3 {
            id: 1,
            name: "rbd".into(),
            size: 3,
            min_size: 2,
            pg_count: 32,
            durability: Durability::Wal,
        };
        ClusterMapV3 {
            fsid: [7; 16],
            epoch: 9,
            osds: BTreeMap::new(),
            pools: [(1, pool)].into_iter().collect(),
            next_pool_id: 2,
            next_osd_id: 0,
        }
    }

    #[test]
    fn a_format_3_database_keeps_its_pools_on_placement_v1() {
        let dir = std::env::temp_dir().join(format!("cairn-mon-migrate4-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = crate::store::open(&dir, 1, [7; 16]).unwrap();
        let sm = SmDataV3 {
            last_applied: None,
            membership: StoredMembership::default(),
            map: v3_map(),
            keys: KeyDbV5::default(),
        };
        let snap = StoredSnapshot {
            meta: openraft::SnapshotMeta::default(),
            data: enc(&SnapshotDataV3 {
                sm: SmDataV3 {
                    last_applied: None,
                    membership: StoredMembership::default(),
                    map: v3_map(),
                    keys: KeyDbV5::default(),
                },
                history: HistoryV3 {
                    base: v3_map(),
                    incs: VecDeque::new(),
                },
            }),
        };
        crate::store::put_meta(
            &db,
            redb::Durability::Immediate,
            &[
                (key::STATE_MACHINE, &enc(&sm)),
                (key::SNAPSHOT, &enc(&snap)),
                (crate::history::BASE_KEY, &enc(&v3_map())),
                (key::FORMAT, &enc(&3u32)),
            ],
        )
        .unwrap();
        drop(db);
        let db = crate::store::open(&dir, 1, [7; 16]).unwrap();
        let format: u32 = crate::store::get_meta(&db, key::FORMAT).unwrap().unwrap();
        assert_eq!(format, crate::store::FORMAT);
        let snap: StoredSnapshot = crate::store::get_meta(&db, key::SNAPSHOT).unwrap().unwrap();
        let data: SnapshotData = dec("snapshot", &snap.data).unwrap();
        assert_eq!(data.sm.map.pools[&1].rule, PlacementRule::FlatV1);
        assert_eq!(data.history.base.pools[&1].pg_count, 32);
        let sm = crate::state_machine::StateMachine::open(db, [7; 16]).unwrap();
        sm.view().with_map(|m| {
            assert_eq!(m.epoch, 9);
            assert_eq!(m.pools[&1].rule, PlacementRule::FlatV1);
            assert_eq!(m.pools[&1].name, "rbd");
            assert!(m.hosts.is_empty());
        });
        assert_eq!(sm.view().history_oldest(), 9);
        drop(sm);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
