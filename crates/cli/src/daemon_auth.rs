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
    /// How every connection's frames are protected at least: `plain` (default: a header
    /// crc only, for a trusted network), `signed` (every frame authenticated by an
    /// AES-256-GCM tag, its bytes in the clear) or `secure` (every frame encrypted and
    /// authenticated, AES-256-GCM). A peer
    /// asking for more gets more. Needs authentication.
    #[arg(long, value_name = "MODE", value_parser = parse_frames, default_value = "plain")]
    pub frames: cairn_transport::FrameMode,
}

/// Parses a frame protection mode.
pub fn parse_frames(s: &str) -> std::result::Result<cairn_transport::FrameMode, String> {
    cairn_transport::FrameMode::parse(s)
        .ok_or_else(|| format!("{s:?}: the frame protection is plain, signed or secure"))
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
        cairn_failstop::name_daemon(&key.entity.to_string());
        let source = cairn_monclient::auth::KeySource::keyring(&path, &key.entity)?;
        Ok(Some(cairn_osd::OsdKey(source)))
    }
}

/// An OSD's caps on each connection's requests in flight (`cairn_transport::RequestLimits`).
#[derive(clap::Args, Debug, Clone)]
pub struct RequestArgs {
    /// Requests in flight on one connection (read, not yet answered) before the OSD stops
    /// reading it until some are answered: one peer cannot fill the OSD's memory with work
    /// that waits (e.g. writes held up by a slow replica).
    #[arg(long, value_name = "N", default_value_t = cairn_transport::RequestLimits::default().max_requests)]
    pub max_requests_per_connection: usize,
    /// Bytes those requests carry plus the bytes they ask to read, with the same effect
    /// (one request is always let in, however large).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size,
          default_value_t = cairn_transport::RequestLimits::default().max_bytes as u64)]
    pub max_bytes_per_connection: u64,
}

impl RequestArgs {
    /// The limits, checked.
    pub fn limits(&self) -> Result<cairn_transport::RequestLimits> {
        if self.max_requests_per_connection == 0 || self.max_bytes_per_connection == 0 {
            bail!(
                "--max-requests-per-connection and --max-bytes-per-connection must be at least 1"
            );
        }
        Ok(cairn_transport::RequestLimits {
            max_requests: self.max_requests_per_connection,
            max_bytes: usize::try_from(self.max_bytes_per_connection).unwrap_or(usize::MAX),
        })
    }
}

/// A daemon's connection limits (`cairn_transport::ConnLimits`).
#[derive(clap::Args, Debug, Clone)]
pub struct ConnArgs {
    /// Most connections held at once; more are closed as they arrive (logged).
    #[arg(long, value_name = "N", default_value_t = cairn_transport::ConnLimits::default().max_total)]
    pub max_connections: usize,
    /// Most connections from one peer address, so one host cannot take every slot.
    #[arg(long, value_name = "N", default_value_t = cairn_transport::ConnLimits::default().max_per_host)]
    pub max_connections_per_host: usize,
    /// Seconds a connection may send nothing before it is closed (clients reconnect when
    /// they need to; a connection waiting for an answer is not idle).
    #[arg(long, value_name = "SECS", default_value_t = cairn_transport::ConnLimits::default().idle.as_secs())]
    pub idle_timeout: u64,
}

impl ConnArgs {
    /// The limits, checked.
    pub fn limits(&self) -> Result<cairn_transport::ConnLimits> {
        if self.max_connections == 0 || self.max_connections_per_host == 0 {
            bail!("--max-connections and --max-connections-per-host must be at least 1");
        }
        if self.idle_timeout < 2 {
            bail!("--idle-timeout must be at least 2 seconds");
        }
        Ok(cairn_transport::ConnLimits {
            max_total: self.max_connections,
            max_per_host: self.max_connections_per_host,
            idle: std::time::Duration::from_secs(self.idle_timeout),
        })
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn zero_caps_and_short_idle_timeouts_are_refused() {
        let requests = |n, bytes| RequestArgs {
            max_requests_per_connection: n,
            max_bytes_per_connection: bytes,
        };
        assert!(requests(0, 1 << 20).limits().is_err());
        assert!(requests(16, 0).limits().is_err());
        let ok = requests(16, 1 << 20).limits().expect("valid");
        assert_eq!((ok.max_requests, ok.max_bytes), (16, 1 << 20));
        let conns = |total, per_host, idle| ConnArgs {
            max_connections: total,
            max_connections_per_host: per_host,
            idle_timeout: idle,
        };
        assert!(conns(0, 1, 900).limits().is_err());
        assert!(conns(1, 0, 900).limits().is_err());
        assert!(conns(1, 1, 1).limits().is_err());
        assert!(conns(1, 1, 2).limits().is_ok());
    }
}
