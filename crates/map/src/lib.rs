//! cairn-map: the cluster map shared by monitors, OSDs and clients.
//!
//! The map is a value with an epoch. It changes only by [`ClusterMap::apply`] of a
//! [`MapChange`]; every change that alters the map bumps the epoch by one, so an
//! [`Incremental`] (epoch + the change that produced it) is enough for a subscriber holding
//! the previous epoch to compute the next map itself. Monitors replicate the changes through
//! Raft; `apply` is deterministic, so every monitor and subscriber computes the same map.
//!
//! Placement of a PG ([`ClusterMap::pg_placement`]) draws over the OSDs that are *in* (with
//! a weight) with `cairn-placement`; the *acting* set is the drawn OSDs that are also *up*, in draw
//! order, the first being the primary. An OSD going down therefore does not move data (its PGs
//! are served by the remaining members), only an OSD marked out does.

mod change;
pub mod intervals;
mod pool;

pub use change::{ChangeOutcome, MapChange, MapError};
pub use intervals::{PastInterval, NO_OSD};
pub use pool::{Domain, Durability, EcProfile, PlacementRule, Pool, PoolSetting, MAX_PG_COUNT};

use cairn_placement::{Hierarchy, HostNode, OsdNode, Placer};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An OSD as the map knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdInfo {
    /// Stable id, assigned by the monitors at first boot.
    pub id: u32,
    /// Where the OSD accepts connections (`ip:port`), as it reported at its last boot.
    pub addr: String,
    /// Host (failure domain) the OSD runs on.
    pub host: String,
    /// Whether it is running and reachable (set by boot, cleared by missed heartbeats).
    pub up: bool,
    /// Whether placement gives it data (operators mark OSDs out to drain them).
    pub in_: bool,
    /// Placement weight in 16.16 fixed point (`cairn_placement::WEIGHT_ONE` = 1.0).
    pub weight: u32,
    /// Epoch of its last boot: distinguishes a restarted OSD from its previous life.
    pub up_from: u64,
    /// Store identity reported at boot (uuid of its store), so a wiped OSD is recognised.
    pub store_id: [u8; 16],
    /// Epoch an operator declared it lost (`cairn osd lost`; 0 = never): peering no longer
    /// waits for it, and writes only it may have held are given up.
    pub lost_at: u64,
}

impl OsdInfo {
    /// Weight used for placement: 0 when out.
    pub fn placement_weight(&self) -> u32 {
        if self.in_ {
            self.weight
        } else {
            0
        }
    }
}

/// The cluster map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Identity of the cluster (random at creation); daemons refuse a map of another cluster.
    pub fsid: [u8; 16],
    /// Version of the map: +1 on every change.
    pub epoch: u64,
    /// OSDs by id.
    pub osds: BTreeMap<u32, OsdInfo>,
    /// Pools by id.
    pub pools: BTreeMap<u32, Pool>,
    /// Next pool id to assign (ids are never reused, so stale clients cannot hit a new pool).
    pub next_pool_id: u32,
    /// Next OSD id to assign.
    pub next_osd_id: u32,
    /// Rack and zone labels of hosts, by host name (a host without labels has no entry).
    pub hosts: BTreeMap<String, HostLocation>,
    /// Fenced client instances, each until a time (Unix seconds): OSDs refuse their ops
    /// (`MapChange::BlocklistAdd`). Entries leave once expired (`BlocklistExpire`).
    pub blocklist: BTreeMap<u64, u64>,
}

/// Most fences the map holds at once (each is 16 bytes in every map sent; a takeover adds one
/// and they expire after an hour).
pub const MAX_BLOCKLIST: usize = 10_000;

/// Where a host sits, for failure domains: its zone and rack ("" = unlabelled). Ordered
/// zone first, as the tree prints.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostLocation {
    pub zone: String,
    pub rack: String,
}

/// Where a PG lives at one epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgPlacement {
    /// OSDs drawn by placement (in OSDs, up or not), in order. For an EC pool one per shard,
    /// [`NO_OSD`] for a shard no OSD could be drawn for (too few failure domains).
    pub up_set: Vec<u32>,
    /// Members of `up_set` that are up, in order; the first is the primary.
    pub acting: Vec<u32>,
}

