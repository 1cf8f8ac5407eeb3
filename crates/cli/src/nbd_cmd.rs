//! `cairn nbd serve`: serve a pool's volumes over NBD.

use anyhow::{Context, Result};
use cairn_client::Client;
use cairn_gateway::nbd::VolumeExports;
use clap::{Args, Subcommand};
use std::path::Path;
use std::sync::Arc;

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
cleanly: connections drain and the leases are released.";

#[derive(Args)]
pub struct ServeArgs {
    /// Pool whose volumes are served.
    #[arg(short, long, default_value = "default")]
    pool: String,
    /// Address to listen on (NBD's port is 10809). Anything but loopback exposes the volumes
    /// to the network without authentication.
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: String,
    /// Volume served to clients that ask for the empty export name.
    #[arg(long)]
    default_export: Option<String>,
    /// Temporal merge: with more than this many requests in flight to one OSD, small ones
    /// (<= 16 KiB) issued together are sent as one message (at most 8). 0 turns it off.
    #[arg(long, default_value_t = cairn_client::DEFAULT_MERGE_THRESHOLD)]
    merge_threshold: usize,
}

pub fn run(cmd: NbdCmd, conf: Option<&Path>) -> Result<()> {
    let NbdCmd::Serve(a) = cmd;
    let mons = crate::conf::load(conf)?.cluster.mons;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.listen))?;
        let mut cfg = crate::conf::client_config(mons);
        cfg.merge_threshold = a.merge_threshold;
        let client = Client::connect(cfg).await?;
        client.pool_id(&a.pool)?;
        // The address bound (with port 0, the port the system chose).
        let addr = listener
            .local_addr()
            .map_or(a.listen.clone(), |l| l.to_string());
        let holder = format!("cairn nbd serve on {}, nbd://{addr}", hostname());
        let exports = Arc::new(VolumeExports::new(
            client,
            &a.pool,
            a.default_export,
            &holder,
        ));
        tracing::info!(listen = %addr, pool = %a.pool, "serving volumes over NBD");
        eprintln!("serving the volumes of pool {} on nbd://{addr}", a.pool);
        cairn_nbd::serve(listener, exports.clone(), stop_signal()).await;
        // Release the volumes' open leases now rather than have `vol rm` wait for them to expire.
        exports.close_all().await;
        eprintln!("stopped serving pool {}", a.pool);
        Ok(())
    })
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
