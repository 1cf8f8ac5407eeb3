//! Golden files of the wire format, protocol version 12 (`testdata/`, listed in
//! `docs/format/wire.md`, "Golden files"): the handshake, the frame, the authentication
//! records, every message type of each protocol (one entry per type and per enum variant,
//! named after it), the message type numbers, and the cluster map types messages carry.
//! Regenerate with `CAIRN_BLESS_GOLDEN=1 cargo test -p cairn-proto --test golden` (only with a
//! `PROTOCOL_VERSION` bump: the file names carry it).

#[path = "../../../testsupport/samples.rs"]
mod samples;
#[path = "../../../testsupport/golden.rs"]
mod support;

use cairn_proto::auth::{AuthChallenge, AuthInit, AuthRefusal};
use cairn_proto::msg::{decode, ec, ec_rebuild, encode, mon, osd, peering, scrub, ErrorCode};
use cairn_proto::{Frame, FrameHeader, Hello, Limits, PROTOCOL_VERSION};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;
use support::{same, Golden};

/// The version the file names below carry.
#[test]
fn the_golden_files_are_of_this_protocol_version() {
    assert_eq!(
        PROTOCOL_VERSION, 12,
        "a new protocol version: bless golden files named -v{PROTOCOL_VERSION} (and rename \
         the files in these tests)"
    );
}

/// Adds the postcard encoding of `v` as entry `name`, checked to decode back to `v`.
fn pin<T>(g: &mut Golden, name: &str, v: T)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    g.add(name, encode(&v), move |b| {
        same(&decode::<T>("golden", b).map_err(|e| e.to_string())?, &v)
    });
}

/// Adds each `(variant, value)` as entry `Type::variant`.
fn pin_all<T>(g: &mut Golden, ty: &str, vs: Vec<(&str, T)>)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    for (variant, v) in vs {
        pin(g, &format!("{ty}::{variant}"), v);
    }
}

