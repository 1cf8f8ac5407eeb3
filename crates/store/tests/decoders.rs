//! The decoders of on-disk bytes (superblock, WAL header slot, WAL record header, effects,
//! checkpoint body and root) against random and mutated-valid inputs: they never panic,
//! valid encodings round-trip, whatever they accept respects the documented limits
//! (`docs/format/store.md`), and no input makes them allocate much more than its own size
//! (a checkpoint claiming 2^60 collections fails at once).
//!
//! A counting global allocator measures each decode's largest single allocation and its total.
//! The same decoders are fuzzed by the targets in `fuzz/`.

use cairn_store::codec::Writer;
use cairn_store::decode::{self, CheckpointRoot};
use cairn_store::effect::{self, Effect, Name, Payload};
use cairn_store::format::{self, Role, Superblock, WalHeader};
use cairn_store::{limits, wal, BLOCK_SIZE};
use proptest::prelude::*;
use proptest::sample::Index;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;

// ---- allocation accounting -------------------------------------------------------------------

struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(n: usize) {
    let _ = LARGEST.try_with(|c| c.set(c.get().max(n)));
    let _ = TOTAL.try_with(|c| c.set(c.get().saturating_add(n)));
}

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result with the largest single allocation and the total bytes
/// allocated by this thread meanwhile.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LARGEST.with(|c| c.set(0));
    TOTAL.with(|c| c.set(0));
    let r = f();
    (r, LARGEST.with(Cell::get), TOTAL.with(Cell::get))
}

/// Allocation a decoder may make for an input of `len` bytes: proportional to the input, plus
/// fixed-size reservations (the effect decoder reserves up to 1024 effects, the root decoder
/// up to 4096 pieces).
fn alloc_budget(len: usize) -> (usize, usize) {
    let largest = 2 * len + (256 << 10);
    let total = 64 * len + (1 << 20);
    (largest, total)
}

fn assert_frugal(what: &str, len: usize, largest: usize, total: usize) {
    let (l, t) = alloc_budget(len);
    assert!(
        largest <= l,
        "{what}: {largest}-byte allocation for {len} input bytes"
    );
    assert!(
        total <= t,
        "{what}: {total} bytes allocated for {len} input bytes"
    );
}

// ---- mutations ---------------------------------------------------------------------------------

/// One change to a valid encoding.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Set(Index, u8),
    Truncate(Index),
    Insert(Index, u8),
    Remove(Index),
    /// Overwrites 2, 4 or 8 bytes with an interesting value (lengths and counts).
    Put(Index, u8, u64),
}

fn interesting() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u16::MAX as u64),
        Just(u32::MAX as u64),
        Just(u64::MAX),
        Just(1 << 60),
        Just(1 << 28),
        Just((1 << 28) - 1),
        Just(limits::OBJECT_SIZE),
        Just(limits::OBJECT_SIZE + 1),
        Just(limits::OBJECT_NAME as u64 + 1),
        Just(limits::KV_VALUE as u64 + 1),
        Just(4 * limits::OPS as u64 + 1),
        Just(16_385),
        Just(1 << 20),
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::Set(i, v)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::Insert(i, v)),
        any::<Index>().prop_map(Mutation::Remove),
        (
            any::<Index>(),
            prop_oneof![Just(2u8), Just(4), Just(8)],
            interesting()
        )
            .prop_map(|(i, w, v)| Mutation::Put(i, w, v)),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..4)
}

fn mutate(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if b.is_empty() {
            break;
        }
        let n = b.len();
        match m {
            Mutation::Flip(i, bit) => b[i.index(n)] ^= 1 << bit,
            Mutation::Set(i, v) => b[i.index(n)] = *v,
            Mutation::Truncate(i) => b.truncate(i.index(n)),
            Mutation::Insert(i, v) => b.insert(i.index(n + 1), *v),
            Mutation::Remove(i) => {
                b.remove(i.index(n));
            }
            Mutation::Put(i, w, v) => {
                let w = *w as usize;
                if n >= w {
                    let at = i.index(n - w + 1);
                    b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
                }
            }
        }
    }
    b
}

