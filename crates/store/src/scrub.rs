//! Scrub: read every data block from every device copy and verify its checksum.

use crate::device::{AlignedBuf, BLOCK_SIZE};
use crate::index::Loc;
use crate::store::Store;
use crate::txn::CollId;

/// One problem found by a scrub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubIssue {
    pub coll: CollId,
    pub object: String,
    pub block: u64,
    pub device: String,
    pub detail: String,
}

/// What a scrub checked and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub objects: u64,
    pub blocks: u64,
    pub bytes_read: u64,
    pub issues: Vec<ScrubIssue>,
}

impl Store {
    /// Verifies every block of every object on every data device (and in memory).
    pub fn scrub(&self) -> ScrubReport {
        let snap = self.sh.colls.copy();
        let mut rep = ScrubReport::default();
        for (c, coll) in &snap.colls {
            for (name, o) in &coll.objects {
                rep.objects += 1;
                for (first, e) in &o.extents {
                    for (i, crc) in e.crcs.iter().enumerate() {
                        rep.blocks += 1;
                        let blk = first + i as u64;
                        self.scrub_block(&mut rep, *c, name, blk, &e.loc, i, *crc);
                    }
                }
            }
        }
        self.scrub_checkpoint(&mut rep);
        rep
    }

    /// Verifies the WAL header and every copy of the current checkpoint (root and pieces).
    /// Issues are reported only if no newer checkpoint replaced it meanwhile (its blocks may
    /// then have been reused).
    fn scrub_checkpoint(&self, rep: &mut ScrubReport) {
        let meta = |device: &str, block: u64, detail: String| ScrubIssue {
            coll: 0,
            object: "<checkpoint>".into(),
            block,
            device: device.to_string(),
            detail,
        };
        let hdr = match self.sh.wal.read_header() {
            Ok(h) => h,
            Err(e) => {
                rep.issues
                    .push(meta(self.sh.wal.dev.name(), 0, e.to_string()));
                return;
            }
        };
        if hdr.ckpt_root_offset == 0 {
            return;
        }
        let mut found = Vec::new();
        for dev in 0..self.sh.data.count() {
            let name = self.sh.data.name(dev).to_string();
            let (off, len) = (hdr.ckpt_root_offset, hdr.ckpt_root_len as usize);
            let Some(root) = self.read_copy(dev, off, len, hdr.ckpt_root_crc, rep) else {
                found.push(meta(
                    &name,
                    0,
                    format!("checkpoint root at offset {off} unreadable or corrupt"),
                ));
                continue;
            };
            let Ok(root) = crate::checkpoint::Root::decode(&root) else {
                found.push(meta(&name, 0, "checkpoint root does not decode".into()));
                continue;
            };
            for (i, &(poff, plen, pcrc)) in root.pieces.iter().enumerate() {
                if self
                    .read_copy(dev, poff, plen as usize, pcrc, rep)
                    .is_none()
                {
                    found.push(meta(
                        &name,
                        i as u64,
                        format!("checkpoint piece at offset {poff} corrupt"),
                    ));
                }
            }
        }
        let same = self
            .sh
            .wal
            .read_header()
            .is_ok_and(|h| h.generation == hdr.generation);
        if same {
            rep.issues.extend(found);
        }
    }

    /// Reads `len` bytes at `off` from device `dev`; `None` unless they match `crc`.
    fn read_copy(
        &self,
        dev: usize,
        off: u64,
        len: usize,
        crc: u32,
        rep: &mut ScrubReport,
    ) -> Option<Vec<u8>> {
        let mut b = AlignedBuf::zeroed(len);
        rep.bytes_read += b.len() as u64;
        self.sh.data.read_from(dev, &mut b, off).ok()?;
        (cairn_crc::crc32c(&b[..len]) == crc).then(|| b[..len].to_vec())
    }

    #[allow(clippy::too_many_arguments)]
    fn scrub_block(
        &self,
        rep: &mut ScrubReport,
        c: CollId,
        name: &[u8],
        blk: u64,
        loc: &Loc,
        i: usize,
        crc: u32,
    ) {
        let issue = |device: String, detail: String| ScrubIssue {
            coll: c,
            object: String::from_utf8_lossy(name).into_owned(),
            block: blk,
            device,
            detail,
        };
        match loc {
            Loc::Mem(m) => {
                let off = m.off + i * BLOCK_SIZE;
                if cairn_crc::crc32c(&m.buf[off..off + BLOCK_SIZE]) != crc {
                    rep.issues
                        .push(issue("memory".into(), "checksum mismatch".into()));
                }
            }
            Loc::Disk(d) => {
                let off = d + (i * BLOCK_SIZE) as u64;
                for dev in 0..self.sh.data.count() {
                    let mut b = AlignedBuf::zeroed(BLOCK_SIZE);
                    rep.bytes_read += BLOCK_SIZE as u64;
                    let problem = match self.sh.data.read_from(dev, &mut b, off) {
                        Err(e) => Some(e.to_string()),
                        Ok(()) if cairn_crc::crc32c(&b) != crc => {
                            Some(format!("checksum mismatch at offset {off}"))
                        }
                        Ok(()) => None,
                    };
                    if let Some(detail) = problem {
                        if self.still_at(c, name, blk, off) {
                            rep.issues
                                .push(issue(self.sh.data.name(dev).to_string(), detail));
                        }
                    }
                }
            }
        }
    }

    /// Whether block `blk` of the object still lives at `off` (not moved by the cleaner).
    fn still_at(&self, c: CollId, name: &[u8], blk: u64, off: u64) -> bool {
        self.sh.colls.with(c, |coll| {
            let Some(o) = coll.and_then(|coll| coll.objects.get(name)) else {
                return false;
            };
            o.extents_in(blk, blk + 1)
                .first()
                .is_some_and(|(_, e)| matches!(e.loc, Loc::Disk(d) if d == off))
        })
    }
}
