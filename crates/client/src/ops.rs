//! The client API: object ops with transparent retries across map changes and failures.

use crate::conn::{Answer, ConnError, MergeCounters, OsdConn, Payload, MERGE_MAX_BYTES};
use crate::error::ClientError;
use crate::route::{MapView, Route};
use cairn_failstop::LockOrDie;
use cairn_map::{ClusterMap, PgId};
use cairn_monclient::MonClient;
use cairn_proto::msg::osd::{OpKind, OpReply, OpRequest, MAX_LIST};
use cairn_transport::{node_kind, Dialer};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Monitor addresses.
    pub mons: Vec<String>,
    /// How long an op keeps retrying before it fails. Default 30 s.
    pub op_timeout: Duration,
    /// Temporal merge: with more than this many ops in flight to one OSD, small ops
    /// (<= 16 KiB) issued together travel as one message (at most 8). 0 turns it off.
    pub merge_threshold: usize,
    /// Local address to connect from (`None`: the system's choice).
    pub source: Option<std::net::IpAddr>,
    /// The credentials this client presents (its key to monitors, tickets to OSDs).
    pub auth: cairn_transport::Auth,
    /// The frame protection it asks for (the cluster may require more). Default plain.
    pub frames: cairn_transport::FrameMode,
}

/// Default [`ClientConfig::merge_threshold`].
pub const DEFAULT_MERGE_THRESHOLD: usize = 4;

impl ClientConfig {
    /// Defaults for a cluster with these monitors.
    pub fn new(mons: Vec<String>) -> ClientConfig {
        ClientConfig {
            mons,
            op_timeout: Duration::from_secs(30),
            merge_threshold: DEFAULT_MERGE_THRESHOLD,
            source: None,
            auth: Arc::new(cairn_transport::NoAuth),
            frames: cairn_transport::FrameMode::Plain,
        }
    }
}

/// What `stat` tells about an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
}

/// A connection to a Cairn cluster. Cheap to clone; clones share connections and the map.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// The instance its ops carry (`OpRequest::instance`): what a fence names.
    instance: u64,
}

/// A random, nonzero client instance.
pub fn new_instance() -> u64 {
    loop {
        let i: u64 = rand::random();
        if i != 0 {
            return i;
        }
    }
}

/// A task stopped when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Inner {
    /// Learns the monitors added to the cluster while this client lives (held for its Drop).
    _learning: AbortOnDrop,
    mon: MonClient,
    maps: watch::Receiver<Arc<ClusterMap>>,
    view: Mutex<Arc<MapView>>,
    conns: Mutex<HashMap<u32, Arc<OsdConn>>>,
    /// One connection attempt per OSD at a time: ops that find no connection wait for it
    /// instead of each opening their own.
    connecting: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<()>>>>,
    cfg: ClientConfig,
    merged: Arc<MergeCounters>,
}

/// How much temporal merge this client did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MergeStats {
    /// Merged messages sent.
    pub batches: u64,
    /// Ops sent in them.
    pub ops: u64,
}

/// What one attempt of an op led to.
enum Attempt {
    Done(Answer),
    /// Retry after the map reaches at least this epoch (or a short pause).
    Again {
        min_epoch: u64,
        why: String,
    },
    /// The OSD refused this client's credentials.
    Denied(String),
}

