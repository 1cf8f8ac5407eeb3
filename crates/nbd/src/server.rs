//! The accept loop and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::conn::{self, ConnError, End};
use crate::export::Exports;
use crate::tls::TlsServer;

/// Connections served at once; further ones are closed on accept (and logged).
pub const MAX_CONNECTIONS: usize = 1024;
/// How long a shutdown waits for connections to finish their in-flight requests before
/// dropping them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Serves NBD on `listener` until `shutdown` resolves. With `tls`, every client must start
/// TLS (NBD_OPT_STARTTLS) before anything else and is known by the identity it proves there.
///
/// Every connection runs in its own task. On shutdown the server stops accepting, drops
/// connections still in the handshake, lets connections in transmission finish the requests
/// they have started (no new request is read) and returns once every connection is closed,
/// or after [`SHUTDOWN_GRACE`] at most.
/// Accept errors (e.g. out of file descriptors) are logged and retried after a short pause;
/// nothing a client does stops the server.
pub async fn serve<E: Exports>(
    listener: TcpListener,
    exports: Arc<E>,
    tls: Option<Arc<TlsServer>>,
    shutdown: impl Future<Output = ()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) if conns.len() >= MAX_CONNECTIONS => {
                    warn!(%peer, "nbd: too many connections, closing the new one");
                    drop(stream);
                }
                Ok((stream, peer)) => {
                    let exports = Arc::clone(&exports);
                    conns.spawn(handle(stream, peer, exports, tls.clone(), stop_rx.clone()));
                }
                Err(e) => {
                    warn!(error = %e, "nbd: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            // Reap finished connections so the set does not grow.
            Some(joined) = conns.join_next(), if !conns.is_empty() => log_join(joined),
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    info!(
        connections = conns.len(),
        "nbd: shutting down, draining connections"
    );
    let drain = async {
        while let Some(joined) = conns.join_next().await {
            log_join(joined);
        }
    };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        // E.g. a client stalled in the middle of a write payload. Command tasks already
        // started are not aborted; only the connections are dropped.
        warn!(
            left = conns.len(),
            "nbd: connections did not drain in time, dropping them"
        );
        conns.shutdown().await;
    }
}

fn log_join(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined {
        warn!(error = %e, "nbd: connection task failed");
    }
}

async fn handle<E: Exports>(
    stream: TcpStream,
    peer: SocketAddr,
    exports: Arc<E>,
    tls: Option<Arc<TlsServer>>,
    stop: watch::Receiver<bool>,
) {
    // Replies are written whole, so Nagle would only delay them.
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, error = %e, "nbd: cannot set TCP_NODELAY");
    }
    debug!(%peer, "nbd: connection");
    let peer_name: Arc<str> = Arc::from(peer.to_string());
    log_end(
        &peer_name,
        conn::run(stream, exports, tls, Arc::clone(&peer_name), stop).await,
    );
}

fn log_end(peer: &str, result: Result<End, ConnError>) {
    match result {
        Ok(end) => debug!(peer, ?end, "nbd: connection closed"),
        Err(e) if e.is_protocol_violation() => warn!(peer, error = %e, "nbd: closing connection"),
        Err(e) => info!(peer, error = %e, "nbd: connection lost"),
    }
}

/// Serves one already-accepted connection (any byte stream) until it ends. Protocol errors
/// are returned rather than logged; requests the server refuses without closing (bad range,
/// unknown command) are logged as warnings.
pub async fn serve_connection<E, S>(stream: S, exports: Arc<E>) -> Result<(), ConnError>
where
    E: Exports,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // A sender kept alive for the whole call: this connection is never told to shut down.
    let (_keep, never) = watch::channel(false);
    conn::run(stream, exports, None, Arc::from("stream"), never)
        .await
        .map(|_| ())
}
