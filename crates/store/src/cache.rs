//! A read cache of data blocks, keyed by their place on the data devices.
//!
//! The store is log-structured: a block at a device offset never changes until its segment is
//! reused, and every write to the devices passes through [`crate::mirror::Mirror`], which drops
//! the cached blocks it overwrites. Blocks enter the cache when the flusher or a large write
//! writes them (so data just written is read from memory after it leaves the in-memory pending
//! set), except a replica's copies (`Transaction::replica_copy`: read only if this OSD becomes
//! the primary, they would take two thirds of the cache of an OSD in a size-3 pool); when a
//! read fetched them from a device; and when the cleaner moves a block that was cached. Every hit is still verified against the index's crc by the
//! caller, like a device read.
//!
//! A read that raced with a write to the same place must not put the old contents back: a
//! generation counter, bumped by every invalidation, lets such a read skip the insert.
//!
//! A block whose data dies (overwritten, which puts the new data elsewhere, or removed)
//! leaves the cache at once ([`BlockCache::forget`], from the commit that frees it or the
//! flush that finds it superseded): under overwrites the cache held every dead copy until it
//! aged out, so it grew with fresh memory (8-10 % of the development VM's CPU clearing pages
//! in a 4 KiB random-write benchmark) and held less live data than its size.
//!
//! Blocks live in slots of a slab that grows in chunks up to the capacity and is never given
//! back: an evicted or invalidated block's slot takes the next block. A heap allocation per
//! block (as before) freed and allocated 4 KiB pieces at the rate data was written, and the
//! allocator kept returning the freed memory to the kernel and faulting it back in, zeroed:
//! 40% of a store's maintenance thread under 4 KiB random writes went to clearing those pages.

use crate::device::BLOCK_SIZE;
use cairn_failstop::LockOrDie;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const B: u64 = BLOCK_SIZE as u64;

/// A read cache's figures: bytes held and the most it holds; reads answered from it and
/// reads that were not, since the store opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub bytes: u64,
    pub capacity: u64,
    pub hits: u64,
    pub misses: u64,
}

/// Cached blocks with first-in-first-out eviction, bounded in blocks.
pub struct BlockCache {
    generation: AtomicU64,
    /// Reads answered wholly from the cache, and those that went to a device.
    hits: AtomicU64,
    misses: AtomicU64,
    inner: Mutex<Inner>,
}

/// Slots are allocated in chunks of this many blocks (1 MiB), as the cache fills.
const CHUNK_BLOCKS: usize = 256;

#[derive(Default)]
struct Inner {
    /// Device offset -> slot. Hashed, not ordered: every lookup names its blocks, and an
    /// ordered map's search missed the CPU caches at every level (a B-tree over a large
    /// cache: ~4 % of the machine under 4 KiB random writes, in `forget` and `insert`).
    blocks: HashMap<u64, u32>,
    /// Slot -> the device offset it was last filled for (stale once the slot is freed or
    /// refilled: checked against `blocks`). Lets a smaller capacity drop just the blocks in
    /// the slots it gives back, instead of walking every block held under the lock.
    keys: Vec<u64>,
    order: VecDeque<u64>,
    slab: Slab,
    /// The most blocks held ([`BlockCache::set_capacity`] changes it).
    cap: usize,
}

/// Fixed-size block slots in chunks; slots are handed out and returned, never freed.
#[derive(Default)]
struct Slab {
    chunks: Vec<Box<[u8]>>,
    /// Slots made so far (all chunks but the last are full).
    made: usize,
    free: Vec<u32>,
}

