//! Golden files of the monitor's database at every format (1 to [`crate::store::FORMAT`]) and
//! of the monitor-to-monitor Raft messages (`testdata/`, listed in `docs/format/mon.md`).
//! Regenerate with `CAIRN_BLESS_GOLDEN=1 cargo test -p cairn-mon golden` (only with a format
//! or protocol bump: a changed golden file is a changed format).
//!
//! A database golden file holds the rows of the database, each entry named `table/key`. The
//! rows of an older format are built here from that format's layout (postcard encodes a struct
//! as its fields back to back, so an old struct is the encodings of its fields, which this file
//! spells out), not with the types the migrations decode them with. Each test loads its
//! format's rows into a new database, opens it (which upgrades an older format in place) and
//! compares every row and the opened state with what the current format must hold.

#[path = "../../../testsupport/samples.rs"]
mod samples;
#[path = "../../../testsupport/golden.rs"]
mod support;

use crate::history::{self, History};
use crate::state_machine::{SmData, SnapshotData, StateMachine, StoredSnapshot};
use crate::store::{dec, enc, key, LOG, META};
use crate::types::{BasicNode, Entry, LogId, MonRaft, NodeId, Proposal, StoredMembership};
use cairn_auth::KeyDb;
use cairn_map::{ClusterMap, Incremental, MapChange, PlacementRule};
use openraft::{CommittedLeaderId, EntryPayload, Membership, SnapshotMeta, Vote};
use std::collections::{BTreeMap, VecDeque};
use support::{same, Golden};

const FSID: [u8; 16] = *b"golden-fsid-0001";
const MON_ID: u64 = 2;

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(3, 1), index)
}

fn membership() -> Membership<NodeId, BasicNode> {
    let nodes: BTreeMap<NodeId, BasicNode> = (1..=3)
        .map(|i| (i, BasicNode::new(format!("10.0.0.{i}:6789"))))
        .collect();
    Membership::new(vec![[1, 2, 3].into()], nodes)
}

fn stored_membership() -> StoredMembership {
    StoredMembership::new(Some(log_id(9)), membership())
}

/// The map change of the last epoch (43), in the log and in the history.
fn incremental() -> Incremental {
    Incremental {
        epoch: 43,
        change: MapChange::OsdOut { id: 4 },
    }
}

/// The history's base map (epoch 42) as a database of `format` holds it, in today's types:
/// what the format lacks is what the upgrade gives it.
fn base_map(format: u32) -> ClusterMap {
    let mut m = samples::cluster_map();
    if format < 5 {
        m.blocklist.clear();
    }
    if format < 4 {
        m.hosts.clear();
        for p in m.pools.values_mut() {
            p.rule = PlacementRule::FlatV1;
        }
    }
    if format < 2 {
        for o in m.osds.values_mut() {
            o.lost_at = 0;
        }
    }
    m
}

/// The applied map: the base map and the last epoch's change.
fn map(format: u32) -> ClusterMap {
    let mut m = base_map(format);
    m.apply(&incremental().change).unwrap();
    m
}

/// The key database (empty and unseeded before format 3; no monitors' key before 6).
fn keys(format: u32) -> KeyDb {
    match format {
        1 | 2 => KeyDb::default(),
        3..=5 => KeyDb {
            mon: None,
            ..samples::key_db()
        },
        _ => samples::key_db(),
    }
}

/// The last log entry (the applied state is at it).
fn last_index(format: u32) -> u64 {
    15 + log_payloads(format).len() as u64 - 3
}

fn sm(format: u32, last_applied: u64) -> SmData {
    SmData {
        last_applied: Some(log_id(last_applied)),
        membership: stored_membership(),
        map: map(format),
        keys: keys(format),
    }
}

fn snapshot_meta() -> SnapshotMeta<NodeId, BasicNode> {
    SnapshotMeta {
        last_log_id: Some(log_id(14)),
        last_membership: stored_membership(),
        snapshot_id: "3-1-14".into(),
    }
}

