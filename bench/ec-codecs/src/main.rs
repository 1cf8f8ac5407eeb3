//! Encode, decode (m data chunks lost) and single-chunk parity-delta throughput of
//! reed-solomon-simd and reed-solomon-erasure at the profiles Cairn offers, one JSON line
//! per (crate, k, m, chunk size). MB/s are of data bytes (k chunks; the changed chunk for
//! a delta). Each figure is the best of 5 rounds of at least 200 ms.

use reed_solomon_erasure::galois_8::ReedSolomon;
use std::time::{Duration, Instant};

const PROFILES: [(usize, usize); 6] = [(2, 1), (4, 2), (6, 2), (6, 3), (8, 3), (10, 2)];
const CHUNKS: [usize; 3] = [4 << 10, 16 << 10, 64 << 10];

fn main() {
    for (k, m) in PROFILES {
        for chunk in CHUNKS {
            let data: Vec<Vec<u8>> = (0..k).map(|i| pattern(i, chunk)).collect();
            report("reed-solomon-simd", k, m, chunk, simd(k, m, &data));
            report("reed-solomon-erasure", k, m, chunk, erasure(k, m, &data));
        }
    }
}

/// (encode, decode, delta) rounds per second.
type Rates = (f64, f64, f64);

fn report(name: &str, k: usize, m: usize, chunk: usize, (enc, dec, delta): Rates) {
    let mb = |per_sec: f64, bytes: usize| per_sec * bytes as f64 / 1e6;
    println!(
        "{{\"crate\":\"{name}\",\"k\":{k},\"m\":{m},\"chunk_bytes\":{chunk},\
         \"encode_mb_s\":{:.0},\"decode_mb_s\":{:.0},\"delta_mb_s\":{:.0},\"delta_us\":{:.2}}}",
        mb(enc, k * chunk),
        mb(dec, k * chunk),
        mb(delta, chunk),
        1e6 / delta
    );
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed as u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Rounds per second of `f`, best of 5.
fn rate(mut f: impl FnMut()) -> f64 {
    let mut best = 0f64;
    for _ in 0..5 {
        let (start, mut n) = (Instant::now(), 0u64);
        while start.elapsed() < Duration::from_millis(200) {
            f();
            n += 1;
        }
        best = best.max(n as f64 / start.elapsed().as_secs_f64());
    }
    best
}

fn simd(k: usize, m: usize, data: &[Vec<u8>]) -> Rates {
    let chunk = data[0].len();
    let mut enc = reed_solomon_simd::ReedSolomonEncoder::new(k, m, chunk).unwrap();
    let mut parity: Vec<Vec<u8>> = Vec::new();
    let e = rate(|| {
        for d in data {
            enc.add_original_shard(d).unwrap();
        }
        let r = enc.encode().unwrap();
        parity = r.recovery_iter().map(|p| p.to_vec()).collect();
    });
    // Lose the first m data chunks: decode from the rest and the parity.
    let mut dec = reed_solomon_simd::ReedSolomonDecoder::new(k, m, chunk).unwrap();
    let lost = m.min(k);
    let d = rate(|| {
        for (i, c) in data.iter().enumerate().skip(lost) {
            dec.add_original_shard(i, c).unwrap();
        }
        for (i, p) in parity.iter().enumerate() {
            dec.add_recovery_shard(i, p).unwrap();
        }
        let r = dec.decode().unwrap();
        assert_eq!(r.restored_original(0).unwrap(), &data[0][..]);
    });
    // Parity delta for chunk 1: the code is linear, so the parity of (old ^ new) with every
    // other chunk zero is what the parity changes by.
    let zero = vec![0u8; chunk];
    let delta = pattern(99, chunk);
    let mut new_parity = parity.clone();
    let t = rate(|| {
        for i in 0..k {
            enc.add_original_shard(if i == 1 { &delta } else { &zero })
                .unwrap();
        }
        let r = enc.encode().unwrap();
        for (p, dp) in new_parity.iter_mut().zip(r.recovery_iter()) {
            xor(p, dp);
        }
    });
    check_delta_simd(k, m, data, &parity, &delta);
    (e, d, t)
}

fn check_delta_simd(k: usize, m: usize, data: &[Vec<u8>], parity: &[Vec<u8>], delta: &[u8]) {
    let mut changed = data.to_vec();
    xor(&mut changed[1], delta);
    let full = reed_solomon_simd::encode(k, m, &changed).unwrap();
    let zero = vec![0u8; delta.len()];
    let dp = reed_solomon_simd::encode(
        k,
        m,
        (0..k).map(|i| if i == 1 { delta } else { &zero[..] }),
    )
    .unwrap();
    for ((p, d), f) in parity.iter().zip(&dp).zip(&full) {
        let mut q = p.clone();
        xor(&mut q, d);
        assert_eq!(&q, f, "parity delta differs from a full encode");
    }
}

fn erasure(k: usize, m: usize, data: &[Vec<u8>]) -> Rates {
    let chunk = data[0].len();
    let rs = ReedSolomon::new(k, m).unwrap();
    let mut shards: Vec<Vec<u8>> = data.to_vec();
    shards.extend((0..m).map(|_| vec![0u8; chunk]));
    let e = rate(|| rs.encode(&mut shards).unwrap());
    let lost = m.min(k);
    let d = rate(|| {
        let mut opt: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
        for s in opt.iter_mut().take(lost) {
            *s = None;
        }
        rs.reconstruct_data(&mut opt).unwrap();
        assert_eq!(opt[0].as_deref(), Some(&data[0][..]));
    });
    let delta = pattern(99, chunk);
    let mut parity: Vec<Vec<u8>> = shards[k..].to_vec();
    let mut scratch: Vec<Vec<u8>> = (0..m).map(|_| vec![0u8; chunk]).collect();
    let t = rate(|| {
        // encode_single_sep(0, ..) writes chunk 0's contribution: for the delta of one
        // chunk the contribution of (old ^ new) at its index is added to the parity.
        for s in scratch.iter_mut() {
            s.fill(0);
        }
        rs.encode_single_sep(1, &delta, &mut scratch).unwrap();
        for (p, s) in parity.iter_mut().zip(&scratch) {
            xor(p, s);
        }
    });
    (e, d, t)
}

fn xor(a: &mut [u8], b: &[u8]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}
