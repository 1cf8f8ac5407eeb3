//! Golden files of the store's on-disk formats (`testdata/`, listed in
//! `docs/format/store.md`, "Golden files"): each structure built with every field set, encoded
//! and compared byte for byte with its golden file, and the golden bytes decoded back.
//! Regenerate with `CAIRN_BLESS_GOLDEN=1 cargo test -p cairn-store golden` (only with a
//! version bump: a changed golden file is a changed format).

#[path = "../../../testsupport/golden.rs"]
mod support;

use crate::checkpoint::{self, Root};
use crate::device::{MemDevice, BLOCK_SIZE};
use crate::effect::{self, Effect, Name, Payload};
use crate::format::{Role, Superblock, WalHeader};
use crate::index::{ApplyOut, Crcs, Index, Loc};
use crate::shared::SharedBytes;
use crate::wal::{self, QueuedRecord, Replayer, WalRegion};
use std::collections::HashMap;
use std::sync::Arc;
use support::{same, Golden};

fn superblock(role: Role) -> Superblock {
    Superblock {
        store_id: *b"golden-store-id!",
        role,
        device_index: 1,
        data_devices: 2,
        device_size: 8 << 30,
        segment_size: 4 << 20,
        segment_offset: 4096 + (64 << 20),
        segment_count: 2046,
        wal_offset: 4096,
        wal_size: 64 << 20,
        created_unix: 1_767_225_600,
    }
}

#[test]
fn superblock_v2() {
    for (file, role) in [
        ("superblock-v2.bin", Role::Data),
        ("superblock-wal-v2.bin", Role::Wal),
    ] {
        let want = superblock(role);
        Golden::raw(file, want.encode(), move |b| {
            same(&Superblock::decode(b).map_err(|e| e.to_string())?, &want)
        })
        .finish();
    }
}

#[test]
fn wal_header_v2() {
    let want = WalHeader {
        store_id: *b"golden-store-id!",
        generation: 9,
        replay_seq: 1234,
        replay_lsn: 5 << 20,
        replay_prev_crc: 0xdead_beef,
        ckpt_root_offset: (300 << 20) + 8192,
        ckpt_root_len: 56,
        ckpt_root_crc: 0x1234_5678,
    };
    Golden::raw("wal-header-v2.bin", want.encode(), move |b| {
        same(&WalHeader::decode(b).ok_or("does not decode")?, &want)
    })
    .finish();
}

fn name(s: &str) -> Name {
    Arc::from(s.as_bytes())
}

/// One effect of every tag, each field distinct.
fn effects() -> Vec<(&'static str, Effect)> {
    let block: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i % 251) as u8).collect();
    vec![
        ("CreateColl", Effect::CreateColl(0x0102_0304_0506_0708)),
        ("RemoveColl", Effect::RemoveColl(0x1112_1314)),
        (
            "Touch",
            Effect::Touch {
                coll: 21,
                obj: name("touched"),
            },
        ),
        (
            "SetBlocks",
            Effect::SetBlocks {
                coll: 22,
                obj: name("written"),
                first_block: 7,
                nblocks: 1,
                data: Payload::Owned(SharedBytes::new(block)),
            },
        ),
        (
            "PunchBlocks",
            Effect::PunchBlocks {
                coll: 23,
                obj: name("punched"),
                first_block: 9,
                nblocks: 3,
            },
        ),
        (
            "SetSize",
            Effect::SetSize {
                coll: 24,
                obj: name("resized"),
                size: 40_000,
            },
        ),
        (
            "Remove",
            Effect::Remove {
                coll: 25,
                obj: name("removed"),
            },
        ),
        (
            "SetAttr",
            Effect::SetAttr {
                coll: 26,
                obj: name("attributed"),
                name: b"user.colour".to_vec(),
                value: b"blue".to_vec(),
            },
        ),
        (
            "RmAttr",
            Effect::RmAttr {
                coll: 27,
                obj: name("unattributed"),
                name: b"user.shape".to_vec(),
            },
        ),
        (
            "KvSet",
            Effect::KvSet {
                coll: 28,
                key: b"log.0001".to_vec(),
                value: b"entry".to_vec(),
            },
        ),
        (
            "KvRm",
            Effect::KvRm {
                coll: 29,
                key: b"log.0000".to_vec(),
            },
        ),
        (
            "KvRmRange",
            Effect::KvRmRange {
                coll: 30,
                start: b"missing.".to_vec(),
                end: b"missing/".to_vec(),
            },
        ),
        (
            "PlaceBlocks",
            Effect::PlaceBlocks {
                coll: 31,
                obj: name("placed"),
                first_block: 12,
                nblocks: 2,
                off: 17 << 20,
                crcs: Crcs::Many(Arc::from(&[0xaaaa_0001u32, 0xbbbb_0002][..])),
            },
        ),
    ]
}

