//! The in-memory object index: collections -> objects -> extents, attributes and collection
//! entries. It is the whole metadata of the store, so the write path never reads metadata from
//! a device. Collections and objects sit behind `Arc`s and are copied on write, which makes a
//! consistent snapshot for a checkpoint cost one map clone instead of a deep copy; an object's
//! extents and a collection's entries are [`CowMap`]s, so a write after a snapshot copies the
//! chunk of them it changes rather than all of them.

use crate::cowmap::CowMap;
use crate::device::BLOCK_SIZE;
use crate::effect::{Effect, Name, Payload};
use crate::key::Key;
use crate::txn::CollId;
use crate::wal::RecordBuf;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Data not yet written to a data device: a range of a WAL record (or replayed bytes).
#[derive(Debug, Clone)]
pub struct MemRef {
    /// Identifies the write that produced the bytes (the flusher matches on it).
    pub id: u64,
    pub buf: RecordBuf,
    /// Byte offset in `buf` of the extent's first block.
    pub off: usize,
}

/// Where an extent's blocks are.
#[derive(Debug, Clone)]
pub enum Loc {
    /// In memory, waiting for the flusher.
    Mem(MemRef),
    /// At this byte offset of the data device(s).
    Disk(u64),
}

impl Loc {
    /// The location `blocks` blocks further on.
    pub fn advance(&self, blocks: u64) -> Loc {
        let bytes = blocks * BLOCK_SIZE as u64;
        match self {
            Loc::Mem(m) => Loc::Mem(MemRef {
                id: m.id,
                buf: m.buf.clone(),
                off: m.off + bytes as usize,
            }),
            Loc::Disk(d) => Loc::Disk(d + bytes),
        }
    }
}

/// The crc32c of each block of an extent. Randomly written objects fragment into one-block
/// extents, whose crc is held inline; longer lists are shared. Either way, copying an object's
/// extent map (copy-on-write after a checkpoint's snapshot) allocates nothing per extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Crcs {
    One(u32),
    Many(Arc<[u32]>),
}

impl std::ops::Deref for Crcs {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        match self {
            Crcs::One(c) => std::slice::from_ref(c),
            Crcs::Many(v) => v,
        }
    }
}

impl From<&[u32]> for Crcs {
    fn from(v: &[u32]) -> Crcs {
        match v {
            [c] => Crcs::One(*c),
            _ => Crcs::Many(v.into()),
        }
    }
}

impl From<Vec<u32>> for Crcs {
    fn from(v: Vec<u32>) -> Crcs {
        match v[..] {
            [c] => Crcs::One(c),
            _ => Crcs::Many(v.into()),
        }
    }
}

impl FromIterator<u32> for Crcs {
    fn from_iter<I: IntoIterator<Item = u32>>(it: I) -> Crcs {
        it.into_iter().collect::<Vec<u32>>().into()
    }
}

/// A run of whole blocks of an object stored contiguously, with one crc32c per block.
#[derive(Debug, Clone)]
pub struct Extent {
    pub nblocks: u32,
    pub loc: Loc,
    pub crcs: Crcs,
}

impl Extent {
    /// Blocks `skip..skip + n` of this extent.
    pub fn slice(&self, skip: u32, n: u32) -> Extent {
        Extent {
            nblocks: n,
            loc: self.loc.advance(skip as u64),
            crcs: self.crcs[skip as usize..(skip + n) as usize].into(),
        }
    }
}

/// Attributes of an object, or key/value entries of a collection. Short keys are held in the
/// tree's nodes ([`Key`]), long keys and values are shared, so copying the map (copy-on-write
/// after a checkpoint's snapshot; a PG's log is thousands of entries) allocates tree nodes
/// only, not buffers per entry.
pub type KvMap = CowMap<Key, Arc<[u8]>>;

/// An object: its size, data extents keyed by first block, and attributes.
#[derive(Debug, Clone, Default)]
pub struct Object {
    pub size: u64,
    pub extents: CowMap<u64, Extent>,
    pub attrs: KvMap,
}

