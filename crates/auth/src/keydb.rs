//! The monitors' key database: every entity's key and caps, kept in the monitors' replicated
//! state (never in the cluster map clients receive) and changed only by [`KeyChange`]s that
//! went through Raft, so every monitor admits the same keys.
//!
//! The monitors' own key starts in each monitor's keyring file (monitors prove it to each
//! other before any of this is replicated); once rotated (`KeyChange::RotateMon`) the new one
//! and its predecessor are here too, as `KeyDb::mon` (`crate::mon_key`). The database starts empty and
//! *unseeded*; the first leader seeds it with the keys of its keyring file (what `cairn dev up`
//! or a bootstrap wrote there). Until then a monitor admits the keys of its file.
//!
//! Rotation keeps the previous key valid for a grace period, so a process that still holds it
//! keeps working while the operator installs the new one. A handshake names the key it proves
//! by [`key_id`], so the monitor knows which of the two to prove itself with.
//!
//! Applying a change is deterministic (no clock, no randomness): the leader puts the new
//! secret and the grace's end into the change before proposing it.

use crate::{Caps, Entity, EntityKind, Perms, Secret};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::BTreeMap;

/// Bytes of a key id.
pub const KEY_ID_LEN: usize = 8;

/// A key's public name: the first bytes of `HMAC-SHA256(key, "cairn key id v1")`. It tells
/// which of an entity's keys a handshake proves, and reveals nothing usable about the key.
pub fn key_id(key: &Secret) -> [u8; KEY_ID_LEN] {
    // A 32-byte key is always accepted by HMAC.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&key.0).unwrap_or_else(|_| unreachable!());
    m.update(b"cairn key id v1");
    let full = m.finalize().into_bytes();
    let mut id = [0u8; KEY_ID_LEN];
    id.copy_from_slice(&full[..KEY_ID_LEN]);
    id
}

/// Most keys the database holds (a change that would pass it is refused).
pub const MAX_KEYS: usize = 65_536;

/// One entity's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredKey {
    pub secret: Secret,
    pub caps: Caps,
    /// The key it replaced, still accepted until the unix time given (seconds).
    pub previous: Option<(Secret, u64)>,
}

/// The replicated key database.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyDb {
    /// Whether the bootstrap keys have been loaded (until then monitors use their files).
    pub seeded: bool,
    pub keys: BTreeMap<Entity, StoredKey>,
    /// The monitors' shared key once it has been rotated (before: only in their keyrings).
    pub mon: Option<crate::MonKey>,
}

/// A change to the key database, as proposed through Raft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyChange {
    /// Loads the bootstrap keys once (ignored when already seeded).
    Seed(Vec<(Entity, Secret, Caps)>),
    /// Adds a key; refused when the entity has a different one.
    Add {
        entity: Entity,
        secret: Secret,
        caps: Caps,
    },
    /// Replaces an entity's caps.
    SetCaps { entity: Entity, caps: Caps },
    /// Gives an entity a new key; the old one is accepted until `keep_old_until` (unix
    /// seconds; 0 = not at all).
    Rotate {
        entity: Entity,
        secret: Secret,
        keep_old_until: u64,
    },
    /// Removes an entity's key.
    Remove { entity: Entity },
    /// Gives the monitors a new shared key. `previous` is the key the proposing leader held
    /// (the keyring files' key before the first rotation), accepted until `keep_old_until`.
    /// Refused unless `previous` is still the monitors' key when applied: two rotations
    /// proposed at once both start from one key, and only the first applies (otherwise the
    /// second would end the first one's grace at once).
    RotateMon {
        secret: Secret,
        previous: Secret,
        keep_old_until: u64,
    },
}

/// Why a key change was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum KeyDbError {
    #[error("{0} has no key in the monitors' key database (`cairn auth ls` lists them)")]
    NoSuchEntity(Entity),
    #[error("{0} already has another key: `cairn auth get {0}` shows it, `cairn auth rotate {0}` replaces it")]
    Exists(Entity),
    #[error(
        "{0}: the monitors' key lives in each monitor's keyring file, not in the key database"
    )]
    MonitorKey(Entity),
    #[error("{0}: daemons have no caps (their role comes from their entity)")]
    DaemonCaps(Entity),
    #[error("refusing to leave no key with `mon x` (no one could manage keys any more): give another entity `mon x` first")]
    LastAdmin,
    #[error("the key database holds {MAX_KEYS} keys, its limit")]
    Full,
    #[error("the monitors have not loaded their bootstrap keys yet; try again in a moment")]
    NotSeeded,
    #[error("bad caps: {0}")]
    BadCaps(String),
    #[error(
        "another rotation of the monitors' key was applied while this one was proposed; its \
         old key is kept until {0} (unix time): rotate again after that"
    )]
    MonKeyRotatedMeanwhile(u64),
}

