//! Checkpoint decoders: `decode::checkpoint` on arbitrary bytes (with and without a valid
//! magic and version in front), and `decode::CheckpointRoot::decode` as read and as re-sealed
//! (so that inputs get past the checksum). A decoded root must re-encode to its own bytes.
#![no_main]

use cairn_store::decode::{checkpoint, CheckpointRoot};
use cairn_store::format::seal;
use libfuzzer_sys::fuzz_target;

fn body(b: &[u8]) {
    let mut next_id = 0u64;
    if let Ok(d) = checkpoint(b, &mut next_id) {
        // Every inline extent got its own id.
        assert_eq!(next_id, d.dirty.len() as u64);
    }
}

fn root(b: &[u8]) {
    if let Ok(r) = CheckpointRoot::decode(b) {
        // At most MAX_PIECES (2^20) pieces.
        assert!(r.pieces.len() <= 1 << 20);
        let again = r.encode();
        // The decoder ignores bytes after the pieces (the WAL header gives the root's length),
        // though the crc at offset 0 covers them: compare what follows the crc.
        assert_eq!(&again[4..], &b[4..again.len()]);
        assert_eq!(CheckpointRoot::decode(&again), Ok(r));
    }
}

fuzz_target!(|data: &[u8]| {
    body(data);
    // The same bytes behind a valid magic and version, to get past them.
    let mut framed = b"CAIRNCK1\x01\x00\x00\x00".to_vec();
    framed.extend_from_slice(data);
    body(&framed);

    root(data);
    if data.len() >= 4 {
        let mut sealed = data.to_vec();
        seal(&mut sealed);
        root(&sealed);
    }
});
