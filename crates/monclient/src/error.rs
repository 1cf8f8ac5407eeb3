//! Errors of monitor client calls.

use cairn_map::MapError;
use cairn_proto::msg::mon::Unavailable;

/// Why a call to the monitors failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MonClientError {
    /// No monitor accepted a connection before the deadline.
    #[error(
        "no monitor reachable at {} ({last_error}): is the cluster running? check -c / CAIRN_CONF",
        addrs.join(", ")
    )]
    Unreachable {
        /// The monitor addresses tried.
        addrs: Vec<String>,
        /// The last connection error.
        last_error: String,
    },
    /// The monitors refused the change (the map is unchanged).
    #[error("refused: {0}")]
    Refused(MapError),
    /// The monitors refused a key database request (`cairn auth`): its reason.
    #[error("refused: {0}")]
    KeyRefused(String),
    /// The leader refused or could not make a membership change (`cairn mon add|rm`).
    #[error("{0}")]
    MembersRefused(String),
    /// Monitors answered but could not commit (no leader or no quorum) before the deadline.
    #[error("monitors unavailable: {0}")]
    Unavailable(Unavailability),
    /// The leader could not make a membership change now (`cairn mon add|rm`).
    #[error("{0}")]
    MembersUnavailable(Unavailable),
    /// A monitor sent something this client does not understand (version mismatch?).
    #[error("monitor protocol error: {0}")]
    Protocol(String),
    /// A monitor refused this client's credentials (none, an unknown entity, a wrong or
    /// rotated key): retrying with the same ones cannot help.
    #[error("the monitors refused this client: {0}")]
    Denied(String),
    /// The deadline passed while waiting for an answer.
    #[error("timed out waiting for the monitors")]
    Timeout,
}

/// Why the monitors could not answer a call before its deadline (each is transient: the
/// call was retried until then).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailability {
    /// What the last monitor asked answered.
    #[error(transparent)]
    Mon(#[from] Unavailable),
    /// The monitors asked named no leader.
    #[error("no monitor leader elected (a majority must be up)")]
    NoLeader,
    /// The monitor's map is older than the epoch asked about.
    #[error("the monitor's map is at epoch {epoch} < {until}")]
    MapBehind {
        /// The monitor's map epoch.
        epoch: u64,
        /// The epoch asked about.
        until: u64,
    },
}
