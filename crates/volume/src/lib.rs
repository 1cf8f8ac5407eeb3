//! cairn-volume: block volumes on the object core.
//!
//! A volume is a header object `vol.<name>` (size, object size, id; docs/format/volume.md)
//! plus data objects `vdata.<id>.<objno>` of a fixed size (default 4 MiB), thin provisioned:
//! a data object exists only once written. [`Volume`] does byte-range I/O over them; an open
//! volume keeps a map of which objects exist so reads of holes never reach an OSD.
//! Snapshots (`snapshot.rs`, `snaps.rs`, `cow.rs`) keep a data object's old bytes in a clone
//! object before its first change after the snapshot.
//! A volume knows no protocol: `cairn-gateway` serves volumes over NBD.

mod admin;
pub mod allocmap;
mod clone;
mod cow;
mod decode_error;
mod diff;
mod error;
pub mod header;
mod holder;
mod join;
mod layout;
pub mod lease;
mod objmap;
pub mod pool_qos;
mod qos;
pub mod registry;
mod remove;
pub mod snaps;
mod snapshot;
mod volume;

pub use admin::{
    create, create_with, info, list, rates, resize, VolumeEntry, VolumeInfo, VolumeRates,
};
pub use clone::{clone_volume, flatten};
pub use decode_error::{DecodeError, Lengths, Record};
pub use diff::{diff, usage, Changed, SnapUsage, Usage, DIFF_BLOCK};
pub use error::VolumeError;
pub use header::{Header, DEFAULT_OBJECT_SIZE};
pub use remove::{
    close_for_removal, data_pool_users, describe_holders, find_orphans, open_volumes, remove,
    remove_orphans, Orphans, RemoveEvent,
};
pub use snapshot::{
    create_snap, list_snaps, protect_snap, remove_snap, rollback_snap, set_qos, trim, SnapEvent,
    SnapList, ACK_WAIT,
};
pub use volume::{read_header, Allocation, Volume};
