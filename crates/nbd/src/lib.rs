//! NBD server (newstyle fixed handshake, structured replies, block status) over any
//! [`Exports`]. See docs/format/nbd.md.

mod export;

pub use export::{Export, ExportError, Exports, Extent};
