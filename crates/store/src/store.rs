//! The store: opening and formatting devices, and the read-side API.
//! The commit path is in [`crate::commit`], background work in [`crate::maint`].

use crate::checkpoint::{self, Root};
use crate::device::{align_up, AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::effect;
use crate::error::{Result, StoreError};
use crate::format::{Role, Superblock, WalHeader};
use crate::index::{ApplyOut, Dirty, Index};
use crate::mirror::{IoCounters, IoStats, Mirror};
use crate::segments::Segments;
use crate::txn::{limits, CollId};
use crate::wal::{self, Next, Replayer, WalRegion};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BLOCK: u64 = BLOCK_SIZE as u64;

/// Tunables. Fields marked "format" are fixed when the devices are formatted.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Format: segment size in bytes (multiple of 4 KiB). Default 4 MiB.
    pub segment_size: u64,
    /// Format: WAL size when the WAL lives on data device 0. Default 256 MiB.
    pub wal_size: u64,
    /// Pending data that triggers a segment write. Default 1 MiB.
    pub flush_batch_bytes: u64,
    /// Most data that may wait in memory for the flusher; commits wait beyond it, and a
    /// transaction may carry at most this much data. Default 16 MiB; at most 1/16 of the data
    /// area is used.
    pub pending_limit_bytes: u64,
    /// Longest time data waits in memory before it is written to a segment. Default 50 ms.
    pub flush_max_delay: Duration,
    /// WAL fill level (percent) that triggers a checkpoint. Default 50.
    pub checkpoint_wal_percent: u8,
    /// A checkpoint is also taken this often when the WAL is not empty. Default 30 s.
    pub checkpoint_interval: Duration,
    /// Serve reads of a mirror from the device that is not flushing. Default true.
    pub read_flush_separation: bool,
    /// Memory for the read cache of data blocks (blocks just flushed and blocks read from the
    /// data devices); 0 turns it off. Default 128 MiB.
    pub read_cache_bytes: u64,
    /// The cleaner starts when fewer segments than this are free. Default 8.
    pub clean_below_free_segments: u32,
    /// Cleaner copy rate while space is not critical, bytes per second. Default 64 MiB/s.
    pub clean_rate: u64,
    /// Segments kept free for the cleaner and checkpoints; writes get ENOSPC before
    /// touching them. Default 4.
    pub reserve_segments: u32,
    /// Writes of whole blocks at least this large go straight to the data devices (data
    /// written once, then only their metadata through the WAL; the WAL batch that carries
    /// them flushes the data devices first) instead of through the WAL and the flusher; 0
    /// turns this off. Default 0: durability then waits for the data device's write and
    /// flush, which pays where it takes large blocks about as fast as the WAL
    /// (docs/operator/store.md).
    pub direct_write_min_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            segment_size: 4 << 20,
            wal_size: 256 << 20,
            flush_batch_bytes: 1 << 20,
            pending_limit_bytes: 16 << 20,
            flush_max_delay: Duration::from_millis(50),
            checkpoint_wal_percent: 50,
            checkpoint_interval: Duration::from_secs(30),
            read_flush_separation: true,
            read_cache_bytes: 128 << 20,
            clean_below_free_segments: 8,
            clean_rate: 64 << 20,
            reserve_segments: 4,
            direct_write_min_bytes: 0,
        }
    }
}

/// The devices of a store.
#[derive(Clone)]
pub struct Devices {
    /// One data device, or two forming a mirror.
    pub data: Vec<Arc<dyn BlockDevice>>,
    /// A separate (fast) WAL device; without it the WAL lives on data device 0.
    pub wal: Option<Arc<dyn BlockDevice>>,
}

/// Counters for benchmarks and `status`.
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    pub data_io: IoStats,
    pub wal_io: IoStats,
    pub commits: u64,
    pub checkpoints: u64,
    pub segments_total: u32,
    pub segments_free: u32,
    /// Bytes of the segment area.
    pub capacity_bytes: u64,
    /// Bytes data and checkpoints may fill before writes fail with `NoSpace` (the segment
    /// area less the reserve for the cleaner, the flusher and checkpoints).
    pub writable_bytes: u64,
    /// Bytes of that in use (live and pending data, checkpoints): at `writable_bytes`, full.
    pub used_bytes: u64,
    /// The read cache (all zero without one).
    pub read_cache: crate::cache::CacheStats,
    pub segments_cleaned: u64,
    pub cleaned_bytes: u64,
    pub live_bytes: u64,
    pub pending_bytes: u64,
    pub checkpoint_bytes: u64,
    pub wal_used_bytes: u64,
    pub wal_size: u64,
    /// Times a commit waited because the flusher was behind (pending data at its limit).
    pub waits_for_flusher: u64,
    /// Times a commit waited for WAL space (a checkpoint to reclaim it).
    pub waits_for_wal_space: u64,
    /// Transactions whose large writes went straight to the data devices (written once, not
    /// through the WAL), and the bytes of those writes.
    pub direct_writes: u64,
    pub direct_bytes: u64,
}