impl Client {
    /// Connects to the monitors and fetches the map.
    pub async fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
        let mon = MonClient::new(cfg.mons.clone())
            .with_source(cfg.source)
            .with_auth(cfg.auth.clone())
            .with_frames(cfg.frames);
        let map = mon
            .get_map()
            .await
            .map_err(|e| ClientError::Mon(e.to_string()))?;
        let maps = mon.follow(Some(map.clone()));
        let map = Arc::new(map);
        let learning =
            AbortOnDrop(mon.keep_learning_monitors(cairn_monclient::LEARN_MONITORS_EVERY));
        Ok(Client {
            inner: Arc::new(Inner {
                _learning: learning,
                mon,
                maps,
                view: Mutex::new(Arc::new(MapView::new(map))),
                conns: Mutex::new(HashMap::new()),
                connecting: Mutex::new(HashMap::new()),
                cfg,
                merged: Arc::default(),
            }),
            instance: new_instance(),
        })
    }

    /// This client's instance: what its ops carry and what fencing it names.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// The same client (connections, map) sending its ops as `instance` (nonzero): one
    /// instance per open of a volume, so that fencing one open leaves the others alone.
    pub fn with_instance(&self, instance: u64) -> Client {
        Client {
            inner: self.inner.clone(),
            instance,
        }
    }

    /// Fences client `instance` (as `MapChange::BlocklistAdd`, allowed with `w` on `pool`):
    /// returns once this client's map holds the fence. From then on every op this client
    /// sends carries a map epoch at which the instance is fenced, so each OSD it reaches
    /// refuses the fenced instance's ops before it serves this client's: nothing the fenced
    /// instance sends lands after what this client writes.
    pub async fn fence(&self, pool: &str, instance: u64) -> Result<u64, ClientError> {
        let change = cairn_map::MapChange::BlocklistAdd {
            instance,
            pool: pool.to_string(),
            until: 0,
        };
        let epoch = match self.inner.mon.command(change).await {
            Ok(cairn_map::ChangeOutcome::Changed { epoch, .. }) => epoch,
            Ok(cairn_map::ChangeOutcome::Unchanged) => {
                self.inner.mon.get_map().await.map_err(mon)?.epoch
            }
            Err(e) => return Err(mon(e)),
        };
        self.wait_epoch(epoch, self.inner.cfg.op_timeout).await;
        match self.map().epoch >= epoch {
            true => Ok(epoch),
            false => Err(ClientError::Timeout {
                what: "fence",
                after: self.inner.cfg.op_timeout,
                last: format!(
                    "the map did not reach epoch {epoch}, which fences instance {instance:016x}"
                ),
            }),
        }
    }

    /// How many merged messages (and ops in them) this client has sent.
    pub fn merge_stats(&self) -> MergeStats {
        use std::sync::atomic::Ordering::Relaxed;
        MergeStats {
            batches: self.inner.merged.batches.load(Relaxed),
            ops: self.inner.merged.ops.load(Relaxed),
        }
    }

    /// The credentials this client presents.
    pub fn auth(&self) -> &cairn_transport::Auth {
        &self.inner.cfg.auth
    }

    /// The monitor client this client uses.
    pub fn mon(&self) -> &MonClient {
        &self.inner.mon
    }

    /// The newest map this client knows.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.view().map.clone()
    }

    fn view(&self) -> Arc<MapView> {
        let newest = self.inner.maps.borrow().clone();
        let mut v = self.inner.view.lock_or_die();
        if newest.epoch > v.map.epoch {
            *v = Arc::new(MapView::new(newest));
        }
        v.clone()
    }

    /// The id of a pool by name.
    pub fn pool_id(&self, name: &str) -> Result<u32, ClientError> {
        self.map()
            .pool_by_name(name)
            .map(|p| p.id)
            .ok_or_else(|| ClientError::NoSuchPool(name.to_string()))
    }

    /// Makes every write to `pool` acknowledged so far durable on every member that holds it
    /// (each up OSD of the pool's acting sets flushes its WAL). Writes are already durable
    /// when acknowledged in pools with `wal` durability: then this returns at once. For
    /// `memory` pools it is what NBD FLUSH waits for.
    pub async fn sync_pool(&self, pool: u32) -> Result<(), ClientError> {
        let view = self.view();
        let Some(p) = view.map.pools.get(&pool) else {
            return Err(ClientError::NoSuchPool(pool.to_string()));
        };
        if p.durability != cairn_map::Durability::Memory {
            return Ok(());
        }
        let mut osds: Vec<u32> = (0..p.pg_count)
            .flat_map(|pg| view.placement(PgId { pool, pg }).acting)
            .collect();
        osds.sort_unstable();
        osds.dedup();
        let fail = |id: u32, why: String| ClientError::Failed {
            code: cairn_proto::msg::osd::FailCode::Other,
            why: format!("flushing the writes of pool {pool} on osd.{id}: {why}"),
        };
        // All OSDs flush at once: one round trip, not one per OSD.
        let mut syncs = tokio::task::JoinSet::new();
        for id in osds {
            let Some(addr) = view.map.osds.get(&id).map(|o| o.addr.clone()) else {
                continue;
            };
            let conn = self.conn(id, &addr).await.map_err(|e| fail(id, e.why))?;
            let timeout = self.inner.cfg.op_timeout;
            syncs.spawn(async move { (id, conn.sync(timeout).await) });
        }
        while let Some(done) = syncs.join_next().await {
            match done {
                Ok((_, Ok(()))) => {}
                Ok((id, Err(e))) => return Err(fail(id, e.why)),
                Err(e) => {
                    return Err(ClientError::Failed {
                        code: cairn_proto::msg::osd::FailCode::Other,
                        why: format!("flushing the writes of pool {pool}: {e}"),
                    })
                }
            }
        }
        Ok(())
    }

    /// Waits until the map is at least `epoch` (or `max_wait` passes).
    async fn wait_epoch(&self, epoch: u64, max_wait: Duration) {
        let mut rx = self.inner.maps.clone();
        let _ = tokio::time::timeout(max_wait, rx.wait_for(|m| m.epoch >= epoch)).await;
    }

    fn open_conn(&self, id: u32, addr: &str) -> Option<Arc<OsdConn>> {
        self.inner
            .conns
            .lock_or_die()
            .get(&id)
            .filter(|c| c.addr == addr && c.is_open())
            .cloned()
    }

    async fn conn(&self, id: u32, addr: &str) -> Result<Arc<OsdConn>, ConnError> {
        if let Some(c) = self.open_conn(id, addr) {
            return Ok(c);
        }
        let lock = self
            .inner
            .connecting
            .lock_or_die()
            .entry(id)
            .or_default()
            .clone();
        let _connecting = lock.lock().await;
        if let Some(c) = self.open_conn(id, addr) {
            return Ok(c); // another op connected meanwhile
        }
        let cfg = &self.inner.cfg;
        let dialer = Dialer::new(node_kind::CLIENT, cfg.auth.clone())
            .from(cfg.source)
            .frames(cfg.frames);
        let c =
            OsdConn::connect(addr, dialer, cfg.merge_threshold, self.inner.merged.clone()).await?;
        self.inner.conns.lock_or_die().insert(id, c.clone());
        Ok(c)
    }

    async fn attempt(
        &self,
        route: Route,
        req: &OpRequest,
        data: Payload<'_>,
        deadline: Instant,
    ) -> Attempt {
        let epoch = req.epoch;
        let Some((id, addr)) = route.primary else {
            return Attempt::Again {
                min_epoch: epoch + 1,
                why: format!("pg {} has no OSD up", route.pg),
            };
        };
        // Connecting is rare and its future large (~1.6 KiB): boxed, so that every op's future
        // (moved and copied as a whole) stays small.
        let conn = match self.open_conn(id, &addr) {
            Some(c) => Ok(c),
            None => Box::pin(self.conn(id, &addr)).await,
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) if e.refused => return Attempt::Denied(e.why),
            Err(e) => {
                return Attempt::Again {
                    min_epoch: epoch + 1,
                    why: e.why,
                }
            }
        };
        let small = match req.kind {
            OpKind::Read { len, .. } => len <= MERGE_MAX_BYTES,
            _ => data.bytes().len() as u64 <= MERGE_MAX_BYTES,
        };
        // An OSD cut off by the network never answers: the op is sent again once the map no
        // longer has it as the PG's primary, or fails at its deadline.
        let answer = tokio::select! {
            r = conn.call(req, data, small) => r,
            () = self.replaced(id, route.pg) => {
                return Attempt::Again {
                    min_epoch: epoch + 1,
                    why: format!("osd.{id} is no longer the primary of pg {}", route.pg),
                }
            }
            // Cut at the op's deadline: the reason of the attempt before stands (empty why).
            () = tokio::time::sleep_until(deadline) => {
                return Attempt::Again {
                    min_epoch: epoch + 1,
                    why: String::new(),
                }
            }
        };
        match answer {
            Ok((OpReply::NotPrimary { epoch: theirs }, _)) => Attempt::Again {
                min_epoch: theirs.max(epoch + 1),
                why: format!("osd.{id} is not primary of pg {}", route.pg),
            },
            Ok((OpReply::Retry, _)) => Attempt::Again {
                min_epoch: epoch + 1,
                why: format!(
                    "osd.{id} asked to resend (acting set of pg {} changed)",
                    route.pg
                ),
            },
            Ok((OpReply::Degraded { acting, min_size }, _)) => Attempt::Again {
                min_epoch: epoch + 1,
                why: format!(
                    "pg {} has {acting} OSDs up, fewer than min_size {min_size}",
                    route.pg
                ),
            },
            // Only a map change (the OSD back, or declared lost) can end it: asked again after
            // the pause or at once on a new map.
            Ok((OpReply::PgDown { waiting_for }, _)) => Attempt::Again {
                min_epoch: epoch + 1,
                why: pg_down_reason(route.pg, &waiting_for),
            },
            Ok(answer) => Attempt::Done(answer),
            Err(e) => Attempt::Again {
                min_epoch: epoch + 1,
                why: e.why,
            },
        }
    }

    /// Returns once a map arrives in which `osd` is not the primary of `pg` (never if none).
    async fn replaced(&self, osd: u32, pg: PgId) {
        let mut maps = self.inner.maps.clone();
        loop {
            if maps.changed().await.is_err() {
                return std::future::pending().await;
            }
            let map = maps.borrow_and_update().clone();
            if map.pg_placement(pg).primary() != Some(osd) {
                return;
            }
        }
    }

    /// Runs an op until it gets a final answer or the op deadline passes.
    async fn submit(
        &self,
        what: &'static str,
        pool: u32,
        target: Target<'_>,
        kind: OpKind,
        data: &[u8],
    ) -> Result<OpReply, ClientError> {
        self.submit_data(what, pool, target, kind, data)
            .await
            .map(|(r, _, _)| r)
    }

    async fn submit_data(
        &self,
        what: &'static str,
        pool: u32,
        target: Target<'_>,
        kind: OpKind,
        data: &[u8],
    ) -> Result<(OpReply, Vec<u8>, u32), ClientError> {
        self.submit_payload(what, pool, target, kind, Payload::Slice(data))
            .await
    }

    /// Sends an op to the PG's primary until it is answered (following map changes) or its
    /// deadline passes; the answer, its data and the attempts made.
    async fn submit_payload(
        &self,
        what: &'static str,
        pool: u32,
        target: Target<'_>,
        kind: OpKind,
        data: Payload<'_>,
    ) -> Result<(OpReply, Vec<u8>, u32), ClientError> {
        let deadline = Instant::now() + self.inner.cfg.op_timeout;
        let mut last_why = String::new();
        let mut pause = Duration::from_millis(2);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let view = self.view();
            let route = match target {
                Target::Object(name) => view.route_object(pool, name),
                Target::Pg(pg) => view
                    .map
                    .pools
                    .get(&pool)
                    .map(|_| view.route_pg(PgId { pool, pg })),
            };
            let Some(route) = route else {
                return Err(ClientError::NoSuchPool(self.pool_label(pool)));
            };
            let req = OpRequest {
                epoch: view.map.epoch,
                pool,
                pg: route.pg.pg,
                object: match target {
                    Target::Object(n) => n.to_vec(),
                    Target::Pg(_) => Vec::new(),
                },
                kind: kind.clone(),
                instance: self.instance,
            };
            let why = match self.attempt(route, &req, data, deadline).await {
                Attempt::Done((r, d)) => return Ok((r, d, attempts)),
                Attempt::Denied(why) => return Err(ClientError::Denied(why)),
                Attempt::Again { min_epoch, why } => {
                    if !why.is_empty() {
                        last_why = why.clone();
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        if last_why.is_empty() {
                            last_why = "no answer from the PG's primary".to_string();
                        }
                        return Err(ClientError::Timeout {
                            what,
                            after: self.inner.cfg.op_timeout,
                            last: last_why,
                        });
                    }
                    self.wait_epoch(min_epoch, pause.min(left)).await;
                    why
                }
            };
            tracing::debug!(what, reason = %why, "retrying op");
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// A pool's name for messages ("id N" when the map no longer has it).
    fn pool_label(&self, pool: u32) -> String {
        self.map()
            .pools
            .get(&pool)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| format!("id {pool}"))
    }

    fn final_version(&self, r: OpReply, pool: u32, name: &[u8]) -> Result<u64, ClientError> {
        match r {
            OpReply::Ok { version, .. } => Ok(version),
            OpReply::NoSuchObject => Err(ClientError::NoSuchObject {
                pool: self.pool_label(pool),
                object: String::from_utf8_lossy(name).into_owned(),
            }),
            OpReply::NoSuchPool => Err(ClientError::NoSuchPool(self.pool_label(pool))),
            other => Err(unexpected(other)),
        }
    }

    /// Writes `data` at `offset` of an object (creating it).
    pub async fn write(
        &self,
        pool: u32,
        name: &[u8],
        offset: u64,
        data: &[u8],
    ) -> Result<u64, ClientError> {
        let r = self
            .submit(
                "write",
                pool,
                Target::Object(name),
                OpKind::Write { offset },
                data,
            )
            .await?;
        self.final_version(r, pool, name)
    }

    /// [`Client::write`] of a shared buffer: a write that waits in its connection's send queue
    /// (others in flight) is held there instead of copied.
    pub async fn write_shared(
        &self,
        pool: u32,
        name: &[u8],
        offset: u64,
        data: &bytes::Bytes,
    ) -> Result<u64, ClientError> {
        let kind = OpKind::Write { offset };
        let (r, _, _) = self
            .submit_payload(
                "write",
                pool,
                Target::Object(name),
                kind,
                Payload::Shared(data),
            )
            .await?;
        self.final_version(r, pool, name)
    }

    /// Replaces an object's contents with `data`.
    pub async fn write_full(
        &self,
        pool: u32,
        name: &[u8],
        data: &[u8],
    ) -> Result<u64, ClientError> {
        let r = self
            .submit("write", pool, Target::Object(name), OpKind::WriteFull, data)
            .await?;
        self.final_version(r, pool, name)
    }

    /// Creates an object holding `data` only if no object of that name exists (exclusive
    /// create): of several creates of one name, one succeeds and the others get
    /// [`ClientError::Exists`]. A create that finds the object already holding exactly `data`
    /// succeeds (a resend of itself after a lost answer, or an identical create).
    pub async fn create(&self, pool: u32, name: &[u8], data: &[u8]) -> Result<(), ClientError> {
        let r = self
            .submit("create", pool, Target::Object(name), OpKind::Create, data)
            .await?;
        if r == OpReply::Exists {
            return Err(ClientError::Exists {
                pool: self.pool_label(pool),
                object: String::from_utf8_lossy(name).into_owned(),
            });
        }
        self.final_version(r, pool, name).map(|_| ())
    }

    /// Compare-and-swap: replaces object `name` with `data` only if the tag of its
    /// contents (`cairn_proto::msg::osd::contents_tag`, 0 when absent) is `expected_tag`, else [`ClientError::Conflict`] and nothing
    /// is written. For small objects (at most 1 MiB) that several processes rewrite whole.
    pub async fn write_full_if(
        &self,
        pool: u32,
        name: &[u8],
        expected_tag: u64,
        data: &[u8],
    ) -> Result<(), ClientError> {
        let kind = OpKind::WriteFullIf { expected_tag };
        let (r, _, attempts) = self
            .submit_data("conditional write", pool, Target::Object(name), kind, data)
            .await?;
        if r == OpReply::Conflict && attempts > 1 {
            // Sent more than once: the first may have landed and lost its answer.
            let now = self.read(pool, name, 0, data.len() as u64 + 1).await;
            if now.is_ok_and(|b| b == data) {
                return Ok(());
            }
        }
        self.conditional(r, pool, name)
    }

    /// Removes object `name` only if the tag of its contents is `expected_tag`, else
    /// [`ClientError::Conflict`]; [`ClientError::NoSuchObject`] when it is absent.
    pub async fn remove_if(
        &self,
        pool: u32,
        name: &[u8],
        expected_tag: u64,
    ) -> Result<(), ClientError> {
        let kind = OpKind::RemoveIf { expected_tag };
        let (r, _, attempts) = self
            .submit_data("conditional remove", pool, Target::Object(name), kind, &[])
            .await?;
        if r == OpReply::NoSuchObject && attempts > 1 {
            return Ok(()); // an earlier attempt removed it and lost its answer
        }
        self.conditional(r, pool, name)
    }

    fn conditional(&self, r: OpReply, pool: u32, name: &[u8]) -> Result<(), ClientError> {
        if r == OpReply::Conflict {
            return Err(ClientError::Conflict {
                pool: self.pool_label(pool),
                object: String::from_utf8_lossy(name).into_owned(),
            });
        }
        self.final_version(r, pool, name).map(|_| ())
    }

    /// Zeroes `len` bytes at `offset` of an object (whole blocks are freed). Does nothing to a
    /// missing object or beyond its end: the object's size never changes.
    pub async fn zero(
        &self,
        pool: u32,
        name: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<(), ClientError> {
        let r = self
            .submit(
                "zero",
                pool,
                Target::Object(name),
                OpKind::Zero { offset, len },
                &[],
            )
            .await?;
        self.final_version(r, pool, name).map(|_| ())
    }

    /// Sets an object's size (creating it if absent), dropping or zero-extending the tail.
    pub async fn truncate(&self, pool: u32, name: &[u8], size: u64) -> Result<(), ClientError> {
        let r = self
            .submit(
                "truncate",
                pool,
                Target::Object(name),
                OpKind::Truncate { size },
                &[],
            )
            .await?;
        self.final_version(r, pool, name).map(|_| ())
    }

    /// Reads up to `len` bytes at `offset` (short at the end of the object).
    pub async fn read(
        &self,
        pool: u32,
        name: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ClientError> {
        let (r, data, _) = self
            .submit_data(
                "read",
                pool,
                Target::Object(name),
                OpKind::Read { offset, len },
                &[],
            )
            .await?;
        self.final_version(r, pool, name).map(|_| data)
    }

    /// Waits until object `name` may have changed: returns at once when its contents'
    /// tag (`contents_tag`, 0 for an absent object) is not `known_tag`, else at the next write to it, or
    /// after about `max_wait` (at most 30 s, and less than the op timeout). A return only
    /// means "read it again": it can come without a change.
    pub async fn watch(
        &self,
        pool: u32,
        name: &[u8],
        known_tag: u64,
        max_wait: Duration,
    ) -> Result<(), ClientError> {
        let most = (self.inner.cfg.op_timeout / 2).min(Duration::from_millis(
            cairn_proto::msg::osd::MAX_WATCH_WAIT_MS.into(),
        ));
        let kind = OpKind::Watch {
            known_tag,
            max_wait_ms: max_wait.min(most).as_millis() as u32,
        };
        let r = self
            .submit("watch", pool, Target::Object(name), kind, &[])
            .await?;
        self.final_version(r, pool, name).map(|_| ())
    }

    /// Removes an object.
    pub async fn remove(&self, pool: u32, name: &[u8]) -> Result<(), ClientError> {
        let (r, _, attempts) = self
            .submit_data("remove", pool, Target::Object(name), OpKind::Remove, &[])
            .await?;
        // A resent remove finding nothing: an earlier attempt removed it before its answer
        // was lost.
        if attempts > 1 && r == OpReply::NoSuchObject {
            return Ok(());
        }
        self.final_version(r, pool, name).map(|_| ())
    }

    /// Size of an object.
    pub async fn stat(&self, pool: u32, name: &[u8]) -> Result<ObjectInfo, ClientError> {
        let r = self
            .submit("stat", pool, Target::Object(name), OpKind::Stat, &[])
            .await?;
        match r {
            OpReply::Ok { size, .. } => Ok(ObjectInfo { size }),
            other => self
                .final_version(other, pool, name)
                .map(|_| ObjectInfo { size: 0 }),
        }
    }

    /// Names of all objects of a pool, PG by PG (sorted within a PG).
    pub async fn list(&self, pool: u32) -> Result<Vec<Vec<u8>>, ClientError> {
        let pg_count = self
            .map()
            .pools
            .get(&pool)
            .map(|p| p.pg_count)
            .ok_or_else(|| ClientError::NoSuchPool(self.pool_label(pool)))?;
        let mut out = Vec::new();
        for pg in 0..pg_count {
            let mut after = None;
            loop {
                let kind = OpKind::List {
                    after: after.clone(),
                    max: MAX_LIST,
                };
                match self.submit("list", pool, Target::Pg(pg), kind, &[]).await? {
                    OpReply::Listed { names, more } => {
                        after = names.last().cloned();
                        out.extend(names);
                        if !more || after.is_none() {
                            break;
                        }
                    }
                    other => return Err(unexpected(other)),
                }
            }
        }
        Ok(out)
    }
}

#[derive(Clone, Copy)]
enum Target<'a> {
    Object(&'a [u8]),
    Pg(u32),
}

fn mon(e: impl std::fmt::Display) -> ClientError {
    ClientError::Mon(e.to_string())
}

fn unexpected(r: OpReply) -> ClientError {
    match r {
        OpReply::Invalid(s) => ClientError::Invalid(s),
        OpReply::Denied(s) => ClientError::Denied(s),
        OpReply::Fenced => ClientError::Fenced,
        OpReply::Failed { code, why } => ClientError::Failed { code, why },
        other => ClientError::Failed {
            code: cairn_proto::msg::osd::FailCode::Other,
            why: format!("unexpected reply {other:?}"),
        },
    }
}

/// Why an op on a down PG cannot be served yet.
fn pg_down_reason(pg: PgId, waiting_for: &[u32]) -> String {
    let osds: Vec<String> = waiting_for.iter().map(|o| format!("osd.{o}")).collect();
    format!(
        "PG {pg} is down: waiting for {} (may hold newer writes; `cairn osd lost` gives up on \
         an OSD that will not return)",
        osds.join(" or ")
    )
}
