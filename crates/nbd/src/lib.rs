//! NBD server (newstyle fixed handshake, structured replies, block status) over any
//! [`Exports`]. See docs/format/nbd.md.
//!
//! Layout: the byte-level protocol is pure code over slices, shared with the fuzzers —
//! [`proto`] (constants, request parsing, reply encoding), [`handshake`] (option haggling as a
//! state machine), [`command`] (request validation). The async parts drive them: `conn` (one
//! connection), `transmission` (reader, per-command tasks, writer) and `server` (accept loop).

#![warn(missing_docs)]

mod conn;
mod exec;
mod export;
mod server;
mod tls;
mod transmission;
mod unwind;

pub mod command;
pub mod handshake;
pub mod option_data;
pub mod proto;

pub use conn::{ConnError, HANDSHAKE_TIMEOUT};
pub use export::{ClientId, Dirty, Export, ExportError, Exports, Extent, Opened};
pub use handshake::MetaContext;
pub use server::{serve, serve_connection, MAX_CONNECTIONS, SHUTDOWN_GRACE};
pub use tls::{
    CertFiles, CertNameError, PskKeys, TlsError, TlsServer, MAX_IDENTITY_LEN, MAX_PSK_LEN,
};
pub use transmission::{MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES};
