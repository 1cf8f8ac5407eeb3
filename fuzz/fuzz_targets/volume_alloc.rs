//! The allocation-map shard decoder (docs/format/volume.md, "The allocation map"): arbitrary
//! bytes as is and with the checksum rewritten (so mutations get past it). An accepted shard
//! is exactly `SHARD_LEN` bytes, marks only objects of its own range, and re-encodes to
//! exactly its bytes.
#![no_main]

use cairn_volume::allocmap::{decode, encode, SHARD_LEN, SHARD_OBJECTS};
use libfuzzer_sys::fuzz_target;

fn check(b: &[u8], id: u64, shard: u64) {
    if let Ok(members) = decode(b, id, shard) {
        assert_eq!(b.len(), SHARD_LEN);
        assert!(members
            .iter()
            .all(|o| (shard * SHARD_OBJECTS..(shard + 1) * SHARD_OBJECTS).contains(o)));
        assert_eq!(encode(id, shard, &members.into_iter().collect()), b);
    }
}

fuzz_target!(|data: &[u8]| {
    // The volume and shard a reader expects come from the bytes' own header when there is
    // one, so that mutations of the bitmap are decoded, not refused as a stranger's.
    let (id, shard) = match data.get(12..24) {
        Some(h) => (
            u64::from_le_bytes(h[..8].try_into().unwrap_or_default()),
            u64::from(u32::from_le_bytes(h[8..].try_into().unwrap_or_default())),
        ),
        None => (0, 0),
    };
    check(data, id, shard);
    if data.len() >= 4 {
        let mut sealed = data.to_vec();
        let n = sealed.len() - 4;
        let crc = crc32c::crc32c(&sealed[..n]);
        sealed[n..].copy_from_slice(&crc.to_le_bytes());
        check(&sealed, id, shard);
    }
});
