//! The PG log: one entry per write, kept in the PG's store collection beside its objects and
//! written in the same transaction as the write itself, so an OSD's objects and its log never
//! disagree. Every member of the acting set writes the same entry (same version, same epoch).
//!
//! Peering compares members' logs to find who is behind and which objects changed since
//! (docs/format/pglog.md). The log keeps the last [`LOG_KEEP`] entries: each write removes
//! the entry `LOG_KEEP` versions older than itself.

use cairn_store::{CollId, Store, StoreError, Transaction};
use serde::{Deserialize, Serialize};

/// Prefix of log entry keys: `log.` + the version as 8 big-endian bytes (so keys sort by
/// version).
pub const LOG_PREFIX: &[u8] = b"log.";
/// Entries kept per PG.
pub const LOG_KEEP: u64 = 4096;
/// Format version of an encoded entry (its first byte). Format 1 entries (no ranges) are
/// still read.
pub const ENTRY_FORMAT: u8 = 2;
/// Most log entries taken from a peer: a log holds [`LOG_KEEP`] once trimmed, with room
/// for one that is not yet.
pub const MAX_PEER_ENTRIES: usize = 4 * LOG_KEEP as usize;
/// Largest encoded entry: an object name is at most 1 KiB.
pub const MAX_ENTRY: usize = 2048;

/// What a write did to its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogOp {
    /// The object was replaced as a whole (write-full), or changed in a way format 1 did not
    /// describe: any byte may differ. It exists afterwards.
    Modify,
    /// The object was removed.
    Remove,
    /// `len` bytes at `offset` were written or zeroed (format 2); it exists afterwards.
    Range { offset: u64, len: u64 },
    /// The object was truncated or extended to `size` bytes (format 2); it exists afterwards.
    Resize { size: u64 },
}

/// One write of a PG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// The PG version the write created.
    pub version: u64,
    /// The map epoch of the primary that assigned the version: of two entries with the same
    /// version, the one of the later epoch wins.
    pub epoch: u64,
    pub object: Vec<u8>,
    pub op: LogOp,
}

