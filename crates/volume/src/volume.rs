//! An open volume: byte-range I/O split over its data objects.

use crate::error::VolumeError;
use crate::header::{self, data_object, Header, HEADER_LEN_V2};
use crate::holder::{HeldLease, Mode};
use crate::join::join_all;
use crate::layout::{pieces, Piece};
use crate::lease::LAPSE_PATIENCE;
use crate::objmap::ObjectMap;
use crate::snaps::Snap;
use cairn_client::{Bytes, Client, ClientError};
use cairn_failstop::LockOrDie;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Objects zeroed or removed at once by one request.
const ZERO_PARALLEL: usize = 32;

/// One run of a volume's allocation map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub len: u64,
    /// Whether data objects back the range (it may still read as zeros).
    pub allocated: bool,
}

/// A write's bytes as the volume got them: borrowed from the caller, or a shared buffer that
/// each object's part is a slice of (no copy).
#[derive(Clone, Copy)]
enum WriteData<'a> {
    Slice(&'a [u8]),
    Shared(&'a Bytes),
}

impl WriteData<'_> {
    fn len(&self) -> usize {
        match self {
            WriteData::Slice(d) => d.len(),
            WriteData::Shared(b) => b.len(),
        }
    }
}

/// An open volume. Share it (in an `Arc`) between all users in one process: its object map is
/// exact only while this process is the volume's one writer.
pub struct Volume {
    pub(crate) client: Client,
    /// The pool of the header, leases, snapshot table and allocation map.
    pub(crate) pool: u32,
    /// The pool of the data objects and their snapshot clones (`pool` unless the volume was
    /// made with `--data-pool`).
    pub(crate) data_pool: u32,
    pool_name: String,
    pub(crate) name: String,
    pub(crate) header: Header,
    size: AtomicU64,
    pub(crate) map: ObjectMap,
    /// The open lease: every I/O passes it, and it closes the volume when `vol rm` asks.
    pub(crate) lease: HeldLease,
    /// The snapshot this is a read-only view of (`None`: the volume itself).
    pub(crate) snap: Option<Snap>,
    /// Of a snapshot view: the clone each data object's reads use, once found (`cow.rs`).
    pub(crate) resolved: Mutex<HashMap<u64, u64>>,
    /// The volume's QoS limits, as this process enforces them (`qos.rs`).
    limiter: crate::qos::Limiter,
    /// Requests the QoS limits delayed, and the microseconds they waited in all.
    throttled: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
    /// Of a clone: the parent snapshot, open read-only (`clone.rs`).
    pub(crate) parent: Option<Box<Volume>>,
    /// Whether a data object absent from the object map is known absent. Not in a clone: its
    /// flattening (another process) creates objects this one never sees.
    trust_map: bool,
    /// Whether this process keeps the persisted allocation map (`allocmap.rs`): the writer
    /// of a volume that is not a clone.
    alloc: bool,
    /// One write of each allocation-map shard at a time (writers of new objects in one shard
    /// wait for it, and find their bit written by it).
    alloc_locks: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
    /// How this process holds the volume.
    mode: Mode,
}

/// Most levels of clones of clones a volume may be opened through.
pub(crate) const MAX_CLONE_DEPTH: usize = 16;

impl Volume {
    /// Opens a volume: reads its header, takes an open lease (docs/format/volume.md) that
    /// names this process as `holder` (for `vol rm` to show), and lists its data objects.
    /// A volume being removed does not open.
    pub async fn open(
        client: Client,
        pool_name: &str,
        name: &str,
        holder: &str,
    ) -> Result<Volume, VolumeError> {
        Self::open_view(client, pool_name, name, None, holder, Mode::Writer, 0).await
    }

    /// Opens a volume beside its writer, if any (no exclusive lease): for reading it, or for
    /// copying into it only what is missing (`vol flatten`).
    pub async fn open_shared(
        client: Client,
        pool_name: &str,
        name: &str,
        holder: &str,
    ) -> Result<Volume, VolumeError> {
        Self::open_view(client, pool_name, name, None, holder, Mode::Shared, 0).await
    }

