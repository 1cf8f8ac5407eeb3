//! Background recovery: after peering, a PG serves while its primary copies to each member
//! the objects the member lacks (marked missing there). Each copy is guarded: a member refuses
//! it if a client wrote the object after the primary read it, and the object is read again
//! later. The last push of an object drops its mark. Paced like all recovery.

use super::dirty::Dirty;
use super::rpc::Rpc;
use super::transfer::{Ctx, End};
use super::Interval;
use crate::daemon::Osd;
use crate::shard::ShardMsg;
use cairn_map::PgId;
use cairn_proto::msg::peering::PgDone;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// What one member still lacks.
pub struct Work {
    pub member: u32,
    pub objects: Vec<(Vec<u8>, Dirty)>,
}

/// Pause after a member could not be reached or refused a copy for another reason.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Pause before an object a client keeps writing is copied again.
const BUSY_PAUSE: Duration = Duration::from_millis(20);

/// Copies every member's missing objects, then tells the PG's shard it is clean. Runs until
/// done or aborted (the acting set changed: the next peering takes over from the marks).
pub async fn run(osd: Arc<Osd>, pg: PgId, epoch: u64, interval: Interval, work: Vec<Work>) {
    let ctx = Ctx {
        osd: osd.clone(),
        pg,
        epoch,
    };
    let total = work.iter().map(|w| w.objects.len() as u64).sum();
    let rec = &osd.recovery;
    let mut pending = rec.plan(total);
    for w in work {
        let mut queue: VecDeque<(Vec<u8>, Dirty)> = w.objects.into();
        let mut link: Option<Rpc> = None;
        while let Some((object, dirty)) = queue.pop_front() {
            let rpc = match link.as_mut() {
                Some(r) => r,
                None => match Rpc::connect_osd(&osd.map(), w.member, osd.source).await {
                    Ok(r) => link.insert(r),
                    Err(e) => {
                        tracing::warn!(pg = %pg, member = w.member, error = %e, "background recovery: member unreachable; retrying");
                        queue.push_front((object, dirty));
                        tokio::time::sleep(RETRY_AFTER).await;
                        continue;
                    }
                },
            };
            let step = rec.step();
            let r = ctx
                .copy_object(
                    &mut End::Local,
                    &mut End::Remote(rpc),
                    &object,
                    &dirty,
                    true,
                )
                .await;
            match r {
                Ok(PgDone::Done) => pending.done_one(),
                Ok(PgDone::Busy) => {
                    queue.push_back((object, dirty));
                    tokio::time::sleep(BUSY_PAUSE).await;
                }
                Ok(PgDone::Stale { epoch }) => {
                    tracing::info!(pg = %pg, member = w.member, epoch, "background recovery: a newer map has another primary; stopping");
                    return;
                }
                Ok(PgDone::Failed(e)) | Err(e) => {
                    tracing::warn!(pg = %pg, member = w.member, error = %e, "background recovery: copy failed; retrying");
                    link = None;
                    queue.push_front((object, dirty));
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
            rec.pace(step).await;
        }
    }
    drop(pending);
    tracing::info!(pg = %pg, "background recovery done: every member is current");
    osd.queue(pg, ShardMsg::RecoveryDone { pg, interval });
}