/// Rewrites the crc32c at offset 0 (over bytes 4..), so that mutated bytes reach the parser.
fn resealed(mut b: Vec<u8>) -> Vec<u8> {
    if b.len() >= 4 {
        format::seal(&mut b);
    }
    b
}

/// Like [`resealed`] for a one-block structure whose crc covers bytes 4..4096 only.
fn resealed_block(mut b: Vec<u8>) -> Vec<u8> {
    if b.len() >= 4 {
        let end = b.len().min(BLOCK_SIZE);
        format::seal(&mut b[..end]);
    }
    b
}

// ---- superblock and WAL header -------------------------------------------------------------

fn superblock() -> impl Strategy<Value = Superblock> {
    (
        any::<[u8; 16]>(),
        any::<bool>(),
        any::<u8>(),
        any::<u8>(),
        any::<[u64; 7]>(),
    )
        .prop_map(
            |(store_id, wal, device_index, data_devices, f)| Superblock {
                store_id,
                role: if wal { Role::Wal } else { Role::Data },
                device_index,
                data_devices,
                device_size: f[0],
                segment_size: f[1],
                segment_offset: f[2],
                segment_count: f[3],
                wal_offset: f[4],
                wal_size: f[5],
                created_unix: f[6],
            },
        )
}

fn wal_header() -> impl Strategy<Value = WalHeader> {
    (
        any::<[u8; 16]>(),
        any::<[u64; 4]>(),
        any::<[u32; 3]>(),
        any::<u64>(),
    )
        .prop_map(|(store_id, a, c, off)| WalHeader {
            store_id,
            generation: a[0],
            replay_seq: a[1],
            replay_lsn: a[2],
            replay_prev_crc: c[0],
            ckpt_root_offset: off,
            ckpt_root_len: c[1],
            ckpt_root_crc: c[2],
        })
}

fn check_superblock(b: &[u8]) {
    let (r, largest, total) = measured(|| Superblock::decode(b));
    assert_frugal("superblock", b.len(), largest, total);
    if let Ok(sb) = r {
        assert!(b.len() >= BLOCK_SIZE);
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb));
    }
}

fn check_wal_header(b: &[u8]) {
    let (r, largest, total) = measured(|| WalHeader::decode(b));
    assert_frugal("WAL header", b.len(), largest, total);
    if let Some(h) = r {
        assert!(b.len() >= BLOCK_SIZE);
        assert_eq!(WalHeader::decode(&h.encode()), Some(h));
    }
}

// ---- WAL records and effects -----------------------------------------------------------------

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn obj_name() -> impl Strategy<Value = Name> {
    bytes(12).prop_map(Name::from)
}

fn effect_strategy() -> impl Strategy<Value = Effect> {
    let c = any::<u64>;
    let block = || 0u64..(1 << 27);
    prop_oneof![
        c().prop_map(Effect::CreateColl),
        c().prop_map(Effect::RemoveColl),
        (c(), obj_name()).prop_map(|(coll, obj)| Effect::Touch { coll, obj }),
        (c(), obj_name(), block(), 1u32..3, any::<u8>()).prop_map(
            |(coll, obj, first_block, nblocks, fill)| Effect::SetBlocks {
                coll,
                obj,
                first_block,
                nblocks,
                data: Payload::Owned(cairn_store::SharedBytes::new(vec![
                    fill;
                    nblocks as usize
                        * BLOCK_SIZE
                ])),
            }
        ),
        (
            c(),
            obj_name(),
            block(),
            prop::collection::vec(any::<u32>(), 1..5),
            0u64..(1 << 30)
        )
            .prop_map(|(coll, obj, first_block, crcs, blk)| Effect::PlaceBlocks {
                coll,
                obj,
                first_block,
                nblocks: crcs.len() as u32,
                off: blk * BLOCK_SIZE as u64,
                crcs: crcs.into(),
            }),
        (c(), obj_name(), block(), 0u64..1000).prop_map(|(coll, obj, first_block, nblocks)| {
            Effect::PunchBlocks {
                coll,
                obj,
                first_block,
                nblocks,
            }
        }),
        (c(), obj_name(), 0..=limits::OBJECT_SIZE).prop_map(|(coll, obj, size)| Effect::SetSize {
            coll,
            obj,
            size
        }),
        (c(), obj_name()).prop_map(|(coll, obj)| Effect::Remove { coll, obj }),
        (c(), obj_name(), bytes(8), bytes(20)).prop_map(|(coll, obj, name, value)| {
            Effect::SetAttr {
                coll,
                obj,
                name,
                value,
            }
        }),
        (c(), obj_name(), bytes(8)).prop_map(|(coll, obj, name)| Effect::RmAttr {
            coll,
            obj,
            name
        }),
        (c(), bytes(8), bytes(20)).prop_map(|(coll, key, value)| Effect::KvSet {
            coll,
            key,
            value
        }),
        (c(), bytes(8)).prop_map(|(coll, key)| Effect::KvRm { coll, key }),
        (c(), bytes(8), bytes(8)).prop_map(|(coll, start, end)| Effect::KvRmRange {
            coll,
            start,
            end
        }),
    ]
}

