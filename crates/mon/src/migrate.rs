//! Upgrades a monitor database written by an older format in place, at open.
//!
//! Format 1 -> 2: the map's OSDs gained `lost_at` (0 for every existing OSD) and snapshots
//! carry the map history. The Raft log is unchanged (map changes only gained variants).
//! The applied state and the last snapshot are rewritten; the history starts at the current
//! map (format 1 kept none).

use crate::history::History;
use crate::state_machine::{SmData, SnapshotData, StoredSnapshot};
use crate::store::{dec, enc, key, StoreError, META};
use crate::types::StoredMembership;
use cairn_map::{ClusterMap, OsdInfo, Pool};
use redb::{Database, ReadableTable};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    pools: BTreeMap<u32, Pool>,
    next_pool_id: u32,
    next_osd_id: u32,
}

#[derive(Serialize, Deserialize)]
struct SmDataV1 {
    last_applied: Option<crate::types::LogId>,
    membership: StoredMembership,
    map: ClusterMapV1,
}

fn upgrade_map(m: ClusterMapV1) -> ClusterMap {
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
    ClusterMap {
        fsid: m.fsid,
        epoch: m.epoch,
        osds,
        pools: m.pools,
        next_pool_id: m.next_pool_id,
        next_osd_id: m.next_osd_id,
    }
}

fn upgrade_sm(v: SmDataV1) -> SmData {
    SmData {
        last_applied: v.last_applied,
        membership: v.membership,
        map: upgrade_map(v.map),
    }
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
            let history = History::starting_at(&sm.map);
            let stored = StoredSnapshot {
                meta: s.meta,
                data: enc(&SnapshotData { sm, history }),
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
}
