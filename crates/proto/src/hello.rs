//! The handshake: the first bytes each side sends on a new connection. It carries the frame
//! layout versions the sender speaks and the authentication records (`crate::auth`).
//!
//! ```text
//! offset size field
//!  0     4    magic        "CRNH"
//!  4     1    min_version  oldest frame layout version the sender reads
//!  5     1    max_version  newest frame layout version the sender reads
//!  6     1    node_kind    1 client, 2 OSD, 3 monitor
//!  7     1    auth_method  0 none, 1 key, 2 ticket, 255 refused (`crate::auth`)
//!  8     2    auth_len     bytes of auth data that follow the head (<= AUTH_MAX)
//! 10     2    reserved     0
//! 12     4    crc          crc32c of bytes 0..12 and the auth data
//! 16          auth data
//! ```

/// Magic of a handshake.
pub const HELLO_MAGIC: [u8; 4] = *b"CRNH";
/// Size of the fixed part of a handshake.
pub const HELLO_LEN: usize = 16;
/// Largest auth data.
pub const AUTH_MAX: usize = 4096;
/// No authentication.
pub const AUTH_NONE: u8 = 0;

/// Why a handshake was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    #[error("the peer did not start with a Cairn handshake (bad magic {0:02x?})")]
    BadMagic([u8; 4]),
    #[error("handshake checksum mismatch")]
    Checksum,
    #[error("handshake auth data of {0} bytes is over the limit of {AUTH_MAX}")]
    AuthTooLarge(usize),
    #[error("handshake needs {0} more bytes")]
    Truncated(usize),
    #[error("no common protocol version: we read {ours:?}, the peer reads {theirs:?}; upgrade the older side")]
    NoCommonVersion { ours: (u8, u8), theirs: (u8, u8) },
    #[error("authentication method {0} is not supported")]
    UnsupportedAuth(u8),
}

/// A handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub min_version: u8,
    pub max_version: u8,
    pub node_kind: u8,
    pub auth_method: u8,
    pub auth: Vec<u8>,
}

impl Hello {
    /// This build's handshake for a node of `node_kind`.
    pub fn ours(node_kind: u8) -> Hello {
        Hello {
            min_version: crate::MIN_PROTOCOL_VERSION,
            max_version: crate::PROTOCOL_VERSION,
            node_kind,
            auth_method: AUTH_NONE,
            auth: Vec::new(),
        }
    }

    /// Encodes the handshake; `auth` longer than [`AUTH_MAX`] is refused.
    pub fn encode(&self) -> Result<Vec<u8>, HelloError> {
        if self.auth.len() > AUTH_MAX {
            return Err(HelloError::AuthTooLarge(self.auth.len()));
        }
        let mut v = Vec::with_capacity(HELLO_LEN + self.auth.len());
        v.extend_from_slice(&HELLO_MAGIC);
        v.extend_from_slice(&[
            self.min_version,
            self.max_version,
            self.node_kind,
            self.auth_method,
        ]);
        v.extend_from_slice(&(self.auth.len() as u16).to_le_bytes());
        v.extend_from_slice(&[0, 0]);
        let crc = cairn_crc::crc32c_append(cairn_crc::crc32c(&v), &self.auth);
        v.extend_from_slice(&crc.to_le_bytes());
        v.extend_from_slice(&self.auth);
        Ok(v)
    }

    /// Decodes a handshake from the start of `b`; returns it and the bytes it used.
    pub fn decode(b: &[u8]) -> Result<(Hello, usize), HelloError> {
        if b.len() < HELLO_LEN {
            return Err(HelloError::Truncated(HELLO_LEN - b.len()));
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&b[..4]);
        if magic != HELLO_MAGIC {
            return Err(HelloError::BadMagic(magic));
        }
        let auth_len = u16::from_le_bytes([b[8], b[9]]) as usize;
        if auth_len > AUTH_MAX {
            return Err(HelloError::AuthTooLarge(auth_len));
        }
        let total = HELLO_LEN + auth_len;
        if b.len() < total {
            return Err(HelloError::Truncated(total - b.len()));
        }
        let auth = &b[HELLO_LEN..total];
        let crc = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
        if cairn_crc::crc32c_append(cairn_crc::crc32c(&b[..12]), auth) != crc {
            return Err(HelloError::Checksum);
        }
        let h = Hello {
            min_version: b[4],
            max_version: b[5],
            node_kind: b[6],
            auth_method: b[7],
            auth: auth.to_vec(),
        };
        Ok((h, total))
    }
}

/// The frame layout version two peers use: the newest both read. (Authentication is the
/// connection layer's: `cairn_transport::handshake`.)
pub fn negotiate(ours: &Hello, theirs: &Hello) -> Result<u8, HelloError> {
    let v = ours.max_version.min(theirs.max_version);
    if v < ours.min_version || v < theirs.min_version {
        return Err(HelloError::NoCommonVersion {
            ours: (ours.min_version, ours.max_version),
            theirs: (theirs.min_version, theirs.max_version),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_round_trips_and_negotiates() {
        let mut a = Hello::ours(1);
        a.auth = b"reserved".to_vec();
        let bytes = a.encode().unwrap();
        assert_eq!(Hello::decode(&bytes).unwrap(), (a.clone(), bytes.len()));
        for i in 0..bytes.len() {
            assert!(Hello::decode(&bytes[..i]).is_err());
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(Hello::decode(&bad).is_err(), "byte {i}");
        }
        a.auth.clear();
        // A peer that reads only versions newer than ours.
        let newer = Hello {
            min_version: crate::PROTOCOL_VERSION + 1,
            max_version: crate::PROTOCOL_VERSION + 3,
            ..Hello::ours(2)
        };
        assert_eq!(
            negotiate(&a, &Hello::ours(2)).unwrap(),
            crate::PROTOCOL_VERSION
        );
        let e = negotiate(&a, &newer).unwrap_err();
        assert!(e.to_string().contains("no common protocol version"), "{e}");
    }
}
