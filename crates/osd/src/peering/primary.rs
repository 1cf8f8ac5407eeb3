//! The primary's side: gather the members' info and logs, check that some member of every
//! past interval that may have acknowledged writes answered (else the PG is down), pick the
//! authoritative history,
//! give every copy that is behind (the primary's own first) the new log with the objects it
//! lacks marked missing; those objects are copied in the background while the PG serves
//! (`background.rs`). Only when the authority is not an acting member (a previous owner
//! after a rebalance, which gets no writes) does the primary copy what it lacks before the
//! PG serves. Last, every acting member records the epoch the PG goes active at.

use super::copy;
use super::dirty::Dirty;
use super::outcome::{Backlog, Own, Work};
use super::rpc::Rpc;
use super::transfer::{Ctx, End};
use super::{PeerError, Peered, Report};
use crate::context::Osd;
use crate::failure::{FailClass, Failure};
use crate::pglog::LogEntry;
use cairn_map::PgId;
use cairn_proto::msg::encode;
use cairn_proto::msg::peering::{PgDone, PgInfo, PgQuery, PushKind, MAX_NAMES, QUERY_CALL};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::members::Member;

/// What a member needs to reach the authoritative history.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    UpToDate,
    /// The objects changed after `common`, the last version it shares with the authority,
    /// with what changed in each.
    Delta {
        common: u64,
        objects: BTreeMap<Vec<u8>, Dirty>,
    },
    /// Its log does not meet the authority's: copy everything.
    Backfill,
}

/// Compares a member's log with the authority's.
pub fn plan(auth: (&PgInfo, &[LogEntry]), m: (&PgInfo, &[LogEntry])) -> Plan {
    let ((ai, ae), (mi, me)) = (auth, m);
    if (mi.last_epoch, mi.last_version) == (ai.last_epoch, ai.last_version) {
        return Plan::UpToDate;
    }
    let by_version: HashMap<u64, &LogEntry> = ae.iter().map(|e| (e.version, e)).collect();
    let shared = me
        .iter()
        .rev()
        .find(|e| by_version.get(&e.version) == Some(e))
        .map(|e| e.version);
    let common = match shared {
        Some(v) => v,
        None if mi.last_version == 0 => 0,
        None => return Plan::Backfill,
    };
    // The authority's log must hold every entry after the common point.
    let covered =
        ai.last_version == common || ai.tail.is_some_and(|t| t <= common.saturating_add(1));
    if !covered {
        return Plan::Backfill;
    }
    // Entries only the member has (never acknowledged) changed bytes the authority's copy
    // must restore: their ranges count too.
    let mut objects: BTreeMap<Vec<u8>, Dirty> = BTreeMap::new();
    for e in ae.iter().chain(me.iter()).filter(|e| e.version > common) {
        objects.entry(e.object.clone()).or_default().add(&e.op);
    }
    Plan::Delta { common, objects }
}

/// Whether this OSD (`me`) holds current copies of every object the authority has marked
/// missing, so that the PG can go on with that authority and recover those objects to it from
/// here: it has none of them marked missing itself, and it shares the authority's history up
/// to a point after which neither log touches them. (The authority got newer entries, e.g. a
/// write that reached it as a replica while the primary died before its own WAL sync, and
/// then lost its source of the objects a recovery had marked missing on it.)
pub fn can_source_missing(auth: (&PgInfo, &[LogEntry]), me: (&PgInfo, &[LogEntry])) -> bool {
    let missing: BTreeSet<&[u8]> = auth.0.missing.iter().map(Vec::as_slice).collect();
    if me.0.missing.iter().any(|o| missing.contains(o.as_slice())) {
        return false;
    }
    match plan(auth, me) {
        Plan::UpToDate => true,
        Plan::Delta { objects, .. } => objects.keys().all(|o| !missing.contains(o.as_slice())),
        Plan::Backfill => false,
    }
}