    /// Opens snapshot `snap` of a volume, read-only: reads see the volume as it was when the
    /// snapshot was taken, while the volume itself goes on changing.
    pub async fn open_snapshot(
        client: Client,
        pool_name: &str,
        name: &str,
        snap: &str,
        holder: &str,
    ) -> Result<Volume, VolumeError> {
        Self::open_view(client, pool_name, name, Some(snap), holder, Mode::Shared, 0).await
    }

    async fn open_view(
        client: Client,
        pool_name: &str,
        name: &str,
        snap_name: Option<&str>,
        holder: &str,
        mode: Mode,
        depth: usize,
    ) -> Result<Volume, VolumeError> {
        header::check_name(name)?;
        // Each open is its own client instance (its lease's holder id): a takeover fences
        // this open, not the other volumes its process serves.
        let client = client.with_instance(cairn_client::new_instance());
        let pool = client.pool_id(pool_name)?;
        let header = read_header(&client, pool, pool_name, name).await?;
        if header.removing {
            return Err(VolumeError::Removing {
                pool: pool_name.to_string(),
                name: name.to_string(),
            });
        }
        let snap = match snap_name {
            Some(s) => Some(crate::snapshot::find_active(&client, pool, name, &header, s).await?),
            None => None,
        };
        let mode = match &snap {
            Some(s) => Mode::Snapshot(s.id),
            None => mode,
        };
        let lease =
            HeldLease::acquire(&client, pool, pool_name, name, header, holder, mode).await?;
        let size = snap.as_ref().map_or(header.size, |s| s.size);
        let link = lease.snaps().table.parent.clone();
        // The writer of a volume that is not a clone keeps the persisted allocation map (a
        // clone's flatten, another process, creates objects this one never sees).
        let alloc = mode == Mode::Writer && link.is_none();
        let map = if alloc {
            Self::load_alloc(&client, pool, &header).await?
        } else {
            let data_pool = crate::header::data_pool(pool, &header);
            let objects = crate::admin::volume_objects(&client, data_pool, header.id).await?;
            ObjectMap::new(match &snap {
                // A snapshot's data is in the head objects or in clones.
                Some(_) => objects.all_objnos(),
                None => objects.heads,
            })
        };
        let parent = match link {
            Some(_) if depth >= MAX_CLONE_DEPTH => {
                return Err(VolumeError::CloneTooDeep {
                    name: name.to_string(),
                })
            }
            Some(l) => {
                let c = client.clone();
                let v = Box::pin(Self::open_view(
                    c,
                    pool_name,
                    &l.volume,
                    Some(&l.snap),
                    holder,
                    Mode::Shared,
                    depth + 1,
                ))
                .await?;
                if v.header.id != l.volume_id {
                    return Err(VolumeError::ParentReplaced {
                        name: name.to_string(),
                        parent: l.volume.clone(),
                    });
                }
                Some(Box::new(v))
            }
            None => None,
        };
        Ok(Volume {
            client,
            pool,
            data_pool: crate::header::data_pool(pool, &header),
            pool_name: pool_name.to_string(),
            name: name.to_string(),
            header,
            size: AtomicU64::new(size),
            map,
            alloc,
            alloc_locks: Mutex::default(),
            lease,
            snap,
            resolved: Mutex::default(),
            limiter: crate::qos::Limiter::default(),
            throttled: Default::default(),
            trust_map: parent.is_none(),
            mode,
            parent,
        })
    }

    /// The persisted allocation map of volume `header`, or, for a volume without one (made
    /// before it, or damaged), the pool listed once and the map written from it.
    async fn load_alloc(
        client: &Client,
        pool: u32,
        header: &Header,
    ) -> Result<ObjectMap, VolumeError> {
        let objects = header.size.div_ceil(u64::from(header.object_size));
        if let Some(set) = crate::allocmap::load(client, pool, header.id, objects).await? {
            return Ok(ObjectMap::persisted(set));
        }
        let data_pool = crate::header::data_pool(pool, header);
        let listed = crate::admin::volume_objects(client, data_pool, header.id).await?;
        let set: BTreeSet<u64> = listed.heads.into_iter().collect();
        crate::allocmap::store_all(client, pool, header.id, objects, &set).await?;
        Ok(ObjectMap::persisted(set))
    }