impl PgPlacement {
    /// The primary, if any member is up.
    pub fn primary(&self) -> Option<u32> {
        self.acting.first().copied()
    }
}

/// A PG named by its pool and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PgId {
    pub pool: u32,
    pub pg: u32,
}

impl std::fmt::Display for PgId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:x}", self.pool, self.pg)
    }
}

/// One step of the map's history: the change that turned epoch - 1 into `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incremental {
    pub epoch: u64,
    pub change: MapChange,
}

impl ClusterMap {
    /// An empty map at epoch 1 for a new cluster.
    pub fn new(fsid: [u8; 16]) -> ClusterMap {
        ClusterMap {
            fsid,
            epoch: 1,
            osds: BTreeMap::new(),
            pools: BTreeMap::new(),
            next_pool_id: 1,
            next_osd_id: 0,
            hosts: BTreeMap::new(),
            blocklist: BTreeMap::new(),
        }
    }

    /// Whether OSDs must refuse the ops of client `instance` (it was fenced).
    pub fn is_blocklisted(&self, instance: u64) -> bool {
        !self.blocklist.is_empty() && self.blocklist.contains_key(&instance)
    }

    /// The labels of `host` (none when unlabelled).
    pub fn host_location(&self, host: &str) -> HostLocation {
        self.hosts.get(host).cloned().unwrap_or_default()
    }

    /// The placement hierarchy (root -> hosts -> OSDs) with out OSDs at weight 0.
    pub fn hierarchy(&self) -> Hierarchy {
        self.hierarchy_weighted(OsdInfo::placement_weight)
    }

    /// [`ClusterMap::hierarchy`] with each OSD weighted by `weight`.
    fn hierarchy_weighted(&self, weight: impl Fn(&OsdInfo) -> u32) -> Hierarchy {
        let mut hosts: BTreeMap<&str, Vec<OsdNode>> = BTreeMap::new();
        for o in self.osds.values() {
            hosts.entry(&o.host).or_default().push(OsdNode {
                id: o.id,
                weight: weight(o),
            });
        }
        Hierarchy {
            hosts: hosts
                .into_iter()
                .map(|(name, osds)| {
                    let at = self.host_location(name);
                    HostNode {
                        name: name.to_string(),
                        rack: at.rack,
                        zone: at.zone,
                        osds,
                    }
                })
                .collect(),
        }
    }

    /// Looks a pool up by name.
    pub fn pool_by_name(&self, name: &str) -> Option<&Pool> {
        self.pools.values().find(|p| p.name == name)
    }

    /// The hierarchy prepared for placement: build it once per map to place many PGs.
    pub fn placer(&self) -> Placer {
        let out = self.osds.values().filter(|o| !o.in_).map(|o| o.id);
        Placer::with_out(&self.hierarchy_weighted(|o| o.weight), out.collect())
    }

    /// Where `pg` lives at this epoch. Unknown pools give an empty placement.
    pub fn pg_placement(&self, pg: PgId) -> PgPlacement {
        self.pg_placement_in(&self.placer(), pg)
    }

    /// Same as [`ClusterMap::pg_placement`] with the placer prepared once by the caller
    /// ([`ClusterMap::placer`]; placing many PGs).
    pub fn pg_placement_in(&self, placer: &Placer, pg: PgId) -> PgPlacement {
        let Some(pool) = self.pools.get(&pg.pool) else {
            return PgPlacement {
                up_set: Vec::new(),
                acting: Vec::new(),
            };
        };
        let size = usize::from(pool.size);
        let up_set = match pool.rule {
            PlacementRule::FlatV1 => placer.pg_osds(pg.pool, pg.pg, size, placer.default_domain()),
            PlacementRule::Tree { domain } => {
                placer.pg_osds_tree(pg.pool, pg.pg, size, domain.placement())
            }
            // Positional: a rank with no OSD is a hole (NO_OSD), the ranks after it keep theirs.
            PlacementRule::Erasure { domain, .. } => placer
                .pg_osds_indep(pg.pool, pg.pg, size, domain.placement())
                .into_iter()
                .map(|o| o.unwrap_or(NO_OSD))
                .collect(),
        };
        let acting = up_set
            .iter()
            .copied()
            .filter(|id| self.osds.get(id).is_some_and(|o| o.up))
            .collect();
        PgPlacement { up_set, acting }
    }

