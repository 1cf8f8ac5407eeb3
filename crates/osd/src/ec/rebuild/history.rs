//! Which history an EC PG goes on with when its primary peers it, from the logs of the shards
//! that answered (docs/format/ec.md, "Peering and rebuild").
//!
//! A write is acknowledged only once every present shard holds it, and there are at least
//! `min_size` of them. So of the writes the newest log holds, those held by `k` answering
//! shards can be rolled forward (the other shards' pieces are decoded from those `k`); a
//! write held by fewer cannot be decoded, and is rolled back when it cannot have been
//! acknowledged: when even with every shard that did not answer it would not reach
//! `min_size`. Otherwise the PG is down until more shards answer.
//!
//! Which shards can say a write was not acknowledged depends on who held which shard when it
//! was written (shards move when an OSD is marked out): with the PG's past intervals, a write
//! is rolled back only when a shard that held its position then, and answered now, lacks it
//! (an acknowledged write is on every shard present in its interval), or when its interval
//! had fewer than `min_size` shards. A write older than the intervals the monitors keep is
//! judged by the counting rule above.

use crate::pglog::LogEntry;
use cairn_map::PastInterval;
use std::collections::BTreeSet;

/// What one answering shard holds: its log and its last version.
#[derive(Debug, Clone)]
pub struct ShardLog {
    pub shard: u8,
    pub osd: u32,
    /// Its last version (the PG version of the last sub-write it applied).
    pub head: u64,
    /// Its kept log, oldest first.
    pub entries: Vec<LogEntry>,
}

impl ShardLog {
    fn tail(&self) -> Option<u64> {
        self.entries.first().map(|e| e.version)
    }

    /// Whether it holds `e`: the same entry in its log, or `e` older than its log (trimmed:
    /// taken as held) and not after its head.
    fn holds(&self, e: &LogEntry) -> bool {
        match self.entries.binary_search_by_key(&e.version, |x| x.version) {
            Ok(i) => self.entries[i] == *e,
            Err(_) => self.tail().is_some_and(|t| e.version < t) && e.version <= self.head,
        }
    }

    /// Its newest entry's (epoch, version): of two logs, the one of the later primary wins.
    fn newest(&self) -> (u64, u64) {
        self.entries
            .last()
            .map_or((0, self.head), |e| (e.epoch, e.version))
    }
}

/// How the PG goes on: the version every shard is brought to, with the authority's log.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The PG's version once rebuilt.
    pub version: u64,
    /// The index (in the answering shards) of the shard whose log is authoritative.
    pub auth: usize,
    /// What each answering shard needs, in order.
    pub shards: Vec<Step>,
    /// The objects whose shard objects may differ from the authoritative history on some
    /// shard: every shard's state of them is checked (with a backfill, every object too).
    pub dirty: BTreeSet<Vec<u8>>,
}

impl Plan {
    /// Whether some shard needs a backfill.
    pub fn backfill(&self) -> bool {
        self.shards.iter().any(|s| s.backfill)
    }
}

/// What one answering shard needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The last version it shares with the authority (0 for a backfill).
    pub common: u64,
    /// Whether it is at the PG's version already, with nothing after it.
    pub up_to_date: bool,
    /// Its log does not meet the authority's kept log (it was away longer than the log
    /// keeps, or it is new): every object of the PG is checked on it.
    pub backfill: bool,
}

/// Why the PG cannot go on from the shards that answered: the write of `version` is held by
/// too few answering shards (`holders`) to be decoded, and with the shards that did not answer
/// it may have been acknowledged.
#[derive(Debug, PartialEq, Eq)]
pub struct Down {
    pub version: u64,
    pub holders: usize,
    /// The OSDs that held a shard when it was written and did not answer (empty when the
    /// interval is not known).
    pub waiting_for: Vec<u32>,
}

/// Why no plan is made.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Down(Down),
    /// Some write must be judged (rolled back or waited for): the PG's past intervals from
    /// epoch `since` are needed for it.
    NeedIntervals {
        since: u64,
    },
}

impl From<Down> for Refusal {
    fn from(d: Down) -> Self {
        Refusal::Down(d)
    }
}

