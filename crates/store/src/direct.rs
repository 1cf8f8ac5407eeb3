//! Large writes written once: a write of whole blocks of at least
//! [`StoreConfig::direct_write_min_bytes`](crate::StoreConfig) goes straight to its place in a
//! segment of its own append point, and only its metadata (where, and one crc per block) goes
//! through the WAL, as [`Effect::PlaceBlocks`](crate::effect::Effect::PlaceBlocks).
//!
//! Order, for crash safety: allocate (under the lock), write the data (outside it), then log
//! the effect like any other; the batch that carries the record flushes the data devices
//! before it writes the WAL. A crash before the record is durable leaves blocks no record
//! names, in space the next open counts free; the record is never durable before its data. Small writes keep the WAL path: on NVM a WAL write costs far
//! less than a data-device flush.

use crate::device::{AlignedBuf, BLOCK_SIZE};
use crate::error::Result;
use crate::index::block_crcs;
use crate::maint::{alloc, Use};
use crate::store::{Shared, State};
use crate::txn::{Op, Transaction};

const B: u64 = BLOCK_SIZE as u64;
/// Largest staging buffer a thread keeps between direct writes.
const KEEP_STAGING: usize = 4 << 20;

thread_local! {
    /// The committing thread's staging buffer for direct writes.
    static STAGING: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Where one direct write went: runs of (byte offset, blocks) on the data devices, in object
/// block order, and the crc of every block.
#[derive(Debug)]
pub(crate) struct Placement {
    pub runs: Vec<(u64, u32)>,
    pub crcs: Box<[u32]>,
}

/// Placements of a transaction's ops, by op index (`None`: the op takes the WAL path).
pub(crate) type Placements = Vec<Option<Placement>>;

/// Whether `op` is a write that goes straight to the data devices.
pub(crate) fn is_direct(op: &Op, min_bytes: u64) -> bool {
    match op {
        Op::Write { offset, data, .. } => {
            let len = data.len() as u64;
            min_bytes > 0 && len >= min_bytes && offset.is_multiple_of(B) && len.is_multiple_of(B)
        }
        _ => false,
    }
}

/// Writes the transaction's large writes to newly allocated blocks and makes them durable.
/// Returns no placements when the transaction has no such write, or when space is short (the
/// WAL path then admits or refuses the data as usual). The blocks are accounted live and held
/// from the cleaner until [`settle`] is called with the lock held.
pub(crate) fn place(sh: &Shared, txn: &Transaction) -> Result<Placements> {
    let min = sh.cfg.direct_write_min_bytes;
    if !txn.ops.iter().any(|op| is_direct(op, min)) {
        return Ok(Vec::new());
    }
    let mut placed: Placements = Vec::with_capacity(txn.ops.len());
    {
        let mut st = sh.lock();
        if let Some(f) = &st.failed {
            return Err(crate::StoreError::Failed(f.clone()));
        }
        // Refuse what the commit would refuse before writing anything.
        crate::commit::validate(&st.index, txn, &[])?;
        for op in &txn.ops {
            let Op::Write { data, .. } = op else {
                placed.push(None);
                continue;
            };
            if !is_direct(op, min) {
                placed.push(None);
                continue;
            }
            let blocks = data.len() as u64 / B;
            match alloc(sh, &mut st, blocks as u32, Use::Direct) {
                Ok(runs) => {
                    st.segs.in_flight(&runs, true);
                    placed.push(Some(Placement {
                        runs,
                        crcs: Box::new([]),
                    }));
                }
                // Free segments ran short but dead blocks wait for the cleaner: the WAL path
                // takes the data (and the flusher makes room). Without that room at all, the
                // write is refused here, before anything is written.
                Err(_) => {
                    let avail = crate::commit::available_blocks(sh, &st);
                    if avail < blocks {
                        settle(&mut st, &placed, false);
                        return Err(crate::StoreError::NoSpace {
                            needed: blocks * B,
                            available: avail * B,
                        });
                    }
                    placed.push(None);
                }
            }
        }
    }
    if let Err(e) = write_placed(sh, txn, &mut placed) {
        let mut st = sh.lock();
        settle(&mut st, &placed, false);
        return Err(e);
    }
    Ok(placed)
}

/// Writes every placed op's data over its runs. The flush that makes them durable is the
/// group commit's: the batch that carries their record flushes the data devices before it is
/// written (`commit::write_batch`), so concurrent large writes share one flush.
fn write_placed(sh: &Shared, txn: &Transaction, placed: &mut Placements) -> Result<()> {
    let mut bytes = 0u64;
    for (op, p) in txn.ops.iter().zip(placed.iter_mut()) {
        let (Op::Write { data, .. }, Some(p)) = (op, p) else {
            continue;
        };
        p.crcs = block_crcs(data);
        STAGING.with_borrow_mut(|slot| -> Result<()> {
            // O_DIRECT needs an aligned buffer: the one copy of the payload on this path,
            // into a buffer kept from the last write (a fresh one costs page faults each time).
            let buf = AlignedBuf::reuse(slot, data.len());
            buf.copy_from_slice(data);
            let mut at = 0usize;
            for &(off, n) in &p.runs {
                let len = n as usize * BLOCK_SIZE;
                sh.data.write_data(&buf[at..at + len], off)?;
                at += len;
            }
            if data.len() > KEEP_STAGING {
                *slot = None;
            }
            Ok(())
        })?;
        bytes += data.len() as u64;
    }
    if bytes > 0 {
        let mut st = sh.lock();
        st.data_unflushed = true;
        st.direct_writes += 1;
        st.direct_bytes += bytes;
    }
    Ok(())
}

/// Ends the hold on placed blocks: once their effects are in the index (`applied`), or by
/// freeing them when the transaction was refused after all.
pub(crate) fn settle(st: &mut State, placed: &Placements, applied: bool) {
    for p in placed.iter().flatten() {
        st.segs.in_flight(&p.runs, false);
        if !applied {
            for &(off, n) in &p.runs {
                st.segs.free_live(off, n);
            }
        }
    }
}
