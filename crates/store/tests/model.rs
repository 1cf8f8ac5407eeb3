//! Property tests of the index and the allocator against a simple model.
//!
//! `index_matches_model`: random multi-op transactions over a few collections and object names
//! (aligned and unaligned offsets, within one block, across blocks, beyond the end; every op
//! kind; invalid names, keys and ranges), interleaved with reopening without a close (WAL
//! replay), close + reopen, explicit checkpoints and pauses that let the flusher run. A model
//! (collections -> objects -> bytes, allocated blocks, attributes; key/value maps) applies the
//! same transactions and predicts which ones the store rejects. After every step the whole
//! visible state is compared (listings with pagination, full and partial reads, stat, attributes,
//! key/value ranges) and the allocator is cross-checked against the index; space accounting
//! must equal the model's allocated blocks once background work is idle. Small segments and a
//! small WAL make flushing, cleaning, WAL wrap-around and checkpoints happen during the test.
//!
//! `allocator_under_space_pressure`: random writes, overwrites, truncates and removes on a
//! tiny device until ENOSPC, repeatedly: ENOSPC is `StoreError::NoSpace` with nothing applied,
//! acknowledged data stays readable (also after WAL replay), and removing data makes the
//! rejected write possible again.
//!
//! `PROPTEST_CASES` runs more cases.

mod common;

use cairn_store::{limits, Op, Store, StoreConfig, StoreError, Transaction, BLOCK_SIZE};
use common::{MemDevs, Rng};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const B: u64 = BLOCK_SIZE as u64;
const SEG: u64 = 64 * 1024;

// ---- the model -------------------------------------------------------------------------------

#[derive(Debug, Clone, Default, PartialEq)]
struct MObj {
    data: Vec<u8>,
    /// Blocks that hold data (not holes).
    blocks: BTreeSet<u64>,
    attrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct MColl {
    objs: BTreeMap<Vec<u8>, MObj>,
    kv: BTreeMap<Vec<u8>, Vec<u8>>,
}

type Model = BTreeMap<u64, MColl>;

fn allocated_blocks(m: &Model) -> u64 {
    m.values()
        .flat_map(|c| c.objs.values())
        .map(|o| o.blocks.len() as u64)
        .sum()
}

// ---- generated operations (compact, so that a shrunk case reads well) -------------------------

/// Collections used by the ops (7 starts missing).
const COLLS: [u64; 3] = [1, 2, 7];

/// Object names by index; 5 and 6 are invalid (empty, too long); 100.. are the space-pressure
/// test's objects.
fn obj_name(i: u8) -> Vec<u8> {
    match i {
        0 => b"a".to_vec(),
        1 => b"ab".to_vec(),
        2 => b"b".to_vec(),
        3 => b"obj\x00\xff".to_vec(),
        4 => b"z".to_vec(),
        5 => Vec::new(),
        100.. => format!("obj{}", i - 100).into_bytes(),
        _ => vec![b'n'; limits::OBJECT_NAME + 1],
    }
}

/// Attribute names; 4 is too long.
fn attr_name(i: u8) -> Vec<u8> {
    match i {
        0 => Vec::new(),
        1 => b"u".to_vec(),
        2 => b"user.x".to_vec(),
        3 => b"v\x00".to_vec(),
        _ => vec![b'a'; limits::ATTR_NAME + 1],
    }
}

/// Collection keys; 7 is too long.
fn kv_key(i: u8) -> Vec<u8> {
    match i {
        0 => Vec::new(),
        1 => b"k0".to_vec(),
        2 => b"k1".to_vec(),
        3 => b"k1\x00".to_vec(),
        4 => b"k2".to_vec(),
        5 => b"log.0001".to_vec(),
        6 => b"log.0002".to_vec(),
        _ => vec![b'k'; limits::KV_KEY + 1],
    }
}

/// Recognizable bytes that are never zero (so holes and zeroed ranges cannot pass for data).
fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i.wrapping_mul(31) + seed as u64) % 251 + 1) as u8)
        .collect()
}

#[derive(Debug, Clone)]
enum MOp {
    Create(u64),
    RmColl(u64),
    Touch {
        c: u64,
        o: u8,
    },
    Write {
        c: u64,
        o: u8,
        off: u64,
        len: u64,
        seed: u8,
    },
    Zero {
        c: u64,
        o: u8,
        off: u64,
        len: u64,
    },
    Trunc {
        c: u64,
        o: u8,
        size: u64,
    },
    Remove {
        c: u64,
        o: u8,
    },
    SetAttr {
        c: u64,
        o: u8,
        name: u8,
        vlen: u8,
        seed: u8,
    },
    RmAttr {
        c: u64,
        o: u8,
        name: u8,
    },
    KvSet {
        c: u64,
        key: u8,
        vlen: u8,
        seed: u8,
    },
    KvRm {
        c: u64,
        key: u8,
    },
    KvRmRange {
        c: u64,
        start: u8,
        end: u8,
    },
}

impl MOp {
    fn coll(&self) -> u64 {
        match *self {
            MOp::Create(c) | MOp::RmColl(c) => c,
            MOp::Touch { c, .. }
            | MOp::Write { c, .. }
            | MOp::Zero { c, .. }
            | MOp::Trunc { c, .. }
            | MOp::Remove { c, .. }
            | MOp::SetAttr { c, .. }
            | MOp::RmAttr { c, .. }
            | MOp::KvSet { c, .. }
            | MOp::KvRm { c, .. }
            | MOp::KvRmRange { c, .. } => c,
        }
    }

