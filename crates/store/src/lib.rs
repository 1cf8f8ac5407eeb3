//! cairn-store: the OSD's local object store for flash + NVM.
//!
//! - **Commit** ([`Store::commit`]) is run to completion by the calling thread: one checksummed
//!   WAL record per transaction, group-committed with concurrent callers; no data-device I/O
//!   on the commit path.
//! - **Data** reaches the data devices later, written by a background flusher as large
//!   sequential appends into segments (log-structured); a cleaner reclaims segments by live
//!   bytes; space accounting is exact. Optionally, large whole-block writes go straight to
//!   their place instead and only their metadata through the WAL (`direct.rs`: the thread
//!   that writes their WAL batch writes their data and flushes the data device first).
//! - **Metadata** (the whole index) is in memory and written through: WAL records plus
//!   periodic checkpoints written into segments. Opening loads the last checkpoint and
//!   replays the WAL.
//! - **Integrity**: crc32c on every WAL record, checkpoint piece and data block; reads verify.
//! - **Mirror**: two data devices hold the same data; reads avoid the device that is flushing.
//!
//! On-disk format: `docs/format/store.md`.

mod cache;
mod checkpoint;
pub mod codec;
mod colls;
mod commit;
mod copies;
pub mod cowmap;
pub mod device;
mod direct;
mod edges;
pub mod effect;
mod error;
pub mod fault;
pub mod format;
#[cfg(test)]
mod golden;
mod index;
mod key;
mod lockwaits;
mod maint;
mod mirror;
mod read;
mod scrub;
mod segments;
mod shared;
mod store;
mod txn;
mod unflushed;
pub mod wal;

pub use cache::CacheStats;
pub use copies::CopyStats;
pub use device::{AlignedBuf, BlockDevice, FileDevice, MemDevice, BLOCK_SIZE};
pub use error::{Result, StoreError};
pub use lockwaits::LockWaitStats;
pub use mirror::IoStats;
pub use read::ReadPlan;
pub use scrub::{ScrubIssue, ScrubReport};
pub use shared::SharedBytes;
pub use store::{
    Devices, ObjectStat, Store, StoreConfig, StoreStats, INDEX_BYTES_PER_EXTENT,
    INDEX_BYTES_PER_OBJECT,
};
pub use txn::{limits, CollId, Op, Transaction};

/// Decoders of on-disk bytes, exposed for the fuzz targets.
pub mod decode {
    pub use crate::checkpoint::{decode as checkpoint, Root as CheckpointRoot};
    pub use crate::effect::decode as effects;
}

/// Percent of the writable space ordinary writes leave free, for transactions that may use it
/// ([`Transaction::use_reserve`]): a full store still takes small metadata writes, so that
/// space can be freed (a snapshot removed) without first freeing space.
pub const CLIENT_RESERVE_PERCENT: u64 = 5;
