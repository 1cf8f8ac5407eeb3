//! An OSD's Prometheus metrics (`--metrics-addr`): events counted where they happen (client
//! ops and their latency as primary, writes applied, bytes, store commit latency), state read
//! at each scrape (space, WAL, flusher, cleaner, cache, recovery, scrub, PGs). Names and
//! meanings: `docs/operator/metrics.md`. Without `--metrics-addr` none of it is updated.

use cairn_metrics::{
    latency_family, latency_histogram, Counter, EncodeLabelSet, Exporter, Family, FloatCounter,
    Gauge, Histogram, LatencyFamily, Unit,
};
use cairn_proto::msg::osd::OpKind;
use std::sync::Arc;
use std::time::Instant;

/// A client op of a pool, by kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub pool: u32,
    pub op: &'static str,
}

/// A pool and this OSD's role in a write (`primary` or `replica`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    pub pool: u32,
    pub role: &'static str,
}

/// A pool and a direction (`in`: written by clients, `out`: read by them).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabels {
    pub pool: u32,
    pub direction: &'static str,
}

/// The metrics updated on the op path.
pub struct OsdMetrics {
    client_ops: Family<OpLabels, Counter>,
    op_latency: LatencyFamily<OpLabels>,
    writes_applied: Family<RoleLabels, Counter>,
    client_bytes: Family<BytesLabels, Counter>,
    commit_latency: Histogram,
}

/// The label of an op kind.
pub fn op_name(kind: &OpKind) -> &'static str {
    match kind {
        OpKind::Read { .. } => "read",
        OpKind::Stat => "stat",
        OpKind::List { .. } => "list",
        OpKind::Watch { .. } => "watch",
        OpKind::Write { .. } => "write",
        OpKind::WriteFull => "write_full",
        OpKind::Create => "create",
        OpKind::WriteFullIf { .. } => "write_full_if",
        OpKind::Zero { .. } => "zero",
        OpKind::Truncate { .. } => "truncate",
        OpKind::Remove => "remove",
        OpKind::RemoveIf { .. } => "remove_if",
    }
}

impl OsdMetrics {
    fn new() -> OsdMetrics {
        OsdMetrics {
            client_ops: Family::default(),
            op_latency: latency_family(),
            writes_applied: Family::default(),
            client_bytes: Family::default(),
            commit_latency: latency_histogram(),
        }
    }

    /// A client op this OSD served as primary, `started` when it reached its shard.
    pub fn op_done(&self, pool: u32, op: &'static str, started: Instant, bytes: (u64, u64)) {
        let labels = OpLabels { pool, op };
        self.client_ops.get_or_create(&labels).inc();
        self.op_latency
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        for (direction, n) in [("in", bytes.0), ("out", bytes.1)] {
            if n > 0 {
                let l = BytesLabels { pool, direction };
                self.client_bytes.get_or_create(&l).inc_by(n);
            }
        }
    }

    /// A write committed to this OSD's store (`primary`: a client's; else a replicated one).
    pub fn write_applied(&self, pool: u32, primary: bool) {
        let role = if primary { "primary" } else { "replica" };
        self.writes_applied
            .get_or_create(&RoleLabels { pool, role })
            .inc();
    }

    /// A batch of writes made durable, the first of them submitted at `since`.
    pub fn committed(&self, since: Instant) {
        self.commit_latency.observe(since.elapsed().as_secs_f64());
    }
}

