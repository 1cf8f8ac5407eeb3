//! Administrative requests to one OSD: its usage (for `cairn status`), scrubbing a PG.

use crate::error::ClientError;
use cairn_proto::msg::call::{Call, Empty};
use cairn_proto::msg::osd::{OsdStats, STATS_CALL};
use cairn_proto::msg::scrub::{ScrubPg, ScrubReport, SCRUB_PG_CALL};
use cairn_proto::Limits;
use cairn_transport::{node_kind, Auth, Dialer, Session};
use std::time::Duration;

/// The usage of the OSD at `addr`, within `timeout`.
pub async fn osd_stats(
    addr: &str,
    auth: &Auth,
    timeout: Duration,
) -> Result<OsdStats, ClientError> {
    ask(addr, auth, STATS_CALL, &Empty, timeout).await
}

/// Asks the OSD at `addr` (the PG's primary) to scrub one PG, and waits up to `timeout`
/// for its report.
pub async fn scrub_pg(
    addr: &str,
    auth: &Auth,
    req: &ScrubPg,
    timeout: Duration,
) -> Result<ScrubReport, ClientError> {
    ask(addr, auth, SCRUB_PG_CALL, req, timeout).await
}

/// Asks the OSD at `addr` (the PG's primary) what `pg` is doing (`cairn pg query`).
pub async fn pg_status(
    addr: &str,
    auth: &Auth,
    pg: cairn_map::PgId,
    epoch: u64,
    timeout: Duration,
) -> Result<cairn_proto::msg::peering::PgStatus, ClientError> {
    use cairn_proto::msg::peering::{PgQuery, STATUS_CALL};
    let q = PgQuery {
        epoch,
        pool: pg.pool,
        pg: pg.pg,
        since: 0,
    };
    ask(addr, auth, STATUS_CALL, &q, timeout).await
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
    use cairn_proto::msg::peering::{PgDone, PgMarkLost, MARK_LOST_CALL};
    let q = PgMarkLost {
        epoch,
        pool: pg.pool,
        pg: pg.pg,
        delete,
    };
    match ask(addr, auth, MARK_LOST_CALL, &q, timeout).await? {
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

/// Sends one request on a connection of its own; returns its reply.
async fn ask<Req: serde::Serialize, Rep: serde::de::DeserializeOwned>(
    addr: &str,
    auth: &Auth,
    call: Call<Req, Rep>,
    req: &Req,
    timeout: Duration,
) -> Result<Rep, ClientError> {
    let started = tokio::time::Instant::now();
    let dialer = Dialer::new(node_kind::CLIENT, auth.clone()).timeout(timeout);
    let session = Session::open(&dialer, addr, node_kind::OSD, Limits::default())
        .await
        .map_err(transport)?;
    let left = timeout.saturating_sub(started.elapsed());
    let (reply, _) = session.ask(call, req, &[], left).await.map_err(transport)?;
    Ok(reply)
}
