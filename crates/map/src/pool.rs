//! Pools: replication size (or erasure-code profile), min_size, PG count and durability mode.

use serde::{Deserialize, Serialize};

/// When a replica counts a write as held (TECHNIQUES section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Durability {
    /// Durable in every member's write-ahead log before the ack (default).
    Wal,
    /// In every member's memory before the ack: lower latency, an acknowledged write can be
    /// lost if every member loses power at once. Explicit opt-in, shown by `cairn status`.
    Memory,
}

impl Durability {
    /// Name used by the CLI and in status output.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Wal => "wal",
            Durability::Memory => "memory",
        }
    }

    /// Parses a CLI name.
    pub fn parse(s: &str) -> Option<Durability> {
        match s {
            "wal" => Some(Durability::Wal),
            "memory" => Some(Durability::Memory),
            _ => None,
        }
    }
}

/// A pool of objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    pub id: u32,
    pub name: String,
    /// Replicas per object.
    pub size: u8,
    /// Fewest members that must hold a write before it is acknowledged.
    pub min_size: u8,
    /// PGs in the pool: grows (`PoolSetting::PgCount`, PGs split), never shrinks.
    pub pg_count: u32,
    pub durability: Durability,
    /// How placement spreads the pool's copies.
    pub rule: PlacementRule,
}

/// A failure domain: no two copies of a PG in one (`cairn_placement::FailureDomain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Domain {
    Osd,
    Host,
    Rack,
    Zone,
}

impl Domain {
    /// The placement crate's domain.
    pub fn placement(self) -> cairn_placement::FailureDomain {
        use cairn_placement::FailureDomain as F;
        match self {
            Domain::Osd => F::Osd,
            Domain::Host => F::Host,
            Domain::Rack => F::Rack,
            Domain::Zone => F::Zone,
        }
    }

    /// Name used by the CLI and in status output: osd, host, rack, zone.
    pub fn name(self) -> &'static str {
        self.placement().name()
    }

    /// Parses [`Domain::name`].
    pub fn parse(s: &str) -> Option<Domain> {
        [Domain::Osd, Domain::Host, Domain::Rack, Domain::Zone]
            .into_iter()
            .find(|d| d.name() == s)
    }
}

/// Which placement algorithm and failure domain a pool uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlacementRule {
    /// Placement version 1, the pools made before map format 4: one flat draw over every
    /// OSD; copies on distinct hosts when the map has at least two hosts with in OSDs, else
    /// on distinct OSDs. `cairn pool set NAME domain D` moves a pool to version 2.
    FlatV1,
    /// Placement version 2: the hierarchical draw, no two copies in one `domain`.
    Tree { domain: Domain },
    /// An erasure-coded pool: the draw of version 2 for `k + m` ranks, no two in one
    /// `domain`; the OSD of rank `i` holds shard `i` (`ClusterMap::pg_shards`). Appended to
    /// the enum, so maps without EC pools encode as before (docs/format/ec.md).
    Erasure { domain: Domain, profile: EcProfile },
}

/// An EC pool's erasure-code profile as the map holds it: `k` data and `m` parity chunks
/// per stripe, chunks of `stripe_unit` bytes. Checked with [`cairn_ec::Profile`] when the
/// pool is created; fixed for the pool's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcProfile {
    pub k: u8,
    pub m: u8,
    pub stripe_unit: u32,
}

impl EcProfile {
    /// The codec's profile, or why these numbers are not one.
    pub fn check(self) -> Result<cairn_ec::Profile, cairn_ec::ProfileError> {
        cairn_ec::Profile::new(self.k.into(), self.m.into(), self.stripe_unit)
    }

    /// Shards per PG: k + m.
    pub fn shards(self) -> u8 {
        self.k.saturating_add(self.m)
    }

    /// "4+2, unit 16 KiB", for status and `pool ls`.
    pub fn describe(self) -> String {
        let unit = self.stripe_unit;
        let unit = if unit.is_multiple_of(1 << 20) {
            format!("{} MiB", unit >> 20)
        } else {
            format!("{} KiB", unit >> 10)
        };
        format!("{}+{}, unit {unit}", self.k, self.m)
    }
}

impl PlacementRule {
    /// For status and `pool ls`: "host", or "auto (v1)" for version 1.
    pub fn describe(self) -> String {
        self.domain()
            .map_or("auto (placement v1)", Domain::name)
            .to_string()
    }

    /// The failure domain of placement version 2 (`None` for version 1).
    pub fn domain(self) -> Option<Domain> {
        match self {
            PlacementRule::FlatV1 => None,
            PlacementRule::Tree { domain } | PlacementRule::Erasure { domain, .. } => Some(domain),
        }
    }
}

impl Pool {
    /// The erasure-code profile of an EC pool; `None` for a replicated pool.
    pub fn ec(&self) -> Option<EcProfile> {
        match self.rule {
            PlacementRule::Erasure { profile, .. } => Some(profile),
            _ => None,
        }
    }

    /// Raw bytes stored per byte of data: the size for a replicated pool, `(k + m) / k` for
    /// an EC pool (whole stripes).
    pub fn raw_per_byte(&self) -> f64 {
        match self.ec() {
            Some(p) => f64::from(p.shards()) / f64::from(p.k.max(1)),
            None => f64::from(self.size),
        }
    }

    /// "erasure" or "replicated", the `type` of JSON listings.
    pub fn type_name(&self) -> &'static str {
        if self.ec().is_some() {
            "erasure"
        } else {
            "replicated"
        }
    }

    /// "replicated" or "ec 4+2, unit 16 KiB".
    pub fn kind(&self) -> String {
        match self.ec() {
            Some(p) => format!("ec {}", p.describe()),
            None => "replicated".to_string(),
        }
    }
}

/// A pool property `cairn pool set` changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolSetting {
    Size(u8),
    MinSize(u8),
    Durability(Durability),
    /// Keep copies apart by this domain (placement version 2; moves data). An EC pool keeps
    /// its profile.
    Domain(Domain),
    /// More PGs: every PG splits into the PGs its objects now hash to (each child's objects
    /// are on its parent's OSDs until the child moves like any rebalance). Never fewer.
    PgCount(u32),
}

/// Largest replica count.
pub const MAX_SIZE: u8 = 10;
/// Largest PG count of a pool.
pub const MAX_PG_COUNT: u32 = 1 << 16;
/// Longest pool name.
pub const MAX_POOL_NAME: usize = 128;
/// Longest rack or zone label.
pub const MAX_LABEL: usize = 64;

/// Checks a rack or zone label: empty (none), or up to 64 characters of `[A-Za-z0-9._-]`.
pub fn valid_label(label: &str) -> bool {
    label.len() <= MAX_LABEL
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Checks a pool name: 1..=128 characters of `[A-Za-z0-9._-]`.
pub fn valid_pool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_POOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}
