//! Volumes as NBD exports: the `cairn-nbd` traits over [`Volume`].

use crate::metrics::NbdMetrics;
use crate::users::{AccessDenied, NbdUsers};
use cairn_client::{Client, ClientError, FailCode};
use cairn_failstop::LockOrDie;
use cairn_nbd::{ClientId, Dirty, Export, ExportError, Exports, Extent, Opened};
use cairn_volume::{read_header, Volume, VolumeError};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Every volume of one pool, each served under its own name.
pub struct VolumeExports {
    client: Client,
    pool: String,
    default: Option<String>,
    /// Who serves, as the volumes' open leases name it.
    holder: String,
    /// One open volume per name, shared by all its connections (one object map per volume);
    /// the last connection to leave closes it (and releases its lease).
    open: tokio::sync::Mutex<HashMap<String, Weak<Volume>>>,
    /// Of every volume opened and not yet released: turns true once released.
    releases: std::sync::Mutex<Vec<(String, tokio::sync::watch::Receiver<bool>)>>,
    /// With TLS: who may open which volume. Without, every client may open every volume.
    users: Option<Arc<NbdUsers>>,
    /// Requests counted and timed per export (`--metrics-addr`).
    metrics: Option<Arc<NbdMetrics>>,
}

impl VolumeExports {
    /// Serves the volumes of `pool`; the empty export name means `default`, if given.
    /// `holder` describes this server in the leases of the volumes it opens (`vol rm` shows it).
    pub fn new(client: Client, pool: &str, default: Option<String>, holder: &str) -> VolumeExports {
        VolumeExports {
            client,
            pool: pool.to_string(),
            default,
            holder: holder.to_string(),
            open: tokio::sync::Mutex::new(HashMap::new()),
            releases: std::sync::Mutex::new(Vec::new()),
            users: None,
            metrics: None,
        }
    }

    /// Counts and times every request in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<NbdMetrics>) -> VolumeExports {
        self.metrics = Some(metrics);
        self
    }

    /// Reads the QoS totals of every open volume into the metrics (when scraped; skipped
    /// while a volume is being opened).
    pub fn refresh_metrics(&self) {
        let (Some(m), Ok(open)) = (&self.metrics, self.open.try_lock()) else {
            return;
        };
        for (name, v) in open.iter() {
            if let Some(v) = v.upgrade() {
                let (waits, waited) = v.throttled();
                m.throttled(name, Arc::as_ptr(&v) as usize, waits, waited);
            }
        }
    }

    /// Serves each client only the volumes its NBD caps grant (read-only without `w`).
    pub fn with_users(mut self, users: Arc<NbdUsers>) -> VolumeExports {
        self.users = Some(users);
        self
    }

    /// Whether `client` may open `volume`, and write it.
    fn access(&self, volume: &str, client: &ClientId) -> Result<bool, AccessDenied> {
        match &self.users {
            Some(users) => users.access(volume, client),
            None => Ok(true),
        }
    }

    fn lock_releases(
        &self,
    ) -> std::sync::MutexGuard<'_, Vec<(String, tokio::sync::watch::Receiver<bool>)>> {
        self.releases.lock_or_die()
    }

    /// Waits (at most a lease's life) until every earlier open of export `name` that is being
    /// released has released its lease: a client that reconnects right after it disconnected
    /// must not find this server's own previous open in the way (its lease is removed in the
    /// background, and takes longer when OSDs restart meanwhile).
    async fn wait_released(&self, name: &str) {
        let pending: Vec<_> = self
            .lock_releases()
            .iter()
            .filter(|(n, r)| n == name && !*r.borrow())
            .map(|(_, r)| r.clone())
            .collect();
        for mut r in pending {
            let wait = r.wait_for(|released| *released);
            if tokio::time::timeout(cairn_volume::lease::LEASE_FOR, wait)
                .await
                .is_err()
            {
                tracing::warn!(
                    volume = name,
                    "an earlier open of the volume is still being released"
                );
            }
        }
    }

    /// Closes every open volume (in-flight I/O finishes, leases are released): call before
    /// the process exits, so `vol rm` does not have to wait for the leases to expire.
    pub async fn close_all(&self) {
        let open: Vec<Arc<Volume>> = self
            .open
            .lock()
            .await
            .drain()
            .filter_map(|(_, v)| v.upgrade())
            .collect();
        for v in open {
            v.close().await;
        }
        // Volumes whose last client left are released in the background: wait for those too.
        let pending = std::mem::take(&mut *self.lock_releases());
        for (_, mut released) in pending {
            // Returns once it turns true, or its task is gone.
            let _ = released.wait_for(|r| *r).await;
        }
    }
}