/// Gauges and counters read from the OSD's state when scraped.
#[derive(Default)]
struct StateMetrics {
    capacity: Gauge,
    used: Gauge,
    full: Gauge,
    nearfull_room: Gauge,
    wal_used: Gauge,
    wal_size: Gauge,
    pending: Gauge,
    pending_limit: Gauge,
    ckpt_write_seconds: FloatCounter,
    ckpt_flush_seconds: FloatCounter,
    checkpoint_bytes: Gauge,
    segments_free: Gauge,
    segments_total: Gauge,
    commits: Counter,
    checkpoints: Counter,
    cleaned_segments: Counter,
    cleaned_bytes: Counter,
    flusher_waits: Counter,
    wal_space_waits: Counter,
    lock_waits: Counter,
    lock_wait_seconds: FloatCounter,
    lock_waits_over_1ms: Counter,
    wal_lock_waits: Counter,
    wal_lock_wait_seconds: FloatCounter,
    wal_lock_waits_over_1ms: Counter,
    coll_lock_waits: Counter,
    coll_lock_wait_seconds: FloatCounter,
    coll_lock_waits_over_1ms: Counter,
    bg_coll_lock_waits: Counter,
    bg_coll_lock_wait_seconds: FloatCounter,
    bg_coll_lock_waits_over_1ms: Counter,
    cache_hits: Counter,
    cache_misses: Counter,
    cache_bytes: Gauge,
    data_read_bytes: Counter,
    data_written_bytes: Counter,
    wal_written_bytes: Counter,
    inflight: Gauge,
    recovered_objects: Counter,
    recovery_bytes: Counter,
    recovery_pending: Gauge,
    peering_pgs: Gauge,
    down_pgs: Gauge,
    held_pgs: Gauge,
    misplaced_pgs: Gauge,
    scrubbed_pgs: Counter,
    scrub_repaired: Counter,
    scrub_unrepaired: Gauge,
    memory: Gauge,
    up_from: Gauge,
    slow_total: Counter,
    slow_recent: Gauge,
}

/// Sets a counter read from state to `v` (state counters only grow; a restart starts over,
/// which Prometheus handles as a counter reset).
fn set_counter(c: &Counter, v: u64) {
    let now = c.get();
    if v > now {
        c.inc_by(v - now);
    }
}

/// Raises a seconds counter to a total kept in microseconds.
fn set_seconds(c: &FloatCounter, micros: u64) {
    let v = micros as f64 / 1e6;
    let now = c.get();
    if v > now {
        c.inc_by(v - now);
    }
}

