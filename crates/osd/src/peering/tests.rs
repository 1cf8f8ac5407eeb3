use super::dirty::Dirty;
use super::primary::{plan, Plan};
use crate::pglog::{LogEntry, LogOp};
use cairn_proto::msg::peering::PgInfo;

fn e(version: u64, epoch: u64, object: &str) -> LogEntry {
    LogEntry {
        version,
        epoch,
        object: object.as_bytes().to_vec(),
        op: LogOp::Modify,
    }
}

fn info(entries: &[LogEntry]) -> PgInfo {
    PgInfo {
        last_version: entries.last().map_or(0, |e| e.version),
        last_epoch: entries.last().map_or(0, |e| e.epoch),
        tail: entries.first().map(|e| e.version),
        missing: Vec::new(),
        last_epoch_started: 0,
    }
}

/// Objects changed by write-full entries: copied whole.
fn objects(names: &[&str]) -> std::collections::BTreeMap<Vec<u8>, Dirty> {
    names
        .iter()
        .map(|n| (n.as_bytes().to_vec(), Dirty::Whole))
        .collect()
}

#[test]
fn a_member_behind_gets_only_the_objects_changed_since() {
    let auth = vec![e(1, 3, "a"), e(2, 3, "b"), e(3, 4, "c"), e(4, 4, "a")];
    let behind = auth[..2].to_vec();
    assert_eq!(
        plan((&info(&auth), &auth), (&info(&behind), &behind)),
        Plan::Delta {
            common: 2,
            objects: objects(&["a", "c"])
        }
    );
    assert_eq!(
        plan((&info(&auth), &auth), (&info(&auth), &auth)),
        Plan::UpToDate
    );
}

#[test]
fn divergent_entries_are_rolled_back_by_copying_their_objects() {
    // The member wrote version 3 at epoch 4 (never acknowledged); the authority's version 3
    // came from a later primary at epoch 5.
    let auth = vec![e(1, 3, "a"), e(2, 3, "b"), e(3, 5, "c")];
    let member = vec![e(1, 3, "a"), e(2, 3, "b"), e(3, 4, "x")];
    assert_eq!(
        plan((&info(&auth), &auth), (&info(&member), &member)),
        Plan::Delta {
            common: 2,
            objects: objects(&["c", "x"])
        }
    );
}

#[test]
fn an_empty_member_gets_everything_by_log_or_backfill() {
    let auth = vec![e(1, 3, "a"), e(2, 3, "b")];
    let empty = PgInfo {
        last_version: 0,
        last_epoch: 0,
        tail: None,
        missing: Vec::new(),
        last_epoch_started: 0,
    };
    assert_eq!(
        plan((&info(&auth), &auth), (&empty, &[])),
        Plan::Delta {
            common: 0,
            objects: objects(&["a", "b"])
        }
    );
    // The authority's log was trimmed: version 1 is gone, so only a full copy is complete.
    let trimmed = auth[1..].to_vec();
    assert_eq!(
        plan((&info(&trimmed), &trimmed), (&empty, &[])),
        Plan::Backfill
    );
}

#[test]
fn a_member_whose_log_does_not_meet_the_authority_is_backfilled() {
    let auth: Vec<LogEntry> = (100..110).map(|v| e(v, 9, "n")).collect();
    let old = vec![e(5, 2, "m"), e(6, 2, "m")];
    assert_eq!(
        plan((&info(&auth), &auth), (&info(&old), &old)),
        Plan::Backfill
    );
}

#[test]
fn ranged_writes_recover_only_their_bytes_and_rollbacks_count_too() {
    let w = |version: u64, object: &str, offset: u64, len: u64| LogEntry {
        version,
        epoch: 3,
        object: object.as_bytes().to_vec(),
        op: LogOp::Range { offset, len },
    };
    let auth = vec![
        w(1, "a", 0, 4096),
        w(2, "a", 8192, 4096),
        w(3, "b", 4096, 100),
        LogEntry {
            version: 4,
            epoch: 3,
            object: b"b".to_vec(),
            op: LogOp::Resize { size: 1000 },
        },
    ];
    let behind = auth[..1].to_vec();
    let Plan::Delta { common, objects } = plan((&info(&auth), &auth), (&info(&behind), &behind))
    else {
        panic!("not a delta")
    };
    assert_eq!(common, 1);
    assert_eq!(objects[&b"a".to_vec()], Dirty::Ranges(vec![(8192, 12288)]));
    assert_eq!(
        objects[&b"b".to_vec()],
        Dirty::Ranges(vec![(1000, u64::MAX)])
    );
    // A member that wrote (never acknowledged) bytes elsewhere gets those bytes back too.
    let mut member = auth[..1].to_vec();
    member.push(LogEntry {
        epoch: 2,
        ..w(2, "a", 65536, 512)
    });
    let Plan::Delta { objects, .. } = plan((&info(&auth), &auth), (&info(&member), &member)) else {
        panic!("not a delta")
    };
    assert_eq!(
        objects[&b"a".to_vec()],
        Dirty::Ranges(vec![(8192, 12288), (65536, 66048)])
    );
}

