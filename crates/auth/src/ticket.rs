//! Tickets: how an entity proves itself to an OSD, which holds no entity keys.
//!
//! A monitor that has authenticated an entity gives it a ticket: the entity's name, caps, a
//! fresh session secret and an expiry, sealed (ChaCha20-Poly1305) with the OSD service key,
//! plus the same session secret sealed with the entity's own key. The entity presents the
//! ticket to an OSD and both prove they hold the session secret in the handshake. The
//! monitors keep the service keys; OSDs fetch them, sealed with their own key.
//!
//! ```text
//! sealed ticket = key_id (u32 LE) | nonce (12) | AEAD(service key, postcard(TicketBody), aad "cairn ticket v1" | key_id)
//! sealed secret = nonce (12) | AEAD(key, bytes, aad)
//! ```

use crate::{Caps, Entity, Secret};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use serde::{Deserialize, Serialize};

/// Largest sealed ticket.
pub const MAX_TICKET: usize = 3584;
/// How long a ticket is good for, by default.
pub const TICKET_TTL_SECS: u64 = 3600;

const NONCE_LEN: usize = 12;

/// What a ticket says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketBody {
    pub entity: Entity,
    pub caps: Caps,
    pub session: Secret,
    /// Seconds since the Unix epoch after which the ticket is refused.
    pub expires: u64,
}

/// A service key, with the id tickets sealed by it carry (so rotation can keep the old one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceKey {
    pub id: u32,
    pub secret: Secret,
}

/// Why sealed bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("sealed bytes are malformed or were not sealed with this key")]
    Invalid,
    #[error("the ticket was sealed with service key {0}, which this OSD does not hold (rotated out?); get a new ticket")]
    UnknownKey(u32),
    #[error("the ticket expired {0} s ago; get a new one")]
    Expired(u64),
    #[error("the ticket is over {MAX_TICKET} bytes")]
    TooLarge,
}

/// Seals `plain` with `key`, binding `aad`.
pub fn seal(key: &Secret, aad: &[u8], plain: &[u8]) -> Vec<u8> {
    let nonce: [u8; NONCE_LEN] = crate::random();
    let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(plain);
    // Sealing fails only for messages over 256 GiB (this seals tickets and keys); then
    // nothing is sealed, and opening fails.
    match cipher(key).seal_in_place_separate_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad),
        &mut out[NONCE_LEN..],
    ) {
        Ok(tag) => out.extend_from_slice(tag.as_ref()),
        Err(_) => out.truncate(NONCE_LEN),
    }
    out
}

/// Bytes of the AEAD's tag at the end of sealed bytes.
const TAG_LEN: usize = 16;

/// ChaCha20-Poly1305 keyed with `key`.
fn cipher(key: &Secret) -> LessSafeKey {
    // A `Secret` is always the 32 bytes ChaCha20-Poly1305 takes.
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key.0).unwrap_or_else(|_| unreachable!()))
}

/// Opens bytes sealed by [`seal`] with the same key and `aad`.
pub fn open(key: &Secret, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
    if sealed.len() < NONCE_LEN {
        return Err(SealError::Invalid);
    }
    let (nonce, ct) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Invalid)?;
    let mut buf = ct.to_vec();
    let plain_len = cipher(key)
        .open_in_place(nonce, Aad::from(aad), &mut buf)
        .map_err(|_| SealError::Invalid)?
        .len();
    buf.truncate(plain_len);
    Ok(buf)
}

/// Bytes of a secret key sealed by [`seal`]: nonce, the key, tag.
pub const SEALED_SECRET_LEN: usize = NONCE_LEN + crate::SECRET_LEN + 16;

/// Opens a secret key sealed by [`seal`] (a ticket's session secret, a key sent by `cairn
/// auth`); the length is checked before anything is decrypted.
pub fn open_secret(key: &Secret, aad: &[u8], sealed: &[u8]) -> Result<Secret, SealError> {
    if sealed.len() != SEALED_SECRET_LEN {
        return Err(SealError::Invalid);
    }
    let plain = open(key, aad, sealed)?;
    let bytes =
        <[u8; crate::SECRET_LEN]>::try_from(plain.as_slice()).map_err(|_| SealError::Invalid)?;
    Ok(Secret(bytes))
}

fn ticket_aad(id: u32) -> Vec<u8> {
    [b"cairn ticket v1".as_slice(), &id.to_le_bytes()].concat()
}

/// Seals a ticket with the service key.
pub fn seal_ticket(svc: &ServiceKey, body: &TicketBody) -> Vec<u8> {
    let plain = postcard::to_allocvec(body).unwrap_or_default();
    let mut out = svc.id.to_le_bytes().to_vec();
    out.extend_from_slice(&seal(&svc.secret, &ticket_aad(svc.id), &plain));
    out
}

/// The id of the service key a sealed ticket needs.
pub fn ticket_key_id(sealed: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(sealed.get(..4)?.try_into().ok()?))
}

