//! Upgrades a monitor database written by an older format in place, at open.
//!
//! Format 1 -> 2: the map's OSDs gained `lost_at` (0 for every existing OSD) and snapshots
//! carry the map history. The Raft log is unchanged (map changes only gained variants).
//! The applied state and the last snapshot are rewritten; the history starts at the current
//! map (format 1 kept none).
//!
//! Format 2 -> 3: the applied state and snapshots gained the key database (empty and
//! unseeded: the leader seeds it from its keyring file, as on a new cluster), and a log
//! entry carries a `Proposal` (`Map(change)` or `Keys(change)`) instead of a bare map
//! change: every log entry is rewritten.
//!
//! Both produce the format-3 types of `crate::migrate_v4`, which then upgrades to format 4.

use crate::migrate_v4::{ClusterMapV3, HistoryV3, PoolV3, SmDataV3, SnapshotDataV3};
use crate::migrate_v6::KeyDbV5;
use crate::state_machine::StoredSnapshot;
use crate::store::{dec, enc, key, StoreError, LOG, META};
use crate::types::{BasicNode, Entry, LogId, NodeId, Proposal, StoredMembership};
use cairn_map::{ChangeOutcome, MapChange, MapError, OsdInfo};
use openraft::EntryPayload;
use redb::{Database, ReadableTable};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
// The macro names `Cursor` unqualified for its default snapshot type.
use std::io::Cursor;

openraft::declare_raft_types!(
    /// The type configuration of a format-2 Raft log: entries carried a bare map change.
    V2Raft:
        D = MapChange,
        R = Result<ChangeOutcome, MapError>,
        NodeId = NodeId,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

#[derive(Serialize, Deserialize)]
struct OsdInfoV1 {
    id: u32,
    addr: String,
    host: String,
    up: bool,
    in_: bool,
    weight: u32,
    up_from: u64,
    store_id: [u8; 16],
}

#[derive(Serialize, Deserialize)]
struct ClusterMapV1 {
    fsid: [u8; 16],
    epoch: u64,
    osds: BTreeMap<u32, OsdInfoV1>,
    pools: BTreeMap<u32, PoolV3>,
    next_pool_id: u32,
    next_osd_id: u32,
}

#[derive(Serialize, Deserialize)]
struct SmDataV1 {
    last_applied: Option<crate::types::LogId>,
    membership: StoredMembership,
    map: ClusterMapV1,
}

fn upgrade_map(m: ClusterMapV1) -> ClusterMapV3 {
    let osds = m
        .osds
        .into_iter()
        .map(|(id, o)| {
            let info = OsdInfo {
                id: o.id,
                addr: o.addr,
                host: o.host,
                up: o.up,
                in_: o.in_,
                weight: o.weight,
                up_from: o.up_from,
                store_id: o.store_id,
                lost_at: 0,
            };
            (id, info)
        })
        .collect();
    ClusterMapV3 {
        fsid: m.fsid,
        epoch: m.epoch,
        osds,
        pools: m.pools,
        next_pool_id: m.next_pool_id,
        next_osd_id: m.next_osd_id,
    }
}

fn upgrade_sm(v: SmDataV1) -> SmDataV2 {
    SmDataV2 {
        last_applied: v.last_applied,
        membership: v.membership,
        map: upgrade_map(v.map),
    }
}

/// The applied state of format 2 (no key database).
#[derive(Serialize, Deserialize)]
struct SmDataV2 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    map: ClusterMapV3,
}

#[derive(Serialize, Deserialize)]
struct SnapshotDataV2 {
    sm: SmDataV2,
    history: HistoryV3,
}

/// A history that starts at `map` (format 1 kept none).
fn history_at(map: &ClusterMapV3) -> HistoryV3 {
    HistoryV3 {
        base: map.clone(),
        incs: Default::default(),
    }
}

