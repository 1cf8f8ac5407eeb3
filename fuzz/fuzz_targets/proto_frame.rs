//! The wire frame decoder on arbitrary byte streams, fed in two pieces.
#![no_main]

use cairn_proto::{Decoder, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(Limits {
        max_control: 1 << 16,
        max_data: 1 << 20,
    });
    let cut = data.first().map_or(0, |&b| b as usize).min(data.len());
    d.push(&data[..cut]);
    while let Ok(Some(_)) = d.next_frame() {}
    d.push(&data[cut..]);
    while let Ok(Some(f)) = d.next_frame() {
        assert!(f.control.len() <= 1 << 16 && f.data.len() <= 1 << 20);
    }
});
