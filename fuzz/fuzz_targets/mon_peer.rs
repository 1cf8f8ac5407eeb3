//! A monitor peer's Raft messages (append, vote, snapshot chunk, and their replies) through
//! the decoders a monitor runs: the server's checked decoder (cluster id, snapshot chunk
//! bound) and the client's reply decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_mon::fuzzing::peer_message(data));
