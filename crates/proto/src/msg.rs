//! Messages carried in frames: message type numbers and the control-part encoding.
//!
//! Control parts are encoded with postcard (a compact, documented serde format); bulk data
//! (object bytes) travels in the frame's raw data part and is never re-encoded. Message type
//! ranges: 1..=99 monitor protocol, 100..=199 monitor-to-monitor (Raft), 200..=299 OSD ops (220..=229 peering and recovery, 228..=231 scrub).

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Why a control part could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {what} message: {reason}")]
pub struct MsgError {
    pub what: &'static str,
    pub reason: String,
}

/// Encodes a control part.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // postcard only fails on types serde cannot describe (none of ours) or a full fixed
    // buffer (we give it a growable one).
    postcard::to_stdvec(msg).unwrap_or_default()
}

/// Decodes a control part; trailing bytes are an error (a sign of a version mismatch).
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, MsgError> {
    let (v, rest) = postcard::take_from_bytes(bytes).map_err(|e| MsgError {
        what,
        reason: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(MsgError {
            what,
            reason: format!("{} trailing bytes", rest.len()),
        });
    }
    Ok(v)
}

/// Why a request was refused, for programs to match on (the message beside it is for people).
/// Sent in an `ERROR` reply ([`mon::ERROR`], [`osd::ERROR`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The frame or its message could not be decoded; the connection is closed after it.
    Malformed,
    /// The message type is not served on this port (or not in this place of a
    /// conversation); the connection is closed after it.
    Unsupported,
    /// What the request names (a PG, a pool) does not exist in the server's map.
    NotFound,
    /// The request is well-formed but not acceptable (a limit exceeded, a bad argument).
    Invalid,
    /// The server could not serve it (a device or internal failure).
    Internal,
    /// The sender may not make this request (authentication and capabilities).
    Denied,
    /// The server's store has no space for it.
    StoreFull,
    /// The server's store failed its checks (corrupt data, a failed device): it stops.
    StoreCorrupt,
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorCode::Malformed => "malformed request",
            ErrorCode::Unsupported => "unsupported request",
            ErrorCode::NotFound => "not found",
            ErrorCode::Invalid => "invalid request",
            ErrorCode::Internal => "server failure",
            ErrorCode::Denied => "permission denied",
            ErrorCode::StoreFull => "store full",
            ErrorCode::StoreCorrupt => "store corrupt",
        })
    }
}

/// A refused request: the `ERROR` reply's control part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorReply {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorReply {
        ErrorReply {
            code,
            message: message.into(),
        }
    }
}

/// Whether `msg_type` is an `ERROR` reply (of the monitor or the OSD protocol).
pub fn is_error(msg_type: u16) -> bool {
    msg_type == mon::ERROR || msg_type == osd::ERROR
}

pub mod call;
pub mod ec;
pub mod ec_rebuild;
pub mod mon;
pub mod osd;
pub mod peering;
pub mod scrub;