impl Slab {
    /// A slot not in use; a new one while fewer than `cap` exist, otherwise `None`.
    fn take(&mut self, cap: usize) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.made >= cap {
            return None;
        }
        let base = self.chunks.len().saturating_sub(1) * CHUNK_BLOCKS;
        let in_chunks = self
            .chunks
            .last()
            .map_or(0, |c| base + c.len() / BLOCK_SIZE);
        if self.made == in_chunks {
            match self.chunks.last_mut() {
                // Cut to an earlier, smaller capacity: grown to the new one (one copy, once).
                Some(last) if last.len() < CHUNK_BLOCKS * BLOCK_SIZE => {
                    let mut v = std::mem::take(last).into_vec();
                    v.resize(CHUNK_BLOCKS.min(cap - base) * BLOCK_SIZE, 0);
                    *last = v.into_boxed_slice();
                }
                _ => {
                    let n = CHUNK_BLOCKS.min(cap - self.made);
                    self.chunks
                        .push(vec![0u8; n * BLOCK_SIZE].into_boxed_slice());
                }
            }
        }
        self.made += 1;
        Some((self.made - 1) as u32)
    }

    /// Slots the chunks have room for.
    fn slots(&self) -> usize {
        self.chunks.iter().map(|c| c.len() / BLOCK_SIZE).sum()
    }

    /// Gives back every slot from `cap` on (their blocks were dropped) and the memory of the
    /// chunks that held only those.
    fn cut_to(&mut self, cap: usize) {
        self.free.retain(|&s| (s as usize) < cap);
        self.made = self.made.min(cap);
        let keep = cap.div_ceil(CHUNK_BLOCKS);
        self.chunks.truncate(keep);
        let want = (cap - (keep - 1) * CHUNK_BLOCKS) * BLOCK_SIZE;
        if let Some(last) = self.chunks.last_mut().filter(|l| l.len() > want) {
            *last = last[..want].to_vec().into_boxed_slice();
        }
    }

    fn put(&mut self, slot: u32) {
        self.free.push(slot);
    }

    fn block(&self, slot: u32) -> &[u8] {
        let (c, i) = (slot as usize / CHUNK_BLOCKS, slot as usize % CHUNK_BLOCKS);
        &self.chunks[c][i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]
    }

    fn block_mut(&mut self, slot: u32) -> &mut [u8] {
        let (c, i) = (slot as usize / CHUNK_BLOCKS, slot as usize % CHUNK_BLOCKS);
        &mut self.chunks[c][i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]
    }
}

