//! Erasure-coded PGs: the primary's sub-writes and reads of one shard of an object, and its
//! query of a shard's state when it peers (docs/format/ec.md). Every message names the shard
//! it is for: an OSD may hold two shards of one PG while data moves.

use super::call::Call;
use super::osd::FailCode;
use serde::{Deserialize, Serialize};

/// Primary -> shard member: [`EcSubWrite`], its payload the bytes its ops carry, in order;
/// answered [`super::osd::REP_REPLY`] ([`super::osd::RepReply`]) with the same request id.
pub const EC_WRITE: u16 = 212;
/// Primary -> shard member: [`EcRead`]; reply [`EC_READ_REPLY`].
pub const EC_READ: u16 = 213;
/// Reply: [`EcReadReply`], its payload the ranges read, back to back (zeros past the end).
pub const EC_READ_REPLY: u16 = 214;
/// Primary -> shard member: [`EcQuery`]; reply [`EC_INFO`].
pub const EC_QUERY: u16 = 215;
/// Reply: [`EcInfo`].
pub const EC_INFO: u16 = 216;

/// [`EC_READ`] answered by [`EC_READ_REPLY`].
pub const EC_READ_CALL: Call<EcRead, EcReadReply> =
    Call::new(EC_READ, EC_READ_REPLY, "ec read reply");
/// [`EC_QUERY`] answered by [`EC_INFO`].
pub const EC_QUERY_CALL: Call<EcQuery, EcInfo> = Call::new(EC_QUERY, EC_INFO, "ec info");

/// Most ops one sub-write carries, and most ranges one read asks for.
pub const MAX_EC_PIECES: usize = 1024;

/// Why an EC request is refused before it is served (the sender is then cut off: only a
/// buggy or hostile OSD sends one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EcLimitError {
    #[error("{got} ops or ranges in one EC request, over the limit of {MAX_EC_PIECES}")]
    TooManyPieces { got: usize },
    #[error("EC sub-write ops take {ops:?} payload bytes, the frame carries {payload}")]
    PayloadMismatch { ops: Option<u64>, payload: usize },
    #[error("EC read of {asked} bytes is over the limit of {MAX_EC_READ}")]
    ReadTooLarge { asked: u64 },
}

/// One step of a sub-write on a shard object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EcShardOp {
    /// Write the next `len` payload bytes at `offset` of the shard object.
    Write { offset: u64, len: u32 },
    /// XOR the next `len` payload bytes into the shard object at `offset` (a parity delta;
    /// bytes past the shard's end count as zeros).
    Xor { offset: u64, len: u32 },
    /// Cut (or extend with zeros) the shard object to `len` bytes.
    Truncate { len: u64 },
    /// Remove the shard object.
    Remove,
}

impl EcShardOp {
    /// The payload bytes the op takes.
    pub fn payload_len(&self) -> u64 {
        match *self {
            EcShardOp::Write { len, .. } | EcShardOp::Xor { len, .. } => u64::from(len),
            EcShardOp::Truncate { .. } | EcShardOp::Remove => 0,
        }
    }
}

/// A primary's write of one shard of an object, as PG version `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcSubWrite {
    /// The primary's map epoch when it sent the write.
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    /// The shard (0..k data, k..k+m parity) this member holds.
    pub shard: u8,
    pub version: u64,
    /// The sending primary's OSD id (checked against the member's map).
    pub primary: u32,
    pub object: Vec<u8>,
    /// The object's logical size after the write (every shard keeps it).
    pub size: u64,
    /// Applied in order, in one transaction.
    pub ops: Vec<EcShardOp>,
}

impl EcSubWrite {
    /// Checks the ops against the payload's length: `Err` says why they do not add up.
    pub fn check(&self, payload: usize) -> Result<(), EcLimitError> {
        if self.ops.len() > MAX_EC_PIECES {
            return Err(EcLimitError::TooManyPieces {
                got: self.ops.len(),
            });
        }
        let total = self
            .ops
            .iter()
            .try_fold(0u64, |sum, op| sum.checked_add(op.payload_len()));
        match total {
            Some(t) if t == payload as u64 => Ok(()),
            _ => Err(EcLimitError::PayloadMismatch {
                ops: total,
                payload,
            }),
        }
    }
}

/// A primary's read of ranges of one shard of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcRead {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    pub shard: u8,
    pub object: Vec<u8>,
    /// `(offset, len)` in the shard object; at most [`MAX_EC_PIECES`], of at most
    /// [`MAX_EC_READ`] bytes together.
    pub ranges: Vec<(u64, u32)>,
}

/// Most bytes one [`EcRead`] returns.
pub const MAX_EC_READ: u64 = 16 << 20;

impl EcRead {
    /// The bytes the reply carries, or why the request is refused.
    pub fn reply_len(&self) -> Result<u64, EcLimitError> {
        if self.ranges.len() > MAX_EC_PIECES {
            return Err(EcLimitError::TooManyPieces {
                got: self.ranges.len(),
            });
        }
        let total: u64 = self.ranges.iter().map(|&(_, len)| u64::from(len)).sum();
        if total > MAX_EC_READ {
            return Err(EcLimitError::ReadTooLarge { asked: total });
        }
        Ok(total)
    }
}

/// A shard member's answer to an [`EcRead`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EcReadReply {
    /// The ranges, back to back in the payload; `exists` false (and zeros) when the shard
    /// holds no such object. `size` is the object's logical size the shard keeps.
    Data { exists: bool, size: u64 },
    /// The member's map says the sender is not primary (or is newer than the sender's).
    Stale { epoch: u64 },
    /// The member could not read (a damaged chunk: `Corrupt`).
    Failed { code: FailCode, why: String },
}

/// A primary asks a shard member what it holds of the PG's shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcQuery {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    pub shard: u8,
}

/// What a member holds of one shard of a PG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcInfo {
    /// Whether the shard's collection exists here.
    pub exists: bool,
    /// The shard's last PG version.
    pub last_version: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_write_checks_its_payload() {
        let mut w = EcSubWrite {
            epoch: 1,
            pool: 1,
            pg: 0,
            shard: 0,
            version: 1,
            primary: 0,
            object: b"o".to_vec(),
            size: 8192,
            ops: vec![
                EcShardOp::Write {
                    offset: 0,
                    len: 4096,
                },
                EcShardOp::Truncate { len: 8192 },
                EcShardOp::Xor {
                    offset: 4096,
                    len: 10,
                },
            ],
        };
        assert!(w.check(4106).is_ok());
        let e = w.check(4105).unwrap_err();
        assert!(e.to_string().contains("4105"), "{e}");
        w.ops = vec![
            EcShardOp::Write {
                offset: 0,
                len: u32::MAX,
            };
            MAX_EC_PIECES + 1
        ];
        assert!(w.check(0).unwrap_err().to_string().contains("limit"));
    }

    #[test]
    fn a_read_is_bounded() {
        let mut r = EcRead {
            epoch: 1,
            pool: 1,
            pg: 0,
            shard: 2,
            object: b"o".to_vec(),
            ranges: vec![(0, 4096), (8192, 4096)],
        };
        assert_eq!(r.reply_len(), Ok(8192));
        r.ranges = vec![(0, 1 << 20); 17];
        assert!(r.reply_len().unwrap_err().to_string().contains("limit"));
    }
}
