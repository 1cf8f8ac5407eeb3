//! The write-ahead log: a ring of checksummed records on the WAL region (NVM in production).
//!
//! Records are written in group-commit batches. A batch is one write starting at a multiple of
//! the WAL device's write alignment ([`WalRegion::align`]: a block, or 64 bytes on NVM) and
//! padded to the next one with a PAD record; when a batch does not fit before
//! the end of the ring, a WRAP record sends readers back to ring offset 0. Every record carries
//! its sequence number and the crc of the record before it, so replay stops at the first record
//! that is torn, stale (from an earlier lap or an earlier incarnation) or out of sequence.
//! Records are chained and sealed when their batch is laid out; the first record of each batch
//! carries [`FLAG_FIRST_IN_BATCH`], which lets open tell a torn tail from mid-log damage.
//! Format details: `docs/format/store.md`.

use crate::device::{align_up, AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::error::{Result, StoreError};
use crate::format::WalHeader;
use crate::shared::SharedBytes;
use std::sync::Arc;

/// Size of a record header.
pub const HEADER_LEN: usize = 32;
/// Magic of every record ("CWAL").
pub const RECORD_MAGIC: u32 = 0x4C41_5743;
/// Record format version.
pub const RECORD_VERSION: u8 = 1;

/// Record kinds.
pub const KIND_TXN: u8 = 1;
pub const KIND_PAD: u8 = 2;
pub const KIND_WRAP: u8 = 3;
/// Flag of the first record of a batch.
pub const FLAG_FIRST_IN_BATCH: u16 = 1;

const BLOCK: u64 = BLOCK_SIZE as u64;

/// Builds a record: header fields filled, crc left for [`seal_record`].
pub fn record_header(out: &mut Vec<u8>, kind: u8, seq: u64, prev_crc: u32) {
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
    out.push(kind);
    out.push(RECORD_VERSION);
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&prev_crc.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// Sets the sequence number of an encoded record (numbered after it was encoded).
pub fn set_record_seq(rec: &mut [u8], seq: u64) {
    rec[16..24].copy_from_slice(&seq.to_le_bytes());
}

/// Fills in the payload length and crc of the record that starts at `rec[0]`; returns the crc.
pub fn seal_record(rec: &mut [u8]) -> u32 {
    let len = (rec.len() - HEADER_LEN) as u32;
    rec[12..16].copy_from_slice(&len.to_le_bytes());
    let crc = cairn_crc::crc32c(&rec[4..]);
    rec[..4].copy_from_slice(&crc.to_le_bytes());
    crc
}

/// Sets the chaining fields of an encoded record and seals it; returns its crc.
pub fn chain_and_seal(rec: &mut [u8], prev_crc: u32, flags: u16, tag: u32) -> u32 {
    rec[10..12].copy_from_slice(&flags.to_le_bytes());
    rec[24..28].copy_from_slice(&prev_crc.to_le_bytes());
    rec[28..32].copy_from_slice(&tag.to_le_bytes());
    seal_record(rec)
}

/// The store tag records carry (bytes 28..32): ties every record to its store, so records
/// left on a reformatted device are never taken for this store's.
pub fn store_tag(store_id: &[u8; 16]) -> u32 {
    cairn_crc::crc32c(store_id)
}

/// A record header as found on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub crc: u32,
    pub kind: u8,
    pub flags: u16,
    pub len: u32,
    pub seq: u64,
    pub prev_crc: u32,
    /// The store tag ([`store_tag`]).
    pub tag: u32,
}

/// Parses a header; `None` when the bytes are not a record header of this version.
pub fn parse_header(b: &[u8]) -> Option<RecordHeader> {
    if b.len() < HEADER_LEN {
        return None;
    }
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    if u32_at(4) != RECORD_MAGIC || b[9] != RECORD_VERSION {
        return None;
    }
    let kind = b[8];
    if !(KIND_TXN..=KIND_WRAP).contains(&kind) {
        return None;
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&b[16..24]);
    Some(RecordHeader {
        crc: u32_at(0),
        kind,
        flags: u16::from_le_bytes([b[10], b[11]]),
        len: u32_at(12),
        seq: u64::from_le_bytes(seq),
        prev_crc: u32_at(24),
        tag: u32_at(28),
    })
}

/// A complete encoded record, shared with the index (which serves reads of its data).
pub type RecordBuf = Arc<Vec<u8>>;

/// A transaction record waiting for its batch: its encoding with the data payloads left out,
/// and where each goes. The batch writer lays it out in the batch buffer, outside the store
/// lock, copying each payload once, straight from the buffer it arrived in (the committer
/// copies no data under the lock, and there is no per-record copy of it).
#[derive(Default)]
pub struct QueuedRecord {
    /// The record without its payloads.
    pub meta: Vec<u8>,
    /// (offset in `meta` the payload goes at, the payload), in offset order.
    pub payloads: Vec<(usize, SharedBytes)>,
}

impl QueuedRecord {
    /// Length of the whole record.
    pub fn len(&self) -> usize {
        self.meta.len() + self.payloads.iter().map(|(_, p)| p.len()).sum::<usize>()
    }

    /// Whether the record is empty (never, for a real record: it has a header).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the whole record into `out`, which is exactly [`QueuedRecord::len`] bytes.
    pub fn write_into(&self, out: &mut [u8]) {
        let (mut from, mut at) = (0, 0);
        let mut put = |b: &[u8], at: &mut usize| {
            out[*at..*at + b.len()].copy_from_slice(b);
            *at += b.len();
        };
        for (pos, p) in &self.payloads {
            put(&self.meta[from..*pos], &mut at);
            put(p, &mut at);
            from = *pos;
        }
        put(&self.meta[from..], &mut at);
    }
}

impl From<Vec<u8>> for QueuedRecord {
    fn from(meta: Vec<u8>) -> Self {
        QueuedRecord {
            meta,
            payloads: Vec::new(),
        }
    }
}

/// The WAL region of a device: two header slots and the ring.
pub struct WalRegion {
    pub dev: Arc<dyn BlockDevice>,
    base: u64,
    /// Size of the ring in bytes.
    pub ring_size: u64,
    /// Batches start and end at multiples of this (the device's write alignment).
    align: u64,
}

impl WalRegion {
    /// The region at `base` of `size` bytes on `dev`.
    pub fn new(dev: Arc<dyn BlockDevice>, base: u64, size: u64) -> Self {
        // A power of two from 64 (a WRAP record must fit in one) to a block.
        let align = (dev.write_align() as u64)
            .clamp(crate::device::NVM_WRITE_ALIGN as u64, BLOCK)
            .next_power_of_two();
        WalRegion {
            dev,
            base,
            ring_size: size - 2 * BLOCK,
            align,
        }
    }

    /// The alignment of batches: a block on a device written with `O_DIRECT`, 64 bytes on a
    /// byte-addressable one (NVM, tmpfs), where padding every batch to a block would double
    /// the bytes written for a 4 KiB write (its record is a little over 4 KiB).
    pub fn align(&self) -> u64 {
        self.align
    }

    /// `v` rounded up to the batch alignment.
    pub fn align_up(&self, v: u64) -> u64 {
        v.div_ceil(self.align) * self.align
    }

    fn ring_base(&self) -> u64 {
        self.base + 2 * BLOCK
    }

    fn io(&self, off: u64, e: std::io::Error) -> StoreError {
        StoreError::io(self.dev.name(), off, e)
    }

    /// Writes `h` to slot `generation % 2` and flushes.
    pub fn write_header(&self, h: &WalHeader) -> Result<()> {
        let off = self.base + (h.generation % 2) * BLOCK;
        let buf = AlignedBuf::from_slice(&h.encode());
        self.dev.write_at(&buf, off).map_err(|e| self.io(off, e))?;
        self.dev.flush().map_err(|e| self.io(off, e))
    }

    /// Reads both slots and returns the valid one with the highest generation.
    pub fn read_header(&self) -> Result<WalHeader> {
        let mut buf = AlignedBuf::zeroed(2 * BLOCK_SIZE);
        self.dev
            .read_at(&mut buf, self.base)
            .map_err(|e| self.io(self.base, e))?;
        let a = WalHeader::decode(&buf[..BLOCK_SIZE]);
        let b = WalHeader::decode(&buf[BLOCK_SIZE..]);
        match (a, b) {
            (Some(a), Some(b)) => Ok(if a.generation >= b.generation { a } else { b }),
            (Some(h), None) | (None, Some(h)) => Ok(h),
            (None, None) => Err(StoreError::corrupt(
                "WAL header",
                self.dev.name(),
                self.base,
                "both header slots are invalid; the store cannot be opened",
            )),
        }
    }

    /// Writes a buffer at log position `lsn`, both aligned to [`WalRegion::align`] (it must
    /// not cross the ring end).
    pub fn write_at_lsn(&self, buf: &[u8], lsn: u64) -> Result<()> {
        let off = self.ring_base() + lsn % self.ring_size;
        self.dev.write_at(buf, off).map_err(|e| self.io(off, e))
    }

    /// Flushes the WAL device.
    pub fn flush(&self) -> Result<()> {
        self.dev.flush().map_err(|e| self.io(self.base, e))
    }

    /// Bytes from `lsn` to the end of the ring.
    pub fn until_ring_end(&self, lsn: u64) -> u64 {
        self.ring_size - lsn % self.ring_size
    }
}

/// One group-commit batch laid out for writing: an optional WRAP record to write first at
/// `wrap.1`, then `buf` at `lsn`.
pub struct BatchLayout {
    pub wrap: Option<(AlignedBuf, u64)>,
    /// The batch, exactly (its allocation is reused for the next batch).
    pub buf: AlignedBuf,
    pub lsn: u64,
    /// Log position just past the batch (aligned).
    pub end_lsn: u64,
    /// crc of the batch's last transaction record.
    pub last_crc: u32,
}

/// Bytes of ring a batch of `len` record bytes needs at `tail`, including a wrap skip.
pub fn batch_footprint(region: &WalRegion, tail: u64, len: u64) -> u64 {
    let padded = region.align_up(len + HEADER_LEN as u64);
    let room = region.until_ring_end(tail);
    if padded <= room {
        padded
    } else {
        room + padded
    }
}

/// Lays unsealed `records` (sequence numbers `first_seq`..) out at aligned `tail`, chaining
/// them to `prev_crc` and sealing them, then pads the batch to the next aligned position with
/// a PAD record (there is always room for one: the padding is at least a header long).
/// `spare` is the last batch's buffer, reused when large enough.
pub fn layout_batch(
    region: &WalRegion,
    tail: u64,
    records: &[QueuedRecord],
    first_seq: u64,
    prev_crc: u32,
    tag: u32,
    spare: Option<AlignedBuf>,
) -> BatchLayout {
    let len: usize = records.iter().map(|r| r.len()).sum();
    let padded = region.align_up((len + HEADER_LEN) as u64) as usize;
    let mut lsn = tail;
    let mut wrap = None;
    if padded as u64 > region.until_ring_end(tail) {
        let mut w = Vec::with_capacity(BLOCK_SIZE);
        record_header(&mut w, KIND_WRAP, first_seq, prev_crc);
        chain_and_seal(&mut w, prev_crc, 0, tag);
        // One aligned unit: the room before the ring end may be no more.
        w.resize(region.align() as usize, 0);
        wrap = Some((AlignedBuf::copy_of(&w), tail));
        lsn = tail + region.until_ring_end(tail);
    }
    // Every byte of it is written below: records, then the PAD record with its zeros.
    let mut buf = AlignedBuf::recycle(spare, padded);
    let (mut pos, mut crc) = (0, prev_crc);
    for (i, r) in records.iter().enumerate() {
        let rec = &mut buf[pos..pos + r.len()];
        r.write_into(rec);
        let flags = if i == 0 { FLAG_FIRST_IN_BATCH } else { 0 };
        crc = chain_and_seal(rec, crc, flags, tag);
        pos += r.len();
    }
    let mut p = Vec::with_capacity(padded - pos);
    record_header(&mut p, KIND_PAD, first_seq + records.len() as u64, crc);
    p.resize(padded - pos, 0);
    chain_and_seal(&mut p, crc, 0, tag);
    buf[pos..].copy_from_slice(&p);
    BatchLayout {
        wrap,
        buf,
        lsn,
        end_lsn: lsn + padded as u64,
        last_crc: crc,
    }
}

/// Reads records forward from a replay point.
pub struct Replayer<'a> {
    region: &'a WalRegion,
    window: AlignedBuf,
    window_off: u64,
    window_len: u64,
    /// Position of the next record.
    pub lsn: u64,
    /// Sequence number the next transaction record must carry.
    pub next_seq: u64,
    /// crc of the last accepted record.
    pub last_crc: u32,
    max_record: u64,
    tag: u32,
}

