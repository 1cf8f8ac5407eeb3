//! The openraft type configuration of the monitor cluster.
//!
//! A Raft log entry carries one [`MapChange`]; applying it yields what
//! [`cairn_map::ClusterMap::apply`] returned. Nodes are addressed by a [`BasicNode`] whose
//! `addr` is the monitor's `ip:port`, the one port that serves both clients and peers.

use cairn_map::{ChangeOutcome, MapChange, MapError};
// The macro names `Cursor` unqualified for its default snapshot type.
use std::io::Cursor;

pub use openraft::BasicNode;

/// Identifies a monitor (its `--id`).
pub type NodeId = u64;

/// What applying one log entry returns to the proposer.
pub type ApplyResult = Result<ChangeOutcome, MapError>;

openraft::declare_raft_types!(
    /// Type configuration of the monitors' Raft group.
    pub MonRaft:
        D = MapChange,
        R = ApplyResult,
        NodeId = NodeId,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// A log id of our Raft group.
pub type LogId = openraft::LogId<NodeId>;
/// The membership as stored with the state machine.
pub type StoredMembership = openraft::StoredMembership<NodeId, BasicNode>;
/// A log entry.
pub type Entry = openraft::Entry<MonRaft>;
/// A running Raft node.
pub type Raft = openraft::Raft<MonRaft>;
/// Storage errors as openraft wants them.
pub type StorageError = openraft::StorageError<NodeId>;
