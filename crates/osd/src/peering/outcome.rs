//! What peering works with and leaves behind, apart from how it runs: a PG's interval (its
//! acting set with each member's life), what a peering found (`Report`), and the objects it
//! leaves to background recovery (`Backlog`). Shard messages and PG state carry these.

use super::dirty::Dirty;
use cairn_map::ClusterMap;

/// The acting set with each member's life: a member that restarted makes a new interval.
pub type Interval = Vec<(u32, u64)>;

/// What peering leaves to background recovery, or why the PG did not go active.
pub type PeerResult = Result<Peered, PeerError>;

/// A peering that brought the acting set to the authoritative history.
pub struct Peered {
    pub backlog: Backlog,
    pub report: Report,
}

/// Why peering did not make the PG active.
pub enum PeerError {
    /// Some interval that may have acknowledged writes has no member that answered.
    Down(Report),
    /// Anything else (a member unreachable, a store error ...): tried again with backoff
    /// when its class is transient, else only once the map changes.
    Failed(crate::failure::Failure),
    /// The newest history lacks `objects` and no OSD that could hold them answered (all of
    /// them did, or were declared lost): not retried until the map changes or an operator
    /// gives them up (`cairn pg mark-unfound-lost`).
    Unfound {
        objects: Vec<Vec<u8>>,
        failure: crate::failure::Failure,
    },
}

impl From<crate::failure::Failure> for PeerError {
    fn from(e: crate::failure::Failure) -> Self {
        PeerError::Failed(e)
    }
}

/// What a peering found about the PG's past intervals (`cairn pg query`).
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The epoch the intervals start at.
    pub from: u64,
    pub intervals: Vec<cairn_map::PastInterval>,
    pub answered: std::collections::BTreeSet<u32>,
    pub coverage: cairn_map::intervals::Coverage,
    /// When down: the OSDs it waits for (any one of them answering may unblock it).
    pub waiting_for: Vec<u32>,
    /// When down for another reason than an uncovered interval: why.
    pub reason: Option<String>,
}

/// The acting set with each member's life in `map`.
pub fn interval(map: &ClusterMap, acting: &[u32]) -> Interval {
    acting
        .iter()
        .map(|id| (*id, map.osds.get(id).map_or(0, |o| o.up_from)))
        .collect()
}

/// What one member still lacks.
pub struct Work {
    pub member: u32,
    pub objects: Vec<(Vec<u8>, Dirty)>,
}

/// What the primary's own copy lacks, and the acting member to pull it from (members get
/// every write, so its copies of these objects stay current: writes to them wait here).
pub struct Own {
    pub from: u32,
    pub objects: Vec<(Vec<u8>, Dirty)>,
}

/// Everything peering leaves to do in the background.
#[derive(Default)]
pub struct Backlog {
    pub own: Option<Own>,
    pub members: Vec<Work>,
}

impl Backlog {
    pub fn is_empty(&self) -> bool {
        self.own.is_none() && self.members.is_empty()
    }

    /// Objects the primary's own copy lacks.
    pub fn own_missing(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.own
            .iter()
            .flat_map(|o| o.objects.iter().map(|(n, _)| n))
    }

    pub(super) fn len(&self) -> u64 {
        let own = self.own.as_ref().map_or(0, |o| o.objects.len());
        let members: usize = self.members.iter().map(|w| w.objects.len()).sum();
        (own + members) as u64
    }
}