    fn to_op(&self) -> Op {
        match *self {
            MOp::Create(c) => Op::CreateCollection(c),
            MOp::RmColl(c) => Op::RemoveCollection(c),
            MOp::Touch { c, o } => Op::Touch {
                coll: c,
                obj: obj_name(o),
            },
            MOp::Write {
                c,
                o,
                off,
                len,
                seed,
            } => Op::Write {
                coll: c,
                obj: obj_name(o),
                offset: off,
                data: pattern(len, seed).into(),
            },
            MOp::Zero { c, o, off, len } => Op::Zero {
                coll: c,
                obj: obj_name(o),
                offset: off,
                len,
            },
            MOp::Trunc { c, o, size } => Op::Truncate {
                coll: c,
                obj: obj_name(o),
                size,
            },
            MOp::Remove { c, o } => Op::Remove {
                coll: c,
                obj: obj_name(o),
            },
            MOp::SetAttr {
                c,
                o,
                name,
                vlen,
                seed,
            } => Op::SetAttr {
                coll: c,
                obj: obj_name(o),
                name: attr_name(name),
                value: pattern(vlen as u64, seed),
            },
            MOp::RmAttr { c, o, name } => Op::RmAttr {
                coll: c,
                obj: obj_name(o),
                name: attr_name(name),
            },
            MOp::KvSet { c, key, vlen, seed } => Op::KvSet {
                coll: c,
                key: kv_key(key),
                value: pattern(vlen as u64, seed),
            },
            MOp::KvRm { c, key } => Op::KvRm {
                coll: c,
                key: kv_key(key),
            },
            MOp::KvRmRange { c, start, end } => Op::KvRmRange {
                coll: c,
                start: kv_key(start),
                end: kv_key(end),
            },
        }
    }
}

fn to_txn(ops: &[MOp]) -> Transaction {
    Transaction {
        ops: ops.iter().map(MOp::to_op).collect(),
        ..Transaction::default()
    }
}

/// The rejection the model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reject {
    NoCollection(u64),
    CollectionExists(u64),
    Invalid,
    TooLarge,
}

impl Reject {
    fn matches(&self, e: &StoreError) -> bool {
        match (self, e) {
            (Reject::NoCollection(a), StoreError::NoCollection(b)) => a == b,
            (Reject::CollectionExists(a), StoreError::CollectionExists(b)) => a == b,
            (Reject::Invalid, StoreError::Invalid(_)) => true,
            (Reject::TooLarge, StoreError::TooLarge { .. }) => true,
            _ => false,
        }
    }
}

fn check_name(o: u8) -> Result<(), Reject> {
    let n = obj_name(o);
    if n.is_empty() {
        Err(Reject::Invalid)
    } else if n.len() > limits::OBJECT_NAME {
        Err(Reject::TooLarge)
    } else {
        Ok(())
    }
}

fn check_range(off: u64, len: u64) -> Result<(), Reject> {
    match off.checked_add(len) {
        Some(end) if end <= limits::OBJECT_SIZE => Ok(()),
        _ => Err(Reject::TooLarge),
    }
}

fn check_len(len: usize, limit: usize) -> Result<(), Reject> {
    if len > limit {
        Err(Reject::TooLarge)
    } else {
        Ok(())
    }
}

/// The documented validation rules: the first failing op (in order) rejects the transaction.
fn validate(m: &Model, ops: &[MOp]) -> Result<(), Reject> {
    let mut exists: BTreeMap<u64, bool> = BTreeMap::new();
    for op in ops {
        let c = op.coll();
        let present = *exists.entry(c).or_insert_with(|| m.contains_key(&c));
        match *op {
            MOp::Create(_) if present => return Err(Reject::CollectionExists(c)),
            MOp::Create(_) => {
                exists.insert(c, true);
            }
            _ if !present => return Err(Reject::NoCollection(c)),
            MOp::RmColl(_) => {
                exists.insert(c, false);
            }
            MOp::Touch { o, .. } | MOp::Remove { o, .. } => check_name(o)?,
            MOp::Write { o, off, len, .. } | MOp::Zero { o, off, len, .. } => {
                check_name(o)?;
                check_range(off, len)?;
            }
            MOp::Trunc { o, size, .. } => {
                check_name(o)?;
                check_range(size, 0)?;
            }
            MOp::SetAttr { o, name, .. } | MOp::RmAttr { o, name, .. } => {
                check_name(o)?;
                check_len(attr_name(name).len(), limits::ATTR_NAME)?;
            }
            MOp::KvSet { key, .. } | MOp::KvRm { key, .. } => {
                check_len(kv_key(key).len(), limits::KV_KEY)?
            }
            MOp::KvRmRange { start, end, .. } => {
                check_len(kv_key(start).len(), limits::KV_KEY)?;
                check_len(kv_key(end).len(), limits::KV_KEY)?;
            }
        }
    }
    Ok(())
}

