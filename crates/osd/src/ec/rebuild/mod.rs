//! Rebuilding an EC PG's shards while its primary peers it (docs/format/ec.md, "Peering and
//! rebuild"): `history.rs` picks the version the PG goes on at; here every shard's state of
//! the objects that may differ is asked, and each shard object that is not at that version
//! (behind, or holding a write that is rolled back) is decoded from `k` shards that are and
//! pushed whole; then each such shard takes the authoritative log. Pushes are durable before
//! the log that vouches for them, and a shard object is marked whole only by its last push,
//! so a rebuild cut short at any point is simply done again by the next peering.
//!
//! The PG serves no client op until its rebuild is done; rebuild steps are paced like
//! replicated recovery (`recovery.rs`).

pub mod history;
pub mod member;
pub mod request;

use super::{codec, shard_coll};
use crate::context::Osd;
use crate::failure::{FailClass, Failure};
use crate::peering::rpc::Rpc;
use crate::pglog::{LogEntry, LogOp};
use cairn_map::{ClusterMap, EcProfile, PgId};
use cairn_proto::msg::ec::{EcRead, EcReadReply, EC_READ_CALL};
use cairn_proto::msg::ec_rebuild::{
    EcChecked, EcObjectState, EcPush, EcSetLog, EcStat, EcStatReply, EcStatWhich, EC_PUSH,
    EC_SET_LOG, EC_STAT_CALL, MAX_EC_STAT,
};
use cairn_proto::msg::osd::{FailCode, RepReply, REP_REPLY};
use history::{Plan, ShardLog};
use request::Request;
use std::sync::Arc;

/// Bytes of each shard object read and pushed per step (a multiple of any stripe unit).
const CHUNK: u64 = 1 << 20;

/// One shard that answered, and how to reach it (`None`: this OSD).
pub struct Holder {
    pub log: ShardLog,
    pub rpc: Option<Rpc>,
}

/// What a shard object should be at the PG's rebuilt version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Absent,
    /// Written last by the write of this version.
    Version(u64),
}

/// Shard objects scrub found damaged, by object: the shards to rebuild when the PG peers.
pub use crate::pgstate::EcRepairs as Repairs;

/// Reads, states and pushes of one PG's shards (a rebuild, a scrub).
pub(crate) struct Ctx<'a> {
    osd: &'a Arc<Osd>,
    map: &'a ClusterMap,
    pg: PgId,
    ec: EcProfile,
    profile: cairn_ec::Profile,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(
        osd: &'a Arc<Osd>,
        map: &'a ClusterMap,
        pg: PgId,
        ec: EcProfile,
    ) -> Result<Ctx<'a>, Failure> {
        let profile = ec.check().map_err(|e| {
            Failure::protocol(format!("pool {} has a bad EC profile: {e}", pg.pool))
        })?;
        Ok(Ctx {
            osd,
            map,
            pg,
            ec,
            profile,
        })
    }

    pub(crate) fn profile(&self) -> cairn_ec::Profile {
        self.profile
    }

    pub(crate) fn codec(&self) -> Result<Arc<cairn_ec::Codec>, Failure> {
        codec(self.ec)
            .ok_or_else(|| Failure::protocol(format!("no codec for profile {:?}", self.profile)))
    }
}

