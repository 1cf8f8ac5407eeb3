//! `vol diff` (what changed between two snapshots, or a snapshot and the volume now, for
//! incremental backups) and `vol du` (space used by the volume and each snapshot).
//!
//! Only data objects with a clone taken between the two points can differ (a write after
//! snapshot `a` first clones its object under the then-newest snapshot, an id `>= a`; a
//! clone is trimmed only when a kept one serves the same snapshots). Those objects are read at
//! both points and compared block by block, so the result is exact at [`DIFF_BLOCK`]
//! granularity: the blocks whose bytes differ.

use crate::admin::{volume_objects, VolumeObjects};
use crate::error::VolumeError;
use crate::header::data_object;
use crate::holder::read_snaps;
use crate::join::join_all;
use crate::snaps::{clone_object, unneeded_clones};
use crate::volume::{read_header, Volume};
use cairn_client::{Client, ClientError};

/// Granularity of `vol diff` extents.
pub const DIFF_BLOCK: u64 = 4096;
/// Data objects compared at once.
const DIFF_PARALLEL: usize = 8;

/// A changed byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed {
    pub offset: u64,
    pub len: u64,
}

/// Progress of a diff: data objects compared so far of those that may differ.
pub type DiffProgress<'a> = &'a mut (dyn FnMut(u64, u64) + Send);

/// The blocks of volume `name` that differ between snapshot `from` and snapshot `to` (or the
/// volume as it is now, with `to` = `None`), merged into ascending extents.
pub async fn diff(
    client: &Client,
    pool_name: &str,
    name: &str,
    from: &str,
    to: Option<&str>,
    progress: DiffProgress<'_>,
) -> Result<Vec<Changed>, VolumeError> {
    let desc = format!("cairn vol diff (pid {})", std::process::id());
    let a = Volume::open_snapshot(client.clone(), pool_name, name, from, &desc).await?;
    let b = match to {
        Some(s) => Volume::open_snapshot(client.clone(), pool_name, name, s, &desc).await?,
        None => Volume::open_shared(client.clone(), pool_name, name, &desc).await?,
    };
    let a_id = a.snapshot().map_or(0, |s| s.id);
    let b_id = b.snapshot().map_or(u64::MAX, |s| s.id);
    if a_id >= b_id {
        return Err(VolumeError::BadArgument {
            what: "snapshots",
            why: format!(
                "{from:?} is not older than {:?}",
                to.unwrap_or("the volume")
            ),
        });
    }
    let objects = volume_objects(client, a.data_pool, a.header.id).await?;
    let candidates: Vec<u64> = objects
        .clones
        .iter()
        .filter(|(_, ids)| ids.iter().any(|&c| c >= a_id && c < b_id))
        .map(|(&n, _)| n)
        .collect();
    let total = candidates.len() as u64;
    let mut done = 0;
    progress(done, total);
    let mut out: Vec<Changed> = Vec::new();
    for chunk in candidates.chunks(DIFF_PARALLEL) {
        let compared = join_all(chunk.iter().map(|&n| compare_object(&a, &b, n)).collect()).await;
        for r in compared {
            for c in r? {
                match out.last_mut() {
                    Some(last) if last.offset + last.len == c.offset => last.len += c.len,
                    _ => out.push(c),
                }
            }
        }
        done += chunk.len() as u64;
        progress(done, total);
    }
    a.close().await;
    b.close().await;
    Ok(out)
}

/// The changed blocks of data object `n` between views `a` and `b`.
async fn compare_object(a: &Volume, b: &Volume, n: u64) -> Result<Vec<Changed>, VolumeError> {
    let os = a.object_size();
    let start = n * os;
    let (da, db) = (
        object_bytes(a, start, os).await?,
        object_bytes(b, start, os).await?,
    );
    let len = da.len().max(db.len());
    let mut out = Vec::new();
    let block = DIFF_BLOCK as usize;
    for at in (0..len).step_by(block) {
        let end = (at + block).min(len);
        if block_of(&da, at, end) != block_of(&db, at, end) {
            out.push(Changed {
                offset: start + at as u64,
                len: (end - at) as u64,
            });
        }
    }
    Ok(out)
}

/// Bytes `at..end` of `d`, zeros where `d` is shorter (past a view's end).
fn block_of(d: &[u8], at: usize, end: usize) -> std::borrow::Cow<'_, [u8]> {
    if end <= d.len() {
        return std::borrow::Cow::Borrowed(&d[at..end]);
    }
    let mut v = vec![0u8; end - at];
    if at < d.len() {
        v[..d.len() - at].copy_from_slice(&d[at..]);
    }
    std::borrow::Cow::Owned(v)
}