/// Facts about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStat {
    pub size: u64,
    /// Bytes of data blocks held (holes excluded).
    pub allocated: u64,
    pub attrs: usize,
}

pub(crate) struct State {
    /// Threads waiting on `durable_cv`, `space_cv` or a `seq_cv`: notifications are skipped
    /// when there are none (a condvar notify is a system call even with no waiter).
    pub cv_waiters: u32,
    /// The maintenance thread is asleep on `maint_cv` (only then is waking it worth a call).
    pub maint_idle: bool,
    pub index: Index,
    pub segs: Segments,
    pub next_seq: u64,
    pub last_crc: u32,
    pub durable_seq: u64,
    /// Encoded, not yet sealed records waiting for the next batch.
    pub queue: Vec<Vec<u8>>,
    pub queue_bytes: u64,
    pub writing: bool,
    pub tail_lsn: u64,
    pub head_lsn: u64,
    pub header_gen: u64,
    pub dirty: VecDeque<Dirty>,
    pub dirty_since: Option<Instant>,
    pub pending_blocks: u64,
    pub next_id: u64,
    pub failed: Option<String>,
    /// A checkpoint snapshotted the index when this was the next sequence number: batches
    /// end before it (`commit::write_batch`), so that its records end a batch.
    pub cut: Option<u64>,
    /// Where the records before the cut end, once durable: (LSN of the next batch, crc of
    /// the last record), for the checkpoint's replay point.
    pub cut_point: Option<(u64, u32)>,
    /// In-memory extents of direct writes whose jobs are not done: id -> (offset in their
    /// buffer, data-device offset), so that a checkpoint names where they are going.
    pub direct_dest: std::collections::HashMap<u64, (usize, u64)>,
    pub ckpt_wanted: bool,
    pub shutdown: bool,
    pub ckpt_runs: Vec<(u64, u32)>,
    /// Expected size of the next checkpoint's index part (without inline data), in blocks.
    pub ckpt_est_blocks: u64,
    pub last_ckpt: Instant,
    pub commits: u64,
    pub checkpoints: u64,
    pub cleaned_segments: u64,
    pub cleaned_bytes: u64,
    pub waits_for_flusher: u64,
    pub waits_for_wal_space: u64,
    /// Transactions whose large writes went straight to the data devices, and their bytes.
    pub direct_writes: u64,
    pub direct_bytes: u64,
    /// Direct writes applied to the index whose data the next WAL batch writes (and flushes)
    /// before its records.
    pub direct_jobs: Vec<crate::direct::DirectJob>,
    /// The batch being written carries direct writes (it writes and flushes a data device).
    pub writing_direct: bool,
}

/// Condition variables committers wait on, by sequence number.
pub(crate) const SEQ_CVS: usize = 64;

pub(crate) struct Shared {
    pub st: Mutex<State>,
    /// Barrier release, WAL drained while a checkpoint waits, failure.
    pub durable_cv: Condvar,
    /// Committers wait for their record on `seq_cvs[seq % SEQ_CVS]`.
    pub seq_cvs: Vec<Condvar>,
    /// Wakes the maintenance thread.
    pub maint_cv: Condvar,
    /// WAL space was reclaimed.
    pub space_cv: Condvar,
    pub wal: WalRegion,
    pub data: Mirror,
    pub cfg: StoreConfig,
    pub wal_counters: IoCounters,
    pub store_id: [u8; 16],
    /// Blocks of the segment area.
    pub data_blocks: u64,
    /// The tag every WAL record of this store carries.
    pub wal_tag: u32,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops writes after a background failure and wakes everyone waiting.
    pub fn fail(&self, st: &mut State, why: String) {
        if st.failed.is_none() {
            st.failed = Some(why);
        }
        self.durable_cv.notify_all();
        self.seq_cvs.iter().for_each(Condvar::notify_all);
        self.space_cv.notify_all();
        self.maint_cv.notify_all();
    }

    /// The condition variable the committer of record `seq` waits on.
    pub fn seq_cv(&self, seq: u64) -> &Condvar {
        &self.seq_cvs[(seq % SEQ_CVS as u64) as usize]
    }

    /// Largest record the WAL accepts.
    pub fn max_record(&self) -> u64 {
        (self.wal.ring_size / 4).min(limits::TXN_BYTES as u64)
    }