    /// Called before a write that may create data object `objno` is sent: with a persisted
    /// allocation map, the object is marked there first (durably), so an open after a crash
    /// finds every object that exists.
    pub(crate) async fn note_writing(&self, objno: u64) -> Result<(), VolumeError> {
        if !self.map.writing(objno) || !self.alloc {
            return Ok(());
        }
        let shard = crate::allocmap::shard_of(objno);
        let lock = self.alloc_lock(shard);
        let _one_writer = lock.lock().await;
        if self.map.is_persisted(objno) {
            return Ok(()); // a write of the shard while this one waited marked it
        }
        self.persist_shard(shard)
            .await
            .map_err(|e| self.object_error("mark in the allocation map", objno, e))
    }

    /// The lock that keeps writes of allocation-map shard `shard` one at a time.
    fn alloc_lock(&self, shard: u64) -> Arc<tokio::sync::Mutex<()>> {
        self.alloc_locks
            .lock_or_die()
            .entry(shard)
            .or_default()
            .clone()
    }

    /// Writes allocation-map shard `shard` from this process's map (the caller holds the
    /// shard's lock).
    async fn persist_shard(&self, shard: u64) -> Result<(), ClientError> {
        let members = self.map.shard_to_persist(shard);
        crate::allocmap::store(&self.client, self.pool, self.header.id, shard, &members).await?;
        self.map.shard_persisted(shard, &members);
        Ok(())
    }

    /// Clears the bits of removed objects from the persisted allocation map (at close; a
    /// crash before leaves bits that only cost a read answered "no such object").
    async fn tidy_alloc(&self) {
        if !self.alloc {
            return;
        }
        for shard in self.map.stale_shards() {
            let lock = self.alloc_lock(shard);
            let _one_writer = lock.lock().await;
            if let Err(e) = self.persist_shard(shard).await {
                tracing::warn!(volume = %self.name, shard, error = %e,
                    "could not clear removed objects from the allocation map");
            }
        }
    }

    /// The snapshot this is a view of, if it is one.
    pub fn snapshot(&self) -> Option<&Snap> {
        self.snap.as_ref()
    }

    /// Closes the volume: waits for in-flight I/O, then releases the lease; later I/O fails.
    /// (Dropping the volume does the same in the background.)
    pub async fn close(&self) {
        self.tidy_alloc().await;
        self.lease.close().await;
        if let Some(p) = &self.parent {
            Box::pin(p.close()).await;
        }
    }

    /// Turns true once the volume is closed and its lease released, also when that happens
    /// in the background after the volume was dropped (so a server can wait for it at exit).
    pub fn released(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lease.released()
    }

    /// Runs one I/O under the lease: refused once the volume is closed, and dropped if the
    /// lease lapses meanwhile (no write of this process may land after `vol rm` saw the lease
    /// expire), then run again once it is renewed; I/O is idempotent, so a dropped attempt
    /// that did land is harmless.
    pub(crate) async fn gated<T, F>(&self, io: impl Fn() -> F) -> Result<T, VolumeError>
    where
        F: std::future::Future<Output = Result<T, VolumeError>>,
    {
        let give_up = tokio::time::Instant::now() + LAPSE_PATIENCE;
        loop {
            let mut permit = self.lease.enter(give_up).await?;
            tokio::select! {
                r = io() => return r,
                () = permit.lapsed() => tracing::warn!(volume = %self.name,
                    "open lease lapsed during an I/O; it is sent again once the lease is renewed"),
            }
        }
    }

    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The header read at open (its size may have changed since: see [`Volume::size`]).
    pub fn header(&self) -> Header {
        self.header
    }