/// Applies a valid transaction to the model.
fn apply(m: &mut Model, ops: &[MOp]) {
    for op in ops {
        match *op {
            MOp::Create(c) => {
                m.insert(c, MColl::default());
            }
            MOp::RmColl(c) => {
                m.remove(&c);
            }
            MOp::Touch { c, o } => {
                coll(m, c).objs.entry(obj_name(o)).or_default();
            }
            MOp::Write {
                c,
                o,
                off,
                len,
                seed,
            } => {
                let obj = coll(m, c).objs.entry(obj_name(o)).or_default();
                if len == 0 {
                    continue; // creates the object, does not extend it
                }
                let end = (off + len) as usize;
                if obj.data.len() < end {
                    obj.data.resize(end, 0);
                }
                obj.data[off as usize..end].copy_from_slice(&pattern(len, seed));
                obj.blocks.extend(off / B..(off + len).div_ceil(B));
            }
            MOp::Zero { c, o, off, len } => {
                let Some(obj) = coll(m, c).objs.get_mut(&obj_name(o)) else {
                    continue; // does not create the object
                };
                let end = (off + len).min(obj.data.len() as u64);
                if off < end {
                    obj.data[off as usize..end as usize].fill(0);
                    for b in off.div_ceil(B)..end / B {
                        obj.blocks.remove(&b);
                    }
                }
            }
            MOp::Trunc { c, o, size } => {
                let obj = coll(m, c).objs.entry(obj_name(o)).or_default();
                obj.blocks.retain(|&b| b < size.div_ceil(B));
                obj.data.resize(size as usize, 0);
            }
            MOp::Remove { c, o } => {
                coll(m, c).objs.remove(&obj_name(o));
            }
            MOp::SetAttr {
                c,
                o,
                name,
                vlen,
                seed,
            } => {
                let obj = coll(m, c).objs.entry(obj_name(o)).or_default();
                obj.attrs
                    .insert(attr_name(name), pattern(vlen as u64, seed));
            }
            MOp::RmAttr { c, o, name } => {
                if let Some(obj) = coll(m, c).objs.get_mut(&obj_name(o)) {
                    obj.attrs.remove(&attr_name(name));
                }
            }
            MOp::KvSet { c, key, vlen, seed } => {
                coll(m, c)
                    .kv
                    .insert(kv_key(key), pattern(vlen as u64, seed));
            }
            MOp::KvRm { c, key } => {
                coll(m, c).kv.remove(&kv_key(key));
            }
            MOp::KvRmRange { c, start, end } => {
                let (s, e) = (kv_key(start), kv_key(end));
                if s < e {
                    coll(m, c).kv.retain(|k, _| k < &s || k >= &e);
                }
            }
        }
    }
}

fn coll(m: &mut Model, c: u64) -> &mut MColl {
    m.get_mut(&c).expect("validated: the collection exists")
}

// ---- strategies ------------------------------------------------------------------------------

fn coll_id() -> impl Strategy<Value = u64> {
    prop_oneof![4 => Just(COLLS[0]), 2 => Just(COLLS[1]), 1 => Just(COLLS[2])]
}

/// Object names: valid ones, and in wild transactions sometimes invalid ones.
fn obj_idx(wild: bool) -> BoxedStrategy<u8> {
    if wild {
        prop_oneof![8 => 0u8..5, 1 => 5u8..7].boxed()
    } else {
        (0u8..5).boxed()
    }
}

/// `tame`, or in wild ops sometimes `bad`.
fn or_bad<T: std::fmt::Debug + Clone + 'static>(
    wild: bool,
    tame: impl Strategy<Value = T> + 'static,
    bad: T,
) -> BoxedStrategy<T> {
    if wild {
        prop_oneof![8 => tame, 1 => Just(bad)].boxed()
    } else {
        tame.boxed()
    }
}

/// Offsets up to ~10 blocks: aligned, unaligned, at block edges.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => (0u64..10).prop_map(|b| b * B),
        3 => (0u64..10, 1..B).prop_map(|(b, r)| b * B + r),
        1 => (0u64..10).prop_map(|b| b * B + B - 1),
        1 => (0u64..10).prop_map(|b| b * B + 1),
    ]
}

/// Lengths: empty, within a block, whole blocks, just off whole blocks, up to three blocks.
fn length() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        3 => 1u64..100,
        2 => (1u64..4).prop_map(|k| k * B),
        1 => prop_oneof![Just(B - 1), Just(B + 1), Just(2 * B - 1)],
        3 => 1u64..3 * B,
    ]
}

