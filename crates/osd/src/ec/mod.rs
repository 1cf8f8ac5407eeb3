//! Erasure-coded PGs (docs/format/ec.md). The primary (the first present shard) turns each
//! client write into one sub-write per shard (`plan.rs`, `write.rs`), reads from the data
//! shards a read covers or decodes from any k (`read.rs`), and peers the PG's shards
//! (`peer.rs`); members apply sub-writes and serve reads of their shard (`member.rs`) over
//! the same ordered links as replicated writes (`remote.rs` for the reads' answers).

pub mod error;
mod gather;
pub mod member;
pub mod peer;
pub mod plan;
mod read;
pub mod rebuild;
pub mod remote;
pub mod scrub;
mod write;

pub use read::read;
pub use write::{resume, unbusy, write};

use cairn_ec::{Codec, Profile};
use cairn_map::{ClusterMap, EcProfile, PgId};
use cairn_store::{CollId, Store, StoreError};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// Attribute of every shard object: the object's logical size (u64 little-endian).
pub const SIZE_ATTR: &[u8] = b"ec_size";

/// Attribute of every shard object: the PG version of the last write it holds (u64
/// little-endian; 0 while a rebuild's pushes are under way).
pub const VERSION_ATTR: &[u8] = b"ec_ver";

/// The store collection of shard `shard` of an EC PG: the PG's own collection id with
/// `shard + 1` in bits 24..32 (PG numbers stay below 2^16), so an OSD can hold two shards of
/// one PG while data moves.
pub fn shard_coll(pg: PgId, shard: u8) -> CollId {
    crate::pgstate::coll_of(pg) | ((u64::from(shard) + 1) << 24)
}

thread_local! {
    /// Codecs by profile: building one inverts matrices, once per thread and profile.
    static CODECS: RefCell<HashMap<Profile, Arc<Codec>>> = RefCell::new(HashMap::new());
}

/// The codec of a pool's profile (`None` for a profile the map should not hold).
pub fn codec(p: EcProfile) -> Option<Arc<Codec>> {
    let profile = p.check().ok()?;
    CODECS.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(codec) = c.get(&profile) {
            return Some(codec.clone());
        }
        let codec = Arc::new(Codec::new(profile).ok()?);
        c.insert(profile, codec.clone());
        Some(codec)
    })
}

/// The shard `me` holds of `pg` in `map`, if any.
pub fn my_shard(map: &ClusterMap, pg: PgId, me: u32) -> Option<u8> {
    let placement = map.pg_placement(pg);
    map.pg_shards(pg, &placement)
        .iter()
        .position(|s| *s == Some(me))
        .map(|i| i as u8)
}

/// The logical size a shard keeps of `obj` (`None` when the shard holds no such object).
pub fn shard_size(store: &Store, coll: CollId, obj: &[u8]) -> Result<Option<u64>, StoreError> {
    match store.get_attr(coll, obj, SIZE_ATTR) {
        Ok(Some(v)) => Ok(Some(decode_size(&v))),
        // An object without the attribute is not an EC shard object: it is not there.
        Ok(None) => Ok(None),
        Err(StoreError::NoObject { .. }) | Err(StoreError::NoCollection(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a shard holds of `obj`: its logical size and the version of its last write (`None`
/// when the shard holds no such object).
pub fn object_state(
    store: &Store,
    coll: CollId,
    obj: &[u8],
) -> Result<Option<cairn_proto::msg::ec_rebuild::EcObjectState>, StoreError> {
    let Some(size) = shard_size(store, coll, obj)? else {
        return Ok(None);
    };
    let version = match store.get_attr(coll, obj, VERSION_ATTR) {
        Ok(v) => v.map_or(0, |v| decode_size(&v)),
        Err(StoreError::NoObject { .. }) | Err(StoreError::NoCollection(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(cairn_proto::msg::ec_rebuild::EcObjectState {
        size,
        version,
    }))
}

fn decode_size(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[..n].copy_from_slice(&v[..n]);
    u64::from_le_bytes(b)
}

/// `len` bytes of a shard object at `offset`, zeros past its end (or where it is absent).
pub fn read_padded(
    store: &Store,
    coll: CollId,
    obj: &[u8],
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, StoreError> {
    let mut data = match store.read(coll, obj, offset, len) {
        Ok(d) => d,
        Err(StoreError::NoObject { .. }) | Err(StoreError::NoCollection(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    data.resize(len as usize, 0);
    Ok(data)
}

/// The last version a shard collection holds (0 when it does not exist).
pub fn shard_version(store: &Store, coll: CollId) -> u64 {
    store
        .kv_get(coll, crate::pgstate::VERSION_KEY)
        .ok()
        .flatten()
        .map_or(0, |v| decode_size(&v))
}

/// The kept log of a shard collection (empty when the shard holds nothing yet).
pub fn shard_entries(
    store: &cairn_store::Store,
    coll: cairn_store::CollId,
) -> Result<Vec<crate::pglog::LogEntry>, crate::pglog::LogError> {
    if !store.collection_exists(coll) {
        return Ok(Vec::new());
    }
    crate::pglog::read_after(store, coll, 0, crate::pglog::MAX_PEER_ENTRIES)
}

/// Sends an op reply without data.
fn reply(to: &cairn_transport::FrameSender, req_id: u64, r: &cairn_proto::msg::osd::OpReply) {
    crate::op::reply::reply(to, req_id, r, &[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_collection_names_its_pg() {
        // At start, collections are mapped back to PGs (splits, strays, reclaim): a shard's
        // must name its own PG, never a PG number past the pool's count.
        let pg = PgId {
            pool: 7,
            pg: 0xfffe,
        };
        for s in [0u8, 1, 31] {
            let c = shard_coll(pg, s);
            assert_ne!(c, crate::pgstate::coll_of(pg));
            assert_eq!(crate::pgstate::pg_of(c), pg);
        }
    }
}
