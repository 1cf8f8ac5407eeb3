//! Open leases: a process serving a volume says so in an object `vopen.<id>.<holder>` that it
//! renews every [`RENEW_EVERY`], so that `vol rm` and `pool rm` can see who has the volume
//! open, refuse, or (with `--force`) make that process close it before any data is removed
//! (docs/format/volume.md, "Open leases").
//!
//! The record is versioned and checksummed; its decoder is fuzzed
//! (`fuzz/fuzz_targets/volume_lease.rs`).

use crate::decode_error::{DecodeError, Lengths, Record};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MAGIC: &[u8; 8] = b"CAIRNOPN";
/// Lease record format version this code writes; it reads version 1 too (no `acked_gen`).
pub const LEASE_VERSION: u16 = 2;
/// Longest holder description kept in a record.
pub const MAX_HOLDER_DESC: usize = 256;
/// Bytes before the description in version 1: magic, version, reserved, holder, expiry, pid,
/// length. Version 2 adds the acknowledged snapshot table generation and the I/O rates before
/// the length.
const FIXED_LEN_V1: usize = 8 + 2 + 2 + 8 + 8 + 4 + 2;
const FIXED_LEN: usize = FIXED_LEN_V1 + 8 + 4 * 8;
/// Largest encoded record (readers ask for no more).
pub const MAX_LEASE_LEN: usize = FIXED_LEN + MAX_HOLDER_DESC + 4;

/// Prefix of lease object names: `vopen.<id:016x>.<holder:016x>`.
pub const LEASE_PREFIX: &str = "vopen.";

/// How often a holder rewrites its lease and re-reads the volume's header.
pub const RENEW_EVERY: Duration = Duration::from_secs(2);
/// How long a written lease is valid for others (its `expires_at`).
pub const LEASE_FOR: Duration = Duration::from_secs(15);
/// How long a holder keeps doing I/O without a successful renewal: well before its lease
/// expires for others, so clocks may disagree by the difference (5 s) and no late write lands
/// after `vol rm` saw the lease expire.
pub const SELF_FENCE_AFTER: Duration = Duration::from_secs(10);
/// How long I/O waits for a lapsed lease to be renewed before it fails (as long as an object
/// op waits for a PG: a lapse is a stall first, an error only if it lasts).
pub const LAPSE_PATIENCE: Duration = Duration::from_secs(30);

/// One holder's lease on a volume, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Random id of the holding process (one per open of the volume).
    pub holder: u64,
    /// Wall-clock expiry, milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// Process id of the holder, for people.
    pub pid: u32,
    /// Who holds it, for people: e.g. `cairn nbd serve on host h (nbd://127.0.0.1:10809)`.
    pub desc: String,
    /// The snapshot table generation the holder has adopted (`snaps.rs`): `vol snap` commands
    /// wait for it.
    pub acked_gen: u64,
    /// The holder's I/O on the volume over its last renewal period.
    pub rates: IoRates,
    /// Whether the holder writes the volume: a writer's lease is exclusive (one writer at a
    /// time); snapshot readers, `vol diff` and `vol flatten` hold shared ones.
    pub writer: bool,
}

/// Lease flag (version 2, the bytes that were reserved in version 1): the holder writes.
const FLAG_WRITER: u16 = 1;

/// I/O rates of one holder, per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoRates {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

