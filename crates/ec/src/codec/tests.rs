//! Property tests of the codec: rebuilds over random erasures, and partial writes applied by
//! parity delta against a model of the object.

use super::*;
use crate::layout::pieces;
use proptest::prelude::*;

fn profile() -> impl Strategy<Value = Profile> {
    (1u32..=8, 1u32..=4, 1u32..=2).prop_map(|(k, m, u)| Profile::new(k, m, u * 4096).unwrap())
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Shard i of a stripe set: `shards[i]` holds chunk i of every stripe, back to back.
fn encode_all(c: &Codec, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut all = data.to_vec();
    all.extend(c.encode(&refs).unwrap());
    all
}

/// Which shards to lose: `lost` distinct indexes out of `n`, chosen by `pick`.
fn choose(n: usize, lost: usize, pick: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    let mut x = pick | 1;
    for i in (1..n).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        idx.swap(i, (x >> 33) as usize % (i + 1));
    }
    idx.truncate(lost);
    idx
}

proptest! {
    /// Any m shards lost (data, parity, or both) are rebuilt exactly; more than m lost is
    /// an error naming how many are present, and nothing is made up.
    #[test]
    fn any_m_lost_shards_are_rebuilt_and_more_are_refused(
        p in profile(), stripes in 1usize..4, seed: u64, pick: u64, extra in 0usize..2,
    ) {
        let c = Codec::new(p).unwrap();
        let len = stripes * p.unit() as usize;
        let data: Vec<Vec<u8>> = (0..p.k()).map(|i| bytes(seed ^ u64::from(i) << 40, len)).collect();
        let all = encode_all(&c, &data);
        let refs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        prop_assert!(c.verify(&refs).unwrap());
        let n = p.shards() as usize;
        let lost = (p.m() as usize + extra).min(n);
        let mut shards: Vec<Option<Vec<u8>>> = all.iter().cloned().map(Some).collect();
        for i in choose(n, lost, pick) {
            shards[i] = None;
        }
        if lost <= p.m() as usize {
            c.reconstruct(&mut shards).unwrap();
            let got: Vec<Vec<u8>> = shards.into_iter().map(Option::unwrap).collect();
            prop_assert!(got == all, "a rebuilt shard differs from the one lost");
        } else {
            let err = c.reconstruct(&mut shards).unwrap_err();
            prop_assert_eq!(err, EcError::TooFewShards { profile: p, have: n - lost, need: p.k() as usize });
        }
    }

    /// Writes at any offset and length, applied the way an EC PG applies them (each piece to
    /// its data shard, its parity delta XORed into the same range of every parity shard),
    /// leave the parity a full encode gives, and every m-shard loss decodes to the model.
    #[test]
    fn partial_writes_by_parity_delta_match_a_model(
        p in profile(),
        writes in proptest::collection::vec((0u64..1 << 16, 1u64..20_000, any::<u64>()), 1..12),
        pick: u64,
    ) {
        let c = Codec::new(p).unwrap();
        let stripes = 4usize;
        let size = stripes as u64 * p.stripe_width();
        let unit = p.unit() as usize;
        let mut model = vec![0u8; size as usize];
        // A zeroed object: zero parity is right for zero data.
        let mut shards = vec![vec![0u8; stripes * unit]; p.shards() as usize];
        for (off, len, seed) in writes {
            let off = off % size;
            let len = len.min(size - off);
            let buf = bytes(seed, len as usize);
            model[off as usize..(off + len) as usize].copy_from_slice(&buf);
            for piece in pieces(&p, off, len) {
                let at = piece.shard_off(&p) as usize;
                let range = at..at + piece.len as usize;
                let new = &buf[piece.buf_off as usize..][..piece.len as usize];
                let old = shards[piece.chunk as usize][range.clone()].to_vec();
                let delta = c.parity_delta(piece.chunk, &old, new).unwrap();
                shards[piece.chunk as usize][range.clone()].copy_from_slice(new);
                for (j, d) in delta.iter().enumerate() {
                    xor_into(&mut shards[p.k() as usize + j][range.clone()], d);
                }
            }
        }
        let data = shards[..p.k() as usize].to_vec();
        prop_assert!(encode_all(&c, &data) == shards, "parity by delta differs from a full encode");
        let mut lossy: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
        for i in choose(p.shards() as usize, p.m() as usize, pick) {
            lossy[i] = None;
        }
        c.reconstruct_data(&mut lossy).unwrap();
        let mut read = vec![0u8; size as usize];
        for piece in pieces(&p, 0, size) {
            let at = piece.shard_off(&p) as usize;
            let shard = lossy[piece.chunk as usize].as_ref().unwrap();
            read[piece.buf_off as usize..][..piece.len as usize]
                .copy_from_slice(&shard[at..at + piece.len as usize]);
        }
        prop_assert!(read == model, "a degraded read of the whole object differs from the model");
    }
}

#[test]
fn bad_shard_sets_are_refused_with_what_is_wrong() {
    let p = Profile::new(4, 2, 4096).unwrap();
    let c = Codec::new(p).unwrap();
    let a = vec![1u8; 4096];
    let short = vec![1u8; 100];
    assert_eq!(
        c.encode(&[&a, &a, &a]).unwrap_err(),
        EcError::ShardCount {
            profile: p,
            got: 3,
            want: 4
        }
    );
    assert!(matches!(
        c.encode(&[&a, &a, &a, &short]),
        Err(EcError::ShardSizes { .. })
    ));
    assert!(matches!(
        c.parity_delta(4, &a, &a),
        Err(EcError::NoSuchChunk { chunk: 4, .. })
    ));
    assert!(matches!(
        c.parity_delta(0, &a, &short),
        Err(EcError::DeltaLengths { .. })
    ));
    let mut mixed = vec![
        Some(a.clone()),
        Some(short),
        Some(a.clone()),
        Some(a.clone()),
        None,
        None,
    ];
    assert!(matches!(
        c.reconstruct(&mut mixed),
        Err(EcError::ShardSizes { .. })
    ));
    // An unchanged chunk changes no parity.
    assert!(c
        .parity_delta(2, &a, &a)
        .unwrap()
        .iter()
        .all(|d| d.iter().all(|&b| b == 0)));
    // Bit rot in one chunk of a stripe: the parity no longer verifies.
    let data = [a.clone(), a.clone(), a.clone(), a.clone()];
    let mut all = encode_all(&c, &data);
    all[1][17] ^= 0x40;
    let refs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
    assert!(!c.verify(&refs).unwrap());
}
