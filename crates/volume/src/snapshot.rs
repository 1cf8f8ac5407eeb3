//! `vol snap` commands: create, list, remove (trimming the clones no snapshot reads any more),
//! protect, and roll back (docs/format/volume.md, "Snapshots").
//!
//! A snapshot is created in two steps, each acknowledged by every process that has the volume
//! open (their leases carry the table generation they adopted): first it is announced (readers
//! of older snapshots learn its id, which their reads must look for), then activated (writers
//! preserve data for it from then on). The snapshot holds the volume as it was when each
//! writer adopted the activation: a point in time inside the command, so it is
//! crash-consistent.

use crate::admin::{remove_named, volume_objects};
use crate::error::VolumeError;
use crate::header::{self, check_name, Header};
use crate::holder::{read_snaps, read_snaps_tag};
use crate::join::join_all;
use crate::lease::{LeaseRecord, LEASE_FOR};
use crate::snaps::{clone_object, snaps_object, unneeded_clones, Snap, SnapTable, MAX_SNAPS};
use crate::volume::{read_header, Volume};
use cairn_client::contents_tag;
use cairn_client::{Client, ClientError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a step waits for the volume's holders to acknowledge it: a live holder does
/// within its next poll, a dead one's lease expires within [`LEASE_FOR`].
pub const ACK_WAIT: Duration = Duration::from_secs(LEASE_FOR.as_secs() + 10);
const ACK_POLL: Duration = Duration::from_millis(5);
/// Objects rolled back at once.
const ROLLBACK_PARALLEL: usize = 16;

/// What a snapshot command is doing, for progress output.
pub enum SnapEvent<'a> {
    /// Waiting for these holders to adopt the change.
    Waiting(&'a [LeaseRecord]),
    /// Clones no snapshot reads any more, removed so far of the total.
    Trimmed { done: u64, total: u64 },
    /// Data objects rolled back so far of the total.
    RolledBack { done: u64, total: u64 },
}

/// What `vol snap ls` shows.
#[derive(Debug, Clone)]
pub struct SnapList {
    pub header: Header,
    pub table: SnapTable,
}

/// The volume's header and snapshot table.
pub async fn list_snaps(
    client: &Client,
    pool_name: &str,
    name: &str,
) -> Result<SnapList, VolumeError> {
    check_name(name)?;
    let (_, header, table) = Ctx::load(client, pool_name, name).await?;
    Ok(SnapList { header, table })
}

/// Snapshot `snap` of the volume, which must be readable (active).
pub(crate) async fn find_active(
    client: &Client,
    pool: u32,
    name: &str,
    header: &Header,
    snap: &str,
) -> Result<Snap, VolumeError> {
    let table = read_snaps(client, pool, name, header.id).await?;
    let s = find(&table, name, snap)?;
    if !s.active {
        return Err(snap_error(
            name,
            snap,
            "is being created (or its creation was interrupted: remove it and create it again)",
        ));
    }
    Ok(s.clone())
}

fn find<'a>(table: &'a SnapTable, name: &str, snap: &str) -> Result<&'a Snap, VolumeError> {
    table.find(snap).ok_or_else(|| VolumeError::NoSuchSnap {
        name: name.to_string(),
        snap: snap.to_string(),
    })
}

fn snap_error(name: &str, snap: &str, why: &str) -> VolumeError {
    VolumeError::Snap {
        name: name.to_string(),
        snap: snap.to_string(),
        why: why.to_string(),
    }
}

