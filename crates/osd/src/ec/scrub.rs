//! Scrub of an EC PG (docs/format/ec.md, "Scrub"): every present shard reads each object
//! whole from its device (`EC_STAT` `Verify`): a chunk whose store block fails its checksum is
//! damaged. Then the primary reads the object's shards, and with every shard present the parity of each stripe is checked against its data, and with `m >= 2` a
//! wrong chunk is found by leaving each shard out in turn. An object written while it is read
//! (its version changed on some shard) is read again later. Damaged shard objects are rebuilt
//! from `k` good shards by the PG's next peering (`rebuild/`), and checked again after it.

use super::rebuild::history::ShardLog;
use super::rebuild::{Ctx, Holder, Repairs};
use crate::context::Osd;
use crate::failure::{FailClass, Failure};
use crate::peering::rpc::Rpc;
use crate::scrub::active::{shutting_down, still_active, wait_active, BUSY_RETRIES};
use cairn_map::PgId;
use cairn_proto::msg::ec_rebuild::{EcChecked, EcObjectState, MAX_EC_STAT};
use cairn_proto::msg::scrub::{ScrubFinding, ScrubReport, MAX_FINDINGS};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of each shard object read per step (a multiple of any stripe unit).
const CHUNK: u64 = 1 << 20;

/// A wrong shard object.
struct Finding {
    object: Vec<u8>,
    /// Index in the holders (`None`: the wrong shard cannot be told).
    holder: Option<usize>,
    detail: String,
}

/// Scrubs EC `pg`, of which this OSD must be the primary, into `rep`; repairs when `repair`
/// (`scrub::scrub_pg` reports and counts it).
pub(crate) async fn run(
    osd: &Arc<Osd>,
    pg: PgId,
    repair: bool,
    rep: &mut ScrubReport,
) -> Result<(), Failure> {
    let (iv, acting) = wait_active(osd, pg).await?;
    rep.acting = acting;
    let map = osd.map();
    let ec = map
        .pools
        .get(&pg.pool)
        .and_then(|p| p.ec())
        .ok_or_else(|| Failure::stale(format!("pg {pg} is not erasure-coded")))?;
    let ctx = Ctx::new(osd, &map, pg, ec)?;
    let mut holders = connect(osd, &map, pg).await?;
    let mine = holders
        .iter()
        .position(|h| h.rpc.is_none())
        .ok_or_else(|| Failure::stale(format!("this OSD holds no shard of pg {pg}")))?;
    let names = ctx.list_all(&mut holders[mine]).await?;
    let (mut findings, mut busy) = (Vec::new(), Vec::new());
    for batch in names.chunks(MAX_EC_STAT) {
        check(&ctx, &mut holders, batch, rep, &mut findings, &mut busy).await?;
        still_active(osd, pg, &iv)?;
    }
    for _ in 0..BUSY_RETRIES {
        if busy.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = std::mem::take(&mut busy);
        for batch in again.chunks(MAX_EC_STAT) {
            check(&ctx, &mut holders, batch, rep, &mut findings, &mut busy).await?;
        }
        still_active(osd, pg, &iv)?;
    }
    rep.busy = busy.len() as u64;
    let repairs = repairs_of(&holders, &findings);
    let mut fixed = std::collections::BTreeSet::new();
    if repair && !repairs.is_empty() {
        fixed = repair_now(osd, &ctx, &mut holders, pg, repairs, rep).await?;
    }
    for f in findings {
        rep.inconsistent += 1;
        let repaired = f.holder.is_some() && fixed.contains(&f.object);
        rep.repaired += u64::from(repaired);
        if rep.findings.len() < MAX_FINDINGS {
            let osd = f.holder.map_or(osd.id(), |i| holders[i].log.osd);
            rep.findings.push(ScrubFinding {
                object: f.object,
                osd,
                detail: f.detail,
                repaired,
            });
        }
    }
    Ok(())
}

/// A holder for every present shard of `pg`.
async fn connect(
    osd: &Arc<Osd>,
    map: &cairn_map::ClusterMap,
    pg: PgId,
) -> Result<Vec<Holder>, Failure> {
    let placement = osd.placement(map, pg);
    let mut holders = Vec::new();
    for (i, s) in map.pg_shards(pg, &placement).iter().enumerate() {
        let Some(id) = *s else { continue };
        let rpc = if id == osd.id() {
            None
        } else {
            Some(Rpc::connect_osd(map, id, &osd.dialer).await?)
        };
        let log = ShardLog {
            shard: i as u8,
            osd: id,
            head: 0,
            entries: Vec::new(),
        };
        holders.push(Holder { log, rpc });
    }
    Ok(holders)
}