/// Why a stored log entry cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("PG log entry {key:?} is damaged: {why}")]
    Damaged { key: Vec<u8>, why: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<LogError> for crate::failure::Failure {
    /// A damaged entry is this OSD's store failing its checks.
    fn from(e: LogError) -> crate::failure::Failure {
        match e {
            LogError::Store(e) => e.into(),
            damaged @ LogError::Damaged { .. } => crate::failure::Failure {
                class: crate::failure::FailClass::StoreCorrupt,
                what: damaged.to_string(),
                local_store: true,
            },
        }
    }
}

/// The key of the entry of `version`.
pub fn key(version: u64) -> Vec<u8> {
    let mut k = LOG_PREFIX.to_vec();
    k.extend_from_slice(&version.to_be_bytes());
    k
}

/// Encodes an entry (format byte, then postcard).
pub fn encode(e: &LogEntry) -> Vec<u8> {
    let mut v = vec![ENTRY_FORMAT];
    v.extend_from_slice(&cairn_proto::msg::encode(e));
    v
}

/// Decodes an entry stored under `key`, checking that it is the entry of that key's version.
pub fn decode(key: &[u8], value: &[u8]) -> Result<LogEntry, LogError> {
    let damaged = |why: String| LogError::Damaged {
        key: key.to_vec(),
        why,
    };
    if value.len() > MAX_ENTRY {
        return Err(damaged(format!(
            "{} bytes (at most {MAX_ENTRY})",
            value.len()
        )));
    }
    let (&format, body) = value.split_first().ok_or_else(|| damaged("empty".into()))?;
    if !(1..=ENTRY_FORMAT).contains(&format) {
        return Err(damaged(format!(
            "format {format}; this OSD reads 1 to {ENTRY_FORMAT}"
        )));
    }
    let e: LogEntry =
        cairn_proto::msg::decode("pg log entry", body).map_err(|e| damaged(e.to_string()))?;
    if key != self::key(e.version).as_slice() {
        return Err(damaged(format!("holds version {}", e.version)));
    }
    Ok(e)
}

/// Decodes the log entries a peer sent (the data part of `PG_INFO` and of a `PushKind::Log`
/// push): at most [`MAX_PEER_ENTRIES`] entries, each for an object name the protocol
/// allows, in increasing version order, so nothing a peer sends can be stored as a log this
/// OSD could not read back.
pub fn decode_peer_entries(data: &[u8]) -> Result<Vec<LogEntry>, crate::failure::Failure> {
    let entries: Vec<LogEntry> = cairn_proto::msg::decode("pg log entries", data)?;
    if entries.len() > MAX_PEER_ENTRIES {
        return Err(crate::failure::Failure::protocol(format!(
            "{} log entries; at most {MAX_PEER_ENTRIES} are taken from a peer",
            entries.len()
        )));
    }
    let max_name = cairn_proto::msg::osd::MAX_OBJECT_NAME;
    if let Some(e) = entries.iter().find(|e| e.object.len() > max_name) {
        return Err(crate::failure::Failure::protocol(format!(
            "log entry {} names an object of {} bytes (at most {max_name})",
            e.version,
            e.object.len()
        )));
    }
    if entries.windows(2).any(|w| w[1].version <= w[0].version) {
        return Err(crate::failure::Failure::protocol(
            "log entries are not in increasing version order",
        ));
    }
    Ok(entries)
}

/// Adds `e` to the transaction `t` of its write, and drops the entry that falls out of the
/// kept window.
pub fn append(t: &mut Transaction, coll: CollId, e: &LogEntry) {
    t.kv_set(coll, &key(e.version), &encode(e));
    if e.version > LOG_KEEP {
        t.kv_rm(coll, &key(e.version - LOG_KEEP));
    }
}

/// Up to `limit` entries with versions after `after`, in version order.
pub fn read_after(
    store: &Store,
    coll: CollId,
    after: u64,
    limit: usize,
) -> Result<Vec<LogEntry>, LogError> {
    let start = key(after.saturating_add(1));
    let end = [LOG_PREFIX, &[0xff; 9][..]].concat();
    store
        .kv_range(coll, &start, Some(&end), limit)?
        .iter()
        .map(|(k, v)| decode(k, v))
        .collect()
}

/// The oldest version still in the log (`None` for an empty log).
pub fn tail(store: &Store, coll: CollId) -> Result<Option<u64>, LogError> {
    Ok(read_after(store, coll, 0, 1)?.first().map(|e| e.version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store::mem_store as store;

    #[test]
    fn peer_entries_are_bounded_named_and_ordered() {
        let enc = |v: &Vec<LogEntry>| cairn_proto::msg::encode(v);
        let good: Vec<LogEntry> = (1..=10).map(entry).collect();
        assert_eq!(decode_peer_entries(&enc(&good)).expect("good"), good);
        let mut unordered = good.clone();
        unordered.swap(3, 4);
        assert!(decode_peer_entries(&enc(&unordered))
            .unwrap_err()
            .what
            .contains("increasing"));
        let mut long = good.clone();
        long[2].object = vec![b'x'; 5000];
        assert!(decode_peer_entries(&enc(&long))
            .unwrap_err()
            .what
            .contains("5000 bytes"));
        let many: Vec<LogEntry> = (1..=MAX_PEER_ENTRIES as u64 + 1).map(entry).collect();
        assert!(decode_peer_entries(&enc(&many))
            .unwrap_err()
            .what
            .contains("at most"));
        assert!(decode_peer_entries(b"\xff\xff").is_err());
    }

    fn entry(version: u64) -> LogEntry {
        LogEntry {
            version,
            epoch: 7 + version / 1000,
            object: format!("obj{}", version % 13).into_bytes(),
            op: match version % 4 {
                0 => LogOp::Remove,
                1 => LogOp::Modify,
                2 => LogOp::Range {
                    offset: version * 4096,
                    len: 512,
                },
                _ => LogOp::Resize { size: version },
            },
        }
    }

    #[test]
    fn entries_round_trip_and_damage_is_refused() {
        let e = entry(42);
        let b = encode(&e);
        assert_eq!(decode(&key(42), &b).expect("decodes"), e);
        assert!(
            decode(&key(43), &b).is_err(),
            "entry under another version's key"
        );
        let mut bad = b.clone();
        bad[0] = 9;
        assert!(decode(&key(42), &bad).is_err(), "unknown format");
        let mut old = b.clone();
        old[0] = 1;
        assert_eq!(decode(&key(42), &old).expect("format 1 is read"), e);
        assert!(decode(&key(42), &b[..b.len() - 1]).is_err(), "truncated");
        assert!(decode(&key(42), &[]).is_err());
        assert!(decode(&key(42), &vec![1u8; MAX_ENTRY + 1]).is_err());
    }

    #[test]
    fn the_log_keeps_the_last_entries_in_order() {
        let s = store();
        let coll: CollId = 5;
        let total = LOG_KEEP + 300;
        for v in 1..=total {
            let mut t = Transaction::new();
            if v == 1 {
                t.create_collection(coll);
            }
            append(&mut t, coll, &entry(v));
            s.submit(&t).expect("submit");
        }
        assert_eq!(tail(&s, coll).expect("tail"), Some(total - LOG_KEEP + 1));
        let all = read_after(&s, coll, 0, usize::MAX).expect("read");
        assert_eq!(all.len() as u64, LOG_KEEP);
        assert!(all.windows(2).all(|w| w[1].version == w[0].version + 1));
        assert_eq!(all.last(), Some(&entry(total)));
        let recent = read_after(&s, coll, total - 10, 100).expect("read");
        assert_eq!(recent, (total - 9..=total).map(entry).collect::<Vec<_>>());
        assert!(read_after(&s, coll, total, 10).expect("read").is_empty());
    }
}
