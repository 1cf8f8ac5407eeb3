//! NBD transmission requests: `parse_request` on arbitrary 28-byte headers (as given and with
//! the magic forced valid), `check_request` against a session chosen by the first byte, the
//! block status descriptor builder on arbitrary extents, and the reply encoders.
#![no_main]

use cairn_nbd::command::{block_descriptors, check_request, Op, Rejection, Session, MAX_PAYLOAD};
use cairn_nbd::proto::*;
use cairn_nbd::Extent;
use libfuzzer_sys::fuzz_target;

fn session(b: u8) -> Session {
    Session {
        export: "disk".into(),
        // Small, odd, page-sized and huge exports.
        size: [0, 1, 4096, 1 << 20, u64::MAX >> 1, u64::MAX][usize::from(b >> 2) % 6],
        flags: FLAG_HAS_FLAGS,
        structured: b & 1 != 0,
        contexts: if b & 2 != 0 {
            vec![cairn_nbd::MetaContext {
                id: 1,
                name: BASE_ALLOCATION.into(),
            }]
        } else {
            Vec::new()
        },
    }
}

fn check(req: &Request, s: &Session) {
    match check_request(req, s) {
        Ok(Op::Read { offset, len } | Op::Write { offset, len, .. }) => {
            assert!(len <= MAX_PAYLOAD);
            assert!(offset
                .checked_add(u64::from(len))
                .is_some_and(|e| e <= s.size));
        }
        Ok(
            Op::Trim { offset, len, .. }
            | Op::Cache { offset, len }
            | Op::WriteZeroes { offset, len, .. },
        ) => {
            assert!(offset
                .checked_add(u64::from(len))
                .is_some_and(|e| e <= s.size));
        }
        Ok(Op::BlockStatus { len, .. }) => {
            assert!(len > 0 && s.structured && !s.contexts.is_empty())
        }
        Ok(Op::Disconnect | Op::Flush) => {}
        Err(Rejection::Fail { discard, .. }) => {
            assert!(discard == 0 || (req.kind == CMD_WRITE && discard <= MAX_PAYLOAD))
        }
        Err(Rejection::Close { .. }) => assert!(req.kind == CMD_WRITE && req.len > MAX_PAYLOAD),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let s = session(sel);
    let mut head = [0u8; REQUEST_LEN];
    let n = rest.len().min(REQUEST_LEN);
    head[..n].copy_from_slice(&rest[..n]);
    if let Ok(req) = parse_request(&head) {
        assert_eq!(encode_request(&req), head);
        check(&req, &s);
    }
    head[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    if let Ok(req) = parse_request(&head) {
        check(&req, &s);
    }

    // The bytes after the header: extents (5 bytes each) and a message for the encoders.
    let tail = rest.get(REQUEST_LEN..).unwrap_or(&[]);
    let extents: Vec<Extent> = tail
        .chunks_exact(5)
        .map(|c| Extent {
            len: u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
            hole: c[4] & 1 != 0,
            zero: c[4] & 2 != 0,
        })
        .collect();
    let len = u32::from_be_bytes([head[24], head[25], head[26], head[27]]).max(1);
    let req_one = head[4] & 1 != 0;
    let d = block_descriptors(&extents, len, req_one);
    assert!(!d.is_empty() && (!req_one || d.len() == 1));
    assert!(d.iter().all(|&(n, _)| n > 0));
    assert!(d.iter().map(|&(n, _)| u64::from(n)).sum::<u64>() <= u64::from(len));
    let chunk = block_status_chunk(1, 1, &d, true);
    assert_eq!(chunk.len(), 24 + 8 * d.len());

    let message = String::from_utf8_lossy(tail);
    let e = error_chunk(2, 22, &message);
    let msg_len = usize::from(u16::from_be_bytes([e[24], e[25]]));
    assert!(msg_len <= MAX_MESSAGE_LEN && e.len() == 26 + msg_len);
    assert!(std::str::from_utf8(&e[26..]).is_ok());
});