const WINDOW: u64 = 1 << 20;

/// What the replayer found at the current position.
pub enum Next {
    /// A valid transaction record (whole record bytes).
    Txn(RecordBuf),
    /// The end of the log (a torn, stale or blank record).
    End,
}

impl<'a> Replayer<'a> {
    /// Starts at the replay point of header `h`.
    pub fn new(region: &'a WalRegion, h: &WalHeader, max_record: u64, tag: u32) -> Self {
        Replayer {
            region,
            window: AlignedBuf::zeroed(0),
            window_off: u64::MAX,
            window_len: 0,
            lsn: h.replay_lsn,
            next_seq: h.replay_seq,
            last_crc: h.replay_prev_crc,
            max_record,
            tag,
        }
    }

    /// Bytes `[off, off+len)` of the ring (must not cross its end).
    fn read(&mut self, off: u64, len: u64) -> Result<&[u8]> {
        let inside = off >= self.window_off && off + len <= self.window_off + self.window_len;
        if !inside {
            let start = off / BLOCK * BLOCK;
            let want = align_up(off + len - start).max(WINDOW);
            let n = want.min(self.region.ring_size - start);
            self.window = AlignedBuf::zeroed(n as usize);
            let dev_off = self.region.ring_base() + start;
            self.region
                .dev
                .read_at(&mut self.window, dev_off)
                .map_err(|e| self.region.io(dev_off, e))?;
            self.window_off = start;
            self.window_len = n;
        }
        let s = (off - self.window_off) as usize;
        Ok(&self.window[s..s + len as usize])
    }