fn is_admin(k: &StoredKey) -> bool {
    k.caps.mon_perms().covers(Perms::X)
}

impl KeyDb {
    /// Applies `change`; on `Err` nothing changed.
    pub fn apply(&mut self, change: &KeyChange) -> Result<(), KeyDbError> {
        if let KeyChange::Seed(keys) = change {
            if !self.seeded {
                for (entity, secret, caps) in keys.iter().take(MAX_KEYS) {
                    if entity.kind() != EntityKind::Mon {
                        let k = StoredKey {
                            secret: secret.clone(),
                            caps: caps.clone(),
                            previous: None,
                        };
                        self.keys.entry(entity.clone()).or_insert(k);
                    }
                }
                self.seeded = true;
            }
            return Ok(());
        }
        if let KeyChange::RotateMon {
            secret,
            previous,
            keep_old_until,
        } = change
        {
            if let Some(m) = self.mon.as_ref().filter(|m| &m.secret != previous) {
                let until = m.previous.as_ref().map_or(0, |p| p.1);
                return Err(KeyDbError::MonKeyRotatedMeanwhile(until));
            }
            let old = previous.clone();
            self.mon = Some(crate::MonKey {
                secret: secret.clone(),
                previous: (*keep_old_until > 0).then_some((old, *keep_old_until)),
            });
            return Ok(());
        }
        if !self.seeded {
            return Err(KeyDbError::NotSeeded);
        }
        if self.takes_the_last_admin(change) {
            return Err(KeyDbError::LastAdmin);
        }
        // Every refusal below comes before anything is changed.
        self.change(change)
    }

    /// Whether `change` would leave no key with `mon x` (removing the last one, or taking
    /// its `x` away).
    fn takes_the_last_admin(&self, change: &KeyChange) -> bool {
        let (entity, keeps_x) = match change {
            KeyChange::Remove { entity } => (entity, false),
            // Caps that do not parse are refused for what they are, further on.
            KeyChange::SetCaps { entity, caps } if caps.validate().is_ok() => {
                (entity, caps.mon_perms().covers(Perms::X))
            }
            _ => return false,
        };
        !keeps_x
            && self.keys.get(entity).is_some_and(is_admin)
            && self.keys.values().filter(|k| is_admin(k)).count() == 1
    }

    fn existing(&mut self, entity: &Entity) -> Result<&mut StoredKey, KeyDbError> {
        self.keys
            .get_mut(entity)
            .ok_or_else(|| KeyDbError::NoSuchEntity(entity.clone()))
    }

    fn change(&mut self, change: &KeyChange) -> Result<(), KeyDbError> {
        let entity = match change {
            KeyChange::Seed(_) | KeyChange::RotateMon { .. } => return Ok(()),
            KeyChange::Add { entity, .. }
            | KeyChange::SetCaps { entity, .. }
            | KeyChange::Rotate { entity, .. }
            | KeyChange::Remove { entity } => entity,
        };
        if entity.kind() == EntityKind::Mon {
            return Err(KeyDbError::MonitorKey(entity.clone()));
        }
        match change {
            KeyChange::Seed(_) | KeyChange::RotateMon { .. } => Ok(()),
            KeyChange::Add {
                entity,
                secret,
                caps,
            } => {
                check_caps(entity, caps)?;
                match self.keys.get(entity) {
                    Some(k) if &k.secret == secret && &k.caps == caps => Ok(()),
                    Some(_) => Err(KeyDbError::Exists(entity.clone())),
                    None if self.keys.len() >= MAX_KEYS => Err(KeyDbError::Full),
                    None => {
                        let k = StoredKey {
                            secret: secret.clone(),
                            caps: caps.clone(),
                            previous: None,
                        };
                        self.keys.insert(entity.clone(), k);
                        Ok(())
                    }
                }
            }
            KeyChange::SetCaps { entity, caps } => {
                check_caps(entity, caps)?;
                self.existing(entity)?.caps = caps.clone();
                Ok(())
            }
            KeyChange::Rotate {
                entity,
                secret,
                keep_old_until,
            } => {
                let k = self.existing(entity)?;
                let old = std::mem::replace(&mut k.secret, secret.clone());
                k.previous = (*keep_old_until > 0).then_some((old, *keep_old_until));
                Ok(())
            }
            KeyChange::Remove { entity } => {
                self.keys
                    .remove(entity)
                    .ok_or_else(|| KeyDbError::NoSuchEntity(entity.clone()))?;
                Ok(())
            }
        }
    }

