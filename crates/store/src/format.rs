//! The superblock every device starts with and the WAL header slots.
//! Byte layouts are documented in `docs/format/store.md`; keep both in step.

use crate::codec::{Reader, Writer};
use crate::device::BLOCK_SIZE;

/// On-disk format version written by this code. Version history:
/// - 1: first format (development only).
/// - 2: WAL records carry the store tag (bytes 28..32) and the first-in-batch flag; checkpoints
///   live in segments of their own.
pub const FORMAT_VERSION: u32 = 2;
/// Magic at offset 4 of every superblock.
pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"CAIRNSB1";
/// Magic at offset 4 of a WAL header slot.
pub const WAL_HEADER_MAGIC: &[u8; 8] = b"CAIRNWH1";

/// What a device is used for.
/// Why a device's first block is not a superblock this build can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    #[error("short superblock ({0} bytes)")]
    Short(usize),
    #[error("no Cairn superblock (bad magic): not formatted, or not a Cairn device")]
    NoMagic,
    #[error("superblock checksum mismatch")]
    Checksum,
    #[error("format version {0}, this build reads version {FORMAT_VERSION}")]
    Version(u32),
    #[error("unknown device role {0}")]
    Role(u8),
    #[error("block size {0}, expected {BLOCK_SIZE}")]
    BlockSize(u32),
    #[error("superblock field: {0}")]
    Field(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A data device (it may also hold the WAL).
    Data,
    /// A separate WAL device.
    Wal,
}

/// Block 0 of every device of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Identity of the store; every device of one store carries the same.
    pub store_id: [u8; 16],
    pub role: Role,
    /// Index among the data devices (0 or 1); 0 for a WAL device.
    pub device_index: u8,
    /// How many data devices the store has (1, or 2 as a mirror).
    pub data_devices: u8,
    /// Formatted size in bytes.
    pub device_size: u64,
    /// Segment size in bytes (data devices).
    pub segment_size: u64,
    /// Byte offset of segment 0 (data devices).
    pub segment_offset: u64,
    /// Number of segments (data devices).
    pub segment_count: u64,
    /// Byte offset of the WAL region on this device, 0 when it has none.
    pub wal_offset: u64,
    /// Size of the WAL region in bytes (two header slots + the ring).
    pub wal_size: u64,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: u64,
}

impl Superblock {
    /// Encodes into one block; the crc32c at offset 0 covers bytes 4..4096.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(BLOCK_SIZE);
        let mut w = Writer(&mut v);
        w.u32(0);
        w.bytes(SUPERBLOCK_MAGIC);
        w.u32(FORMAT_VERSION);
        w.bytes(&self.store_id);
        w.u8(match self.role {
            Role::Data => 1,
            Role::Wal => 2,
        });
        w.u8(self.device_index);
        w.u8(self.data_devices);
        w.u8(0);
        w.u32(BLOCK_SIZE as u32);
        for x in [
            self.device_size,
            self.segment_size,
            self.segment_offset,
            self.segment_count,
            self.wal_offset,
            self.wal_size,
            self.created_unix,
        ] {
            w.u64(x);
        }
        v.resize(BLOCK_SIZE, 0);
        seal(&mut v);
        v
    }

    /// Decodes and verifies a superblock block; the error says what is wrong.
    pub fn decode(b: &[u8]) -> Result<Self, SuperblockError> {
        if b.len() < BLOCK_SIZE {
            return Err(SuperblockError::Short(b.len()));
        }
        let b = &b[..BLOCK_SIZE];
        if &b[4..12] != SUPERBLOCK_MAGIC {
            return Err(SuperblockError::NoMagic);
        }
        if !sealed_ok(b) {
            return Err(SuperblockError::Checksum);
        }
        let mut r = Reader::new(&b[12..]);
        let e = |e: crate::codec::DecodeError| SuperblockError::Field(e.0);
        let version = r.u32().map_err(e)?;
        if version != FORMAT_VERSION {
            return Err(SuperblockError::Version(version));
        }
        let mut store_id = [0u8; 16];
        store_id.copy_from_slice(r.take(16).map_err(e)?);
        let role = match r.u8().map_err(e)? {
            1 => Role::Data,
            2 => Role::Wal,
            x => return Err(SuperblockError::Role(x)),
        };
        let device_index = r.u8().map_err(e)?;
        let data_devices = r.u8().map_err(e)?;
        r.u8().map_err(e)?;
        let bs = r.u32().map_err(e)?;
        if bs as usize != BLOCK_SIZE {
            return Err(SuperblockError::BlockSize(bs));
        }
        let mut f = [0u64; 7];
        for x in f.iter_mut() {
            *x = r.u64().map_err(e)?;
        }
        Ok(Superblock {
            store_id,
            role,
            device_index,
            data_devices,
            device_size: f[0],
            segment_size: f[1],
            segment_offset: f[2],
            segment_count: f[3],
            wal_offset: f[4],
            wal_size: f[5],
            created_unix: f[6],
        })
    }
}

