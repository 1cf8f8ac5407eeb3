//! `cairn osd create`: prepares an OSD on this host, so that `cairn osd run --dir DIR` (or
//! the `cairn-osd@` systemd unit) starts it with nothing else to say. It formats the store,
//! has the monitors give it the next id (down and out until its first boot), registers its
//! key for that id, and writes `DIR/osd.toml` (devices, host, listen address) and
//! `DIR/keyring`.

use anyhow::{bail, Context, Result};
use cairn_auth::{Caps, Entity, Keyring};
use cairn_map::{ChangeOutcome, MapChange};
use cairn_monclient::auth::AuthAnswer;
use cairn_proto::msg::mon::AuthRequest;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The file in an OSD's directory that `osd create` writes and `osd run` reads.
pub const OSD_TOML: &str = "osd.toml";

#[derive(Args)]
pub struct CreateArgs {
    /// Directory of the new OSD (created; it must not hold an OSD yet).
    #[arg(long)]
    pub dir: PathBuf,
    #[command(flatten)]
    pub devices: crate::osd_cmd::Devices,
    /// Host name (failure domain) [default: this machine's name].
    #[arg(long)]
    pub host: Option<String>,
    /// Address the OSD will serve on (IP:PORT, port 0 = any free port): this host's address
    /// on the storage network.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Placement weight (1.0 = a typical device).
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
}

/// What `osd.toml` holds: the settings `osd run --dir` takes from it unless given flags.
#[derive(Debug, Serialize, Deserialize)]
pub struct OsdToml {
    /// The id the monitors gave it (its key is bound to it).
    pub id: u32,
    pub data: PathBuf,
    pub wal: Option<PathBuf>,
    pub host: String,
    pub listen: SocketAddr,
}

impl OsdToml {
    /// Reads `DIR/osd.toml` if there is one.
    pub fn load(dir: &Path) -> Result<Option<OsdToml>> {
        crate::conf::load_toml(&dir.join(OSD_TOML))
    }
}

/// The machine's name, for OSDs not told their host.
pub fn machine_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

pub fn create(a: CreateArgs, conf: Option<&Path>) -> Result<()> {
    if let Some(t) = OsdToml::load(&a.dir)? {
        bail!(
            "{} already holds osd.{}: start it with `cairn osd run --dir {}`",
            a.dir.display(),
            t.id,
            a.dir.display()
        );
    }
    if !(a.weight > 0.0 && a.weight <= 4096.0) {
        bail!("--weight {}: need 0 < weight <= 4096", a.weight);
    }
    let mons = crate::conf::load(conf)?.cluster.mons;
    let mut cfg = cairn_osd::OsdConfig::new(a.dir.clone(), mons);
    a.devices.apply(&mut cfg);
    let data = cfg.data_path();
    let store_id = cairn_osd::open_store(&cfg)
        .with_context(|| format!("cannot create the store on {}", data.display()))?
        .store_id();
    eprintln!("formatted the store on {}", data.display());

    let host = a.host.unwrap_or_else(machine_host);
    let mon = crate::admin::mon_client(conf)?;
    let change = MapChange::OsdCreate {
        store_id,
        host: host.clone(),
        weight: (a.weight * 65536.0).round() as u32,
    };
    let id = match crate::admin::block_on_mon(&mon.addrs(), mon.command(change))?? {
        ChangeOutcome::Changed { id, .. } => id,
        ChangeOutcome::Unchanged => {
            let map = crate::admin::block_on_mon(&mon.addrs(), mon.get_map())??;
            map.osds
                .values()
                .find(|o| o.store_id == store_id)
                .map(|o| o.id)
                .context("the monitors know this store but the map does not list it")?
        }
    };
    if let Some(me) = crate::conf::own_key() {
        let entity = Entity::osd(id);
        let add = AuthRequest::Add {
            entity: entity.clone(),
            caps: Caps::default(),
        };
        let answer = crate::admin::block_on_mon(&mon.addrs(), mon.auth_request(add, &me))?
            .with_context(|| format!("cannot register the key of {entity} (needs `mon x`)"))?;
        let AuthAnswer::Key(entry) = answer else {
            bail!("the monitors answered without the key of {entity}");
        };
        Keyring { keys: vec![entry] }.save(&a.dir.join("keyring"))?;
    }
    let t = OsdToml {
        id,
        data,
        wal: a.devices.wal,
        host,
        listen: a.listen,
    };
    let text = toml::to_string(&t).context("encoding osd.toml")?;
    std::fs::write(a.dir.join(OSD_TOML), text)
        .with_context(|| format!("cannot write {}", a.dir.join(OSD_TOML).display()))?;
    println!("osd.{id}");
    eprintln!(
        "prepared osd.{id} in {} (down and out until it first starts): start it with \
         `cairn osd run --dir {}`",
        a.dir.display(),
        a.dir.display()
    );
    Ok(())
}
