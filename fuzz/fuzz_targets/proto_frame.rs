//! The wire frame readers on arbitrary byte streams: the sans-I/O `Decoder`, fed in two
//! pieces, and `cairn_transport::read_frame` (what every connection runs), which must read the bytes
//! exactly as the decoder does (`check_readers_agree` panics otherwise).
#![no_main]

use cairn_proto::{Decoder, Limits};
use cairn_transport::check_readers_agree;
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_control: 1 << 16,
    max_data: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(LIMITS);
    let cut = data.first().map_or(0, |&b| b as usize).min(data.len());
    d.push(&data[..cut]);
    while let Ok(Some(_)) = d.next_frame() {}
    d.push(&data[cut..]);
    while let Ok(Some(f)) = d.next_frame() {
        assert!(f.control.len() <= 1 << 16 && f.data.len() <= 1 << 20);
    }
    check_readers_agree(data, &LIMITS);
});
