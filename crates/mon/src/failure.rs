//! Failure detection: the leader marks OSDs down when their heartbeats stop.
//!
//! Only the leader tracks heartbeats, in memory. When a monitor becomes leader (or starts a
//! new term as leader) it forgets what it knew, so every up OSD gets a full grace period from
//! that moment: a new leader never marks an OSD down for heartbeats its predecessor received.
//! Heartbeats are tied to an OSD's life (`up_from`): one from a previous life neither keeps the
//! OSD up nor delays its replacement life's detection.
//!
//! OSDs also ping each other and report a peer that stops answering. While an OSD is reported
//! by enough others ([`MIN_REPORTERS`], fewer in a smaller cluster) within the grace, its own
//! heartbeats are refused, so it is marked down a grace after the last one accepted even if
//! they still reach the monitors (cut off from its peers, its PGs' writes cannot complete).
//! Marking it down only then keeps the OSD's lease promise: it has stopped serving (its lease
//! ran out) before another OSD takes over its PGs.

use cairn_failstop::LockOrDie;
use cairn_map::{ClusterMap, MapChange};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Distinct reporters that must agree before an OSD is marked down for its peers' reports.
pub(crate) const MIN_REPORTERS: usize = 2;

/// Last heartbeat per OSD, as seen by the leader.
pub(crate) struct FailureDetector {
    grace: Duration,
    /// How long an OSD stays down before it is marked out (its data re-replicated elsewhere).
    down_out: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The leader term the table belongs to (`None` while not leader).
    term: Option<u64>,
    /// OSD id -> (the life it was seen in, when it was last heard from or its grace began).
    seen: HashMap<u32, (u64, Instant)>,
    /// Down and in OSD id -> (its last life, when this leader first saw it down).
    down_since: HashMap<u32, (u64, Instant)>,
    /// Reported OSD id -> (the life reported, reporter id -> when it last reported).
    reports: HashMap<u32, (u64, HashMap<u32, Instant>)>,
    /// Reporters needed to refuse an OSD's heartbeats (from the last map seen).
    needed: usize,
    /// OSDs whose heartbeats are being refused (to log the change once).
    refusing: std::collections::HashSet<u32>,
}