/// A sealed TXN record carrying `effects`.
fn txn_record(effects: &[Effect], seq: u64, prev_crc: u32) -> Vec<u8> {
    let mut rec = Vec::new();
    wal::record_header(&mut rec, wal::KIND_TXN, seq, prev_crc);
    effect::encode(effects, &[], &mut rec);
    wal::seal_record(&mut rec);
    rec
}

/// `e` with an in-record payload replaced by a copy of its bytes, for comparisons.
fn owned(e: &Effect, rec: &[u8]) -> Effect {
    match e {
        Effect::SetBlocks {
            coll,
            obj,
            first_block,
            nblocks,
            data: Payload::InRecord(off),
        } => Effect::SetBlocks {
            coll: *coll,
            obj: obj.clone(),
            first_block: *first_block,
            nblocks: *nblocks,
            data: Payload::Owned(cairn_store::SharedBytes::new(
                rec[*off..*off + *nblocks as usize * BLOCK_SIZE].to_vec(),
            )),
        },
        e => e.clone(),
    }
}

fn max_block() -> u64 {
    limits::OBJECT_SIZE / BLOCK_SIZE as u64
}

/// Asserts that a decoded effect respects the decoder's limits.
fn assert_effect_in_limits(e: &Effect, rec_len: usize) {
    let name_ok = |o: &[u8]| assert!(o.len() <= limits::OBJECT_NAME);
    match e {
        Effect::CreateColl(_) | Effect::RemoveColl(_) => {}
        Effect::Touch { obj, .. } | Effect::Remove { obj, .. } => name_ok(obj),
        Effect::SetBlocks {
            obj,
            first_block,
            nblocks,
            data,
            ..
        } => {
            name_ok(obj);
            assert!(*nblocks >= 1 && *nblocks as usize <= limits::TXN_BYTES / BLOCK_SIZE);
            assert!(first_block + *nblocks as u64 <= max_block());
            let Payload::InRecord(off) = data else {
                panic!("a decoded payload is not in the record")
            };
            assert!(off + *nblocks as usize * BLOCK_SIZE <= rec_len);
        }
        Effect::PlaceBlocks {
            obj,
            first_block,
            nblocks,
            off,
            crcs,
            ..
        } => {
            name_ok(obj);
            assert!(*nblocks >= 1 && *nblocks as usize <= limits::TXN_BYTES / BLOCK_SIZE);
            assert!(first_block + *nblocks as u64 <= max_block());
            assert_eq!(crcs.len(), *nblocks as usize);
            assert_eq!(off % BLOCK_SIZE as u64, 0);
        }
        Effect::PunchBlocks {
            obj,
            first_block,
            nblocks,
            ..
        } => {
            name_ok(obj);
            assert!(first_block
                .checked_add(*nblocks)
                .is_some_and(|end| end <= max_block()));
        }
        Effect::SetSize { obj, size, .. } => {
            name_ok(obj);
            assert!(*size <= limits::OBJECT_SIZE);
        }
        Effect::SetAttr {
            obj, name, value, ..
        } => {
            name_ok(obj);
            assert!(name.len() <= limits::ATTR_NAME && value.len() <= limits::ATTR_VALUE);
        }
        Effect::RmAttr { obj, name, .. } => {
            name_ok(obj);
            assert!(name.len() <= limits::ATTR_NAME);
        }
        Effect::KvSet { key, value, .. } => {
            assert!(key.len() <= limits::KV_KEY && value.len() <= limits::KV_VALUE);
        }
        Effect::KvRm { key, .. } => assert!(key.len() <= limits::KV_KEY),
        Effect::KvRmRange { start, end, .. } => {
            assert!(start.len() <= limits::KV_KEY && end.len() <= limits::KV_KEY);
        }
    }
}

