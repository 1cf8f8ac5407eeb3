//! Why the primary of an EC PG could not fetch what a read or a write needs (a leaf, so the
//! shard messages that carry it need nothing else of `ec/`).

use cairn_map::PgId;

/// Why ranges could not be had.
#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    #[error("pg {pg}: only {have} of the {need} shards a degraded read needs answered{}", last.as_ref().map_or(String::new(), |e| format!(" ({e})")))]
    TooFew {
        pg: PgId,
        have: usize,
        need: usize,
        /// The last shard read that failed.
        last: Option<ShardReadError>,
    },
    #[error("pg {pg}: decoding shard {shard}: {error}")]
    Decode {
        pg: PgId,
        shard: u32,
        error: cairn_ec::EcError,
    },
}

/// Why a shard could not be read: the read goes on degraded, from other shards.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ShardReadError {
    #[error("osd.{osd} holding shard {shard} cannot be reached")]
    Unreachable { osd: u32, shard: u8 },
    #[error("osd.{osd} did not answer a read of shard {shard} within {timeout:?}")]
    TimedOut {
        osd: u32,
        shard: u8,
        timeout: std::time::Duration,
    },
    #[error("osd.{osd} refused a read of shard {shard}: {why}")]
    Refused { osd: u32, shard: u8, why: String },
}
