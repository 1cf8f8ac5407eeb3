//! Segment allocation and exact space accounting for the log-structured data devices.
//!
//! Data is appended to one open segment per append point ([`Head`]). Every block is accounted to its segment as
//! live data or live checkpoint; a segment whose blocks are all dead goes to *limbo* and is
//! reused only after a checkpoint taken after it died is durable, because the previous
//! checkpoint may still point into it.

use crate::device::BLOCK_SIZE;
use crate::effect::Name;
use crate::txn::CollId;
use std::collections::BTreeSet;

const BLOCK: u64 = BLOCK_SIZE as u64;

/// Lifecycle of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    Free,
    Open,
    Used,
    /// Dead since the given checkpoint generation was started.
    Limbo(u64),
}

/// Which append point an allocation takes blocks from. Each has a segment of its own, so that
/// every stream stays sequential on the device and releasing one frees whole segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Pending data written by the flusher, and live blocks moved by the cleaner.
    Data,
    /// Large writes that go straight to their place (see `commit::direct`).
    Direct,
    /// Checkpoint pieces and roots.
    Ckpt,
}

/// What a segment holds, for the cleaner: written ranges of objects (some may be dead since).
#[derive(Debug, Clone)]
pub struct Summary {
    pub coll: CollId,
    pub obj: Name,
    pub first_block: u64,
    pub nblocks: u32,
}

/// The segment table.
pub struct Segments {
    pub base: u64,
    pub seg_blocks: u32,
    live: Vec<u32>,
    ckpt: Vec<u32>,
    /// Checkpoint generation started when a data block of the segment last died: the segment
    /// is referenced by checkpoints up to that generation.
    death: Vec<u64>,
    state: Vec<SegState>,
    free: BTreeSet<u32>,
    limbo: Vec<u32>,
    /// Open segment (and blocks used in it) of each [`Head`], indexed by `Head as usize`.
    heads: [Option<(u32, u32)>; 3],
    /// Blocks allocated to writes still in flight (written, not yet in the index), per
    /// segment: the cleaner leaves such a segment alone, as it cannot see those blocks.
    in_flight: Vec<u32>,
    /// Segments that replay keeps open (see [`Segments::replay_place`]).
    replay_open: Vec<u32>,
    pub summaries: Vec<Vec<Summary>>,
    /// Checkpoint snapshots started / made durable in this incarnation.
    pub snap_started: u64,
    pub snap_durable: u64,
    live_total: u64,
    ckpt_total: u64,
}

impl Segments {
    /// A table of `count` free segments of `seg_size` bytes starting at byte `base`.
    pub fn new(base: u64, seg_size: u64, count: u32) -> Self {
        let n = count as usize;
        Segments {
            base,
            seg_blocks: (seg_size / BLOCK) as u32,
            live: vec![0; n],
            ckpt: vec![0; n],
            death: vec![0; n],
            state: vec![SegState::Free; n],
            free: (0..count).collect(),
            limbo: Vec::new(),
            heads: [None; 3],
            in_flight: vec![0; n],
            replay_open: Vec::new(),
            summaries: vec![Vec::new(); n],
            snap_started: 0,
            snap_durable: 0,
            live_total: 0,
            ckpt_total: 0,
        }
    }

    /// Number of segments.
    pub fn count(&self) -> u32 {
        self.state.len() as u32
    }

    /// Segment holding the byte offset, if it is in the segment area.
    pub fn seg_of(&self, off: u64) -> Option<u32> {
        let s = off.checked_sub(self.base)? / (self.seg_blocks as u64 * BLOCK);
        (s < self.state.len() as u64).then_some(s as u32)
    }

    /// Byte offset of the start of segment `s`.
    pub fn seg_offset(&self, s: u32) -> u64 {
        self.base + s as u64 * self.seg_blocks as u64 * BLOCK
    }

    /// Allocates `n` blocks at `head`, as runs of (byte offset, blocks) each within one
    /// segment, accounted as live data (or checkpoint for [`Head::Ckpt`]); the caller frees
    /// blocks that turn out dead. `None` (and nothing allocated) when free segments run out.
    pub fn alloc(&mut self, n: u32, head: Head) -> Option<Vec<(u64, u32)>> {
        let h = head as usize;
        let head_room = self.heads[h].map_or(0, |(_, used)| self.seg_blocks - used);
        let extra = n.saturating_sub(head_room);
        if extra.div_ceil(self.seg_blocks) as usize > self.free.len() {
            return None;
        }
        let mut runs = Vec::new();
        let mut left = n;
        while left > 0 {
            let (seg, used) = match self.heads[h] {
                Some(cur) if cur.1 < self.seg_blocks => cur,
                _ => {
                    self.close(head);
                    let s = self.free.pop_first()?;
                    self.state[s as usize] = SegState::Open;
                    self.death[s as usize] = 0;
                    (s, 0)
                }
            };
            let take = left.min(self.seg_blocks - used);
            let off = self.seg_offset(seg) + used as u64 * BLOCK;
            // Account before the head can be closed, or the segment would look dead.
            if head == Head::Ckpt {
                self.ckpt_blocks(off, take, true);
            } else {
                self.add_live(off, take);
            }
            runs.push((off, take));
            self.heads[h] = Some((seg, used + take));
            left -= take;
        }
        Some(runs)
    }

