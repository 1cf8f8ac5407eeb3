//! Unfound objects: the newest history lacks them (they are marked missing there) and no OSD
//! that could hold them answered with a current copy (all of them answered without one, or
//! were declared lost). The PG waits for one to return, or for an operator to give them up
//! (`cairn pg mark-unfound-lost PG revert|delete`, Ceph's `mark_unfound_lost`): the next
//! peering then reverts each to the best older copy an answering member holds, or deletes it,
//! on the authority, whose missing marks go with it; the peering after that spreads the
//! result to every member as any recovery does.

use super::dirty::Dirty;
use super::members::Member;
use super::transfer::{Ctx, End};
use crate::failure::{refused, Failure};
use cairn_proto::msg::peering::{PgDone, PushKind};

/// Gives up `objects` on the authority `members[auth_i]`: with `delete`, removes them;
/// else copies over each the best older copy a member holds (one not marked missing there
/// first, then the newest history), or removes it where none is held. Returns how many.
pub(super) async fn give_up(
    ctx: &Ctx,
    members: &mut [Member],
    auth_i: usize,
    objects: &[Vec<u8>],
    delete: bool,
) -> Result<usize, Failure> {
    for o in objects {
        let src = if delete {
            None
        } else {
            best_copy(ctx, members, o).await?
        };
        let done = match src {
            Some(s) if s != auth_i => {
                let (from, to) = crate::slices::pair(members, s, auth_i);
                ctx.copy_object(&mut end(from), &mut end(to), o, &Dirty::Whole, false)
                    .await?
            }
            // The authority's own older copy: rewritten in place, which drops its mark (read
            // over a second connection when the authority is another OSD).
            Some(_) => {
                let a = &mut members[auth_i];
                match a.rpc.as_mut() {
                    None => {
                        ctx.copy_object(&mut End::Local, &mut End::Local, o, &Dirty::Whole, false)
                            .await?
                    }
                    Some(rpc) => {
                        let map = ctx.osd.map();
                        let mut reader =
                            super::rpc::Rpc::connect_osd(&map, a.id, &ctx.osd.dialer).await?;
                        let (mut from, mut to) = (End::Remote(&mut reader), End::Remote(rpc));
                        ctx.copy_object(&mut from, &mut to, o, &Dirty::Whole, false)
                            .await?
                    }
                }
            }
            None => {
                let kind = PushKind::RecoverRemove {
                    object: o.clone(),
                    since: None,
                };
                ctx.push_reply(&mut end(&mut members[auth_i]), kind, &[])
                    .await?
            }
        };
        if done != PgDone::Done {
            return Err(refused("giving up an unfound object", &done));
        }
    }
    Ok(objects.len())
}

/// The member holding the best copy of `object`: one whose own history has it current (not
/// marked missing) before one that has it marked, then the newest history.
async fn best_copy(
    ctx: &Ctx,
    members: &mut [Member],
    object: &[u8],
) -> Result<Option<usize>, Failure> {
    let mut best: Option<((bool, u64), usize)> = None;
    for (i, m) in members.iter_mut().enumerate() {
        let current = !m.info.missing.iter().any(|x| x == object);
        let rank = (current, m.info.last_version);
        if best.is_some_and(|(b, _)| b >= rank) {
            continue;
        }
        let (o, _) = ctx.read_len(&mut end(m), object, 0, 0).await?;
        if o.exists {
            best = Some((rank, i));
        }
    }
    Ok(best.map(|(_, i)| i))
}

fn end(m: &mut Member) -> End<'_> {
    end_of(m.rpc.as_mut())
}

fn end_of(rpc: Option<&mut super::rpc::Rpc>) -> End<'_> {
    match rpc {
        Some(r) => End::Remote(r),
        None => End::Local,
    }
}
