//! The handshake decoder and the authentication records it carries, on arbitrary bytes:
//! a decoded handshake encodes back to the same bytes, a decoded record re-decodes equal.
#![no_main]

use cairn_proto::auth::{decode_proof, AuthChallenge, AuthInit, AuthRefusal, PROOF_RECORD_LEN};
use cairn_proto::msg::{decode, encode};
use cairn_proto::Hello;
use libfuzzer_sys::fuzz_target;

fn roundtrip<T>(what: &'static str, b: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = decode::<T>(what, b) {
        let again: T = decode(what, &encode(&v)).expect("re-encoded record decodes");
        assert_eq!(v, again);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok((h, used)) = Hello::decode(data) {
        let mut again = h.encode().expect("a decoded handshake encodes");
        // The reserved bytes are written as zero; compare the rest.
        again[10] = data[10];
        again[11] = data[11];
        assert_eq!(&again[..12], &data[..12]);
        assert_eq!(&again[16..], &data[16..used]);
        // The auth data as each record the handshake reads from it.
        roundtrip::<AuthInit>("init", &h.auth);
        roundtrip::<AuthChallenge>("challenge", &h.auth);
        roundtrip::<AuthRefusal>("refusal", &h.auth);
    }
    if let Ok(rec) = <[u8; PROOF_RECORD_LEN]>::try_from(data) {
        let _ = decode_proof(&rec);
    }
});
