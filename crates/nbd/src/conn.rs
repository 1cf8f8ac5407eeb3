//! One connection: the handshake (driving [`Negotiation`] over the socket, looking exports
//! up), then the transmission phase.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf, WriteHalf,
};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::command::Session;
use crate::export::{ClientId, Export, ExportError, Exports};
use crate::handshake::{Admit, ExportInfo, HandshakeError, Lookup, Negotiation, Outcome};
use crate::proto::{greeting, parse_option_header, ProtoError, OPTION_HEADER_LEN};
use crate::tls::{TlsError, TlsServer};
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
    /// The TLS handshake after NBD_OPT_STARTTLS failed (unknown user, wrong key, not TLS).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The client sent bytes after NBD_OPT_STARTTLS before the server's reply: they cannot
    /// belong to the TLS handshake.
    #[error("data sent after NBD_OPT_STARTTLS before the server acknowledged it")]
    StartTlsPipelined,
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

/// Any byte stream a connection runs over: the socket, or TLS over it after STARTTLS.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Both halves of a connection's stream. One buffered reader serves both phases: bytes read
/// ahead during the handshake belong to the first requests.
struct Halves {
    rd: BufReader<ReadHalf<Box<dyn Io>>>,
    wr: WriteHalf<Box<dyn Io>>,
}

impl Halves {
    fn new(stream: Box<dyn Io>) -> Halves {
        let (rd, wr) = tokio::io::split(stream);
        Halves {
            rd: BufReader::new(rd),
            wr,
        }
    }
}

/// Runs a whole connection: handshake, then transmission until it ends. With `tls`, the
/// client must start TLS before anything else.
pub(crate) async fn run<E, S>(
    stream: S,
    exports: Arc<E>,
    tls: Option<Arc<TlsServer>>,
    peer: Arc<str>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<End, ConnError>
where
    E: Exports,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = Halves::new(Box::new(stream));
    let client = ClientId {
        identity: None,
        addr: peer.to_string(),
    };
    let handshake = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        negotiate(io, &*exports, tls.as_deref(), client),
    );
    let (io, negotiated) = tokio::select! {
        r = handshake => r.map_err(|_| ConnError::HandshakeTimeout(HANDSHAKE_TIMEOUT))??,
        // Nothing is in flight during the handshake: just drop the connection.
        () = wait_shutdown(&mut shutdown) => return Ok(End::Shutdown),
    };
    match negotiated {
        Negotiated::Abort => Ok(End::Abort),
        Negotiated::Go(session, export) => {
            debug!(peer = %peer, export = %session.export, size = session.size,
                structured = session.structured, contexts = session.contexts.len(), "nbd: transmission");
            transmission::run(io.rd, io.wr, session, export, peer, shutdown).await
        }
    }
}

async fn negotiate<E: Exports>(
    mut io: Halves,
    exports: &E,
    tls: Option<&TlsServer>,
    mut client: ClientId,
) -> Result<(Halves, Negotiated<E::Export>), ConnError> {
    io.wr.write_all(&greeting()).await?;
    io.wr.flush().await?;
    let flags = io.rd.read_u32().await?;
    let mut nego = match tls {
        Some(_) => Negotiation::requiring_tls(flags)?,
        None => Negotiation::new(flags)?,
    };
    // The export opened by the latest lookup, handed to transmission on Go.
    let mut opened: Option<Arc<E::Export>> = None;
    loop {
        let mut step = next_option(&mut io, &mut nego, &client.addr).await?;
        // Lookups feed back into the machine until it has an answer for this option.
        loop {
            io.wr.write_all(&step.replies).await?;
            step = match step.outcome {
                Outcome::Continue => break,
                Outcome::Abort => {
                    io.wr.flush().await?;
                    return Ok((io, Negotiated::Abort));
                }
                Outcome::Close(e) => {
                    io.wr.flush().await?;
                    return Err(e.into());
                }
                Outcome::StartTls => {
                    let tls = tls.ok_or(ConnError::Internal("STARTTLS without TLS set up"))?;
                    io.wr.flush().await?;
                    let identity;
                    (io, identity) = start_tls(io, tls, &client.addr).await?;
                    client.identity = Some(identity);
                    nego.tls_started();
                    break;
                }
                Outcome::NeedContexts { export } => {
                    nego.on_contexts(exports.meta_contexts(&export, &client).await)
                }
                Outcome::NeedList => nego.on_list(exports.list(&client).await),
                Outcome::NeedExport { name, description } => {
                    let (found, export) = lookup(exports, &name, description, &client).await;
                    opened = export;
                    nego.on_export(found)
                }
                Outcome::Go(session) => {
                    io.wr.flush().await?;
                    let export =
                        opened.ok_or(ConnError::Internal("go without an opened export"))?;
                    return Ok((io, Negotiated::Go(session, export)));
                }
            };
        }
        io.wr.flush().await?;
    }
}

/// Reads one option and feeds it to the machine.
async fn next_option(
    io: &mut Halves,
    nego: &mut Negotiation,
    peer: &str,
) -> Result<crate::handshake::Step, ConnError> {
    let mut head = [0u8; OPTION_HEADER_LEN];
    io.rd.read_exact(&mut head).await?;
    let (opt, len) = parse_option_header(&head)?;
    debug!(peer, opt, len, "nbd: option");
    match nego.admit(opt, len) {
        Admit::Read => {
            let mut data = vec![0; len as usize];
            io.rd.read_exact(&mut data).await?;
            Ok(nego.on_option(opt, &data))
        }
        Admit::Discard => {
            if !skip(&mut io.rd, len).await? {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            Ok(nego.on_discarded(opt))
        }
        Admit::Close(e) => Err(e.into()),
    }
}

/// Runs the TLS handshake on the connection's socket; returns the halves of the secure
/// stream and the identity the client proved.
async fn start_tls(io: Halves, tls: &TlsServer, peer: &str) -> Result<(Halves, String), ConnError> {
    if !io.rd.buffer().is_empty() {
        return Err(ConnError::StartTlsPipelined);
    }
    let stream = io.rd.into_inner().unsplit(io.wr);
    match tls.accept(stream).await {
        Ok((secure, identity)) => {
            info!(peer, identity, "nbd: TLS client authenticated");
            Ok((Halves::new(Box::new(secure)), identity))
        }
        Err(e) => {
            warn!(peer, error = %e, "nbd: refused a TLS client");
            Err(e.into())
        }
    }
}

/// Opens an export for `client` and describes it for the state machine.
async fn lookup<E: Exports>(
    exports: &E,
    name: &str,
    description: bool,
    client: &ClientId,
) -> (Lookup, Option<Arc<E::Export>>) {
    let opened = match exports.open(name, client).await {
        Ok(Some(x)) => x,
        Ok(None) => return (Lookup::Missing, None),
        Err(ExportError::Denied(why)) => {
            warn!(peer = %client.addr, identity = ?client.identity, export = name, "nbd: {why}");
            return (Lookup::Denied(why), None);
        }
        Err(e) => return (Lookup::Failed(e.to_string()), None),
    };
    // Descriptions only live in the export list; a failure to list just omits it.
    let description = match description {
        true => exports.list(client).await.ok().and_then(|list| {
            list.into_iter()
                .find(|(n, d)| n == name && !d.is_empty())
                .map(|(_, d)| d)
        }),
        false => None,
    };
    let info = ExportInfo {
        size: opened.export.size(),
        multi_conn: opened.export.multi_conn(),
        description,
        read_only: opened.read_only,
    };
    (Lookup::Found(info), Some(opened.export))
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