/// One op. Wild ops also create collections (which may exist), and use invalid names, keys and
/// ranges; tame ops are valid when their collection exists.
fn op(wild: bool) -> impl Strategy<Value = MOp> {
    let max = limits::OBJECT_SIZE;
    let o = move || obj_idx(wild);
    let mut arms: Vec<(u32, BoxedStrategy<MOp>)> = vec![
        (1, coll_id().prop_map(MOp::RmColl).boxed()),
        (
            2,
            (coll_id(), o())
                .prop_map(|(c, o)| MOp::Touch { c, o })
                .boxed(),
        ),
        (
            14,
            (coll_id(), o(), offset(), length(), any::<u8>())
                .prop_map(|(c, o, off, len, seed)| MOp::Write {
                    c,
                    o,
                    off,
                    len,
                    seed,
                })
                .boxed(),
        ),
        (
            4,
            (
                coll_id(),
                o(),
                offset(),
                or_bad(
                    wild,
                    prop_oneof![6 => length(), 1 => Just(1u64 << 39)],
                    u64::MAX,
                ),
            )
                .prop_map(|(c, o, off, len)| MOp::Zero { c, o, off, len })
                .boxed(),
        ),
        (
            4,
            (
                coll_id(),
                o(),
                or_bad(
                    wild,
                    prop_oneof![2 => 0..12 * B, 1 => (0u64..12).prop_map(|b| b * B)],
                    max + 1,
                ),
            )
                .prop_map(|(c, o, size)| MOp::Trunc { c, o, size })
                .boxed(),
        ),
        (
            3,
            (coll_id(), o())
                .prop_map(|(c, o)| MOp::Remove { c, o })
                .boxed(),
        ),
        (
            3,
            (
                coll_id(),
                o(),
                or_bad(wild, 0u8..4, 4),
                0u8..40,
                any::<u8>(),
            )
                .prop_map(|(c, o, name, vlen, seed)| MOp::SetAttr {
                    c,
                    o,
                    name,
                    vlen,
                    seed,
                })
                .boxed(),
        ),
        (
            2,
            (coll_id(), o(), or_bad(wild, 0u8..4, 4))
                .prop_map(|(c, o, name)| MOp::RmAttr { c, o, name })
                .boxed(),
        ),
        (
            3,
            (coll_id(), or_bad(wild, 0u8..7, 7), 0u8..60, any::<u8>())
                .prop_map(|(c, key, vlen, seed)| MOp::KvSet { c, key, vlen, seed })
                .boxed(),
        ),
        (
            1,
            (coll_id(), or_bad(wild, 0u8..7, 7))
                .prop_map(|(c, key)| MOp::KvRm { c, key })
                .boxed(),
        ),
        (
            1,
            (coll_id(), 0u8..7, 0u8..7)
                .prop_map(|(c, start, end)| MOp::KvRmRange { c, start, end })
                .boxed(),
        ),
    ];
    if wild {
        arms.push((2, coll_id().prop_map(MOp::Create).boxed()));
        // Past the largest object size: rejected.
        arms.push((
            1,
            (coll_id(), o(), 11u64..30, any::<u8>())
                .prop_map(move |(c, o, len, seed)| MOp::Write {
                    c,
                    o,
                    off: max - 10,
                    len,
                    seed,
                })
                .boxed(),
        ));
    }
    proptest::strategy::Union::new_weighted(arms)
}

#[derive(Debug, Clone)]
enum Step {
    /// A transaction of tame ops, preceded by the creation of whatever collection they use that
    /// does not exist.
    Tame(Vec<MOp>),
    /// A transaction as generated (often rejected).
    Wild(Vec<MOp>),
    /// Drop without close, open again: WAL replay (after the last checkpoint).
    Reopen,
    /// Clean close (final checkpoint), open again.
    CloseReopen,
    Checkpoint,
    /// Let the background flusher and cleaner run.
    Pause,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        20 => prop::collection::vec(op(false), 1..6).prop_map(Step::Tame),
        4 => prop::collection::vec(op(true), 0..6).prop_map(Step::Wild),
        // Larger writes: more WAL and segment traffic.
        2 => (coll_id(), 0u8..5, 0u64..8, prop_oneof![Just(0u64), 1..B], 4u64..16, any::<u8>())
            .prop_map(|(c, o, at, skew, blocks, seed)| {
                Step::Tame(vec![MOp::Write { c, o, off: at * B + skew, len: blocks * B, seed }])
            }),
        1 => Just(Step::Reopen),
        1 => Just(Step::CloseReopen),
        2 => Just(Step::Checkpoint),
        1 => Just(Step::Pause),
    ]
}

/// A tame transaction as committed: missing collections are created first.
fn tame_txn(m: &Model, ops: &[MOp]) -> Vec<MOp> {
    let mut out: Vec<MOp> = Vec::new();
    for op in ops {
        let c = op.coll();
        if !m.contains_key(&c) && !out.iter().any(|o| matches!(o, MOp::Create(x) if *x == c)) {
            out.push(MOp::Create(c));
        }
    }
    out.extend(ops.iter().cloned());
    out
}

#[derive(Debug, Clone)]
struct Setup {
    mirror: bool,
    separate_wal: bool,
    segments: u64,
}

fn setup() -> impl Strategy<Value = Setup> {
    (any::<bool>(), any::<bool>(), 20u64..36).prop_map(|(mirror, separate_wal, segments)| Setup {
        mirror,
        separate_wal,
        segments,
    })
}

/// Small segments, a small WAL and an eager cleaner, so that background work happens often.
fn model_cfg() -> StoreConfig {
    StoreConfig {
        segment_size: SEG,
        wal_size: 512 * 1024,
        flush_batch_bytes: 32 * 1024,
        pending_limit_bytes: 256 * 1024,
        flush_max_delay: Duration::from_millis(2),
        checkpoint_wal_percent: 50,
        checkpoint_interval: Duration::from_millis(100),
        clean_below_free_segments: 10,
        clean_rate: 0,
        reserve_segments: 4,
        // Aligned writes of two blocks or more go straight to the data devices, one-block
        // writes through the WAL: both paths, and their mix in one transaction.
        direct_write_min_bytes: 2 * B,
        ..StoreConfig::default()
    }
}

