//! Background recovery: after peering, a PG serves while its primary copies what is not
//! current yet. First its own copy: the objects it lacks are pulled from an acting member
//! that holds them (a client op that needs such an object's bytes waits for it, and it is
//! pulled next). Then each member's: the objects it lacks (marked missing there) are pushed
//! from the primary. Every copy is guarded: refused if a client wrote the object after its
//! source was read, and the object is read again later. The last push of an object drops its
//! mark. Paced like all recovery, except pulls client ops wait for.

use super::dirty::Dirty;
use super::outcome::{Backlog, Own, Work};
use super::rpc::Rpc;
use super::transfer::{Ctx, End};
use super::Interval;
use crate::context::Osd;
use crate::failure::{FailClass, Failure};
use crate::mailbox::ShardMsg;
use crate::recovery::Pending;
use cairn_map::PgId;
use cairn_proto::msg::peering::PgDone;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Pause after a member could not be reached or refused a copy for another reason.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Pause before an object a client keeps writing is copied again.
const BUSY_PAUSE: Duration = Duration::from_millis(20);

/// Copies what `backlog` lists, the primary's own copy first; `urgent` names objects client
/// ops wait for. Then tells the PG's shard it is clean. Runs until done or aborted (the acting
/// set changed: the next peering takes over from the marks).
pub async fn run(
    osd: Arc<Osd>,
    pg: PgId,
    epoch: u64,
    interval: Interval,
    backlog: Backlog,
    mut urgent: UnboundedReceiver<Vec<u8>>,
) {
    let ctx = Ctx {
        osd: osd.clone(),
        pg,
        epoch,
    };
    let mut pending = osd.recovery.plan(backlog.len());
    if let Some(own) = backlog.own {
        pull_own(&ctx, &interval, own, &mut urgent, &mut pending).await;
        tracing::info!(pg = %pg, "this OSD's copy is current");
    }
    for w in backlog.members {
        if !push_member(&ctx, w, &mut pending).await {
            return;
        }
    }
    drop(pending);
    tracing::info!(pg = %pg, "background recovery done: every member is current");
    osd.queue(pg, ShardMsg::RecoveryDone { pg, interval });
}