/// Opens a ticket with whichever of `keys` sealed it, refusing one expired at `now`.
pub fn open_ticket(keys: &[ServiceKey], sealed: &[u8], now: u64) -> Result<TicketBody, SealError> {
    if sealed.len() > MAX_TICKET {
        return Err(SealError::TooLarge);
    }
    let id = ticket_key_id(sealed).ok_or(SealError::Invalid)?;
    // During a rotation of the monitors' key an OSD holds two keys of each id (one per
    // monitors' key, `crate::mon_key`): the ticket opens with one of them.
    let mut with_id = keys.iter().filter(|k| k.id == id).peekable();
    if with_id.peek().is_none() {
        return Err(SealError::UnknownKey(id));
    }
    let plain = with_id
        .find_map(|k| open(&k.secret, &ticket_aad(id), &sealed[4..]).ok())
        .ok_or(SealError::Invalid)?;
    let body: TicketBody = postcard::from_bytes(&plain).map_err(|_| SealError::Invalid)?;
    if body.expires < now {
        return Err(SealError::Expired(now - body.expires));
    }
    Ok(body)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sealed bytes are RFC 8439 ChaCha20-Poly1305 as `nonce | ciphertext | tag`, the layout
    /// earlier releases wrote (with RustCrypto's implementation): bytes sealed by another
    /// implementation (OpenSSL's) open, and ours open there.
    #[test]
    fn sealed_bytes_are_rfc_8439_chacha20_poly1305() {
        use openssl::symm::{decrypt_aead, encrypt_aead, Cipher};
        let (key, nonce) = (Secret::generate(), [9u8; NONCE_LEN]);
        let (aad, plain) = (
            b"cairn ticket v1".as_slice(),
            b"what a ticket says".as_slice(),
        );
        let mut tag = [0u8; TAG_LEN];
        let c = Cipher::chacha20_poly1305();
        let ct = encrypt_aead(c, &key.0, Some(&nonce), aad, plain, &mut tag).expect("openssl");
        let theirs = [&nonce[..], &ct, &tag].concat();
        assert_eq!(open(&key, aad, &theirs).as_deref(), Ok(plain));
        let ours = seal(&key, aad, plain);
        let (n, rest) = ours.split_at(NONCE_LEN);
        let (ct, tag) = rest.split_at(rest.len() - TAG_LEN);
        let opened = decrypt_aead(c, &key.0, Some(n), aad, ct, tag).expect("openssl opens ours");
        assert_eq!(opened, plain);
    }

    #[test]
    fn a_sealed_secret_opens_only_whole_with_its_key_and_aad() {
        let (k, s) = (Secret::generate(), Secret::generate());
        let sealed = seal(&k, b"aad", &s.0);
        assert_eq!(sealed.len(), SEALED_SECRET_LEN);
        assert_eq!(open_secret(&k, b"aad", &sealed), Ok(s));
        assert_eq!(open_secret(&k, b"other", &sealed), Err(SealError::Invalid));
        assert_eq!(
            open_secret(&Secret::generate(), b"aad", &sealed),
            Err(SealError::Invalid)
        );
        // Another length is refused before decryption: not a secret, whatever the key.
        let long = seal(&k, b"aad", &[0u8; 33]);
        assert_eq!(open_secret(&k, b"aad", &long), Err(SealError::Invalid));
        assert_eq!(
            open_secret(&k, b"aad", &sealed[..40]),
            Err(SealError::Invalid)
        );
    }

    fn body(expires: u64) -> TicketBody {
        TicketBody {
            entity: Entity::admin(),
            caps: Caps::admin(),
            session: Secret::generate(),
            expires,
        }
    }

    #[test]
    fn tickets_open_only_with_their_key_and_in_time() {
        let svc = ServiceKey {
            id: 7,
            secret: Secret::generate(),
        };
        let other = ServiceKey {
            id: 8,
            secret: Secret::generate(),
        };
        let b = body(1000);
        let t = seal_ticket(&svc, &b);
        assert_eq!(ticket_key_id(&t), Some(7));
        assert_eq!(
            open_ticket(&[other.clone(), svc.clone()], &t, 999).unwrap(),
            b
        );
        assert_eq!(
            open_ticket(std::slice::from_ref(&svc), &t, 1005),
            Err(SealError::Expired(5))
        );
        assert_eq!(
            open_ticket(std::slice::from_ref(&other), &t, 0),
            Err(SealError::UnknownKey(7))
        );
        // Same id, other secret (a forged ticket): refused.
        let forged = ServiceKey { id: 7, ..other };
        assert_eq!(
            open_ticket(std::slice::from_ref(&forged), &t, 0),
            Err(SealError::Invalid)
        );
        // Two keys of that id (a rotation of the monitors' key): the one that opens it wins,
        // in either order.
        assert_eq!(
            open_ticket(&[forged.clone(), svc.clone()], &t, 0),
            Ok(b.clone())
        );
        assert_eq!(open_ticket(&[svc.clone(), forged], &t, 0), Ok(b.clone()));
        for i in 0..t.len() {
            let mut bad = t.clone();
            bad[i] ^= 0x40;
            assert!(
                open_ticket(std::slice::from_ref(&svc), &bad, 0).is_err(),
                "byte {i}"
            );
        }
        assert!(open_ticket(std::slice::from_ref(&svc), &t[..10], 0).is_err());
        assert_eq!(
            open_ticket(&[svc], &vec![7; MAX_TICKET + 1], 0),
            Err(SealError::TooLarge)
        );
    }

    #[test]
    fn sealed_secrets_need_the_key_and_the_aad() {
        let k = Secret::generate();
        let s = seal(&k, b"a", b"secret");
        assert_eq!(open(&k, b"a", &s).unwrap(), b"secret");
        assert!(open(&k, b"b", &s).is_err());
        assert!(open(&Secret::generate(), b"a", &s).is_err());
        assert_ne!(seal(&k, b"a", b"secret"), s, "a fresh nonce each time");
    }
}