/// A collection: objects in name order and key/value entries.
#[derive(Debug, Clone, Default)]
pub struct Collection {
    pub objects: BTreeMap<Name, Arc<Object>>,
    pub kv: KvMap,
}

/// The whole index.
#[derive(Debug, Clone, Default)]
pub struct Index {
    pub colls: BTreeMap<CollId, Arc<Collection>>,
}

/// Blocks that an index change released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freed {
    /// Data-device blocks that are now dead.
    Disk { off: u64, nblocks: u32 },
    /// In-memory blocks that will never be flushed.
    Mem { nblocks: u32 },
}

/// New in-memory data the flusher must write.
#[derive(Debug, Clone)]
pub struct Dirty {
    pub coll: CollId,
    pub obj: Name,
    pub first_block: u64,
    pub nblocks: u32,
    pub id: u64,
    /// Whether the blocks enter the read cache once flushed (not for a replica's copy).
    pub cache: bool,
}

/// Blocks an [`Effect::PlaceBlocks`] put into the index, already on the data devices.
#[derive(Debug, Clone)]
pub struct Placed {
    pub coll: CollId,
    pub obj: Name,
    pub first_block: u64,
    pub nblocks: u32,
    pub off: u64,
}

/// Side effects of applying effects, for space accounting and the flusher.
#[derive(Debug, Default)]
pub struct ApplyOut {
    pub freed: Vec<Freed>,
    pub dirty: Vec<Dirty>,
    pub placed: Vec<Placed>,
}

fn free_extent(e: &Extent, out: &mut Vec<Freed>) {
    free_blocks(&e.loc, 0, e.nblocks, out);
}

/// Reports `nblocks` blocks, `skip` blocks into an extent at `loc`, as released.
fn free_blocks(loc: &Loc, skip: u64, nblocks: u32, out: &mut Vec<Freed>) {
    out.push(match loc {
        Loc::Disk(off) => Freed::Disk {
            off: off + skip * BLOCK_SIZE as u64,
            nblocks,
        },
        // A direct write's blocks are accounted where they go; its job frees what nothing
        // points to once written (`direct::finish`).
        Loc::Mem(m) if m.id & crate::direct::DIRECT_ID != 0 => return,
        Loc::Mem(_) => Freed::Mem { nblocks },
    });
}

impl Object {
    /// Ensures no extent crosses block `at`.
    pub fn split_at(&mut self, at: u64) {
        let Some((&start, e)) = self.extents.range(..at).next_back() else {
            return;
        };
        let end = start + e.nblocks as u64;
        if end <= at {
            return;
        }
        let head = (at - start) as u32;
        let (a, b) = (e.slice(0, head), e.slice(head, e.nblocks - head));
        self.extents.insert(start, a);
        self.extents.insert(at, b);
    }

    /// Removes blocks `first..first + n`, reporting what they held.
    pub fn punch(&mut self, first: u64, n: u64, freed: &mut Vec<Freed>) {
        let end = first.saturating_add(n);
        if end <= first || self.punch_inside_one(first, end, freed, &mut None) {
            return;
        }
        self.punch_across(first, end, freed);
    }

    /// Removes blocks `first..end` whatever extents hold them.
    fn punch_across(&mut self, first: u64, end: u64, freed: &mut Vec<Freed>) {
        self.split_at(first);
        self.split_at(end);
        let keys: Vec<u64> = self.extents.range(first..end).map(|(k, _)| *k).collect();
        for k in keys {
            if let Some(e) = self.extents.remove(&k) {
                free_extent(&e, freed);
            }
        }
    }

