//! The NBD users a gateway serves over TLS: every `client.` or `nbd.` entity with NBD caps,
//! with its TLS pre-shared key (derived from its entity key) and caps, fetched from the
//! monitors' key database and kept fresh in memory (the TLS handshake asks for a key
//! synchronously, so it cannot wait for the network).
//!
//! The table is fetched again every `refresh` interval, and at once (at most once a second)
//! when a client presents an identity the table does not know: a user added with `cairn auth
//! add` can connect within a second of its first refused attempt, and a removed or rotated
//! one stops being accepted within `refresh`.

use cairn_auth::{Caps, Perms, Secret};
use cairn_failstop::RwLockOrDie;
use cairn_monclient::auth::{AuthAnswer, KeySource};
use cairn_monclient::{MonClient, MonClientError};
use cairn_nbd::{ClientId, PskKeys};
use cairn_proto::msg::mon::AuthRequest;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Notify;

/// Shortest pause between two fetches, however many unknown identities arrive.
const MIN_REFETCH: Duration = Duration::from_secs(1);

struct User {
    psk: Secret,
    caps: Caps,
}

/// Why an NBD client may not open a volume (answered `NBD_REP_ERR_POLICY`). A permission
/// failure: the same client is refused again until its caps change.
/// (Display and Error by hand: this crate does without `thiserror`.)
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccessDenied {
    /// The client did not authenticate (no TLS), on a server that serves users.
    Unauthenticated,
    /// The identity it proved is not (or no longer) an NBD user.
    NotAUser { identity: String },
    /// The user's NBD caps grant neither `r` nor `w` on the volume.
    NoRead { identity: String, volume: String },
}

impl std::fmt::Display for AccessDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccessDenied::Unauthenticated => {
                f.write_str("permission denied: the client has not authenticated (TLS)")
            }
            AccessDenied::NotAUser { identity } => {
                write!(f, "permission denied: {identity} is no longer an NBD user")
            }
            AccessDenied::NoRead { identity, volume } => {
                write!(
                    f,
                    "permission denied: {identity} lacks r on volume {volume}"
                )
            }
        }
    }
}

impl std::error::Error for AccessDenied {}

/// The users, by identity (the entity name, e.g. `client.alice`).
#[derive(Default)]
pub struct NbdUsers {
    table: RwLock<HashMap<String, User>>,
    unknown_seen: Notify,
}

impl NbdUsers {
    /// Fetches the users once (this gateway's key needs `x` in its NBD caps, or `mon x`).
    pub async fn fetch(mon: &MonClient, me: &KeySource) -> Result<Arc<NbdUsers>, MonClientError> {
        let users = Arc::new(NbdUsers::default());
        users.refetch(mon, me).await?;
        Ok(users)
    }

    async fn refetch(&self, mon: &MonClient, me: &KeySource) -> Result<usize, MonClientError> {
        let AuthAnswer::NbdUsers(list) = mon.auth_request(AuthRequest::NbdUsers, me).await? else {
            return Err(MonClientError::Protocol(
                "the monitors answered the NBD user list with something else".into(),
            ));
        };
        let table: HashMap<String, User> = list
            .into_iter()
            .map(|(entity, caps, psk)| (entity.to_string(), User { psk, caps }))
            .collect();
        let n = table.len();
        *self.table.write_or_die() = table;
        Ok(n)
    }

    /// Keeps the table fresh until the returned task is aborted (errors are logged; the last
    /// table stays in use).
    pub fn keep_fresh(
        self: &Arc<Self>,
        mon: MonClient,
        me: Arc<KeySource>,
        refresh: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let users = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(refresh) => {}
                    () = users.unknown_seen.notified() => {}
                }
                match users.refetch(&mon, &me).await {
                    Ok(n) => tracing::debug!(users = n, "nbd: user table refreshed"),
                    Err(e) => tracing::warn!(error = %e, "nbd: cannot refresh the NBD users"),
                }
                tokio::time::sleep(MIN_REFETCH).await;
            }
        })
    }

    /// Whether `client` may open `volume`, and write it: `Ok(writable)` or the refusal.
    pub fn access(&self, volume: &str, client: &ClientId) -> Result<bool, AccessDenied> {
        let Some(identity) = client.identity.as_deref() else {
            return Err(AccessDenied::Unauthenticated);
        };
        let table = self.table.read_or_die();
        let Some(user) = table.get(identity) else {
            return Err(AccessDenied::NotAUser {
                identity: identity.to_string(),
            });
        };
        let perms = user.caps.volume_perms(volume);
        if !perms.covers(Perms::R) && !perms.covers(Perms::W) {
            return Err(AccessDenied::NoRead {
                identity: identity.to_string(),
                volume: volume.to_string(),
            });
        }
        Ok(perms.covers(Perms::W))
    }

    /// How many users the table holds.
    pub fn len(&self) -> usize {
        self.table.read_or_die().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl PskKeys for NbdUsers {
    fn psk(&self, identity: &str) -> Option<Vec<u8>> {
        let table = self.table.read_or_die();
        let found = table.get(identity).map(|u| u.psk.0.to_vec());
        if found.is_none() {
            self.unknown_seen.notify_one();
        }
        found
    }
}
