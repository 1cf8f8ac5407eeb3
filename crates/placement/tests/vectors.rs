//! Committed test vectors: `testdata/vectors-v1.txt` pins the results of placement version 1
//! (hashes, stable mod, the flat draw), `testdata/vectors-v2.txt` those of version 2 (the
//! hierarchical draw).
//!
//! `vectors_match` recomputes every line. If it fails, placement results changed: either that
//! is a bug, or the change is intended and needs a new `PLACEMENT_VERSION` and a new vectors
//! file (never rewrite a committed file for a change in results). To write the newest
//! version's file (only when creating a version):
//!
//! ```text
//! cargo test -p cairn-placement --test vectors -- --ignored regenerate_vectors
//! ```
//!
//! Line format (fields separated by single spaces; `#` starts a comment line):
//!
//! ```text
//! version <PLACEMENT_VERSION>
//! hierarchy <label> <host>=<osd id>:<16.16 weight>,... <host>=...   (a host may have no OSDs: `h=`)
//! object_hash <name as hex, prefixed "hex:"> <hash, 8 lowercase hex digits>
//! object_pg <name as hex, prefixed "hex:"> <pg_count> <pg>
//! pg_osds <hierarchy label> <host|osd> <pool> <pg> <size> <osd ids, comma separated, or "-">
//! pg_tree <hierarchy label> <osd|host|rack|zone> <pool> <pg> <size> <osd ids or "-">
//! pg_indep <hierarchy label> <domain> <pool> <pg> <size> <out osd ids or "-"> <osd per rank, "x" for none>
//! ```
//!
//! `pg_indep` lines (version 2) pin the positional draw of erasure-coded pools
//! (`Placer::pg_osds_indep`), with no OSD out and with the hierarchy's first OSD out.
//!
//! In version 2 files a host may carry labels: `<zone>/<rack>/<host>=...`.

use cairn_placement::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

fn vectors_path(version: u32) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(format!("vectors-v{version}.txt"))
}

const VERSIONS: [u32; 2] = [1, PLACEMENT_VERSION];

fn hex(bytes: &[u8]) -> String {
    let mut s = String::from("hex:");
    for b in bytes {
        write!(s, "{b:02x}").unwrap();
    }
    s
}

fn unhex(s: &str) -> Vec<u8> {
    let digits = s.strip_prefix("hex:").expect("hex: prefix");
    assert!(digits.len().is_multiple_of(2), "odd hex length: {s}");
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn host(name: &str, osds: &[(u32, u32)]) -> HostNode {
    HostNode {
        name: name.to_string(),
        osds: osds
            .iter()
            .map(|&(id, weight)| OsdNode { id, weight })
            .collect(),
        ..Default::default()
    }
}

/// The hierarchies the vectors cover.
fn fixtures() -> Vec<(&'static str, Hierarchy)> {
    const W: u32 = WEIGHT_ONE;
    let uniform = |host_count: u32, per_host: u32| Hierarchy {
        hosts: (0..host_count)
            .map(|hi| {
                let osds: Vec<(u32, u32)> =
                    (0..per_host).map(|oi| (hi * per_host + oi, W)).collect();
                host(&format!("host-{hi}"), &osds)
            })
            .collect(),
    };
    vec![
        ("one-host-3-osds", uniform(1, 3)),
        ("three-hosts-4-osds", uniform(3, 4)),
        (
            "unequal-weights",
            Hierarchy {
                hosts: vec![
                    host("rack1-a", &[(0, W / 2), (1, W), (2, 3 * W)]),
                    host("rack1-b", &[(3, 2 * W), (4, W + W / 4)]),
                    host("rack2-a", &[(5, W / 4), (6, 5 * W), (7, W)]),
                    host("rack2-b", &[(8, 4 * W)]),
                ],
            },
        ),
        (
            "racks-and-zones",
            Hierarchy {
                hosts: vec![
                    labelled("z1", "r1", "a", &[(0, W), (1, 2 * W)]),
                    labelled("z1", "r1", "b", &[(2, W)]),
                    labelled("z1", "r2", "c", &[(3, W), (4, W / 2)]),
                    labelled("z2", "r1", "d", &[(5, 3 * W), (6, 0)]),
                    labelled("z2", "r3", "e", &[(7, W)]),
                    labelled("z3", "", "f", &[(8, W), (9, W)]),
                    labelled("z3", "", "g", &[]),
                ],
            },
        ),
        (
            "with-zero-weight",
            Hierarchy {
                hosts: vec![
                    host("a", &[(10, W), (11, 0), (12, W)]),
                    host("b", &[(20, 0)]),
                    host("c", &[(30, W), (31, W)]),
                    host("d", &[]),
                ],
            },
        ),
    ]
}

fn object_names() -> Vec<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"a".to_vec(),
        b"a\0".to_vec(),
        b"object".to_vec(),
        b"12345678".to_vec(),
        b"123456789".to_vec(),
        b"rbd_data.1234.0000000000000001".to_vec(),
        vec![0xff; 33],
    ];
    names.extend((0..8).map(|i| format!("obj-{i}").into_bytes()));
    names
}