impl LeaseRecord {
    /// The stored bytes; a description longer than [`MAX_HOLDER_DESC`] is cut.
    pub fn encode(&self) -> Vec<u8> {
        let mut desc = self.desc.as_str();
        while desc.len() > MAX_HOLDER_DESC {
            let mut end = MAX_HOLDER_DESC;
            while !desc.is_char_boundary(end) {
                end -= 1;
            }
            desc = &desc[..end];
        }
        let mut b = Vec::with_capacity(FIXED_LEN + desc.len() + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&LEASE_VERSION.to_le_bytes());
        let flags = if self.writer { FLAG_WRITER } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.holder.to_le_bytes());
        b.extend_from_slice(&self.expires_at_ms.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.acked_gen.to_le_bytes());
        let r = &self.rates;
        for v in [r.read_ops, r.write_ops, r.read_bytes, r.write_bytes] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        // Cut above to MAX_HOLDER_DESC (256), so it fits.
        b.extend_from_slice(&(desc.len() as u16).to_le_bytes());
        b.extend_from_slice(desc.as_bytes());
        let crc = cairn_crc::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a record; the error says what is wrong.
    pub fn decode(b: &[u8]) -> Result<LeaseRecord, DecodeError> {
        if b.len() < FIXED_LEN_V1 + 4 || b.len() > MAX_LEASE_LEN {
            return Err(DecodeError::Length {
                len: b.len(),
                expected: Lengths {
                    min: FIXED_LEN_V1 + 4,
                    max: MAX_LEASE_LEN,
                },
            });
        }
        if &b[0..8] != MAGIC {
            return Err(DecodeError::BadMagic(Record::Lease));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if cairn_crc::crc32c(body).to_le_bytes() != crc {
            return Err(DecodeError::Checksum);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        let (fixed, acked_gen, rates) = match version {
            1 => (FIXED_LEN_V1, 0, IoRates::default()),
            2 if b.len() >= FIXED_LEN + 4 => {
                let rates = IoRates {
                    read_ops: u64_at(b, 40),
                    write_ops: u64_at(b, 48),
                    read_bytes: u64_at(b, 56),
                    write_bytes: u64_at(b, 64),
                };
                (FIXED_LEN, u64_at(b, 32), rates)
            }
            2 => return Err(DecodeError::ShortForV2(b.len())),
            _ => {
                return Err(DecodeError::Version {
                    record: Record::Lease,
                    version,
                })
            }
        };
        let flags = u16::from_le_bytes([b[10], b[11]]);
        let known = if version == 1 { 0 } else { FLAG_WRITER };
        if flags & !known != 0 {
            return Err(DecodeError::UnknownFlags(flags));
        }
        let desc_len = usize::from(u16::from_le_bytes([b[fixed - 2], b[fixed - 1]]));
        if desc_len > MAX_HOLDER_DESC || fixed + desc_len + 4 != b.len() {
            return Err(DecodeError::DescriptionLength(desc_len));
        }
        let desc =
            std::str::from_utf8(&body[fixed..]).map_err(|_| DecodeError::NotUtf8("description"))?;
        Ok(LeaseRecord {
            holder: u64_at(b, 12),
            expires_at_ms: u64_at(b, 20),
            pid: u32::from_le_bytes([b[28], b[29], b[30], b[31]]),
            desc: desc.to_string(),
            acked_gen,
            rates,
            // A version 1 holder wrote whatever it opened.
            writer: version == 1 || flags & FLAG_WRITER != 0,
        })
    }

    /// Milliseconds until the lease expires by this machine's clock (0 once expired).
    pub fn remaining_ms(&self) -> u64 {
        self.expires_at_ms.saturating_sub(now_ms())
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Name of holder `holder`'s lease object on volume `id`.
pub fn lease_object(id: u64, holder: u64) -> Vec<u8> {
    format!("{LEASE_PREFIX}{id:016x}.{holder:016x}").into_bytes()
}

/// The volume id and holder of a lease object name, if `object` is one.
pub fn lease_of(object: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(object).ok()?;
    let rest = s.strip_prefix(LEASE_PREFIX)?;
    let (id, holder) = rest.split_once('.')?;
    if id.len() != 16 || holder.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(id, 16).ok()?,
        u64::from_str_radix(holder, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> LeaseRecord {
        LeaseRecord {
            holder: 0xfeed_beef,
            expires_at_ms: 1_800_000_000_000,
            pid: 4242,
            desc: "cairn nbd serve on host h (nbd://127.0.0.1:10809)".into(),
            acked_gen: 3,
            rates: IoRates {
                read_ops: 1,
                write_ops: 2,
                read_bytes: 3,
                write_bytes: 4,
            },
            writer: true,
        }
    }

    #[test]
    fn reads_version_1() {
        let r = sample();
        let mut v1 = r.encode();
        v1.drain(32..72);
        v1[8] = 1;
        v1[10] = 0; // no flags in version 1
        let end = v1.len() - 4;
        let crc = cairn_crc::crc32c(&v1[..end]);
        v1[end..].copy_from_slice(&crc.to_le_bytes());
        let back = LeaseRecord::decode(&v1).unwrap();
        let want = LeaseRecord {
            acked_gen: 0,
            rates: IoRates::default(),
            ..r
        };
        assert_eq!(back, want);
        // Flags were reserved in version 1: set, the record is refused.
        v1[10] = 1;
        let crc = cairn_crc::crc32c(&v1[..end]);
        v1[end..].copy_from_slice(&crc.to_le_bytes());
        assert!(LeaseRecord::decode(&v1).is_err());
    }

    #[test]
    fn round_trips_and_cuts_long_descriptions() {
        let r = sample();
        assert_eq!(LeaseRecord::decode(&r.encode()), Ok(r.clone()));
        let long = LeaseRecord {
            desc: "é".repeat(200),
            ..r
        };
        let back = LeaseRecord::decode(&long.encode()).unwrap();
        assert_eq!(back.desc, "é".repeat(128));
    }

    #[test]
    fn refuses_damage() {
        let b = sample().encode();
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(
                LeaseRecord::decode(&d).is_err(),
                "flip at byte {i} accepted"
            );
        }
        assert!(LeaseRecord::decode(&b[..b.len() - 1]).is_err());
        assert!(LeaseRecord::decode(&[0; MAX_LEASE_LEN + 1]).is_err());
    }

    #[test]
    fn names() {
        let n = lease_object(7, 0xab);
        assert_eq!(lease_of(&n), Some((7, 0xab)));
        assert_eq!(lease_of(b"vopen.0000000000000007"), None);
        assert_eq!(lease_of(b"vdata.0000000000000007.00000000000000ab"), None);
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = LeaseRecord::decode(&b);
        }
    }
}
