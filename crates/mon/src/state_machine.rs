//! The replicated state machine: the cluster map and the key database, built by applying
//! committed proposals (openraft's `RaftStateMachine`), and the view of them that requests
//! are served from. The key database never leaves the monitors in a map.

use crate::history::{self, History, HistoryWrite};
use crate::store::{self, blocking, dec, enc, get_meta, key, StoreError};
use crate::types::{
    key_change_summary, ApplyResult, BasicNode, Entry, LogId, MonRaft, NodeId, Proposal,
    StorageError, StoredMembership,
};
use cairn_auth::KeyDb;
use cairn_failstop::RwLockOrDie;
use cairn_map::{ChangeOutcome, ClusterMap, Incremental, MapChange, PastInterval, PgId};
use cairn_proto::msg::mon::MapUpdate;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{AnyError, EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError};
use redb::{Database, Durability};
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use tokio::sync::watch;

/// How many epochs behind a subscriber may be and still get incrementals; an older asker
/// gets the full map.
pub const HISTORY: usize = 500;

/// The applied state; also the content of a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SmData {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub map: ClusterMap,
    /// Every entity's key and caps (format 3).
    pub keys: KeyDb,
}

/// What a snapshot carries: the applied state and the map history.
#[derive(Serialize, Deserialize)]
pub(crate) struct SnapshotData {
    pub sm: SmData,
    pub history: History,
}

/// A snapshot as stored in the `meta` table.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    pub data: Vec<u8>,
}

struct Live {
    data: SmData,
    /// The map history ending at `data.map.epoch`.
    history: History,
}

/// Why past intervals could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IntervalsError {
    #[error("this monitor's map is at epoch {have}, older than the asked epoch {until}")]
    Behind { have: u64, until: u64 },
    #[error("the map history does not replay: {0}")]
    Replay(cairn_map::MapError),
}

/// The current map as clients see it: read by the server, written only by the state machine.
pub struct MapView {
    live: RwLock<Live>,
    epoch: watch::Sender<u64>,
}

impl MapView {
    fn new(data: SmData, history: History) -> Self {
        let (epoch, _) = watch::channel(data.map.epoch);
        MapView {
            live: RwLock::new(Live { data, history }),
            epoch,
        }
    }

    // A panic while holding the lock cannot leave the map half-applied (`apply` only
    // changes it on success), so a poisoned lock is still safe to use.
    fn read(&self) -> RwLockReadGuard<'_, Live> {
        self.live.read_or_die()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Live> {
        self.live.write_or_die()
    }

    /// Runs `f` on the current map.
    pub fn with_map<R>(&self, f: impl FnOnce(&ClusterMap) -> R) -> R {
        f(&self.read().data.map)
    }

    /// An empty view (a new cluster's), for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests() -> MapView {
        let sm = SmData {
            last_applied: None,
            membership: StoredMembership::default(),
            map: ClusterMap::new([0; 16]),
            keys: KeyDb::default(),
        };
        let history = History::starting_at(&sm.map);
        MapView::new(sm, history)
    }

    /// Replaces the key database, for unit tests.
    #[cfg(test)]
    pub(crate) fn set_keys_for_tests(&self, keys: KeyDb) {
        self.write().data.keys = keys;
    }

    /// Runs `f` on the key database.
    pub fn with_keys<R>(&self, f: impl FnOnce(&KeyDb) -> R) -> R {
        f(&self.read().data.keys)
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.read().data.map.epoch
    }

    /// Notified with the epoch after every applied change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// What a holder of epoch `have` needs: `None` when it is not behind, the incrementals
    /// when they are all kept, the full map otherwise.
    pub fn update_since(&self, have: u64) -> Option<MapUpdate> {
        let live = self.read();
        let epoch = live.data.map.epoch;
        if have >= epoch && have != 0 {
            return None;
        }
        let oldest = live.history.incs.front().map(|i| i.epoch);
        let near = epoch.saturating_sub(have) <= HISTORY as u64;
        match oldest {
            Some(first) if have != 0 && near && first <= have + 1 => Some(MapUpdate::Incrementals(
                live.history
                    .incs
                    .iter()
                    .filter(|i| i.epoch > have)
                    .cloned()
                    .collect(),
            )),
            _ => Some(MapUpdate::Full(live.data.map.clone())),
        }
    }

    /// The oldest epoch whose map the history can rebuild.
    pub fn history_oldest(&self) -> u64 {
        self.read().history.oldest()
    }

    /// The past intervals of `pg` from epoch `since` (or the oldest kept, when later) to
    /// `until`, with the epoch the list starts at.
    pub(crate) fn past_intervals(
        &self,
        pg: PgId,
        since: u64,
        until: u64,
    ) -> Result<(u64, Vec<PastInterval>), IntervalsError> {
        // Replayed outside the lock: applying changes must not wait for it.
        let (base, incs) = {
            let live = self.read();
            let have = live.data.map.epoch;
            if have < until {
                return Err(IntervalsError::Behind { have, until });
            }
            let h = &live.history;
            let incs: Vec<Incremental> = h
                .incs
                .iter()
                .take_while(|i| i.epoch <= until)
                .cloned()
                .collect();
            (h.base.clone(), incs)
        };
        cairn_map::intervals::compute(&base, &incs, pg, since, until)
            .map_err(IntervalsError::Replay)
    }

    fn publish(&self, epoch: u64) {
        self.epoch.send_replace(epoch);
    }
}