/// Takes snapshot `snap` of volume `name`, crash-consistent even while it is served.
pub async fn create_snap(
    client: &Client,
    pool_name: &str,
    name: &str,
    snap: &str,
    events: &mut dyn FnMut(SnapEvent<'_>),
) -> Result<Snap, VolumeError> {
    check_name(name)?;
    check_name(snap)?;
    let (ctx, header, mut table) = Ctx::load(client, pool_name, name).await?;
    if header.removing {
        return Err(VolumeError::Removing {
            pool: pool_name.to_string(),
            name: name.to_string(),
        });
    }
    if table.find(snap).is_some() {
        return Err(snap_error(name, snap, "exists already"));
    }
    if table.snaps.len() >= MAX_SNAPS {
        return Err(snap_error(
            name,
            snap,
            &format!("cannot be taken: the volume has {MAX_SNAPS} snapshots, the most it may"),
        ));
    }
    let id = table.seq + 1;
    table.seq = id;
    table.snaps.push(Snap {
        id,
        name: snap.to_string(),
        created: crate::admin::now_secs(),
        size: header.size,
        protected: false,
        active: false,
    });
    ctx.change(&mut table, events).await?;
    if let Some(s) = table.snaps.iter_mut().find(|s| s.id == id) {
        s.active = true;
    }
    ctx.change(&mut table, events).await?;
    find(&table, name, snap).cloned()
}

/// Protects (or unprotects) snapshot `snap`: a protected snapshot cannot be removed.
pub async fn protect_snap(
    client: &Client,
    pool_name: &str,
    name: &str,
    snap: &str,
    protected: bool,
) -> Result<Snap, VolumeError> {
    let (ctx, header, mut table) = Ctx::load(client, pool_name, name).await?;
    let id = find(&table, name, snap)?.id;
    if !protected {
        let clones = crate::clone::children(client, ctx.pool, pool_name, header.id, id).await?;
        if !clones.is_empty() {
            return Err(snap_error(
                name,
                snap,
                &format!(
                    "has clones ({}): `cairn vol flatten` or remove them first",
                    clones.join(", ")
                ),
            ));
        }
    }
    for s in table.snaps.iter_mut().filter(|s| s.name == snap) {
        s.protected = protected;
    }
    table.generation += 1;
    ctx.write(&table).await?;
    find(&table, name, snap).cloned()
}

/// Removes snapshot `snap`, then the clones no remaining snapshot reads (its exclusive data).
/// Processes serving the snapshot close it first. An interrupted trim is finished by the next
/// `vol snap rm` of the volume, or [`trim`].
pub async fn remove_snap(
    client: &Client,
    pool_name: &str,
    name: &str,
    snap: &str,
    events: &mut dyn FnMut(SnapEvent<'_>),
) -> Result<(), VolumeError> {
    let (ctx, _, mut table) = Ctx::load(client, pool_name, name).await?;
    let s = find(&table, name, snap)?.clone();
    if s.protected {
        return Err(snap_error(
            name,
            snap,
            "is protected: `cairn vol snap unprotect` it first",
        ));
    }
    if table.retired.len() >= crate::snaps::MAX_RETIRED {
        return Err(snap_error(
            name,
            snap,
            "cannot be removed now: too many removed snapshots still hold data; run `cairn \
             vol snap trim` first",
        ));
    }
    table.snaps.retain(|t| t.id != s.id);
    if let Err(at) = table.retired.binary_search(&s.id) {
        table.retired.insert(at, s.id);
    }
    ctx.change(&mut table, events).await?;
    ctx.trim(&mut table, events).await
}

/// Removes the clones no snapshot of volume `name` reads any more.
pub async fn trim(
    client: &Client,
    pool_name: &str,
    name: &str,
    events: &mut dyn FnMut(SnapEvent<'_>),
) -> Result<(), VolumeError> {
    let (ctx, _, mut table) = Ctx::load(client, pool_name, name).await?;
    ctx.trim(&mut table, events).await
}

/// Sets volume `name` back to snapshot `snap` (data and size). Refused while the volume is
/// open; newer snapshots are kept (the volume's current data is preserved for them first).
pub async fn rollback_snap(
    client: &Client,
    pool_name: &str,
    name: &str,
    snap: &str,
    events: &mut dyn FnMut(SnapEvent<'_>),
) -> Result<(), VolumeError> {
    let pool = client.pool_id(pool_name)?;
    let header = read_header(client, pool, pool_name, name).await?;
    let s = find_active(client, pool, name, &header, snap).await?;
    let listing = client.list(pool).await?;
    let live = crate::remove::live_leases(client, pool, header.id).await?;
    if !live.is_empty() {
        let records: Vec<LeaseRecord> = live.into_iter().map(|(_, r)| r).collect();
        return Err(VolumeError::Open {
            name: name.to_string(),
            holders: crate::remove::describe_holders(&records),
        });
    }
    let desc = format!("cairn vol snap rollback (pid {})", std::process::id());
    let vol = Volume::open(client.clone(), pool_name, name, &desc).await?;
    let objects = crate::admin::VolumeObjects::of(header.id, &listing);
    let all = objects.all_objnos();
    let total = all.len() as u64;
    let mut done = 0;
    events(SnapEvent::RolledBack { done, total });
    let none = Vec::new();
    for chunk in all.chunks(ROLLBACK_PARALLEL) {
        let rolls = chunk.iter().map(|&n| {
            let clones = objects.clones.get(&n).unwrap_or(&none);
            let vol = &vol;
            async move { vol.gated(|| vol.roll_back_object(n, clones, s.id)).await }
        });
        join_all(rolls.collect())
            .await
            .into_iter()
            .collect::<Result<(), _>>()?;
        done += chunk.len() as u64;
        events(SnapEvent::RolledBack { done, total });
    }
    vol.close().await;
    let mut h = read_header(client, pool, pool_name, name).await?;
    h.size = s.size;
    client
        .write_full(pool, &header::header_object(name), &h.encode())
        .await?;
    Ok(())
}

/// Sets volume `name`'s QoS limits; returns once every process serving it applies them.
pub async fn set_qos(
    client: &Client,
    pool_name: &str,
    name: &str,
    qos: crate::snaps::Qos,
    events: &mut dyn FnMut(SnapEvent<'_>),
) -> Result<(), VolumeError> {
    check_name(name)?;
    let (ctx, _, mut table) = Ctx::load(client, pool_name, name).await?;
    table.qos = qos;
    ctx.change(&mut table, events).await
}

/// Writes volume `id`'s `table`, read with contents tag `tag` (`holder::read_snaps_tag`), as its next
/// generation and waits for every holder to adopt it.
pub(crate) async fn change_table(
    client: &Client,
    (pool, data_pool): (u32, u32),
    name: &str,
    (id, tag): (u64, u64),
    table: &mut SnapTable,
) -> Result<(), VolumeError> {
    let ctx = Ctx {
        client,
        pool,
        data_pool,
        name,
        id,
        tag: AtomicU64::new(tag),
    };
    ctx.change(table, &mut |_| {}).await
}

/// One volume's snapshot table, changed.
struct Ctx<'a> {
    client: &'a Client,
    pool: u32,
    /// Where the volume's data objects and their clones are.
    data_pool: u32,
    name: &'a str,
    id: u64,
    /// Contents tag of the table as this command last read or wrote it: each write is
    /// conditional on it, so two commands changing one volume's table at once cannot lose
    /// each other's change (the second is refused).
    tag: AtomicU64,
}

impl<'a> Ctx<'a> {
    /// Volume `name`'s context, header and snapshot table.
    async fn load(
        client: &'a Client,
        pool_name: &str,
        name: &'a str,
    ) -> Result<(Ctx<'a>, Header, SnapTable), VolumeError> {
        let pool = client.pool_id(pool_name)?;
        let header = read_header(client, pool, pool_name, name).await?;
        let (table, tag) = read_snaps_tag(client, pool, name, header.id).await?;
        let ctx = Ctx {
            client,
            pool,
            data_pool: crate::header::data_pool(pool, &header),
            name,
            id: header.id,
            tag: AtomicU64::new(tag),
        };
        Ok((ctx, header, table))
    }

    /// Writes `table` if no one else changed it since this command read it.
    async fn write(&self, table: &SnapTable) -> Result<(), VolumeError> {
        let bytes = table.encode();
        let expected = self.tag.load(Ordering::Relaxed);
        match self
            .client
            .write_full_if(self.pool, &snaps_object(self.id), expected, &bytes)
            .await
        {
            Ok(()) => {
                self.tag.store(contents_tag(&bytes), Ordering::Relaxed);
                Ok(())
            }
            Err(ClientError::Conflict { .. }) => Err(VolumeError::Conflict {
                name: self.name.to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `table` as its next generation and waits until every holder adopted it.
    async fn change(
        &self,
        table: &mut SnapTable,
        events: &mut dyn FnMut(SnapEvent<'_>),
    ) -> Result<(), VolumeError> {
        table.generation += 1;
        self.write(table).await?;
        self.wait_acked(table.generation, events).await
    }

    async fn wait_acked(
        &self,
        generation: u64,
        events: &mut dyn FnMut(SnapEvent<'_>),
    ) -> Result<(), VolumeError> {
        let mut behind = crate::remove::live_leases(self.client, self.pool, self.id)
            .await?
            .into_iter()
            .filter(|(_, r)| r.acked_gen < generation)
            .collect::<Vec<_>>();
        let start = Instant::now();
        while !behind.is_empty() {
            if start.elapsed() > ACK_WAIT {
                let records: Vec<LeaseRecord> = behind.into_iter().map(|(_, r)| r).collect();
                return Err(VolumeError::Closed {
                    name: self.name.to_string(),
                    why: format!(
                        "{} did not adopt the snapshot change within {} s; stop it and run \
                         this again",
                        crate::remove::describe_holders(&records),
                        ACK_WAIT.as_secs()
                    ),
                });
            }
            let records: Vec<LeaseRecord> = behind.iter().map(|(_, r)| r.clone()).collect();
            events(SnapEvent::Waiting(&records));
            tokio::time::sleep(ACK_POLL).await;
            let mut still = Vec::new();
            for (o, _) in behind {
                if let Some(r) = crate::remove::read_lease(self.client, self.pool, &o).await? {
                    if r.remaining_ms() > 0 && r.acked_gen < generation {
                        still.push((o, r));
                    }
                }
            }
            behind = still;
        }
        Ok(())
    }

    /// Removes the clones no snapshot reads, then forgets retired ids without clones.
    async fn trim(
        &self,
        table: &mut SnapTable,
        events: &mut dyn FnMut(SnapEvent<'_>),
    ) -> Result<(), VolumeError> {
        let objects = volume_objects(self.client, self.data_pool, self.id).await?;
        let live: Vec<u64> = table.snaps.iter().map(|s| s.id).collect();
        let mut doomed = Vec::new();
        let mut kept_ids = std::collections::BTreeSet::<u64>::new();
        for (&objno, ids) in &objects.clones {
            let gone = unneeded_clones(ids, &live);
            kept_ids.extend(ids.iter().filter(|c| !gone.contains(c)));
            doomed.extend(gone.into_iter().map(|c| clone_object(self.id, objno, c)));
        }
        let mut progress = |done, total| events(SnapEvent::Trimmed { done, total });
        remove_named(
            self.client,
            self.data_pool,
            self.name,
            &doomed,
            &mut progress,
        )
        .await?;
        let before = table.retired.len();
        table.retired.retain(|r| kept_ids.contains(r));
        if table.retired.len() != before {
            table.generation += 1;
            self.write(table).await?;
        }
        Ok(())
    }
}
