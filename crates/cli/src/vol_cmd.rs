//! `cairn vol`: create, list, inspect, resize and remove block volumes.

use crate::admin::block_on;
use crate::size::{human, parse_size};
use anyhow::{bail, Result};
use cairn_client::Client;
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
        /// Keep the data in this pool (e.g. an erasure-coded one, `cairn pool create NAME
        /// --ec 4+2`) and only the header, leases and snapshot table in --pool (which must be
        /// replicated). Fixed for the volume's life; its clones keep theirs there too.
        #[arg(long, value_name = "POOL")]
        data_pool: Option<String>,
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
    /// Remove a volume and all its data (progress on stderr). Refused while a server has it
    /// open (the holders are named); --force makes the servers close it first.
    Rm {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
        /// Remove even while served: the servers close the volume (their clients' I/O then
        /// fails) within a few seconds, or their lease expires (15 s) if they are gone.
        #[arg(long)]
        force: bool,
    },
    /// Snapshots: create, ls, rm, rollback, protect, unprotect, trim. A snapshot is served
    /// read-only over NBD as export VOL@SNAP.
    #[command(subcommand)]
    Snap(crate::snap_cmd::SnapCmd),
    /// Create volume NEW as a clone of protected snapshot VOL@SNAP: instant; its data is read
    /// from the snapshot until written (each data object is copied on its first change).
    Clone {
        /// VOL@SNAP: the parent snapshot (`vol snap protect` it first).
        from: String,
        /// Name of the new volume.
        name: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Copy every data object a clone still reads from its parent (progress on stderr), then
    /// detach it. Safe while the clone is served and written.
    Flatten {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// I/O limits per volume: set, clear (shown by `vol info`).
    #[command(subcommand)]
    Qos(crate::qos_cmd::QosCmd),
    /// List the byte ranges that changed between snapshot VOL@A and snapshot VOL@B (or the
    /// volume now), exact to 4 KiB: what an incremental backup must copy.
    Diff {
        /// VOL@A: the older snapshot.
        from: String,
        /// VOL@B: the newer snapshot (default: the volume as it is now).
        to: Option<String>,
        #[command(flatten)]
        pool: PoolArg,
        /// Print JSON: {"volume", "from", "to", "block", "changed_bytes", "extents": [{"offset", "length"}]}.
        #[arg(long)]
        json: bool,
    },
    /// Show the space a volume and each of its snapshots use (before replication): what a
    /// snapshot reads from clones, and what removing it would give back.
    Du {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Create volume NAME from a local file (a raw disk image), as large as the file rounded
    /// up to 512 bytes (progress on stderr). Chunks of zeros are not written: they use no
    /// space. The volume must not exist.
    Import {
        /// The file to copy from.
        file: std::path::PathBuf,
        /// Name of the new volume.
        name: String,
        /// Data object size of the new volume (see `vol create`).
        #[arg(long, value_parser = parse_size, allow_hyphen_values = true, default_value = "4M")]
        object_size: u64,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Copy volume VOL, or its snapshot VOL@SNAP, to a new local file (a raw disk image,
    /// sparse: what the volume never wrote, or holds as zeros, is a hole). A volume being
    /// written meanwhile is not copied as of one moment: export a snapshot for that.
    Export {
        /// VOL or VOL@SNAP.
        name: String,
        /// The file to create.
        file: std::path::PathBuf,
        /// Replace the file if it exists.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Find the data objects of volumes that no longer exist (left by an interrupted or
    /// forced removal) and remove them.
    Gc {
        #[command(flatten)]
        pool: PoolArg,
        /// Only report what would be removed.
        #[arg(long)]
        dry_run: bool,
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
        let client = Client::connect(crate::conf::client_config(mons)).await?;
        match cmd {
            VolCmd::Create {
                name,
                size,
                object_size,
                pool,
                data_pool,
            } => {
                let Ok(os) = u32::try_from(object_size) else {
                    bail!("--object-size {object_size} is too large (at most 64M)");
                };
                let dp = data_pool.as_deref();
                let h = cairn_volume::create_with(&client, &pool.pool, &name, size, os, dp).await?;
                let data = match (&data_pool, h.data_pool) {
                    (Some(d), Some(_)) => format!(", data in pool {d}"),
                    _ => String::new(),
                };
                eprintln!(
                    "created volume {name} ({}, {} objects) in pool {}{data}",
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
            VolCmd::Rm { name, pool, force } => {
                let mut events = RemoveOutput::new(&name);
                let r = cairn_volume::remove(&client, &pool.pool, &name, force, &mut |e| {
                    events.show(e)
                })
                .await;
                events.finish();
                r?;
                eprintln!("removed volume {name} from pool {}", pool.pool);
            }
            VolCmd::Gc { pool, dry_run } => gc(&client, &pool.pool, dry_run).await?,
            VolCmd::Import {
                file,
                name,
                object_size,
                pool,
            } => {
                let Ok(os) = u32::try_from(object_size) else {
                    bail!("--object-size {object_size} is too large (at most 64M)");
                };
                crate::vol_io::import(&client, &pool.pool, &file, &name, os).await?
            }
            VolCmd::Export {
                name,
                file,
                force,
                pool,
            } => crate::vol_io::export(&client, &pool.pool, &name, &file, force).await?,
            VolCmd::Snap(cmd) => crate::snap_cmd::run(&client, cmd).await?,
            VolCmd::Qos(cmd) => crate::qos_cmd::run(&client, cmd).await?,
            VolCmd::Clone { from, name, pool } => {
                let (vol, snap) = crate::snap_cmd::split(&from)?;
                let h = cairn_volume::clone_volume(&client, &pool.pool, vol, snap, &name).await?;
                eprintln!(
                    "created volume {name} ({}) as a clone of {from}",
                    human(h.size)
                );
            }
            VolCmd::Flatten { name, pool } => {
                let mut progress = crate::progress::Progress::new("copying from the parent");
                let r = cairn_volume::flatten(&client, &pool.pool, &name, &mut |d, t| {
                    progress.show(d, t)
                })
                .await;
                progress.finish();
                r?;
                eprintln!("flattened volume {name}: it no longer reads its parent");
            }
            VolCmd::Diff {
                from,
                to,
                pool,
                json,
            } => crate::snap_cmd::diff(&client, &pool.pool, &from, to.as_deref(), json).await?,
            VolCmd::Du { name, pool, json } => {
                crate::snap_cmd::du(&client, &pool.pool, &name, json).await?
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
                Err(why) => serde_json::json!({"name": v.name, "error": why.to_string()}),
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
                "{:<32} {:>12} {:>12}{}",
                v.name,
                human(h.size),
                human(u64::from(h.object_size)),
                if h.removing { "  (being removed)" } else { "" }
            )?,
            Err(why) => writeln!(out, "{:<32} damaged header: {why}", v.name)?,
        }
    }
    Ok(())
}

/// Progress of a removal on stderr: who is being waited for, then objects removed.
pub struct RemoveOutput<'a> {
    name: &'a str,
    progress: crate::progress::Progress,
    last_wait: Option<std::time::Instant>,
}

impl<'a> RemoveOutput<'a> {
    pub fn new(name: &'a str) -> RemoveOutput<'a> {
        RemoveOutput {
            name,
            progress: crate::progress::Progress::new("removing data objects"),
            last_wait: None,
        }
    }

    pub fn show(&mut self, e: cairn_volume::RemoveEvent<'_>) {
        match e {
            cairn_volume::RemoveEvent::Waiting(holders) => {
                if self.last_wait.is_none_or(|t| t.elapsed().as_secs() >= 2) {
                    self.last_wait = Some(std::time::Instant::now());
                    eprintln!(
                        "waiting for the server(s) to close volume {}: {}",
                        self.name,
                        cairn_volume::describe_holders(holders)
                    );
                }
            }
            cairn_volume::RemoveEvent::Removed { done, total } => self.progress.show(done, total),
        }
    }

    pub fn finish(&self) {
        self.progress.finish();
    }
}

async fn gc(client: &Client, pool: &str, dry_run: bool) -> Result<()> {
    let found = cairn_volume::find_orphans(client, pool).await?;
    for name in &found.interrupted {
        eprintln!(
            "volume {name} is flagged for removal (an interrupted `vol rm`): `cairn vol rm \
             {name} --pool {pool}` finishes it"
        );
    }
    if found.by_id.is_empty() {
        println!("pool {pool}: no orphaned volume objects");
        return Ok(());
    }
    for (id, objects) in &found.by_id {
        println!(
            "volume id {id:016x}: {} objects, no volume has this id",
            objects.len()
        );
    }
    if dry_run {
        println!(
            "pool {pool}: {} orphaned objects of {} removed volumes (dry run: nothing removed)",
            found.objects(),
            found.by_id.len()
        );
        return Ok(());
    }
    let mut progress = crate::progress::Progress::new("removing orphaned objects");
    cairn_volume::remove_orphans(client, pool, &found, &mut |d, t| progress.show(d, t)).await?;
    progress.finish();
    println!(
        "pool {pool}: removed {} orphaned objects of {} removed volumes",
        found.objects(),
        found.by_id.len()
    );
    Ok(())
}

/// Before `pool rm`: refuses while volumes of other pools keep their data in it, and while
/// volumes of the pool are open, or with `force` makes their servers close them and waits (so
/// no server writes into a pool being removed).
pub fn close_pool_volumes(conf: Option<&Path>, pool: &str, force: bool) -> Result<()> {
    let mons = crate::conf::load(conf)?.cluster.mons;
    block_on(async move {
        let client = Client::connect(crate::conf::client_config(mons)).await?;
        if client.pool_id(pool).is_err() {
            return Ok(()); // the monitors say what is wrong with the name
        }
        // Not even with --force: the volumes' headers would stay, their data gone.
        let users = cairn_volume::data_pool_users(&client, pool).await?;
        if !users.is_empty() {
            let list: Vec<String> = users
                .iter()
                .map(|(p, v)| format!("{v} (pool {p})"))
                .collect();
            bail!(
                "pool {pool} holds the data of volumes {}: remove them first (`cairn vol rm \
                 NAME -p POOL`)",
                list.join(", ")
            );
        }
        let open = cairn_volume::open_volumes(&client, pool).await?;
        if open.is_empty() {
            return Ok(());
        }
        if !force {
            let list: Vec<String> = open
                .iter()
                .map(|(v, h)| format!("{v} ({})", cairn_volume::describe_holders(h)))
                .collect();
            bail!(
                "pool {pool} has open volumes: {}; stop serving them, or add --force to make \
                 the servers close them first",
                list.join("; ")
            );
        }
        for (name, _) in &open {
            let mut events = RemoveOutput::new(name);
            cairn_volume::close_for_removal(&client, pool, name, &mut |e| events.show(e)).await?;
        }
        Ok(())
    })?
}

fn header_json(name: &str, h: &Header) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "size": h.size,
        "object_size": h.object_size,
        "id": format!("{:016x}", h.id),
        "created": h.created,
        "created_at": crate::size::iso8601(h.created),
        "removing": h.removing,
    })
}

fn print_info(pool: &str, i: &cairn_volume::VolumeInfo, json: bool) {
    let h = &i.header;
    let allocated = (i.allocated_objects * u64::from(h.object_size)).min(h.size);
    if json {
        let mut v = header_json(&i.name, h);
        v["pool"] = pool.into();
        v["data_pool"] = i.data_pool.clone().into();
        v["objects"] = h.object_count().into();
        v["allocated_objects"] = i.allocated_objects.into();
        v["allocated_bytes_max"] = allocated.into();
        v["snapshots"] = i.snapshots.into();
        v["clone_objects"] = i.clone_objects.into();
        let q = |q: &cairn_volume::snaps::Qos| {
            serde_json::json!({
                "iops": q.iops, "bps": q.bps,
                "iops_burst": q.iops_burst, "bps_burst": q.bps_burst,
            })
        };
        v["qos"] = q(&i.qos);
        v["pool_qos"] = q(&i.pool_qos);
        v["open_by"] = i.holders.into();
        v["parent"] = match &i.parent {
            Some(p) => format!("{}@{}", p.volume, p.snap).into(),
            None => serde_json::Value::Null,
        };
        v["rates"] = serde_json::json!({
            "read_ops": i.rates.read_ops, "write_ops": i.rates.write_ops,
            "read_bytes": i.rates.read_bytes, "write_bytes": i.rates.write_bytes,
        });
        println!("{v}");
        return;
    }
    println!("volume:      {}", i.name);
    println!("pool:        {pool}");
    if let Some(d) = &i.data_pool {
        println!("data pool:   {d}");
    }
    println!("size:        {} ({} bytes)", human(h.size), h.size);
    println!("object size: {}", human(u64::from(h.object_size)));
    println!(
        "allocated:   {} of {} objects (at most {})",
        i.allocated_objects,
        h.object_count(),
        human(allocated)
    );
    println!(
        "snapshots:   {} ({} clone objects)",
        i.snapshots, i.clone_objects
    );
    if let Some(p) = &i.parent {
        println!(
            "parent:      {}@{} (clone; `cairn vol flatten {}` detaches it)",
            p.volume, p.snap, i.name
        );
    }
    if !i.qos.is_limited() && i.pool_qos.is_limited() {
        let pool_default = crate::qos_cmd::describe(&i.pool_qos);
        println!("qos:         {pool_default} (the pool's default)");
    } else {
        println!("qos:         {}", crate::qos_cmd::describe(&i.qos));
    }
    let r = &i.rates;
    println!(
        "now:         open by {} process(es): {} read/s ({}/s), {} write/s ({}/s)",
        i.holders,
        r.read_ops,
        human(r.read_bytes),
        r.write_ops,
        human(r.write_bytes)
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
    if let Some(room) = crate::capacity::usable(&map, &uses, p.raw_per_byte()) {
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
