//! Message decoders on arbitrary bytes: never a panic, and whatever decodes re-encodes to an
//! equal message; real messages round-trip.

use cairn_proto::msg::{decode, encode, mon, osd, peering};
use proptest::prelude::*;

fn roundtrip<T>(what: &'static str, b: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = decode::<T>(what, b) {
        let again: T = decode(what, &encode(&v)).expect("re-encoded message decodes");
        assert_eq!(v, again);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
        roundtrip::<osd::OpRequest>("op", &b);
        roundtrip::<osd::OpReply>("op reply", &b);
        roundtrip::<osd::RepOp>("rep", &b);
        roundtrip::<osd::RepReply>("rep reply", &b);
        roundtrip::<mon::MapUpdate>("map", &b);
        roundtrip::<mon::CommandReply>("command reply", &b);
        roundtrip::<cairn_map::MapChange>("command", &b);
        roundtrip::<mon::MonStatus>("mon status", &b);
        roundtrip::<osd::OsdStats>("osd stats", &b);
        roundtrip::<osd::OpBatch>("op batch", &b);
        roundtrip::<peering::PgQuery>("pg query", &b);
        roundtrip::<peering::PgInfo>("pg info", &b);
        roundtrip::<peering::PgPull>("pg pull", &b);
        roundtrip::<peering::PgObject>("pg object", &b);
        roundtrip::<peering::PgPush>("pg push", &b);
        roundtrip::<peering::PgDone>("pg done", &b);
        roundtrip::<peering::PgList>("pg list", &b);
        roundtrip::<peering::PgNames>("pg names", &b);
        roundtrip::<mon::Heartbeat>("heartbeat", &b);
        roundtrip::<mon::PastIntervalsQuery>("past intervals query", &b);
        roundtrip::<mon::PastIntervalsReply>("past intervals", &b);
        roundtrip::<peering::PgStatus>("pg status", &b);
        roundtrip::<cairn_proto::msg::ErrorReply>("error", &b);
    }
}

#[test]
fn an_op_round_trips_and_trailing_bytes_are_refused() {
    let op = osd::OpRequest {
        epoch: 7,
        pool: 1,
        pg: 3,
        object: b"vol.0001".to_vec(),
        kind: osd::OpKind::Write { offset: 8192 },
        instance: 1,
    };
    let mut b = encode(&op);
    assert_eq!(decode::<osd::OpRequest>("op", &b), Ok(op));
    b.push(0);
    let e = decode::<osd::OpRequest>("op", &b).unwrap_err();
    assert!(e.to_string().contains("trailing"), "{e}");
}

#[test]
fn a_huge_length_prefix_does_not_allocate_it() {
    // A name claiming 2^35 bytes in a 12-byte message must fail fast, not allocate.
    let mut b = vec![7, 1, 3];
    b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x7f]);
    assert!(decode::<osd::OpRequest>("op", &b).is_err());
}

#[test]
fn an_op_batch_must_account_for_its_data() {
    let op = |id, len| osd::BatchedOp {
        request_id: id,
        data_len: len,
        req: osd::OpRequest {
            epoch: 1,
            pool: 1,
            pg: 0,
            object: b"o".to_vec(),
            kind: osd::OpKind::Write { offset: 0 },
            instance: 1,
        },
    };
    let b = osd::OpBatch {
        ops: vec![op(1, 4096), op(2, 100)],
    };
    let again: osd::OpBatch = decode("op batch", &encode(&b)).expect("decodes");
    assert_eq!(again, b);
    assert!(b.check(4196).is_ok());
    let e = b.check(4195).unwrap_err();
    assert_eq!(
        e,
        osd::BatchError::DataLength {
            sum: 4196,
            frame: 4195
        }
    );
    assert!(e.to_string().contains("add up"), "{e}");
    assert!(osd::OpBatch { ops: vec![] }.check(0).is_err());
    let big = osd::OpBatch {
        ops: (0..osd::MAX_BATCH_OPS as u64 + 1)
            .map(|i| op(i, 0))
            .collect(),
    };
    assert!(big.check(0).unwrap_err().to_string().contains("ops"));
    // Reads: up to 1 MiB in all; 64 reads of 16 MiB (a GiB to read and queue) are refused.
    let read = |id, len| osd::BatchedOp {
        req: osd::OpRequest {
            kind: osd::OpKind::Read { offset: 0, len },
            ..op(id, 0).req
        },
        ..op(id, 0)
    };
    let ok = osd::OpBatch {
        ops: (0..8).map(|i| read(i, 16 << 10)).collect(),
    };
    assert!(ok.check(0).is_ok());
    let greedy = osd::OpBatch {
        ops: (0..64).map(|i| read(i, 16 << 20)).collect(),
    };
    let e = greedy.check(0).unwrap_err();
    assert!(matches!(e, osd::BatchError::ReadsOver { .. }), "{e:?}");
    assert!(e.to_string().contains("over the limit"), "{e}");
    let overflow = osd::OpBatch {
        ops: vec![read(1, u64::MAX), read(2, u64::MAX)],
    };
    assert!(overflow.check(0).is_err());
}
