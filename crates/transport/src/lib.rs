//! cairn-transport: the one connection layer every Cairn link uses (client to OSD, OSD to
//! OSD, anyone to monitor, monitor to monitor).
//!
//! - [`dial`]: connect from a chosen address, handshake, check the peer's kind, in one
//!   deadline ([`Dialer`]); servers run [`accept`] on what they accept.
//! - [`handshake`]: the hello exchange with version negotiation and mutual authentication
//!   ([`initiate`] on the dialing side, [`accept`] on the serving side).
//! - [`session`]: request/reply multiplexing with deadlines and typed refusals ([`Session`]).
//! - [`sender`]: frame sending from any thread, batched per event-loop turn, with
//!   backpressure, on connections that may still be opening ([`FrameSender`]).
//! - [`tickets`]: the OSD's verifier of tickets ([`TicketVerifier`]).
//! - [`limits`]: connection caps and idle limits for servers ([`Admission`], [`ConnReader`]).
//! - [`load`]: caps on the requests (and bytes) in flight per connection ([`ConnLoad`]).
//! - [`recv`]: a connection's receive buffer; [`copies`]: what connections copy in memory.
//! - [`frames`]: reading frames (the reader that runs is checked against the fuzzed
//!   `cairn_proto::Decoder`).
//!
//! The framing itself (sans I/O) is `cairn_proto`; the protocol is in `docs/format/wire.md`.

pub mod copies;
pub mod dial;
pub mod frames;
pub mod handshake;
pub mod limits;
pub mod load;
pub mod net;
mod queue;
pub mod recv;
pub mod sender;
pub mod session;
pub mod tickets;

pub use cairn_auth::FrameMode;
pub use copies::CopyTally;
pub use dial::{Connected, DialError, Dialer};
pub use frames::{
    check_readers_agree, encode_parts, frame_buffered, frame_buffered_with, read_frame,
    read_guarded, seal_encoded, write_frame, write_guarded, ReadError, READ_BUFFER,
};
pub use handshake::ready as ready_credentials;
pub use handshake::{
    accept, initiate, initiate_with, kind_of, node_kind, split_guards, Accepted, AllowNone, Auth,
    Authenticator, Credentials, CredentialsFuture, Fixed, Guards, HandshakeError, Initiated, Known,
    NoAuth, NoCredentials, Peer, Verifier, VerifyError, HANDSHAKE_TIMEOUT,
};
pub use limits::{Admission, Admitted, ConnLimits, ConnReader};
pub use load::{ConnLoad, RequestLimits, RequestTicket, REQUEST_OVERHEAD};
pub use recv::RecvBuf;
pub use sender::{begin_batch, end_batch, FrameSender, SendClosed};
pub use session::{CallError, Reply, Session};
pub use tickets::TicketVerifier;
