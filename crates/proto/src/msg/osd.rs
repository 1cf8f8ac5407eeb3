//! The OSD protocol: client ops to a PG's primary, and replication from the primary to the
//! other members of the acting set.
//!
//! Object bytes travel in the frame's raw data part: a write's payload in the [`OP`] or [`REP`]
//! frame, a read's result in the [`OP_REPLY`] frame.

use super::call::{Call, Empty};
use serde::{Deserialize, Serialize};

/// Request: [`OpRequest`] (+ data for writes); reply: [`OP_REPLY`].
pub const OP: u16 = 200;
/// Reply: [`OpReply`] (+ data for reads).
pub const OP_REPLY: u16 = 201;
/// Primary -> replica: [`RepOp`] (+ data); reply: [`REP_REPLY`].
pub const REP: u16 = 202;
/// Replica -> primary: [`RepReply`].
pub const REP_REPLY: u16 = 203;
/// Request (empty control): the OSD's usage; reply: [`OSD_STATS_REPLY`].
pub const OSD_STATS: u16 = 204;
/// Reply: [`OsdStats`].
pub const OSD_STATS_REPLY: u16 = 205;
/// Request: [`OpBatch`] (+ the ops' data, concatenated): several small ops sent as one
/// message (temporal merge); each is answered by its own [`OP_REPLY`] with its own request id.
pub const OP_BATCH: u16 = 206;
/// OSD -> OSD: empty; reply [`OSD_PONG`] (peer heartbeat).
pub const OSD_PING: u16 = 207;
/// Reply: empty.
pub const OSD_PONG: u16 = 208;
/// Reply to a malformed frame: [`crate::msg::mon::ErrorReply`]; the OSD then closes the
/// connection.
pub const ERROR: u16 = 209;
/// Request (empty control): make every write this OSD has acknowledged durable (flush its
/// WAL device; what NBD FLUSH needs from pools with `memory` durability, whose writes are
/// acknowledged once written, before their flush). Reply: [`OSD_SYNC_REPLY`], or [`ERROR`]
/// (`Internal`) when the flush failed.
pub const OSD_SYNC: u16 = 210;
/// Reply: empty.
pub const OSD_SYNC_REPLY: u16 = 211;

/// [`OP`] answered by [`OP_REPLY`].
pub const OP_CALL: Call<OpRequest, OpReply> = Call::new(OP, OP_REPLY, "op reply");
/// [`OSD_STATS`] answered by [`OSD_STATS_REPLY`].
pub const STATS_CALL: Call<Empty, OsdStats> = Call::new(OSD_STATS, OSD_STATS_REPLY, "osd stats");
/// [`OSD_SYNC`] answered by [`OSD_SYNC_REPLY`].
pub const SYNC_CALL: Call<Empty, Empty> = Call::new(OSD_SYNC, OSD_SYNC_REPLY, "osd sync reply");
/// [`OSD_PING`] answered by [`OSD_PONG`].
pub const PING_CALL: Call<Empty, Empty> = Call::new(OSD_PING, OSD_PONG, "osd pong");

/// Longest object name accepted on the wire (same as the store's limit).
pub const MAX_OBJECT_NAME: usize = 1024;
/// Most names one list reply carries.
pub const MAX_LIST: u32 = 1024;

/// A client operation on one object (or one PG, for `List`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpRequest {
    /// The client's map epoch: the OSD answers `NotPrimary` when its map disagrees.
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    pub object: Vec<u8>,
    pub kind: OpKind,
    /// The sending client instance (random; one per client, or per open of a volume): an
    /// OSD whose map blocklists it refuses the op with [`OpReply::Fenced`]. A claim, not an
    /// identity: fencing stops a stale writer, not an attacker (caps do that).
    pub instance: u64,
}

