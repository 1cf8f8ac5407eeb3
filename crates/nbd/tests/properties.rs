//! Property tests of the pure protocol code: nothing derived from input panics, and what is
//! accepted respects the limits (the fuzz targets in fuzz/ explore the same functions longer).

use cairn_nbd::command::{block_descriptors, check_request, Op, Rejection, Session, MAX_PAYLOAD};
use cairn_nbd::handshake::{Admit, ExportInfo, Lookup, Negotiation, Outcome};
use cairn_nbd::proto::*;
use cairn_nbd::Extent;
use proptest::prelude::*;

fn session() -> impl Strategy<Value = Session> {
    (any::<u64>(), any::<bool>(), any::<bool>()).prop_map(|(size, structured, meta)| Session {
        export: "d".into(),
        size: size >> (size % 64),
        flags: FLAG_HAS_FLAGS,
        structured,
        contexts: if meta {
            vec![cairn_nbd::MetaContext {
                id: 1,
                name: BASE_ALLOCATION.into(),
            }]
        } else {
            Vec::new()
        },
    })
}

proptest! {
    #[test]
    fn parse_request_never_panics(bytes in any::<[u8; REQUEST_LEN]>()) {
        match parse_request(&bytes) {
            Ok(r) => prop_assert_eq!(encode_request(&r), bytes),
            Err(_) => prop_assert_ne!(&bytes[0..4], &REQUEST_MAGIC.to_be_bytes()),
        }
    }

    #[test]
    fn accepted_requests_are_in_range(
        flags in any::<u16>(), kind in 0u16..12, offset in any::<u64>(), len in any::<u32>(),
        s in session(),
    ) {
        let req = Request { flags, kind, cookie: 0, offset, len };
        match check_request(&req, &s) {
            Ok(Op::Disconnect | Op::Flush) => {}
            Ok(Op::Read { offset, len } | Op::Write { offset, len, .. }) => {
                prop_assert!(len <= MAX_PAYLOAD);
                prop_assert!(offset + u64::from(len) <= s.size);
            }
            Ok(Op::Trim { offset, len, .. } | Op::Cache { offset, len }
                | Op::WriteZeroes { offset, len, .. }) => {
                prop_assert!(offset + u64::from(len) <= s.size);
            }
            Ok(Op::BlockStatus { offset, len, .. }) => {
                prop_assert!(s.structured && !s.contexts.is_empty() && len > 0);
                prop_assert!(offset + u64::from(len) <= s.size);
            }
            // Only a write's payload is ever skipped, and only up to the maximum.
            Err(Rejection::Fail { discard, .. }) => {
                prop_assert!(discard == 0 || (kind == CMD_WRITE && discard == len && len <= MAX_PAYLOAD));
            }
            Err(Rejection::Close { .. }) => prop_assert!(kind == CMD_WRITE && len > MAX_PAYLOAD),
        }
    }

    #[test]
    fn descriptors_stay_within_the_request(
        extents in prop::collection::vec((any::<u32>(), any::<bool>(), any::<bool>()), 0..50),
        len in 1u32.., req_one in any::<bool>(),
    ) {
        let extents: Vec<Extent> = extents.into_iter().map(|(len, hole, zero)| Extent { len, hole, zero }).collect();
        let d = block_descriptors(&extents, len, req_one);
        prop_assert!(!d.is_empty());
        prop_assert!(d.iter().all(|&(n, _)| n > 0));
        prop_assert!(d.iter().map(|&(n, _)| u64::from(n)).sum::<u64>() <= u64::from(len));
        prop_assert!(!req_one || d.len() == 1);
        prop_assert!(d.windows(2).all(|w| w[0].1 != w[1].1));
    }

    #[test]
    fn negotiation_never_panics(
        flags in 0u32..4,
        options in prop::collection::vec((0u32..14, prop::collection::vec(any::<u8>(), 0..64), any::<u8>()), 0..20),
    ) {
        let mut n = Negotiation::new(flags).expect("valid flags");
        for (opt, data, answer) in options {
            if n.admit(opt, data.len() as u32) != Admit::Read {
                break;
            }
            let mut step = n.on_option(opt, &data);
            loop {
                step = match step.outcome {
                    Outcome::NeedList => n.on_list(Ok(vec![("d".into(), "disk".into())])),
                    Outcome::NeedExport { name, .. } => n.on_export(match answer % 4 {
                        0 => Lookup::Missing,
                        1 => Lookup::Failed("boom".into()),
                        2 => Lookup::Denied("no".into()),
                        _ => Lookup::Found(ExportInfo {
                            size: 4096,
                            multi_conn: name.is_empty(),
                            description: None,
                            read_only: answer & 4 != 0,
                        }),
                    }),
                    _ => break,
                };
            }
            match step.outcome {
                Outcome::Continue => {}
                Outcome::Go(s) => { prop_assert_eq!(s.size, 4096); break; }
                _ => break,
            }
        }
    }
}