/// The history of the snapshot and the tables (none kept before format 2).
fn history(format: u32) -> History {
    if format < 2 {
        return History::starting_at(&map(format));
    }
    History {
        base: base_map(format),
        incs: VecDeque::from([incremental()]),
    }
}

/// The log from index 13: the last epoch's change, a blank entry, a membership change and
/// (from format 3) every change of the key database.
fn log_payloads(format: u32) -> Vec<(String, EntryPayload<MonRaft>)> {
    let mut v = vec![
        (
            "Normal(Map)".to_string(),
            EntryPayload::Normal(Proposal::Map(incremental().change)),
        ),
        ("Blank".to_string(), EntryPayload::Blank),
        (
            "Membership".to_string(),
            EntryPayload::Membership(membership()),
        ),
    ];
    if format >= 3 {
        for (name, k) in samples::key_changes() {
            if name == "RotateMon" && format < 6 {
                continue;
            }
            v.push((
                format!("Normal(Keys::{name})"),
                EntryPayload::Normal(Proposal::Keys(k)),
            ));
        }
    }
    v
}

/// A map in the layout of `format`: 1 had no `OsdInfo::lost_at`, up to 3 no pool rule and no
/// hosts' labels, up to 4 no blocklist.
fn map_bytes(m: &ClusterMap, format: u32) -> Vec<u8> {
    let pools_v3: BTreeMap<u32, _> = m
        .pools
        .iter()
        .map(|(id, p)| {
            let p = (p.id, &p.name, p.size, p.min_size, p.pg_count, p.durability);
            (*id, p)
        })
        .collect();
    match format {
        1 => {
            let osds: BTreeMap<u32, _> = m
                .osds
                .iter()
                .map(|(id, o)| {
                    let o = (
                        o.id, &o.addr, &o.host, o.up, o.in_, o.weight, o.up_from, o.store_id,
                    );
                    (*id, o)
                })
                .collect();
            let v1 = (
                m.fsid,
                m.epoch,
                osds,
                pools_v3,
                m.next_pool_id,
                m.next_osd_id,
            );
            enc(&v1)
        }
        2 | 3 => {
            let v3 = (
                m.fsid,
                m.epoch,
                &m.osds,
                pools_v3,
                m.next_pool_id,
                m.next_osd_id,
            );
            enc(&v3)
        }
        4 => {
            let v4 = (
                m.fsid,
                m.epoch,
                &m.osds,
                &m.pools,
                m.next_pool_id,
                m.next_osd_id,
                &m.hosts,
            );
            enc(&v4)
        }
        _ => enc(m),
    }
}

/// The applied state in the layout of `format`: no key database before 3, no monitors' key
/// before 6.
fn sm_bytes(s: &SmData, format: u32) -> Vec<u8> {
    let mut b = enc(&s.last_applied);
    b.extend(enc(&s.membership));
    b.extend(map_bytes(&s.map, format));
    match format {
        1 | 2 => {}
        3..=5 => b.extend(enc(&(s.keys.seeded, &s.keys.keys))),
        _ => b.extend(enc(&s.keys)),
    }
    b
}

/// A snapshot's state in the layout of `format`: the applied state alone in format 1, then
/// with the map history.
fn snapshot_data_bytes(s: &SmData, h: &History, format: u32) -> Vec<u8> {
    let mut b = sm_bytes(s, format);
    if format >= 2 {
        b.extend(map_bytes(&h.base, format));
        b.extend(enc(&h.incs));
    }
    b
}