impl StateMetrics {
    fn register(&self, e: &mut Exporter) {
        let r = e.registry();
        let bytes = Unit::Bytes;
        r.register_with_unit(
            "capacity",
            "Bytes the store can fill before client writes are refused for no space",
            bytes.clone(),
            self.capacity.clone(),
        );
        r.register_with_unit(
            "used",
            "Bytes in use: object data (flushed and pending) and checkpoints",
            bytes.clone(),
            self.used.clone(),
        );
        r.register(
            "full",
            "1 when a primary here would refuse a 4 MiB client write for no space",
            self.full.clone(),
        );
        r.register_with_unit(
            "admissible",
            "Bytes of client data this OSD would still admit as a primary",
            bytes.clone(),
            self.nearfull_room.clone(),
        );
        r.register_with_unit(
            "wal_used",
            "Bytes of the WAL ring in use (not yet checkpointed)",
            bytes.clone(),
            self.wal_used.clone(),
        );
        r.register_with_unit(
            "wal_size",
            "Bytes of the WAL ring",
            bytes.clone(),
            self.wal_size.clone(),
        );
        r.register_with_unit(
            "flusher_pending",
            "Bytes written to the WAL waiting for the flusher",
            bytes.clone(),
            self.pending.clone(),
        );
        r.register_with_unit(
            "flusher_pending_limit",
            "Bytes that may wait for the flusher before commits wait for it",
            bytes.clone(),
            self.pending_limit.clone(),
        );
        r.register_with_unit(
            "checkpoint",
            "Bytes of the store's checkpoints",
            bytes.clone(),
            self.checkpoint_bytes.clone(),
        );
        r.register(
            "segments_free",
            "Free segments of the data devices",
            self.segments_free.clone(),
        );
        r.register(
            "segments",
            "Segments of the data devices",
            self.segments_total.clone(),
        );
        r.register(
            "store_commits",
            "Transactions the store committed",
            self.commits.clone(),
        );
        r.register(
            "store_checkpoints",
            "Checkpoints the store took",
            self.checkpoints.clone(),
        );
        r.register_with_unit(
            "checkpoint_write",
            "Time checkpoints spent writing their index snapshot to the data devices",
            Unit::Seconds,
            self.ckpt_write_seconds.clone(),
        );
        r.register_with_unit(
            "checkpoint_device_flush",
            "Time checkpoints spent flushing the data devices (it can hold the flusher's writes)",
            Unit::Seconds,
            self.ckpt_flush_seconds.clone(),
        );
        r.register(
            "cleaner_segments",
            "Segments the cleaner freed",
            self.cleaned_segments.clone(),
        );
        r.register_with_unit(
            "cleaner",
            "Bytes of live data the cleaner moved",
            bytes.clone(),
            self.cleaned_bytes.clone(),
        );
        r.register(
            "flusher_waits",
            "Commits that waited for the flusher (pending data at its limit)",
            self.flusher_waits.clone(),
        );
        r.register(
            "wal_space_waits",
            "Commits that waited for WAL space",
            self.wal_space_waits.clone(),
        );
        r.register(
            "store_lock_waits",
            "Times a thread found the store's state lock taken and waited",
            self.lock_waits.clone(),
        );
        r.register(
            "store_lock_wait_seconds",
            "Time threads waited for the store's state lock",
            self.lock_wait_seconds.clone(),
        );
        r.register(
            "store_lock_waits_over_1ms",
            "Waits for the store's state lock longer than 1 ms",
            self.lock_waits_over_1ms.clone(),
        );
        r.register(
            "store_wal_lock_waits",
            "Times a thread found the store's WAL queue lock taken and waited",
            self.wal_lock_waits.clone(),
        );
        r.register(
            "store_wal_lock_wait_seconds",
            "Time threads waited for the store's WAL queue lock",
            self.wal_lock_wait_seconds.clone(),
        );
        r.register(
            "store_wal_lock_waits_over_1ms",
            "Waits for the store's WAL queue lock longer than 1 ms",
            self.wal_lock_waits_over_1ms.clone(),
        );
        r.register(
            "store_collection_lock_waits",
            "Times a thread found one of the store's collection locks taken and waited",
            self.coll_lock_waits.clone(),
        );
        r.register(
            "store_collection_lock_wait_seconds",
            "Time threads waited for the store's collection locks",
            self.coll_lock_wait_seconds.clone(),
        );
        r.register(
            "store_collection_lock_waits_over_1ms",
            "Waits for one of the store's collection locks longer than 1 ms",
            self.coll_lock_waits_over_1ms.clone(),
        );
        r.register(
            "store_background_collection_lock_waits",
            "Times the store's flusher or cleaner found a collection's lock taken and waited",
            self.bg_coll_lock_waits.clone(),
        );
        r.register(
            "store_background_collection_lock_wait_seconds",
            "Time the store's flusher and cleaner waited for collection locks",
            self.bg_coll_lock_wait_seconds.clone(),
        );
        r.register(
            "store_background_collection_lock_waits_over_1ms",
            "Waits of the store's flusher and cleaner for a collection's lock longer than 1 ms",
            self.bg_coll_lock_waits_over_1ms.clone(),
        );
        r.register(
            "read_cache_hits",
            "Reads served by the read cache",
            self.cache_hits.clone(),
        );
        r.register(
            "read_cache_misses",
            "Reads that missed the read cache",
            self.cache_misses.clone(),
        );
        r.register_with_unit(
            "read_cache",
            "Bytes held by the read cache",
            bytes.clone(),
            self.cache_bytes.clone(),
        );
        r.register_with_unit(
            "data_device_read",
            "Bytes read from the data devices",
            bytes.clone(),
            self.data_read_bytes.clone(),
        );
        r.register_with_unit(
            "data_device_written",
            "Bytes written to the data devices",
            bytes.clone(),
            self.data_written_bytes.clone(),
        );
        r.register_with_unit(
            "wal_device_written",
            "Bytes written to the WAL device",
            bytes.clone(),
            self.wal_written_bytes.clone(),
        );
        r.register(
            "writes_inflight",
            "Writes this OSD leads waiting for their members",
            self.inflight.clone(),
        );
        r.register(
            "recovered_objects",
            "Objects copied by recovery, backfill or repair",
            self.recovered_objects.clone(),
        );
        r.register_with_unit(
            "recovery",
            "Object bytes copied by recovery, backfill or repair",
            bytes.clone(),
            self.recovery_bytes.clone(),
        );
        r.register(
            "recovery_pending_objects",
            "Objects the recoveries this OSD leads still have to copy",
            self.recovery_pending.clone(),
        );
        r.register(
            "pgs_peering",
            "PGs this OSD leads that are peering or recovering",
            self.peering_pgs.clone(),
        );
        r.register(
            "pgs_down",
            "PGs this OSD leads that are down (waiting for OSDs)",
            self.down_pgs.clone(),
        );
        r.register(
            "pgs_held",
            "PG copies this OSD holds",
            self.held_pgs.clone(),
        );
        r.register(
            "pgs_misplaced",
            "PG copies held here that the map places elsewhere",
            self.misplaced_pgs.clone(),
        );
        r.register(
            "scrubbed_pgs",
            "PG scrubs this OSD led",
            self.scrubbed_pgs.clone(),
        );
        r.register(
            "scrub_repaired",
            "Object copies scrub repaired",
            self.scrub_repaired.clone(),
        );
        r.register(
            "scrub_unrepaired",
            "Damaged object copies scrub found and could not repair",
            self.scrub_unrepaired.clone(),
        );
        r.register_with_unit(
            "resident_memory",
            "Resident memory of the OSD process",
            bytes,
            self.memory.clone(),
        );
        r.register(
            "up_from_epoch",
            "Map epoch this OSD booted at",
            self.up_from.clone(),
        );
        r.register(
            "slow_ops",
            "Writes this OSD led that took longer than its slow-op threshold",
            self.slow_total.clone(),
        );
        r.register(
            "slow_ops_recent",
            "Slow writes of the last minute",
            self.slow_recent.clone(),
        );
    }

