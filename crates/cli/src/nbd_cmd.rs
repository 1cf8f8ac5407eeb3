//! `cairn nbd serve`: serve a pool's volumes over NBD.

use anyhow::{bail, Context, Result};
use cairn_client::Client;
use cairn_gateway::nbd::VolumeExports;
use cairn_gateway::users::NbdUsers;
use cairn_nbd::TlsServer;
use clap::{Args, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Subcommand)]
pub enum NbdCmd {
    /// Serve every volume of a pool as an NBD export named after it (runs until killed).
    #[command(long_about = SERVE_ABOUT)]
    Serve(ServeArgs),
}

const SERVE_ABOUT: &str = "Serve every volume of a pool as an NBD export named after it \
(runs until killed).\n\n\
Clients connect with the volume's name, e.g. `nbdinfo nbd://127.0.0.1/disk0`, \
`qemu-img info nbd://127.0.0.1:10809/disk0`, or the Linux driver: \
`nbd-client -N disk0 127.0.0.1 /dev/nbd0`. Volumes created while the server runs are served \
too; a resized volume shows its new size on the next connection.\n\n\
Writes are durable at the pool's durability level when acknowledged, so FLUSH and FUA cost \
nothing. Several connections to one export are safe (multi-conn): serve each volume from one \
`cairn nbd serve` only, since the server keeps the map of which parts of a volume exist.\n\n\
While a volume has clients, the server holds an open lease on it: `cairn vol rm` refuses, and \
`cairn vol rm --force` makes the server close it first. SIGTERM or Ctrl-C stops the server \
cleanly: connections drain and the leases are released.\n\n\
With --tls require, every client must start TLS with a pre-shared key (NBD_OPT_STARTTLS) and \
sees only the volumes its NBD caps grant, read-only without `w`. Users are entities of the \
key database with NBD caps: `cairn auth add client.alice --nbd 'rw volume=disk0'`, then \
`cairn auth psk client.alice -o keys.psk` writes the key file clients use: \
`nbdinfo 'nbds://client.alice@HOST/disk0?tls-psk-file=keys.psk'`, or QEMU's \
`--object tls-creds-psk,id=tls0,endpoint=client,dir=DIR,username=client.alice` with \
DIR/keys.psk. The server's own key needs `x` in its NBD caps (client.admin has it).\n\n\
With --tls-cert, --tls-key and --tls-client-ca as well, clients may instead present an X.509 \
certificate issued by that CA: the user is the certificate's subject common name (e.g. \
CN=client.alice), held to that entity's NBD caps like a PSK user. The server proves itself \
with --tls-cert (its names must include the address clients connect to). Clients: \
`nbdinfo 'nbds://HOST/disk0?tls-certificates=DIR'` or QEMU's \
`--object tls-creds-x509,id=tls0,endpoint=client,dir=DIR`, DIR holding ca-cert.pem (the CA of \
the server's certificate), client-cert.pem and client-key.pem.";

/// Whether clients must use TLS.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TlsMode {
    /// No TLS: every client that can connect may open every volume (loopback only, unless
    /// --insecure).
    Off,
    /// Every client starts TLS with a pre-shared key and is held to its NBD caps.
    Require,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Pool whose volumes are served.
    #[arg(short, long, default_value = "default")]
    pool: String,
    /// Address to listen on (NBD's port is 10809). Anything but loopback needs --tls require
    /// (or --insecure).
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub(crate) listen: String,
    /// Whether clients must authenticate with TLS-PSK (see below).
    #[arg(long, value_enum, default_value = "off")]
    tls: TlsMode,
    /// Serve without TLS on an address other than loopback: every host that can reach it
    /// may read and write every volume.
    #[arg(long)]
    insecure: bool,
    /// How often the server fetches the NBD users (keys and caps) from the monitors, in
    /// seconds; an unknown user also triggers a fetch (at most one a second).
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    users_refresh: u64,
    /// The server's X.509 certificate (PEM, with its chain), to accept client certificates
    /// besides pre-shared keys; needs --tls require, --tls-key and --tls-client-ca.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_client_ca"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA certificates (PEM) that client certificates must be issued by.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Volume served to clients that ask for the empty export name.
    #[arg(long)]
    default_export: Option<String>,
    /// Temporal merge: with more than this many requests in flight to one OSD, small ones
    /// (<= 16 KiB) issued together are sent as one message (at most 8). 0 turns it off.
    #[arg(long, default_value_t = cairn_client::DEFAULT_MERGE_THRESHOLD)]
    merge_threshold: usize,
    /// Prometheus metrics: requests, bytes, errors and latency per export, QoS throttling.
    #[command(flatten)]
    metrics: crate::metrics_args::MetricsArgs,
}

