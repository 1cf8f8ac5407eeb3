//! PG split on this OSD: when a pool's PG count grows, every copy of one of its PGs this OSD
//! holds gives the objects that now hash to another PG (a child) to that PG's collection,
//! here, with their log entries and missing marks and the parent's version and activation
//! epoch. A child's objects are thus on its parent's OSDs, which the past intervals say
//! (`cairn_map::intervals`): the child's primary peers with them and the child then moves
//! like any rebalance.
//!
//! Ordering: the collections to split are noted before a map with a grown count is installed
//! (and, at start, every collection held: the OSD may have been down through a split), and
//! each is split by its own shard when it takes that map (`MapChanged`), after every write it
//! took before. Until a pool has no collection left to split here, peering of its PGs does
//! not start here and peering requests for them are refused (the asking primary retries), so
//! no primary sees a child before its objects are in it. Writes and recovery pushes of an
//! object that no longer hashes to the PG they name are refused (`op::write`,
//! `peering::member`): nothing enters a parent after its split.

pub mod pending;

use crate::failure::{FailClass, Failure};
use crate::pglog;
use crate::pgstate::{coll_of, LES_KEY, VERSION_KEY};
use cairn_map::{ClusterMap, PgId};
use cairn_store::{Store, Transaction};
use std::collections::{BTreeMap, BTreeSet};

/// Objects listed per store call while splitting.
const LIST_BATCH: usize = 1024;
/// Bytes of an object copied per transaction when it moves to its new PG.
const MOVE_PIECE: u64 = 4 << 20;

/// Splits the pending collections of `shard` for `map`; when a pool is done, every shard is
/// told (its PGs may peer now).
pub fn run(shard: &mut crate::shard::Shard, map: &ClusterMap) {
    let osd = shard.osd.clone();
    for pg in osd.splits.of_shard(shard.index, osd.shard_count()) {
        match split(&osd.store, map, pg) {
            Ok(moved) => {
                if moved > 0 {
                    tracing::info!(pg = %pg, objects = moved, "PG split: objects moved to their new PGs");
                }
            }
            Err(e) => {
                // Left pending: the pool's PGs wait, and the split is tried at the next map
                // or restart. A store that fails here fails everything else too.
                tracing::error!(pg = %pg, class = %e.class, error = %e, "PG split failed; retrying at the next map");
                if e.local_store && e.class == FailClass::StoreCorrupt {
                    osd.store_corrupt(&e);
                }
                continue;
            }
        }
        if osd.splits.done(pg) {
            tracing::info!(pool = pg.pool, "PG split done on this OSD");
            osd.queue_all(|| crate::mailbox::ShardMsg::MapChanged);
        }
    }
}

/// What moves from a parent to one child.
#[derive(Default)]
struct Child {
    objects: BTreeSet<Vec<u8>>,
    entries: Vec<pglog::LogEntry>,
    marks: Vec<Vec<u8>>,
}

/// Moves the objects of `pg`'s collection that hash to another PG under `map` into that
/// PG's collection; returns how many moved. Each step is one transaction and the whole is
/// idempotent: after a crash the next start splits what is left.
pub fn split(store: &Store, map: &ClusterMap, pg: PgId) -> Result<usize, Failure> {
    let coll = coll_of(pg);
    let Some(pool) = map.pools.get(&pg.pool) else {
        return Ok(0);
    };
    if !store.collection_exists(coll) {
        return Ok(0);
    }
    let child_of = |o: &[u8]| cairn_placement::object_pg(o, pool.pg_count);
    let mut children: BTreeMap<u32, Child> = BTreeMap::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let names = store.list_objects(coll, after.as_deref(), LIST_BATCH)?;
        let Some(last) = names.last().cloned() else {
            break;
        };
        for n in names {
            let c = child_of(&n);
            if c != pg.pg {
                children.entry(c).or_default().objects.insert(n);
            }
        }
        after = Some(last);
    }
    for o in crate::peering::copy::missing(store, pg)? {
        let c = child_of(&o);
        if c != pg.pg {
            children.entry(c).or_default().marks.push(o);
        }
    }
    for e in pglog::read_after(store, coll, 0, usize::MAX)? {
        let c = child_of(&e.object);
        if c != pg.pg {
            children.entry(c).or_default().entries.push(e);
        }
    }
    let mut moved = 0;
    for (c, child) in children {
        let cc = coll_of(PgId {
            pool: pg.pool,
            pg: c,
        });
        start_child(store, coll, cc, &child)?;
        for o in &child.objects {
            move_object(store, coll, cc, o)?;
            moved += 1;
            // Some of a PG's objects moved to a child, the rest still in the parent.
            fail::fail_point!("osd_split_mid");
        }
    }
    Ok(moved)
}

/// Gives the child collection `cc` (created if absent, with the parent's version and
/// activation epoch) its log entries and missing marks, removed from the parent `pc`.
fn start_child(store: &Store, pc: u64, cc: u64, child: &Child) -> Result<(), Failure> {
    let mut t = Transaction::new();
    if !store.collection_exists(cc) {
        t.create_collection(cc);
        for key in [VERSION_KEY, LES_KEY] {
            if let Some(v) = store.kv_get(pc, key)? {
                t.kv_set(cc, key, &v);
            }
        }
    }
    // Entries are keyed by version: moving one again (a split run again) changes nothing.
    for e in &child.entries {
        pglog::append(&mut t, cc, e);
        t.kv_rm(pc, &pglog::key(e.version));
    }
    for o in &child.marks {
        let key = crate::peering::copy::missing_key(o);
        t.kv_rm(pc, &key);
        t.kv_set(cc, &key, &[]);
    }
    if t.is_empty() {
        return Ok(());
    }
    store.submit(&t)?;
    Ok(())
}

