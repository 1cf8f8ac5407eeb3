//! `cairn.toml`: how commands find a cluster (`-c FILE` or `CAIRN_CONF`).
//!
//! ```toml
//! [cluster]
//! fsid = "9f0c...e1"                 # 32 hex digits
//! mons = ["127.0.0.1:6789"]          # monitor addresses
//! ```

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
}

/// Where the configuration comes from: `-c FILE`, else `CAIRN_CONF`, else `./cairn-dev/cairn.toml`
/// when it exists.
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
    bail!("no cluster configuration: pass -c FILE or set CAIRN_CONF (`cairn dev up` writes one)")
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