#[test]
fn missing_marks_add_whole_objects_to_any_plan_but_a_backfill() {
    use super::primary::with_missing;
    let auth = vec![e(1, 3, "a"), e(2, 3, "b")];
    let mut m = info(&auth);
    m.missing = vec![b"x".to_vec()];
    assert_eq!(
        with_missing(Plan::UpToDate, &m),
        Plan::Delta {
            common: 2,
            objects: objects(&["x"])
        }
    );
    let delta = Plan::Delta {
        common: 1,
        objects: objects(&["b"]),
    };
    assert_eq!(
        with_missing(delta, &m),
        Plan::Delta {
            common: 1,
            objects: objects(&["b", "x"])
        }
    );
    assert_eq!(with_missing(Plan::Backfill, &m), Plan::Backfill);
    m.missing.clear();
    assert_eq!(with_missing(Plan::UpToDate, &m), Plan::UpToDate);
}

fn op(object: &str, kind: cairn_proto::msg::osd::OpKind) -> cairn_proto::msg::osd::OpRequest {
    cairn_proto::msg::osd::OpRequest {
        epoch: 1,
        pool: 1,
        pg: 0,
        object: object.as_bytes().to_vec(),
        kind,
        instance: 1,
    }
}

#[test]
fn ops_wait_only_for_the_bytes_the_primary_lacks() {
    use cairn_proto::msg::osd::OpKind;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut missing: std::collections::HashMap<Vec<u8>, bool> =
        [(b"stale".to_vec(), false)].into_iter().collect();
    let waits = |m: &mut _, req| super::waits_for_missing(m, Some(&tx), &req);
    let read = OpKind::Read { offset: 0, len: 1 };
    // Objects it holds are served; a listing waits for the whole PG.
    assert!(!waits(&mut missing, op("current", read.clone())));
    let list = OpKind::List {
        after: None,
        max: 10,
    };
    assert!(waits(&mut missing, op("", list)));
    // A write to an object it lacks goes on; nothing is pulled early for it.
    assert!(!waits(
        &mut missing,
        op("stale", OpKind::Write { offset: 0 })
    ));
    assert!(rx.try_recv().is_err());
    // A read waits and asks for the object next, once; writes then wait too.
    assert!(waits(&mut missing, op("stale", read.clone())));
    assert!(waits(&mut missing, op("stale", read)));
    assert_eq!(rx.try_recv().ok(), Some(b"stale".to_vec()));
    assert!(rx.try_recv().is_err());
    assert!(waits(&mut missing, op("stale", OpKind::WriteFull)));
    // A remove must know whether the object exists.
    let mut other: std::collections::HashMap<Vec<u8>, bool> =
        [(b"gone?".to_vec(), false)].into_iter().collect();
    assert!(waits(&mut other, op("gone?", OpKind::Remove)));
    // Nothing missing: nothing waits.
    assert!(!waits(
        &mut std::collections::HashMap::new(),
        op(
            "",
            OpKind::List {
                after: None,
                max: 1
            }
        )
    ));
}

#[test]
fn writes_wait_out_a_copy_of_their_object_and_reads_do_not() {
    use cairn_proto::msg::osd::OpKind;
    let copying: std::collections::HashSet<Vec<u8>> = [b"hot".to_vec()].into_iter().collect();
    assert!(super::waits_for_copy(
        &copying,
        &op("hot", OpKind::Write { offset: 0 })
    ));
    assert!(super::waits_for_copy(&copying, &op("hot", OpKind::Remove)));
    assert!(!super::waits_for_copy(
        &copying,
        &op("hot", OpKind::Read { offset: 0, len: 1 })
    ));
    assert!(!super::waits_for_copy(
        &copying,
        &op("cold", OpKind::WriteFull)
    ));
}