/// One connection's view of a volume: its size is fixed at the handshake, as NBD requires.
pub struct VolumeExport {
    volume: Arc<Volume>,
    size: u64,
    /// Of a snapshot export `VOL@B`: what its dirty bitmaps compare.
    bitmaps: Option<Bitmaps>,
    /// Where this connection's requests are counted, and the export's name there.
    metrics: Option<(Arc<NbdMetrics>, String)>,
}

impl Drop for VolumeExport {
    fn drop(&mut self) {
        if let Some((m, name)) = &self.metrics {
            m.connection(name, -1);
        }
    }
}

/// The dirty bitmaps of a snapshot export `VOL@B`: bitmap `A` (context
/// `qemu:dirty-bitmap:A`) marks the blocks that changed between snapshot A and B, computed
/// once per connection (`cairn_volume::diff`, exact to 4 KiB).
struct Bitmaps {
    client: Client,
    pool: String,
    volume: String,
    snap: String,
    computed: tokio::sync::Mutex<HashMap<String, Arc<Vec<cairn_volume::Changed>>>>,
}

/// The context names of the dirty bitmaps export `VOL@B` offers: one per older snapshot.
fn bitmap_contexts(table: &cairn_volume::snaps::SnapTable, snap: &str) -> Vec<String> {
    let Some(b) = table.snaps.iter().find(|s| s.name == snap && s.active) else {
        return Vec::new();
    };
    table
        .snaps
        .iter()
        .filter(|a| a.active && a.id < b.id)
        .map(|a| format!("{}{}", cairn_nbd::proto::DIRTY_BITMAP_PREFIX, a.name))
        .collect()
}

impl Bitmaps {
    async fn changed(&self, from: &str) -> Result<Arc<Vec<cairn_volume::Changed>>, ExportError> {
        let mut computed = self.computed.lock().await;
        if let Some(c) = computed.get(from) {
            return Ok(c.clone());
        }
        let (c, p, v) = (&self.client, &self.pool, &self.volume);
        let found = cairn_volume::diff(c, p, v, from, Some(&self.snap), &mut |_, _| {})
            .await
            .map_err(|e| match e {
                VolumeError::NoSuchSnap { .. } | VolumeError::Snap { .. } => {
                    ExportError::Invalid(e.to_string())
                }
                e => export_error(e),
            })?;
        let found = Arc::new(found);
        computed.insert(from.to_string(), found.clone());
        Ok(found)
    }
}

/// Dirty runs over `offset..offset+len` from sorted, disjoint changed extents.
fn dirty_runs(changed: &[cairn_volume::Changed], offset: u64, len: u64) -> Vec<Dirty> {
    let end = offset + len;
    let mut out = Vec::new();
    let mut at = offset;
    let first = changed.partition_point(|c| c.offset + c.len <= offset);
    for c in &changed[first..] {
        if c.offset >= end {
            break;
        }
        let (s, e) = (c.offset.max(at), (c.offset + c.len).min(end));
        if s > at {
            out.push(Dirty {
                len: (s - at) as u32,
                dirty: false,
            });
        }
        if e > s {
            out.push(Dirty {
                len: (e - s) as u32,
                dirty: true,
            });
            at = e;
        }
    }
    if at < end {
        out.push(Dirty {
            len: (end - at) as u32,
            dirty: false,
        });
    }
    out
}