/// A log entry in the layout of `format`: up to 2 a bare map change, then a `Proposal`.
fn entry_bytes(index: u64, p: &EntryPayload<MonRaft>, format: u32) -> Vec<u8> {
    if format >= 3 {
        let e = Entry {
            log_id: log_id(index),
            payload: p.clone(),
        };
        return enc(&e);
    }
    // The payload's variant index, then its content.
    let mut b = enc(&log_id(index));
    match p {
        EntryPayload::Blank => b.push(0),
        EntryPayload::Normal(Proposal::Map(c)) => {
            b.push(1);
            b.extend(enc(c));
        }
        EntryPayload::Membership(m) => {
            b.push(2);
            b.extend(enc(m));
        }
        EntryPayload::Normal(Proposal::Keys(_)) => unreachable!("no key changes before 3"),
    }
    b
}

/// The rows of a database of `format`, each `(table/key, bytes, check)`; the checks decode
/// the rows of the current format (older ones are decoded by the upgrade, see
/// [`opens_and_upgrades`]).
fn rows(format: u32) -> Golden {
    let current = format == crate::store::FORMAT;
    let mut g = Golden::new(&format!("mon-state-v{format}.bin"));
    let row = |g: &mut Golden, name: String, b: Vec<u8>, check: support::Check| {
        if current {
            g.add(name, b, check);
        } else {
            g.add(name, b, |_| Ok(()));
        }
    };
    let meta = |k: &str| format!("meta/{k}");
    row(&mut g, meta(key::FORMAT), enc(&format), decodes_to(format));
    row(&mut g, meta(key::FSID), enc(&FSID), decodes_to(FSID));
    row(&mut g, meta(key::MON_ID), enc(&MON_ID), decodes_to(MON_ID));
    let vote: Vote<NodeId> = Vote::new_committed(3, 1);
    row(&mut g, meta(key::VOTE), enc(&vote), decodes_to(vote));
    let committed = Some(log_id(last_index(format)));
    row(
        &mut g,
        meta(key::COMMITTED),
        enc(&committed),
        decodes_to(committed),
    );
    row(
        &mut g,
        meta(key::PURGED),
        enc(&log_id(12)),
        decodes_to(log_id(12)),
    );
    let state = sm(format, last_index(format));
    row(
        &mut g,
        meta(key::STATE_MACHINE),
        sm_bytes(&state, format),
        Box::new(move |b: &[u8]| same_sm(&dec("state", b).map_err(|e| e.to_string())?, &state)),
    );
    let (snap_sm, snap_history) = (sm(format, 14), history(format));
    let stored = StoredSnapshot {
        meta: snapshot_meta(),
        data: snapshot_data_bytes(&snap_sm, &snap_history, format),
    };
    row(
        &mut g,
        meta(key::SNAPSHOT),
        enc(&stored),
        Box::new(move |b: &[u8]| {
            let want = SnapshotData {
                sm: snap_sm.clone(),
                history: snap_history.clone(),
            };
            same_snapshot(&dec("snapshot", b).map_err(|e| e.to_string())?, &want)
        }),
    );
    if format >= 2 {
        let base = base_map(format);
        row(
            &mut g,
            meta(history::BASE_KEY),
            map_bytes(&base, format),
            decodes_to(base),
        );
        let inc = incremental();
        row(
            &mut g,
            format!("map_history/{}", inc.epoch),
            enc(&inc),
            decodes_to(inc),
        );
    }
    for (i, (name, p)) in log_payloads(format).into_iter().enumerate() {
        let index = 13 + i as u64;
        let b = entry_bytes(index, &p, format);
        let check: support::Check = Box::new(move |b: &[u8]| same_entry(b, index, &p));
        row(&mut g, format!("raft_log/{index} {name}"), b, check);
    }
    g
}

/// A check that a row decodes (as today's type) to `want`.
fn decodes_to<T>(want: T) -> support::Check
where
    T: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + 'static,
{
    Box::new(move |b: &[u8]| same(&dec::<T>("row", b).map_err(|e| e.to_string())?, &want))
}

