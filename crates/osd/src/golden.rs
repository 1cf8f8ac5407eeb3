//! Golden files of what the OSD keeps in its store beside a PG's objects: PG log entries and
//! the PG's info (`testdata/`, listed in `docs/format/pglog.md`, "Golden files"). Regenerate
//! with `CAIRN_BLESS_GOLDEN=1 cargo test -p cairn-osd golden` (only with a format bump).

#[path = "../../../testsupport/golden.rs"]
mod support;

use crate::peering::copy;
use crate::pglog::{self, LogEntry, LogOp};
use crate::pgstate::{coll_of, LES_KEY, VERSION_KEY};
use cairn_map::PgId;
use cairn_proto::msg::peering::PgInfo;
use cairn_store::Transaction;
use support::{same, Golden};

/// An entry of every op, each field distinct.
fn entries() -> Vec<(&'static str, LogEntry)> {
    let e = |version, epoch, object: &str, op| LogEntry {
        version,
        epoch,
        object: object.as_bytes().to_vec(),
        op,
    };
    vec![
        ("Modify", e(0x0102_0304, 17, "obj-modified", LogOp::Modify)),
        ("Remove", e(0x0102_0305, 18, "obj-removed", LogOp::Remove)),
        (
            "Range",
            e(
                0x0102_0306,
                19,
                "obj-written",
                LogOp::Range {
                    offset: 3 << 20,
                    len: 8192,
                },
            ),
        ),
        (
            "Resize",
            e(
                0x0102_0307,
                20,
                "obj-resized",
                LogOp::Resize { size: 1_234_567 },
            ),
        ),
    ]
}

/// Adds entry `op` (its stored value) and `op key` (the key it is stored under).
fn add_entry(g: &mut Golden, op: &str, e: LogEntry, value: Vec<u8>) {
    let key = pglog::key(e.version);
    g.add(format!("{op} key"), key.clone(), {
        let key = key.clone();
        move |b| same(&b.to_vec(), &key)
    });
    g.add(op, value, move |b| {
        same(&pglog::decode(&key, b).map_err(|e| e.to_string())?, &e)
    });
}

/// Log entries of format 2, and the key each is stored under.
#[test]
fn pglog_entry_v2() {
    let mut g = Golden::new("pglog-entry-v2.bin");
    for (op, e) in entries() {
        let value = pglog::encode(&e);
        add_entry(&mut g, op, e, value);
    }
    g.finish();
}

/// Log entries of format 1 (`Modify` and `Remove` only), which format 2 still reads.
#[test]
fn pglog_entry_v1() {
    let mut g = Golden::new("pglog-entry-v1.bin");
    for (op, e) in entries().into_iter().take(2) {
        let mut value = pglog::encode(&e);
        value[0] = 1;
        add_entry(&mut g, op, e, value);
    }
    g.finish();
}

/// The log entries a peer sends (the data part of `PG_INFO` and of a `PushKind::Log` push).
#[test]
fn pglog_peer_entries_v12() {
    let want: Vec<LogEntry> = entries().into_iter().map(|(_, e)| e).collect();
    let bytes = cairn_proto::msg::encode(&want);
    Golden::raw("pglog-peer-entries-v12.bin", bytes, move |b| {
        same(
            &pglog::decode_peer_entries(b).map_err(|e| e.to_string())?,
            &want,
        )
    })
    .finish();
}

const PG: PgId = PgId { pool: 3, pg: 0x2a };
const MISSING: [&str; 2] = ["missing.obj-late", "missing.obj-lost"];

/// The PG's info as stored: its last version, the epoch it last went active here, and the
/// objects marked missing (entries named by their keys). Loaded into a store beside two log
/// entries, it reads back as the member's `PgInfo`.
#[test]
fn pg_info_v2() {
    let mut g = Golden::new("pg-info-v2.bin");
    let key = |k: &[u8]| String::from_utf8(k.to_vec()).unwrap();
    let version = 0x0102_0305u64.to_le_bytes().to_vec();
    let les = 0x0000_0abc_u64.to_le_bytes().to_vec();
    g.add(key(VERSION_KEY), version.clone(), move |b| {
        same(&b.to_vec(), &version)
    });
    g.add(key(LES_KEY), les.clone(), move |b| same(&b.to_vec(), &les));
    for m in MISSING {
        assert_eq!(copy::missing_key(&m.as_bytes()[8..]), m.as_bytes());
        g.add(m, Vec::new(), |b| same(&b.len(), &0));
    }
    g.finish();

    let golden = support::parse(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/pg-info-v2.bin"
        ))
        .unwrap(),
    )
    .unwrap();
    let store = crate::test_store::mem_store();
    let coll = coll_of(PG);
    let mut t = Transaction::new();
    t.create_collection(coll);
    for (k, v) in &golden {
        t.kv_set(coll, k.as_bytes(), v);
    }
    let log: Vec<LogEntry> = entries().into_iter().take(2).map(|(_, e)| e).collect();
    for e in &log {
        pglog::append(&mut t, coll, e);
    }
    store.commit(&t).unwrap();
    let (info, read) = copy::info(&store, PG, 0).unwrap();
    let want = PgInfo {
        last_version: 0x0102_0305,
        last_epoch: 18,
        tail: Some(0x0102_0304),
        missing: vec![b"obj-late".to_vec(), b"obj-lost".to_vec()],
        last_epoch_started: 0xabc,
    };
    assert_eq!(info, want);
    assert_eq!(read, log);
}
