//! Asking one OSD for its usage (for `cairn status`).

use crate::error::ClientError;
use cairn_proto::msg::osd::{OsdStats, OSD_STATS, OSD_STATS_REPLY};
use cairn_proto::stream::{handshake, node_kind, read_frame, write_frame};
use cairn_proto::Limits;
use std::time::Duration;

/// The usage of the OSD at `addr`, within `timeout`.
pub async fn osd_stats(addr: &str, timeout: Duration) -> Result<OsdStats, ClientError> {
    let fail = |why: String| ClientError::Failed(format!("osd at {addr}: {why}"));
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| fail(e.to_string()))?;
        handshake(&mut s, node_kind::CLIENT)
            .await
            .map_err(|e| fail(e.to_string()))?;
        write_frame(&mut s, OSD_STATS, 1, &[], &[])
            .await
            .map_err(|e| fail(e.to_string()))?;
        let f = read_frame(&mut s, &Limits::default())
            .await
            .map_err(|e| fail(e.to_string()))?;
        if f.msg_type != OSD_STATS_REPLY {
            return Err(fail(format!("unexpected reply type {}", f.msg_type)));
        }
        cairn_proto::msg::decode::<OsdStats>("osd stats", &f.control)
            .map_err(|e| fail(e.to_string()))
    };
    tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| fail("no answer".into()))?
}
