//! Which data objects of an open volume exist, so reads of never-written ranges return zeros
//! without asking an OSD and block status can report holes.
//!
//! Built by listing the pool when the volume is opened, then kept current by this process's own
//! writes and removes. It is exact only while this process is the volume's one writer (one
//! `cairn nbd serve` per volume; any number of connections to it).

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
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the object may exist (reads must ask the OSD).
    pub fn may_exist(&self, objno: u64) -> bool {
        self.lock().exists.contains(&objno)
    }

    /// Called before a write to the object is sent.
    pub fn writing(&self, objno: u64) {
        let mut m = self.lock();
        m.exists.insert(objno);
        m.removing.remove(&objno);
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

#[cfg(test)]
mod tests {
    use super::*;

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