/// The shard objects to rebuild for `findings` (those whose wrong shard is known).
fn repairs_of(holders: &[Holder], findings: &[Finding]) -> Repairs {
    let mut r = Repairs::new();
    for f in findings {
        if let Some(i) = f.holder {
            r.entry(f.object.clone())
                .or_default()
                .insert(holders[i].log.shard);
        }
    }
    r
}

/// Has the PG peer again with `repairs` rebuilt, waits until it is active, and checks those
/// objects again; returns the objects found whole then.
async fn repair_now(
    osd: &Arc<Osd>,
    ctx: &Ctx<'_>,
    holders: &mut [Holder],
    pg: PgId,
    repairs: Repairs,
    rep: &mut ScrubReport,
) -> Result<std::collections::BTreeSet<Vec<u8>>, Failure> {
    let objects: Vec<Vec<u8>> = repairs.keys().cloned().collect();
    let map = osd.map();
    crate::shard::with_pg(osd, pg, |shard| {
        shard.pg(&map, pg).ec_repair.extend(repairs);
        crate::peering::unpeer(shard, pg);
    })
    .ok_or_else(shutting_down)?;
    wait_active(osd, pg).await?;
    let (before_objects, before_bytes) = (rep.objects, rep.bytes);
    let (mut again, mut busy) = (Vec::new(), Vec::new());
    for batch in objects.chunks(MAX_EC_STAT) {
        check(ctx, holders, batch, rep, &mut again, &mut busy).await?;
    }
    // The check after the repair is not part of the PG's count.
    (rep.objects, rep.bytes) = (before_objects, before_bytes);
    Ok(objects
        .into_iter()
        .filter(|o| !again.iter().any(|f| &f.object == o))
        .collect())
}

/// Checks the objects `names` on every holder. An object whose shards hold different versions,
/// or that changed while it was read, is left in `busy` (written meanwhile).
async fn check(
    ctx: &Ctx<'_>,
    holders: &mut [Holder],
    names: &[Vec<u8>],
    rep: &mut ScrubReport,
    findings: &mut Vec<Finding>,
    busy: &mut Vec<Vec<u8>>,
) -> Result<(), Failure> {
    let mut before = Vec::with_capacity(holders.len());
    let mut checked = Vec::with_capacity(holders.len());
    for h in holders.iter_mut() {
        before.push(ctx.stat_all(h, names).await?);
        checked.push(ctx.verify_all(h, names).await?);
    }
    for (j, name) in names.iter().enumerate() {
        let states: Vec<Option<EcObjectState>> = before.iter().map(|s| s[j]).collect();
        // Shards at different versions: a write in flight (an active PG's shards are brought
        // to one version when it peers), checked again later.
        let Some(common) = agreed(&states) else {
            busy.push(name.clone());
            continue;
        };
        let Some(state) = common else { continue };
        let damaged: Vec<Finding> = checked
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match &c[j] {
                EcChecked::Damaged { why, .. } => Some(Finding {
                    object: name.clone(),
                    holder: Some(i),
                    detail: format!("damaged: shard {}: {why}", holders[i].log.shard),
                }),
                _ => None,
            })
            .collect();
        let (found, bytes) = if damaged.is_empty() {
            check_object(ctx, holders, name, state).await?
        } else {
            (damaged, 0)
        };
        let mut changed = false;
        for h in holders.iter_mut() {
            changed |= ctx.stat_all(h, std::slice::from_ref(name)).await? != [Some(state)];
        }
        if changed {
            busy.push(name.clone());
            continue;
        }
        rep.objects += 1;
        rep.bytes += bytes;
        findings.extend(found);
    }
    Ok(())
}

/// The state every shard holds, if they agree.
fn agreed(states: &[Option<EcObjectState>]) -> Option<Option<EcObjectState>> {
    let first = *states.first()?;
    states.iter().all(|s| *s == first).then_some(first)
}

