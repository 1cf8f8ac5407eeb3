//! One connection: the handshake (driving [`Negotiation`] over the socket, looking exports
//! up), then the transmission phase.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tracing::debug;

use crate::command::Session;
use crate::export::{Export, Exports};
use crate::handshake::{Admit, ExportInfo, HandshakeError, Negotiation, Outcome};
use crate::proto::{greeting, parse_option_header, ProtoError, OPTION_HEADER_LEN};
use crate::transmission;

/// A client gets this long to finish option haggling (an idle half-open handshake would
/// otherwise hold its connection forever).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a connection ended other than by the client's clean disconnect.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Socket error (often just the client going away).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// Bytes that are not NBD (bad magic).
    #[error("protocol error: {0}")]
    Proto(#[from] ProtoError),
    /// The handshake failed (bad flags, unknown export for NBD_OPT_EXPORT_NAME, limits).
    #[error("handshake failed: {0}")]
    Handshake(#[from] HandshakeError),
    /// Option haggling took longer than [`HANDSHAKE_TIMEOUT`].
    #[error("handshake not finished within {0:?}")]
    HandshakeTimeout(Duration),
    /// A request the stream cannot continue after (e.g. an oversized write payload).
    #[error("bad request (type {kind}, length {len}): {reason}")]
    Request {
        /// Why.
        reason: &'static str,
        /// The command type.
        kind: u16,
        /// Its length field.
        len: u32,
    },
    /// The client closed the connection in the middle of a write payload; the write was not
    /// executed.
    #[error("client disconnected in the middle of a write payload (write not executed)")]
    TruncatedPayload,
    /// A bug in the server.
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl ConnError {
    /// Whether the client broke the protocol (logged as a warning) rather than just went away.
    pub fn is_protocol_violation(&self) -> bool {
        !matches!(self, ConnError::Io(_) | ConnError::TruncatedPayload)
    }
}

/// How a connection ended cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// NBD_OPT_ABORT during the handshake.
    Abort,
    /// NBD_CMD_DISC.
    Disconnect,
    /// The client closed the socket between requests.
    Eof,
    /// The server is shutting down.
    Shutdown,
}

enum Negotiated<X> {
    Abort,
    Go(Session, Arc<X>),
}

/// Runs a whole connection: handshake, then transmission until it ends.
pub(crate) async fn run<E, S>(
    stream: S,
    exports: Arc<E>,
    peer: Arc<str>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<End, ConnError>
where
    E: Exports,
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (rd, mut wr) = tokio::io::split(stream);
    // One buffered reader for both phases: bytes read ahead during the handshake belong to
    // the first requests.
    let mut rd = BufReader::new(rd);
    let handshake = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        negotiate(&mut rd, &mut wr, &*exports, &peer),
    );
    let negotiated = tokio::select! {
        r = handshake => r.map_err(|_| ConnError::HandshakeTimeout(HANDSHAKE_TIMEOUT))??,
        // Nothing is in flight during the handshake: just drop the connection.
        () = wait_shutdown(&mut shutdown) => return Ok(End::Shutdown),
    };
    match negotiated {
        Negotiated::Abort => Ok(End::Abort),
        Negotiated::Go(session, export) => {
            debug!(peer = %peer, export = %session.export, size = session.size,
                structured = session.structured, meta = ?session.meta_context, "nbd: transmission");
            transmission::run(rd, wr, session, export, peer, shutdown).await
        }
    }
}

async fn negotiate<E, R, W>(
    rd: &mut R,
    wr: &mut W,
    exports: &E,
    peer: &str,
) -> Result<Negotiated<E::Export>, ConnError>
where
    E: Exports,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    wr.write_all(&greeting()).await?;
    wr.flush().await?;
    let mut nego = Negotiation::new(rd.read_u32().await?)?;
    // The export opened by the latest lookup, handed to transmission on Go.
    let mut opened: Option<Arc<E::Export>> = None;
    loop {
        let mut head = [0u8; OPTION_HEADER_LEN];
        rd.read_exact(&mut head).await?;
        let (opt, len) = parse_option_header(&head)?;
        debug!(peer, opt, len, "nbd: option");
        let mut step = match nego.admit(opt, len) {
            Admit::Read => {
                let mut data = vec![0; len as usize];
                rd.read_exact(&mut data).await?;
                nego.on_option(opt, &data)
            }
            Admit::Discard => {
                if !skip(rd, len).await? {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
                nego.on_discarded(opt)
            }
            Admit::Close(e) => return Err(e.into()),
        };
        // Lookups feed back into the machine until it has an answer for this option.
        loop {
            wr.write_all(&step.replies).await?;
            step = match step.outcome {
                Outcome::Continue => break,
                Outcome::Abort => {
                    wr.flush().await?;
                    return Ok(Negotiated::Abort);
                }
                Outcome::Close(e) => {
                    wr.flush().await?;
                    return Err(e.into());
                }
                Outcome::NeedList => nego.on_list(exports.list().await.map_err(|e| e.to_string())),
                Outcome::NeedExport { name, description } => {
                    let (found, export) = lookup(exports, &name, description).await;
                    opened = export;
                    nego.on_export(found)
                }
                Outcome::Go(session) => {
                    wr.flush().await?;
                    let export =
                        opened.ok_or(ConnError::Internal("go without an opened export"))?;
                    return Ok(Negotiated::Go(session, export));
                }
            };
        }
        wr.flush().await?;
    }
}

/// Opens an export and describes it for the state machine.
async fn lookup<E: Exports>(
    exports: &E,
    name: &str,
    description: bool,
) -> (Result<Option<ExportInfo>, String>, Option<Arc<E::Export>>) {
    let export = match exports.open(name).await {
        Ok(Some(x)) => x,
        Ok(None) => return (Ok(None), None),
        Err(e) => return (Err(e.to_string()), None),
    };
    // Descriptions only live in the export list; a failure to list just omits it.
    let description = match description {
        true => exports.list().await.ok().and_then(|list| {
            list.into_iter()
                .find(|(n, d)| n == name && !d.is_empty())
                .map(|(_, d)| d)
        }),
        false => None,
    };
    let info = ExportInfo {
        size: export.size(),
        multi_conn: export.multi_conn(),
        description,
    };
    (Ok(Some(info)), Some(export))
}

/// Reads and drops `len` bytes; false if the stream ended first.
pub(crate) async fn skip<R: AsyncRead + Unpin>(rd: &mut R, len: u32) -> std::io::Result<bool> {
    let want = u64::from(len);
    let got = tokio::io::copy(&mut rd.take(want), &mut tokio::io::sink()).await?;
    Ok(got == want)
}

/// Resolves once shutdown is signalled; never if the sender is gone without signalling.
pub(crate) async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
