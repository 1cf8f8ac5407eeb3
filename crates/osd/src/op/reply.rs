//! Sending an op's reply: what the handlers and the PG state (answering watches) share,
//! below both so that neither imports the other for it.

use cairn_proto::msg::osd::{FailCode, OpReply, RepReply, OP_REPLY, REP_REPLY};
use cairn_store::StoreError;
use cairn_transport::FrameSender;

/// Sends an op reply (a client that went away needs none).
pub fn reply(to: &FrameSender, req_id: u64, r: &OpReply, data: &[u8]) {
    let control = cairn_proto::msg::encode(r);
    let _ = to.send(OP_REPLY, req_id, &control, data);
}

/// Sends an op reply carrying data read for it, held (not copied) if the reply must wait in
/// the connection's queue.
pub fn reply_data(to: &FrameSender, req_id: u64, r: &OpReply, data: Vec<u8>) {
    let control = cairn_proto::msg::encode(r);
    let _ = to.send_held(OP_REPLY, req_id, &control, data);
}

/// The wire code of a store failure: what a client (the NBD server's ENOSPC) matches on.
pub fn fail_code(e: &StoreError) -> FailCode {
    match e {
        StoreError::NoSpace { .. } => FailCode::NoSpace,
        StoreError::Io { .. } | StoreError::BadDevice { .. } | StoreError::Failed(_) => {
            FailCode::Device
        }
        StoreError::Corrupt { .. } | StoreError::CorruptData { .. } => FailCode::Corrupt,
        _ => FailCode::Other,
    }
}

/// A client's answer to an op the store failed.
pub fn store_failed(e: &StoreError) -> OpReply {
    OpReply::Failed {
        code: fail_code(e),
        why: e.to_string(),
    }
}

/// A primary's answer to a replicated write the store failed.
pub fn rep_store_failed(e: &StoreError) -> RepReply {
    RepReply::Failed {
        code: fail_code(e),
        why: e.to_string(),
    }
}

/// Sends a replica's answer to its primary.
pub fn rep_reply(to: &FrameSender, req_id: u64, r: &RepReply) {
    let control = cairn_proto::msg::encode(r);
    let _ = to.send(REP_REPLY, req_id, &control, &[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_failures_get_the_code_callers_match_on() {
        let full = StoreError::NoSpace {
            needed: 8192,
            available: 0,
        };
        assert_eq!(fail_code(&full), FailCode::NoSpace);
        assert_eq!(fail_code(&StoreError::Failed("x".into())), FailCode::Device);
        let io = StoreError::io("data0", 0, std::io::Error::other("boom"));
        assert_eq!(fail_code(&io), FailCode::Device);
        assert_eq!(fail_code(&StoreError::Invalid("x".into())), FailCode::Other);
        match store_failed(&full) {
            OpReply::Failed { code, why } => {
                assert_eq!(code, FailCode::NoSpace);
                assert!(why.contains("no space left"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }
}
