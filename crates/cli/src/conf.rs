//! `cairn.toml`: how commands find a cluster (`-c FILE` or `CAIRN_CONF`).
//!
//! ```toml
//! [cluster]
//! fsid = "9f0c...e1"                 # 32 hex digits
//! mons = ["127.0.0.1:6789"]          # monitor addresses
//! keyring = "keyring"                # this client's key (relative to this file's directory)
//! entity = "client.admin"            # whose key to use from the keyring (default: the first)
//! frames = "secure"                  # frame protection asked for: plain (default), signed,
//!                                    # secure (the cluster may require more)
//! ```
//!
//! Without `keyring` the client presents no credentials (a cluster run with `--auth none`).

use anyhow::{bail, Context, Result};
use cairn_auth::{Entity, Keyring};
use cairn_transport::Auth;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The parsed configuration file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Conf {
    pub cluster: ClusterConf,
}

/// The `[cluster]` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterConf {
    pub fsid: String,
    pub mons: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyring: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<String>,
}

/// The credentials of this process, set when the configuration is loaded (a command talks
/// to one cluster as one entity).
static AUTH: std::sync::OnceLock<Auth> = std::sync::OnceLock::new();

/// This process's own key (set with [`AUTH`]).
static KEY: std::sync::OnceLock<Arc<cairn_monclient::auth::KeySource>> = std::sync::OnceLock::new();

/// This process's own key, when a configuration with a keyring is loaded.
pub fn own_key() -> Option<Arc<cairn_monclient::auth::KeySource>> {
    KEY.get().cloned()
}

/// The frame protection this process asks for (from `frames` in the configuration).
static FRAMES: std::sync::OnceLock<cairn_transport::FrameMode> = std::sync::OnceLock::new();

/// The frame protection this process asks for (plain unless the configuration says).
pub fn frames() -> cairn_transport::FrameMode {
    FRAMES.get().copied().unwrap_or_default()
}

/// This process's credentials (none until a configuration with a keyring is loaded).
pub fn auth() -> Auth {
    AUTH.get()
        .cloned()
        .unwrap_or_else(|| Arc::new(cairn_transport::NoAuth))
}

/// Uses the key of `entity` (or the first) from the keyring at `path` (read again when the
/// file changes), getting tickets for OSDs from the monitors at `mons`. A process talks to
/// one cluster as one entity: the first keyring it loads is the one it keeps.
pub fn use_keyring(path: &Path, entity: Option<&str>, mons: &[String]) -> Result<()> {
    let ring = Keyring::load(path)?;
    let key = match entity {
        Some(e) => {
            let e = Entity::parse(e)?;
            ring.get(&e)
                .with_context(|| format!("keyring {} has no key for {e}", path.display()))?
        }
        None => ring
            .first()
            .with_context(|| format!("keyring {} holds no key", path.display()))?,
    };
    // Followed: a long-running command (`nbd serve`) takes up a rotated key installed in
    // the file without a restart.
    let source = cairn_monclient::auth::KeySource::keyring(path, &key.entity)?;
    let a: Auth = cairn_monclient::auth::EntityKey::from_source(source.clone(), mons.to_vec());
    if AUTH.set(a).is_ok() {
        let _ = KEY.set(source);
    }
    Ok(())
}

/// Client settings for a cluster with monitors `mons`, with this process's credentials.
pub fn client_config(mons: Vec<String>) -> cairn_client::ClientConfig {
    let mut c = cairn_client::ClientConfig::new(mons);
    c.auth = auth();
    c.frames = frames();
    c
}

/// A monitor client with this process's credentials.
pub fn mon_client(mons: Vec<String>) -> cairn_monclient::MonClient {
    cairn_monclient::MonClient::new(mons)
        .with_auth(auth())
        .with_frames(frames())
}

/// Reads a daemon's settings file (`mon.toml`, `osd.toml`) if there is one.
pub fn load_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            Ok(Some(toml::from_str(&s).with_context(|| {
                format!("{} is damaged", path.display())
            })?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// A host's configuration file (`cairn cluster bootstrap` writes it).
pub const HOST_CONF: &str = "/etc/cairn/cairn.toml";

/// Where the configuration comes from: `-c FILE`, else `CAIRN_CONF`, else `./cairn-dev/cairn.toml`
/// when it exists, else [`HOST_CONF`] when it exists.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("CAIRN_CONF") {
        return Ok(PathBuf::from(p));
    }
    let dev = PathBuf::from(crate::dev::DEFAULT_DIR).join("cairn.toml");
    if dev.exists() {
        return Ok(dev);
    }
    let host = PathBuf::from(HOST_CONF);
    if host.exists() {
        return Ok(host);
    }
    bail!(
        "no cluster configuration: pass -c FILE or set CAIRN_CONF (`cairn dev up` writes one, \
         `cairn cluster bootstrap` writes {HOST_CONF})"
    )
}

/// Reads and checks a configuration file.
pub fn load(explicit: Option<&Path>) -> Result<Conf> {
    let path = locate(explicit)?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read cluster configuration {}", path.display()))?;
    let conf: Conf = toml::from_str(&text)
        .with_context(|| format!("{} is not a valid cairn.toml", path.display()))?;
    if conf.cluster.mons.is_empty() {
        bail!("{}: [cluster] mons is empty", path.display());
    }
    if let Some(f) = &conf.cluster.frames {
        let mode = crate::daemon_auth::parse_frames(f)
            .map_err(|e| anyhow::anyhow!("{}: [cluster] frames: {e}", path.display()))?;
        let _ = FRAMES.set(mode);
    }
    if let Some(k) = &conf.cluster.keyring {
        let dir = path.parent().unwrap_or(Path::new("."));
        use_keyring(
            &dir.join(k),
            conf.cluster.entity.as_deref(),
            &conf.cluster.mons,
        )
        .with_context(|| format!("{}: [cluster] keyring", path.display()))?;
    }
    Ok(conf)
}

/// Writes a configuration file.
pub fn save(path: &Path, conf: &Conf) -> Result<()> {
    let text = toml::to_string(conf).context("cannot encode the configuration")?;
    let header = "# Cairn cluster configuration. Commands find it with -c FILE or CAIRN_CONF.\n";
    std::fs::write(path, format!("{header}{text}"))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Parses 32 hex digits.
pub fn parse_fsid(s: &str) -> Result<[u8; 16]> {
    let s = s.trim();
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("fsid {s:?} is not 32 hex digits");
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)?;
    }
    Ok(out)
}

/// Formats 16 bytes as 32 hex digits.
pub fn hex16(b: &[u8; 16]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
