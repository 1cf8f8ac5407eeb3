//! Safe removal: a volume that a server has open is not removed under it (its writes would
//! re-create the data objects), and objects that no volume owns can be found and collected.

use crate::admin::{remove_objects, REMOVE_PARALLEL};
use crate::error::VolumeError;
use crate::header::{self, Header, DATA_PREFIX};
use crate::join::join_all;
use crate::lease::{lease_of, LeaseRecord, LEASE_FOR, MAX_LEASE_LEN};
use crate::volume::read_header;
use cairn_client::{Client, ClientError};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How long `--force` waits for servers to close a volume before giving up: a live server
/// closes within the lease's renewal period, a dead one's lease expires within [`LEASE_FOR`].
pub const CLOSE_WAIT: Duration = Duration::from_secs(LEASE_FOR.as_secs() + 30);
const POLL: Duration = Duration::from_millis(300);
/// How long a plain `vol rm` waits for a lease to go before refusing: a server releases it as
/// soon as the volume's last client disconnects.
const RELEASE_GRACE: Duration = Duration::from_secs(3);

/// What a removal is doing, for progress output.
pub enum RemoveEvent<'a> {
    /// Waiting for these servers to close the volume (`--force`).
    Waiting(&'a [LeaseRecord]),
    /// Data objects removed so far, of the total.
    Removed { done: u64, total: u64 },
}

/// Lease objects with their records.
pub(crate) type Leases = Vec<(Vec<u8>, LeaseRecord)>;