/// Brings every shard in `holders` to `plan`, and the shard objects in `repair` (damaged,
/// as scrub found) rebuilt whatever their version; returns the shard objects rebuilt.
pub async fn run(
    osd: &Arc<Osd>,
    map: &ClusterMap,
    pg: PgId,
    ec: EcProfile,
    holders: &mut [Holder],
    plan: &Plan,
    repair: &Repairs,
) -> Result<u64, Failure> {
    let ctx = Ctx::new(osd, map, pg, ec)?;
    let mut dirty = plan.dirty.clone();
    dirty.extend(repair.keys().cloned());
    if plan.backfill() {
        for h in holders.iter_mut() {
            dirty.extend(ctx.list_all(h).await?);
        }
    }
    let objects: Vec<Vec<u8>> = dirty.into_iter().collect();
    let mut states = Vec::with_capacity(holders.len());
    for h in holders.iter_mut() {
        states.push(ctx.stat_all(h, &objects).await?);
    }
    let auth = &holders[plan.auth].log;
    let history: Vec<LogEntry> = auth
        .entries
        .iter()
        .filter(|e| e.version <= plan.version)
        .cloned()
        .collect();
    let mut pending = osd.recovery.plan(objects.len() as u64);
    let mut rebuilt = 0;
    for (j, object) in objects.iter().enumerate() {
        let damaged = repair.get(object);
        let held: Vec<Option<EcObjectState>> = states
            .iter()
            .zip(holders.iter())
            .map(|(s, h)| match s[j] {
                // Damaged: neither a source nor left as it is.
                Some(st) if damaged.is_some_and(|d| d.contains(&h.log.shard)) => {
                    Some(EcObjectState { version: 0, ..st })
                }
                other => other,
            })
            .collect();
        let expect = expected(&history, object, holders, plan, &held).ok_or_else(|| {
            Failure::new(
                FailClass::Unfound,
                format!(
                    "pg {pg}: no shard holds object {:?} as it was before the writes rolled back",
                    String::from_utf8_lossy(object)
                ),
            )
        })?;
        let _slot = osd.recovery.slot().await;
        let step = osd.recovery.step();
        rebuilt += ctx.rebuild_object(holders, object, expect, &held).await?;
        pending.done_one();
        osd.recovery.pace(step).await;
    }
    for (i, h) in holders.iter_mut().enumerate() {
        let history::Step {
            common, up_to_date, ..
        } = plan.shards[i];
        if up_to_date {
            continue;
        }
        let entries: Vec<LogEntry> = history
            .iter()
            .filter(|e| e.version > common)
            .cloned()
            .collect();
        ctx.set_log(h, common, plan.version, entries).await?;
    }
    Ok(rebuilt)
}

/// What `object` should be at `plan.version`: as the authority's log last left it, or (when
/// the log does not name it: only writes rolled back did) as most shards untouched by those
/// writes hold it. `None` when no shard can say.
fn expected(
    history: &[LogEntry],
    object: &[u8],
    holders: &[Holder],
    plan: &Plan,
    held: &[Option<EcObjectState>],
) -> Option<Expect> {
    if let Some(e) = history.iter().rev().find(|e| e.object == object) {
        return Some(match e.op {
            LogOp::Remove => Expect::Absent,
            _ => Expect::Version(e.version),
        });
    }
    let mut votes: Vec<(Expect, usize)> = Vec::new();
    for (i, h) in holders.iter().enumerate() {
        // A shard being backfilled holds what it held before: no vote.
        if plan.shards[i].backfill {
            continue;
        }
        let common = plan.shards[i].common;
        let touched = h
            .log
            .entries
            .iter()
            .any(|e| e.version > common && e.object == object);
        let state = match held[i] {
            None => Expect::Absent,
            Some(s) if s.version > 0 && s.version <= plan.version => Expect::Version(s.version),
            Some(_) => continue,
        };
        if touched {
            continue;
        }
        match votes.iter_mut().find(|(e, _)| *e == state) {
            Some((_, n)) => *n += 1,
            None => votes.push((state, 1)),
        }
    }
    votes.into_iter().max_by_key(|&(_, n)| n).map(|(e, _)| e)
}

