//! A client's credentials: its own key for monitors, tickets for OSDs.
//!
//! OSDs hold no entity keys: a client asks the monitors for a ticket (`GET_TICKET`, over a
//! connection authenticated with its key), keeps it, and presents it to every OSD until it is
//! half way to expiry, then gets a new one. An OSD asks for the service keys it opens tickets
//! with (`GET_SERVICE_KEYS`). Both answers are sealed with the asker's own key.

use crate::{expect, protocol, MonClient, MonClientError, Step};
use cairn_auth::{
    open, open_secret, seal, Caps, Entity, FileStamp, KeyEntry, Keyring, KeyringError, Secret,
    ServiceKey, MAX_TICKET,
};
use cairn_failstop::LockOrDie;
use cairn_proto::msg::mon::{
    auth_import_aad, auth_key_aad, nbd_psk_aad, AuthListing, AuthReply, AuthRequest, AUTH_COMMAND,
    AUTH_REPLY,
};
use cairn_proto::msg::mon::{
    service_keys_aad, ticket_session_aad, ServiceKeysReply, TicketReply, GET_SERVICE_KEYS,
    GET_TICKET, SERVICE_KEYS, TICKET,
};
use cairn_proto::msg::{decode, encode};
use cairn_proto::Frame;
use cairn_transport::{
    node_kind, ready_credentials, Authenticator, Credentials, CredentialsFuture, NoCredentials,
};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
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

/// Largest sealed service-key reply opened.
const MAX_SEALED_SERVICE_KEYS: usize = 4096;

/// Longest ticket lifetime believed (a day; monitors grant [`cairn_auth::TICKET_TTL_SECS`]).
const MAX_TICKET_TTL_SECS: u64 = 86_400;

/// Where an entity's key comes from: fixed, or a keyring file read again whenever it changes
/// (so a key rotated with `cairn auth rotate` is taken up without a restart: install the new
/// key in the file). The key held before a change is kept as the previous one, to open
/// answers sealed with it on connections that proved it.
pub struct KeySource {
    entity: Entity,
    file: Option<PathBuf>,
    state: Mutex<KeyState>,
}

struct KeyState {
    secret: Secret,
    previous: Option<Secret>,
    stamp: Option<FileStamp>,
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySource({})", self.entity)
    }
}

impl KeySource {
    /// A key that never changes.
    pub fn fixed(entity: Entity, secret: Secret) -> Arc<KeySource> {
        Arc::new(KeySource {
            entity,
            file: None,
            state: Mutex::new(KeyState {
                secret,
                previous: None,
                stamp: None,
            }),
        })
    }

    /// The key of `entity` in the keyring at `path`, read again when the file changes.
    pub fn keyring(path: &Path, entity: &Entity) -> Result<Arc<KeySource>, KeyringError> {
        let seen = FileStamp::of(path);
        let key = Keyring::load_key(path, entity)?;
        Ok(Arc::new(KeySource {
            entity: entity.clone(),
            file: Some(path.to_path_buf()),
            state: Mutex::new(KeyState {
                secret: key.secret,
                previous: None,
                stamp: seen,
            }),
        }))
    }

    /// The entity whose key this is.
    pub fn entity(&self) -> &Entity {
        &self.entity
    }

    /// The current key, after reading the file again if it changed.
    pub fn current(&self) -> Secret {
        self.keys().0
    }

