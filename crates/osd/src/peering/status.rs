//! A PG as its primary sees it, for `cairn pg query`: its state, its past intervals as the
//! last peering judged them, and what it waits for.

use crate::shard::Shard;
use cairn_map::PgId;
use cairn_proto::msg::peering::{IntervalStatus, PgStatus};

/// The status of `pg` on this OSD.
pub fn of(shard: &mut Shard, pg: PgId) -> PgStatus {
    let map = shard.osd.map();
    let me = shard.osd.id();
    let les = super::copy::last_epoch_started(&shard.osd.store, pg);
    let st = shard.pg(&map, pg);
    let report = st.report.clone().unwrap_or_default();
    let primary = st.placement.primary() == Some(me);
    let waiting_for = st
        .down
        .as_ref()
        .map(|d| d.waiting_for.clone())
        .unwrap_or_default();
    let active = st.peered.is_some() && st.peering.is_none() && st.down.is_none();
    let (state, reason) = if !primary {
        (
            "inactive",
            Some(format!("osd.{me} is not this PG's primary")),
        )
    } else if !waiting_for.is_empty() {
        let osds: Vec<String> = waiting_for.iter().map(|o| format!("osd.{o}")).collect();
        let cause = report.reason.clone().unwrap_or_else(|| {
            "an interval that may have acknowledged writes has no member up".into()
        });
        let why = format!(
            "down: {cause}; waiting for {} (may hold newer writes); `cairn osd lost` gives \
             them up",
            osds.join(" or ")
        );
        ("down", Some(why))
    } else if let Some(f) = st.failure.as_ref().filter(|f| !f.class.retries()) {
        // Its last peering failed for good: whatever it served before, it serves nothing
        // until the map changes.
        let why = format!("{f} ({}: not retried until the map changes)", f.class);
        ("failed", Some(why))
    } else if !active {
        ("peering", st.failure.as_ref().map(|f| f.to_string()))
    } else if st.recovering.is_some() {
        ("recovering", None)
    } else {
        ("active", None)
    };
    let intervals = report
        .intervals
        .iter()
        .map(|iv| {
            let blocked = report
                .coverage
                .blocked
                .iter()
                .find(|b| b.interval == *iv)
                .map(|b| b.waiting_for.clone());
            IntervalStatus {
                interval: iv.clone(),
                answered: iv
                    .acting
                    .iter()
                    .copied()
                    .filter(|o| report.answered.contains(o))
                    .collect(),
                waiting_for: blocked.unwrap_or_default(),
                given_up: report.coverage.given_up.contains(iv),
            }
        })
        .collect();
    PgStatus {
        epoch: map.epoch,
        state: state.to_string(),
        up_set: st.placement.up_set.clone(),
        acting: st.placement.acting.clone(),
        last_version: st.last_version,
        last_epoch_started: les,
        intervals_from: report.from,
        intervals,
        answered: report.answered.iter().copied().collect(),
        waiting_for,
        reason,
        unfound: st
            .unfound
            .iter()
            .take(cairn_proto::msg::peering::MAX_NAMES as usize)
            .cloned()
            .collect(),
        // Cleared when a peering succeeds.
        failure_class: st.failure.as_ref().map(|f| f.class.name().to_string()),
        lost_intervals: st.lost_intervals.clone(),
        degraded_objects: st.missing.len() as u64,
    }
}
