//! Changes to the map: validated, deterministic, one epoch each.

use crate::pool::{valid_label, valid_pool_name, MAX_PG_COUNT, MAX_SIZE};
use crate::{
    ClusterMap, Domain, Durability, EcProfile, HostLocation, OsdInfo, PlacementRule, Pool,
    PoolSetting,
};
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
    /// A pool with placement version 1 (`PlacementRule::FlatV1`). Kept so that log entries
    /// written before map format 4 replay as they did; clients send `PoolCreateRule`.
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
    /// A pool with placement version 2 and failure domain `domain`; `None` picks `Host`
    /// when the in OSDs span at least `size` hosts, else `Osd`. A domain with fewer members
    /// than `size` is accepted (its PGs stay undersized): `cairn pool create` refuses it
    /// unless forced, and status warns.
    PoolCreateRule {
        name: String,
        size: u8,
        min_size: u8,
        pg_count: u32,
        durability: Durability,
        domain: Option<Domain>,
    },
    /// Sets a host's rack and zone labels ("" = none). Moves the data of pools whose
    /// domain is rack or zone.
    HostLocation {
        host: String,
        rack: String,
        zone: String,
    },
    /// Fences a client instance (one open of a volume, one process: the `instance` it sends
    /// with every op) until `until` (Unix seconds): every OSD refuses its ops once its map
    /// holds the entry. What a new writer of a volume does to the previous one before taking
    /// it over. `pool` names the pool whose data the fence protects (the caps check: `w` on
    /// it); the fence itself covers every pool. The monitors set `until` (a client's value
    /// is replaced by the monitors' clock plus the blocklist duration).
    BlocklistAdd {
        instance: u64,
        pool: String,
        until: u64,
    },
    /// Lifts a fence early (`cairn osd blocklist rm`).
    BlocklistRemove {
        instance: u64,
    },
    /// Monitors only (refused from clients): drops the fences that ended at or before `now`
    /// (Unix seconds).
    BlocklistExpire {
        now: u64,
    },
    /// An erasure-coded pool (`PlacementRule::Erasure`): `k + m` shards per PG, no two in
    /// one `domain` (`None`: as for `PoolCreateRule`, with `k + m` as the size); a write needs
    /// `min_size` shards, `k <= min_size <= k + m`. The profile is fixed for the pool's life.
    PoolCreateEc {
        name: String,
        profile: EcProfile,
        min_size: u8,
        pg_count: u32,
        durability: Durability,
        domain: Option<Domain>,
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
    #[error(
        "invalid location label {0:?}: use up to 64 characters of letters, digits, '.', '_' or '-'"
    )]
    BadLabel(String),
    #[error("no OSD is on host {0:?}: `cairn osd tree` lists the hosts")]
    NoSuchHost(String),
    #[error("pool {pool:?} has {have} PGs: a PG count only grows (PGs split, never merge)")]
    PgCountDown { pool: String, have: u32 },
    #[error("client instance 0 cannot be blocklisted (no client uses it)")]
    BadInstance,
    #[error("the blocklist holds {} fences, the most the map keeps: wait for some to expire or remove them (`cairn osd blocklist rm`)", crate::MAX_BLOCKLIST)]
    BlocklistFull,
    #[error("invalid erasure-code profile: {0}")]
    BadEcProfile(String),
    #[error("invalid min_size {min_size} for an erasure-coded pool of {k}+{m}: need {k} <= min_size <= {}", u16::from(*k) + u16::from(*m))]
    BadEcMinSize { k: u8, m: u8, min_size: u8 },
    #[error("pool {pool:?} is erasure-coded: its {what} is fixed by its profile (create another pool and copy the data)")]
    EcFixed { pool: String, what: String },
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
            MapChange::PoolCreate { .. } | MapChange::PoolCreateRule { .. } => {
                match self.creation(change) {
                    Some((spec, rule)) => self.pool_create(spec, rule)?,
                    None => return Ok(ChangeOutcome::Unchanged),
                }
            }
            MapChange::PoolCreateEc {
                name,
                profile,
                min_size,
                pg_count,
                durability,
                domain,
            } => {
                let spec = PoolSpec {
                    name,
                    size: profile.shards(),
                    min_size: *min_size,
                    pg_count: *pg_count,
                    durability: *durability,
                };
                self.pool_create_ec(spec, *profile, *domain)?
            }
            MapChange::HostLocation { host, rack, zone } => {
                if !self.host_location_change(host, rack, zone)? {
                    return Ok(ChangeOutcome::Unchanged);
                }
                0
            }
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
            MapChange::BlocklistAdd {
                instance,
                pool,
                until,
            } => {
                self.pool_id(pool)?;
                if *instance == 0 {
                    return Err(MapError::BadInstance);
                }
                if self.blocklist.get(instance) == Some(until) {
                    return Ok(ChangeOutcome::Unchanged);
                }
                if !self.blocklist.contains_key(instance)
                    && self.blocklist.len() >= crate::MAX_BLOCKLIST
                {
                    return Err(MapError::BlocklistFull);
                }
                self.blocklist.insert(*instance, *until);
                0
            }
            MapChange::BlocklistRemove { instance } => {
                if self.blocklist.remove(instance).is_none() {
                    return Ok(ChangeOutcome::Unchanged);
                }
                0
            }
            MapChange::BlocklistExpire { now } => {
                let before = self.blocklist.len();
                self.blocklist.retain(|_, until| *until > *now);
                if self.blocklist.len() == before {
                    return Ok(ChangeOutcome::Unchanged);
                }
                0
            }
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

    fn pool_create(&mut self, spec: PoolSpec, rule: PlacementRule) -> Result<u32, MapError> {
        self.check_new_name(spec.name)?;
        check_size(spec.size, spec.min_size)?;
        self.insert_pool(spec, rule)
    }

    /// Refuses a pool name that is not valid or already taken.
    fn check_new_name(&self, name: &str) -> Result<(), MapError> {
        if !valid_pool_name(name) {
            return Err(MapError::BadPoolName(name.to_string()));
        }
        if self.pool_by_name(name).is_some() {
            return Err(MapError::PoolExists(name.to_string()));
        }
        Ok(())
    }

    /// Adds a pool whose name and sizes were checked, with the next id.
    fn insert_pool(&mut self, spec: PoolSpec, rule: PlacementRule) -> Result<u32, MapError> {
        if spec.pg_count == 0 || spec.pg_count > MAX_PG_COUNT {
            return Err(MapError::BadPgCount(spec.pg_count));
        }
        let pool = Pool {
            id: self.next_pool_id,
            name: spec.name.to_string(),
            size: spec.size,
            min_size: spec.min_size,
            pg_count: spec.pg_count,
            durability: spec.durability,
            rule,
        };
        self.next_pool_id += 1;
        self.pools.insert(pool.id, pool.clone());
        Ok(pool.id)
    }

    /// Checks an EC pool's profile and min_size, then creates it as [`Self::pool_create`].
    fn pool_create_ec(
        &mut self,
        spec: PoolSpec,
        profile: EcProfile,
        domain: Option<Domain>,
    ) -> Result<u32, MapError> {
        profile
            .check()
            .map_err(|e| MapError::BadEcProfile(e.to_string()))?;
        check_ec_min_size(profile, spec.min_size)?;
        let domain = domain.unwrap_or_else(|| self.default_domain(spec.size));
        let rule = PlacementRule::Erasure { domain, profile };
        self.check_new_name(spec.name)?;
        self.insert_pool(spec, rule)
    }

    /// The pool a creation asks for and its placement rule (version 1 for `PoolCreate`).
    fn creation<'a>(&self, change: &'a MapChange) -> Option<(PoolSpec<'a>, PlacementRule)> {
        let (name, size, min_size, pg_count, durability, domain) = match change {
            MapChange::PoolCreate {
                name,
                size,
                min_size,
                pg_count,
                durability,
            } => (name, size, min_size, pg_count, durability, None),
            MapChange::PoolCreateRule {
                name,
                size,
                min_size,
                pg_count,
                durability,
                domain,
            } => (name, size, min_size, pg_count, durability, Some(domain)),
            _ => return None,
        };
        let rule = match domain {
            None => PlacementRule::FlatV1,
            Some(d) => PlacementRule::Tree {
                domain: d.unwrap_or_else(|| self.default_domain(*size)),
            },
        };
        let spec = PoolSpec {
            name,
            size: *size,
            min_size: *min_size,
            pg_count: *pg_count,
            durability: *durability,
        };
        Some((spec, rule))
    }

    /// The domain a version-2 pool gets when none is named: host when the in OSDs span at
    /// least `size` hosts, else osd (a small or single-host cluster still keeps `size`
    /// copies, on distinct OSDs).
    pub fn default_domain(&self, size: u8) -> Domain {
        let hosts = self.placer().domain_count(Domain::Host.placement());
        if hosts >= usize::from(size) {
            Domain::Host
        } else {
            Domain::Osd
        }
    }

    /// Returns whether the labels changed.
    fn host_location_change(
        &mut self,
        host: &str,
        rack: &str,
        zone: &str,
    ) -> Result<bool, MapError> {
        for label in [rack, zone] {
            if !valid_label(label) {
                return Err(MapError::BadLabel(label.to_string()));
            }
        }
        if !self.osds.values().any(|o| o.host == host) {
            return Err(MapError::NoSuchHost(host.to_string()));
        }
        let at = HostLocation {
            rack: rack.to_string(),
            zone: zone.to_string(),
        };
        if self.host_location(host) == at {
            return Ok(false);
        }
        if at == HostLocation::default() {
            self.hosts.remove(host);
        } else {
            self.hosts.insert(host.to_string(), at);
        }
        Ok(true)
    }

    /// Returns whether the pool changed.
    fn pool_set(&mut self, id: u32, setting: &PoolSetting) -> Result<bool, MapError> {
        let Some(before) = self.pools.get(&id) else {
            return Ok(false);
        };
        let mut p = before.clone();
        if let Some(profile) = p.ec() {
            return self.ec_pool_set(p, profile, setting);
        }
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
            PoolSetting::Domain(domain) => p.rule = PlacementRule::Tree { domain },
            PoolSetting::PgCount(n) => {
                if n == 0 || n > MAX_PG_COUNT {
                    return Err(MapError::BadPgCount(n));
                }
                if n < p.pg_count {
                    return Err(MapError::PgCountDown {
                        pool: p.name.clone(),
                        have: p.pg_count,
                    });
                }
                p.pg_count = n;
            }
        }
        if p == *before {
            return Ok(false);
        }
        self.pools.insert(id, p);
        Ok(true)
    }
}