pub fn run(cmd: NbdCmd, conf: Option<&Path>) -> Result<()> {
    let NbdCmd::Serve(a) = cmd;
    let mons = crate::conf::load(conf)?.cluster.mons;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        // Checked before binding: nothing listens beyond loopback unless allowed.
        let exposed = tokio::net::lookup_host(&a.listen)
            .await
            .with_context(|| format!("cannot resolve --listen {}", a.listen))?
            .any(|l| !l.ip().is_loopback());
        if a.tls_cert.is_some() && a.tls == TlsMode::Off {
            bail!("--tls-cert needs --tls require (certificates authenticate TLS clients)");
        }
        if exposed && a.tls == TlsMode::Off && !a.insecure {
            bail!(
                "refusing to serve {} without TLS: every host that reaches it could read and \
                 write every volume. Use --tls require (clients authenticate with their keys), \
                 listen on 127.0.0.1, or pass --insecure on a network you trust",
                a.listen
            );
        }
        let metrics = a.metrics.listen()?;
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.listen))?;
        let metrics_endpoint = match metrics {
            Some(m) => Some(
                cairn_metrics::Endpoint::bind(&m)
                    .with_context(|| format!("cannot serve metrics on {}", m.addr))?,
            ),
            None => None,
        };
        let mut cfg = crate::conf::client_config(mons);
        cfg.merge_threshold = a.merge_threshold;
        let client = Client::connect(cfg).await?;
        client.pool_id(&a.pool)?;
        let users = match a.tls {
            TlsMode::Off => None,
            TlsMode::Require => Some(fetch_users(&client).await?),
        };
        // The address bound (with port 0, the port the system chose).
        let addr = listener
            .local_addr()
            .map_or(a.listen.clone(), |l| l.to_string());
        let holder = format!("cairn nbd serve on {}, nbd://{addr}", hostname());
        let certs = cert_files(&a);
        let mut exports = VolumeExports::new(client.clone(), &a.pool, a.default_export, &holder);
        let mut tls = None;
        let mut refresher = None;
        if let Some(users) = users {
            let me = crate::conf::own_key().context("--tls require needs this process's key")?;
            let every = Duration::from_secs(a.users_refresh.max(1));
            refresher = Some(users.keep_fresh(client.mon().clone(), me, every));
            let server = match certs {
                Some(files) => TlsServer::with_certificates(users.clone(), &files)?,
                None => TlsServer::psk(users.clone())?,
            };
            tls = Some(Arc::new(server));
            exports = exports.with_users(users);
        }
        let mut metrics_exporter = None;
        if let Some(endpoint) = metrics_endpoint {
            let (m, e) = cairn_gateway::metrics::NbdMetrics::new();
            exports = exports.with_metrics(m);
            metrics_exporter = Some((endpoint, e));
        }
        let exports = Arc::new(exports);
        if let Some((endpoint, e)) = metrics_exporter {
            let weak = Arc::downgrade(&exports);
            e.on_scrape(move || {
                if let Some(x) = weak.upgrade() {
                    x.refresh_metrics();
                }
            });
            eprintln!("metrics on http://{}/metrics", endpoint.addr);
            tokio::spawn(cairn_metrics::serve(endpoint, Arc::new(e)));
        }
        tracing::info!(listen = %addr, pool = %a.pool, "serving volumes over NBD");
        eprintln!("serving the volumes of pool {} on nbd://{addr}", a.pool);
        cairn_nbd::serve(listener, exports.clone(), tls, stop_signal()).await;
        if let Some(r) = refresher {
            r.abort();
        }
        // Release the volumes' open leases now rather than have `vol rm` wait for them to expire.
        exports.close_all().await;
        eprintln!("stopped serving pool {}", a.pool);
        Ok(())
    })
}

/// The X.509 files, when given (clap makes them all or none).
fn cert_files(a: &ServeArgs) -> Option<cairn_nbd::CertFiles> {
    Some(cairn_nbd::CertFiles {
        cert_chain: a.tls_cert.clone()?,
        key: a.tls_key.clone()?,
        client_ca: a.tls_client_ca.clone()?,
    })
}

/// The NBD users (keys and caps), fetched once to check this server may serve them.
async fn fetch_users(client: &Client) -> Result<Arc<NbdUsers>> {
    let me = crate::conf::own_key().context(
        "--tls require needs this process's key: the configuration names no keyring (a cluster \
         run with --auth none has no NBD users)",
    )?;
    let users = NbdUsers::fetch(client.mon(), &me)
        .await
        .context("cannot fetch the NBD users from the monitors")?;
    if users.is_empty() {
        tracing::warn!(
            "no NBD users yet: add one with `cairn auth add client.NAME --nbd 'rw volume=VOL'`"
        );
    }
    Ok(users)
}

/// Resolves on SIGINT or SIGTERM (or never, if the handlers cannot be installed).
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot install signal handlers; stop the server with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping: signal received");
}

/// This machine's name, for people reading a volume's lease.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown host".into())
}
