//! Volume snapshots through real clients (fio, nbdcopy, qemu-img, nbdsh) against a real
//! cluster: a snapshot export reads what the volume held when the snapshot was taken while the
//! volume goes on changing (also across kill -9 of an OSD), a snapshot taken under writes holds
//! exactly a prefix of them (crash-consistent), rollback restores, removal reclaims.

mod common;

use common::cluster::{text, Cluster};
use common::tools::{
    file_tree, find_block, fio_verify, fsck_clean, fuse_disk, image, mount_loop, nbdsh_spawn, p,
    scratch, system_path, tool, tool_ok, verify_tree, wait_line,
};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Connects, reads one block, and keeps the connection open (idle) until killed.
const IDLE: &str = r#"
import nbd, os, time
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
h.pread(4096, 0)
print("connected", flush=True)
time.sleep(120)
"#;

/// Writes 4 KiB blocks one at a time (each acknowledged before the next) round the 1,024
/// slots of 64 KiB of a 64 MiB volume: write n puts n+1 (u64 little-endian, repeated) in slot
/// n % 1024. Runs until killed.
const SEQUENTIAL: &str = r#"
import nbd, os, time, struct
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
n = 0
end = time.time() + 100
while time.time() < end:
    h.pwrite(struct.pack("<Q", n + 1) * 512, (n % 1024) * 65536)
    n += 1
    if n == 50:
        print("writing", flush=True)
"#;

const SLOTS: u64 = 1024;
const SLOT: usize = 64 << 10;

/// Stops an [`nbdsh`] run: `timeout` passes SIGTERM on to nbdsh (a SIGKILL would not).
fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// Waits for the first line of `child`'s stdout, which must be `want`.
fn objects_with(c: &Cluster, part: &str) -> Vec<String> {
    c.ok(&["obj", "ls", "default"])
        .lines()
        .filter(|l| l.contains(part))
        .map(str::to_string)
        .collect()
}

fn volume_id(c: &Cluster, name: &str) -> String {
    let info: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", name, "--json"])).expect("json");
    info["id"].as_str().expect("id").to_string()
}