/// Decodes `rec` as replay does: header, then the effects of the payload it claims.
fn check_record(rec: &[u8]) {
    let Some(h) = wal::parse_header(rec) else {
        return;
    };
    assert!((wal::KIND_TXN..=wal::KIND_WRAP).contains(&h.kind));
    let end = (wal::HEADER_LEN as u64 + h.len as u64).min(rec.len() as u64) as usize;
    check_effects(&rec[..end], wal::HEADER_LEN);
}

/// Decodes the bytes of `rec` after `base` as effects.
fn check_effects(rec: &[u8], base: usize) {
    let payload = &rec[base..];
    let (r, largest, total) = measured(|| decode::effects(payload, base));
    assert_frugal("effects", payload.len(), largest, total);
    if let Ok(effects) = r {
        assert!(effects.len() <= 4 * limits::OPS);
        for e in &effects {
            assert_effect_in_limits(e, rec.len());
        }
        // The encoding is canonical: decoded effects re-encode to the same bytes.
        let mut again = Vec::new();
        effect::encode(&effects, rec, &mut again);
        assert_eq!(again, payload);
    }
}

// ---- checkpoint body and root ---------------------------------------------------------------

#[derive(Debug, Clone)]
enum MLoc {
    Disk(u64),
    /// Inline blocks, all filled with this byte.
    Inline(u8),
}

#[derive(Debug, Clone)]
struct MExtent {
    nblocks: u32,
    loc: MLoc,
    crcs: Vec<u32>,
}

#[derive(Debug, Clone)]
struct MObject {
    size: u64,
    attrs: BTreeMap<Vec<u8>, Vec<u8>>,
    extents: BTreeMap<u64, MExtent>,
}

#[derive(Debug, Clone)]
struct MColl {
    kv: BTreeMap<Vec<u8>, Vec<u8>>,
    objects: BTreeMap<Vec<u8>, MObject>,
}

#[derive(Debug, Clone)]
struct MCheckpoint {
    replay_seq: u64,
    colls: BTreeMap<u64, MColl>,
}

fn extent() -> impl Strategy<Value = MExtent> {
    (1u32..3, any::<Option<u8>>(), any::<u64>(), any::<u32>()).prop_map(
        |(nblocks, inline, off, crc0)| match inline {
            Some(fill) => MExtent {
                nblocks,
                loc: MLoc::Inline(fill),
                crcs: vec![cairn_crc::crc32c(&[fill; BLOCK_SIZE]); nblocks as usize],
            },
            None => MExtent {
                nblocks,
                loc: MLoc::Disk(off),
                crcs: (0..nblocks).map(|i| crc0.wrapping_add(i)).collect(),
            },
        },
    )
}

fn object() -> impl Strategy<Value = MObject> {
    (
        0..=limits::OBJECT_SIZE,
        prop::collection::btree_map(bytes(8), bytes(16), 0..3),
        prop::collection::btree_map(0u64..(1 << 27), extent(), 0..3),
    )
        .prop_map(|(size, attrs, extents)| MObject {
            size,
            attrs,
            extents,
        })
}

fn checkpoint_model() -> impl Strategy<Value = MCheckpoint> {
    let coll = (
        prop::collection::btree_map(bytes(8), bytes(24), 0..3),
        prop::collection::btree_map(bytes(10), object(), 0..3),
    )
        .prop_map(|(kv, objects)| MColl { kv, objects });
    (
        any::<u64>(),
        prop::collection::btree_map(any::<u64>(), coll, 0..3),
    )
        .prop_map(|(replay_seq, colls)| MCheckpoint { replay_seq, colls })
}

