//! What every connection handler of a monitor shares, and the requests that need Raft:
//! commands, heartbeats and status.

use crate::failure::FailureDetector;
use crate::state_machine::MapView;
use crate::types::{ApplyResult, BasicNode, NodeId, Proposal, Raft};
use cairn_map::{ChangeOutcome, MapChange, MapError};
use cairn_proto::msg::mon::{
    CommandReply, FailureReport, Heartbeat, MonStatus, PastIntervalsQuery, PastIntervalsReply,
    Unavailable,
};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{RaftMetrics, ServerState};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What became of a proposal.
pub(crate) enum Proposed {
    /// Committed and applied here, with what applying it returned.
    Applied(ApplyResult),
    /// This monitor does not lead (the leader's address when known).
    NotLeader(Option<String>),
    /// Not committed in time, or the monitor is stopping.
    Unavailable(Unavailable),
}

/// A monitor's shared state.
pub(crate) struct Ctx {
    pub id: NodeId,
    pub fsid: [u8; 16],
    pub raft: Raft,
    pub metrics: watch::Receiver<RaftMetrics<NodeId, BasicNode>>,
    pub view: Arc<MapView>,
    pub failure: FailureDetector,
    pub command_timeout: Duration,
    /// Every PG's last start, for trimming the map history (leader only).
    pub starts: crate::pg_starts::PgStarts,
    /// Epochs of history kept at least.
    pub history_keep: u64,
    /// Who may connect (`crate::auth`).
    pub verifier: Arc<dyn cairn_transport::Verifier>,
    /// The keys (`None`: the monitor runs without authentication).
    pub keys: Option<Arc<crate::auth::MonKeys>>,
    /// Connections held on the monitor's port, against their caps.
    pub admission: Arc<cairn_transport::Admission>,
    /// Counts and latencies of proposals (`metrics.rs`).
    pub stats: crate::metrics::MonMetrics,
}

