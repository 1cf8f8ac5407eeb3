//! Totals of the client ops this OSD served as primary, per pool, and of its store commits:
//! always kept (a few additions per op), reported in `OsdStats` so that `cairn osd perf`,
//! `cairn top` and the dashboard compute rates and mean latencies from two samples, with or
//! without a metrics endpoint.

use cairn_failstop::LockOrDie;
use cairn_proto::msg::osd::PoolOps;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// The totals.
#[derive(Default)]
pub struct OpTotals {
    pools: Mutex<BTreeMap<u32, PoolOps>>,
    commits: AtomicU64,
    commit_us: AtomicU64,
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

impl OpTotals {
    /// A client op of `pool` served (`write` or not), started at `started`, that brought
    /// `bytes_in` and returned `bytes_out`.
    pub fn op(&self, pool: u32, write: bool, started: Instant, bytes_in: u64, bytes_out: u64) {
        let us = micros(started);
        let mut pools = self.pools.lock_or_die();
        let p = pools.entry(pool).or_insert_with(|| PoolOps {
            pool,
            ..PoolOps::default()
        });
        if write {
            p.writes += 1;
            p.write_latency_us += us;
        } else {
            p.reads += 1;
            p.read_latency_us += us;
        }
        p.bytes_in += bytes_in;
        p.bytes_out += bytes_out;
    }

    /// A WAL write (and flush) started at `t0`, done now.
    pub fn commit(&self, t0: Instant) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.commit_us.fetch_add(micros(t0), Ordering::Relaxed);
    }

    /// Per-pool totals, and (commits, their microseconds in all).
    pub fn snapshot(&self) -> (Vec<PoolOps>, u64, u64) {
        let pools = self.pools.lock_or_die();
        (
            pools.values().cloned().collect(),
            self.commits.load(Ordering::Relaxed),
            self.commit_us.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_summed_per_pool_and_kind() {
        let t = OpTotals::default();
        let now = Instant::now();
        t.op(2, true, now, 4096, 0);
        t.op(2, true, now, 4096, 0);
        t.op(2, false, now, 0, 512);
        t.op(5, false, now, 0, 8);
        t.commit(now);
        let (pools, commits, _) = t.snapshot();
        assert_eq!(commits, 1);
        assert_eq!(pools.len(), 2);
        let p2 = &pools[0];
        assert_eq!((p2.pool, p2.writes, p2.reads), (2, 2, 1));
        assert_eq!((p2.bytes_in, p2.bytes_out), (8192, 512));
        assert_eq!((pools[1].pool, pools[1].reads), (5, 1));
    }
}