/// The bytes of the data object at volume offset `start` in view `v` (short at its end).
async fn object_bytes(v: &Volume, start: u64, os: u64) -> Result<Vec<u8>, VolumeError> {
    let size = v.size();
    if start >= size {
        return Ok(Vec::new());
    }
    v.read(start, os.min(size - start)).await
}

/// Space of one snapshot, as `vol du` shows it.
#[derive(Debug, Clone)]
pub struct SnapUsage {
    pub name: String,
    pub id: u64,
    /// Bytes of the clones this snapshot reads (the rest it reads from the volume itself).
    pub clone_bytes: u64,
    /// Bytes only this snapshot reads: what removing it gives back.
    pub exclusive_bytes: u64,
}

/// What `vol du` shows.
#[derive(Debug, Clone)]
pub struct Usage {
    /// Bytes stored in the volume's data objects.
    pub head_bytes: u64,
    /// Bytes stored in all clones.
    pub clone_bytes: u64,
    pub snaps: Vec<SnapUsage>,
}

/// Space used by volume `name` and by each of its snapshots (object sizes, before replication).
pub async fn usage(client: &Client, pool_name: &str, name: &str) -> Result<Usage, VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let header = read_header(client, pool, pool_name, name).await?;
    let table = read_snaps(client, pool, name, header.id).await?;
    let data_pool = crate::header::data_pool(pool, &header);
    let objects = volume_objects(client, data_pool, header.id).await?;
    let heads: Vec<Vec<u8>> = objects
        .heads
        .iter()
        .map(|&n| data_object(header.id, n))
        .collect();
    let head_bytes = sizes(client, data_pool, &heads).await?.iter().sum();
    let clone_names: Vec<(u64, u64)> = clone_list(&objects);
    let names: Vec<Vec<u8>> = clone_names
        .iter()
        .map(|&(n, c)| clone_object(header.id, n, c))
        .collect();
    let clone_sizes = sizes(client, data_pool, &names).await?;
    let by_clone: std::collections::HashMap<(u64, u64), u64> = clone_names
        .iter()
        .copied()
        .zip(clone_sizes.iter().copied())
        .collect();
    let size_of = |n: u64, c: u64| by_clone.get(&(n, c)).copied().unwrap_or(0);
    let live: Vec<u64> = table.snaps.iter().map(|s| s.id).collect();
    let mut snaps = Vec::new();
    for s in &table.snaps {
        let others: Vec<u64> = live.iter().copied().filter(|&t| t != s.id).collect();
        let (mut reads, mut exclusive) = (0, 0);
        for (&n, ids) in &objects.clones {
            if let Some(c) = crate::snaps::clone_for(ids, s.id) {
                reads += size_of(n, c);
            }
            let now = unneeded_clones(ids, &live);
            for c in unneeded_clones(ids, &others) {
                if !now.contains(&c) {
                    exclusive += size_of(n, c);
                }
            }
        }
        snaps.push(SnapUsage {
            name: s.name.clone(),
            id: s.id,
            clone_bytes: reads,
            exclusive_bytes: exclusive,
        });
    }
    Ok(Usage {
        head_bytes,
        clone_bytes: clone_sizes.iter().sum(),
        snaps,
    })
}

/// Every clone as (object number, snapshot id).
fn clone_list(objects: &VolumeObjects) -> Vec<(u64, u64)> {
    objects
        .clones
        .iter()
        .flat_map(|(&n, ids)| ids.iter().map(move |&c| (n, c)))
        .collect()
}

/// Sizes of objects `names` (0 for one removed meanwhile).
async fn sizes(client: &Client, pool: u32, names: &[Vec<u8>]) -> Result<Vec<u64>, VolumeError> {
    let mut out = Vec::with_capacity(names.len());
    for chunk in names.chunks(32) {
        let stats = chunk.iter().map(|o| async move {
            match client.stat(pool, o).await {
                Ok(i) => Ok(i.size),
                Err(ClientError::NoSuchObject { .. }) => Ok(0),
                Err(e) => Err(VolumeError::from(e)),
            }
        });
        for r in join_all(stats.collect()).await {
            out.push(r?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_past_a_short_side_compare_as_zeros() {
        let d = vec![1u8; 10];
        assert_eq!(&*block_of(&d, 0, 4), &[1, 1, 1, 1]);
        assert_eq!(&*block_of(&d, 8, 12), &[1, 1, 0, 0]);
        assert_eq!(&*block_of(&d, 12, 16), &[0, 0, 0, 0]);
    }
}