    /// Closes the open segment of `head` (its next allocation starts a new one).
    pub fn close(&mut self, head: Head) {
        if let Some((s, _)) = self.heads[head as usize].take() {
            self.state[s as usize] = SegState::Used;
            self.maybe_dead(s);
        }
    }

    /// Blocks left in the open checkpoint segment.
    pub fn ckpt_head_room(&self) -> u32 {
        self.heads[Head::Ckpt as usize].map_or(0, |(_, used)| self.seg_blocks - used)
    }

    /// Marks (`hold`) or unmarks allocated runs as written but not yet in the index.
    pub fn in_flight(&mut self, runs: &[(u64, u32)], hold: bool) {
        for &(off, n) in runs {
            self.for_runs(off, n, |t, s, k| {
                t.in_flight[s] = if hold {
                    t.in_flight[s] + k
                } else {
                    t.in_flight[s].saturating_sub(k)
                };
            });
        }
    }

    fn maybe_dead(&mut self, s: u32) {
        let i = s as usize;
        if self.state[i] == SegState::Used && self.live[i] == 0 && self.ckpt[i] == 0 {
            // Checkpoint blocks are released only once a newer checkpoint is durable, so they
            // hold nothing back; dead data may still be referenced by checkpoints up to `death`.
            self.state[i] = SegState::Limbo(self.death[i]);
            self.summaries[i] = Vec::new();
            self.limbo.push(s);
        }
    }

    fn for_runs(&mut self, off: u64, n: u32, mut f: impl FnMut(&mut Self, usize, u32)) {
        let mut off = off;
        let mut left = n;
        while left > 0 {
            let Some(s) = self.seg_of(off) else { return };
            let in_seg = self.seg_blocks - ((off - self.seg_offset(s)) / BLOCK) as u32;
            let take = left.min(in_seg);
            f(self, s as usize, take);
            off += take as u64 * BLOCK;
            left -= take;
        }
    }

    /// Accounts `n` blocks at `off` as live data.
    pub fn add_live(&mut self, off: u64, n: u32) {
        self.for_runs(off, n, |t, s, k| {
            t.live[s] += k;
            t.live_total += k as u64;
            if t.state[s] == SegState::Free {
                t.free.remove(&(s as u32));
                t.state[s] = SegState::Used;
            }
        });
    }

    /// Replay of a record that placed `n` blocks at `off`: they are live, and their segment
    /// was the open direct head when they were written, so it stays open (it must not die
    /// between the records that fill it) until [`Segments::end_replay`].
    pub fn replay_place(&mut self, off: u64, n: u32) {
        self.for_runs(off, n, |t, s, _| {
            match t.state[s] {
                SegState::Free => {
                    t.free.remove(&(s as u32));
                }
                SegState::Limbo(_) => t.limbo.retain(|&x| x as usize != s),
                SegState::Open | SegState::Used => {}
            }
            if t.state[s] != SegState::Open {
                t.state[s] = SegState::Open;
                t.replay_open.push(s as u32);
            }
        });
        self.add_live(off, n);
    }

    /// Closes the segments replay kept open.
    pub fn end_replay(&mut self) {
        for s in std::mem::take(&mut self.replay_open) {
            if self.state[s as usize] == SegState::Open {
                self.state[s as usize] = SegState::Used;
                self.maybe_dead(s);
            }
        }
    }

    /// Accounts `n` live data blocks at `off` as dead.
    pub fn free_live(&mut self, off: u64, n: u32) {
        self.for_runs(off, n, |t, s, k| {
            let k = k.min(t.live[s]);
            t.live[s] -= k;
            t.live_total -= k as u64;
            t.death[s] = t.snap_started;
            t.maybe_dead(s as u32);
        });
    }

    /// Accounts `n` blocks at `off` as checkpoint (`add`) or releases them.
    pub fn ckpt_blocks(&mut self, off: u64, n: u32, add: bool) {
        self.for_runs(off, n, |t, s, k| {
            if add {
                t.ckpt[s] += k;
                t.ckpt_total += k as u64;
                if t.state[s] == SegState::Free {
                    t.free.remove(&(s as u32));
                    t.state[s] = SegState::Used;
                }
            } else {
                let k = k.min(t.ckpt[s]);
                t.ckpt[s] -= k;
                t.ckpt_total -= k as u64;
                t.maybe_dead(s as u32);
            }
        });
    }