    fn refresh(&self, sample: &Sample) {
        let (st, stats) = (&sample.store, &sample.osd);
        let g = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        let data_room = sample.data_room;
        g(&self.capacity, st.writable_bytes);
        g(&self.used, st.used_bytes);
        g(&self.full, u64::from(data_room < 4 << 20));
        g(&self.nearfull_room, data_room);
        g(&self.wal_used, st.wal_used_bytes);
        g(&self.wal_size, st.wal_size);
        g(&self.pending, st.pending_bytes);
        g(&self.pending_limit, st.pending_limit_bytes);
        set_seconds(&self.ckpt_write_seconds, st.checkpoint_write_micros);
        set_seconds(&self.ckpt_flush_seconds, st.checkpoint_flush_micros);
        g(&self.checkpoint_bytes, st.checkpoint_bytes);
        g(&self.segments_free, st.segments_free.into());
        g(&self.segments_total, st.segments_total.into());
        set_counter(&self.commits, st.commits);
        set_counter(&self.checkpoints, st.checkpoints);
        set_counter(&self.cleaned_segments, st.segments_cleaned);
        set_counter(&self.cleaned_bytes, st.cleaned_bytes);
        set_counter(&self.flusher_waits, st.waits_for_flusher);
        set_counter(&self.wal_space_waits, st.waits_for_wal_space);
        set_counter(&self.lock_waits, st.lock_waits.waits);
        set_seconds(&self.lock_wait_seconds, st.lock_waits.wait_nanos / 1_000);
        set_counter(
            &self.lock_waits_over_1ms,
            st.lock_waits.over_nanos(1_000_000),
        );
        let w = &st.wal_lock_waits;
        set_counter(&self.wal_lock_waits, w.waits);
        set_seconds(&self.wal_lock_wait_seconds, w.wait_nanos / 1_000);
        set_counter(&self.wal_lock_waits_over_1ms, w.over_nanos(1_000_000));
        let c = &st.coll_lock_waits;
        set_counter(&self.coll_lock_waits, c.waits);
        set_seconds(&self.coll_lock_wait_seconds, c.wait_nanos / 1_000);
        set_counter(&self.coll_lock_waits_over_1ms, c.over_nanos(1_000_000));
        let b = &st.coll_lock_waits_background;
        set_counter(&self.bg_coll_lock_waits, b.waits);
        set_seconds(&self.bg_coll_lock_wait_seconds, b.wait_nanos / 1_000);
        set_counter(&self.bg_coll_lock_waits_over_1ms, b.over_nanos(1_000_000));
        set_counter(&self.cache_hits, st.read_cache.hits);
        set_counter(&self.cache_misses, st.read_cache.misses);
        g(&self.cache_bytes, st.read_cache.bytes);
        set_counter(&self.data_read_bytes, st.data_io.read_bytes);
        set_counter(&self.data_written_bytes, st.data_io.write_bytes);
        set_counter(&self.wal_written_bytes, st.wal_io.write_bytes);
        g(&self.inflight, stats.inflight);
        set_counter(&self.recovered_objects, stats.recovered_objects);
        set_counter(&self.recovery_bytes, stats.recovery_bytes);
        g(&self.recovery_pending, stats.recovery_pending_objects);
        g(&self.peering_pgs, stats.peering_pgs);
        g(&self.down_pgs, stats.down_pgs.len() as u64);
        g(&self.held_pgs, stats.pgs_held);
        g(&self.misplaced_pgs, stats.pgs_misplaced);
        set_counter(&self.scrubbed_pgs, stats.scrubbed_pgs);
        set_counter(&self.scrub_repaired, stats.scrub_repaired);
        g(&self.scrub_unrepaired, stats.scrub_unrepaired);
        g(&self.memory, stats.memory_used_bytes);
        g(&self.up_from, sample.up_from);
        set_counter(&self.slow_total, stats.slow_ops_total);
        g(&self.slow_recent, sample.slow_recent);
    }
}

