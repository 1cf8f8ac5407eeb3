//! NBD_OPT_STARTTLS: TLS with pre-shared keys (TLS-PSK), as QEMU (`tls-creds-psk`), libnbd
//! (`nbds://USER@HOST/EXPORT?tls-psk-file=FILE`) and nbdkit speak it, and optionally with
//! X.509 certificates on both sides (QEMU's `tls-creds-x509`, libnbd's
//! `tls-certificates=DIR`). The PSK identity is the user name; the server looks its key up in
//! a [`PskKeys`]. A client certificate, verified against the configured CA, names its user
//! in its subject's common name. Either way the proven identity goes to
//! [`Exports`](crate::Exports) so that it can decide what the user may open.
//!
//! TLS itself is OpenSSL's (the system library): TLS 1.3, or TLS 1.2 with forward-secret AEAD
//! suites only; no session tickets.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openssl::ex_data::Index;
use openssl::nid::Nid;
use openssl::ssl::{
    Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslRef,
    SslSessionCacheMode, SslVerifyMode, SslVersion,
};
use openssl::x509::X509Ref;
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
/// TLS 1.2 suites added with certificates: ECDHE with AEAD only.
const TLS12_CERT_CIPHERS: &str = "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:\
ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:\
ECDHE-RSA-CHACHA20-POLY1305";

/// The PEM files of X.509 authentication.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The server's certificate (and the chain to its CA, if any), as clients will verify it
    /// (its names must include the host name or address clients connect to).
    pub cert_chain: PathBuf,
    /// The server certificate's private key.
    pub key: PathBuf,
    /// The CA certificates client certificates must be issued by.
    pub client_ca: PathBuf,
}

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
    /// A certificate, key or CA file could not be loaded.
    #[error("cannot load the TLS {what} from {path}: {reason}")]
    Files {
        /// Which file: certificate chain, private key, client CA.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// OpenSSL's account.
        reason: String,
    },
    /// The client's certificate verified, but does not name one user
    /// ([`CertNameError`]).
    #[error("TLS handshake failed: {0}")]
    Certificate(#[from] CertNameError),
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
        let (b, identity) = builder(keys, TLS12_PSK_CIPHERS)?;
        Ok(TlsServer {
            ctx: b.build(),
            identity,
        })
    }

    /// A server that authenticates users by pre-shared key or by a client certificate
    /// issued by `files.client_ca` (the user is its subject's common name), and proves
    /// itself with `files.cert_chain`.
    pub fn with_certificates(
        keys: Arc<dyn PskKeys>,
        files: &CertFiles,
    ) -> Result<TlsServer, TlsError> {
        let ciphers = format!("{TLS12_PSK_CIPHERS}:{TLS12_CERT_CIPHERS}");
        let (mut b, identity) = builder(keys, &ciphers)?;
        let load = |what, path: &Path, r: Result<(), openssl::error::ErrorStack>| {
            r.map_err(|e| TlsError::Files {
                what,
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        };
        let chain = &files.cert_chain;
        load(
            "certificate chain",
            chain,
            b.set_certificate_chain_file(chain),
        )?;
        let key = &files.key;
        load(
            "private key",
            key,
            b.set_private_key_file(key, SslFiletype::PEM),
        )?;
        load("private key", key, b.check_private_key())?;
        let ca = &files.client_ca;
        load("client CA", ca, b.set_ca_file(ca))?;
        // Asked for and verified when sent; a client with neither a certificate nor a PSK
        // completes no session (`accept` finds no identity).
        b.set_verify(SslVerifyMode::PEER);
        // OpenSSL treats a TLS 1.3 PSK as a resumed session, which needs a context once
        // client certificates are verified (no session is ever cached: `builder`).
        b.set_session_id_context(b"cairn-nbd")?;
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
        let ssl = tls.ssl();
        // The identity the PSK callback saw counts only if the session was keyed with its
        // key: a TLS 1.3 client may offer a PSK the server cannot use and go on with a
        // certificate handshake.
        if psk_used(ssl) {
            return match claimed {
                Some(identity) => Ok((tls, identity)),
                None => Err(TlsError::Handshake {
                    identity: None,
                    reason: "a pre-shared key was used without an identity".into(),
                }),
            };
        }
        if ssl.verify_result() != openssl::x509::X509VerifyResult::OK {
            return Err(TlsError::Handshake {
                identity: None,
                reason: format!(
                    "the client certificate did not verify: {}",
                    ssl.verify_result()
                ),
            });
        }
        // No PSK: a certificate, which OpenSSL verified against the client CA.
        match ssl.peer_certificate().as_deref().map(common_name) {
            Some(Ok(name)) => Ok((tls, name)),
            Some(Err(e)) => Err(TlsError::Certificate(e)),
            None => Err(TlsError::Handshake {
                identity: None,
                reason: "the client used neither a pre-shared key nor a certificate".into(),
            }),
        }
    }
}

/// An OpenSSL server context with what both kinds of authentication share.
fn builder(
    keys: Arc<dyn PskKeys>,
    tls12_ciphers: &str,
) -> Result<(SslContextBuilder, Index<Ssl, String>), TlsError> {
    let identity = Ssl::new_ex_index::<String>()?;
    let mut b = SslContext::builder(SslMethod::tls_server())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_cipher_list(tls12_ciphers)?;
    // SHA-256 suites first, and the server's order decides (CIPHER_SERVER_PREFERENCE): a TLS
    // 1.3 PSK from the callback is bound to SHA-256, and a session that picked a SHA-384
    // suite would not use it (and with a certificate configured, fall back to a certificate
    // handshake the PSK client cannot do).
    b.set_ciphersuites(
        "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384",
    )?;
    // No session tickets and no session cache: each connection proves its key or
    // certificate afresh (a resumed session would skip both).
    b.set_options(SslOptions::NO_TICKET | SslOptions::CIPHER_SERVER_PREFERENCE);
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    b.set_psk_server_callback(move |ssl, id, out| Ok(lookup(&*keys, ssl, identity, id, out)));
    Ok((b, identity))
}

/// Whether the session was keyed with a pre-shared key: an external PSK in TLS 1.3 (shown as
/// a resumption, since tickets and the session cache are off), a PSK suite in TLS 1.2.
fn psk_used(ssl: &SslRef) -> bool {
    match ssl.version2() {
        Some(SslVersion::TLS1_3) => ssl.session_reused(),
        _ => ssl
            .current_cipher()
            .is_some_and(|c| c.name().contains("PSK")),
    }
}

/// Why a verified client certificate names no user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertNameError {
    /// None, or several, common names in its subject.
    #[error("the client certificate's subject has no single common name")]
    NotOne,
    /// The common name is not UTF-8.
    #[error("the client certificate's common name is not UTF-8: {0}")]
    NotUtf8(std::str::Utf8Error),
    /// The common name holds a NUL byte (refused, never cut short).
    #[error("the client certificate's common name holds a NUL byte")]
    Nul,
    /// The common name is empty or over [`MAX_IDENTITY_LEN`] bytes.
    #[error(
        "the client certificate's common name is empty or longer than {MAX_IDENTITY_LEN} bytes"
    )]
    Length,
}

