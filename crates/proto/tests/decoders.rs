//! Random and mutated input to every decoder: errors, never panics, never a frame that was not
//! sent.

use cairn_proto::{Decoder, Frame, Hello, Limits};
use proptest::prelude::*;

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let mut d = Decoder::new(Limits { max_control: 1024, max_data: 4096 });
        d.push(&bytes);
        while let Ok(Some(_)) = d.next_frame() {}
        let _ = Hello::decode(&bytes);
    }

    #[test]
    fn mutated_frames_are_rejected_or_intact(
        control in proptest::collection::vec(any::<u8>(), 0..64),
        data in proptest::collection::vec(any::<u8>(), 0..512),
        at in any::<usize>(),
        xor in 1u8..,
    ) {
        let f = Frame { msg_type: 3, request_id: 42, control, data };
        let mut bytes = Vec::new();
        f.encode_into(&mut bytes);
        let i = at % bytes.len();
        bytes[i] ^= xor;
        let mut d = Decoder::new(Limits::default());
        d.push(&bytes);
        // A single corrupted byte anywhere is always detected.
        prop_assert!(d.next_frame().is_err());
    }
}