    /// Removes blocks `first..end` if one extent holds them all, with one tree search: the
    /// common case of random overwrites, which split large extents block by block (the
    /// general path costs three searches and five inserts). Returns whether it did. When the
    /// extent is exactly those blocks (the same blocks written again) and `put` holds their
    /// new extent, that takes its place in the tree (`put` is then taken).
    fn punch_inside_one(
        &mut self,
        first: u64,
        end: u64,
        freed: &mut Vec<Freed>,
        put: &mut Option<Extent>,
    ) -> bool {
        let Some((&start, e)) = self.extents.range_mut(..=first).next_back() else {
            return false;
        };
        let e_end = start + e.nblocks as u64;
        if e_end < end {
            return false;
        }
        if (start, e_end) == (first, end) {
            if let Some(new) = put.take() {
                let old = std::mem::replace(e, new);
                free_extent(&old, freed);
                return true;
            }
        }
        free_blocks(&e.loc, first - start, (end - first) as u32, freed);
        let tail = (end < e_end).then(|| e.slice((end - start) as u32, (e_end - end) as u32));
        if first > start {
            *e = e.slice(0, (first - start) as u32);
        } else {
            self.extents.remove(&start);
        }
        if let Some(tail) = tail {
            self.extents.insert(end, tail);
        }
        true
    }

    /// Puts `ext` at block `first`, in place of whatever those blocks held (reported).
    pub fn replace_blocks(&mut self, first: u64, ext: Extent, freed: &mut Vec<Freed>) {
        let end = first.saturating_add(ext.nblocks as u64);
        let mut put = Some(ext);
        if end > first && !self.punch_inside_one(first, end, freed, &mut put) {
            self.punch_across(first, end, freed);
        }
        if let Some(ext) = put {
            self.extents.insert(first, ext);
        }
    }

    /// [`Object::relocate`] with one tree search when one extent holds all of `first..end`
    /// (the flusher's usual case: it writes what one write left in memory): moved in place
    /// when it is exactly those blocks, left alone (unsplit) when it is not `from`. `None`
    /// when the general path must run.
    fn relocate_within_one(
        &mut self,
        first: u64,
        end: u64,
        from: &LocMatch,
        to: u64,
    ) -> Option<Vec<(u64, u32)>> {
        let (&start, e) = self.extents.range_mut(..=first).next_back()?;
        if start + (e.nblocks as u64) < end {
            return None;
        }
        let rel = first - start;
        let at_first = match &e.loc {
            Loc::Mem(m) => LocMatch::Mem {
                id: m.id,
                off: m.off + rel as usize * BLOCK_SIZE,
            },
            Loc::Disk(d) => LocMatch::Disk(d + rel * BLOCK_SIZE as u64),
        };
        if *from != at_first {
            return Some(Vec::new());
        }
        if (start, start + e.nblocks as u64) != (first, end) {
            return None;
        }
        e.loc = Loc::Disk(to);
        Some(vec![(0, e.nblocks)])
    }

    /// Number of blocks holding data.
    pub fn allocated_blocks(&self) -> u64 {
        self.extents.values().map(|e| e.nblocks as u64).sum()
    }

    /// Extents overlapping blocks `first..end`, as (first block, extent) clipped to the range.
    pub fn extents_in(&self, first: u64, end: u64) -> Vec<(u64, Extent)> {
        let mut out = Vec::new();
        if end <= first {
            return out;
        }
        // Walked backwards from `end`: one tree search (a fragmented object's map is a deep
        // tree that misses the caches; the flusher, the cleaner and reads all come here).
        // Extents do not overlap, so the first one ending at or before `first` ends the walk.
        for (&s, e) in self.extents.range(..end).rev() {
            let e_end = s + e.nblocks as u64;
            if e_end <= first {
                break;
            }
            let a = s.max(first);
            let b = e_end.min(end);
            out.push((a, e.slice((a - s) as u32, (b - a) as u32)));
        }
        out.reverse();
        out
    }

    /// Points blocks `first..end` whose location is `from` (blocks counted from `first`) at
    /// `to` instead. Returns the moved runs as (blocks from `first`, count).
    pub fn relocate(&mut self, first: u64, end: u64, from: &LocMatch, to: u64) -> Vec<(u64, u32)> {
        if let Some(moved) = self.relocate_within_one(first, end, from, to) {
            return moved;
        }
        self.split_at(first);
        self.split_at(end);
        let mut moved = Vec::new();
        for (&s, e) in self.extents.range_mut(first..end) {
            let rel = s - first;
            if from.matches(&e.loc, rel) {
                e.loc = Loc::Disk(to + rel * BLOCK_SIZE as u64);
                moved.push((rel, e.nblocks));
            }
        }
        moved
    }
}

