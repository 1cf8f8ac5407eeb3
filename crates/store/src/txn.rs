//! Transactions: what callers ask the store to do, atomically.

use crate::shared::SharedBytes;

/// A collection (one per placement group).
pub type CollId = u64;

/// Size limits on everything a transaction carries. Decoders enforce the same limits.
pub mod limits {
    /// Longest object name.
    pub const OBJECT_NAME: usize = 1024;
    /// Longest attribute name.
    pub const ATTR_NAME: usize = 256;
    /// Largest attribute value.
    pub const ATTR_VALUE: usize = 64 * 1024;
    /// Longest collection key.
    pub const KV_KEY: usize = 1024;
    /// Largest collection value.
    pub const KV_VALUE: usize = 1024 * 1024;
    /// Largest object (offset + length of any write).
    pub const OBJECT_SIZE: u64 = 1 << 40;
    /// Most operations in one transaction.
    pub const OPS: usize = 65_536;
    /// Largest encoded transaction (also bounded by a quarter of the WAL ring).
    pub const TXN_BYTES: usize = 64 * 1024 * 1024;
}

/// One operation of a [`Transaction`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Creates a collection; fails if it exists.
    CreateCollection(CollId),
    /// Removes a collection with all its objects and entries.
    RemoveCollection(CollId),
    /// Creates an empty object if it does not exist.
    Touch { coll: CollId, obj: Vec<u8> },
    /// Writes bytes at an offset, extending the object if needed. The bytes are shared with
    /// whoever handed them in (a whole-block write is held in memory without a copy).
    Write {
        coll: CollId,
        obj: Vec<u8>,
        offset: u64,
        data: SharedBytes,
    },
    /// Makes a range read as zeros (releasing space); does not change the object's size.
    Zero {
        coll: CollId,
        obj: Vec<u8>,
        offset: u64,
        len: u64,
    },
    /// Sets the object's size, dropping data beyond it or extending with zeros.
    Truncate {
        coll: CollId,
        obj: Vec<u8>,
        size: u64,
    },
    /// Removes an object (no-op if absent).
    Remove { coll: CollId, obj: Vec<u8> },
    /// Sets an attribute (creating the object if needed).
    SetAttr {
        coll: CollId,
        obj: Vec<u8>,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    /// Removes an attribute (no-op if absent).
    RmAttr {
        coll: CollId,
        obj: Vec<u8>,
        name: Vec<u8>,
    },
    /// Sets a collection key/value entry.
    KvSet {
        coll: CollId,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Removes a collection entry (no-op if absent).
    KvRm { coll: CollId, key: Vec<u8> },
    /// Removes collection entries with `start <= key < end`.
    KvRmRange {
        coll: CollId,
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

impl Op {
    /// The collection the operation works on.
    pub fn coll(&self) -> CollId {
        match self {
            Op::CreateCollection(c) | Op::RemoveCollection(c) => *c,
            Op::Touch { coll, .. }
            | Op::Write { coll, .. }
            | Op::Zero { coll, .. }
            | Op::Truncate { coll, .. }
            | Op::Remove { coll, .. }
            | Op::SetAttr { coll, .. }
            | Op::RmAttr { coll, .. }
            | Op::KvSet { coll, .. }
            | Op::KvRm { coll, .. }
            | Op::KvRmRange { coll, .. } => *coll,
        }
    }
}

/// An atomic group of operations: after any crash, wholly present or wholly absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transaction {
    /// The operations, applied in order.
    pub ops: Vec<Op>,
    /// May use the last [`crate::CLIENT_RESERVE_PERCENT`] of the space, which ordinary
    /// writes leave free: small metadata (a volume's header, lease or snapshot table) must
    /// still be writable when the data has filled the store, or nothing could be removed.
    /// Not stored: a hint for this submission only.
    pub use_reserve: bool,
    /// A copy of a write a primary admitted ([`crate::Store::admits`]): may use half the
    /// headroom that admission keeps free. Members of a PG fill unevenly; a replica must not
    /// refuse what its primary admitted (and applied), or its copy of the PG falls behind
    /// with no room to catch up. Not stored.
    pub replicated: bool,
    /// A copy this store serves no reads from (a replica's): its blocks stay out of the read
    /// cache, where they would push out what is read. Not stored.
    pub replica_copy: bool,
}

impl Transaction {
    /// An empty transaction.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds [`Op::CreateCollection`].
    pub fn create_collection(&mut self, coll: CollId) -> &mut Self {
        self.ops.push(Op::CreateCollection(coll));
        self
    }
    /// Adds [`Op::RemoveCollection`].
    pub fn remove_collection(&mut self, coll: CollId) -> &mut Self {
        self.ops.push(Op::RemoveCollection(coll));
        self
    }
    /// Adds [`Op::Touch`].
    pub fn touch(&mut self, coll: CollId, obj: &[u8]) -> &mut Self {
        self.ops.push(Op::Touch {
            coll,
            obj: obj.to_vec(),
        });
        self
    }
    /// Adds [`Op::Write`] of a copy of `data`.
    pub fn write(&mut self, coll: CollId, obj: &[u8], offset: u64, data: &[u8]) -> &mut Self {
        self.write_shared(coll, obj, offset, SharedBytes::from(data))
    }
    /// Adds [`Op::Write`] of `data` without copying it.
    pub fn write_shared(
        &mut self,
        coll: CollId,
        obj: &[u8],
        offset: u64,
        data: SharedBytes,
    ) -> &mut Self {
        self.ops.push(Op::Write {
            coll,
            obj: obj.to_vec(),
            offset,
            data,
        });
        self
    }
    /// Adds [`Op::Zero`].
    pub fn zero(&mut self, coll: CollId, obj: &[u8], offset: u64, len: u64) -> &mut Self {
        self.ops.push(Op::Zero {
            coll,
            obj: obj.to_vec(),
            offset,
            len,
        });
        self
    }
    /// Adds [`Op::Truncate`].
    pub fn truncate(&mut self, coll: CollId, obj: &[u8], size: u64) -> &mut Self {
        self.ops.push(Op::Truncate {
            coll,
            obj: obj.to_vec(),
            size,
        });
        self
    }
    /// Adds [`Op::Remove`].
    pub fn remove(&mut self, coll: CollId, obj: &[u8]) -> &mut Self {
        self.ops.push(Op::Remove {
            coll,
            obj: obj.to_vec(),
        });
        self
    }
    /// Adds [`Op::SetAttr`].
    pub fn set_attr(&mut self, coll: CollId, obj: &[u8], name: &[u8], value: &[u8]) -> &mut Self {
        self.ops.push(Op::SetAttr {
            coll,
            obj: obj.to_vec(),
            name: name.to_vec(),
            value: value.to_vec(),
        });
        self
    }
    /// Adds [`Op::RmAttr`].
    pub fn rm_attr(&mut self, coll: CollId, obj: &[u8], name: &[u8]) -> &mut Self {
        self.ops.push(Op::RmAttr {
            coll,
            obj: obj.to_vec(),
            name: name.to_vec(),
        });
        self
    }
    /// Adds [`Op::KvSet`].
    pub fn kv_set(&mut self, coll: CollId, key: &[u8], value: &[u8]) -> &mut Self {
        self.ops.push(Op::KvSet {
            coll,
            key: key.to_vec(),
            value: value.to_vec(),
        });
        self
    }
    /// Adds [`Op::KvRm`].
    pub fn kv_rm(&mut self, coll: CollId, key: &[u8]) -> &mut Self {
        self.ops.push(Op::KvRm {
            coll,
            key: key.to_vec(),
        });
        self
    }
    /// Adds [`Op::KvRmRange`].
    pub fn kv_rm_range(&mut self, coll: CollId, start: &[u8], end: &[u8]) -> &mut Self {
        self.ops.push(Op::KvRmRange {
            coll,
            start: start.to_vec(),
            end: end.to_vec(),
        });
        self
    }
    /// Lets the transaction use the reserve (see [`Transaction::use_reserve`]).
    pub fn use_reserve(&mut self) -> &mut Self {
        self.use_reserve = true;
        self
    }
    /// Marks the transaction a copy no reads are served from (see
    /// [`Transaction::replica_copy`]).
    pub fn replica_copy(&mut self) -> &mut Self {
        self.replica_copy = true;
        self
    }
    /// Marks the transaction a copy of an admitted write (see [`Transaction::replicated`]).
    pub fn replicated(&mut self) -> &mut Self {
        self.replicated = true;
        self
    }
    /// Whether the transaction has no operations.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}
