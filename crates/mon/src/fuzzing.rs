//! Entry points for the fuzz targets (`fuzz/fuzz_targets/mon_peer.rs`, `mon_stored.rs`): the
//! production decoders of what a monitor reads from its peers and from its database, on
//! arbitrary bytes. Each must end without a panic; what decodes must re-encode and decode
//! the same.

use crate::history::History;
use crate::raft_net::{self, decode_peer_reply, decode_peer_rpc, PeerRpc};
use crate::state_machine::{SmData, SnapshotData, StoredSnapshot};
use crate::store::{dec, enc};
use crate::types::{Entry, LogId, NodeId};
use cairn_map::{ClusterMap, Incremental};
use cairn_proto::Frame;

/// A peer's Raft message (the first byte picks its type, request or reply; the rest is the
/// control part), through the server's checked decoder or the client's reply decoder.
pub fn peer_message(data: &[u8]) {
    let Some((&which, control)) = data.split_first() else {
        return;
    };
    let types = [
        raft_net::RAFT_APPEND,
        raft_net::RAFT_VOTE,
        raft_net::RAFT_SNAPSHOT,
        raft_net::RAFT_APPEND_REPLY,
        raft_net::RAFT_VOTE_REPLY,
        raft_net::RAFT_SNAPSHOT_REPLY,
    ];
    let msg_type = types[which as usize % types.len()];
    if which as usize % types.len() >= 3 {
        decode_peer_reply(msg_type, control);
        return;
    }
    let frame = Frame {
        msg_type,
        request_id: 0,
        control: control.to_vec(),
        data: Vec::new(),
    };
    // A cluster id of zeros, or the one the input claims (so inputs get past the check).
    let fsid = control
        .get(..16)
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .unwrap_or_default();
    if let Ok(PeerRpc::Snapshot(s)) = decode_peer_rpc(&fsid, &frame) {
        let reach = s.offset.saturating_add(s.data.len() as u64);
        assert!(reach <= raft_net::MAX_SNAPSHOT_BYTES);
    }
}

fn same<T>(what: &'static str, b: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    if let Ok(v) = dec::<T>(what, b) {
        let again = enc(&v);
        let back: T = dec(what, &again).unwrap_or_else(|e| panic!("{what} re-decodes: {e}"));
        assert_eq!(enc(&back), again, "{what} re-encodes the same");
    }
}

/// A record of the monitor's database (the first byte picks which), through the decoder
/// the monitor runs at start.
pub fn stored_record(data: &[u8]) {
    let Some((&which, b)) = data.split_first() else {
        return;
    };
    match which % 8 {
        0 => same::<SmData>("state machine", b),
        1 => {
            if let Ok(s) = dec::<StoredSnapshot>("snapshot", b) {
                same::<SnapshotData>("snapshot data", &s.data);
            }
        }
        2 => same::<SnapshotData>("snapshot data", b),
        3 => same::<Entry>("raft log entry", b),
        4 => same::<Incremental>("map history", b),
        5 => same::<ClusterMap>("history base", b),
        6 => same::<History>("history", b),
        _ => {
            same::<Option<LogId>>("purged", b);
            same::<openraft::Vote<NodeId>>("vote", b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::MapView;
    use crate::types::Proposal;
    use cairn_map::MapChange;

    /// Valid records, each cut at every length and with bytes flipped: the decoders the
    /// fuzz targets run end without a panic (the fuzz targets search much further).
    #[test]
    fn stored_records_and_peer_messages_never_panic_on_damaged_bytes() {
        let view = MapView::for_tests();
        let entry = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(3, 1), 9),
            payload: openraft::EntryPayload::Normal(Proposal::Map(MapChange::OsdOut { id: 2 })),
        };
        let map = view.with_map(|m| m.clone());
        let mut inputs: Vec<(u8, Vec<u8>)> = vec![
            (3, enc(&entry)),
            (5, enc(&map)),
            (6, enc(&History::starting_at(&map))),
        ];
        let vote = crate::raft_net::PeerRequest {
            fsid: [0; 16],
            from: 1,
            rpc: openraft::raft::VoteRequest::<NodeId>::new(openraft::Vote::new(2, 1), None),
        };
        inputs.push((1, enc(&vote)));
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for (which, bytes) in &inputs {
            for cut in 0..=bytes.len() {
                let mut d = vec![*which];
                d.extend_from_slice(&bytes[..cut]);
                stored_record(&d);
                peer_message(&d);
                if cut < bytes.len() {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let mut flipped = vec![*which];
                    flipped.extend_from_slice(bytes);
                    flipped[1 + cut] ^= (seed >> 56) as u8 | 1;
                    stored_record(&flipped);
                    peer_message(&flipped);
                }
            }
        }
    }
}
