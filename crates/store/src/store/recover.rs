//! Recovery at open: the last checkpoint is loaded, then the WAL replayed after it.

use crate::checkpoint::{self, Root};
use crate::device::{align_up, BLOCK_SIZE};
use crate::effect;
use crate::error::{Result, StoreError};
use crate::format::WalHeader;
use crate::index::{ApplyOut, Dirty, Index};
use crate::mirror::Mirror;
use crate::read::read_verified;
use crate::wal::{self, Next, Replayer};

use super::{Shared, State};

const BLOCK: u64 = BLOCK_SIZE as u64;

type Loaded = (Index, Vec<Dirty>, Vec<(u64, u32)>);

pub(super) fn load_checkpoint(data: &Mirror, hdr: &WalHeader, next_id: &mut u64) -> Result<Loaded> {
    if hdr.ckpt_root_offset == 0 {
        return Ok((Index::default(), Vec::new(), Vec::new()));
    }
    let (roff, rlen) = (hdr.ckpt_root_offset, hdr.ckpt_root_len as u64);
    let rbuf = read_verified(data, roff, rlen, "checkpoint root", |b| {
        cairn_crc::crc32c(b) == hdr.ckpt_root_crc
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
            cairn_crc::crc32c(b) == crc
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
pub(super) fn replay(sh: &Shared, hdr: &WalHeader) -> Result<bool> {
    let mut r = Replayer::new(&sh.wal, hdr, sh.max_record(), sh.wal_tag);
    // Nothing else runs yet: the whole index is replayed into at once, then put back.
    let mut table = sh.colls.write();
    let mut index = crate::colls::take_index(&mut table);
    let mut st = sh.lock();
    let replayed = replay_records(sh, &mut r, &mut index, &mut st);
    crate::colls::put_index(&mut table, index);
    replayed?;
    drop(table);
    st.segs.end_replay();
    let mut wq = sh.wal_lock();
    wq.next_seq = r.next_seq;
    wq.last_crc = r.last_crc;
    wq.durable_seq = r.next_seq - 1;
    wq.written_seq = wq.durable_seq;
    wq.tail_lsn = sh.wal.align_up(r.lsn);
    Ok(!r.lsn.is_multiple_of(sh.wal.align()))
}

/// Applies the log's records to the index and accounts their space, one after the other.
fn replay_records(
    sh: &Shared,
    r: &mut Replayer<'_>,
    index: &mut Index,
    st: &mut State,
) -> Result<()> {
    while let Next::Txn(rec) = r.next_record()? {
        let effects = effect::decode(wal::payload(&rec), wal::HEADER_LEN)
            .map_err(|e| StoreError::corrupt("WAL record", sh.wal.dev.name(), r.lsn, e.0))?;
        let mut out = ApplyOut::default();
        for e in &effects {
            index.apply(e, &rec, &sh.next_id, &mut out);
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
    Ok(())
}
