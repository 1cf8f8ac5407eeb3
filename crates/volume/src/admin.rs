//! Volume management: create, list, inspect, resize and remove volumes.

use crate::decode_error::DecodeError;
use crate::error::VolumeError;
use crate::header::{self, data_object, Header};
use crate::join::join_all;
use crate::volume::read_header;
use cairn_client::{Client, ClientError};
use std::time::{SystemTime, UNIX_EPOCH};

/// Data objects removed at once by `rm` and `resize`.
pub(crate) const REMOVE_PARALLEL: usize = 32;

/// A volume as `ls` shows it.
#[derive(Debug, Clone)]
pub struct VolumeEntry {
    pub name: String,
    /// The header, or why its bytes do not decode.
    pub header: Result<Header, DecodeError>,
}

/// What `info` shows.
#[derive(Debug, Clone)]
pub struct VolumeInfo {
    pub name: String,
    pub header: Header,
    /// Data objects that exist (thin provisioning: only written ones).
    pub allocated_objects: u64,
    /// Snapshots (of any state).
    pub snapshots: usize,
    /// Clone objects kept for snapshots.
    pub clone_objects: u64,
    /// QoS limits of its own.
    pub qos: crate::snaps::Qos,
    /// The pool's default limits (they apply when it has none of its own).
    pub pool_qos: crate::snaps::Qos,
    /// Processes that have the volume open (live leases).
    pub holders: usize,
    /// Their I/O rates over their last renewal period, summed.
    pub rates: crate::lease::IoRates,
    /// Of a clone not yet flattened: its parent snapshot.
    pub parent: Option<crate::snaps::ParentLink>,
    /// The pool of its data objects, when not its own (`vol create --data-pool`).
    pub data_pool: Option<String>,
}

/// Creates a volume of `size` bytes with data objects of `object_size` bytes.
///
/// Not safe against two creators of the same name at the same instant (the header is checked
/// then written); `cairn vol create` is an operator action, not a race.
/// (Removal is in `remove.rs`: it has to deal with servers that have the volume open.)
pub async fn create(
    client: &Client,
    pool_name: &str,
    name: &str,
    size: u64,
    object_size: u32,
) -> Result<Header, VolumeError> {
    create_with(client, pool_name, name, size, object_size, None).await
}