    /// Most data blocks that may wait in memory for the flusher; commits wait beyond it.
    /// Bounds memory and the inline part of a checkpoint. At most 1/16 of the data area, so
    /// that the room kept for checkpoints stays a small part of a small device.
    pub fn pending_limit_blocks(&self) -> u64 {
        let cfg = self.cfg.pending_limit_bytes.max(self.cfg.flush_batch_bytes) / BLOCK_SIZE as u64;
        cfg.min(self.data_blocks / 16).max(1)
    }

    /// Free segments one checkpoint may need: its index part, plus all pending data if it
    /// has to carry that inline (when the flusher could not write it first).
    pub fn ckpt_need_segments(&self, st: &State) -> u64 {
        let seg = st.segs.seg_blocks as u64;
        (st.ckpt_est_blocks + self.pending_limit_blocks()).div_ceil(seg) + 1
    }

    /// Free segments the flusher leaves: room for two checkpoints (a new one is written while
    /// the previous one still holds its segments) and one segment for the cleaner to copy
    /// live blocks into. Writes get ENOSPC before this room is touched.
    pub fn flusher_keep_segments(&self, st: &State) -> u64 {
        2 * self.ckpt_need_segments(st) + 1
    }

    /// Bytes of the WAL ring in use.
    pub fn wal_used(&self, st: &State) -> u64 {
        st.tail_lsn - st.head_lsn + st.queue_bytes
    }
}

/// A local object store on one or two data devices and an optional WAL device.
/// Thread-safe; share it behind an `Arc`.
pub struct Store {
    pub(crate) sh: Arc<Shared>,
    maint: Option<JoinHandle<()>>,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    // SAFETY: getrandom writes at most id.len() bytes into id.
    let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
    if n != id.len() as isize {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        id = (t ^ ((std::process::id() as u128) << 64)).to_le_bytes();
    }
    id
}

/// The crc a WAL's first record chains to: ties records to their store.
fn chain_seed(store_id: &[u8; 16]) -> u32 {
    crc32c::crc32c(store_id)
}

fn write_block(dev: &dyn BlockDevice, bytes: &[u8], off: u64) -> Result<()> {
    dev.write_at(&AlignedBuf::from_slice(bytes), off)
        .map_err(|e| StoreError::io(dev.name(), off, e))
}

fn read_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let mut b = AlignedBuf::zeroed(BLOCK_SIZE);
    dev.read_at(&mut b, 0)
        .map_err(|e| StoreError::io(dev.name(), 0, e))?;
    Superblock::decode(&b).map_err(|reason| StoreError::BadDevice {
        device: dev.name().to_string(),
        reason,
    })
}

impl Store {
    /// Formats the devices as a new, empty store (destroying what they held) and returns
    /// its identity.
    pub fn mkfs(devs: &Devices, cfg: &StoreConfig) -> Result<[u8; 16]> {
        let n = devs.data.len();
        if n == 0 || n > 2 {
            return Err(StoreError::Config(format!(
                "{n} data devices; give 1, or 2 for a mirror"
            )));
        }
        if cfg.segment_size < 16 * BLOCK || !cfg.segment_size.is_multiple_of(BLOCK) {
            return Err(StoreError::Config(
                "segment size must be a multiple of 4 KiB, at least 64 KiB".into(),
            ));
        }
        let id = random_id();
        let size = devs.data.iter().map(|d| d.size()).min().unwrap_or(0);
        let wal_on_data = devs.wal.is_none();
        let wal_size = if wal_on_data {
            align_up(cfg.wal_size)
        } else {
            0
        };
        if wal_on_data && wal_size < 16 * BLOCK {
            return Err(StoreError::Config(
                "WAL size must be at least 64 KiB".into(),
            ));
        }
        let seg_off = BLOCK + wal_size;
        let seg_count = size.saturating_sub(seg_off) / cfg.segment_size;
        let min_segs = min_segments(cfg, seg_count);
        if seg_count < min_segs {
            return Err(StoreError::Config(format!(
                "data device of {size} bytes holds {seg_count} segments of {} bytes; at least {min_segs} \
                 are needed (the reserve for checkpoints and the cleaner, plus room for data); use a \
                 larger device or smaller segments",
                cfg.segment_size
            )));
        }
        for (i, d) in devs.data.iter().enumerate() {
            let sb = Superblock {
                store_id: id,
                role: Role::Data,
                device_index: i as u8,
                data_devices: n as u8,
                device_size: size,
                segment_size: cfg.segment_size,
                segment_offset: seg_off,
                segment_count: seg_count,
                wal_offset: if wal_on_data { BLOCK } else { 0 },
                wal_size,
                created_unix: now_unix(),
            };
            write_block(d.as_ref(), &sb.encode(), 0)?;
        }
        let (wal_dev, wal_off, wal_size) = match &devs.wal {
            Some(w) => {
                let wsize = w.size().saturating_sub(BLOCK);
                if wsize < 16 * BLOCK {
                    return Err(StoreError::Config(
                        "WAL device must hold at least 64 KiB".into(),
                    ));
                }
                let sb = Superblock {
                    store_id: id,
                    role: Role::Wal,
                    device_index: 0,
                    data_devices: n as u8,
                    device_size: w.size(),
                    segment_size: 0,
                    segment_offset: 0,
                    segment_count: 0,
                    wal_offset: BLOCK,
                    wal_size: wsize,
                    created_unix: now_unix(),
                };
                write_block(w.as_ref(), &sb.encode(), 0)?;
                (w.clone(), BLOCK, wsize)
            }
            None => (devs.data[0].clone(), BLOCK, wal_size),
        };
        let region = WalRegion::new(wal_dev.clone(), wal_off, wal_size);
        write_block(wal_dev.as_ref(), &[0u8; BLOCK_SIZE], wal_off)?;
        region.write_header(&WalHeader {
            store_id: id,
            generation: 1,
            replay_seq: 1,
            replay_lsn: 0,
            replay_prev_crc: chain_seed(&id),
            ..Default::default()
        })?;
        for d in &devs.data {
            d.flush().map_err(|e| StoreError::io(d.name(), 0, e))?;
        }
        Ok(id)
    }

