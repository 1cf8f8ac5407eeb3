//! A sorted map kept in chunks of at most [`CHUNK`] entries, each shared copy-on-write: a
//! clone shares every chunk, and a change after it copies only the chunk it touches.
//!
//! The index is snapshotted for each checkpoint by cloning it (`docs/format/store.md`,
//! section 9). With whole maps shared, the first write to an object after a snapshot copied
//! the object's whole extent map (~1,000 extents once 4 KiB writes have fragmented a 4 MiB
//! object) and the first log entry of a PG copied its whole log: 35-60 ms of copying per
//! OSD, on the shard threads, in the 200 ms after every snapshot, which put a burst of slow
//! writes at the start of every checkpoint. In chunks, those copies are ~64 entries each and
//! spread over the interval between checkpoints, as writes first reach each chunk.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// Most entries in a chunk: copying one is a few KiB.
pub const CHUNK: usize = 64;

/// A chunk this small is merged with the next one when both fit in one.
const MERGE_BELOW: usize = CHUNK / 4;

/// A sorted map whose clones share chunks of entries (see the module's comment).
#[derive(Clone)]
pub struct CowMap<K, V> {
    /// Chunks in key order, each with its first key; none is empty. A vector: a map of one
    /// chunk (most objects' attributes, a sequentially written object's extents) costs one
    /// small allocation beside the chunk's.
    chunks: Vec<(K, Arc<BTreeMap<K, V>>)>,
    len: usize,
}

impl<K, V> Default for CowMap<K, V> {
    fn default() -> Self {
        CowMap {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for CowMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.chunks.iter().flat_map(|(_, c)| c.iter()))
            .finish()
    }
}

type Chunk<K, V> = (K, Arc<BTreeMap<K, V>>);
type Iter<'a, K, V> = std::iter::FlatMap<
    std::slice::Iter<'a, Chunk<K, V>>,
    std::collections::btree_map::Iter<'a, K, V>,
    fn(&'a Chunk<K, V>) -> std::collections::btree_map::Iter<'a, K, V>,
>;

fn chunk_iter<K, V>(c: &Chunk<K, V>) -> std::collections::btree_map::Iter<'_, K, V> {
    c.1.iter()
}

