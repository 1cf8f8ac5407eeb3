//! How far back the map history must reach: the epoch every PG last went active
//! (`last_epoch_started`), as its primary reports it in heartbeats.
//!
//! Peering asks for a PG's past intervals from its `last_epoch_started`, so the history may
//! be trimmed up to the oldest of these over all PGs. The leader keeps the reports in memory
//! and trims only once every PG of every pool has been reported in its term: a PG whose
//! OSDs are all down is never reported, and holds the history where it is. A report is
//! taken only from the OSD the map makes the PG's primary, for an epoch not in the future.

use cairn_failstop::LockOrDie;
use cairn_map::{ClusterMap, PgId};
use cairn_placement::Placer;
use cairn_proto::msg::mon::PgStarted;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Inner {
    term: Option<u64>,
    started: HashMap<PgId, u64>,
    /// The placement hierarchy of one epoch, prepared once for every heartbeat of it.
    placer: Option<(u64, Arc<Placer>)>,
}

/// The leader's record of every PG's last start.
#[derive(Default)]
pub(crate) struct PgStarts {
    inner: Mutex<Inner>,
}

impl PgStarts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_or_die()
    }

    /// Forgets every report when leadership changes (a new leader starts from nothing).
    pub fn set_leader_term(&self, term: Option<u64>) {
        let mut g = self.lock();
        if g.term != term {
            g.term = term;
            g.started.clear();
        }
    }

    /// Records `osd`'s reports, keeping those of PGs it is primary of in `map`.
    pub fn report(&self, map: &ClusterMap, osd: u32, pgs: &[PgStarted]) {
        if pgs.is_empty() {
            return;
        }
        let mut g = self.lock();
        let h = match &g.placer {
            Some((epoch, h)) if *epoch == map.epoch => h.clone(),
            _ => {
                let h = Arc::new(map.placer());
                g.placer = Some((map.epoch, h.clone()));
                h
            }
        };
        for r in pgs {
            let pg = PgId {
                pool: r.pool,
                pg: r.pg,
            };
            let known = map.pools.get(&pg.pool).is_some_and(|p| pg.pg < p.pg_count);
            if !known || r.epoch > map.epoch {
                continue;
            }
            if map.pg_placement_in(&h, pg).primary() == Some(osd) {
                g.started.insert(pg, r.epoch);
            }
        }
    }

    /// The oldest epoch any PG of `map` still needs, once every PG has been reported.
    pub fn floor(&self, map: &ClusterMap) -> Option<u64> {
        let g = self.lock();
        let mut floor = u64::MAX;
        for p in map.pools.values() {
            for pg in 0..p.pg_count {
                let id = PgId { pool: p.id, pg };
                floor = floor.min(*g.started.get(&id)?);
            }
        }
        Some(floor.min(map.epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_map::{Durability, MapChange};

    fn map() -> ClusterMap {
        let mut m = ClusterMap::new([2; 16]);
        for n in 1..=2u8 {
            m.apply(&MapChange::OsdBoot {
                store_id: [n; 16],
                addr: format!("127.0.0.1:{}", 7000 + n as u16),
                host: format!("h{n}"),
                weight: cairn_placement::WEIGHT_ONE,
            })
            .unwrap();
        }
        m.apply(&MapChange::PoolCreate {
            name: "p".into(),
            size: 2,
            min_size: 1,
            pg_count: 2,
            durability: Durability::Wal,
        })
        .unwrap();
        m
    }

    fn started(pg: u32, epoch: u64) -> PgStarted {
        PgStarted { pool: 1, pg, epoch }
    }

    #[test]
    fn the_floor_waits_for_every_pg_and_takes_only_primaries_reports() {
        let m = map();
        let t = PgStarts::default();
        t.set_leader_term(Some(1));
        let primary = |pg| m.pg_placement(PgId { pool: 1, pg }).primary().unwrap();
        t.report(&m, primary(0), &[started(0, 3)]);
        assert_eq!(t.floor(&m), None, "pg 1.1 not reported yet");
        let other = 1 - primary(1);
        t.report(&m, other, &[started(1, 1)]);
        assert_eq!(t.floor(&m), None, "a non-primary's report is ignored");
        t.report(&m, primary(1), &[started(1, 2), started(0, 99)]);
        assert_eq!(t.floor(&m), Some(2), "a future epoch is ignored too");
        t.set_leader_term(Some(2));
        assert_eq!(t.floor(&m), None, "a new term starts from nothing");
    }
}
