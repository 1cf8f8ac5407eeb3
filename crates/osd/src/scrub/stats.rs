//! What this OSD's scrubs found, kept for `OSD_STATS` (the OSD's shared context holds it).

use cairn_failstop::LockOrDie;
use cairn_map::PgId;
use cairn_proto::msg::scrub::ScrubReport;

/// What the latest scrubs found, for `OSD_STATS`.
#[derive(Default)]
pub struct ScrubStats {
    inner: std::sync::Mutex<StatsInner>,
}

#[derive(Default)]
struct StatsInner {
    /// Per PG led by this OSD: wrong copies its latest scrub left unrepaired.
    unrepaired: std::collections::HashMap<PgId, u64>,
    repaired: u64,
    scrubbed: u64,
}

impl ScrubStats {
    /// Records a scrub's outcome (a scrub that stopped early replaces an earlier count only
    /// when it found something itself).
    pub fn note(&self, pg: PgId, rep: &ScrubReport) {
        let mut s = self.inner.lock_or_die();
        s.repaired += rep.repaired;
        if rep.error.is_none() {
            s.scrubbed += 1;
        }
        if rep.error.is_none() || rep.inconsistent > 0 {
            s.unrepaired
                .insert(pg, rep.inconsistent.saturating_sub(rep.repaired));
        }
    }

    /// (copies left wrong by the latest scrubs, copies repaired, PGs scrubbed) since start.
    pub fn totals(&self) -> (u64, u64, u64) {
        let s = self.inner.lock_or_die();
        (s.unrepaired.values().sum(), s.repaired, s.scrubbed)
    }
}