/// The message type numbers, as one entry of u16s.
fn pin_types(g: &mut Golden, types: &[(&'static str, u16)]) {
    let b: Vec<u8> = types.iter().flat_map(|(_, t)| t.to_le_bytes()).collect();
    let names: Vec<&'static str> = types.iter().map(|(n, _)| *n).collect();
    let want: Vec<u16> = types.iter().map(|(_, t)| *t).collect();
    g.add("message types", b, move |b| {
        let got: Vec<u16> = b
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        same(&(names.clone(), got), &(names.clone(), want.clone()))
    });
}

fn names() -> Vec<Vec<u8>> {
    vec![b"obj-a".to_vec(), b"obj-b".to_vec()]
}

#[test]
fn hello_v12() {
    let auth = encode(&auth_init());
    let mut g = Golden::new("hello-v12.bin");
    for (name, h) in [
        (
            "Hello",
            Hello {
                min_version: 9,
                max_version: 10,
                node_kind: 2,
                auth_method: 0,
                auth: Vec::new(),
            },
        ),
        (
            "Hello with auth",
            Hello {
                min_version: 10,
                max_version: 11,
                node_kind: 1,
                auth_method: cairn_proto::auth::AUTH_TICKET,
                auth,
            },
        ),
    ] {
        g.add(name, h.encode().unwrap(), move |b| {
            let (got, used) = Hello::decode(b).map_err(|e| e.to_string())?;
            same(&used, &b.len())?;
            same(&got, &h)
        });
    }
    g.finish();
}

#[test]
fn frame_v12() {
    let f = Frame {
        msg_type: osd::OP,
        request_id: 0x0102_0304_0506_0708,
        control: b"control part".to_vec(),
        data: b"data part, longer".to_vec(),
    };
    let header = FrameHeader {
        version: 12,
        flags: 0x5a,
        msg_type: 0x1234,
        request_id: 0x1122_3344_5566_7788,
        control_len: 100,
        data_len: 2000,
        body_crc: 0xcafe_f00d,
    };
    let mut g = Golden::new("frame-v12.bin");
    g.add("FrameHeader", header.encode().to_vec(), move |b| {
        let h: &[u8; 32] = b.try_into().map_err(|_| "not 32 bytes")?;
        same(
            &FrameHeader::decode(h, &Limits::default()).map_err(|e| e.to_string())?,
            &header,
        )
    });
    let mut bytes = Vec::new();
    f.encode_into(&mut bytes);
    g.add("Frame", bytes, move |b| {
        let mut d = cairn_proto::Decoder::new(Limits::default());
        d.push(b);
        let got = d.next_frame().map_err(|e| e.to_string())?;
        same(&got, &Some(f.clone()))?;
        same(&d.buffered(), &0)
    });
    g.finish();
}

fn auth_init() -> AuthInit {
    AuthInit {
        entity: "client.golden".into(),
        key_id: *b"key-id-8",
        frames: 2,
        nonce: *b"initiator nonce of 32 bytes long",
        ticket: b"sealed ticket bytes".to_vec(),
    }
}

#[test]
fn auth_v12() {
    let mut g = Golden::new("auth-v12.bin");
    pin(&mut g, "AuthInit", auth_init());
    pin(
        &mut g,
        "AuthChallenge",
        AuthChallenge {
            nonce: *b"acceptor nonce, also of 32 bytes",
            frames: 1,
            proof: *b"acceptor's proof of the key, 32B",
        },
    );
    pin(
        &mut g,
        "AuthRefusal",
        AuthRefusal::new("permission denied: no key for client.nobody"),
    );
    let proof = *b"initiator's proof, 32 bytes long";
    g.add(
        "proof record",
        cairn_proto::auth::encode_proof(&proof).to_vec(),
        move |b| {
            let r: &[u8; 36] = b.try_into().map_err(|_| "not 36 bytes")?;
            same(&cairn_proto::auth::decode_proof(r), &Some(&proof[..]))
        },
    );
    let consts = [
        cairn_proto::auth::AUTH_KEY,
        cairn_proto::auth::AUTH_TICKET,
        cairn_proto::auth::AUTH_REFUSED,
        cairn_proto::AUTH_NONE,
    ];
    g.add("auth methods", consts.to_vec(), move |b| {
        same(&b.to_vec(), &consts.to_vec())
    });
    g.finish();
}

fn error_codes() -> Vec<(&'static str, ErrorCode)> {
    vec![
        ("Malformed", ErrorCode::Malformed),
        ("Unsupported", ErrorCode::Unsupported),
        ("NotFound", ErrorCode::NotFound),
        ("Invalid", ErrorCode::Invalid),
        ("Internal", ErrorCode::Internal),
        ("Denied", ErrorCode::Denied),
        ("StoreFull", ErrorCode::StoreFull),
        ("StoreCorrupt", ErrorCode::StoreCorrupt),
    ]
}

/// The cluster map's types, which monitor messages and the monitors' log carry.
#[test]
fn map_v12() {
    use cairn_map::{Durability, PlacementRule};
    let mut g = Golden::new("map-v12.bin");
    pin(&mut g, "ClusterMap", samples::cluster_map());
    pin(&mut g, "OsdInfo", samples::osd(3));
    pin(&mut g, "Pool", samples::pool(2));
    pin(&mut g, "Incremental", samples::incremental());
    pin(&mut g, "PastInterval", samples::past_interval());
    pin_all(&mut g, "MapChange", samples::map_changes());
    pin_all(&mut g, "ChangeOutcome", samples::change_outcomes());
    pin_all(&mut g, "MapError", samples::map_errors());
    pin_all(&mut g, "PoolSetting", samples::pool_settings());
    pin_all(&mut g, "Domain", samples::domains());
    pin_all(
        &mut g,
        "Durability",
        vec![("Wal", Durability::Wal), ("Memory", Durability::Memory)],
    );
    pin_all(
        &mut g,
        "PlacementRule",
        vec![
            ("FlatV1", PlacementRule::FlatV1),
            (
                "Tree",
                PlacementRule::Tree {
                    domain: cairn_map::Domain::Zone,
                },
            ),
            (
                "Erasure",
                PlacementRule::Erasure {
                    domain: cairn_map::Domain::Host,
                    profile: samples::ec_profile(),
                },
            ),
        ],
    );
    g.finish();
}

#[test]
fn msg_mon_v12() {
    use mon::*;
    let mut g = Golden::new("msg-mon-v12.bin");
    pin_types(
        &mut g,
        &[
            ("GET_MAP", GET_MAP),
            ("SUBSCRIBE", SUBSCRIBE),
            ("MAP", MAP),
            ("COMMAND", COMMAND),
            ("COMMAND_REPLY", COMMAND_REPLY),
            ("HEARTBEAT", HEARTBEAT),
            ("MON_STATUS", MON_STATUS),
            ("MON_STATUS_REPLY", MON_STATUS_REPLY),
            ("ERROR", ERROR),
            ("FAILURE_REPORT", FAILURE_REPORT),
            ("PAST_INTERVALS", PAST_INTERVALS),
            ("PAST_INTERVALS_REPLY", PAST_INTERVALS_REPLY),
            ("GET_TICKET", GET_TICKET),
            ("TICKET", TICKET),
            ("GET_SERVICE_KEYS", GET_SERVICE_KEYS),
            ("SERVICE_KEYS", SERVICE_KEYS),
            ("AUTH_COMMAND", AUTH_COMMAND),
            ("AUTH_REPLY", AUTH_REPLY),
            ("MEMBERS_COMMAND", MEMBERS_COMMAND),
            ("MEMBERS_REPLY", MEMBERS_REPLY),
        ],
    );
    pin(&mut g, "GetMap", GetMap { have: 41 });
    pin(&mut g, "Subscribe", Subscribe { have: 40 });
    pin_all(
        &mut g,
        "MapUpdate",
        vec![
            ("Full", MapUpdate::Full(samples::cluster_map())),
            (
                "Incrementals",
                MapUpdate::Incrementals(vec![
                    samples::incremental(),
                    cairn_map::Incremental {
                        epoch: 44,
                        change: cairn_map::MapChange::OsdIn { id: 3 },
                    },
                ]),
            ),
        ],
    );
    pin_all(
        &mut g,
        "CommandReply",
        vec![
            (
                "Done",
                CommandReply::Done(cairn_map::ChangeOutcome::Changed { epoch: 45, id: 2 }),
            ),
            (
                "Refused",
                CommandReply::Refused(cairn_map::MapError::NoSuchOsd(12)),
            ),
            (
                "NotLeader",
                CommandReply::NotLeader {
                    leader: Some("10.0.0.1:6789".into()),
                },
            ),
            (
                "Unavailable",
                CommandReply::Unavailable(Unavailable::NotCommitted { timeout_ms: 4000 }),
            ),
            ("Alive", CommandReply::Alive { grace_ms: 20_000 }),
        ],
    );
    pin(
        &mut g,
        "Heartbeat",
        Heartbeat {
            osd: 3,
            up_from: 41,
            pgs: vec![PgStarted {
                pool: 2,
                pg: 0x1f,
                epoch: 39,
            }],
        },
    );
    pin(
        &mut g,
        "PgStarted",
        PgStarted {
            pool: 4,
            pg: 5,
            epoch: 6,
        },
    );
    pin(
        &mut g,
        "PastIntervalsQuery",
        PastIntervalsQuery {
            pool: 2,
            pg: 7,
            since: 10,
            until: 42,
        },
    );
    pin_all(
        &mut g,
        "PastIntervalsReply",
        vec![
            (
                "Intervals",
                PastIntervalsReply::Intervals {
                    from: 11,
                    intervals: vec![samples::past_interval()],
                },
            ),
            ("Behind", PastIntervalsReply::Behind { epoch: 33 }),
            (
                "Failed",
                PastIntervalsReply::Failed(cairn_map::MapError::NoSuchOsd(9)),
            ),
        ],
    );
    pin(
        &mut g,
        "FailureReport",
        FailureReport {
            reporter: 3,
            reporter_life: 41,
            target: 4,
            target_life: 44,
        },
    );
    pin(
        &mut g,
        "MonStatus",
        MonStatus {
            id: 2,
            leader: Some(1),
            leader_addr: Some("10.0.0.1:6789".into()),
            term: 7,
            members: vec![(1, "10.0.0.1:6789".into()), (2, "10.0.0.2:6789".into())],
            epoch: 42,
            history_oldest: 12,
            frames: 1,
            authenticated: true,
        },
    );
    pin_all(
        &mut g,
        "TicketReply",
        vec![
            (
                "Granted",
                TicketReply::Granted {
                    ticket: b"sealed ticket".to_vec(),
                    session: b"sealed session".to_vec(),
                    ttl_secs: 3600,
                },
            ),
            ("Refused", TicketReply::Refused("no key".into())),
        ],
    );
    pin_all(
        &mut g,
        "ServiceKeysReply",
        vec![
            (
                "Granted",
                ServiceKeysReply::Granted {
                    sealed: b"sealed service keys".to_vec(),
                },
            ),
            ("Refused", ServiceKeysReply::Refused("not an osd".into())),
        ],
    );
    let (entity, caps) = (samples::entity(), samples::caps());
    pin_all(
        &mut g,
        "AuthRequest",
        vec![
            ("List", AuthRequest::List),
            (
                "Get",
                AuthRequest::Get {
                    entity: entity.clone(),
                },
            ),
            (
                "Add",
                AuthRequest::Add {
                    entity: entity.clone(),
                    caps: caps.clone(),
                },
            ),
            (
                "Import",
                AuthRequest::Import {
                    entity: entity.clone(),
                    sealed: b"sealed secret".to_vec(),
                    caps: caps.clone(),
                },
            ),
            (
                "SetCaps",
                AuthRequest::SetCaps {
                    entity: entity.clone(),
                    caps: caps.clone(),
                },
            ),
            (
                "Rotate",
                AuthRequest::Rotate {
                    entity: entity.clone(),
                    keep_old_secs: 600,
                },
            ),
            (
                "Remove",
                AuthRequest::Remove {
                    entity: entity.clone(),
                },
            ),
            ("NbdUsers", AuthRequest::NbdUsers),
            ("MonKey", AuthRequest::MonKey),
        ],
    );
    let nbd_user = NbdUser {
        entity: "nbd.alice".parse().unwrap(),
        caps: caps.clone(),
        sealed_psk: b"sealed psk".to_vec(),
    };
    let listing = AuthListing {
        entity: entity.clone(),
        caps: caps.clone(),
        previous_until: Some(1_767_229_700),
    };
    pin(&mut g, "NbdUser", nbd_user.clone());
    pin(&mut g, "AuthListing", listing.clone());
    pin_all(
        &mut g,
        "AuthReply",
        vec![
            ("Done", AuthReply::Done),
            ("List", AuthReply::List(vec![listing])),
            (
                "Key",
                AuthReply::Key {
                    entity,
                    caps,
                    sealed: b"sealed key".to_vec(),
                },
            ),
            ("Refused", AuthReply::Refused("denied".into())),
            (
                "NotLeader",
                AuthReply::NotLeader {
                    leader: Some("10.0.0.3:6789".into()),
                },
            ),
            (
                "Unavailable",
                AuthReply::Unavailable(Unavailable::NotSeeded),
            ),
            ("NbdUsers", AuthReply::NbdUsers(vec![nbd_user])),
            (
                "MonKey",
                AuthReply::MonKey {
                    rotated: true,
                    previous_until: Some(1_767_229_800),
                },
            ),
        ],
    );
    pin_all(
        &mut g,
        "MembersRequest",
        vec![
            (
                "Add",
                MembersRequest::Add {
                    id: 4,
                    addr: "10.0.0.4:6789".into(),
                },
            ),
            ("Remove", MembersRequest::Remove { id: 5 }),
        ],
    );
    pin_all(
        &mut g,
        "MembersReply",
        vec![
            (
                "Done",
                MembersReply::Done {
                    members: vec![(1, "10.0.0.1:6789".into())],
                },
            ),
            ("Refused", MembersReply::Refused("last voter".into())),
            (
                "NotLeader",
                MembersReply::NotLeader {
                    leader: Some("10.0.0.2:6789".into()),
                },
            ),
            (
                "Unavailable",
                MembersReply::Unavailable(Unavailable::LearnerBehind {
                    id: 4,
                    addr: "10.0.0.4:6789".into(),
                    timeout_ms: 60_000,
                }),
            ),
        ],
    );
    pin_all(
        &mut g,
        "Unavailable",
        vec![
            (
                "NotCommitted",
                Unavailable::NotCommitted { timeout_ms: 4000 },
            ),
            (
                "Stopping",
                Unavailable::Stopping {
                    detail: "raft stopped".into(),
                },
            ),
            (
                "Membership",
                Unavailable::Membership {
                    detail: "a membership change is in progress".into(),
                },
            ),
            ("NotSeeded", Unavailable::NotSeeded),
            (
                "LearnerBehind",
                Unavailable::LearnerBehind {
                    id: 5,
                    addr: "10.0.0.5:6789".into(),
                    timeout_ms: 60_000,
                },
            ),
            ("MapAppliedAsKeys", Unavailable::MapAppliedAsKeys),
            ("KeysAppliedAsMap", Unavailable::KeysAppliedAsMap),
        ],
    );
    pin(
        &mut g,
        "ErrorReply",
        ErrorReply::new(ErrorCode::Denied, "permission denied"),
    );
    pin_all(&mut g, "ErrorCode", error_codes());
    g.finish();
}

fn op_kinds() -> Vec<(&'static str, osd::OpKind)> {
    use osd::OpKind::*;
    vec![
        ("Write", Write { offset: 8192 }),
        ("WriteFull", WriteFull),
        (
            "Zero",
            Zero {
                offset: 4096,
                len: 512,
            },
        ),
        ("Truncate", Truncate { size: 1000 }),
        (
            "Read",
            Read {
                offset: 12_288,
                len: 700,
            },
        ),
        ("Remove", Remove),
        ("Stat", Stat),
        (
            "List",
            List {
                after: Some(b"obj-a".to_vec()),
                max: 100,
            },
        ),
        ("Create", Create),
        (
            "Watch",
            Watch {
                known_tag: 0x1234_5678_9abc,
                max_wait_ms: 2000,
            },
        ),
        (
            "WriteFullIf",
            WriteFullIf {
                expected_tag: 0x2345_6789,
            },
        ),
        (
            "RemoveIf",
            RemoveIf {
                expected_tag: 0x3456_789a,
            },
        ),
    ]
}

fn fail_codes() -> Vec<(&'static str, osd::FailCode)> {
    use osd::FailCode::*;
    vec![
        ("NoSpace", NoSpace),
        ("Device", Device),
        ("Corrupt", Corrupt),
        ("Other", Other),
    ]
}

fn op_request() -> osd::OpRequest {
    osd::OpRequest {
        epoch: 42,
        pool: 2,
        pg: 0x1f,
        object: b"vdata.0123456789abcdef.0000000000000001".to_vec(),
        kind: osd::OpKind::Write { offset: 8192 },
        instance: 0x7777_0000_5678,
    }
}

#[test]
fn msg_osd_v12() {
    use osd::*;
    let mut g = Golden::new("msg-osd-v12.bin");
    pin_types(
        &mut g,
        &[
            ("OP", OP),
            ("OP_REPLY", OP_REPLY),
            ("REP", REP),
            ("REP_REPLY", REP_REPLY),
            ("OSD_STATS", OSD_STATS),
            ("OSD_STATS_REPLY", OSD_STATS_REPLY),
            ("OP_BATCH", OP_BATCH),
            ("OSD_PING", OSD_PING),
            ("OSD_PONG", OSD_PONG),
            ("ERROR", ERROR),
            ("OSD_SYNC", OSD_SYNC),
            ("OSD_SYNC_REPLY", OSD_SYNC_REPLY),
        ],
    );
    pin(&mut g, "OpRequest", op_request());
    pin_all(&mut g, "OpKind", op_kinds());
    pin_all(
        &mut g,
        "OpReply",
        vec![
            (
                "Ok",
                OpReply::Ok {
                    version: 99,
                    size: 4096,
                },
            ),
            (
                "Listed",
                OpReply::Listed {
                    names: names(),
                    more: true,
                },
            ),
            ("NotPrimary", OpReply::NotPrimary { epoch: 43 }),
            (
                "Degraded",
                OpReply::Degraded {
                    acting: 1,
                    min_size: 2,
                },
            ),
            ("Retry", OpReply::Retry),
            ("NoSuchObject", OpReply::NoSuchObject),
            ("NoSuchPool", OpReply::NoSuchPool),
            ("Invalid", OpReply::Invalid("bad range".into())),
            (
                "Failed",
                OpReply::Failed {
                    code: FailCode::Device,
                    why: "I/O error".into(),
                },
            ),
            (
                "PgDown",
                OpReply::PgDown {
                    waiting_for: vec![4, 6],
                },
            ),
            ("Denied", OpReply::Denied("lacks w".into())),
            ("Exists", OpReply::Exists),
            ("Fenced", OpReply::Fenced),
            ("Conflict", OpReply::Conflict),
        ],
    );
    let batched = BatchedOp {
        request_id: 0x55,
        data_len: 4096,
        req: op_request(),
    };
    pin(&mut g, "BatchedOp", batched.clone());
    pin(
        &mut g,
        "OpBatch",
        OpBatch {
            ops: vec![
                batched,
                BatchedOp {
                    request_id: 0x56,
                    data_len: 0,
                    req: OpRequest {
                        kind: OpKind::Read {
                            offset: 0,
                            len: 4096,
                        },
                        ..op_request()
                    },
                },
            ],
        },
    );
    pin(
        &mut g,
        "RepOp",
        RepOp {
            epoch: 42,
            pool: 2,
            pg: 0x1f,
            version: 1001,
            primary: 3,
            object: b"obj-rep".to_vec(),
            kind: OpKind::Zero {
                offset: 4096,
                len: 8192,
            },
        },
    );
    pin_all(&mut g, "FailCode", fail_codes());
    pin_all(
        &mut g,
        "RepReply",
        vec![
            ("Done", RepReply::Done),
            ("Stale", RepReply::Stale { epoch: 44 }),
            (
                "Failed",
                RepReply::Failed {
                    code: FailCode::NoSpace,
                    why: "store full".into(),
                },
            ),
            ("Gap", RepReply::Gap { have: 998 }),
            ("DoneButFull", RepReply::DoneButFull { metadata_too: true }),
        ],
    );
    let down = DownPg {
        pool: 2,
        pg: 3,
        osds: vec![5, 6],
    };
    let slow = SlowOps {
        waiting_for: 4,
        count: 17,
        longest_ms: 1500,
    };
    let pool_ops = PoolOps {
        pool: 2,
        reads: 1,
        writes: 2,
        bytes_in: 3,
        bytes_out: 4,
        read_latency_us: 5,
        write_latency_us: 6,
    };
    let copies = PayloadCopies {
        received_bytes: 11,
        receive_copied_bytes: 12,
        send_queue_copied_bytes: 13,
        send_queue_held_bytes: 14,
        wal_batch_bytes: 15,
        partial_block_bytes: 16,
        flush_staged_bytes: 17,
        direct_staged_bytes: 18,
    };
    pin(&mut g, "DownPg", down.clone());
    pin(&mut g, "SlowOps", slow.clone());
    pin(&mut g, "PoolOps", pool_ops.clone());
    pin(&mut g, "PayloadCopies", copies);
    let failed = cairn_proto::msg::osd::FailedPg {
        pool: 10,
        pg: 11,
        class: "store_full".into(),
        why: "no space left".into(),
        unfound: 3,
    };
    pin(&mut g, "FailedPg", failed.clone());
    let crash = cairn_proto::msg::osd::CrashSummary {
        id: "20261202T020202Z_osd.3_77".into(),
        time_secs: 1_796_176_922,
        location: "crates/osd/src/x.rs:1:2".into(),
        message: "boom".into(),
    };
    pin(&mut g, "CrashSummary", crash.clone());
    pin(
        &mut g,
        "OsdStats",
        OsdStats {
            osd: 3,
            used_bytes: 101,
            capacity_bytes: 102,
            inflight: 103,
            recovered_objects: 104,
            recovery_bytes: 105,
            recovery_pending_objects: 106,
            recovery_bytes_per_sec: 107,
            recovery_objects_per_sec: 108,
            peering_pgs: 109,
            scrub_unrepaired: 110,
            scrub_repaired: 111,
            scrubbed_pgs: 112,
            pgs_held: 113,
            pgs_misplaced: 114,
            down_pgs: vec![down.clone()],
            failed_pgs: vec![failed.clone()],
            crashes: vec![crash.clone()],
            lost_write_pgs: vec![DownPg {
                pool: 7,
                pg: 8,
                osds: vec![9],
            }],
            memory_target_bytes: 115,
            memory_used_bytes: 116,
            index_bytes: 117,
            cache_bytes: 118,
            cache_capacity_bytes: 119,
            cache_hits: 120,
            cache_misses: 121,
            pgs_reclaiming: 122,
            slow_ops: vec![slow],
            slow_ops_total: 123,
            pools: vec![pool_ops],
            commits: 124,
            commit_latency_us: 125,
            wal_sync_floor_us: 126,
            wal_syncs_handed_off: 127,
            copies,
        },
    );
    g.finish();
}

fn push_kinds() -> Vec<(&'static str, peering::PushKind)> {
    use peering::PushKind::*;
    vec![
        ("Reset", Reset),
        (
            "Recover",
            Recover {
                object: b"obj-recovered".to_vec(),
                offset: 4 << 20,
                size: 9 << 20,
                reset: true,
                last: false,
                since: Some(77),
            },
        ),
        (
            "RecoverRemove",
            RecoverRemove {
                object: b"obj-gone".to_vec(),
                since: Some(78),
            },
        ),
        ("MarkMissing", MarkMissing { objects: names() }),
        ("Log", Log { last_version: 1002 }),
        (
            "Repair",
            Repair {
                object: b"obj-repaired".to_vec(),
                offset: 8192,
                size: 16_384,
                since: 79,
            },
        ),
        (
            "RepairRemove",
            RepairRemove {
                object: b"obj-extra".to_vec(),
                since: 80,
            },
        ),
        ("Activate", Activate { epoch: 46 }),
    ]
}

#[test]
fn msg_peering_v12() {
    use peering::*;
    let mut g = Golden::new("msg-peering-v12.bin");
    pin_types(
        &mut g,
        &[
            ("PG_QUERY", PG_QUERY),
            ("PG_INFO", PG_INFO),
            ("PG_PULL", PG_PULL),
            ("PG_OBJECT", PG_OBJECT),
            ("PG_PUSH", PG_PUSH),
            ("PG_DONE", PG_DONE),
            ("PG_LIST", PG_LIST),
            ("PG_NAMES", PG_NAMES),
            ("PG_CLEAN", PG_CLEAN),
            ("PG_STATUS", PG_STATUS),
            ("PG_STATUS_REPLY", PG_STATUS_REPLY),
            ("PG_MARK_LOST", PG_MARK_LOST),
        ],
    );
    pin(
        &mut g,
        "PgMarkLost",
        PgMarkLost {
            epoch: 42,
            pool: 2,
            pg: 0x1f,
            delete: true,
        },
    );
    pin(
        &mut g,
        "PgQuery",
        PgQuery {
            epoch: 42,
            pool: 2,
            pg: 0x1f,
            since: 900,
        },
    );
    pin(
        &mut g,
        "PgInfo",
        PgInfo {
            last_version: 1000,
            last_epoch: 41,
            tail: Some(7),
            missing: names(),
            last_epoch_started: 39,
        },
    );
    pin(
        &mut g,
        "PgPull",
        PgPull {
            epoch: 42,
            pool: 2,
            pg: 0x1f,
            object: b"obj-pulled".to_vec(),
            offset: 4 << 20,
            len: 1 << 20,
        },
    );
    pin(
        &mut g,
        "PgObject",
        PgObject {
            exists: true,
            size: 5000,
            version: 1001,
        },
    );
    pin_all(&mut g, "PushKind", push_kinds());
    pin(
        &mut g,
        "PgPush",
        PgPush {
            epoch: 42,
            pool: 2,
            pg: 0x1f,
            primary: 3,
            kind: PushKind::Activate { epoch: 43 },
        },
    );
    pin_all(
        &mut g,
        "PgDone",
        vec![
            ("Done", PgDone::Done),
            ("Stale", PgDone::Stale { epoch: 44 }),
            (
                "Failed",
                PgDone::Failed {
                    code: ErrorCode::NotFound,
                    why: "no such PG".into(),
                },
            ),
            ("Busy", PgDone::Busy),
        ],
    );
    pin(
        &mut g,
        "PgList",
        PgList {
            epoch: 42,
            pool: 2,
            pg: 0x1f,
            after: Some(b"obj-a".to_vec()),
        },
    );
    pin(
        &mut g,
        "PgNames",
        PgNames {
            names: names(),
            more: true,
        },
    );
    let interval = IntervalStatus {
        interval: samples::past_interval(),
        answered: vec![3],
        waiting_for: vec![5],
        given_up: true,
    };
    pin(&mut g, "IntervalStatus", interval.clone());
    pin(
        &mut g,
        "PgStatus",
        PgStatus {
            epoch: 42,
            state: "down".into(),
            up_set: vec![3, 4, 5],
            acting: vec![3, 4],
            last_version: 1000,
            last_epoch_started: 39,
            intervals_from: 12,
            intervals: vec![interval],
            answered: vec![4],
            waiting_for: vec![5, 6],
            unfound: vec![b"lost-object".to_vec()],
            failure_class: Some("store_full".into()),
            reason: Some("waiting for osd.5".into()),
            lost_intervals: vec![cairn_map::PastInterval {
                first: 30,
                last: 31,
                acting: vec![7],
                min_size: 1,
                maybe_went_rw: false,
            }],
            degraded_objects: 17,
        },
    );
    g.finish();
}

#[test]
fn msg_scrub_v12() {
    use scrub::*;
    let mut g = Golden::new("msg-scrub-v12.bin");
    pin_types(
        &mut g,
        &[
            ("PG_SCRUB", PG_SCRUB),
            ("PG_SCRUB_MAP", PG_SCRUB_MAP),
            ("SCRUB_PG", SCRUB_PG),
            ("SCRUB_REPORT", SCRUB_REPORT),
        ],
    );
    pin(
        &mut g,
        "PgScrub",
        PgScrub {
            epoch: 42,
            pool: 2,
            pg: 0x1f,
            after: Some(b"obj-a".to_vec()),
            names: names(),
        },
    );
    let entry = ScrubEntry {
        name: b"obj-scrubbed".to_vec(),
        exists: true,
        size: 5000,
        data_crc: 0x1111_2222,
        attrs_crc: 0x3333_4444,
        damage: Some("block 1 damaged".into()),
    };
    pin(&mut g, "ScrubEntry", entry.clone());
    pin(
        &mut g,
        "PgScrubMap",
        PgScrubMap {
            version: 1000,
            objects: vec![entry],
            more: true,
        },
    );
    pin(
        &mut g,
        "ScrubPg",
        ScrubPg {
            pool: 2,
            pg: 0x1f,
            repair: true,
        },
    );
    let finding = ScrubFinding {
        object: b"obj-bad".to_vec(),
        osd: 4,
        detail: "different content".into(),
        repaired: true,
    };
    pin(&mut g, "ScrubFinding", finding.clone());
    pin(
        &mut g,
        "ScrubReport",
        ScrubReport {
            pool: 2,
            pg: 0x1f,
            acting: vec![3, 4, 5],
            objects: 100,
            bytes: 200,
            inconsistent: 3,
            repaired: 2,
            busy: 1,
            findings: vec![finding],
            error: Some("osd.5 unreachable".into()),
        },
    );
    g.finish();
}

#[test]
fn msg_ec_v12() {
    use ec::*;
    let mut g = Golden::new("msg-ec-v12.bin");
    pin_types(
        &mut g,
        &[
            ("EC_WRITE", EC_WRITE),
            ("EC_READ", EC_READ),
            ("EC_READ_REPLY", EC_READ_REPLY),
            ("EC_QUERY", EC_QUERY),
            ("EC_INFO", EC_INFO),
        ],
    );
    pin_all(
        &mut g,
        "EcShardOp",
        vec![
            (
                "Write",
                EcShardOp::Write {
                    offset: 0x1_0000,
                    len: 4096,
                },
            ),
            (
                "Xor",
                EcShardOp::Xor {
                    offset: 0x2000,
                    len: 512,
                },
            ),
            ("Truncate", EcShardOp::Truncate { len: 0x3000 }),
            ("Remove", EcShardOp::Remove),
        ],
    );
    pin(
        &mut g,
        "EcSubWrite",
        EcSubWrite {
            epoch: 42,
            pool: 3,
            pg: 0x1f,
            shard: 4,
            version: 1000,
            primary: 7,
            object: b"obj-a".to_vec(),
            size: 0x12345,
            ops: vec![
                EcShardOp::Write { offset: 0, len: 10 },
                EcShardOp::Xor {
                    offset: 4096,
                    len: 20,
                },
            ],
        },
    );
    pin(
        &mut g,
        "EcRead",
        EcRead {
            epoch: 42,
            pool: 3,
            pg: 0x1f,
            shard: 1,
            object: b"obj-b".to_vec(),
            ranges: vec![(0, 4096), (0x8000, 100)],
        },
    );
    pin_all(
        &mut g,
        "EcReadReply",
        vec![
            (
                "Data",
                EcReadReply::Data {
                    exists: true,
                    size: 0x12345,
                },
            ),
            ("Stale", EcReadReply::Stale { epoch: 43 }),
            (
                "Failed",
                EcReadReply::Failed {
                    code: osd::FailCode::Corrupt,
                    why: "chunk damaged".into(),
                },
            ),
        ],
    );
    pin(
        &mut g,
        "EcQuery",
        EcQuery {
            epoch: 42,
            pool: 3,
            pg: 0x1f,
            shard: 5,
        },
    );
    pin(
        &mut g,
        "EcInfo",
        EcInfo {
            exists: true,
            last_version: 1000,
        },
    );
    g.finish();
}

#[test]
fn msg_ec_rebuild_v12() {
    use ec_rebuild::*;
    let mut g = Golden::new("msg-ec-rebuild-v12.bin");
    pin_types(
        &mut g,
        &[
            ("EC_STAT", EC_STAT),
            ("EC_STAT_REPLY", EC_STAT_REPLY),
            ("EC_PUSH", EC_PUSH),
            ("EC_SET_LOG", EC_SET_LOG),
        ],
    );
    let state = EcObjectState {
        size: 0x12345,
        version: 1000,
    };
    pin(
        &mut g,
        "EcStat",
        EcStat {
            epoch: 42,
            pool: 3,
            pg: 0x1f,
            shard: 2,
            which: EcStatWhich::Named(names()),
        },
    );
    pin_all(
        &mut g,
        "EcStatWhich",
        vec![
            ("Named", EcStatWhich::Named(names())),
            ("After", EcStatWhich::After(b"obj-a".to_vec())),
            ("Verify", EcStatWhich::Verify(names())),
        ],
    );
    pin_all(
        &mut g,
        "EcChecked",
        vec![
            ("Absent", EcChecked::Absent),
            ("Whole", EcChecked::Whole(state)),
            (
                "Damaged",
                EcChecked::Damaged {
                    state,
                    why: "block 3 failed its checksum".into(),
                },
            ),
        ],
    );
    pin_all(
        &mut g,
        "EcStatReply",
        vec![
            ("States", EcStatReply::States(vec![Some(state), None])),
            (
                "Listed",
                EcStatReply::Listed {
                    names: names(),
                    more: true,
                },
            ),
            ("Checked", EcStatReply::Checked(vec![EcChecked::Absent])),
            ("Stale", EcStatReply::Stale { epoch: 43 }),
            (
                "Failed",
                EcStatReply::Failed {
                    code: osd::FailCode::Device,
                    why: "device gone".into(),
                },
            ),
        ],
    );
    pin(
        &mut g,
        "EcPush",
        EcPush {
            epoch: 42,
            pool: 3,
            pg: 0x1f,
            shard: 5,
            primary: 7,
            object: b"obj-a".to_vec(),
            state: Some(state),
            offset: 0x10_0000,
            last: true,
        },
    );
    pin(
        &mut g,
        "EcSetLog",
        EcSetLog {
            epoch: 42,
            pool: 3,
            pg: 0x1f,
            shard: 0,
            primary: 7,
            from: 990,
            version: 1000,
        },
    );
    g.finish();
}