/// Removes a volume: its data objects, its leases, then its header. While a server has it
/// open this refuses with the holders named, or with `force` flags the header `close` and
/// waits until every holder closed it (or its lease expired) first, so no write of theirs
/// lands after the data is gone. An interrupted removal leaves the volume flagged `removing`
/// (no one opens it) and listed; running it again finishes it.
pub async fn remove(
    client: &Client,
    pool_name: &str,
    name: &str,
    force: bool,
    events: &mut dyn FnMut(RemoveEvent<'_>),
) -> Result<(), VolumeError> {
    header::check_name(name)?;
    let pool = client.pool_id(pool_name)?;
    let h = read_header(client, pool, pool_name, name).await?;
    let snaps = crate::holder::read_snaps(client, pool, name, h.id).await?;
    if let Some(s) = snaps.snaps.first() {
        return Err(VolumeError::Snap {
            name: name.to_string(),
            snap: s.name.clone(),
            why: format!(
                "and {} other snapshot(s) exist: remove them first (`cairn vol snap ls {name}`, \
                 `cairn vol snap rm {name}@SNAP`)",
                snaps.snaps.len() - 1
            ),
        });
    }
    let flagged = Header {
        removing: true,
        close: h.close || force,
        ..h
    };
    if flagged != h {
        // First the flag, then the leases: a server opening the volume meanwhile writes its
        // lease first and reads the header after, so one of the two sees the other.
        write_header(client, pool, name, &flagged).await?;
    }
    let mut live = live_leases(client, pool, h.id).await?;
    if !live.is_empty() && !force {
        // A client that has just disconnected: its server releases the lease at once.
        live = wait_released(client, pool, live, RELEASE_GRACE, &mut |_| {}).await?;
        if !live.is_empty() {
            if !h.removing {
                write_header(client, pool, name, &h).await?;
            }
            return Err(VolumeError::Open {
                name: name.to_string(),
                holders: describe(&live),
            });
        }
    }
    close_wait(client, pool, name, live, events).await?;
    // Listed again: a server may have created objects until it closed the volume.
    let objects = client.list(pool).await?;
    let dp = header::data_pool(pool, &h);
    let in_data = if dp == pool {
        objects.clone()
    } else {
        client.list(dp).await?
    };
    let data: Vec<u64> = in_data
        .iter()
        .filter_map(|o| header::objno_of(h.id, o))
        .collect();
    let mut progress = |done, total| events(RemoveEvent::Removed { done, total });
    remove_objects(client, dp, name, h.id, &data, &mut progress).await?;
    // Clones left by an interrupted trim (beside the data), the snapshot table, the leases.
    let is_clone = |o: &Vec<u8>| crate::snaps::clone_of(o).is_some_and(|(id, _, _)| id == h.id);
    if dp != pool {
        let clones: Vec<Vec<u8>> = in_data.into_iter().filter(is_clone).collect();
        remove_names(client, dp, &clones).await?;
    }
    let mut rest: Vec<Vec<u8>> = objects
        .into_iter()
        .filter(|o| {
            lease_of(o).is_some_and(|(id, _)| id == h.id)
                || is_clone(o)
                || crate::allocmap::volume_of(o) == Some(h.id)
                || crate::registry::volume_of(o) == Some(h.id)
        })
        .collect();
    rest.push(crate::snaps::snaps_object(h.id));
    remove_names(client, pool, &rest).await?;
    match client.remove(pool, &header::header_object(name)).await {
        Ok(()) | Err(ClientError::NoSuchObject { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The volumes (pool name, volume name) whose data is in pool `pool_name` while their header
/// is in another pool (`vol create --data-pool`), for `pool rm`.
pub async fn data_pool_users(
    client: &Client,
    pool_name: &str,
) -> Result<Vec<(String, String)>, VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let map = client.map();
    let mut out = Vec::new();
    for p in map
        .pools
        .values()
        .filter(|p| p.ec().is_none() && p.id != pool)
    {
        let objects = client.list(p.id).await?;
        for (vol, h) in headers(client, p.id, &p.name, &objects).await? {
            if h.data_pool == Some(pool) {
                out.push((p.name.clone(), vol));
            }
        }
    }
    Ok(out)
}

/// The volumes of a pool that servers have open, with their holders (for `pool rm`).
pub async fn open_volumes(
    client: &Client,
    pool_name: &str,
) -> Result<Vec<(String, Vec<LeaseRecord>)>, VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let objects = client.list(pool).await?;
    let ids: BTreeSet<u64> = objects
        .iter()
        .filter_map(|o| lease_of(o).map(|(id, _)| id))
        .collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (name, h) in headers(client, pool, pool_name, &objects).await? {
        if !ids.contains(&h.id) {
            continue;
        }
        let live = live_leases(client, pool, h.id).await?;
        if !live.is_empty() {
            out.push((name, live.into_iter().map(|(_, r)| r).collect()));
        }
    }
    Ok(out)
}

/// Makes the servers of volume `name` close it (flags it `removing` and `close`) and waits for
/// them; the volume stays flagged (`pool rm --force` removes the pool next).
pub async fn close_for_removal(
    client: &Client,
    pool_name: &str,
    name: &str,
    events: &mut dyn FnMut(RemoveEvent<'_>),
) -> Result<(), VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let h = read_header(client, pool, pool_name, name).await?;
    let flagged = Header {
        removing: true,
        close: true,
        ..h
    };
    if flagged != h {
        write_header(client, pool, name, &flagged).await?;
    }
    let live = live_leases(client, pool, h.id).await?;
    close_wait(client, pool, name, live, events).await
}

/// Objects of volumes that no longer exist, by volume id.
#[derive(Debug, Default)]
pub struct Orphans {
    /// Volume id -> its leftover data and lease objects.
    pub by_id: BTreeMap<u64, Vec<Vec<u8>>>,
    /// Volumes whose removal was interrupted (header flagged `removing`): `vol rm` finishes them.
    pub interrupted: Vec<String>,
}

impl Orphans {
    /// How many objects are orphaned.
    pub fn objects(&self) -> usize {
        self.by_id.values().map(Vec::len).sum()
    }
}

/// Finds data and lease objects whose volume id belongs to no volume header. A damaged header
/// stops the search (its id, so the objects it owns, cannot be known).
pub async fn find_orphans(client: &Client, pool_name: &str) -> Result<Orphans, VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let mut found = Orphans::default();
    for o in client.list(pool).await? {
        let id = data_id(&o)
            .or_else(|| lease_of(&o).map(|(id, _)| id))
            .or_else(|| crate::allocmap::volume_of(&o))
            .or_else(|| crate::registry::volume_of(&o));
        if let Some(id) = id {
            found.by_id.entry(id).or_default().push(o);
        }
    }
    if found.by_id.is_empty() {
        return Ok(found);
    }
    // Headers from a second listing, made after the first: a volume created while the first
    // ran has its header in place before any of its data objects, so it shows here. Every
    // replicated pool's headers count: a volume made with `--data-pool` keeps its header in
    // another pool than its data.
    let map = client.map();
    let mut header_pools: Vec<(u32, String)> = map
        .pools
        .values()
        .filter(|p| p.ec().is_none() || p.id == pool)
        .map(|p| (p.id, p.name.clone()))
        .collect();
    header_pools.sort();
    for (id, name) in header_pools {
        let objects = client.list(id).await?;
        for (vol, h) in headers(client, id, &name, &objects).await? {
            found.by_id.remove(&h.id);
            if h.removing && id == pool {
                found.interrupted.push(vol);
            }
        }
    }
    Ok(found)
}

/// Removes what [`find_orphans`] found, reporting `(done, total)`.
pub async fn remove_orphans(
    client: &Client,
    pool_name: &str,
    orphans: &Orphans,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let all: Vec<Vec<u8>> = orphans.by_id.values().flatten().cloned().collect();
    let total = all.len() as u64;
    progress(0, total);
    let mut done = 0;
    for chunk in all.chunks(REMOVE_PARALLEL) {
        remove_names(client, pool, chunk).await?;
        done += chunk.len() as u64;
        progress(done, total);
    }
    Ok(())
}

/// The volume id of a data object name `vdata.<id>.<objno>`.
fn data_id(object: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(object).ok()?;
    let (id, objno) = s.strip_prefix(DATA_PREFIX)?.split_once('.')?;
    if id.len() != 16 || objno.len() != 16 {
        return None;
    }
    let id = u64::from_str_radix(id, 16).ok()?;
    header::objno_of(id, object).map(|_| id)
}

/// Every volume header among `objects`, read; a damaged one is an error.
async fn headers(
    client: &Client,
    pool: u32,
    pool_name: &str,
    objects: &[Vec<u8>],
) -> Result<Vec<(String, Header)>, VolumeError> {
    let mut out = Vec::new();
    for name in objects.iter().filter_map(|o| header::volume_of_header(o)) {
        match read_header(client, pool, pool_name, name).await {
            Ok(h) => out.push((name.to_string(), h)),
            Err(VolumeError::NoSuchVolume { .. }) => {} // removed meanwhile
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The unexpired leases of volume `id` (its holder registry, `registry.rs`).
pub(crate) async fn live_leases(
    client: &Client,
    pool: u32,
    id: u64,
) -> Result<Leases, VolumeError> {
    let mut live = all_leases(client, pool, id).await?;
    live.retain(|(_, r)| r.remaining_ms() > 0);
    Ok(live)
}

/// Every lease of volume `id`, expired ones too.
pub(crate) async fn all_leases(client: &Client, pool: u32, id: u64) -> Result<Leases, VolumeError> {
    crate::registry::leases(client, pool, &format!("(id {id:016x})"), id).await
}

/// A lease record; `None` once removed. A damaged record counts as expired (its holder
/// rewrites it every few seconds, so damage means no one does).
pub(crate) async fn read_lease(
    client: &Client,
    pool: u32,
    object: &[u8],
) -> Result<Option<LeaseRecord>, VolumeError> {
    match client.read(pool, object, 0, MAX_LEASE_LEN as u64).await {
        Ok(b) => Ok(Some(LeaseRecord::decode(&b).unwrap_or_else(|why| {
            tracing::warn!(object = %String::from_utf8_lossy(object), %why,
                "damaged volume lease; treating it as expired");
            LeaseRecord {
                holder: 0,
                expires_at_ms: 0,
                pid: 0,
                desc: format!("damaged lease ({why})"),
                acked_gen: 0,
                rates: Default::default(),
                writer: false,
            }
        }))),
        Err(ClientError::NoSuchObject { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Waits up to [`CLOSE_WAIT`] until each of `live` is released or expired.
async fn close_wait(
    client: &Client,
    pool: u32,
    name: &str,
    live: Leases,
    events: &mut dyn FnMut(RemoveEvent<'_>),
) -> Result<(), VolumeError> {
    let left = wait_released(client, pool, live, CLOSE_WAIT, events).await?;
    if left.is_empty() {
        return Ok(());
    }
    Err(VolumeError::Closed {
        name: name.to_string(),
        why: format!(
            "not closed after {} s by {}; stop that server, then run this again",
            CLOSE_WAIT.as_secs(),
            describe(&left)
        ),
    })
}

/// Waits up to `limit` until each of `live` is released or expired; returns those that are not.
async fn wait_released(
    client: &Client,
    pool: u32,
    mut live: Leases,
    limit: Duration,
    events: &mut dyn FnMut(RemoveEvent<'_>),
) -> Result<Leases, VolumeError> {
    let start = Instant::now();
    while !live.is_empty() && start.elapsed() < limit {
        let records: Vec<LeaseRecord> = live.iter().map(|(_, r)| r.clone()).collect();
        events(RemoveEvent::Waiting(&records));
        tokio::time::sleep(POLL).await;
        let mut still = Vec::new();
        for (o, _) in live {
            if let Some(r) = read_lease(client, pool, &o).await? {
                if r.remaining_ms() > 0 {
                    still.push((o, r));
                }
            }
        }
        live = still;
    }
    Ok(live)
}

async fn write_header(
    client: &Client,
    pool: u32,
    name: &str,
    h: &Header,
) -> Result<(), VolumeError> {
    client
        .write_full(pool, &header::header_object(name), &h.encode())
        .await?;
    Ok(())
}

async fn remove_names(client: &Client, pool: u32, names: &[Vec<u8>]) -> Result<(), VolumeError> {
    let removes = names.iter().map(|o| async move {
        match client.remove(pool, o).await {
            Ok(()) | Err(ClientError::NoSuchObject { .. }) => Ok(()),
            Err(e) => Err(VolumeError::from(e)),
        }
    });
    join_all(removes.collect()).await.into_iter().collect()
}

/// Holders as people read them: `cairn nbd serve on h, nbd://... (pid 12, lease for 14 s more)`.
pub fn describe_holders(records: &[LeaseRecord]) -> String {
    records
        .iter()
        .map(|r| {
            format!(
                "{} (pid {}, instance {:016x}, lease valid {} s more)",
                r.desc,
                r.pid,
                r.holder,
                r.remaining_ms().div_ceil(1000)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn describe(live: &Leases) -> String {
    let records: Vec<LeaseRecord> = live.iter().map(|(_, r)| r.clone()).collect();
    describe_holders(&records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_ids() {
        let o = header::data_object(0xabc, 7);
        assert_eq!(data_id(&o), Some(0xabc));
        assert_eq!(data_id(b"vdata.0000000000000abc"), None);
        assert_eq!(data_id(b"vdata.xyz.0000000000000007"), None);
        assert_eq!(data_id(b"vol.disk"), None);
    }
}
