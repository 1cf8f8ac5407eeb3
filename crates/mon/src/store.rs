//! The monitor's redb database (`<dir>/mon.redb`): tables, identity checks and the helpers the
//! log store and the state machine share.
//!
//! Layout (format [`FORMAT`]):
//! - table `raft_log`: log index (u64) -> postcard of the openraft `Entry` (a `Proposal`:
//!   map change or key change; a membership change; or a blank entry).
//! - table `meta`: name -> postcard value:
//!   `format` (u32), `fsid` ([u8; 16]), `mon_id` (u64) — written once at creation;
//!   `vote`, `committed`, `purged` — Raft's persistent markers;
//!   `state_machine` — the applied state ([`crate::state_machine::SmData`]: the map and the
//!   key database);
//!   `snapshot` — the last snapshot (meta + the serialized `SmData` and map history);
//!   `history_base` — the map at the oldest epoch of the history.
//! - table `map_history`: epoch (u64) -> postcard `Incremental`, every epoch after the base
//!   (`crate::history`).
//!
//! Log appends, truncations, votes and snapshots are committed with `Durability::Immediate`
//! (fsync before returning), so they survive kill -9 and power loss. The applied state is
//! committed without fsync: losing its latest versions only means replaying a few committed
//! log entries at the next start, which openraft does from the `committed` marker.

use crate::config::fsid_hex;
use crate::error::MonError;
use redb::{Database, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The Raft log.
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Everything else, by name.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// On-disk format written by this build (2: OSDs' `lost_at`, map history; 3: the key
/// database, log entries as `Proposal`s; 4: pools' placement rule, hosts' labels; 5: the
/// client blocklist; 6: the monitors' key in the key database once rotated; older formats
/// are upgraded in place at open, `crate::migrate`, `crate::migrate_v4`, `crate::migrate_v5`
/// and `crate::migrate_v6`).
pub const FORMAT: u32 = 6;

/// Names of the `meta` entries.
pub(crate) mod key {
    pub const FORMAT: &str = "format";
    pub const FSID: &str = "fsid";
    pub const MON_ID: &str = "mon_id";
    pub const VOTE: &str = "vote";
    pub const COMMITTED: &str = "committed";
    pub const PURGED: &str = "purged";
    pub const STATE_MACHINE: &str = "state_machine";
    pub const SNAPSHOT: &str = "snapshot";
}

/// File name of the database inside the data dir.
pub const DB_FILE: &str = "mon.redb";

/// A storage operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    // Boxed: redb's error is large and these results are returned on every storage call.
    #[error("database: {0}")]
    Db(Box<redb::Error>),
    #[error("stored {what} is unreadable ({reason}): the database is damaged")]
    Decode { what: &'static str, reason: String },
    #[error("storage task failed: {0}")]
    Task(String),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Db(Box::new(e.into()))
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// Encodes a stored value.
pub(crate) fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    cairn_proto::msg::encode(v)
}

/// Decodes a stored value.
pub(crate) fn dec<T: DeserializeOwned>(what: &'static str, b: &[u8]) -> Result<T, StoreError> {
    cairn_proto::msg::decode(what, b).map_err(|e| StoreError::Decode {
        what,
        reason: e.reason,
    })
}

/// Reads one `meta` entry.
pub(crate) fn get_meta<T: DeserializeOwned>(
    db: &Database,
    name: &'static str,
) -> Result<Option<T>, StoreError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(META)?;
    let Some(v) = table.get(name)? else {
        return Ok(None);
    };
    dec(name, v.value()).map(Some)
}

/// Writes `meta` entries in one transaction with the given durability.
pub(crate) fn put_meta(
    db: &Database,
    durability: redb::Durability,
    entries: &[(&str, &[u8])],
) -> Result<(), StoreError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(durability);
    {
        let mut table = txn.open_table(META)?;
        for (k, v) in entries {
            table.insert(*k, *v)?;
        }
    }
    txn.commit()?;
    Ok(())
}

/// Runs a database operation on the blocking pool (commits wait for fsync).
pub(crate) async fn blocking<T, F>(db: &Arc<Database>, f: F) -> Result<T, StoreError>
where
    F: FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    let db = db.clone();
    tokio::task::spawn_blocking(move || f(&db))
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
}

/// What a data dir says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredIdentity {
    /// The monitor whose data this is.
    pub id: u64,
    /// The cluster it belongs to.
    pub fsid: [u8; 16],
}

