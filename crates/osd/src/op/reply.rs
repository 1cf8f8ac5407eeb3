//! Sending an op's reply: what the handlers and the PG state (answering watches) share,
//! below both so that neither imports the other for it.

use cairn_proto::msg::osd::{OpReply, OP_REPLY};
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
