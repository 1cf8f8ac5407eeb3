//! Peering and recovery between OSDs: the primary of a PG asks the members of its acting set
//! for their PG info and log, then copies objects to (or from) the members that are behind.
//! Every request is answered on the same connection with the same request id.

use super::call::Call;
use serde::{Deserialize, Serialize};

/// Primary -> member: [`PgQuery`]; reply [`PG_INFO`].
pub const PG_QUERY: u16 = 220;
/// Reply: [`PgInfo`]; data: the member's log entries after the query's `since`, encoded as
/// a postcard list of the OSD's PG log entries (docs/format/pglog.md).
pub const PG_INFO: u16 = 221;
/// Primary -> member: [`PgPull`]; reply [`PG_OBJECT`].
pub const PG_PULL: u16 = 222;
/// Reply: [`PgObject`]; data: the requested bytes of the object.
pub const PG_OBJECT: u16 = 223;
/// Primary -> member: [`PgPush`] (+ object bytes); reply [`PG_DONE`].
pub const PG_PUSH: u16 = 224;
/// Reply to a push: [`PgDone`].
pub const PG_DONE: u16 = 225;

/// Primary -> member: [`PgList`]; reply [`PG_NAMES`].
pub const PG_LIST: u16 = 226;
/// Reply: [`PgNames`].
pub const PG_NAMES: u16 = 227;

/// Previous owner -> primary: [`PgQuery`] (`since` unused); reply [`PG_DONE`]: `Done` if the
/// PG is clean at the query's map epoch (every acting member current, as many as the pool's
/// size: the asker may delete its copy), `Busy` if not (yet, or the maps' epochs differ),
/// `Stale` if the receiver is not the PG's primary.
pub const PG_CLEAN: u16 = 232;
/// CLI -> a PG's primary: [`PgQuery`] (`since` unused); reply [`PG_STATUS_REPLY`]: what the PG
/// is doing and, for its last peering, its past intervals and what it waits for.
pub const PG_STATUS: u16 = 233;
/// Reply: [`PgStatus`].
pub const PG_STATUS_REPLY: u16 = 234;
/// CLI -> a PG's primary: [`PgMarkLost`]; reply [`PG_DONE`]: `Done` once the primary took
/// the order (it peers the PG again, giving the unfound objects up), `Failed` if the PG has
/// no unfound objects or the receiver is not its primary.
pub const PG_MARK_LOST: u16 = 235;

/// [`PG_QUERY`] answered by [`PG_INFO`].
pub const QUERY_CALL: Call<PgQuery, PgInfo> = Call::new(PG_QUERY, PG_INFO, "pg info");
/// [`PG_PULL`] answered by [`PG_OBJECT`].
pub const PULL_CALL: Call<PgPull, PgObject> = Call::new(PG_PULL, PG_OBJECT, "pg object");
/// [`PG_PUSH`] answered by [`PG_DONE`].
pub const PUSH_CALL: Call<PgPush, PgDone> = Call::new(PG_PUSH, PG_DONE, "pg done");
/// [`PG_LIST`] answered by [`PG_NAMES`].
pub const LIST_CALL: Call<PgList, PgNames> = Call::new(PG_LIST, PG_NAMES, "pg names");
/// [`PG_CLEAN`] answered by [`PG_DONE`].
pub const CLEAN_CALL: Call<PgQuery, PgDone> = Call::new(PG_CLEAN, PG_DONE, "pg done");
/// [`PG_STATUS`] answered by [`PG_STATUS_REPLY`].
pub const STATUS_CALL: Call<PgQuery, PgStatus> = Call::new(PG_STATUS, PG_STATUS_REPLY, "pg status");
/// [`PG_MARK_LOST`] answered by [`PG_DONE`].
pub const MARK_LOST_CALL: Call<PgMarkLost, PgDone> = Call::new(PG_MARK_LOST, PG_DONE, "pg done");

/// Gives up a PG's unfound objects (`cairn pg mark-unfound-lost`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgMarkLost {
    /// The sender's map epoch.
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    /// Delete them (else revert each to the newest older copy an answering member holds,
    /// deleting those no member holds at all).
    pub delete: bool,
}

/// Most names one [`PgNames`] carries.
pub const MAX_NAMES: u32 = 1024;

/// Largest object chunk one pull or push carries.
pub const RECOVERY_CHUNK: u64 = 4 << 20;

/// What the primary asks a member about one PG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgQuery {
    /// The primary's map epoch.
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    /// Send the log entries with versions after this one.
    pub since: u64,
}

/// A member's state of one PG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgInfo {
    /// The member's last version (0: it holds nothing of the PG).
    pub last_version: u64,
    /// The epoch of its last log entry (0 when its log is empty).
    pub last_epoch: u64,
    /// The oldest version in its log (`None`: empty log).
    pub tail: Option<u64>,
    /// Objects marked missing: a recovery adopted a newer log before copying them, so the
    /// member's copies of these are not current whatever its log says.
    pub missing: Vec<Vec<u8>>,
    /// The map epoch at which the PG last went active with this member in its acting set
    /// (0: never). Its history holds everything acknowledged before that epoch.
    pub last_epoch_started: u64,
}