    /// Current size in bytes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Takes a new size from a re-read header (after `cairn vol resize`); a snapshot's size
    /// never changes.
    pub fn set_size(&self, size: u64) {
        if self.snap.is_none() {
            self.size.store(size, Ordering::Relaxed);
        }
    }

    /// How many data objects exist.
    pub fn allocated_objects(&self) -> usize {
        self.map.len()
    }

    fn check_writable(&self) -> Result<(), VolumeError> {
        let why = match (&self.snap, self.mode) {
            (Some(s), _) => format!("this is snapshot {:?}", s.name),
            (None, Mode::Writer) => return Ok(()),
            (None, _) => "it was opened beside its writer, to read".into(),
        };
        Err(VolumeError::ReadOnly {
            name: self.name.clone(),
            why,
        })
    }

    /// Whether this process may write the volume (it holds the writer's lease).
    pub fn writable(&self) -> bool {
        self.check_writable().is_ok()
    }

    pub(crate) fn object_size(&self) -> u64 {
        u64::from(self.header.object_size)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        let size = self.size();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(VolumeError::OutOfRange {
                name: self.name.clone(),
                offset,
                len,
                size,
            }),
        }
    }

    pub(crate) fn object_error(
        &self,
        op: &'static str,
        objno: u64,
        source: ClientError,
    ) -> VolumeError {
        VolumeError::Object {
            name: self.name.clone(),
            op,
            object: String::from_utf8_lossy(&data_object(self.header.id, objno)).into_owned(),
            source,
        }
    }

    /// Reads `len` bytes at `offset`; never-written ranges read as zeros.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, VolumeError> {
        self.throttle(len).await;
        let data = self.gated(|| self.read_ungated(offset, len)).await?;
        self.lease.count(false, len);
        Ok(data)
    }

    /// Waits as the volume's QoS limits ask for a request of `bytes`.
    async fn throttle(&self, bytes: u64) {
        let wait = self.limiter.admit(&self.lease.qos(), bytes);
        if !wait.is_zero() {
            use std::sync::atomic::Ordering::Relaxed;
            self.throttled.0.fetch_add(1, Relaxed);
            let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
            self.throttled.1.fetch_add(us, Relaxed);
            tokio::time::sleep(wait).await;
        }
    }

    /// Requests the volume's QoS limits delayed since it was opened, and how long they
    /// waited in all.
    pub fn throttled(&self) -> (u64, std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let us = self.throttled.1.load(Relaxed);
        (
            self.throttled.0.load(Relaxed),
            std::time::Duration::from_micros(us),
        )
    }

    async fn read_ungated(&self, offset: u64, len: u64) -> Result<Vec<u8>, VolumeError> {
        self.check_range(offset, len)?;
        let ps = pieces(self.object_size(), offset, len);
        if let [p] = ps[..] {
            // Within one object, the reply from the OSD is the result: zero-filled past where
            // the object ends, not copied into a zeroed buffer (a memset and a copy of every
            // byte read, 1 MiB for each 1 MiB read).
            let mut d = self.read_piece(p).await?.unwrap_or_default();
            d.resize(len as usize, 0);
            return Ok(d);
        }
        let mut out = vec![0u8; len as usize];
        let reads = join_all(ps.iter().map(|&p| self.read_piece(p)).collect()).await;
        for (p, r) in ps.iter().zip(reads) {
            if let Some(d) = r? {
                let at = p.at as usize;
                out[at..at + d.len()].copy_from_slice(&d);
            }
        }
        Ok(out)
    }

    /// The piece's bytes as stored (short where the object is), or `None` for a hole.
    async fn read_piece(&self, p: Piece) -> Result<Option<Vec<u8>>, VolumeError> {
        if self.trust_map && !self.map.may_exist(p.objno) {
            return Ok(None);
        }
        if let Some(snap) = &self.snap {
            return self.read_snap_piece(snap.id, p).await;
        }
        self.read_head(p).await
    }

    /// The piece's bytes in the head object (what the volume holds now).
    pub(crate) async fn read_head(&self, p: Piece) -> Result<Option<Vec<u8>>, VolumeError> {
        let name = data_object(self.header.id, p.objno);
        match self
            .client
            .read(self.data_pool, &name, p.offset, p.len)
            .await
        {
            Ok(mut d) => {
                d.truncate(p.len as usize);
                Ok(Some(d))
            }
            Err(ClientError::NoSuchObject { .. }) => self.read_parent(p).await,
            Err(e) => Err(self.object_error("read", p.objno, e)),
        }
    }

    /// Writes `data` at `offset`. Durable at the pool's durability level when it returns.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<(), VolumeError> {
        self.write_data(offset, WriteData::Slice(data)).await
    }

    /// [`Volume::write`] of a shared buffer: each object's part of it is a slice of the same
    /// buffer, which a connection holds instead of copying when the write has to wait.
    pub async fn write_shared(&self, offset: u64, data: &Bytes) -> Result<(), VolumeError> {
        self.write_data(offset, WriteData::Shared(data)).await
    }

    async fn write_data(&self, offset: u64, data: WriteData<'_>) -> Result<(), VolumeError> {
        let len = data.len() as u64;
        self.throttle(len).await;
        self.gated(|| self.write_ungated(offset, data)).await?;
        self.lease.count(true, len);
        Ok(())
    }

    async fn write_ungated(&self, offset: u64, data: WriteData<'_>) -> Result<(), VolumeError> {
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        let ps = pieces(self.object_size(), offset, data.len() as u64);
        let write = |p: Piece| async move {
            self.preserve(p.objno).await?;
            self.copy_up(p.objno).await?;
            self.note_writing(p.objno).await?;
            let name = data_object(self.header.id, p.objno);
            let range = p.at as usize..(p.at + p.len) as usize;
            let (pool, at) = (self.data_pool, p.offset);
            let written = match data {
                WriteData::Slice(d) => self.client.write(pool, &name, at, &d[range]).await,
                WriteData::Shared(b) => {
                    let part = b.slice(range);
                    self.client.write_shared(pool, &name, at, &part).await
                }
            };
            written
                .map(|_| ())
                .map_err(|e| self.object_error("write", p.objno, e))
        };
        if let [p] = ps[..] {
            return write(p).await;
        }
        join_all(ps.into_iter().map(write).collect())
            .await
            .into_iter()
            .collect()
    }

    /// Makes a range read as zeros. With `punch`, whole data objects in it are removed (the
    /// space is freed); without, every object in the range is kept or created (allocated).
    pub async fn zero(&self, offset: u64, len: u64, punch: bool) -> Result<(), VolumeError> {
        self.throttle(0).await;
        self.gated(|| self.zero_ungated(offset, len, punch)).await?;
        self.lease.count(true, 0);
        Ok(())
    }

    async fn zero_ungated(&self, offset: u64, len: u64, punch: bool) -> Result<(), VolumeError> {
        self.check_writable()?;
        self.check_range(offset, len)?;
        // Bounded concurrency: a discard of a whole disk spans thousands of objects.
        for chunk in pieces(self.object_size(), offset, len).chunks(ZERO_PARALLEL) {
            let results = join_all(chunk.iter().map(|&p| self.zero_piece(p, punch)).collect());
            results.await.into_iter().collect::<Result<(), _>>()?;
        }
        Ok(())
    }

    async fn zero_piece(&self, p: Piece, punch: bool) -> Result<(), VolumeError> {
        let name = data_object(self.header.id, p.objno);
        let whole = punch && p.is_whole_object(self.object_size(), self.size());
        if self.parent_covers(p.objno) {
            self.preserve(p.objno).await?;
            // A clone's missing object reads its parent's: punched, it must be kept, empty.
            self.note_writing(p.objno).await?;
            let r = if whole {
                self.client
                    .write_full(self.data_pool, &name, &[])
                    .await
                    .map(|_| ())
            } else {
                self.copy_up(p.objno).await?;
                self.client
                    .zero(self.data_pool, &name, p.offset, p.len)
                    .await
            };
            return r
                .map(|_| ())
                .map_err(|e| self.object_error("zero", p.objno, e));
        }
        if whole {
            if !self.map.may_exist(p.objno) {
                return Ok(());
            }
            self.preserve(p.objno).await?;
            let token = self.map.removing(p.objno);
            return match self.client.remove(self.data_pool, &name).await {
                Ok(()) | Err(ClientError::NoSuchObject { .. }) => {
                    self.map.removed(token);
                    Ok(())
                }
                Err(e) => {
                    self.map.remove_failed(token);
                    Err(self.object_error("remove", p.objno, e))
                }
            };
        }
        if self.map.may_exist(p.objno) {
            self.preserve(p.objno).await?;
            return self
                .client
                .zero(self.data_pool, &name, p.offset, p.len)
                .await
                .map_err(|e| self.object_error("zero", p.objno, e));
        }
        if punch {
            return Ok(()); // a hole already reads as zeros
        }
        // Allocating zeros where nothing exists: one zero byte at the range's end creates the
        // object, sparse, reading as zeros up to there (no buffer of the range's size; a
        // truncate instead could race a concurrent write to another part of the object).
        self.preserve(p.objno).await?;
        self.note_writing(p.objno).await?;
        self.client
            .write(self.data_pool, &name, p.offset + p.len - 1, &[0])
            .await
            .map(|_| ())
            .map_err(|e| self.object_error("write", p.objno, e))
    }

    /// Returns once every write acknowledged before the call is durable against power loss
    /// on every member. In a pool with `wal` durability that is true of every acknowledged
    /// write already; in a `memory` pool (writes acknowledged once written to the WAL devices,
    /// before their flush) every OSD of the pool flushes its WAL first.
    pub async fn flush(&self) -> Result<(), VolumeError> {
        // Still refused once closed: a FLUSH that succeeds promises the writes are there.
        self.gated(|| async {
            self.client
                .sync_pool(self.data_pool)
                .await
                .map_err(VolumeError::Client)?;
            if self.data_pool != self.pool {
                self.client.sync_pool(self.pool).await?;
            }
            Ok(())
        })
        .await
    }

    /// The allocation map of `offset..offset+len` at data object granularity, in order,
    /// adjacent runs of the same kind merged.
    pub fn allocation(&self, offset: u64, len: u64) -> Vec<Allocation> {
        let mut out: Vec<Allocation> = Vec::new();
        let os = self.object_size();
        if len == 0 {
            return out;
        }
        let existing = self
            .map
            .existing_in(offset / os, (offset + len).div_ceil(os));
        for p in pieces(os, offset, len) {
            // A clone reads what it has not written from its parent: data there too.
            let allocated = existing.binary_search(&p.objno).is_ok() || self.parent_holds(p.objno);
            match out.last_mut() {
                Some(last) if last.allocated == allocated => last.len += p.len,
                _ => out.push(Allocation {
                    len: p.len,
                    allocated,
                }),
            }
        }
        out
    }

    /// Whether data object `objno`, missing from this clone, is read from a parent that holds it.
    fn parent_holds(&self, objno: u64) -> bool {
        self.parent_covers(objno)
            && self
                .parent
                .as_ref()
                .is_some_and(|v| v.map.may_exist(objno) || v.parent_holds(objno))
    }

    /// The pool this volume lives in.
    pub fn pool_name(&self) -> &str {
        &self.pool_name
    }
}

/// Reads and checks a volume's header (of pool `pool`, named `pool_name` in errors).
pub async fn read_header(
    client: &Client,
    pool: u32,
    pool_name: &str,
    name: &str,
) -> Result<Header, VolumeError> {
    let obj = header::header_object(name);
    match client.read(pool, &obj, 0, HEADER_LEN_V2 as u64 + 1).await {
        Ok(b) => Header::decode(&b).map_err(|why| VolumeError::BadHeader {
            name: name.to_string(),
            why,
        }),
        Err(ClientError::NoSuchObject { .. }) => Err(VolumeError::NoSuchVolume {
            pool: pool_name.to_string(),
            name: name.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}
