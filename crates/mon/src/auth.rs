//! Who may talk to a monitor, and what each may ask.
//!
//! A monitor started with a keyring requires every connection to authenticate (mutual proof
//! in the handshake, `cairn_transport::handshake`) with a key it knows: the monitors' shared
//! key (its keyring's `mon.N` entry; every monitor holds the same secret), or a key of an
//! entity its keyring lists. Then every request is checked against what the peer is:
//!
//! | Request | Allowed to |
//! |---|---|
//! | `GET_MAP`, `SUBSCRIBE`, `MON_STATUS`, `PAST_INTERVALS` | daemons; clients with `mon r` |
//! | `COMMAND` (`OsdBoot`) | `osd.N` only, for OSD id N (a known store that is N, or a new store when N is the next id) |
//! | `COMMAND` (any other change) | clients with `mon w` |
//! | `HEARTBEAT`, `FAILURE_REPORT` | `osd.N` only, about itself as N |
//! | Raft messages | monitors only |
//! | `GET_TICKET` | any authenticated client or OSD (the ticket carries its caps) |
//! | `GET_SERVICE_KEYS` | `osd.N` only |
//!
//! A monitor started without a keyring (`--auth none`) lets everyone in and checks nothing.

use crate::state_machine::MapView;
use cairn_auth::service::{derive_service_key, mint, service_key_id, service_keys_around};
use cairn_auth::{
    key_id, seal, unix_now, Caps, Entity, EntityKind, FileStamp, KeyRefusal, Keyring, MonKeySet,
    Perms, Secret, KEY_ID_LEN, TICKET_TTL_SECS,
};
use cairn_failstop::RwLockOrDie;
use cairn_map::{ClusterMap, MapChange};
use cairn_proto::auth::{AuthInit, AUTH_KEY};
use cairn_proto::msg::mon::{service_keys_aad, ticket_session_aad, ServiceKeysReply, TicketReply};
use cairn_proto::msg::ErrorCode;
use cairn_transport::{
    Authenticator, Credentials, CredentialsFuture, Known, Peer, Verifier, VerifyError,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The keys a monitor knows: the monitors' shared key from its keyring file (re-read when
/// the file changes) until it is first rotated, then from the key database; every other
/// entity's key from the replicated key database (`cairn_auth::KeyDb`). Until the first
/// leader has seeded the database, the other keys of the file stand in for it.
pub struct MonKeys {
    path: PathBuf,
    /// This monitor's entity (`mon.ID`), for dialing its peers.
    me: Entity,
    loaded: RwLock<Loaded>,
    /// The replicated state holding the key database.
    view: Arc<MapView>,
    /// The frame protection every connection gets at least.
    frames: cairn_auth::FrameMode,
    /// Connections dialed to peer monitors: during a rotation of the monitors' key, dials
    /// take turns with the two keys.
    dials: AtomicU64,
}

impl std::fmt::Debug for MonKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MonKeys({})", self.me)
    }
}

struct Loaded {
    stamp: Option<FileStamp>,
    /// The monitors' shared key.
    mon: Secret,
    /// The file's other keys: the bootstrap keys the database is seeded with.
    entities: HashMap<Entity, (Secret, Caps)>,
}

/// Why a monitor keyring cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MonKeysError {
    /// The file cannot be read or parsed.
    #[error(transparent)]
    Keyring(#[from] cairn_auth::KeyringError),
    /// It lacks the monitors' shared key.
    #[error("keyring {0} has no monitor key (an entry for mon.N): every monitor needs the monitors' shared key")]
    NoMonKey(String),
}

impl MonKeys {
    /// Loads a monitor's keyring; `id` is this monitor's id, `view` its replicated state.
    pub(crate) fn load(path: &Path, id: u64, view: Arc<MapView>) -> Result<MonKeys, MonKeysError> {
        Ok(MonKeys {
            path: path.to_path_buf(),
            me: Entity::mon(id),
            loaded: RwLock::new(read(path)?),
            view,
            frames: cairn_auth::FrameMode::Plain,
            dials: AtomicU64::new(0),
        })
    }