fn store_err(path: &Path, e: impl std::fmt::Display) -> MonError {
    MonError::Store {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn open_db(path: &Path) -> Result<Database, MonError> {
    match Database::create(path) {
        Ok(db) => Ok(db),
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => Err(MonError::InUse {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(store_err(path, e)),
    }
}

/// Reads the identity of an existing data dir without starting a monitor (`None` when the
/// dir holds no monitor database yet). Fails if a monitor is running on it.
pub fn stored_identity(dir: &Path) -> Result<Option<StoredIdentity>, MonError> {
    let path = dir.join(DB_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let db = open_db(&path)?;
    read_identity(&db).map_err(|e| store_err(&path, e))
}

fn read_identity(db: &Database) -> Result<Option<StoredIdentity>, StoreError> {
    let txn = db.begin_read()?;
    let table = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let (Some(id), Some(fsid)) = (table.get(key::MON_ID)?, table.get(key::FSID)?) else {
        return Ok(None);
    };
    Ok(Some(StoredIdentity {
        id: dec(key::MON_ID, id.value())?,
        fsid: dec(key::FSID, fsid.value())?,
    }))
}

/// Opens (creating if needed) the database of monitor `id` of cluster `fsid` in `dir`,
/// refusing a dir that belongs to another monitor or cluster.
pub(crate) fn open(dir: &Path, id: u64, fsid: [u8; 16]) -> Result<Arc<Database>, MonError> {
    std::fs::create_dir_all(dir).map_err(|source| MonError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let path: PathBuf = dir.join(DB_FILE);
    let db = open_db(&path)?;
    // It holds every entity's key (the key database): for the monitor's user only, like a
    // keyring.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|err| store_err(&path, format!("cannot make it private (chmod 600): {err}")))?;
    let e = |e: StoreError| store_err(&path, e);
    let format: Option<u32> = get_meta_if_exists(&db, key::FORMAT).map_err(e)?;
    if format == Some(1) {
        tracing::info!(path = %path.display(), "upgrading the monitor database from format 1 to 2");
        crate::migrate::from_v1(&db).map_err(e)?;
    }
    if matches!(format, Some(1 | 2)) {
        tracing::info!(path = %path.display(), "upgrading the monitor database from format 2 to 3");
        crate::migrate::from_v2(&db).map_err(e)?;
    }
    if matches!(format, Some(1..=3)) {
        tracing::info!(path = %path.display(), "upgrading the monitor database from format 3 to 4 (pools keep placement v1)");
        crate::migrate_v4::from_v3(&db).map_err(e)?;
    } else if format == Some(4) {
        tracing::info!(path = %path.display(), "upgrading the monitor database from format 4 to 5 (an empty client blocklist)");
        crate::migrate_v5::from_v4(&db).map_err(e)?;
    } else if format == Some(5) {
        tracing::info!(path = %path.display(), "upgrading the monitor database from format 5 to 6 (room for the monitors' rotated key)");
        crate::migrate_v6::from_v5(&db).map_err(e)?;
    } else if let Some(found) = format {
        if found != FORMAT {
            return Err(MonError::Format {
                path,
                found,
                supported: FORMAT,
            });
        }
    }
    match read_identity(&db).map_err(e)? {
        Some(s) if s.fsid != fsid => {
            return Err(MonError::FsidMismatch {
                dir: dir.to_path_buf(),
                stored: fsid_hex(&s.fsid),
                given: fsid_hex(&fsid),
            })
        }
        Some(s) if s.id != id => {
            return Err(MonError::IdMismatch {
                dir: dir.to_path_buf(),
                stored: s.id,
                given: id,
            })
        }
        Some(_) => {}
        None => create_tables(&db, id, fsid).map_err(e)?,
    }
    Ok(Arc::new(db))
}

fn get_meta_if_exists<T: DeserializeOwned>(
    db: &Database,
    name: &'static str,
) -> Result<Option<T>, StoreError> {
    match get_meta(db, name) {
        Err(StoreError::Db(e)) if matches!(*e, redb::Error::TableDoesNotExist(_)) => Ok(None),
        r => r,
    }
}

fn create_tables(db: &Database, id: u64, fsid: [u8; 16]) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        txn.open_table(LOG)?;
        let mut meta = txn.open_table(META)?;
        meta.insert(key::FORMAT, enc(&FORMAT).as_slice())?;
        meta.insert(key::FSID, enc(&fsid).as_slice())?;
        meta.insert(key::MON_ID, enc(&id).as_slice())?;
    }
    txn.commit()?;
    Ok(())
}
