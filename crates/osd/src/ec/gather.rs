//! Fetching byte ranges of an object's data shards for the primary: from each data shard
//! that is up, and for a shard that is absent or fails, decoded from the same ranges of any
//! k others (a degraded read).

use super::error::GatherError;
use super::error::ShardReadError;
use super::plan::{OldBytes, OldRange};
use super::remote::read_shard;
use crate::context::Osd;
use cairn_ec::Codec;
use cairn_map::PgId;
use cairn_proto::msg::ec::EcRead;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The object and the shards a gather reads.
#[derive(Clone)]
pub struct Source {
    pub osd: Arc<Osd>,
    /// The primary's shard thread (its links to members).
    pub here: usize,
    pub epoch: u64,
    pub pg: PgId,
    pub object: Vec<u8>,
    /// Per shard, its OSD when it is up.
    pub shards: Vec<Option<u32>>,
    pub codec: Arc<Codec>,
}

/// Reads `ranges` (each on one shard) of every shard named, concurrently: per shard, its
/// bytes or why not.
async fn read_many(
    src: &Source,
    ranges: BTreeMap<u32, Vec<(u64, u32)>>,
) -> BTreeMap<u32, Result<Vec<u8>, ShardReadError>> {
    let mut set = tokio::task::JoinSet::new();
    for (shard, rs) in ranges {
        let Some(target) = src.shards.get(shard as usize).copied().flatten() else {
            continue;
        };
        let req = EcRead {
            epoch: src.epoch,
            pool: src.pg.pool,
            pg: src.pg.pg,
            shard: shard as u8,
            object: src.object.clone(),
            ranges: rs,
        };
        let (osd, here) = (src.osd.clone(), src.here);
        set.spawn(async move {
            let r = read_shard(&osd, here, target, req).await;
            (shard, r.map(|(_, _, data)| data))
        });
    }
    let mut out = BTreeMap::new();
    while let Some(done) = set.join_next().await {
        if let Ok((shard, r)) = done {
            out.insert(shard, r);
        }
    }
    out
}

/// Cuts a shard's answer (its ranges back to back) into its ranges.
fn split(ranges: &[(u64, u32)], data: &[u8]) -> Vec<Vec<u8>> {
    let mut at = 0usize;
    ranges
        .iter()
        .map(|&(_, len)| {
            let end = (at + len as usize).min(data.len());
            let piece = data[at.min(end)..end].to_vec();
            at = end;
            piece
        })
        .collect()
}

/// The bytes of every range in `want`.
pub async fn gather(src: &Source, want: &[OldRange]) -> Result<OldBytes, GatherError> {
    let mut by_shard: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
    for r in want {
        by_shard
            .entry(r.shard)
            .or_default()
            .push((r.shard_off, r.len));
    }
    let answers = read_many(src, by_shard.clone()).await;
    let mut out = OldBytes::new();
    let mut lost: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
    let mut last = None;
    for (shard, rs) in by_shard {
        match answers.get(&shard) {
            Some(Ok(data)) => {
                for (&(shard_off, len), bytes) in rs.iter().zip(split(&rs, data)) {
                    let key = OldRange {
                        shard,
                        shard_off,
                        len,
                    };
                    out.insert(key, bytes);
                }
            }
            other => {
                if let Some(Err(e)) = other {
                    tracing::warn!(pg = %src.pg, error = %e, "EC shard read failed; decoding from the others");
                    last = Some(e.clone());
                }
                lost.insert(shard, rs);
            }
        }
    }
    if !lost.is_empty() {
        decode_lost(src, &lost, &mut out, last).await?;
    }
    Ok(out)
}

/// Decodes the ranges of the `lost` data shards from the same ranges of every other shard
/// that is up.
async fn decode_lost(
    src: &Source,
    lost: &BTreeMap<u32, Vec<(u64, u32)>>,
    out: &mut OldBytes,
    mut last: Option<ShardReadError>,
) -> Result<(), GatherError> {
    let p = src.codec.profile();
    let n = p.shards() as usize;
    // Every offset range any lost shard needs, read from each shard not lost.
    let ranges: BTreeSet<(u64, u32)> = lost.values().flatten().copied().collect();
    let ranges: Vec<(u64, u32)> = ranges.into_iter().collect();
    let others: BTreeMap<u32, Vec<(u64, u32)>> = (0..n as u32)
        .filter(|s| !lost.contains_key(s))
        .map(|s| (s, ranges.clone()))
        .collect();
    let answers = read_many(src, others).await;
    let mut got: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    for (shard, r) in answers {
        match r {
            Ok(data) => {
                got.insert(shard, split(&ranges, &data));
            }
            Err(e) => last = Some(e),
        }
    }
    let need = p.k() as usize;
    if got.len() < need {
        return Err(GatherError::TooFew {
            pg: src.pg,
            have: got.len(),
            need,
            last,
        });
    }
    for (i, &(shard_off, len)) in ranges.iter().enumerate() {
        let mut stripe: Vec<Option<Vec<u8>>> = vec![None; n];
        for (&s, pieces) in &got {
            stripe[s as usize] = pieces.get(i).cloned();
        }
        src.codec
            .reconstruct_data(&mut stripe)
            .map_err(|error| GatherError::Decode {
                pg: src.pg,
                shard: lost.keys().next().copied().unwrap_or(0),
                error,
            })?;
        for (&shard, rs) in lost {
            if rs.contains(&(shard_off, len)) {
                let bytes = stripe[shard as usize].take().unwrap_or_default();
                let key = OldRange {
                    shard,
                    shard_off,
                    len,
                };
                out.insert(key, bytes);
            }
        }
    }
    Ok(())
}
