//! cairn-mon: the Cairn monitor.
//!
//! Monitors hold the cluster map. They replicate it with Raft (openraft) across 1, 3 or 5
//! monitors and persist it in redb (`<dir>/mon.redb`); every Raft log entry is one
//! [`cairn_map::MapChange`], and the replicated state machine is the map built by applying
//! them in order; the same log carries the key database's changes (`cairn auth`), kept
//! beside the map but never sent with it. The leader takes commands and OSD heartbeats and marks OSDs down when their
//! heartbeats stop; every monitor serves the map and pushes new epochs to subscribers. Clients
//! use `cairn-monclient`; the wire protocol is `cairn_proto::msg::mon`, and monitors talk to
//! each other on the same port with the message types of [`raft_net`].
//!
//! Operator documentation: `docs/operator/mon.md`.

#![warn(missing_docs)]

pub mod auth;
mod config;
mod ctx;
mod error;
mod failure;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
mod golden;
mod history;
mod keys_cmd;
mod log_store;
mod members_cmd;
mod metrics;
mod migrate;
mod migrate_v4;
mod migrate_v5;
mod migrate_v6;
mod node;
mod pg_starts;
pub mod raft_net;
mod server;
mod state_machine;
mod store;
mod types;

pub use config::{
    fsid_hex, parse_fsid, MonConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_ELECTION_TIMEOUT_MS,
    DEFAULT_HISTORY_KEEP, DEFAULT_OSD_GRACE,
};
pub use error::MonError;
pub use node::run;
pub use server::KEEPALIVE;
pub use state_machine::HISTORY;
pub use store::{stored_identity, StoredIdentity, DB_FILE, FORMAT};
pub use types::NodeId;

#[cfg(test)]
mod storage_suite;
