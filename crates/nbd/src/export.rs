//! What the NBD server serves: a set of named block exports. The server knows nothing about
//! Cairn; `cairn-volume` implements these traits over volumes, tests over memory.

use std::future::Future;
use std::sync::Arc;

/// Why an export operation failed; mapped to the NBD error the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// The data could not be read or written (NBD_EIO).
    #[error("i/o error: {0}")]
    Io(String),
    /// No space left (NBD_ENOSPC).
    #[error("no space left: {0}")]
    NoSpace(String),
    /// The request is not valid for this export (NBD_EINVAL).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The export cannot do this (fast) (NBD_ENOTSUP), e.g. a FAST_ZERO it cannot honour.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// This client may not open the export (NBD_REP_ERR_POLICY in the handshake); the text
    /// says who lacks what.
    #[error("{0}")]
    Denied(String),
}

/// Who is asking, as far as the server knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientId {
    /// The identity the client proved in the TLS handshake (its TLS-PSK identity); `None`
    /// without TLS, when the server trusts every client that can reach it.
    pub identity: Option<String>,
    /// The client's address, for logs.
    pub addr: String,
}

/// An export opened for one client.
pub struct Opened<X> {
    /// The export.
    pub export: Arc<X>,
    /// The client may only read (NBD_FLAG_READ_ONLY; writes fail with EPERM).
    pub read_only: bool,
}

/// One run of an export's allocation map, for NBD_CMD_BLOCK_STATUS (base:allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length in bytes (> 0).
    pub len: u32,
    /// The range is not allocated (NBD_STATE_HOLE).
    pub hole: bool,
    /// The range reads as zeros (NBD_STATE_ZERO).
    pub zero: bool,
}

/// One run of a dirty bitmap (`qemu:dirty-bitmap:NAME`), for NBD_CMD_BLOCK_STATUS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dirty {
    /// Length in bytes (> 0).
    pub len: u32,
    /// The range changed since the bitmap's point.
    pub dirty: bool,
}

/// One block device served by name.
///
/// Every method may be called concurrently from many connections; an implementation is safe for
/// multi-conn when a write acknowledged on one connection is visible to reads on every other.
pub trait Export: Send + Sync + 'static {
    /// Size in bytes, fixed for the life of a connection.
    fn size(&self) -> u64;

    /// Whether writes acknowledged to one connection are seen by all others, and a FLUSH on any
    /// connection covers writes acknowledged on all of them (NBD_FLAG_CAN_MULTI_CONN).
    fn multi_conn(&self) -> bool;

    /// Reads `len` bytes at `offset` (the server has checked the range is inside the export).
    fn read(
        &self,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Vec<u8>, ExportError>> + Send;

    /// Writes `data` at `offset`. With `fua`, returns only once the data is durable.
    fn write(
        &self,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    ) -> impl Future<Output = Result<(), ExportError>> + Send;

    /// Returns once every write acknowledged before the call is durable.
    fn flush(&self) -> impl Future<Output = Result<(), ExportError>> + Send;

    /// Discards a range: afterwards it reads as zeros or as its old contents (the export
    /// chooses); space may be freed.
    fn trim(&self, offset: u64, len: u32) -> impl Future<Output = Result<(), ExportError>> + Send;

    /// Makes a range read as zeros. `may_punch` (no NBD_CMD_FLAG_NO_HOLE) lets the export free
    /// the space; `fast` (NBD_CMD_FLAG_FAST_ZERO) asks it to fail with `NotSupported` rather than
    /// do it slower than a write of zeros would be.
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_punch: bool,
        fast: bool,
        fua: bool,
    ) -> impl Future<Output = Result<(), ExportError>> + Send;

    /// The allocation map of `offset..offset+len`: extents in order, starting at `offset`,
    /// covering at least one byte and at most `len` bytes.
    fn block_status(
        &self,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Vec<Extent>, ExportError>> + Send;

    /// The dirty map of bitmap `name` (the leaf of a `qemu:dirty-bitmap:NAME` context the
    /// export set offered, [`Exports::meta_contexts`]) over `offset..offset+len`: runs in
    /// order, starting at `offset`, covering at least one byte and at most `len` bytes.
    fn dirty_status(
        &self,
        name: &str,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Vec<Dirty>, ExportError>> + Send {
        let _ = (name, offset, len);
        async {
            Err(ExportError::Invalid(
                "this export has no dirty bitmaps".into(),
            ))
        }
    }
}

/// The set of exports a server offers, looked up by name at each connection's handshake.
pub trait Exports: Send + Sync + 'static {
    /// The export type [`open`](Exports::open) hands out.
    type Export: Export;

    /// Names (and optional one-line descriptions) for NBD_OPT_LIST: only those `client` may
    /// open.
    fn list(
        &self,
        client: &ClientId,
    ) -> impl Future<Output = Result<Vec<(String, String)>, ExportError>> + Send;

    /// Opens an export by name for `client`; `Ok(None)` when there is none, `Denied` when the
    /// client may not open it. The empty name is the default export (if the implementation
    /// has one).
    fn open(
        &self,
        name: &str,
        client: &ClientId,
    ) -> impl Future<Output = Result<Option<Opened<Self::Export>>, ExportError>> + Send;

    /// Metadata contexts export `name` offers besides base:allocation (full names, e.g.
    /// `qemu:dirty-bitmap:monday`), for NBD_OPT_LIST/SET_META_CONTEXT; none by default.
    fn meta_contexts(
        &self,
        name: &str,
        client: &ClientId,
    ) -> impl Future<Output = Vec<String>> + Send {
        let _ = (name, client);
        async { Vec::new() }
    }
}