/// Encodes a checkpoint body as `docs/format/store.md` section 8 describes it.
fn encode_body(m: &MCheckpoint) -> Vec<u8> {
    let mut v = Vec::new();
    let mut w = Writer(&mut v);
    w.bytes(b"CAIRNCK1");
    w.u32(1);
    w.u64(m.replay_seq);
    w.u64(m.colls.len() as u64);
    for (id, c) in &m.colls {
        w.u64(*id);
        w.u64(c.kv.len() as u64);
        for (k, val) in &c.kv {
            w.name(k);
            w.blob(val);
        }
        w.u64(c.objects.len() as u64);
        for (name, o) in &c.objects {
            w.name(name);
            w.u64(o.size);
            w.u64(o.attrs.len() as u64);
            for (k, val) in &o.attrs {
                w.name(k);
                w.blob(val);
            }
            w.u64(o.extents.len() as u64);
            for (first, e) in &o.extents {
                w.u64(*first);
                w.u32(e.nblocks);
                match e.loc {
                    MLoc::Disk(off) => {
                        w.u8(0);
                        w.u64(off);
                    }
                    MLoc::Inline(fill) => {
                        w.u8(1);
                        w.bytes(&vec![fill; e.nblocks as usize * BLOCK_SIZE]);
                    }
                }
                for c in &e.crcs {
                    w.u32(*c);
                }
            }
        }
    }
    v
}

/// Decodes a checkpoint body; when it decodes, checks the result against the limits.
fn check_body(b: &[u8]) {
    let mut next_id = 0;
    let (r, largest, total) = measured(|| decode::checkpoint(b, &mut next_id));
    assert_frugal("checkpoint", b.len(), largest, total);
    let Ok(d) = r else { return };
    assert_eq!(next_id, d.dirty.len() as u64, "one id per inline extent");
    for c in d.index.colls.values() {
        for (k, v) in &c.kv {
            assert!(k.len() <= limits::KV_KEY && v.len() <= limits::KV_VALUE);
        }
        for (name, o) in &c.objects {
            assert!(name.len() <= limits::OBJECT_NAME);
            assert!(o.size <= limits::OBJECT_SIZE);
            for (k, v) in &o.attrs {
                assert!(k.len() <= limits::ATTR_NAME && v.len() <= limits::ATTR_VALUE);
            }
            for (first, e) in &o.extents {
                assert!(e.nblocks >= 1);
                assert!(first + e.nblocks as u64 <= max_block());
                assert_eq!(e.crcs.len(), e.nblocks as usize);
            }
        }
    }
    for dirty in &d.dirty {
        assert!(dirty.nblocks as usize * BLOCK_SIZE <= b.len());
    }
}

fn root_strategy() -> impl Strategy<Value = CheckpointRoot> {
    (
        any::<u64>(),
        prop::collection::vec((any::<u64>(), any::<u32>(), any::<u32>()), 0..20),
    )
        .prop_map(|(generation, pieces)| CheckpointRoot {
            generation,
            total_len: pieces.iter().map(|p| p.1 as u64).sum(),
            pieces,
        })
}

fn check_root(b: &[u8]) {
    let (r, largest, total) = measured(|| CheckpointRoot::decode(b));
    assert_frugal("checkpoint root", b.len(), largest, total);
    if let Ok(root) = r {
        assert!(root.pieces.len() <= 1 << 20);
        assert_eq!(
            root.pieces.iter().map(|p| p.1 as u64).sum::<u64>(),
            root.total_len
        );
        // Bytes after the pieces are ignored, though the crc at offset 0 covers them.
        let again = root.encode();
        assert_eq!(
            &again[4..],
            &b[4..again.len()],
            "the root re-encodes to its bytes"
        );
    }
}

// ---- properties --------------------------------------------------------------------------------