fn make_devs(s: &Setup, cfg: &StoreConfig) -> MemDevs {
    let wal = s.separate_wal.then_some(B + cfg.wal_size);
    let wal_on_data = if s.separate_wal { 0 } else { cfg.wal_size };
    let size = B + wal_on_data + s.segments * cfg.segment_size;
    MemDevs::new(if s.mirror { 2 } else { 1 }, size, wal)
}

// ---- comparing the store with the model ------------------------------------------------------

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

/// Compares everything the store shows with the model.
fn check_state(s: &Store, m: &Model, rng: &mut Rng, ctx: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        s.list_collections(),
        m.keys().copied().collect::<Vec<_>>(),
        "{}: collections",
        ctx
    );
    for c in COLLS {
        if !m.contains_key(&c) {
            prop_assert!(!s.collection_exists(c), "{}: collection {} exists", ctx, c);
            prop_assert!(
                matches!(s.list_objects(c, None, 10), Err(StoreError::NoCollection(x)) if x == c)
            );
            prop_assert!(
                matches!(s.kv_range(c, b"", None, 10), Err(StoreError::NoCollection(x)) if x == c)
            );
            prop_assert!(
                matches!(s.read(c, b"a", 0, 1), Err(StoreError::NoCollection(x)) if x == c)
            );
        }
    }
    for (&c, mc) in m {
        prop_assert!(s.collection_exists(c));
        // Listing in pages, resumed from the last name.
        let page = 1 + rng.below(4) as usize;
        let mut names = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let got = s
                .list_objects(c, after.as_deref(), page)
                .map_err(|e| fail(format!("{ctx}: list_objects({c}): {e}")))?;
            prop_assert!(got.len() <= page);
            let done = got.len() < page;
            after = got.last().cloned().or(after);
            names.extend(got);
            if done {
                break;
            }
        }
        let want: Vec<Vec<u8>> = mc.objs.keys().cloned().collect();
        prop_assert_eq!(&names, &want, "{}: objects of collection {}", ctx, c);
        for (name, mo) in &mc.objs {
            check_object(s, c, name, mo, rng, ctx)?;
        }
        for i in 0..5u8 {
            let n = obj_name(i);
            if !mc.objs.contains_key(&n) {
                prop_assert!(
                    matches!(s.stat(c, &n), Err(StoreError::NoObject { .. })),
                    "{}: {}/{:?} should not exist",
                    ctx,
                    c,
                    n
                );
            }
        }
        let kv = s
            .kv_range(c, b"", None, usize::MAX)
            .map_err(|e| fail(format!("{ctx}: kv_range({c}): {e}")))?;
        let want: Vec<(Vec<u8>, Vec<u8>)> =
            mc.kv.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        prop_assert_eq!(kv, want, "{}: entries of collection {}", ctx, c);
        // A bounded sub-range with a limit.
        let (a, b) = (kv_key(rng.below(7) as u8), kv_key(rng.below(7) as u8));
        let limit = rng.below(4) as usize;
        let got = s.kv_range(c, &a, Some(&b), limit).unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = mc
            .kv
            .iter()
            .filter(|(k, _)| **k >= a && **k < b)
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        prop_assert_eq!(
            got,
            want,
            "{}: kv_range({}, {:?}..{:?}, {})",
            ctx,
            c,
            a,
            b,
            limit
        );
        let k = kv_key(rng.below(7) as u8);
        prop_assert_eq!(s.kv_get(c, &k).unwrap(), mc.kv.get(&k).cloned());
    }
    s.check_space_accounting()
        .map_err(|e| fail(format!("{ctx}: space accounting: {e}")))?;
    Ok(())
}

fn check_object(
    s: &Store,
    c: u64,
    name: &[u8],
    mo: &MObj,
    rng: &mut Rng,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let what = format!("{ctx}: object {c}/{:?}", String::from_utf8_lossy(name));
    let st = s
        .stat(c, name)
        .map_err(|e| fail(format!("{what}: stat: {e}")))?;
    prop_assert_eq!(st.size, mo.data.len() as u64, "{}: size", what);
    prop_assert_eq!(
        st.allocated,
        mo.blocks.len() as u64 * B,
        "{}: allocated bytes (model blocks {:?})",
        what,
        mo.blocks
    );
    prop_assert_eq!(st.attrs, mo.attrs.len(), "{}: attribute count", what);
    let full = s
        .read(c, name, 0, u64::MAX)
        .map_err(|e| fail(format!("{what}: read: {e}")))?;
    if full != mo.data {
        let at = full
            .iter()
            .zip(&mo.data)
            .position(|(a, b)| a != b)
            .unwrap_or(full.len().min(mo.data.len()));
        return Err(fail(format!(
            "{what}: content differs from byte {at} (store {} bytes, model {} bytes)",
            full.len(),
            mo.data.len()
        )));
    }
    let size = mo.data.len() as u64;
    for _ in 0..2 {
        let off = rng.below(size + 2 * B);
        let len = rng.below(3 * B);
        let got = s
            .read(c, name, off, len)
            .map_err(|e| fail(format!("{what}: read {off}+{len}: {e}")))?;
        let (a, b) = (
            off.min(size) as usize,
            off.saturating_add(len).min(size) as usize,
        );
        prop_assert!(
            got == mo.data[a..b],
            "{}: read {}+{} differs",
            what,
            off,
            len
        );
    }
    let attrs = s.attrs(c, name).unwrap();
    let want: Vec<(Vec<u8>, Vec<u8>)> = mo
        .attrs
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    prop_assert_eq!(attrs, want, "{}: attributes", what);
    let a = attr_name(rng.below(4) as u8);
    prop_assert_eq!(s.get_attr(c, name, &a).unwrap(), mo.attrs.get(&a).cloned());
    Ok(())
}

