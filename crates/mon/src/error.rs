//! Errors of a monitor as a whole (startup, storage, configuration).

use std::path::PathBuf;

/// Why a monitor could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MonError {
    /// The configuration is inconsistent (says what and how to fix it).
    #[error("invalid monitor configuration: {0}")]
    Config(String),
    /// The data directory could not be created.
    #[error("cannot create monitor data dir {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// Another process (or another monitor in this process) has the database open.
    #[error("{path} is in use: another monitor is running on this data dir; stop it first")]
    InUse { path: PathBuf },
    /// The database could not be read or written.
    #[error("monitor database {path}: {reason}")]
    Store { path: PathBuf, reason: String },
    /// The data directory belongs to another cluster.
    #[error(
        "{dir} holds cluster {stored} but this monitor was started with fsid {given}: \
         pass the cluster's --fsid or use another --dir"
    )]
    FsidMismatch {
        dir: PathBuf,
        stored: String,
        given: String,
    },
    /// The data directory belongs to another monitor of the cluster.
    #[error(
        "{dir} holds the data of monitor {stored} but this monitor has id {given}: \
         start monitor {stored} on it, or give this one its own --dir"
    )]
    IdMismatch {
        dir: PathBuf,
        stored: u64,
        given: u64,
    },
    /// The database was written by a build with another on-disk format.
    #[error(
        "{path} has on-disk format {found}; this build reads format {supported}: upgrade Cairn"
    )]
    Format {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// The Raft node failed (storage failure or a bug); the monitor stopped.
    #[error("raft: {0}")]
    Raft(String),
}
