//! Frames of a protected connection (signed or secure, picked by the first byte) through the
//! reader every protected connection runs (`cairn_transport::read_guarded`): arbitrary bytes,
//! and a valid sealed frame with the input's bytes XORed in. Nothing panics; a frame is
//! accepted only when it is the one sealed, unchanged.
#![no_main]

use cairn_auth::{frame_guards, FrameMode, Secret};
use cairn_proto::Limits;
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_control: 1 << 12,
    max_data: 1 << 16,
};

fn read(bytes: &[u8], opener: &mut cairn_auth::Opener) -> Option<cairn_proto::Frame> {
    let mut r = bytes;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut read = std::pin::pin!(cairn_transport::read_guarded(&mut r, &LIMITS, Some(opener)));
    // A byte slice never makes a read wait, so one poll completes it.
    match read.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(f)) => Some(f),
        _ => None,
    }
}

use std::future::Future;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let mode = if which & 1 == 0 {
        FrameMode::Signed
    } else {
        FrameMode::Secure
    };
    let session = Secret([7; 32]);
    let (_, mut opener) = frame_guards(&session, mode, false)
        .ok()
        .flatten()
        .expect("guards");
    let _ = read(rest, &mut opener);
    // A genuine frame with the input XORed over it: accepted only if nothing changed.
    let (mut sealer, _) = frame_guards(&session, mode, true)
        .ok()
        .flatten()
        .expect("guards");
    let mut frame = Vec::new();
    cairn_transport::encode_parts(&mut frame, 40, 1, b"control part", &[0x5a; 200]);
    cairn_transport::seal_encoded(&mut frame, &mut sealer).expect("seal");
    let genuine = frame.clone();
    for (b, x) in frame.iter_mut().zip(rest) {
        *b ^= x;
    }
    let (_, mut opener) = frame_guards(&session, mode, false)
        .ok()
        .flatten()
        .expect("guards");
    if let Some(f) = read(&frame, &mut opener) {
        assert_eq!(frame, genuine, "a changed frame was accepted");
        assert_eq!(
            (f.control.as_slice(), f.data.len()),
            (b"control part".as_slice(), 200)
        );
    }
});
