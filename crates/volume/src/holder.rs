//! The holder's side of an open lease: written at open, renewed in the background, and the
//! gate every I/O passes. The renewal also re-reads the header, so a `vol rm --force` (header
//! flag `close`) or a removed volume closes the volume here within [`RENEW_EVERY`]: in-flight
//! I/O finishes, new I/O fails, and the lease object goes, which is what `vol rm` waits for.
//!
//! Between renewals it watches the volume's snapshot table (an OSD watch: answered at the next
//! write to it) and re-reads it when woken: a new generation is adopted while no I/O runs
//! (writes then preserve data for the newest active snapshot) and acknowledged in the lease
//! record, which `vol snap` commands wait for.

use crate::error::VolumeError;
use crate::header::Header;
use crate::lease::IoRates;
use crate::lease::{
    lease_object, now_ms, LeaseRecord, LAPSE_PATIENCE, LEASE_FOR, RENEW_EVERY, SELF_FENCE_AFTER,
};
use crate::snaps::{snaps_object, SnapTable, MAX_SNAPS_LEN};
use crate::volume::read_header;
use cairn_client::contents_tag;
use cairn_client::{Client, ClientError};
use cairn_failstop::LockOrDie;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify, RwLock, RwLockReadGuard};
use tokio::time::Instant;

/// Where a held lease stands.
#[derive(Debug, Clone)]
enum State {
    /// I/O may run until `until` (the last successful renewal's start + SELF_FENCE_AFTER),
    /// when the watchdog turns it `Lapsed` unless a renewal came first.
    Valid { until: Instant },
    /// Not renewed in time: no I/O until the next renewal.
    Lapsed,
    /// Closed for good, and why.
    Closed(String),
}

struct Shared {
    client: Client,
    pool: u32,
    pool_name: String,
    name: String,
    id: u64,
    record: Mutex<LeaseRecord>,
    /// I/O holds it shared; closing takes it exclusively, so a close waits for in-flight I/O.
    io: RwLock<()>,
    state: watch::Sender<State>,
    stop: Notify,
    /// The snapshot table adopted last.
    snaps: Mutex<Arc<SnapView>>,
    /// The snapshot id this holder reads, if it serves a snapshot (closes once it is removed).
    reading: Option<u64>,
    /// Reads, writes, bytes read, bytes written since open.
    counts: [AtomicU64; 4],
    /// The counts at the last renewal, and when: rates are over one renewal period.
    sampled: Mutex<(Instant, [u64; 4])>,
    /// The pool's default QoS limits, re-read at every renewal.
    pool_qos: Mutex<crate::snaps::Qos>,
    /// Contents tag of the snapshot table's bytes as last read (what the watch of it compares).
    table_tag: AtomicU64,
}

/// How a process holds a volume open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// It writes: one writer at a time (the lease is exclusive among writers).
    Writer,
    /// It only reads, or only copies what is missing (`vol flatten`): any number, beside a
    /// writer.
    Shared,
    /// It reads this snapshot (shared; closes once the snapshot is removed).
    Snapshot(u64),
}

/// How long a holder waits before reading the snapshot table again when watching it failed.
pub const SNAP_POLL: Duration = Duration::from_millis(200);

/// A snapshot table as a holder adopted it, with the data objects already preserved for its
/// newest active snapshot (a clone exists), learnt by this process.
#[derive(Debug, Default)]
pub(crate) struct SnapView {
    pub table: SnapTable,
    preserved: Mutex<HashSet<u64>>,
}

impl SnapView {
    pub fn is_preserved(&self, objno: u64) -> bool {
        self.lock().contains(&objno)
    }
    pub fn mark_preserved(&self, objno: u64) {
        self.lock().insert(objno);
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.preserved.lock_or_die()
    }
}

/// Reads volume `id`'s snapshot table; a volume without one has the empty table.
pub(crate) async fn read_snaps(
    client: &Client,
    pool: u32,
    name: &str,
    id: u64,
) -> Result<SnapTable, VolumeError> {
    read_snaps_tag(client, pool, name, id).await.map(|(t, _)| t)
}