    /// The same keys, protecting every connection's frames with `frames` at least.
    pub(crate) fn with_frames(self, frames: cairn_auth::FrameMode) -> MonKeys {
        MonKeys { frames, ..self }
    }

    fn current(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        let stamp = FileStamp::of(&self.path);
        let stale = self.loaded.read_or_die().stamp != stamp;
        if stale {
            match read(&self.path) {
                Ok(l) => {
                    tracing::info!(keyring = %self.path.display(), keys = l.entities.len(), "keyring re-read");
                    *self.loaded.write_or_die() = l;
                }
                Err(e) => tracing::warn!("keeping the keys read before: {e}"),
            }
        }
        self.loaded.read_or_die()
    }

    /// The monitors' keys in use now (`cairn_auth::mon_key`).
    pub(crate) fn mon_keys(&self) -> MonKeySet {
        let db = self.view.with_keys(|k| k.mon.clone());
        MonKeySet::at(db.as_ref(), &self.current().mon, unix_now())
    }

    /// After a rotation of the monitors' key, writes the new key into this monitor's keyring
    /// file (in place of the monitors' key it held), so that the file always holds the key to
    /// copy to a new monitor. Returns whether it wrote.
    pub(crate) fn sync_keyring(&self) -> Result<bool, cairn_auth::KeyringError> {
        let Some(want) = self
            .view
            .with_keys(|k| k.mon.as_ref().map(|m| m.secret.clone()))
        else {
            return Ok(false);
        };
        if self.current().mon == want {
            return Ok(false);
        }
        let mut ring = Keyring::load(&self.path)?;
        for k in ring
            .keys
            .iter_mut()
            .filter(|k| k.entity.kind() == EntityKind::Mon)
        {
            k.secret = want.clone();
        }
        ring.save(&self.path)?;
        // What was written is what is in use now, whatever the file's time stamps say.
        if let Ok(l) = read(&self.path) {
            *self.loaded.write_or_die() = l;
        }
        tracing::info!(keyring = %self.path.display(), "keyring rewritten with the monitors' new key");
        Ok(true)
    }

    /// Whether the key database has been seeded (until then the file's keys are used).
    pub(crate) fn seeded(&self) -> bool {
        self.view.with_keys(|k| k.seeded)
    }