    /// Opens a formatted store: loads the last checkpoint and replays the WAL.
    pub fn open(devs: &Devices, cfg: StoreConfig) -> Result<Store> {
        let (data_sb, region) = check_devices(devs)?;
        let hdr = region.read_header()?;
        if hdr.store_id != data_sb.store_id {
            return Err(StoreError::BadDevice {
                device: region.dev.name().to_string(),
                reason: "its WAL header belongs to another store".into(),
            });
        }
        let data = Mirror::new(
            devs.data.clone(),
            cfg.read_flush_separation,
            cfg.read_cache_bytes,
        );
        let mut segs = Segments::new(
            data_sb.segment_offset,
            data_sb.segment_size,
            data_sb.segment_count as u32,
        );
        let mut next_id = 0;
        let (index, mut dirty, ckpt_runs) = load_checkpoint(&data, &hdr, &mut next_id)?;
        index.for_each_disk_extent(|coll, obj, first, e, off| {
            segs.add_live(off, e.nblocks);
            if let Some(s) = segs.seg_of(off) {
                segs.summaries[s as usize].push(crate::segments::Summary {
                    coll,
                    obj: obj.clone(),
                    first_block: first,
                    nblocks: e.nblocks,
                });
            }
        });
        for &(off, n) in &ckpt_runs {
            segs.ckpt_blocks(off, n, true);
        }
        let mut st = State {
            cv_waiters: 0,
            maint_idle: false,
            index,
            segs,
            next_seq: hdr.replay_seq,
            last_crc: hdr.replay_prev_crc,
            durable_seq: hdr.replay_seq.saturating_sub(1),
            queue: Vec::new(),
            queue_bytes: 0,
            writing: false,
            tail_lsn: hdr.replay_lsn,
            head_lsn: hdr.replay_lsn,
            header_gen: hdr.generation,
            dirty: VecDeque::new(),
            dirty_since: None,
            pending_blocks: 0,
            next_id,
            failed: None,
            cut: None,
            cut_point: None,
            direct_dest: std::collections::HashMap::new(),
            ckpt_wanted: false,
            shutdown: false,
            ckpt_runs: ckpt_runs.clone(),
            // The index part only: inline data is counted as pending.
            ckpt_est_blocks: crate::maint::ckpt_estimate(
                (ckpt_runs.iter().map(|r| r.1 as u64 * BLOCK).sum::<u64>())
                    .saturating_sub(dirty.iter().map(|d| d.nblocks as u64 * BLOCK).sum()),
            ),
            last_ckpt: Instant::now(),
            commits: 0,
            checkpoints: 0,
            cleaned_segments: 0,
            cleaned_bytes: 0,
            waits_for_flusher: 0,
            waits_for_wal_space: 0,
            direct_writes: 0,
            direct_bytes: 0,
            direct_jobs: Vec::new(),
            writing_direct: false,
        };
        for d in dirty.drain(..) {
            st.pending_blocks += d.nblocks as u64;
            st.dirty.push_back(d);
        }
        let sh = Arc::new(Shared {
            st: Mutex::new(st),
            durable_cv: Condvar::new(),
            seq_cvs: (0..SEQ_CVS).map(|_| Condvar::new()).collect(),
            maint_cv: Condvar::new(),
            space_cv: Condvar::new(),
            wal: region,
            data,

            cfg,
            wal_counters: IoCounters::default(),
            store_id: hdr.store_id,
            data_blocks: data_sb.segment_count * (data_sb.segment_size / BLOCK),
            wal_tag: wal::store_tag(&hdr.store_id),
        });
        let torn_tail = replay(&sh, &hdr)?;
        if torn_tail {
            // The log ends inside a block (a torn batch): new batches start at the next block,
            // which the next replay could not reach. A checkpoint moves the replay point there.
            crate::maint::checkpoint(&sh)?;
        }
        let maint_sh = sh.clone();
        let maint = std::thread::Builder::new()
            .name("cairn-store-maint".into())
            .spawn(move || crate::maint::run(maint_sh))
            .map_err(|e| StoreError::Config(format!("cannot start the maintenance thread: {e}")))?;
        Ok(Store {
            sh,
            maint: Some(maint),
        })
    }

