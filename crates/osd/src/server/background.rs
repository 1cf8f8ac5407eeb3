//! Requests served off the shards, a bounded number at a time (scrubs, recovery pulls):
//! they answer when done.

use super::refuse;
use crate::context::Osd;
use crate::peering::member::check_pg;
use cairn_map::PgId;
use cairn_proto::msg::peering::{PgPull, PG_OBJECT};
use cairn_proto::msg::scrub::{ScrubPg, SCRUB_PG, SCRUB_REPORT};
use cairn_proto::msg::MsgError;
use cairn_transport::FrameSender;
use std::sync::Arc;

/// A request served off the shards.
pub(super) enum Background {
    Scrub(ScrubPg),
    Pull(PgPull),
}

pub(super) fn background_job(msg_type: u16, control: &[u8]) -> Result<Background, MsgError> {
    use cairn_proto::msg::decode;
    match msg_type {
        SCRUB_PG => decode::<ScrubPg>("scrub pg", control).map(Background::Scrub),
        _ => decode::<PgPull>("pg pull", control).map(Background::Pull),
    }
}

/// Reads the bytes a recovery pulls off the shard's thread (up to 4 MiB from the device: the
/// shard's client ops must not wait for that), and answers. The PG version is read before the
/// bytes, so a copy guarded by it is refused if a write landed meanwhile.
pub(super) fn start_pull(
    osd: &Arc<Osd>,
    to: &FrameSender,
    req_id: u64,
    req: PgPull,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let (osd, to) = (osd.clone(), to.clone());
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        if let Err(r) = check_pg(&osd.map(), pg) {
            return refuse(&to, req_id, r.code, &r.why);
        }
        if let Err(r) = crate::peering::member::not_splitting(&osd, pg) {
            return refuse(&to, req_id, r.code, &r.why);
        }
        match crate::peering::copy::pull(&osd.store, pg, &req.object, req.offset, req.len) {
            Ok((obj, bytes)) => {
                let control = cairn_proto::msg::encode(&obj);
                let _ = to.send_held(PG_OBJECT, req_id, &control, bytes);
            }
            Err(r) => refuse(&to, req_id, r.code, &r.why),
        }
    });
}

/// Scrubs a PG in the background and answers with its report when done.
pub(super) fn start_scrub(
    osd: &Arc<Osd>,
    to: &FrameSender,
    req_id: u64,
    req: ScrubPg,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    if let Err(r) = check_pg(&osd.map(), pg) {
        return refuse(to, req_id, r.code, &r.why);
    }
    let (osd, to) = (osd.clone(), to.clone());
    tokio::spawn(async move {
        let _slot = slot;
        let rep = crate::scrub::scrub_pg(osd, pg, req.repair).await;
        let _ = to.send(SCRUB_REPORT, req_id, &cairn_proto::msg::encode(&rep), &[]);
    });
}