    /// The keys the database is seeded with: the file's keys other than the monitors'.
    pub(crate) fn bootstrap_keys(&self) -> Vec<(Entity, Secret, Caps)> {
        let mut v: Vec<_> = self
            .current()
            .entities
            .iter()
            .map(|(e, (s, c))| (e.clone(), s.clone(), c.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The key of `entity` with id `id` (current, or previous during a rotation) and its
    /// caps; `Err` is the refusal.
    fn lookup(&self, entity: &Entity, id: &[u8; KEY_ID_LEN]) -> Result<(Secret, Caps), KeyRefusal> {
        if self.seeded() {
            return self.view.with_keys(|db| db.key_for(entity, id, unix_now()));
        }
        let keys = self.current();
        let (key, caps) = keys
            .entities
            .get(entity)
            .ok_or_else(|| KeyRefusal::NotInKeyring(entity.clone()))?;
        if &key_id(key) != id {
            return Err(KeyRefusal::OtherKeyringKey(entity.clone()));
        }
        Ok((key.clone(), caps.clone()))
    }

    /// The current caps of `entity`, if it has a key.
    fn caps_of(&self, entity: &Entity) -> Option<Caps> {
        if self.seeded() {
            return self
                .view
                .with_keys(|db| db.keys.get(entity).map(|k| k.caps.clone()));
        }
        self.current().entities.get(entity).map(|(_, c)| c.clone())
    }
}

const NO_AUTH: &str =
    "this cluster runs without authentication: there are no tickets or service keys";

/// A ticket for `peer` from `keys` (`None`: the monitor does not authenticate); refusals
/// are logged.
pub(crate) fn grant_ticket(keys: Option<&MonKeys>, peer: &Peer) -> TicketReply {
    let reply = keys.map_or(TicketReply::Refused(NO_AUTH.into()), |k| {
        k.grant_ticket(peer)
    });
    if let TicketReply::Refused(why) = &reply {
        tracing::warn!(peer = %peer.name(), "no ticket: {why}");
    }
    reply
}

/// The service keys for `peer` from `keys`; refusals are logged.
pub(crate) fn grant_service_keys(keys: Option<&MonKeys>, peer: &Peer) -> ServiceKeysReply {
    let reply = keys.map_or(ServiceKeysReply::Refused(NO_AUTH.into()), |k| {
        k.grant_service_keys(peer)
    });
    if let ServiceKeysReply::Refused(why) = &reply {
        tracing::warn!(peer = %peer.name(), "no service keys: {why}");
    }
    reply
}

impl MonKeys {
    /// A ticket for OSDs for `peer` (authenticated on this connection, so its key and caps
    /// are known), its session secret sealed with the peer's key.
    fn grant_ticket(&self, peer: &Peer) -> TicketReply {
        let Some(entity) = &peer.entity else {
            return TicketReply::Refused(NO_AUTH.into());
        };
        if entity.kind() == EntityKind::Mon {
            return TicketReply::Refused("monitors do not talk to OSDs as clients".into());
        }
        let (Some(caps), Some(key)) = (self.caps_of(entity), &peer.key) else {
            return TicketReply::Refused(format!("{entity} is no longer known"));
        };
        let now = unix_now();
        let svc = derive_service_key(self.mon_keys().ticket_key(), service_key_id(now));
        let m = mint(&svc, entity, &caps, now, TICKET_TTL_SECS);
        let name = entity.to_string();
        TicketReply::Granted {
            ticket: m.ticket,
            // Sealed with the key this connection proved: during a rotation the peer may
            // still hold the previous one.
            session: seal(key, &ticket_session_aad(&name), &m.session.0),
            ttl_secs: TICKET_TTL_SECS,
        }
    }

    /// The OSD service keys around now for `peer`, which must be an OSD, sealed with its key.
    fn grant_service_keys(&self, peer: &Peer) -> ServiceKeysReply {
        let Some(entity) = peer.entity.as_ref().filter(|e| e.kind() == EntityKind::Osd) else {
            return ServiceKeysReply::Refused(format!(
                "permission denied: {} is not an OSD: only OSDs get the service keys",
                peer.name()
            ));
        };
        let (Some(_), Some(key)) = (self.caps_of(entity), &peer.key) else {
            return ServiceKeysReply::Refused(format!("{entity} is no longer known"));
        };
        let now = unix_now();
        let svc: Vec<_> = (self.mon_keys().service_generations().into_iter())
            .flat_map(|k| service_keys_around(k, now))
            .collect();
        let plain = postcard::to_allocvec(&svc).unwrap_or_default();
        ServiceKeysReply::Granted {
            sealed: seal(key, &service_keys_aad(&entity.to_string()), &plain),
        }
    }
}

fn read(path: &Path) -> Result<Loaded, MonKeysError> {
    let stamp = FileStamp::of(path);
    let ring = Keyring::load(path)?;
    let mon = ring
        .keys
        .iter()
        .find(|k| k.entity.kind() == EntityKind::Mon)
        .ok_or_else(|| MonKeysError::NoMonKey(path.display().to_string()))?
        .secret
        .clone();
    let entities = ring
        .keys
        .into_iter()
        .filter(|k| k.entity.kind() != EntityKind::Mon)
        .map(|k| (k.entity, (k.secret, k.caps.unwrap_or_default())))
        .collect();
    Ok(Loaded {
        stamp,
        mon,
        entities,
    })
}

impl MonKeys {
    /// Why a monitor proving key id `id` is refused.
    fn refuse_mon_key(&self, entity: &Entity, id: &[u8; KEY_ID_LEN]) -> KeyRefusal {
        let replaced = self.view.with_keys(|k| {
            k.mon
                .as_ref()
                .and_then(|m| m.previous.as_ref())
                .is_some_and(|(old, _)| &key_id(old) == id)
        });
        if replaced {
            return KeyRefusal::PreviousMonKey(entity.clone());
        }
        KeyRefusal::OtherMonKey {
            entity: entity.clone(),
            keyring: self.path.clone(),
        }
    }
}

/// How a monitor proves itself to its peers: the monitors' key; during a rotation, dials take
/// turns with the old key and the new one (a peer that has not applied the rotation knows
/// only the old one, a monitor added with a keyring copied since only the new one), the old
/// one first.
impl Authenticator for MonKeys {
    fn credentials(&self, _peer_kind: u8) -> CredentialsFuture<'_> {
        let keys = self.mon_keys().to_dial();
        let turn = self.dials.fetch_add(1, Ordering::Relaxed) as usize % keys.len().max(1);
        let secret = keys
            .into_iter()
            .nth(turn)
            .unwrap_or_else(|| self.current().mon.clone());
        cairn_transport::ready_credentials(Ok(Credentials::Key {
            entity: self.me.clone(),
            secret,
        }))
    }
}

impl Verifier for MonKeys {
    fn allow_none(&self) -> bool {
        false
    }

    fn frames(&self) -> cairn_auth::FrameMode {
        self.frames
    }

    fn key_for(&self, method: u8, init: &AuthInit, entity: &Entity) -> Result<Known, VerifyError> {
        if method != AUTH_KEY {
            return Err(VerifyError::TicketToMonitor);
        }
        if entity.kind() == EntityKind::Mon {
            let Some(mon) = self.mon_keys().admits(&init.key_id).cloned() else {
                return Err(self.refuse_mon_key(entity, &init.key_id).into());
            };
            return Ok(Known {
                entity: entity.clone(),
                caps: Caps::default(),
                key: mon,
            });
        }
        let (key, caps) = self.lookup(entity, &init.key_id)?;
        Ok(Known {
            entity: entity.clone(),
            caps,
            key,
        })
    }
}

/// What a request needs from the peer that sent it.
pub(crate) enum Need<'a> {
    /// Reading the map and status.
    Read,
    /// A map change (`OsdBoot` is checked against the map).
    Change(&'a MapChange),
    /// A heartbeat or failure report about OSD `osd`.
    OsdItself(u32),
    /// Raft.
    Monitor,
}

/// Why a peer may not make a request of the monitors: the refusal it is sent (`ERROR`
/// `Denied`, or `MapError::Denied` in the reply to a map change). A permission failure: the
/// same request from the same entity is refused again until its caps change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Denied {
    /// Reading the map or status needs `mon r` (or a daemon's key).
    #[error("permission denied: {0} lacks r on the monitors")]
    NoRead(Entity),
    /// Raft messages come only from monitors.
    #[error("permission denied: {0} is not a monitor (Raft messages come only from monitors)")]
    NotMonitor(Entity),
    /// A heartbeat or failure report in the name of another OSD.
    #[error("permission denied: {entity} may not speak for osd.{osd}")]
    OtherOsd { entity: Entity, osd: u32 },
    /// An `OsdBoot` from an entity that is not an OSD.
    #[error("permission denied: {0} is not an OSD: only an OSD boots")]
    NotOsd(Entity),
    /// An `OsdBoot` of a store the map gives another OSD (or of a new store under an id
    /// that is not the next).
    #[error(
        "permission denied: {entity} may not boot this store: its key is bound to osd.{id}, \
         the store is another OSD's (or osd.{id} is not the next new id)"
    )]
    BootOther { entity: Entity, id: u32 },
    /// A map change needs `mon w` (a blocklist entry: `w` on the pool).
    #[error("permission denied: {0} lacks w on the monitors")]
    NoWrite(Entity),
}

