//! `cairn vol qos`: per-volume I/O limits, applied live where the volume is served.

use crate::size::{human, parse_size};
use crate::vol_cmd::PoolArg;
use anyhow::Result;
use cairn_client::Client;
use cairn_volume::snaps::Qos;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum QosCmd {
    /// Limit a volume's requests and bytes per second (reads and writes together), with
    /// bursts after a quiet spell. The servers of the volume apply it within a fraction of a
    /// second; the command waits for them. Limits not given are removed (0: no limit).
    /// With --pool-default instead of a volume name: the limits of every volume of the pool
    /// that has none of its own (servers apply them within 2 s).
    Set {
        /// Volume name (or --pool-default).
        #[arg(required_unless_present = "pool_default")]
        name: Option<String>,
        /// Set the pool's default limits instead of one volume's.
        #[arg(long, conflicts_with = "name")]
        pool_default: bool,
        /// Requests per second (reads, writes, zeroes and trims).
        #[arg(long, default_value_t = 0)]
        iops: u64,
        /// Bytes per second, e.g. 100M.
        #[arg(long, value_parser = parse_size, default_value = "0")]
        bps: u64,
        /// Requests admitted at once after a quiet spell (default: one second's worth).
        #[arg(long, default_value_t = 0)]
        iops_burst: u64,
        /// Bytes admitted at once after a quiet spell (default: one second's worth).
        #[arg(long, value_parser = parse_size, default_value = "0")]
        bps_burst: u64,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Remove a volume's limits (it is then held to its pool's defaults, if any), or with
    /// --pool-default the pool's defaults.
    Clear {
        #[arg(required_unless_present = "pool_default")]
        name: Option<String>,
        #[arg(long, conflicts_with = "name")]
        pool_default: bool,
        #[command(flatten)]
        pool: PoolArg,
    },
}

pub async fn run(client: &Client, cmd: QosCmd) -> Result<()> {
    let (name, pool, qos) = match cmd {
        QosCmd::Set {
            name,
            pool_default: _,
            iops,
            bps,
            iops_burst,
            bps_burst,
            pool,
        } => {
            let q = Qos {
                iops,
                bps,
                iops_burst,
                bps_burst,
            };
            (name, pool, q)
        }
        QosCmd::Clear { name, pool, .. } => (name, pool, Qos::default()),
    };
    match name {
        Some(name) => {
            cairn_volume::set_qos(client, &pool.pool, &name, qos, &mut |_| {}).await?;
            eprintln!("volume {name}: {}", describe(&qos));
        }
        None => {
            cairn_volume::pool_qos::set(client, &pool.pool, &qos).await?;
            eprintln!(
                "pool {}: volumes without limits of their own are {}",
                pool.pool,
                describe(&qos)
            );
        }
    }
    Ok(())
}

/// Limits as people read them.
pub fn describe(q: &Qos) -> String {
    if !q.is_limited() {
        return "no I/O limits".into();
    }
    let mut parts = Vec::new();
    if q.iops > 0 {
        let burst = if q.iops_burst > 0 {
            q.iops_burst
        } else {
            q.iops
        };
        parts.push(format!("{} IOPS (burst {burst})", q.iops));
    }
    if q.bps > 0 {
        let burst = if q.bps_burst > 0 { q.bps_burst } else { q.bps };
        parts.push(format!("{}/s (burst {})", human(q.bps), human(burst)));
    }
    format!("limited to {}", parts.join(", "))
}