/// Which location a relocation expects to find (so that overwritten data is left alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocMatch {
    /// In memory, from write `id`, the range starting at byte `off` of its buffer.
    Mem { id: u64, off: usize },
    /// On disk starting at `off`.
    Disk(u64),
}

impl LocMatch {
    fn matches(&self, loc: &Loc, rel_blocks: u64) -> bool {
        let rel = rel_blocks as usize * BLOCK_SIZE;
        match (self, loc) {
            (LocMatch::Mem { id, off }, Loc::Mem(m)) => m.id == *id && m.off == off + rel,
            (LocMatch::Disk(d), Loc::Disk(x)) => *x == d + rel as u64,
            _ => false,
        }
    }
}

/// Blocks an extent's bytes, computing the per-block crcs.
pub fn block_crcs(data: &[u8]) -> Crcs {
    data.chunks(BLOCK_SIZE).map(cairn_crc::crc32c).collect()
}

impl Index {
    /// The collection, if it exists.
    pub fn coll(&self, c: CollId) -> Option<&Arc<Collection>> {
        self.colls.get(&c)
    }

    /// The object, if it exists.
    pub fn object(&self, c: CollId, o: &[u8]) -> Option<&Arc<Object>> {
        self.colls.get(&c)?.objects.get(o)
    }

    fn coll_mut(&mut self, c: CollId) -> Option<&mut Collection> {
        self.colls.get_mut(&c).map(Arc::make_mut)
    }

    /// The object for writing, created when missing; `None` if the collection is missing.
    pub fn object_mut(&mut self, c: CollId, o: &Name) -> Option<&mut Object> {
        self.object_entry_mut(c, o).map(|(_, obj)| obj)
    }

    /// Like [`Index::object_mut`], with the index's own copy of the name (to share it rather
    /// than keep the caller's).
    pub fn object_entry_mut(&mut self, c: CollId, o: &Name) -> Option<(Name, &mut Object)> {
        use std::collections::btree_map::Entry;
        let coll = self.coll_mut(c)?;
        let (key, obj) = match coll.objects.entry(o.clone()) {
            Entry::Occupied(e) => (e.key().clone(), e.into_mut()),
            Entry::Vacant(e) => (o.clone(), e.insert(Arc::default())),
        };
        Some((key, Arc::make_mut(obj)))
    }

    /// The object for writing if it exists.
    pub fn existing_object_mut(&mut self, c: CollId, o: &[u8]) -> Option<&mut Object> {
        let coll = self.coll_mut(c)?;
        coll.objects.get_mut(o).map(Arc::make_mut)
    }

