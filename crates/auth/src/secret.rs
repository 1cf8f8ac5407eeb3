//! Secret keys: 32 random bytes, written as 64 hex digits, never printed by `Debug`.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bytes of a secret key.
pub const SECRET_LEN: usize = 32;

/// A secret key (an entity's, a ticket's session secret, a service key).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret(pub [u8; SECRET_LEN]);

/// Why a string is not a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a secret key is {} hex digits", 2 * SECRET_LEN)]
pub struct BadSecret;

impl Secret {
    /// A new secret from the operating system's random source.
    pub fn generate() -> Secret {
        let mut b = [0u8; SECRET_LEN];
        rand::rngs::OsRng.fill_bytes(&mut b);
        Secret(b)
    }

    /// The secret as hex digits (for key files; handle with care).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Secret, BadSecret> {
        let s = s.trim().as_bytes();
        if s.len() != 2 * SECRET_LEN {
            return Err(BadSecret);
        }
        let mut out = [0u8; SECRET_LEN];
        for (i, o) in out.iter_mut().enumerate() {
            let hi = (s[2 * i] as char).to_digit(16).ok_or(BadSecret)?;
            let lo = (s[2 * i + 1] as char).to_digit(16).ok_or(BadSecret)?;
            *o = (hi * 16 + lo) as u8;
        }
        Ok(Secret(out))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The TLS pre-shared key of an NBD user: derived from its entity key (so it changes when
/// the key is rotated) and never usable as the key itself.
pub fn nbd_psk(key: &Secret) -> Secret {
    let hk = hkdf::Hkdf::<sha2::Sha256>::new(None, &key.0);
    let mut out = [0u8; SECRET_LEN];
    // 32 bytes is far below HKDF-SHA256's 8160-byte limit: expand cannot fail.
    let _ = hk.expand(b"cairn nbd tls-psk v1", &mut out);
    Secret(out)
}

/// `n` random bytes (nonces).
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_debug_hides_the_bytes() {
        let s = Secret::generate();
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert_ne!(Secret::generate(), s);
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert!(Secret::from_hex("00").is_err());
        assert!(Secret::from_hex(&"g".repeat(64)).is_err());
        assert!(Secret::from_hex(&"é".repeat(32)).is_err());
    }
}
