//! Errors returned by the store. Each variant says what failed and where.

use std::io;

/// Identifies a device in error messages ("data0 (/path/to/file)").
pub type DeviceName = String;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An I/O call on a device failed.
    #[error("I/O error on device {device} at offset {offset}: {error}; check the device and the kernel log")]
    Io {
        device: DeviceName,
        offset: u64,
        error: io::Error,
    },
    /// A device does not carry a Cairn store, or a different one.
    #[error("device {device} is not usable: {reason}")]
    BadDevice { device: DeviceName, reason: String },
    /// On-disk bytes failed their checksum or did not decode.
    #[error("corrupt {what} on device {device} at offset {offset}: {detail}")]
    Corrupt {
        what: &'static str,
        device: DeviceName,
        offset: u64,
        detail: String,
    },
    /// Object data failed its checksum on every copy.
    #[error("corrupt data in object {object:?} of collection {coll} (block {block}) on device {device}: checksum mismatch on every copy")]
    CorruptData {
        coll: u64,
        object: String,
        block: u64,
        device: DeviceName,
    },
    /// The collection does not exist.
    #[error("collection {0} does not exist")]
    NoCollection(u64),
    /// The collection already exists.
    #[error("collection {0} already exists")]
    CollectionExists(u64),
    /// The object does not exist.
    #[error("object {object:?} does not exist in collection {coll}")]
    NoObject { coll: u64, object: String },
    /// A transaction, name or value is over its limit.
    #[error("{what} is too large: {size} bytes, the limit is {limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    /// An argument is out of range.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Not enough free space for the transaction (ENOSPC). Nothing was written.
    #[error("no space left: the transaction needs {needed} bytes, {available} are available; remove data or add capacity")]
    NoSpace { needed: u64, available: u64 },
    /// A background write or flush failed; the store stopped accepting writes to protect data.
    #[error("store failed and stopped accepting writes: {0}; restart the OSD to replay the WAL")]
    Failed(String),
    /// The configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl StoreError {
    /// Wraps an I/O error with the device and offset it happened at.
    pub fn io(device: &str, offset: u64, source: io::Error) -> Self {
        StoreError::Io {
            device: device.to_string(),
            offset,
            error: source,
        }
    }

    /// A decode failure of on-disk bytes.
    pub fn corrupt(
        what: &'static str,
        device: &str,
        offset: u64,
        detail: impl Into<String>,
    ) -> Self {
        StoreError::Corrupt {
            what,
            device: device.to_string(),
            offset,
            detail: detail.into(),
        }
    }
}

/// Result alias for the store.
pub type Result<T> = std::result::Result<T, StoreError>;
