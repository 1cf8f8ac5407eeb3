//! One member of a PG's acting set (or a stray) as a peering primary sees it.

use super::rpc::Rpc;
use crate::pglog::LogEntry;
use cairn_proto::msg::peering::PgInfo;

pub(super) struct Member {
    pub id: u32,
    /// `None` for this OSD.
    pub rpc: Option<Rpc>,
    pub info: PgInfo,
    pub entries: Vec<LogEntry>,
}

impl Member {
    /// Its log head: (epoch, version) of its last entry.
    pub fn head(&self) -> (u64, u64) {
        (self.info.last_epoch, self.info.last_version)
    }
}