    /// Applies one effect. Total: effects on missing collections are ignored (validation
    /// happened before the effect was logged). `rec` holds in-record payloads.
    pub fn apply(&mut self, e: &Effect, rec: &RecordBuf, next_id: &AtomicU64, out: &mut ApplyOut) {
        match e {
            Effect::CreateColl(c) => {
                self.colls.entry(*c).or_default();
            }
            Effect::RemoveColl(c) => {
                if let Some(coll) = self.colls.remove(c) {
                    for o in coll.objects.values() {
                        o.extents
                            .values()
                            .for_each(|x| free_extent(x, &mut out.freed));
                    }
                }
            }
            Effect::Touch { coll, obj } => {
                self.object_mut(*coll, obj);
            }
            Effect::SetBlocks {
                coll,
                obj,
                first_block,
                nblocks,
                data,
            } => {
                let (buf, off) = match data {
                    Payload::InRecord(off) => (rec, *off),
                    Payload::Owned(b) => b.parts(),
                };
                let Some(bytes) = buf.get(off..off + *nblocks as usize * BLOCK_SIZE) else {
                    return;
                };
                // The flusher and the cleaner's summaries share the index's copy of the name
                // (one copy per object, not one per write).
                let Some((name, o)) = self.object_entry_mut(*coll, obj) else {
                    return;
                };
                let id = next_id.fetch_add(1, Ordering::Relaxed) + 1;
                let ext = Extent {
                    nblocks: *nblocks,
                    loc: Loc::Mem(MemRef {
                        id,
                        buf: buf.clone(),
                        off,
                    }),
                    crcs: block_crcs(bytes),
                };
                o.replace_blocks(*first_block, ext, &mut out.freed);
                out.dirty.push(Dirty {
                    coll: *coll,
                    obj: name,
                    first_block: *first_block,
                    nblocks: *nblocks,
                    id,
                    cache: true,
                });
            }
            Effect::PlaceBlocks {
                coll,
                obj,
                first_block,
                nblocks,
                off,
                crcs,
            } => {
                let Some((name, o)) = self.object_entry_mut(*coll, obj) else {
                    return;
                };
                let ext = Extent {
                    nblocks: *nblocks,
                    loc: Loc::Disk(*off),
                    crcs: crcs.clone(),
                };
                o.replace_blocks(*first_block, ext, &mut out.freed);
                out.placed.push(Placed {
                    coll: *coll,
                    obj: name,
                    first_block: *first_block,
                    nblocks: *nblocks,
                    off: *off,
                });
            }
            Effect::PunchBlocks {
                coll,
                obj,
                first_block,
                nblocks,
            } => {
                if let Some(o) = self.existing_object_mut(*coll, obj) {
                    o.punch(*first_block, *nblocks, &mut out.freed);
                }
            }
            Effect::SetSize { coll, obj, size } => {
                if let Some(o) = self.object_mut(*coll, obj) {
                    o.size = *size;
                }
            }
            Effect::Remove { coll, obj } => {
                if let Some(c) = self.coll_mut(*coll) {
                    if let Some(o) = c.objects.remove(&obj[..]) {
                        o.extents
                            .values()
                            .for_each(|x| free_extent(x, &mut out.freed));
                    }
                }
            }
            Effect::SetAttr {
                coll,
                obj,
                name,
                value,
            } => {
                if let Some(o) = self.object_mut(*coll, obj) {
                    o.attrs.insert(name[..].into(), value[..].into());
                }
            }
            Effect::RmAttr { coll, obj, name } => {
                if let Some(o) = self.existing_object_mut(*coll, obj) {
                    o.attrs.remove(&name[..]);
                }
            }
            Effect::KvSet { coll, key, value } => {
                if let Some(c) = self.coll_mut(*coll) {
                    c.kv.insert(key[..].into(), value[..].into());
                }
            }
            Effect::KvRm { coll, key } => {
                if let Some(c) = self.coll_mut(*coll) {
                    c.kv.remove(&key[..]);
                }
            }
            Effect::KvRmRange { coll, start, end } => {
                if let Some(c) = self.coll_mut(*coll) {
                    if start < end {
                        let range = (Bound::Included(&start[..]), Bound::Excluded(&end[..]));
                        let keys: Vec<Key> =
                            c.kv.range::<[u8], _>(range)
                                .map(|(k, _)| k.clone())
                                .collect();
                        for k in keys {
                            c.kv.remove(&k);
                        }
                    }
                }
            }
        }
    }

    /// Applies a direct write's run (the fields of an [`Effect::PlaceBlocks`]) with its data
    /// still in memory, at `mem`; returns the index's copy of the object name, or `None` if
    /// the collection is missing.
    pub fn place_in_memory(
        &mut self,
        coll: CollId,
        obj: &Name,
        first_block: u64,
        crcs: &[u32],
        mem: MemRef,
        out: &mut ApplyOut,
    ) -> Option<Name> {
        let (name, o) = self.object_entry_mut(coll, obj)?;
        let ext = Extent {
            nblocks: crcs.len() as u32,
            loc: Loc::Mem(mem),
            crcs: crcs.into(),
        };
        o.replace_blocks(first_block, ext, &mut out.freed);
        Some(name)
    }