impl Ctx<'_> {
    /// The names of every object a holder's shard holds.
    pub(crate) async fn list_all(&self, h: &mut Holder) -> Result<Vec<Vec<u8>>, Failure> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        loop {
            let after = out.last().cloned().unwrap_or_default();
            match self.stat(h, EcStatWhich::After(after)).await? {
                EcStatReply::Listed { names, more } => {
                    let done = !more || names.is_empty();
                    out.extend(names);
                    if done {
                        return Ok(out);
                    }
                }
                other => return Err(self.stat_failed(h, other)),
            }
        }
    }

    /// Asks a holder an `EC_STAT` (its own shard: on its shard thread).
    async fn stat(&self, h: &mut Holder, which: EcStatWhich) -> Result<EcStatReply, Failure> {
        let q = EcStat {
            epoch: self.map.epoch,
            pool: self.pg.pool,
            pg: self.pg.pg,
            shard: h.log.shard,
            which,
        };
        match h.rpc.as_mut() {
            None => {
                let map = self.map;
                crate::shard::with_pg(self.osd, self.pg, |sh| member::stat(sh, map, &q))
                    .ok_or_else(shutting_down)
            }
            Some(rpc) => Ok(rpc
                .ask(EC_STAT_CALL, &q, &[])
                .await
                .map_err(|e| {
                    let f = Failure::from(e);
                    Failure::new(
                        f.class,
                        format!("asking osd.{} for shard states: {f}", h.log.osd),
                    )
                })?
                .0),
        }
    }

    /// The failure an unexpected `EC_STAT` answer stands for.
    fn stat_failed(&self, h: &Holder, r: EcStatReply) -> Failure {
        match r {
            EcStatReply::Stale { epoch } => Failure::stale(format!(
                "osd.{} does not hold shard {} of pg {} at epoch {epoch}",
                h.log.osd, h.log.shard, self.pg
            )),
            EcStatReply::Failed { code, why } => failed(h.log.osd, code, why),
            other => Failure::protocol(format!(
                "osd.{} answered an EC stat with {other:?}",
                h.log.osd
            )),
        }
    }

    /// A holder's check of `objects` read whole from its device, in order.
    pub(crate) async fn verify_all(
        &self,
        h: &mut Holder,
        objects: &[Vec<u8>],
    ) -> Result<Vec<EcChecked>, Failure> {
        let mut out = Vec::with_capacity(objects.len());
        for batch in objects.chunks(MAX_EC_STAT) {
            match self.stat(h, EcStatWhich::Verify(batch.to_vec())).await? {
                EcStatReply::Checked(c) if c.len() == batch.len() => out.extend(c),
                other => return Err(self.stat_failed(h, other)),
            }
        }
        Ok(out)
    }

    /// Every holder's state of `objects`, in order.
    pub(crate) async fn stat_all(
        &self,
        h: &mut Holder,
        objects: &[Vec<u8>],
    ) -> Result<Vec<Option<EcObjectState>>, Failure> {
        let mut out = Vec::with_capacity(objects.len());
        for batch in objects.chunks(MAX_EC_STAT) {
            match self.stat(h, EcStatWhich::Named(batch.to_vec())).await? {
                EcStatReply::States(s) if s.len() == batch.len() => out.extend(s),
                EcStatReply::States(s) => {
                    return Err(Failure::protocol(format!(
                        "osd.{} gave {} object states for {} objects",
                        h.log.osd,
                        s.len(),
                        batch.len()
                    )))
                }
                other => return Err(self.stat_failed(h, other)),
            }
        }
        Ok(out)
    }

    /// Brings `object` to `expect` on every holder that does not have it: decoded from `k`
    /// that do. Returns how many shard objects were written or removed.
    async fn rebuild_object(
        &self,
        holders: &mut [Holder],
        object: &[u8],
        expect: Expect,
        held: &[Option<EcObjectState>],
    ) -> Result<u64, Failure> {
        let version = match expect {
            Expect::Absent => {
                let targets: Vec<usize> =
                    (0..holders.len()).filter(|&i| held[i].is_some()).collect();
                for &t in &targets {
                    self.push(&mut holders[t], object, None, 0, Vec::new(), true)
                        .await?;
                }
                return Ok(targets.len() as u64);
            }
            Expect::Version(v) => v,
        };
        let at_version: Vec<EcObjectState> = held
            .iter()
            .flatten()
            .copied()
            .filter(|s| s.version == version)
            .collect();
        // Shards at the version agree on its size; should one not, most of them win.
        let size = at_version
            .iter()
            .map(|s| s.size)
            .max_by_key(|&size| at_version.iter().filter(|s| s.size == size).count())
            .unwrap_or(0);
        let state = EcObjectState { size, version };
        let (sources, targets): (Vec<usize>, Vec<usize>) =
            (0..holders.len()).partition(|&i| held[i] == Some(state));
        if targets.is_empty() {
            return Ok(0);
        }
        let k = self.profile.k() as usize;
        let sources: Vec<usize> = sources.into_iter().take(k).collect();
        if sources.len() < k {
            return Err(Failure::new(
                FailClass::Unfound,
                format!(
                    "pg {}: object {:?} at version {version} is on {} shards, {k} needed to \
                     rebuild it",
                    self.pg,
                    String::from_utf8_lossy(object),
                    sources.len()
                ),
            ));
        }
        tracing::info!(pg = %self.pg, object = %String::from_utf8_lossy(object), version,
            targets = ?targets.iter().map(|&t| holders[t].log.shard).collect::<Vec<_>>(),
            "rebuilding EC shard objects");
        let p = &self.profile;
        let longest = (0..p.shards())
            .map(|s| cairn_ec::layout::shard_len(p, s, size))
            .max()
            .unwrap_or(0);
        let codec = self.codec()?;
        let mut off = 0;
        loop {
            let len = CHUNK.min(longest - off);
            let mut shards: Vec<Option<Vec<u8>>> = vec![None; p.shards() as usize];
            for &s in &sources {
                let which = usize::from(holders[s].log.shard);
                shards[which] = Some(self.read(&mut holders[s], object, off, len, size).await?);
            }
            codec.reconstruct(&mut shards).map_err(|e| {
                Failure::protocol(format!(
                    "decoding {:?}: {e}",
                    String::from_utf8_lossy(object)
                ))
            })?;
            let last = off + len >= longest;
            for &t in &targets {
                let which = holders[t].log.shard;
                let own = cairn_ec::layout::shard_len(p, u32::from(which), size);
                let mut piece = shards[usize::from(which)].take().unwrap_or_default();
                piece.truncate(own.saturating_sub(off).min(len) as usize);
                self.osd
                    .recovery
                    .bytes
                    .fetch_add(piece.len() as u64, std::sync::atomic::Ordering::Relaxed);
                self.push(&mut holders[t], object, Some(state), off, piece, last)
                    .await?;
            }
            if last {
                break;
            }
            off += len;
        }
        Ok(targets.len() as u64)
    }

    /// `len` bytes at `off` of a source's shard object, which must still be of `size`.
    pub(crate) async fn read(
        &self,
        h: &mut Holder,
        object: &[u8],
        off: u64,
        len: u64,
        size: u64,
    ) -> Result<Vec<u8>, Failure> {
        let req = EcRead {
            epoch: self.map.epoch,
            pool: self.pg.pool,
            pg: self.pg.pg,
            shard: h.log.shard,
            object: object.to_vec(),
            ranges: vec![(off, len as u32)],
        };
        let (r, data) = match h.rpc.as_mut() {
            None => super::member::read_ranges(&self.osd.store, self.pg, &req),
            Some(rpc) => rpc.ask(EC_READ_CALL, &req, &[]).await.map_err(|e| {
                let f = Failure::from(e);
                Failure::new(
                    f.class,
                    format!("reading a shard from osd.{}: {f}", h.log.osd),
                )
            })?,
        };
        match r {
            EcReadReply::Data {
                exists: true,
                size: s,
            } if s == size && data.len() as u64 == len => Ok(data),
            EcReadReply::Data { .. } => Err(Failure::transient(format!(
                "shard {} on osd.{} of {:?} changed while it was read for a rebuild",
                h.log.shard,
                h.log.osd,
                String::from_utf8_lossy(object)
            ))),
            EcReadReply::Stale { epoch } => Err(Failure::stale(format!(
                "osd.{} does not hold shard {} at epoch {epoch}",
                h.log.osd, h.log.shard
            ))),
            EcReadReply::Failed { code, why } => Err(failed(h.log.osd, code, why)),
        }
    }

    async fn push(
        &self,
        h: &mut Holder,
        object: &[u8],
        state: Option<EcObjectState>,
        offset: u64,
        data: Vec<u8>,
        last: bool,
    ) -> Result<(), Failure> {
        let p = EcPush {
            epoch: self.map.epoch,
            pool: self.pg.pool,
            pg: self.pg.pg,
            shard: h.log.shard,
            primary: self.osd.id(),
            object: object.to_vec(),
            state,
            offset,
            last,
        };
        self.send(h, Request::Push(p, data), "an EC push").await
    }

    async fn set_log(
        &self,
        h: &mut Holder,
        from: u64,
        version: u64,
        entries: Vec<LogEntry>,
    ) -> Result<(), Failure> {
        tracing::info!(pg = %self.pg, shard = h.log.shard, osd = h.log.osd, from, version,
            "giving an EC shard the authoritative log");
        let l = EcSetLog {
            epoch: self.map.epoch,
            pool: self.pg.pool,
            pg: self.pg.pg,
            shard: h.log.shard,
            primary: self.osd.id(),
            from,
            version,
        };
        self.send(h, Request::SetLog(l, entries), "an EC log").await
    }

    /// Applies a push or log on a holder: this OSD's own shard on its shard thread, another's
    /// over its session (answered `REP_REPLY`).
    async fn send(&self, h: &mut Holder, req: Request, what: &str) -> Result<(), Failure> {
        let map = self.map;
        let r = match h.rpc.as_mut() {
            None => crate::shard::with_pg(self.osd, self.pg, |sh| member::apply(sh, map, &req))
                .ok_or_else(shutting_down)?,
            Some(rpc) => {
                let (msg_type, control, data) = match &req {
                    Request::Push(p, data) => (EC_PUSH, cairn_proto::msg::encode(p), data.clone()),
                    Request::SetLog(l, entries) => (
                        EC_SET_LOG,
                        cairn_proto::msg::encode(l),
                        cairn_proto::msg::encode(entries),
                    ),
                    Request::Stat(_) => {
                        return Err(Failure::protocol("an EC stat is not a push"));
                    }
                };
                ask_rep(rpc, msg_type, &control, &data, h.log.osd).await?
            }
        };
        done(r, h.log.osd, what)
    }
}

