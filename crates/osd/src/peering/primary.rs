//! The primary's side: gather the members' info and logs, pick the authoritative history,
//! bring every member (itself first) up to it, object by object. Runs as a task on the PG's
//! shard; client ops on the PG wait until it is done.

use super::dirty::Dirty;
use super::member;
use super::rpc::Rpc;
use crate::daemon::Osd;
use crate::pglog::LogEntry;
use cairn_map::PgId;
use cairn_proto::msg::peering::{
    PgDone, PgInfo, PgList, PgNames, PgObject, PgPull, PgPush, PgQuery, PushKind, PG_DONE, PG_INFO,
    PG_LIST, PG_NAMES, PG_OBJECT, PG_PULL, PG_PUSH, PG_QUERY, RECOVERY_CHUNK,
};
use cairn_proto::msg::{decode, encode};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One member of the acting set as peering sees it.
struct Member {
    id: u32,
    /// `None` for this OSD.
    rpc: Option<Rpc>,
    info: PgInfo,
    entries: Vec<LogEntry>,
}

impl Member {
    fn head(&self) -> (u64, u64) {
        (self.info.last_epoch, self.info.last_version)
    }
}

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

/// Where object bytes come from or go to: this OSD's store or a member over its connection.
pub(crate) enum End<'a> {
    Local,
    Remote(&'a mut Rpc),
}

/// Moves object bytes between this OSD (a PG's primary) and the PG's members.
pub(crate) struct Ctx {
    pub osd: Arc<Osd>,
    pub pg: PgId,
    pub epoch: u64,
}

impl Ctx {
    pub async fn read(
        &self,
        src: &mut End<'_>,
        object: &[u8],
        offset: u64,
    ) -> Result<(PgObject, Vec<u8>), String> {
        self.read_len(src, object, offset, RECOVERY_CHUNK).await
    }