impl<K: Ord + Clone, V: Clone> CowMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries in key order.
    pub fn iter(&self) -> Iter<'_, K, V> {
        let f: fn(&'_ Chunk<K, V>) -> std::collections::btree_map::Iter<'_, K, V> = chunk_iter;
        self.chunks.iter().flat_map(f)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// The chunk that holds `q` if any does: the last one starting at or before it.
    fn chunk_of<Q>(&self, q: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunks
            .partition_point(|(k, _)| k.borrow() <= q)
            .checked_sub(1)
    }

    pub fn get<Q>(&self, q: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunks[self.chunk_of(q)?].1.get(q)
    }

    /// Inserts `k` -> `v`; returns the value it replaced.
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        let Some(i) = self.chunk_of(&k) else {
            return self.insert_first(k, v);
        };
        let chunk = Arc::make_mut(&mut self.chunks[i].1);
        let appended = chunk.last_key_value().is_some_and(|(last, _)| *last < k);
        let old = chunk.insert(k, v);
        if old.is_none() {
            self.len += 1;
        }
        if chunk.len() > CHUNK {
            // Appending (a log's new entries) leaves the chunk full and starts a new one;
            // elsewhere it is halved.
            let keep = if appended { CHUNK } else { chunk.len() / 2 };
            if let Some(split) = chunk.keys().nth(keep).cloned() {
                let upper = chunk.split_off(&split);
                self.chunks.insert(i + 1, (split, Arc::new(upper)));
            }
        }
        old
    }

    /// Inserts a key smaller than every chunk's first: into the first chunk, which is keyed
    /// anew (or into a new chunk when that one is full or there is none).
    fn insert_first(&mut self, k: K, v: V) -> Option<V> {
        self.len += 1;
        match self.chunks.first_mut() {
            Some((first, chunk)) if chunk.len() < CHUNK => {
                Arc::make_mut(chunk).insert(k.clone(), v);
                *first = k;
            }
            _ => {
                if self.chunks.capacity() == 0 {
                    self.chunks.reserve_exact(1);
                }
                let chunk = Arc::new(BTreeMap::from([(k.clone(), v)]));
                self.chunks.insert(0, (k, chunk));
            }
        }
        None
    }

    /// Removes `q`; returns its value. A chunk is copied only if it holds `q`.
    pub fn remove<Q>(&mut self, q: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let i = self.chunk_of(q)?;
        let (first, chunk) = &mut self.chunks[i];
        if !chunk.contains_key(q) {
            return None;
        }
        let chunk = Arc::make_mut(chunk);
        let old = chunk.remove(q)?;
        self.len -= 1;
        match chunk.first_key_value() {
            None => {
                self.chunks.remove(i);
                return Some(old);
            }
            Some((k, _)) => *first = k.clone(),
        }
        if chunk.len() < MERGE_BELOW {
            self.merge_next(i);
        }
        Some(old)
    }

    /// Moves chunk `i + 1` into chunk `i` when both fit in one.
    fn merge_next(&mut self, i: usize) {
        let fits = match (self.chunks.get(i), self.chunks.get(i + 1)) {
            (Some(a), Some(b)) => a.1.len() + b.1.len() <= CHUNK,
            _ => false,
        };
        if !fits {
            return;
        }
        let (_, next) = self.chunks.remove(i + 1);
        let chunk = Arc::make_mut(&mut self.chunks[i].1);
        chunk.extend(next.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    /// The chunks that may hold keys in `r`, as a range of `chunks`.
    fn chunk_span<Q, R>(&self, r: &R) -> std::ops::Range<usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
        R: RangeBounds<Q>,
    {
        let from = match r.start_bound() {
            Bound::Included(q) | Bound::Excluded(q) => self.chunk_of(q).unwrap_or(0),
            Bound::Unbounded => 0,
        };
        let to = match r.end_bound() {
            Bound::Included(q) | Bound::Excluded(q) => self.chunk_of(q).map_or(0, |i| i + 1),
            Bound::Unbounded => self.chunks.len(),
        };
        from..to.max(from)
    }

    /// Entries with keys in `r`, in order (and reversed with `.rev()`).
    pub fn range<Q, R>(&self, r: R) -> impl DoubleEndedIterator<Item = (&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
        R: RangeBounds<Q> + Clone,
    {
        let span = self.chunk_span(&r);
        self.chunks[span]
            .iter()
            .flat_map(move |(_, c)| c.range::<Q, R>(r.clone()))
    }

    /// [`CowMap::range`] for changing the values; copies each chunk it reaches if shared.
    pub fn range_mut<Q, R>(&mut self, r: R) -> impl DoubleEndedIterator<Item = (&K, &mut V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
        R: RangeBounds<Q> + Clone,
    {
        let span = self.chunk_span(&r);
        self.chunks[span]
            .iter_mut()
            .flat_map(move |(_, c)| Arc::make_mut(c).range_mut::<Q, R>(r.clone()))
    }
}

impl<'a, K: Ord + Clone, V: Clone> IntoIterator for &'a CowMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Snapshot,
        Range(u16, u16),
        RangeMutAdd(u16, u16),
        LastAtOrBefore(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u16..600, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            4 => (0u16..600).prop_map(Op::Remove),
            1 => Just(Op::Snapshot),
            1 => (0u16..600, 0u16..600).prop_map(|(a, b)| Op::Range(a, b)),
            1 => (0u16..600, 0u16..600).prop_map(|(a, b)| Op::RangeMutAdd(a, b)),
            1 => (0u16..600).prop_map(Op::LastAtOrBefore),
        ]
    }

    /// The chunks are sorted, non-empty, keyed by their first key, at most CHUNK long, and
    /// counted.
    fn check_shape(m: &CowMap<u16, u32>) {
        let mut prev: Option<u16> = None;
        let mut n = 0;
        for (k, c) in &m.chunks {
            assert!(!c.is_empty() && c.len() <= CHUNK, "chunk of {}", c.len());
            assert_eq!(c.keys().next(), Some(k));
            if let Some(p) = prev {
                assert!(p < *k);
            }
            prev = c.keys().next_back().copied();
            n += c.len();
        }
        assert_eq!(n, m.len());
    }

    proptest! {
        /// Every operation answers as a `BTreeMap` does, and a snapshot taken at any point
        /// keeps its contents whatever is done to the map afterwards.
        #[test]
        fn behaves_as_a_btreemap_and_snapshots_stay_unchanged(ops in prop::collection::vec(op(), 1..400)) {
            let mut m: CowMap<u16, u32> = CowMap::new();
            let mut model: BTreeMap<u16, u32> = BTreeMap::new();
            let mut snaps: Vec<(CowMap<u16, u32>, BTreeMap<u16, u32>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(m.insert(k, v), model.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(m.remove(&k), model.remove(&k)),
                    Op::Snapshot => snaps.push((m.clone(), model.clone())),
                    Op::Range(a, b) => {
                        let (a, b) = (a.min(b), a.max(b));
                        let got: Vec<_> = m.range(a..b).collect();
                        let want: Vec<_> = model.range(a..b).collect();
                        prop_assert_eq!(got, want);
                        let got: Vec<_> = m.range(a..=b).rev().collect();
                        let want: Vec<_> = model.range(a..=b).rev().collect();
                        prop_assert_eq!(got, want);
                    }
                    Op::RangeMutAdd(a, b) => {
                        let (a, b) = (a.min(b), a.max(b));
                        for (_, v) in m.range_mut(a..b) {
                            *v = v.wrapping_add(1);
                        }
                        for (_, v) in model.range_mut(a..b) {
                            *v = v.wrapping_add(1);
                        }
                    }
                    Op::LastAtOrBefore(k) => {
                        let got = m.range_mut(..=k).next_back().map(|(k, v)| (*k, *v));
                        let want = model.range(..=k).next_back().map(|(k, v)| (*k, *v));
                        prop_assert_eq!(got, want);
                        let got = m.range(..k).next_back();
                        prop_assert_eq!(got, model.range(..k).next_back());
                    }
                }
                check_shape(&m);
                prop_assert_eq!(m.len(), model.len());
                prop_assert_eq!(m.get(&7), model.get(&7));
            }
            prop_assert!(m.iter().eq(model.iter()));
            for (snap, want) in &snaps {
                check_shape(snap);
                prop_assert!(snap.iter().eq(want.iter()));
            }
        }
    }

    /// After a snapshot, a change copies one chunk, not the map.
    #[test]
    fn a_change_after_a_clone_copies_one_chunk() {
        let mut m: CowMap<u32, u32> = CowMap::new();
        for k in 0..10_000 {
            m.insert(k, k);
        }
        let snap = m.clone();
        m.insert(5_000, 0);
        let shared = m
            .chunks
            .iter()
            .zip(&snap.chunks)
            .filter(|(a, b)| Arc::ptr_eq(&a.1, &b.1))
            .count();
        assert_eq!(shared, m.chunks.len() - 1);
        assert_eq!(snap.get(&5_000), Some(&5_000));
        // Appending fills chunks: a log's entries take 10,000 / CHUNK chunks, not twice that.
        assert_eq!(m.chunks.len(), 10_000usize.div_ceil(CHUNK));
    }
}