impl ClusterMap {
    /// [`Self::pool_set`] for an EC pool: its size is its profile's, its min_size stays in
    /// `k..=k+m`, a new domain keeps the profile. Returns whether the pool changed.
    fn ec_pool_set(
        &mut self,
        mut p: Pool,
        profile: EcProfile,
        setting: &PoolSetting,
    ) -> Result<bool, MapError> {
        match *setting {
            PoolSetting::Size(_) => {
                return Err(MapError::EcFixed {
                    pool: p.name.clone(),
                    what: "size (k + m)".to_string(),
                })
            }
            PoolSetting::MinSize(m) => {
                check_ec_min_size(profile, m)?;
                p.min_size = m;
            }
            PoolSetting::Durability(d) => p.durability = d,
            PoolSetting::Domain(domain) => p.rule = PlacementRule::Erasure { domain, profile },
            PoolSetting::PgCount(_) => {
                return Err(MapError::EcFixed {
                    pool: p.name.clone(),
                    what: "PG count (EC PGs do not split yet)".to_string(),
                })
            }
        }
        if self.pools.get(&p.id) == Some(&p) {
            return Ok(false);
        }
        self.pools.insert(p.id, p);
        Ok(true)
    }
}

fn check_ec_min_size(profile: EcProfile, min_size: u8) -> Result<(), MapError> {
    if min_size < profile.k || min_size > profile.shards() {
        return Err(MapError::BadEcMinSize {
            k: profile.k,
            m: profile.m,
            min_size,
        });
    }
    Ok(())
}

/// The properties every pool creation names.
struct PoolSpec<'a> {
    name: &'a str,
    size: u8,
    min_size: u8,
    pg_count: u32,
    durability: Durability,
}