/// `e` with an in-record payload replaced by the bytes it points at in `rec`.
fn owned(e: Effect, rec: &[u8]) -> Effect {
    match e {
        Effect::SetBlocks {
            coll,
            obj,
            first_block,
            nblocks,
            data: Payload::InRecord(off),
        } => {
            let len = nblocks as usize * BLOCK_SIZE;
            let bytes = rec.get(off..off + len).unwrap_or_default().to_vec();
            Effect::SetBlocks {
                coll,
                obj,
                first_block,
                nblocks,
                data: Payload::Owned(SharedBytes::new(bytes)),
            }
        }
        e => e,
    }
}

/// The effects of a TXN payload, each tag on its own.
#[test]
fn effects_v1() {
    let mut g = Golden::new("effects-v1.bin");
    for (tag, e) in effects() {
        let mut b = Vec::new();
        effect::encode(std::slice::from_ref(&e), &[], &mut b);
        g.add(tag, b, move |b| {
            let got = effect::decode(b, 0).map_err(|e| e.0)?;
            let got: Vec<Effect> = got.into_iter().map(|x| owned(x, b)).collect();
            same(&got, &vec![e.clone()])
        });
    }
    g.finish();
}

const WAL_TAG: u32 = 0x5a5a_0101;
const FIRST_SEQ: u64 = 41;
const PREV_CRC: u32 = 0x0bad_cafe;
/// The ring is two blocks and the batch is laid out 64 bytes before its end: it wraps.
const RING: u64 = 2 * BLOCK_SIZE as u64;
const TAIL: u64 = 3 * RING - 64;

fn region() -> WalRegion {
    let size = 2 * BLOCK_SIZE as u64 + RING;
    WalRegion::new(Arc::new(MemDevice::nvm("golden-wal", size)), 0, size)
}

/// The transaction records of the batch, as the commit path queues them.
fn batch_records() -> Vec<Vec<Effect>> {
    let all = effects();
    let pick = |names: &[&str]| -> Vec<Effect> {
        names
            .iter()
            .map(|n| all.iter().find(|(t, _)| t == n).unwrap().1.clone())
            .collect()
    };
    vec![
        pick(&["CreateColl", "Touch"]),
        pick(&["SetBlocks", "KvSet"]),
    ]
}

/// A group-commit batch of two transaction records and its PAD, behind a WRAP record: every
/// record kind and both flag values, laid out by `wal::layout_batch`.
#[test]
fn wal_records_v1() {
    let region = region();
    let queued: Vec<QueuedRecord> = batch_records()
        .iter()
        .enumerate()
        .map(|(i, effects)| {
            let mut rec = QueuedRecord::default();
            wal::record_header(&mut rec.meta, wal::KIND_TXN, FIRST_SEQ + i as u64, 0);
            effect::encode_deferring(effects, &mut rec.meta, &mut rec.payloads);
            rec
        })
        .collect();
    let b = wal::layout_batch(&region, TAIL, &queued, FIRST_SEQ, PREV_CRC, WAL_TAG, None);
    let (wrap, wrap_lsn) = b.wrap.expect("the batch wraps");
    assert_eq!((wrap_lsn, b.lsn), (TAIL, 3 * RING));
    let mut g = Golden::new("wal-records-v1.bin");
    g.add("WRAP", wrap.to_vec(), |b| {
        let h = wal::parse_header(b).ok_or("no record header")?;
        let want = (wal::KIND_WRAP, 0, 0, FIRST_SEQ, PREV_CRC, WAL_TAG);
        same(&(h.kind, h.flags, h.len, h.seq, h.prev_crc, h.tag), &want)?;
        same(&h.crc, &cairn_crc::crc32c(&b[4..wal::HEADER_LEN]))
    });
    g.add("batch", b.buf.to_vec(), replay_batch);
    g.finish();
}

/// Replays the golden WRAP and batch from a ring holding nothing else: the transactions come
/// back in order, and each record's header is as laid out.
fn replay_batch(batch: &[u8]) -> Result<(), String> {
    let wrap = support::entry("wal-records-v1.bin", "WRAP")?;
    let region = region();
    let e = |e: crate::StoreError| e.to_string();
    region.write_at_lsn(&wrap, TAIL).map_err(e)?;
    region.write_at_lsn(batch, 3 * RING).map_err(e)?;
    let h = WalHeader {
        replay_seq: FIRST_SEQ,
        replay_lsn: TAIL,
        replay_prev_crc: PREV_CRC,
        ..WalHeader::default()
    };
    let mut r = Replayer::new(&region, &h, 1 << 20, WAL_TAG);
    let mut pos = 0;
    let (mut prev, mut seq) = (PREV_CRC, FIRST_SEQ);
    for (i, want) in batch_records().into_iter().enumerate() {
        let wal::Next::Txn(rec) = r.next_record().map_err(e)? else {
            return Err(format!("record {i} does not replay"));
        };
        let h = wal::parse_header(&rec).ok_or("no record header")?;
        let flags = if i == 0 { wal::FLAG_FIRST_IN_BATCH } else { 0 };
        same(
            &(h.kind, h.flags, h.seq, h.prev_crc, h.tag),
            &(wal::KIND_TXN, flags, seq, prev, WAL_TAG),
        )?;
        same(&&batch[pos..pos + rec.len()], &&rec[..])?;
        let got = effect::decode(wal::payload(&rec), wal::HEADER_LEN).map_err(|e| e.0)?;
        let got: Vec<Effect> = got.into_iter().map(|x| owned(x, &rec)).collect();
        same(&got, &want)?;
        (prev, seq, pos) = (h.crc, seq + 1, pos + rec.len());
    }
    let pad = wal::parse_header(&batch[pos..]).ok_or("no PAD header")?;
    same(
        &(pad.kind, pad.flags, pad.seq, pad.prev_crc, pad.tag),
        &(wal::KIND_PAD, 0, seq, prev, WAL_TAG),
    )?;
    same(&(pos + wal::HEADER_LEN + pad.len as usize), &batch.len())?;
    match r.next_record().map_err(e)? {
        wal::Next::End => Ok(()),
        wal::Next::Txn(_) => Err("a record after the batch".into()),
    }
}

