//! NBD_OPT_STARTTLS: TLS with pre-shared keys (TLS-PSK), as QEMU (`tls-creds-psk`), libnbd
//! (`nbds://USER@HOST/EXPORT?tls-psk-file=FILE`) and nbdkit speak it. The PSK identity is the
//! user name; the server looks its key up in a [`PskKeys`] and hands the proven identity to
//! [`Exports`](crate::Exports) so that it can decide what the user may open.
//!
//! TLS itself is OpenSSL's (the system library): TLS 1.3, or TLS 1.2 with (EC)DHE-PSK AEAD
//! suites; no certificates.

use std::sync::Arc;

use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslContext, SslMethod, SslOptions, SslRef, SslVersion};
use tokio::io::{AsyncRead, AsyncWrite, BufStream};
use tokio_openssl::SslStream;

/// Bytes of TLS records buffered on the socket each way (four full records).
const RECORD_BUFFER: usize = 64 << 10;
use tracing::warn;

/// Longest PSK identity accepted, in bytes.
pub const MAX_IDENTITY_LEN: usize = 128;
/// Longest pre-shared key, in bytes (OpenSSL's own limit).
pub const MAX_PSK_LEN: usize = 256;
/// TLS 1.2 suites offered: PSK with forward secrecy and AEAD only.
const TLS12_PSK_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:\
DHE-PSK-AES128-GCM-SHA256:DHE-PSK-CHACHA20-POLY1305";

/// Where the server finds each user's pre-shared key. Called during the TLS handshake, so
/// it must answer at once (no I/O): keep the keys in memory.
pub trait PskKeys: Send + Sync + 'static {
    /// The key of `identity`, or `None` for an unknown user (the handshake then fails).
    fn psk(&self, identity: &str) -> Option<Vec<u8>>;
}

/// Why TLS could not be set up or the handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// OpenSSL refused the server's own settings (a bug or a broken system library).
    #[error("cannot set up TLS: {0}")]
    Setup(#[from] openssl::error::ErrorStack),
    /// The client's TLS handshake failed: unknown user, wrong key, or not TLS at all.
    #[error("TLS handshake failed{}: {reason}", .identity.as_deref().map(|i| format!(" for {i:?}")).unwrap_or_default())]
    Handshake {
        /// The identity the client claimed, if it got that far.
        identity: Option<String>,
        /// OpenSSL's account.
        reason: String,
    },
}

/// The TLS side of an NBD server.
pub struct TlsServer {
    ctx: SslContext,
    identity: Index<Ssl, String>,
}

impl TlsServer {
    /// A server that authenticates users by pre-shared key.
    pub fn psk(keys: Arc<dyn PskKeys>) -> Result<TlsServer, TlsError> {
        let identity = Ssl::new_ex_index::<String>()?;
        let mut b = SslContext::builder(SslMethod::tls_server())?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
        b.set_cipher_list(TLS12_PSK_CIPHERS)?;
        // No session tickets: each connection proves its key afresh.
        b.set_options(SslOptions::NO_TICKET);
        b.set_psk_server_callback(move |ssl, id, out| Ok(lookup(&*keys, ssl, identity, id, out)));
        Ok(TlsServer {
            ctx: b.build(),
            identity,
        })
    }

    /// Runs the server side of the TLS handshake on `stream`; returns the secure stream and
    /// the identity the client proved.
    ///
    /// The records go through a buffer on the socket: OpenSSL writes each record (and reads
    /// each record's header and body) with its own call, so without it a batch of replies
    /// costs a syscall per record; with it, one per flush (the reply writer flushes once
    /// per batch, OpenSSL at the end of each handshake flight).
    pub async fn accept<S>(&self, stream: S) -> Result<(SslStream<BufStream<S>>, String), TlsError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let ssl = Ssl::new(&self.ctx)?;
        let buffered = BufStream::with_capacity(RECORD_BUFFER, RECORD_BUFFER, stream);
        let mut tls = SslStream::new(ssl, buffered)?;
        let done = std::pin::Pin::new(&mut tls).accept().await;
        let claimed = tls.ssl().ex_data(self.identity).cloned();
        if let Err(e) = done {
            return Err(TlsError::Handshake {
                identity: claimed,
                reason: e.to_string(),
            });
        }
        match claimed {
            Some(identity) => Ok((tls, identity)),
            // A handshake cannot succeed without the PSK callback having run.
            None => Err(TlsError::Handshake {
                identity: None,
                reason: "no pre-shared key was used".into(),
            }),
        }
    }
}

/// The PSK callback: copies the key of the claimed identity into `out` and returns its
/// length, 0 for an unknown or malformed identity (OpenSSL then fails the handshake).
fn lookup(
    keys: &dyn PskKeys,
    ssl: &mut SslRef,
    index: Index<Ssl, String>,
    id: Option<&[u8]>,
    out: &mut [u8],
) -> usize {
    let Some(name) = id
        .filter(|i| !i.is_empty() && i.len() <= MAX_IDENTITY_LEN)
        .and_then(|i| std::str::from_utf8(i).ok())
    else {
        warn!("nbd: TLS client sent no usable PSK identity");
        return 0;
    };
    ssl.set_ex_data(index, name.to_string());
    match keys.psk(name) {
        Some(key) if !key.is_empty() && key.len() <= out.len().min(MAX_PSK_LEN) => {
            out[..key.len()].copy_from_slice(&key);
            key.len()
        }
        Some(_) => {
            warn!(identity = name, "nbd: pre-shared key of unusable length");
            0
        }
        None => {
            warn!(
                identity = name,
                "nbd: TLS client with an unknown PSK identity"
            );
            0
        }
    }
}
