//! Scrub: the primary of a PG compares every object's copies across the acting set and
//! repairs the wrong ones from the authoritative copy.
//!
//! The PG is walked in ranges of object names. For each range every member digests its
//! objects on the PG's shard (`map.rs`: size, CRC-32C of the bytes read from the device and
//! verified against the store's block checksums, of the attributes), so each member's map
//! describes the PG at one version. Client I/O goes on: when the members' versions differ,
//! the objects the primary's log shows written between them are not compared now but again
//! at the end (up to [`BUSY_RETRIES`] times). `compare.rs` picks the authoritative copy. A
//! repair copies it with a guard: the receiver refuses it if a log entry after the version
//! the copy was read at touched the object, so a repair never overwrites a newer write.

pub(crate) mod active;
pub mod compare;
pub mod map;
pub mod stats;

pub use active::BUSY_RETRIES;
use active::{shutting_down, still_active, wait_active};

use crate::context::Osd;
use crate::failure::{FailClass, Failure};
use crate::peering::rpc::Rpc;
use crate::peering::transfer::{Ctx, End};
use crate::pgstate::coll_of;
use cairn_map::PgId;
use cairn_proto::msg::peering::{PgDone, PushKind};
use cairn_proto::msg::scrub::SCRUB_MAP_CALL;
use cairn_proto::msg::scrub::{
    PgScrub, PgScrubMap, ScrubFinding, ScrubReport, MAX_FINDINGS, MAX_SCRUB_OBJECTS,
};
use compare::{CopyState, Verdict};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Scrubs `pg`, of which this OSD must be the primary; repairs when `repair`.
pub async fn scrub_pg(osd: Arc<Osd>, pg: PgId, repair: bool) -> ScrubReport {
    let ec = osd
        .map()
        .pools
        .get(&pg.pool)
        .is_some_and(|p| p.ec().is_some());
    let mut rep = ScrubReport {
        pool: pg.pool,
        pg: pg.pg,
        ..ScrubReport::default()
    };
    let r = if ec {
        crate::ec::scrub::run(&osd, pg, repair, &mut rep).await
    } else {
        run(&osd, pg, repair, &mut rep).await
    };
    if let Err(e) = r {
        tracing::warn!(pg = %pg, class = %e.class, error = %e, "scrub stopped");
        if e.local_store && e.class == FailClass::StoreCorrupt {
            osd.store_corrupt(&e);
        }
        rep.error = Some(format!("{} ({})", e, e.class));
    }
    osd.scrub.note(pg, &rep);
    if rep.inconsistent > 0 {
        tracing::warn!(pg = %pg, inconsistent = rep.inconsistent, repaired = rep.repaired,
            "scrub found inconsistent copies");
    }
    rep
}

/// One member during a scrub: `None` is this OSD.
type Link = Option<Rpc>;

async fn run(osd: &Arc<Osd>, pg: PgId, repair: bool, rep: &mut ScrubReport) -> Result<(), Failure> {
    let (iv, acting) = wait_active(osd, pg).await?;
    rep.acting = acting.clone();
    let map = osd.map();
    let mut links: Vec<Link> = Vec::with_capacity(acting.len());
    for id in &acting {
        if *id == osd.id() {
            links.push(None);
            continue;
        }
        links.push(Some(Rpc::connect_osd(&map, *id, &osd.dialer).await?));
    }
    let ctx = Ctx {
        osd: osd.clone(),
        pg,
        epoch: map.epoch,
    };
    let mut busy = BTreeSet::new();
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let req = PgScrub {
            epoch: ctx.epoch,
            pool: pg.pool,
            pg: pg.pg,
            after: cursor.clone(),
            names: Vec::new(),
        };
        let maps = gather(&ctx, &mut links, &req).await?;
        let end = chunk_end(&maps);
        if end.is_some() && end == cursor {
            return Err(Failure::protocol("a member's scrub map made no progress"));
        }
        let names = names_upto(&maps, end.as_deref());
        busy.extend(check(&ctx, &mut links, &maps, names, repair, rep).await?);
        still_active(osd, pg, &iv)?;
        match end {
            Some(e) => cursor = Some(e),
            None => break,
        }
    }
    for _ in 0..BUSY_RETRIES {
        if busy.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let all: Vec<Vec<u8>> = std::mem::take(&mut busy).into_iter().collect();
        for names in all.chunks(MAX_SCRUB_OBJECTS as usize) {
            let req = PgScrub {
                epoch: ctx.epoch,
                pool: pg.pool,
                pg: pg.pg,
                after: None,
                names: names.to_vec(),
            };
            let maps = gather(&ctx, &mut links, &req).await?;
            let set = names.iter().cloned().collect();
            busy.extend(check(&ctx, &mut links, &maps, set, repair, rep).await?);
            still_active(osd, pg, &iv)?;
        }
    }
    rep.busy = busy.len() as u64;
    Ok(())
}