/// The table and the contents tag of its stored bytes (0 when absent: what a watch and a
/// conditional write compare).
pub(crate) async fn read_snaps_tag(
    client: &Client,
    pool: u32,
    name: &str,
    id: u64,
) -> Result<(SnapTable, u64), VolumeError> {
    match client
        .read(pool, &snaps_object(id), 0, MAX_SNAPS_LEN as u64 + 1)
        .await
    {
        Ok(b) => match SnapTable::decode(&b) {
            Ok(t) => Ok((t, contents_tag(&b))),
            Err(why) => Err(VolumeError::BadSnaps {
                name: name.to_string(),
                why,
            }),
        },
        Err(ClientError::NoSuchObject { .. }) => Ok((SnapTable::default(), 0)),
        Err(e) => Err(e.into()),
    }
}

/// A lease held on one open volume; dropping it releases the lease in the background.
pub(crate) struct HeldLease {
    shared: Arc<Shared>,
    /// Becomes true once the lease is released (the renewal task ended).
    released: watch::Receiver<bool>,
}

/// Permission for one I/O: holds off a close until dropped.
pub(crate) struct IoPermit<'a> {
    _io: RwLockReadGuard<'a, ()>,
    state: watch::Receiver<State>,
}

impl IoPermit<'_> {
    /// Resolves once the lease lapses (no renewal in time): the I/O must then be dropped, so
    /// that nothing of it lands after others may consider the lease expired. No timer per
    /// I/O: the volume's one watchdog marks the lapse.
    pub async fn lapsed(&mut self) {
        while matches!(*self.state.borrow_and_update(), State::Valid { .. }) {
            if self.state.changed().await.is_err() {
                return;
            }
        }
    }
}

impl HeldLease {
    /// Takes a lease on volume `header.id` for a holder described by `desc`, and checks that
    /// the volume is still there and not being removed (after writing the lease, so that a
    /// concurrent `vol rm` sees the lease or this sees its flag).
    pub async fn acquire(
        client: &Client,
        pool: u32,
        pool_name: &str,
        name: &str,
        header: Header,
        desc: &str,
        mode: Mode,
    ) -> Result<HeldLease, VolumeError> {
        let reading = match mode {
            Mode::Snapshot(id) => Some(id),
            Mode::Writer | Mode::Shared => None,
        };
        let record = LeaseRecord {
            holder: client.instance(),
            expires_at_ms: 0,
            pid: std::process::id(),
            desc: desc.to_string(),
            acked_gen: 0,
            rates: Default::default(),
            writer: mode == Mode::Writer,
        };
        let shared = Arc::new(Shared {
            client: client.clone(),
            pool,
            pool_name: pool_name.to_string(),
            name: name.to_string(),
            id: header.id,
            record: Mutex::new(record),
            io: RwLock::new(()),
            state: watch::Sender::new(State::Closed("not yet open".into())),
            stop: Notify::new(),
            snaps: Mutex::new(Arc::default()),
            reading,
            counts: Default::default(),
            sampled: Mutex::new((Instant::now(), [0; 4])),
            pool_qos: Mutex::default(),
            table_tag: Default::default(),
        });
        let started = Instant::now();
        // Registered before the lease is written: whoever reads the registry after this finds
        // the lease, or this holder about to write it.
        let writer = mode == Mode::Writer;
        let holder = client.instance();
        match crate::registry::register(client, pool, name, header.id, holder, writer).await {
            Ok(()) => {}
            // A full pool still serves reads (below); a writer cannot go on.
            Err(e) if is_full(&e) && !writer => {
                tracing::warn!(volume = name, error = %e, "the pool is full: not registered")
            }
            Err(e) => return Err(e),
        }
        match shared.write_record().await {
            Ok(()) => {}
            // A write that failed may still have landed on some copies: no stale lease left.
            Err(e) if mode == Mode::Writer => {
                shared.remove_record().await;
                return Err(e);
            }
            // A full pool still lets its data be read: a reader goes on without a lease
            // record (it cannot write anything anyway); a writer cannot.
            Err(e) if is_full(&e) => {
                shared.remove_record().await;
                tracing::warn!(volume = name, error = %e,
                    "the pool is full: opening read-only without an open lease record");
            }
            Err(e) => {
                shared.remove_record().await;
                return Err(e);
            }
        }
        // The table is read after the lease is written: a `vol snap` command that changes it
        // either sees this lease (and waits for it) or this sees the change.
        let refused = match shared.current_header().await {
            Ok(h) if h.removing => Some(VolumeError::Removing {
                pool: pool_name.to_string(),
                name: name.to_string(),
            }),
            Ok(_) => match shared.first_snaps().await {
                Ok(()) if mode == Mode::Writer => shared.other_writers().await.err(),
                r => r.err(),
            },
            Err(e) => Some(e),
        };
        if let Some(e) = refused {
            shared.remove_record().await;
            return Err(e);
        }
        shared.refresh_pool_qos().await;
        shared.set(State::Valid {
            until: started + SELF_FENCE_AFTER,
        });
        let (done, released) = watch::channel(false);
        let renewing = shared.clone();
        tokio::spawn(async move {
            renew(renewing).await;
            let _ = done.send(true);
        });
        // Only a writer must stop its I/O when its lease lapses (no write after others may
        // take over); readers and copiers of missing objects change nothing others wrote.
        if mode == Mode::Writer {
            tokio::spawn(watchdog(shared.clone()));
        }
        Ok(HeldLease { shared, released })
    }

