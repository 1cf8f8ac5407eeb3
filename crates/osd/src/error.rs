//! Errors that stop an OSD from starting or running.

/// Why the OSD cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OsdError {
    #[error("cannot open {what} {path}: {source}")]
    Device {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("store on {path}: {source}")]
    Store {
        path: String,
        source: cairn_store::StoreError,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot register with the monitors: {0}")]
    Boot(String),
    #[error("cannot start the OSD runtime: {0}")]
    Runtime(std::io::Error),
    #[error("bad configuration: {0}")]
    Config(String),
    #[error(
        "the store failed: {0}; the OSD stopped to protect data (restart it to replay the WAL)"
    )]
    StoreFailed(String),
}