    /// Reads the record at the current position without checking chaining.
    fn peek(&mut self) -> Result<Option<(RecordHeader, Vec<u8>)>> {
        self.peek_at(self.lsn)
    }

    fn peek_at(&mut self, lsn: u64) -> Result<Option<(RecordHeader, Vec<u8>)>> {
        if self.region.until_ring_end(lsn) < HEADER_LEN as u64 {
            return Ok(None);
        }
        let off = lsn % self.region.ring_size;
        let Some(h) = parse_header(self.read(off, HEADER_LEN as u64)?) else {
            return Ok(None);
        };
        let total = HEADER_LEN as u64 + h.len as u64;
        if h.len as u64 > self.max_record || total > self.region.until_ring_end(lsn) {
            return Ok(None);
        }
        let bytes = self.read(off, total)?.to_vec();
        Ok(Some((h, bytes)))
    }

    /// Advances to the next valid transaction record, or reports the end of the log.
    pub fn next_record(&mut self) -> Result<Next> {
        loop {
            let Some((h, bytes)) = self.peek()? else {
                return Ok(Next::End);
            };
            let valid = cairn_crc::crc32c(&bytes[4..]) == h.crc
                && h.seq == self.next_seq
                && h.prev_crc == self.last_crc
                && h.tag == self.tag;
            if !valid {
                return Ok(Next::End);
            }
            match h.kind {
                KIND_TXN => {
                    self.lsn += bytes.len() as u64;
                    self.next_seq += 1;
                    self.last_crc = h.crc;
                    return Ok(Next::Txn(Arc::new(bytes)));
                }
                KIND_PAD => self.lsn += bytes.len() as u64,
                _ => self.lsn += self.region.until_ring_end(self.lsn),
            }
        }
    }

