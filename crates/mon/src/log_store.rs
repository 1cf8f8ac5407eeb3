//! The Raft log, vote and commit markers in redb (openraft's `RaftLogStorage`).

use crate::store::{self, blocking, dec, enc, get_meta, key, StoreError, LOG, META};
use crate::types::{Entry, LogId, MonRaft, NodeId, StorageError};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, RaftLogId, StorageIOError, Vote};
use redb::{Database, Durability, ReadableTable};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// The log store. Cheap to clone: readers handed to replication share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    pub(crate) fn new(db: Arc<Database>) -> Self {
        LogStore { db }
    }
}

fn read_err(e: StoreError) -> StorageError {
    StorageIOError::read_logs(AnyError::new(&e)).into()
}

fn write_err(e: StoreError) -> StorageError {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

fn owned_bound(b: Bound<&u64>) -> Bound<u64> {
    match b {
        Bound::Included(x) => Bound::Included(*x),
        Bound::Excluded(x) => Bound::Excluded(*x),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Entries with an index in `range`, in order.
fn read_range(db: &Database, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>, StoreError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(LOG)?;
    let mut out = Vec::new();
    for row in table.range::<u64>(range)? {
        let (_, v) = row?;
        out.push(dec("raft log entry", v.value())?);
    }
    Ok(out)
}

/// Deletes the entries with an index in `range` and records `meta` in the same transaction.
fn delete_range(
    db: &Database,
    range: (Bound<u64>, Bound<u64>),
    meta: Option<(&str, Vec<u8>)>,
) -> Result<(), StoreError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    {
        let mut table = txn.open_table(LOG)?;
        table.retain_in::<u64, _>(range, |_, _| false)?;
        if let Some((k, v)) = meta {
            txn.open_table(META)?.insert(k, v.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}

impl RaftLogReader<MonRaft> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let r = (
            owned_bound(range.start_bound()),
            owned_bound(range.end_bound()),
        );
        blocking(&self.db, move |db| read_range(db, r))
            .await
            .map_err(read_err)
    }
}

impl RaftLogStorage<MonRaft> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<MonRaft>, StorageError> {
        blocking(&self.db, |db| {
            let purged: Option<LogId> = get_meta(db, key::PURGED)?;
            let txn = db.begin_read()?;
            let table = txn.open_table(LOG)?;
            let last = match table.last()? {
                Some((_, v)) => Some(*dec::<Entry>("raft log entry", v.value())?.get_log_id()),
                None => purged,
            };
            Ok(LogState {
                last_purged_log_id: purged,
                last_log_id: last,
            })
        })
        .await
        .map_err(read_err)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let v = enc(vote);
        blocking(&self.db, move |db| {
            store::put_meta(db, Durability::Immediate, &[(key::VOTE, &v)])
        })
        .await
        .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        blocking(&self.db, |db| get_meta(db, key::VOTE))
            .await
            .map_err(|e| StorageIOError::read_vote(AnyError::new(&e)).into())
    }

    /// The committed marker lets a restarted monitor replay committed entries into its map
    /// before it hears from a leader. It may lag (no fsync): replay then stops earlier and the
    /// leader brings the rest.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let v = enc(&committed);
        blocking(&self.db, move |db| {
            store::put_meta(db, Durability::None, &[(key::COMMITTED, &v)])
        })
        .await
        .map_err(write_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        blocking(&self.db, |db| {
            Ok(get_meta::<Option<LogId>>(db, key::COMMITTED)?.flatten())
        })
        .await
        .map_err(read_err)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<MonRaft>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let rows: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .map(|e| (e.get_log_id().index, enc(&e)))
            .collect();
        let r = blocking(&self.db, move |db| {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate);
            {
                let mut table = txn.open_table(LOG)?;
                for (i, v) in &rows {
                    table.insert(*i, v.as_slice())?;
                }
            }
            txn.commit()?;
            Ok(())
        })
        .await;
        // The commit above is durable when it returns, so the flush is reported right away.
        match r {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(write_err(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "truncating the raft log");
        let r = (Bound::Included(log_id.index), Bound::Unbounded);
        blocking(&self.db, move |db| delete_range(db, r, None))
            .await
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "purging the raft log");
        let r = (Bound::Unbounded, Bound::Included(log_id.index));
        let marker = enc(&log_id);
        blocking(&self.db, move |db| {
            delete_range(db, r, Some((key::PURGED, marker)))
        })
        .await
        .map_err(write_err)
    }
}