/// Every member's scrub map for `req`, in acting order.
async fn gather(ctx: &Ctx, links: &mut [Link], req: &PgScrub) -> Result<Vec<PgScrubMap>, Failure> {
    let mut maps = Vec::with_capacity(links.len());
    for link in links.iter_mut() {
        let m = match link {
            None => {
                let pg = ctx.pg;
                crate::shard::with_pg(&ctx.osd, pg, |shard| map::build(&shard.osd.store, pg, req))
                    .ok_or_else(shutting_down)??
            }
            Some(rpc) => rpc.ask(SCRUB_MAP_CALL, req, &[]).await?.0,
        };
        maps.push(m);
    }
    Ok(maps)
}

/// Where this round's range ends: the smallest last name among the maps that were cut
/// short (`None`: every map reached the end of the PG).
fn chunk_end(maps: &[PgScrubMap]) -> Option<Vec<u8>> {
    maps.iter()
        .filter(|m| m.more)
        .filter_map(|m| m.objects.last().map(|e| e.name.clone()))
        .min()
}

/// The names any member listed, up to `end`.
fn names_upto(maps: &[PgScrubMap], end: Option<&[u8]>) -> BTreeSet<Vec<u8>> {
    maps.iter()
        .flat_map(|m| m.objects.iter())
        .map(|e| e.name.clone())
        .filter(|n| end.is_none_or(|end| n.as_slice() <= end))
        .collect()
}

/// Compares the copies of `names`, repairs what is wrong (when `repair`) and returns the
/// names that could not be compared or repaired because clients wrote them meanwhile.
async fn check(
    ctx: &Ctx,
    links: &mut [Link],
    maps: &[PgScrubMap],
    names: BTreeSet<Vec<u8>>,
    repair: bool,
    rep: &mut ScrubReport,
) -> Result<BTreeSet<Vec<u8>>, Failure> {
    let mut busy = written_between(ctx, maps, &names)?;
    if !busy.is_empty() {
        tracing::debug!(pg = %ctx.pg, busy = busy.len(), "scrub: objects written meanwhile, compared later");
    }
    let now: Vec<&Vec<u8>> = names.iter().filter(|n| !busy.contains(*n)).collect();
    for name in now {
        let copies: Vec<CopyState> = maps
            .iter()
            .map(|m| CopyState::of(m.objects.iter().find(|e| &e.name == name)))
            .collect();
        if let Some(CopyState::Good { size, .. }) = copies.first() {
            rep.bytes += size;
        }
        rep.objects += 1;
        let (source, wrong) = match compare::judge(&copies) {
            Verdict::Consistent => continue,
            Verdict::Inconsistent { source, wrong } => (Some(source), wrong),
            Verdict::Lost { wrong } => (None, wrong),
        };
        let mut fixed = vec![false; wrong.len()];
        if let (true, Some(s)) = (repair, source) {
            for (k, (d, _)) in wrong.iter().enumerate() {
                if *d == s || *d >= links.len() || s >= links.len() {
                    continue;
                }
                let (src, dst) = crate::slices::pair(links, s, *d);
                match repair_copy(ctx, &mut end(src), &mut end(dst), name).await? {
                    PgDone::Done => fixed[k] = true,
                    PgDone::Busy => {
                        busy.insert(name.clone());
                    }
                    other @ (PgDone::Stale { .. } | PgDone::Failed { .. }) => {
                        return Err(crate::failure::refused("repairing an object", &other))
                    }
                }
            }
        }
        if busy.contains(name) {
            rep.objects -= 1;
            continue;
        }
        for ((d, detail), repaired) in wrong.into_iter().zip(fixed) {
            rep.inconsistent += 1;
            rep.repaired += u64::from(repaired);
            let osd = rep.acting.get(d).copied().unwrap_or(u32::MAX);
            tracing::warn!(pg = %ctx.pg, object = %String::from_utf8_lossy(name), osd,
                detail = %detail, repaired, "scrub: inconsistent copy");
            if rep.findings.len() < MAX_FINDINGS {
                rep.findings.push(ScrubFinding {
                    object: name.clone(),
                    osd,
                    detail,
                    repaired,
                });
            }
        }
    }
    Ok(busy)
}

