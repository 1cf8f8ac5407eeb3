//! The handshake every connection starts with: both sides send their [`Hello`] first (so
//! neither waits for the other), then read the peer's and agree on a frame layout version.
//! The `auth_method`/`auth` slot of the hello is where authentication goes; until it is
//! filled, every hello says "none".

use cairn_proto::{negotiate, Hello, AUTH_MAX, HELLO_LEN};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a handshake may take: a peer that connects and stays silent is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a connection's handshake failed. Messages carry no "handshake" prefix: callers say
/// where it failed ("{addr}: handshake: {e}").
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Hello(#[from] cairn_proto::HelloError),
    #[error("timed out")]
    Timeout,
}

/// Node kinds in the handshake.
pub mod node_kind {
    pub const CLIENT: u8 = 1;
    pub const OSD: u8 = 2;
    pub const MON: u8 = 3;

    /// A kind's name, for messages.
    pub fn name(kind: u8) -> &'static str {
        match kind {
            CLIENT => "client",
            OSD => "OSD",
            MON => "monitor",
            _ => "unknown node kind",
        }
    }
}

/// Exchanges handshakes on a new connection as a node of `kind`, within
/// [`HANDSHAKE_TIMEOUT`]; returns the peer's hello and the negotiated frame layout version.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    kind: u8,
) -> Result<(Hello, u8), HandshakeError> {
    let fut = async {
        let ours = Hello::ours(kind);
        s.write_all(&ours.encode()?).await?;
        let mut head = [0u8; HELLO_LEN];
        s.read_exact(&mut head).await?;
        // The auth length is checked by decode before the bytes are kept: read at most one
        // byte past the limit so decode sees the violation.
        let auth_len = (u16::from_le_bytes([head[8], head[9]]) as usize).min(AUTH_MAX + 1);
        let mut all = head.to_vec();
        if auth_len <= AUTH_MAX {
            all.resize(HELLO_LEN + auth_len, 0);
            s.read_exact(&mut all[HELLO_LEN..]).await?;
        }
        let (theirs, _) = Hello::decode(&all)?;
        let v = negotiate(&ours, &theirs)?;
        Ok::<_, HandshakeError>((theirs, v))
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, fut)
        .await
        .map_err(|_| HandshakeError::Timeout)?
}