/// What an op does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpKind {
    /// Writes the frame's data at `offset`, extending the object (creating it if absent).
    Write {
        offset: u64,
    },
    /// Replaces the whole object with the frame's data.
    WriteFull,
    /// Zeroes a range (reads of it return zeros; space is freed where whole blocks).
    Zero {
        offset: u64,
        len: u64,
    },
    /// Sets the object's size, dropping or zero-extending the tail.
    Truncate {
        size: u64,
    },
    /// Reads up to `len` bytes at `offset` (short at the end of the object).
    Read {
        offset: u64,
        len: u64,
    },
    Remove,
    Stat,
    /// Lists the PG's object names after `after`, at most `max` (<= [`MAX_LIST`]).
    List {
        after: Option<Vec<u8>>,
        max: u32,
    },
    /// Creates the object holding the frame's data, only if it does not exist (exclusive
    /// create: of two creates of one name, exactly one wins). An existing object is answered
    /// [`OpReply::Exists`], unless it holds exactly these bytes already (what a resend of
    /// this same create finds after its first answer was lost): then `Ok`.
    Create,
    /// Waits for the object to change: answered `Ok` at once when its contents' tag
    /// ([`contents_tag`], 0 for an absent object) is not `known_tag`, else when a write to it comes,
    /// or after `max_wait_ms` (<= [`MAX_WATCH_WAIT_MS`]). An answer only says "read it
    /// again": it may come without a change (a timeout, a primary change). Objects of at
    /// most [`MAX_WATCH_OBJECT`] bytes.
    Watch {
        known_tag: u64,
        max_wait_ms: u32,
    },
    /// Compare-and-swap: replaces the whole object with the frame's data only if the tag
    /// of its contents ([`contents_tag`], 0 when absent) is `expected_tag`; else answered
    /// [`OpReply::Conflict`]. (A client that sent it again after a lost answer and gets
    /// `Conflict` reads the object: holding exactly its bytes, its first attempt landed.)
    WriteFullIf {
        expected_tag: u64,
    },
    /// Removes the object only if the tag of its contents is `expected_tag`; else
    /// [`OpReply::Conflict`] ([`OpReply::NoSuchObject`] when absent).
    RemoveIf {
        expected_tag: u64,
    },
}

/// What a watch and a conditional op compare: the first 8 bytes of the SHA-256 of an
/// object's contents (little-endian), never 0, which stands for an absent object. Not a CRC:
/// objects that end with their own CRC-32C (tables, records) all have the same CRC-32C.
pub fn contents_tag(data: &[u8]) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(data);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first).max(1)
}

/// Longest a [`OpKind::Watch`] waits at the OSD.
pub const MAX_WATCH_WAIT_MS: u32 = 30_000;
/// Largest object a [`OpKind::Watch`] may watch (the OSD reads it whole to compare).
pub const MAX_WATCH_OBJECT: u64 = 1 << 20;

impl OpKind {
    /// Whether the op changes the object (is replicated).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            OpKind::Write { .. }
                | OpKind::WriteFull
                | OpKind::Zero { .. }
                | OpKind::Truncate { .. }
                | OpKind::Remove
                | OpKind::Create
                | OpKind::WriteFullIf { .. }
                | OpKind::RemoveIf { .. }
        )
    }
}

