//! Monitor configuration.

use crate::error::MonError;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Default time without a heartbeat after which the leader marks an OSD down.
pub const DEFAULT_OSD_GRACE: Duration = Duration::from_secs(4);
/// Default time an OSD stays down before it is marked out: 10 minutes.
pub const DEFAULT_DOWN_OUT_INTERVAL: Duration = Duration::from_secs(600);
/// Default election timeout range in milliseconds. A leader is replaced this long after it
/// stops sending heartbeats (which it does every third of the minimum).
pub const DEFAULT_ELECTION_TIMEOUT_MS: (u64, u64) = (300, 600);
/// Default time a command may take to commit before the client is told `Unavailable`.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(4);
/// Default number of log entries between snapshots of the map.
pub const DEFAULT_SNAPSHOT_LOGS: u64 = 1000;
/// Default of [`MonConfig::history_keep`].
pub const DEFAULT_HISTORY_KEEP: u64 = 500;

/// How to run one monitor.
#[derive(Debug, Clone)]
pub struct MonConfig {
    /// This monitor's id; must be a key of `members`.
    pub id: u64,
    /// Every monitor of the cluster (this one included): id -> `ip:port` where it serves
    /// clients and peers. Used to form the cluster on first start; afterwards the membership
    /// stored in the Raft log is authoritative.
    pub members: BTreeMap<u64, String>,
    /// Data directory; holds `mon.redb`.
    pub dir: PathBuf,
    /// Cluster identity. Every monitor of a cluster must be given the same one: a data dir
    /// created for another fsid is refused, and peers with another fsid are not answered.
    pub fsid: [u8; 16],
    /// Time without a heartbeat after which the leader marks an OSD down.
    pub osd_grace: Duration,
    /// Mark an OSD out after it has been down this long (its PGs move and are recovered
    /// elsewhere).
    pub down_out_interval: Duration,
    /// Raft election timeout range (min, max) in milliseconds.
    pub election_timeout_ms: (u64, u64),
    /// How long a command waits to be committed before the reply is `Unavailable`.
    pub command_timeout: Duration,
    /// Log entries between snapshots of the map; as many are kept after a snapshot, so a
    /// monitor that was away for fewer changes catches up from the log, otherwise from the
    /// leader's snapshot.
    pub snapshot_logs: u64,
    /// Epochs of map history kept at least, even when every PG has gone active since (the
    /// history is otherwise trimmed to the oldest epoch a PG may still need for peering).
    pub history_keep: u64,
    /// The monitor's keyring (the monitors' shared key and the entities it knows): every
    /// connection must then authenticate. `None`: no authentication (`--auth none`).
    pub keyring: Option<PathBuf>,
    /// Connection caps and the idle limit of the monitor's port (`ConnLimits` says each
    /// default). A connection with a subscription or a command in flight is never idle.
    pub conn_limits: cairn_transport::ConnLimits,
    /// How every connection's frames are protected at least (clients and monitor peers;
    /// a peer asking for more gets more). Needs a keyring. Default plain.
    pub frames: cairn_transport::FrameMode,
    /// This monitor joins a running cluster: it never forms one, and waits until the leader
    /// adds it (`cairn mon add`); `members` is then just itself.
    pub join: bool,
    /// Where to serve Prometheus metrics over HTTP (`GET /metrics`), and the token a scrape
    /// must show; `None`: no endpoint.
    pub metrics_listen: Option<cairn_metrics::Listen>,
}

impl MonConfig {
    /// A configuration with the default timings.
    pub fn new(id: u64, members: BTreeMap<u64, String>, dir: PathBuf, fsid: [u8; 16]) -> Self {
        MonConfig {
            id,
            members,
            dir,
            fsid,
            osd_grace: DEFAULT_OSD_GRACE,
            down_out_interval: DEFAULT_DOWN_OUT_INTERVAL,
            election_timeout_ms: DEFAULT_ELECTION_TIMEOUT_MS,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            snapshot_logs: DEFAULT_SNAPSHOT_LOGS,
            history_keep: DEFAULT_HISTORY_KEEP,
            keyring: None,
            metrics_listen: None,
            conn_limits: cairn_transport::ConnLimits::default(),
            frames: cairn_transport::FrameMode::Plain,
            join: false,
        }
    }

    /// Checks what the monitor cannot run with.
    pub fn validate(&self) -> Result<(), MonError> {
        let bad = |s: String| Err(MonError::Config(s));
        if !self.members.contains_key(&self.id) {
            return bad(format!(
                "monitor {} is not in the member list {:?}: add --member {}=ADDR",
                self.id,
                self.members.keys().collect::<Vec<_>>(),
                self.id
            ));
        }
        for (id, addr) in &self.members {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return bad(format!("member {id} address {addr:?} is not ip:port"));
            }
        }
        if self.keyring.is_none() && self.frames != cairn_transport::FrameMode::Plain {
            return bad(format!(
                "{} frames need authentication: give the monitor its keyring (or --frames plain)",
                self.frames
            ));
        }
        let (lo, hi) = self.election_timeout_ms;
        if lo < 20 || hi <= lo {
            return bad(format!(
                "election timeout {lo}..{hi} ms: need 20 <= min < max"
            ));
        }
        if self.osd_grace < Duration::from_millis(100) {
            return bad(format!(
                "osd grace {:?} is too short: use at least 100 ms",
                self.osd_grace
            ));
        }
        if self.command_timeout.is_zero() {
            return bad("command timeout must be positive".into());
        }
        if self.snapshot_logs == 0 {
            return bad("snapshot interval must be at least 1 log entry".into());
        }
        Ok(())
    }

    /// The monitor that creates the cluster on first start: the lowest id.
    pub(crate) fn bootstrapper(&self) -> u64 {
        self.members.keys().next().copied().unwrap_or(self.id)
    }
}

/// Formats an fsid as 32 lowercase hex digits.
pub fn fsid_hex(fsid: &[u8; 16]) -> String {
    fsid.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 32 hex digits (dashes allowed, as in a uuid) into an fsid.
pub fn parse_fsid(s: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hex = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(hex, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsid_round_trips_through_hex() {
        let f = [0xab; 16];
        assert_eq!(parse_fsid(&fsid_hex(&f)), Some(f));
        assert_eq!(
            parse_fsid("00112233-4455-6677-8899-aabbccddeeff").map(|f| f[15]),
            Some(0xff)
        );
        assert_eq!(parse_fsid("xyz"), None);
        assert_eq!(parse_fsid(&"g".repeat(32)), None);
    }

    #[test]
    fn config_needs_self_in_members() {
        let mut members = BTreeMap::new();
        members.insert(2, "127.0.0.1:1".to_string());
        let c = MonConfig::new(1, members, PathBuf::from("/nonexistent"), [0; 16]);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--member 1="), "{e}");
    }
}
