//! Messages carried in frames: message type numbers and the control-part encoding.
//!
//! Control parts are encoded with postcard (a compact, documented serde format); bulk data
//! (object bytes) travels in the frame's raw data part and is never re-encoded. Message type
//! ranges: 1..=99 monitor protocol, 100..=199 monitor-to-monitor (Raft), 200..=299 OSD ops (220..=229 peering and recovery, 228..=231 scrub).

use serde::{de::DeserializeOwned, Serialize};

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

pub mod mon;
pub mod osd;
pub mod peering;
pub mod scrub;
