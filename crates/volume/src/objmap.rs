//! Which data objects of an open volume exist, so reads of never-written ranges return zeros
//! without asking an OSD and block status can report holes.
//!
//! Loaded at open from the persisted allocation map (`allocmap.rs`; the writer of a volume
//! that is not a clone) or by listing the pool (other views, or a volume without a map), then
//! kept current by this process's own writes and removes; for the writer it also tracks what
//! the persisted map surely marks. It is exact only while this process is the volume's one writer (one
//! `cairn nbd serve` per volume; any number of connections to it).

use cairn_failstop::LockOrDie;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// The set of existing data objects, with the removes in flight.
#[derive(Debug, Default)]
pub struct ObjectMap {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    exists: BTreeSet<u64>,
    /// What the persisted allocation map marks (`allocmap.rs`), as far as this process knows
    /// it for sure: a superset of `exists` for every object being written.
    persisted: BTreeSet<u64>,
    /// Remove in flight per object, by token; a write to the object cancels it so a remove
    /// that completes after a newer write never marks the object absent.
    removing: HashMap<u64, u64>,
    next_token: u64,
}

/// A remove's claim on an object, given back to [`ObjectMap::removed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoveToken {
    objno: u64,
    token: u64,
}

impl ObjectMap {
    /// A map holding exactly these objects.
    pub fn new(existing: impl IntoIterator<Item = u64>) -> ObjectMap {
        ObjectMap {
            inner: Mutex::new(Inner {
                exists: existing.into_iter().collect(),
                ..Inner::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_or_die()
    }

    /// Whether the object may exist (reads must ask the OSD).
    pub fn may_exist(&self, objno: u64) -> bool {
        self.lock().exists.contains(&objno)
    }

    /// A map holding these objects, all of them marked in the persisted allocation map.
    pub fn persisted(existing: BTreeSet<u64>) -> ObjectMap {
        ObjectMap {
            inner: Mutex::new(Inner {
                persisted: existing.clone(),
                exists: existing,
                ..Inner::default()
            }),
        }
    }

    /// Called before a write to the object is sent. Returns whether the persisted allocation
    /// map may lack it (then it must be marked there before the write is sent).
    pub fn writing(&self, objno: u64) -> bool {
        let mut m = self.lock();
        m.exists.insert(objno);
        m.removing.remove(&objno);
        !m.persisted.contains(&objno)
    }

    /// Whether the persisted allocation map surely marks the object.
    pub fn is_persisted(&self, objno: u64) -> bool {
        self.lock().persisted.contains(&objno)
    }

    /// The objects of allocation-map shard `shard` to write now. Until that write is done,
    /// only what both the old and the new shard mark counts as persisted: an object cleared
    /// by this write is marked again (by the next write) before its data is written.
    pub fn shard_to_persist(&self, shard: u64) -> BTreeSet<u64> {
        let (first, end) = shard_range(shard);
        let mut m = self.lock();
        let members: BTreeSet<u64> = m.exists.range(first..end).copied().collect();
        let dropped: Vec<u64> = m
            .persisted
            .range(first..end)
            .filter(|o| !members.contains(o))
            .copied()
            .collect();
        for o in dropped {
            m.persisted.remove(&o);
        }
        members
    }

    /// Records that shard `shard` now holds exactly `members`.
    pub fn shard_persisted(&self, shard: u64, members: &BTreeSet<u64>) {
        let (first, end) = shard_range(shard);
        let mut m = self.lock();
        let old: Vec<u64> = m.persisted.range(first..end).copied().collect();
        for o in old {
            m.persisted.remove(&o);
        }
        m.persisted.extend(members.iter().copied());
    }

    /// Shards that mark objects that are gone (to clear at close).
    pub fn stale_shards(&self) -> Vec<u64> {
        let m = self.lock();
        let mut shards: Vec<u64> = m
            .persisted
            .difference(&m.exists)
            .map(|&o| crate::allocmap::shard_of(o))
            .collect();
        shards.dedup();
        shards
    }

    /// Called before a remove of the object is sent.
    pub fn removing(&self, objno: u64) -> RemoveToken {
        let mut m = self.lock();
        m.next_token += 1;
        let token = m.next_token;
        m.removing.insert(objno, token);
        RemoveToken { objno, token }
    }

    /// Called once the remove is acknowledged: the object is absent unless written since.
    pub fn removed(&self, t: RemoveToken) {
        let mut m = self.lock();
        if m.removing.get(&t.objno) == Some(&t.token) {
            m.removing.remove(&t.objno);
            m.exists.remove(&t.objno);
        }
    }

    /// Called when a remove failed: the object's state is unknown, keep it as existing.
    pub fn remove_failed(&self, t: RemoveToken) {
        let mut m = self.lock();
        if m.removing.get(&t.objno) == Some(&t.token) {
            m.removing.remove(&t.objno);
        }
    }

    /// How many objects exist.
    pub fn len(&self) -> usize {
        self.lock().exists.len()
    }

    /// The existing objects among `first..end`, in order.
    pub fn existing_in(&self, first: u64, end: u64) -> Vec<u64> {
        self.lock().exists.range(first..end).copied().collect()
    }
}

fn shard_range(shard: u64) -> (u64, u64) {
    let first = shard * crate::allocmap::SHARD_OBJECTS;
    (first, first + crate::allocmap::SHARD_OBJECTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_write_counts_only_what_both_versions_mark() {
        let m = ObjectMap::persisted([1, 2].into_iter().collect());
        assert!(!m.writing(1), "marked already");
        let t = m.removing(2);
        m.removed(t);
        assert_eq!(m.stale_shards(), vec![0]);
        // A rewrite of shard 0 starts: 2 is no longer counted as marked...
        let members = m.shard_to_persist(0);
        assert_eq!(members, [1].into_iter().collect());
        // ...so a write of 2 meanwhile must mark it again.
        assert!(m.writing(2));
        m.shard_persisted(0, &members);
        assert!(!m.is_persisted(2) && m.is_persisted(1));
        let again = m.shard_to_persist(0);
        m.shard_persisted(0, &again);
        assert!(m.is_persisted(2));
        assert!(m.stale_shards().is_empty());
    }

    #[test]
    fn write_then_remove() {
        let m = ObjectMap::new([3]);
        assert!(m.may_exist(3) && !m.may_exist(4));
        m.writing(4);
        assert!(m.may_exist(4));
        let t = m.removing(4);
        m.removed(t);
        assert!(!m.may_exist(4));
        assert_eq!(m.existing_in(0, 10), vec![3]);
    }

    #[test]
    fn a_write_during_a_remove_keeps_the_object() {
        let m = ObjectMap::new([]);
        m.writing(1);
        let t = m.removing(1);
        m.writing(1); // sent after the remove; may be applied after it
        m.removed(t);
        assert!(m.may_exist(1));
    }

    #[test]
    fn overlapping_removes_and_failures() {
        let m = ObjectMap::new([1, 2]);
        let a = m.removing(1);
        let b = m.removing(1);
        m.removed(a); // superseded by b
        assert!(m.may_exist(1));
        m.removed(b);
        assert!(!m.may_exist(1));
        let c = m.removing(2);
        m.remove_failed(c);
        assert!(m.may_exist(2));
        assert_eq!(m.len(), 1);
    }
}