    /// After [`Next::End`]: whether a later batch follows the end point. Batches are written
    /// one after the other, each only once the one before is durable, so a later batch means
    /// the end point was durable once and has been damaged since (a torn write only ever hits
    /// the last batch). Looks at aligned positions up to one ring ahead for the first record
    /// of a batch with a higher sequence number and a valid crc.
    pub fn corruption_follows(&mut self) -> Result<bool> {
        let start = self.region.align_up(self.lsn + 1);
        let mut lsn = start;
        while lsn < self.lsn + self.region.ring_size {
            if let Some((h, b)) = self.peek_at(lsn)? {
                // Records of earlier laps carry lower sequence numbers.
                let later = h.seq >= self.next_seq && h.seq - self.next_seq < 1 << 40;
                if h.kind == KIND_TXN
                    && h.tag == self.tag
                    && h.flags & FLAG_FIRST_IN_BATCH != 0
                    && later
                    && cairn_crc::crc32c(&b[4..]) == h.crc
                {
                    // A batch that did not fit before the ring end starts the next lap behind a
                    // WRAP record written with it: if that WRAP is what is missing, this batch
                    // is the torn one itself, not a later one.
                    let wrapped_self = h.seq == self.next_seq
                        && lsn == self.lsn + self.region.until_ring_end(self.lsn);
                    if !wrapped_self {
                        return Ok(true);
                    }
                }
            }
            lsn += self.region.align();
        }
        Ok(false)
    }
}

