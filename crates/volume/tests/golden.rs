//! Golden files of the volume formats (`testdata/`, listed in `docs/format/volume.md`,
//! "Golden files"): the header, open leases (versions 1 and 2), the holder registry, the
//! allocation map, the snapshot table and a pool's QoS defaults. Regenerate with
//! `CAIRN_BLESS_GOLDEN=1 cargo test -p cairn-volume --test golden` (only with a version bump).

#[path = "../../../testsupport/golden.rs"]
mod support;

use cairn_volume::header::Header;
use cairn_volume::lease::{IoRates, LeaseRecord};
use cairn_volume::snaps::{ParentLink, Qos, Snap, SnapTable};
use cairn_volume::{allocmap, pool_qos, registry};
use std::collections::BTreeSet;
use support::{same, Golden};

/// A header with each flag combination and the clone feature.
#[test]
fn volume_header_v1() {
    let base = Header {
        id: 0x0123_4567_89ab_cdef,
        size: 10 << 30,
        object_size: 4 << 20,
        features: 0,
        created: 1_767_225_600,
        removing: false,
        close: false,
        data_pool: None,
    };
    let mut g = Golden::new("volume-header-v1.bin");
    for (name, h) in [
        ("Header", base),
        (
            "Header removing",
            Header {
                removing: true,
                ..base
            },
        ),
        (
            "Header removing close",
            Header {
                removing: true,
                close: true,
                ..base
            },
        ),
        (
            "Header clone",
            Header {
                features: cairn_volume::header::FEATURE_PARENT,
                ..base
            },
        ),
    ] {
        g.add(name, h.encode(), move |b| {
            same(&Header::decode(b).map_err(|e| e.to_string())?, &h)
        });
    }
    g.finish();
}

/// A header of a volume with a data pool (version 2), plain and as a clone.
#[test]
fn volume_header_v2() {
    let base = Header {
        id: 0x0123_4567_89ab_cdef,
        size: 10 << 30,
        object_size: 4 << 20,
        features: 0,
        created: 1_767_225_600,
        removing: false,
        close: false,
        data_pool: Some(0x0708),
    };
    let mut g = Golden::new("volume-header-v2.bin");
    for (name, h) in [
        ("Header data pool", base),
        (
            "Header data pool clone removing",
            Header {
                features: cairn_volume::header::FEATURE_PARENT,
                removing: true,
                ..base
            },
        ),
    ] {
        g.add(name, h.encode(), move |b| {
            same(&Header::decode(b).map_err(|e| e.to_string())?, &h)
        });
    }
    g.finish();
}

fn lease(writer: bool) -> LeaseRecord {
    LeaseRecord {
        holder: 0x1111_2222_3333_4444,
        expires_at_ms: 1_767_225_615_000,
        pid: 4242,
        desc: "cairn nbd serve on golden, nbd://127.0.0.1:10809".into(),
        acked_gen: 17,
        rates: IoRates {
            read_ops: 101,
            write_ops: 202,
            read_bytes: 303_000,
            write_bytes: 404_000,
        },
        writer,
    }
}

/// A writer's and a reader's lease record.
#[test]
fn lease_v2() {
    let mut g = Golden::new("lease-v2.bin");
    for (name, l) in [("writer", lease(true)), ("reader", lease(false))] {
        g.add(name, l.encode(), move |b| {
            same(&LeaseRecord::decode(b).map_err(|e| e.to_string())?, &l)
        });
    }
    g.finish();
}

/// A version 1 record (no snapshot generation, rates or writer flag), still read: as a
/// writer that acknowledged generation 0.
#[test]
fn lease_v1() {
    let l = lease(true);
    let mut b = Vec::new();
    b.extend_from_slice(b"CAIRNOPN");
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&l.holder.to_le_bytes());
    b.extend_from_slice(&l.expires_at_ms.to_le_bytes());
    b.extend_from_slice(&l.pid.to_le_bytes());
    b.extend_from_slice(&(l.desc.len() as u16).to_le_bytes());
    b.extend_from_slice(l.desc.as_bytes());
    b.extend_from_slice(&cairn_crc::crc32c(&b).to_le_bytes());
    let want = LeaseRecord {
        acked_gen: 0,
        rates: IoRates::default(),
        ..l
    };
    Golden::raw("lease-v1.bin", b, move |b| {
        same(&LeaseRecord::decode(b).map_err(|e| e.to_string())?, &want)
    })
    .finish();
}

