//! `cairn osd blocklist`: the fenced client instances (`ClusterMap::blocklist`).
//!
//! A new writer of a volume fences the previous one by itself (docs/operator/volumes.md,
//! "One writer per volume"); these commands show the fences, lift one early, or fence by
//! hand (an instance is the `instance` shown by `cairn vol info` for each holder).

use anyhow::{bail, Result};
use cairn_map::MapChange;
use clap::Subcommand;
use std::path::Path;

#[derive(Subcommand)]
pub enum BlocklistCmd {
    /// List the fenced client instances and when each fence ends.
    Ls(crate::admin::JsonFlag),
    /// Fence a client instance for an hour: every OSD refuses its ops. Needs `mon w`, or
    /// `osd w` on --pool.
    Add {
        /// The instance, in hex (as `cairn vol info` shows a holder's).
        instance: String,
        /// The pool whose data the fence protects (what the caps check).
        #[arg(long)]
        pool: String,
    },
    /// Lift a fence before it ends: the instance's ops are served again.
    Rm {
        /// The instance, in hex.
        instance: String,
    },
}

fn parse_instance(s: &str) -> Result<u64> {
    match u64::from_str_radix(s.trim_start_matches("0x"), 16) {
        Ok(0) | Err(_) => bail!("{s:?} is not a client instance: give the 16 hex digits `cairn vol info` or `cairn osd blocklist ls` shows"),
        Ok(v) => Ok(v),
    }
}

pub fn run(cmd: BlocklistCmd, conf: Option<&Path>) -> Result<()> {
    match cmd {
        BlocklistCmd::Ls(j) => ls(conf, j.json),
        BlocklistCmd::Add { instance, pool } => {
            let instance = parse_instance(&instance)?;
            let change = MapChange::BlocklistAdd {
                instance,
                pool,
                until: 0,
            };
            crate::admin::change(conf, change, &format!("fence {instance:016x}"))
        }
        BlocklistCmd::Rm { instance } => {
            let instance = parse_instance(&instance)?;
            let change = MapChange::BlocklistRemove { instance };
            crate::admin::change(conf, change, &format!("lift fence {instance:016x}"))
        }
    }
}

fn ls(conf: Option<&Path>, json: bool) -> Result<()> {
    let map = crate::admin::get_map(conf)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if json {
        let v: Vec<_> = map
            .blocklist
            .iter()
            .map(|(i, until)| serde_json::json!({"instance": format!("{i:016x}"), "until": until}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if map.blocklist.is_empty() {
        println!("no client instance is fenced");
        return Ok(());
    }
    println!("{:<18} ends in", "instance");
    for (i, until) in &map.blocklist {
        println!("{i:016x}   {} s", until.saturating_sub(now));
    }
    Ok(())
}
