//! How an OSD authenticates: its `osd.N` key to the monitors; to other OSDs, tickets it mints
//! itself with the service keys the monitors give it (an OSD is trusted with them: it opens
//! every client's ticket with them anyway). The same keys open the tickets peers present.

use cairn_auth::service::mint;
use cairn_auth::{unix_now, Caps, Entity, ServiceKeys};
use cairn_monclient::auth::KeySource;
use cairn_transport::{
    node_kind, ready_credentials, Authenticator, Credentials, CredentialsFuture, NoCredentials,
};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How long a ticket an OSD mints for its peers is good for (it mints one per connection).
const PEER_TICKET_TTL_SECS: u64 = 600;

/// How often the service keys are fetched again. A new one comes into use each day by itself,
/// but after a rotation of the monitors' key (`cairn auth rotate mon`) the OSDs must hold the
/// new key's service keys before its grace ends (`cairn_auth::MIN_MON_KEEP_OLD_SECS`, twice
/// this). One small request to a monitor.
pub(crate) const SERVICE_KEY_REFRESH: Duration = Duration::from_secs(30);

/// An OSD's key: its `osd.N` entity and where the key comes from (its keyring file, read
/// again when it changes, so a rotated key is taken up without a restart).
#[derive(Clone)]
pub struct OsdKey(pub Arc<KeySource>);

impl OsdKey {
    /// The entity (`osd.N`).
    pub fn entity(&self) -> &Entity {
        self.0.entity()
    }
}

impl fmt::Debug for OsdKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OsdKey({})", self.entity())
    }
}

/// The credentials an OSD presents.
#[derive(Debug)]
pub(crate) struct OsdAuth {
    pub key: OsdKey,
    pub service: Arc<ServiceKeys>,
}

impl Authenticator for OsdAuth {
    fn credentials(&self, peer_kind: u8) -> CredentialsFuture<'_> {
        let entity = self.key.entity().clone();
        if peer_kind != node_kind::OSD {
            return self.key.0.credentials(peer_kind);
        }
        let now = unix_now();
        let c = match self.service.current(now) {
            Some(svc) => {
                let m = mint(&svc, &entity, &Caps::default(), now, PEER_TICKET_TTL_SECS);
                Ok(Credentials::Ticket {
                    entity,
                    ticket: m.ticket,
                    session: m.session,
                })
            }
            None => Err(NoCredentials {
                why: format!(
                    "{entity} holds no service keys yet (the monitors have not given them)"
                ),
                refused: false,
            }),
        };
        ready_credentials(c)
    }
}

/// Fetches the service keys into `held`, retrying every 10 s until the monitors answer (a
/// refusal is final: the key is not this OSD's, or the cluster does not authenticate).
pub(crate) async fn fetch_service_keys(
    mon: &cairn_monclient::MonClient,
    key: &OsdKey,
    held: &ServiceKeys,
) -> Result<(), cairn_monclient::MonClientError> {
    loop {
        match mon
            .get_service_keys(key.entity(), &key.0.candidates())
            .await
        {
            Ok(k) => {
                held.set(k);
                return Ok(());
            }
            Err(e @ cairn_monclient::MonClientError::Denied(_)) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "cannot fetch the service keys; retrying in 10 s");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    }
}

/// The least time between two fetches of the service keys asked for by tickets that did not
/// open (`ServiceKeys::want_newer`): anyone can present such a ticket, so they must not turn
/// into a request to the monitors each.
pub(crate) const SERVICE_KEY_ON_DEMAND_GAP: Duration = Duration::from_secs(5);

/// Whether to fetch the service keys now, `since` the last fetch: every
/// [`SERVICE_KEY_REFRESH`], or sooner when a ticket did not open with the keys held (taken
/// from `held` only when it may be acted on, so that it waits out the gap).
fn fetch_due(since: Duration, held: &ServiceKeys) -> Option<&'static str> {
    if since >= SERVICE_KEY_REFRESH {
        return Some("periodic");
    }
    (since >= SERVICE_KEY_ON_DEMAND_GAP && held.take_wanted())
        .then_some("a ticket did not open with the service keys held")
}

/// Fetches the service keys again every [`SERVICE_KEY_REFRESH`], and within
/// [`SERVICE_KEY_ON_DEMAND_GAP`] of a ticket the keys held do not open (so an OSD whose
/// fetches failed through a rotation of the monitors' key takes the new keys up as soon as a
/// client presents a ticket sealed with them), forever.
pub(crate) async fn refresh_service_keys(
    mon: cairn_monclient::MonClient,
    key: OsdKey,
    held: Arc<ServiceKeys>,
) {
    let mut last = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(why) = fetch_due(last.elapsed(), &held) else {
            continue;
        };
        tracing::debug!(why, "fetching the service keys");
        last = tokio::time::Instant::now();
        if let Err(e) = fetch_service_keys(&mon, &key, &held).await {
            tracing::error!(error = %e, "the monitors refuse this OSD the service keys; keeping the old ones");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fetched_periodically_and_soon_after_a_ticket_missed() {
        let held = ServiceKeys::default();
        let secs = Duration::from_secs;
        assert_eq!(fetch_due(secs(1), &held), None);
        assert_eq!(fetch_due(SERVICE_KEY_REFRESH, &held), Some("periodic"));
        held.want_newer();
        // Within the gap the wish waits (and is kept).
        assert_eq!(fetch_due(secs(1), &held), None);
        assert!(fetch_due(SERVICE_KEY_ON_DEMAND_GAP, &held).is_some_and(|w| w.contains("ticket")));
        assert_eq!(fetch_due(SERVICE_KEY_ON_DEMAND_GAP, &held), None, "once");
    }
}
