//! The map as the client uses it: one value per epoch with the placement hierarchy computed
//! once and PG placements cached, so routing an op costs a hash and a lookup.

use cairn_failstop::LockOrDie;
use cairn_map::{ClusterMap, PgId, PgPlacement};
use cairn_placement::Placer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A map epoch ready for routing.
pub struct MapView {
    pub map: Arc<ClusterMap>,
    placer: Placer,
    placements: Mutex<HashMap<PgId, PgPlacement>>,
}

/// Where to send an op.
pub struct Route {
    pub pg: PgId,
    /// The primary's id and address, when the PG has an up member.
    pub primary: Option<(u32, String)>,
}

impl MapView {
    /// Prepares `map` for routing.
    pub fn new(map: Arc<ClusterMap>) -> MapView {
        MapView {
            placer: map.placer(),
            map,
            placements: Mutex::new(HashMap::new()),
        }
    }

    /// Where `pg` lives.
    pub fn placement(&self, pg: PgId) -> PgPlacement {
        let mut cache = self.placements.lock_or_die();
        cache
            .entry(pg)
            .or_insert_with(|| self.map.pg_placement_in(&self.placer, pg))
            .clone()
    }

    /// The route of an object op; `None` when the pool does not exist.
    pub fn route_object(&self, pool: u32, name: &[u8]) -> Option<Route> {
        let pg = self.map.object_pg(pool, name)?;
        Some(self.route_pg(pg))
    }

    /// The route of a PG op.
    pub fn route_pg(&self, pg: PgId) -> Route {
        let primary = self
            .placement(pg)
            .primary()
            .and_then(|id| self.map.osds.get(&id).map(|o| (id, o.addr.clone())));
        Route { pg, primary }
    }
}