/// [`create`] with the data objects in pool `data_pool` (e.g. an erasure-coded one) and the
/// header, leases and snapshot table in `pool_name`, which must be replicated.
pub async fn create_with(
    client: &Client,
    pool_name: &str,
    name: &str,
    size: u64,
    object_size: u32,
    data_pool: Option<&str>,
) -> Result<Header, VolumeError> {
    header::check_name(name)?;
    header::check_size(size)?;
    header::check_object_size(object_size)?;
    let pool = client.pool_id(pool_name)?;
    if client
        .map()
        .pools
        .get(&pool)
        .is_some_and(|p| p.ec().is_some())
    {
        return Err(VolumeError::BadArgument {
            what: "pool",
            why: format!(
                "pool {pool_name} is erasure-coded, and a volume's header, leases and snapshot \
                 table need a replicated pool: create the volume in a replicated pool with \
                 `--data-pool {pool_name}`"
            ),
        });
    }
    let data_pool = match data_pool {
        Some(d) => Some(client.pool_id(d)?).filter(|&d| d != pool),
        None => None,
    };
    let obj = header::header_object(name);
    let h = Header {
        id: rand::random(),
        size,
        object_size,
        features: 0,
        created: now_secs(),
        removing: false,
        close: false,
        data_pool,
    };
    // Exclusive: of two creates of one name, one writes the header and the other is told
    // the volume exists (each header carries its own random id, so they never match).
    match client.create(pool, &obj, &h.encode()).await {
        Ok(()) => Ok(h),
        Err(ClientError::Exists { .. }) => Err(VolumeError::Exists {
            pool: pool_name.to_string(),
            name: name.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// All volumes of a pool, sorted by name.
pub async fn list(client: &Client, pool_name: &str) -> Result<Vec<VolumeEntry>, VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let mut names: Vec<String> = client
        .list(pool)
        .await?
        .iter()
        .filter_map(|o| header::volume_of_header(o).map(str::to_string))
        .collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let header = match read_header(client, pool, pool_name, &name).await {
            Ok(h) => Ok(h),
            Err(VolumeError::BadHeader { why, .. }) => Err(why),
            Err(VolumeError::NoSuchVolume { .. }) => continue, // removed meanwhile
            Err(e) => return Err(e),
        };
        out.push(VolumeEntry { name, header });
    }
    Ok(out)
}

/// Wall-clock seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A volume's current I/O: what its holders (the processes that have it open) reported with
/// their last lease renewal, summed.
#[derive(Debug, Clone)]
pub struct VolumeRates {
    pub name: String,
    pub size: u64,
    pub holders: usize,
    pub rates: crate::lease::IoRates,
    /// Bytes of the data objects its allocation map marks (at most that much is used);
    /// `None` for a volume without a map (never opened for writing since it has one).
    pub allocated_bytes: Option<u64>,
}

/// The current I/O rates of every volume of a pool (its volume list, each volume's holder
/// registry and allocation map: no listing of the pool's objects).
pub async fn rates(client: &Client, pool_name: &str) -> Result<Vec<VolumeRates>, VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let mut out = Vec::new();
    for v in list(client, pool_name).await? {
        let Ok(h) = v.header else { continue };
        let live = crate::remove::live_leases(client, pool, h.id).await?;
        let rates = sum_rates(&live);
        let marked = crate::allocmap::load(client, pool, h.id, h.object_count()).await?;
        out.push(VolumeRates {
            name: v.name,
            size: h.size,
            holders: live.len(),
            rates,
            allocated_bytes: marked.map(|m| m.len() as u64 * u64::from(h.object_size)),
        });
    }
    Ok(out)
}

/// The rates of every lease, summed.
fn sum_rates(live: &crate::remove::Leases) -> crate::lease::IoRates {
    let mut rates = crate::lease::IoRates::default();
    for (_, r) in live {
        rates.read_ops += r.rates.read_ops;
        rates.write_ops += r.rates.write_ops;
        rates.read_bytes += r.rates.read_bytes;
        rates.write_bytes += r.rates.write_bytes;
    }
    rates
}

/// A volume's header and how much of it is allocated.
pub async fn info(client: &Client, pool_name: &str, name: &str) -> Result<VolumeInfo, VolumeError> {
    header::check_name(name)?;
    let pool = client.pool_id(pool_name)?;
    let h = read_header(client, pool, pool_name, name).await?;
    let listing = client.list(header::data_pool(pool, &h)).await?;
    let objects = VolumeObjects::of(h.id, &listing);
    let snaps = crate::holder::read_snaps(client, pool, name, h.id).await?;
    let live = crate::remove::live_leases(client, pool, h.id).await?;
    let rates = sum_rates(&live);
    Ok(VolumeInfo {
        name: name.to_string(),
        header: h,
        allocated_objects: objects.heads.len() as u64,
        snapshots: snaps.snaps.len(),
        clone_objects: objects.clones.values().map(|v| v.len() as u64).sum(),
        qos: snaps.qos,
        pool_qos: crate::pool_qos::read(client, pool).await?,
        holders: live.len(),
        rates,
        parent: snaps.parent,
        data_pool: h.data_pool.map(|id| {
            let map = client.map();
            map.pools
                .get(&id)
                .map_or_else(|| format!("pool {id} (removed)"), |p| p.name.clone())
        }),
    })
}

/// Changes a volume's size. Shrinking first removes the data beyond the new end (so a later
/// grow never shows old data), then records the size; an interrupted shrink leaves the old
/// size and can simply be run again.
pub async fn resize(
    client: &Client,
    pool_name: &str,
    name: &str,
    new_size: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Header, VolumeError> {
    header::check_name(name)?;
    header::check_size(new_size)?;
    let pool = client.pool_id(pool_name)?;
    let mut h = read_header(client, pool, pool_name, name).await?;
    if new_size < h.size {
        let t = crate::holder::read_snaps(client, pool, name, h.id).await?;
        let why = if !t.snaps.is_empty() {
            Some("has snapshots, whose data a shrink would take; remove them first")
        } else if t.parent.is_some() {
            // The removed objects would read the parent's data again after a grow.
            Some("is a clone: `cairn vol flatten` it first")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(VolumeError::BadArgument {
                what: "size",
                why: format!("volume {name:?} {why} (or grow it instead)"),
            });
        }
    }
    if new_size < h.size {
        let os = u64::from(h.object_size);
        let first_gone = new_size.div_ceil(os);
        let dp = header::data_pool(pool, &h);
        let doomed: Vec<u64> = data_objects(client, dp, h.id)
            .await?
            .into_iter()
            .filter(|&n| n >= first_gone)
            .collect();
        remove_objects(client, dp, name, h.id, &doomed, progress).await?;
        if !new_size.is_multiple_of(os) {
            let boundary = data_object(h.id, new_size / os);
            match client.stat(dp, &boundary).await {
                Ok(info) if info.size > new_size % os => {
                    client.truncate(dp, &boundary, new_size % os).await?
                }
                Ok(_) | Err(ClientError::NoSuchObject { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    h.size = new_size;
    client
        .write_full(pool, &header::header_object(name), &h.encode())
        .await?;
    Ok(h)
}

/// Removes data objects `objnos` of volume `id`, reporting `(done, total)`.
pub(crate) async fn remove_objects(
    client: &Client,
    pool: u32,
    name: &str,
    id: u64,
    objnos: &[u64],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), VolumeError> {
    let names: Vec<Vec<u8>> = objnos.iter().map(|&n| data_object(id, n)).collect();
    remove_named(client, pool, name, &names, progress).await
}

/// Removes objects `names` of volume `name` (absent ones are fine), [`REMOVE_PARALLEL`] at
/// once, reporting `(done, total)`.
pub(crate) async fn remove_named(
    client: &Client,
    pool: u32,
    name: &str,
    names: &[Vec<u8>],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), VolumeError> {
    let total = names.len() as u64;
    let mut done = 0;
    progress(done, total);
    for chunk in names.chunks(REMOVE_PARALLEL) {
        let removes = chunk.iter().map(|obj| async move {
            match client.remove(pool, obj).await {
                Ok(()) | Err(ClientError::NoSuchObject { .. }) => Ok(()),
                Err(source) => Err(VolumeError::Object {
                    name: name.to_string(),
                    op: "remove",
                    object: String::from_utf8_lossy(obj).into_owned(),
                    source,
                }),
            }
        });
        join_all(removes.collect())
            .await
            .into_iter()
            .collect::<Result<(), _>>()?;
        done += chunk.len() as u64;
        progress(done, total);
    }
    Ok(())
}

/// A volume's objects in a pool listing: head data objects and clones.
#[derive(Debug, Default)]
pub(crate) struct VolumeObjects {
    /// Object numbers of the head data objects, sorted.
    pub heads: Vec<u64>,
    /// Clone snapshot ids (ascending) by object number.
    pub clones: std::collections::BTreeMap<u64, Vec<u64>>,
}

impl VolumeObjects {
    /// Every object number with a head or a clone, sorted.
    pub fn all_objnos(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.heads.clone();
        v.extend(self.clones.keys());
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Sorts out volume `id`'s objects in a pool listing.
    pub fn of(id: u64, listing: &[Vec<u8>]) -> VolumeObjects {
        let mut out = VolumeObjects::default();
        for o in listing {
            if let Some(n) = header::objno_of(id, o) {
                out.heads.push(n);
            } else if let Some((of, n, snap)) = crate::snaps::clone_of(o) {
                if of == id {
                    out.clones.entry(n).or_default().push(snap);
                }
            }
        }
        out.heads.sort_unstable();
        for ids in out.clones.values_mut() {
            ids.sort_unstable();
        }
        out
    }
}

/// Volume `id`'s head data objects and clones.
pub(crate) async fn volume_objects(
    client: &Client,
    pool: u32,
    id: u64,
) -> Result<VolumeObjects, VolumeError> {
    Ok(VolumeObjects::of(id, &client.list(pool).await?))
}

/// The object numbers of volume `id`'s existing data objects, sorted.
pub(crate) async fn data_objects(
    client: &Client,
    pool: u32,
    id: u64,
) -> Result<Vec<u64>, VolumeError> {
    let mut v: Vec<u64> = client
        .list(pool)
        .await?
        .iter()
        .filter_map(|o| header::objno_of(id, o))
        .collect();
    v.sort_unstable();
    Ok(v)
}
