//! The persisted allocation map: which data objects of a volume may exist, kept by its writer
//! so that opening a volume reads a few small objects instead of listing the pool.
//!
//! One object per [`SHARD_OBJECTS`] data objects, `valloc.<id:016x>.<shard:08x>`, holding a
//! bitmap (docs/format/volume.md, "The allocation map"). The rule that keeps it safe: a bit is
//! set, durably, before the first write of its data object is sent; bits are cleared only by
//! rewriting a shard from the writer's own map. So the map may name objects that no longer
//! exist (a crash after a remove), never miss one that does.

use crate::decode_error::{DecodeError, Lengths, Record};
use crate::error::VolumeError;
use cairn_client::{Client, ClientError};
use std::collections::BTreeSet;

const MAGIC: &[u8; 8] = b"CAIRNALC";
/// Format version this code writes and reads.
pub const ALLOC_VERSION: u16 = 1;
/// Data objects one shard covers (its bitmap is 4 KiB: 128 GiB of 4 MiB objects).
pub const SHARD_OBJECTS: u64 = 32768;
pub(crate) const BITMAP_LEN: usize = (SHARD_OBJECTS / 8) as usize;
const FIXED_LEN: usize = 8 + 2 + 2 + 8 + 4 + 4;
/// Size of an encoded shard (readers ask for one byte more, to see a longer object).
pub const SHARD_LEN: usize = FIXED_LEN + BITMAP_LEN + 4;

/// Prefix of allocation-map object names.
pub const ALLOC_PREFIX: &str = "valloc.";

/// Object name of shard `shard` of volume `id`'s map.
pub fn shard_object(id: u64, shard: u64) -> Vec<u8> {
    format!("{ALLOC_PREFIX}{id:016x}.{shard:08x}").into_bytes()
}

/// The volume id of an allocation-map object name.
pub fn volume_of(object: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(object).ok()?;
    let (id, shard) = s.strip_prefix(ALLOC_PREFIX)?.split_once('.')?;
    if id.len() != 16 || shard.len() != 8 || !shard.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(id, 16).ok()
}

/// The shard holding data object `objno`'s bit.
pub fn shard_of(objno: u64) -> u64 {
    objno / SHARD_OBJECTS
}

/// How many shards cover a volume of `objects` data objects.
pub fn shards_for(objects: u64) -> u64 {
    objects.div_ceil(SHARD_OBJECTS).max(1)
}

/// Encodes shard `shard` of volume `id` with the objects of `members` in its range.
pub fn encode(id: u64, shard: u64, members: &BTreeSet<u64>) -> Vec<u8> {
    let first = shard * SHARD_OBJECTS;
    let mut bitmap = vec![0u8; BITMAP_LEN];
    for &o in members.range(first..first + SHARD_OBJECTS) {
        let bit = (o - first) as usize;
        bitmap[bit / 8] |= 1 << (bit % 8);
    }
    let mut v = Vec::with_capacity(SHARD_LEN);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&ALLOC_VERSION.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&(shard as u32).to_le_bytes());
    v.extend_from_slice(&(BITMAP_LEN as u32).to_le_bytes());
    v.extend_from_slice(&bitmap);
    v.extend_from_slice(&cairn_crc::crc32c(&v).to_le_bytes());
    v
}

/// Decodes shard `shard` of volume `id`: the data objects it marks. Anything else (another
/// volume's or shard's bytes, damage, another version) is an error.
pub fn decode(b: &[u8], id: u64, shard: u64) -> Result<Vec<u64>, DecodeError> {
    if b.len() != SHARD_LEN {
        return Err(DecodeError::Length {
            len: b.len(),
            expected: Lengths {
                min: SHARD_LEN,
                max: SHARD_LEN,
            },
        });
    }
    let (body, crc) = b.split_at(SHARD_LEN - 4);
    let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if cairn_crc::crc32c(body) != crc {
        return Err(DecodeError::Checksum);
    }
    if &body[..8] != MAGIC {
        return Err(DecodeError::BadMagic(Record::AllocMap));
    }
    let u32_at =
        |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
    let version = u16::from_le_bytes([body[8], body[9]]);
    if version != ALLOC_VERSION {
        return Err(DecodeError::Version {
            record: Record::AllocMap,
            version,
        });
    }
    let mut idb = [0u8; 8];
    idb.copy_from_slice(&body[12..20]);
    if u64::from_le_bytes(idb) != id || u64::from(u32_at(20)) != shard {
        return Err(DecodeError::OtherShard);
    }
    if u32_at(24) as usize != BITMAP_LEN {
        return Err(DecodeError::BitmapLength(u32_at(24)));
    }
    let first = shard * SHARD_OBJECTS;
    let bitmap = &body[FIXED_LEN..];
    Ok((0..SHARD_OBJECTS)
        .filter(|&bit| bitmap[(bit / 8) as usize] & (1 << (bit % 8)) != 0)
        .map(|bit| first + bit)
        .collect())
}

