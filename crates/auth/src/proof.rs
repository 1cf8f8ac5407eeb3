//! The handshake's proofs: each side shows it holds the shared key `K` (an entity's secret,
//! or a ticket's session secret) by a MAC over what was said on this connection, so a proof
//! is good for one connection only; the session key is derived from `K` and both nonces.
//!
//! `acceptor proof = HMAC-SHA256(K, "cairn acceptor v1" | len | init | len | reply_head)`,
//! `initiator proof = HMAC-SHA256(K, "cairn initiator v1" | len | init | len | reply)`,
//! `session key = HKDF-SHA256(ikm K, salt nonce_i | nonce_a, info "cairn session v1")`.
//! The labels differ, so a proof cannot be reflected back as the other side's.

use crate::Secret;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a proof.
pub const PROOF_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &Secret, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // A 32-byte key is always accepted by HMAC.
    let mut m = <HmacSha256 as Mac>::new_from_slice(&key.0).unwrap_or_else(|_| unreachable!());
    m.update(label);
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m
}

const ACCEPTOR: &[u8] = b"cairn acceptor v1";
const INITIATOR: &[u8] = b"cairn initiator v1";

/// The acceptor's proof over the initiator's hello (`init`, all its bytes) and the reply it
/// sends (`reply_head`: the reply's bytes that precede the proof, its fresh nonce among them).
pub fn acceptor_proof(key: &Secret, init: &[u8], reply_head: &[u8]) -> [u8; PROOF_LEN] {
    mac(key, ACCEPTOR, &[init, reply_head])
        .finalize()
        .into_bytes()
        .into()
}

/// The initiator's proof over both hellos (`reply`: all the acceptor's bytes).
pub fn initiator_proof(key: &Secret, init: &[u8], reply: &[u8]) -> [u8; PROOF_LEN] {
    mac(key, INITIATOR, &[init, reply])
        .finalize()
        .into_bytes()
        .into()
}

/// Checks an acceptor proof, in constant time.
pub fn check_acceptor_proof(key: &Secret, init: &[u8], reply_head: &[u8], proof: &[u8]) -> bool {
    mac(key, ACCEPTOR, &[init, reply_head])
        .verify_slice(proof)
        .is_ok()
}

/// Checks an initiator proof, in constant time.
pub fn check_initiator_proof(key: &Secret, init: &[u8], reply: &[u8], proof: &[u8]) -> bool {
    mac(key, INITIATOR, &[init, reply])
        .verify_slice(proof)
        .is_ok()
}

/// The connection's session key.
pub fn session_key(key: &Secret, nonce_i: &[u8], nonce_a: &[u8]) -> Secret {
    let salt = [nonce_i, nonce_a].concat();
    let hk = hkdf::Hkdf::<Sha256>::new(Some(&salt), &key.0);
    let mut out = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's output limit.
    hk.expand(b"cairn session v1", &mut out)
        .unwrap_or_else(|_| unreachable!());
    Secret(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_the_key_the_transcript_and_the_side() {
        let k = Secret::generate();
        let other = Secret::generate();
        let (init, head, reply) = (b"init".as_slice(), b"head".as_slice(), b"reply".as_slice());
        let a = acceptor_proof(&k, init, head);
        assert!(check_acceptor_proof(&k, init, head, &a));
        assert!(!check_acceptor_proof(&other, init, head, &a));
        assert!(!check_acceptor_proof(&k, b"init2", head, &a));
        assert!(!check_acceptor_proof(&k, init, head, &a[..31]));
        let i = initiator_proof(&k, init, reply);
        assert!(check_initiator_proof(&k, init, reply, &i));
        assert!(!check_initiator_proof(&k, init, b"reply2", &i));
        // Reflection: an acceptor proof is no initiator proof over the same bytes.
        assert!(!check_initiator_proof(&k, init, head, &a));
        // Length-prefixed parts: moving a byte across the boundary changes the proof.
        assert_ne!(
            acceptor_proof(&k, b"ab", b"c"),
            acceptor_proof(&k, b"a", b"bc")
        );
        let s = session_key(&k, &[1; 32], &[2; 32]);
        assert_ne!(s, session_key(&k, &[1; 32], &[3; 32]));
        assert_eq!(s, session_key(&k, &[1; 32], &[2; 32]));
    }
}
