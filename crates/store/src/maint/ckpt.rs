//! Checkpoints: a snapshot of the index written to segments, after which the WAL before it
//! can be reused. Commits never wait for one (`docs/format/store.md`, section 9).

use super::*;
use cairn_failstop::CondvarOrDie;

/// Takes a checkpoint (also used at open, before the thread starts): write pending data,
/// snapshot the index, wait until the records it holds end a durable WAL batch, write it to
/// segments, flush the data devices, then point the WAL header at it and reclaim WAL space.
/// Commits never wait for it: the snapshot is taken under the lock at any time, and the batch
/// writers end a batch at its records (the cut) so that replay can start right after them.
pub(crate) fn checkpoint(sh: &Shared) -> Result<()> {
    flush_all(sh)?;
    let (snap, seq, gen, dest) = {
        // With the table held exclusively no commit is under way (each numbers its record
        // before it releases the table): none is between the snapshot and `seq`. Nor is a
        // relocation by the flusher, the cleaner or a direct write's batch half-accounted.
        let mut table = sh.colls.write();
        let mut st = sh.lock();
        st.ckpt_wanted = false;
        st.segs.snap_started += 1;
        let mut wq = sh.wal_lock();
        let seq = wq.next_seq;
        if !wq.writing && wq.queue.is_empty() {
            wq.cut_point = Some((wq.tail_lsn, wq.last_crc));
        } else {
            wq.cut = Some(seq);
        }
        drop(wq);
        let gen = st.segs.snap_started;
        let dest = st.direct_dest.clone();
        drop(st);
        (crate::colls::snapshot(&mut table), seq, gen, dest)
    };
    let (lsn, prev_crc) = wait_for_cut(sh)?;
    let write_start = Instant::now();
    // The direct writes the snapshot holds in memory are on the data devices by now (their
    // records are durable, and a batch writes and flushes their data first): named there.
    let mut body = BodyWriter::new(sh);
    let mut buf = Vec::with_capacity(PIECE + PIECE / 4);
    let inline_bytes =
        checkpoint::encode_in_pieces(&snap, seq, &dest, &mut buf, PIECE, &mut |v| body.write(v))?;
    drop(snap);
    drop(buf);
    let body_len = body.total as usize;
    // The checkpoint's body written, its root and the WAL header that names it not.
    fail::fail_point!("store_checkpoint_body_written");
    let root = Root {
        generation: gen,
        total_len: body.total,
        pieces: body.pieces,
    };
    let runs = body.runs;
    let root_bytes = root.encode();
    let root_len = root_bytes.len();
    let root_runs = {
        let mut st = sh.lock();
        let blocks = (align_up(root_bytes.len() as u64) / B) as u32;
        // The root is read back in one piece: keep it within one segment.
        if st.segs.ckpt_head_room() < blocks {
            st.segs.close(Head::Ckpt);
        }
        alloc(sh, &mut st, blocks, Use::Ckpt)?
    };
    let root_off = contiguous(&root_runs)?;
    sh.data
        .write(&AlignedBuf::from_slice(&root_bytes), root_off)?;
    let flush_start = Instant::now();
    sh.data.flush()?;
    let flushed = Instant::now();
    let header_gen = sh.lock().header_gen + 1;
    let hdr = WalHeader {
        store_id: sh.store_id,
        generation: header_gen,
        replay_seq: seq,
        replay_lsn: lsn,
        replay_prev_crc: prev_crc,
        ckpt_root_offset: root_off,
        ckpt_root_len: root_bytes.len() as u32,
        ckpt_root_crc: cairn_crc::crc32c(&root_bytes),
    };
    sh.wal.write_header(&hdr)?;
    let mut st = sh.lock();
    st.header_gen = header_gen;
    // Under `st`: committers that wait for WAL room look at it under `st` (and `wq`).
    sh.wal_lock().head_lsn = lsn;
    st.segs.close(Head::Ckpt);
    let old = std::mem::replace(
        &mut st.ckpt_runs,
        runs.into_iter().chain(root_runs).collect(),
    );
    for (off, n) in old {
        st.segs.ckpt_blocks(off, n, false);
    }
    st.ckpt_est_blocks = ckpt_estimate((body_len - inline_bytes) as u64 + root_len as u64);
    st.segs.snap_durable = gen;
    st.segs.release_limbo();
    st.last_ckpt = Instant::now();
    st.checkpoints += 1;
    st.ckpt_write_time += flush_start - write_start;
    st.ckpt_flush_time += flushed - flush_start;
    sh.space_cv.notify_all();
    Ok(())
}