/// Whether the write `e`, held by `holders` of the answering `shards`, may have been
/// acknowledged, with the shards that did not answer (`absent`) and the past intervals.
fn may_be_acknowledged(
    e: &LogEntry,
    shards: &[ShardLog],
    holders: usize,
    (absent, min_size): (usize, usize),
    intervals: &[PastInterval],
) -> Option<Down> {
    let Some(iv) = intervals.iter().find(|iv| iv.spans(e.epoch)) else {
        return (holders + absent >= min_size).then(|| Down {
            version: e.version,
            holders,
            waiting_for: Vec::new(),
        });
    };
    let was_there = |s: &ShardLog| iv.shard_holder(s.shard) == Some(s.osd);
    if !iv.maybe_went_rw || shards.iter().any(|s| was_there(s) && !s.holds(e)) {
        return None;
    }
    let waiting_for = (0..iv.acting.len())
        .filter_map(|i| iv.shard_holder(i as u8))
        .filter(|id| !shards.iter().any(|s| s.osd == *id && was_there(s)))
        .collect();
    Some(Down {
        version: e.version,
        holders,
        waiting_for,
    })
}

/// Plans the rebuild of a PG of `n` shards (`k` data) from the `shards` that answered, with
/// its past `intervals` once they are asked for ([`Refusal::NeedIntervals`]).
pub fn plan(
    shards: &[ShardLog],
    (n, k, min_size): (usize, usize, usize),
    intervals: Option<&[PastInterval]>,
) -> Result<Plan, Refusal> {
    let Some(auth) = (0..shards.len()).max_by_key(|&i| (shards[i].newest(), shards[i].head)) else {
        return Ok(Plan {
            version: 0,
            auth: 0,
            shards: Vec::new(),
            dirty: BTreeSet::new(),
        });
    };
    let a = &shards[auth];
    let holders = |e: &LogEntry| shards.iter().filter(|s| s.holds(e)).count();
    let version = match a.entries.iter().rev().find(|e| holders(e) >= k) {
        Some(e) => e.version,
        None if a.tail().is_none_or(|t| t <= 1) => 0,
        None => {
            let oldest = a.entries.first().map_or(0, |e| e.version);
            let held = a.entries.first().map_or(0, holders);
            return Err(Down {
                version: oldest,
                holders: held,
                waiting_for: Vec::new(),
            }
            .into());
        }
    };
    let absent = n.saturating_sub(shards.len());
    let in_history = |e: &LogEntry| e.version <= version && a.holds(e);
    let judged: Vec<&LogEntry> = shards
        .iter()
        .flat_map(|s| &s.entries)
        .filter(|e| !in_history(e))
        .collect();
    let intervals = match intervals {
        Some(ivs) => ivs,
        None if judged.is_empty() => &[],
        None => {
            let since = judged.iter().map(|e| e.epoch).min().unwrap_or(0);
            return Err(Refusal::NeedIntervals { since });
        }
    };
    for e in judged {
        let counts = (absent, min_size);
        if let Some(down) = may_be_acknowledged(e, shards, holders(e), counts, intervals) {
            return Err(down.into());
        }
    }
    let history: Vec<&LogEntry> = a.entries.iter().filter(|e| e.version <= version).collect();
    let mut dirty = BTreeSet::new();
    let mut steps = Vec::with_capacity(shards.len());
    for s in shards {
        let common = match history.iter().rev().find(|e| s.holds(e)) {
            Some(e) => Some(e.version),
            None if s.head == 0 || version == 0 => Some(0),
            // Its log ends where the authority's begins.
            None if a.tail().is_some_and(|t| s.head + 1 == t) => Some(s.head),
            None => None,
        };
        let covered = |c: u64| c == version || a.tail().is_some_and(|t| t <= c + 1);
        let step = match common {
            Some(c) if covered(c) => Step {
                common: c,
                up_to_date: c == version && s.head == version,
                backfill: false,
            },
            _ => Step {
                common: 0,
                up_to_date: false,
                backfill: true,
            },
        };
        let changed = history.iter().copied().filter(|e| e.version > step.common);
        let own = s.entries.iter().filter(|e| e.version > step.common);
        dirty.extend(changed.chain(own).map(|e| e.object.clone()));
        steps.push(step);
    }
    Ok(Plan {
        version,
        auth,
        shards: steps,
        dirty,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pglog::LogOp;
    use cairn_map::intervals::NO_OSD;

    fn e(epoch: u64, version: u64, object: &str) -> LogEntry {
        LogEntry {
            version,
            epoch,
            object: object.as_bytes().to_vec(),
            op: LogOp::Modify,
        }
    }

    /// Shard `shard` with the entries of versions `1..=head` of epoch 5 (object `o{v % 4}`).
    fn shard(shard: u8, head: u64) -> ShardLog {
        ShardLog {
            shard,
            osd: u32::from(shard) + 10,
            head,
            entries: (1..=head)
                .map(|v| e(5, v, &format!("o{}", v % 4)))
                .collect(),
        }
    }

    fn step(common: u64, up_to_date: bool) -> Step {
        Step {
            common,
            up_to_date,
            backfill: false,
        }
    }

    fn names(v: &[&str]) -> BTreeSet<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn shards_that_agree_change_nothing() {
        let p = plan(
            &[shard(0, 9), shard(1, 9), shard(2, 9)],
            (3, 2, 2),
            Some(&[]),
        )
        .expect("plan");
        assert_eq!(p.version, 9);
        assert!(p.shards.iter().all(|&s| s == step(9, true)));
        assert!(p.dirty.is_empty());
        let empty = plan(&[shard(0, 0), shard(1, 0)], (3, 2, 2), Some(&[])).expect("plan");
        assert_eq!(empty.version, 0);
        assert!(empty.dirty.is_empty());
    }

    #[test]
    fn a_shard_back_after_missed_writes_gets_the_objects_they_changed() {
        let p = plan(
            &[shard(0, 9), shard(1, 6), shard(2, 9)],
            (3, 2, 2),
            Some(&[]),
        )
        .expect("plan");
        assert_eq!(p.version, 9);
        assert_eq!(p.shards[1], step(6, false));
        assert_eq!(p.dirty, names(&["o3", "o0", "o1"]));
    }

    #[test]
    fn a_write_on_k_shards_rolls_forward() {
        // The primary died after two of three shards applied version 10.
        let p = plan(
            &[shard(0, 9), shard(1, 10), shard(2, 10)],
            (3, 2, 2),
            Some(&[]),
        )
        .expect("plan");
        assert_eq!(p.version, 10);
        assert_eq!(
            p.shards,
            vec![step(9, false), step(10, true), step(10, true)]
        );
        assert_eq!(p.dirty, names(&["o2"]));
    }

    #[test]
    fn a_write_on_fewer_than_k_rolls_back_unless_it_may_have_been_acknowledged() {
        let p = plan(
            &[shard(0, 10), shard(1, 9), shard(2, 9)],
            (3, 2, 2),
            Some(&[]),
        )
        .expect("plan");
        assert_eq!(p.version, 9);
        assert_eq!(p.auth, 0, "the newest log is the authority");
        assert_eq!(
            p.shards[0],
            step(9, false),
            "version 10 is undone on shard 0"
        );
        assert_eq!(p.dirty, names(&["o2"]));
        // With shard 2 silent, version 10 may be on it too, and then acknowledged.
        assert_eq!(
            plan(&[shard(0, 10), shard(1, 9)], (3, 2, 2), Some(&[])),
            Err(Refusal::Down(Down {
                version: 10,
                holders: 1,
                waiting_for: Vec::new(),
            }))
        );
        // 4+2 with min_size 5: held by 3 of 5 answering, it was never acknowledged.
        let six: Vec<ShardLog> = (0..5)
            .map(|i| shard(i, if i < 3 { 10 } else { 9 }))
            .collect();
        let p = plan(&six, (6, 4, 5), Some(&[])).expect("plan");
        assert_eq!(p.version, 9);
    }

    #[test]
    fn a_newer_primarys_history_wins_over_an_older_ones_at_the_same_version() {
        // Shard 0 kept version 10 of a primary of epoch 5 that died; the PG went on at epoch 8
        // without it and wrote its own version 10 on shards 1 and 2.
        let mut newer = [shard(1, 9), shard(2, 9)];
        for s in &mut newer {
            s.entries.push(e(8, 10, "x"));
            s.head = 10;
        }
        let p = plan(
            &[shard(0, 10), newer[0].clone(), newer[1].clone()],
            (3, 2, 2),
            Some(&[]),
        )
        .expect("plan");
        assert_eq!(p.version, 10);
        assert!(p.auth > 0, "an epoch-8 log is the authority");
        assert_eq!(p.shards[0], step(9, false));
        assert_eq!(p.dirty, names(&["x", "o2"]), "both writes of version 10");
    }

    #[test]
    fn a_shard_whose_log_does_not_meet_the_authoritys_is_backfilled() {
        let mut a = shard(0, 20);
        a.entries.drain(..10); // keeps 11..=20
        let b = ShardLog {
            entries: a.entries.clone(),
            ..shard(1, 20)
        };
        let p = plan(&[a.clone(), b.clone(), shard(2, 5)], (3, 2, 2), Some(&[])).expect("plan");
        assert!(p.backfill());
        assert_eq!(
            p.shards[2],
            Step {
                common: 0,
                up_to_date: false,
                backfill: true
            }
        );
        assert_eq!(p.shards[0], step(20, true));
        // One that stopped at 10 meets the kept log.
        let p = plan(&[a, b, shard(2, 10)], (3, 2, 2), Some(&[])).expect("plan");
        assert_eq!(p.shards[2], step(10, false));
        assert!(!p.backfill());
    }

    /// An interval of epochs `first..=last` in which shard `i` was on OSD `acting[i]`.
    fn iv(first: u64, last: u64, acting: &[u32], went_rw: bool) -> PastInterval {
        PastInterval {
            first,
            last,
            acting: acting.to_vec(),
            min_size: 0,
            maybe_went_rw: went_rw,
        }
    }

    #[test]
    fn writes_on_shards_that_moved_away_are_waited_for_not_rolled_back() {
        // 4+2, min_size 5: versions 1..=9 written at epoch 5 on osd.10..=15; then osd.14 and
        // osd.15 were marked out and shards 4 and 5 moved to the empty osd.20 and osd.21, and
        // osd.10 died before they were backfilled.
        let mut logs: Vec<ShardLog> = (1..4).map(|i| shard(i, 9)).collect();
        for (i, osd) in [(4u8, 20u32), (5, 21)] {
            logs.push(ShardLog { osd, ..shard(i, 0) });
        }
        let ivs = [
            iv(1, 10, &[10, 11, 12, 13, 14, 15], true),
            iv(11, 12, &[10, 11, 12, 13, 20, 21], true),
            iv(13, 13, &[NO_OSD, 11, 12, 13, 20, 21], true),
        ];
        assert_eq!(
            plan(&logs, (6, 4, 5), None),
            Err(Refusal::NeedIntervals { since: 5 })
        );
        // Counting the empty shards as shards that lack the writes would undo all nine.
        assert_eq!(plan(&logs, (6, 4, 5), Some(&[])).map(|p| p.version), Ok(0));
        assert_eq!(
            plan(&logs, (6, 4, 5), Some(&ivs)),
            Err(Refusal::Down(Down {
                version: 1,
                holders: 3,
                waiting_for: vec![10, 14, 15],
            }))
        );
        // osd.14 back at shard 4 (it was never wiped): the writes roll forward from k.
        logs[3] = ShardLog {
            osd: 14,
            ..shard(4, 9)
        };
        let p = plan(&logs, (6, 4, 5), Some(&ivs)).expect("plan");
        assert_eq!(p.version, 9);
        assert!(!p.shards[4].up_to_date, "osd.21 is new");
        assert_eq!(p.dirty, names(&["o0", "o1", "o2", "o3"]));
    }

    #[test]
    fn a_shard_present_when_a_write_was_made_and_lacking_it_proves_it_unacknowledged() {
        // 2+1, min_size 2: the primary (shard 0) applied version 10 and died before shard 1
        // did; shard 2 is silent. Counting alone cannot rule out an acknowledgement (1 holder
        // + 1 silent >= 2), but shard 1 was present then, so the write was never acknowledged.
        let logs = [shard(0, 10), shard(1, 9)];
        let ivs = [iv(1, 9, &[10, 11, 12], true)];
        assert!(matches!(
            plan(&logs, (3, 2, 2), Some(&[])),
            Err(Refusal::Down(_))
        ));
        let p = plan(&logs, (3, 2, 2), Some(&ivs)).expect("plan");
        assert_eq!(p.version, 9);
        assert_eq!(p.shards[0], step(9, false));
        // In an interval with fewer than min_size shards nothing was acknowledged.
        let lone = [iv(1, 9, &[10, NO_OSD, NO_OSD], false)];
        assert_eq!(
            plan(&[shard(0, 10), shard(1, 9)], (3, 2, 2), Some(&lone)).map(|p| p.version),
            Ok(9)
        );
        // Shard 1 on another OSD then: it cannot say; the write's own shard 2 may hold it.
        let other = [iv(1, 9, &[10, 99, 12], true)];
        assert_eq!(
            plan(&logs, (3, 2, 2), Some(&other)),
            Err(Refusal::Down(Down {
                version: 10,
                holders: 1,
                waiting_for: vec![99, 12],
            }))
        );
    }
}
