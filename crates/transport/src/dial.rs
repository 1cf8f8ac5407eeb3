//! Opening a connection: connect (from a chosen local address), handshake and authenticate,
//! check that the peer is the kind of node the caller wanted, all within one deadline.

use crate::handshake::{
    initiate_with, kind_of, node_kind, Auth, Credentials, Guards, HandshakeError,
};
use cairn_auth::FrameMode;
use std::net::IpAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// How connections are opened: as which kind of node, with which credentials, from which
/// address, how patiently.
#[derive(Clone)]
pub struct Dialer {
    /// The kind this side says it is in the handshake.
    pub kind: u8,
    /// Where the credentials for each peer come from.
    pub auth: Auth,
    /// Local address to connect from (`None`: the system's choice).
    pub from: Option<IpAddr>,
    /// Connect and handshake together must finish within this.
    pub timeout: Duration,
    /// The frame protection asked for (the peer may require more).
    pub frames: FrameMode,
}

/// A connection after its handshake: the stream, and the guards of its frames when they are
/// protected (every frame sent must be sealed and every frame read opened with them).
#[derive(Debug)]
pub struct Connected {
    pub stream: TcpStream,
    pub guards: Guards,
}

/// Why a connection could not be opened. Every variant names the address.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("{addr}: handshake: {source}")]
    Handshake {
        addr: String,
        source: HandshakeError,
    },
    #[error("{addr}: handshake: the peer is not a {} (it says it is a {}); check the address", node_kind::name(*want), node_kind::name(*got))]
    WrongPeer { addr: String, want: u8, got: u8 },
    #[error("{addr}: connecting timed out after {after:?}")]
    Timeout { addr: String, after: Duration },
    #[error("{addr}: no credentials for a {}: {why}", node_kind::name(*kind))]
    NoCredentials {
        addr: String,
        kind: u8,
        why: String,
        /// The monitors refused them (see [`crate::NoCredentials::refused`]).
        refused: bool,
    },
}

impl DialError {
    /// The peer refused our credentials (retrying with the same ones will not help).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            DialError::Handshake {
                source: HandshakeError::Refused(_)
                    | HandshakeError::PeerProof(_)
                    | HandshakeError::Unauthenticated,
                ..
            } | DialError::NoCredentials { refused: true, .. }
        )
    }
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("kind", &self.kind)
            .field("from", &self.from)
            .field("timeout", &self.timeout)
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}

impl Dialer {
    /// Dials as a node of `kind` with credentials from `auth`, from the system's choice of
    /// address, within 5 s.
    pub fn new(kind: u8, auth: Auth) -> Dialer {
        Dialer {
            kind,
            auth,
            from: None,
            timeout: Duration::from_secs(5),
            frames: FrameMode::Plain,
        }
    }

    /// Asks for frame protection `frames` at least.
    pub fn frames(self, frames: FrameMode) -> Dialer {
        Dialer { frames, ..self }
    }

    /// Connects from `from` when given.
    pub fn from(self, from: Option<IpAddr>) -> Dialer {
        Dialer { from, ..self }
    }

    /// Gives up after `timeout`.
    pub fn timeout(self, timeout: Duration) -> Dialer {
        Dialer { timeout, ..self }
    }

    /// Connects to `addr` and shakes hands; the peer must say it is a node of kind `expect`.
    pub async fn dial(&self, addr: &str, expect: u8) -> Result<Connected, DialError> {
        let creds = self
            .auth
            .credentials(expect)
            .await
            .map_err(|e| DialError::NoCredentials {
                addr: addr.to_string(),
                kind: expect,
                why: e.why,
                refused: e.refused,
            })?;
        // An authenticated peer is the kind its entity is (an OSD's monitor client is an OSD).
        let kind = match &creds {
            Credentials::Key { entity, .. } | Credentials::Ticket { entity, .. } => kind_of(entity),
            Credentials::None => self.kind,
        };
        let open = async {
            let mut s = crate::net::connect(addr, self.from)
                .await
                .map_err(|source| DialError::Connect {
                    addr: addr.to_string(),
                    source,
                })?;
            // Requests and replies are small and latency-bound: no Nagle delay.
            let _ = s.set_nodelay(true);
            let done = initiate_with(&mut s, kind, &creds, self.frames)
                .await
                .map_err(|source| DialError::Handshake {
                    addr: addr.to_string(),
                    source,
                })?;
            let hello = done.hello;
            if hello.node_kind != expect {
                return Err(DialError::WrongPeer {
                    addr: addr.to_string(),
                    want: expect,
                    got: hello.node_kind,
                });
            }
            Ok(Connected {
                stream: s,
                guards: done.guards,
            })
        };
        tokio::time::timeout(self.timeout, open)
            .await
            .map_err(|_| DialError::Timeout {
                addr: addr.to_string(),
                after: self.timeout,
            })?
    }
}