impl BlockCache {
    /// A cache of at most `bytes` (rounded down to whole blocks; at least one block).
    pub fn new(bytes: u64) -> BlockCache {
        BlockCache {
            generation: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                cap: cap_blocks(bytes),
                ..Inner::default()
            }),
        }
    }

    /// Holds at most `bytes` from now on (at least one block): a smaller capacity drops the
    /// blocks beyond it at once and gives back the memory that held them (the memory target
    /// leaves the cache less room as the index grows); a larger one fills as blocks come.
    pub fn set_capacity(&self, bytes: u64) {
        let cap = cap_blocks(bytes);
        let mut inner = self.lock();
        inner.cap = cap;
        if inner.slab.slots() > cap {
            let Inner {
                blocks, keys, slab, ..
            } = &mut *inner;
            for (slot, key) in keys.iter().enumerate().skip(cap) {
                if blocks.get(key) == Some(&(slot as u32)) {
                    blocks.remove(key);
                }
            }
            keys.truncate(cap);
            slab.cut_to(cap);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_or_die()
    }

    /// The invalidation generation; pass it to [`BlockCache::insert_if_current`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Copies the blocks at `off..off + out.len()` into `out` when every one is cached and
    /// `verify(i, block)` accepts it; false otherwise (`out` is then unspecified).
    pub fn get_all(&self, off: u64, out: &mut [u8], verify: impl Fn(usize, &[u8]) -> bool) -> bool {
        let hit = self.copy_out(off, out, verify);
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    fn copy_out(&self, off: u64, out: &mut [u8], verify: impl Fn(usize, &[u8]) -> bool) -> bool {
        let inner = self.lock();
        for (i, chunk) in out.chunks_mut(BLOCK_SIZE).enumerate() {
            match inner.blocks.get(&(off + i as u64 * B)) {
                Some(&s) if verify(i, inner.slab.block(s)) => {
                    chunk.copy_from_slice(inner.slab.block(s))
                }
                _ => return false,
            }
        }
        true
    }

    /// What it holds and how it served, for the store's stats.
    pub fn stats(&self) -> CacheStats {
        let (held, cap) = {
            let inner = self.lock();
            (inner.blocks.len(), inner.cap)
        };
        CacheStats {
            bytes: held as u64 * B,
            capacity: cap as u64 * B,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Caches whole blocks of `data` at `off` (the caller holds them as written or verified).
    pub fn insert(&self, off: u64, data: &[u8]) {
        let mut inner = self.lock();
        self.insert_locked(&mut inner, off, data);
    }

    /// [`BlockCache::insert`] unless something was invalidated since `generation` was read
    /// (the data may then be older than a write that happened meanwhile). Invalidations bump
    /// the generation under the same lock, so the check and the insert cannot be split.
    pub fn insert_if_current(&self, generation: u64, off: u64, data: &[u8]) {
        let mut inner = self.lock();
        if self.generation.load(Ordering::Acquire) == generation {
            self.insert_locked(&mut inner, off, data);
        }
    }

    fn insert_locked(&self, inner: &mut Inner, off: u64, data: &[u8]) {
        for (i, chunk) in data.chunks_exact(BLOCK_SIZE).enumerate() {
            let at = off + i as u64 * B;
            let slot = match inner.blocks.get(&at) {
                Some(&s) => s,
                None => match self.slot_for_new(inner) {
                    Some(s) => {
                        inner.blocks.insert(at, s);
                        inner.order.push_back(at);
                        note_key(&mut inner.keys, s, at);
                        s
                    }
                    None => return,
                },
            };
            inner.slab.block_mut(slot).copy_from_slice(chunk);
        }
        // Keys whose block was invalidated linger in `order`; keep it bounded too.
        if inner.order.len() > 2 * inner.cap {
            let Inner { blocks, order, .. } = inner;
            order.retain(|k| blocks.contains_key(k));
        }
    }

    /// A free slot, evicting the oldest block when the cache is full.
    fn slot_for_new(&self, inner: &mut Inner) -> Option<u32> {
        loop {
            if let Some(s) = inner.slab.take(inner.cap) {
                return Some(s);
            }
            // Full: keys in `order` whose block was invalidated are skipped.
            let old = inner.order.pop_front()?;
            if let Some(s) = inner.blocks.remove(&old) {
                return Some(s);
            }
        }
    }

    /// Whether the block at `off` is cached.
    pub fn contains(&self, off: u64) -> bool {
        self.lock().blocks.contains_key(&off)
    }

    /// Drops cached blocks overlapping `off..off + len` (before they are overwritten).
    pub fn invalidate(&self, off: u64, len: u64) {
        let mut inner = self.lock();
        self.generation.fetch_add(1, Ordering::AcqRel);
        drop_range(&mut inner, off, len);
    }

    /// Drops the cached blocks of the ranges `(off, len)` that nothing points to any more
    /// (their data was overwritten elsewhere, or removed), so their slots take the next
    /// blocks instead of the cache growing with dead copies until they age out. The
    /// generation stays: a read that raced with this may put a dead block back, which is
    /// harmless (nothing reads it) and dropped again when its place is written.
    pub fn forget(&self, ranges: impl IntoIterator<Item = (u64, u64)>) {
        let mut inner = None;
        for (off, len) in ranges {
            drop_range(inner.get_or_insert_with(|| self.lock()), off, len);
        }
    }

    /// Blocks cached.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().blocks.len()
    }
}

/// Records that `slot` now holds the block at `key`.
fn note_key(keys: &mut Vec<u64>, slot: u32, key: u64) {
    let i = slot as usize;
    if keys.len() <= i {
        keys.resize(i + 1, u64::MAX);
    }
    keys[i] = key;
}

/// A capacity in blocks: at least one; slots are numbered in u32 (16 TiB of cache).
fn cap_blocks(bytes: u64) -> usize {
    (bytes / B).clamp(1, u32::MAX as u64) as usize
}

/// Drops the cached blocks overlapping `off..off + len`, their slots made free. Blocks are
/// cached at whole-block offsets.
fn drop_range(inner: &mut Inner, off: u64, len: u64) {
    let start = off / B * B;
    let end = off.saturating_add(len);
    let Inner { blocks, slab, .. } = inner;
    if (end - start).div_ceil(B) > blocks.len() as u64 {
        // A range larger than the cache: one pass over what is held.
        blocks.retain(|&k, &mut s| {
            let inside = (start..end).contains(&k);
            if inside {
                slab.put(s);
            }
            !inside
        });
        return;
    }
    for k in (start..end).step_by(BLOCK_SIZE) {
        if let Some(s) = blocks.remove(&k) {
            slab.put(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(v: u8) -> Vec<u8> {
        vec![v; BLOCK_SIZE]
    }

    #[test]
    fn hits_misses_eviction_and_invalidation() {
        let c = BlockCache::new(2 * B);
        c.insert(0, &block(1));
        c.insert(B, &block(2));
        let mut out = vec![0u8; 2 * BLOCK_SIZE];
        assert!(c.get_all(0, &mut out, |_, _| true));
        assert_eq!(&out[BLOCK_SIZE..], &block(2)[..]);
        assert!(
            !c.get_all(0, &mut out, |i, _| i == 0),
            "verify refuses block 1"
        );
        c.insert(2 * B, &block(3)); // evicts block 0 (first in)
        assert_eq!(c.len(), 2);
        assert!(!c.get_all(0, &mut out[..BLOCK_SIZE], |_, _| true));
        c.invalidate(B + 100, 10);
        assert!(!c.get_all(B, &mut out[..BLOCK_SIZE], |_, _| true));
        assert!(c.get_all(2 * B, &mut out[..BLOCK_SIZE], |_, _| true));
        // Two reads were answered from memory; the refused, evicted and invalidated ones not.
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (2, 3));
        assert_eq!(
            (s.bytes, s.capacity),
            (B, 2 * B),
            "one block left after the invalidation"
        );
    }

    #[test]
    fn slots_of_evicted_and_invalidated_blocks_are_reused() {
        let cap = CHUNK_BLOCKS + 3;
        let c = BlockCache::new(cap as u64 * B);
        for i in 0..10 * cap as u64 {
            c.insert(i * B, &block(i as u8));
            if i % 7 == 0 {
                c.invalidate(i * B, B);
            }
        }
        let inner = c.lock();
        assert_eq!(inner.slab.made, cap, "never more slots than the capacity");
        assert_eq!(
            inner.slab.chunks.iter().map(|ch| ch.len()).sum::<usize>(),
            cap * BLOCK_SIZE,
            "the last chunk is cut to the capacity"
        );
        assert_eq!(inner.blocks.len() + inner.slab.free.len(), cap);
    }

    /// Dead blocks forgotten give their slots to the next blocks (the slab does not grow),
    /// and forgetting does not make racing reads skip their insert (the generation stays).
    #[test]
    fn forgotten_blocks_give_their_slots_back_without_a_new_generation() {
        let c = BlockCache::new(1 << 30);
        let live = 10u64;
        (0..live).for_each(|i| c.insert(i * B, &block(i as u8)));
        let generation = c.generation();
        // Each round moves every block elsewhere, as a log-structured overwrite does.
        for round in 1..20u64 {
            let (old, new) = ((round - 1) * live * B, round * live * B);
            c.forget([(old, live * B)]);
            (0..live).for_each(|i| c.insert(new + i * B, &block(round as u8)));
        }
        assert_eq!(c.generation(), generation);
        assert_eq!(c.len() as u64, live, "only the live blocks are held");
        assert_eq!(c.lock().slab.made as u64, live, "their slots were reused");
        let mut out = vec![0u8; BLOCK_SIZE];
        assert!(c.get_all(19 * live * B, &mut out, |_, _| true));
        assert!(!c.get_all(18 * live * B, &mut out, |_, _| true));
    }

    proptest::proptest! {
        /// Against a model (a map and a FIFO of keys): every cached block reads back as last
        /// written, never more than the capacity is held, and a block just inserted is held.
        #[test]
        fn behaves_like_a_bounded_fifo_map(
            cap in 1usize..12,
            ops in proptest::collection::vec((0u64..24, 0u8..4, proptest::num::u8::ANY), 1..300),
        ) {
            let mut cap = cap;
            let c = BlockCache::new(cap as u64 * B);
            let mut model: std::collections::HashMap<u64, u8> = Default::default();
            for (key, op, v) in ops {
                if op == 3 {
                    // A new capacity, smaller or larger (blocks beyond a smaller one dropped).
                    cap = usize::from(v % 12) + 1;
                    c.set_capacity(cap as u64 * B);
                } else if op == 0 {
                    // Ranges of 1 to 16 blocks: some smaller than what is cached, some larger.
                    let n = u64::from(v % 16) + 1;
                    c.invalidate(key * B, n * B);
                    model.retain(|k, _| !(key..key + n).contains(k));
                } else {
                    c.insert(key * B, &block(v));
                    model.insert(key, v);
                }
                let mut out = block(0);
                if op == 1 || op == 2 {
                    proptest::prop_assert!(c.get_all(key * B, &mut out, |_, _| true));
                }
                for k in 0..24u64 {
                    if c.get_all(k * B, &mut out, |_, _| true) {
                        proptest::prop_assert_eq!(Some(&out[0]), model.get(&k), "key {}", k);
                        proptest::prop_assert!(out.iter().all(|&b| b == out[0]));
                    }
                }
                proptest::prop_assert!(c.len() <= cap);
                let inner = c.lock();
                proptest::prop_assert_eq!(
                    inner.blocks.len() + inner.slab.free.len(),
                    inner.slab.made,
                    "every slot is held or free"
                );
                for (k, s) in &inner.blocks {
                    proptest::prop_assert_eq!(inner.keys.get(*s as usize), Some(k), "slot {} of key {}", s, k);
                }
                let slots = inner.slab.slots();
                proptest::prop_assert!(inner.slab.made <= slots && slots <= cap, "{} {}", slots, cap);
            }
        }
    }

    #[test]
    fn a_read_older_than_an_invalidation_is_not_cached() {
        let c = BlockCache::new(16 * B);
        let g = c.generation();
        c.invalidate(0, B); // a write to the place the read fetched from
        c.insert_if_current(g, 0, &block(9));
        assert_eq!(c.len(), 0);
        let g = c.generation();
        c.insert_if_current(g, 0, &block(9));
        assert_eq!(c.len(), 1);
    }
}