/// Result of an op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpReply {
    /// Done. `size` is the object's size for reads and stat (0 for writes); `version` the PG
    /// version a write created (0 for reads).
    Ok {
        version: u64,
        size: u64,
    },
    /// Names listed; `more` when the PG has more after the last one.
    Listed {
        names: Vec<Vec<u8>>,
        more: bool,
    },
    /// This OSD is not the PG's primary at `epoch` (or has an older map than the client):
    /// refresh the map to at least `epoch` and resend.
    NotPrimary {
        epoch: u64,
    },
    /// Fewer than min_size members are up: the write was not applied; retry later.
    Degraded {
        acting: u8,
        min_size: u8,
    },
    /// The acting set changed while the op was in flight; resend (the op is idempotent).
    Retry,
    NoSuchObject,
    NoSuchPool,
    /// The request is invalid (bad range, name too long, ...): do not retry.
    Invalid(String),
    /// The OSD failed to store or read: `code` says why for programs (a full store is
    /// `NoSpace`), `why` for people. Do not retry blindly.
    Failed {
        code: FailCode,
        why: String,
    },
    /// The PG is down: an interval that may have acknowledged writes has no member up, so
    /// serving now could return older data. It waits for one of `waiting_for` to come back
    /// (or for an operator to declare them lost); retry later.
    PgDown {
        waiting_for: Vec<u32>,
    },
    /// The sender may not do this (its caps): "permission denied: client.x lacks w on pool
    /// p". Do not retry.
    Denied(String),
    /// A [`OpKind::Create`] found the object already there, with other contents.
    Exists,
    /// The sending instance is fenced (blocklisted in the map, `OpRequest::instance`): a
    /// newer holder took its volume over. Do not retry.
    Fenced,
    /// A conditional op ([`OpKind::WriteFullIf`], [`OpKind::RemoveIf`]) found other
    /// contents: nothing was written. Read the object again.
    Conflict,
}

/// Most ops one [`OpBatch`] may carry (clients send at most 8).
pub const MAX_BATCH_OPS: usize = 64;
/// Most bytes the reads of one [`OpBatch`] may ask for in all (clients batch only reads of
/// at most 16 KiB, at most 8 of them): a batch cannot make an OSD read and queue much more
/// than its own size.
pub const MAX_BATCH_READ_BYTES: u64 = 1 << 20;

/// Several ops in one message. The frame's data is the ops' data in order; `data_len` says
/// where each one's ends. The frame's own request id is unused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpBatch {
    pub ops: Vec<BatchedOp>,
}

/// One op of an [`OpBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchedOp {
    /// The request id its [`OP_REPLY`] carries.
    pub request_id: u64,
    pub data_len: u32,
    pub req: OpRequest,
}

impl OpBatch {
    /// Checks the batch against its frame's data length: at most [`MAX_BATCH_OPS`] ops, at
    /// least one, and data lengths that add up.
    pub fn check(&self, data_len: usize) -> Result<(), BatchError> {
        if self.ops.is_empty() || self.ops.len() > MAX_BATCH_OPS {
            return Err(BatchError::OpCount {
                ops: self.ops.len(),
            });
        }
        let reads: u64 = self
            .ops
            .iter()
            .map(|o| match o.req.kind {
                OpKind::Read { len, .. } => len,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add);
        if reads > MAX_BATCH_READ_BYTES {
            return Err(BatchError::ReadsOver { bytes: reads });
        }
        let sum: u64 = self.ops.iter().map(|o| u64::from(o.data_len)).sum();
        if sum != data_len as u64 {
            return Err(BatchError::DataLength {
                sum,
                frame: data_len as u64,
            });
        }
        Ok(())
    }
}

/// Why an [`OpBatch`] does not fit its frame or its limits: a protocol violation by the
/// sender (answered `ERROR` `Malformed`, and the connection closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// No ops, or more than [`MAX_BATCH_OPS`].
    #[error("op batch of {ops} ops (1..={MAX_BATCH_OPS} allowed)")]
    OpCount { ops: usize },
    /// Its reads ask for more than [`MAX_BATCH_READ_BYTES`] in all.
    #[error(
        "op batch reads {bytes} bytes, over the limit of {MAX_BATCH_READ_BYTES} (send large \
         reads alone)"
    )]
    ReadsOver { bytes: u64 },
    /// Its ops' data lengths do not add up to the frame's data part.
    #[error("op batch data lengths add up to {sum} bytes but the frame carries {frame}")]
    DataLength { sum: u64, frame: u64 },
}

impl BatchError {
    /// The code the refusal carries.
    pub fn code(&self) -> super::ErrorCode {
        super::ErrorCode::Malformed
    }
}

/// A write forwarded by the primary to a replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepOp {
    /// The primary's map epoch when it sent the op.
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    /// The PG version this write creates.
    pub version: u64,
    /// The sending primary's OSD id (replicas refuse a primary their map does not know).
    pub primary: u32,
    pub object: Vec<u8>,
    /// Always a write kind.
    pub kind: OpKind,
}