    /// Up to `len` bytes (at most [`RECOVERY_CHUNK`]) of an object at `offset`.
    async fn read_len(
        &self,
        src: &mut End<'_>,
        object: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<(PgObject, Vec<u8>), String> {
        match src {
            End::Local => member::pull(&self.osd.store, self.pg, object, offset, len),
            End::Remote(rpc) => {
                let p = PgPull {
                    epoch: self.epoch,
                    pool: self.pg.pool,
                    pg: self.pg.pg,
                    object: object.to_vec(),
                    offset,
                    len: len.min(RECOVERY_CHUNK),
                };
                let f = rpc.call(PG_PULL, PG_OBJECT, &encode(&p), &[]).await?;
                let o: PgObject = decode("pg object", &f.control).map_err(|e| e.to_string())?;
                Ok((o, f.data))
            }
        }
    }

    async fn push(&self, dst: &mut End<'_>, kind: PushKind, data: &[u8]) -> Result<(), String> {
        match self.push_reply(dst, kind, data).await? {
            PgDone::Done => Ok(()),
            PgDone::Stale { epoch } => Err(format!(
                "the member's map (epoch {epoch}) no longer has this OSD as primary"
            )),
            PgDone::Failed(why) => Err(why),
            PgDone::Busy => Err("the member refused: the object changed meanwhile".into()),
        }
    }

    /// Applies one push to `dst` and returns its answer.
    pub async fn push_reply(
        &self,
        dst: &mut End<'_>,
        kind: PushKind,
        data: &[u8],
    ) -> Result<PgDone, String> {
        if !matches!(kind, PushKind::Log { .. }) {
            let rec = &self.osd.recovery;
            rec.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        match dst {
            End::Local => {
                let pg = self.pg;
                self.osd
                    .with_pg_shard(pg, |shard| member::apply(shard, pg, &kind, data))
                    .ok_or_else(|| "no shard".to_string())
            }
            End::Remote(rpc) => {
                let p = PgPush {
                    epoch: self.epoch,
                    pool: self.pg.pool,
                    pg: self.pg.pg,
                    primary: self.osd.id(),
                    kind,
                };
                let f = rpc.call(PG_PUSH, PG_DONE, &encode(&p), data).await?;
                decode::<PgDone>("pg done", &f.control).map_err(|e| e.to_string())
            }
        }
    }

    /// Copies one object's state (or its absence) from `src` to `dst`.
    async fn copy(
        &self,
        src: &mut End<'_>,
        dst: &mut End<'_>,
        object: &[u8],
    ) -> Result<(), String> {
        let mut offset = 0;
        loop {
            let (o, bytes) = self.read(src, object, offset).await?;
            if !o.exists {
                let kind = PushKind::Remove {
                    object: object.to_vec(),
                };
                return self.push(dst, kind, &[]).await;
            }
            let n = bytes.len() as u64;
            let kind = PushKind::Object {
                object: object.to_vec(),
                offset,
                size: o.size,
            };
            self.push(dst, kind, &bytes).await?;
            offset += n;
            if n == 0 || offset >= o.size {
                return Ok(());
            }
        }
    }

    /// Copies the bytes of `object` in `ranges` from `src` to `dst` and gives it the
    /// source's size (the rest of the destination's copy is already the same).
    async fn patch(
        &self,
        src: &mut End<'_>,
        dst: &mut End<'_>,
        object: &[u8],
        ranges: &[(u64, u64)],
    ) -> Result<(), String> {
        let (o, _) = self.read_len(src, object, 0, 0).await?;
        let patch = |offset| PushKind::Patch {
            object: object.to_vec(),
            offset,
            size: o.size,
        };
        if !o.exists {
            let kind = PushKind::Remove {
                object: object.to_vec(),
            };
            return self.push(dst, kind, &[]).await;
        }
        self.push(dst, patch(0), &[]).await?;
        for &(start, end) in ranges {
            let (mut at, end) = (start, end.min(o.size));
            while at < end {
                let (_, bytes) = self.read_len(src, object, at, end - at).await?;
                if bytes.is_empty() {
                    break;
                }
                self.push(dst, patch(at), &bytes).await?;
                at += bytes.len() as u64;
            }
        }
        Ok(())
    }

    async fn names(&self, src: &mut End<'_>) -> Result<Vec<Vec<u8>>, String> {
        let mut out = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page: PgNames = match src {
                End::Local => member::list(&self.osd.store, self.pg, after.as_deref())?,
                End::Remote(rpc) => {
                    let l = PgList {
                        epoch: self.epoch,
                        pool: self.pg.pool,
                        pg: self.pg.pg,
                        after: after.clone(),
                    };
                    let f = rpc.call(PG_LIST, PG_NAMES, &encode(&l), &[]).await?;
                    decode("pg names", &f.control).map_err(|e| e.to_string())?
                }
            };
            after = page.names.last().cloned();
            out.extend(page.names);
            if !page.more || after.is_none() {
                return Ok(out);
            }
        }
    }

    /// Brings `dst` to the authority's history as `plan` says, copying from `src`.
    async fn recover(
        &self,
        src: &mut End<'_>,
        dst: &mut End<'_>,
        plan: Plan,
        auth: &PgInfo,
        auth_entries: &[LogEntry],
    ) -> Result<(), String> {
        let (common, objects) = match plan {
            Plan::UpToDate => return Ok(()),
            Plan::Delta { common, objects } => (common, objects.into_iter().collect()),
            Plan::Backfill => {
                let names = self.names(src).await?;
                self.push(dst, PushKind::Reset, &[]).await?;
                (0, names.into_iter().map(|n| (n, Dirty::Whole)).collect())
            }
        };
        let objects: Vec<(Vec<u8>, Dirty)> = objects;
        let rec = &self.osd.recovery;
        let mut pending = rec.plan(objects.len() as u64);
        for (o, dirty) in &objects {
            let step = rec.step();
            match dirty {
                Dirty::Whole => self.copy(src, dst, o).await?,
                Dirty::Ranges(r) => self.patch(src, dst, o, r).await?,
            }
            pending.done_one();
            rec.pace(step).await;
        }
        let entries: Vec<&LogEntry> = auth_entries.iter().filter(|e| e.version > common).collect();
        let kind = PushKind::Log {
            last_version: auth.last_version,
        };
        self.push(dst, kind, &encode(&entries)).await
    }
}

/// Peers `pg` with the acting set `acting` (this OSD first): afterwards every member holds
/// the authoritative history.
pub async fn peer(osd: Arc<Osd>, pg: PgId, acting: Vec<u32>) -> Result<(), String> {
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
    for id in strays {
        match query(&map, pg, id, osd.source).await {
            Ok(m) if m.info.last_version > 0 => stray_members.push(m),
            Ok(_) => {}
            Err(e) => tracing::debug!(pg = %pg, osd = id, error = %e, "stray not asked"),
        }
    }
    for id in acting {
        if id == me {
            let (info, entries) = member::info(&osd.store, pg, 0)?;
            members.push(Member {
                id,
                rpc: None,
                info,
                entries,
            });
            continue;
        }
        members.push(query(&map, pg, id, osd.source).await?);
    }
    let acting_count = members.len();
    members.extend(stray_members);
    let Some(auth_i) = (0..members.len()).max_by_key(|&i| members[i].head()) else {
        return Ok(());
    };
    let auth_info = members[auth_i].info.clone();
    let auth_entries = members[auth_i].entries.clone();
    let auth_id = members[auth_i].id;
    // This OSD first: afterwards it is a source for everyone else.
    let mine = members.iter().position(|m| m.rpc.is_none()).unwrap_or(0);
    let p = plan(
        (&auth_info, &auth_entries),
        (&members[mine].info, &members[mine].entries),
    );
    if p != Plan::UpToDate {
        tracing::info!(pg = %pg, from = auth_id, plan = ?summary(&p), "recovering this OSD's copy");
        let Some(rpc) = members[auth_i].rpc.as_mut() else {
            return Err("the authority is this OSD but its plan is not up to date".into());
        };
        ctx.recover(
            &mut End::Remote(rpc),
            &mut End::Local,
            p,
            &auth_info,
            &auth_entries,
        )
        .await?;
    }
    for m in members[..acting_count]
        .iter_mut()
        .filter(|m| m.rpc.is_some())
    {
        let p = plan((&auth_info, &auth_entries), (&m.info, &m.entries));
        if p == Plan::UpToDate {
            continue;
        }
        tracing::info!(pg = %pg, member = m.id, plan = ?summary(&p), "recovering a member");
        if let Some(rpc) = m.rpc.as_mut() {
            ctx.recover(
                &mut End::Local,
                &mut End::Remote(rpc),
                p,
                &auth_info,
                &auth_entries,
            )
            .await?;
        }
    }
    Ok(())
}

/// Asks member `id` for its info and whole log of `pg`.
async fn query(
    map: &cairn_map::ClusterMap,
    pg: PgId,
    id: u32,
    source: Option<std::net::IpAddr>,
) -> Result<Member, String> {
    let addr = map
        .osds
        .get(&id)
        .map(|o| o.addr.clone())
        .ok_or_else(|| format!("osd.{id} is not in the map"))?;
    let mut rpc = Rpc::connect(&addr, source).await?;
    let q = PgQuery {
        epoch: map.epoch,
        pool: pg.pool,
        pg: pg.pg,
        since: 0,
    };
    let f = rpc.call(PG_QUERY, PG_INFO, &encode(&q), &[]).await?;
    let info: PgInfo = decode("pg info", &f.control).map_err(|e| e.to_string())?;
    let entries: Vec<LogEntry> = decode("pg log entries", &f.data).map_err(|e| e.to_string())?;
    Ok(Member {
        id,
        rpc: Some(rpc),
        info,
        entries,
    })
}

/// A plan for the log: its kind and how many objects.
fn summary(p: &Plan) -> String {
    match p {
        Plan::UpToDate => "up to date".into(),
        Plan::Delta { common, objects } => {
            format!("delta after version {common}: {} objects", objects.len())
        }
        Plan::Backfill => "backfill".into(),
    }
}
