//! The write planner against a model: random writes, whole-object writes, zeroing, cuts and
//! removes, each planned from the old bytes it asks for and applied to in-memory shards,
//! must leave data shards holding the model object's bytes (zeros past it) and parity
//! shards holding what a full encode of each stripe gives.

use super::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Shard objects in memory, with what a store read past the end gives (zeros).
struct Shards(Vec<Vec<u8>>);

impl Shards {
    fn read(&self, shard: u32, off: u64, len: u32) -> Vec<u8> {
        let s = &self.0[shard as usize];
        let mut out = vec![0u8; len as usize];
        for (i, b) in out.iter_mut().enumerate() {
            if let Some(v) = s.get(off as usize + i) {
                *b = *v;
            }
        }
        out
    }

    fn apply(&mut self, plan: &Plan) {
        for (s, w) in self.0.iter_mut().zip(&plan.shards) {
            let mut at = 0usize;
            for op in &w.ops {
                let n = op.payload_len() as usize;
                let bytes = &w.payload[at..at + n];
                at += n;
                match *op {
                    EcShardOp::Write { offset, .. } | EcShardOp::Xor { offset, .. } => {
                        let off = offset as usize;
                        if s.len() < off + n {
                            s.resize(off + n, 0);
                        }
                        let xor = matches!(op, EcShardOp::Xor { .. });
                        for (d, b) in s[off..off + n].iter_mut().zip(bytes) {
                            *d = if xor { *d ^ b } else { *b };
                        }
                    }
                    EcShardOp::Truncate { len } => s.resize(len as usize, 0),
                    EcShardOp::Remove => s.clear(),
                }
            }
            assert_eq!(at, w.payload.len(), "ops take the whole payload");
        }
    }
}

fn check(codec: &Codec, shards: &Shards, model: &[u8]) {
    let p = codec.profile();
    let unit = p.unit() as u64;
    let stripes = (model.len() as u64).div_ceil(p.stripe_width()) + 1;
    for s in 0..stripes {
        let data: Vec<Vec<u8>> = (0..p.k())
            .map(|i| shards.read(i, s * unit, p.unit()))
            .collect();
        for (i, chunk) in data.iter().enumerate() {
            for (b, got) in chunk.iter().enumerate() {
                let at = s * p.stripe_width() + i as u64 * unit + b as u64;
                let want = model.get(at as usize).copied().unwrap_or(0);
                assert_eq!(*got, want, "object byte {at} (shard {i})");
            }
        }
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = codec.encode(&refs).expect("encode");
        for (j, want) in parity.iter().enumerate() {
            let got = shards.read(p.k() + j as u32, s * unit, p.unit());
            assert_eq!(&got, want, "parity {j} of stripe {s}");
        }
    }
}

fn run(k: u32, m: u32, seed: u64) {
    let codec = Codec::new(Profile::new(k, m, 4096).expect("profile")).expect("codec");
    let p = codec.profile();
    let w = p.stripe_width();
    let mut rng = Rng(seed);
    let mut shards = Shards(vec![Vec::new(); p.shards() as usize]);
    let mut model: Vec<u8> = Vec::new();
    let mut read_nothing = 0;
    for step in 0..300 {
        let old_size = model.len() as u64;
        let fill = (step as u8).wrapping_mul(37) | 1;
        let len = 1 + rng.below(3 * w);
        let offset = match rng.below(3) {
            0 => rng.below(4 * w) / w * w, // stripe-aligned
            _ => rng.below(4 * w),
        };
        let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
        let change = match rng.below(10) {
            0 => Change::Full { data: &data },
            1 => Change::Zero { offset, len },
            2 => Change::Truncate {
                size: rng.below(4 * w),
            },
            3 if rng.below(4) == 0 => Change::Remove,
            _ => Change::Write {
                offset,
                data: &data,
            },
        };
        let want = reads(&p, old_size, change);
        if want.is_empty() {
            read_nothing += 1;
        }
        let old: OldBytes = want
            .iter()
            .map(|r| (*r, shards.read(r.shard, r.shard_off, r.len)))
            .collect();
        let plan = plan(&codec, old_size, change, &old).expect("plan");
        shards.apply(&plan);
        match change {
            Change::Write { offset, data } => {
                let end = offset as usize + data.len();
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[offset as usize..end].copy_from_slice(data);
            }
            Change::Full { data } => model = data.to_vec(),
            Change::Zero { offset, len } => {
                let end = ((offset + len) as usize).min(model.len());
                if (offset as usize) < end {
                    model[offset as usize..end].fill(0);
                }
            }
            Change::Truncate { size } => model.resize(size as usize, 0),
            Change::Remove => model.clear(),
        }
        assert_eq!(plan.size, model.len() as u64, "size after {change:?}");
        check(&codec, &shards, &model);
    }
    assert!(
        read_nothing > 20,
        "whole-stripe writes read nothing: {read_nothing}"
    );
}

#[test]
fn planned_writes_keep_every_stripe_decodable_and_equal_to_the_model() {
    for (k, m, seed) in [(2, 1, 7), (4, 2, 11), (3, 2, 99), (1, 1, 5)] {
        run(k, m, seed);
    }
}

#[test]
fn whole_stripes_and_appends_read_nothing_and_partial_writes_read_only_their_range() {
    let p = Profile::new(4, 2, 4096).expect("profile");
    let data = vec![1u8; p.stripe_width() as usize];
    let whole = Change::Write {
        offset: p.stripe_width(),
        data: &data,
    };
    assert!(reads(&p, 10 * p.stripe_width(), whole).is_empty());
    let append = Change::Write {
        offset: 2 * p.stripe_width(),
        data: &data[..100],
    };
    assert!(reads(&p, 2 * p.stripe_width(), append).is_empty());
    let small = Change::Write {
        offset: 4096 + 100,
        data: &data[..200],
    };
    let want = reads(&p, 10 * p.stripe_width(), small);
    assert_eq!(
        want,
        vec![OldRange {
            shard: 1,
            shard_off: 100,
            len: 200
        }]
    );
}
