//! Past intervals: the runs of map epochs during which a PG's acting set stayed the same.
//!
//! A PG's history since it last went active (its `last_epoch_started`) is a list of
//! intervals. An interval whose acting set had at least the pool's `min_size` members may
//! have acknowledged writes (`maybe_went_rw`), and every such write is on every member of
//! that interval (a write is acknowledged only when all acting members hold it). So before a
//! PG goes active again its primary must hear from at least one member of every such
//! interval, or the newest acknowledged writes may be missing from every copy it can see:
//! it would serve the past. [`check`] says which intervals are not covered and whom they
//! wait for; an OSD an operator declared lost (`OsdInfo::lost_at`) is not waited for.

use crate::{ClusterMap, Incremental, MapError, PgId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// In an erasure-coded PG's interval, the `acting` entry of a shard no OSD held (its OSD down).
pub const NO_OSD: u32 = u32::MAX;

/// A run of epochs `first..=last` during which a PG's acting set (members and their lives)
/// did not change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastInterval {
    pub first: u64,
    pub last: u64,
    /// Acting members, the primary first. For an erasure-coded PG, by shard: entry `i` is the
    /// OSD that held shard `i`, [`NO_OSD`] when none did (which shard an OSD holds matters).
    pub acting: Vec<u32>,
    /// The pool's min_size then.
    pub min_size: u8,
    /// Whether writes may have been acknowledged in it (at least min_size members acting).
    pub maybe_went_rw: bool,
}

impl PastInterval {
    /// Whether it spans map `epoch`.
    pub fn spans(&self, epoch: u64) -> bool {
        (self.first..=self.last).contains(&epoch)
    }

    /// The OSD that held shard `shard` of an erasure-coded PG in it.
    pub fn shard_holder(&self, shard: u8) -> Option<u32> {
        self.acting
            .get(usize::from(shard))
            .copied()
            .filter(|id| *id != NO_OSD)
    }
}

/// The open interval with its members' lives (a restarted member starts a new one) and the
/// pool's PG count (a split starts a new one).
type OpenInterval = (PastInterval, Vec<(u32, u64)>, u32);

/// Builds a PG's intervals from the maps of consecutive epochs.
struct Tracker {
    pg: PgId,
    open: Option<OpenInterval>,
    done: Vec<PastInterval>,
}

impl Tracker {
    fn observe(&mut self, map: &ClusterMap) {
        let Some(pool) = map.pools.get(&self.pg.pool) else {
            self.close();
            return;
        };
        // Before a split made this PG, its objects were in its ancestor, on its OSDs.
        let held_by = PgId {
            pool: self.pg.pool,
            pg: cairn_placement::pg_ancestor(self.pg.pg, pool.pg_count),
        };
        let placement = map.pg_placement(held_by);
        let (acting, members) = if pool.ec().is_some() {
            let shards = map.pg_shards(held_by, &placement);
            let members = shards.iter().flatten().count();
            (
                shards.into_iter().map(|s| s.unwrap_or(NO_OSD)).collect(),
                members,
            )
        } else {
            let n = placement.acting.len();
            (placement.acting, n)
        };
        let lives: Vec<(u32, u64)> = acting
            .iter()
            .map(|id| (*id, map.osds.get(id).map_or(0, |o| o.up_from)))
            .collect();
        if let Some((iv, open_lives, pgs)) = &mut self.open {
            if *open_lives == lives && iv.min_size == pool.min_size && *pgs == pool.pg_count {
                iv.last = map.epoch;
                return;
            }
        }
        self.close();
        let maybe_went_rw = members > 0 && members >= pool.min_size as usize;
        let iv = PastInterval {
            first: map.epoch,
            last: map.epoch,
            acting,
            min_size: pool.min_size,
            maybe_went_rw,
        };
        self.open = Some((iv, lives, pool.pg_count));
    }

    fn close(&mut self) {
        if let Some((iv, _, _)) = self.open.take() {
            self.done.push(iv);
        }
    }
}

