//! This OSD's copy of a PG as its store holds it: the PG's version, the epoch it last went
//! active here, the objects marked missing, its log, and the object reads and listings a
//! primary's peering and recovery ask for. Members answer from these (`member.rs`); split,
//! scrub and the primary read them too.

use super::refusal::Refusal;
use crate::failure::Failure;
use crate::pglog::{self, LogEntry};
use crate::pgstate::{coll_of, LES_KEY, VERSION_KEY};
use cairn_map::PgId;
use cairn_proto::msg::peering::{PgInfo, PgNames, PgObject, MAX_NAMES, RECOVERY_CHUNK};
use cairn_proto::msg::ErrorCode;
use cairn_store::Store;

pub fn pg_id(pool: u32, pg: u32) -> PgId {
    PgId { pool, pg }
}

/// Prefix of the keys marking objects missing on this member (`missing.` + object name).
pub const MISSING_PREFIX: &[u8] = b"missing.";
/// The end of the missing marks' key range (`/` sorts right after `.`).
pub(super) const MISSING_END: &[u8] = b"missing/";

pub fn missing_key(object: &[u8]) -> Vec<u8> {
    [MISSING_PREFIX, object].concat()
}

/// The objects marked missing in this OSD's copy of `pg`.
pub fn missing(store: &Store, pg: PgId) -> Result<Vec<Vec<u8>>, Failure> {
    let coll = coll_of(pg);
    if !store.collection_exists(coll) {
        return Ok(Vec::new());
    }
    let marks = store.kv_range(coll, MISSING_PREFIX, Some(MISSING_END), usize::MAX)?;
    Ok(marks
        .into_iter()
        .map(|(k, _)| k[MISSING_PREFIX.len()..].to_vec())
        .collect())
}

/// The PG's last version as stored (0 when it has nothing).
pub fn last_version(store: &Store, pg: PgId) -> u64 {
    stored_u64(store, pg, VERSION_KEY)
}

/// The epoch the PG last went active with this OSD acting (0: never, or no copy).
pub fn last_epoch_started(store: &Store, pg: PgId) -> u64 {
    stored_u64(store, pg, LES_KEY)
}

fn stored_u64(store: &Store, pg: PgId, key: &[u8]) -> u64 {
    store
        .kv_get(coll_of(pg), key)
        .ok()
        .flatten()
        .and_then(|v| v.get(..8).and_then(|b| b.try_into().ok()))
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

/// This OSD's info of `pg` and its log entries after `since`.
pub fn info(store: &Store, pg: PgId, since: u64) -> Result<(PgInfo, Vec<LogEntry>), Failure> {
    let coll = coll_of(pg);
    if !store.collection_exists(coll) {
        let empty = PgInfo {
            last_version: 0,
            last_epoch: 0,
            tail: None,
            missing: Vec::new(),
            last_epoch_started: 0,
        };
        return Ok((empty, Vec::new()));
    }
    let entries = pglog::read_after(store, coll, since, pglog::LOG_KEEP as usize)?;
    let last_v = last_version(store, pg);
    let last = pglog::read_after(store, coll, last_v.saturating_sub(1), 1)?;
    let info = PgInfo {
        last_version: last_v,
        last_epoch: last.first().map_or(0, |e| e.epoch),
        tail: pglog::tail(store, coll)?,
        missing: missing(store, pg)?,
        last_epoch_started: last_epoch_started(store, pg),
    };
    Ok((info, entries))
}

/// Bytes `offset..offset+len` of an object, with whether it exists and its size.
pub fn pull(
    store: &Store,
    pg: PgId,
    object: &[u8],
    offset: u64,
    len: u64,
) -> Result<(PgObject, Vec<u8>), Refusal> {
    let coll = coll_of(pg);
    // Never "absent" for want of the whole PG (an old copy deleted after a rebalance): a
    // recovery reading from here would delete the object.
    if !store.collection_exists(coll) {
        let why = format!("this OSD holds no copy of pg {pg}");
        return Err(Refusal::new(ErrorCode::NotFound, why));
    }
    // Read before the object: the bytes are at least as new as this version.
    let version = last_version(store, pg);
    match store.stat(coll, object) {
        Ok(st) => {
            let n = len.min(RECOVERY_CHUNK);
            let bytes = store.read(coll, object, offset, n)?;
            let obj = PgObject {
                exists: true,
                size: st.size,
                version,
            };
            Ok((obj, bytes))
        }
        Err(_) => Ok((
            PgObject {
                exists: false,
                size: 0,
                version,
            },
            Vec::new(),
        )),
    }
}

/// Object names of the PG after `after`.
pub fn list(store: &Store, pg: PgId, after: Option<&[u8]>) -> Result<PgNames, Failure> {
    let coll = coll_of(pg);
    if !store.collection_exists(coll) {
        return Ok(PgNames {
            names: Vec::new(),
            more: false,
        });
    }
    let mut names = store.list_objects(coll, after, MAX_NAMES as usize + 1)?;
    let more = names.len() > MAX_NAMES as usize;
    names.truncate(MAX_NAMES as usize);
    Ok(PgNames { names, more })
}