/// 256 cases per property, or `PROPTEST_CASES` for a longer run.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_never_panic(b in bytes(300), big in any::<bool>()) {
        // Block-sized inputs reach past the length checks of the one-block structures.
        let mut b = b;
        if big {
            b.resize(BLOCK_SIZE, 0);
        }
        check_superblock(&b);
        check_superblock(&resealed_block(b.clone()));
        check_wal_header(&b);
        check_wal_header(&resealed_block(b.clone()));
        check_record(&b);
        check_effects(&b, 0);
        check_body(&b);
        let mut framed = b"CAIRNCK1\x01\x00\x00\x00".to_vec();
        framed.extend_from_slice(&b);
        check_body(&framed);
        check_root(&b);
        check_root(&resealed(b));
    }

    #[test]
    fn superblock_round_trips_and_survives_mutation(
        sb in superblock(), muts in mutations(), reseal in any::<bool>()
    ) {
        let b = sb.encode();
        prop_assert_eq!(Superblock::decode(&b), Ok(sb));
        let m = mutate(b, &muts);
        check_superblock(&if reseal { resealed_block(m) } else { m });
    }

    #[test]
    fn wal_header_round_trips_and_survives_mutation(
        h in wal_header(), muts in mutations(), reseal in any::<bool>()
    ) {
        let b = h.encode();
        prop_assert_eq!(WalHeader::decode(&b), Some(h));
        let m = mutate(b, &muts);
        check_wal_header(&if reseal { resealed_block(m) } else { m });
    }

    #[test]
    fn wal_record_round_trips_and_survives_mutation(
        effects in prop::collection::vec(effect_strategy(), 0..5),
        seq in any::<u64>(),
        prev in any::<u32>(),
        muts in mutations(),
        reseal in any::<bool>(),
    ) {
        let rec = txn_record(&effects, seq, prev);
        let h = wal::parse_header(&rec).expect("a header");
        prop_assert_eq!(h.kind, wal::KIND_TXN);
        prop_assert_eq!((h.seq, h.prev_crc), (seq, prev));
        prop_assert_eq!(h.len as usize, rec.len() - wal::HEADER_LEN);
        prop_assert_eq!(h.crc, cairn_crc::crc32c(&rec[4..]));
        let back = decode::effects(wal::payload(&rec), wal::HEADER_LEN).expect("decodes");
        let back: Vec<Effect> = back.iter().map(|e| owned(e, &rec)).collect();
        prop_assert_eq!(back, effects);
        check_record(&rec);
        let m = mutate(rec, &muts);
        check_record(&if reseal { resealed(m) } else { m });
    }

    #[test]
    fn checkpoint_body_round_trips_and_survives_mutation(
        m in checkpoint_model(), muts in mutations()
    ) {
        let body = encode_body(&m);
        let mut next_id = 0;
        let d = decode::checkpoint(&body, &mut next_id).expect("a valid body decodes");
        prop_assert_eq!(d.replay_seq, m.replay_seq);
        prop_assert_eq!(d.index.colls.len(), m.colls.len());
        let mut inline = 0;
        for (id, mc) in &m.colls {
            let c = &d.index.colls[id];
            prop_assert_eq!(&kv_owned(&c.kv), &mc.kv);
            prop_assert_eq!(c.objects.len(), mc.objects.len());
            for (name, mo) in &mc.objects {
                let o = &c.objects[&name[..]];
                prop_assert_eq!(o.size, mo.size);
                prop_assert_eq!(&kv_owned(&o.attrs), &mo.attrs);
                prop_assert_eq!(o.extents.len(), mo.extents.len());
                for (first, me) in &mo.extents {
                    let e = o.extents.get(first).expect("the model's extent");
                    prop_assert_eq!(e.nblocks, me.nblocks);
                    prop_assert_eq!(&e.crcs[..], &me.crcs[..]);
                    match me.loc {
                        // `Loc` is not nameable outside the crate; its Debug form is.
                        MLoc::Disk(off) => {
                            prop_assert_eq!(format!("{:?}", e.loc), format!("Disk({off})"))
                        }
                        MLoc::Inline(_) => {
                            inline += 1;
                            prop_assert!(d.dirty.iter().any(|x| x.coll == *id
                                && x.obj[..] == name[..]
                                && x.first_block == *first
                                && x.nblocks == me.nblocks));
                        }
                    }
                }
            }
        }
        prop_assert_eq!(d.dirty.len(), inline);
        check_body(&mutate(body, &muts));
    }

    #[test]
    fn checkpoint_root_round_trips_and_survives_mutation(
        root in root_strategy(), muts in mutations(), reseal in any::<bool>()
    ) {
        let b = root.encode();
        prop_assert_eq!(b.len(), 40 + 16 * root.pieces.len());
        prop_assert_eq!(CheckpointRoot::decode(&b), Ok(root));
        let m = mutate(b, &muts);
        check_root(&if reseal { resealed(m) } else { m });
    }
}