    /// Flushes everything, writes a final checkpoint and stops background work.
    pub fn close(mut self) -> Result<()> {
        self.stop(true)
    }

    fn stop(&mut self, clean: bool) -> Result<()> {
        {
            let mut st = self.sh.lock();
            st.shutdown = true;
            st.ckpt_wanted = clean;
            self.sh.maint_cv.notify_all();
        }
        if let Some(h) = self.maint.take() {
            let _ = h.join();
        }
        let st = self.sh.lock();
        match &st.failed {
            Some(f) if clean => Err(StoreError::Failed(f.clone())),
            _ => Ok(()),
        }
    }

    /// Reads up to `len` bytes at `offset`; the result is shorter past the end of the object.
    pub fn read(&self, coll: CollId, obj: &[u8], offset: u64, len: u64) -> Result<Vec<u8>> {
        crate::read::read(&self.sh, coll, obj, offset, len, true)
    }

    /// Like [`Store::read`], but every block comes from a device and is verified there,
    /// never from the read cache (scrub: the cache may hold a good copy of a damaged block).
    pub fn read_uncached(
        &self,
        coll: CollId,
        obj: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        crate::read::read(&self.sh, coll, obj, offset, len, false)
    }

    /// Size and allocation of an object.
    pub fn stat(&self, coll: CollId, obj: &[u8]) -> Result<ObjectStat> {
        let st = self.sh.lock();
        let o = lookup(&st.index, coll, obj)?;
        Ok(ObjectStat {
            size: o.size,
            allocated: o.allocated_blocks() * BLOCK,
            attrs: o.attrs.len(),
        })
    }

    /// One attribute of an object.
    pub fn get_attr(&self, coll: CollId, obj: &[u8], name: &[u8]) -> Result<Option<Vec<u8>>> {
        let st = self.sh.lock();
        Ok(lookup(&st.index, coll, obj)?.attrs.get(name).cloned())
    }

