//! Why the stored bytes of a volume's record (header, lease, holder registry, allocation map
//! shard, snapshot table, pool QoS limits; docs/format/volume.md) do not decode. One error
//! for all of them, saying what is wrong with the bytes; the caller says which object it read
//! ([`VolumeError::BadHeader`](crate::VolumeError::BadHeader), `BadSnaps`, ...). Each is
//! damage (or a version this build does not read): reading the same bytes again cannot help.

use crate::header::{MAX_OBJECT_SIZE, MIN_OBJECT_SIZE};
use crate::snaps::{MAX_RETIRED, MAX_SNAPS};
use std::fmt;

/// Which record a [`DecodeError`] is about, for its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Header,
    Lease,
    Registry,
    AllocMap,
    SnapTable,
    PoolQos,
}

impl Record {
    /// What the record is, as in "not {what} (bad magic)".
    fn what(self) -> &'static str {
        match self {
            Record::Header => "a volume header",
            Record::Lease => "a lease record",
            Record::Registry => "a holder registry",
            Record::AllocMap => "an allocation map shard",
            Record::SnapTable => "a snapshot table",
            Record::PoolQos => "pool QoS limits",
        }
    }

    /// The name its format versions go by, as in "{name} format version 3".
    fn format(self) -> &'static str {
        match self {
            Record::Header => "volume header",
            Record::Lease => "lease",
            Record::Registry => "holder registry",
            Record::AllocMap => "allocation map",
            Record::SnapTable => "snapshot table",
            Record::PoolQos => "pool QoS",
        }
    }

    /// The versions this build reads, as in "this cairn reads {versions}".
    fn versions(self) -> String {
        match self {
            Record::Header => format!("version {}", crate::header::FORMAT_VERSION),
            Record::Lease => format!("versions 1 and {}", crate::lease::LEASE_VERSION),
            Record::Registry => format!("version {}", crate::registry::REGISTRY_VERSION),
            Record::AllocMap => format!("version {}", crate::allocmap::ALLOC_VERSION),
            Record::SnapTable => format!("version {}", crate::snaps::SNAPS_VERSION),
            Record::PoolQos => format!("version {}", crate::pool_qos::POOL_QOS_VERSION),
        }
    }
}

/// The accepted lengths of a record, as in "{len} bytes, expected {lengths}".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lengths {
    pub min: usize,
    pub max: usize,
}

impl fmt::Display for Lengths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{} to {}", self.min, self.max)
        }
    }
}