/// Adds a member's missing marks to its plan: those objects are copied whole whatever its
/// log says.
pub fn with_missing(p: Plan, info: &PgInfo) -> Plan {
    if info.missing.is_empty() {
        return p;
    }
    let marked = info.missing.iter().map(|o| (o.clone(), Dirty::Whole));
    match p {
        Plan::Backfill => Plan::Backfill,
        Plan::UpToDate => Plan::Delta {
            common: info.last_version,
            objects: marked.collect(),
        },
        Plan::Delta {
            common,
            mut objects,
        } => {
            objects.extend(marked);
            Plan::Delta { common, objects }
        }
    }
}

/// Peers `pg` with the acting set `acting` (this OSD first). Afterwards this OSD holds the
/// authoritative history and every member its log; returns the objects copies still lack.
/// Peers `pg` for `acting`; with `give_up` (an operator's `mark-unfound-lost`: `true` to
/// delete), the newest history's unfound objects are given up first.
pub async fn peer(
    osd: Arc<Osd>,
    pg: PgId,
    acting: Vec<u32>,
    give_up: Option<bool>,
) -> Result<Peered, PeerError> {
    let map = osd.map();
    let me = osd.id();
    let ctx = Ctx {
        osd: osd.clone(),
        pg,
        epoch: map.epoch,
    };
    let mut members = Vec::with_capacity(acting.len());
    // OSDs that are up but not acting may hold the PG's newest data (the previous owners
    // after a rebalance): they are asked too, and may be the authority, but are not changed.
    let strays: Vec<u32> = map
        .osds
        .values()
        .filter(|o| o.up && !acting.contains(&o.id))
        .map(|o| o.id)
        .collect();
    let mut stray_members = Vec::new();
    let mut answered: BTreeSet<u32> = acting.iter().copied().collect();
    for id in strays {
        match query(&map, pg, id, &osd.dialer).await {
            Ok(m) => {
                answered.insert(id);
                if m.info.last_version > 0 {
                    stray_members.push(m);
                }
            }
            Err(e) => tracing::debug!(pg = %pg, osd = id, error = %e, "stray not asked"),
        }
    }
    for id in acting {
        if id == me {
            let (info, entries) = copy::info(&osd.store, pg, 0)?;
            members.push(Member {
                id,
                rpc: None,
                info,
                entries,
            });
            continue;
        }
        members.push(query(&map, pg, id, &osd.dialer).await?);
    }
    let acting_count = members.len();
    members.extend(stray_members);
    let mut report = past_intervals(&osd, &map, pg, &members, answered).await?;
    if !report.coverage.blocked.is_empty() {
        report.waiting_for = report.coverage.waiting_for();
        return Err(PeerError::Down(report));
    }
    // The newest history: the PG's latest activation first (a copy that went active later
    // holds everything acknowledged before), then the newest log head; of equals, one whose
    // copies are all current, then an acting member (a previous owner may be deleting its
    // copy once the PG is clean).
    let Some(auth_i) = (0..members.len()).max_by_key(|&i| {
        let m = &members[i];
        (
            m.info.last_epoch_started,
            m.head(),
            m.info.missing.is_empty(),
            i < acting_count,
        )
    }) else {
        return Ok(Peered {
            backlog: Backlog::default(),
            report,
        });
    };
    let mine = members.iter().position(|m| m.rpc.is_none()).unwrap_or(0);
    let auth_missing = members[auth_i].info.missing.len();
    let histories: Vec<(&PgInfo, &[LogEntry])> = members
        .iter()
        .map(|m| (&m.info, m.entries.as_slice()))
        .collect();
    // Every member's history gathered, the authority chosen, nothing changed yet.
    fail::fail_point!("osd_peering_mid");
    let source = source_of_missing(&histories, auth_i, mine);
    let mut copied_here = BTreeSet::new();
    match source {
        Some(s) if s == mine => {
            tracing::info!(pg = %pg, authority = members[auth_i].id, objects = auth_missing,
                "the newest history lacks objects this OSD has current: recovering them from here");
        }
        Some(s) => {
            copied_here = copy_missing_from(&ctx, &mut members, auth_i, s).await?;
        }
        None => {}
    }
    if auth_missing > 0 && source.is_none() {
        let why = format!(
            "the newest history is on osd.{} but {} of its objects are not current there \
             (marked missing) and no OSD that answered has them",
            members[auth_i].id,
            members[auth_i].info.missing.len()
        );
        // Down, waiting for the OSDs of its intervals that did not answer: one of them may
        // hold those objects. With every one of them declared lost, asking again cannot help
        // until the map changes (there is no way yet to give up unfound objects).
        report.waiting_for = not_answered(&report, &map);
        if report.waiting_for.is_empty() {
            let objects = members[auth_i].info.missing.clone();
            if let Some(delete) = give_up {
                let n =
                    super::unfound::give_up(&ctx, &mut members, auth_i, &objects, delete).await?;
                let how = if delete {
                    "deleted"
                } else {
                    "reverted or deleted"
                };
                tracing::warn!(pg = %pg, objects = n, how, "unfound objects given up (`cairn pg mark-unfound-lost`); peering again");
                return Err(PeerError::Failed(Failure::transient(format!(
                    "{n} unfound objects given up; peering again"
                ))));
            }
            return Err(PeerError::Unfound {
                objects,
                failure: Failure::new(FailClass::Unfound, why),
            });
        }
        report.reason = Some(why);
        return Err(PeerError::Down(report));
    }
    let auth_info = members[auth_i].info.clone();
    let auth_entries = members[auth_i].entries.clone();
    let auth_id = members[auth_i].id;
    let mut backlog = Backlog::default();
    // This OSD first: it is the source for everyone else. Objects just copied here from
    // another member are current already.
    let p = without(
        with_missing(
            plan(
                (&auth_info, &auth_entries),
                (&members[mine].info, &members[mine].entries),
            ),
            &members[mine].info,
        ),
        &copied_here,
    );
    if p != Plan::UpToDate {
        let acting_auth = auth_i < acting_count;
        tracing::info!(pg = %pg, from = auth_id, plan = %summary(&p, &members[mine].info), in_background = acting_auth, "recovering this OSD's copy");
        let Some(rpc) = members[auth_i].rpc.as_mut() else {
            let why = "the authority is this OSD but its plan is not up to date";
            return Err(PeerError::Failed(Failure::protocol(why)));
        };
        let objects = ctx
            .start(
                &mut End::Local,
                p,
                &auth_info,
                &auth_entries,
                &mut End::Remote(rpc),
            )
            .await?;
        if acting_auth {
            backlog.own = Some(Own {
                from: auth_id,
                objects,
            });
        } else {
            recover_now(&ctx, rpc, objects).await?;
        }
    }
    for m in members[..acting_count]
        .iter_mut()
        .filter(|m| m.rpc.is_some())
    {
        let p = with_missing(
            plan((&auth_info, &auth_entries), (&m.info, &m.entries)),
            &m.info,
        );
        if p == Plan::UpToDate {
            continue;
        }
        tracing::info!(pg = %pg, member = m.id, plan = %summary(&p, &m.info), "member behind: recovering it in the background");
        if let Some(rpc) = m.rpc.as_mut() {
            let objects = ctx
                .start(
                    &mut End::Remote(rpc),
                    p,
                    &auth_info,
                    &auth_entries,
                    &mut End::Local,
                )
                .await?;
            backlog.members.push(Work {
                member: m.id,
                objects,
            });
        }
    }
    activate(&ctx, &mut members[..acting_count]).await?;
    Ok(Peered { backlog, report })
}

