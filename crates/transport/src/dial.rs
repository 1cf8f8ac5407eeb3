//! Opening a connection: connect (from a chosen local address), handshake, check that the
//! peer is the kind of node the caller wanted, all within one deadline.

use crate::handshake::{handshake, node_kind, HandshakeError};
use std::net::IpAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// How connections are opened: as which kind of node, from which address, how patiently.
#[derive(Debug, Clone, Copy)]
pub struct Dialer {
    /// The kind this side says it is in the handshake.
    pub kind: u8,
    /// Local address to connect from (`None`: the system's choice).
    pub from: Option<IpAddr>,
    /// Connect and handshake together must finish within this.
    pub timeout: Duration,
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
}

impl Dialer {
    /// Dials as a node of `kind`, from the system's choice of address, within 5 s.
    pub fn new(kind: u8) -> Dialer {
        Dialer {
            kind,
            from: None,
            timeout: Duration::from_secs(5),
        }
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
    pub async fn dial(&self, addr: &str, expect: u8) -> Result<TcpStream, DialError> {
        let open = async {
            let mut s = crate::net::connect(addr, self.from)
                .await
                .map_err(|source| DialError::Connect {
                    addr: addr.to_string(),
                    source,
                })?;
            // Requests and replies are small and latency-bound: no Nagle delay.
            let _ = s.set_nodelay(true);
            let (hello, _version) =
                handshake(&mut s, self.kind)
                    .await
                    .map_err(|source| DialError::Handshake {
                        addr: addr.to_string(),
                        source,
                    })?;
            if hello.node_kind != expect {
                return Err(DialError::WrongPeer {
                    addr: addr.to_string(),
                    want: expect,
                    got: hello.node_kind,
                });
            }
            Ok(s)
        };
        tokio::time::timeout(self.timeout, open)
            .await
            .map_err(|_| DialError::Timeout {
                addr: addr.to_string(),
                after: self.timeout,
            })?
    }
}
