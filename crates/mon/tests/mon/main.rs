//! Monitor integration tests: monitors run in-process on 127.0.0.1, clients use
//! cairn-monclient (and raw frames for the malformed-input tests).

mod common;

mod cluster;
mod crash;
mod follow;
mod garbage;
mod heartbeat;
mod history;
mod single;
