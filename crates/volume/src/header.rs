//! The volume header object: what a volume is (size, object size, id), versioned and
//! checksummed (docs/format/volume.md), and the names of a volume's objects.

use crate::decode_error::{DecodeError, Lengths, Record};
use crate::error::VolumeError;

const MAGIC: &[u8; 8] = b"CAIRNVOL";
/// Header format version of a volume whose data objects are in its own pool (written so that
/// binaries from before version 2 still open it).
pub const FORMAT_VERSION: u16 = 1;
/// Encoded header length (version 1).
pub const HEADER_LEN: usize = 52;
/// Header format version of a volume with a data pool (`vol create --data-pool`): version 1
/// and the data pool's id.
pub const FORMAT_VERSION_DATA_POOL: u16 = 2;
/// Encoded header length (version 2).
pub const HEADER_LEN_V2: usize = 56;
/// Default data object size: 4 MiB.
pub const DEFAULT_OBJECT_SIZE: u32 = 4 << 20;
/// Smallest and largest data object sizes (powers of two).
pub const MIN_OBJECT_SIZE: u32 = 64 << 10;
pub const MAX_OBJECT_SIZE: u32 = 64 << 20;
/// Largest volume: 1 PiB (keeps object numbers and NBD offsets far from overflow).
pub const MAX_VOLUME_SIZE: u64 = 1 << 50;
/// Longest volume name.
pub const MAX_NAME: usize = 128;

/// Prefix of header object names: `vol.<name>`.
pub const HEADER_PREFIX: &str = "vol.";
/// Prefix of data object names: `vdata.<id:016x>.<objno:016x>`.
pub const DATA_PREFIX: &str = "vdata.";
/// Header flag: `vol rm` has begun; the volume cannot be opened any more (docs/format/volume.md).
pub const FLAG_REMOVING: u16 = 1;
/// Header flag: `vol rm --force`: servers that have the volume open close it.
pub const FLAG_CLOSE: u16 = 2;
/// Feature bit: the volume is a clone whose snapshot table names a parent snapshot its
/// unwritten data comes from; a reader that does not know clones must not open it.
pub const FEATURE_PARENT: u64 = 1;

/// A volume's identity and geometry, as stored in its header object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Random id naming the data objects, so a removed and re-created volume never sees the
    /// old volume's leftovers.
    pub id: u64,
    /// Size in bytes.
    pub size: u64,
    /// Data object size in bytes (power of two).
    pub object_size: u32,
    /// Feature bits: [`FEATURE_PARENT`].
    pub features: u64,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
    /// `vol rm` has begun: no one opens the volume any more.
    pub removing: bool,
    /// `vol rm --force` has begun: servers that have it open close it.
    pub close: bool,
    /// The pool holding the data objects (and their snapshot clones), when not the header's
    /// own (`vol create --data-pool`, e.g. an erasure-coded pool).
    pub data_pool: Option<u32>,
}