fn labelled(zone: &str, rack: &str, name: &str, osds: &[(u32, u32)]) -> HostNode {
    HostNode {
        zone: zone.into(),
        rack: rack.into(),
        ..host(name, osds)
    }
}

/// Version 1 knows hosts only: its files have no labelled hierarchy.
fn fixtures_of(version: u32) -> Vec<(&'static str, Hierarchy)> {
    let mut all = fixtures();
    if version == 1 {
        all.retain(|(_, h)| {
            h.hosts
                .iter()
                .all(|h| h.zone.is_empty() && h.rack.is_empty())
        });
    }
    all
}

fn format_hierarchy(label: &str, h: &Hierarchy) -> String {
    let mut line = format!("hierarchy {label}");
    for host in &h.hosts {
        let osds: Vec<String> = host
            .osds
            .iter()
            .map(|o| format!("{}:{}", o.id, o.weight))
            .collect();
        if host.zone.is_empty() && host.rack.is_empty() {
            write!(line, " {}={}", host.name, osds.join(",")).unwrap();
        } else {
            let (z, r, n) = (&host.zone, &host.rack, &host.name);
            write!(line, " {z}/{r}/{n}={}", osds.join(",")).unwrap();
        }
    }
    line
}

fn parse_hierarchy(fields: &[&str]) -> Hierarchy {
    let hosts = fields
        .iter()
        .map(|f| {
            let (path, osds) = f.split_once('=').expect("host=osds");
            let parts: Vec<&str> = path.split('/').collect();
            let (zone, rack, name) = match parts[..] {
                [name] => ("", "", name),
                [zone, rack, name] => (zone, rack, name),
                _ => panic!("bad host {path:?}"),
            };
            let osds = osds
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|o| {
                    let (id, weight) = o.split_once(':').expect("id:weight");
                    OsdNode {
                        id: id.parse().expect("osd id"),
                        weight: weight.parse().expect("weight"),
                    }
                })
                .collect();
            HostNode {
                name: name.to_string(),
                rack: rack.to_string(),
                zone: zone.to_string(),
                osds,
            }
        })
        .collect();
    Hierarchy { hosts }
}

fn parse_domain(s: &str) -> FailureDomain {
    FailureDomain::parse(s).unwrap_or_else(|| panic!("unknown domain {s}"))
}