/// The objects the map of volume `id` (`objects` data objects long) marks, or `None` when a
/// shard is missing or unreadable (a volume from before the map, or damage): the caller
/// lists the pool instead and writes the map again.
pub async fn load(
    client: &Client,
    pool: u32,
    id: u64,
    objects: u64,
) -> Result<Option<BTreeSet<u64>>, VolumeError> {
    let reads = (0..shards_for(objects)).map(|shard| async move {
        let r = client
            .read(pool, &shard_object(id, shard), 0, SHARD_LEN as u64 + 1)
            .await;
        (shard, r)
    });
    let mut out = BTreeSet::new();
    for (shard, r) in crate::join::join_all(reads.collect()).await {
        match r {
            Ok(b) => match decode(&b, id, shard) {
                Ok(members) => out.extend(members),
                Err(why) => {
                    tracing::warn!(
                        volume = format_args!("{id:016x}"),
                        shard,
                        %why,
                        "allocation map shard is damaged; listing the pool instead"
                    );
                    return Ok(None);
                }
            },
            Err(ClientError::NoSuchObject { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(out))
}

/// Writes shard `shard` of volume `id` from `members`.
pub async fn store(
    client: &Client,
    pool: u32,
    id: u64,
    shard: u64,
    members: &BTreeSet<u64>,
) -> Result<(), ClientError> {
    client
        .write_full(pool, &shard_object(id, shard), &encode(id, shard, members))
        .await
        .map(|_| ())
}

/// Writes every shard covering `objects` data objects from `members`.
pub async fn store_all(
    client: &Client,
    pool: u32,
    id: u64,
    objects: u64,
    members: &BTreeSet<u64>,
) -> Result<(), ClientError> {
    let writes = (0..shards_for(objects)).map(|s| store(client, pool, id, s, members));
    crate::join::join_all(writes.collect())
        .await
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_round_trips_and_refuses_damage_and_strangers() {
        let members: BTreeSet<u64> = [SHARD_OBJECTS, SHARD_OBJECTS + 7, 2 * SHARD_OBJECTS - 1, 5]
            .into_iter()
            .collect();
        let b = encode(9, 1, &members);
        assert_eq!(b.len(), SHARD_LEN);
        assert_eq!(
            decode(&b, 9, 1).unwrap(),
            vec![SHARD_OBJECTS, SHARD_OBJECTS + 7, 2 * SHARD_OBJECTS - 1]
        );
        assert!(decode(&b, 8, 1).is_err(), "another volume's shard");
        assert!(decode(&b, 9, 0).is_err(), "another shard");
        for i in [0, 9, 13, 30, SHARD_LEN - 1] {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad, 9, 1).is_err(), "byte {i}");
        }
        assert!(decode(&b[..SHARD_LEN - 1], 9, 1).is_err());
        assert_eq!(shards_for(0), 1);
        assert_eq!(shards_for(SHARD_OBJECTS + 1), 2);
        assert_eq!(shard_of(SHARD_OBJECTS), 1);
        assert_eq!(volume_of(&shard_object(0xabc, 3)), Some(0xabc));
        assert_eq!(volume_of(b"valloc.0000000000000abc"), None);
        assert_eq!(volume_of(b"valloc.0000000000000abc.xyz00000"), None);
    }
}