/// Why an OSD failed an op, for callers to match on (the text beside it is for people).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailCode {
    /// A store has no space left for the write (ENOSPC); nothing was applied there.
    NoSpace,
    /// A store's device failed, or the store stopped accepting writes after a failure.
    Device,
    /// Stored data failed its checksum.
    Corrupt,
    /// Anything else.
    Other,
}

/// A replica's answer to a [`RepOp`] (same request id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RepReply {
    /// Held at the pool's durability level.
    Done,
    /// The replica's map says the sender is not primary at `epoch`.
    Stale { epoch: u64 },
    /// The replica could not apply the write (see [`FailCode`]).
    Failed { code: FailCode, why: String },
    /// The write's version does not follow the replica's last one (`have`): it missed a
    /// write (a connection broke). Nothing was applied; the primary must peer the PG again.
    Gap { have: u64 },
    /// Held, as `Done`; and the replica's store is past the point where it would admit
    /// ordinary client data as a primary (and small metadata too, `metadata_too`). The primary
    /// refuses such writes to the PGs this replica holds for a while, so the replica's
    /// headroom for copies is not used up.
    DoneButFull { metadata_too: bool },
}

/// A crash of an OSD (a panic: it aborted and was restarted), from the report it left in its
/// crash directory; `cairn status` and `cairn crash ls` show them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashSummary {
    /// The report's id (`<UTC time>_<entity>_<pid>`), its file name in the crash directory.
    pub id: String,
    /// Seconds since the Unix epoch.
    pub time_secs: u64,
    /// `file:line:column` of the panic.
    pub location: String,
    /// The panic's message, cut at 512 bytes.
    pub message: String,
}

/// Crashes an OSD reports: the newest, within [`RECENT_CRASH_SECS`].
pub const MAX_REPORTED_CRASHES: usize = 8;
/// How long a crash counts as recent (Ceph's RECENT_CRASH warns for two weeks too).
pub const RECENT_CRASH_SECS: u64 = 14 * 86_400;

/// An OSD's usage, for `cairn status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdStats {
    pub osd: u32,
    /// Bytes in use: object data (flushed and pending) and the store's checkpoints.
    pub used_bytes: u64,
    /// Bytes that can be used before writes fail for no space (the store's reserve excluded).
    pub capacity_bytes: u64,
    /// Writes in flight.
    pub inflight: u64,
    /// Objects this OSD copied to (or from) other members by recovery since it started.
    pub recovered_objects: u64,
    /// Object bytes it sent or applied by recovery, backfill or scrub repair since it started.
    pub recovery_bytes: u64,
    /// Objects the recoveries it leads still have to copy (degraded objects).
    pub recovery_pending_objects: u64,
    /// Recovery speed over the last seconds.
    pub recovery_bytes_per_sec: u64,
    pub recovery_objects_per_sec: u64,
    /// PGs this OSD leads that are peering or recovering (their I/O waits).
    pub peering_pgs: u64,
    /// Object copies the latest scrub of each PG this OSD leads found wrong and could not
    /// repair.
    pub scrub_unrepaired: u64,
    /// Object copies scrubs repaired since the OSD started.
    pub scrub_repaired: u64,
    /// Scrubs completed since the OSD started.
    pub scrubbed_pgs: u64,
    /// PGs this OSD holds a copy of (members, and previous owners not yet clean elsewhere).
    pub pgs_held: u64,
    /// Of those, PGs it is no longer a member of (misplaced copies, kept until the PG is
    /// clean on its members).
    pub pgs_misplaced: u64,
    /// PGs this OSD leads that are down, each with the OSDs it waits for.
    pub down_pgs: Vec<DownPg>,
    /// PGs this OSD leads whose peering failed for good (until the map changes).
    pub failed_pgs: Vec<FailedPg>,
    /// This OSD's recent crashes (its earlier lives' panics), newest first.
    pub crashes: Vec<CrashSummary>,
    /// PGs this OSD leads that went active without some interval's writes (its OSDs were
    /// declared lost), since it started.
    pub lost_write_pgs: Vec<DownPg>,
    /// Memory: the OSD's target, and what it uses (resident).
    pub memory_target_bytes: u64,
    pub memory_used_bytes: u64,
    /// The store's index (its heap, estimated), counted in the memory target: the read
    /// cache gets three quarters of the target less this.
    pub index_bytes: u64,
    /// Read cache: bytes held, the most it holds, and data reads answered from it or not
    /// since the OSD started.
    pub cache_bytes: u64,
    pub cache_capacity_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Copies of PGs of removed pools this OSD still holds: it is deleting them in the
    /// background (`pool rm`), and their space comes back as they go.
    pub pgs_reclaiming: u64,
    /// Writes this OSD led that took longer than its slow-op threshold, in the last minute,
    /// by the member they waited for (this OSD itself: its own commit was slow).
    pub slow_ops: Vec<SlowOps>,
    /// Slow writes since the OSD started.
    pub slow_ops_total: u64,
    /// Client ops it served as primary since it started, per pool.
    pub pools: Vec<PoolOps>,
    /// Store commits (WAL writes and flushes) since it started, and their microseconds in all.
    pub commits: u64,
    pub commit_latency_us: u64,
    /// The quickest of its last 64 WAL syncs (microseconds), and the syncs its shards handed
    /// to the syncer thread because that says the WAL is on a device, not in memory.
    pub wal_sync_floor_us: u64,
    pub wal_syncs_handed_off: u64,
    /// Object bytes it copied in memory since it started, by where.
    pub copies: PayloadCopies,
}