#[test]
fn holder_registry_v1() {
    let entries = vec![
        registry::Entry {
            holder: 0x0a0a_0b0b_0c0c_0d0d,
            since_ms: 1_767_225_600_123,
            writer: true,
        },
        registry::Entry {
            holder: 0x0e0e_0f0f_1010_1111,
            since_ms: 1_767_225_600_456,
            writer: false,
        },
    ];
    let b = registry::encode(&entries);
    Golden::raw("holder-registry-v1.bin", b, move |b| {
        same(&registry::decode(b).map_err(|e| e.to_string())?, &entries)
    })
    .finish();
}

/// Shard 3 of a volume's allocation map, with its first, last and a few other bits set.
#[test]
fn allocmap_v1() {
    let (id, shard) = (0x5555_6666_7777_8888, 3);
    let first = shard * allocmap::SHARD_OBJECTS;
    let members: BTreeSet<u64> = [0, 1, 9, 4095, 4096, allocmap::SHARD_OBJECTS - 1]
        .into_iter()
        .map(|i| first + i)
        .collect();
    let b = allocmap::encode(id, shard, &members);
    Golden::raw("allocmap-v1.bin", b, move |b| {
        same(
            &allocmap::decode(b, id, shard).map_err(|e| e.to_string())?,
            &members.iter().copied().collect(),
        )
    })
    .finish();
}

fn qos() -> Qos {
    Qos {
        iops: 5000,
        bps: 200 << 20,
        iops_burst: 7000,
        bps_burst: 300 << 20,
    }
}

/// A snapshot table with snapshots of each flag combination, retired ids and QoS limits; and
/// a clone's, with its parent link.
#[test]
fn snapshot_table_v1() {
    let snap = |id, name: &str, protected, active| Snap {
        id,
        name: name.into(),
        created: 1_767_225_600 + id,
        size: (id + 1) << 30,
        protected,
        active,
    };
    let table = SnapTable {
        generation: 31,
        seq: 9,
        snaps: vec![
            snap(2, "daily", false, true),
            snap(5, "kept", true, true),
            snap(7, "kept-creating", true, false),
            snap(9, "creating", false, false),
        ],
        retired: vec![3, 4, 8],
        qos: qos(),
        parent: None,
    };
    let clone = SnapTable {
        generation: 2,
        seq: 1,
        snaps: vec![snap(1, "first", false, true)],
        retired: Vec::new(),
        qos: Qos::default(),
        parent: Some(ParentLink {
            volume_id: 0x9999_aaaa_bbbb_cccc,
            snap_id: 5,
            overlap: 6 << 30,
            volume: "golden-parent".into(),
            snap: "kept".into(),
        }),
    };
    let mut g = Golden::new("snapshot-table-v1.bin");
    for (name, t) in [("SnapTable", table), ("SnapTable clone", clone)] {
        g.add(name, t.encode(), move |b| {
            same(&SnapTable::decode(b).map_err(|e| e.to_string())?, &t)
        });
    }
    g.finish();
}

#[test]
fn pool_qos_v1() {
    let q = qos();
    Golden::raw("pool-qos-v1.bin", pool_qos::encode(&q), move |b| {
        same(&pool_qos::decode(b).map_err(|e| e.to_string())?, &q)
    })
    .finish();
}

/// The names of a volume's objects, which find them in the pool (each parsed back where the
/// code parses that kind).
#[test]
fn object_names_v1() {
    use cairn_volume::{header, lease, snaps};
    let (id, objno, holder, snap) = (0x0123_4567_89ab_cdef, 0x2a, 0x1111_2222_3333_4444, 5);
    let mut g = Golden::new("object-names-v1.bin");
    g.add("header", header::header_object("golden-vol"), |b| {
        same(&header::volume_of_header(b), &Some("golden-vol"))
    });
    g.add("data", header::data_object(id, objno), move |b| {
        same(&header::objno_of(id, b), &Some(objno))
    });
    g.add("lease", lease::lease_object(id, holder), move |b| {
        same(&lease::lease_of(b), &Some((id, holder)))
    });
    g.add("registry", registry::registry_object(id), move |b| {
        same(&registry::volume_of(b), &Some(id))
    });
    g.add("allocmap", allocmap::shard_object(id, 3), move |b| {
        same(&allocmap::volume_of(b), &Some(id))
    });
    let table = snaps::snaps_object(id);
    g.add("snapshot table", table.clone(), move |b| {
        same(&b.to_vec(), &table)
    });
    g.add("clone", snaps::clone_object(id, objno, snap), move |b| {
        same(&snaps::clone_of(b), &Some((id, objno, snap)))
    });
    g.add("pool qos", pool_qos::POOL_QOS_OBJECT.to_vec(), |b| {
        same(&b, &pool_qos::POOL_QOS_OBJECT)
    });
    g.finish();
}