/// Reads `name` whole from every holder and checks it; returns what is wrong and the bytes
/// read.
async fn check_object(
    ctx: &Ctx<'_>,
    holders: &mut [Holder],
    name: &[u8],
    state: EcObjectState,
) -> Result<(Vec<Finding>, u64), Failure> {
    let p = ctx.profile();
    let codec = ctx.codec()?;
    let longest = (0..p.shards())
        .map(|s| cairn_ec::layout::shard_len(&p, s, state.size))
        .max()
        .unwrap_or(0);
    let complete = holders.len() == p.shards() as usize;
    let mut bad: BTreeMap<usize, String> = BTreeMap::new();
    let mut unknown = Vec::new();
    let (mut off, mut bytes) = (0u64, 0u64);
    while off < longest {
        let len = CHUNK.min(longest - off);
        let mut chunks: Vec<Option<Vec<u8>>> = vec![None; p.shards() as usize];
        for (i, h) in holders.iter_mut().enumerate() {
            if bad.contains_key(&i) {
                continue;
            }
            match ctx.read(h, name, off, len, state.size).await {
                Ok(d) => chunks[usize::from(h.log.shard)] = Some(d),
                Err(f) if f.class == FailClass::StoreCorrupt => {
                    bad.insert(i, format!("damaged: shard {}: {f}", h.log.shard));
                }
                Err(f) => return Err(f),
            }
            bytes += len;
        }
        if complete && bad.is_empty() {
            for (stripe, wrong) in wrong_stripes(&codec, &chunks, p.unit() as usize, off)? {
                let holder = wrong.and_then(|s| holders.iter().position(|h| h.log.shard == s));
                match holder {
                    Some(i) => {
                        let shard = holders[i].log.shard;
                        bad.insert(
                            i,
                            format!(
                                "stripe {stripe}: its chunk on shard {shard} does not match \
                                 the others"
                            ),
                        );
                    }
                    None => unknown.push(format!(
                        "stripe {stripe}: the parity does not match the data, and with {} \
                         parity chunks the wrong one cannot be told",
                        p.m()
                    )),
                }
            }
        }
        off += len;
    }
    let mut found: Vec<Finding> = bad
        .into_iter()
        .map(|(i, detail)| Finding {
            object: name.to_vec(),
            holder: Some(i),
            detail,
        })
        .collect();
    found.extend(unknown.into_iter().take(1).map(|detail| Finding {
        object: name.to_vec(),
        holder: None,
        detail,
    }));
    Ok((found, bytes))
}

/// The stripes of `chunks` (every shard's bytes of one range, starting at shard offset `off`)
/// whose parity does not match, each with the shard found wrong, if one can be.
fn wrong_stripes(
    codec: &cairn_ec::Codec,
    chunks: &[Option<Vec<u8>>],
    unit: usize,
    off: u64,
) -> Result<Vec<(u64, Option<u8>)>, Failure> {
    let codec_err = |e: cairn_ec::codec::EcError| Failure::protocol(format!("scrub decode: {e}"));
    let len = chunks.iter().flatten().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let end = (at + unit).min(len);
        let slices: Vec<&[u8]> = chunks
            .iter()
            .map(|c| c.as_deref().map_or(&[][..], |c| &c[at..end]))
            .collect();
        if !codec.verify(&slices).map_err(codec_err)? {
            let stripe = (off + at as u64) / unit as u64;
            out.push((stripe, odd_one_out(codec, &slices)?));
        }
        at = end;
    }
    Ok(out)
}

/// The one shard that, left out and decoded from the others, makes the stripe consistent
/// (`None` when none or more than one do: with one parity chunk, any would).
fn odd_one_out(codec: &cairn_ec::Codec, slices: &[&[u8]]) -> Result<Option<u8>, Failure> {
    let codec_err = |e: cairn_ec::codec::EcError| Failure::protocol(format!("scrub decode: {e}"));
    if codec.profile().m() < 2 {
        return Ok(None);
    }
    let mut fits = Vec::new();
    for out in 0..slices.len() {
        let mut shards: Vec<Option<Vec<u8>>> = slices.iter().map(|s| Some(s.to_vec())).collect();
        shards[out] = None;
        codec.reconstruct(&mut shards).map_err(codec_err)?;
        let decoded: Vec<&[u8]> = shards.iter().map(|s| s.as_deref().unwrap_or(&[])).collect();
        // Consistent with it decoded, and only because it differs.
        if codec.verify(&decoded).map_err(codec_err)? && decoded[out] != slices[out] {
            fits.push(out as u8);
        }
    }
    Ok(if fits.len() == 1 { fits.pop() } else { None })
}
