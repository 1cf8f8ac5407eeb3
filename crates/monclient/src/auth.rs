//! A client's credentials: its own key for monitors, tickets for OSDs.
//!
//! OSDs hold no entity keys: a client asks the monitors for a ticket (`GET_TICKET`, over a
//! connection authenticated with its key), keeps it, and presents it to every OSD until it is
//! half way to expiry, then gets a new one. An OSD asks for the service keys it opens tickets
//! with (`GET_SERVICE_KEYS`). Both answers are sealed with the asker's own key.

use crate::{expect, protocol, MonClient, MonClientError, Step};
use cairn_auth::{open, Entity, Secret, ServiceKey, MAX_TICKET, SECRET_LEN};
use cairn_proto::msg::decode;
use cairn_proto::msg::mon::{
    service_keys_aad, ticket_session_aad, ServiceKeysReply, TicketReply, GET_SERVICE_KEYS,
    GET_TICKET, SERVICE_KEYS, TICKET,
};
use cairn_transport::{
    node_kind, ready_credentials, Authenticator, Credentials, CredentialsFuture, NoCredentials,
};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A ticket this client holds (`Debug` shows no secret: the ticket is sealed, the session
/// secret's `Debug` hides it).
#[derive(Clone, Debug)]
pub struct HeldTicket {
    /// The sealed ticket, presented as is.
    pub ticket: Vec<u8>,
    /// Its session secret.
    pub session: Secret,
    /// When to get a new one (half its life).
    pub renew_at: Instant,
    /// When it stops being accepted (on this client's clock).
    pub expires_at: Instant,
}

/// After a failed renewal, how long the ticket held is used before asking again (so a
/// monitor outage does not delay every new connection by a monitor call's deadline).
const RENEW_RETRY: Duration = Duration::from_secs(10);

/// Longest ticket lifetime believed (a day; monitors grant [`cairn_auth::TICKET_TTL_SECS`]).
const MAX_TICKET_TTL_SECS: u64 = 86_400;

/// An entity's key: presented to monitors; exchanged with them for tickets to OSDs.
pub struct EntityKey {
    entity: Entity,
    secret: Secret,
    /// Monitors to ask for tickets, authenticating with this key.
    mons: MonClient,
    held: tokio::sync::Mutex<Option<HeldTicket>>,
}

impl fmt::Debug for EntityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntityKey({})", self.entity)
    }
}

impl EntityKey {
    /// The key of `entity`, getting tickets from the monitors at `mons`.
    pub fn new(entity: Entity, secret: Secret, mons: Vec<String>) -> Arc<EntityKey> {
        EntityKey::asking(entity, secret, MonClient::new(mons))
    }

    /// The key of `entity`, getting tickets through `mons` (given this key to present).
    pub(crate) fn asking(entity: Entity, secret: Secret, mons: MonClient) -> Arc<EntityKey> {
        let key = Credentials::Key {
            entity: entity.clone(),
            secret: secret.clone(),
        };
        let mons = mons.with_auth(Arc::new(cairn_transport::Fixed(key)));
        Arc::new(EntityKey {
            entity,
            secret,
            mons,
            held: tokio::sync::Mutex::new(None),
        })
    }

    /// A current ticket: the one held, or a new one from the monitors when none is held or
    /// it is half way to expiry. Concurrent callers share one request. While the monitors
    /// cannot be asked (not while they refuse), the ticket held serves until it expires.
    pub async fn ticket(&self) -> Result<HeldTicket, MonClientError> {
        let mut held = self.held.lock().await;
        let now = Instant::now();
        if let Some(t) = held
            .as_ref()
            .filter(|t| now < t.renew_at && now < t.expires_at)
        {
            return Ok(t.clone());
        }
        match self.mons.get_ticket(&self.entity, &self.secret).await {
            Ok(t) => {
                *held = Some(t.clone());
                Ok(t)
            }
            Err(e @ MonClientError::Denied(_)) => {
                *held = None;
                Err(e)
            }
            Err(e) => {
                let Some(t) = held.as_mut().filter(|t| Instant::now() < t.expires_at) else {
                    return Err(e);
                };
                tracing::warn!(entity = %self.entity, error = %e, "cannot renew the ticket; using the one held until it expires");
                t.renew_at = Instant::now() + RENEW_RETRY;
                Ok(t.clone())
            }
        }
    }
}