    /// The current key and the one held before it, if any.
    pub fn keys(&self) -> (Secret, Option<Secret>) {
        let mut st = self.state.lock_or_die();
        if let Some(path) = &self.file {
            let now = FileStamp::of(path);
            if now != st.stamp {
                st.stamp = now;
                match Keyring::load_key(path, &self.entity) {
                    Ok(k) if k.secret != st.secret => {
                        tracing::info!(entity = %self.entity, keyring = %path.display(), "using the new key of the keyring");
                        st.previous = Some(std::mem::replace(&mut st.secret, k.secret));
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("keeping the key read before: {e}"),
                }
            }
        }
        (st.secret.clone(), st.previous.clone())
    }

    /// Every key held, newest first (what a sealed answer may be sealed with).
    pub fn candidates(&self) -> Vec<Secret> {
        let (cur, prev) = self.keys();
        std::iter::once(cur).chain(prev).collect()
    }
}

impl Authenticator for KeySource {
    fn credentials(&self, _peer_kind: u8) -> CredentialsFuture<'_> {
        ready_credentials(Ok(Credentials::Key {
            entity: self.entity.clone(),
            secret: self.current(),
        }))
    }
}

/// Opens the secret in `sealed` with the first of `keys` it opens with.
fn open_any(keys: &[Secret], aad: &[u8], sealed: &[u8]) -> Option<Secret> {
    keys.iter().find_map(|k| open_secret(k, aad, sealed).ok())
}

