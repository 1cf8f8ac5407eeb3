//! Service keys: the keys OSD tickets are sealed with, and how tickets are minted.
//!
//! OSDs hold no entity keys. They hold the *service keys* the monitors give them (sealed with
//! the OSD's own key), and open with them the tickets the monitors give clients. Service keys
//! are derived from the monitors' shared key, one per period of [`SERVICE_KEY_PERIOD_SECS`]:
//!
//! `service key(id) = HKDF-SHA256(ikm mon key, salt "", info "cairn osd service key v1" | id LE)`
//!
//! so every monitor derives the same keys without storing or agreeing on anything, a new key
//! comes into use every period by itself (rotation), and an OSD given the keys of periods
//! `id - 1 ..= id + 1` opens every ticket issued around now. A key that leaks from an OSD
//! stops being useful two periods later; the monitors' key never leaves the monitors (HKDF is
//! one-way).

use crate::ticket::{seal_ticket, ServiceKey, TicketBody};
use crate::{Caps, Entity, Secret};
use cairn_failstop::RwLockOrDie;
use hkdf::Hkdf;
use sha2::Sha256;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// How long one service key is the current one (a day).
pub const SERVICE_KEY_PERIOD_SECS: u64 = 86_400;

/// The id of the service key current at `now` (seconds since the Unix epoch).
pub fn service_key_id(now: u64) -> u32 {
    u32::try_from(now / SERVICE_KEY_PERIOD_SECS).unwrap_or(u32::MAX)
}

/// The service key `id`, derived from the monitors' shared key.
pub fn derive_service_key(mon_key: &Secret, id: u32) -> ServiceKey {
    let hk = Hkdf::<Sha256>::new(None, &mon_key.0);
    let info = [b"cairn osd service key v1".as_slice(), &id.to_le_bytes()].concat();
    let mut out = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's output limit.
    hk.expand(&info, &mut out)
        .unwrap_or_else(|_| unreachable!());
    ServiceKey {
        id,
        secret: Secret(out),
    }
}

/// The service keys an OSD is given at `now`: the previous, current and next period's.
pub fn service_keys_around(mon_key: &Secret, now: u64) -> Vec<ServiceKey> {
    let cur = service_key_id(now);
    [cur.saturating_sub(1), cur, cur.saturating_add(1)]
        .into_iter()
        .map(|id| derive_service_key(mon_key, id))
        .collect()
}

/// A ticket just minted: what the holder presents, and the secret it proves.
#[derive(Debug, Clone)]
pub struct Minted {
    pub ticket: Vec<u8>,
    pub session: Secret,
    pub expires: u64,
}

/// Mints a ticket for `entity` with `caps`, good for `ttl_secs` from `now`.
pub fn mint(svc: &ServiceKey, entity: &Entity, caps: &Caps, now: u64, ttl_secs: u64) -> Minted {
    let body = TicketBody {
        entity: entity.clone(),
        caps: caps.clone(),
        session: Secret::generate(),
        expires: now.saturating_add(ttl_secs),
    };
    Minted {
        ticket: seal_ticket(svc, &body),
        session: body.session,
        expires: body.expires,
    }
}

/// The service keys a node holds, replaced whole when the monitors send new ones.
#[derive(Debug, Default)]
pub struct ServiceKeys {
    keys: RwLock<Vec<ServiceKey>>,
    /// A ticket did not open with the keys held (the monitors may have newer ones).
    wanted: AtomicBool,
}

impl ServiceKeys {
    /// Notes that a ticket did not open with the keys held, so that the holder fetches them
    /// again soon (`ServiceKeys::take_wanted`) rather than at its next periodic fetch.
    pub fn want_newer(&self) {
        self.wanted.store(true, Ordering::Relaxed);
    }

    /// Whether a ticket missed since the last call.
    pub fn take_wanted(&self) -> bool {
        self.wanted.swap(false, Ordering::Relaxed)
    }

    /// Replaces the keys held.
    pub fn set(&self, keys: Vec<ServiceKey>) {
        *self.keys.write_or_die() = keys;
    }

    /// The keys held.
    pub fn get(&self) -> Vec<ServiceKey> {
        self.keys.read_or_die().clone()
    }

    /// The key to seal new tickets with at `now`: the current period's, else the newest held.
    pub fn current(&self, now: u64) -> Option<ServiceKey> {
        let keys = self.keys.read_or_die();
        let id = service_key_id(now);
        keys.iter()
            .find(|k| k.id == id)
            .or_else(|| keys.iter().max_by_key(|k| k.id))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ticket::{open_ticket, SealError};

    #[test]
    fn every_monitor_derives_the_same_keys_and_osds_open_tickets_around_now() {
        let mon = Secret::generate();
        let now = 1_800_000_000;
        let a = service_keys_around(&mon, now);
        assert_eq!(a, service_keys_around(&mon, now), "deterministic");
        assert_eq!(a.len(), 3);
        assert_ne!(a[0].secret, a[1].secret);
        assert_ne!(
            service_keys_around(&Secret::generate(), now)[1].secret,
            a[1].secret
        );
        let held = ServiceKeys::default();
        assert!(held.get().is_empty());
        held.set(a.clone());
        let svc = held.current(now).expect("current key");
        assert_eq!(svc.id, service_key_id(now));
        let m = mint(&svc, &Entity::admin(), &Caps::admin(), now, 60);
        let body = open_ticket(&held.get(), &m.ticket, now + 59).expect("opens");
        assert_eq!(body.session, m.session);
        assert_eq!(body.entity, Entity::admin());
        assert_eq!(
            open_ticket(&held.get(), &m.ticket, now + 61),
            Err(SealError::Expired(1))
        );
        // Two periods later the OSD's keys have moved on; the old ticket's key is gone.
        let later = now + 2 * SERVICE_KEY_PERIOD_SECS;
        held.set(service_keys_around(&mon, later));
        assert!(matches!(
            open_ticket(&held.get(), &m.ticket, now),
            Err(SealError::UnknownKey(_))
        ));
    }
}
