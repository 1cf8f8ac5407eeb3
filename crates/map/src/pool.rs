//! Pools: replication size, min_size, PG count and durability mode.

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
    /// PGs in the pool (fixed at creation).
    pub pg_count: u32,
    pub durability: Durability,
}

/// A pool property `cairn pool set` changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolSetting {
    Size(u8),
    MinSize(u8),
    Durability(Durability),
}

/// Largest replica count.
pub const MAX_SIZE: u8 = 10;
/// Largest PG count of a pool.
pub const MAX_PG_COUNT: u32 = 1 << 16;
/// Longest pool name.
pub const MAX_POOL_NAME: usize = 128;

/// Checks a pool name: 1..=128 characters of `[A-Za-z0-9._-]`.
pub fn valid_pool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_POOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}
