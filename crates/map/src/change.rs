//! Changes to the map: validated, deterministic, one epoch each.

use crate::pool::{valid_pool_name, MAX_PG_COUNT, MAX_SIZE};
use crate::{ClusterMap, Durability, OsdInfo, Pool, PoolSetting};
use serde::{Deserialize, Serialize};

/// A request to change the map. Monitors replicate these through Raft; applying one is
/// deterministic so every replica and subscriber computes the same map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapChange {
    /// An OSD starts: known by `store_id` (keeps its id) or new (gets the next id).
    OsdBoot {
        store_id: [u8; 16],
        addr: String,
        host: String,
        weight: u32,
    },
    /// An OSD stopped heartbeating. Ignored unless it is still in the life that began at
    /// epoch `up_from`, so a late report cannot mark a restarted OSD down.
    OsdDown {
        id: u32,
        up_from: u64,
    },
    /// Stop placing data on an OSD.
    OsdOut {
        id: u32,
    },
    /// Place data on an OSD again.
    OsdIn {
        id: u32,
    },
    /// Set an OSD's placement weight (16.16 fixed point).
    OsdWeight {
        id: u32,
        weight: u32,
    },
    PoolCreate {
        name: String,
        size: u8,
        min_size: u8,
        pg_count: u32,
        durability: Durability,
    },
    PoolRemove {
        name: String,
    },
    PoolSet {
        name: String,
        setting: PoolSetting,
    },
    /// An operator declares a down OSD's data gone for good (`cairn osd lost`): PGs stop
    /// waiting for it. Refused while it is up.
    OsdLost {
        id: u32,
    },
    /// Monitors only (refused from clients): drop the map history older than epoch `below`,
    /// which no PG needs any more. The map itself does not change.
    TrimHistory {
        below: u64,
    },
    /// An operator prepares an OSD (`cairn osd create`): its formatted store gets the next
    /// id, down and out, so that a key can be bound to that id before the OSD first boots.
    /// Its first boot marks it in. Already known: unchanged.
    OsdCreate {
        store_id: [u8; 16],
        host: String,
        weight: u32,
    },
}

/// What applying a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeOutcome {
    /// The map moved to a new epoch; `id` is the OSD or pool id the change created or named.
    Changed { epoch: u64, id: u32 },
    /// Nothing to do (already so); the epoch did not move.
    Unchanged,
}

/// Why a change was refused. The map is untouched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    #[error("no OSD {0}: `cairn osd ls` lists the OSDs")]
    NoSuchOsd(u32),
    #[error("no pool named {0:?}: `cairn pool ls` lists the pools")]
    NoSuchPool(String),
    #[error("pool {0:?} already exists")]
    PoolExists(String),
    #[error("invalid pool name {0:?}: use 1-128 characters of letters, digits, '.', '_' or '-'")]
    BadPoolName(String),
    #[error("invalid pool size {size} / min_size {min_size}: need 1 <= min_size <= size <= 10")]
    BadSize { size: u8, min_size: u8 },
    #[error("invalid pg count {0}: need 1..=65536")]
    BadPgCount(u32),
    #[error("invalid OSD weight {0:#x}: need 0 < weight <= 0x10000000")]
    BadWeight(u32),
    #[error("invalid OSD address {0:?}: need ip:port")]
    BadAddr(String),
    #[error("map update for epoch {got} does not follow epoch {have}: refetch the full map")]
    EpochGap { have: u64, got: u64 },
    #[error("osd.{osd} is marked down (or up in another life) in the map: it must boot again")]
    NotUp { osd: u32 },
    #[error("osd.{0} is up: only a down OSD can be declared lost (stop it first)")]
    OsdUp(u32),
    #[error("this change is made by the monitors themselves, never asked for by a client")]
    MonitorsOnly,
    #[error("osd.{osd} is reported unreachable by its peers: its heartbeats are not accepted until it is marked down")]
    Reported { osd: u32 },
    /// The sender may not ask for this change (its entity's caps or role).
    #[error("{0}")]
    Denied(String),
}

/// Largest OSD weight (4096.0).
const MAX_WEIGHT: u32 = 0x1000_0000;

fn check_weight(w: u32) -> Result<(), MapError> {
    if w == 0 || w > MAX_WEIGHT {
        return Err(MapError::BadWeight(w));
    }
    Ok(())
}

fn check_size(size: u8, min_size: u8) -> Result<(), MapError> {
    if size == 0 || size > MAX_SIZE || min_size == 0 || min_size > size {
        return Err(MapError::BadSize { size, min_size });
    }
    Ok(())
}

