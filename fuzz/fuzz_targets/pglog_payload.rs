//! The decoder of the PG log entries a peer sends (`PG_INFO`'s data, a `PushKind::Log` push)
//! on arbitrary bytes: what it accepts is bounded, named within limits, ordered, and
//! re-encodes to entries that decode the same.
#![no_main]

use cairn_osd::pglog::{decode_peer_entries, MAX_PEER_ENTRIES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = decode_peer_entries(data) {
        assert!(entries.len() <= MAX_PEER_ENTRIES);
        assert!(entries.windows(2).all(|w| w[0].version < w[1].version));
        let again = decode_peer_entries(&cairn_proto::msg::encode(&entries)).expect("re-decodes");
        assert_eq!(again, entries);
    }
});
