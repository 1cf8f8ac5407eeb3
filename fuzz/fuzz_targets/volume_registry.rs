//! The holder registry decoder (docs/format/volume.md, "The holder registry"): arbitrary bytes
//! as is and with the checksum rewritten (so mutations get past it). An accepted registry is
//! at most `MAX_REGISTRY_LEN` bytes and re-encodes to exactly its bytes.
#![no_main]

use cairn_volume::registry::{decode, encode, MAX_REGISTRY_LEN};
use libfuzzer_sys::fuzz_target;

fn check(b: &[u8]) {
    if let Ok(entries) = decode(b) {
        assert!(b.len() <= MAX_REGISTRY_LEN);
        assert_eq!(encode(&entries), b);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 4 {
        let mut sealed = data.to_vec();
        let n = sealed.len() - 4;
        let crc = crc32c::crc32c(&sealed[..n]);
        sealed[n..].copy_from_slice(&crc.to_le_bytes());
        check(&sealed);
    }
});