    /// Waits until I/O may run: at once while the lease is valid; while it has lapsed, until
    /// it is renewed or `give_up`. Fails once the volume is closed.
    pub async fn enter(&self, give_up: Instant) -> Result<IoPermit<'_>, VolumeError> {
        let mut state = self.shared.state.subscribe();
        loop {
            match &*state.borrow_and_update() {
                State::Closed(why) => return Err(self.shared.closed(why.clone())),
                State::Valid { .. } => break,
                State::Lapsed => {}
            }
            tokio::select! {
                changed = state.changed() => if changed.is_err() {
                    return Err(self.shared.closed("its lease is gone".into()));
                },
                () = tokio::time::sleep_until(give_up) => return Err(self.shared.lapsed()),
            }
        }
        let io = self.shared.io.read().await;
        // Closed while this waited for the lock (a close holds it until it is done).
        if let State::Closed(why) = self.shared.get() {
            return Err(self.shared.closed(why));
        }
        Ok(IoPermit { _io: io, state })
    }

    /// Closes: waits for in-flight I/O, refuses new I/O and removes the lease object.
    pub async fn close(&self) {
        self.shared.stop.notify_one();
        wait_released(self.released.clone()).await;
    }

    /// Becomes true once the lease is released, also after the volume was dropped.
    pub fn released(&self) -> watch::Receiver<bool> {
        self.released.clone()
    }

    /// Counts one finished read (or write) of `bytes`, for the rates in the lease record.
    pub fn count(&self, write: bool, bytes: u64) {
        let at = usize::from(write);
        self.shared.counts[at].fetch_add(1, Ordering::Relaxed);
        self.shared.counts[2 + at].fetch_add(bytes, Ordering::Relaxed);
    }

    /// The QoS limits this volume is held to: its own, else its pool's defaults.
    pub fn qos(&self) -> crate::snaps::Qos {
        let own = self.shared.snap_view().table.qos;
        if own.is_limited() {
            return own;
        }
        *self.shared.pool_qos.lock_or_die()
    }

    /// The snapshot table adopted last: stable while an [`IoPermit`] is held.
    pub fn snaps(&self) -> Arc<SnapView> {
        self.shared.snap_view()
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        // The renewal task sees it and closes (it owns a reference to everything it needs).
        self.shared.stop.notify_one();
    }
}