impl Denied {
    /// The code of the `ERROR` reply it is sent in.
    pub(crate) fn code(&self) -> ErrorCode {
        ErrorCode::Denied
    }
}

/// Whether the key of `osd.{id}` may boot the store `store_id`: the map knows that store as
/// OSD `id`, or does not know it and `id` is the id a new OSD gets next.
fn boot_bound(m: &ClusterMap, id: u32, store_id: &[u8; 16]) -> bool {
    match m.osds.values().find(|o| &o.store_id == store_id) {
        Some(o) => o.id == id,
        None => m.next_osd_id == id && !m.osds.contains_key(&id),
    }
}

/// Checks `need` for `peer` against the current map in `view` (an unauthenticated peer only
/// exists on a monitor without authentication, which checks nothing). `Err` is the refusal
/// to send.
pub(crate) fn check(peer: &Peer, need: Need<'_>, view: &MapView) -> Result<(), Denied> {
    let Some(entity) = &peer.entity else {
        return Ok(());
    };
    let kind = entity.kind();
    let daemon = matches!(kind, EntityKind::Mon | EntityKind::Osd);
    let who = || entity.clone();
    match need {
        Need::Read if daemon || peer.caps.mon_perms().covers(Perms::R) => Ok(()),
        Need::Read => Err(Denied::NoRead(who())),
        Need::Monitor if kind == EntityKind::Mon => Ok(()),
        Need::Monitor => Err(Denied::NotMonitor(who())),
        Need::OsdItself(osd) if entity.osd_id() == Some(osd) => Ok(()),
        Need::OsdItself(osd) => Err(Denied::OtherOsd { entity: who(), osd }),
        Need::Change(MapChange::OsdBoot { store_id, .. }) => {
            let Some(id) = entity.osd_id() else {
                return Err(Denied::NotOsd(who()));
            };
            if view.with_map(|m| boot_bound(m, id, store_id)) {
                Ok(())
            } else {
                Err(Denied::BootOther { entity: who(), id })
            }
        }
        Need::Change(_) if !daemon && peer.caps.mon_perms().covers(Perms::W) => Ok(()),
        // A writer of a pool may fence the previous writer of its data (a volume takeover),
        // as RBD clients may blocklist: it could overwrite that data anyway.
        Need::Change(MapChange::BlocklistAdd { pool, .. })
            if !daemon && peer.caps.pool_perms(pool).covers(Perms::W) =>
        {
            Ok(())
        }
        Need::Change(_) => Err(Denied::NoWrite(who())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_auth::{KeyChange, KeyDb, KeyEntry};

    fn init_for(secret: &Secret) -> AuthInit {
        AuthInit {
            entity: String::new(),
            key_id: key_id(secret),
            frames: 0,
            nonce: [0; 32],
            ticket: Vec::new(),
        }
    }

    #[test]
    fn file_keys_serve_until_the_database_is_seeded_then_the_database_rules() {
        let dir = std::env::temp_dir().join(format!("cairn-monkeys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("keyring");
        let admin = KeyEntry {
            entity: Entity::admin(),
            secret: Secret::generate(),
            caps: Some(Caps::admin()),
        };
        let mut ring = Keyring {
            keys: vec![admin.clone()],
        };
        ring.save(&path).expect("save");
        let view = Arc::new(MapView::for_tests());
        let e = MonKeys::load(&path, 0, view.clone())
            .expect_err("no monitor key")
            .to_string();
        assert!(e.contains("has no monitor key"), "{e}");
        ring.put(KeyEntry {
            entity: Entity::mon(0),
            secret: Secret::generate(),
            caps: None,
        });
        ring.save(&path).expect("save");
        let keys = MonKeys::load(&path, 1, view.clone()).expect("load");
        // A monitor holding another monitors' key is refused by name, not by a failed proof.
        let e = keys
            .key_for(AUTH_KEY, &init_for(&Secret::generate()), &Entity::mon(2))
            .err()
            .expect("another monitors' key");
        assert!(
            e.to_string()
                .contains("mon.2 holds a monitors' key other than"),
            "{e}"
        );
        let known = keys
            .key_for(AUTH_KEY, &init_for(&admin.secret), &Entity::admin())
            .expect("admin");
        assert_eq!(known.caps, Caps::admin());
        let e = keys
            .key_for(AUTH_KEY, &init_for(&Secret::generate()), &Entity::admin())
            .err()
            .expect("another key");
        assert!(e.to_string().contains("do not hold"), "{e}");
        let osd = Entity::osd(4);
        let osd_key = Secret::generate();
        let e = keys
            .key_for(AUTH_KEY, &init_for(&osd_key), &osd)
            .err()
            .expect("unknown");
        assert!(e.to_string().contains("unknown entity osd.4"), "{e}");
        let e = keys
            .key_for(cairn_proto::auth::AUTH_TICKET, &init_for(&osd_key), &osd)
            .err()
            .expect("tickets");
        assert!(e.to_string().contains("not tickets"), "{e}");
        // A key added to the file is admitted without a restart, until the database is
        // seeded.
        ring.put(KeyEntry {
            entity: osd.clone(),
            secret: osd_key.clone(),
            caps: None,
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        ring.save(&path).expect("save");
        assert!(keys.key_for(AUTH_KEY, &init_for(&osd_key), &osd).is_ok());
        assert_eq!(keys.bootstrap_keys().len(), 2);
        // Seeded with the admin key only: the file's osd.4 no longer counts.
        let mut db = KeyDb::default();
        db.apply(&KeyChange::Seed(vec![(
            Entity::admin(),
            admin.secret.clone(),
            Caps::admin(),
        )]))
        .expect("seed");
        view.set_keys_for_tests(db);
        assert!(keys.seeded());
        let e = keys
            .key_for(AUTH_KEY, &init_for(&osd_key), &osd)
            .err()
            .expect("not in the database");
        assert!(e.to_string().contains("unknown entity osd.4"), "{e}");
        assert!(keys
            .key_for(AUTH_KEY, &init_for(&admin.secret), &Entity::admin())
            .is_ok());
        std::fs::remove_dir_all(&dir).expect("clean");
    }

    fn dialed(keys: &MonKeys) -> Secret {
        let c = futures_lite_block(keys.credentials(cairn_transport::node_kind::MON));
        match c {
            Ok(Credentials::Key { secret, .. }) => secret,
            other => panic!("credentials: {other:?}"),
        }
    }

    fn futures_lite_block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    fn opened_with(keys: &MonKeys, peer: &Peer, of: &Secret) -> bool {
        let TicketReply::Granted { ticket, .. } = keys.grant_ticket(peer) else {
            panic!("no ticket");
        };
        let svc = service_keys_around(of, unix_now());
        cairn_auth::ticket::open_ticket(&svc, &ticket, unix_now()).is_ok()
    }

    #[test]
    fn a_keyring_rewritten_within_one_timestamp_tick_is_read_again() {
        let dir = std::env::temp_dir().join(format!("cairn-monkeys-tick-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("keyring");
        let ring_with = |mon: &Secret| Keyring {
            keys: vec![KeyEntry {
                entity: Entity::mon(0),
                secret: mon.clone(),
                caps: None,
            }],
        };
        let (first, second) = (Secret::generate(), Secret::generate());
        ring_with(&first).save(&path).expect("save");
        let when = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .expect("mtime");
        let keys = MonKeys::load(&path, 0, Arc::new(MapView::for_tests())).expect("load");
        assert_eq!(keys.current().mon, first);
        // The same length and the same modification time: only the inode tells.
        ring_with(&second).save(&path).expect("save");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(when))
            .expect("set mtime");
        assert_eq!(keys.current().mon, second);
        std::fs::remove_dir_all(&dir).expect("clean");
    }

    #[test]
    fn a_rotated_monitors_key_is_admitted_dialed_and_written_with_the_old_one_through_its_grace() {
        let dir = std::env::temp_dir().join(format!("cairn-monkeys-rot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("keyring");
        let (old, new) = (Secret::generate(), Secret::generate());
        let admin = KeyEntry {
            entity: Entity::admin(),
            secret: Secret::generate(),
            caps: Some(Caps::admin()),
        };
        let mon = KeyEntry {
            entity: Entity::mon(0),
            secret: old.clone(),
            caps: None,
        };
        Keyring {
            keys: vec![mon, admin.clone()],
        }
        .save(&path)
        .expect("save");
        let view = Arc::new(MapView::for_tests());
        let keys = MonKeys::load(&path, 2, view.clone()).expect("load");
        let peer_with = |entity: Entity, key: &Secret| Peer {
            kind: 0,
            entity: Some(entity),
            caps: Caps::default(),
            session: None,
            key: Some(key.clone()),
            frames: cairn_auth::FrameMode::Plain,
        };
        let peer = peer_with(Entity::admin(), &admin.secret);
        let osd_key = Secret::generate();
        let osd = peer_with(Entity::osd(3), &osd_key);
        let mut db = KeyDb::default();
        let seed = vec![
            (Entity::admin(), admin.secret.clone(), Caps::admin()),
            (Entity::osd(3), osd_key.clone(), Caps::default()),
        ];
        db.apply(&KeyChange::Seed(seed)).expect("seed");
        view.set_keys_for_tests(db.clone());
        assert_eq!(dialed(&keys), old);
        assert!(!keys.sync_keyring().expect("nothing to write"));
        assert!(opened_with(&keys, &peer, &old));

        let rotate = |until| KeyChange::RotateMon {
            secret: new.clone(),
            previous: old.clone(),
            keep_old_until: until,
        };
        let mut grace = db.clone();
        grace.apply(&rotate(unix_now() + 600)).expect("rotate");
        view.set_keys_for_tests(grace);
        for (k, who) in [(&old, "old"), (&new, "new")] {
            let known = keys
                .key_for(AUTH_KEY, &init_for(k), &Entity::mon(1))
                .unwrap_or_else(|e| panic!("{who} key in the grace: {e}"));
            assert_eq!(&known.key, k);
        }
        // Dials take turns, the old key first.
        let turns: Vec<Secret> = (0..4).map(|_| dialed(&keys)).collect();
        assert!(turns.contains(&old) && turns.contains(&new), "{turns:?}");
        assert_ne!(turns[0], turns[1]);
        // Tickets still open with the old key's service keys; OSDs get both generations.
        assert!(opened_with(&keys, &peer, &old));
        let ServiceKeysReply::Granted { sealed } = keys.grant_service_keys(&osd) else {
            panic!("no service keys");
        };
        let plain = cairn_auth::open(&osd_key, &service_keys_aad("osd.3"), &sealed).expect("open");
        let given: Vec<cairn_auth::ticket::ServiceKey> =
            postcard::from_bytes(&plain).expect("keys");
        let mut want = service_keys_around(&old, unix_now());
        want.extend(service_keys_around(&new, unix_now()));
        assert_eq!(
            given, want,
            "the old key's first (tickets are minted with it), then the new"
        );
        // The keyring file gets the new key (and only its monitors' entry changes).
        assert!(keys.sync_keyring().expect("write"));
        let ring = Keyring::load(&path).expect("reload");
        assert_eq!(ring.get(&Entity::mon(0)).expect("mon").secret, new);
        assert_eq!(ring.get(&Entity::admin()).expect("admin"), &admin);
        assert!(!keys.sync_keyring().expect("written already"));

        let mut after = db.clone();
        after.apply(&rotate(unix_now() - 1)).expect("rotate");
        view.set_keys_for_tests(after);
        let e = keys
            .key_for(AUTH_KEY, &init_for(&old), &Entity::mon(1))
            .err()
            .expect("the old key after the grace");
        assert!(
            e.to_string()
                .contains("previous key, replaced by `cairn auth rotate mon`"),
            "{e}"
        );
        assert!(keys
            .key_for(AUTH_KEY, &init_for(&new), &Entity::mon(1))
            .is_ok());
        assert!((0..3).all(|_| dialed(&keys) == new));
        assert!(opened_with(&keys, &peer, &new));
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