/// The intervals of `pg` from epoch `since` to `until` (both included), from `base` (the
/// map at the oldest epoch kept) and the incrementals after it. Returns the epoch the list
/// starts at: `since`, or the base's epoch when history before it was trimmed.
pub fn compute<'a>(
    base: &ClusterMap,
    history: impl IntoIterator<Item = &'a Incremental>,
    pg: PgId,
    since: u64,
    until: u64,
) -> Result<(u64, Vec<PastInterval>), MapError> {
    let from = since.max(base.epoch);
    let mut t = Tracker {
        pg,
        open: None,
        done: Vec::new(),
    };
    let mut map = base.clone();
    if map.epoch >= from && map.epoch <= until {
        t.observe(&map);
    }
    for inc in history {
        if inc.epoch <= map.epoch {
            continue;
        }
        if inc.epoch > until {
            break;
        }
        map.apply_incremental(inc)?;
        if map.epoch >= from {
            t.observe(&map);
        }
    }
    if map.epoch < until {
        return Err(MapError::EpochGap {
            have: map.epoch,
            got: until,
        });
    }
    t.close();
    Ok((from, t.done))
}

/// An interval that may have acknowledged writes and none of whose members answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    pub interval: PastInterval,
    /// Its members not declared lost: any one of them answering unblocks it.
    pub waiting_for: Vec<u32>,
}

/// What the past intervals allow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Intervals that wait for an OSD: the PG is down while any is left.
    pub blocked: Vec<Blocked>,
    /// Intervals whose every member that could hold their writes was declared lost: the PG
    /// may go on, and writes acknowledged in them may be lost.
    pub given_up: Vec<PastInterval>,
}

impl Coverage {
    /// Every OSD some blocked interval waits for, once each, ascending.
    pub fn waiting_for(&self) -> Vec<u32> {
        let all: BTreeSet<u32> = self
            .blocked
            .iter()
            .flat_map(|b| b.waiting_for.iter().copied())
            .collect();
        all.into_iter().collect()
    }
}

/// Whether `osd` was declared lost after `iv` ended (its copy of what `iv` wrote is gone).
fn lost_for(map: &ClusterMap, osd: u32, iv: &PastInterval) -> bool {
    map.osds.get(&osd).is_none_or(|o| o.lost_at > iv.last)
}