/// Live plus pending blocks equal the model's allocated blocks once the maintenance thread is
/// between jobs (a flush or cleaning in progress briefly counts its new copy too).
fn check_exact_space(s: &Store, m: &Model, ctx: &str) -> Result<(), TestCaseError> {
    let want = allocated_blocks(m) * B;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let st = s.stats();
        let got = st.live_bytes + st.pending_bytes;
        if got == want {
            return Ok(());
        }
        prop_assert!(
            got > want && Instant::now() < deadline,
            "{}: live {} + pending {} bytes, the model holds {} bytes of blocks",
            ctx,
            st.live_bytes,
            st.pending_bytes,
            want
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Commits a transaction to the store and, if the model accepts it, to the model.
/// Returns whether it was applied.
fn commit_both(s: &Store, m: &mut Model, ops: &[MOp], ctx: &str) -> Result<bool, TestCaseError> {
    let want = validate(m, ops);
    let got = s.commit(&to_txn(ops));
    COVERAGE.with(|c| {
        let mut c = c.borrow_mut();
        match &got {
            Ok(_) => c.applied += 1,
            Err(StoreError::NoSpace { .. }) => c.no_space += 1,
            Err(e) => {
                let kind = format!("{e:?}");
                let kind = kind.split([' ', '(']).next().unwrap_or("").to_string();
                *c.rejected.entry(kind).or_default() += 1;
            }
        }
    });
    match (want, got) {
        (Ok(()), Ok(_)) => {
            apply(m, ops);
            Ok(true)
        }
        (Ok(()), Err(StoreError::NoSpace { needed, available })) => {
            // Space is not modeled; a rejection for space must be coherent and apply nothing.
            prop_assert!(
                needed > available,
                "{}: NoSpace needed {} available {}",
                ctx,
                needed,
                available
            );
            prop_assert!(
                ops.iter()
                    .any(|o| matches!(o, MOp::Write { off, len, .. } if (off % B) + len > 0)),
                "{}: NoSpace for a transaction without data",
                ctx
            );
            Ok(false)
        }
        (Err(r), Err(e)) => {
            prop_assert!(
                r.matches(&e),
                "{}: expected {:?}, the store said {}",
                ctx,
                r,
                e
            );
            Ok(false)
        }
        (want, got) => Err(fail(format!(
            "{ctx}: the model says {want:?}, the store {got:?}"
        ))),
    }
}

/// Aborts the test binary if a case runs far longer than it should (a store that hangs), printing
/// the case, instead of hanging the test run.
struct Watchdog {
    _alive: std::sync::mpsc::Sender<()>,
}

impl Watchdog {
    fn new(case: String) -> Watchdog {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_secs(120))
            {
                eprintln!("a case has run for 120 s; the store hangs. The case: {case}");
                std::process::abort();
            }
        });
        Watchdog { _alive: tx }
    }
}

/// What the model test exercised, summed over its cases (per test thread).
#[derive(Debug, Default)]
struct Coverage {
    cases: u64,
    steps: u64,
    applied: u64,
    rejected: BTreeMap<String, u64>,
    no_space: u64,
    segments_cleaned: u64,
    checkpoints: u64,
    /// Times the WAL ring was written around.
    wal_wraps: u64,
}

thread_local! {
    static COVERAGE: std::cell::RefCell<Coverage> = std::cell::RefCell::default();
}

/// Adds a store incarnation's counters to the coverage (before it is closed or dropped).
fn tally(s: &Store, wal_bytes: &mut u64) {
    let st = s.stats();
    *wal_bytes += st.wal_io.write_bytes;
    COVERAGE.with(|c| {
        let mut c = c.borrow_mut();
        c.segments_cleaned += st.segments_cleaned;
        c.checkpoints += st.checkpoints;
    });
}

