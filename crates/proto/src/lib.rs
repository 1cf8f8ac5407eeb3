//! cairn-proto: the wire framing every Cairn connection uses (client <-> OSD, OSD <-> OSD,
//! anyone <-> monitor). Sans-I/O: encoders write into buffers and [`Decoder`] consumes bytes
//! as they arrive, so the same code serves blocking sockets, tokio and the fuzzers.
//!
//! A frame is a fixed header, a control part (a message encoded by the message layer) and a
//! raw data part (object bytes, never re-encoded):
//!
//! ```text
//! offset size field
//!  0     4    magic        "CRNP"
//!  4     1    version      protocol version of the frame layout (PROTOCOL_VERSION)
//!  5     1    flags        reserved, 0
//!  6     2    msg_type     what the control part holds
//!  8     8    request_id   matches replies to requests (many in flight per connection)
//! 16     4    control_len  bytes of control part
//! 20     4    data_len     bytes of raw data part
//! 24     4    body_crc     crc32c of control then data
//! 28     4    header_crc   crc32c of bytes 0..28
//! 32          control, then data
//! ```
//!
//! All integers are little-endian. Lengths are checked against [`Limits`] before anything is
//! allocated. Format details and the handshake: `docs/format/wire.md`.

pub mod auth;
mod frame;
mod hello;
pub mod msg;

pub use frame::{
    body_crc, clear_body_crc, Decoder, Frame, FrameError, FrameHeader, Limits, HEADER_LEN, MAGIC,
};
pub use hello::{negotiate, Hello, HelloError, AUTH_MAX, AUTH_NONE, HELLO_LEN};

/// Version of the protocol (frame layout and messages) written by this build; the history is
/// in `docs/format/wire.md`.
pub const PROTOCOL_VERSION: u8 = 12;
/// Oldest protocol version this build reads. Message changes are not compatible, so this
/// is the current version: a peer of another version is refused at the handshake, with an
/// error that names both ranges, instead of misreading messages.
pub const MIN_PROTOCOL_VERSION: u8 = 12;
