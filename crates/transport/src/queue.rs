//! The bytes a sender accepted and has not written yet: runs of copied bytes (headers,
//! control parts, small payloads) and payloads held by reference, in order.

use crate::copies;
use std::collections::VecDeque;
use std::io::IoSlice;

/// A payload a queue holds instead of copying it.
pub type HeldBytes = std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Payloads shorter than this are copied even when they could be held: the copy costs less
/// than a chunk of their own and a slice more per write.
pub const HOLD_MIN: usize = 512;

/// At most this many slices per vectored write (the kernel allows 1024).
const MAX_SLICES: usize = 64;

enum Chunk {
    Copied(Vec<u8>),
    Held(HeldBytes),
}

impl Chunk {
    fn bytes(&self) -> &[u8] {
        match self {
            Chunk::Copied(v) => v,
            Chunk::Held(h) => (**h).as_ref(),
        }
    }
}

#[derive(Default)]
pub(crate) struct SendQueue {
    chunks: VecDeque<Chunk>,
    /// Bytes of the front chunk already written.
    front_done: usize,
    len: usize,
}

impl SendQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a copy of `b` (frame headers and control parts).
    pub fn copy(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        match self.chunks.back_mut() {
            Some(Chunk::Copied(v)) => v.extend_from_slice(b),
            _ => self.chunks.push_back(Chunk::Copied(b.to_vec())),
        }
        self.len += b.len();
    }

    /// Appends a data part by copying it, counted as a copy of a payload.
    pub fn copy_payload(&mut self, b: &[u8]) {
        self.copy(b);
        copies::queued(b.len(), 0);
    }

    /// Appends a data part by reference, from byte `skip` of it (the socket took the bytes
    /// before; only when the queue is empty, or `skip` is 0).
    pub fn hold(&mut self, h: HeldBytes, skip: usize) {
        let len = (*h).as_ref().len();
        if skip >= len {
            return;
        }
        debug_assert!(skip == 0 || self.chunks.is_empty());
        if self.chunks.is_empty() {
            self.front_done = skip;
        }
        self.chunks.push_back(Chunk::Held(h));
        self.len += len - skip;
        copies::queued(0, len - skip);
    }

    /// Appends what was not written of a frame's `parts` (the socket took `skip` bytes), the
    /// data part (`parts[data]`) held when `held` has it.
    pub fn rest_of(
        &mut self,
        parts: &[&[u8]],
        mut skip: usize,
        data: usize,
        held: Option<HeldBytes>,
    ) {
        let mut held = held;
        for (i, p) in parts.iter().enumerate() {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            match held.take() {
                Some(h) if i == data => self.hold(h, skip),
                other => {
                    held = other;
                    if i == data {
                        self.copy_payload(&p[skip..]);
                    } else {
                        self.copy(&p[skip..]);
                    }
                }
            }
            skip = 0;
        }
    }

    /// The queued bytes as slices for one vectored write (at most [`MAX_SLICES`]).
    pub fn slices(&self) -> Vec<IoSlice<'_>> {
        let mut out = Vec::with_capacity(self.chunks.len().min(MAX_SLICES));
        for (i, c) in self.chunks.iter().take(MAX_SLICES).enumerate() {
            let skip = if i == 0 { self.front_done } else { 0 };
            out.push(IoSlice::new(&c.bytes()[skip..]));
        }
        out
    }

    /// Drops the first `n` bytes (written).
    pub fn consume(&mut self, mut n: usize) {
        self.len -= n.min(self.len);
        while n > 0 {
            let Some(front) = self.chunks.front() else {
                break;
            };
            let left = front.bytes().len() - self.front_done;
            if n < left {
                self.front_done += n;
                return;
            }
            n -= left;
            self.chunks.pop_front();
            self.front_done = 0;
        }
    }

    /// Everything queued, in one buffer (a copy), leaving the queue empty.
    pub fn take_all(&mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for s in self.slices_all() {
            out.extend_from_slice(s);
        }
        *self = SendQueue::default();
        out
    }

    fn slices_all(&self) -> impl Iterator<Item = &[u8]> {
        let skip = self.front_done;
        self.chunks
            .iter()
            .enumerate()
            .map(move |(i, c)| &c.bytes()[if i == 0 { skip } else { 0 }..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Shared(Arc<Vec<u8>>);
    impl AsRef<[u8]> for Shared {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    fn written(q: &SendQueue) -> Vec<u8> {
        q.slices_all().flat_map(|s| s.iter().copied()).collect()
    }

    #[test]
    fn a_held_payload_is_queued_by_reference_and_written_in_order() {
        let payload = Arc::new(vec![7u8; 4096]);
        let mut q = SendQueue::default();
        let parts: [&[u8]; 3] = [b"header", b"ctl", &payload];
        q.rest_of(&parts, 0, 2, Some(Arc::new(Shared(payload.clone()))));
        q.copy(b"next");
        assert_eq!(
            Arc::strong_count(&payload),
            2,
            "the queue holds the payload, no copy"
        );
        let mut want = b"headerctl".to_vec();
        want.extend_from_slice(&payload);
        want.extend_from_slice(b"next");
        assert_eq!(q.len(), want.len());
        assert_eq!(written(&q), want);
        // Written in uneven steps, across the chunks' edges.
        let mut got = Vec::new();
        while !q.is_empty() {
            let s: Vec<u8> = q.slices().iter().flat_map(|s| s.iter().copied()).collect();
            let n = s.len().min(1000);
            got.extend_from_slice(&s[..n]);
            q.consume(n);
        }
        assert_eq!(got, want);
        assert_eq!(Arc::strong_count(&payload), 1, "released once written");
    }

    #[test]
    fn what_the_socket_took_is_skipped_whichever_part_it_ends_in() {
        let payload = Arc::new((0..=255u8).cycle().take(2000).collect::<Vec<u8>>());
        let parts: [&[u8]; 3] = [b"hdr", b"control", &payload];
        let whole: Vec<u8> = parts.concat();
        for skip in [0, 2, 3, 9, 10, 11, 1500, whole.len() - 1, whole.len()] {
            for hold in [false, true] {
                let mut q = SendQueue::default();
                let h: Option<HeldBytes> =
                    hold.then(|| Arc::new(Shared(payload.clone())) as HeldBytes);
                q.rest_of(&parts, skip, 2, h);
                assert_eq!(written(&q), whole[skip..], "skip {skip} held {hold}");
                assert_eq!(q.len(), whole.len() - skip);
                assert_eq!(q.take_all(), whole[skip..]);
                assert!(q.is_empty());
            }
        }
    }

    #[test]
    fn one_write_takes_at_most_max_slices() {
        let mut q = SendQueue::default();
        for i in 0..(MAX_SLICES * 2) {
            q.copy(&[i as u8]);
            q.hold(Arc::new(Shared(Arc::new(vec![i as u8; HOLD_MIN]))), 0);
        }
        assert_eq!(q.slices().len(), MAX_SLICES);
        let first: usize = q.slices().iter().map(|s| s.len()).sum();
        q.consume(first);
        assert_eq!(q.len(), 2 * MAX_SLICES * (1 + HOLD_MIN) - first);
    }
}