fn same_sm(got: &SmData, want: &SmData) -> Result<(), String> {
    same(
        &(&got.last_applied, &got.membership, &got.map, &got.keys),
        &(&want.last_applied, &want.membership, &want.map, &want.keys),
    )
}

fn same_snapshot(got: &StoredSnapshot, want: &SnapshotData) -> Result<(), String> {
    same(&got.meta, &snapshot_meta())?;
    let data: SnapshotData = dec("snapshot data", &got.data).map_err(|e| e.to_string())?;
    same_sm(&data.sm, &want.sm)?;
    same(&data.history, &want.history)
}

fn same_entry(b: &[u8], index: u64, want: &EntryPayload<MonRaft>) -> Result<(), String> {
    let e: Entry = dec("entry", b).map_err(|e| e.to_string())?;
    same(&e.log_id, &log_id(index))?;
    same(&e.payload, want)
}

/// Loads the golden rows of `format` into a new database, opens it (upgrading it) and
/// checks every row and the state the monitor opens with, in the current format.
fn opens_and_upgrades(format: u32) {
    let golden = support::parse(
        &std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("testdata/mon-state-v{format}.bin")),
        )
        .unwrap(),
    )
    .unwrap();
    let dir =
        std::env::temp_dir().join(format!("cairn-mon-golden-v{format}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    {
        let db = redb::Database::create(dir.join(crate::store::DB_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            // Only the tables the format has rows in (format 1 had no map history).
            for (name, b) in &golden {
                let (table, k) = name.split_once('/').unwrap();
                let number = || k.split(' ').next().unwrap().parse::<u64>().unwrap();
                match table {
                    "meta" => {
                        let mut t = txn.open_table(META).unwrap();
                        t.insert(k, b.as_slice()).unwrap();
                    }
                    "raft_log" => {
                        let mut t = txn.open_table(LOG).unwrap();
                        t.insert(number(), b.as_slice()).unwrap();
                    }
                    "map_history" => {
                        let mut t = txn.open_table(history::TABLE).unwrap();
                        t.insert(number(), b.as_slice()).unwrap();
                    }
                    t => panic!("no table {t}"),
                }
            }
        }
        txn.commit().unwrap();
    }
    let db = crate::store::open(&dir, MON_ID, FSID).unwrap();
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(META).unwrap();
    let get = |k: &str| meta.get(k).unwrap().map(|v| v.value().to_vec());
    let format_now: u32 = dec("format", &get(key::FORMAT).unwrap()).unwrap();
    assert_eq!(
        format_now,
        crate::store::FORMAT,
        "format {format}: not upgraded"
    );
    for k in [
        key::FSID,
        key::MON_ID,
        key::VOTE,
        key::COMMITTED,
        key::PURGED,
    ] {
        let golden_row = golden
            .iter()
            .find(|(n, _)| *n == format!("meta/{k}"))
            .unwrap();
        assert_eq!(
            get(k).as_ref(),
            Some(&golden_row.1),
            "format {format}: meta/{k}"
        );
    }
    let check = |what: &str, r: Result<(), String>| {
        if let Err(e) = r {
            panic!("format {format} upgraded: {what}: {e}");
        }
    };
    let state = sm(format, last_index(format));
    check(
        "meta/state_machine",
        same_sm(
            &dec("state", &get(key::STATE_MACHINE).unwrap()).unwrap(),
            &state,
        ),
    );
    let snap = SnapshotData {
        sm: sm(format, 14),
        history: history(format),
    };
    check(
        "meta/snapshot",
        same_snapshot(
            &dec("snapshot", &get(key::SNAPSHOT).unwrap()).unwrap(),
            &snap,
        ),
    );
    let base: Option<ClusterMap> = get(history::BASE_KEY).map(|b| dec("base", &b).unwrap());
    assert_eq!(
        base,
        (format >= 2).then(|| base_map(format)),
        "format {format} upgraded: meta/history_base"
    );
    drop(meta);
    let log = txn.open_table(LOG).unwrap();
    for (i, (name, p)) in log_payloads(format).into_iter().enumerate() {
        let index = 13 + i as u64;
        let b = log.get(index).unwrap().unwrap().value().to_vec();
        check(
            &format!("raft_log/{index} {name}"),
            same_entry(&b, index, &p),
        );
    }
    drop(log);
    let inc: Option<Incremental> = match txn.open_table(history::TABLE) {
        Ok(t) => t
            .get(incremental().epoch)
            .unwrap()
            .map(|v| dec("inc", v.value()).unwrap()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        inc,
        (format >= 2).then(incremental),
        "format {format} upgraded: map_history"
    );
    drop(txn);
    let sm = StateMachine::open(db, FSID).unwrap();
    let view = sm.view();
    view.with_map(|m| assert_eq!(m, &map(format), "format {format}: the opened map"));
    view.with_keys(|k| assert_eq!(k, &keys(format), "format {format}: the opened keys"));
    let oldest = if format >= 2 { 42 } else { 43 };
    assert_eq!(
        view.history_oldest(),
        oldest,
        "format {format}: the history"
    );
    drop(sm);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mon_state_v6() {
    assert_eq!(crate::store::FORMAT, 6, "a new format: add its golden file");
    rows(6).finish();
    opens_and_upgrades(6);
}

#[test]
fn mon_state_v5() {
    rows(5).finish();
    opens_and_upgrades(5);
}

#[test]
fn mon_state_v4() {
    rows(4).finish();
    opens_and_upgrades(4);
}

#[test]
fn mon_state_v3() {
    rows(3).finish();
    opens_and_upgrades(3);
}

#[test]
fn mon_state_v2() {
    rows(2).finish();
    opens_and_upgrades(2);
}

#[test]
fn mon_state_v1() {
    rows(1).finish();
    opens_and_upgrades(1);
}

/// The monitor-to-monitor Raft messages (protocol version 12): each request in its
/// `PeerRequest`, and each reply's variants. The message type numbers are an entry too.
#[test]
fn msg_raft_v12() {
    use crate::raft_net::*;
    use openraft::error::{Fatal, InstallSnapshotError, RaftError, SnapshotMismatch};
    use openraft::raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    };
    use openraft::SnapshotSegmentId;
    type AppendReply = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
    type VoteReply = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
    type SnapshotReply =
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;
    assert_eq!(
        cairn_proto::PROTOCOL_VERSION,
        12,
        "a new protocol: bless -v13 files"
    );

    let mut g = Golden::new("msg-raft-v12.bin");
    let types = [
        RAFT_APPEND,
        RAFT_VOTE,
        RAFT_SNAPSHOT,
        RAFT_APPEND_REPLY,
        RAFT_VOTE_REPLY,
        RAFT_SNAPSHOT_REPLY,
    ];
    let b: Vec<u8> = types.iter().flat_map(|t| t.to_le_bytes()).collect();
    g.add("message types", b.clone(), move |got| {
        same(&got.to_vec(), &b)
    });

    let peer = |b: &[u8]| -> Result<(), String> {
        // fsid and sender, ahead of every request.
        same(&b.get(..16), &Some(&FSID[..]))?;
        same(&b.get(16), &Some(&(MON_ID as u8)))
    };
    let entries: Vec<Entry> = log_payloads(crate::store::FORMAT)
        .into_iter()
        .enumerate()
        .map(|(i, (_, payload))| Entry {
            log_id: log_id(13 + i as u64),
            payload,
        })
        .collect();
    let append = PeerRequest {
        fsid: FSID,
        from: MON_ID,
        rpc: AppendEntriesRequest::<MonRaft> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(log_id(12)),
            entries: entries.clone(),
            leader_commit: Some(log_id(11)),
        },
    };
    g.add(
        "PeerRequest<AppendEntriesRequest>",
        cairn_proto::msg::encode(&append),
        move |b| {
            peer(b)?;
            let got: PeerRequest<AppendEntriesRequest<MonRaft>> =
                cairn_proto::msg::decode("append", b).map_err(|e| e.to_string())?;
            let r = &got.rpc;
            same(
                &(r.vote, r.prev_log_id, r.leader_commit),
                &(
                    Vote::new_committed(3, 1),
                    Some(log_id(12)),
                    Some(log_id(11)),
                ),
            )?;
            same(&r.entries.len(), &entries.len())?;
            for (e, w) in r.entries.iter().zip(&entries) {
                same(&(&e.log_id, &e.payload), &(&w.log_id, &w.payload))?;
            }
            Ok(())
        },
    );
    let vote = VoteRequest::new(Vote::new(4, 2), Some(log_id(21)));
    let req = PeerRequest {
        fsid: FSID,
        from: MON_ID,
        rpc: vote.clone(),
    };
    g.add(
        "PeerRequest<VoteRequest>",
        cairn_proto::msg::encode(&req),
        move |b| {
            peer(b)?;
            let got: PeerRequest<VoteRequest<NodeId>> =
                cairn_proto::msg::decode("vote", b).map_err(|e| e.to_string())?;
            same(&got.rpc, &vote)
        },
    );
    let chunk = PeerRequest {
        fsid: FSID,
        from: MON_ID,
        rpc: InstallSnapshotRequest::<MonRaft> {
            vote: Vote::new_committed(3, 1),
            meta: snapshot_meta(),
            offset: 256 << 10,
            data: b"a chunk of a snapshot".to_vec(),
            done: true,
        },
    };
    g.add(
        "PeerRequest<InstallSnapshotRequest>",
        cairn_proto::msg::encode(&chunk),
        move |b| {
            peer(b)?;
            let got: PeerRequest<InstallSnapshotRequest<MonRaft>> =
                cairn_proto::msg::decode("snapshot", b).map_err(|e| e.to_string())?;
            same(&got.rpc, &chunk.rpc)
        },
    );

    fn reply<T>(g: &mut Golden, name: &str, v: T)
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + 'static,
    {
        g.add(name, cairn_proto::msg::encode(&v), move |b| {
            same(
                &cairn_proto::msg::decode::<T>("reply", b).map_err(|e| e.to_string())?,
                &v,
            )
        });
    }
    let appends: Vec<(&str, AppendReply)> = vec![
        ("Success", Ok(AppendEntriesResponse::Success)),
        (
            "PartialSuccess",
            Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(18)))),
        ),
        ("Conflict", Ok(AppendEntriesResponse::Conflict)),
        (
            "HigherVote",
            Ok(AppendEntriesResponse::HigherVote(Vote::new(5, 3))),
        ),
        ("Fatal::Panicked", Err(RaftError::Fatal(Fatal::Panicked))),
        ("Fatal::Stopped", Err(RaftError::Fatal(Fatal::Stopped))),
    ];
    for (name, r) in appends {
        reply(&mut g, &format!("AppendReply::{name}"), r);
    }
    let v: VoteReply = Ok(VoteResponse {
        vote: Vote::new(4, 2),
        vote_granted: true,
        last_log_id: Some(log_id(20)),
    });
    reply(&mut g, "VoteReply::Ok", v);
    let s: SnapshotReply = Ok(InstallSnapshotResponse {
        vote: Vote::new_committed(3, 1),
    });
    reply(&mut g, "SnapshotReply::Ok", s);
    let mismatch: SnapshotReply = Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
        SnapshotMismatch {
            expect: SnapshotSegmentId {
                id: "3-1-14".into(),
                offset: 0,
            },
            got: SnapshotSegmentId {
                id: "3-1-15".into(),
                offset: 7,
            },
        },
    )));
    reply(&mut g, "SnapshotReply::SnapshotMismatch", mismatch);
    g.finish();
}