/// The member that can give the authority's missing objects (marked missing there): this
/// OSD when it can ([`can_source_missing`]), else another member that answered, else none.
/// `None` too when the authority lacks nothing.
pub fn source_of_missing(
    histories: &[(&PgInfo, &[LogEntry])],
    auth_i: usize,
    mine: usize,
) -> Option<usize> {
    let auth = histories[auth_i];
    if auth.0.missing.is_empty() {
        return None;
    }
    let can = |i: usize| i != auth_i && can_source_missing(auth, histories[i]);
    if can(mine) {
        return Some(mine);
    }
    // Another member can source them only into a copy here that recovers by delta: a
    // backfill would copy every object from the authority, those too.
    if plan(auth, histories[mine]) == Plan::Backfill {
        return None;
    }
    (0..histories.len()).find(|&i| i != mine && can(i))
}

/// Copies the authority's missing objects whole from member `src` to this OSD (where the
/// other members recover them from); returns them.
async fn copy_missing_from(
    ctx: &Ctx,
    members: &mut [Member],
    auth_i: usize,
    src: usize,
) -> Result<BTreeSet<Vec<u8>>, PeerError> {
    let objects: BTreeSet<Vec<u8>> = members[auth_i].info.missing.iter().cloned().collect();
    tracing::info!(pg = %ctx.pg, authority = members[auth_i].id, source = members[src].id,
        objects = objects.len(),
        "the newest history lacks objects another member has current: copying them here first");
    let Some(rpc) = members[src].rpc.as_mut() else {
        return Err(PeerError::Failed(Failure::protocol(
            "the source of the missing objects is this OSD",
        )));
    };
    for o in &objects {
        let done = ctx
            .copy_object(
                &mut End::Remote(rpc),
                &mut End::Local,
                o,
                &Dirty::Whole,
                false,
            )
            .await?;
        if done != PgDone::Done {
            let who = format!(
                "copying an object the authority lacks from osd.{}",
                members[src].id
            );
            return Err(PeerError::Failed(crate::failure::refused(&who, &done)));
        }
    }
    Ok(objects)
}