/// Bytes an OSD copied in memory since it started, by where (docs/operator/cluster.md "Copy
/// by copy"): divided by the bytes it took in, the copies per byte of a workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadCopies {
    /// Frame bytes its connections read from sockets through a receive buffer (headers
    /// included).
    pub received_bytes: u64,
    /// Of those, bytes copied out of a receive buffer (small frames; a large data part is
    /// read straight into its own buffer).
    pub receive_copied_bytes: u64,
    /// Payload bytes copied into a connection's send queue (a frame that waited and whose
    /// payload it could not hold by reference).
    pub send_queue_copied_bytes: u64,
    /// Payload bytes that waited in a send queue held by reference (not copied).
    pub send_queue_held_bytes: u64,
    /// Payloads laid into WAL batches.
    pub wal_batch_bytes: u64,
    /// Whole blocks built for writes covering part of a block.
    pub partial_block_bytes: u64,
    /// Data the flusher laid into its staging buffer.
    pub flush_staged_bytes: u64,
    /// Large writes copied to an aligned buffer before their direct write.
    pub direct_staged_bytes: u64,
}

/// Totals of the client ops of one pool an OSD served as primary (rates and mean latencies
/// come from two samples).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolOps {
    pub pool: u32,
    pub reads: u64,
    pub writes: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Microseconds from each op reaching its shard to its reply, summed.
    pub read_latency_us: u64,
    pub write_latency_us: u64,
}

/// Slow writes that waited for one member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlowOps {
    pub waiting_for: u32,
    pub count: u64,
    /// The longest wait seen, in milliseconds.
    pub longest_ms: u64,
}

/// A PG and OSDs that matter to it (waited for, or given up as lost).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownPg {
    pub pool: u32,
    pub pg: u32,
    pub osds: Vec<u32>,
}

/// A PG this OSD leads whose last peering failed in a way that is not retried until the map
/// changes (a full or corrupt store, a protocol violation, permission, unfound objects).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedPg {
    pub pool: u32,
    pub pg: u32,
    /// `store_full`, `store_corrupt`, `protocol`, `permission` or `unfound`.
    pub class: String,
    /// What failed, cut at 512 bytes.
    pub why: String,
    /// Its unfound objects (class `unfound`).
    pub unfound: u64,
}
