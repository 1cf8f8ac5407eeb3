//! The deterministic workload of `cairn store torture`, and a model of its effects.
//!
//! Shared with `crates/cli/tests/kill9.rs` (included there by `#[path]`), which replays the
//! same transactions into [`Model`] to know exactly what the store must hold.
//!
//! Thread `t` commits transactions numbered `c = 1, 2, ...`; transaction `c` is a pure
//! function of `(seed, t, c)` ([`txn`]). Threads touch disjoint objects and keys, so the
//! state a thread owns after any crash must equal the model after replaying that thread's
//! transactions `1..=R`, where `R` is the counter its key [`ctr_key`] holds. Every
//! transaction sets that key together with 2-3 objects (writes, zeroes, truncates, removes
//! and an attribute carrying the counter) and a log entry, so a transaction applied only
//! in part cannot match the model at any counter.

// The binary uses the generator; the test also uses the model and the helpers.
#![allow(dead_code)]

use cairn_store::{CollId, Op, Transaction};
use std::collections::BTreeMap;

/// Collections the workload uses: objects alternate between them; 1 holds the counters.
pub const COLLS: [CollId; 2] = [1, 2];
/// Objects per thread.
pub const OBJECTS: u64 = 6;
/// Most threads a torture run may use (names and keys are per thread).
pub const MAX_THREADS: usize = 16;

/// A small deterministic generator (SplitMix64).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    /// Uniform-enough in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The SplitMix64 finalizer.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn key3(a: u64, b: u64, c: u64) -> u64 {
    mix(mix(mix(a) ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15)) ^ c.wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
}

/// Name of object `k` of thread `t`.
pub fn obj_name(t: usize, k: u64) -> Vec<u8> {
    format!("t{t}-o{k}").into_bytes()
}

/// Collection of object `k`.
pub fn obj_coll(k: u64) -> CollId {
    COLLS[(k % 2) as usize]
}

/// Key (in collection `COLLS[0]`) holding the last counter thread `t` committed.
pub fn ctr_key(t: usize) -> Vec<u8> {
    format!("t{t}/ctr").into_bytes()
}

/// Prefix of every key thread `t` owns (in both collections).
pub fn key_prefix(t: usize) -> Vec<u8> {
    format!("t{t}/").into_bytes()
}

fn log_key(t: usize, c: u64) -> Vec<u8> {
    format!("t{t}/log/{c:012}").into_bytes()
}