/// The op-path metrics of a new OSD, when it serves metrics.
pub fn op_metrics(serving: bool) -> Option<Arc<OsdMetrics>> {
    serving.then(|| Arc::new(OsdMetrics::new()))
}

/// The OSD's state the scrape-time metrics read: its stats as `OSD_STATS` reports them, and
/// a few figures they leave out.
pub struct Sample {
    pub store: cairn_store::StoreStats,
    pub osd: cairn_proto::msg::osd::OsdStats,
    /// Bytes the data device can still take (`Store::admissible_bytes`).
    pub data_room: u64,
    pub up_from: u64,
    /// Slow writes of the last minute.
    pub slow_recent: u64,
}

/// The exporter of an OSD's `op` metrics and of the state `sample` reads at each scrape
/// (`None` once the OSD is gone).
pub fn exporter(
    op: Option<&Arc<OsdMetrics>>,
    sample: impl Fn() -> Option<Sample> + Send + Sync + 'static,
) -> Arc<Exporter> {
    let mut e = Exporter::new("cairn_osd");
    if let Some(m) = op {
        let r = e.registry();
        r.register(
            "client_ops",
            "Client ops served as primary, by pool and kind",
            m.client_ops.clone(),
        );
        r.register_with_unit(
            "op_latency",
            "Latency of client ops served as primary: from reaching their shard to the reply (writes: held by every member)",
            Unit::Seconds,
            m.op_latency.clone(),
        );
        r.register(
            "writes_applied",
            "Writes committed to this OSD's store, by pool and role (primary or replica)",
            m.writes_applied.clone(),
        );
        r.register_with_unit(
            "client",
            "Bytes clients wrote to (in) and read from (out) this OSD as primary",
            Unit::Bytes,
            m.client_bytes.clone(),
        );
        r.register_with_unit(
            "commit_latency",
            "Store commit latency: one WAL write (and flush, for wal pools) making a batch of writes durable",
            Unit::Seconds,
            m.commit_latency.clone(),
        );
    }
    let state = Arc::new(StateMetrics::default());
    state.register(&mut e);
    e.on_scrape(move || {
        if let Some(s) = sample() {
            state.refresh(&s);
        }
    });
    Arc::new(e)
}
