//! Slow-op reports, like Ceph's slow requests: every second the writes this OSD leads that
//! have waited longer than the threshold (`--slow-op-ms`) are logged once each, with where they
//! stand (which members hold them and when they answered, which do not yet), and kept for a
//! minute for `cairn status` (through `OsdStats::slow_ops`) and the metrics.

use crate::inflight::SlowWrite;
use cairn_failstop::LockOrDie;
use cairn_proto::msg::osd::SlowOps as SlowSummary;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a slow write stays in the summary `cairn status` shows.
const KEPT_FOR: Duration = Duration::from_secs(60);
/// Most slow writes kept for the summary (the oldest go first).
const KEPT_MAX: usize = 4096;

/// Default threshold: an op on flash that takes a second is stuck somewhere.
pub const DEFAULT_SLOW_OP: Duration = Duration::from_secs(1);

struct Seen {
    at: Instant,
    waiting_for: Vec<u32>,
    age: Duration,
}

/// The slow writes of the last minute, and the count since start.
pub struct SlowOps {
    pub threshold: Duration,
    total: AtomicU64,
    recent: Mutex<VecDeque<Seen>>,
}

impl SlowOps {
    pub fn new(threshold: Duration) -> SlowOps {
        SlowOps {
            threshold,
            total: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// Reports the writes that became slow since the last call (`me`: this OSD's id).
    pub fn check(&self, me: u32, found: Vec<SlowWrite>) {
        if found.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut recent = self.recent.lock_or_die();
        for w in found {
            let waiting: Vec<String> = w.waiting.iter().map(|m| format!("osd.{m}")).collect();
            let held = match w.held {
                (n, Some(t)) => format!(
                    "{n} member(s) hold it, the last answered after {:.1} ms",
                    t.as_secs_f64() * 1e3
                ),
                _ => "no member holds it yet".to_string(),
            };
            tracing::warn!(
                osd = me,
                pg = %w.pg,
                version = w.version,
                op = w.what.op,
                bytes = w.what.bytes,
                "slow write: {:.2} s, waiting for {} ({held})",
                w.age.as_secs_f64(),
                waiting.join(", "),
            );
            self.total.fetch_add(1, Ordering::Relaxed);
            recent.push_back(Seen {
                at: now,
                waiting_for: w.waiting,
                age: w.age,
            });
        }
        while recent.len() > KEPT_MAX {
            recent.pop_front();
        }
    }

    /// Slow writes of the last minute.
    pub fn recent_count(&self) -> u64 {
        let recent = self.recent.lock_or_die();
        recent.iter().filter(|s| s.at.elapsed() <= KEPT_FOR).count() as u64
    }

    /// Slow writes since start.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The last minute's slow writes, by the member they waited for.
    pub fn summary(&self) -> Vec<SlowSummary> {
        let mut recent = self.recent.lock_or_die();
        while recent.front().is_some_and(|s| s.at.elapsed() > KEPT_FOR) {
            recent.pop_front();
        }
        let mut by: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for s in recent.iter() {
            let ms = u64::try_from(s.age.as_millis()).unwrap_or(u64::MAX);
            for &m in &s.waiting_for {
                let e = by.entry(m).or_default();
                e.0 += 1;
                e.1 = e.1.max(ms);
            }
        }
        by.into_iter()
            .map(|(waiting_for, (count, longest_ms))| SlowSummary {
                waiting_for,
                count,
                longest_ms,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflight::WriteWhat;
    use cairn_map::PgId;

    fn slow(waiting: Vec<u32>, age_ms: u64) -> SlowWrite {
        SlowWrite {
            pg: PgId { pool: 1, pg: 2 },
            version: 7,
            what: WriteWhat::now("write", 4096),
            age: Duration::from_millis(age_ms),
            waiting,
            held: (1, Some(Duration::from_micros(80))),
        }
    }

    #[test]
    fn slow_writes_are_summed_by_the_member_they_wait_for() {
        let s = SlowOps::new(DEFAULT_SLOW_OP);
        assert!(s.summary().is_empty());
        s.check(
            0,
            vec![
                slow(vec![2], 1500),
                slow(vec![2], 2100),
                slow(vec![1, 2], 1200),
            ],
        );
        assert_eq!(s.total(), 3);
        let sum = s.summary();
        assert_eq!(
            sum,
            vec![
                SlowSummary {
                    waiting_for: 1,
                    count: 1,
                    longest_ms: 1200
                },
                SlowSummary {
                    waiting_for: 2,
                    count: 3,
                    longest_ms: 2100
                },
            ]
        );
    }
}