fn run_model(setup: &Setup, steps: &[Step], seed: u64) -> Result<(), TestCaseError> {
    let _watchdog = Watchdog::new(format!("{setup:?}, {steps:?}, seed {seed}"));
    let cfg = model_cfg();
    let devs = make_devs(setup, &cfg);
    let mut s = devs.mkfs_open(cfg.clone());
    let mut m = Model::new();
    let mut rng = Rng(seed);
    let mut wal_bytes = 0;
    let init = [MOp::Create(COLLS[0]), MOp::Create(COLLS[1])];
    prop_assert!(commit_both(&s, &mut m, &init, "setup")?);
    for (i, step) in steps.iter().enumerate() {
        let ctx = format!("step {i} ({step:?})");
        match step {
            Step::Tame(ops) => {
                let ops = tame_txn(&m, ops);
                commit_both(&s, &mut m, &ops, &ctx)?;
            }
            Step::Wild(ops) => {
                commit_both(&s, &mut m, ops, &ctx)?;
            }
            Step::Reopen => {
                tally(&s, &mut wal_bytes);
                drop(s);
                s = Store::open(&devs.devices(), cfg.clone())
                    .map_err(|e| fail(format!("{ctx}: open: {e}")))?;
            }
            Step::CloseReopen => {
                tally(&s, &mut wal_bytes);
                s.close().map_err(|e| fail(format!("{ctx}: close: {e}")))?;
                s = Store::open(&devs.devices(), cfg.clone())
                    .map_err(|e| fail(format!("{ctx}: open: {e}")))?;
            }
            Step::Checkpoint => s
                .checkpoint()
                .map_err(|e| fail(format!("{ctx}: checkpoint: {e}")))?,
            Step::Pause => std::thread::sleep(Duration::from_millis(4)),
        }
        prop_assert!(
            s.failure().is_none(),
            "{}: store failed: {:?}",
            ctx,
            s.failure()
        );
        check_state(&s, &m, &mut rng, &ctx)?;
        check_exact_space(&s, &m, &ctx)?;
    }
    tally(&s, &mut wal_bytes);
    COVERAGE.with(|c| {
        let mut c = c.borrow_mut();
        c.cases += 1;
        c.steps += steps.len() as u64;
        c.wal_wraps += wal_bytes / (cfg.wal_size - 2 * B);
    });
    let rep = s.scrub();
    prop_assert!(rep.issues.is_empty(), "scrub: {:?}", rep.issues);
    let objects: usize = m.values().map(|c| c.objs.len()).sum();
    prop_assert_eq!(rep.objects, objects as u64);
    prop_assert_eq!(rep.blocks, allocated_blocks(&m));
    // And once more from the devices alone, after WAL replay.
    drop(s);
    let s = Store::open(&devs.devices(), cfg).map_err(|e| fail(format!("final open: {e}")))?;
    check_state(&s, &m, &mut rng, "after the final reopen")?;
    check_exact_space(&s, &m, "after the final reopen")?;
    prop_assert!(s.scrub().issues.is_empty());
    Ok(())
}

// ---- space pressure --------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum POp {
    /// Write `blocks` blocks (plus `tail` bytes) at block `at` (plus `skew` bytes) of object `o`.
    Write {
        o: u8,
        at: u64,
        skew: u64,
        blocks: u64,
        tail: u64,
        seed: u8,
    },
    Trunc {
        o: u8,
        blocks: u64,
    },
    Remove {
        o: u8,
    },
}

/// Objects of the space-pressure test (model names 100..).
const PNAMES: u8 = 12;

fn pop() -> impl Strategy<Value = POp> {
    prop_oneof![
        30 => (0..PNAMES, 0u64..32, prop_oneof![3 => Just(0u64), 1 => 1..B], 1u64..7,
               prop_oneof![3 => Just(0u64), 1 => 1..B], any::<u8>())
            .prop_map(|(o, at, skew, blocks, tail, seed)| POp::Write { o, at, skew, blocks, tail, seed }),
        1 => (0..PNAMES, 0u64..16).prop_map(|(o, blocks)| POp::Trunc { o, blocks }),
        1 => (0..PNAMES).prop_map(|o| POp::Remove { o }),
    ]
}

impl POp {
    fn to_mop(&self) -> MOp {
        match *self {
            POp::Write {
                o,
                at,
                skew,
                blocks,
                tail,
                seed,
            } => MOp::Write {
                c: 1,
                o: o + 100,
                off: at * B + skew,
                len: blocks * B + tail,
                seed,
            },
            POp::Trunc { o, blocks } => MOp::Trunc {
                c: 1,
                o: o + 100,
                size: blocks * B,
            },
            POp::Remove { o } => MOp::Remove { c: 1, o: o + 100 },
        }
    }
}

fn pressure_cfg() -> StoreConfig {
    StoreConfig {
        segment_size: SEG,
        wal_size: 1 << 20,
        flush_batch_bytes: 32 * 1024,
        pending_limit_bytes: 128 * 1024,
        flush_max_delay: Duration::from_millis(2),
        checkpoint_interval: Duration::from_millis(100),
        clean_below_free_segments: 6,
        clean_rate: 0,
        reserve_segments: 4,
        ..StoreConfig::default()
    }
}

/// Reads every object of the pressure test back.
fn check_pressure(s: &Store, m: &Model, ctx: &str) -> Result<(), TestCaseError> {
    let objs = &m[&1].objs;
    prop_assert_eq!(
        s.list_objects(1, None, usize::MAX).unwrap(),
        objs.keys().cloned().collect::<Vec<_>>(),
        "{}: objects",
        ctx
    );
    for (name, mo) in objs {
        let got = s
            .read(1, name, 0, u64::MAX)
            .map_err(|e| fail(format!("{ctx}: read {name:?}: {e}")))?;
        prop_assert!(got == mo.data, "{}: object {:?} differs", ctx, name);
        prop_assert_eq!(
            s.stat(1, name).unwrap().allocated,
            mo.blocks.len() as u64 * B
        );
    }
    s.check_space_accounting()
        .map_err(|e| fail(format!("{ctx}: space accounting: {e}")))?;
    Ok(())
}

/// Data blocks a transaction asks for (what `NoSpace` reports as needed).
fn new_blocks(ops: &[MOp]) -> u64 {
    ops.iter()
        .map(|o| match *o {
            MOp::Write { off, len, .. } => (off + len).div_ceil(B) - off / B,
            _ => 0,
        })
        .sum()
}