fn sm_v3(v: SmDataV2) -> SmDataV3 {
    SmDataV3 {
        last_applied: v.last_applied,
        membership: v.membership,
        map: v.map,
        keys: KeyDbV5::default(),
    }
}

fn entry_v3(e: openraft::Entry<V2Raft>) -> Entry {
    let payload = match e.payload {
        EntryPayload::Blank => EntryPayload::Blank,
        EntryPayload::Normal(c) => EntryPayload::Normal(Proposal::Map(c)),
        EntryPayload::Membership(m) => EntryPayload::Membership(m),
    };
    Entry {
        log_id: e.log_id,
        payload,
    }
}

/// Rewrites a format-2 database as format 3 in one transaction: the applied state, the last
/// snapshot and every log entry.
pub(crate) fn from_v2(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        let sm = match meta.get(key::STATE_MACHINE)? {
            Some(v) => Some(sm_v3(dec::<SmDataV2>("format 2 state", v.value())?)),
            None => None,
        };
        if let Some(sm) = &sm {
            meta.insert(key::STATE_MACHINE, enc(sm).as_slice())?;
        }
        let snap = match meta.get(key::SNAPSHOT)? {
            Some(v) => Some(dec::<StoredSnapshot>("format 2 snapshot", v.value())?),
            None => None,
        };
        if let Some(s) = snap {
            let old: SnapshotDataV2 = dec("format 2 snapshot state", &s.data)?;
            let data = SnapshotDataV3 {
                sm: sm_v3(old.sm),
                history: old.history,
            };
            let stored = StoredSnapshot {
                meta: s.meta,
                data: enc(&data),
            };
            meta.insert(key::SNAPSHOT, enc(&stored).as_slice())?;
        }
        let mut log = txn.open_table(LOG)?;
        let mut rewritten = Vec::new();
        for row in log.iter()? {
            let (k, v) = row?;
            let old: openraft::Entry<V2Raft> = dec("format 2 log entry", v.value())?;
            rewritten.push((k.value(), enc(&entry_v3(old))));
        }
        for (k, v) in rewritten {
            log.insert(k, v.as_slice())?;
        }
        meta.insert(key::FORMAT, enc(&3u32).as_slice())?;
    }
    txn.commit()?;
    Ok(())
}

