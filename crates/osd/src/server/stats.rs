//! What an OSD reports about itself (`OSD_STATS`): usage, state, progress.

use crate::context::Osd;
use cairn_proto::msg::osd::OsdStats;
use std::sync::atomic::Ordering;

/// This OSD's usage and state, as `cairn status` and the metrics show them.
pub fn osd_stats(osd: &Osd) -> OsdStats {
    osd_stats_with(osd, &osd.store.stats())
}

/// [`osd_stats`] from the store's figures `st`, read once by a caller that needs them too.
pub fn osd_stats_with(osd: &Osd, st: &cairn_store::StoreStats) -> OsdStats {
    let (scrub_unrepaired, scrub_repaired, scrubbed_pgs) = osd.scrub.totals();
    let progress = osd.recovery.progress();
    let held = osd.store.list_collections();
    let troubles = osd.pg_troubles();
    let (pools, commits, commit_latency_us) = osd.inflight.totals.snapshot();
    let (wal_sync_floor_us, wal_syncs_handed_off) = osd.wal_pace.figures();
    OsdStats {
        osd: osd.id(),
        // What fills up to a NoSpace refusal, so the full ratio means what it says.
        used_bytes: st.used_bytes,
        memory_target_bytes: osd.memory_target,
        memory_used_bytes: crate::config::resident_bytes(),
        index_bytes: st.index_bytes,
        cache_bytes: st.read_cache.bytes,
        cache_capacity_bytes: st.read_cache.capacity,
        cache_hits: st.read_cache.hits,
        cache_misses: st.read_cache.misses,
        capacity_bytes: st.writable_bytes,
        inflight: osd.inflight.count() as u64,
        recovered_objects: osd.recovery.objects.load(Ordering::Relaxed),
        recovery_bytes: osd.recovery.bytes.load(Ordering::Relaxed),
        recovery_pending_objects: progress.pending_objects,
        recovery_bytes_per_sec: progress.bytes_per_sec,
        recovery_objects_per_sec: progress.objects_per_sec,
        peering_pgs: osd.peering_pgs(),
        scrub_unrepaired,
        scrub_repaired,
        scrubbed_pgs,
        pgs_held: held.len() as u64,
        pgs_misplaced: crate::peering::misplaced_copies(osd, &held),
        pgs_reclaiming: crate::reclaim::removed_copies(&osd.map(), &held),
        down_pgs: troubles.down,
        failed_pgs: troubles.failed,
        crashes: osd.crashes.clone(),
        lost_write_pgs: troubles.lost,
        slow_ops: osd.slow.summary(),
        slow_ops_total: osd.slow.total(),
        pools,
        commits,
        commit_latency_us,
        wal_sync_floor_us,
        wal_syncs_handed_off,
        copies: payload_copies(&st.copies),
    }
}

fn payload_copies(store: &cairn_store::CopyStats) -> cairn_proto::msg::osd::PayloadCopies {
    let net = cairn_transport::copies::tally();
    cairn_proto::msg::osd::PayloadCopies {
        received_bytes: net.received_bytes,
        receive_copied_bytes: net.receive_copied_bytes,
        send_queue_copied_bytes: net.queue_copied_bytes,
        send_queue_held_bytes: net.queue_held_bytes,
        wal_batch_bytes: store.wal_batch_bytes,
        partial_block_bytes: store.partial_block_bytes,
        flush_staged_bytes: store.flush_staged_bytes,
        direct_staged_bytes: store.direct_staged_bytes,
    }
}
