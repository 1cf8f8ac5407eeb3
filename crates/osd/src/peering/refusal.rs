//! Why a member refused a peering or recovery request, with the typed code its `PG_DONE`
//! reply carries.

use cairn_proto::msg::peering::PgDone;
use cairn_proto::msg::ErrorCode;

/// Why a peering request was refused, typed for the `PG_DONE` reply.
#[derive(Debug)]
pub struct Refusal {
    pub code: ErrorCode,
    pub why: String,
}

impl From<String> for Refusal {
    /// Reading or writing the store failed.
    fn from(why: String) -> Refusal {
        Refusal {
            code: ErrorCode::Internal,
            why,
        }
    }
}

impl Refusal {
    pub fn new(code: ErrorCode, why: String) -> Refusal {
        Refusal { code, why }
    }

    /// The `PG_DONE` reply that carries it.
    pub fn reply(self) -> PgDone {
        PgDone::Failed {
            code: self.code,
            why: self.why,
        }
    }
}
