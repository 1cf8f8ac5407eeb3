//! The records of a monitor's database (applied state with the key database, snapshots, Raft
//! log entries, map history, vote) through the decoders a monitor runs at start; what decodes
//! must re-encode and decode the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_mon::fuzzing::stored_record(data));
