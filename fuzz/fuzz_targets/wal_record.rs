//! A WAL record: `wal::parse_header` on the first 32 bytes, then `decode::effects` on the
//! payload the header claims (cut to the bytes present). Decoded effects must point inside the
//! record and re-encode to exactly the payload (the encoding is canonical).
#![no_main]

use cairn_store::effect::{self, Effect, Payload};
use cairn_store::wal::{self, HEADER_LEN};
use cairn_store::BLOCK_SIZE;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Also decode the bytes as a bare payload, so that effects are explored without a header.
    check_payload(data, 0, data);
    let Some(h) = wal::parse_header(data) else {
        return;
    };
    assert!((wal::KIND_TXN..=wal::KIND_WRAP).contains(&h.kind));
    let end = (HEADER_LEN as u64 + h.len as u64).min(data.len() as u64) as usize;
    let rec = &data[..end];
    check_payload(rec, HEADER_LEN, wal::payload(rec));
});

fn check_payload(rec: &[u8], base: usize, payload: &[u8]) {
    let Ok(effects) = cairn_store::decode::effects(payload, base) else {
        return;
    };
    for e in &effects {
        if let Effect::SetBlocks {
            nblocks,
            data: Payload::InRecord(off),
            ..
        } = e
        {
            assert!(*off >= base);
            assert!(off + *nblocks as usize * BLOCK_SIZE <= rec.len());
        }
    }
    let mut out = Vec::new();
    effect::encode(&effects, rec, &mut out);
    assert_eq!(out, payload, "effects do not re-encode to their payload");
}
