//! The monitor protocol (clients, OSDs and the CLI talking to a monitor).
//!
//! Every monitor answers [`GET_MAP`] and [`SUBSCRIBE`] from its own copy of the map (it may
//! lag the leader briefly; subscribers simply receive the newer epochs a little later).
//! [`COMMAND`] and [`HEARTBEAT`] are handled by the leader; other monitors answer
//! [`CommandReply::NotLeader`] naming the leader when they know it.

use cairn_auth::{Caps, Entity};
use cairn_map::{ChangeOutcome, ClusterMap, Incremental, MapError, PastInterval};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Request: [`GetMap`]; reply: [`MAP`].
pub const GET_MAP: u16 = 1;
/// Request: [`Subscribe`]; replies: one [`MAP`] frame (same request id) now if the subscriber
/// is behind, then one per new epoch, until the connection closes.
pub const SUBSCRIBE: u16 = 2;
/// Reply/push: [`MapUpdate`].
pub const MAP: u16 = 3;
/// Request: [`cairn_map::MapChange`]; reply: [`COMMAND_REPLY`].
pub const COMMAND: u16 = 4;
/// Reply: [`CommandReply`].
pub const COMMAND_REPLY: u16 = 5;
/// Request: [`Heartbeat`]; reply: [`COMMAND_REPLY`] (`Done(Unchanged)` when accepted).
pub const HEARTBEAT: u16 = 6;
/// Request: empty; reply: [`MON_STATUS_REPLY`].
pub const MON_STATUS: u16 = 7;
/// Reply: [`MonStatus`].
pub const MON_STATUS_REPLY: u16 = 8;
/// Reply to anything malformed: [`ErrorReply`]; the monitor then closes the connection.
pub const ERROR: u16 = 9;
/// Request: [`FailureReport`]; reply: [`COMMAND_REPLY`] (`Done(Unchanged)` when recorded).
pub const FAILURE_REPORT: u16 = 10;
/// Request: [`PastIntervalsQuery`]; reply: [`PAST_INTERVALS_REPLY`]. Any monitor answers
/// from its own map history.
pub const PAST_INTERVALS: u16 = 11;
/// Reply: [`PastIntervalsReply`].
pub const PAST_INTERVALS_REPLY: u16 = 12;
/// Request: empty (the ticket is for the entity the connection authenticated as); reply:
/// [`TICKET`].
pub const GET_TICKET: u16 = 13;
/// Reply: [`TicketReply`].
pub const TICKET: u16 = 14;
/// Request: empty, from an OSD; reply: [`SERVICE_KEYS`].
pub const GET_SERVICE_KEYS: u16 = 15;
/// Reply: [`ServiceKeysReply`].
pub const SERVICE_KEYS: u16 = 16;
/// Request: [`AuthRequest`] (needs `mon x`); reply: [`AUTH_REPLY`]. Handled by the leader.
pub const AUTH_COMMAND: u16 = 17;
/// Reply: [`AuthReply`].
pub const AUTH_REPLY: u16 = 18;
/// Request: [`MembersRequest`], changing which monitors form the cluster (needs `mon x`).
pub const MEMBERS_COMMAND: u16 = 19;
/// Reply: [`MembersReply`].
pub const MEMBERS_REPLY: u16 = 20;

/// Most PGs one heartbeat reports (an OSD leading more reports them over several).
pub const MAX_HEARTBEAT_PGS: usize = 4096;

/// Asks for the map; `have` is the epoch the asker holds (0 = none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetMap {
    pub have: u64,
}

/// Asks to be sent every new epoch after `have`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribe {
    pub have: u64,
}

/// A map, whole or as the incrementals after the asker's epoch (in order, consecutive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapUpdate {
    Full(ClusterMap),
    Incrementals(Vec<Incremental>),
}

/// Result of a command or heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandReply {
    Done(ChangeOutcome),
    Refused(MapError),
    /// Ask the leader instead (`leader` is its client address when known).
    NotLeader {
        leader: Option<String>,
    },
    /// The monitors cannot commit right now (no quorum); retry later.
    Unavailable(Unavailable),
    /// A heartbeat was accepted; the leader marks an OSD down after `grace_ms` without one
    /// (the OSD bounds its lease by it).
    Alive {
        grace_ms: u64,
    },
}

