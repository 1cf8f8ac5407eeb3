//! The authentication records of the handshake (the protocol: `docs/format/wire.md`,
//! "Authentication"). The initiator's hello carries an [`AuthInit`]; the acceptor's hello
//! answers with an [`AuthChallenge`] (its nonce and its proof) or an [`AuthRefusal`]; the
//! initiator then sends its proof as a fixed [`PROOF_RECORD_LEN`]-byte record.
//!
//! The records are postcard-encoded in the hello's auth data (at most `AUTH_MAX` bytes), so
//! every length is bounded before anything is allocated.

use serde::{Deserialize, Serialize};

/// Authenticate with the entity's own key (to a monitor).
pub const AUTH_KEY: u8 = 1;
/// Authenticate with a ticket from the monitors (to an OSD).
pub const AUTH_TICKET: u8 = 2;
/// The acceptor's refusal: its auth data is an [`AuthRefusal`].
pub const AUTH_REFUSED: u8 = 255;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Magic of the initiator's proof record.
pub const PROOF_MAGIC: [u8; 4] = *b"CRNA";
/// Bytes of the initiator's proof record: magic and a 32-byte proof.
pub const PROOF_RECORD_LEN: usize = 36;
/// Longest refusal message kept.
pub const MAX_REFUSAL: usize = 512;

/// What the initiator says: who it is, which of its keys it proves (`key_id`, from
/// `cairn_auth::key_id`: during a rotation an entity has two), a fresh nonce, and its ticket
/// (method [`AUTH_TICKET`]; empty for [`AUTH_KEY`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthInit {
    pub entity: String,
    pub key_id: [u8; 8],
    /// The frame protection the initiator asks for at least (`cairn_auth::FrameMode`).
    pub frames: u8,
    pub nonce: [u8; NONCE_LEN],
    pub ticket: Vec<u8>,
}

/// The acceptor's answer: a fresh nonce, the frame protection of the connection (the
/// stronger of what the initiator asked and what the acceptor requires; its proof covers
/// it), and its proof that it holds the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthChallenge {
    pub nonce: [u8; NONCE_LEN],
    pub frames: u8,
    pub proof: [u8; 32],
}

/// Why the acceptor refused (for the initiator's error message; the acceptor logs it too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthRefusal {
    pub message: String,
}

impl AuthRefusal {
    /// A refusal, its message cut to [`MAX_REFUSAL`] bytes.
    pub fn new(message: impl Into<String>) -> AuthRefusal {
        let mut message = message.into();
        if message.len() > MAX_REFUSAL {
            let mut end = MAX_REFUSAL;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        AuthRefusal { message }
    }
}

/// Encodes the initiator's proof record.
pub fn encode_proof(proof: &[u8; 32]) -> [u8; PROOF_RECORD_LEN] {
    let mut r = [0u8; PROOF_RECORD_LEN];
    r[..4].copy_from_slice(&PROOF_MAGIC);
    r[4..].copy_from_slice(proof);
    r
}

/// The proof in a proof record, if it is one.
pub fn decode_proof(r: &[u8; PROOF_RECORD_LEN]) -> Option<&[u8]> {
    (r[..4] == PROOF_MAGIC).then(|| &r[4..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{decode, encode};

    #[test]
    fn records_round_trip_and_refuse_trailing_bytes() {
        let i = AuthInit {
            entity: "client.admin".into(),
            key_id: [9; 8],
            frames: 2,
            nonce: [3; 32],
            ticket: vec![1, 2, 3],
        };
        let b = encode(&i);
        assert_eq!(decode::<AuthInit>("auth init", &b).unwrap(), i);
        assert!(decode::<AuthInit>("auth init", &[b.as_slice(), &[0]].concat()).is_err());
        let c = AuthChallenge {
            nonce: [1; 32],
            frames: 1,
            proof: [2; 32],
        };
        assert_eq!(decode::<AuthChallenge>("c", &encode(&c)).unwrap(), c);
        let r = AuthRefusal::new("é".repeat(600));
        assert!(r.message.len() <= MAX_REFUSAL);
        let p = encode_proof(&[9; 32]);
        assert_eq!(decode_proof(&p), Some(&[9u8; 32][..]));
        let mut bad = p;
        bad[0] = b'X';
        assert_eq!(decode_proof(&bad), None);
    }
}