// ---- size claims that must fail fast -------------------------------------------------------

/// Decodes `b` as a checkpoint body, which must fail without allocating for its claims.
fn body_fails_fast(what: &str, b: &[u8]) {
    let mut next_id = 0;
    let (r, largest, total) = measured(|| decode::checkpoint(b, &mut next_id).map(|_| ()));
    assert!(r.is_err(), "{what}: decoded");
    assert!(largest <= 64 << 10, "{what}: {largest}-byte allocation");
    assert!(total <= 1 << 20, "{what}: {total} bytes allocated");
}

/// A body that ends in one extent of the given header, then a few bytes.
fn extent_fails_fast(obj: &[u8], first: u64, nblocks: u32, kind: u8) {
    let mut b = obj.to_vec();
    let mut w = Writer(&mut b);
    w.u64(0);
    w.u64(1);
    w.u64(first);
    w.u32(nblocks);
    w.u8(kind);
    w.u64(0);
    w.bytes(&[0; 64]);
    body_fails_fast(&format!("extent {first}+{nblocks} kind {kind}"), &b);
}

/// A body up to the extent count of one object "o" in collection 7.
fn object_prefix() -> Vec<u8> {
    let mut b = body_prefix(1);
    let mut w = Writer(&mut b);
    w.u64(7);
    w.u64(0);
    w.u64(1);
    w.name(b"o");
    w.u64(4096);
    b
}

fn body_prefix(ncoll: u64) -> Vec<u8> {
    let mut v = Vec::new();
    let mut w = Writer(&mut v);
    w.bytes(b"CAIRNCK1");
    w.u32(1);
    w.u64(1);
    w.u64(ncoll);
    v
}

#[test]
fn checkpoint_claims_fail_fast() {
    body_fails_fast("2^60 collections", &body_prefix(1 << 60));
    body_fails_fast("u64::MAX collections", &body_prefix(u64::MAX));

    // One collection claiming 2^60 entries, then 2^60 objects.
    let mut b = body_prefix(1);
    Writer(&mut b).u64(7);
    let coll = b.clone();
    Writer(&mut b).u64(1 << 60);
    body_fails_fast("2^60 entries", &b);
    let mut b = coll;
    Writer(&mut b).u64(0);
    Writer(&mut b).u64(1 << 60);
    body_fails_fast("2^60 objects", &b);

    // One object claiming 2^60 attributes, then 2^60 extents, then huge extents.
    let obj = object_prefix();
    let mut b = obj.clone();
    Writer(&mut b).u64(1 << 60);
    body_fails_fast("2^60 attributes", &b);
    let mut b = obj.clone();
    Writer(&mut b).u64(0);
    Writer(&mut b).u64(1 << 60);
    body_fails_fast("2^60 extents", &b);
    for (first, nblocks, kind) in [
        (0u64, u32::MAX, 1u8),
        (0, u32::MAX, 0),
        (u64::MAX, 1, 0),
        (max_block(), 1, 0),
        (0, 0, 0),
        (0, 1 << 28, 1),
    ] {
        extent_fails_fast(&obj, first, nblocks, kind);
    }

    // An object name or a value longer than its limit.
    let mut b = body_prefix(1);
    let mut w = Writer(&mut b);
    w.u64(7);
    w.u64(1);
    w.u16(u16::MAX);
    body_fails_fast("key of 65535 bytes", &b);
    let mut b = body_prefix(1);
    let mut w = Writer(&mut b);
    w.u64(7);
    w.u64(1);
    w.name(b"k");
    w.u32(u32::MAX);
    body_fails_fast("value of 4 GiB", &b);
}

/// An on-disk extent within the object size limit whose crcs the body cannot hold: the
/// decoder must not reserve room for 2^28 crcs (1 GiB) before reading them.
#[test]
fn checkpoint_disk_extent_crc_claim_fails_fast() {
    let obj = object_prefix();
    for (first, nblocks) in [(0u64, 1u32 << 28), ((1 << 28) - (1 << 20), 1 << 20)] {
        extent_fails_fast(&obj, first, nblocks, 0);
    }
}

