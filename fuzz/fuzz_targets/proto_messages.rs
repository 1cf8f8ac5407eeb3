//! Every control-part message decoder (monitor and OSD protocols) on arbitrary bytes: the
//! first byte picks the message type. A decoded message must re-encode to the same bytes.
#![no_main]

use cairn_proto::msg::{decode, ec, ec_rebuild, encode, mon, osd, peering, scrub};
use libfuzzer_sys::fuzz_target;

fn roundtrip<T>(what: &'static str, b: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = decode::<T>(what, b) {
        let again: T = decode(what, &encode(&v)).expect("re-encoded message decodes");
        assert_eq!(v, again);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, b)) = data.split_first() else {
        return;
    };
    match which % 45 {
        0 => roundtrip::<osd::OpRequest>("op", b),
        1 => roundtrip::<osd::OpReply>("op reply", b),
        2 => roundtrip::<osd::RepOp>("rep", b),
        3 => roundtrip::<osd::RepReply>("rep reply", b),
        4 => roundtrip::<mon::MapUpdate>("map", b),
        5 => roundtrip::<mon::CommandReply>("command reply", b),
        6 => roundtrip::<cairn_map::MapChange>("command", b),
        7 => roundtrip::<mon::Heartbeat>("heartbeat", b),
        8 => roundtrip::<mon::MonStatus>("mon status", b),
        9 => roundtrip::<osd::OsdStats>("osd stats", b),
        10 => {
            if let Ok(batch) = decode::<osd::OpBatch>("op batch", b) {
                // The check must not panic on any decoded batch, whatever the frame's size.
                let _ = batch.check(b.len());
                let again: osd::OpBatch = decode("op batch", &encode(&batch)).expect("re-decodes");
                assert_eq!(batch, again);
            }
        }
        11 => roundtrip::<peering::PgQuery>("pg query", b),
        12 => roundtrip::<peering::PgInfo>("pg info", b),
        13 => roundtrip::<peering::PgPull>("pg pull", b),
        14 => roundtrip::<peering::PgObject>("pg object", b),
        15 => roundtrip::<peering::PgPush>("pg push", b),
        16 => roundtrip::<peering::PgDone>("pg done", b),
        17 => roundtrip::<peering::PgList>("pg list", b),
        18 => roundtrip::<peering::PgNames>("pg names", b),
        19 => roundtrip::<scrub::PgScrub>("pg scrub", b),
        20 => roundtrip::<scrub::PgScrubMap>("pg scrub map", b),
        21 => roundtrip::<scrub::ScrubPg>("scrub pg", b),
        22 => roundtrip::<scrub::ScrubReport>("scrub report", b),
        23 => roundtrip::<mon::FailureReport>("failure report", b),
        24 => roundtrip::<mon::PastIntervalsQuery>("past intervals query", b),
        25 => roundtrip::<mon::PastIntervalsReply>("past intervals", b),
        26 => roundtrip::<peering::PgStatus>("pg status", b),
        27 => roundtrip::<cairn_proto::msg::ErrorReply>("error", b),
        28 => roundtrip::<mon::TicketReply>("ticket", b),
        29 => roundtrip::<mon::ServiceKeysReply>("service keys", b),
        30 => roundtrip::<mon::AuthRequest>("auth command", b),
        31 => roundtrip::<mon::AuthReply>("auth reply", b),
        32 => roundtrip::<mon::MembersRequest>("members command", b),
        33 => roundtrip::<mon::MembersReply>("members reply", b),
        34 => roundtrip::<peering::PgMarkLost>("pg mark lost", b),
        35 => {
            if let Ok(w) = decode::<ec::EcSubWrite>("ec sub-write", b) {
                // The payload check must not panic on any decoded sub-write.
                let _ = w.check(b.len());
                let again: ec::EcSubWrite = decode("ec sub-write", &encode(&w)).expect("re-decodes");
                assert_eq!(w, again);
            }
        }
        36 => {
            if let Ok(r) = decode::<ec::EcRead>("ec read", b) {
                let _ = r.reply_len();
                let again: ec::EcRead = decode("ec read", &encode(&r)).expect("re-decodes");
                assert_eq!(r, again);
            }
        }
        37 => roundtrip::<ec::EcReadReply>("ec read reply", b),
        38 => roundtrip::<ec::EcQuery>("ec query", b),
        39 => roundtrip::<ec::EcInfo>("ec info", b),
        40 => {
            if let Ok(q) = decode::<ec_rebuild::EcStat>("ec stat", b) {
                let _ = q.check();
                roundtrip::<ec_rebuild::EcStat>("ec stat", b);
            }
        }
        41 => roundtrip::<ec_rebuild::EcStatReply>("ec stat reply", b),
        42 => {
            if let Ok(p) = decode::<ec_rebuild::EcPush>("ec push", b) {
                let _ = p.check(b.len());
                roundtrip::<ec_rebuild::EcPush>("ec push", b);
            }
        }
        43 => {
            if let Ok(l) = decode::<ec_rebuild::EcSetLog>("ec set log", b) {
                let _ = l.check();
                roundtrip::<ec_rebuild::EcSetLog>("ec set log", b);
            }
        }
        _ => roundtrip::<mon::GetMap>("get map", b),
    }
});