async fn ask_rep(
    rpc: &mut Rpc,
    msg_type: u16,
    control: &[u8],
    data: &[u8],
    osd: u32,
) -> Result<RepReply, Failure> {
    let what = |f: Failure| Failure::new(f.class, format!("rebuilding on osd.{osd}: {f}"));
    let f = rpc
        .call(msg_type, REP_REPLY, control, data)
        .await
        .map_err(|e| what(e.into()))?;
    cairn_proto::msg::decode::<RepReply>("rep reply", &f.control).map_err(|e| what(e.into()))
}

fn done(r: RepReply, osd: u32, what: &str) -> Result<(), Failure> {
    match r {
        RepReply::Done | RepReply::DoneButFull { .. } => Ok(()),
        RepReply::Stale { epoch } => Err(Failure::stale(format!(
            "osd.{osd} refused {what}: its map (epoch {epoch}) has another primary"
        ))),
        RepReply::Gap { have } => Err(Failure::protocol(format!(
            "osd.{osd} answered {what} with a version gap (it has {have})"
        ))),
        RepReply::Failed { code, why } => Err(failed(osd, code, why)),
    }
}

fn failed(osd: u32, code: FailCode, why: String) -> Failure {
    let class = match code {
        FailCode::NoSpace => FailClass::StoreFull,
        FailCode::Device | FailCode::Corrupt => FailClass::StoreCorrupt,
        FailCode::Other => FailClass::Protocol,
    };
    Failure::new(class, format!("osd.{osd}: {why}"))
}

fn shutting_down() -> Failure {
    Failure::transient("the OSD is shutting down (no shard)")
}

/// The log of this OSD's own shard, as peering compares it.
pub fn own_log(osd: &Osd, pg: PgId, shard: u8) -> Result<ShardLog, Failure> {
    let coll = shard_coll(pg, shard);
    let entries = super::shard_entries(&osd.store, coll)?;
    Ok(ShardLog {
        shard,
        osd: osd.id(),
        head: super::shard_version(&osd.store, coll),
        entries,
    })
}