/// The user a verified client certificate names: its subject's one common name, within the
/// identity limits.
fn common_name(cert: &X509Ref) -> Result<String, CertNameError> {
    let mut names = cert.subject_name().entries_by_nid(Nid::COMMONNAME);
    let (Some(cn), None) = (names.next(), names.next()) else {
        return Err(CertNameError::NotOne);
    };
    // The raw bytes, taken whole: a name with a NUL in it is refused, never cut short.
    let name = std::str::from_utf8(cn.data().as_slice())
        .map_err(CertNameError::NotUtf8)?
        .to_string();
    if name.contains('\0') {
        return Err(CertNameError::Nul);
    }
    if name.is_empty() || name.len() > MAX_IDENTITY_LEN {
        return Err(CertNameError::Length);
    }
    Ok(name)
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

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::x509::{X509Builder, X509NameBuilder, X509};

    fn cert_named(cns: &[&str]) -> X509 {
        let mut name = X509NameBuilder::new().expect("name");
        name.append_entry_by_text("O", "cairn").expect("O");
        for cn in cns {
            name.append_entry_by_nid(Nid::COMMONNAME, cn).expect("CN");
        }
        let mut b = X509Builder::new().expect("builder");
        b.set_subject_name(&name.build()).expect("subject");
        b.build()
    }

    #[test]
    fn a_certificate_names_its_user_by_one_common_name() {
        assert_eq!(
            common_name(&cert_named(&["client.alice"])),
            Ok("client.alice".into())
        );
        let refused = [
            (vec![], CertNameError::NotOne, "no single common name"),
            (
                vec!["client.alice", "client.admin"],
                CertNameError::NotOne,
                "no single common name",
            ),
            (vec!["client.admin\0.evil"], CertNameError::Nul, "NUL"),
        ];
        for (cns, want, why) in refused {
            let err = common_name(&cert_named(&cns)).expect_err("refused");
            assert_eq!(err, want, "{cns:?}");
            assert!(err.to_string().contains(why), "{cns:?}: {err}");
        }
        // OpenSSL itself refuses a common name over 64 bytes (ub-common-name), below the
        // identity limit, so that check cannot be reached with a certificate built here.
        assert!(X509NameBuilder::new()
            .expect("name")
            .append_entry_by_nid(Nid::COMMONNAME, &"x".repeat(MAX_IDENTITY_LEN + 1))
            .is_err());
    }
}