impl Exports for VolumeExports {
    type Export = VolumeExport;

    async fn list(&self, client: &ClientId) -> Result<Vec<(String, String)>, ExportError> {
        let vols = cairn_volume::list(&self.client, &self.pool)
            .await
            .map_err(export_error)?;
        let mut out = Vec::new();
        for v in vols {
            if self.access(&v.name, client).is_err() {
                continue;
            }
            let h = match v.header {
                Ok(h) => h,
                Err(why) => {
                    out.push((v.name, format!("damaged header: {why}")));
                    continue;
                }
            };
            out.push((v.name.clone(), format!("{} bytes", h.size)));
            // Its snapshots, read-only exports of their own.
            let snaps = cairn_volume::list_snaps(&self.client, &self.pool, &v.name).await;
            for s in snaps.map(|l| l.table.snaps).unwrap_or_default() {
                if s.active {
                    let desc = format!("snapshot of {}, {} bytes, read-only", v.name, s.size);
                    out.push((format!("{}@{}", v.name, s.name), desc));
                }
            }
        }
        Ok(out)
    }

    async fn open(
        &self,
        name: &str,
        client: &ClientId,
    ) -> Result<Option<Opened<VolumeExport>>, ExportError> {
        let name = match (name, &self.default) {
            ("", Some(d)) => d.as_str(),
            ("", None) => return Ok(None),
            (n, _) => n,
        };
        // `VOL@SNAP` is snapshot SNAP of volume VOL, read-only.
        let (vol_name, snap) = match name.split_once('@') {
            Some((v, s)) => (v, Some(s)),
            None => (name, None),
        };
        // Before any lookup: a client learns nothing of volumes it may not open.
        let writable = self
            .access(vol_name, client)
            .map_err(|e| ExportError::Denied(e.to_string()))?
            && snap.is_none();
        let check = cairn_volume::header::check_name;
        if check(vol_name).is_err() || snap.is_some_and(|s| check(s).is_err()) {
            return Ok(None);
        }
        let pool = self.client.pool_id(&self.pool).map_err(client_error)?;
        // Re-read the header on every connection: a resize shows on the next connection, and
        // a volume removed and re-created under the same name is a different volume.
        let header = match read_header(&self.client, pool, &self.pool, vol_name).await {
            Ok(h) => h,
            Err(VolumeError::NoSuchVolume { .. }) => return Ok(None),
            Err(e) => return Err(export_error(e)),
        };
        if header.removing {
            tracing::info!(
                volume = name,
                "refusing to open a volume that is being removed"
            );
            return Ok(None);
        }
        let mut open = self.open.lock().await;
        let volume = match open.get(name).and_then(Weak::upgrade) {
            Some(v) if v.header().id == header.id => {
                v.set_size(header.size);
                v
            }
            _ => {
                self.wait_released(name).await;
                let (c, p, h) = (self.client.clone(), &self.pool, &self.holder);
                let opened = match snap {
                    None => match Volume::open(c.clone(), p, vol_name, h).await {
                        // No room even for its open lease: its data can still be read.
                        Err(e) if e.is_no_space() => {
                            tracing::warn!(volume = name, error = %e,
                                "the pool is full: serving the volume read-only");
                            Volume::open_shared(c, p, vol_name, h).await
                        }
                        r => r,
                    },
                    Some(s) => Volume::open_snapshot(c, p, vol_name, s, h).await,
                };
                let v = match opened {
                    Ok(v) => Arc::new(v),
                    Err(
                        VolumeError::NoSuchVolume { .. }
                        | VolumeError::Removing { .. }
                        | VolumeError::NoSuchSnap { .. },
                    ) => return Ok(None),
                    Err(e @ VolumeError::Locked { .. }) => {
                        tracing::warn!(volume = name, error = %e, "refusing a second writer");
                        return Err(ExportError::Denied(e.to_string()));
                    }
                    Err(e) => return Err(export_error(e)),
                };
                // A read-only fallback is not shared: the next connection tries to write again.
                if v.writable() || snap.is_some() {
                    open.insert(name.to_string(), Arc::downgrade(&v));
                }
                let mut releases = self.lock_releases();
                releases.retain(|(_, r)| !*r.borrow());
                releases.push((name.to_string(), v.released()));
                v
            }
        };
        let size = volume.size();
        let bitmaps = snap.map(|s| Bitmaps {
            client: self.client.clone(),
            pool: self.pool.clone(),
            volume: vol_name.to_string(),
            snap: s.to_string(),
            computed: Default::default(),
        });
        Ok(Some(Opened {
            read_only: !writable || !volume.writable(),
            export: Arc::new(VolumeExport {
                volume,
                size,
                bitmaps,
                metrics: self.metrics.as_ref().map(|m| {
                    m.connection(name, 1);
                    (m.clone(), name.to_string())
                }),
            }),
        }))
    }