/// Payload bytes of a record.
pub fn payload(rec: &[u8]) -> &[u8] {
    &rec[HEADER_LEN..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    fn rec(seq: u64, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        record_header(&mut v, KIND_TXN, seq, 0);
        v.extend_from_slice(body);
        v
    }

    /// Writes a batch; returns (end lsn, last crc, the sealed records as written).
    fn write_batch(
        region: &WalRegion,
        tail: u64,
        recs: &[Vec<u8>],
        first: u64,
        crc: u32,
    ) -> (u64, u32, Vec<Vec<u8>>) {
        let queued: Vec<QueuedRecord> = recs.iter().map(|r| r.clone().into()).collect();
        let b = layout_batch(region, tail, &queued, first, crc, 7, None);
        if let Some((w, l)) = &b.wrap {
            region.write_at_lsn(w, *l).unwrap();
        }
        region.write_at_lsn(&b.buf, b.lsn).unwrap();
        let mut sealed = Vec::new();
        let mut pos = 0;
        for r in recs {
            sealed.push(b.buf[pos..pos + r.len()].to_vec());
            pos += r.len();
        }
        (b.end_lsn, b.last_crc, sealed)
    }

    #[test]
    fn batches_replay_across_wrap_and_stop_at_stale_records() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("wal", 9 * 4096));
        // A ring of 7 blocks: batches of 2 blocks wrap after the third batch.
        let region = WalRegion::new(dev, 0, 9 * 4096);
        let (mut tail, mut crc, mut seq) = (0u64, 0u32, 1u64);
        let mut all = Vec::new();
        let mut crc_before_third = 0;
        for round in 0..5 {
            let recs: Vec<Vec<u8>> = (0..2)
                .map(|i| rec(seq + i, &vec![round as u8; 3000]))
                .collect();
            if round == 2 {
                crc_before_third = crc;
            }
            let (t, c, sealed) = write_batch(&region, tail, &recs, seq, crc);
            (tail, crc) = (t, c);
            all.extend(sealed);
            seq += 2;
        }
        assert!(tail > region.ring_size, "the test must wrap");
        // Replay from the start of the third batch (the first two are overwritten).
        let h = WalHeader {
            replay_seq: 5,
            replay_lsn: 16384,
            replay_prev_crc: crc_before_third,
            ..Default::default()
        };
        let mut r = Replayer::new(&region, &h, 1 << 20, 7);
        let mut got = Vec::new();
        while let Next::Txn(b) = r.next_record().unwrap() {
            got.push(b.to_vec());
        }
        assert_eq!(got.len(), 6);
        assert_eq!(got, all[4..].to_vec());
        assert!(!r.corruption_follows().unwrap());
        assert_eq!(r.next_seq, 11);
    }

    #[test]
    fn records_near_block_ends_replay_and_damage_before_a_later_batch_is_detected() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("wal", 64 * 4096));
        let region = WalRegion::new(dev.clone(), 0, 64 * 4096);
        let (mut tail, mut crc) = (0u64, 0u32);
        // Sizes that make records start in the last bytes of a block.
        let sizes = [4070 - HEADER_LEN, 20, 4090, 1, 8000, 4064];
        for (i, n) in sizes.iter().enumerate() {
            let s = 2 * i as u64 + 1;
            let recs = vec![rec(s, &vec![1; *n]), rec(s + 1, &[2; 7])];
            (tail, crc, _) = write_batch(&region, tail, &recs, s, crc);
        }
        let h = WalHeader {
            replay_seq: 1,
            ..Default::default()
        };
        let mut r = Replayer::new(&region, &h, 1 << 20, 7);
        let mut n = 0;
        while let Next::Txn(_) = r.next_record().unwrap() {
            n += 1;
        }
        assert_eq!(n, 12);
        assert_eq!(r.lsn, tail);
        assert!(!r.corruption_follows().unwrap());
        // Damage the second batch (one block at ring offset 8192: records of 52 and 39 bytes,
        // then the PAD): a later batch exists, so it is corruption, not a torn tail.
        let second = 2 * 4096 + 2 * 4096;
        for (at, stops_at) in [(40, 3), (200, 5)] {
            let mut b = AlignedBuf::zeroed(4096);
            region.dev.read_at(&mut b, second).unwrap();
            b[at] ^= 1;
            region.dev.write_at(&b, second).unwrap();
            let mut r = Replayer::new(&region, &h, 1 << 20, 7);
            while let Next::Txn(_) = r.next_record().unwrap() {}
            assert_eq!(r.next_seq, stops_at);
            assert!(r.corruption_follows().unwrap());
            b[at] ^= 1;
            region.dev.write_at(&b, second).unwrap();
        }
        // Damage in the last batch looks like a torn write: replay just ends there.
        let last = 2 * 4096 + tail - 8192;
        let mut b = AlignedBuf::zeroed(4096);
        region.dev.read_at(&mut b, last).unwrap();
        b[40] ^= 1;
        region.dev.write_at(&b, last).unwrap();
        let mut r = Replayer::new(&region, &h, 1 << 20, 7);
        while let Next::Txn(_) = r.next_record().unwrap() {}
        assert_eq!(r.next_seq, 11);
        assert!(!r.corruption_follows().unwrap());
    }

    #[test]
    fn on_nvm_batches_pack_at_64_bytes_wrap_inside_the_ring_and_damage_is_found() {
        // An 8-block region (a ring of 6 blocks) followed by bytes that must stay untouched:
        // on data device 0 the segment area follows the WAL.
        let nvm = Arc::new(MemDevice::nvm("wal", 16 * 4096));
        let after = AlignedBuf::from_slice(&[0xee; 4096]);
        nvm.write_at(&after, 8 * 4096).unwrap();
        let dev: Arc<dyn BlockDevice> = nvm.clone();
        let region = WalRegion::new(dev, 0, 8 * 4096);
        assert_eq!(region.align(), 64);
        // A 4 KiB write's record is a little over 4 KiB: its batch takes 4,288 bytes, not 8,192.
        let body = 4096 + 100 - HEADER_LEN;
        let (mut tail, mut crc) = (0u64, 0u32);
        // (batch start lsn, first seq, crc before it, sealed record)
        let mut batches = Vec::new();
        let mut spare = None;
        for seq in 1..=14u64 {
            let queued = [QueuedRecord::from(rec(seq, &vec![seq as u8; body]))];
            let b = layout_batch(&region, tail, &queued, seq, crc, 7, spare.take());
            assert_eq!(b.end_lsn - b.lsn, 4288);
            if let Some((w, l)) = &b.wrap {
                assert!(w.len() as u64 <= region.until_ring_end(*l), "the WRAP fits");
                region.write_at_lsn(w, *l).unwrap();
            }
            region.write_at_lsn(&b.buf, b.lsn).unwrap();
            batches.push((b.lsn, seq, crc, b.buf[..HEADER_LEN + body].to_vec()));
            (tail, crc) = (b.end_lsn, b.last_crc);
            spare = Some(b.buf);
        }
        assert!(tail > 2 * region.ring_size, "the test must wrap twice");
        let mut back = AlignedBuf::zeroed(4096);
        nvm.read_at(&mut back, 8 * 4096).unwrap();
        assert_eq!(&back[..], &after[..], "nothing written past the ring");

        // The ring holds the last five batches: replay them.
        let from = |i: usize| WalHeader {
            replay_seq: batches[i].1,
            replay_lsn: batches[i].0,
            replay_prev_crc: batches[i].2,
            ..Default::default()
        };
        let h = from(9);
        let mut r = Replayer::new(&region, &h, 1 << 20, 7);
        let mut got = Vec::new();
        while let Next::Txn(b) = r.next_record().unwrap() {
            got.push(b.to_vec());
        }
        let want: Vec<Vec<u8>> = batches[9..].iter().map(|b| b.3.clone()).collect();
        assert_eq!(got, want);
        assert_eq!(r.lsn, tail);
        assert!(!r.corruption_follows().unwrap());

        // Damage the second-to-last batch: the last one starts off a block boundary, so only
        // a scan at the WAL's alignment finds it and calls it corruption, not a torn tail.
        let (victim, last) = (&batches[12], &batches[13]);
        assert_ne!(
            last.0 % region.ring_size % 4096,
            0,
            "the test needs an unaligned batch"
        );
        let off = 2 * 4096 + victim.0 % region.ring_size + 1000;
        let base = off / 4096 * 4096;
        let mut b = AlignedBuf::zeroed(4096);
        nvm.read_at(&mut b, base).unwrap();
        b[(off - base) as usize] ^= 4;
        nvm.write_at(&b, base).unwrap();
        let mut r = Replayer::new(&region, &h, 1 << 20, 7);
        while let Next::Txn(_) = r.next_record().unwrap() {}
        assert_eq!(r.next_seq, victim.1);
        assert!(r.corruption_follows().unwrap());
    }
}