impl Header {
    /// The on-disk bytes (docs/format/volume.md).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN_V2);
        b.extend_from_slice(MAGIC);
        let version = match self.data_pool {
            None => FORMAT_VERSION,
            Some(_) => FORMAT_VERSION_DATA_POOL,
        };
        b.extend_from_slice(&version.to_le_bytes());
        let flags =
            if self.removing { FLAG_REMOVING } else { 0 } | if self.close { FLAG_CLOSE } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.object_size.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&self.features.to_le_bytes());
        b.extend_from_slice(&self.created.to_le_bytes());
        if let Some(p) = self.data_pool {
            b.extend_from_slice(&p.to_le_bytes());
        }
        let crc = cairn_crc::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks header bytes; the error says what is wrong.
    pub fn decode(b: &[u8]) -> Result<Header, DecodeError> {
        if b.len() != HEADER_LEN && b.len() != HEADER_LEN_V2 {
            return Err(DecodeError::Length {
                len: b.len(),
                expected: Lengths {
                    min: HEADER_LEN,
                    max: HEADER_LEN_V2,
                },
            });
        }
        if &b[0..8] != MAGIC {
            return Err(DecodeError::BadMagic(Record::Header));
        }
        let len = b.len();
        let crc = u32_at(b, len - 4);
        if cairn_crc::crc32c(&b[..len - 4]) != crc {
            return Err(DecodeError::Checksum);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        let want = if len == HEADER_LEN {
            FORMAT_VERSION
        } else {
            FORMAT_VERSION_DATA_POOL
        };
        if version != want {
            return Err(DecodeError::Version {
                record: Record::Header,
                version,
            });
        }
        let flags = u16::from_le_bytes([b[10], b[11]]);
        if flags & !(FLAG_REMOVING | FLAG_CLOSE) != 0 {
            return Err(DecodeError::UnknownFlags(flags));
        }
        let h = Header {
            object_size: u32_at(b, 12),
            size: u64_at(b, 16),
            id: u64_at(b, 24),
            features: u64_at(b, 32),
            created: u64_at(b, 40),
            removing: flags & FLAG_REMOVING != 0,
            close: flags & FLAG_CLOSE != 0,
            data_pool: (len == HEADER_LEN_V2).then(|| u32_at(b, 48)),
        };
        if h.features & !FEATURE_PARENT != 0 {
            return Err(DecodeError::UnknownFeatures(h.features));
        }
        if !object_size_ok(h.object_size) {
            return Err(DecodeError::ObjectSize(h.object_size));
        }
        if !size_ok(h.size) {
            return Err(DecodeError::Size(h.size));
        }
        Ok(h)
    }

    /// How many data objects cover the volume.
    pub fn object_count(&self) -> u64 {
        self.size.div_ceil(u64::from(self.object_size))
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Checks a volume name: 1..=128 bytes of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`.
pub fn check_name(name: &str) -> Result<(), VolumeError> {
    match name_problem(name) {
        None => Ok(()),
        Some(why) => Err(VolumeError::BadName {
            name: name.to_string(),
            why,
        }),
    }
}

/// What is wrong with a volume name (`None`: nothing; see [`check_name`]).
pub(crate) fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("empty");
    }
    if name.len() > MAX_NAME {
        return Some("longer than 128 bytes");
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Some("starts with '.' or '-'");
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
    {
        return Some("only letters, digits, '.', '_' and '-' are allowed");
    }
    None
}

/// Checks a name read from a record ([`check_name`]).
pub(crate) fn decoded_name(name: &str) -> Result<(), DecodeError> {
    match name_problem(name) {
        None => Ok(()),
        Some(why) => Err(DecodeError::BadName {
            name: name.to_string(),
            why,
        }),
    }
}

/// Whether a data object size is allowed: a power of two from 64 KiB to 64 MiB.
pub(crate) fn object_size_ok(object_size: u32) -> bool {
    object_size.is_power_of_two() && (MIN_OBJECT_SIZE..=MAX_OBJECT_SIZE).contains(&object_size)
}

/// Whether a volume size is allowed: a multiple of 512 from 512 bytes to 1 PiB.
pub(crate) fn size_ok(size: u64) -> bool {
    size != 0 && size <= MAX_VOLUME_SIZE && size.is_multiple_of(512)
}

/// Checks a data object size.
pub fn check_object_size(object_size: u32) -> Result<(), VolumeError> {
    if !object_size_ok(object_size) {
        return Err(VolumeError::BadArgument {
            what: "object size",
            why: format!(
                "{object_size} bytes; must be a power of two from {} KiB to {} MiB",
                MIN_OBJECT_SIZE >> 10,
                MAX_OBJECT_SIZE >> 20
            ),
        });
    }
    Ok(())
}

/// Checks a volume size.
pub fn check_size(size: u64) -> Result<(), VolumeError> {
    if !size_ok(size) {
        return Err(VolumeError::BadArgument {
            what: "volume size",
            why: format!("{size} bytes; must be a multiple of 512 from 512 bytes to 1 PiB"),
        });
    }
    Ok(())
}

/// Name of a volume's header object.
pub fn header_object(name: &str) -> Vec<u8> {
    format!("{HEADER_PREFIX}{name}").into_bytes()
}

/// The volume name of a header object name, if it is one.
pub fn volume_of_header(object: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(object).ok()?;
    let name = s.strip_prefix(HEADER_PREFIX)?;
    check_name(name).ok().map(|_| name)
}

/// The pool holding the data objects of a volume whose header `h` is in `pool`.
pub fn data_pool(pool: u32, h: &Header) -> u32 {
    h.data_pool.unwrap_or(pool)
}

/// Prefix shared by all data objects of volume `id`.
pub fn data_prefix(id: u64) -> String {
    format!("{DATA_PREFIX}{id:016x}.")
}

/// Name of data object `objno` of volume `id`.
pub fn data_object(id: u64, objno: u64) -> Vec<u8> {
    format!("{DATA_PREFIX}{id:016x}.{objno:016x}").into_bytes()
}

/// The object number of a data object of volume `id`, if `object` is one.
pub fn objno_of(id: u64, object: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(object).ok()?;
    let hex = s.strip_prefix(&data_prefix(id))?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Header {
        Header {
            id: 0x1234_5678_9abc_def0,
            size: 10 << 30,
            object_size: DEFAULT_OBJECT_SIZE,
            features: 0,
            created: 1_800_000_000,
            removing: false,
            close: false,
            data_pool: None,
        }
    }

    #[test]
    fn round_trips() {
        let h = sample();
        let b = h.encode();
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(Header::decode(&b), Ok(h));
        let removing = Header {
            removing: true,
            close: true,
            ..h
        };
        assert_eq!(Header::decode(&removing.encode()), Ok(removing));
        let ec = Header {
            data_pool: Some(7),
            ..h
        };
        let b = ec.encode();
        assert_eq!(b.len(), HEADER_LEN_V2);
        assert_eq!(Header::decode(&b), Ok(ec));
    }

    #[test]
    fn a_length_must_go_with_its_version() {
        // A version-2 body cut to version 1's length (checksum fixed up) is refused.
        let mut b = Header {
            data_pool: Some(7),
            ..sample()
        }
        .encode();
        b.truncate(HEADER_LEN - 4);
        let crc = cairn_crc::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Header::decode(&b),
            Err(DecodeError::Version { version: 2, .. })
        ));
    }

    #[test]
    fn refuses_damage() {
        let v2 = Header {
            data_pool: Some(3),
            ..sample()
        };
        for b in [sample().encode(), v2.encode()] {
            for i in 0..b.len() {
                let mut d = b.clone();
                d[i] ^= 0x40;
                assert!(Header::decode(&d).is_err(), "flip at byte {i} accepted");
            }
        }
        let b = sample().encode();
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x40;
            assert!(Header::decode(&d).is_err(), "flip at byte {i} accepted");
        }
        assert!(Header::decode(&b[..HEADER_LEN - 1]).is_err());
        let mut longer = b.clone();
        longer.push(0);
        assert!(Header::decode(&longer).is_err());
    }

    #[test]
    fn names() {
        assert!(check_name("vm-disk_1.img").is_ok());
        for bad in ["", ".hidden", "-x", "a/b", "a b", &"x".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(volume_of_header(b"vol.disk0"), Some("disk0"));
        assert_eq!(volume_of_header(b"vol."), None);
        assert_eq!(volume_of_header(b"other"), None);
        let n = data_object(7, 0x2a);
        assert_eq!(objno_of(7, &n), Some(0x2a));
        assert_eq!(objno_of(8, &n), None);
        assert_eq!(objno_of(7, b"vdata.0000000000000007.xyz"), None);
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Header::decode(&b);
        }
    }
}
