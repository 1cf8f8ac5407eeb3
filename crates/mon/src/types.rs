//! The openraft type configuration of the monitor cluster.
//!
//! A Raft log entry carries one [`Proposal`]: a [`MapChange`] (applying it yields what
//! [`cairn_map::ClusterMap::apply`] returned) or a [`KeyChange`] to the key database. Nodes are addressed by a [`BasicNode`] whose
//! `addr` is the monitor's `ip:port`, the one port that serves both clients and peers.

use cairn_auth::{KeyChange, KeyDbError};
use cairn_map::{ChangeOutcome, MapChange, MapError};
use serde::{Deserialize, Serialize};
// The macro names `Cursor` unqualified for its default snapshot type.
use std::io::Cursor;

pub use openraft::BasicNode;

/// Identifies a monitor (its `--id`).
pub type NodeId = u64;

/// What one log entry proposes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Proposal {
    /// A change of the cluster map.
    Map(MapChange),
    /// A change of the key database (never part of the map clients receive).
    Keys(KeyChange),
}

impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Proposal::Map(c) => write!(f, "{c:?}"),
            // Never the secrets: the kind of change and its entity only.
            Proposal::Keys(k) => f.write_str(&key_change_summary(k)),
        }
    }
}

/// A key change as logs show it (no secret).
pub fn key_change_summary(k: &KeyChange) -> String {
    match k {
        KeyChange::Seed(keys) => format!("seed {} key(s)", keys.len()),
        KeyChange::Add { entity, caps, .. } => format!("add {entity} ({caps})"),
        KeyChange::SetCaps { entity, caps } => format!("caps {entity} ({caps})"),
        KeyChange::Rotate {
            entity,
            keep_old_until,
            ..
        } => format!("rotate {entity} (old key kept until {keep_old_until})"),
        KeyChange::Remove { entity } => format!("remove {entity}"),
        KeyChange::RotateMon { keep_old_until, .. } => {
            format!("rotate the monitors' key (old key kept until {keep_old_until})")
        }
    }
}

/// What applying one log entry returns to the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyResult {
    Map(Result<ChangeOutcome, MapError>),
    Keys(Result<(), KeyDbError>),
}
openraft::declare_raft_types!(
    /// Type configuration of the monitors' Raft group.
    pub MonRaft:
        D = Proposal,
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