/// Rewrites a format-1 database as format 2 in one transaction.
pub(crate) fn from_v1(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        let sm = match meta.get(key::STATE_MACHINE)? {
            Some(v) => Some(upgrade_sm(dec::<SmDataV1>("format 1 state", v.value())?)),
            None => None,
        };
        if let Some(sm) = &sm {
            meta.insert(key::STATE_MACHINE, enc(sm).as_slice())?;
        }
        let snap = match meta.get(key::SNAPSHOT)? {
            Some(v) => Some(dec::<StoredSnapshot>("format 1 snapshot", v.value())?),
            None => None,
        };
        if let Some(s) = snap {
            let old: SmDataV1 = dec("format 1 snapshot state", &s.data)?;
            let sm = upgrade_sm(old);
            let history = history_at(&sm.map);
            let stored = StoredSnapshot {
                meta: s.meta,
                data: enc(&SnapshotDataV2 { sm, history }),
            };
            meta.insert(key::SNAPSHOT, enc(&stored).as_slice())?;
        }
        meta.insert(key::FORMAT, enc(&2u32).as_slice())?;
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::SnapshotData;

    fn empty_v3(fsid: [u8; 16]) -> ClusterMapV3 {
        ClusterMapV3 {
            fsid,
            epoch: 1,
            osds: BTreeMap::new(),
            pools: BTreeMap::new(),
            next_pool_id: 1,
            next_osd_id: 0,
        }
    }

    #[test]
    fn a_format_1_database_opens_with_its_map_and_no_osd_lost() {
        let dir = std::env::temp_dir().join(format!("cairn-mon-migrate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = crate::store::open(&dir, 1, [5; 16]).unwrap();
        let osd = OsdInfoV1 {
            id: 0,
            addr: "127.0.0.1:7000".into(),
            host: "h".into(),
            up: true,
            in_: true,
            weight: 0x10000,
            up_from: 3,
            store_id: [1; 16],
        };
        let v1 = SmDataV1 {
            last_applied: None,
            membership: StoredMembership::default(),
            map: ClusterMapV1 {
                fsid: [5; 16],
                epoch: 3,
                osds: [(0, osd)].into_iter().collect(),
                pools: BTreeMap::new(),
                next_pool_id: 1,
                next_osd_id: 1,
            },
        };
        crate::store::put_meta(
            &db,
            redb::Durability::Immediate,
            &[(key::STATE_MACHINE, &enc(&v1)), (key::FORMAT, &enc(&1u32))],
        )
        .unwrap();
        drop(db);
        let db = crate::store::open(&dir, 1, [5; 16]).unwrap();
        let sm = crate::state_machine::StateMachine::open(db, [5; 16]).unwrap();
        let view = sm.view();
        view.with_map(|m| {
            assert_eq!(m.epoch, 3);
            assert_eq!(m.osds[&0].lost_at, 0);
            assert_eq!(m.osds[&0].up_from, 3);
        });
        assert_eq!(view.history_oldest(), 3);
        drop(sm);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_format_2_database_keeps_its_log_and_gets_an_unseeded_key_database() {
        let dir = std::env::temp_dir().join(format!("cairn-mon-migrate2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = crate::store::open(&dir, 1, [6; 16]).unwrap();
        let v2 = SmDataV2 {
            last_applied: None,
            membership: StoredMembership::default(),
            map: empty_v3([6; 16]),
        };
        let change = MapChange::OsdOut { id: 3 };
        let entry = openraft::Entry::<V2Raft> {
            log_id: LogId::new(openraft::CommittedLeaderId::new(2, 1), 7),
            payload: EntryPayload::Normal(change.clone()),
        };
        let snap = StoredSnapshot {
            meta: openraft::SnapshotMeta::default(),
            data: enc(&SnapshotDataV2 {
                history: history_at(&v2.map),
                sm: SmDataV2 {
                    last_applied: None,
                    membership: StoredMembership::default(),
                    map: empty_v3([6; 16]),
                },
            }),
        };
        crate::store::put_meta(
            &db,
            redb::Durability::Immediate,
            &[
                (key::STATE_MACHINE, &enc(&v2)),
                (key::SNAPSHOT, &enc(&snap)),
                (key::FORMAT, &enc(&2u32)),
            ],
        )
        .unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(LOG)
            .unwrap()
            .insert(7u64, enc(&entry).as_slice())
            .unwrap();
        txn.commit().unwrap();
        drop(db);
        let db = crate::store::open(&dir, 1, [6; 16]).unwrap();
        let format: u32 = crate::store::get_meta(&db, key::FORMAT).unwrap().unwrap();
        assert_eq!(format, crate::store::FORMAT);
        let txn = db.begin_read().unwrap();
        let log = txn.open_table(LOG).unwrap();
        let got: Entry = dec("entry", log.get(7u64).unwrap().unwrap().value()).unwrap();
        assert_eq!(got.log_id.index, 7);
        assert!(matches!(got.payload, EntryPayload::Normal(Proposal::Map(c)) if c == change));
        drop(log);
        drop(txn);
        let snap: StoredSnapshot = crate::store::get_meta(&db, key::SNAPSHOT).unwrap().unwrap();
        let data: SnapshotData = dec("snapshot", &snap.data).unwrap();
        assert!(!data.sm.keys.seeded);
        let sm = crate::state_machine::StateMachine::open(db, [6; 16]).unwrap();
        assert!(sm.view().with_keys(|k| !k.seeded && k.keys.is_empty()));
        drop(sm);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