    /// The key of `entity` whose id is `id`, and its caps, at unix time `now`: the current
    /// key, or the previous one while its grace lasts. `Err` says why not, for the refusal.
    pub fn key_for(
        &self,
        entity: &Entity,
        id: &[u8; KEY_ID_LEN],
        now: u64,
    ) -> Result<(Secret, Caps), KeyRefusal> {
        let k = self
            .keys
            .get(entity)
            .ok_or_else(|| KeyRefusal::UnknownEntity(entity.clone()))?;
        if &key_id(&k.secret) == id {
            return Ok((k.secret.clone(), k.caps.clone()));
        }
        match &k.previous {
            Some((old, until)) if &key_id(old) == id && now < *until => {
                Ok((old.clone(), k.caps.clone()))
            }
            Some((old, _)) if &key_id(old) == id => Err(KeyRefusal::PreviousKey(entity.clone())),
            _ => Err(KeyRefusal::OtherKey(entity.clone())),
        }
    }
}

/// Why the key an entity proves in a handshake is not admitted (by the key database, a
/// monitor's keyring file before the database is seeded, or the monitors' own key): the
/// refusal the peer is sent. Every one is a permission failure: trying again with the same
/// key cannot help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyRefusal {
    /// The key database holds no key for the entity.
    #[error("unknown entity {0}: the monitors hold no key for it (`cairn auth add`)")]
    UnknownEntity(Entity),
    /// The entity proved the key a rotation replaced, after its grace ended.
    #[error(
        "{0} presents its previous key, replaced by `cairn auth rotate` and no longer \
         accepted: install the new key (`cairn auth get {0}`)"
    )]
    PreviousKey(Entity),
    /// The entity proved a key the database does not hold for it.
    #[error(
        "{0} presents a key the monitors do not hold for it (rotated or re-created?): \
         `cairn auth get {0}` shows the current key"
    )]
    OtherKey(Entity),
    /// Before the database is seeded: no monitor keyring file holds a key for the entity.
    #[error("unknown entity {0}: no monitor keyring holds its key")]
    NotInKeyring(Entity),
    /// Before the database is seeded: the keyring file holds another key for the entity.
    #[error("{0} presents a key the monitors do not hold for it (rotated or re-created?)")]
    OtherKeyringKey(Entity),
    /// A monitor proved the monitors' key a rotation replaced, after its grace ended.
    #[error(
        "{0} presents the monitors' previous key, replaced by `cairn auth rotate mon` and no \
         longer accepted: give it the new key (any running monitor's keyring holds it)"
    )]
    PreviousMonKey(Entity),
    /// A monitor proved a monitors' key other than the one this monitor holds.
    #[error("{entity} holds a monitors' key other than this monitor's (keyring {})", keyring.display())]
    OtherMonKey {
        entity: Entity,
        /// The keyring file this monitor's key is in.
        keyring: std::path::PathBuf,
    },
}

