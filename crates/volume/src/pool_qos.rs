//! A pool's default QoS limits for its volumes (`vol qos set --pool-default`): object
//! `vqos.default` in the pool, versioned and checksummed (docs/format/volume.md, "QoS").
//! A volume without limits of its own is held to them; servers re-read them at every lease
//! renewal (2 s). The decoder is fuzzed (`fuzz/fuzz_targets/volume_snaps.rs` feeds it too).

use crate::decode_error::{DecodeError, Lengths, Record};
use crate::error::VolumeError;
use crate::snaps::Qos;
use cairn_client::{Client, ClientError};

const MAGIC: &[u8; 8] = b"CAIRNQOS";
/// Format version this code writes and reads.
pub const POOL_QOS_VERSION: u16 = 1;
/// Encoded length: magic, version, reserved, four limits, crc.
pub const POOL_QOS_LEN: usize = 8 + 2 + 2 + 4 * 8 + 4;
/// The object holding a pool's default limits.
pub const POOL_QOS_OBJECT: &[u8] = b"vqos.default";

/// The stored bytes.
pub fn encode(q: &Qos) -> Vec<u8> {
    let mut b = Vec::with_capacity(POOL_QOS_LEN);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&POOL_QOS_VERSION.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    for v in [q.iops, q.bps, q.iops_burst, q.bps_burst] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let crc = cairn_crc::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Parses and checks stored limits; the error says what is wrong.
pub fn decode(b: &[u8]) -> Result<Qos, DecodeError> {
    if b.len() != POOL_QOS_LEN {
        return Err(DecodeError::Length {
            len: b.len(),
            expected: Lengths {
                min: POOL_QOS_LEN,
                max: POOL_QOS_LEN,
            },
        });
    }
    if &b[..8] != MAGIC {
        return Err(DecodeError::BadMagic(Record::PoolQos));
    }
    let (body, crc) = b.split_at(POOL_QOS_LEN - 4);
    if cairn_crc::crc32c(body).to_le_bytes() != crc {
        return Err(DecodeError::Checksum);
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != POOL_QOS_VERSION {
        return Err(DecodeError::Version {
            record: Record::PoolQos,
            version,
        });
    }
    if b[10..12] != [0, 0] {
        return Err(DecodeError::Reserved);
    }
    let at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[12 + 8 * i..20 + 8 * i]);
        u64::from_le_bytes(a)
    };
    Ok(Qos {
        iops: at(0),
        bps: at(1),
        iops_burst: at(2),
        bps_burst: at(3),
    })
}

/// A pool's default limits (none set: no limits).
pub async fn read(client: &Client, pool: u32) -> Result<Qos, VolumeError> {
    match client
        .read(pool, POOL_QOS_OBJECT, 0, POOL_QOS_LEN as u64 + 1)
        .await
    {
        Ok(b) => decode(&b).map_err(|why| VolumeError::BadPoolQos { why }),
        Err(ClientError::NoSuchObject { .. }) => Ok(Qos::default()),
        Err(e) => Err(e.into()),
    }
}

/// Sets (or with no limits, clears) pool `pool_name`'s default limits. Servers apply them
/// at their next lease renewal (within 2 s).
pub async fn set(client: &Client, pool_name: &str, q: &Qos) -> Result<(), VolumeError> {
    let pool = client.pool_id(pool_name)?;
    if !q.is_limited() {
        return match client.remove(pool, POOL_QOS_OBJECT).await {
            Ok(()) | Err(ClientError::NoSuchObject { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    client.write_full(pool, POOL_QOS_OBJECT, &encode(q)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let q = Qos {
            iops: 2000,
            bps: 100 << 20,
            iops_burst: 0,
            bps_burst: 7,
        };
        let b = encode(&q);
        assert_eq!(decode(&b), Ok(q));
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x08;
            assert!(decode(&d).is_err(), "flip at byte {i} accepted");
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = decode(&b);
        }
    }
}
