//! cairn-osd: an object storage daemon.
//!
//! The flow of a client write (see `op/write.rs`):
//! the connection's reader on its shard's event loop (`server.rs`) -> the shard that owns the
//! PG (`shard/`; inline when it is the same shard, else queued to it) -> the primary assigns
//! the PG version, sends the write to every replica (`peers.rs`) and submits it to the local
//! store -> at the end of the run of requests already received, one WAL flush makes the shard's
//! writes durable -> replicas do the same and answer -> the last answer completes the write
//! (`inflight.rs`) and replies to the client on whichever thread read it. Replica answers are
//! never queued behind client ops.
//!
//! A PG belongs to exactly one shard (a thread with its own event loop), so its ops are ordered
//! without a lock shared between PGs and never wait behind another shard's PGs. The map
//! arrives from the monitors (`mapwatch.rs`).

mod access;
mod auth;
mod backlog;
mod config;
mod context;
mod crashes;
mod daemon;
mod ec;
mod error;
pub mod failure;
mod fullness;
#[cfg(test)]
mod golden;
mod inflight;
mod lease;
mod mailbox;
mod mapwatch;
mod metrics;
mod op;
mod optotals;
mod peer_heartbeat;
mod peering;
mod peers;
pub mod pglog;
mod pgstate;
mod readers;
mod reclaim;
mod recovery;
mod scrub;
mod server;
mod shard;
mod slices;
mod slowops;
mod split;
mod syncer;
#[cfg(test)]
mod test_store;
mod wal_pace;

pub use auth::OsdKey;
pub use config::{
    default_memory_target, default_wal_size, machine_memory, pending_share, OsdConfig,
    DEFAULT_DIRECT_WRITE_MIN, MIN_MEMORY_TARGET,
};
pub use daemon::{open_store, run};
pub use error::OsdError;
pub use readers::DEFAULT_READ_THREADS;
