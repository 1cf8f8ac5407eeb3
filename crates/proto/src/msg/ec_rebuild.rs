//! Rebuilding the shards of an EC PG when its primary peers it (docs/format/ec.md,
//! "Peering and rebuild"): the primary asks each shard for the state of the objects the PG
//! logs say changed (`EC_STAT`), pushes rebuilt shard objects to the shards that lack them
//! (`EC_PUSH`), and then gives those shards the authoritative log (`EC_SET_LOG`).

use super::call::Call;
use super::osd::{FailCode, MAX_OBJECT_NAME};
use serde::{Deserialize, Serialize};

/// Primary -> shard member: [`EcStat`]; reply [`EC_STAT_REPLY`].
pub const EC_STAT: u16 = 217;
/// Reply: [`EcStatReply`].
pub const EC_STAT_REPLY: u16 = 218;
/// Primary -> shard member: [`EcPush`], its payload the shard bytes at the push's offset;
/// answered [`super::osd::REP_REPLY`] once durable.
pub const EC_PUSH: u16 = 219;
/// Primary -> shard member: [`EcSetLog`], its payload the authoritative log entries after
/// `from` (encoded as the log entries of `PG_INFO`); answered [`super::osd::REP_REPLY`] once
/// durable.
pub const EC_SET_LOG: u16 = 236;

/// [`EC_STAT`] answered by [`EC_STAT_REPLY`].
pub const EC_STAT_CALL: Call<EcStat, EcStatReply> =
    Call::new(EC_STAT, EC_STAT_REPLY, "ec stat reply");

/// Most objects one [`EcStat`] names.
pub const MAX_EC_STAT: usize = 1024;
/// Most payload bytes one [`EcPush`] carries.
pub const MAX_EC_PUSH: usize = 4 << 20;

/// What a shard holds of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcObjectState {
    /// The object's logical size the shard keeps.
    pub size: u64,
    /// The PG version of the last write the shard object holds; 0 while a push rebuilds it
    /// (it is then no source for a rebuild).
    pub version: u64,
}

/// A primary asks a shard member for the state of objects of its shard, or for the names of
/// the objects it holds (a backfill).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcStat {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    pub shard: u8,
    pub which: EcStatWhich,
}

/// What an [`EcStat`] asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EcStatWhich {
    /// The states of these objects (at most [`MAX_EC_STAT`]).
    Named(Vec<Vec<u8>>),
    /// The names of up to [`MAX_EC_STAT`] objects after this one in byte order (empty: from
    /// the first).
    After(Vec<u8>),
    /// The states of these objects (at most [`MAX_EC_STAT`]), each read whole from the
    /// device and checked against the store's block checksums (a scrub).
    Verify(Vec<Vec<u8>>),
}

/// What a shard holds of one object, read whole from its device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EcChecked {
    Absent,
    Whole(EcObjectState),
    /// A block failed its checksum.
    Damaged {
        state: EcObjectState,
        why: String,
    },
}

/// A shard member's answer to an [`EcStat`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EcStatReply {
    /// One state per object asked for, in order (`None`: the shard holds no such object).
    States(Vec<Option<EcObjectState>>),
    /// Names in byte order; `more` when the shard holds objects after the last.
    Listed {
        names: Vec<Vec<u8>>,
        more: bool,
    },
    /// One per object asked to verify, in order.
    Checked(Vec<EcChecked>),
    /// The member's map says it does not hold the shard (or is newer than the sender's).
    Stale {
        epoch: u64,
    },
    Failed {
        code: FailCode,
        why: String,
    },
}

/// A primary writes (part of) a rebuilt shard object, or removes one the shard should not
/// hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcPush {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    pub shard: u8,
    /// The sending primary's OSD id (checked against the member's map).
    pub primary: u32,
    pub object: Vec<u8>,
    /// The object's state once the push is done; `None`: remove it (no payload).
    pub state: Option<EcObjectState>,
    /// Where the payload goes in the shard object: a push at 0 replaces the object.
    pub offset: u64,
    /// The object's last push: only it records `state.version`, so a shard object whose
    /// pushes were cut short is never taken for a whole one.
    pub last: bool,
}

