//! Administrative requests to one OSD: its usage (for `cairn status`), scrubbing a PG.

use crate::error::ClientError;
use cairn_proto::msg::osd::{OsdStats, OSD_STATS, OSD_STATS_REPLY};
use cairn_proto::msg::scrub::{ScrubPg, ScrubReport, SCRUB_PG, SCRUB_REPORT};
use cairn_proto::Limits;
use cairn_transport::{node_kind, Auth, Dialer, Session};
use std::time::Duration;

/// The usage of the OSD at `addr`, within `timeout`.
pub async fn osd_stats(
    addr: &str,
    auth: &Auth,
    timeout: Duration,
) -> Result<OsdStats, ClientError> {
    let f = ask(addr, auth, OSD_STATS, &[], OSD_STATS_REPLY, timeout).await?;
    cairn_proto::msg::decode::<OsdStats>("osd stats", &f).map_err(|e| fail(addr, e.to_string()))
}

/// Asks the OSD at `addr` (the PG's primary) to scrub one PG, and waits up to `timeout`
/// for its report.
pub async fn scrub_pg(
    addr: &str,
    auth: &Auth,
    req: &ScrubPg,
    timeout: Duration,
) -> Result<ScrubReport, ClientError> {
    let control = cairn_proto::msg::encode(req);
    let f = ask(addr, auth, SCRUB_PG, &control, SCRUB_REPORT, timeout).await?;
    cairn_proto::msg::decode::<ScrubReport>("scrub report", &f)
        .map_err(|e| fail(addr, e.to_string()))
}

/// Asks the OSD at `addr` (the PG's primary) what `pg` is doing (`cairn pg query`).
pub async fn pg_status(
    addr: &str,
    auth: &Auth,
    pg: cairn_map::PgId,
    epoch: u64,
    timeout: Duration,
) -> Result<cairn_proto::msg::peering::PgStatus, ClientError> {
    use cairn_proto::msg::peering::{PgQuery, PG_STATUS, PG_STATUS_REPLY};
    let q = PgQuery {
        epoch,
        pool: pg.pool,
        pg: pg.pg,
        since: 0,
    };
    let control = cairn_proto::msg::encode(&q);
    let f = ask(addr, auth, PG_STATUS, &control, PG_STATUS_REPLY, timeout).await?;
    cairn_proto::msg::decode("pg status", &f).map_err(|e| fail(addr, e.to_string()))
}

/// Asks the primary of `pg` (at `addr`) to give up the PG's unfound objects: delete them, or
/// revert them to older copies (`cairn pg mark-unfound-lost`). `Ok` once it took the order.
pub async fn pg_mark_unfound_lost(
    addr: &str,
    auth: &Auth,
    pg: cairn_map::PgId,
    epoch: u64,
    delete: bool,
    timeout: Duration,
) -> Result<(), ClientError> {
    use cairn_proto::msg::peering::{PgDone, PgMarkLost, PG_DONE, PG_MARK_LOST};
    let q = PgMarkLost {
        epoch,
        pool: pg.pool,
        pg: pg.pg,
        delete,
    };
    let control = cairn_proto::msg::encode(&q);
    let f = ask(addr, auth, PG_MARK_LOST, &control, PG_DONE, timeout).await?;
    match cairn_proto::msg::decode::<PgDone>("pg done", &f)
        .map_err(|e| fail(addr, e.to_string()))?
    {
        PgDone::Done => Ok(()),
        PgDone::Failed { why, .. } => Err(fail(addr, why)),
        other => Err(fail(addr, format!("unexpected answer {other:?}"))),
    }
}

fn fail(addr: &str, why: String) -> ClientError {
    ClientError::Failed {
        code: cairn_proto::msg::osd::FailCode::Other,
        why: format!("osd at {addr}: {why}"),
    }
}

/// A transport failure (its text names the address).
fn transport(e: impl std::fmt::Display) -> ClientError {
    ClientError::Failed {
        code: cairn_proto::msg::osd::FailCode::Other,
        why: e.to_string(),
    }
}

/// Sends one request on a connection of its own; returns the reply's control part.
async fn ask(
    addr: &str,
    auth: &Auth,
    msg_type: u16,
    control: &[u8],
    want: u16,
    timeout: Duration,
) -> Result<Vec<u8>, ClientError> {
    let started = tokio::time::Instant::now();
    let dialer = Dialer::new(node_kind::CLIENT, auth.clone()).timeout(timeout);
    let session = Session::open(&dialer, addr, node_kind::OSD, Limits::default())
        .await
        .map_err(transport)?;
    let left = timeout.saturating_sub(started.elapsed());
    let f = session
        .call_for(msg_type, want, control, &[], left)
        .await
        .map_err(transport)?;
    Ok(f.control)
}