#[test]
fn root_and_effect_claims_fail_fast() {
    // A correctly sealed root claiming 2^60 pieces, and one claiming the most it may hold.
    for n in [1u64 << 60, 1 << 20] {
        let mut b = Vec::new();
        let mut w = Writer(&mut b);
        w.u32(0);
        w.bytes(b"CAIRNCR1");
        w.u32(1);
        w.u64(1);
        w.u64(0);
        w.u64(n);
        w.bytes(&[0; 32]);
        let b = resealed(b);
        let (r, largest, _) = measured(|| CheckpointRoot::decode(&b));
        assert!(r.is_err(), "root with {n} pieces decoded");
        assert!(
            largest <= 64 << 10,
            "root with {n} pieces: {largest}-byte allocation"
        );
    }

    // Effects: u32::MAX of them; a SetBlocks of u32::MAX blocks; over-long names and values.
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut b = Vec::new();
    Writer(&mut b).u32(u32::MAX);
    cases.push(("u32::MAX effects", b));
    let mut b = Vec::new();
    Writer(&mut b).u32((4 * limits::OPS) as u32);
    cases.push(("the most effects, no bytes", b));
    let mut b = Vec::new();
    let mut w = Writer(&mut b);
    w.u32(1);
    w.u8(4);
    w.u64(1);
    w.name(b"o");
    w.u64(0);
    w.u32(u32::MAX);
    cases.push(("SetBlocks of u32::MAX blocks", b));
    for (tag, what) in [(3u8, "object name"), (10, "key")] {
        let mut b = Vec::new();
        let mut w = Writer(&mut b);
        w.u32(1);
        w.u8(tag);
        w.u64(1);
        w.u16(u16::MAX);
        w.bytes(&[b'x'; 100]);
        cases.push((what, b));
    }
    let mut b = Vec::new();
    let mut w = Writer(&mut b);
    w.u32(1);
    w.u8(10);
    w.u64(1);
    w.name(b"k");
    w.u32(u32::MAX);
    cases.push(("value of 4 GiB", b));
    for (what, b) in cases {
        let (r, largest, total) = measured(|| decode::effects(&b, 0).map(|v| v.len()));
        assert!(r.is_err(), "{what}: decoded");
        assert!(largest <= 256 << 10, "{what}: {largest}-byte allocation");
        assert!(total <= 1 << 20, "{what}: {total} bytes allocated");
    }
}

#[test]
fn wal_record_header_fields_are_where_the_format_says() {
    let rec = txn_record(&[Effect::CreateColl(9)], 0x0102_0304_0506_0708, 0xAABB_CCDD);
    assert_eq!(rec.len(), 32 + 4 + 9);
    assert_eq!(&rec[4..8], b"CWAL");
    assert_eq!(rec[8], wal::KIND_TXN);
    assert_eq!(rec[9], wal::RECORD_VERSION);
    assert_eq!(&rec[10..12], &[0, 0]);
    assert_eq!(u32::from_le_bytes(rec[12..16].try_into().unwrap()), 13);
    assert_eq!(&rec[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&rec[24..28], &0xAABB_CCDDu32.to_le_bytes());
    assert_eq!(&rec[28..32], &[0; 4]);
    assert_eq!(
        u32::from_le_bytes(rec[..4].try_into().unwrap()),
        cairn_crc::crc32c(&rec[4..])
    );
    // Kinds outside 1..=3, another version or magic are not records.
    for (at, v) in [(8, 0u8), (8, 4), (9, 2), (4, b'X')] {
        let mut bad = rec.clone();
        bad[at] = v;
        assert_eq!(wal::parse_header(&bad), None, "byte {at} = {v}");
    }
    assert_eq!(wal::parse_header(&rec[..31]), None);
}

/// A decoded key/value map with owned keys and values, to compare with a model's.
fn kv_owned<'a, K: AsRef<[u8]> + 'a, V: AsRef<[u8]> + 'a>(
    m: impl IntoIterator<Item = (&'a K, &'a V)>,
) -> BTreeMap<Vec<u8>, Vec<u8>> {
    m.into_iter()
        .map(|(k, v)| (k.as_ref().to_vec(), v.as_ref().to_vec()))
        .collect()
}
