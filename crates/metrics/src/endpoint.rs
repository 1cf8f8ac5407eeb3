//! The metrics endpoint: accepts scrapes on a listener, answers each with the exporter's
//! metrics, closes the connection. Bounded: a few scrapes at once, each given a few seconds.

use crate::http;
use crate::Exporter;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Scrapes served at once; more wait in the accept queue.
const MAX_SCRAPES: usize = 8;
/// Time a client has to send its request, and to take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes read and dropped after the answer, and for how long.
const DRAIN_MAX: usize = 64 << 10;
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// A bound metrics endpoint: where it listens (port 0 in the configuration gives a free one).
pub struct Endpoint {
    listener: std::net::TcpListener,
    pub addr: SocketAddr,
}

impl Endpoint {
    /// Binds `addr` (done before the daemon starts serving, so a taken port fails the start).
    pub fn bind(addr: SocketAddr) -> std::io::Result<Endpoint> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        Ok(Endpoint { listener, addr })
    }
}

/// Serves `exporter` on `endpoint` until the runtime stops (or the listener fails).
pub async fn serve(endpoint: Endpoint, exporter: Arc<Exporter>) {
    let listener = match tokio::net::TcpListener::from_std(endpoint.listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(addr = %endpoint.addr, error = %e, "the metrics endpoint cannot serve");
            return;
        }
    };
    tracing::info!(addr = %endpoint.addr, "serving metrics on http://{}/metrics", endpoint.addr);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let exporter = exporter.clone();
        tokio::spawn(async move {
            if let Err(e) = scrape(conn, &exporter).await {
                tracing::debug!(%peer, error = %e, "metrics scrape ended early");
            }
            drop(slot);
        });
    }
}

async fn scrape(mut conn: TcpStream, exporter: &Exporter) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let request = tokio::time::timeout(IO_TIMEOUT, async {
        loop {
            let mut chunk = [0u8; 1024];
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            buf.extend_from_slice(&chunk[..n]);
            match http::parse_request(&buf) {
                Ok(Some(r)) => return Ok::<_, std::io::Error>(Ok(r)),
                Ok(None) => continue,
                Err(e) => return Ok(Err(e)),
            }
        }
    })
    .await
    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let answer = match request {
        Ok(r) => http::respond(&r, || exporter.render()),
        Err(e) => http::refuse(&e),
    };
    tokio::time::timeout(IO_TIMEOUT, conn.write_all(&answer))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let _ = conn.shutdown().await;
    // What the client still sends (the rest of a refused request) is read and dropped for a
    // moment: closing with it unread would reset the connection before the client reads
    // the answer.
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left = DRAIN_MAX;
        while left > 0 {
            match conn.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
    Ok(())
}