/// An extent as compared: where its blocks are (or the inline bytes) and their crcs.
#[derive(Debug, PartialEq)]
enum Ext {
    Disk(u64, Vec<u32>),
    Inline(Vec<u8>, Vec<u32>),
}

/// An index as compared: collections with their entries and objects (name, size, attributes,
/// extents by first block).
type Flat = Vec<(u64, Vec<(Vec<u8>, Vec<u8>)>, Vec<FlatObject>)>;
type FlatObject = (Vec<u8>, u64, Vec<(Vec<u8>, Vec<u8>)>, Vec<(u64, u32, Ext)>);

fn flat(idx: &Index) -> Flat {
    let kv = |m: &crate::index::KvMap| -> Vec<(Vec<u8>, Vec<u8>)> {
        m.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
    };
    idx.colls
        .iter()
        .map(|(id, c)| {
            let objects = c
                .objects
                .iter()
                .map(|(n, o)| {
                    let extents = o
                        .extents
                        .iter()
                        .map(|(first, e)| {
                            let crcs = e.crcs.to_vec();
                            let at = match &e.loc {
                                Loc::Disk(off) => Ext::Disk(*off, crcs),
                                Loc::Mem(m) => {
                                    let len = e.nblocks as usize * BLOCK_SIZE;
                                    Ext::Inline(m.buf[m.off..m.off + len].to_vec(), crcs)
                                }
                            };
                            (*first, e.nblocks, at)
                        })
                        .collect();
                    (n.to_vec(), o.size, kv(&o.attrs), extents)
                })
                .collect();
            (*id, kv(&c.kv), objects)
        })
        .collect()
}

/// Two collections; one with entries and an object with attributes, an extent on disk and an
/// inline one (data not yet flushed at the snapshot).
fn index() -> Index {
    let block: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i % 253) as u8).collect();
    let rec: wal::RecordBuf = Arc::new(block);
    let mut out = ApplyOut::default();
    let ids = std::sync::atomic::AtomicU64::new(0);
    let mut idx = Index::default();
    let obj = name("object-a");
    for e in [
        Effect::CreateColl(0x0000_0001_0000_0002),
        Effect::CreateColl(0x0000_0003_0000_0004),
        Effect::KvSet {
            coll: 0x0000_0001_0000_0002,
            key: b"pg_version".to_vec(),
            value: b"\x05\0\0\0\0\0\0\0".to_vec(),
        },
        Effect::PlaceBlocks {
            coll: 0x0000_0001_0000_0002,
            obj: obj.clone(),
            first_block: 2,
            nblocks: 2,
            off: 9 << 20,
            crcs: Crcs::Many(Arc::from(&[0x0101_0101u32, 0x0202_0202][..])),
        },
        Effect::SetBlocks {
            coll: 0x0000_0001_0000_0002,
            obj: obj.clone(),
            first_block: 6,
            nblocks: 1,
            data: Payload::InRecord(0),
        },
        Effect::SetSize {
            coll: 0x0000_0001_0000_0002,
            obj: obj.clone(),
            size: 7 * BLOCK_SIZE as u64 - 100,
        },
        Effect::SetAttr {
            coll: 0x0000_0001_0000_0002,
            obj,
            name: b"_".to_vec(),
            value: b"attr value".to_vec(),
        },
    ] {
        idx.apply(&e, &rec, &ids, &mut out);
    }
    idx
}

#[test]
fn checkpoint_v1() {
    let idx = index();
    let want = flat(&idx);
    let mut body = Vec::new();
    let inline = checkpoint::encode(&idx, 77, &HashMap::new(), &mut body);
    assert_eq!(inline, BLOCK_SIZE);
    Golden::raw("checkpoint-v1.bin", body, move |b| {
        let d = checkpoint::decode(b, &mut 0).map_err(|e| e.0)?;
        same(&d.replay_seq, &77)?;
        same(&d.dirty.len(), &1)?;
        same(&flat(&d.index), &want)
    })
    .finish();
    let root = Root {
        generation: 3,
        total_len: 5000,
        pieces: vec![(12 << 20, 4096, 0x1111_2222), (13 << 20, 904, 0x3333_4444)],
    };
    let want = root.clone();
    Golden::raw("checkpoint-root-v1.bin", root.encode(), move |b| {
        same(&Root::decode(b).map_err(|e| e.0)?, &want)
    })
    .finish();
}
