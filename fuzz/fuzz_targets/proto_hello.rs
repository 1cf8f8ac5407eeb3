//! The handshake decoder on arbitrary bytes; what decodes must encode back to the same bytes.
#![no_main]

use cairn_proto::Hello;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, used)) = Hello::decode(data) {
        let mut again = h.encode().expect("a decoded handshake encodes");
        // The reserved bytes are written as zero; compare the rest.
        again[10] = data[10];
        again[11] = data[11];
        assert_eq!(&again[..12], &data[..12]);
        assert_eq!(&again[16..], &data[16..used]);
    }
});
