//! The volume lease record decoder (docs/format/volume.md, "Open leases"): arbitrary bytes as
//! is and with the checksum rewritten (so mutations get past it). An accepted record
//! re-encodes to exactly its bytes (a version 1 record to a version 2 one that decodes the same).
#![no_main]

use cairn_volume::lease::{LeaseRecord, MAX_LEASE_LEN};
use libfuzzer_sys::fuzz_target;

fn check(b: &[u8]) {
    if let Ok(r) = LeaseRecord::decode(b) {
        assert!(b.len() <= MAX_LEASE_LEN);
        if b[8] == 1 {
            assert_eq!(LeaseRecord::decode(&r.encode()), Ok(r));
        } else {
            assert_eq!(r.encode(), b);
        }
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
