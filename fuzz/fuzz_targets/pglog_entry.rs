//! The PG log entry decoder (docs/format/pglog.md) on arbitrary bytes, under its own key and
//! under the key of the version it claims. An accepted entry re-encodes to bytes that decode
//! to the same entry (postcard also accepts over-long varints, so not always the same bytes).
#![no_main]

use cairn_osd::pglog::{decode, encode, key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&v, value)) = data.split_first() else {
        return;
    };
    for k in [key(u64::from(v)), key(u64::from_le_bytes([v; 8]))] {
        if let Ok(e) = decode(&k, value) {
            assert_eq!(decode(&k, &encode(&e)).expect("re-encoded entry decodes"), e);
            assert_eq!(key(e.version), k);
        }
    }
});
