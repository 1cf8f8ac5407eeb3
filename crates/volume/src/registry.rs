//! The holder registry: which processes have a volume open, so that finding the open leases
//! reads one object instead of listing the pool.
//!
//! `vholders.<id:016x>` lists each holder's id (its lease object is `vopen.<id>.<holder>`),
//! when it registered and whether it writes (docs/format/volume.md, "The holder registry").
//! A process registers before writing its lease and unregisters after removing it; every
//! change is a compare-and-swap, so concurrent opens and closes lose nobody.

use crate::decode_error::{DecodeError, Lengths, Record};
use crate::error::VolumeError;
use crate::lease::{lease_object, now_ms, LeaseRecord, LEASE_FOR};
use cairn_client::{contents_tag, Client, ClientError};

const MAGIC: &[u8; 8] = b"CAIRNHLD";
/// Format version this code writes and reads.
pub const REGISTRY_VERSION: u16 = 1;
/// Most holders one volume may have at once.
pub const MAX_HOLDERS: usize = 1024;
const ENTRY_LEN: usize = 8 + 8 + 1;
const FIXED_LEN: usize = 8 + 2 + 2;
/// Largest encoded registry (readers ask for one byte more).
pub const MAX_REGISTRY_LEN: usize = FIXED_LEN + MAX_HOLDERS * ENTRY_LEN + 4;
/// Prefix of registry object names.
pub const REGISTRY_PREFIX: &str = "vholders.";
/// Conflicting changes retried before giving up (each retry re-reads the registry).
const ATTEMPTS: u32 = 64;

/// One registered holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub holder: u64,
    /// Wall-clock registration time, milliseconds since the Unix epoch.
    pub since_ms: u64,
    pub writer: bool,
}

/// Object name of volume `id`'s registry.
pub fn registry_object(id: u64) -> Vec<u8> {
    format!("{REGISTRY_PREFIX}{id:016x}").into_bytes()
}

/// The volume id of a registry object name.
pub fn volume_of(object: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(object)
        .ok()?
        .strip_prefix(REGISTRY_PREFIX)?;
    (s.len() == 16).then(|| u64::from_str_radix(s, 16).ok())?
}

/// Encodes a registry (at most [`MAX_HOLDERS`] entries: the caller checks).
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::with_capacity(FIXED_LEN + entries.len() * ENTRY_LEN + 4);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&REGISTRY_VERSION.to_le_bytes());
    v.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for e in entries {
        v.extend_from_slice(&e.holder.to_le_bytes());
        v.extend_from_slice(&e.since_ms.to_le_bytes());
        v.push(u8::from(e.writer));
    }
    v.extend_from_slice(&cairn_crc::crc32c(&v).to_le_bytes());
    v
}

