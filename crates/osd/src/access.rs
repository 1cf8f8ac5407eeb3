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
use crate::failure::FailClass;
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

/// Why a peer may not make a request of this OSD: the refusal it is sent (`ERROR` `Denied`,
/// or `OpReply::Denied` for an op). Always of the class [`FailClass::Permission`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Denied {
    /// A message that speaks for OSD `osd` from another peer.
    #[error("permission denied: {peer} sent a {what} in the name of osd.{osd}")]
    InNameOf {
        peer: String,
        what: &'static str,
        osd: u32,
    },
    /// A daemon message from a client.
    #[error("permission denied: {peer} is not an OSD: {what} comes only from OSDs")]
    NotOsd { peer: String, what: &'static str },
    /// Cluster stats need `mon r`.
    #[error("permission denied: {peer} lacks r on the monitors")]
    NoMonRead { peer: String },
    /// The peer's caps do not grant `need` on the pool.
    #[error("permission denied: {peer} lacks {need} on pool {pool}")]
    NoPoolPerms {
        peer: String,
        need: Perms,
        /// The pool's name (its id when the map has no such pool).
        pool: String,
    },
}

impl Denied {
    /// Its class: permission (the same peer is refused again until its caps change).
    pub(crate) fn class(&self) -> FailClass {
        FailClass::Permission
    }
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
    pub fn speaks_for(&self, osd: u32, what: &'static str) -> Result<(), Denied> {
        match &self.peer.entity {
            None => Ok(()),
            Some(e) if e.osd_id() == Some(osd) => Ok(()),
            Some(_) => Err(Denied::InNameOf {
                peer: self.peer.name(),
                what,
                osd,
            }),
        }
    }

    /// Daemon messages: only OSDs (or anyone, without authentication).
    pub fn osd_only(&self, what: &'static str) -> Result<(), Denied> {
        if self.trusted {
            return Ok(());
        }
        Err(Denied::NotOsd {
            peer: self.peer.name(),
            what,
        })
    }

    /// Requests about the cluster (stats): OSDs, and clients that may read the monitors.
    pub fn cluster_read(&self) -> Result<(), Denied> {
        if self.trusted || self.peer.caps.mon_perms().covers(Perms::R) {
            return Ok(());
        }
        Err(Denied::NoMonRead {
            peer: self.peer.name(),
        })
    }

    /// `need` on pool `pool` (OSDs may do anything the map lets them).
    pub fn pool(&mut self, osd: &Osd, pool: u32, need: Perms) -> Result<(), Denied> {
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
        Err(Denied::NoPoolPerms {
            peer: self.peer.name(),
            need,
            pool: name,
        })
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