/// Checks that some member of every interval that may have acknowledged writes is among
/// `answered` (the OSDs that told the primary what they hold), with lost OSDs from `map`.
pub fn check(intervals: &[PastInterval], answered: &BTreeSet<u32>, map: &ClusterMap) -> Coverage {
    let mut c = Coverage::default();
    for iv in intervals.iter().filter(|iv| iv.maybe_went_rw) {
        if iv.acting.iter().any(|m| answered.contains(m)) {
            continue;
        }
        let waiting_for: Vec<u32> = iv
            .acting
            .iter()
            .copied()
            .filter(|m| !lost_for(map, *m, iv))
            .collect();
        if waiting_for.is_empty() {
            c.given_up.push(iv.clone());
        } else {
            c.blocked.push(Blocked {
                interval: iv.clone(),
                waiting_for,
            });
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChangeOutcome, Durability, MapChange};
    use cairn_placement::WEIGHT_ONE;

    /// A recorder of a map's history as the monitors keep it.
    struct History {
        base: ClusterMap,
        map: ClusterMap,
        incs: Vec<Incremental>,
    }

    impl History {
        fn new() -> Self {
            let m = ClusterMap::new([7; 16]);
            History {
                base: m.clone(),
                map: m,
                incs: Vec::new(),
            }
        }

        fn apply(&mut self, change: MapChange) -> u32 {
            match self.map.apply(&change) {
                Ok(ChangeOutcome::Changed { epoch, id }) => {
                    self.incs.push(Incremental { epoch, change });
                    id
                }
                other => panic!("{change:?}: {other:?}"),
            }
        }

        fn boot(&mut self, n: u8) -> u32 {
            self.apply(MapChange::OsdBoot {
                store_id: [n; 16],
                addr: format!("127.0.0.1:{}", 7000 + n as u16),
                host: format!("h{n}"),
                weight: WEIGHT_ONE,
            })
        }

        fn down(&mut self, id: u32) {
            let up_from = self.map.osds[&id].up_from;
            self.apply(MapChange::OsdDown { id, up_from });
        }

        fn intervals(&self, pg: PgId, since: u64) -> Vec<PastInterval> {
            compute(&self.base, &self.incs, pg, since, self.map.epoch)
                .unwrap()
                .1
        }
    }

    fn set(ids: &[u32]) -> BTreeSet<u32> {
        ids.iter().copied().collect()
    }

    /// Two OSDs, size 2, min_size 1: A and B write, B dies, A writes alone, A dies, B returns.
    fn two_osd_story() -> (History, PgId, u64) {
        let mut h = History::new();
        let a = h.boot(1);
        let b = h.boot(2);
        let pool = h.apply(MapChange::PoolCreate {
            name: "pi".into(),
            size: 2,
            min_size: 1,
            pg_count: 1,
            durability: Durability::Wal,
        });
        let started = h.map.epoch;
        h.down(b);
        h.down(a);
        h.boot(2);
        (h, PgId { pool, pg: 0 }, started)
    }

    #[test]
    fn an_interval_only_a_dead_osd_served_blocks_peering_until_it_answers() {
        let (h, pg, started) = two_osd_story();
        let ivs = h.intervals(pg, started);
        let acting: Vec<(Vec<u32>, bool)> = ivs
            .iter()
            .map(|i| (i.acting.clone(), i.maybe_went_rw))
            .collect();
        assert_eq!(
            acting,
            vec![
                (vec![0, 1], true),
                (vec![0], true),
                (vec![], false),
                (vec![1], true)
            ]
        );
        let c = check(&ivs, &set(&[1]), &h.map);
        assert_eq!(c.waiting_for(), vec![0], "osd.0 alone took writes");
        assert!(c.given_up.is_empty());
        assert!(check(&ivs, &set(&[0, 1]), &h.map).blocked.is_empty());
    }

    #[test]
    fn an_osd_declared_lost_is_not_waited_for_and_its_intervals_are_given_up() {
        let (mut h, pg, started) = two_osd_story();
        h.apply(MapChange::OsdLost { id: 0 });
        let ivs = h.intervals(pg, started);
        let c = check(&ivs, &set(&[1]), &h.map);
        assert!(c.blocked.is_empty());
        assert_eq!(c.given_up.len(), 1);
        assert_eq!(c.given_up[0].acting, vec![0]);
    }

    #[test]
    fn a_loss_declared_before_an_interval_does_not_cover_it() {
        let (mut h, pg, _) = two_osd_story();
        h.apply(MapChange::OsdLost { id: 0 });
        // osd.0 comes back after all, serves alone, and dies again.
        h.boot(1);
        h.down(1);
        let later = h.map.epoch;
        h.down(0);
        h.boot(2);
        let ivs = h.intervals(pg, later);
        assert_eq!(check(&ivs, &set(&[1]), &h.map).waiting_for(), vec![0]);
    }

    #[test]
    fn below_min_size_nothing_was_acknowledged() {
        let mut h = History::new();
        let ids: Vec<u32> = (1..=3).map(|n| h.boot(n)).collect();
        let pool = h.apply(MapChange::PoolCreate {
            name: "p".into(),
            size: 3,
            min_size: 2,
            pg_count: 1,
            durability: Durability::Wal,
        });
        let started = h.map.epoch;
        let pg = PgId { pool, pg: 0 };
        let first = h.map.pg_placement(pg).acting;
        h.down(first[0]);
        h.down(first[1]);
        let ivs = h.intervals(pg, started);
        assert_eq!(ivs.len(), 3);
        assert!(ivs[1].maybe_went_rw, "two of three: writes go on");
        assert!(!ivs[2].maybe_went_rw, "one of three: below min_size");
        // The last member alone answers: the two-member interval waits for its other member.
        let c = check(&ivs, &set(&[first[2]]), &h.map);
        assert!(
            c.blocked.is_empty(),
            "osd.{} was in every interval",
            first[2]
        );
        let _ = ids;
    }

    #[test]
    fn a_restarted_member_starts_a_new_interval_and_trimmed_history_starts_at_the_base() {
        let (h, pg, _) = two_osd_story();
        let whole = h.intervals(pg, 0);
        assert_eq!(whole.first().map(|i| i.first), Some(4), "pool created at 4");
        // A base later than `since`: the list starts at the base.
        let mut base = h.base.clone();
        for inc in &h.incs[..4] {
            base.apply_incremental(inc).unwrap();
        }
        let (from, ivs) = compute(&base, &h.incs, pg, 2, h.map.epoch).unwrap();
        assert_eq!(from, base.epoch);
        assert_eq!(ivs.first().map(|i| i.first), Some(base.epoch));
        let gap = compute(&base, &h.incs[..5], pg, 0, h.map.epoch);
        assert!(matches!(gap, Err(MapError::EpochGap { .. })));
    }

    #[test]
    fn a_split_child_was_held_by_its_parents_osds_before_the_split() {
        let mut h = History::new();
        for n in 1..=6 {
            h.boot(n);
        }
        let pool = h.apply(MapChange::PoolCreate {
            name: "p".into(),
            size: 2,
            min_size: 1,
            pg_count: 4,
            durability: Durability::Wal,
        });
        let before = h.map.epoch;
        let parent = h.map.pg_placement(PgId { pool, pg: 1 }).acting;
        h.apply(MapChange::PoolSet {
            name: "p".into(),
            setting: crate::PoolSetting::PgCount(16),
        });
        let split = h.map.epoch;
        // Children of 1 under 16 PGs: 5, 9 and 13 (and 1 itself).
        for child in [5, 9, 13] {
            let ivs = h.intervals(PgId { pool, pg: child }, before);
            assert_eq!(ivs[0].acting, parent, "pg {child} before the split");
            assert_eq!(ivs[0].last, split - 1);
            let own = h.map.pg_placement(PgId { pool, pg: child }).acting;
            assert_eq!(ivs.last().map(|i| i.acting.clone()), Some(own));
            assert_eq!(ivs.last().map(|i| i.first), Some(split));
        }
        // The parent's own interval ends at the split too (its objects changed).
        let ivs = h.intervals(PgId { pool, pg: 1 }, before);
        assert_eq!(ivs.len(), 2);
        assert_eq!(ivs[1].first, split);
        // Shrinking is refused.
        let shrink = MapChange::PoolSet {
            name: "p".into(),
            setting: crate::PoolSetting::PgCount(8),
        };
        assert!(matches!(
            h.map.apply(&shrink),
            Err(MapError::PgCountDown { have: 16, .. })
        ));
    }

    /// An erasure-coded PG's intervals name each shard's OSD by position: a down OSD leaves a
    /// hole where its shard was, and an OSD marked out hands its shard to another OSD.
    #[test]
    fn an_ec_pgs_intervals_say_which_osd_held_each_shard() {
        let mut h = History::new();
        let ids: Vec<u32> = (1..=4).map(|n| h.boot(n)).collect();
        let pool = h.apply(MapChange::PoolCreateEc {
            name: "ec".into(),
            profile: crate::EcProfile {
                k: 2,
                m: 1,
                stripe_unit: 4096,
            },
            min_size: 3,
            pg_count: 1,
            durability: Durability::Wal,
            domain: None,
        });
        let pg = PgId { pool, pg: 0 };
        let started = h.map.epoch;
        let first = h.map.pg_placement(pg).up_set;
        assert_eq!(first.len(), 3);
        h.down(first[1]);
        let spare = *ids.iter().find(|id| !first.contains(id)).unwrap();
        h.apply(MapChange::OsdOut { id: first[1] });
        let ivs = h.intervals(pg, started);
        assert_eq!(ivs.len(), 3, "{ivs:?}");
        assert_eq!(ivs[0].acting, first);
        assert!(ivs[0].maybe_went_rw);
        assert_eq!(ivs[1].acting, vec![first[0], NO_OSD, first[2]]);
        assert_eq!(ivs[1].shard_holder(1), None);
        assert!(!ivs[1].maybe_went_rw, "2 shards, min_size 3");
        let moved = h.map.pg_placement(pg).up_set;
        assert_eq!(ivs[2].acting, moved);
        assert!(moved.contains(&spare) && !moved.contains(&first[1]));
        assert_eq!(ivs[2].shard_holder(0), Some(moved[0]));
        assert!(ivs[2].spans(h.map.epoch) && !ivs[2].spans(ivs[1].last));
    }
}