fn run_pressure(
    mirror: bool,
    segments: u64,
    ops: &[Vec<POp>],
    victims: &[u8],
) -> Result<(), TestCaseError> {
    let _watchdog = Watchdog::new(format!("{mirror}, {segments}, {ops:?}, {victims:?}"));
    let cfg = pressure_cfg();
    let setup = Setup {
        mirror,
        separate_wal: true,
        segments,
    };
    let devs = make_devs(&setup, &cfg);
    let s = devs.mkfs_open(cfg.clone());
    let mut m = Model::new();
    prop_assert!(commit_both(&s, &mut m, &[MOp::Create(1)], "setup")?);
    // Room for data the store offered at the first ENOSPC: data held + what it said was left.
    let mut first_room: Option<u64> = None;
    let mut victim = victims.iter().cycle();
    for (i, txn) in ops.iter().enumerate() {
        let mops: Vec<MOp> = txn.iter().map(POp::to_mop).collect();
        let ctx = format!("txn {i} ({txn:?})");
        let want = validate(&m, &mops);
        prop_assert!(want.is_ok());
        let available = match s.commit(&to_txn(&mops)) {
            Ok(_) => {
                apply(&mut m, &mops);
                continue;
            }
            Err(StoreError::NoSpace { needed, available }) => {
                prop_assert_eq!(needed, new_blocks(&mops) * B, "{}: needed", &ctx);
                prop_assert!(available < needed, "{}: available {}", ctx, available);
                available
            }
            Err(e) => return Err(fail(format!("{ctx}: {e}"))),
        };
        // ENOSPC: nothing of the transaction is visible, and the store keeps working.
        prop_assert!(s.failure().is_none(), "{}: {:?}", ctx, s.failure());
        check_pressure(&s, &m, &ctx)?;
        // The room for data does not shrink over time (no leaked space): it may vary by
        // about the checkpoint's size.
        let room = allocated_blocks(&m) * B + available;
        let first = *first_room.get_or_insert(room);
        prop_assert!(
            room + 2 * SEG >= first,
            "{}: room for data shrank from {} to {} bytes (data {} + available {})",
            ctx,
            first,
            room,
            allocated_blocks(&m) * B,
            available
        );
        // Removing data makes the rejected transaction possible again.
        let mut checkpointed = false;
        loop {
            if commit_both(&s, &mut m, &mops, &ctx)? {
                break;
            }
            let names: Vec<u8> = (0..PNAMES)
                .filter(|&o| m[&1].objs.contains_key(&obj_name(o + 100)))
                .collect();
            if names.is_empty() {
                // Only the checkpoint's room may still be held.
                prop_assert!(
                    !checkpointed,
                    "{}: still ENOSPC with every object removed",
                    ctx
                );
                s.checkpoint().unwrap();
                s.checkpoint().unwrap();
                checkpointed = true;
                continue;
            }
            let pick = names[*victim.next().unwrap() as usize % names.len()];
            let rm = [MOp::Remove {
                c: 1,
                o: pick + 100,
            }];
            prop_assert!(commit_both(&s, &mut m, &rm, &ctx)?);
        }
        check_pressure(&s, &m, &ctx)?;
        check_exact_space(&s, &m, &ctx)?;
    }
    let room = first_room.ok_or_else(|| fail("the device never filled up".into()))?;
    prop_assert!(room >= 16 * B, "only {} bytes of data fit", room);
    check_pressure(&s, &m, "end")?;
    drop(s);
    let s = Store::open(&devs.devices(), cfg).map_err(|e| fail(format!("reopen: {e}")))?;
    check_pressure(&s, &m, "after WAL replay")?;
    check_exact_space(&s, &m, "after WAL replay")?;
    prop_assert!(s.scrub().issues.is_empty());
    s.close().map_err(|e| fail(format!("close: {e}")))?;
    Ok(())
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        max_shrink_iters: 512,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    }
}

#[test]
fn index_matches_model() {
    let cfg = config(48);
    let cases = cfg.cases;
    let mut runner = proptest::test_runner::TestRunner::new(cfg);
    let strategy = (setup(), prop::collection::vec(step(), 1..64), any::<u64>());
    if let Err(e) = runner.run(&strategy, |(setup, steps, seed)| {
        run_model(&setup, &steps, seed)
    }) {
        panic!("{e}");
    }
    // The run exercised what it is meant to (the default number of cases does, by far).
    COVERAGE.with(|c| {
        let c = c.borrow();
        eprintln!("coverage: {c:?}");
        if cases >= 32 {
            assert!(c.applied > 10 * c.cases, "{c:?}");
            for kind in ["NoCollection", "CollectionExists", "Invalid", "TooLarge"] {
                assert!(
                    c.rejected.get(kind).is_some_and(|&n| n > 0),
                    "{kind}: {c:?}"
                );
            }
            assert!(
                c.segments_cleaned > 0 && c.checkpoints > 0 && c.wal_wraps > 0,
                "{c:?}"
            );
        }
    });
}

proptest! {
    #![proptest_config(config(8))]

    #[test]
    fn allocator_under_space_pressure(
        mirror in any::<bool>(),
        segments in 16u64..23,
        ops in prop::collection::vec(prop::collection::vec(pop(), 1..3), 120..200),
        victims in prop::collection::vec(any::<u8>(), 8),
    ) {
        run_pressure(mirror, segments, &ops, &victims)?;
    }
}