impl Shared {
    fn get(&self) -> State {
        self.state.borrow().clone()
    }

    fn set(&self, s: State) {
        self.state.send_replace(s);
    }

    fn closed(&self, why: String) -> VolumeError {
        VolumeError::Closed {
            name: self.name.clone(),
            why,
        }
    }

    fn lapsed(&self) -> VolumeError {
        self.closed(format!(
            "its open lease has not been renewed for {} s (cluster unreachable?); I/O resumes \
             once it is",
            (SELF_FENCE_AFTER + LAPSE_PATIENCE).as_secs()
        ))
    }

    fn object(&self) -> Vec<u8> {
        let holder = self.record.lock_or_die().holder;
        lease_object(self.id, holder)
    }

    /// I/O rates since the last sample.
    fn sample_rates(&self) -> IoRates {
        let now: [u64; 4] = std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed));
        let mut s = self.sampled.lock_or_die();
        let secs = s.0.elapsed().as_secs_f64().max(0.001);
        let rate = |i: usize| (now[i].saturating_sub(s.1[i]) as f64 / secs) as u64;
        let r = IoRates {
            read_ops: rate(0),
            write_ops: rate(1),
            read_bytes: rate(2),
            write_bytes: rate(3),
        };
        *s = (Instant::now(), now);
        r
    }

    async fn write_record(&self) -> Result<(), VolumeError> {
        let bytes = {
            let mut r = self.record.lock_or_die();
            r.expires_at_ms = now_ms() + LEASE_FOR.as_millis() as u64;
            r.encode()
        };
        self.client
            .write_full(self.pool, &self.object(), &bytes)
            .await
            .map(|_| ())
            .map_err(VolumeError::from)
    }

    /// Removes the lease, then the registry's entry (`registry.rs`).
    async fn remove_record(&self) {
        match self.client.remove(self.pool, &self.object()).await {
            Ok(()) | Err(ClientError::NoSuchObject { .. }) => {}
            Err(e) => tracing::warn!(volume = %self.name, error = %e,
                "could not remove the volume's open lease; it expires by itself"),
        }
        let holder = [self.record.lock_or_die().holder];
        let r = crate::registry::unregister(&self.client, self.pool, &self.name, self.id, &holder);
        if let Err(e) = r.await {
            tracing::warn!(volume = %self.name, error = %e,
                "could not leave the volume's holder registry; the next opener drops the entry");
        }
    }

    /// The volume's header, as long as it is still the volume this lease is on.
    async fn current_header(&self) -> Result<Header, VolumeError> {
        let h = read_header(&self.client, self.pool, &self.pool_name, &self.name).await?;
        if h.id != self.id {
            return Err(VolumeError::NoSuchVolume {
                pool: self.pool_name.clone(),
                name: self.name.clone(),
            });
        }
        Ok(h)
    }

    /// Refuses if another process has the volume open for writing: checked after this
    /// lease is written, so of two writers opening at once at least one sees the other.
    /// A writer whose lease expired is fenced first (its ops refused by every OSD this
    /// client reaches from now on), so nothing it still sends lands after this one's writes.
    async fn other_writers(&self) -> Result<(), VolumeError> {
        let me = self.object();
        let mut live = Vec::new();
        for (object, r) in crate::remove::all_leases(&self.client, self.pool, self.id)
            .await?
            .into_iter()
            .filter(|(o, _)| *o != me)
        {
            if r.remaining_ms() > 0 {
                if r.writer {
                    live.push(r);
                }
                continue;
            }
            // A damaged record (holder 0) may have been a writer's: fenced too.
            if r.writer || r.holder == 0 {
                self.take_over(&object, &r).await?;
            }
        }
        if live.is_empty() {
            return Ok(());
        }
        Err(VolumeError::Locked {
            name: self.name.clone(),
            holders: crate::remove::describe_holders(&live),
        })
    }

    /// Fences the writer of the expired lease `object` and removes the lease.
    async fn take_over(&self, object: &[u8], r: &LeaseRecord) -> Result<(), VolumeError> {
        let Some((_, holder)) = crate::lease::lease_of(object) else {
            return Ok(());
        };
        let epoch = self.client.fence(&self.pool_name, holder).await?;
        tracing::warn!(volume = %self.name, holder = format_args!("{holder:016x}"), pid = r.pid,
            desc = %r.desc, epoch,
            "took the volume over from a writer whose lease expired: that writer is fenced");
        match self.client.remove(self.pool, object).await {
            Ok(()) | Err(ClientError::NoSuchObject { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        crate::registry::unregister(&self.client, self.pool, &self.name, self.id, &[holder]).await
    }

    /// Re-reads the pool's default QoS limits (kept as they were if that fails).
    async fn refresh_pool_qos(&self) {
        match crate::pool_qos::read(&self.client, self.pool).await {
            Ok(q) => *self.pool_qos.lock_or_die() = q,
            Err(e) => tracing::warn!(volume = %self.name, error = %e,
                "could not read the pool's default QoS limits"),
        }
    }

    fn snap_view(&self) -> Arc<SnapView> {
        self.snaps.lock_or_die().clone()
    }

    /// Reads and adopts the table at open; a snapshot being read must exist and be active.
    async fn first_snaps(&self) -> Result<(), VolumeError> {
        let (t, tag) = read_snaps_tag(&self.client, self.pool, &self.name, self.id).await?;
        self.table_tag.store(tag, Ordering::Relaxed);
        if let Some(id) = self.reading {
            if !t.snaps.iter().any(|s| s.id == id && s.active) {
                return Err(self.closed(format!("snapshot {id} was removed")));
            }
        }
        let generation = t.generation;
        *self.snaps.lock_or_die() = Arc::new(SnapView {
            table: t,
            preserved: Mutex::default(),
        });
        if generation > 0 {
            match self.ack(generation).await {
                Err(e) if !is_full(&e) || self.is_writer() => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    fn is_writer(&self) -> bool {
        self.record.lock_or_die().writer
    }

    /// Adopts a newer snapshot table while no I/O runs, then acknowledges it. Returns why the
    /// volume must close, if it must (the snapshot it serves was removed).
    async fn adopt(&self, t: SnapTable) -> Option<String> {
        let current = self.snap_view();
        if t.generation <= current.table.generation {
            return None;
        }
        if let Some(id) = self.reading {
            if !t.is_live(id) {
                return Some("the snapshot it serves was removed (cairn vol snap rm)".into());
            }
        }
        let generation = t.generation;
        {
            let _all = self.io.write().await;
            // What was preserved for a newer or the same snapshot is preserved for an older
            // one too (a clone not older than it exists); for a newer snapshot it is not.
            let keep = t.latest_active() <= current.table.latest_active();
            let preserved = if keep {
                std::mem::take(&mut *current.lock())
            } else {
                HashSet::new()
            };
            *self.snaps.lock_or_die() = Arc::new(SnapView {
                table: t,
                preserved: Mutex::new(preserved),
            });
        }
        if let Err(e) = self.ack(generation).await {
            tracing::warn!(volume = %self.name, error = %e,
                "could not acknowledge a snapshot table change; retried at the next renewal");
        }
        None
    }

    async fn ack(&self, generation: u64) -> Result<(), VolumeError> {
        self.record.lock_or_die().acked_gen = generation;
        self.write_record().await
    }

    /// Closes for good: in-flight I/O ends first, then the lease object goes.
    async fn close(&self, why: String) {
        {
            let _all = self.io.write().await;
            self.set(State::Closed(why));
        }
        self.remove_record().await;
    }
}

/// Whether `e` says the pool is full.
fn is_full(e: &VolumeError) -> bool {
    e.is_no_space()
}

/// Returns once `released` turns true (or its task is gone).
pub(crate) async fn wait_released(mut released: watch::Receiver<bool>) {
    let _ = released.wait_for(|r| *r).await;
}

/// Turns the lease `Lapsed` when a renewal does not come by its `until`; ends once closed.
async fn watchdog(s: Arc<Shared>) {
    let mut state = s.state.subscribe();
    loop {
        let until = match &*state.borrow_and_update() {
            State::Valid { until } => Some(*until),
            State::Lapsed => None,
            State::Closed(_) => return,
        };
        let Some(until) = until else {
            if state.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            () = tokio::time::sleep_until(until) => {
                // A renewal meanwhile moved `until` on: then this lapse is not due.
                s.state.send_if_modified(|st| match st {
                    State::Valid { until } if *until <= Instant::now() => {
                        *st = State::Lapsed;
                        true
                    }
                    _ => false,
                });
            }
            changed = state.changed() => if changed.is_err() { return },
        }
    }
}

/// Why a holder stops.
enum Stop {
    /// Its server closed the volume.
    Server,
    /// The volume must close (why).
    Must(String),
}

/// Watches the snapshot table until the next renewal is due, adopting each new generation;
/// `Err` once the holder stops.
async fn poll_snaps(s: &Shared, until: Instant) -> Result<(), Stop> {
    let object = snaps_object(s.id);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        let known = s.table_tag.load(Ordering::Relaxed);
        let woken = async {
            if let Err(e) = s.client.watch(s.pool, &object, known, left).await {
                tracing::debug!(volume = %s.name, error = %e, "watching the snapshot table failed; polling");
                tokio::time::sleep(SNAP_POLL.min(left)).await;
            }
        };
        tokio::select! {
            () = woken => {}
            () = s.stop.notified() => return Err(Stop::Server),
        }
        match read_snaps_tag(&s.client, s.pool, &s.name, s.id).await {
            Ok((t, tag)) => {
                if let Some(why) = s.adopt(t).await {
                    return Err(Stop::Must(why));
                }
                s.table_tag.store(tag, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(volume = %s.name, error = %e,
                    "could not read the volume's snapshot table");
                tokio::time::sleep(SNAP_POLL.min(left)).await;
            }
        }
    }
}

/// Renews the lease until stopped or until the header says the volume is going.
async fn renew(s: Arc<Shared>) {
    loop {
        match poll_snaps(&s, Instant::now() + RENEW_EVERY).await {
            Ok(()) => {}
            Err(Stop::Server) => return s.close("the server closed it".into()).await,
            Err(Stop::Must(why)) => {
                tracing::warn!(volume = %s.name, why, "closing the volume");
                return s.close(why).await;
            }
        }
        let started = Instant::now();
        s.refresh_pool_qos().await;
        let rates = s.sample_rates();
        s.record.lock_or_die().rates = rates;
        if let Err(e) = s.write_record().await {
            if e.is_fenced() {
                let why = "another server took it over after this one's lease expired (this \
                           process is fenced: the OSDs refuse its I/O; reopen the volume to take \
                           it back)";
                tracing::error!(volume = %s.name, why, "closing the volume");
                return s.close(why.into()).await;
            }
            tracing::warn!(volume = %s.name, error = %e, "could not renew the volume's open lease");
            continue;
        }
        match s.current_header().await {
            Ok(h) if h.close => {
                let why = "it is being removed (cairn vol rm --force)";
                tracing::warn!(volume = %s.name, why, "closing the volume");
                s.close(why.into()).await;
                return;
            }
            Ok(_) => s.set(State::Valid {
                until: started + SELF_FENCE_AFTER,
            }),
            Err(e @ VolumeError::NoSuchVolume { .. }) => {
                tracing::warn!(volume = %s.name, reason = %e, "closing the volume");
                s.close(e.to_string()).await;
                return;
            }
            Err(e) => tracing::warn!(volume = %s.name, error = %e,
                "could not re-read the volume's header while renewing its lease"),
        }
    }
}