    /// All attributes of an object.
    pub fn attrs(&self, coll: CollId, obj: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let st = self.sh.lock();
        let o = lookup(&st.index, coll, obj)?;
        Ok(o.attrs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    /// One collection entry.
    pub fn kv_get(&self, coll: CollId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let st = self.sh.lock();
        let c = st.index.coll(coll).ok_or(StoreError::NoCollection(coll))?;
        Ok(c.kv.get(key).cloned())
    }

    /// Collection entries with keys in `start..end` (all when `end` is `None`), at most `limit`.
    pub fn kv_range(
        &self,
        coll: CollId,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let st = self.sh.lock();
        let c = st.index.coll(coll).ok_or(StoreError::NoCollection(coll))?;
        Ok(c.kv
            .range(start.to_vec()..)
            .take_while(|(k, _)| end.is_none_or(|e| k.as_slice() < e))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    /// All collections, in id order.
    pub fn list_collections(&self) -> Vec<CollId> {
        self.sh.lock().index.colls.keys().copied().collect()
    }

    /// Whether a collection exists.
    pub fn collection_exists(&self, coll: CollId) -> bool {
        self.sh.lock().index.colls.contains_key(&coll)
    }

    /// Object names of a collection in byte order, starting after `after`, at most `limit`.
    /// The order is stable, so a listing can be resumed from its last name.
    pub fn list_objects(
        &self,
        coll: CollId,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>> {
        use std::ops::Bound;
        let st = self.sh.lock();
        let c = st.index.coll(coll).ok_or(StoreError::NoCollection(coll))?;
        let lower: Bound<&[u8]> = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        Ok(c.objects
            .range::<[u8], _>((lower, Bound::Unbounded))
            .take(limit)
            .map(|(k, _)| k.to_vec())
            .collect())
    }

    /// The store's identity (random at mkfs; also in every superblock and WAL header).
    pub fn store_id(&self) -> [u8; 16] {
        self.sh.store_id
    }

    /// Whether making the submitted transactions durable now would wait for a data device:
    /// large writes written once are queued or being written (see `direct.rs`). A caller that
    /// must not block on a data device (an OSD shard's event loop) syncs elsewhere then.
    pub fn sync_waits_for_data_device(&self) -> bool {
        if self.sh.cfg.direct_write_min_bytes == 0 {
            return false; // no direct writes: no lock taken per sync
        }
        let st = self.sh.lock();
        !st.direct_jobs.is_empty() || st.writing_direct
    }

    /// Counters and space usage.
    pub fn stats(&self) -> StoreStats {
        let st = self.sh.lock();
        StoreStats {
            data_io: self.sh.data.counters.get(),
            wal_io: self.sh.wal_counters.get(),
            commits: st.commits,
            checkpoints: st.checkpoints,
            segments_total: st.segs.count(),
            capacity_bytes: self.sh.data_blocks * BLOCK_SIZE as u64,
            writable_bytes: crate::commit::writable_blocks(&self.sh, &st) * BLOCK,
            used_bytes: crate::commit::used_blocks(&st) * BLOCK,
            read_cache: self
                .sh
                .data
                .cache
                .as_ref()
                .map(|c| c.stats())
                .unwrap_or_default(),
            segments_free: st.segs.free_segments(),
            segments_cleaned: st.cleaned_segments,
            cleaned_bytes: st.cleaned_bytes,
            live_bytes: st.segs.live_blocks() * BLOCK,
            pending_bytes: st.pending_blocks * BLOCK,
            checkpoint_bytes: st.segs.ckpt_blocks_total() * BLOCK,
            wal_used_bytes: self.sh.wal_used(&st),
            wal_size: self.sh.wal.ring_size,
            waits_for_flusher: st.waits_for_flusher,
            waits_for_wal_space: st.waits_for_wal_space,
            direct_writes: st.direct_writes,
            direct_bytes: st.direct_bytes,
        }
    }

    /// Writes all pending data and takes a checkpoint now; returns when it is durable.
    pub fn checkpoint(&self) -> Result<()> {
        let mut st = self.sh.lock();
        let target = st.checkpoints + 1;
        st.ckpt_wanted = true;
        self.sh.maint_cv.notify_all();
        while st.checkpoints < target {
            if let Some(f) = &st.failed {
                return Err(StoreError::Failed(f.clone()));
            }
            st.cv_waiters += 1;
            st = self.sh.space_cv.wait(st).unwrap_or_else(|p| p.into_inner());
            st.cv_waiters -= 1;
        }
        Ok(())
    }

    /// Cross-checks the space accounting against the index (for tests): every block an
    /// extent points at must be accounted live in a segment that cannot be reused.
    #[doc(hidden)]
    pub fn check_space_accounting(&self) -> std::result::Result<(), String> {
        let st = self.sh.lock();
        let mut refs = Vec::new();
        st.index
            .for_each_disk_extent(|_, _, _, e, off| refs.push((off, e.nblocks)));
        st.segs.check_refs(&refs)
    }

    /// Where a block of an object is on the data devices, if it has been written there
    /// (for fault-injection tests).
    #[doc(hidden)]
    pub fn block_location(&self, coll: CollId, obj: &[u8], block: u64) -> Option<u64> {
        let st = self.sh.lock();
        let o = st.index.object(coll, obj)?;
        match o.extents_in(block, block + 1).first()?.1.loc {
            crate::index::Loc::Disk(off) => Some(off),
            crate::index::Loc::Mem(_) => None,
        }
    }

    /// The error that stopped the store, if any.
    pub fn failure(&self) -> Option<String> {
        self.sh.lock().failed.clone()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.maint.is_some() {
            let _ = self.stop(false);
        }
    }
}

pub(crate) fn lookup<'a>(
    idx: &'a Index,
    coll: CollId,
    obj: &[u8],
) -> Result<&'a crate::index::Object> {
    let c = idx.coll(coll).ok_or(StoreError::NoCollection(coll))?;
    c.objects
        .get(obj)
        .map(|o| o.as_ref())
        .ok_or_else(|| StoreError::NoObject {
            coll,
            object: String::from_utf8_lossy(obj).into_owned(),
        })
}

/// Segments a store needs: the reserve kept for checkpoints and the cleaner (as
/// `Shared::flusher_keep_segments` computes it for an empty store) plus four for data.
fn min_segments(cfg: &StoreConfig, seg_count: u64) -> u64 {
    let seg = cfg.segment_size / BLOCK;
    let pending = (cfg.pending_limit_bytes.max(cfg.flush_batch_bytes) / BLOCK)
        .min(seg_count * seg / 16)
        .max(1);
    let ckpt_need = (4 + pending).div_ceil(seg) + 1;
    cfg.reserve_segments as u64 + 2 * ckpt_need + 1 + 4
}

fn check_devices(devs: &Devices) -> Result<(Superblock, WalRegion)> {
    let n = devs.data.len();
    if n == 0 || n > 2 {
        return Err(StoreError::Config(format!(
            "{n} data devices; give 1, or 2 for a mirror"
        )));
    }
    let bad = |d: &Arc<dyn BlockDevice>, reason: String| StoreError::BadDevice {
        device: d.name().to_string(),
        reason,
    };
    let first = read_superblock(devs.data[0].as_ref())?;
    check_geometry(&first).map_err(|r| bad(&devs.data[0], r))?;
    for (i, d) in devs.data.iter().enumerate() {
        let sb = read_superblock(d.as_ref())?;
        if sb.role != Role::Data {
            return Err(bad(d, "it is a WAL device, given as a data device".into()));
        }
        if sb.store_id != first.store_id {
            return Err(bad(
                d,
                "it belongs to another store than data device 0".into(),
            ));
        }
        if sb.device_index as usize != i || sb.data_devices as usize != n {
            return Err(bad(
                d,
                format!(
                    "it is data device {} of {}, given as {i} of {n}",
                    sb.device_index, sb.data_devices
                ),
            ));
        }
        let same = (
            sb.segment_size,
            sb.segment_offset,
            sb.segment_count,
            sb.device_size,
        ) == (
            first.segment_size,
            first.segment_offset,
            first.segment_count,
            first.device_size,
        );
        if !same {
            return Err(bad(
                d,
                "its segment geometry differs from data device 0's".into(),
            ));
        }
        if d.size() < sb.device_size {
            return Err(bad(
                d,
                format!(
                    "it is smaller ({}) than formatted ({})",
                    d.size(),
                    sb.device_size
                ),
            ));
        }
    }
    let region = match &devs.wal {
        Some(w) => {
            let sb = read_superblock(w.as_ref())?;
            check_geometry(&sb).map_err(|r| bad(w, r))?;
            if w.size() < sb.wal_offset + sb.wal_size {
                return Err(bad(
                    w,
                    format!(
                        "it is smaller ({}) than its WAL region ends ({})",
                        w.size(),
                        sb.wal_offset + sb.wal_size
                    ),
                ));
            }
            if sb.role != Role::Wal {
                return Err(bad(
                    w,
                    "it is a data device, given as the WAL device".into(),
                ));
            }
            if sb.store_id != first.store_id {
                return Err(bad(w, "it belongs to another store".into()));
            }
            WalRegion::new(w.clone(), sb.wal_offset, sb.wal_size)
        }
        None => {
            if first.wal_offset == 0 {
                return Err(bad(
                    &devs.data[0],
                    "the store was formatted with a separate WAL device; give it".into(),
                ));
            }
            WalRegion::new(devs.data[0].clone(), first.wal_offset, first.wal_size)
        }
    };
    Ok((first, region))
}

/// Rejects superblock geometry that does not fit the device (a checksum-valid but wrong
/// superblock must not make the store compute nonsense offsets).
fn check_geometry(sb: &Superblock) -> std::result::Result<(), String> {
    let min = 16 * BLOCK;
    if sb.wal_offset != 0
        && (sb.wal_size < min
            || !sb.wal_size.is_multiple_of(BLOCK)
            || !sb.wal_offset.is_multiple_of(BLOCK))
    {
        return Err(format!(
            "bad WAL region ({} bytes at {})",
            sb.wal_size, sb.wal_offset
        ));
    }
    if sb.wal_offset.saturating_add(sb.wal_size) > sb.device_size {
        return Err("WAL region beyond the device end".into());
    }
    if sb.role == Role::Data {
        let after_wal = if sb.wal_offset == 0 {
            BLOCK
        } else {
            sb.wal_offset + sb.wal_size
        };
        if sb.segment_offset < after_wal || !sb.segment_offset.is_multiple_of(BLOCK) {
            return Err(format!(
                "segment area at {} overlaps the superblock or WAL",
                sb.segment_offset
            ));
        }
        let seg_ok = sb.segment_size >= min && sb.segment_size.is_multiple_of(BLOCK);
        let end = sb
            .segment_count
            .checked_mul(sb.segment_size)
            .and_then(|x| x.checked_add(sb.segment_offset));
        if !seg_ok || sb.segment_count > u32::MAX as u64 || end.is_none_or(|e| e > sb.device_size) {
            return Err(format!(
                "bad segment geometry ({} segments of {} bytes at {})",
                sb.segment_count, sb.segment_size, sb.segment_offset
            ));
        }
        if sb.data_devices == 0 || sb.data_devices > 2 {
            return Err(format!("{} data devices recorded", sb.data_devices));
        }
    }
    Ok(())
}

/// Reads `len` bytes at `off` from the first device copy whose bytes pass `ok`.
pub(crate) fn read_verified(
    data: &Mirror,
    off: u64,
    len: u64,
    what: &'static str,
    ok: impl Fn(&[u8]) -> bool,
) -> Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(align_up(len) as usize);
    let mut last = None;
    for i in 0..data.count() {
        match data.read_from(i, &mut buf, off) {
            Ok(()) if ok(&buf[..len as usize]) => return Ok(buf),
            Ok(()) => {
                last = Some(StoreError::corrupt(
                    what,
                    data.name(i),
                    off,
                    "checksum mismatch",
                ))
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| StoreError::Config("no data devices".into())))
}

type Loaded = (Index, Vec<Dirty>, Vec<(u64, u32)>);

fn load_checkpoint(data: &Mirror, hdr: &WalHeader, next_id: &mut u64) -> Result<Loaded> {
    if hdr.ckpt_root_offset == 0 {
        return Ok((Index::default(), Vec::new(), Vec::new()));
    }
    let (roff, rlen) = (hdr.ckpt_root_offset, hdr.ckpt_root_len as u64);
    let rbuf = read_verified(data, roff, rlen, "checkpoint root", |b| {
        crc32c::crc32c(b) == hdr.ckpt_root_crc
    })?;
    let root = Root::decode(&rbuf[..rlen as usize])
        .map_err(|e| StoreError::corrupt("checkpoint root", data.name(0), roff, e.0))?;
    let limit = data.device_size();
    if root.total_len > limit {
        return Err(StoreError::corrupt(
            "checkpoint root",
            data.name(0),
            roff,
            "checkpoint larger than the device",
        ));
    }
    let mut body = Vec::with_capacity(root.total_len as usize);
    let mut runs = vec![(roff, (align_up(rlen) / BLOCK) as u32)];
    for &(off, len, crc) in &root.pieces {
        let b = read_verified(data, off, len as u64, "checkpoint piece", |b| {
            crc32c::crc32c(b) == crc
        })?;
        body.extend_from_slice(&b[..len as usize]);
        runs.push((off, (align_up(len as u64) / BLOCK) as u32));
    }
    let d = checkpoint::decode(&body, next_id)
        .map_err(|e| StoreError::corrupt("checkpoint", data.name(0), roff, e.0))?;
    if d.replay_seq != hdr.replay_seq {
        return Err(StoreError::corrupt(
            "checkpoint",
            data.name(0),
            roff,
            format!(
                "covers up to record {}, the WAL header says {}",
                d.replay_seq, hdr.replay_seq
            ),
        ));
    }
    Ok((d.index, d.dirty, runs))
}

/// Replays the WAL into the index; returns whether the log ends inside a block.
fn replay(sh: &Shared, hdr: &WalHeader) -> Result<bool> {
    let mut r = Replayer::new(&sh.wal, hdr, sh.max_record(), sh.wal_tag);
    let mut st = sh.lock();
    while let Next::Txn(rec) = r.next_record()? {
        let effects = effect::decode(wal::payload(&rec), wal::HEADER_LEN)
            .map_err(|e| StoreError::corrupt("WAL record", sh.wal.dev.name(), r.lsn, e.0))?;
        let mut out = ApplyOut::default();
        let st = &mut *st;
        for e in &effects {
            st.index.apply(e, &rec, &mut st.next_id, &mut out);
        }
        // Blocks a record placed were written before it: they are live from here on (at run
        // time they were accounted when allocated).
        for p in &out.placed {
            let end = p.off + p.nblocks as u64 * BLOCK - 1;
            let seg = st.segs.seg_of(p.off);
            if seg.is_none() || seg != st.segs.seg_of(end) {
                return Err(StoreError::corrupt(
                    "WAL record",
                    sh.wal.dev.name(),
                    r.lsn,
                    format!(
                        "record {} places {} blocks at {} on the data devices, outside one segment",
                        r.next_seq, p.nblocks, p.off
                    ),
                ));
            }
            st.segs.replay_place(p.off, p.nblocks);
        }
        crate::commit::account(st, out);
    }
    if r.corruption_follows()? {
        return Err(StoreError::corrupt(
            "WAL record",
            sh.wal.dev.name(),
            r.lsn,
            format!(
                "record {} is damaged but later records are intact: acknowledged writes would be lost; \
                 restore the WAL device or recover the data from replicas",
                r.next_seq
            ),
        ));
    }
    st.segs.end_replay();
    st.next_seq = r.next_seq;
    st.last_crc = r.last_crc;
    st.durable_seq = r.next_seq - 1;
    st.tail_lsn = align_up(r.lsn);
    Ok(!r.lsn.is_multiple_of(BLOCK))
}
