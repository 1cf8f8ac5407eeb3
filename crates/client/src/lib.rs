//! cairn-client: the cluster client library.
//!
//! A [`Client`] follows the cluster map from the monitors, computes each object's PG and
//! primary itself and sends the op straight to that OSD (one connection per OSD, many ops in
//! flight on it). Map changes and OSD failures are handled inside: an op that meets a
//! refusal (`NotPrimary`, `Retry`), a broken connection or a degraded PG is resent to the
//! PG's primary at a newer map until it succeeds or the op deadline passes.

mod conn;
mod error;
mod ops;
mod route;
mod stats;

pub use bytes::Bytes;
pub use cairn_proto::msg::osd::{contents_tag, FailCode, OsdStats};
pub use error::ClientError;
pub use ops::{
    new_instance, Client, ClientConfig, MergeStats, ObjectInfo, DEFAULT_MERGE_THRESHOLD,
};
pub use stats::{osd_stats, pg_mark_unfound_lost, pg_status, scrub_pg};