/// An entity's key: presented to monitors; exchanged with them for tickets to OSDs.
pub struct EntityKey {
    entity: Entity,
    key: Arc<KeySource>,
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
        EntityKey::asking(KeySource::fixed(entity, secret), MonClient::new(mons))
    }

    /// The key `key` holds (e.g. a keyring file, followed), getting tickets from the
    /// monitors at `mons`.
    pub fn from_source(key: Arc<KeySource>, mons: Vec<String>) -> Arc<EntityKey> {
        EntityKey::asking(key, MonClient::new(mons))
    }

    /// The key `key` holds, getting tickets through `mons` (given this key to present).
    pub(crate) fn asking(key: Arc<KeySource>, mons: MonClient) -> Arc<EntityKey> {
        let mons = mons.with_auth(key.clone());
        Arc::new(EntityKey {
            entity: key.entity().clone(),
            key,
            mons,
            held: tokio::sync::Mutex::new(None),
        })
    }

    /// The key source (for answers sealed with this entity's key).
    pub fn source(&self) -> &Arc<KeySource> {
        &self.key
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
        match self
            .mons
            .get_ticket(&self.entity, &self.key.candidates())
            .await
        {
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
            return self.key.credentials(peer_kind);
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
    /// Asks for a ticket for OSDs; `secrets` must hold the key this client authenticates
    /// with (the one that opens the ticket's session secret; during a rotation, the new and
    /// the previous key).
    pub async fn get_ticket(
        &self,
        entity: &Entity,
        secrets: &[Secret],
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
            let Some(session) = open_any(secrets, &aad, &sealed) else {
                return Step::Fail(protocol(
                    "the ticket's session secret does not open with our key",
                ));
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

    /// Asks for the OSD service keys (only an OSD gets them); `secrets` must hold the key
    /// this client authenticates with.
    pub async fn get_service_keys(
        &self,
        entity: &Entity,
        secrets: &[Secret],
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
            // At most 16 keys of 36 bytes: anything much larger is not opened.
            if sealed.len() > MAX_SEALED_SERVICE_KEYS {
                return Step::Fail(protocol(format!(
                    "sealed service keys of {} bytes (at most {MAX_SEALED_SERVICE_KEYS})",
                    sealed.len()
                )));
            }
            let keys = secrets
                .iter()
                .find_map(|k| open(k, &aad, &sealed).ok())
                .and_then(|p| postcard::from_bytes::<Vec<ServiceKey>>(&p).ok());
            match keys {
                Some(k) if k.len() <= 16 => Step::Done(k),
                _ => Step::Fail(protocol("the service keys do not open with our key")),
            }
        })
        .await
    }
}

/// What a key database request returned.
#[derive(Debug)]
pub enum AuthAnswer {
    /// Done, nothing to show.
    Done,
    /// Every entity with its caps.
    List(Vec<AuthListing>),
    /// An entity's key and caps (opened with this client's key).
    Key(KeyEntry),
    /// Every NBD user with its caps and TLS pre-shared key (opened with this client's key).
    NbdUsers(Vec<(Entity, Caps, Secret)>),
    /// The state of the monitors' shared key.
    MonKey {
        /// Whether `cairn auth rotate mon` ever replaced the bootstrap key.
        rotated: bool,
        /// Until when (unix seconds) the replaced key is still accepted, while that lasts.
        previous_until: Option<u64>,
    },
}

/// The request that imports `entry`, its secret sealed with `me` (the key this client
/// authenticates with).
pub fn import_request(entry: &KeyEntry, me: &Secret) -> AuthRequest {
    AuthRequest::Import {
        sealed: seal(me, &auth_import_aad(&entry.entity), &entry.secret.0),
        caps: entry.caps.clone().unwrap_or_default(),
        entity: entry.entity.clone(),
    }
}

fn auth_step(f: Frame, me: &[Secret]) -> Step<AuthAnswer> {
    if let Err(e) = expect(&f, AUTH_REPLY, "auth") {
        return Step::Fail(e);
    }
    match decode::<AuthReply>("auth reply", &f.control) {
        Err(e) => Step::Fail(protocol(e)),
        Ok(AuthReply::Done) => Step::Done(AuthAnswer::Done),
        Ok(AuthReply::List(l)) => Step::Done(AuthAnswer::List(l)),
        Ok(AuthReply::MonKey {
            rotated,
            previous_until,
        }) => Step::Done(AuthAnswer::MonKey {
            rotated,
            previous_until,
        }),
        Ok(AuthReply::Refused(why)) => Step::Fail(MonClientError::KeyRefused(why)),
        Ok(AuthReply::NotLeader { leader }) => Step::Redirect(leader),
        Ok(AuthReply::Unavailable(why)) => Step::Retry(why.into()),
        Ok(AuthReply::NbdUsers(users)) => {
            let mut out = Vec::with_capacity(users.len());
            for u in users {
                let Some(psk) = open_any(me, &nbd_psk_aad(&u.entity), &u.sealed_psk) else {
                    return Step::Fail(protocol(format!(
                        "the pre-shared key of {} does not open with our key",
                        u.entity
                    )));
                };
                out.push((u.entity, u.caps, psk));
            }
            Step::Done(AuthAnswer::NbdUsers(out))
        }
        Ok(AuthReply::Key {
            entity,
            caps,
            sealed,
        }) => match open_any(me, &auth_key_aad(&entity), &sealed) {
            Some(secret) => Step::Done(AuthAnswer::Key(KeyEntry {
                entity,
                secret,
                caps: Some(caps),
            })),
            None => Step::Fail(protocol("the key sent does not open with our key")),
        },
    }
}

impl MonClient {
    /// Sends a request to the monitors' key database (it needs `mon x`). `me` is the key
    /// this client authenticates with: a key in the answer comes sealed with it.
    pub async fn auth_request(
        &self,
        req: AuthRequest,
        me: &KeySource,
    ) -> Result<AuthAnswer, MonClientError> {
        let keys = me.candidates();
        self.call(AUTH_COMMAND, encode(&req), self.deadline(), |f| {
            auth_step(f, &keys)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_rewritten_within_one_timestamp_tick_is_taken_up() {
        let dir = std::env::temp_dir().join(format!("cairn-keysource-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("keyring");
        let who = Entity::admin();
        let ring_with = |secret: &Secret| Keyring {
            keys: vec![KeyEntry {
                entity: who.clone(),
                secret: secret.clone(),
                caps: None,
            }],
        };
        let (first, second) = (Secret::generate(), Secret::generate());
        ring_with(&first).save(&path).expect("save");
        let when = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .expect("mtime");
        let source = KeySource::keyring(&path, &who).expect("load");
        assert_eq!(source.current(), first);
        // The same length and modification time: only the new inode tells.
        ring_with(&second).save(&path).expect("save");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(when))
            .expect("set mtime");
        assert_eq!(source.keys(), (second, Some(first)));
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
