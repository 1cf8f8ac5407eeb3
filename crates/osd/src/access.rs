//! Who may ask what of this OSD. Every connection's peer was authenticated in its handshake
//! (a ticket: its entity and caps) or, in a cluster without authentication, was not (and may
//! do anything). The checks:
//!
//! | Request | Allowed to |
//! |---|---|
//! | `OP`, `OP_BATCH` | clients with `r` (reads, stat, list) or `w` (writes, removes) on the pool |
//! | `SCRUB_PG` | OSDs; clients with `x` on the pool |
//! | `PG_STATUS` | OSDs; clients with `r` on the pool |
//! | `PG_MARK_LOST` | OSDs; clients with `w` on the pool (it gives up objects, as a remove would) |
//! | `OSD_STATS` | OSDs; clients with `mon r` |
//! | `OSD_SYNC`, `OSD_PING` | anyone authenticated |
//! | `REP`, `PG_QUERY`, `PG_PUSH`, `PG_PULL`, `PG_LIST`, `PG_SCRUB`, `PG_CLEAN` | OSDs only (which OSD, the PG's handler checks against the map) |

use crate::context::Osd;
use cairn_auth::{EntityKind, Perms};
use cairn_proto::msg::osd::OpKind;
use cairn_transport::Peer;
use std::collections::HashMap;

/// A connection's peer and what it may do, with its per-pool permissions worked out once.
pub(crate) struct Access {
    peer: Peer,
    /// Whether it is unchecked (no authentication) or an OSD.
    trusted: bool,
    pools: HashMap<u32, Perms>,
}

fn denied(peer: &Peer, what: &str) -> String {
    format!("permission denied: {} {what}", peer.name())
}

impl Access {
    pub fn new(peer: Peer) -> Access {
        let trusted = peer
            .entity
            .as_ref()
            .is_none_or(|e| e.kind() == EntityKind::Osd);
        Access {
            peer,
            trusted,
            pools: HashMap::new(),
        }
    }

    /// The peer as logs and refusals name it.
    pub fn name(&self) -> String {
        self.peer.name()
    }

    /// A message that speaks for OSD `osd` (a primary's): only from that OSD (anyone,
    /// without authentication).
    pub fn speaks_for(&self, osd: u32, what: &str) -> Result<(), String> {
        match &self.peer.entity {
            None => Ok(()),
            Some(e) if e.osd_id() == Some(osd) => Ok(()),
            Some(_) => Err(denied(
                &self.peer,
                &format!("sent a {what} in the name of osd.{osd}"),
            )),
        }
    }

    /// Daemon messages: only OSDs (or anyone, without authentication).
    pub fn osd_only(&self, what: &str) -> Result<(), String> {
        if self.trusted {
            return Ok(());
        }
        Err(denied(
            &self.peer,
            &format!("is not an OSD: {what} comes only from OSDs"),
        ))
    }

    /// Requests about the cluster (stats): OSDs, and clients that may read the monitors.
    pub fn cluster_read(&self) -> Result<(), String> {
        if self.trusted || self.peer.caps.mon_perms().covers(Perms::R) {
            return Ok(());
        }
        Err(denied(&self.peer, "lacks r on the monitors"))
    }

    /// `need` on pool `pool` (OSDs may do anything the map lets them).
    pub fn pool(&mut self, osd: &Osd, pool: u32, need: Perms) -> Result<(), String> {
        if self.trusted {
            return Ok(());
        }
        let perms = match self.pools.get(&pool) {
            Some(p) => *p,
            None => {
                // A pool id is never reused, so its name (and what the caps grant on it)
                // stays the same for the connection's life.
                let Some(name) = osd.map().pools.get(&pool).map(|p| p.name.clone()) else {
                    // Unknown pools are answered as such by the op's handler.
                    return Ok(());
                };
                let p = self.peer.caps.pool_perms(&name);
                self.pools.insert(pool, p);
                p
            }
        };
        if perms.covers(need) {
            return Ok(());
        }
        let name = osd
            .map()
            .pools
            .get(&pool)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| pool.to_string());
        Err(denied(&self.peer, &format!("lacks {need} on pool {name}")))
    }
}

/// What an op needs on its pool.
pub(crate) fn op_needs(kind: &OpKind) -> Perms {
    if kind.is_write() {
        Perms::W
    } else {
        Perms::R
    }
}
