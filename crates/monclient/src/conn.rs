//! Connections to monitors, through the transport layer: a multiplexed
//! [`cairn_transport::Session`] for requests, and a dedicated stream for a subscription (one
//! request, many pushes). Every connection is dialed as a client; the peer must answer as a
//! monitor.

use cairn_proto::{Frame, Limits};
use cairn_transport::{
    node_kind, read_guarded, write_guarded, Auth, Dialer, FrameMode, ReadError, Session,
};
use std::time::Duration;
use tokio::io::BufReader;
use tokio::net::tcp::OwnedWriteHalf;

/// Limits for frames from monitors: a full map travels in a control part and can exceed the
/// default 1 MiB on large clusters.
pub(crate) fn limits() -> Limits {
    Limits {
        max_control: 256 << 20,
        max_data: 1 << 20,
    }
}

/// How connections are made: from which local address (`None`: the system's choice), with
/// which credentials.
#[derive(Clone)]
pub(crate) struct Source {
    pub from: Option<std::net::IpAddr>,
    pub auth: Auth,
    /// The frame protection asked for.
    pub frames: FrameMode,
}

fn dialer(timeout: Duration, from: &Source) -> Dialer {
    Dialer::new(node_kind::CLIENT, from.auth.clone())
        .from(from.from)
        .timeout(timeout)
        .frames(from.frames)
}

/// Opens a request session to the monitor at `addr` (connect and handshake within
/// `timeout`).
pub(crate) async fn open(
    addr: &str,
    timeout: Duration,
    from: &Source,
) -> Result<Session, cairn_transport::DialError> {
    Session::open(&dialer(timeout, from), addr, node_kind::MON, limits()).await
}

/// Why a subscription ended.
#[derive(Debug)]
pub(crate) struct Ended {
    pub why: String,
    /// The monitor refused this client (its credentials or caps): trying again soon cannot
    /// help.
    pub refused: bool,
}

impl From<String> for Ended {
    fn from(why: String) -> Ended {
        Ended {
            why,
            refused: false,
        }
    }
}

/// A dedicated subscription stream (not multiplexed): `follow` reads its pushes directly.
pub(crate) struct Stream {
    rd: BufReader<tokio::net::tcp::OwnedReadHalf>,
    _wr: OwnedWriteHalf,
    opener: Option<cairn_auth::Opener>,
}

impl Stream {
    /// Connects, handshakes (bounded by `timeout`) and sends one request.
    pub(crate) async fn open(
        addr: &str,
        (timeout, from): (Duration, &Source),
        msg_type: u16,
        rid: u64,
        control: &[u8],
    ) -> Result<Stream, Ended> {
        let c = dialer(timeout, from)
            .dial(addr, node_kind::MON)
            .await
            .map_err(|e| Ended {
                refused: e.is_refusal(),
                why: e.to_string(),
            })?;
        let (mut sealer, opener) = cairn_transport::split_guards(c.guards);
        let (rd, mut wr) = c.stream.into_split();
        write_guarded(&mut wr, (msg_type, rid, control, &[]), sealer.as_mut())
            .await
            .map_err(|e| Ended::from(format!("{addr}: sending: {e}")))?;
        Ok(Stream {
            rd: BufReader::new(rd),
            _wr: wr,
            opener,
        })
    }

    /// The next frame, or why the stream ended.
    pub(crate) async fn next(&mut self) -> Result<Frame, ReadError> {
        read_guarded(&mut self.rd, &limits(), self.opener.as_mut()).await
    }
}
