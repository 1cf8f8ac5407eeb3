//! Errors of a monitor as a whole (startup, storage, configuration).

use std::path::PathBuf;

/// Why a monitor could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MonError {
    /// The configuration is inconsistent (says what and how to fix it).
    #[error("invalid monitor configuration: {0}")]
    Config(String),
    /// The metrics endpoint's address cannot be listened on.
    #[error("cannot serve metrics on {addr}: {source} (is another daemon using that port?)")]
    Metrics {
        /// The address configured.
        addr: std::net::SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// The keyring cannot be used.
    #[error(transparent)]
    Keys(#[from] crate::auth::MonKeysError),
    /// The data directory could not be created.
    #[error("cannot create monitor data dir {dir}: {source}")]
    Dir {
        /// The data directory.
        dir: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Another process (or another monitor in this process) has the database open.
    #[error("{path} is in use: another monitor is running on this data dir; stop it first")]
    InUse {
        /// The database file.
        path: PathBuf,
    },
    /// The database could not be read or written.
    #[error("monitor database {path}: {reason}")]
    Store {
        /// The database file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The data directory belongs to another cluster.
    #[error(
        "{dir} holds cluster {stored} but this monitor was started with fsid {given}: \
         pass the cluster's --fsid or use another --dir"
    )]
    FsidMismatch {
        /// The data directory.
        dir: PathBuf,
        /// The fsid stored in it (hex).
        stored: String,
        /// The fsid this monitor was given (hex).
        given: String,
    },
    /// The data directory belongs to another monitor of the cluster.
    #[error(
        "{dir} holds the data of monitor {stored} but this monitor has id {given}: \
         start monitor {stored} on it, or give this one its own --dir"
    )]
    IdMismatch {
        /// The data directory.
        dir: PathBuf,
        /// The monitor id stored in it.
        stored: u64,
        /// The id this monitor was given.
        given: u64,
    },
    /// The database was written by a build with another on-disk format.
    #[error(
        "{path} has on-disk format {found}; this build reads format {supported}: upgrade Cairn"
    )]
    Format {
        /// The database file.
        path: PathBuf,
        /// Its format version.
        found: u32,
        /// The format version this build reads.
        supported: u32,
    },
    /// The Raft node failed (storage failure or a bug); the monitor stopped.
    #[error("raft: {0}")]
    Raft(String),
}