#[test]
fn the_primary_sources_the_authoritys_missing_objects_only_when_it_has_them_current() {
    use super::primary::can_source_missing;
    let missing = |i: PgInfo, m: &[&str]| PgInfo {
        missing: m.iter().map(|o| o.as_bytes().to_vec()).collect(),
        ..i
    };
    // The authority has one entry more (c, never acknowledged) and lacks a current `a`.
    let auth = vec![e(1, 3, "a"), e(2, 3, "b"), e(3, 4, "c")];
    let me = auth[..2].to_vec();
    let a_missing = missing(info(&auth), &["a"]);
    assert!(can_source_missing((&a_missing, &auth), (&info(&me), &me)));
    // Same history: the primary's `a` is current.
    assert!(can_source_missing(
        (&a_missing, &auth),
        (&info(&auth), &auth)
    ));
    // The missing object changed after the shared history: the primary's copy is old.
    let c_missing = missing(info(&auth), &["c"]);
    assert!(!can_source_missing((&c_missing, &auth), (&info(&me), &me)));
    // The primary lacks it too.
    assert!(!can_source_missing(
        (&a_missing, &auth),
        (&missing(info(&me), &["a"]), &me)
    ));
    // The primary's own divergent entry touched it: its copy is not the authority's.
    let divergent = vec![e(1, 3, "a"), e(2, 3, "b"), e(3, 2, "a")];
    assert!(!can_source_missing(
        (&a_missing, &auth),
        (&info(&divergent), &divergent)
    ));
    // Logs that do not meet: no.
    let far = vec![e(7, 9, "z")];
    let far_auth = vec![e(20, 9, "q")];
    let q = missing(info(&far_auth), &["a"]);
    assert!(!can_source_missing((&q, &far_auth), (&info(&far), &far)));
}

#[test]
fn another_member_sources_the_authoritys_missing_objects_when_the_primary_cannot() {
    use super::primary::source_of_missing;
    let marked = |i: PgInfo, m: &[&str]| PgInfo {
        missing: m.iter().map(|o| o.as_bytes().to_vec()).collect(),
        ..i
    };
    // The authority (index 0) has `c` more and lacks a current `a`; the primary (index 1)
    // lacks `a` too; a third member (index 2) shares the history before `c` with `a` current.
    let auth = vec![e(1, 3, "a"), e(2, 3, "b"), e(3, 4, "c")];
    let shared = auth[..2].to_vec();
    let (ai, pi, oi) = (
        marked(info(&auth), &["a"]),
        marked(info(&shared), &["a"]),
        info(&shared),
    );
    let h = [(&ai, &auth[..]), (&pi, &shared[..]), (&oi, &shared[..])];
    assert_eq!(source_of_missing(&h, 0, 1), Some(2));
    // The primary itself can: it is preferred.
    let h = [(&ai, &auth[..]), (&oi, &shared[..]), (&oi, &shared[..])];
    assert_eq!(source_of_missing(&h, 0, 1), Some(1));
    // Nobody has it current.
    let h = [(&ai, &auth[..]), (&pi, &shared[..]), (&pi, &shared[..])];
    assert_eq!(source_of_missing(&h, 0, 1), None);
    // The primary's log does not meet the authority's (it will be backfilled from the
    // authority, `a` included): no other source helps.
    let far = vec![e(20, 9, "q")];
    let fi = info(&far);
    let h = [(&ai, &auth[..]), (&fi, &far[..]), (&oi, &shared[..])];
    assert_eq!(source_of_missing(&h, 0, 1), None);
    // The authority lacks nothing.
    let full = info(&auth);
    let h = [(&full, &auth[..]), (&pi, &shared[..]), (&oi, &shared[..])];
    assert_eq!(source_of_missing(&h, 0, 1), None);
}

#[test]
fn a_recovery_push_of_an_object_split_off_the_pg_is_refused() {
    use super::member::pushed_object_belongs;
    use cairn_map::{ClusterMap, Durability, MapChange, PgId};
    use cairn_proto::msg::peering::PushKind;
    let mut map = ClusterMap::new([1; 16]);
    map.apply(&MapChange::PoolCreate {
        name: "p".into(),
        size: 1,
        min_size: 1,
        pg_count: 8,
        durability: Durability::Wal,
    })
    .expect("pool");
    let pg = map.object_pg(1, b"obj").expect("pg");
    let other = PgId {
        pool: 1,
        pg: (pg.pg + 1) % 8,
    };
    let remove = |o: &[u8]| PushKind::RecoverRemove {
        object: o.to_vec(),
        since: None,
    };
    assert!(pushed_object_belongs(&map, pg, &remove(b"obj")));
    assert!(!pushed_object_belongs(&map, other, &remove(b"obj")));
    // Pushes that name no object (a log, an activation) are not about placement.
    assert!(pushed_object_belongs(
        &map,
        other,
        &PushKind::Activate { epoch: 1 }
    ));
}