/// `p` without `objects` (copied current already).
fn without(p: Plan, copied: &BTreeSet<Vec<u8>>) -> Plan {
    match p {
        Plan::Delta {
            common,
            mut objects,
        } => {
            objects.retain(|o, _| !copied.contains(o));
            Plan::Delta { common, objects }
        }
        other => other,
    }
}

/// Asks the monitors for `pg`'s intervals since the newest activation any OSD that answered
/// knows of, and checks that each that may have acknowledged writes has a member among
/// `answered`.
async fn past_intervals(
    osd: &Osd,
    map: &cairn_map::ClusterMap,
    pg: PgId,
    members: &[Member],
    answered: BTreeSet<u32>,
) -> Result<Report, PeerError> {
    let since = members
        .iter()
        .map(|m| m.info.last_epoch_started)
        .max()
        .unwrap_or(0);
    let (from, intervals) = osd
        .mon
        .past_intervals(pg, since, map.epoch)
        .await
        .map_err(|e| {
            Failure::transient(format!("asking the monitors for the past intervals: {e}"))
        })?;
    let coverage = cairn_map::intervals::check(&intervals, &answered, map);
    Ok(Report {
        from,
        intervals,
        answered,
        coverage,
        waiting_for: Vec::new(),
        reason: None,
    })
}

/// The OSDs of `report`'s intervals that did not answer and were not declared lost.
fn not_answered(report: &Report, map: &cairn_map::ClusterMap) -> Vec<u32> {
    let all: BTreeSet<u32> = report
        .intervals
        .iter()
        .flat_map(|iv| iv.acting.iter().copied())
        .filter(|o| !report.answered.contains(o))
        .filter(|o| map.osds.get(o).is_some_and(|i| i.lost_at == 0))
        .collect();
    all.into_iter().collect()
}

/// Tells every acting member (this OSD too) that the PG goes active at this epoch.
async fn activate(ctx: &Ctx, members: &mut [Member]) -> Result<(), Failure> {
    for m in members {
        let kind = PushKind::Activate { epoch: ctx.epoch };
        match m.rpc.as_mut() {
            Some(rpc) => ctx.push(&mut End::Remote(rpc), kind, &[]).await?,
            None => ctx.push(&mut End::Local, kind, &[]).await?,
        }
    }
    Ok(())
}

/// Copies `objects` from the authority (a previous owner, not getting writes) over this
/// OSD's copy, before the PG serves.
async fn recover_now(
    ctx: &Ctx,
    auth: &mut Rpc,
    objects: Vec<(Vec<u8>, Dirty)>,
) -> Result<(), Failure> {
    // Not paced: the PG's client I/O waits for this, pausing would only make it wait longer.
    let mut pending = ctx.osd.recovery.plan(objects.len() as u64);
    for (o, dirty) in &objects {
        let done = ctx
            .copy_object(&mut End::Remote(auth), &mut End::Local, o, dirty, false)
            .await?;
        if done != PgDone::Done {
            return Err(crate::failure::refused(
                "recovering an object from the authority",
                &done,
            ));
        }
        pending.done_one();
    }
    Ok(())
}

