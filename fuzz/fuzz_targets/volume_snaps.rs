//! The volume snapshot table decoder (docs/format/volume.md, "Snapshots") and the pool QoS
//! defaults decoder ("QoS"): arbitrary bytes as is and with the checksum rewritten (so
//! mutations get past it). An accepted table re-encodes to exactly its bytes and keeps the
//! invariants reads rely on; accepted limits re-encode to exactly their bytes.
#![no_main]

use cairn_volume::snaps::{SnapTable, MAX_SNAPS_LEN};
use libfuzzer_sys::fuzz_target;

fn check(b: &[u8]) {
    if let Ok(q) = cairn_volume::pool_qos::decode(b) {
        assert_eq!(cairn_volume::pool_qos::encode(&q), b);
    }
    if let Ok(t) = SnapTable::decode(b) {
        assert!(b.len() <= MAX_SNAPS_LEN);
        assert_eq!(t.encode(), b);
        let ids = t.clone_ids();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert!(ids.iter().all(|&i| i > 0 && i <= t.seq));
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