/// Parses the value of [`ctr_key`].
pub fn parse_ctr(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Deterministic bytes for a write: byte at object offset `off + i` depends on `key` and
/// `off + i` only, so overlapping writes of one key agree.
pub fn payload(key: u64, off: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    let first = off / 8;
    let last = (off + len as u64).div_ceil(8);
    for w in first..last {
        out.extend_from_slice(&mix(key ^ w.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
    }
    let skip = (off - first * 8) as usize;
    out.drain(..skip);
    out.truncate(len);
    out
}

/// The transaction that creates the workload's collections (those missing).
pub fn setup_txn(missing: &[CollId]) -> Transaction {
    let mut t = Transaction::new();
    for &c in missing {
        t.create_collection(c);
    }
    t
}

/// Transaction number `c` (from 1) of thread `t`.
pub fn txn(seed: u64, t: usize, c: u64) -> Transaction {
    let mut r = Rng::new(key3(seed, t as u64, c));
    let mut x = Transaction::new();
    let n = 2 + r.below(2);
    let mut picked: Vec<u64> = Vec::new();
    while (picked.len() as u64) < n {
        let k = r.below(OBJECTS);
        if !picked.contains(&k) {
            picked.push(k);
        }
    }
    let stamp = format!("t{t}c{c}").into_bytes();
    for (i, &k) in picked.iter().enumerate() {
        let coll = obj_coll(k);
        let name = obj_name(t, k);
        let pkey = key3(seed ^ 0x5eed, (t as u64) << 32 | k, c);
        let roll = r.below(100);
        let mut removed = false;
        match roll {
            // Block-aligned writes, now and then large ones.
            0..=39 => {
                let blk = r.below(48);
                let nblk = if r.below(12) == 0 {
                    16 + r.below(17)
                } else {
                    1 + r.below(4)
                };
                let off = blk * 4096;
                x.write(
                    coll,
                    &name,
                    off,
                    &payload(pkey, off, (nblk * 4096) as usize),
                );
            }
            // Unaligned writes (read-modify-write of edge blocks).
            40..=69 => {
                let off = r.below(200_000);
                let len = 1 + r.below(6000) as usize;
                x.write(coll, &name, off, &payload(pkey, off, len));
            }
            70..=77 => {
                let off = r.below(200_000);
                let len = r.below(40_000);
                x.zero(coll, &name, off, len);
            }
            78..=85 => {
                x.truncate(coll, &name, r.below(220_000));
            }
            // Remove (only a transaction's third object, so two always carry the counter).
            86..=91 if i == 2 => {
                x.remove(coll, &name);
                removed = true;
            }
            _ => {
                let off = r.below(4) * 8;
                x.write(coll, &name, off, &payload(pkey, off, 32));
            }
        }
        if removed {
            continue;
        }
        // Sometimes a second, overlapping write to the same object in the same transaction.
        if r.below(8) == 0 {
            let off = r.below(100_000);
            let len = 1 + r.below(9000) as usize;
            x.write(coll, &name, off, &payload(pkey ^ 1, off, len));
        }
        x.set_attr(coll, &name, b"ctr", &stamp);
        match r.below(20) {
            0 | 1 => {
                let len = r.below(300) as usize;
                x.set_attr(coll, &name, b"x", &payload(pkey ^ 2, 0, len));
            }
            2 => {
                x.rm_attr(coll, &name, b"x");
            }
            _ => {}
        }
    }
    x.kv_set(COLLS[0], &ctr_key(t), c.to_string().as_bytes());
    let vlen = 16 + r.below(200) as usize;
    x.kv_set(
        COLLS[1],
        &log_key(t, c),
        &payload(key3(seed, t as u64, !c), 0, vlen),
    );
    if c.is_multiple_of(16) && c > 24 {
        x.kv_rm_range(COLLS[1], &log_key(t, 0), &log_key(t, c - 24));
    }
    if r.below(30) == 0 && c > 1 {
        x.kv_rm(COLLS[1], &log_key(t, c - 1));
    }
    x
}

/// An object as the model sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelObj {
    pub data: Vec<u8>,
    pub attrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// What the store must hold for the objects and keys of some threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    pub objects: BTreeMap<(CollId, Vec<u8>), ModelObj>,
    pub kv: BTreeMap<(CollId, Vec<u8>), Vec<u8>>,
}

impl Model {
    /// Applies a transaction with the store's documented semantics.
    pub fn apply(&mut self, txn: &Transaction) {
        for op in &txn.ops {
            match op {
                Op::CreateCollection(_) | Op::RemoveCollection(_) => {
                    unreachable!("the workload's transactions do not manage collections")
                }
                Op::Touch { coll, obj } => {
                    self.objects.entry((*coll, obj.clone())).or_default();
                }
                Op::Write {
                    coll,
                    obj,
                    offset,
                    data,
                } => {
                    let o = self.objects.entry((*coll, obj.clone())).or_default();
                    let end = *offset as usize + data.len();
                    if o.data.len() < end {
                        o.data.resize(end, 0);
                    }
                    o.data[*offset as usize..end].copy_from_slice(data);
                }
                Op::Zero {
                    coll,
                    obj,
                    offset,
                    len,
                } => {
                    if let Some(o) = self.objects.get_mut(&(*coll, obj.clone())) {
                        let end = ((offset + len) as usize).min(o.data.len());
                        let start = *offset as usize;
                        if start < end {
                            o.data[start..end].fill(0);
                        }
                    }
                }
                Op::Truncate { coll, obj, size } => {
                    let o = self.objects.entry((*coll, obj.clone())).or_default();
                    o.data.resize(*size as usize, 0);
                }
                Op::Remove { coll, obj } => {
                    self.objects.remove(&(*coll, obj.clone()));
                }
                Op::SetAttr {
                    coll,
                    obj,
                    name,
                    value,
                } => {
                    let o = self.objects.entry((*coll, obj.clone())).or_default();
                    o.attrs.insert(name.clone(), value.clone());
                }
                Op::RmAttr { coll, obj, name } => {
                    if let Some(o) = self.objects.get_mut(&(*coll, obj.clone())) {
                        o.attrs.remove(name);
                    }
                }
                Op::KvSet { coll, key, value } => {
                    self.kv.insert((*coll, key.clone()), value.clone());
                }
                Op::KvRm { coll, key } => {
                    self.kv.remove(&(*coll, key.clone()));
                }
                Op::KvRmRange { coll, start, end } => {
                    self.kv
                        .retain(|(c, k), _| !(c == coll && k >= start && k < end));
                }
            }
        }
    }
}
