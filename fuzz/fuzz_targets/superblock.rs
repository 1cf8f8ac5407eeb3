//! `Superblock::decode` on arbitrary bytes, as read and as re-sealed (so that inputs get past
//! the checksum). A decoded superblock must re-encode to a block that decodes the same.
#![no_main]

use cairn_store::format::{seal, Superblock};
use libfuzzer_sys::fuzz_target;

fn check(b: &[u8]) {
    if let Ok(sb) = Superblock::decode(b) {
        let again = sb.encode();
        assert_eq!(again.len(), 4096);
        assert_eq!(Superblock::decode(&again).as_ref(), Ok(&sb));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 4 {
        let mut sealed = data.to_vec();
        // The crc covers bytes 4..4096 of the block.
        let end = sealed.len().min(4096);
        seal(&mut sealed[..end]);
        check(&sealed);
    }
});
