//! How a daemon (`cairn mon run`, `cairn osd run`) authenticates: `--keyring` and `--auth`.

use anyhow::{bail, Context, Result};
use cairn_auth::{EntityKind, Keyring};
use std::path::{Path, PathBuf};

/// Whether connections authenticate.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Every connection proves its key (mutual authentication in the handshake).
    Key,
    /// No authentication: anyone who can connect may do anything. Only for a network you
    /// trust completely (benchmarks of the cost of authentication).
    None,
}

/// A daemon's authentication options.
#[derive(clap::Args, Debug, Clone)]
pub struct DaemonAuth {
    /// Keyring holding this daemon's key (mode 0600). Default: DIR/keyring, which
    /// `cairn dev up` writes.
    #[arg(long, value_name = "PATH")]
    pub keyring: Option<PathBuf>,
    /// `key` (default): every connection authenticates; `none`: no authentication.
    #[arg(long, value_enum, default_value_t = AuthMode::Key)]
    pub auth: AuthMode,
}

impl DaemonAuth {
    /// The keyring to use (`None` with `--auth none`); it must exist.
    pub fn keyring(&self, dir: &Path) -> Result<Option<PathBuf>> {
        if self.auth == AuthMode::None {
            tracing::warn!("running without authentication (--auth none): anyone who can connect may do anything");
            return Ok(None);
        }
        let path = self.keyring.clone().unwrap_or_else(|| dir.join("keyring"));
        if !path.exists() {
            bail!(
                "no keyring at {}: give --keyring PATH (`cairn dev up` writes one per daemon), \
                 or --auth none to run without authentication",
                path.display()
            );
        }
        Ok(Some(path))
    }

    /// An OSD's key: its `osd.N` key from the keyring (none with `--auth none`).
    pub fn osd_key(&self, dir: &Path) -> Result<Option<cairn_osd::OsdKey>> {
        let Some(path) = self.keyring(dir)? else {
            return Ok(None);
        };
        let ring = Keyring::load(&path)?;
        let key = ring
            .keys
            .iter()
            .find(|k| k.entity.kind() == EntityKind::Osd)
            .with_context(|| format!("keyring {} has no OSD key (osd.N)", path.display()))?;
        tracing::info!(entity = %key.entity, keyring = %path.display(), "authenticating as");
        Ok(Some(cairn_osd::OsdKey {
            entity: key.entity.clone(),
            secret: key.secret.clone(),
        }))
    }
}