impl Authenticator for EntityKey {
    fn credentials(&self, peer_kind: u8) -> CredentialsFuture<'_> {
        if peer_kind != node_kind::OSD {
            return ready_credentials(Ok(Credentials::Key {
                entity: self.entity.clone(),
                secret: self.secret.clone(),
            }));
        }
        Box::pin(async move {
            let t = self.ticket().await.map_err(|e| NoCredentials {
                refused: matches!(e, MonClientError::Denied(_)),
                why: format!("no ticket for {}: {e}", self.entity),
            })?;
            Ok(Credentials::Ticket {
                entity: self.entity.clone(),
                ticket: t.ticket,
                session: t.session,
            })
        })
    }
}

fn refused(why: String) -> Step<HeldTicket> {
    Step::Fail(MonClientError::Denied(why))
}

impl MonClient {
    /// Asks for a ticket for OSDs; `entity`/`secret` must be the key this client
    /// authenticates with (it opens the ticket's session secret).
    pub async fn get_ticket(
        &self,
        entity: &Entity,
        secret: &Secret,
    ) -> Result<HeldTicket, MonClientError> {
        let aad = ticket_session_aad(&entity.to_string());
        self.call(GET_TICKET, Vec::new(), self.deadline(), |f| {
            if let Err(e) = expect(&f, TICKET, "ticket") {
                return Step::Fail(e);
            }
            let (ticket, sealed, ttl) = match decode::<TicketReply>("ticket", &f.control) {
                Err(e) => return Step::Fail(protocol(e)),
                Ok(TicketReply::Refused(why)) => return refused(why),
                Ok(TicketReply::Granted {
                    ticket,
                    session,
                    ttl_secs,
                }) => (ticket, session, ttl_secs),
            };
            if ticket.len() > MAX_TICKET {
                return Step::Fail(protocol(format!(
                    "a ticket of {} bytes (at most {MAX_TICKET})",
                    ticket.len()
                )));
            }
            // The monitor's word on the lifetime is bounded (it must not overflow a clock).
            let ttl = Duration::from_secs(ttl.min(MAX_TICKET_TTL_SECS));
            let session = match open(secret, &aad, &sealed) {
                Ok(s) if s.len() == SECRET_LEN => {
                    let mut b = [0u8; SECRET_LEN];
                    b.copy_from_slice(&s);
                    Secret(b)
                }
                _ => {
                    return Step::Fail(protocol(
                        "the ticket's session secret does not open with our key",
                    ))
                }
            };
            let now = Instant::now();
            Step::Done(HeldTicket {
                ticket,
                session,
                renew_at: now + ttl / 2,
                expires_at: now + ttl,
            })
        })
        .await
    }

    /// Asks for the OSD service keys (only an OSD gets them); `entity`/`secret` must be the
    /// key this client authenticates with.
    pub async fn get_service_keys(
        &self,
        entity: &Entity,
        secret: &Secret,
    ) -> Result<Vec<ServiceKey>, MonClientError> {
        let aad = service_keys_aad(&entity.to_string());
        self.call(GET_SERVICE_KEYS, Vec::new(), self.deadline(), |f| {
            if let Err(e) = expect(&f, SERVICE_KEYS, "service keys") {
                return Step::Fail(e);
            }
            let sealed = match decode::<ServiceKeysReply>("service keys", &f.control) {
                Err(e) => return Step::Fail(protocol(e)),
                Ok(ServiceKeysReply::Refused(why)) => {
                    return Step::Fail(MonClientError::Denied(why))
                }
                Ok(ServiceKeysReply::Granted { sealed }) => sealed,
            };
            let keys = open(secret, &aad, &sealed)
                .ok()
                .and_then(|p| postcard::from_bytes::<Vec<ServiceKey>>(&p).ok());
            match keys {
                Some(k) if k.len() <= 16 => Step::Done(k),
                _ => Step::Fail(protocol("the service keys do not open with our key")),
            }
        })
        .await
    }
}