/// Waits until the records before the checkpoint's cut are durable and end a batch; returns
/// where replay resumes: (LSN, crc of the last record before it). Writes the queued batch
/// itself when no one else is writing (records submitted without a waiter).
fn wait_for_cut(sh: &Shared) -> Result<(u64, u32)> {
    let mut wq = sh.wal_lock();
    loop {
        if wq.failed.is_some() {
            wq.cut = None;
            return Err(StoreError::Failed("WAL failed during checkpoint".into()));
        }
        if let Some(p) = wq.cut_point.take() {
            return Ok(p);
        }
        if !wq.writing && !wq.queue.is_empty() {
            wq = crate::commit::write_batch(sh, wq);
            continue;
        }
        wq = sh.durable_cv.wait_or_die(wq);
    }
}

fn contiguous(runs: &[(u64, u32)]) -> Result<u64> {
    match runs {
        [(off, _)] => Ok(*off),
        [(a, an), (b, _), ..] if *b == a + *an as u64 * B => Ok(*a),
        _ => Err(StoreError::Failed(
            "checkpoint root does not fit in one segment run".into(),
        )),
    }
}

/// Writes a checkpoint body as it is encoded: each part handed to it goes to blocks
/// allocated for it, in root pieces of at most [`PIECE`] bytes.
struct BodyWriter<'a> {
    sh: &'a Shared,
    /// One aligned buffer for every piece (a fresh zeroed allocation per piece costs page
    /// faults and page clearing every time); freed with the checkpoint.
    staging: Option<AlignedBuf>,
    /// (data-device offset, length, crc) of each piece, in body order.
    pieces: Vec<(u64, u32, u32)>,
    /// The runs the body occupies.
    runs: Vec<(u64, u32)>,
    total: u64,
}

impl<'a> BodyWriter<'a> {
    fn new(sh: &'a Shared) -> Self {
        BodyWriter {
            sh,
            staging: None,
            pieces: Vec::new(),
            runs: Vec::new(),
            total: 0,
        }
    }

    /// Writes the next part of the body (all of `part`, which it empties).
    fn write(&mut self, part: &mut Vec<u8>) -> Result<()> {
        let blocks = align_up(part.len() as u64) / B;
        let runs = {
            let mut st = self.sh.lock();
            alloc(self.sh, &mut st, blocks as u32, Use::Ckpt)?
        };
        // Counted at once: if a write below fails, the store fails, and these runs are
        // released with the rest of its state when it is opened again.
        self.runs.extend_from_slice(&runs);
        let mut at = 0usize;
        for &(off, n) in &runs {
            let run_bytes = n as usize * BLOCK_SIZE;
            let mut r_at = 0usize;
            while r_at < run_bytes && at < part.len() {
                let len = (run_bytes - r_at).min(PIECE).min(part.len() - at);
                let chunk = &part[at..at + len];
                let doff = off + r_at as u64;
                let buf = AlignedBuf::reuse(&mut self.staging, len);
                buf[..len].copy_from_slice(chunk);
                // The padding to a whole block must not carry an older piece's bytes.
                buf[len..].fill(0);
                self.sh.data.write(buf, doff)?;
                self.pieces
                    .push((doff, len as u32, cairn_crc::crc32c(chunk)));
                at += len;
                r_at += align_up(len as u64) as usize;
            }
        }
        self.total += part.len() as u64;
        part.clear();
        Ok(())
    }
}