    /// Calls `f` for every on-disk extent (for space accounting at open).
    pub fn for_each_disk_extent(&self, mut f: impl FnMut(CollId, &Name, u64, &Extent, u64)) {
        for (c, coll) in &self.colls {
            for (name, o) in &coll.objects {
                for (first, e) in &o.extents {
                    if let Loc::Disk(off) = e.loc {
                        f(*c, name, *first, e, off);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(nblocks: u32, off: u64) -> Extent {
        Extent {
            nblocks,
            loc: Loc::Disk(off),
            crcs: (0..nblocks).collect(),
        }
    }

    #[test]
    fn punch_splits_and_reports_freed_blocks() {
        let mut o = Object::default();
        o.extents.insert(0, ext(8, 0));
        let mut freed = Vec::new();
        o.punch(2, 3, &mut freed);
        assert_eq!(
            freed,
            vec![Freed::Disk {
                off: 8192,
                nblocks: 3
            }]
        );
        let keys: Vec<_> = o
            .extents
            .iter()
            .map(|(k, e)| (*k, e.nblocks, e.crcs[0]))
            .collect();
        assert_eq!(keys, vec![(0, 2, 0), (5, 3, 5)]);
        assert_eq!(o.allocated_blocks(), 5);
    }

    #[test]
    fn split_extents_keep_their_crcs_and_single_blocks_hold_them_inline() {
        let mut o = Object::default();
        o.extents.insert(0, ext(8, 0));
        let mut freed = Vec::new();
        o.punch(3, 1, &mut freed);
        o.punch(5, 1, &mut freed);
        let got: Vec<_> = o
            .extents
            .iter()
            .map(|(k, e)| (*k, e.crcs.to_vec(), matches!(e.crcs, Crcs::One(_))))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, vec![0, 1, 2], false),
                (4, vec![4], true),
                (6, vec![6, 7], false)
            ]
        );
        // A copy-on-write copy of the object shares the longer crc lists.
        let copy = o.clone();
        let (a, b) = (
            &o.extents.get(&0).expect("extent at 0").crcs,
            &copy.extents.get(&0).expect("extent at 0").crcs,
        );
        assert!(matches!((a, b), (Crcs::Many(x), Crcs::Many(y)) if Arc::ptr_eq(x, y)));
    }

    /// Blocks of `o` as (block -> (disk block, crc)), checking that no two extents overlap.
    fn blocks_of(o: &Object) -> BTreeMap<u64, (u64, u32)> {
        let mut out = BTreeMap::new();
        for (&first, e) in &o.extents {
            let Loc::Disk(off) = e.loc else {
                panic!("only disk extents in this test")
            };
            for i in 0..e.nblocks as u64 {
                let held = (off / BLOCK_SIZE as u64 + i, e.crcs[i as usize]);
                assert!(
                    out.insert(first + i, held).is_none(),
                    "block {} twice",
                    first + i
                );
            }
        }
        out
    }

    proptest::proptest! {
        /// Overwrites and punches of any shape (inside one extent, across several, over
        /// holes, the same blocks again) leave exactly the blocks a per-block model holds,
        /// each with its own crc, and report exactly the blocks they replaced as freed.
        #[test]
        fn overwrites_and_punches_match_a_per_block_model(
            ops in proptest::collection::vec((0u64..64, 1u64..20, proptest::bool::ANY), 1..200),
        ) {
            let mut o = Object::default();
            let mut model: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
            let mut next_disk = 1000u64;
            for (first, n, write) in ops {
                let mut freed = Vec::new();
                let before: Vec<u64> =
                    model.range(first..first + n).map(|(_, &(d, _))| d).collect();
                if write {
                    let e = Extent {
                        nblocks: n as u32,
                        loc: Loc::Disk(next_disk * BLOCK_SIZE as u64),
                        crcs: (0..n).map(|i| (next_disk + i) as u32).collect(),
                    };
                    for i in 0..n {
                        model.insert(first + i, (next_disk + i, (next_disk + i) as u32));
                    }
                    next_disk += n;
                    o.replace_blocks(first, e, &mut freed);
                } else {
                    for i in 0..n {
                        model.remove(&(first + i));
                    }
                    o.punch(first, n, &mut freed);
                }
                proptest::prop_assert_eq!(blocks_of(&o), model.clone());
                let mut freed_blocks: Vec<u64> = freed
                    .iter()
                    .flat_map(|f| match *f {
                        Freed::Disk { off, nblocks } => {
                            let b = off / BLOCK_SIZE as u64;
                            b..b + nblocks as u64
                        }
                        Freed::Mem { .. } => 0..0,
                    })
                    .collect();
                freed_blocks.sort_unstable();
                let mut before = before;
                before.sort_unstable();
                proptest::prop_assert_eq!(freed_blocks, before);
            }
        }

        /// Lookups of any range, and relocations of any range (the same blocks as one write,
        /// part of it, across several extents, where the blocks were overwritten meanwhile),
        /// agree with a per-block model: a block moves exactly when it is where the
        /// relocation expects it.
        #[test]
        fn lookups_and_relocations_match_a_per_block_model(
            ops in proptest::collection::vec((0u64..64, 1u64..20, 0u8..4, 0u64..3), 1..200),
        ) {
            let mut o = Object::default();
            let mut model: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
            let mut next_disk = 1000u64;
            for (first, n, kind, skew) in ops {
                let mut freed = Vec::new();
                if kind < 2 {
                    let e = ext(n as u32, next_disk * BLOCK_SIZE as u64);
                    for i in 0..n {
                        model.insert(first + i, (next_disk + i, i as u32));
                    }
                    next_disk += n;
                    o.replace_blocks(first, e, &mut freed);
                } else {
                    // Expect the blocks where the model has `first` (shifted by `skew`
                    // blocks: then nothing, or only part, matches), or anywhere.
                    let from_block = model.get(&first).map_or(7, |&(d, _)| d + skew);
                    let from = LocMatch::Disk(from_block * BLOCK_SIZE as u64);
                    let to = next_disk;
                    next_disk += n;
                    let mut want = Vec::new();
                    for i in 0..n {
                        if let Some(b) = model.get_mut(&(first + i)) {
                            if b.0 == from_block + i {
                                b.0 = to + i;
                                want.push(i);
                            }
                        }
                    }
                    let moved = o.relocate(first, first + n, &from, to * BLOCK_SIZE as u64);
                    let got: Vec<u64> =
                        moved.iter().flat_map(|&(r, k)| r..r + k as u64).collect();
                    proptest::prop_assert_eq!(got, want);
                }
                proptest::prop_assert_eq!(blocks_of(&o), model.clone());
                for (a, b) in [(0, 90), (first, first + n), (first + 1, first + n + 2)] {
                    let mut got = BTreeMap::new();
                    let mut last_end = a;
                    for (blk, e) in o.extents_in(a, b) {
                        proptest::prop_assert!(blk >= last_end && blk + e.nblocks as u64 <= b);
                        last_end = blk + e.nblocks as u64;
                        let Loc::Disk(off) = e.loc else { unreachable!() };
                        for i in 0..e.nblocks as u64 {
                            got.insert(blk + i, (off / BLOCK_SIZE as u64 + i, e.crcs[i as usize]));
                        }
                    }
                    let want: BTreeMap<u64, (u64, u32)> =
                        model.range(a..b).map(|(k, v)| (*k, *v)).collect();
                    proptest::prop_assert_eq!(got, want);
                }
            }
        }
    }

    #[test]
    fn relocate_moves_only_matching_blocks() {
        let mut o = Object::default();
        o.extents.insert(0, ext(4, 40960));
        o.extents.insert(4, ext(4, 0));
        let moved = o.relocate(0, 8, &LocMatch::Disk(40960), 1 << 20);
        assert_eq!(moved, vec![(0, 4)]);
        let v = o.extents_in(0, 8);
        assert!(matches!(v[0].1.loc, Loc::Disk(x) if x == 1 << 20));
        assert!(matches!(v[1].1.loc, Loc::Disk(0)));
        // Empty and reversed ranges hold nothing (and do not underflow).
        assert!(o.extents_in(5, 5).is_empty() && o.extents_in(6, 2).is_empty());
    }
}
