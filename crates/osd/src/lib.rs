//! cairn-osd: an object storage daemon.
//!
//! The flow of a client write (see `op/write.rs`):
//! connection reader (tokio) -> the shard thread that owns the PG (`shard.rs`) -> the primary
//! sends the write to every replica (`peers.rs`) and commits it to the local store (WAL,
//! run to completion) -> replicas commit and answer -> the last answer completes the write
//! (`inflight.rs`) and replies to the client from whichever thread delivered it. Replica
//! answers never wait behind client ops in a shard's queue.
//!
//! A PG belongs to exactly one shard thread, so its ops are ordered without a lock and never
//! wait behind another shard's PGs. The map arrives from the monitors (`mapwatch.rs`).

mod config;
mod daemon;
mod error;
mod inflight;
mod mapwatch;
mod op;
mod peers;
mod pgstate;
mod server;
mod shard;

pub use config::OsdConfig;
pub use daemon::run;
pub use error::OsdError;