impl ClusterMap {
    /// Applies a change: validates it, and on success moves to the next epoch unless the
    /// change was already in effect. On error the map is unchanged.
    pub fn apply(&mut self, change: &MapChange) -> Result<ChangeOutcome, MapError> {
        let next = self.epoch + 1;
        let id = match change {
            MapChange::OsdBoot {
                store_id,
                addr,
                host,
                weight,
            } => self.osd_boot(*store_id, addr, host, *weight, next)?,
            MapChange::OsdDown { id, up_from } => {
                let o = self.osd_mut(*id)?;
                if !o.up || o.up_from != *up_from {
                    return Ok(ChangeOutcome::Unchanged);
                }
                o.up = false;
                *id
            }
            MapChange::OsdOut { id } => {
                let o = self.osd_mut(*id)?;
                if !o.in_ {
                    return Ok(ChangeOutcome::Unchanged);
                }
                o.in_ = false;
                *id
            }
            MapChange::OsdIn { id } => {
                let o = self.osd_mut(*id)?;
                if o.in_ {
                    return Ok(ChangeOutcome::Unchanged);
                }
                o.in_ = true;
                *id
            }
            MapChange::OsdWeight { id, weight } => {
                check_weight(*weight)?;
                let o = self.osd_mut(*id)?;
                if o.weight == *weight {
                    return Ok(ChangeOutcome::Unchanged);
                }
                o.weight = *weight;
                *id
            }
            MapChange::PoolCreate {
                name,
                size,
                min_size,
                pg_count,
                durability,
            } => self.pool_create(name, *size, *min_size, *pg_count, *durability)?,
            MapChange::PoolRemove { name } => {
                let id = self.pool_id(name)?;
                self.pools.remove(&id);
                id
            }
            MapChange::OsdCreate {
                store_id,
                host,
                weight,
            } => {
                check_weight(*weight)?;
                if self.osds.values().any(|o| o.store_id == *store_id) {
                    return Ok(ChangeOutcome::Unchanged);
                }
                // Out until its first boot: no PG waits for an OSD that never ran.
                self.new_osd(*store_id, host, *weight, false)
            }
            MapChange::OsdLost { id } => {
                let o = self.osd_mut(*id)?;
                if o.up {
                    return Err(MapError::OsdUp(*id));
                }
                // Declared again later: the newer declaration covers more history.
                o.lost_at = next;
                *id
            }
            MapChange::TrimHistory { .. } => return Ok(ChangeOutcome::Unchanged),
            MapChange::PoolSet { name, setting } => {
                let id = self.pool_id(name)?;
                match self.pool_set(id, setting)? {
                    true => id,
                    false => return Ok(ChangeOutcome::Unchanged),
                }
            }
        };
        self.epoch = next;
        Ok(ChangeOutcome::Changed { epoch: next, id })
    }

    fn osd_mut(&mut self, id: u32) -> Result<&mut OsdInfo, MapError> {
        self.osds.get_mut(&id).ok_or(MapError::NoSuchOsd(id))
    }

    fn pool_id(&self, name: &str) -> Result<u32, MapError> {
        self.pool_by_name(name)
            .map(|p| p.id)
            .ok_or_else(|| MapError::NoSuchPool(name.to_string()))
    }

    /// A new OSD, down, with the next id.
    fn new_osd(&mut self, store_id: [u8; 16], host: &str, weight: u32, in_: bool) -> u32 {
        let id = self.next_osd_id;
        self.next_osd_id += 1;
        self.osds.insert(
            id,
            OsdInfo {
                id,
                addr: String::new(),
                host: host.to_string(),
                up: false,
                in_,
                weight,
                up_from: 0,
                store_id,
                lost_at: 0,
            },
        );
        id
    }

    fn osd_boot(
        &mut self,
        store_id: [u8; 16],
        addr: &str,
        host: &str,
        weight: u32,
        epoch: u64,
    ) -> Result<u32, MapError> {
        check_weight(weight)?;
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(MapError::BadAddr(addr.to_string()));
        }
        let known = self.osds.values().find(|o| o.store_id == store_id);
        let id = match known {
            Some(o) => o.id,
            None => self.new_osd(store_id, host, weight, true),
        };
        let o = self.osd_mut(id)?;
        if o.up_from == 0 {
            // First boot (of a new OSD, or of one prepared by `OsdCreate`): it takes data.
            o.in_ = true;
        }
        o.addr = addr.to_string();
        o.host = host.to_string();
        o.up = true;
        o.up_from = epoch;
        Ok(id)
    }

    fn pool_create(
        &mut self,
        name: &str,
        size: u8,
        min_size: u8,
        pg_count: u32,
        durability: Durability,
    ) -> Result<u32, MapError> {
        if !valid_pool_name(name) {
            return Err(MapError::BadPoolName(name.to_string()));
        }
        if self.pool_by_name(name).is_some() {
            return Err(MapError::PoolExists(name.to_string()));
        }
        check_size(size, min_size)?;
        if pg_count == 0 || pg_count > MAX_PG_COUNT {
            return Err(MapError::BadPgCount(pg_count));
        }
        let id = self.next_pool_id;
        self.next_pool_id += 1;
        self.pools.insert(
            id,
            Pool {
                id,
                name: name.to_string(),
                size,
                min_size,
                pg_count,
                durability,
            },
        );
        Ok(id)
    }

    /// Returns whether the pool changed.
    fn pool_set(&mut self, id: u32, setting: &PoolSetting) -> Result<bool, MapError> {
        let Some(p) = self.pools.get_mut(&id) else {
            return Ok(false);
        };
        let before = p.clone();
        match *setting {
            PoolSetting::Size(s) => {
                check_size(s, p.min_size.min(s))?;
                p.size = s;
                p.min_size = p.min_size.min(s);
            }
            PoolSetting::MinSize(m) => {
                check_size(p.size, m)?;
                p.min_size = m;
            }
            PoolSetting::Durability(d) => p.durability = d,
        }
        Ok(*p != before)
    }
}
