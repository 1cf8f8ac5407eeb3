//! The cleaner: moves the live blocks of the emptiest segment to the head so the segment can
//! be reused.

use super::*;

/// Moves the live blocks of the emptiest segment to the head so it can be reused.
pub(super) fn clean_one(sh: &Shared, throttle: bool) -> Result<()> {
    let started = Instant::now();
    // Only this thread cleans or releases segments: the victim stays what it is while its
    // summaries are looked up in the collections with `st` released.
    let (victim, summaries, seg_start, seg_end) = {
        let st = sh.lock();
        let Some(victim) = st.segs.clean_candidate() else {
            return Ok(());
        };
        let start = st.segs.seg_offset(victim);
        let end = start + st.segs.seg_blocks as u64 * B;
        (
            victim,
            st.segs.summaries[victim as usize].clone(),
            start,
            end,
        )
    };
    let pieces = live_pieces(sh, &summaries, seg_start, seg_end);
    drop(summaries);
    let runs = {
        let mut st = sh.lock();
        let total: u32 = pieces.iter().map(|p| p.nblocks).sum();
        if total > 0 {
            alloc(sh, &mut st, total, Use::Clean)?
        } else {
            Vec::new()
        }
    };
    let total: u64 = pieces.iter().map(|p| p.nblocks as u64).sum();
    let mut buf = AlignedBuf::zeroed((total * B) as usize);
    let mut at = 0;
    for p in &pieces {
        let LocMatch::Disk(off) = p.from else {
            continue;
        };
        let n = p.nblocks as usize * BLOCK_SIZE;
        // Raw copy: a corrupt block stays detectably corrupt under its old crc.
        let dev = sh.data.pick_reader();
        sh.data.read_from(dev, &mut buf[at..at + n], off)?;
        at += n;
    }
    write_runs(sh, &buf, &runs)?;
    // A moved block stays cached if it was: the cleaner picks segments by how little they
    // hold, not by how cold it is, and a hot block must not drop out of the cache for it.
    if let Some(c) = &sh.data.cache {
        cache_written(sh, &buf, &pieces, &runs, |p, rel| match p.from {
            LocMatch::Disk(src) => c.contains(src + rel * B),
            LocMatch::Mem { .. } => false,
        });
    }
    // Pointed at their new place and accounted under one hold of the collections' table
    // (a checkpoint's snapshot sees them before they moved or after they were accounted).
    // The cleaner's pieces are all on a data device (`LocMatch::Disk`).
    let moves = moves_over_runs(&pieces, &runs, &mut 0);
    let table = sh.colls.read();
    let moved = relocate_all(sh, &table, &moves);
    let mut guard = sh.lock();
    let st = &mut *guard;
    for (m, moved) in moves.iter().zip(moved) {
        account_moved(sh, st, m, &moved);
        if let LocMatch::Disk(old) = m.from {
            for &(rel, k) in &moved {
                st.segs.free_live(old + rel * B, k);
            }
        }
    }
    drop(table);
    st.cleaned_segments += 1;
    st.cleaned_bytes += total * B;
    if st.segs.live_in(victim) != 0 {
        return Err(StoreError::Failed(format!(
            "segment {victim} still holds {} live blocks after cleaning (accounting bug)",
            st.segs.live_in(victim)
        )));
    }
    drop(guard);
    if throttle && sh.cfg.clean_rate > 0 {
        let budget = Duration::from_secs_f64((total * B) as f64 / sh.cfg.clean_rate as f64);
        if let Some(rest) = budget.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(())
}

fn push_run(out: &mut Vec<Piece>, sum: &Summary, run: Option<(u64, u64, u32)>) {
    if let Some((first, disk, nblocks)) = run {
        out.push(Piece {
            cache: false,
            coll: sum.coll,
            obj: sum.obj.clone(),
            first,
            nblocks,
            from: LocMatch::Disk(disk),
            data: Arc::new(Vec::new()),
            data_off: 0,
        });
    }
}

/// The still-live extents of a segment (`seg_start..seg_end`), found through its summaries.
fn live_pieces(sh: &Shared, summaries: &[Summary], seg_start: u64, seg_end: u64) -> Vec<Piece> {
    let table = sh.colls.read();
    let mut out: Vec<Piece> = Vec::new();
    // Summaries of one segment may overlap (a range rewritten into the same segment), so
    // blocks are taken once each, as runs of blocks not seen before.
    let mut seen = std::collections::HashSet::new();
    for_each_by_collection(
        summaries,
        |s| s.coll,
        |coll, group| {
            let Some(slot) = table.get(&coll) else { return };
            let g = sh.colls.lock_background(slot);
            let Some(c) = g.as_ref() else { return };
            for &k in group {
                live_runs(&summaries[k], c, seg_start, seg_end, &mut seen, &mut out);
            }
        },
    );
    out
}

/// The still-live runs in `seg_start..seg_end` of one summary's blocks not `seen` yet.
fn live_runs(
    sum: &Summary,
    c: &crate::index::Collection,
    seg_start: u64,
    seg_end: u64,
    seen: &mut std::collections::HashSet<u64>,
    out: &mut Vec<Piece>,
) {
    let Some(o) = c.objects.get(&sum.obj[..]) else {
        return;
    };
    for (blk, e) in o.extents_in(sum.first_block, sum.first_block + sum.nblocks as u64) {
        let Loc::Disk(d) = e.loc else { continue };
        if d < seg_start || d >= seg_end {
            continue;
        }
        let mut run: Option<(u64, u64, u32)> = None; // (object block, disk offset, blocks)
        for k in 0..e.nblocks as u64 {
            let fresh = seen.insert(d + k * B);
            match (&mut run, fresh) {
                (Some(r), true) => r.2 += 1,
                (None, true) => run = Some((blk + k, d + k * B, 1)),
                (Some(_), false) => push_run(out, sum, run.take()),
                (None, false) => {}
            }
        }
        push_run(out, sum, run);
    }
}