fn check_caps(entity: &Entity, caps: &Caps) -> Result<(), KeyDbError> {
    caps.validate()
        .map_err(|e| KeyDbError::BadCaps(e.0.clone()))?;
    let daemon = matches!(entity.kind(), EntityKind::Osd | EntityKind::Mon);
    if daemon && caps != &Caps::default() {
        return Err(KeyDbError::DaemonCaps(entity.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(name: &str) -> Entity {
        Entity::parse(&format!("client.{name}")).unwrap()
    }

    fn seeded() -> KeyDb {
        let mut db = KeyDb::default();
        let seed = KeyChange::Seed(vec![
            (Entity::admin(), Secret::generate(), Caps::admin()),
            (Entity::mon(0), Secret::generate(), Caps::default()),
        ]);
        db.apply(&seed).unwrap();
        db
    }

    #[test]
    fn seeding_happens_once_and_changes_wait_for_it() {
        let mut db = KeyDb::default();
        let add = KeyChange::Add {
            entity: client("a"),
            secret: Secret::generate(),
            caps: Caps::default(),
        };
        assert_eq!(db.apply(&add), Err(KeyDbError::NotSeeded));
        let admin = Secret::generate();
        db.apply(&KeyChange::Seed(vec![(
            Entity::admin(),
            admin.clone(),
            Caps::admin(),
        )]))
        .unwrap();
        // A second seed (another monitor's file) changes nothing.
        db.apply(&KeyChange::Seed(vec![(
            Entity::admin(),
            Secret::generate(),
            Caps::default(),
        )]))
        .unwrap();
        assert_eq!(db.keys[&Entity::admin()].secret, admin);
        db.apply(&add).unwrap();
        // The same add again is a no-op (a retried command), another key is refused.
        db.apply(&add).unwrap();
        let other = KeyChange::Add {
            entity: client("a"),
            secret: Secret::generate(),
            caps: Caps::default(),
        };
        assert_eq!(db.apply(&other), Err(KeyDbError::Exists(client("a"))));
    }

    #[test]
    fn the_monitor_key_never_enters_and_daemons_get_no_caps() {
        let mut db = seeded();
        assert!(!db.keys.contains_key(&Entity::mon(0)));
        let mon = KeyChange::Remove {
            entity: Entity::mon(1),
        };
        assert_eq!(db.apply(&mon), Err(KeyDbError::MonitorKey(Entity::mon(1))));
        let osd = KeyChange::Add {
            entity: Entity::osd(1),
            secret: Secret::generate(),
            caps: Caps::admin(),
        };
        assert_eq!(db.apply(&osd), Err(KeyDbError::DaemonCaps(Entity::osd(1))));
        let bad = KeyChange::SetCaps {
            entity: Entity::admin(),
            caps: Caps {
                mon: "q".into(),
                ..Caps::default()
            },
        };
        assert!(matches!(db.apply(&bad), Err(KeyDbError::BadCaps(_))));
    }

    #[test]
    fn the_monitors_key_rotates_from_the_file_key_then_from_its_own() {
        // Not seeded yet: the monitors' key does not depend on the entity keys.
        let mut db = KeyDb::default();
        let (file, k1, k2) = (Secret::generate(), Secret::generate(), Secret::generate());
        let rotate = |secret: &Secret, previous: &Secret, until| KeyChange::RotateMon {
            secret: secret.clone(),
            previous: previous.clone(),
            keep_old_until: until,
        };
        db.apply(&rotate(&k1, &file, 50)).expect("first rotation");
        let m = db.mon.clone().expect("rotated");
        assert_eq!(
            (m.secret, m.previous),
            (k1.clone(), Some((file.clone(), 50)))
        );
        // A rotation proposed from the key the first one replaced (two at once) is refused,
        // and changes nothing.
        assert_eq!(
            db.apply(&rotate(&k2, &file, 0)),
            Err(KeyDbError::MonKeyRotatedMeanwhile(50))
        );
        assert_eq!(db.mon.as_ref().map(|m| &m.secret), Some(&k1));
        // One from the key the database holds replaces it.
        db.apply(&rotate(&k2, &k1, 0)).expect("second");
        assert_eq!(
            db.mon,
            Some(crate::MonKey {
                secret: k2,
                previous: None
            })
        );
        assert!(db.keys.is_empty() && !db.seeded);
    }

    #[test]
    fn rotation_keeps_the_old_key_for_its_grace_only() {
        let mut db = seeded();
        let old = db.keys[&Entity::admin()].secret.clone();
        let new = Secret::generate();
        db.apply(&KeyChange::Rotate {
            entity: Entity::admin(),
            secret: new.clone(),
            keep_old_until: 1000,
        })
        .unwrap();
        let a = Entity::admin();
        assert_eq!(db.key_for(&a, &key_id(&new), 2000).unwrap().0, new);
        assert_eq!(db.key_for(&a, &key_id(&old), 999).unwrap().0, old);
        let e = db.key_for(&a, &key_id(&old), 1000).unwrap_err();
        assert_eq!(e, KeyRefusal::PreviousKey(a.clone()));
        assert!(e.to_string().contains("previous key"), "{e}");
        let e = db.key_for(&a, &key_id(&Secret::generate()), 0).unwrap_err();
        assert!(e.to_string().contains("do not hold"), "{e}");
        let e = db.key_for(&client("x"), &key_id(&new), 0).unwrap_err();
        assert!(e.to_string().contains("unknown entity client.x"), "{e}");
        // Without a grace the old key is refused at once.
        db.apply(&KeyChange::Rotate {
            entity: Entity::admin(),
            secret: Secret::generate(),
            keep_old_until: 0,
        })
        .unwrap();
        assert!(db.key_for(&a, &key_id(&new), 0).is_err());
    }

    #[test]
    fn the_last_key_that_can_manage_keys_stays() {
        let mut db = seeded();
        let a = Entity::admin();
        let rm = KeyChange::Remove { entity: a.clone() };
        assert_eq!(db.apply(&rm), Err(KeyDbError::LastAdmin));
        let demote = KeyChange::SetCaps {
            entity: a.clone(),
            caps: Caps::default(),
        };
        assert_eq!(db.apply(&demote), Err(KeyDbError::LastAdmin));
        assert_eq!(db.keys[&a].caps, Caps::admin());
        db.apply(&KeyChange::Add {
            entity: client("ops"),
            secret: Secret::generate(),
            caps: Caps::admin(),
        })
        .unwrap();
        db.apply(&rm).unwrap();
        assert_eq!(db.apply(&rm), Err(KeyDbError::NoSuchEntity(a)));
    }

    #[test]
    fn key_ids_differ_per_key_and_are_stable() {
        let k = Secret::generate();
        assert_eq!(key_id(&k), key_id(&k.clone()));
        assert_ne!(key_id(&k), key_id(&Secret::generate()));
    }
}