    /// Returns limbo segments to the free list once a later checkpoint is durable.
    pub fn release_limbo(&mut self) {
        let durable = self.snap_durable;
        let mut keep = Vec::new();
        for s in std::mem::take(&mut self.limbo) {
            match self.state[s as usize] {
                SegState::Limbo(tag) if durable > tag => {
                    self.state[s as usize] = SegState::Free;
                    self.free.insert(s);
                }
                SegState::Limbo(_) => keep.push(s),
                _ => {}
            }
        }
        self.limbo = keep;
    }

    /// The used segment with dead space and the fewest live blocks to move. Checkpoint
    /// blocks stay where they are; they are released by the next checkpoint.
    pub fn clean_candidate(&self) -> Option<u32> {
        (0..self.state.len())
            .filter(|&i| self.state[i] == SegState::Used && self.live[i] > 0)
            .filter(|&i| self.in_flight[i] == 0)
            .filter(|&i| self.live[i] + self.ckpt[i] < self.seg_blocks)
            .min_by_key(|&i| self.live[i])
            .map(|i| i as u32)
    }

    /// Used segments that hold nothing but checkpoint blocks (the next checkpoint frees them).
    pub fn ckpt_only_segments(&self) -> u32 {
        (0..self.state.len())
            .filter(|&i| self.state[i] == SegState::Used && self.live[i] == 0 && self.ckpt[i] > 0)
            .count() as u32
    }

    /// Checks that every referenced block is accounted live in a segment that is not free or
    /// in limbo. `refs` are (offset, blocks) of every on-disk extent.
    pub fn check_refs(&self, refs: &[(u64, u32)]) -> Result<(), String> {
        let mut count = vec![0u32; self.state.len()];
        for &(off, n) in refs {
            let Some(s) = self.seg_of(off) else {
                return Err(format!("extent at {off} is outside the segment area"));
            };
            let end = self.seg_offset(s) + self.seg_blocks as u64 * BLOCK;
            if off + n as u64 * BLOCK > end {
                return Err(format!(
                    "extent at {off} of {n} blocks crosses segment {s}'s end"
                ));
            }
            count[s as usize] += n;
        }
        for (i, c) in count.iter().enumerate() {
            let st = self.state[i];
            if *c > self.live[i] || (*c > 0 && matches!(st, SegState::Free | SegState::Limbo(_))) {
                return Err(format!(
                    "segment {i} ({st:?}) holds {c} referenced blocks but {} are accounted live",
                    self.live[i]
                ));
            }
        }
        Ok(())
    }

    /// Live data blocks in segment `s`.
    pub fn live_in(&self, s: u32) -> u32 {
        self.live[s as usize]
    }

    /// Free segments.
    pub fn free_segments(&self) -> u32 {
        self.free.len() as u32
    }

    /// Segments waiting in limbo.
    pub fn limbo_segments(&self) -> u32 {
        self.limbo.len() as u32
    }

    /// Total live data blocks.
    pub fn live_blocks(&self) -> u64 {
        self.live_total
    }

    /// Total checkpoint blocks.
    pub fn ckpt_blocks_total(&self) -> u64 {
        self.ckpt_total
    }

    /// Total blocks of the segment area.
    pub fn total_blocks(&self) -> u64 {
        self.state.len() as u64 * self.seg_blocks as u64
    }

    /// State of segment `s`.
    #[cfg(test)]
    pub fn state(&self, s: u32) -> SegState {
        self.state[s as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_segments_wait_for_a_later_checkpoint() {
        let mut t = Segments::new(4096, 4 * BLOCK, 3);
        let runs = t.alloc(6, Head::Data).unwrap();
        assert_eq!(runs, vec![(4096, 4), (4096 + 4 * BLOCK, 2)]);
        t.free_live(4096, 4);
        assert_eq!(t.state(0), SegState::Limbo(0));
        t.release_limbo();
        assert_eq!(t.free_segments(), 1);
        t.snap_started = 1;
        t.snap_durable = 1;
        t.release_limbo();
        assert_eq!(t.free_segments(), 2);
        assert_eq!(t.live_blocks(), 2);
        assert!(t.alloc(11, Head::Data).is_none());
        // Checkpoints take whole segments of their own: two free segments hold 8 blocks.
        assert!(t.alloc(9, Head::Ckpt).is_none());
        assert!(t.alloc(8, Head::Ckpt).is_some());
        assert_eq!(t.ckpt_blocks_total(), 8);
    }
}