/// Why the monitors cannot serve a change right now ([`CommandReply::Unavailable`],
/// [`AuthReply::Unavailable`], [`MembersReply::Unavailable`]). Each is transient unless its
/// text says what to do first: asking again later (or another monitor) may succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Unavailable {
    /// The change was not committed within the leader's command timeout (`timeout_ms`); it
    /// may still be.
    #[error(
        "the change was not committed within {:?} (it may still be): a majority of the \
         monitors must be running and reachable",
        Duration::from_millis(*timeout_ms)
    )]
    NotCommitted { timeout_ms: u64 },
    /// This monitor's Raft stopped (it is shutting down, or its store failed): ask another.
    #[error("this monitor is stopping: {detail}")]
    Stopping {
        /// Raft's account of why it stopped.
        detail: String,
    },
    /// Raft refused the proposal because of the membership (a change in progress, or a
    /// configuration it cannot take now).
    #[error("{detail}")]
    Membership {
        /// Raft's account.
        detail: String,
    },
    /// The key database has not been seeded with the bootstrap keys yet (a new leader does
    /// that first).
    #[error("the monitors have not loaded their bootstrap keys yet; try again in a moment")]
    NotSeeded,
    /// A monitor being added (`cairn mon add`) did not catch up as a learner within
    /// `timeout_ms`: it stays a learner until added again.
    #[error(
        "monitor {id} did not catch up within {:?}: is it running (`cairn mon run --join`) \
         and reachable at {addr}? It stays a learner (not a voter) until added again",
        Duration::from_millis(*timeout_ms)
    )]
    LearnerBehind {
        id: u64,
        addr: String,
        timeout_ms: u64,
    },
    /// A map change came back applied as a key change (a monitor bug).
    #[error("a map change applied as a key change")]
    MapAppliedAsKeys,
    /// A key change came back applied as a map change (a monitor bug).
    #[error("a key change applied as a map change")]
    KeysAppliedAsMap,
}

/// An OSD's sign of life, sent to the leader every heartbeat interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub osd: u32,
    /// The epoch its current life began (from its boot).
    pub up_from: u64,
    /// For PGs it is primary of: the epoch each last went active (the monitors keep the map
    /// history back to the oldest of these over all PGs). At most [`MAX_HEARTBEAT_PGS`].
    pub pgs: Vec<PgStarted>,
}

/// A PG and the epoch it last went active (`last_epoch_started`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgStarted {
    pub pool: u32,
    pub pg: u32,
    pub epoch: u64,
}

/// Asks for the past intervals of a PG from epoch `since` to `until` (the asker's map epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastIntervalsQuery {
    pub pool: u32,
    pub pg: u32,
    pub since: u64,
    pub until: u64,
}

/// A PG's past intervals, or why they cannot be given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PastIntervalsReply {
    /// The intervals from epoch `from` (`since`, or the oldest epoch kept when later: the
    /// history before it is not needed by any PG) to `until`.
    Intervals {
        from: u64,
        intervals: Vec<PastInterval>,
    },
    /// This monitor's map is older than `until`: ask again (or another monitor).
    Behind { epoch: u64 },
    /// The history could not be replayed (a monitor bug or damaged store): the error a
    /// change of the history met when applied again.
    Failed(MapError),
}

/// An OSD (`reporter`, in its life `reporter_life`) cannot reach OSD `target` (in its life
/// `target_life`): it has not answered its pings for the grace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureReport {
    pub reporter: u32,
    pub reporter_life: u64,
    pub target: u32,
    pub target_life: u64,
}

/// A monitor's view of the monitor cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonStatus {
    pub id: u64,
    pub leader: Option<u64>,
    pub leader_addr: Option<String>,
    pub term: u64,
    /// Members (id, client address).
    pub members: Vec<(u64, String)>,
    pub epoch: u64,
    /// The oldest epoch of its map history (peering looks no further back).
    pub history_oldest: u64,
    /// The frame protection it requires of every connection (`cairn_auth::FrameMode`).
    pub frames: u8,
    /// Whether it requires authentication.
    pub authenticated: bool,
}

pub use super::{ErrorCode, ErrorReply};

/// A ticket for OSDs, or why none is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TicketReply {
    Granted {
        /// The sealed ticket, presented to OSDs as is (at most `cairn_auth::MAX_TICKET` bytes).
        ticket: Vec<u8>,
        /// The ticket's session secret, sealed with the requester's own key (AAD
        /// `"cairn ticket session v1" | entity`), so only the requester learns it.
        session: Vec<u8>,
        /// Seconds the ticket is good for (counted on the requester's clock from receipt,
        /// so clocks need not agree).
        ttl_secs: u64,
    },
    Refused(String),
}

/// The OSD service keys, or why none are given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceKeysReply {
    /// `Vec<cairn_auth::ServiceKey>` (postcard), sealed with the OSD's own key (AAD
    /// `"cairn service keys v1" | entity`).
    Granted {
        sealed: Vec<u8>,
    },
    Refused(String),
}

/// The AAD a ticket's session secret is sealed under for `entity`.
pub fn ticket_session_aad(entity: &str) -> Vec<u8> {
    [b"cairn ticket session v1".as_slice(), entity.as_bytes()].concat()
}

