//! The monitors' shared key, and how a rotation of it runs without stopping anything.
//!
//! Until it is first rotated, the monitors' key lives only in each monitor's keyring file.
//! `cairn auth rotate mon` puts a new one into the key database (through Raft, so every
//! monitor learns it) together with the key it replaces and the end of a grace. During the
//! grace a monitor:
//! - admits peer monitors proving either key (a monitor that has not applied the rotation
//!   yet knows only the old one; one added with a keyring copied after it only the new one);
//! - dials its peers with either, the old one first, trying the other when one is refused;
//! - mints tickets with the service keys of the *old* key, which every OSD already holds, and
//!   gives OSDs the service keys of both, so that by the end of the grace every OSD opens the
//!   tickets of the new key. OSDs fetch their service keys every 30 s, so the grace must be
//!   longer than that ([`MIN_MON_KEEP_OLD_SECS`]).
//!
//! After the grace the old key is refused; its service keys are still given to OSDs for one
//! ticket lifetime, as tickets minted just before the grace ended are still presented.

use crate::keydb::key_id;
use crate::ticket::TICKET_TTL_SECS;
use crate::Secret;
use serde::{Deserialize, Serialize};

/// Shortest grace a rotation of the monitors' key may keep the old key: twice the interval at
/// which OSDs fetch their service keys, so each has the new ones before tickets switch.
pub const MIN_MON_KEEP_OLD_SECS: u64 = 60;

/// The monitors' key as the key database holds it once it has been rotated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonKey {
    pub secret: Secret,
    /// The key it replaced, accepted until the unix time given (seconds).
    pub previous: Option<(Secret, u64)>,
}

/// The monitors' keys one monitor uses at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonKeySet {
    /// The newest key.
    pub current: Secret,
    /// The key it replaced, while its grace lasts.
    pub previous: Option<Secret>,
    /// The key it replaced, while tickets sealed with its service keys may be presented.
    previous_tickets: Option<Secret>,
}

impl MonKeySet {
    /// The keys at unix time `now`, from the key database's entry (`None`: never rotated,
    /// the keyring file's key `file` is the only one).
    pub fn at(db: Option<&MonKey>, file: &Secret, now: u64) -> MonKeySet {
        let Some(k) = db else {
            return MonKeySet {
                current: file.clone(),
                previous: None,
                previous_tickets: None,
            };
        };
        let prev = |end: u64| {
            k.previous
                .as_ref()
                .filter(|(_, until)| now < until.saturating_add(end))
                .map(|(s, _)| s.clone())
        };
        MonKeySet {
            current: k.secret.clone(),
            previous: prev(0),
            previous_tickets: prev(TICKET_TTL_SECS),
        }
    }

    /// The key a peer monitor proves when it names key id `id`, if it is admitted.
    pub fn admits(&self, id: &[u8; crate::KEY_ID_LEN]) -> Option<&Secret> {
        std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|k| &key_id(k) == id)
    }

    /// The keys to prove to a peer monitor, in the order to try them: during the grace the
    /// old one first (a peer that has not applied the rotation knows only it).
    pub fn to_dial(&self) -> Vec<Secret> {
        self.previous
            .iter()
            .chain(std::iter::once(&self.current))
            .cloned()
            .collect()
    }

    /// The key whose service keys seal the tickets minted now: the old one during the grace
    /// (OSDs may not have fetched the new service keys yet), then the new one.
    pub fn ticket_key(&self) -> &Secret {
        self.previous.as_ref().unwrap_or(&self.current)
    }

    /// The keys whose service keys OSDs are given, the one tickets are minted with first.
    pub fn service_generations(&self) -> Vec<&Secret> {
        let mut v = vec![self.ticket_key()];
        for k in std::iter::once(&self.current).chain(&self.previous_tickets) {
            if !v.contains(&k) {
                v.push(k);
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotation_admits_both_keys_in_its_grace_and_moves_tickets_to_the_new_key_after_it() {
        let (old, new) = (Secret::generate(), Secret::generate());
        let never = MonKeySet::at(None, &old, 100);
        assert_eq!(never.admits(&key_id(&old)), Some(&old));
        assert_eq!(never.admits(&key_id(&new)), None);
        assert_eq!(never.to_dial(), vec![old.clone()]);
        assert_eq!(never.service_generations(), vec![&old]);

        let db = MonKey {
            secret: new.clone(),
            previous: Some((old.clone(), 1_000)),
        };
        // The file's key no longer counts once the database has one.
        let other = Secret::generate();
        let grace = MonKeySet::at(Some(&db), &other, 999);
        assert_eq!(grace.admits(&key_id(&old)), Some(&old));
        assert_eq!(grace.admits(&key_id(&new)), Some(&new));
        assert_eq!(grace.admits(&key_id(&other)), None);
        assert_eq!(grace.to_dial(), vec![old.clone(), new.clone()]);
        assert_eq!(grace.ticket_key(), &old);
        assert_eq!(grace.service_generations(), vec![&old, &new]);

        let after = MonKeySet::at(Some(&db), &other, 1_000);
        assert_eq!(after.admits(&key_id(&old)), None, "the grace ended");
        assert_eq!(after.to_dial(), vec![new.clone()]);
        assert_eq!(after.ticket_key(), &new);
        // Tickets minted with the old key's service keys just before are still opened.
        assert_eq!(after.service_generations(), vec![&new, &old]);
        let later = MonKeySet::at(Some(&db), &other, 1_000 + TICKET_TTL_SECS);
        assert_eq!(later.service_generations(), vec![&new]);

        let no_grace = MonKey {
            secret: new.clone(),
            previous: None,
        };
        let at_once = MonKeySet::at(Some(&no_grace), &old, 0);
        assert_eq!(at_once.admits(&key_id(&old)), None);
        assert_eq!(at_once.service_generations(), vec![&new]);
        // An end of grace near u64::MAX does not overflow.
        let far = MonKey {
            secret: new,
            previous: Some((old.clone(), u64::MAX - 1)),
        };
        let s = MonKeySet::at(Some(&far), &other, u64::MAX - 2);
        assert_eq!(s.previous, Some(old));
    }
}