/// Moves object `o` from collection `from` to `to`: its bytes in pieces of [`MOVE_PIECE`]
/// (one transaction each, the first emptying any copy at `to`), its attributes and its
/// removal from `from` in the last. A move cut short leaves the object at `from`, and the
/// next split copies it again whole: nothing writes `to`'s copy meanwhile (the pool's PGs
/// do not peer here until the split is done).
fn move_object(store: &Store, from: u64, to: u64, o: &[u8]) -> Result<(), Failure> {
    // Only marked missing here (no copy): the mark moved with the log.
    let Ok(st) = store.stat(from, o) else {
        return Ok(());
    };
    let mut t = Transaction::new();
    t.touch(to, o);
    t.truncate(to, o, 0);
    let mut offset = 0;
    while offset < st.size {
        let n = (st.size - offset).min(MOVE_PIECE);
        let data = store.read(from, o, offset, n)?;
        t.write(to, o, offset, &data);
        offset += n;
        if offset < st.size {
            store.submit(&t)?;
            t = Transaction::new();
        }
    }
    t.truncate(to, o, st.size);
    for (name, value) in store.attrs(from, o)? {
        t.set_attr(to, o, &name, &value);
    }
    t.remove(from, o);
    store.submit(&t)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pglog::{LogEntry, LogOp};
    use crate::test_store::mem_store as store;
    use cairn_map::{Durability, MapChange};

    fn map(pgs: u32) -> ClusterMap {
        let mut m = ClusterMap::new([1; 16]);
        m.apply(&MapChange::PoolCreate {
            name: "p".into(),
            size: 1,
            min_size: 1,
            pg_count: pgs,
            durability: Durability::Wal,
        })
        .expect("pool");
        m
    }

    fn bytes(name: &str, len: usize) -> Vec<u8> {
        name.bytes().cycle().take(len).collect()
    }

    #[test]
    fn a_split_moves_objects_log_entries_and_marks_to_the_children() {
        let s = store();
        let before = map(2);
        let after = {
            let mut m = before.clone();
            m.apply(&MapChange::PoolSet {
                name: "p".into(),
                setting: cairn_map::PoolSetting::PgCount(8),
            })
            .expect("grow");
            m
        };
        let parent = PgId { pool: 1, pg: 1 };
        let coll = coll_of(parent);
        // Objects of pg 1 under 2 PGs; one larger than a move piece.
        let names: Vec<String> = (0..200)
            .map(|i| format!("o{i}"))
            .filter(|n| before.object_pg(1, n.as_bytes()) == Some(parent))
            .take(40)
            .collect();
        // The big object moves to a child (its copy there interrupted, below).
        let big = names
            .iter()
            .find(|n| after.object_pg(1, n.as_bytes()) != Some(parent))
            .expect("an object that moves")
            .clone();
        let big = &big;
        let mut t = Transaction::new();
        t.create_collection(coll);
        t.kv_set(coll, VERSION_KEY, &41u64.to_le_bytes());
        t.kv_set(coll, LES_KEY, &7u64.to_le_bytes());
        for (i, n) in names.iter().enumerate() {
            let len = if n == big {
                (MOVE_PIECE * 2 + 5) as usize
            } else {
                100 + i
            };
            t.write(coll, n.as_bytes(), 0, &bytes(n, len));
            let e = LogEntry {
                version: i as u64 + 1,
                epoch: 3,
                object: n.as_bytes().to_vec(),
                op: LogOp::Modify,
            };
            pglog::append(&mut t, coll, &e);
        }
        let marked = &names[1];
        t.kv_set(
            coll,
            &crate::peering::copy::missing_key(marked.as_bytes()),
            &[],
        );
        s.submit(&t).expect("fill");

        // An interrupted move: a partial copy of the big object in its child already.
        let big_child = after.object_pg(1, big.as_bytes()).expect("pg");
        let mut t = Transaction::new();
        t.create_collection(coll_of(big_child));
        t.write(coll_of(big_child), big.as_bytes(), 0, b"partial");
        s.submit(&t).expect("partial");

        let moved = split(&s, &after, parent).expect("split");
        assert!(
            moved > 0 && moved < names.len(),
            "{moved} of {}",
            names.len()
        );
        for (i, n) in names.iter().enumerate() {
            let pg = after.object_pg(1, n.as_bytes()).expect("pg");
            let len = if n == big {
                (MOVE_PIECE * 2 + 5) as usize
            } else {
                100 + i
            };
            let got = s
                .read(coll_of(pg), n.as_bytes(), 0, len as u64)
                .expect("read");
            assert!(got == bytes(n, len), "{n} in {pg}");
            if pg != parent {
                assert!(
                    s.stat(coll, n.as_bytes()).is_err(),
                    "{n} left in the parent"
                );
                let log = pglog::read_after(&s, coll_of(pg), 0, usize::MAX).expect("log");
                assert!(log.iter().any(|e| e.object == n.as_bytes()), "{n}'s entry");
                let v = crate::peering::copy::last_version(&s, pg);
                assert!(v == 41 || pg == big_child, "child {pg} version {v}");
            }
        }
        let parent_log = pglog::read_after(&s, coll, 0, usize::MAX).expect("log");
        assert!(parent_log
            .iter()
            .all(|e| after.object_pg(1, &e.object) == Some(parent)));
        let mark_pg = after.object_pg(1, marked.as_bytes()).expect("pg");
        let marks = crate::peering::copy::missing(&s, mark_pg).expect("marks");
        assert_eq!(marks, vec![marked.as_bytes().to_vec()]);
        // Again: nothing left to move.
        assert_eq!(split(&s, &after, parent).expect("again"), 0);
    }
}