/// Waits (30 s at most) until `ready` holds.
fn wait_until(c: &Cluster, what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `cairn vol snap create`; returns how long it said it took (ms).
fn snap_create(c: &Cluster, spec: &str) -> u64 {
    let o = c.cairn(&["vol", "snap", "create", spec]);
    let err = text(&o.stderr);
    assert!(
        o.status.success(),
        "snap create {spec}: {err}\n{}",
        c.logs()
    );
    let ms = err
        .rsplit(" in ")
        .next()
        .and_then(|t| t.trim().strip_suffix(" ms"))
        .and_then(|t| t.parse().ok());
    ms.unwrap_or_else(|| panic!("no time in {err:?}"))
}

fn compare(c: &Cluster, a: &str, b: &str) {
    tool_ok(
        c,
        120,
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", a, b],
    );
}

#[test]
fn snapshot_export_keeps_its_data_while_the_volume_changes_and_rollback_restores_it() {
    let c = Cluster::up_with_nbd("snap-fio", 3);
    c.ok(&["vol", "create", "vm", "--size", "64M"]);
    let id = volume_id(&c, "vm");
    let uri = c.nbd_uri("vm");
    let snap_uri = c.nbd_uri("vm@before");
    fio_verify(&c, &uri, "fill", "64k", "64M", "4");
    let dir = scratch("snap-fio");
    let at_snap = dir.join("at-snap.raw");
    tool_ok(&c, 120, "nbdcopy", &[&uri, &p(&at_snap)]);

    // A client keeps the volume open: the snapshot waits for its server to adopt it.
    let mut idle = nbdsh_spawn(&uri, 150, IDLE);
    wait_line(&mut idle, "connected");
    let ms = snap_create(&c, "vm@before");
    eprintln!("snapshot of a served volume took {ms} ms");
    let ls = c.ok(&["vol", "snap", "ls", "vm", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&ls).expect("json");
    assert_eq!(v["snapshots"][0]["name"], "before", "{v}");
    assert_eq!(v["snapshots"][0]["state"], "ready", "{v}");
    let listed = tool_ok(&c, 30, "nbdinfo", &["--list", &c.nbd_uri("")]);
    assert!(listed.contains("vm@before"), "{listed}");
    let o = c.cairn(&["vol", "resize", "vm", "--size", "32M", "--allow-shrink"]);
    assert!(!o.status.success() && text(&o.stderr).contains("has snapshots"));

    // The volume changes (an OSD killed -9 and restarted meanwhile) while the snapshot is
    // read and compared.
    std::thread::scope(|s| {
        let writer = s.spawn(|| fio_verify(&c, &uri, "rewrite", "4k", "64M", "16"));
        compare(&c, &snap_uri, &p(&at_snap));
        c.kill9("osd.1");
        compare(&c, &snap_uri, &p(&at_snap));
        c.start_osd(1);
        writer.join().expect("fio rewrite");
    });
    compare(&c, &snap_uri, &p(&at_snap));
    let now = dir.join("now.raw");
    tool_ok(&c, 120, "nbdcopy", &[&uri, &p(&now)]);
    assert_ne!(
        std::fs::read(&now).expect("read"),
        std::fs::read(&at_snap).expect("read"),
        "the volume did not change"
    );
    let clones = objects_with(&c, &format!("vclone.{id}."));
    assert_eq!(clones.len(), 16, "one clone per data object: {clones:?}");

    // Snapshots cannot be written.
    let o = tool(
        30,
        "nbdsh",
        &["-u", &snap_uri, "-c", "h.pwrite(b'x' * 512, 0)"],
    );
    assert!(!o.status.success(), "a snapshot export took a write");
    assert!(
        text(&o.stderr).contains("does not support write"),
        "{}",
        text(&o.stderr)
    );

    // Rollback is refused while the volume is open, then restores the snapshot's data.
    let o = c.cairn(&["vol", "snap", "rollback", "vm@before"]);
    assert!(!o.status.success(), "rollback of an open volume");
    assert!(text(&o.stderr).contains("is open"), "{}", text(&o.stderr));
    stop(idle);
    wait_until(&c, "lease not released", || {
        objects_with(&c, &format!("vopen.{id}.")).is_empty()
    });
    c.ok(&["vol", "snap", "rollback", "vm@before"]);
    compare(&c, &uri, &p(&at_snap));
    compare(&c, &snap_uri, &p(&at_snap));

    // A protected snapshot stays; removal takes the clones; then the volume can go.
    c.ok(&["vol", "snap", "protect", "vm@before"]);
    let o = c.cairn(&["vol", "snap", "rm", "vm@before"]);
    assert!(!o.status.success() && text(&o.stderr).contains("protected"));
    let o = c.cairn(&["vol", "rm", "vm"]);
    assert!(!o.status.success() && text(&o.stderr).contains("snapshot"));
    c.ok(&["vol", "snap", "unprotect", "vm@before"]);
    c.ok(&["vol", "snap", "rm", "vm@before"]);
    assert!(objects_with(&c, &format!("vclone.{id}.")).is_empty());
    compare(&c, &uri, &p(&at_snap));
    let o = tool(30, "nbdinfo", &[&snap_uri]);
    assert!(!o.status.success(), "a removed snapshot is still exported");
    c.ok(&["vol", "rm", "vm"]);
    assert!(
        objects_with(&c, &id).is_empty(),
        "{:?}",
        objects_with(&c, &id)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The value of each slot (0: never written), checking each block is one repeated value.
fn slots(image: &[u8]) -> Vec<u64> {
    (0..SLOTS as usize)
        .map(|i| {
            let block = &image[i * SLOT..i * SLOT + 4096];
            let v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
            assert!(
                block.chunks(8).all(|w| w == &block[..8]),
                "slot {i} holds a torn block"
            );
            v
        })
        .collect()
}

/// Checks `got` is the state after exactly the first N writes of [`SEQUENTIAL`], for the N
/// its newest slot shows; returns N.
fn assert_prefix(got: &[u64]) -> u64 {
    let n = got.iter().copied().max().unwrap_or(0);
    for (i, &v) in got.iter().enumerate() {
        let i = i as u64;
        // The last write to slot i among writes 0..n (write k writes k+1 to slot k % SLOTS).
        let want = if n > i {
            ((n - 1 - i) / SLOTS) * SLOTS + i + 1
        } else {
            0
        };
        assert_eq!(
            v, want,
            "slot {i}: the snapshot is not the state after {n} writes"
        );
    }
    n
}

#[test]
fn a_snapshot_taken_under_writes_holds_exactly_a_prefix_of_them() {
    let c = Cluster::up_with_nbd("snap-prefix", 3);
    c.ok(&["vol", "create", "db", "--size", "64M"]);
    let uri = c.nbd_uri("db");
    let mut writer = nbdsh_spawn(&uri, 150, SEQUENTIAL);
    wait_line(&mut writer, "writing");
    let ms = snap_create(&c, "db@mid");
    eprintln!("snapshot under writes took {ms} ms");
    // More writes land after the snapshot, then the writer stops.
    std::thread::sleep(Duration::from_millis(1500));
    stop(writer);
    let dir = scratch("snap-prefix");
    let (snap, head) = (dir.join("snap.raw"), dir.join("head.raw"));
    tool_ok(&c, 120, "nbdcopy", &[&c.nbd_uri("db@mid"), &p(&snap)]);
    tool_ok(&c, 120, "nbdcopy", &[&uri, &p(&head)]);
    let at_snap = assert_prefix(&slots(&std::fs::read(&snap).expect("read")));
    let at_end = assert_prefix(&slots(&std::fs::read(&head).expect("read")));
    assert!(
        at_snap >= 50,
        "the snapshot missed writes acknowledged before it: {at_snap}"
    );
    assert!(
        at_end > at_snap,
        "no write after the snapshot ({at_snap}, {at_end})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `N` random 4 KiB blocks at distinct random block offsets of a 64 MiB volume and
/// prints the offsets, one per line.
const RANDOM_BLOCKS: &str = r#"
import nbd, os, random
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
for b in random.sample(range(16384), int(os.environ["N"])):
    h.pwrite(os.urandom(4096), b * 4096)
    print(b * 4096)
h.flush()
"#;

fn write_random_blocks(c: &Cluster, uri: &str, n: usize) -> Vec<u64> {
    let o = Command::new("timeout")
        .args(["-k", "5", "120", "nbdsh", "-c", RANDOM_BLOCKS])
        .env("URI", uri)
        .env("N", n.to_string())
        .env("PATH", system_path())
        .output()
        .expect("run nbdsh");
    assert!(o.status.success(), "{}\n{}", text(&o.stderr), c.logs());
    text(&o.stdout)
        .lines()
        .map(|l| l.trim().parse().expect("offset"))
        .collect()
}

/// Blocks of 4 KiB at `offsets`, merged into (offset, length) extents.
fn extents_of(offsets: &[u64]) -> Vec<(u64, u64)> {
    let mut sorted = offsets.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for o in sorted {
        match out.last_mut() {
            Some((at, len)) if *at + *len == o => *len += 4096,
            _ => out.push((o, 4096)),
        }
    }
    out
}

fn vol_diff(c: &Cluster, args: &[&str]) -> Vec<(u64, u64)> {
    let mut all = vec!["vol", "diff"];
    all.extend_from_slice(args);
    all.push("--json");
    let v: serde_json::Value = serde_json::from_str(&c.ok(&all)).expect("json");
    v["extents"]
        .as_array()
        .expect("extents")
        .iter()
        .map(|e| {
            let n = |k: &str| e[k].as_u64().expect("number");
            (n("offset"), n("length"))
        })
        .collect()
}

#[test]
fn vol_diff_lists_exactly_the_blocks_written_between_snapshots_and_du_counts_them() {
    let c = Cluster::up_with_nbd("snap-diff", 3);
    c.ok(&["vol", "create", "d", "--size", "64M"]);
    let uri = c.nbd_uri("d");
    fio_verify(&c, &uri, "fill", "1m", "64M", "4");
    snap_create(&c, "d@a");
    let first = write_random_blocks(&c, &uri, 40);
    snap_create(&c, "d@b");
    let second = write_random_blocks(&c, &uri, 30);

    assert_eq!(vol_diff(&c, &["d@a", "d@b"]), extents_of(&first));
    assert_eq!(vol_diff(&c, &["d@b"]), extents_of(&second));
    let both: Vec<u64> = first.iter().chain(&second).copied().collect();
    assert_eq!(vol_diff(&c, &["d@a"]), extents_of(&both));
    let o = c.cairn(&["vol", "diff", "d@b", "d@a"]);
    assert!(!o.status.success(), "a diff backwards was accepted");

    // The same over NBD: export d@b offers qemu:dirty-bitmap:a, and nbdinfo's map of it
    // marks exactly the blocks written between a and b (what a backup tool copies).
    let out = tool_ok(
        &c,
        60,
        "nbdinfo",
        &["--map=qemu:dirty-bitmap:a", "--json", &c.nbd_uri("d@b")],
    );
    let map: serde_json::Value = serde_json::from_str(&out).expect("nbdinfo json");
    let dirty: Vec<(u64, u64)> = map
        .as_array()
        .expect("extents")
        .iter()
        .filter(|e| e["type"] == 1)
        .map(|e| {
            (
                e["offset"].as_u64().expect("offset"),
                e["length"].as_u64().expect("length"),
            )
        })
        .collect();
    assert_eq!(dirty, extents_of(&first));
    let listed = tool_ok(&c, 30, "nbdinfo", &["--list", &c.nbd_uri("")]);
    assert!(listed.contains("qemu:dirty-bitmap:a"), "{listed}");

    // Space: every written object was cloned once per snapshot it changed under; removing
    // `a` gives back exactly what only `a` reads.
    let du: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "du", "d", "--json"])).expect("json");
    let snap = |i: usize, k: &str| du["snapshots"][i][k].as_u64().expect("number");
    assert_eq!(du["head_bytes"], 64 << 20, "{du}");
    assert!(
        snap(0, "clone_bytes") > 0 && snap(1, "clone_bytes") > 0,
        "{du}"
    );
    let exclusive_a = snap(0, "exclusive_bytes");
    assert!(exclusive_a > 0, "{du}");
    let before = du["clone_bytes"].as_u64().expect("clone_bytes");
    c.ok(&["vol", "snap", "rm", "d@a"]);
    let du: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "du", "d", "--json"])).expect("json");
    assert_eq!(
        du["clone_bytes"].as_u64().expect("clone_bytes"),
        before - exclusive_a,
        "{du}"
    );
    assert_eq!(vol_diff(&c, &["d@b"]), extents_of(&second));

    // Commands changing one volume's table at once: each either lands or stops with a
    // clear error; none is lost (the table is written compare-and-swap).
    let racing: Vec<Child> = (0..4)
        .map(|i| {
            Command::new(env!("CARGO_BIN_EXE_cairn"))
                .args(["-c", &c.conf.display().to_string()])
                .args(["vol", "snap", "create", &format!("d@race{i}")])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let outcomes: Vec<_> = racing
        .into_iter()
        .map(|ch| ch.wait_with_output().expect("wait"))
        .collect();
    let ls = c.ok(&["vol", "snap", "ls", "d"]);
    for (i, o) in outcomes.iter().enumerate() {
        let listed = ls.contains(&format!("race{i}"));
        if o.status.success() {
            assert!(listed, "race{i} succeeded but is not in the table:\n{ls}");
        } else {
            let e = text(&o.stderr);
            assert!(e.contains("at the same time"), "race{i}: {e}");
        }
    }
    let landed = outcomes.iter().filter(|o| o.status.success()).count();
    eprintln!("{landed} of 4 racing snapshot creates landed");
    assert!(landed >= 1, "no racing create landed");

    // A damaged holder registry is a clear error too, naming the object to remove.
    let junk_dir = scratch("snap-diff-junk");
    let junk = junk_dir.join("junk");
    std::fs::write(&junk, b"CAIRNHLD not a registry").expect("write");
    let registry = format!("vholders.{}", volume_id(&c, "d"));
    c.ok(&["obj", "put", "default", &registry, &p(&junk)]);
    let o = c.cairn(&["vol", "info", "d"]);
    let err = text(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("holder registry is damaged")
            && err.contains(&registry),
        "{err}"
    );
    c.ok(&["obj", "rm", "default", &registry]);

    // A damaged snapshot table is a clear error, not a panic or a guess.
    std::fs::write(&junk, b"CAIRNSNP not a table").expect("write");
    let table = format!("vsnaps.{}", volume_id(&c, "d"));
    c.ok(&["obj", "put", "default", &table, &p(&junk)]);
    let o = c.cairn(&["vol", "snap", "ls", "d"]);
    let err = text(&o.stderr);
    assert!(
        !o.status.success() && err.contains("snapshot table is damaged"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&junk_dir);
}

/// Writes `tree` under `root`.
fn write_tree(root: &std::path::Path, tree: &[(String, Vec<u8>)]) {
    for (rel, data) in tree {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir in ext4");
        std::fs::write(&path, data).expect("write in ext4");
    }
}

#[test]
fn ext4_on_a_clone_of_a_snapshot_then_flatten_under_writes_and_the_parent_removed() {
    let c = Cluster::up_with_nbd("snap-clone", 3);
    let dir = scratch("snap-clone");
    c.ok(&["vol", "create", "golden", "--size", "256M"]);
    let base = file_tree(7);
    {
        let (m, disk) = fuse_disk(&c, &c.nbd_uri("golden"), &dir.join("g"));
        tool_ok(&c, 120, "mkfs.ext4", &["-q", "-F", &p(&disk)]);
        mount_loop(&c, &disk, &m.loop_mnt);
        write_tree(&m.loop_mnt, &base);
        assert!(m.umount_loop(), "umount failed");
    }
    let golden = dir.join("golden.raw");
    tool_ok(&c, 120, "nbdcopy", &[&c.nbd_uri("golden"), &p(&golden)]);
    snap_create(&c, "golden@base");
    let o = c.cairn(&["vol", "clone", "golden@base", "vm1"]);
    assert!(!o.status.success() && text(&o.stderr).contains("not protected"));
    c.ok(&["vol", "snap", "protect", "golden@base"]);
    let start = Instant::now();
    c.ok(&["vol", "clone", "golden@base", "vm1"]);
    eprintln!(
        "clone took {} ms (with the CLI's start)",
        start.elapsed().as_millis()
    );
    compare(&c, &c.nbd_uri("vm1"), &p(&golden));

    // ext4 on the clone: clean, the parent's files there, new files of its own.
    let (m, disk) = fuse_disk(&c, &c.nbd_uri("vm1"), &dir.join("c"));
    fsck_clean(&disk);
    mount_loop(&c, &disk, &m.loop_mnt);
    verify_tree(&m.loop_mnt, &base);
    let own = file_tree(8);
    write_tree(&m.loop_mnt.join("own"), &own);
    assert!(m.umount_loop(), "umount failed");
    fsck_clean(&disk);
    compare(&c, &c.nbd_uri("golden"), &p(&golden));
    compare(&c, &c.nbd_uri("golden@base"), &p(&golden));
    let o = c.cairn(&["vol", "snap", "unprotect", "golden@base"]);
    assert!(!o.status.success() && text(&o.stderr).contains("vm1"));
    let o = c.cairn(&["vol", "resize", "vm1", "--size", "128M", "--allow-shrink"]);
    assert!(!o.status.success() && text(&o.stderr).contains("is a clone"));

    // Flatten while files are written into the clone's ext4.
    mount_loop(&c, &disk, &m.loop_mnt);
    let during = file_tree(9);
    std::thread::scope(|s| {
        let writer = s.spawn(|| write_tree(&m.loop_mnt.join("during"), &during));
        c.ok(&["vol", "flatten", "vm1"]);
        writer.join().expect("writer");
    });
    assert!(m.umount_loop(), "umount failed");
    let info: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", "vm1", "--json"])).expect("json");
    assert!(info["parent"].is_null(), "{info}");

    // The parent goes; the clone stands alone.
    c.ok(&["vol", "snap", "unprotect", "golden@base"]);
    c.ok(&["vol", "snap", "rm", "golden@base"]);
    c.ok(&["vol", "rm", "golden"]);
    fsck_clean(&disk);
    mount_loop(&c, &disk, &m.loop_mnt);
    verify_tree(&m.loop_mnt, &base);
    verify_tree(&m.loop_mnt.join("own"), &own);
    verify_tree(&m.loop_mnt.join("during"), &during);
    assert!(m.umount_loop(), "umount failed");
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pool_filled_under_a_snapshot_says_enospc_loses_nothing_and_snapshot_rm_brings_writes_back() {
    // Three 256 MiB OSDs, 3 copies: about 170 MiB fit. A 96 MiB volume fits once, not twice
    // (its snapshot's copies on top of a full rewrite).
    let c = Cluster::up_with_nbd_sized("snap-full", 3, "256M");
    c.ok(&["vol", "create", "v", "--size", "96M"]);
    let uri = c.nbd_uri("v");
    let dir = scratch("snap-full");
    let (a, b) = (dir.join("a.raw"), dir.join("b.raw"));
    let (img_a, img_b) = (image(96 << 20, &[], 1), image(96 << 20, &[], 2));
    std::fs::write(&a, &img_a).expect("write a");
    std::fs::write(&b, &img_b).expect("write b");
    tool_ok(&c, 120, "nbdcopy", &[&p(&a), &uri]);
    snap_create(&c, "v@old");

    let o = tool(300, "nbdcopy", &[&p(&b), &uri]);
    let err = text(&o.stderr);
    assert!(
        !o.status.success(),
        "a rewrite under a snapshot fitted a full pool"
    );
    assert!(err.contains("No space left"), "{err}");
    // Small objects may use the store's last 5%: fill that too. The volume's data can still be
    // read (served read-only while there is no room even for its open lease).
    let mut puts = Vec::new();
    for size in [60 << 10, 4096] {
        let small = dir.join("small");
        std::fs::write(&small, vec![0x5au8; size]).expect("write");
        loop {
            let name = format!("filler-{}", puts.len());
            let o = c.cairn(&["obj", "put", "default", &name, &p(&small)]);
            if !o.status.success() {
                let e = text(&o.stderr);
                assert!(e.contains("no space"), "{e}\n{}", c.logs());
                break;
            }
            puts.push(name);
            assert!(puts.len() < 2000, "the reserve never filled");
        }
    }
    // Nothing lost: the snapshot reads what it held; every 4 KiB of the volume is old or new
    // (nbdcopy's requests failed or landed whole).
    compare(&c, &c.nbd_uri("v@old"), &p(&a));
    let now = dir.join("now.raw");
    tool_ok(&c, 120, "nbdcopy", &[&uri, &p(&now)]);
    let now = std::fs::read(&now).expect("read");
    let (mut old, mut new) = (0, 0);
    for (i, chunk) in now.chunks(4096).enumerate() {
        let at = i * 4096;
        if chunk == &img_a[at..at + chunk.len()] {
            old += 1;
        } else if chunk == &img_b[at..at + chunk.len()] {
            new += 1;
        } else {
            panic!("block {i} of the volume is neither the old data nor the new");
        }
    }
    assert!(new > 0 && old > 0, "old {old} new {new}");

    for name in &puts {
        c.ok(&["obj", "rm", "default", name]);
    }

    // Removing the snapshot gives its copies back: the rewrite now fits.
    c.ok(&["vol", "snap", "rm", "v@old"]);
    let start = Instant::now();
    loop {
        let o = tool(300, "nbdcopy", &[&p(&b), &uri]);
        if o.status.success() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "writes did not come back after the snapshot was removed: {}\n{}",
            text(&o.stderr),
            c.logs()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    compare(&c, &uri, &p(&b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A block only a snapshot holds (in its clone object), damaged on one OSD's data device:
/// scrub finds and repairs it like the volume's own data, and the snapshot reads it intact.
#[test]
fn scrub_repairs_a_damaged_copy_of_snapshot_data() {
    use std::os::unix::fs::FileExt;
    let c = Cluster::up_with_nbd("snap-scrub", 3);
    c.ok(&["vol", "create", "s", "--size", "16M"]);
    let uri = c.nbd_uri("s");
    let old: Vec<u8> = (0..4096u32)
        .map(|i| (i * 7 + 3) as u8 ^ b"SNAPSCRUB"[(i % 9) as usize])
        .collect();
    let dir = scratch("snap-scrub");
    let (old_file, new_file) = (dir.join("old"), dir.join("new"));
    std::fs::write(&old_file, &old).expect("write");
    std::fs::write(&new_file, vec![0x6bu8; 4096]).expect("write");
    let put = |file: &std::path::Path| {
        let code = format!("h.pwrite(open({:?}, 'rb').read(), 0)", p(file));
        tool_ok(&c, 30, "nbdsh", &["-u", &uri, "-c", &code]);
    };
    put(&old_file);
    snap_create(&c, "s@keep");
    // The old block now lives only in the snapshot's clone object.
    put(&new_file);
    // Damage it in osd.1's data file once its store has written it there (the clone's copy
    // may reach the data device after a stale copy of the head's old block does): damage
    // every copy found, scrub, and look again until scrub has found the clone's.
    let data = c.dir.join("osd.1").join("data.img");
    let start = Instant::now();
    let out = loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "scrub never found a damaged copy"
        );
        std::thread::sleep(Duration::from_millis(500));
        let spots = find_block(&data, &old);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&data)
            .expect("open");
        for at in &spots {
            f.write_all_at(b"DAMAGED BY THE TEST", at + 64)
                .expect("damage");
        }
        f.sync_all().expect("sync");
        let out = c.ok(&["pg", "scrub", "-p", "default"]);
        if out.contains("(repaired)") {
            break out;
        }
    };
    assert!(
        out.contains("vclone."),
        "the damaged copy is a snapshot clone: {out}"
    );
    let back = dir.join("back");
    tool_ok(&c, 60, "nbdcopy", &[&c.nbd_uri("s@keep"), &p(&back)]);
    let read = std::fs::read(&back).expect("read back");
    assert!(
        read[..4096] == old[..],
        "the snapshot does not read its old block"
    );
    // Repaired for good: a second scrub finds every copy consistent.
    let again = c.ok(&["pg", "scrub", "-p", "default"]);
    assert!(
        !again.contains("(repaired)") && !again.contains("NOT repaired"),
        "{again}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Blocks of `path` that hold data (not holes), in bytes.
fn allocated_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").blocks() * 512
}

#[test]
fn vol_import_and_export_copy_images_thin_with_progress_and_snapshots_and_clones_export_whole() {
    let c = Cluster::up_with_nbd("vol-io", 3);
    let dir = scratch("vol-io");
    // 40 MiB and 1,000 bytes: data in some 4 MiB chunks, zeros in the others, and a tail that
    // is not a multiple of 512 bytes.
    const MIB: usize = 1 << 20;
    let len = 40 * MIB + 1000;
    let zeros = [(4 * MIB, 8 * MIB), (12 * MIB, 32 * MIB)];
    let original = image(len, &zeros, 41);
    let src = dir.join("src.raw");
    std::fs::write(&src, &original).expect("write the image");

    let o = c.cairn(&["vol", "import", &p(&src), "imported"]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "import: {err}\n{}", c.logs());
    assert!(err.contains("importing [") && err.contains("100%"), "{err}");
    let info: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", "imported", "--json"])).expect("json");
    assert_eq!(info["size"], (len as u64).div_ceil(512) * 512, "{info}");
    // Chunks 0, 2, 8, 9 and the tail's hold data; the zero chunks 1 and 3..=7 were not
    // written.
    assert_eq!(info["allocated_objects"], 5, "{info}");

    // Out again: the same bytes (the tail padded with zeros), as a sparse file.
    let mut padded = original.clone();
    padded.resize(len.div_ceil(512) * 512, 0);
    let out = dir.join("out.raw");
    let o = c.cairn(&["vol", "export", "imported", &p(&out)]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "export: {err}");
    assert!(err.contains("exporting [") && err.contains("100%"), "{err}");
    assert!(
        std::fs::read(&out).expect("read") == padded,
        "export differs"
    );
    assert!(allocated_bytes(&out) <= 21 * MIB as u64, "not sparse");
    // What a real NBD client reads is what was exported.
    compare(&c, &c.nbd_uri("imported"), &p(&out));

    // A snapshot exports what it held; the volume what it holds now.
    snap_create(&c, "imported@s1");
    tool_ok(
        &c,
        60,
        "nbdsh",
        &[
            "-u",
            &c.nbd_uri("imported"),
            "-c",
            "h.pwrite(b'\\x07' * 4096, 0)",
        ],
    );
    let snap_out = dir.join("snap.raw");
    c.ok(&["vol", "export", "imported@s1", &p(&snap_out)]);
    assert!(
        std::fs::read(&snap_out).expect("read") == padded,
        "snapshot differs"
    );
    let o = c.cairn(&["vol", "export", "imported", &p(&out)]);
    assert!(!o.status.success(), "an existing file was replaced");
    assert!(text(&o.stderr).contains("--force"), "{}", text(&o.stderr));
    c.ok(&["vol", "export", "imported", &p(&out), "--force"]);
    let now = std::fs::read(&out).expect("read");
    assert!(now[..4096].iter().all(|&b| b == 7) && now[4096..] == padded[4096..]);

    // A clone reads its parent where it has not written: exported whole, not as holes.
    c.ok(&["vol", "snap", "protect", "imported@s1"]);
    c.ok(&["vol", "clone", "imported@s1", "cl"]);
    // So do NBD clients that skip what block status calls holes (nbdcopy does).
    let nbd_out = dir.join("clone-nbd.raw");
    tool_ok(&c, 60, "nbdcopy", &[&c.nbd_uri("cl"), &p(&nbd_out)]);
    let over_nbd = std::fs::read(&nbd_out).expect("read");
    assert!(over_nbd == padded, "clone over NBD differs");
    let clone_out = dir.join("clone.raw");
    c.ok(&["vol", "export", "cl", &p(&clone_out)]);
    let exported = std::fs::read(&clone_out).expect("read");
    assert!(exported == padded, "clone differs");

    // Refusals that lose nothing.
    let o = c.cairn(&["vol", "import", &p(&src), "imported"]);
    assert!(!o.status.success(), "imported over an existing volume");
    assert!(text(&o.stderr).contains("exists"), "{}", text(&o.stderr));
    let o = c.cairn(&["vol", "import", &p(&dir.join("missing")), "other"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("cannot open"),
        "{}",
        text(&o.stderr)
    );
    let none = dir.join("none.raw");
    let o = c.cairn(&["vol", "export", "nosuch", &p(&none)]);
    assert!(!o.status.success(), "exported a volume that does not exist");
    assert!(text(&o.stderr).contains("nosuch"), "{}", text(&o.stderr));
    assert!(!none.exists(), "a failed export left a file");
    c.ok(&["vol", "export", "imported@s1", &p(&snap_out), "--force"]);
    assert!(
        std::fs::read(&snap_out).expect("read") == padded,
        "snapshot changed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A volume whose data objects are on an erasure-coded pool (2+1, `vol create --data-pool`),
/// its header, leases and snapshot table on the replicated default pool: ext4 through nbdfuse
/// and a loop device is clean and its files verify; writes after a snapshot keep the old data
/// in clone objects on the EC pool (exclusive creates there) and the snapshot reads back as
/// taken; a clone of it copies up onto the EC pool too; no data object lands in the default
/// pool, and removing the clone takes its data off the EC pool; qemu-img converts an image
/// into another EC-backed volume and out again unchanged.
#[test]
fn ext4_on_a_volume_whose_data_is_on_an_ec_pool_with_a_snapshot_and_a_clone() {
    let c = Cluster::up_with_nbd("snap-ec", 3);
    let dir = scratch("snap-ec");
    c.ok(&["pool", "create", "ecdata", "--ec", "2+1", "--pgs", "8"]);
    let o = c.cairn(&["vol", "create", "x", "--size", "64M", "--pool", "ecdata"]);
    assert!(
        !o.status.success() && text(&o.stderr).contains("--data-pool ecdata"),
        "{}",
        text(&o.stderr)
    );
    c.ok(&[
        "vol",
        "create",
        "golden",
        "--size",
        "256M",
        "--data-pool",
        "ecdata",
    ]);
    assert!(c
        .ok(&["vol", "info", "golden"])
        .contains("data pool:   ecdata"));
    let base = file_tree(7);
    {
        let (m, disk) = fuse_disk(&c, &c.nbd_uri("golden"), &dir.join("g"));
        tool_ok(&c, 120, "mkfs.ext4", &["-q", "-F", &p(&disk)]);
        mount_loop(&c, &disk, &m.loop_mnt);
        write_tree(&m.loop_mnt, &base);
        assert!(m.umount_loop(), "umount failed");
        fsck_clean(&disk);
    }
    let golden = dir.join("golden.raw");
    tool_ok(&c, 120, "nbdcopy", &[&c.nbd_uri("golden"), &p(&golden)]);
    snap_create(&c, "golden@base");
    {
        let (m, disk) = fuse_disk(&c, &c.nbd_uri("golden"), &dir.join("g2"));
        mount_loop(&c, &disk, &m.loop_mnt);
        write_tree(&m.loop_mnt.join("more"), &file_tree(9));
        assert!(m.umount_loop(), "umount failed");
        fsck_clean(&disk);
    }
    compare(&c, &c.nbd_uri("golden@base"), &p(&golden));
    c.ok(&["vol", "snap", "protect", "golden@base"]);
    c.ok(&["vol", "clone", "golden@base", "vm1"]);
    {
        let (m, disk) = fuse_disk(&c, &c.nbd_uri("vm1"), &dir.join("c"));
        fsck_clean(&disk);
        mount_loop(&c, &disk, &m.loop_mnt);
        verify_tree(&m.loop_mnt, &base);
        write_tree(&m.loop_mnt.join("own"), &file_tree(8));
        assert!(m.umount_loop(), "umount failed");
        fsck_clean(&disk);
    }
    let data_of = |pool: &str| -> usize {
        c.ok(&["obj", "ls", pool])
            .lines()
            .filter(|l| l.starts_with("vdata."))
            .count()
    };
    assert_eq!(data_of("default"), 0, "data objects in the header pool");
    let before = data_of("ecdata");
    assert!(before > 0, "no data objects on the EC pool");
    c.ok(&["vol", "rm", "vm1"]);
    assert!(data_of("ecdata") < before, "the clone's data stayed");
    compare(&c, &c.nbd_uri("golden@base"), &p(&golden));
    // qemu-img convert of a random image (a zero stretch, a write not a multiple of the
    // stripe) into an EC-backed volume and back out: byte for byte the same.
    const MIB: usize = 1 << 20;
    c.ok(&[
        "vol",
        "create",
        "img",
        "--size",
        "96M",
        "--data-pool",
        "ecdata",
    ]);
    let data = image(
        96 * MIB,
        &[(40 * MIB, 56 * MIB), (70 * MIB, 70 * MIB + 5000)],
        3,
    );
    let (src, out) = (dir.join("src.raw"), dir.join("out.qcow2"));
    std::fs::write(&src, &data).expect("write image");
    let img = c.nbd_uri("img");
    let convert = |args: &[&str]| tool_ok(&c, 300, "qemu-img", args);
    convert(&["convert", "-n", "-f", "raw", "-O", "raw", &p(&src), &img]);
    convert(&["convert", "-f", "raw", "-O", "qcow2", &img, &p(&out)]);
    convert(&["compare", "-f", "raw", "-F", "qcow2", &p(&src), &p(&out)]);
    let back = dir.join("back.raw");
    convert(&["convert", "-f", "qcow2", "-O", "raw", &p(&out), &p(&back)]);
    assert!(
        std::fs::read(&back).expect("read back") == data,
        "the image converted out of the EC-backed volume differs"
    );
    // The data pool cannot be removed from under the volumes, not even forced.
    let o = c.cairn(&["pool", "rm", "ecdata", "--yes-i-really-mean-it", "--force"]);
    let err = text(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("holds the data of volumes")
            && err.contains("golden (pool default)")
            && err.contains("img (pool default)"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
