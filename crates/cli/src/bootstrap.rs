//! `cairn cluster bootstrap`: the first host of a new cluster. Writes the first monitor's
//! directory (its keyring with the monitors' shared key and the administrator's bootstrap
//! key, and `mon.toml`, so `cairn mon run --dir DIR` starts it), the host configuration
//! (`/etc/cairn/cairn.toml`) and the administrator's keyring beside it. Nothing is started:
//! `cairn mon run --dir DIR` (or the `cairn-mon@` unit) does that.

use anyhow::{bail, Context, Result};
use cairn_auth::{Caps, Entity, KeyEntry, Keyring, Secret};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The file in a monitor's directory that `cluster bootstrap` writes and `mon run` reads.
pub const MON_TOML: &str = "mon.toml";

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Create a new cluster on this host: the first monitor's directory, keys and the host
    /// configuration (nothing is started).
    Bootstrap(BootstrapArgs),
}

#[derive(Args)]
pub struct BootstrapArgs {
    /// Address the first monitor serves on (IP:PORT): this host's address on the storage
    /// network, which every host must reach.
    #[arg(long)]
    pub mon_addr: SocketAddr,
    /// The first monitor's directory.
    #[arg(long, default_value = "/var/lib/cairn/mon.0")]
    pub mon_dir: PathBuf,
    /// Where the configuration (cairn.toml) and the administrator's keyring are written;
    /// copy both to every host of the cluster.
    #[arg(long, default_value = "/etc/cairn")]
    pub conf_dir: PathBuf,
    /// Frame protection every daemon requires: plain, signed or secure.
    #[arg(long, value_parser = crate::daemon_auth::parse_frames)]
    pub frames: Option<cairn_transport::FrameMode>,
}

/// What `mon.toml` holds: the settings `mon run --dir` takes from it unless given flags.
#[derive(Debug, Serialize, Deserialize)]
pub struct MonToml {
    pub id: u64,
    pub listen: SocketAddr,
    pub fsid: String,
    /// The members the cluster is formed with on first start, as `ID=IP:PORT`.
    pub members: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<String>,
}

impl MonToml {
    /// Reads `DIR/mon.toml` if there is one.
    pub fn load(dir: &Path) -> Result<Option<MonToml>> {
        crate::conf::load_toml(&dir.join(MON_TOML))
    }
}

pub fn run(cmd: ClusterCmd) -> Result<()> {
    let ClusterCmd::Bootstrap(a) = cmd;
    let conf_path = a.conf_dir.join("cairn.toml");
    for existing in [conf_path.clone(), a.mon_dir.join(MON_TOML)] {
        if existing.exists() {
            bail!(
                "{} exists: this host already belongs to a cluster (remove it to bootstrap a \
                 new one)",
                existing.display()
            );
        }
    }
    if a.mon_addr.port() == 0 || a.mon_addr.ip().is_unspecified() {
        bail!(
            "--mon-addr {}: give this host's address and a fixed port (clients are told it)",
            a.mon_addr
        );
    }
    let fsid = crate::conf::hex16(&crate::dev::random_fsid()?);
    let addr = a.mon_addr.to_string();
    let admin = KeyEntry {
        entity: Entity::admin(),
        secret: Secret::generate(),
        caps: Some(Caps::admin()),
    };
    std::fs::create_dir_all(&a.mon_dir)
        .with_context(|| format!("cannot create {}", a.mon_dir.display()))?;
    std::fs::create_dir_all(&a.conf_dir)
        .with_context(|| format!("cannot create {}", a.conf_dir.display()))?;
    let mon_key = KeyEntry {
        entity: Entity::mon(0),
        secret: Secret::generate(),
        caps: None,
    };
    Keyring {
        keys: vec![mon_key, admin.clone()],
    }
    .save(&a.mon_dir.join("keyring"))?;
    Keyring { keys: vec![admin] }.save(&a.conf_dir.join("keyring"))?;
    let frames = a.frames.map(|f| f.to_string());
    let mon = MonToml {
        id: 0,
        listen: a.mon_addr,
        fsid: fsid.clone(),
        members: vec![format!("0={addr}")],
        frames: frames.clone(),
    };
    let text = toml::to_string(&mon).context("encoding mon.toml")?;
    std::fs::write(a.mon_dir.join(MON_TOML), text)
        .with_context(|| format!("cannot write {}", a.mon_dir.join(MON_TOML).display()))?;
    crate::conf::save(
        &conf_path,
        &crate::conf::Conf {
            cluster: crate::conf::ClusterConf {
                fsid: fsid.clone(),
                mons: vec![addr.clone()],
                keyring: Some("keyring".into()),
                entity: Some("client.admin".into()),
                frames,
            },
        },
    )?;
    println!("{fsid}");
    eprintln!(
        "cluster {fsid}: monitor 0 at {addr}, its directory {}; configuration {} and the \
         administrator's keyring beside it (copy both to every host).\nStart the monitor: \
         `cairn mon run --dir {}`",
        a.mon_dir.display(),
        conf_path.display(),
        a.mon_dir.display()
    );
    Ok(())
}
