//! A member's scrub map: a digest of each object of a range, taken on the PG's shard so that
//! all of them describe the PG at one version.

use crate::failure::Failure;
use crate::peering::copy::last_version;
use crate::pgstate::coll_of;
use cairn_map::PgId;
use cairn_proto::msg::peering::RECOVERY_CHUNK;
use cairn_proto::msg::scrub::{
    PgScrub, PgScrubMap, ScrubEntry, MAX_SCRUB_OBJECTS, SCRUB_CHUNK_BYTES,
};
use cairn_store::Store;

/// Digests the objects `req` asks for. Runs on the PG's shard: no write of the PG lands
/// between the first object read and the last.
pub fn build(store: &Store, pg: PgId, req: &PgScrub) -> Result<PgScrubMap, Failure> {
    let coll = coll_of(pg);
    let version = last_version(store, pg);
    let mut map = PgScrubMap {
        version,
        objects: Vec::new(),
        more: false,
    };
    if !req.names.is_empty() {
        if req.names.len() > MAX_SCRUB_OBJECTS as usize {
            return Err(Failure::protocol(format!(
                "a scrub asks for {} objects; at most {MAX_SCRUB_OBJECTS} are allowed",
                req.names.len()
            )));
        }
        map.objects = req.names.iter().map(|n| digest(store, pg, n)).collect();
        return Ok(map);
    }
    if !store.collection_exists(coll) {
        return Ok(map);
    }
    let names = store.list_objects(coll, req.after.as_deref(), MAX_SCRUB_OBJECTS as usize + 1)?;
    let mut bytes = 0u64;
    for (i, name) in names.iter().enumerate() {
        if i == MAX_SCRUB_OBJECTS as usize || bytes >= SCRUB_CHUNK_BYTES {
            map.more = true;
            break;
        }
        let e = digest(store, pg, name);
        bytes += e.size;
        map.objects.push(e);
    }
    Ok(map)
}

/// Reads of one object before a checksum mismatch counts as damage.
const READ_TRIES: u32 = 3;

/// CRC-32C of an object's `size` bytes, read from the device.
fn data_crc(
    store: &Store,
    coll: cairn_store::CollId,
    name: &[u8],
    size: u64,
) -> Result<u32, cairn_store::StoreError> {
    let (mut crc, mut off) = (0, 0);
    while off < size {
        let b = store.read_uncached(coll, name, off, RECOVERY_CHUNK)?;
        if b.is_empty() {
            break;
        }
        crc = cairn_crc::crc32c_append(crc, &b);
        off += b.len() as u64;
    }
    Ok(crc)
}

/// One object's digest: size, CRC-32C of its bytes as the device holds them, of its
/// attributes, or why it cannot be read.
pub fn digest(store: &Store, pg: PgId, name: &[u8]) -> ScrubEntry {
    let coll = coll_of(pg);
    let mut e = ScrubEntry {
        name: name.to_vec(),
        exists: false,
        size: 0,
        data_crc: 0,
        attrs_crc: 0,
        damage: None,
    };
    let Ok(st) = store.stat(coll, name) else {
        return e;
    };
    e.exists = true;
    e.size = st.size;
    // A block the store moves while it is read fails its check once; damage stays.
    let mut tries = 0;
    loop {
        match data_crc(store, coll, name, st.size) {
            Ok(crc) => {
                e.data_crc = crc;
                break;
            }
            Err(_) if tries < READ_TRIES => tries += 1,
            Err(err) => {
                e.damage = Some(err.to_string());
                return e;
            }
        }
    }
    match store.attrs(coll, name) {
        Ok(attrs) => {
            for (k, v) in attrs {
                for part in [&k, &v] {
                    let len = (part.len() as u64).to_le_bytes();
                    e.attrs_crc = cairn_crc::crc32c_append(e.attrs_crc, &len);
                    e.attrs_crc = cairn_crc::crc32c_append(e.attrs_crc, part);
                }
            }
        }
        Err(err) => e.damage = Some(format!("attributes: {err}")),
    }
    e
}
