//! The metrics endpoint: accepts scrapes on a listener, answers each with the exporter's
//! metrics, closes the connection. Bounded: a few scrapes at once, each given a few seconds.

use crate::http;
use crate::{Exporter, Listen, Token};
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
    token: Option<Token>,
}

impl Endpoint {
    /// Binds `listen.addr` (done before the daemon starts serving, so a taken port fails the
    /// start); scrapes must show `listen.token`, if set.
    pub fn bind(listen: &Listen) -> std::io::Result<Endpoint> {
        let listener = std::net::TcpListener::bind(listen.addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        Ok(Endpoint {
            listener,
            addr,
            token: listen.token.clone(),
        })
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
        let (exporter, token) = (exporter.clone(), endpoint.token.clone());
        tokio::spawn(async move {
            if let Err(e) = scrape(conn, &exporter, token.as_ref()).await {
                tracing::debug!(%peer, error = %e, "metrics scrape ended early");
            }
            drop(slot);
        });
    }
}

async fn scrape(
    mut conn: TcpStream,
    exporter: &Exporter,
    token: Option<&Token>,
) -> std::io::Result<()> {
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
        Ok(r) if token.is_some_and(|t| !t.admits(r.authorization.as_deref())) => {
            http::unauthorized()
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Sends `head` to `addr` and returns the whole answer.
    fn ask(addr: SocketAddr, head: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.write_all(head.as_bytes()).expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("answer");
        out
    }

    #[test]
    fn with_a_token_only_scrapes_that_show_it_get_the_page() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let mut exporter = Exporter::new("cairn_test");
        let c: crate::Counter = crate::Counter::default();
        c.inc();
        exporter
            .registry()
            .register("scrapes_seen", "a test counter", c);
        let token = Token::parse("0123456789abcdef0123").expect("token");
        let listen =
            Listen::new("127.0.0.1:0".parse().expect("addr"), Some(token)).expect("listen");
        let endpoint = Endpoint::bind(&listen).expect("bind");
        let addr = endpoint.addr;
        rt.spawn(serve(endpoint, Arc::new(exporter)));
        let get = |auth: &str| ask(addr, &format!("GET /metrics HTTP/1.1\r\n{auth}\r\n"));
        for refused in [
            get(""),
            get("Authorization: Bearer 0123456789abcdef0124\r\n"),
            get("Authorization: Basic MDEyMzQ1Njc4OWFiY2RlZjAxMjM=\r\n"),
            ask(addr, "GET / HTTP/1.1\r\n\r\n"),
        ] {
            assert!(refused.starts_with("HTTP/1.1 401 "), "{refused}");
            assert!(refused.contains("WWW-Authenticate: Bearer"), "{refused}");
            assert!(!refused.contains("scrapes_seen"), "{refused}");
        }
        let page = get("Authorization: Bearer 0123456789abcdef0123\r\n");
        assert!(page.starts_with("HTTP/1.1 200 "), "{page}");
        assert!(page.contains("cairn_test_scrapes_seen_total 1"), "{page}");
    }
}
