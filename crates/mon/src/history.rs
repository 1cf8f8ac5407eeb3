//! The map's history: the map at the oldest epoch kept (the base) and every incremental
//! after it, so that peering can learn a PG's past intervals (`cairn_map::intervals`).
//!
//! Kept by every monitor as part of its applied state: each applied change adds its
//! incremental (table `map_history`, epoch -> postcard `Incremental`, written in the same
//! transaction as the applied state), snapshots carry base and incrementals, and only a
//! replicated `MapChange::TrimHistory` drops epochs, once no PG needs them: the leader
//! trims to the oldest `last_epoch_started` the primaries of all PGs report
//! (`crate::pg_starts`).

use crate::store::{dec, enc, StoreError, META};
use cairn_map::{ClusterMap, Incremental};
use redb::{Database, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Incrementals kept, by epoch.
pub(crate) const TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("map_history");
/// `meta` entry holding the base map.
pub(crate) const BASE_KEY: &str = "history_base";

/// The base map and the consecutive incrementals from its epoch to the current one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct History {
    pub base: ClusterMap,
    pub incs: VecDeque<Incremental>,
}

impl History {
    /// No history before `map` (a new cluster, or one whose history was never kept).
    pub fn starting_at(map: &ClusterMap) -> Self {
        History {
            base: map.clone(),
            incs: VecDeque::new(),
        }
    }

    /// The oldest epoch whose map can be rebuilt.
    pub fn oldest(&self) -> u64 {
        self.base.epoch
    }

    /// Records the change that produced `inc.epoch`.
    pub fn push(&mut self, inc: Incremental) {
        self.incs.push_back(inc);
    }

    /// Moves the base forward to epoch `below` (at most the newest epoch); returns the
    /// epochs dropped, or `None` when there is nothing to drop.
    pub fn trim(&mut self, below: u64) -> Option<Vec<u64>> {
        let mut dropped = Vec::new();
        while let Some(inc) = self.incs.front() {
            if inc.epoch > below {
                break;
            }
            // The history is consecutive from the base, so this cannot fail; stop trimming
            // rather than lose the base if it ever does.
            if let Err(e) = self.base.apply_incremental(inc) {
                tracing::error!(error = %e, epoch = inc.epoch, "map history does not apply; not trimming it");
                break;
            }
            dropped.push(inc.epoch);
            self.incs.pop_front();
        }
        (!dropped.is_empty()).then_some(dropped)
    }
}

/// What the applied-state save does to the history table.
#[derive(Default)]
pub(crate) struct HistoryWrite {
    pub added: Vec<(u64, Vec<u8>)>,
    pub dropped: Vec<u64>,
    /// The new base after a trim.
    pub base: Option<Vec<u8>>,
}

impl HistoryWrite {
    /// Applies this write in `txn`.
    pub fn apply(&self, txn: &redb::WriteTransaction) -> Result<(), StoreError> {
        let mut table = txn.open_table(TABLE)?;
        for (epoch, bytes) in &self.added {
            table.insert(*epoch, bytes.as_slice())?;
        }
        for epoch in &self.dropped {
            table.remove(*epoch)?;
        }
        if let Some(b) = &self.base {
            txn.open_table(META)?.insert(BASE_KEY, b.as_slice())?;
        }
        Ok(())
    }
}

/// Replaces the stored history with `h` (a snapshot was installed) in `txn`.
pub(crate) fn replace(txn: &redb::WriteTransaction, h: &History) -> Result<(), StoreError> {
    txn.delete_table(TABLE)?;
    let mut table = txn.open_table(TABLE)?;
    for inc in &h.incs {
        table.insert(inc.epoch, enc(inc).as_slice())?;
    }
    txn.open_table(META)?
        .insert(BASE_KEY, enc(&h.base).as_slice())?;
    Ok(())
}

/// Loads the history ending at `map` (the applied state being opened). A history that does
/// not reach `map` (never kept, or damaged) restarts at `map`, with an error logged.
pub(crate) fn load(db: &Database, map: &ClusterMap) -> Result<History, StoreError> {
    let txn = db.begin_read()?;
    let base: Option<ClusterMap> = match txn.open_table(META)?.get(BASE_KEY)? {
        Some(v) => Some(dec(BASE_KEY, v.value())?),
        None => None,
    };
    let Some(base) = base else {
        return Ok(History::starting_at(map));
    };
    let mut h = History::starting_at(&base);
    let table = match txn.open_table(TABLE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(History::starting_at(map)),
        Err(e) => return Err(e.into()),
    };
    let mut rebuilt = base;
    for row in table.range(h.oldest() + 1..=map.epoch)? {
        let (_, v) = row?;
        let inc: Incremental = dec("map history", v.value())?;
        if rebuilt.apply_incremental(&inc).is_err() {
            break;
        }
        h.push(inc);
    }
    if rebuilt != *map {
        tracing::error!(
            kept_until = rebuilt.epoch,
            epoch = map.epoch,
            "the map history does not lead to the applied map; it restarts here (PGs down \
             now may need `cairn osd lost` to go on)"
        );
        return Ok(History::starting_at(map));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_map::MapChange;

    fn grown(n: u32) -> (History, ClusterMap) {
        let mut map = ClusterMap::new([3; 16]);
        let mut h = History::starting_at(&map);
        for i in 0..n {
            let change = MapChange::PoolCreate {
                name: format!("p{i}"),
                size: 1,
                min_size: 1,
                pg_count: 1,
                durability: cairn_map::Durability::Wal,
            };
            map.apply(&change).unwrap();
            h.push(Incremental {
                epoch: map.epoch,
                change,
            });
        }
        (h, map)
    }

    #[test]
    fn trimming_moves_the_base_to_the_map_of_that_epoch() {
        let (mut h, map) = grown(10);
        assert_eq!(h.oldest(), 1);
        assert_eq!(h.trim(4), Some(vec![2, 3, 4]));
        assert_eq!(h.oldest(), 4);
        assert_eq!(h.base.pools.len(), 3);
        assert_eq!(h.trim(3), None, "never backwards");
        assert_eq!(h.trim(1000).map(|d| d.len()), Some(7));
        assert_eq!(h.base, map);
    }

    #[test]
    fn history_survives_a_reopen_and_a_damaged_one_restarts_at_the_map() {
        let path = std::env::temp_dir().join(format!("cairn-mon-history-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let db = Database::create(&path).unwrap();
        let (h, map) = grown(5);
        let txn = db.begin_write().unwrap();
        replace(&txn, &h).unwrap();
        txn.commit().unwrap();
        assert_eq!(load(&db, &map).unwrap(), h);
        // A row lost: the history cannot rebuild the map.
        let txn = db.begin_write().unwrap();
        txn.open_table(TABLE).unwrap().remove(3).unwrap();
        txn.commit().unwrap();
        assert_eq!(load(&db, &map).unwrap(), History::starting_at(&map));
        drop(db);
        let _ = std::fs::remove_file(&path);
    }
}