impl Ctx {
    /// The leader this monitor knows of: (id, address).
    pub(crate) fn leader(&self) -> (Option<NodeId>, Option<String>) {
        let m = self.metrics.borrow();
        let addr = m.current_leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.addr.clone())
        });
        (m.current_leader, addr)
    }

    /// The term this monitor leads in, if it is the leader.
    pub(crate) fn leading_term(&self) -> Option<u64> {
        let m = self.metrics.borrow();
        (m.state == ServerState::Leader && m.current_leader == Some(self.id))
            .then_some(m.current_term)
    }

    /// `NotLeader` naming the leader when this monitor does not lead.
    fn not_leader(&self) -> Option<CommandReply> {
        if self.leading_term().is_some() {
            return None;
        }
        Some(CommandReply::NotLeader {
            leader: self.leader().1,
        })
    }

    /// Proposes a map change and waits until it is committed and applied here.
    pub(crate) async fn command(&self, change: MapChange) -> CommandReply {
        match self.propose(Proposal::Map(change)).await {
            Proposed::Applied(ApplyResult::Map(Ok(outcome))) => CommandReply::Done(outcome),
            Proposed::Applied(ApplyResult::Map(Err(e))) => CommandReply::Refused(e),
            Proposed::Applied(ApplyResult::Keys(_)) => {
                CommandReply::Unavailable(Unavailable::MapAppliedAsKeys)
            }
            Proposed::NotLeader(leader) => CommandReply::NotLeader { leader },
            Proposed::Unavailable(why) => CommandReply::Unavailable(why),
        }
    }

    /// Proposes `p` (leader only) and waits until it is committed and applied here.
    pub(crate) async fn propose(&self, p: Proposal) -> Proposed {
        if self.leading_term().is_none() {
            return Proposed::NotLeader(self.leader().1);
        }
        let kind = match p {
            Proposal::Map(_) => "map",
            Proposal::Keys(_) => "keys",
        };
        let t0 = Instant::now();
        let proposed = self.propose_now(p).await;
        let result = match &proposed {
            Proposed::Applied(_) => "applied",
            Proposed::NotLeader(_) => "not_leader",
            Proposed::Unavailable(_) => "unavailable",
        };
        self.stats
            .proposed(kind, result, t0.elapsed().as_secs_f64());
        proposed
    }

    async fn propose_now(&self, p: Proposal) -> Proposed {
        let write = self.raft.client_write(p);
        match tokio::time::timeout(self.command_timeout, write).await {
            Err(_) => Proposed::Unavailable(Unavailable::NotCommitted {
                timeout_ms: self.command_timeout.as_millis() as u64,
            }),
            Ok(Ok(resp)) => Proposed::Applied(resp.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Proposed::NotLeader(f.leader_node.map(|n| n.addr))
            }
            Ok(Err(RaftError::APIError(e))) => Proposed::Unavailable(Unavailable::Membership {
                detail: e.to_string(),
            }),
            Ok(Err(RaftError::Fatal(e))) => Proposed::Unavailable(Unavailable::Stopping {
                detail: e.to_string(),
            }),
        }
    }

    /// Records an OSD's heartbeat (leader only). A heartbeat from a previous life of the OSD,
    /// or from an OSD marked down, is refused (`NotUp`): the OSD must not count it as a lease
    /// renewal (another OSD may lead its PGs now); it learns from the map that it must boot
    /// again.
    pub(crate) fn heartbeat(&self, hb: Heartbeat) -> CommandReply {
        if let Some(r) = self.not_leader() {
            return r;
        }
        let state = self
            .view
            .with_map(|m| m.osds.get(&hb.osd).map(|o| (o.up, o.up_from)));
        match state {
            None => CommandReply::Refused(MapError::NoSuchOsd(hb.osd)),
            Some((true, life)) if life == hb.up_from => {
                if !self.failure.heard(hb.osd, life, Instant::now()) {
                    return CommandReply::Refused(MapError::Reported { osd: hb.osd });
                }
                self.view
                    .with_map(|m| self.starts.report(m, hb.osd, &hb.pgs));
                let grace_ms = self.failure.grace().as_millis() as u64;
                CommandReply::Alive { grace_ms }
            }
            Some((up, life)) => {
                tracing::debug!(
                    osd = hb.osd,
                    up,
                    life,
                    heartbeat_life = hb.up_from,
                    "refusing a heartbeat of another life of the OSD"
                );
                CommandReply::Refused(MapError::NotUp { osd: hb.osd })
            }
        }
    }

    /// Records an OSD's report that a peer does not answer (leader only). The reporter must
    /// be up in the life it names; a report about another life of the target is ignored.
    pub(crate) fn failure_report(&self, r: FailureReport) -> CommandReply {
        if let Some(reply) = self.not_leader() {
            return reply;
        }
        let state = self.view.with_map(|m| {
            let reporter = m.osds.get(&r.reporter).map(|o| (o.up, o.up_from));
            let target = m.osds.get(&r.target).map(|o| (o.up, o.up_from));
            (reporter, target)
        });
        match state {
            (None, _) => CommandReply::Refused(MapError::NoSuchOsd(r.reporter)),
            (_, None) => CommandReply::Refused(MapError::NoSuchOsd(r.target)),
            (Some((up, life)), _) if !up || life != r.reporter_life => {
                CommandReply::Refused(MapError::NotUp { osd: r.reporter })
            }
            (_, Some((true, life))) if life == r.target_life => {
                tracing::info!(
                    reporter = r.reporter,
                    target = r.target,
                    "OSD failure report"
                );
                self.failure
                    .reported(r.target, life, r.reporter, Instant::now());
                CommandReply::Done(ChangeOutcome::Unchanged)
            }
            _ => CommandReply::Done(ChangeOutcome::Unchanged),
        }
    }

    /// A PG's past intervals from this monitor's map history.
    pub(crate) fn past_intervals(&self, q: &PastIntervalsQuery) -> PastIntervalsReply {
        let pg = cairn_map::PgId {
            pool: q.pool,
            pg: q.pg,
        };
        match self.view.past_intervals(pg, q.since, q.until) {
            Ok((from, intervals)) => PastIntervalsReply::Intervals { from, intervals },
            Err(crate::state_machine::IntervalsError::Behind { have, .. }) => {
                PastIntervalsReply::Behind { epoch: have }
            }
            Err(crate::state_machine::IntervalsError::Replay(e)) => PastIntervalsReply::Failed(e),
        }
    }

    /// The epoch the map history may be trimmed to now, when it is newer than the oldest
    /// kept (leader only): the oldest epoch a PG may still need, and never within
    /// `history_keep` epochs of the current one.
    pub(crate) fn history_trim_due(&self) -> Option<u64> {
        self.leading_term()?;
        let (floor, epoch) = self.view.with_map(|m| (self.starts.floor(m), m.epoch));
        let below = floor?.min(epoch.saturating_sub(self.history_keep));
        (below > self.view.history_oldest()).then_some(below)
    }

    /// This monitor's view of the monitor cluster.
    pub(crate) fn status(&self) -> MonStatus {
        let (leader, leader_addr) = self.leader();
        let m = self.metrics.borrow();
        MonStatus {
            id: self.id,
            leader,
            leader_addr,
            term: m.current_term,
            members: m
                .membership_config
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect(),
            epoch: self.view.epoch(),
            history_oldest: self.view.history_oldest(),
            frames: self.verifier.frames().to_u8(),
            authenticated: self.keys.is_some(),
        }
    }
}
