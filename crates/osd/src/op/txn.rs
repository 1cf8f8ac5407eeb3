//! The store transaction of a write: the same on the primary and on every replica, so all
//! members hold the same object and PG version.

use crate::pglog::{self, LogEntry, LogOp};
use crate::pgstate::{coll_of, VERSION_KEY};
use cairn_map::PgId;
use cairn_proto::msg::osd::{OpKind, OpReply};
use cairn_store::{limits, SharedBytes, Transaction};

/// Largest whole-object write that may use the store's reserve.
pub const SMALL_OBJECT: usize = 64 << 10;

/// Whether a write is metadata: a small whole object (a volume's header, lease, snapshot
/// table), writable in a full store so that space can be freed.
pub fn is_metadata(kind: &OpKind, len: usize) -> bool {
    matches!(
        kind,
        OpKind::WriteFull | OpKind::Create | OpKind::WriteFullIf { .. }
    ) && len <= SMALL_OBJECT
}

/// Builds the transaction applying `kind` to `object` as PG version `version`, assigned by a
/// primary at map `epoch`, with its PG log entry.
pub fn build(
    pg: PgId,
    create_coll: bool,
    version: u64,
    epoch: u64,
    object: &[u8],
    kind: &OpKind,
    data: &SharedBytes,
) -> Result<Transaction, OpReply> {
    let coll = coll_of(pg);
    let mut t = Transaction::new();
    if create_coll {
        t.create_collection(coll);
    }
    match *kind {
        OpKind::Write { offset } => {
            check_range(offset, data.len() as u64)?;
            t.write_shared(coll, object, offset, data.clone());
        }
        // A create reaches the store only once the primary found the object absent.
        OpKind::WriteFull | OpKind::Create | OpKind::WriteFullIf { .. } => {
            check_range(0, data.len() as u64)?;
            if is_metadata(kind, data.len()) {
                t.use_reserve();
            }
            t.touch(coll, object);
            t.truncate(coll, object, 0);
            t.write_shared(coll, object, 0, data.clone());
        }
        OpKind::Zero { offset, len } => {
            check_range(offset, len)?;
            t.zero(coll, object, offset, len);
        }
        OpKind::Truncate { size } => {
            check_range(size, 0)?;
            t.truncate(coll, object, size);
        }
        OpKind::Remove | OpKind::RemoveIf { .. } => {
            t.remove(coll, object);
        }
        OpKind::Read { .. } | OpKind::Stat | OpKind::List { .. } | OpKind::Watch { .. } => {
            return Err(OpReply::Invalid("not a write".into()))
        }
    }
    // Admitted by the primary (`write::admission`): every copy may use the headroom kept for
    // members fuller than their primary.
    t.replicated();
    t.kv_set(coll, VERSION_KEY, &version.to_le_bytes());
    // Ranges let recovery copy only the bytes a write changed (4 KiB of a 4 MiB object).
    let op = match *kind {
        OpKind::Remove | OpKind::RemoveIf { .. } => LogOp::Remove,
        OpKind::Write { offset } => LogOp::Range {
            offset,
            len: data.len() as u64,
        },
        OpKind::Zero { offset, len } => LogOp::Range { offset, len },
        OpKind::Truncate { size } => LogOp::Resize { size },
        _ => LogOp::Modify,
    };
    let entry = LogEntry {
        version,
        epoch,
        object: object.to_vec(),
        op,
    };
    pglog::append(&mut t, coll, &entry);
    Ok(t)
}

fn check_range(offset: u64, len: u64) -> Result<(), OpReply> {
    match offset.checked_add(len) {
        Some(end) if end <= limits::OBJECT_SIZE => Ok(()),
        _ => Err(OpReply::Invalid(format!(
            "range {offset}+{len} is beyond the largest object size ({} bytes)",
            limits::OBJECT_SIZE
        ))),
    }
}
