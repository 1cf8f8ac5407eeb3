//! `cairn dashboard`: a read-only web view of a cluster, served by a process of its own on
//! loopback (by default): health with its reasons, OSDs (up/in, capacity, latency), pools,
//! volumes, PGs by state, recovery and scrub, and live IOPS, throughput and latency charts.
//! The page is static (HTML and a script compiled in, nothing fetched from elsewhere); it
//! polls `/api/cluster`, which this process refreshes every `--refresh` seconds. Browsers
//! sign in with a Cairn identity and its key when the cluster has authentication.

mod gather;
mod web;

use anyhow::{bail, Context, Result};
use cairn_failstop::LockOrDie;
use cairn_metrics::http;
use clap::Args;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Options of `cairn dashboard`.
#[derive(Args, Debug)]
pub struct DashboardArgs {
    /// Address to serve the dashboard on. Anything but loopback needs --insecure: the page
    /// is plain HTTP, and keys typed into its login travel in the clear.
    #[arg(long, default_value = "127.0.0.1:7480")]
    listen: SocketAddr,
    /// Serve on an address other than loopback anyway (behind a TLS proxy, or on a network
    /// you trust).
    #[arg(long)]
    insecure: bool,
    /// Seconds between two refreshes of the data the page shows.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=300))]
    refresh: u64,
}

/// Most requests served at once; more wait.
const MAX_CLIENTS: usize = 32;
/// Time a browser has to send its request.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

struct State {
    sessions: web::Sessions,
    snapshot: Mutex<String>,
    mons: Vec<String>,
}

pub fn run(conf: Option<&Path>, a: DashboardArgs) -> Result<()> {
    if !a.listen.ip().is_loopback() && !a.insecure {
        bail!(
            "refusing to serve the dashboard on {}: it is plain HTTP and its login carries keys; \
             listen on 127.0.0.1 (reach it through an SSH tunnel or a TLS proxy), or pass \
             --insecure on a network you trust",
            a.listen
        );
    }
    let conf_path = crate::conf::locate(conf)?;
    let cluster = crate::conf::load(Some(&conf_path))?.cluster;
    let required = cluster.keyring.is_some();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.listen))?;
        let addr = listener.local_addr().map_or(a.listen, |l| l);
        let client =
            cairn_client::Client::connect(crate::conf::client_config(cluster.mons.clone()))
                .await
                .context("cannot connect to the cluster")?;
        let g = gather::Gatherer {
            exe: std::env::current_exe().context("cannot find this executable")?,
            conf: conf_path,
            mon: crate::conf::mon_client(cluster.mons.clone()).with_timeout(Duration::from_secs(5)),
            client,
        };
        let state = Arc::new(State {
            sessions: web::Sessions::new(required),
            snapshot: Mutex::new("{\"loading\":true}".into()),
            mons: cluster.mons.clone(),
        });
        let s = state.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(a.refresh));
            loop {
                every.tick().await;
                let v = g.snapshot().await;
                *s.snapshot.lock_or_die() = v.to_string();
            }
        });
        let login = if required {
            "sign in with a key"
        } else {
            "no login"
        };
        eprintln!("dashboard on http://{addr}/ ({login}); stop with Ctrl-C");
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CLIENTS));
        loop {
            let slot = slots.clone().acquire_owned().await?;
            let (conn, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "dashboard: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let state = state.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(conn, &state).await {
                    tracing::debug!(error = %e, "dashboard request ended early");
                }
                drop(slot);
            });
        }
    })
}

/// Reads one request (head and, for a login, its small body) and answers it.
async fn serve(mut conn: TcpStream, state: &State) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(2048);
    let read = tokio::time::timeout(IO_TIMEOUT, async {
        loop {
            let mut chunk = [0u8; 2048];
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            buf.extend_from_slice(&chunk[..n]);
            match http::parse_request(&buf) {
                Ok(Some(r)) => {
                    let want = r.content_length.unwrap_or(0).min(http::MAX_FORM + 1);
                    if buf.len() >= r.head_len + want {
                        return Ok::<_, std::io::Error>(Ok(r));
                    }
                }
                Ok(None) => {}
                Err(e) => return Ok(Err(e)),
            }
        }
    });
    let req = read
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let answer = match req {
        Err(e) => http::refuse(&e),
        Ok(r) if r.method == "POST" && r.path == "/login" => {
            let end = (r.head_len + r.content_length.unwrap_or(0)).min(buf.len());
            login(state, &buf[r.head_len.min(end)..end]).await
        }
        Ok(r) => web::route(&r, &state.sessions, || state.snapshot.lock_or_die().clone()),
    };
    conn.write_all(&answer).await?;
    let _ = conn.shutdown().await;
    Ok(())
}

/// Checks a login form (`entity`, `key`: the hex secret of a keyring) by authenticating to
/// the monitors with it and reading the map.
async fn login(state: &State, body: &[u8]) -> Vec<u8> {
    let Some(form) = http::parse_form(body) else {
        return web::login_page(
            400,
            "Bad Request",
            Some("the form is too large or not text"),
        );
    };
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let (entity, key) = (field("entity"), field("key"));
    if !state.sessions.required {
        return web::logged_in("none");
    }
    let checked = check_key(&state.mons, &entity, &key).await;
    match checked.and_then(|()| state.sessions.open(&entity)) {
        Ok(token) => {
            tracing::info!(%entity, "dashboard: signed in");
            web::logged_in(&token)
        }
        Err(e) => {
            tracing::warn!(%entity, error = %e, "dashboard: sign-in refused");
            // Slows guessing down (keys are 256 bits: this is for the logs' sake).
            tokio::time::sleep(Duration::from_millis(500)).await;
            web::login_page(401, "Unauthorized", Some(&format!("{e:#}")))
        }
    }
}

async fn check_key(mons: &[String], entity: &str, key: &str) -> Result<()> {
    let entity =
        cairn_auth::Entity::parse(entity).context("not an identity (e.g. client.admin)")?;
    let secret = cairn_auth::Secret::from_hex(key)
        .context("not a key (the 64 hex digits of `secret` in a keyring)")?;
    let auth = cairn_monclient::auth::EntityKey::new(entity, secret, mons.to_vec());
    let mon = cairn_monclient::MonClient::new(mons.to_vec())
        .with_auth(auth)
        .with_frames(crate::conf::frames())
        .with_timeout(Duration::from_secs(5));
    mon.get_map()
        .await
        .map(|_| ())
        .context("the monitors did not accept this identity and key (or it may not read the map)")
}
