//! Waiting for a PG to be active before a scrub, and checking that it stayed so: a scrub
//! compares the copies of one interval only.

use crate::context::Osd;
use crate::failure::Failure;
use cairn_map::PgId;
use std::sync::Arc;
use std::time::Duration;

/// How often objects found busy (written during the comparison) are tried again.
pub const BUSY_RETRIES: usize = 5;
/// How long a scrub waits for its PG to finish peering.
const ACTIVE_WAIT: Duration = Duration::from_secs(30);

/// Waits until `pg` is active on this OSD as its primary; returns its interval and acting set.
pub(crate) async fn wait_active(
    osd: &Arc<Osd>,
    pg: PgId,
) -> Result<(crate::peering::Interval, Vec<u32>), Failure> {
    let deadline = tokio::time::Instant::now() + ACTIVE_WAIT;
    loop {
        let map = osd.map();
        let state = crate::shard::with_pg(osd, pg, |shard| {
            let primary = shard.pg(&map, pg).placement.primary();
            if primary != Some(shard.osd.id()) {
                return Err(Failure::stale(match primary {
                    Some(p) => format!("this OSD is not the primary of pg {pg} (osd.{p} is)"),
                    None => format!("pg {pg} has no primary (no member is up)"),
                }));
            }
            if !crate::peering::ready(shard, &map, pg) {
                return Ok(None);
            }
            let st = shard.pg(&map, pg);
            // Members still being recovered differ on purpose.
            if st.recovering.is_some() {
                return Ok(None);
            }
            Ok(st
                .peered
                .clone()
                .map(|iv| (iv, st.placement.acting.clone())))
        });
        match state.ok_or_else(shutting_down)?? {
            Some(v) => return Ok(v),
            None if tokio::time::Instant::now() >= deadline => {
                return Err(Failure::transient(format!(
                    "pg {pg} did not finish peering and recovery within {ACTIVE_WAIT:?}; \
                     scrub it later"
                )))
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Fails when the PG's acting set changed since the scrub began (the comparison would mix
/// intervals); the next scrub starts over.
pub(crate) fn still_active(
    osd: &Arc<Osd>,
    pg: PgId,
    iv: &crate::peering::Interval,
) -> Result<(), Failure> {
    let map = osd.map();
    let same = crate::shard::with_pg(osd, pg, |shard| {
        shard.pg(&map, pg).peered.as_ref() == Some(iv)
    });
    match same {
        Some(true) => Ok(()),
        _ => Err(Failure::stale(format!(
            "pg {pg}'s acting set changed during the scrub; run it again"
        ))),
    }
}

pub(crate) fn shutting_down() -> Failure {
    Failure::transient("the OSD is shutting down")
}