/// The state machine openraft drives.
pub struct StateMachine {
    db: Arc<Database>,
    view: Arc<MapView>,
    fsid: [u8; 16],
}

fn sm_read_err(e: StoreError) -> StorageError {
    StorageIOError::read_state_machine(AnyError::new(&e)).into()
}

fn sm_write_err(e: StoreError) -> StorageError {
    StorageIOError::write_state_machine(AnyError::new(&e)).into()
}

impl StateMachine {
    /// Loads the applied state (the newer of the saved state and the last snapshot), or an
    /// empty map at epoch 1 for a new cluster.
    pub(crate) fn open(db: Arc<Database>, fsid: [u8; 16]) -> Result<Self, StoreError> {
        let saved: Option<SmData> = get_meta(&db, key::STATE_MACHINE)?;
        let snap: Option<StoredSnapshot> = get_meta(&db, key::SNAPSHOT)?;
        let from_snap = match snap {
            Some(s) => Some(dec::<SnapshotData>("snapshot", &s.data)?),
            None => None,
        };
        let (data, history) = match (saved, from_snap) {
            (Some(a), Some(b)) if b.sm.last_applied > a.last_applied => (b.sm, Some(b.history)),
            (Some(a), _) => (a, None),
            (None, Some(b)) => (b.sm, Some(b.history)),
            (None, None) => {
                let sm = SmData {
                    last_applied: None,
                    membership: StoredMembership::default(),
                    map: ClusterMap::new(fsid),
                    keys: KeyDb::default(),
                };
                (sm, None)
            }
        };
        let history = match history {
            Some(h) => h,
            None => history::load(&db, &data.map)?,
        };
        Ok(StateMachine {
            db,
            view: Arc::new(MapView::new(data, history)),
            fsid,
        })
    }

    /// The view the server reads.
    pub(crate) fn view(&self) -> Arc<MapView> {
        self.view.clone()
    }
}

