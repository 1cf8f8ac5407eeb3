//! A rebuild request from a primary as a shard's mailbox carries it (`member.rs` serves it).

use crate::pglog::LogEntry;
use cairn_proto::msg::ec_rebuild::{EcPush, EcSetLog, EcStat};

/// A rebuild request from a primary, decoded and checked against its limits.
pub enum Request {
    Stat(EcStat),
    Push(EcPush, Vec<u8>),
    SetLog(EcSetLog, Vec<LogEntry>),
}