/// One of the two alternating header slots at the start of the WAL region. The slot with the
/// highest valid generation is current. It says where replay starts and which checkpoint
/// holds the state before that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WalHeader {
    pub store_id: [u8; 16],
    /// Increases by one per header write; slot = generation % 2.
    pub generation: u64,
    /// Sequence number of the first record to replay.
    pub replay_seq: u64,
    /// Log position (monotonic byte count; ring offset = lsn % ring size) replay starts at.
    pub replay_lsn: u64,
    /// crc of the record before `replay_seq` (records chain their predecessor's crc).
    pub replay_prev_crc: u32,
    /// Data-device offset of the checkpoint root, 0 for none (empty store).
    pub ckpt_root_offset: u64,
    pub ckpt_root_len: u32,
    pub ckpt_root_crc: u32,
}

impl WalHeader {
    /// Encodes into one block; the crc32c at offset 0 covers bytes 4..4096.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(BLOCK_SIZE);
        let mut w = Writer(&mut v);
        w.u32(0);
        w.bytes(WAL_HEADER_MAGIC);
        w.u32(FORMAT_VERSION);
        w.bytes(&self.store_id);
        w.u64(self.generation);
        w.u64(self.replay_seq);
        w.u64(self.replay_lsn);
        w.u32(self.replay_prev_crc);
        w.u64(self.ckpt_root_offset);
        w.u32(self.ckpt_root_len);
        w.u32(self.ckpt_root_crc);
        v.resize(BLOCK_SIZE, 0);
        seal(&mut v);
        v
    }

    /// Decodes a slot; `None` when it is blank, torn or corrupt.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < BLOCK_SIZE || &b[4..12] != WAL_HEADER_MAGIC || !sealed_ok(&b[..BLOCK_SIZE]) {
            return None;
        }
        let mut r = Reader::new(&b[12..]);
        if r.u32().ok()? != FORMAT_VERSION {
            return None;
        }
        let mut store_id = [0u8; 16];
        store_id.copy_from_slice(r.take(16).ok()?);
        Some(WalHeader {
            store_id,
            generation: r.u64().ok()?,
            replay_seq: r.u64().ok()?,
            replay_lsn: r.u64().ok()?,
            replay_prev_crc: r.u32().ok()?,
            ckpt_root_offset: r.u64().ok()?,
            ckpt_root_len: r.u32().ok()?,
            ckpt_root_crc: r.u32().ok()?,
        })
    }
}

/// Writes the crc32c of bytes 4.. into bytes 0..4.
pub fn seal(b: &mut [u8]) {
    let c = cairn_crc::crc32c(&b[4..]);
    b[..4].copy_from_slice(&c.to_le_bytes());
}

/// Checks the crc32c written by [`seal`].
pub fn sealed_ok(b: &[u8]) -> bool {
    b.len() >= 4 && u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == cairn_crc::crc32c(&b[4..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            store_id: [7; 16],
            role: Role::Data,
            device_index: 1,
            data_devices: 2,
            device_size: 1 << 30,
            segment_size: 4 << 20,
            segment_offset: 1 << 20,
            segment_count: 255,
            wal_offset: 4096,
            wal_size: 1 << 20,
            created_unix: 42,
        }
    }

    #[test]
    fn superblock_round_trip_and_corruption() {
        let b = sb().encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb());
        let mut bad = b.clone();
        bad[100] ^= 1;
        assert_eq!(
            Superblock::decode(&bad).unwrap_err(),
            SuperblockError::Checksum
        );
        assert_eq!(
            Superblock::decode(&[0u8; 4096]).unwrap_err(),
            SuperblockError::NoMagic
        );
    }

    // The golden files of the superblock and the WAL header: `crate::golden`.

    #[test]
    fn wal_header_round_trip() {
        let h = WalHeader {
            store_id: [1; 16],
            generation: 9,
            replay_seq: 100,
            replay_lsn: 8192,
            replay_prev_crc: 77,
            ckpt_root_offset: 1 << 20,
            ckpt_root_len: 4096,
            ckpt_root_crc: 5,
        };
        let mut b = h.encode();
        assert_eq!(WalHeader::decode(&b), Some(h));
        b[30] ^= 4;
        assert_eq!(WalHeader::decode(&b), None);
    }
}
