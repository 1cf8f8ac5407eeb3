//! A volume's snapshot table: object `vsnaps.<id>`, versioned and checksummed
//! (docs/format/volume.md, "Snapshots"), and the names of the clone objects that keep a data
//! object's bytes as a snapshot saw them. The table also carries the volume's QoS limits:
//! every process serving the volume already polls and acknowledges it, so a change applies
//! live and `vol qos set` knows when it has.
//!
//! Every change of the table raises its `generation`; the processes that have the volume open
//! adopt each generation and say so in their open lease (`acked_gen`), which is what `vol snap`
//! commands wait for. The decoder is fuzzed (`fuzz/fuzz_targets/volume_snaps.rs`).

use crate::decode_error::{DecodeError, Lengths, Record};
use crate::header::{decoded_name, size_ok};

const MAGIC: &[u8; 8] = b"CAIRNSNP";
/// Snapshot table format version this code writes and reads.
pub const SNAPS_VERSION: u16 = 1;
/// Most snapshots of one volume.
pub const MAX_SNAPS: usize = 256;
/// Most removed snapshot ids whose clones are still kept for older snapshots.
pub const MAX_RETIRED: usize = 1024;
/// Bytes before the entries: magic, version, reserved, generation, seq, counts.
const FIXED_LEN: usize = 8 + 2 + 2 + 8 + 8 + 2 + 2;
/// Bytes of an entry before its name: id, created, size, flags, name length.
const ENTRY_FIXED: usize = 8 + 8 + 8 + 2 + 1;
/// Bytes of the QoS limits after the retired ids.
const QOS_LEN: usize = 4 * 8;
/// Largest parent link after the QoS limits: present flag, ids, overlap, two names.
const PARENT_MAX: usize = 1 + 3 * 8 + 2 * (1 + crate::header::MAX_NAME);
/// Largest encoded table (readers ask for no more).
pub const MAX_SNAPS_LEN: usize = FIXED_LEN
    + MAX_SNAPS * (ENTRY_FIXED + crate::header::MAX_NAME)
    + MAX_RETIRED * 8
    + QOS_LEN
    + PARENT_MAX
    + 4;

/// Entry flag: `vol snap protect`; the snapshot cannot be removed.
const FLAG_PROTECTED: u16 = 1;
/// Entry flag: every holder knew the snapshot before writes began to preserve data for it.
const FLAG_ACTIVE: u16 = 2;

/// Prefix of snapshot table object names: `vsnaps.<id:016x>`.
pub const SNAPS_PREFIX: &str = "vsnaps.";
/// Prefix of clone object names: `vclone.<id:016x>.<objno:016x>.<snap:016x>`.
pub const CLONE_PREFIX: &str = "vclone.";

/// One snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snap {
    /// Ids grow with every snapshot of the volume (1, 2, ...), never reused.
    pub id: u64,
    pub name: String,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
    /// The volume's size when the snapshot was taken.
    pub size: u64,
    /// Protected snapshots cannot be removed.
    pub protected: bool,
    /// Whether writes preserve data for it (the second step of `vol snap create`); an inactive
    /// snapshot is being created (or its creation was interrupted) and cannot be read.
    pub active: bool,
}

/// A volume's snapshot table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapTable {
    /// Raised by every change; holders acknowledge the generation they adopted.
    pub generation: u64,
    /// The last snapshot id handed out.
    pub seq: u64,
    /// The snapshots, by id.
    pub snaps: Vec<Snap>,
    /// Ids of removed snapshots whose clone objects may still hold data older snapshots read.
    pub retired: Vec<u64>,
    /// I/O limits where the volume is served.
    pub qos: Qos,
    /// Of a clone (`vol clone`): the snapshot its unwritten data objects are read from, until
    /// `vol flatten` copies them.
    pub parent: Option<ParentLink>,
}

