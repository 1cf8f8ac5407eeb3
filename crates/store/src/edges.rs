//! The old contents of edge blocks that a transaction's read-modify-write needs (an unaligned
//! write, a zeroed range or a truncation that ends inside a block), read with no lock held.
//!
//! Resolving a transaction happens under its collections' locks. A block it needs that is on
//! a data device is not read there: resolving notes it as missing and the commit rolls back,
//! reads what is missing with no lock held, and resolves again with those blocks at hand. A
//! block is known by where it is and its checksum, so a block that moved or was overwritten
//! between the read and the second resolve is missing again and read again, never used stale.
//! A read that fails (a checksum that does not match, an I/O error) fails the transaction
//! only if the index, looked at again under the lock, still points at what was read: the
//! block may have been overwritten and its place reused meanwhile, and then the failure means
//! nothing.

use crate::device::{AlignedBuf, BLOCK_SIZE};
use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::store::Shared;
use crate::txn::CollId;
use std::collections::HashMap;

/// A block resolving needed and did not have: which object block, where it is, its crc.
struct Miss {
    coll: CollId,
    obj: Vec<u8>,
    block: u64,
    off: u64,
    crc: u32,
}

#[derive(Default)]
pub(crate) struct EdgeBlocks {
    /// Blocks read: (data-device offset, crc) -> contents (as read, not copied again).
    read: HashMap<(u64, u32), AlignedBuf>,
    /// Reads that failed, by the same key.
    failed: HashMap<(u64, u32), StoreError>,
    missing: Vec<Miss>,
    /// A failed read of a block the index still points at: the transaction fails with it.
    error: Option<StoreError>,
}

impl EdgeBlocks {
    /// Copies the current contents of one block of an object into `out` (zeros for a
    /// hole). A block on a data device that was not read yet is noted missing, and one whose
    /// read failed is noted as the error; either leaves zeros: the caller must not use what
    /// it resolved while [`EdgeBlocks::incomplete`].
    pub fn old_block(&mut self, idx: &Index, coll: CollId, obj: &[u8], block: u64, out: &mut [u8]) {
        let out = &mut out[..BLOCK_SIZE];
        let Some(o) = idx.object(coll, obj) else {
            return out.fill(0);
        };
        let Some((_, e)) = o.extents_in(block, block + 1).into_iter().next() else {
            return out.fill(0);
        };
        match &e.loc {
            Loc::Mem(m) => out.copy_from_slice(&m.buf[m.off..m.off + BLOCK_SIZE]),
            Loc::Disk(off) => {
                let crc = e.crcs[0];
                if let Some(b) = self.read.get(&(*off, crc)) {
                    return out.copy_from_slice(&b[..BLOCK_SIZE]);
                }
                out.fill(0);
                if let Some(e) = self.failed.remove(&(*off, crc)) {
                    self.error.get_or_insert(e);
                    return;
                }
                self.missing.push(Miss {
                    coll,
                    obj: obj.to_vec(),
                    block,
                    off: *off,
                    crc,
                });
            }
        }
    }

    /// Whether resolving lacked a block or met a failed read.
    pub fn incomplete(&self) -> bool {
        !self.missing.is_empty() || self.error.is_some()
    }

    /// The failed read resolving met (then the transaction fails with it).
    pub fn take_error(&mut self) -> Option<StoreError> {
        self.error.take()
    }

    /// Reads the missing blocks, verifying each against its crc. Call with no lock held.
    pub fn read_missing(&mut self, sh: &Shared) {
        for m in std::mem::take(&mut self.missing) {
            let key = (m.off, m.crc);
            if self.read.contains_key(&key) || self.failed.contains_key(&key) {
                continue;
            }
            match crate::read::read_block(sh, m.coll, &m.obj, m.block, m.off, m.crc) {
                Ok(b) => {
                    self.read.insert(key, b);
                }
                Err(e) => {
                    self.failed.insert(key, e);
                }
            }
        }
    }
}