impl RaftStateMachine<MonRaft> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let live = self.view.read();
        Ok((live.data.last_applied, live.data.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut replies = Vec::new();
        let mut hw = HistoryWrite::default();
        let (bytes, before, after) = {
            let mut live = self.view.write();
            let before = live.data.map.epoch;
            for e in entries {
                live.data.last_applied = Some(e.log_id);
                match e.payload {
                    EntryPayload::Blank => {
                        replies.push(ApplyResult::Map(Ok(ChangeOutcome::Unchanged)))
                    }
                    EntryPayload::Normal(Proposal::Keys(k)) => {
                        let r = live.data.keys.apply(&k);
                        match &r {
                            Ok(()) => {
                                tracing::info!(change = %key_change_summary(&k), "key database changed")
                            }
                            Err(e) => {
                                tracing::info!(change = %key_change_summary(&k), "key change refused: {e}")
                            }
                        }
                        replies.push(ApplyResult::Keys(r));
                    }
                    EntryPayload::Normal(Proposal::Map(change)) => {
                        let r = live.data.map.apply(&change);
                        if let Ok(ChangeOutcome::Changed { epoch, .. }) = r {
                            tracing::info!(epoch, ?change, "map changed");
                            let inc = Incremental { epoch, change };
                            hw.added.push((epoch, enc(&inc)));
                            live.history.push(inc);
                        } else if let MapChange::TrimHistory { below } = change {
                            let below = below.min(live.data.map.epoch);
                            if let Some(dropped) = live.history.trim(below) {
                                tracing::info!(
                                    below,
                                    epochs = dropped.len(),
                                    "map history trimmed"
                                );
                                hw.dropped.extend(dropped);
                                hw.base = Some(enc(&live.history.base));
                            }
                        }
                        replies.push(ApplyResult::Map(r));
                    }
                    EntryPayload::Membership(m) => {
                        tracing::info!(log_id = %e.log_id, membership = ?m, "monitor membership");
                        live.data.membership = StoredMembership::new(Some(e.log_id), m);
                        replies.push(ApplyResult::Map(Ok(ChangeOutcome::Unchanged)));
                    }
                }
            }
            (enc(&live.data), before, live.data.map.epoch)
        };
        // No fsync: the log holds these entries durably; a lost save is replayed at start.
        blocking(&self.db, move |db| {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::None);
            txn.open_table(store::META)?
                .insert(key::STATE_MACHINE, bytes.as_slice())?;
            hw.apply(&txn)?;
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(sm_write_err)?;
        if after != before {
            self.view.publish(after);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            view: self.view.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let snap_err = |e: StoreError| -> StorageError {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::new(&e)).into()
        };
        let got: SnapshotData = dec("snapshot", &bytes).map_err(snap_err)?;
        if got.sm.map.fsid != self.fsid {
            let e = StoreError::Decode {
                what: "snapshot",
                reason: "it belongs to another cluster (fsid differs)".into(),
            };
            return Err(snap_err(e));
        }
        let data = SmData {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            map: got.sm.map,
            keys: got.sm.keys,
        };
        let hist = got.history;
        let sm = enc(&data);
        let stored = enc(&StoredSnapshot {
            meta: meta.clone(),
            data: bytes,
        });
        let h = hist.clone();
        blocking(&self.db, move |db| {
            let txn = db.begin_write()?;
            {
                let mut meta = txn.open_table(store::META)?;
                meta.insert(key::STATE_MACHINE, sm.as_slice())?;
                meta.insert(key::SNAPSHOT, stored.as_slice())?;
            }
            history::replace(&txn, &h)?;
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| {
            StorageError::from(StorageIOError::write_snapshot(
                Some(meta.signature()),
                AnyError::new(&e),
            ))
        })?;
        let epoch = data.map.epoch;
        tracing::info!(epoch, snapshot = %meta, "installed a map snapshot from the leader");
        {
            let mut live = self.view.write();
            live.data = data;
            live.history = hist;
        }
        self.view.publish(epoch);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<MonRaft>>, StorageError> {
        let snap: Option<StoredSnapshot> = blocking(&self.db, |db| get_meta(db, key::SNAPSHOT))
            .await
            .map_err(sm_read_err)?;
        Ok(snap.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

/// Builds snapshots from the current applied state.
pub struct SnapshotBuilder {
    db: Arc<Database>,
    view: Arc<MapView>,
}

impl RaftSnapshotBuilder<MonRaft> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<MonRaft>, StorageError> {
        let (data, last, membership) = {
            let live = self.view.read();
            (
                enc(&SnapshotData {
                    sm: live.data.clone(),
                    history: live.history.clone(),
                }),
                live.data.last_applied,
                live.data.membership.clone(),
            )
        };
        // Same applied log id means same content, so the id only needs to tell apart
        // snapshots of different states.
        let snapshot_id = match last {
            Some(l) => l.to_string(),
            None => "empty".to_string(),
        };
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: membership,
            snapshot_id,
        };
        let stored = enc(&StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        });
        blocking(&self.db, move |db| {
            store::put_meta(db, Durability::Immediate, &[(key::SNAPSHOT, &stored)])
        })
        .await
        .map_err(|e| {
            StorageError::from(StorageIOError::write_snapshot(
                Some(meta.signature()),
                AnyError::new(&e),
            ))
        })?;
        tracing::debug!(snapshot = %meta, "built a map snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}
