//! Errors of the client API.

use cairn_proto::msg::osd::FailCode;
use std::time::Duration;

/// Why an op failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("no pool {0:?}: `cairn pool ls` lists the pools")]
    NoSuchPool(String),
    #[error("no object {object:?} in pool {pool}")]
    NoSuchObject { pool: String, object: String },
    #[error("invalid request: {0}")]
    Invalid(String),
    /// An exclusive create found the object there already (with other contents).
    #[error("object {object:?} already exists in pool {pool}")]
    Exists { pool: String, object: String },
    /// A conditional write or remove found other contents than expected: nothing changed.
    #[error("object {object:?} in pool {pool} was changed by someone else meanwhile")]
    Conflict { pool: String, object: String },
    /// An OSD failed the op; match on `code` (e.g. [`FailCode::NoSpace`]), show `why`.
    #[error("the OSD failed the op: {why}")]
    Failed { code: FailCode, why: String },
    #[error("{what} did not complete within {after:?} ({last}); check `cairn status`")]
    Timeout {
        what: &'static str,
        after: Duration,
        last: String,
    },
    /// The OSD refused this client: its credentials (no ticket, a refused one) or its caps
    /// (e.g. no `w` on the pool).
    #[error("{0}")]
    Denied(String),
    #[error("monitors: {0}")]
    Mon(String),
    /// This client instance was fenced (blocklisted): another holder took its volume over.
    /// Nothing it sends is served any more; do not retry.
    #[error("this client was fenced: another process took the volume over (its ops are refused; reopen to take it back)")]
    Fenced,
}
