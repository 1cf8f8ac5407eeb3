//! Format 5 -> 6, at open: the key database gained the monitors' key (`KeyDb::mon`, set by
//! its first rotation, `cairn auth rotate mon`), absent after the upgrade. Same rewrite as
//! format 4's (`crate::migrate_v4::rewrite`).

use crate::history::History;
use crate::state_machine::{SmData, SnapshotData};
use crate::store::{dec, StoreError};
use crate::types::{LogId, StoredMembership};
use cairn_auth::{Entity, KeyDb, StoredKey};
use cairn_map::ClusterMap;
use redb::Database;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The key database of formats 3 to 5 (no monitors' key).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct KeyDbV5 {
    pub seeded: bool,
    pub keys: BTreeMap<Entity, StoredKey>,
}

impl From<KeyDbV5> for KeyDb {
    fn from(k: KeyDbV5) -> KeyDb {
        KeyDb {
            seeded: k.seeded,
            keys: k.keys,
            mon: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct SmDataV5 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    map: ClusterMap,
    keys: KeyDbV5,
}

#[derive(Serialize, Deserialize)]
struct SnapshotDataV5 {
    sm: SmDataV5,
    history: History,
}

fn sm_v6(v: SmDataV5) -> SmData {
    SmData {
        last_applied: v.last_applied,
        membership: v.membership,
        map: v.map,
        keys: v.keys.into(),
    }
}

/// Rewrites a format-5 database in the current format in one transaction.
pub(crate) fn from_v5(db: &Database) -> Result<(), StoreError> {
    crate::migrate_v4::rewrite(
        db,
        &|b| Ok(sm_v6(dec::<SmDataV5>("format 5 state", b)?)),
        &|b| {
            let old: SnapshotDataV5 = dec("format 5 snapshot state", b)?;
            Ok(SnapshotData {
                sm: sm_v6(old.sm),
                history: old.history,
            })
        },
        &|b| dec::<ClusterMap>("format 5 history base", b),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::StoredSnapshot;
    use crate::store::{enc, key};
    use cairn_auth::{Caps, Secret};

    fn v5_state() -> SmDataV5 {
        let admin = StoredKey {
            secret: Secret([9; 32]),
            caps: Caps::admin(),
            previous: None,
        };
        let mut map = ClusterMap::new([7; 16]);
        map.epoch = 21;
        SmDataV5 {
            last_applied: None,
            membership: StoredMembership::default(),
            map,
            keys: KeyDbV5 {
                seeded: true,
                keys: [(Entity::admin(), admin)].into_iter().collect(),
            },
        }
    }

    #[test]
    fn a_format_5_database_keeps_its_keys_and_has_no_rotated_monitors_key() {
        let dir = std::env::temp_dir().join(format!("cairn-mon-migrate6-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = crate::store::open(&dir, 1, [7; 16]).unwrap();
        let history = History::starting_at(&v5_state().map);
        let snap = StoredSnapshot {
            meta: openraft::SnapshotMeta::default(),
            data: enc(&SnapshotDataV5 {
                sm: v5_state(),
                history,
            }),
        };
        crate::store::put_meta(
            &db,
            redb::Durability::Immediate,
            &[
                (key::STATE_MACHINE, &enc(&v5_state())),
                (key::SNAPSHOT, &enc(&snap)),
                (crate::history::BASE_KEY, &enc(&v5_state().map)),
                (key::FORMAT, &enc(&5u32)),
            ],
        )
        .unwrap();
        drop(db);
        let db = crate::store::open(&dir, 1, [7; 16]).unwrap();
        let format: u32 = crate::store::get_meta(&db, key::FORMAT).unwrap().unwrap();
        assert_eq!(format, 6);
        let snap: StoredSnapshot = crate::store::get_meta(&db, key::SNAPSHOT).unwrap().unwrap();
        let data: SnapshotData = dec("snapshot", &snap.data).unwrap();
        assert!(data.sm.keys.seeded && data.sm.keys.mon.is_none());
        assert_eq!(data.sm.map.epoch, 21);
        let sm = crate::state_machine::StateMachine::open(db, [7; 16]).unwrap();
        sm.view().with_keys(|k| {
            assert!(k.seeded && k.mon.is_none());
            assert_eq!(k.keys[&Entity::admin()].secret, Secret([9; 32]));
        });
        sm.view().with_map(|m| assert_eq!(m.epoch, 21));
        drop(sm);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