    /// A snapshot export `VOL@B` offers `qemu:dirty-bitmap:A` for each older snapshot A (what
    /// changed from A to B: an incremental backup copies only that).
    async fn meta_contexts(&self, name: &str, client: &ClientId) -> Vec<String> {
        let Some((vol, snap)) = name.split_once('@') else {
            return Vec::new();
        };
        if self.access(vol, client).is_err() {
            return Vec::new();
        }
        match cairn_volume::list_snaps(&self.client, &self.pool, vol).await {
            Ok(l) => bitmap_contexts(&l.table, snap),
            Err(e) => {
                tracing::warn!(export = name, error = %e, "cannot list the snapshots for dirty bitmaps");
                Vec::new()
            }
        }
    }
}

impl VolumeExport {
    /// When a request starts, if the server keeps metrics.
    fn clock(&self) -> Option<std::time::Instant> {
        self.metrics.as_ref().map(|_| std::time::Instant::now())
    }

    /// Counts request `op` started at `t0` (`bytes_in` written, `out` tells the bytes read)
    /// when the server keeps metrics.
    fn count<T>(
        &self,
        op: &'static str,
        bytes_in: u64,
        t0: Option<std::time::Instant>,
        r: &Result<T, ExportError>,
        out: impl Fn(&T) -> u64,
    ) {
        if let (Some((m, name)), Some(t0)) = (&self.metrics, t0) {
            m.record(name, op, bytes_in, t0, r, out);
        }
    }

