//! Typed failures of the OSD's background work (peering, recovery, backfill, scrub, split).
//! Each carries a class that says whether trying again can help: a member that did not
//! answer may answer in a second, a full or corrupt store will not get better by asking it
//! again every second.

use crate::peering::rpc::RpcError;
use cairn_proto::msg::ErrorCode;
use cairn_store::StoreError;
use cairn_transport::{CallError, DialError};

/// What kind of failure it is, and so what is done about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailClass {
    /// A member unreachable, a call that timed out or broke, an object that changed while
    /// it was copied: tried again with backoff.
    Transient,
    /// A member's map or role differs from ours (one of us is behind): tried again with
    /// backoff; the maps converge.
    StaleMap,
    /// A store's data or device failed its checks (this OSD's: the OSD stops; a member's:
    /// that member stops): not tried again until the map changes.
    StoreCorrupt,
    /// A store has no space left: not tried again until the map changes (OSDs added,
    /// weights or pools changed).
    StoreFull,
    /// A member answered what the protocol does not allow (a bug or a hostile peer): not
    /// tried again until the map changes.
    Protocol,
    /// A member refused us permission (keys or caps): not tried again until the map
    /// changes.
    Permission,
    /// The newest history lacks objects that no OSD that could hold them has (all of them
    /// answered or were declared lost): not tried again until the map changes.
    Unfound,
}

impl FailClass {
    /// Its name in `cairn pg query` and `cairn status`.
    pub fn name(self) -> &'static str {
        match self {
            FailClass::Transient => "transient",
            FailClass::StaleMap => "stale_map",
            FailClass::StoreCorrupt => "store_corrupt",
            FailClass::StoreFull => "store_full",
            FailClass::Protocol => "protocol",
            FailClass::Permission => "permission",
            FailClass::Unfound => "unfound",
        }
    }

    /// Whether the same work may succeed if it is simply tried again.
    pub fn retries(self) -> bool {
        matches!(self, FailClass::Transient | FailClass::StaleMap)
    }

    /// The code a member's refusal carries for a failure of this class.
    pub fn code(self) -> ErrorCode {
        match self {
            FailClass::Transient | FailClass::StaleMap | FailClass::Unfound => ErrorCode::Internal,
            FailClass::StoreCorrupt => ErrorCode::StoreCorrupt,
            FailClass::StoreFull => ErrorCode::StoreFull,
            FailClass::Protocol => ErrorCode::Invalid,
            FailClass::Permission => ErrorCode::Denied,
        }
    }

    /// The class of a member's refusal with `code`.
    pub fn of_code(code: ErrorCode) -> FailClass {
        match code {
            ErrorCode::Internal => FailClass::Transient,
            ErrorCode::NotFound => FailClass::StaleMap,
            ErrorCode::Malformed | ErrorCode::Unsupported | ErrorCode::Invalid => {
                FailClass::Protocol
            }
            ErrorCode::Denied => FailClass::Permission,
            ErrorCode::StoreFull => FailClass::StoreFull,
            ErrorCode::StoreCorrupt => FailClass::StoreCorrupt,
        }
    }
}

impl std::fmt::Display for FailClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A failure with its class and what failed (which object, member or device).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}")]
pub struct Failure {
    pub class: FailClass,
    pub what: String,
    /// The failure is this OSD's own store's (a corrupt one takes this OSD down).
    pub local_store: bool,
}

impl Failure {
    pub fn new(class: FailClass, what: impl Into<String>) -> Failure {
        Failure {
            class,
            what: what.into(),
            local_store: false,
        }
    }

    pub fn transient(what: impl Into<String>) -> Failure {
        Failure::new(FailClass::Transient, what)
    }

    pub fn stale(what: impl Into<String>) -> Failure {
        Failure::new(FailClass::StaleMap, what)
    }

    pub fn protocol(what: impl Into<String>) -> Failure {
        Failure::new(FailClass::Protocol, what)
    }
}