impl FailureDetector {
    pub(crate) fn new(grace: Duration, down_out: Duration) -> Self {
        FailureDetector {
            grace,
            down_out,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_or_die()
    }

    /// The grace period.
    pub(crate) fn grace(&self) -> Duration {
        self.grace
    }

    /// How long a failure report counts: peers report once per grace, so two graces make
    /// consecutive reports overlap.
    fn report_window(&self) -> Duration {
        self.grace * 2
    }

    /// Records a heartbeat of `osd` in its life `up_from` (the caller checked that the map
    /// has the OSD up in that life); false (not recorded) while enough peers report it.
    pub(crate) fn heard(&self, osd: u32, up_from: u64, now: Instant) -> bool {
        let mut inner = self.lock();
        let needed = inner.needed.max(1);
        let window = self.report_window();
        let reporters = inner.reports.get(&osd).map_or(0, |(life, by)| {
            if *life != up_from {
                return 0;
            }
            by.values()
                .filter(|at| now.saturating_duration_since(**at) < window)
                .count()
        });
        let reported = reporters >= needed;
        if reported {
            if inner.refusing.insert(osd) {
                tracing::warn!(
                    osd,
                    reporters,
                    "refusing the heartbeats of an OSD reported unreachable by its peers"
                );
            }
        } else {
            inner.refusing.remove(&osd);
            inner.seen.insert(osd, (up_from, now));
        }
        !reported
    }

    /// Tells the detector whether this monitor leads, and in which term; a change of either
    /// clears the table so that every OSD gets a full grace from now.
    pub(crate) fn set_leader_term(&self, term: Option<u64>) {
        let mut inner = self.lock();
        if inner.term != term {
            inner.term = term;
            inner.seen.clear();
            inner.down_since.clear();
            inner.reports.clear();
            inner.refusing.clear();
        }
    }

    /// Records that `reporter` cannot reach `target` in its life `life`.
    pub(crate) fn reported(&self, target: u32, life: u64, reporter: u32, now: Instant) {
        let mut inner = self.lock();
        let entry = inner
            .reports
            .entry(target)
            .or_insert_with(|| (life, HashMap::new()));
        if life < entry.0 {
            return;
        }
        if life > entry.0 {
            *entry = (life, HashMap::new());
        }
        entry.1.insert(reporter, now);
    }

    /// The `OsdDown` changes due at `now`: every up OSD not heard from in its current life
    /// within the grace, or reported by enough peers within it. An OSD is reported once per
    /// grace period, so a proposal that has not been applied yet is not repeated at every tick.
    pub(crate) fn due(&self, map: &ClusterMap, now: Instant) -> Vec<MapChange> {
        let mut inner = self.lock();
        if inner.term.is_none() {
            return Vec::new();
        }
        inner
            .seen
            .retain(|id, _| map.osds.get(id).is_some_and(|o| o.up));
        let window = self.report_window();
        inner
            .refusing
            .retain(|id| map.osds.get(id).is_some_and(|o| o.up));
        inner.reports.retain(|id, (life, by)| {
            by.retain(|_, at| now.saturating_duration_since(*at) < window);
            !by.is_empty() && map.osds.get(id).is_some_and(|o| o.up && o.up_from == *life)
        });
        let up = map.osds.values().filter(|o| o.up).count();
        let needed = MIN_REPORTERS.min(up.saturating_sub(1)).max(1);
        inner.needed = needed;
        let mut down = Vec::new();
        for o in map.osds.values().filter(|o| o.up) {
            let reporters = inner.reports.get(&o.id).map_or(0, |(_, by)| by.len());
            match inner.seen.get_mut(&o.id) {
                Some((life, at)) if *life == o.up_from => {
                    if now.saturating_duration_since(*at) >= self.grace {
                        *at = now;
                        if reporters >= needed {
                            tracing::warn!(
                                osd = o.id,
                                reporters,
                                "OSD reported unreachable by its peers; marking it down"
                            );
                        }
                        down.push(MapChange::OsdDown {
                            id: o.id,
                            up_from: o.up_from,
                        });
                    }
                }
                _ => {
                    inner.seen.insert(o.id, (o.up_from, now));
                }
            }
        }
        down
    }

    /// The `OsdOut` changes due at `now`: every OSD down and in for the down-out interval
    /// (counted from when this leader first saw it down, so a new leader never marks out
    /// early). Reported once per interval, like `due`.
    pub(crate) fn due_out(&self, map: &ClusterMap, now: Instant) -> Vec<MapChange> {
        let mut inner = self.lock();
        if inner.term.is_none() {
            return Vec::new();
        }
        inner
            .down_since
            .retain(|id, _| map.osds.get(id).is_some_and(|o| !o.up && o.in_));
        let mut out = Vec::new();
        for o in map.osds.values().filter(|o| !o.up && o.in_) {
            match inner.down_since.get_mut(&o.id) {
                Some((life, at)) if *life == o.up_from => {
                    if now.saturating_duration_since(*at) >= self.down_out {
                        *at = now;
                        out.push(MapChange::OsdOut { id: o.id });
                    }
                }
                _ => {
                    inner.down_since.insert(o.id, (o.up_from, now));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_with_osd() -> ClusterMap {
        let mut m = ClusterMap::new([1; 16]);
        m.apply(&MapChange::OsdBoot {
            store_id: [1; 16],
            addr: "127.0.0.1:7000".into(),
            host: "h".into(),
            weight: 0x10000,
        })
        .unwrap();
        m
    }

    #[test]
    fn silent_osds_are_due_after_the_grace_only_while_leading() {
        let grace = Duration::from_secs(4);
        let d = FailureDetector::new(grace, Duration::from_secs(600));
        let m = map_with_osd();
        let t0 = Instant::now();
        assert!(d.due(&m, t0 + grace * 2).is_empty(), "not leader");
        d.set_leader_term(Some(3));
        assert!(d.due(&m, t0).is_empty(), "grace starts now");
        assert!(d.due(&m, t0 + grace / 2).is_empty());
        d.heard(0, m.osds[&0].up_from, t0 + grace / 2);
        assert!(d.due(&m, t0 + grace).is_empty(), "heartbeat extended it");
        let due = d.due(&m, t0 + grace * 2);
        assert_eq!(
            due,
            vec![MapChange::OsdDown {
                id: 0,
                up_from: m.osds[&0].up_from
            }]
        );
        assert!(d.due(&m, t0 + grace * 2).is_empty(), "not repeated at once");
        d.set_leader_term(Some(4));
        assert!(d.due(&m, t0 + grace * 3).is_empty(), "new term, new grace");
    }

    #[test]
    fn an_osd_reported_by_two_peers_has_its_heartbeats_refused_until_marked_down() {
        let grace = Duration::from_secs(4);
        let d = FailureDetector::new(grace, Duration::from_secs(600));
        let mut m = map_with_osd();
        for i in 1..4u8 {
            m.apply(&MapChange::OsdBoot {
                store_id: [i + 1; 16],
                addr: format!("127.0.0.1:700{i}"),
                host: "h".into(),
                weight: 0x10000,
            })
            .unwrap();
        }
        let life = m.osds[&0].up_from;
        let t0 = Instant::now();
        d.set_leader_term(Some(1));
        assert!(d.due(&m, t0).is_empty());
        let beat_others = |at| {
            for id in 1..4u32 {
                d.heard(id, m.osds[&id].up_from, at);
            }
        };
        d.reported(0, life, 1, t0);
        assert!(d.heard(0, life, t0), "one reporter is not enough");
        // A report of an older life does not count.
        d.reported(0, life - 1, 2, t0);
        assert!(d.heard(0, life, t0));
        d.reported(0, life, 2, t0 + grace / 2);
        assert!(!d.heard(0, life, t0 + grace / 2), "two reporters: refused");
        beat_others(t0 + grace / 2);
        assert!(d.due(&m, t0 + grace / 2).is_empty());
        // Silent (for the monitors) a grace after its last accepted heartbeat: down.
        assert_eq!(
            d.due(&m, t0 + grace),
            vec![MapChange::OsdDown {
                id: 0,
                up_from: life
            }]
        );
        // Reports count for two graces (peers report once per grace).
        assert!(!d.heard(0, life, t0 + grace + grace / 4));
        assert!(d.heard(0, life, t0 + grace * 3));
    }

    #[test]
    fn down_osds_are_marked_out_after_the_interval_only_while_leading() {
        let out_after = Duration::from_secs(10);
        let d = FailureDetector::new(Duration::from_secs(1), out_after);
        let mut m = map_with_osd();
        let up_from = m.osds[&0].up_from;
        m.apply(&MapChange::OsdDown { id: 0, up_from })
            .expect("down");
        let t0 = Instant::now();
        assert!(d.due_out(&m, t0 + out_after * 2).is_empty(), "not leader");
        d.set_leader_term(Some(1));
        assert!(d.due_out(&m, t0).is_empty(), "the interval starts now");
        assert!(d.due_out(&m, t0 + out_after / 2).is_empty());
        assert_eq!(
            d.due_out(&m, t0 + out_after),
            vec![MapChange::OsdOut { id: 0 }]
        );
        assert!(
            d.due_out(&m, t0 + out_after).is_empty(),
            "not repeated at once"
        );
        d.set_leader_term(Some(2));
        assert!(
            d.due_out(&m, t0 + out_after * 2).is_empty(),
            "new term, new interval"
        );
        // Back up (or marked out meanwhile): forgotten.
        m.apply(&MapChange::OsdOut { id: 0 }).expect("out");
        assert!(d.due_out(&m, t0 + out_after * 9).is_empty());
    }

    #[test]
    fn a_heartbeat_of_a_previous_life_does_not_count() {
        let grace = Duration::from_secs(1);
        let d = FailureDetector::new(grace, Duration::from_secs(600));
        let m = map_with_osd();
        let t0 = Instant::now();
        d.set_leader_term(Some(1));
        d.heard(0, m.osds[&0].up_from - 1, t0 + grace * 5);
        assert!(d.due(&m, t0 + grace * 5).is_empty(), "restarts its grace");
        assert_eq!(d.due(&m, t0 + grace * 6).len(), 1);
    }
}
