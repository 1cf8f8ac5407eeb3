//! The volume header decoder (docs/format/volume.md): arbitrary bytes as is and with the
//! checksum rewritten (so mutations get past it). An accepted header re-encodes to exactly
//! its bytes.
#![no_main]

use cairn_volume::header::{Header, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fn check(b: &[u8]) {
    if let Ok(h) = Header::decode(b) {
        assert_eq!(h.encode(), b);
        assert!(h.object_count() > 0);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() == HEADER_LEN {
        let mut sealed = data.to_vec();
        let crc = crc32c::crc32c(&sealed[..HEADER_LEN - 4]);
        sealed[HEADER_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        check(&sealed);
    }
});