/// A member's answer other than `Done` to a push or a pull, as a failure.
pub fn refused(who: &str, done: &cairn_proto::msg::peering::PgDone) -> Failure {
    use cairn_proto::msg::peering::PgDone;
    match done {
        PgDone::Done => Failure::protocol(format!("{who}: an unexpected Done")),
        PgDone::Stale { epoch } => Failure::stale(format!(
            "{who}: its map (epoch {epoch}) no longer has this OSD as primary"
        )),
        PgDone::Failed { code, why } => Failure::new(
            FailClass::of_code(*code),
            format!("{who} refused ({code}): {why}"),
        ),
        PgDone::Busy => Failure::transient(format!("{who}: the object changed meanwhile")),
    }
}

/// The class of a store error of this OSD's own store.
pub fn store_class(e: &StoreError) -> FailClass {
    match e {
        StoreError::NoSpace { .. } => FailClass::StoreFull,
        StoreError::Io { .. }
        | StoreError::BadDevice { .. }
        | StoreError::Corrupt { .. }
        | StoreError::CorruptData { .. }
        | StoreError::Failed(_)
        | StoreError::Config(_) => FailClass::StoreCorrupt,
        // A collection or object that went away meanwhile (a PG removed, an object deleted
        // by a client while it was copied): the next attempt sees the new state.
        StoreError::NoCollection(_)
        | StoreError::CollectionExists(_)
        | StoreError::NoObject { .. } => FailClass::Transient,
        // A peer's data that this store cannot hold as sent.
        StoreError::TooLarge { .. } | StoreError::Invalid(_) => FailClass::Protocol,
        // A kind of store error this code does not know yet: not retried blindly.
        _ => FailClass::StoreCorrupt,
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure {
            class: store_class(&e),
            what: e.to_string(),
            local_store: true,
        }
    }
}

impl From<RpcError> for Failure {
    fn from(e: RpcError) -> Failure {
        let class = match &e {
            RpcError::NotInMap(_) => FailClass::StaleMap,
            RpcError::Connect(DialError::WrongPeer { .. }) => FailClass::Protocol,
            RpcError::Connect(_) => FailClass::Transient,
            RpcError::Call(CallError::Refused { code, .. }) => FailClass::of_code(*code),
            RpcError::Call(CallError::Unexpected { .. } | CallError::Malformed { .. }) => {
                FailClass::Protocol
            }
            RpcError::Call(CallError::Closed { .. } | CallError::Timeout { .. }) => {
                FailClass::Transient
            }
        };
        Failure::new(class, e.to_string())
    }
}

impl From<cairn_proto::msg::MsgError> for Failure {
    /// A member's message that does not decode.
    fn from(e: cairn_proto::msg::MsgError) -> Failure {
        Failure::protocol(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_classes_retry_and_codes_round_trip() {
        let all = [
            FailClass::Transient,
            FailClass::StaleMap,
            FailClass::StoreCorrupt,
            FailClass::StoreFull,
            FailClass::Protocol,
            FailClass::Permission,
            FailClass::Unfound,
        ];
        let retrying: Vec<_> = all.iter().filter(|c| c.retries()).collect();
        assert_eq!(retrying, [&FailClass::Transient, &FailClass::StaleMap]);
        for c in all
            .iter()
            .filter(|c| !c.retries() && **c != FailClass::Unfound)
        {
            assert_eq!(FailClass::of_code(c.code()), *c, "{c}");
        }
    }

    #[test]
    fn store_errors_are_classed_full_or_corrupt() {
        let full = StoreError::NoSpace {
            needed: 1,
            available: 0,
        };
        assert_eq!(Failure::from(full).class, FailClass::StoreFull);
        let bad = StoreError::corrupt("segment", "data", 4096, "checksum");
        let f = Failure::from(bad);
        assert_eq!(f.class, FailClass::StoreCorrupt);
        assert!(f.local_store);
    }
}