    /// The PG of an object in a pool, `None` when the pool does not exist.
    pub fn object_pg(&self, pool: u32, name: &[u8]) -> Option<PgId> {
        let p = self.pools.get(&pool)?;
        Some(PgId {
            pool,
            pg: cairn_placement::object_pg(name, p.pg_count),
        })
    }

    /// Applies the incremental for the next epoch. Fails when it is not the next one.
    pub fn apply_incremental(&mut self, inc: &Incremental) -> Result<(), MapError> {
        if inc.epoch != self.epoch + 1 {
            return Err(MapError::EpochGap {
                have: self.epoch,
                got: inc.epoch,
            });
        }
        match self.apply(&inc.change)? {
            ChangeOutcome::Changed { .. } => Ok(()),
            ChangeOutcome::Unchanged => Err(MapError::EpochGap {
                have: self.epoch,
                got: inc.epoch,
            }),
        }
    }

    /// How many failure domains of `rule` hold an in OSD with a weight, and their kind
    /// ("host"...): a pool whose size exceeds the count can never be fully placed. Version 1
    /// uses hosts when there are at least two such hosts, otherwise OSDs.
    pub fn failure_domains(placer: &Placer, rule: PlacementRule) -> (usize, &'static str) {
        let (n, d) = match rule {
            PlacementRule::FlatV1 => placer.domains(),
            PlacementRule::Tree { domain } | PlacementRule::Erasure { domain, .. } => {
                (placer.domain_count(domain.placement()), domain.placement())
            }
        };
        (n, d.name())
    }

    /// The shards of an EC PG placed at `p`: per shard (rank of the draw), its OSD when up,
    /// `None` when that OSD is down or no OSD could be drawn for the rank (too few failure
    /// domains). A hole stays a hole: a down OSD's shard cannot be served by another OSD,
    /// which holds a different shard. Empty for a replicated pool.
    pub fn pg_shards(&self, pg: PgId, p: &PgPlacement) -> Vec<Option<u32>> {
        let Some(ec) = self.pools.get(&pg.pool).and_then(Pool::ec) else {
            return Vec::new();
        };
        (0..usize::from(ec.shards()))
            .map(|rank| {
                let id = *p.up_set.get(rank)?;
                self.osds.get(&id).is_some_and(|o| o.up).then_some(id)
            })
            .collect()
    }

    /// The PGs of EC pool `pool` by how many shards they miss (index `i`: PGs with `i` shards
    /// absent, `0..=k+m`), by placement with `placer` ([`ClusterMap::placer`], built once for
    /// every pool); `None` for a replicated or unknown pool.
    pub fn ec_pgs_by_missing_shards(&self, placer: &Placer, pool: u32) -> Option<Vec<u32>> {
        let p = self.pools.get(&pool)?;
        let shards = usize::from(p.ec()?.shards());
        let mut by_missing = vec![0u32; shards + 1];
        for pg in 0..p.pg_count {
            let id = PgId { pool, pg };
            let held = self.pg_shards(id, &self.pg_placement_in(placer, id));
            let missing = held.iter().filter(|s| s.is_none()).count();
            by_missing[missing.min(shards)] += 1;
        }
        Some(by_missing)
    }

    /// Number of OSDs up and in, for status.
    pub fn osd_counts(&self) -> (usize, usize, usize) {
        let up = self.osds.values().filter(|o| o.up).count();
        let inn = self.osds.values().filter(|o| o.in_).count();
        (self.osds.len(), up, inn)
    }
}

#[cfg(test)]
mod ec_tests;
#[cfg(test)]
mod tests;
