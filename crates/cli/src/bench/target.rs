//! The running cluster a benchmark measures: its processes (for CPU accounting), a client,
//! and a throw-away pool that is removed however the benchmark ends.

use super::objects::cluster_pids;
use anyhow::{bail, Context, Result};
use cairn_client::Client;
use cairn_map::{Durability, MapChange};
use std::future::Future;
use std::path::{Path, PathBuf};

pub struct Target {
    /// The configuration file found (`-c`, `CAIRN_CONF`, `./cairn-dev/cairn.toml`).
    pub conf: PathBuf,
    /// The cluster's processes on this machine.
    pub pids: Vec<i32>,
    pub rt: tokio::runtime::Runtime,
    pub client: Client,
}

impl Target {
    /// Finds the cluster and connects to it.
    pub fn connect(conf: Option<&Path>) -> Result<Target> {
        let conf: PathBuf = crate::conf::locate(conf)?;
        let cfg = crate::conf::load(Some(&conf))?;
        let pids = cluster_pids(&conf);
        if pids.is_empty() {
            bail!("found no cluster processes to measure CPU of (is the cluster running on this machine?)");
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = rt.block_on(Client::connect(crate::conf::client_config(
            cfg.cluster.mons,
        )))?;
        Ok(Target {
            conf,
            pids,
            rt,
            client,
        })
    }

    /// Creates pool `name` (64 PGs, min_size = size - 1), runs `f`, then removes the pool.
    pub fn with_pool<T>(
        &self,
        name: &str,
        size: u8,
        durability: Durability,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let c = MapChange::PoolCreateRule {
            name: name.to_string(),
            size,
            min_size: size.saturating_sub(1).max(1),
            pg_count: 64,
            durability,
            domain: None,
        };
        self.with_change(c, name, f)
    }

    /// Runs `f` with the pool `create` makes (named `name`), removed afterwards.
    pub fn with_change<T>(
        &self,
        create: MapChange,
        name: &str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.rt.block_on(self.client.mon().command(create))?;
        let result = f();
        let rm = MapChange::PoolRemove {
            name: name.to_string(),
        };
        let removed = self.rt.block_on(self.client.mon().command(rm));
        let out = result?;
        removed.with_context(|| format!("cannot remove the bench pool {name}"))?;
        Ok(out)
    }

    /// Runs a future on the bench's runtime.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}