/// The AAD service keys are sealed under for `entity`.
pub fn service_keys_aad(entity: &str) -> Vec<u8> {
    [b"cairn service keys v1".as_slice(), entity.as_bytes()].concat()
}

/// A request to the monitors' key database (`cairn auth`). Entity names are checked when
/// decoded (`cairn_auth::Entity`), caps by the monitor when it applies the change; secrets
/// travel sealed with the requester's own key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthRequest {
    /// Every entity with its caps (no secrets).
    List,
    /// An entity's key and caps.
    Get { entity: Entity },
    /// A new entity with a key the leader generates; the reply carries it.
    Add { entity: Entity, caps: Caps },
    /// A new entity with the key given, sealed with the requester's key (AAD
    /// [`auth_import_aad`]; `cairn_auth::SEALED_SECRET_LEN` bytes).
    Import {
        entity: Entity,
        sealed: Vec<u8>,
        caps: Caps,
    },
    /// Replaces an entity's caps.
    SetCaps { entity: Entity, caps: Caps },
    /// A new key for an entity; the old one is still accepted for `keep_old_secs`.
    Rotate { entity: Entity, keep_old_secs: u64 },
    /// Removes an entity's key.
    Remove { entity: Entity },
    /// Every NBD user (a `client.` or `nbd.` entity with NBD caps) with its caps and TLS
    /// pre-shared key: for NBD gateways (`x` in NBD caps without `volume=`) or `mon x`.
    NbdUsers,
    /// The state of the monitors' shared key (never the key): [`AuthReply::MonKey`].
    MonKey,
}

/// One user of [`AuthReply::NbdUsers`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NbdUser {
    pub entity: Entity,
    pub caps: Caps,
    /// Its pre-shared key (`cairn_auth::nbd_psk`), sealed with the requester's key (AAD
    /// [`nbd_psk_aad`]).
    pub sealed_psk: Vec<u8>,
}

/// One entity of [`AuthReply::List`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthListing {
    pub entity: Entity,
    pub caps: Caps,
    /// When the previous key stops being accepted (unix seconds), during a rotation.
    pub previous_until: Option<u64>,
}

/// The answer to an [`AuthRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthReply {
    Done,
    List(Vec<AuthListing>),
    /// An entity's key, sealed with the requester's key (AAD [`auth_key_aad`]).
    Key {
        entity: Entity,
        caps: Caps,
        sealed: Vec<u8>,
    },
    Refused(String),
    /// Ask the leader instead.
    NotLeader {
        leader: Option<String>,
    },
    /// The monitors cannot commit right now; retry later.
    Unavailable(Unavailable),
    /// The answer to [`AuthRequest::NbdUsers`].
    NbdUsers(Vec<NbdUser>),
    /// The answer to [`AuthRequest::MonKey`].
    MonKey {
        /// Whether `cairn auth rotate mon` ever replaced the bootstrap key.
        rotated: bool,
        /// Until when (unix seconds) the key it replaced is still accepted, while that lasts.
        previous_until: Option<u64>,
    },
}

/// The AAD an NBD user's pre-shared key is sealed under in [`AuthReply::NbdUsers`].
pub fn nbd_psk_aad(entity: &Entity) -> Vec<u8> {
    [
        b"cairn nbd psk v1".as_slice(),
        entity.to_string().as_bytes(),
    ]
    .concat()
}

/// The AAD an entity's key is sealed under in [`AuthReply::Key`].
pub fn auth_key_aad(entity: &Entity) -> Vec<u8> {
    [
        b"cairn auth key v1".as_slice(),
        entity.to_string().as_bytes(),
    ]
    .concat()
}

/// The AAD a key is sealed under in [`AuthRequest::Import`].
pub fn auth_import_aad(entity: &Entity) -> Vec<u8> {
    [
        b"cairn auth import v1".as_slice(),
        entity.to_string().as_bytes(),
    ]
    .concat()
}

/// A change of the monitors' membership (`cairn mon add|rm`), served by the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembersRequest {
    /// Make monitor `id`, already running at `addr` (`cairn mon run --join`), a voting
    /// member: it first catches up as a learner.
    Add { id: u64, addr: String },
    /// Remove monitor `id` from the voters (it may be dead).
    Remove { id: u64 },
}

/// The answer to a [`MembersRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembersReply {
    /// Done: the voting members now (id, address).
    Done {
        members: Vec<(u64, String)>,
    },
    Refused(String),
    /// Ask the leader instead.
    NotLeader {
        leader: Option<String>,
    },
    /// The change could not be committed (retry later).
    Unavailable(Unavailable),
}