/// Why a record's bytes do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// A length no record of this kind has.
    #[error("{len} bytes, expected {expected}")]
    Length { len: usize, expected: Lengths },
    /// Another kind of bytes.
    #[error("not {} (bad magic)", .0.what())]
    BadMagic(Record),
    /// The crc32c does not match: damaged bytes.
    #[error("checksum mismatch")]
    Checksum,
    /// A format version this build does not read.
    #[error("{} format version {version}; this cairn reads {}", .record.format(), .record.versions())]
    Version { record: Record, version: u16 },
    /// Version 2 of a lease record is longer than this.
    #[error("{0} bytes, too short for version 2")]
    ShortForV2(usize),
    /// A field runs past the end.
    #[error("truncated")]
    Truncated,
    /// Reserved bytes that must be zero are not.
    #[error("reserved bytes are not zero")]
    Reserved,
    /// Flag bits this build does not know.
    #[error("unknown flags {0:#x}")]
    UnknownFlags(u16),
    /// Feature bits this build does not know (a newer cairn's volume).
    #[error("unknown feature bits {0:#x}")]
    UnknownFeatures(u64),
    /// A data object size out of range.
    #[error(
        "invalid object size: {0} bytes; must be a power of two from {min} KiB to {max} MiB",
        min = MIN_OBJECT_SIZE >> 10,
        max = MAX_OBJECT_SIZE >> 20
    )]
    ObjectSize(u32),
    /// A volume (or snapshot) size out of range.
    #[error("invalid volume size: {0} bytes; must be a multiple of 512 from 512 bytes to 1 PiB")]
    Size(u64),
    /// A name that is not a valid volume or snapshot name.
    #[error("invalid volume name {name:?}: {why}")]
    BadName { name: String, why: &'static str },
    /// A text field that is not UTF-8.
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    /// A lease record's description length disagrees with its length.
    #[error("description length {0} does not match the record")]
    DescriptionLength(usize),
    /// A holder registry's entry count disagrees with its length.
    #[error("{entries} entries do not fit {len} bytes")]
    Entries { entries: usize, len: usize },
    /// A holder registry entry's writer flag is neither 0 nor 1.
    #[error("writer flag {0}")]
    WriterFlag(u8),
    /// An allocation map shard of another volume, or another shard.
    #[error("it belongs to another volume or shard")]
    OtherShard,
    /// An allocation map shard's bitmap length is not the format's.
    #[error("bitmap of {0} bytes, not {len}", len = crate::allocmap::BITMAP_LEN)]
    BitmapLength(u32),
    /// A snapshot table holds more snapshots or retired ids than allowed.
    #[error("{snaps} snapshots and {retired} retired ids, limits {MAX_SNAPS} and {MAX_RETIRED}")]
    Counts { snaps: usize, retired: usize },
    /// Snapshot ids must rise and lie in `1..=seq`.
    #[error("snapshot id {0} out of order or range")]
    SnapOrder(u64),
    /// Two snapshots of one name.
    #[error("snapshot name {0:?} twice")]
    SnapTwice(String),
    /// Retired ids must rise and lie in `1..=seq`.
    #[error("retired id {0} out of order or range")]
    RetiredOrder(u64),
    /// A retired id that a snapshot still has.
    #[error("retired id {0} is a snapshot's")]
    RetiredIsSnap(u64),
    /// The parent flag is neither 0 nor 1.
    #[error("parent flag {0}")]
    ParentFlag(u8),
    /// Bytes after the end of the table.
    #[error("{0} bytes after the table")]
    Trailing(usize),
    /// A parent link to snapshot id 0.
    #[error("parent snapshot id 0")]
    ParentSnapZero,
    /// A parent link's overlap is not a volume size.
    #[error(
        "parent overlap: invalid volume size: {0} bytes; must be a multiple of 512 from 512 \
         bytes to 1 PiB"
    )]
    ParentOverlap(u64),
    /// What is wrong with the parent link's names.
    #[error("parent: {0}")]
    Parent(Box<DecodeError>),
    /// What is wrong with one snapshot of the table.
    #[error("snapshot {id}: {error}")]
    Snap { id: u64, error: Box<DecodeError> },
}

impl DecodeError {
    /// The error about snapshot `id`.
    pub(crate) fn in_snap(self, id: u64) -> DecodeError {
        DecodeError::Snap {
            id,
            error: Box::new(self),
        }
    }

    /// The error about the parent link.
    pub(crate) fn in_parent(self) -> DecodeError {
        DecodeError::Parent(Box::new(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{check_name, check_object_size, check_size, decoded_name};

    #[test]
    fn checks_of_decoded_fields_read_as_the_argument_checks_do() {
        let arg = |e: crate::VolumeError| e.to_string();
        assert_eq!(
            DecodeError::ObjectSize(3).to_string(),
            arg(check_object_size(3).unwrap_err())
        );
        assert_eq!(
            DecodeError::Size(7).to_string(),
            arg(check_size(7).unwrap_err())
        );
        assert_eq!(
            DecodeError::ParentOverlap(7).to_string(),
            format!("parent overlap: {}", arg(check_size(7).unwrap_err()))
        );
        assert_eq!(
            decoded_name("-x").unwrap_err().to_string(),
            arg(check_name("-x").unwrap_err())
        );
    }

    #[test]
    fn messages_say_which_record_and_where() {
        assert_eq!(
            DecodeError::BadMagic(Record::Header).to_string(),
            "not a volume header (bad magic)"
        );
        let v = DecodeError::Version {
            record: Record::Lease,
            version: 9,
        };
        assert_eq!(
            v.to_string(),
            "lease format version 9; this cairn reads versions 1 and 2"
        );
        let one = Lengths { min: 52, max: 52 };
        let range = Lengths { min: 44, max: 300 };
        let len = |expected| DecodeError::Length { len: 51, expected }.to_string();
        assert_eq!(len(one), "51 bytes, expected 52");
        assert_eq!(len(range), "51 bytes, expected 44 to 300");
        assert_eq!(
            DecodeError::NotUtf8("name").in_snap(3).to_string(),
            "snapshot 3: name is not UTF-8"
        );
    }
}
