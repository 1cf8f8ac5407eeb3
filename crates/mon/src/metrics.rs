//! A monitor's Prometheus metrics (`--metrics-addr`): Raft state (term, leadership, log
//! indexes), proposals and their commit latency, and the cluster map as this monitor holds it
//! (epoch, OSDs up and in, pools, EC pools' PGs by missing shards). Names and meanings: `docs/operator/metrics.md`.

use crate::ctx::Ctx;
use cairn_metrics::{
    latency_family, Counter, EncodeLabelSet, Exporter, Family, Gauge, LatencyFamily, Unit,
};
use openraft::ServerState;
use std::sync::{Arc, Weak};

/// What kind of proposal: a map change or a key change.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// A proposal's kind and what became of it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub kind: &'static str,
    pub result: &'static str,
}

/// One OSD of the map.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OsdLabels {
    pub osd: u32,
    pub host: String,
}

/// One pool of the map.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: u32,
    pub name: String,
}

/// An EC pool's PGs missing this many shards.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MissingLabels {
    pub pool: u32,
    pub missing: u32,
}

/// Metrics updated as proposals are made.
pub struct MonMetrics {
    proposals: Family<ResultLabels, Counter>,
    commit_latency: LatencyFamily<KindLabels>,
}

impl MonMetrics {
    pub fn new() -> MonMetrics {
        MonMetrics {
            proposals: Family::default(),
            commit_latency: latency_family(),
        }
    }

    /// A proposal of `kind` that ended as `result` after `secs` (committed and applied here
    /// when `result` is `applied`).
    pub fn proposed(&self, kind: &'static str, result: &'static str, secs: f64) {
        self.proposals
            .get_or_create(&ResultLabels { kind, result })
            .inc();
        if result == "applied" {
            self.commit_latency
                .get_or_create(&KindLabels { kind })
                .observe(secs);
        }
    }
}

/// State read when scraped.
#[derive(Default)]
struct State {
    term: Gauge,
    leader: Gauge,
    last_log: Gauge,
    applied: Gauge,
    members: Gauge,
    epoch: Gauge,
    osd_up: Family<OsdLabels, Gauge>,
    osd_in: Family<OsdLabels, Gauge>,
    osds: Gauge,
    pool_info: Family<PoolLabels, Gauge>,
    ec_pgs: Family<MissingLabels, Gauge>,
    blocklisted: Gauge,
}

impl State {
    fn register(&self, e: &mut Exporter) {
        let r = e.registry();
        r.register("raft_term", "Current Raft term", self.term.clone());
        r.register("leader", "1 on the monitor that leads", self.leader.clone());
        r.register(
            "raft_last_log_index",
            "Index of the last Raft log entry",
            self.last_log.clone(),
        );
        r.register(
            "raft_applied_index",
            "Index of the last Raft log entry applied",
            self.applied.clone(),
        );
        r.register(
            "members",
            "Monitors in the Raft membership",
            self.members.clone(),
        );
        r.register(
            "map_epoch",
            "Epoch of the cluster map this monitor holds",
            self.epoch.clone(),
        );
        r.register(
            "osd_up",
            "1 when the map says the OSD is up",
            self.osd_up.clone(),
        );
        r.register(
            "osd_in",
            "1 when the map says the OSD is in (holds data)",
            self.osd_in.clone(),
        );
        r.register("osds", "OSDs in the map", self.osds.clone());
        r.register(
            "pool_info",
            "One series per pool: its id and name (join on the pool label)",
            self.pool_info.clone(),
        );
        r.register(
            "ec_pgs",
            "PGs of an EC pool by shards missing (an OSD down, or too few to place them), by placement",
            self.ec_pgs.clone(),
        );
        r.register(
            "blocklisted_clients",
            "Client instances fenced (blocklisted)",
            self.blocklisted.clone(),
        );
    }

    fn refresh(&self, ctx: &Ctx) {
        {
            let m = ctx.metrics.borrow();
            self.term.set(m.current_term as i64);
            let leads = m.state == ServerState::Leader && m.current_leader == Some(ctx.id);
            self.leader.set(i64::from(leads));
            self.last_log.set(m.last_log_index.map_or(0, |i| i as i64));
            self.applied
                .set(m.last_applied.map_or(0, |l| l.index as i64));
            self.members
                .set(m.membership_config.membership().voter_ids().count() as i64);
        }
        // Series of OSDs and pools no longer in the map go away.
        self.osd_up.clear();
        self.osd_in.clear();
        self.pool_info.clear();
        self.ec_pgs.clear();
        ctx.view.with_map(|map| {
            self.epoch.set(map.epoch as i64);
            self.osds.set(map.osds.len() as i64);
            self.blocklisted.set(map.blocklist.len() as i64);
            for o in map.osds.values() {
                let l = OsdLabels {
                    osd: o.id,
                    host: o.host.clone(),
                };
                self.osd_up.get_or_create(&l).set(i64::from(o.up));
                self.osd_in.get_or_create(&l).set(i64::from(o.in_));
            }
            let placer = map.placer();
            for p in map.pools.values() {
                let l = PoolLabels {
                    pool: p.id,
                    name: p.name.clone(),
                };
                self.pool_info.get_or_create(&l).set(1);
                let by_missing = map
                    .ec_pgs_by_missing_shards(&placer, p.id)
                    .unwrap_or_default();
                for (missing, n) in by_missing.iter().enumerate() {
                    let l = MissingLabels {
                        pool: p.id,
                        missing: missing as u32,
                    };
                    self.ec_pgs.get_or_create(&l).set(i64::from(*n));
                }
            }
        });
    }
}

/// The exporter of a monitor.
pub fn exporter(ctx: &Arc<Ctx>) -> Arc<Exporter> {
    let mut e = Exporter::new("cairn_mon");
    let m = &ctx.stats;
    e.registry().register(
        "proposals",
        "Changes this monitor proposed (as leader), by kind and result",
        m.proposals.clone(),
    );
    e.registry().register_with_unit(
        "commit_latency",
        "Latency of a change: from proposed to committed by a majority and applied here",
        Unit::Seconds,
        m.commit_latency.clone(),
    );
    let state = Arc::new(State::default());
    state.register(&mut e);
    let weak: Weak<Ctx> = Arc::downgrade(ctx);
    e.on_scrape(move || {
        if let Some(ctx) = weak.upgrade() {
            state.refresh(&ctx);
        }
    });
    Arc::new(e)
}