    /// Forced unit access: the write just acknowledged must survive a power loss too, which in
    /// a pool with `memory` durability takes a flush (nothing in a `wal` pool).
    async fn fua(&self, fua: bool) -> Result<(), ExportError> {
        if !fua {
            return Ok(());
        }
        self.volume.flush().await.map_err(export_error)
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExportError::Invalid(format!(
                "range {offset}+{len} is beyond the export's size {}",
                self.size
            ))),
        }
    }
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.size
    }

    /// Safe: all connections of this process share one `Volume`, reads go to the PG primary,
    /// which serves only acknowledged data, and a FLUSH on any connection flushes every OSD of
    /// the pool (in a `memory` pool), so it covers the writes of every connection.
    fn multi_conn(&self) -> bool {
        true
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, ExportError> {
        self.check(offset, len.into())?;
        let t0 = self.clock();
        let r = self.volume.read(offset, len.into()).await;
        let r = r.map_err(export_error);
        self.count("read", 0, t0, &r, |d| d.len() as u64);
        r
    }

    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), ExportError> {
        self.check(offset, data.len() as u64)?;
        let t0 = self.clock();
        let len = data.len() as u64;
        // Shared, not borrowed: a part that waits in a connection's send queue is held there,
        // not copied.
        let data = cairn_client::Bytes::from(data);
        let r = match self.volume.write_shared(offset, &data).await {
            Ok(()) => self.fua(fua).await,
            Err(e) => Err(export_error(e)),
        };
        self.count("write", len, t0, &r, |_| 0);
        r
    }

    async fn flush(&self) -> Result<(), ExportError> {
        let t0 = self.clock();
        let r = self.volume.flush().await.map_err(export_error);
        self.count("flush", 0, t0, &r, |_| 0);
        r
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<(), ExportError> {
        self.check(offset, len.into())?;
        let t0 = self.clock();
        let r = self.volume.zero(offset, len.into(), true).await;
        let r = r.map_err(export_error);
        self.count("trim", 0, t0, &r, |_| 0);
        r
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_punch: bool,
        _fast: bool,
        fua: bool,
    ) -> Result<(), ExportError> {
        self.check(offset, len.into())?;
        // Every way of zeroing is fast here (remove, in-place zero, or a one-byte sparse
        // write), so FAST_ZERO never has to fail.
        let t0 = self.clock();
        let r = match self.volume.zero(offset, len.into(), may_punch).await {
            Ok(()) => self.fua(fua).await,
            Err(e) => Err(export_error(e)),
        };
        self.count("write_zeroes", 0, t0, &r, |_| 0);
        r
    }

    async fn dirty_status(
        &self,
        name: &str,
        offset: u64,
        len: u32,
    ) -> Result<Vec<Dirty>, ExportError> {
        self.check(offset, len.into())?;
        let Some(b) = &self.bitmaps else {
            return Err(ExportError::Invalid(
                "only snapshot exports have dirty bitmaps".into(),
            ));
        };
        Ok(dirty_runs(&b.changed(name).await?, offset, len.into()))
    }

    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>, ExportError> {
        self.check(offset, len.into())?;
        Ok(self
            .volume
            .allocation(offset, len.into())
            .into_iter()
            .map(|a| Extent {
                // Runs are at most `len` long, so they fit.
                len: u32::try_from(a.len).unwrap_or(u32::MAX),
                hole: !a.allocated,
                zero: !a.allocated,
            })
            .collect())
    }
}

fn client_error(e: ClientError) -> ExportError {
    export_error(VolumeError::Client(e))
}

/// The NBD error a client sees, with the full story in the server's log.
fn export_error(e: VolumeError) -> ExportError {
    tracing::warn!(error = %e, "volume i/o failed");
    let full = |e: &ClientError| {
        matches!(
            e,
            ClientError::Failed {
                code: FailCode::NoSpace,
                ..
            }
        )
    };
    match &e {
        VolumeError::OutOfRange { .. }
        | VolumeError::BadArgument { .. }
        | VolumeError::BadPoolQos { .. } => ExportError::Invalid(e.to_string()),
        VolumeError::Object { source, .. } | VolumeError::Client(source) if full(source) => {
            ExportError::NoSpace(e.to_string())
        }
        _ => ExportError::Io(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_volume::Changed;

    /// The size of the future `f` returns.
    fn future_size<A, B, F>(_: impl Fn(&'static VolumeExport, A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn a_read_or_write_future_stays_small_as_it_is_moved_once_per_request() {
        // Every request's future is boxed (and so copied) once by the NBD server; a wrapper
        // that holds the volume's future by value doubles or triples it (it was 10 KiB).
        let read = future_size(|x, offset, len| x.read(offset, len));
        let write = future_size(|x, offset, data| x.write(offset, data, false));
        assert!(read <= 3 << 10 && write <= 3 << 10, "{read}, {write}");
    }

    #[test]
    fn dirty_runs_cover_the_range_exactly() {
        let c = |offset, len| Changed { offset, len };
        let changed = [c(4096, 4096), c(16384, 8192), c(65536, 4096)];
        let runs = |o, l| -> Vec<(u32, bool)> {
            dirty_runs(&changed, o, l)
                .into_iter()
                .map(|d| (d.len, d.dirty))
                .collect()
        };
        assert_eq!(
            runs(0, 32768),
            vec![
                (4096, false),
                (4096, true),
                (8192, false),
                (8192, true),
                (8192, false)
            ]
        );
        assert_eq!(runs(20480, 1024), vec![(1024, true)]);
        assert_eq!(runs(30000, 4096), vec![(4096, false)]);
        assert_eq!(runs(65536 + 4095, 10), vec![(1, true), (9, false)]);
    }
}