/// The objects among `names` a write may have changed between the members' map versions
/// (all of them when the primary's log does not cover that span).
fn written_between(
    ctx: &Ctx,
    maps: &[PgScrubMap],
    names: &BTreeSet<Vec<u8>>,
) -> Result<BTreeSet<Vec<u8>>, Failure> {
    let lo = maps.iter().map(|m| m.version).min().unwrap_or(0);
    let hi = maps.iter().map(|m| m.version).max().unwrap_or(0);
    if lo == hi {
        return Ok(BTreeSet::new());
    }
    let store = &ctx.osd.store;
    let coll = coll_of(ctx.pg);
    let entries = crate::pglog::read_after(store, coll, lo, crate::pglog::LOG_KEEP as usize)?;
    let covered = entries.first().is_some_and(|e| e.version == lo + 1)
        && entries.last().is_some_and(|e| e.version >= hi);
    if !covered {
        return Ok(names.clone());
    }
    Ok(entries
        .into_iter()
        .filter(|e| e.version <= hi && names.contains(&e.object))
        .map(|e| e.object)
        .collect())
}

/// Copies the state of `object` from `src` over `dst`'s, guarded by the version the source
/// read it at.
async fn repair_copy(
    ctx: &Ctx,
    src: &mut End<'_>,
    dst: &mut End<'_>,
    object: &[u8],
) -> Result<PgDone, Failure> {
    let mut offset = 0;
    let mut since = None;
    loop {
        let (o, bytes) = ctx.read(src, object, offset).await?;
        let since = *since.get_or_insert(o.version);
        let n = bytes.len() as u64;
        let kind = if o.exists {
            PushKind::Repair {
                object: object.to_vec(),
                offset,
                size: o.size,
                since,
            }
        } else {
            PushKind::RepairRemove {
                object: object.to_vec(),
                since,
            }
        };
        let done = ctx.push_reply(dst, kind, &bytes).await?;
        offset += n;
        if done != PgDone::Done || !o.exists || n == 0 || offset >= o.size {
            return Ok(done);
        }
    }
}

fn end(link: &mut Link) -> End<'_> {
    match link {
        None => End::Local,
        Some(rpc) => End::Remote(rpc),
    }
}

/// Scrubs (and repairs) every PG this OSD leads, one at a time, each about once per
/// `interval`. The schedule lives in memory: a restart starts it over.
pub async fn periodic(osd: Arc<Osd>, interval: Duration) {
    let mut next = 0usize;
    loop {
        let led = led_pgs(&osd);
        let gap = interval / (led.len().max(1) as u32);
        tokio::time::sleep(gap.max(Duration::from_millis(100))).await;
        if led.is_empty() {
            continue;
        }
        let pg = led[next % led.len()];
        next = next.wrapping_add(1);
        let rep = scrub_pg(osd.clone(), pg, true).await;
        tracing::debug!(pg = %pg, objects = rep.objects, "periodic scrub done");
    }
}

/// The PGs this OSD is the primary of, in pool and PG order.
fn led_pgs(osd: &Arc<Osd>) -> Vec<PgId> {
    let map = osd.map();
    let me = osd.id();
    let mut out = Vec::new();
    for (id, pool) in map.pools.iter().filter(|(_, p)| p.ec().is_none()) {
        for pg in 0..pool.pg_count {
            let pg = PgId { pool: *id, pg };
            if osd.placement(&map, pg).primary() == Some(me) {
                out.push(pg);
            }
        }
    }
    out
}
