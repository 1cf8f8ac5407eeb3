//! `MEMBERS_COMMAND`: adding and removing monitors (`cairn mon add|rm`), on the leader.
//!
//! Adding makes the new monitor (started with `--join`, so it forms no cluster of its own) a
//! learner, waits until it has caught up with the log, then makes it a voter; removing
//! replaces the voters by the others. Both are Raft membership changes (joint consensus), so
//! a quorum of the old and of the new membership must be reachable. Needs `mon x` (or a
//! cluster without authentication).

use crate::ctx::Ctx;
use crate::types::BasicNode;
use cairn_auth::{EntityKind, Perms};
use cairn_proto::msg::mon::{MembersReply, MembersRequest, Unavailable};
use cairn_transport::Peer;
use openraft::error::{ClientWriteError, RaftError};
use std::collections::BTreeSet;
use std::time::Duration;

/// Longest a new monitor may take to catch up with the log before it becomes a voter.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// Most monitors a cluster may have.
pub const MAX_MONITORS: usize = 7;

fn refusal(ctx: &Ctx, peer: &Peer) -> Option<String> {
    // Without authentication every client is trusted (as for map changes).
    ctx.keys.as_ref()?;
    let admin = peer
        .entity
        .as_ref()
        .is_some_and(|e| matches!(e.kind(), EntityKind::Client | EntityKind::Nbd));
    if admin && peer.caps.mon_perms().covers(Perms::X) {
        return None;
    }
    Some(format!(
        "permission denied: {} lacks x on the monitors (adding or removing monitors needs \
         `mon x`)",
        peer.name()
    ))
}

/// Answers one request from `peer`.
pub(crate) async fn serve(ctx: &Ctx, peer: &Peer, req: MembersRequest) -> MembersReply {
    if let Some(why) = refusal(ctx, peer) {
        tracing::warn!(peer = %peer.name(), "refused: {why}");
        return MembersReply::Refused(why);
    }
    if ctx.leading_term().is_none() {
        return MembersReply::NotLeader {
            leader: ctx.leader().1,
        };
    }
    let voters = voters(ctx);
    let result = match req {
        MembersRequest::Add { id, addr } => add(ctx, &voters, id, addr).await,
        MembersRequest::Remove { id } => remove(ctx, &voters, id).await,
    };
    match result {
        Ok(()) => MembersReply::Done {
            members: members(ctx),
        },
        Err(reply) => reply,
    }
}

fn voters(ctx: &Ctx) -> BTreeSet<u64> {
    ctx.metrics
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect()
}

fn members(ctx: &Ctx) -> Vec<(u64, String)> {
    ctx.metrics
        .borrow()
        .membership_config
        .membership()
        .nodes()
        .map(|(id, n)| (*id, n.addr.clone()))
        .collect()
}

async fn add(ctx: &Ctx, voters: &BTreeSet<u64>, id: u64, addr: String) -> Result<(), MembersReply> {
    let refused = |s: String| Err(MembersReply::Refused(s));
    if voters.contains(&id) {
        return refused(format!("monitor {id} is already a member"));
    }
    if addr.parse::<std::net::SocketAddr>().is_err() {
        return refused(format!("monitor address {addr:?} is not IP:PORT"));
    }
    if voters.len() >= MAX_MONITORS {
        return refused(format!(
            "the cluster has {} monitors, the most it may have: remove one first",
            voters.len()
        ));
    }
    if members(ctx)
        .iter()
        .any(|(other, a)| *a == addr && *other != id)
    {
        return refused(format!("another monitor is at {addr}"));
    }
    tracing::info!(id, %addr, "adding a monitor: catching it up as a learner");
    let learner = ctx.raft.add_learner(id, BasicNode::new(&addr), true);
    match tokio::time::timeout(CATCH_UP_TIMEOUT, learner).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(raft_error(e)),
        Err(_) => {
            return Err(MembersReply::Unavailable(Unavailable::LearnerBehind {
                id,
                addr,
                timeout_ms: CATCH_UP_TIMEOUT.as_millis() as u64,
            }))
        }
    }
    let mut next = voters.clone();
    next.insert(id);
    change(ctx, next).await?;
    tracing::info!(id, %addr, "monitor added");
    Ok(())
}

async fn remove(ctx: &Ctx, voters: &BTreeSet<u64>, id: u64) -> Result<(), MembersReply> {
    if !voters.contains(&id) {
        return Err(MembersReply::Refused(format!(
            "monitor {id} is not a member (members: {voters:?})"
        )));
    }
    if voters.len() == 1 {
        return Err(MembersReply::Refused(format!(
            "monitor {id} is the only monitor: add another before removing it"
        )));
    }
    let mut next = voters.clone();
    next.remove(&id);
    change(ctx, next).await?;
    tracing::info!(id, "monitor removed");
    Ok(())
}

async fn change(ctx: &Ctx, voters: BTreeSet<u64>) -> Result<(), MembersReply> {
    match ctx.raft.change_membership(voters, false).await {
        Ok(_) => Ok(()),
        Err(e) => Err(raft_error(e)),
    }
}

fn raft_error(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> MembersReply {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => MembersReply::NotLeader {
            leader: f.leader_node.map(|n| n.addr),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
            MembersReply::Refused(c.to_string())
        }
        RaftError::Fatal(e) => MembersReply::Unavailable(Unavailable::Stopping {
            detail: e.to_string(),
        }),
    }
}