/// Pulls the objects this OSD lacks from `own.from`, those client ops wait for first; tells
/// the shard of each, so the ops waiting for it run.
async fn pull_own(
    ctx: &Ctx,
    interval: &Interval,
    own: Own,
    urgent: &mut UnboundedReceiver<Vec<u8>>,
    pending: &mut Pending<'_>,
) {
    let (osd, pg) = (&ctx.osd, ctx.pg);
    let mut queue: VecDeque<Vec<u8>> = own.objects.iter().map(|(o, _)| o.clone()).collect();
    let mut left: HashMap<Vec<u8>, Dirty> = own.objects.into_iter().collect();
    let mut hot: VecDeque<Vec<u8>> = VecDeque::new();
    let mut link: Option<Rpc> = None;
    while !left.is_empty() {
        while let Ok(o) = urgent.try_recv() {
            hot.push_back(o);
        }
        let (object, waited_for) = match hot.pop_front() {
            Some(o) => (o, true),
            None => match queue.pop_front() {
                Some(o) => (o, false),
                None => break,
            },
        };
        let Some(dirty) = left.get(&object) else {
            continue;
        };
        let Some(rpc) = connected(&mut link, osd, pg, own.from).await else {
            queue.push_front(object);
            continue;
        };
        // A copy a client op waits for does not wait for a slot.
        let slot = if waited_for {
            None
        } else {
            osd.recovery.slot().await
        };
        let step = osd.recovery.step();
        let r = ctx
            .copy_object_held(&mut End::Remote(rpc), &mut End::Local, &object, dirty)
            .await;
        if !waited_for {
            // A client op waiting for an object ends the pause.
            tokio::select! {
                _ = osd.recovery.pace(step) => {}
                Some(o) = urgent.recv() => hot.push_back(o),
            }
        }
        // Waits before a retry leave the slot to other copies.
        drop(slot);
        match r {
            Ok(PgDone::Done) => {
                left.remove(&object);
                pending.done_one();
                let iv = interval.clone();
                osd.queue(
                    pg,
                    ShardMsg::ObjectRecovered {
                        pg,
                        interval: iv,
                        object,
                    },
                );
            }
            // A client wrote it after the source's copy was read: read it again.
            Ok(PgDone::Busy) => {
                if waited_for {
                    hot.push_back(object);
                } else {
                    queue.push_back(object);
                }
                tokio::time::sleep(BUSY_PAUSE).await;
            }
            Ok(other) => {
                tracing::warn!(pg = %pg, from = own.from, answer = ?other, "catching up: copy refused; retrying");
                queue.push_front(object);
                tokio::time::sleep(RETRY_AFTER).await;
            }
            Err(e) if !e.class.retries() => {
                tracing::error!(pg = %pg, from = own.from, class = %e.class, error = %e, "catching up: copy failed; stopping until the map changes");
                if e.local_store && e.class == FailClass::StoreCorrupt {
                    ctx.osd.store_corrupt(&e);
                }
                return;
            }
            Err(e) => {
                tracing::warn!(pg = %pg, from = own.from, class = %e.class, error = %e, "catching up: copy failed; retrying");
                link = None;
                queue.push_front(object);
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

/// Pushes the objects member `w.member` lacks; false if a newer map has another primary.
async fn push_member(ctx: &Ctx, w: Work, pending: &mut Pending<'_>) -> bool {
    let (osd, pg) = (&ctx.osd, ctx.pg);
    let rec = &osd.recovery;
    let mut queue: VecDeque<(Vec<u8>, Dirty)> = w.objects.into();
    let mut link: Option<Rpc> = None;
    while let Some((object, dirty)) = queue.pop_front() {
        let Some(rpc) = connected(&mut link, osd, pg, w.member).await else {
            queue.push_front((object, dirty));
            continue;
        };
        let slot = rec.slot().await;
        let step = rec.step();
        let r = ctx
            .copy_object_held(&mut End::Local, &mut End::Remote(rpc), &object, &dirty)
            .await;
        rec.pace(step).await;
        // Waits before a retry leave the slot to other copies.
        drop(slot);
        match r {
            Ok(PgDone::Done) => pending.done_one(),
            Ok(PgDone::Busy) => {
                queue.push_back((object, dirty));
                tokio::time::sleep(BUSY_PAUSE).await;
            }
            Ok(PgDone::Stale { epoch }) => {
                tracing::info!(pg = %pg, member = w.member, epoch, "background recovery: a newer map has another primary; stopping");
                return false;
            }
            r => {
                let e = match r {
                    Err(e) => e,
                    Ok(done) => crate::failure::refused(&format!("osd.{}", w.member), &done),
                };
                if !e.class.retries() {
                    // A full or corrupt store does not get better by asking again every
                    // second: the PG peers again when the map changes.
                    tracing::error!(pg = %pg, member = w.member, class = %e.class, error = %e, "background recovery: copy failed; stopping until the map changes");
                    if e.local_store && e.class == FailClass::StoreCorrupt {
                        ctx.osd.store_corrupt(&e);
                    }
                    return false;
                }
                tracing::warn!(pg = %pg, member = w.member, class = %e.class, error = %e, "background recovery: copy failed; retrying");
                link = None;
                queue.push_front((object, dirty));
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
    true
}

/// The connection to member `id`, opened if needed; `None` (after a pause) if it cannot be.
async fn connected<'a>(
    link: &'a mut Option<Rpc>,
    osd: &Osd,
    pg: PgId,
    id: u32,
) -> Option<&'a mut Rpc> {
    if link.is_none() {
        match Rpc::connect_osd(&osd.map(), id, &osd.dialer).await {
            Ok(r) => *link = Some(r),
            Err(e) => {
                tracing::warn!(pg = %pg, member = id, error = %e, "background recovery: member unreachable; retrying");
                tokio::time::sleep(RETRY_AFTER).await;
                return None;
            }
        }
    }
    link.as_mut()
}

impl Ctx {
    /// A guarded copy during which client writes to the object wait (this OSD, the primary,
    /// orders every write), so that the copy is not refused over and over for a hot object.
    async fn copy_object_held(
        &self,
        src: &mut End<'_>,
        dst: &mut End<'_>,
        object: &[u8],
        dirty: &Dirty,
    ) -> Result<PgDone, Failure> {
        let pg = self.pg;
        let hold =
            |on| crate::shard::with_pg(&self.osd, pg, |s| super::set_copying(s, pg, object, on));
        hold(true);
        let r = self.copy_object(src, dst, object, dirty, true).await;
        hold(false);
        r
    }
}