/// Where a clone's data comes from until it is flattened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentLink {
    /// The parent volume's id (a volume removed and re-created under its name is another).
    pub volume_id: u64,
    /// The parent snapshot's id.
    pub snap_id: u64,
    /// Bytes of the parent snapshot the clone reads (its size at cloning).
    pub overlap: u64,
    /// The parent volume's name (same pool), to open it.
    pub volume: String,
    /// The parent snapshot's name.
    pub snap: String,
}

/// A volume's I/O limits, enforced by each process serving it (0: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Qos {
    /// Requests (reads, writes, zeroes, trims) per second.
    pub iops: u64,
    /// Bytes read and written per second.
    pub bps: u64,
    /// Requests that may run at once above the rate after a quiet spell (0: one second's).
    pub iops_burst: u64,
    /// Bytes likewise (0: one second's).
    pub bps_burst: u64,
}

impl Qos {
    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.iops > 0 || self.bps > 0
    }
}

impl SnapTable {
    /// The newest active snapshot: what writes preserve data for.
    pub fn latest_active(&self) -> Option<u64> {
        self.snaps.iter().filter(|s| s.active).map(|s| s.id).max()
    }

    /// Every id a clone object may carry, ascending: the snapshots' and the retired ones.
    pub fn clone_ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.snaps.iter().map(|s| s.id).collect();
        v.extend_from_slice(&self.retired);
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The snapshot named `name`.
    pub fn find(&self, name: &str) -> Option<&Snap> {
        self.snaps.iter().find(|s| s.name == name)
    }

    /// Whether a snapshot (of any state) has id `id`.
    pub fn is_live(&self, id: u64) -> bool {
        self.snaps.iter().any(|s| s.id == id)
    }

