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

impl From<crate::failure::Failure> for Refusal {
    /// Reading or writing the store failed: the code says how (full, corrupt, ...).
    fn from(f: crate::failure::Failure) -> Refusal {
        Refusal {
            code: f.class.code(),
            why: f.what,
        }
    }
}

impl From<cairn_store::StoreError> for Refusal {
    fn from(e: cairn_store::StoreError) -> Refusal {
        crate::failure::Failure::from(e).into()
    }
}

impl From<Refusal> for crate::failure::Failure {
    fn from(r: Refusal) -> crate::failure::Failure {
        let class = crate::failure::FailClass::of_code(r.code);
        crate::failure::Failure::new(class, r.why)
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