/// Decodes a registry; anything malformed is an error.
pub fn decode(b: &[u8]) -> Result<Vec<Entry>, DecodeError> {
    if b.len() < FIXED_LEN + 4 || b.len() > MAX_REGISTRY_LEN {
        return Err(DecodeError::Length {
            len: b.len(),
            expected: Lengths {
                min: FIXED_LEN + 4,
                max: MAX_REGISTRY_LEN,
            },
        });
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if cairn_crc::crc32c(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return Err(DecodeError::Checksum);
    }
    if &body[..8] != MAGIC {
        return Err(DecodeError::BadMagic(Record::Registry));
    }
    let version = u16::from_le_bytes([body[8], body[9]]);
    if version != REGISTRY_VERSION {
        return Err(DecodeError::Version {
            record: Record::Registry,
            version,
        });
    }
    let n = usize::from(u16::from_le_bytes([body[10], body[11]]));
    if n > MAX_HOLDERS || body.len() != FIXED_LEN + n * ENTRY_LEN {
        return Err(DecodeError::Entries {
            entries: n,
            len: body.len(),
        });
    }
    body[FIXED_LEN..]
        .chunks_exact(ENTRY_LEN)
        .map(|c| {
            let u64_at = |at: usize| {
                let mut x = [0u8; 8];
                x.copy_from_slice(&c[at..at + 8]);
                u64::from_le_bytes(x)
            };
            match c[16] {
                0 | 1 => Ok(Entry {
                    holder: u64_at(0),
                    since_ms: u64_at(8),
                    writer: c[16] == 1,
                }),
                f => Err(DecodeError::WriterFlag(f)),
            }
        })
        .collect()
}

/// Volume `id`'s registry (empty when absent) and its contents tag.
pub async fn read(
    client: &Client,
    pool: u32,
    name: &str,
    id: u64,
) -> Result<(Vec<Entry>, u64), VolumeError> {
    match client
        .read(pool, &registry_object(id), 0, MAX_REGISTRY_LEN as u64 + 1)
        .await
    {
        Ok(b) => match decode(&b) {
            Ok(e) => Ok((e, contents_tag(&b))),
            Err(why) => Err(VolumeError::BadRegistry {
                name: name.to_string(),
                id,
                why,
            }),
        },
        Err(ClientError::NoSuchObject { .. }) => Ok((Vec::new(), 0)),
        Err(e) => Err(e.into()),
    }
}

/// Changes the registry with `change` (given the entries, returns whether to write), as a
/// compare-and-swap retried on conflict.
async fn update(
    client: &Client,
    pool: u32,
    name: &str,
    id: u64,
    change: impl Fn(&mut Vec<Entry>) -> Result<bool, VolumeError>,
) -> Result<(), VolumeError> {
    for attempt in 0..ATTEMPTS {
        let (mut entries, tag) = read(client, pool, name, id).await?;
        if !change(&mut entries)? {
            return Ok(());
        }
        let obj = registry_object(id);
        let r = match entries.is_empty() {
            true if tag != 0 => client.remove_if(pool, &obj, tag).await,
            true => Ok(()),
            false => {
                client
                    .write_full_if(pool, &obj, tag, &encode(&entries))
                    .await
            }
        };
        match r {
            Ok(()) | Err(ClientError::NoSuchObject { .. }) => return Ok(()),
            Err(ClientError::Conflict { .. }) => {
                let pause = 1 + u64::from(attempt) * 2 + rand::random::<u64>() % 5;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(VolumeError::Conflict {
        name: name.to_string(),
    })
}

/// Registers `holder` (before it writes its lease).
pub async fn register(
    client: &Client,
    pool: u32,
    name: &str,
    id: u64,
    holder: u64,
    writer: bool,
) -> Result<(), VolumeError> {
    update(client, pool, name, id, |entries| {
        if entries.iter().any(|e| e.holder == holder) {
            return Ok(false);
        }
        if entries.len() >= MAX_HOLDERS {
            return Err(VolumeError::BadArgument {
                what: "open",
                why: format!("volume {name:?} is open by {MAX_HOLDERS} processes, the most it may"),
            });
        }
        entries.push(Entry {
            holder,
            since_ms: now_ms(),
            writer,
        });
        Ok(true)
    })
    .await
}

/// Unregisters `holders` (after their leases are gone).
pub async fn unregister(
    client: &Client,
    pool: u32,
    name: &str,
    id: u64,
    holders: &[u64],
) -> Result<(), VolumeError> {
    update(client, pool, name, id, |entries| {
        let before = entries.len();
        entries.retain(|e| !holders.contains(&e.holder));
        Ok(entries.len() != before)
    })
    .await
}

/// Every registered holder's lease: its object name and record. A holder registered for
/// longer than a lease lasts without a lease record (it died before writing one, or after
/// removing it) is dropped from the registry; a younger one counts as a live lease of its
/// kind (it is about to write it).
pub async fn leases(
    client: &Client,
    pool: u32,
    name: &str,
    id: u64,
) -> Result<Vec<(Vec<u8>, LeaseRecord)>, VolumeError> {
    let (entries, _) = read(client, pool, name, id).await?;
    let mut found = Vec::new();
    let mut gone = Vec::new();
    for e in entries {
        let object = lease_object(id, e.holder);
        match crate::remove::read_lease(client, pool, &object).await? {
            Some(r) => found.push((object, r)),
            None if now_ms().saturating_sub(e.since_ms) > LEASE_FOR.as_millis() as u64 => {
                gone.push(e.holder)
            }
            None => found.push((
                object,
                LeaseRecord {
                    holder: e.holder,
                    expires_at_ms: e.since_ms + LEASE_FOR.as_millis() as u64,
                    pid: 0,
                    desc: "a process opening the volume".into(),
                    acked_gen: 0,
                    rates: Default::default(),
                    writer: e.writer,
                },
            )),
        }
    }
    if !gone.is_empty() {
        if let Err(e) = unregister(client, pool, name, id, &gone).await {
            tracing::debug!(volume = name, error = %e, "could not drop dead holders from the registry");
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_round_trips_and_refuses_damage() {
        let e = vec![
            Entry {
                holder: 7,
                since_ms: 1000,
                writer: true,
            },
            Entry {
                holder: u64::MAX,
                since_ms: 0,
                writer: false,
            },
        ];
        let b = encode(&e);
        assert_eq!(decode(&b).unwrap(), e);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x04;
            assert!(decode(&bad).is_err(), "byte {i}");
        }
        assert!(decode(&b[..b.len() - 1]).is_err());
        assert_eq!(volume_of(&registry_object(0xab)), Some(0xab));
        assert_eq!(volume_of(b"vholders.12"), None);
    }
}
