//! `WalHeader::decode` on arbitrary bytes, as read and as re-sealed (so that inputs get past
//! the checksum). A decoded header must re-encode to a slot that decodes the same.
#![no_main]

use cairn_store::format::{seal, WalHeader};
use libfuzzer_sys::fuzz_target;

fn check(b: &[u8]) {
    if let Some(h) = WalHeader::decode(b) {
        let again = h.encode();
        assert_eq!(again.len(), 4096);
        assert_eq!(WalHeader::decode(&again), Some(h));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 4 {
        let mut sealed = data.to_vec();
        let end = sealed.len().min(4096);
        seal(&mut sealed[..end]);
        check(&sealed);
    }
});