impl Ctx {
    /// Gives `dst` the authority's log with the objects `plan` says it lacks marked missing
    /// (after emptying it for a backfill, listing the objects at `src`); returns them.
    async fn start(
        &self,
        dst: &mut End<'_>,
        plan: Plan,
        auth: &PgInfo,
        auth_entries: &[LogEntry],
        src: &mut End<'_>,
    ) -> Result<Vec<(Vec<u8>, Dirty)>, Failure> {
        let (common, objects): (u64, Vec<(Vec<u8>, Dirty)>) = match plan {
            Plan::UpToDate => return Ok(Vec::new()),
            Plan::Delta { common, objects } => (common, objects.into_iter().collect()),
            Plan::Backfill => {
                let names = self.names(src).await?;
                self.push(dst, PushKind::Reset, &[]).await?;
                (0, names.into_iter().map(|n| (n, Dirty::Whole)).collect())
            }
        };
        // Marked before the log is adopted: a member never looks current without being so.
        for chunk in objects.chunks(MAX_NAMES as usize) {
            let kind = PushKind::MarkMissing {
                objects: chunk.iter().map(|(o, _)| o.clone()).collect(),
            };
            self.push(dst, kind, &[]).await?;
        }
        let entries: Vec<&LogEntry> = auth_entries.iter().filter(|e| e.version > common).collect();
        let kind = PushKind::Log {
            last_version: auth.last_version,
        };
        self.push(dst, kind, &encode(&entries)).await?;
        Ok(objects)
    }
}

/// Asks member `id` for its info and whole log of `pg`.
async fn query(
    map: &cairn_map::ClusterMap,
    pg: PgId,
    id: u32,
    dialer: &cairn_transport::Dialer,
) -> Result<Member, Failure> {
    let mut rpc = Rpc::connect_osd(map, id, dialer).await?;
    let q = PgQuery {
        epoch: map.epoch,
        pool: pg.pool,
        pg: pg.pg,
        since: 0,
    };
    let (info, data) = rpc.ask(QUERY_CALL, &q, &[]).await?;
    check_claims(&info, id, map.epoch)?;
    let entries = crate::pglog::decode_peer_entries(&data)
        .map_err(|e| Failure::protocol(format!("osd.{id}'s log of pg {pg}: {e}")))?;
    Ok(Member {
        id,
        rpc: Some(rpc),
        info,
        entries,
    })
}

/// Refuses a member's info whose `last_epoch_started` no map of this OSD's can have made
/// (it ranks authority: a forged future epoch would make that copy win).
fn check_claims(info: &PgInfo, osd: u32, map_epoch: u64) -> Result<(), Failure> {
    if info.last_epoch_started > map_epoch {
        return Err(Failure::stale(format!(
            "osd.{osd} claims the PG went active at epoch {}, after this OSD's map epoch \
             {map_epoch}",
            info.last_epoch_started
        )));
    }
    Ok(())
}

/// A plan for the log: its kind and how many objects.
fn summary(p: &Plan, info: &PgInfo) -> String {
    let marked = if info.missing.is_empty() {
        String::new()
    } else {
        format!(" ({} of them marked missing)", info.missing.len())
    };
    match p {
        Plan::UpToDate => "up to date".into(),
        Plan::Delta { common, objects } => {
            format!(
                "delta after version {common}: {} objects{marked}",
                objects.len()
            )
        }
        Plan::Backfill => "backfill".into(),
    }
}

#[cfg(test)]
mod claim_tests {
    use super::*;

    #[test]
    fn a_member_claiming_a_future_activation_is_refused() {
        let mut info = PgInfo {
            last_version: 3,
            last_epoch: 5,
            tail: Some(1),
            missing: Vec::new(),
            last_epoch_started: 9,
        };
        assert!(check_claims(&info, 2, 9).is_ok());
        info.last_epoch_started = 10;
        let e = check_claims(&info, 2, 9).unwrap_err();
        assert_eq!(e.class, FailClass::StaleMap, "{e}");
        assert!(
            e.what.contains("osd.2") && e.what.contains("epoch 10"),
            "{e}"
        );
    }
}
