//! Errors of volume operations.

use crate::decode_error::DecodeError;
use crate::volume::MAX_CLONE_DEPTH;
use cairn_client::ClientError;

/// Why a volume operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    #[error("no volume {name:?} in pool {pool}: `cairn vol ls` lists the volumes")]
    NoSuchVolume { pool: String, name: String },
    #[error("volume {name:?} already exists in pool {pool}")]
    Exists { pool: String, name: String },
    #[error("invalid volume name {name:?}: {why}")]
    BadName { name: String, why: &'static str },
    #[error("invalid {what}: {why}")]
    BadArgument { what: &'static str, why: String },
    #[error("volume {name:?}: header object is damaged ({why}); the volume's data objects are untouched")]
    BadHeader { name: String, why: DecodeError },
    #[error("volume {name:?}: header object is damaged (more than {MAX_CLONE_DEPTH} levels of clones); the volume's data objects are untouched")]
    CloneTooDeep { name: String },
    #[error("volume {name:?}: header object is damaged (its parent volume {parent:?} was replaced); the volume's data objects are untouched")]
    ParentReplaced { name: String, parent: String },
    #[error("volume {name:?}: its holder registry is damaged ({why}); `cairn obj rm` it (vholders.{id:016x}) once no server has the volume open")]
    BadRegistry {
        name: String,
        id: u64,
        why: DecodeError,
    },
    #[error("invalid pool QoS defaults (object vqos.default): {why}")]
    BadPoolQos { why: DecodeError },
    #[error("volume {name:?}: range {offset}+{len} is beyond its size {size}")]
    OutOfRange {
        name: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("volume {name:?}: {op} of data object {object}: {source}")]
    Object {
        name: String,
        op: &'static str,
        object: String,
        source: ClientError,
    },
    #[error("volume {name:?} in pool {pool} is being removed; run `cairn vol rm {name}` again if it was interrupted")]
    Removing { pool: String, name: String },
    #[error("volume {name:?} is closed: {why}")]
    Closed { name: String, why: String },
    #[error("volume {name:?} is open: {holders}; stop serving it (disconnect its clients), or add --force to make the server close it first")]
    Open { name: String, holders: String },
    #[error("volume {name:?}: snapshot table is damaged ({why}); the data objects are untouched")]
    BadSnaps { name: String, why: DecodeError },
    #[error("volume {name:?} has no snapshot {snap:?}: `cairn vol snap ls {name}` lists them")]
    NoSuchSnap { name: String, snap: String },
    #[error("volume {name:?}: snapshot {snap:?} {why}")]
    Snap {
        name: String,
        snap: String,
        why: String,
    },
    #[error("volume {name:?} is open for writing by {holders}; one writer at a time: stop that server (a dead one's lease expires within 15 s)")]
    Locked { name: String, holders: String },
    #[error("volume {name:?}: another command changed its snapshot table at the same time, so this one stopped; run it again (`cairn vol snap ls` shows where things stand)")]
    Conflict { name: String },
    #[error("volume {name:?} is read-only here: {why}")]
    ReadOnly { name: String, why: String },
    #[error("{0}")]
    Client(#[from] ClientError),
}

impl VolumeError {
    /// Whether this process was fenced: another holder took the volume over.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            VolumeError::Client(ClientError::Fenced)
                | VolumeError::Object {
                    source: ClientError::Fenced,
                    ..
                }
        )
    }

    /// Whether an OSD refused for lack of space (the pool is full).
    pub fn is_no_space(&self) -> bool {
        let full = |e: &ClientError| {
            matches!(
                e,
                ClientError::Failed {
                    code: cairn_client::FailCode::NoSpace,
                    ..
                }
            )
        };
        match self {
            VolumeError::Client(e) | VolumeError::Object { source: e, .. } => full(e),
            _ => false,
        }
    }
}