    /// The stored bytes (docs/format/volume.md).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED_LEN + self.snaps.len() * 64 + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&SNAPS_VERSION.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        // Callers keep both counts under their limits (checked before every change).
        b.extend_from_slice(&(self.snaps.len() as u16).to_le_bytes());
        b.extend_from_slice(&(self.retired.len() as u16).to_le_bytes());
        for s in &self.snaps {
            b.extend_from_slice(&s.id.to_le_bytes());
            b.extend_from_slice(&s.created.to_le_bytes());
            b.extend_from_slice(&s.size.to_le_bytes());
            let flags = if s.protected { FLAG_PROTECTED } else { 0 }
                | if s.active { FLAG_ACTIVE } else { 0 };
            b.extend_from_slice(&flags.to_le_bytes());
            // Names pass `check_name` (at most 128 bytes).
            b.push(s.name.len() as u8);
            b.extend_from_slice(s.name.as_bytes());
        }
        for r in &self.retired {
            b.extend_from_slice(&r.to_le_bytes());
        }
        for v in [
            self.qos.iops,
            self.qos.bps,
            self.qos.iops_burst,
            self.qos.bps_burst,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        match &self.parent {
            None => b.push(0),
            Some(p) => {
                b.push(1);
                b.extend_from_slice(&p.volume_id.to_le_bytes());
                b.extend_from_slice(&p.snap_id.to_le_bytes());
                b.extend_from_slice(&p.overlap.to_le_bytes());
                // Names pass `check_name` (at most 128 bytes).
                for n in [&p.volume, &p.snap] {
                    b.push(n.len() as u8);
                    b.extend_from_slice(n.as_bytes());
                }
            }
        }
        let crc = cairn_crc::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a table; the error says what is wrong.
    pub fn decode(b: &[u8]) -> Result<SnapTable, DecodeError> {
        if b.len() < FIXED_LEN + 4 || b.len() > MAX_SNAPS_LEN {
            return Err(DecodeError::Length {
                len: b.len(),
                expected: Lengths {
                    min: FIXED_LEN + 4,
                    max: MAX_SNAPS_LEN,
                },
            });
        }
        if &b[0..8] != MAGIC {
            return Err(DecodeError::BadMagic(Record::SnapTable));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if cairn_crc::crc32c(body).to_le_bytes() != crc {
            return Err(DecodeError::Checksum);
        }
        let mut r = Reader { b: body, at: 8 };
        let version = r.u16()?;
        if version != SNAPS_VERSION {
            return Err(DecodeError::Version {
                record: Record::SnapTable,
                version,
            });
        }
        if r.u16()? != 0 {
            return Err(DecodeError::Reserved);
        }
        let generation = r.u64()?;
        let seq = r.u64()?;
        let nsnaps = usize::from(r.u16()?);
        let nretired = usize::from(r.u16()?);
        if nsnaps > MAX_SNAPS || nretired > MAX_RETIRED {
            return Err(DecodeError::Counts {
                snaps: nsnaps,
                retired: nretired,
            });
        }
        let mut snaps: Vec<Snap> = Vec::with_capacity(nsnaps);
        for _ in 0..nsnaps {
            let s = read_snap(&mut r)?;
            if snaps.last().is_some_and(|p| p.id >= s.id) || s.id == 0 || s.id > seq {
                return Err(DecodeError::SnapOrder(s.id));
            }
            if snaps.iter().any(|p| p.name == s.name) {
                return Err(DecodeError::SnapTwice(s.name));
            }
            snaps.push(s);
        }
        let mut retired: Vec<u64> = Vec::with_capacity(nretired);
        for _ in 0..nretired {
            let id = r.u64()?;
            if retired.last().is_some_and(|&p| p >= id) || id == 0 || id > seq {
                return Err(DecodeError::RetiredOrder(id));
            }
            if snaps.iter().any(|s| s.id == id) {
                return Err(DecodeError::RetiredIsSnap(id));
            }
            retired.push(id);
        }
        let qos = Qos {
            iops: r.u64()?,
            bps: r.u64()?,
            iops_burst: r.u64()?,
            bps_burst: r.u64()?,
        };
        let parent = match r.u8()? {
            0 => None,
            1 => Some(read_parent(&mut r)?),
            f => return Err(DecodeError::ParentFlag(f)),
        };
        if r.at != body.len() {
            return Err(DecodeError::Trailing(body.len() - r.at));
        }
        Ok(SnapTable {
            generation,
            seq,
            snaps,
            retired,
            qos,
            parent,
        })
    }
}

fn read_parent(r: &mut Reader<'_>) -> Result<ParentLink, DecodeError> {
    let volume_id = r.u64()?;
    let snap_id = r.u64()?;
    let overlap = r.u64()?;
    let mut name = || -> Result<String, DecodeError> {
        let len = usize::from(r.u8()?);
        let n =
            std::str::from_utf8(r.take(len)?).map_err(|_| DecodeError::NotUtf8("parent name"))?;
        decoded_name(n).map_err(DecodeError::in_parent)?;
        Ok(n.to_string())
    };
    let (volume, snap) = (name()?, name()?);
    if !size_ok(overlap) {
        return Err(DecodeError::ParentOverlap(overlap));
    }
    if snap_id == 0 {
        return Err(DecodeError::ParentSnapZero);
    }
    Ok(ParentLink {
        volume_id,
        snap_id,
        overlap,
        volume,
        snap,
    })
}

fn read_snap(r: &mut Reader<'_>) -> Result<Snap, DecodeError> {
    let id = r.u64()?;
    let created = r.u64()?;
    let size = r.u64()?;
    let flags = r.u16()?;
    if flags & !(FLAG_PROTECTED | FLAG_ACTIVE) != 0 {
        return Err(DecodeError::UnknownFlags(flags).in_snap(id));
    }
    let len = usize::from(r.u8()?);
    let name =
        std::str::from_utf8(r.take(len)?).map_err(|_| DecodeError::NotUtf8("name").in_snap(id))?;
    decoded_name(name).map_err(|e| e.in_snap(id))?;
    if !size_ok(size) {
        return Err(DecodeError::Size(size).in_snap(id));
    }
    Ok(Snap {
        id,
        name: name.to_string(),
        created,
        size,
        protected: flags & FLAG_PROTECTED != 0,
        active: flags & FLAG_ACTIVE != 0,
    })
}

/// Bounds-checked little-endian reads.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            return Err(DecodeError::Truncated);
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

/// Name of volume `id`'s snapshot table.
pub fn snaps_object(id: u64) -> Vec<u8> {
    format!("{SNAPS_PREFIX}{id:016x}").into_bytes()
}

/// Name of the clone of data object `objno` of volume `id` kept for snapshot `snap` (and the
/// older snapshots it covers).
pub fn clone_object(id: u64, objno: u64, snap: u64) -> Vec<u8> {
    format!("{CLONE_PREFIX}{id:016x}.{objno:016x}.{snap:016x}").into_bytes()
}

/// The volume id, object number and snapshot id of a clone object name, if `object` is one.
pub fn clone_of(object: &[u8]) -> Option<(u64, u64, u64)> {
    let s = std::str::from_utf8(object).ok()?;
    let mut parts = s.strip_prefix(CLONE_PREFIX)?.split('.');
    let mut field = || {
        let p = parts.next()?;
        (p.len() == 16).then(|| u64::from_str_radix(p, 16).ok())?
    };
    let (id, objno, snap) = (field()?, field()?, field()?);
    parts.next().is_none().then_some((id, objno, snap))
}

/// Of the clones `ids` (ascending) of one object, the one a read of snapshot `snap` uses: the
/// oldest not older than the snapshot. `None`: the head object still holds what it saw.
pub fn clone_for(ids: &[u64], snap: u64) -> Option<u64> {
    ids.iter().copied().find(|&c| c >= snap)
}

/// Of the clones `ids` (ascending) of one object, those no snapshot of `live` (ids) reads
/// any more: a clone serves the snapshots after the previous clone kept, up to its own id.
pub fn unneeded_clones(ids: &[u64], live: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    let mut prev_kept = 0;
    for &c in ids {
        if live.iter().any(|&t| t > prev_kept && t <= c) {
            prev_kept = c;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SnapTable {
        SnapTable {
            generation: 9,
            seq: 5,
            snaps: vec![
                Snap {
                    id: 2,
                    name: "before-upgrade".into(),
                    created: 1_800_000_000,
                    size: 10 << 30,
                    protected: true,
                    active: true,
                },
                Snap {
                    id: 5,
                    name: "nightly".into(),
                    created: 1_800_000_100,
                    size: 12 << 30,
                    protected: false,
                    active: false,
                },
            ],
            retired: vec![1, 4],
            qos: Qos {
                iops: 2000,
                bps: 100 << 20,
                iops_burst: 0,
                bps_burst: 1 << 30,
            },
            parent: Some(ParentLink {
                volume_id: 0xabcd,
                snap_id: 3,
                overlap: 10 << 30,
                volume: "golden".into(),
                snap: "v1".into(),
            }),
        }
    }

    #[test]
    fn round_trips() {
        let t = sample();
        assert_eq!(SnapTable::decode(&t.encode()), Ok(t.clone()));
        assert_eq!(t.latest_active(), Some(2));
        assert_eq!(t.clone_ids(), vec![1, 2, 4, 5]);
        let empty = SnapTable::default();
        assert_eq!(SnapTable::decode(&empty.encode()), Ok(empty));
    }

    #[test]
    fn refuses_damage_and_inconsistency() {
        let b = sample().encode();
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x20;
            assert!(SnapTable::decode(&d).is_err(), "flip at byte {i} accepted");
        }
        assert!(SnapTable::decode(&b[..b.len() - 1]).is_err());
        let mut dup = sample();
        dup.snaps[1].name = dup.snaps[0].name.clone();
        assert!(SnapTable::decode(&dup.encode()).is_err());
        let mut beyond = sample();
        beyond.seq = 4;
        assert!(SnapTable::decode(&beyond.encode()).is_err());
        let mut both = sample();
        both.retired = vec![2];
        assert!(SnapTable::decode(&both.encode()).is_err());
    }

    #[test]
    fn largest_table_fits_the_limit() {
        let t = SnapTable {
            generation: u64::MAX,
            seq: u64::MAX,
            snaps: (1..=MAX_SNAPS as u64)
                .map(|i| Snap {
                    id: i,
                    name: format!("{i:0>128}"),
                    created: 0,
                    size: 1 << 50,
                    protected: true,
                    active: true,
                })
                .collect(),
            retired: (1000..1000 + MAX_RETIRED as u64).collect(),
            qos: Qos {
                iops: u64::MAX,
                bps: u64::MAX,
                iops_burst: u64::MAX,
                bps_burst: u64::MAX,
            },
            parent: Some(ParentLink {
                volume_id: u64::MAX,
                snap_id: u64::MAX,
                overlap: 1 << 50,
                volume: "v".repeat(128),
                snap: "s".repeat(128),
            }),
        };
        let b = t.encode();
        assert_eq!(b.len(), MAX_SNAPS_LEN);
        assert_eq!(SnapTable::decode(&b), Ok(t));
    }

    #[test]
    fn names() {
        let n = clone_object(7, 0x2a, 3);
        assert_eq!(clone_of(&n), Some((7, 0x2a, 3)));
        assert_eq!(clone_of(b"vclone.0000000000000007.000000000000002a"), None);
        assert_eq!(crate::header::objno_of(7, &n), None);
        assert_eq!(snaps_object(7), b"vsnaps.0000000000000007".to_vec());
    }

    #[test]
    fn reads_use_the_oldest_clone_not_older_than_the_snapshot() {
        assert_eq!(clone_for(&[2, 5], 1), Some(2));
        assert_eq!(clone_for(&[2, 5], 2), Some(2));
        assert_eq!(clone_for(&[2, 5], 3), Some(5));
        assert_eq!(clone_for(&[2, 5], 6), None);
    }

    #[test]
    fn trimming_keeps_the_clones_live_snapshots_read() {
        // Snapshots 1..=4 taken; the object was cloned when 2 and when 4 were the newest.
        assert_eq!(unneeded_clones(&[2, 4], &[1, 2, 3, 4]), Vec::<u64>::new());
        // 2 removed: its clone still serves 1.
        assert_eq!(unneeded_clones(&[2, 4], &[1, 3, 4]), Vec::<u64>::new());
        // 1 and 2 removed: clone 2 serves nobody; 4 serves 3 and 4.
        assert_eq!(unneeded_clones(&[2, 4], &[3, 4]), vec![2]);
        // 3 and 4 removed: clone 4 serves nobody.
        assert_eq!(unneeded_clones(&[2, 4], &[1, 2]), vec![4]);
        assert_eq!(unneeded_clones(&[2, 4], &[]), vec![2, 4]);
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = SnapTable::decode(&b);
        }

        /// Removing snapshots and trimming changes no remaining snapshot's read.
        #[test]
        fn trimming_changes_no_live_read(
            clones in proptest::collection::btree_set(1u64..20, 0..6),
            live in proptest::collection::btree_set(1u64..20, 0..6),
            removed in proptest::collection::btree_set(1u64..20, 0..6),
        ) {
            let ids: Vec<u64> = clones.into_iter().collect();
            let after: Vec<u64> = live.iter().copied().filter(|t| !removed.contains(t)).collect();
            let gone = unneeded_clones(&ids, &after);
            let kept: Vec<u64> = ids.iter().copied().filter(|c| !gone.contains(c)).collect();
            for &t in &after {
                prop_assert_eq!(clone_for(&kept, t), clone_for(&ids, t));
            }
        }
    }
}
