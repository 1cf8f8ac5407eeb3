//! Formatting devices (`mkfs`) and opening a store: device and geometry checks, then the
//! checkpoint load and WAL replay of `recover.rs`, then the maintenance thread.

use crate::device::{align_up, AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::error::{Result, StoreError};
use crate::format::{Role, Superblock, WalHeader};
use crate::mirror::{IoCounters, Mirror};
use crate::segments::Segments;
use crate::store::WalQueue;
use crate::wal::{self, WalRegion};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::recover::{load_checkpoint, replay};
use super::{Devices, Shared, State, Store, StoreConfig, SEQ_CVS};

const BLOCK: u64 = BLOCK_SIZE as u64;

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
    cairn_crc::crc32c(store_id)
}

fn write_block(dev: &dyn BlockDevice, bytes: &[u8], off: u64) -> Result<()> {
    dev.write_at(&AlignedBuf::from_slice(bytes), off)
        .map_err(|e| StoreError::io(dev.name(), off, e))
}

fn read_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let mut b = AlignedBuf::zeroed(BLOCK_SIZE);
    dev.read_at(&mut b, 0)
        .map_err(|e| StoreError::io(dev.name(), 0, e))?;
    Superblock::decode(&b).map_err(|e| StoreError::BadDevice {
        device: dev.name().to_string(),
        reason: e.to_string(),
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
            flusher_idle: false,
            flusher_short: false,
            flush_rounds: 0,
            segs,
            header_gen: hdr.generation,
            dirty: VecDeque::new(),
            dirty_since: None,
            pending_blocks: 0,
            failed: None,
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
            ckpt_write_time: Duration::ZERO,
            ckpt_flush_time: Duration::ZERO,
            cleaned_segments: 0,
            cleaned_bytes: 0,
            waits_for_flusher: 0,
            waits_for_wal_space: 0,
            direct_writes: 0,
            direct_bytes: 0,
        };
        let wq = WalQueue {
            cv_waiters: 0,
            failed: None,
            next_seq: hdr.replay_seq,
            last_crc: hdr.replay_prev_crc,
            durable_seq: hdr.replay_seq.saturating_sub(1),
            written_seq: hdr.replay_seq.saturating_sub(1),
            unflushed_since: None,
            queue: Vec::new(),
            queue_bytes: 0,
            reserved_bytes: 0,
            writing: false,
            batch_spare: None,
            tail_lsn: hdr.replay_lsn,
            head_lsn: hdr.replay_lsn,
            cut: None,
            cut_point: None,
            direct_jobs: Vec::new(),
            writing_direct: false,
        };
        for d in dirty.drain(..) {
            st.pending_blocks += d.nblocks as u64;
            st.dirty.push_back(d);
        }
        let sh = Arc::new(Shared {
            colls: crate::colls::Colls::new(index),
            next_id: std::sync::atomic::AtomicU64::new(next_id),
            st: Mutex::new(st),
            wq: Mutex::new(wq),
            durable_cv: Condvar::new(),
            seq_cvs: (0..SEQ_CVS).map(|_| Condvar::new()).collect(),
            maint_cv: Condvar::new(),
            flush_cv: Condvar::new(),
            space_cv: Condvar::new(),
            wal: region,
            data,

            cfg,
            wal_counters: IoCounters::default(),
            store_id: hdr.store_id,
            data_blocks: data_sb.segment_count * (data_sb.segment_size / BLOCK),
            wal_tag: wal::store_tag(&hdr.store_id),
            copies: Default::default(),
            lock_waits: Default::default(),
            wal_lock_waits: Default::default(),
        });
        let torn_tail = replay(&sh, &hdr)?;
        if torn_tail {
            // The log ends inside a block (a torn batch): new batches start at the next block,
            // which the next replay could not reach. A checkpoint moves the replay point there.
            crate::maint::checkpoint(&sh)?;
        }
        let spawn = |name: &str, f: fn(Arc<Shared>)| {
            let sh = sh.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(sh))
                .map_err(|e| StoreError::Config(format!("cannot start the {name} thread: {e}")))
        };
        let maint = spawn("cairn-store-maint", crate::maint::run)?;
        let mut store = Store {
            sh: sh.clone(),
            threads: vec![maint],
        };
        // On failure, dropping `store` stops the maintenance thread.
        store
            .threads
            .push(spawn("cairn-store-flush", crate::maint::run_flusher)?);
        Ok(store)
    }
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
    check_geometry(&first).map_err(|r| bad(&devs.data[0], r.to_string()))?;
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
            check_geometry(&sb).map_err(|r| bad(w, r.to_string()))?;
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

/// Superblock geometry that does not fit the device.
#[derive(Debug, thiserror::Error)]
enum BadGeometry {
    #[error("bad WAL region ({size} bytes at {offset})")]
    Wal { size: u64, offset: u64 },
    #[error("WAL region beyond the device end")]
    WalBeyondEnd,
    #[error("segment area at {0} overlaps the superblock or WAL")]
    SegmentOverlap(u64),
    #[error("bad segment geometry ({count} segments of {size} bytes at {offset})")]
    Segments { count: u64, size: u64, offset: u64 },
    #[error("{0} data devices recorded")]
    DataDevices(u8),
}

/// Rejects superblock geometry that does not fit the device (a checksum-valid but wrong
/// superblock must not make the store compute nonsense offsets).
fn check_geometry(sb: &Superblock) -> std::result::Result<(), BadGeometry> {
    let min = 16 * BLOCK;
    if sb.wal_offset != 0
        && (sb.wal_size < min
            || !sb.wal_size.is_multiple_of(BLOCK)
            || !sb.wal_offset.is_multiple_of(BLOCK))
    {
        return Err(BadGeometry::Wal {
            size: sb.wal_size,
            offset: sb.wal_offset,
        });
    }
    if sb.wal_offset.saturating_add(sb.wal_size) > sb.device_size {
        return Err(BadGeometry::WalBeyondEnd);
    }
    if sb.role == Role::Data {
        let after_wal = if sb.wal_offset == 0 {
            BLOCK
        } else {
            sb.wal_offset + sb.wal_size
        };
        if sb.segment_offset < after_wal || !sb.segment_offset.is_multiple_of(BLOCK) {
            return Err(BadGeometry::SegmentOverlap(sb.segment_offset));
        }
        let seg_ok = sb.segment_size >= min && sb.segment_size.is_multiple_of(BLOCK);
        let end = sb
            .segment_count
            .checked_mul(sb.segment_size)
            .and_then(|x| x.checked_add(sb.segment_offset));
        if !seg_ok || sb.segment_count > u32::MAX as u64 || end.is_none_or(|e| e > sb.device_size) {
            return Err(BadGeometry::Segments {
                count: sb.segment_count,
                size: sb.segment_size,
                offset: sb.segment_offset,
            });
        }
        if sb.data_devices == 0 || sb.data_devices > 2 {
            return Err(BadGeometry::DataDevices(sb.data_devices));
        }
    }
    Ok(())
}
