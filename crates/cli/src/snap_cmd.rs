//! `cairn vol snap`: snapshots of block volumes.

use crate::size::human;
use crate::vol_cmd::PoolArg;
use anyhow::{anyhow, bail, Result};
use cairn_client::Client;
use cairn_volume::SnapEvent;
use clap::Subcommand;
use std::time::Instant;

#[derive(Subcommand)]
pub enum SnapCmd {
    /// Take a crash-consistent snapshot: instant, copy-on-write (a data object is copied on
    /// its first change after the snapshot). While the volume is served, its servers adopt
    /// the snapshot within a fraction of a second; the command waits for them.
    Create {
        /// VOL@SNAP: volume and snapshot name (letters, digits, '.', '_', '-').
        spec: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// List a volume's snapshots.
    Ls {
        /// Volume name.
        volume: String,
        #[command(flatten)]
        pool: PoolArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a snapshot, then the clones no other snapshot reads (its exclusive space).
    /// Servers exporting the snapshot (VOL@SNAP) close it first.
    Rm {
        /// VOL@SNAP.
        spec: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Set the volume back to a snapshot (data and size). The volume must not be served;
    /// newer snapshots are kept.
    Rollback {
        /// VOL@SNAP.
        spec: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Protect a snapshot from removal.
    Protect {
        /// VOL@SNAP.
        spec: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Allow a protected snapshot to be removed again.
    Unprotect {
        /// VOL@SNAP.
        spec: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Remove clones no snapshot reads any more (finishes an interrupted `snap rm`).
    Trim {
        /// Volume name.
        volume: String,
        #[command(flatten)]
        pool: PoolArg,
    },
}

/// Splits `VOL@SNAP`.
pub fn split(spec: &str) -> Result<(&str, &str)> {
    spec.split_once('@')
        .filter(|(v, s)| !v.is_empty() && !s.is_empty())
        .ok_or_else(|| anyhow!("{spec:?}: expected VOLUME@SNAPSHOT"))
}

pub async fn run(client: &Client, cmd: SnapCmd) -> Result<()> {
    match cmd {
        SnapCmd::Create { spec, pool } => {
            let (vol, snap) = split(&spec)?;
            let start = Instant::now();
            let mut out = Output::new(vol);
            let s = cairn_volume::create_snap(client, &pool.pool, vol, snap, &mut |e| out.show(e))
                .await;
            out.finish();
            let s = s?;
            eprintln!(
                "created snapshot {vol}@{} (id {}, {}) in {} ms",
                s.name,
                s.id,
                human(s.size),
                start.elapsed().as_millis()
            );
        }
        SnapCmd::Ls { volume, pool, json } => ls(client, &pool.pool, &volume, json).await?,
        SnapCmd::Rm { spec, pool } => {
            let (vol, snap) = split(&spec)?;
            let mut out = Output::new(vol);
            let r = cairn_volume::remove_snap(client, &pool.pool, vol, snap, &mut |e| out.show(e))
                .await;
            out.finish();
            r?;
            eprintln!("removed snapshot {spec}");
        }
        SnapCmd::Rollback { spec, pool } => {
            let (vol, snap) = split(&spec)?;
            let mut out = Output::new(vol);
            let r =
                cairn_volume::rollback_snap(client, &pool.pool, vol, snap, &mut |e| out.show(e))
                    .await;
            out.finish();
            r?;
            eprintln!("rolled volume {vol} back to snapshot {snap}");
        }
        SnapCmd::Protect { spec, pool } => protect(client, &pool.pool, &spec, true).await?,
        SnapCmd::Unprotect { spec, pool } => protect(client, &pool.pool, &spec, false).await?,
        SnapCmd::Trim { volume, pool } => {
            let mut out = Output::new(&volume);
            let r = cairn_volume::trim(client, &pool.pool, &volume, &mut |e| out.show(e)).await;
            out.finish();
            r?;
        }
    }
    Ok(())
}

/// `vol diff VOL@A [VOL@B]`.
pub async fn diff(
    client: &Client,
    pool: &str,
    from: &str,
    to: Option<&str>,
    json: bool,
) -> Result<()> {
    let (vol, a) = split(from)?;
    let b = match to {
        Some(spec) => {
            let (v, b) = split(spec)?;
            if v != vol {
                bail!("{from} and {spec} are snapshots of different volumes");
            }
            Some(b)
        }
        None => None,
    };
    let mut progress = crate::progress::Progress::new("comparing changed data objects");
    let changed =
        cairn_volume::diff(client, pool, vol, a, b, &mut |d, t| progress.show(d, t)).await;
    progress.finish();
    let changed = changed?;
    let bytes: u64 = changed.iter().map(|c| c.len).sum();
    if json {
        let extents: Vec<serde_json::Value> = changed
            .iter()
            .map(|c| serde_json::json!({ "offset": c.offset, "length": c.len }))
            .collect();
        let v = serde_json::json!({
            "volume": vol,
            "from": a,
            "to": b,
            "block": cairn_volume::DIFF_BLOCK,
            "changed_bytes": bytes,
            "extents": extents,
        });
        println!("{v}");
        return Ok(());
    }
    for c in &changed {
        println!("{:>16} {:>12}", c.offset, c.len);
    }
    eprintln!(
        "{} changed in {} extent(s) from {from} to {}",
        human(bytes),
        changed.len(),
        to.unwrap_or("now")
    );
    Ok(())
}

/// `vol du VOL`.
pub async fn du(client: &Client, pool: &str, name: &str, json: bool) -> Result<()> {
    let u = cairn_volume::usage(client, pool, name).await?;
    if json {
        let snaps: Vec<serde_json::Value> = u
            .snaps
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name, "id": s.id,
                    "clone_bytes": s.clone_bytes, "exclusive_bytes": s.exclusive_bytes,
                })
            })
            .collect();
        let v = serde_json::json!({
            "volume": name,
            "head_bytes": u.head_bytes,
            "clone_bytes": u.clone_bytes,
            "snapshots": snaps,
        });
        println!("{v}");
        return Ok(());
    }
    println!("{:<32} {:>12} {:>12}", "name", "clones", "exclusive");
    for s in &u.snaps {
        println!(
            "{:<32} {:>12} {:>12}",
            format!("{name}@{}", s.name),
            human(s.clone_bytes),
            human(s.exclusive_bytes)
        );
    }
    println!("{:<32} {:>12}", name, human(u.head_bytes));
    println!(
        "{:<32} {:>12}",
        "<total>",
        human(u.head_bytes + u.clone_bytes)
    );
    Ok(())
}

async fn protect(client: &Client, pool: &str, spec: &str, on: bool) -> Result<()> {
    let (vol, snap) = split(spec)?;
    cairn_volume::protect_snap(client, pool, vol, snap, on).await?;
    let what = if on { "protected" } else { "unprotected" };
    eprintln!("{what} snapshot {spec}");
    Ok(())
}

async fn ls(client: &Client, pool: &str, volume: &str, json: bool) -> Result<()> {
    let l = cairn_volume::list_snaps(client, pool, volume).await?;
    let state = |s: &cairn_volume::snaps::Snap| if s.active { "ready" } else { "creating" };
    if json {
        let snaps: Vec<serde_json::Value> = l
            .table
            .snaps
            .iter()
            .map(|s| {
                serde_json::json!({
                    "id": s.id,
                    "name": s.name,
                    "size": s.size,
                    "created": s.created,
                    "created_at": crate::size::iso8601(s.created),
                    "protected": s.protected,
                    "state": state(s),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "volume": volume, "snapshots": snaps })
        );
        return Ok(());
    }
    println!(
        "{:>5}  {:<32} {:>10}  {:<20}  {:<9}  protected",
        "id", "name", "size", "created", "state"
    );
    for s in &l.table.snaps {
        println!(
            "{:>5}  {:<32} {:>10}  {:<20}  {:<9}  {}",
            s.id,
            s.name,
            human(s.size),
            crate::size::iso8601(s.created),
            state(s),
            if s.protected { "yes" } else { "no" }
        );
    }
    Ok(())
}

/// Progress on stderr: holders being waited for, clones trimmed, objects rolled back.
struct Output<'a> {
    volume: &'a str,
    progress: Option<crate::progress::Progress>,
    last_wait: Option<Instant>,
}

impl<'a> Output<'a> {
    fn new(volume: &'a str) -> Output<'a> {
        Output {
            volume,
            progress: None,
            last_wait: None,
        }
    }

    fn show(&mut self, e: SnapEvent<'_>) {
        let (label, done, total) = match e {
            SnapEvent::Waiting(holders) => {
                // Holders adopt within a poll: say nothing unless it takes a while.
                let first = *self.last_wait.get_or_insert_with(Instant::now);
                if first.elapsed().as_secs() >= 2 {
                    self.last_wait = Some(Instant::now());
                    eprintln!(
                        "waiting for the server(s) of volume {} to adopt the change: {}",
                        self.volume,
                        cairn_volume::describe_holders(holders)
                    );
                }
                return;
            }
            SnapEvent::Trimmed { done, total } => ("removing unneeded clones", done, total),
            SnapEvent::RolledBack { done, total } => ("rolling back data objects", done, total),
        };
        self.progress
            .get_or_insert_with(|| crate::progress::Progress::new(label))
            .show(done, total);
    }

    fn finish(&self) {
        if let Some(p) = &self.progress {
            p.finish();
        }
    }
}