impl EcPush {
    /// Checks the payload's length: `Err` says why the push is refused.
    pub fn check(&self, payload: usize) -> Result<(), EcRebuildLimitError> {
        if payload > MAX_EC_PUSH {
            return Err(EcRebuildLimitError::PushTooLarge { got: payload });
        }
        if self.state.is_none() && (payload > 0 || self.offset > 0) {
            return Err(EcRebuildLimitError::RemoveWithData);
        }
        name_ok(&self.object)
    }
}

/// A primary gives a shard member the authoritative history: the member drops its log
/// entries after `from`, takes the payload's entries (the authority's kept entries after
/// `from`, up to `version`, consecutive) and holds `version` as its last. A backfill sends
/// `from` 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcSetLog {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    pub shard: u8,
    pub primary: u32,
    pub from: u64,
    pub version: u64,
}

/// Why a rebuild request is refused before it is served (the sender is then cut off).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EcRebuildLimitError {
    #[error("an EC push of {got} bytes is over the limit of {MAX_EC_PUSH}")]
    PushTooLarge { got: usize },
    #[error("an EC push that removes an object carries bytes or an offset")]
    RemoveWithData,
    #[error("an EC stat of {got} objects is over the limit of {MAX_EC_STAT}")]
    TooManyObjects { got: usize },
    #[error("an EC log starts at version {from}, after its last version {version}")]
    LogBackwards { from: u64, version: u64 },
    #[error("an object name of {got} bytes is over the limit of {MAX_OBJECT_NAME}")]
    NameTooLong { got: usize },
}

fn name_ok(name: &[u8]) -> Result<(), EcRebuildLimitError> {
    if name.len() > MAX_OBJECT_NAME {
        return Err(EcRebuildLimitError::NameTooLong { got: name.len() });
    }
    Ok(())
}

impl EcStat {
    pub fn check(&self) -> Result<(), EcRebuildLimitError> {
        match &self.which {
            EcStatWhich::Named(objects) | EcStatWhich::Verify(objects)
                if objects.len() > MAX_EC_STAT =>
            {
                Err(EcRebuildLimitError::TooManyObjects { got: objects.len() })
            }
            EcStatWhich::Named(objects) | EcStatWhich::Verify(objects) => {
                objects.iter().try_for_each(|o| name_ok(o))
            }
            EcStatWhich::After(name) => name_ok(name),
        }
    }
}

impl EcSetLog {
    pub fn check(&self) -> Result<(), EcRebuildLimitError> {
        if self.from > self.version {
            return Err(EcRebuildLimitError::LogBackwards {
                from: self.from,
                version: self.version,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(state: Option<EcObjectState>, offset: u64) -> EcPush {
        EcPush {
            epoch: 1,
            pool: 1,
            pg: 0,
            shard: 1,
            primary: 0,
            object: b"o".to_vec(),
            state,
            offset,
            last: true,
        }
    }

    #[test]
    fn rebuild_requests_are_bounded() {
        let s = Some(EcObjectState {
            size: 10,
            version: 3,
        });
        assert!(push(s, 0).check(MAX_EC_PUSH).is_ok());
        assert!(push(s, 0).check(MAX_EC_PUSH + 1).is_err());
        assert!(push(None, 0).check(0).is_ok());
        assert!(push(None, 0).check(1).is_err());
        assert!(push(None, 4096).check(0).is_err());
        let stat = |which| EcStat {
            epoch: 1,
            pool: 1,
            pg: 0,
            shard: 0,
            which,
        };
        let mut names = vec![b"o".to_vec(); MAX_EC_STAT];
        assert!(stat(EcStatWhich::Named(names.clone())).check().is_ok());
        names[3] = vec![b'x'; MAX_OBJECT_NAME + 1];
        let e = stat(EcStatWhich::Named(names.clone())).check().unwrap_err();
        assert!(e.to_string().contains("name"), "{e}");
        names[3] = b"p".to_vec();
        names.push(b"p".to_vec());
        let e = stat(EcStatWhich::Named(names)).check().unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        assert!(stat(EcStatWhich::After(Vec::new())).check().is_ok());
        let long = vec![b'x'; MAX_OBJECT_NAME + 1];
        assert!(stat(EcStatWhich::After(long)).check().is_err());
        let mut l = EcSetLog {
            epoch: 1,
            pool: 1,
            pg: 0,
            shard: 0,
            primary: 0,
            from: 4,
            version: 4,
        };
        assert!(l.check().is_ok());
        l.from = 5;
        assert!(l.check().is_err());
    }
}
