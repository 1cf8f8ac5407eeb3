//! Reads of EC shards by the primary: from its own store, or over the ordered link its
//! sub-writes to that member take (so a read sees every sub-write sent before it), the
//! answer routed back by `peers::PendingReads`.

use super::error::ShardReadError;
use crate::context::Osd;
use crate::peers::Link;
use cairn_map::PgId;
use cairn_proto::msg::ec::{EcRead, EcReadReply, EC_READ, EC_READ_REPLY};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a shard read may take before its member counts as unreachable for it.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a read waits for a link that is still opening.
const LINK_WAIT: Duration = Duration::from_secs(1);

/// The ranges `req` asks of shard `req.shard`, held by `target`, back to back.
pub async fn read_shard(
    osd: &Arc<Osd>,
    here: usize,
    target: u32,
    req: EcRead,
) -> Result<(bool, u64, Vec<u8>), ShardReadError> {
    let shard = req.shard;
    let pg = PgId {
        pool: req.pool,
        pg: req.pg,
    };
    let (r, data) = if target == osd.id() {
        super::member::read_ranges(&osd.store, pg, &req)
    } else {
        ask(osd, here, target, &req).await?
    };
    let want = req.reply_len().unwrap_or(0);
    match r {
        EcReadReply::Data { exists, size } if data.len() as u64 == want => Ok((exists, size, data)),
        EcReadReply::Data { .. } => Err(ShardReadError::Refused {
            osd: target,
            shard,
            why: format!("{} bytes answered for {want} asked", data.len()),
        }),
        EcReadReply::Stale { epoch } => Err(ShardReadError::Refused {
            osd: target,
            shard,
            why: format!("its map (epoch {epoch}) does not have this OSD primary"),
        }),
        EcReadReply::Failed { why, .. } => Err(ShardReadError::Refused {
            osd: target,
            shard,
            why,
        }),
    }
}

/// Sends a read on the link to `target` and waits for its answer.
async fn ask(
    osd: &Arc<Osd>,
    here: usize,
    target: u32,
    req: &EcRead,
) -> Result<(EcReadReply, Vec<u8>), ShardReadError> {
    let shard = req.shard;
    let unreachable = ShardReadError::Unreachable { osd: target, shard };
    let started = Instant::now();
    let link = loop {
        let map = osd.map();
        match osd.peers.link(&osd.inflight, here, &map, target) {
            Link::Up(s) => break s,
            Link::Opening if started.elapsed() < LINK_WAIT => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Link::Opening | Link::Down => return Err(unreachable),
        }
    };
    let (id, answer) = osd.peers.reads.register(target);
    let control = cairn_proto::msg::encode(req);
    if link.send(EC_READ, id, &control, &[]).is_err() {
        osd.peers.reads.cancel(id);
        return Err(unreachable);
    }
    let frame = match tokio::time::timeout(READ_TIMEOUT, answer).await {
        Ok(Ok(f)) => f,
        Ok(Err(_)) => return Err(unreachable),
        Err(_) => {
            osd.peers.reads.cancel(id);
            return Err(ShardReadError::TimedOut {
                osd: target,
                shard,
                timeout: READ_TIMEOUT,
            });
        }
    };
    debug_assert_eq!(frame.msg_type, EC_READ_REPLY);
    match cairn_proto::msg::decode::<EcReadReply>("ec read reply", &frame.control) {
        Ok(r) => Ok((r, frame.data)),
        Err(e) => Err(ShardReadError::Refused {
            osd: target,
            shard,
            why: e.to_string(),
        }),
    }
}