fn format_osds(osds: &[u32]) -> String {
    if osds.is_empty() {
        return "-".to_string();
    }
    osds.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The whole vectors file of `version`, computed by the current code.
fn generate(version: u32) -> String {
    let mut out = String::new();
    out.push_str("# Cairn placement test vectors; format and regeneration: tests/vectors.rs,\n");
    out.push_str("# algorithm: docs/format/placement.md. Do not edit by hand.\n");
    writeln!(out, "version {version}").unwrap();
    if version == 2 {
        generate_tree(&mut out);
        generate_indep(&mut out);
        return out;
    }
    for name in object_names() {
        writeln!(out, "object_hash {} {:08x}", hex(&name), object_hash(&name)).unwrap();
    }
    for name in object_names() {
        for pg_count in [1, 2, 7, 64, 100, 4096] {
            let pg = object_pg(&name, pg_count);
            writeln!(out, "object_pg {} {pg_count} {pg}", hex(&name)).unwrap();
        }
    }
    for (label, h) in fixtures_of(1) {
        writeln!(out, "{}", format_hierarchy(label, &h)).unwrap();
        for domain in [FailureDomain::Host, FailureDomain::Osd] {
            for (pool, pg) in [(1, 0), (1, 1), (1, 2), (1, 3), (1, 77), (2, 0), (9, 4095)] {
                for size in [1, 3, 5] {
                    let osds = pg_osds(&h, pool, pg, size, domain);
                    writeln!(
                        out,
                        "pg_osds {label} {} {pool} {pg} {size} {}",
                        domain.name(),
                        format_osds(&osds)
                    )
                    .unwrap();
                }
            }
        }
    }
    out
}

/// Version 2's lines: the hierarchical draw over every fixture and every domain (hashes and
/// stable mod are version 1's, pinned by its file).
fn generate_tree(out: &mut String) {
    for (label, h) in fixtures_of(2) {
        writeln!(out, "{}", format_hierarchy(label, &h)).unwrap();
        let placer = Placer::new(&h);
        for domain in FailureDomain::ALL {
            for (pool, pg) in [(1, 0), (1, 1), (1, 2), (1, 3), (1, 77), (2, 0), (9, 4095)] {
                for size in [1, 3, 5] {
                    let osds = placer.pg_osds_tree(pool, pg, size, domain);
                    writeln!(
                        out,
                        "pg_tree {label} {} {pool} {pg} {size} {}",
                        domain.name(),
                        format_osds(&osds)
                    )
                    .unwrap();
                }
            }
        }
    }
}

/// Version 2's positional lines: every fixture and domain, sizes 3 and 5, with no OSD out
/// and with the fixture's first OSD out.
fn generate_indep(out: &mut String) {
    for (label, h) in fixtures_of(2) {
        let first = h.hosts.iter().flat_map(|x| &x.osds).map(|o| o.id).next();
        for outs in [Vec::new(), first.into_iter().collect::<Vec<u32>>()] {
            let placer = Placer::with_out(&h, outs.iter().copied().collect());
            for domain in FailureDomain::ALL {
                for (pool, pg) in [(1, 0), (1, 1), (1, 2), (1, 77), (9, 4095)] {
                    for size in [3, 5] {
                        let osds = placer.pg_osds_indep(pool, pg, size, domain);
                        writeln!(
                            out,
                            "pg_indep {label} {} {pool} {pg} {size} {} {}",
                            domain.name(),
                            format_osds(&outs),
                            format_ranks(&osds)
                        )
                        .unwrap();
                    }
                }
            }
        }
    }
}

/// "3,x,5": an OSD per rank, `x` where there is none.
fn format_ranks(osds: &[Option<u32>]) -> String {
    osds.iter()
        .map(|o| o.map_or("x".to_string(), |o| o.to_string()))
        .collect::<Vec<_>>()
        .join(",")
}

#[derive(Default)]
struct Counts {
    hashes: usize,
    pgs: usize,
    placements: usize,
}

/// Recomputes one line; returns a description of the mismatch, if any.
fn check_line(
    version: u32,
    line: &str,
    hierarchies: &mut BTreeMap<String, Hierarchy>,
    counts: &mut Counts,
) -> Option<String> {
    let fields: Vec<&str> = line.split(' ').collect();
    match fields[0] {
        "version" => {
            assert_eq!(fields[1].parse::<u32>().unwrap(), version);
            None
        }
        "hierarchy" => {
            hierarchies.insert(fields[1].to_string(), parse_hierarchy(&fields[2..]));
            None
        }
        "object_hash" => {
            counts.hashes += 1;
            let got = format!("{:08x}", object_hash(&unhex(fields[1])));
            (got != fields[2]).then(|| format!("got {got}"))
        }
        "object_pg" => {
            counts.pgs += 1;
            let got = object_pg(&unhex(fields[1]), fields[2].parse().unwrap()).to_string();
            (got != fields[3]).then(|| format!("got {got}"))
        }
        "pg_osds" => {
            counts.placements += 1;
            let h = &hierarchies[fields[1]];
            let got = format_osds(&pg_osds(
                h,
                fields[3].parse().unwrap(),
                fields[4].parse().unwrap(),
                fields[5].parse().unwrap(),
                parse_domain(fields[2]),
            ));
            (got != fields[6]).then(|| format!("got {got}"))
        }
        "pg_tree" => {
            counts.placements += 1;
            let placer = Placer::new(&hierarchies[fields[1]]);
            let got = format_osds(&placer.pg_osds_tree(
                fields[3].parse().unwrap(),
                fields[4].parse().unwrap(),
                fields[5].parse().unwrap(),
                parse_domain(fields[2]),
            ));
            (got != fields[6]).then(|| format!("got {got}"))
        }
        "pg_indep" => {
            counts.placements += 1;
            let outs = match fields[6] {
                "-" => Default::default(),
                list => list.split(',').map(|o| o.parse().unwrap()).collect(),
            };
            let placer = Placer::with_out(&hierarchies[fields[1]], outs);
            let got = format_ranks(&placer.pg_osds_indep(
                fields[3].parse().unwrap(),
                fields[4].parse().unwrap(),
                fields[5].parse().unwrap(),
                parse_domain(fields[2]),
            ));
            (got != fields[7]).then(|| format!("got {got}"))
        }
        other => panic!("unknown line kind {other:?}"),
    }
}

#[test]
fn vectors_match() {
    for version in VERSIONS {
        check_file(version);
    }
}

fn check_file(version: u32) {
    let text = std::fs::read_to_string(vectors_path(version)).expect("read vectors file");
    let mut hierarchies = BTreeMap::new();
    let mut counts = Counts::default();
    let mut mismatches = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(err) = check_line(version, line, &mut hierarchies, &mut counts) {
            mismatches.push(format!("v{version} line {}: {line}: {err}", n + 1));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} vector(s) differ; placement results changed (see tests/vectors.rs):\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    // Guard against a truncated file passing vacuously.
    if version == 1 {
        assert!(counts.hashes >= 10, "{} object_hash lines", counts.hashes);
        assert!(counts.pgs >= 50, "{} object_pg lines", counts.pgs);
    }
    assert!(
        counts.placements >= 100,
        "{} placement lines",
        counts.placements
    );
    assert_eq!(hierarchies.len(), fixtures_of(version).len());
}

#[test]
fn vectors_files_are_what_the_generator_writes() {
    // Also catches a file edited by hand or a generator changed without regenerating.
    for version in VERSIONS {
        let text = std::fs::read_to_string(vectors_path(version)).expect("read vectors file");
        assert!(
            text == generate(version),
            "vectors-v{version} differs from generate()"
        );
    }
}

#[test]
#[ignore = "writes the newest testdata/vectors-vN.txt; run only when creating a placement version"]
fn regenerate_vectors() {
    let path = vectors_path(PLACEMENT_VERSION);
    std::fs::write(path, generate(PLACEMENT_VERSION)).expect("write vectors file");
}