/// Asks for bytes of one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPull {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    pub object: Vec<u8>,
    pub offset: u64,
    /// At most [`RECOVERY_CHUNK`].
    pub len: u64,
}

/// An object's state as the member holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgObject {
    pub exists: bool,
    /// Its size (0 when absent).
    pub size: u64,
    /// The member's PG version when it read these bytes (scrub repair: a copy is only
    /// installed where the object has not changed since).
    pub version: u64,
}

/// What a push does on the member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PushKind {
    /// Backfill starts: remove every object, log entry and missing mark of the PG.
    Reset,
    /// Recovery of one object: with `reset`, empty the object first (a whole copy starts);
    /// write the bytes at `offset` (none: only set the size), make the object `size` bytes
    /// long; with `last`, the object is current: drop its missing mark. With `since`, refused
    /// ([`PgDone::Busy`]) if a log entry after that version touched the object (a client
    /// wrote it after the bytes were read: recovery reads it again).
    Recover {
        object: Vec<u8>,
        offset: u64,
        size: u64,
        reset: bool,
        last: bool,
        since: Option<u64>,
    },
    /// Recovery of one object that does not exist: remove it, drop its missing mark (same
    /// `since` condition).
    RecoverRemove { object: Vec<u8>, since: Option<u64> },
    /// Mark these objects missing (before a newer log is adopted; at most [`MAX_NAMES`]).
    MarkMissing { objects: Vec<Vec<u8>> },
    /// Recovery is done: adopt these log entries (the frame's data, encoded like
    /// [`PG_INFO`]'s) and this last version.
    Log { last_version: u64 },
    /// Scrub repair: write these bytes at `offset` and make the object `size` bytes long,
    /// unless a log entry after version `since` touched the object (then [`PgDone::Busy`]).
    /// Unlike a [`PushKind::Recover`] with `reset` it never empties the object first, so a repair stopped
    /// half way leaves every byte either as it was or repaired.
    Repair {
        object: Vec<u8>,
        offset: u64,
        size: u64,
        since: u64,
    },
    /// Scrub repair: the object must not exist (same condition as [`PushKind::Repair`]).
    RepairRemove { object: Vec<u8>, since: u64 },
    /// Peering is done: the PG goes active at map epoch `epoch`; the member records it as
    /// its `last_epoch_started` (never lowering it).
    Activate { epoch: u64 },
}

/// One push of recovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPush {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    /// The pushing primary (members refuse one their map does not know as the PG's primary).
    pub primary: u32,
    pub kind: PushKind,
}

/// The answer to a push (or a refused query or pull).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PgDone {
    Done,
    /// The member's map says the sender is not the primary at `epoch`.
    Stale {
        epoch: u64,
    },
    /// The request was refused or failed: `code` for programs (a PG the member's map does not
    /// have is `NotFound`), `why` for people.
    Failed {
        code: crate::msg::ErrorCode,
        why: String,
    },
    /// A repair was refused: the object changed after the repair's `since` version.
    Busy,
}

/// Asks for a PG's object names after `after` (backfill).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgList {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    pub after: Option<Vec<u8>>,
}

/// Object names in byte order, at most [`MAX_NAMES`]; `more` when the PG has more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgNames {
    pub names: Vec<Vec<u8>>,
    pub more: bool,
}

/// One past interval as a PG's primary judged it in its last peering.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntervalStatus {
    pub interval: cairn_map::PastInterval,
    /// Members that answered the primary.
    pub answered: Vec<u32>,
    /// Members it waits for (the interval may have acknowledged writes and none answered).
    pub waiting_for: Vec<u32>,
    /// Every member that could hold its writes was declared lost: given up.
    pub given_up: bool,
}

/// A PG as its primary sees it (`cairn pg query`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgStatus {
    pub epoch: u64,
    /// `active`, `peering`, `recovering`, `down`, `failed` (its peering failed in a way that
    /// is not retried until the map changes) or `inactive`.
    pub state: String,
    pub up_set: Vec<u32>,
    pub acting: Vec<u32>,
    pub last_version: u64,
    /// The primary's own `last_epoch_started`.
    pub last_epoch_started: u64,
    /// The epoch its last peering looked back to (0 before any peering).
    pub intervals_from: u64,
    pub intervals: Vec<IntervalStatus>,
    /// OSDs that answered its last peering.
    pub answered: Vec<u32>,
    /// OSDs it waits for to go active (down PGs).
    pub waiting_for: Vec<u32>,
    /// Why it is not active, when it is not.
    pub reason: Option<String>,
    /// Objects the newest history lacks that no OSD that answered holds (`cairn pg
    /// list-unfound`), at most [`MAX_NAMES`].
    pub unfound: Vec<Vec<u8>>,
    /// The class of the failure that keeps it from going active (`transient`, `stale_map`,
    /// `store_corrupt`, `store_full`, `protocol`, `permission`), when one does.
    pub failure_class: Option<String>,
    /// Epochs of intervals given up because their OSDs were declared lost, since this OSD
    /// started: writes acknowledged in them may be lost.
    pub lost_intervals: Vec<cairn_map::PastInterval>,
    /// Objects still to recover.
    pub degraded_objects: u64,
}
