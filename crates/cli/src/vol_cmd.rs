//! `cairn vol`: create, list, inspect, resize and remove block volumes.

use crate::admin::block_on;
use crate::size::{human, parse_size};
use anyhow::{bail, Result};
use cairn_client::{Client, ClientConfig};
use cairn_volume::Header;
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::Path;

#[derive(Subcommand)]
pub enum VolCmd {
    /// Create a thin-provisioned volume (no space is used until it is written).
    Create {
        /// Volume name: letters, digits, '.', '_' and '-', at most 128 bytes.
        name: String,
        /// Size, e.g. 10G (a multiple of 512 bytes).
        #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
        size: u64,
        /// Data object size: a power of two from 64K to 64M. Larger objects mean fewer
        /// objects; smaller ones spread a small volume over more PGs.
        #[arg(long, value_parser = parse_size, allow_hyphen_values = true, default_value = "4M")]
        object_size: u64,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// List the volumes of a pool.
    Ls {
        #[command(flatten)]
        pool: PoolArg,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a volume's size, object size, id and how much of it is allocated.
    Info {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Grow or shrink a volume. Connected NBD clients see the new size when they reconnect.
    Resize {
        name: String,
        /// New size, e.g. 20G.
        #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
        size: u64,
        /// Allow a smaller size: the data beyond the new end is deleted.
        #[arg(long)]
        allow_shrink: bool,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Remove a volume and all its data (progress on stderr). Stop serving it first.
    Rm {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
    },
}

#[derive(Args)]
pub struct PoolArg {
    /// Pool holding the volume.
    #[arg(short, long, default_value = "default")]
    pub pool: String,
}

pub fn run(cmd: VolCmd, conf: Option<&Path>) -> Result<()> {
    let mons = crate::conf::load(conf)?.cluster.mons;
    block_on(async move {
        let client = Client::connect(ClientConfig::new(mons)).await?;
        match cmd {
            VolCmd::Create {
                name,
                size,
                object_size,
                pool,
            } => {
                let Ok(os) = u32::try_from(object_size) else {
                    bail!("--object-size {object_size} is too large (at most 64M)");
                };
                let h = cairn_volume::create(&client, &pool.pool, &name, size, os).await?;
                eprintln!(
                    "created volume {name} ({}, {} objects) in pool {}",
                    human(h.size),
                    human(u64::from(h.object_size)),
                    pool.pool
                );
                warn_if_larger_than_room(&client, &pool.pool, &name, h.size).await;
            }
            VolCmd::Ls { pool, json } => ls(&client, &pool.pool, json).await?,
            VolCmd::Info { name, pool, json } => {
                let i = cairn_volume::info(&client, &pool.pool, &name).await?;
                print_info(&pool.pool, &i, json);
            }
            VolCmd::Resize {
                name,
                size,
                allow_shrink,
                pool,
            } => resize(&client, &pool.pool, &name, size, allow_shrink).await?,
            VolCmd::Rm { name, pool } => {
                let mut progress = crate::progress::Progress::new("removing data objects");
                cairn_volume::remove(&client, &pool.pool, &name, &mut |d, t| progress.show(d, t))
                    .await?;
                progress.finish();
                eprintln!("removed volume {name} from pool {}", pool.pool);
            }
        }
        Ok(())
    })?
}

async fn ls(client: &Client, pool: &str, json: bool) -> Result<()> {
    let vols = cairn_volume::list(client, pool).await?;
    if json {
        let v: Vec<_> = vols
            .iter()
            .map(|v| match &v.header {
                Ok(h) => header_json(&v.name, h),
                Err(why) => serde_json::json!({"name": v.name, "error": why}),
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{:<32} {:>12} {:>12}", "NAME", "SIZE", "OBJECT SIZE")?;
    for v in &vols {
        match &v.header {
            Ok(h) => writeln!(
                out,
                "{:<32} {:>12} {:>12}",
                v.name,
                human(h.size),
                human(u64::from(h.object_size))
            )?,
            Err(why) => writeln!(out, "{:<32} damaged header: {why}", v.name)?,
        }
    }
    Ok(())
}

fn header_json(name: &str, h: &Header) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "size": h.size,
        "object_size": h.object_size,
        "id": format!("{:016x}", h.id),
        "created": h.created,
        "created_at": crate::size::iso8601(h.created),
    })
}

fn print_info(pool: &str, i: &cairn_volume::VolumeInfo, json: bool) {
    let h = &i.header;
    let allocated = (i.allocated_objects * u64::from(h.object_size)).min(h.size);
    if json {
        let mut v = header_json(&i.name, h);
        v["pool"] = pool.into();
        v["objects"] = h.object_count().into();
        v["allocated_objects"] = i.allocated_objects.into();
        v["allocated_bytes_max"] = allocated.into();
        println!("{v}");
        return;
    }
    println!("volume:      {}", i.name);
    println!("pool:        {pool}");
    println!("size:        {} ({} bytes)", human(h.size), h.size);
    println!("object size: {}", human(u64::from(h.object_size)));
    println!(
        "allocated:   {} of {} objects (at most {})",
        i.allocated_objects,
        h.object_count(),
        human(allocated)
    );
    println!("id:          {:016x}", h.id);
    println!("created:     {}", crate::size::iso8601(h.created));
}

/// Warns when a thin volume is larger than what its pool can still hold: writing it full
/// would fail with ENOSPC part way.
async fn warn_if_larger_than_room(client: &Client, pool: &str, name: &str, size: u64) {
    let map = client.map();
    let Some(p) = map.pool_by_name(pool) else {
        return;
    };
    let uses = crate::capacity::osd_uses(&map).await;
    if let Some(room) = crate::capacity::usable(&map, &uses, p.size) {
        if size > room {
            eprintln!(
                "warning: volume {name} ({}) is larger than the about {} pool {pool} can still \
                 hold with {} copies: it is thin, but writing more than that fails (no space). \
                 Add OSDs or use a smaller size",
                human(size),
                human(room),
                p.size
            );
        }
    }
}

async fn resize(
    client: &Client,
    pool: &str,
    name: &str,
    size: u64,
    allow_shrink: bool,
) -> Result<()> {
    let cur = cairn_volume::info(client, pool, name).await?.header.size;
    if size == cur {
        println!("volume {name} is already {}: nothing to do", human(cur));
        return Ok(());
    }
    if size < cur && !allow_shrink {
        bail!(
            "{} is smaller than the volume's {}: shrinking deletes the data beyond the new end; \
             add --allow-shrink to do it",
            human(size),
            human(cur)
        );
    }
    let mut progress = crate::progress::Progress::new("removing data beyond the new end");
    cairn_volume::resize(client, pool, name, size, &mut |d, t| progress.show(d, t)).await?;
    progress.finish();
    eprintln!(
        "resized volume {name} from {} to {}",
        human(cur),
        human(size)
    );
    Ok(())
}
