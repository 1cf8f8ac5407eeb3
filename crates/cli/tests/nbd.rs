//! Block volumes served over NBD by a real cluster (`cairn dev up`), driven by clients no one
//! here wrote: qemu-img, nbdinfo, nbdcopy, nbdsh, nbdfuse + the kernel's ext4 and loop
//! driver, and fio's nbd engine (Debian packages qemu-utils, libnbd-bin, nbdfuse, fio,
//! e2fsprogs).

mod common;

use common::cluster::{run_as, text, Cluster};
use common::nbd_server::NbdServer;
use common::tools::{
    file_tree, fio_verify, fsck_clean, fuse_disk, image, mount_loop, nbdsh_spawn, p, scratch,
    system_path, tool, tool_ok, verify_tree, wait_line,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

#[test]
fn qemu_img_nbdcopy_and_nbdinfo_against_a_volume() {
    let c = Cluster::up_with_nbd("nbd-qemu", 3);
    let dir = scratch("qemu");
    c.ok(&["vol", "create", "img", "--size", "256M"]);
    let uri = c.nbd_uri("img");

    // A fresh thin volume is one hole, and the default export is dev up's disk0 (1 GiB).
    let info: serde_json::Value =
        serde_json::from_str(&tool_ok(&c, 60, "nbdinfo", &["--json", &uri])).expect("json");
    assert_eq!(
        info["exports"][0]["export-size"],
        256 * MIB as u64,
        "{info}"
    );
    assert_eq!(info["exports"][0]["can_multi_conn"], true, "{info}");
    let map = tool_ok(&c, 60, "nbdinfo", &["--map", &uri]);
    assert!(map.contains("hole,zero") && !map.contains("data"), "{map}");
    let default = format!("nbd://{}", c.nbd_addr());
    let size = tool_ok(&c, 60, "nbdinfo", &["--size", &default]);
    assert_eq!(size.trim(), (1u64 << 30).to_string());

    // qemu-img convert a 256 MiB random image (with a 64 MiB zero stretch) in and compare.
    let src = dir.join("src.raw");
    let data = image(
        256 * MIB,
        &[(96 * MIB, 160 * MIB), (200 * MIB, 200 * MIB + 5000)],
        1,
    );
    std::fs::write(&src, &data).expect("write image");
    tool_ok(
        &c,
        300,
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", &p(&src), &uri],
    );
    tool_ok(
        &c,
        300,
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &p(&src), &uri],
    );
    // The zero stretch was skipped: its objects do not exist and show as a hole.
    let map = tool_ok(&c, 60, "nbdinfo", &["--map", "--json", &uri]);
    let extents: serde_json::Value = serde_json::from_str(&map).expect("map json");
    let hole = extents
        .as_array()
        .expect("extents")
        .iter()
        .find(|e| e["type"] == 3)
        .unwrap_or_else(|| panic!("no hole in {map}"));
    assert_eq!(hole["offset"], 96 * MIB as u64, "{map}");
    assert_eq!(hole["length"], 64 * MIB as u64, "{map}");
    let vinfo: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", "img", "--json"])).expect("info json");
    assert_eq!(vinfo["allocated_objects"], 48, "{vinfo}");

    // nbdcopy out of the volume, byte-identical.
    let out = dir.join("out.raw");
    tool_ok(&c, 300, "nbdcopy", &[&uri, &p(&out)]);
    assert!(
        std::fs::read(&out).expect("read copy") == data,
        "nbdcopy out differs"
    );

    // A read within one object that ends short of the read (512 bytes written into a hole)
    // is the object's bytes, then zeros; and a read past its end is all zeros.
    let at = 96 * MIB + 1000;
    let short = format!(
        "h.pwrite(b'y' * 512, {at})\n\
         assert h.pread(8192, {at} - 1000) == bytes(1000) + b'y' * 512 + bytes(8192 - 1512)\n\
         assert h.pread(65536, {at} + 512) == bytes(65536)\n\
         print('short reads ok')",
        at = at
    );
    let short_out = tool_ok(&c, 60, "nbdsh", &["-c", &nbdsh_at(&uri, &short)]);
    assert!(short_out.contains("short reads ok"), "{short_out}");

    // nbdcopy into a second volume, then back out through qemu-img.
    c.ok(&[
        "vol",
        "create",
        "img2",
        "--size",
        "64M",
        "--object-size",
        "1M",
    ]);
    let uri2 = c.nbd_uri("img2");
    let data2 = image(64 * MIB, &[(0, 3 * MIB)], 2);
    let src2 = dir.join("src2.raw");
    std::fs::write(&src2, &data2).expect("write image 2");
    tool_ok(&c, 300, "nbdcopy", &[&p(&src2), &uri2]);
    let out2 = dir.join("out2.raw");
    tool_ok(
        &c,
        300,
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri2, &p(&out2)],
    );
    assert!(
        std::fs::read(&out2).expect("read") == data2,
        "round trip 2 differs"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ext4_on_nbdfuse_survives_unmount_fsck_and_remount() {
    let c = Cluster::up_with_nbd("nbd-ext4", 3);
    let dir = scratch("ext4");
    c.ok(&["vol", "create", "fs", "--size", "512M"]);
    let (m, disk) = fuse_disk(&c, &c.nbd_uri("fs"), &dir);
    let loop_mnt = m.loop_mnt.clone();
    tool_ok(&c, 120, "mkfs.ext4", &["-q", "-F", &p(&disk)]);
    mount_loop(&c, &disk, &loop_mnt);
    let tree = file_tree(7);
    for (rel, data) in &tree {
        let path = loop_mnt.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir in ext4");
        std::fs::write(&path, data).expect("write in ext4");
    }
    assert!(m.umount_loop(), "umount failed\n{}", c.logs());
    fsck_clean(&disk);
    mount_loop(&c, &disk, &loop_mnt);
    verify_tree(&loop_mnt, &tree);
    assert!(m.umount_loop(), "second umount failed");
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fio_verify_jobs_and_multi_conn_clients() {
    let c = Cluster::up_with_nbd("nbd-fio", 3);
    c.ok(&["vol", "create", "fio", "--size", "256M"]);
    let uri = c.nbd_uri("fio");
    fio_verify(&c, &uri, "rand4k", "4k", "32M", "16");
    fio_verify(&c, &uri, "rand1m", "1M", "128M", "4");

    // Two clients on one export, each seeing the other's flushed writes, at offsets that
    // straddle data objects (4 MiB) and in never-written space.
    let script = r#"
import nbd, os
uri = os.environ["URI"]
a = nbd.NBD(); a.add_meta_context("base:allocation"); a.connect_uri(uri)
b = nbd.NBD(); b.connect_uri(uri)
assert a.can_multi_conn() and b.can_multi_conn()
for i, off in enumerate([0, 4*1024*1024 - 1000, 200*1024*1024 + 17, 255*1024*1024]):
    x = bytes([(i * 7 + j) % 251 for j in range(4096)])
    a.pwrite(x, off); a.flush()
    assert b.pread(4096, off) == x, "b does not see a's write at %d" % off
    y = bytes([(i * 13 + j) % 241 for j in range(4096)])
    b.pwrite(y, off, nbd.CMD_FLAG_FUA)
    assert a.pread(4096, off) == y, "a does not see b's FUA write at %d" % off
    b.zero(4096, off)
    b.flush()
    assert a.pread(4096, off) == bytes(4096), "a does not see b's zeroing at %d" % off
# A trim of whole data objects removes them: block status then reports a hole there, and
# the range reads as zeros; the neighbouring object written too stays data.
MiB = 1024 * 1024
a.pwrite(b"\x5a" * (8 * MiB), 8 * MiB); a.flush()
b.trim(4 * MiB, 8 * MiB)
def status(off, length):
    got = []
    def cb(ctx, o, entries, err):
        got.extend(zip(entries[0::2], entries[1::2]))
    a.block_status(length, off, cb)
    return got
st = status(8 * MiB, 8 * MiB)
assert st[0] == (4 * MiB, 3), "trimmed object not a hole: %r" % st
assert st[1][1] == 0, "untouched object not data: %r" % st
assert a.pread(4096, 10 * MiB) == bytes(4096)
assert a.pread(4096, 12 * MiB) == b"\x5a" * 4096
print("ok")
"#;
    let o = Command::new("timeout")
        .args(["-k", "5", "120", "nbdsh", "-c", script])
        .env("URI", &uri)
        .env("PATH", system_path())
        .output()
        .expect("run nbdsh (apt-get install libnbd-bin python3-libnbd)");
    assert!(
        o.status.success() && text(&o.stdout).contains("ok"),
        "nbdsh multi-conn script failed:\n{}{}\n{}",
        text(&o.stdout),
        text(&o.stderr),
        c.logs()
    );
}

#[test]
fn vol_commands_create_list_resize_and_remove() {
    let c = Cluster::up_with_nbd("nbd-vol", 3);
    // dev up created disk0; names and sizes are checked.
    let ls = c.ok(&["vol", "ls"]);
    assert!(ls.contains("disk0") && ls.contains("1 GiB"), "{ls}");
    c.ok(&[
        "vol",
        "create",
        "v1",
        "--size",
        "20M",
        "--object-size",
        "1M",
    ]);
    for (args, want) in [
        (
            vec!["vol", "create", "v1", "--size", "1M"],
            "already exists",
        ),
        (
            vec!["vol", "create", "bad/name", "--size", "1M"],
            "invalid volume name",
        ),
        (
            vec!["vol", "create", "v2", "--size", "1000"],
            "multiple of 512",
        ),
        (
            vec!["vol", "create", "v2", "--size", "1M", "--object-size", "3M"],
            "power of two",
        ),
        (vec!["vol", "info", "nope"], "no volume \"nope\""),
        (vec!["vol", "ls", "--pool", "nopool"], "no pool"),
        (
            vec!["vol", "resize", "v1", "--size", "10M"],
            "--allow-shrink",
        ),
    ] {
        let o = c.cairn(&args);
        let err = text(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: one-line error: {err}"
        );
    }

    // Fill v1 through NBD, shrink it to 10.5 MiB, grow it back: the cut part reads as zeros.
    let uri = c.nbd_uri("v1");
    let dir = scratch("vol");
    let data = image(20 * MIB, &[], 3);
    let src = dir.join("v1.raw");
    std::fs::write(&src, &data).expect("write");
    tool_ok(&c, 120, "nbdcopy", &[&p(&src), &uri]);
    let info: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", "v1", "--json"])).expect("json");
    assert_eq!(info["allocated_objects"], 20, "{info}");
    // The creation date, as ISO 8601 UTC in JSON and text alike.
    let at = info["created_at"].as_str().expect("created_at");
    assert!(
        at.len() == 20 && at.ends_with('Z') && at.as_bytes()[10] == b'T',
        "{at}"
    );
    assert!(c
        .ok(&["vol", "info", "v1"])
        .contains(&format!("created:     {at}")));
    // A thin volume larger than the pool can hold is created, with a warning.
    let o = c.cairn(&["vol", "create", "huge", "--size", "100T"]);
    let e = text(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("warning: volume huge (100 TiB) is larger than"),
        "{e}"
    );
    // Status reports the thin overcommit, with the pool named.
    let overcommitted = |s: &serde_json::Value| {
        s["problems"].as_array().expect("problems").iter().any(|p| {
            p.as_str()
                .is_some_and(|p| p.starts_with("pool default is overcommitted"))
        })
    };
    let s = c.status();
    assert!(overcommitted(&s) && s["health"] != "HEALTH_OK", "{s}");
    let pool = &s["pools"][0];
    assert!(
        pool["provisioned_bytes"].as_u64() > Some(100 << 40),
        "{pool}"
    );
    assert!(pool["overcommit"].as_f64() > Some(1000.0), "{pool}");
    c.ok(&["vol", "rm", "huge"]);
    assert!(!overcommitted(&c.status()));
    // Resizing to the size it has changes nothing, and says so.
    let same = c.ok(&["vol", "resize", "v1", "--size", "20M"]);
    assert!(same.contains("already 20 MiB: nothing to do"), "{same}");
    let cut = 10 * MIB + MIB / 2;
    c.ok(&[
        "vol",
        "resize",
        "v1",
        "--size",
        &cut.to_string(),
        "--allow-shrink",
    ]);
    let info: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", "v1", "--json"])).expect("json");
    assert_eq!(info["size"], cut as u64);
    assert_eq!(info["allocated_objects"], 11, "{info}");
    c.ok(&["vol", "resize", "v1", "--size", "20M"]);
    let out = dir.join("back.raw");
    tool_ok(&c, 120, "nbdcopy", &[&uri, &p(&out)]);
    let back = std::fs::read(&out).expect("read");
    assert_eq!(back.len(), 20 * MIB);
    assert!(back[..cut] == data[..cut], "data before the cut changed");
    assert!(
        back[cut..].iter().all(|&b| b == 0),
        "data beyond the cut came back"
    );

    // rm reports progress and leaves no object behind; the export is gone.
    let o = c.cairn(&["vol", "rm", "v1"]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    // Not a terminal: plain lines, the last one the end.
    let last = err
        .lines()
        .rfind(|l| l.starts_with("removing data objects"));
    assert_eq!(
        last,
        Some("removing data objects [##############################] 100% 11/11"),
        "{err}"
    );
    let objects = c.ok(&["obj", "ls", "default"]);
    let id = info["id"].as_str().expect("id");
    assert!(
        !objects.contains(id) && !objects.contains("vol.v1"),
        "{objects}"
    );
    let o = tool(30, "nbdinfo", &[&uri]);
    assert!(
        !o.status.success(),
        "export of a removed volume still served"
    );
    let ls = c.ok(&["vol", "ls", "--json"]);
    assert!(!ls.contains("\"v1\"") && ls.contains("\"disk0\""), "{ls}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes 64 KiB blocks over the first 64 MiB (16 data objects) until an error or 60 s.
const WRITER: &str = r#"
import nbd, os, time
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
end = time.time() + 60
n = 0
try:
    while time.time() < end:
        h.pwrite(b"\x77" * 65536, (n * 65536) % (64 << 20)); n += 1
    print("done", n)
except nbd.Error as e:
    print("error after", n, "writes:", e)
"#;

/// Connects, writes one block, and keeps the connection open (idle) for 60 s.
const HOLDER: &str = r#"
import nbd, os, time
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
h.pwrite(b"\x42" * 4096, 0)
print("connected", flush=True)
time.sleep(60)
"#;

/// Object names of `pool` that contain `part`.
fn objects_with(c: &Cluster, pool: &str, part: &str) -> Vec<String> {
    c.ok(&["obj", "ls", pool])
        .lines()
        .filter(|l| l.contains(part))
        .map(str::to_string)
        .collect()
}

/// Waits (30 s at most) until `pool` has an object whose name contains `part`.
fn wait_object(c: &Cluster, pool: &str, part: &str) {
    let start = Instant::now();
    while objects_with(c, pool, part).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no object {part}* in pool {pool}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn volume_id(c: &Cluster, pool: &str, name: &str) -> String {
    let info: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", name, "-p", pool, "--json"])).expect("json");
    info["id"].as_str().expect("id").to_string()
}

#[test]
fn served_volumes_are_not_removed_under_their_writers() {
    let c = Cluster::up_with_nbd("nbd-rm", 3);
    c.ok(&["vol", "create", "busy", "--size", "256M"]);
    let id = volume_id(&c, "default", "busy");
    let writer = nbdsh_spawn(&c.nbd_uri("busy"), 90, WRITER);
    wait_object(&c, "default", &format!("vopen.{id}."));
    wait_object(&c, "default", &format!("vdata.{id}."));

    // A plain rm refuses, names the server, and leaves the volume as it was.
    let o = c.cairn(&["vol", "rm", "busy"]);
    let e = text(&o.stderr);
    assert!(!o.status.success(), "rm of a served volume succeeded");
    assert!(
        e.contains("volume \"busy\" is open: cairn nbd serve on")
            && e.contains(&c.nbd_addr())
            && e.contains("--force"),
        "{e}"
    );
    let ls: serde_json::Value = serde_json::from_str(&c.ok(&["vol", "ls", "--json"])).unwrap();
    let busy = ls
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "busy")
        .cloned();
    assert_eq!(busy.map(|v| v["removing"].clone()), Some(false.into()));

    // --force: the server closes the volume, its writer gets errors, and nothing the writer
    // did re-creates an object of the removed volume (it used to: 256 orphans).
    let o = c.cairn(&["vol", "rm", "busy", "--force"]);
    let e = text(&o.stderr);
    assert!(o.status.success(), "{e}\n{}", c.logs());
    assert!(
        e.contains("waiting for the server(s) to close volume busy"),
        "{e}"
    );
    let w = writer.wait_with_output().expect("writer");
    let out = text(&w.stdout);
    assert!(out.contains("error after"), "writer not stopped: {out}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(objects_with(&c, "default", &id), Vec::<String>::new());
    assert!(!tool(30, "nbdinfo", &[&c.nbd_uri("busy")]).status.success());

    // gc: objects of a volume id no header has are found and removed; disk0's are not.
    let disk0 = volume_id(&c, "default", "disk0");
    let holder = nbdsh_spawn(&c.nbd_uri("disk0"), 90, HOLDER);
    wait_object(&c, "default", &format!("vdata.{disk0}."));
    let junk = std::env::temp_dir().join(format!("cairn-gc-{}", std::process::id()));
    std::fs::write(&junk, b"left behind").unwrap();
    let junk = junk.display().to_string();
    for name in [
        "vdata.00000000deadbeef.0000000000000003",
        "vdata.00000000deadbeef.0000000000000004",
        "vopen.00000000deadbeef.0000000000000001",
    ] {
        c.ok(&["obj", "put", "default", name, &junk]);
    }
    let dry = c.ok(&["vol", "gc", "--dry-run"]);
    assert!(
        dry.contains("volume id 00000000deadbeef: 3 objects")
            && dry.contains("3 orphaned objects of 1 removed volumes (dry run"),
        "{dry}"
    );
    assert_eq!(objects_with(&c, "default", "deadbeef").len(), 3);
    let gc = c.ok(&["vol", "gc"]);
    assert!(gc.contains("removed 3 orphaned objects"), "{gc}");
    assert!(objects_with(&c, "default", "deadbeef").is_empty());
    assert!(!objects_with(&c, "default", &format!("vdata.{disk0}.")).is_empty());
    assert!(c.ok(&["vol", "gc"]).contains("no orphaned volume objects"));
    // A damaged header stops gc (which objects that volume owns cannot be told), loses nothing.
    c.ok(&["obj", "put", "default", "vol.broken", &junk]);
    c.ok(&[
        "obj",
        "put",
        "default",
        "vdata.00000000deadbeef.0000000000000005",
        &junk,
    ]);
    let o = c.cairn(&["vol", "gc"]);
    let e = text(&o.stderr);
    assert!(
        !o.status.success() && e.contains("\"broken\": header object is damaged"),
        "{e}"
    );
    assert_eq!(objects_with(&c, "default", "deadbeef").len(), 1);
    c.ok(&["obj", "rm", "default", "vol.broken"]);
    assert!(c.ok(&["vol", "gc"]).contains("removed 1 orphaned objects"));
    let _ = std::fs::remove_file(&junk);

    // SIGTERM stops the server cleanly: connections drain and leases are released at once.
    c.signal("nbd", libc::SIGTERM);
    let start = Instant::now();
    while common::cluster::alive(c.pid("nbd")) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nbd serve did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(objects_with(&c, "default", "vopen."), Vec::<String>::new());
    drop(holder);
}

#[test]
fn pool_rm_and_dead_servers() {
    let c = Cluster::up_with_nbd("nbd-poolrm", 3);
    c.pool_create("p2", 3, 2, 8);
    c.ok(&["vol", "create", "v2", "-p", "p2", "--size", "64M"]);
    let mut server = NbdServer::start(&c, "p2");
    let holder = nbdsh_spawn(&server.uri("v2"), 90, HOLDER);
    let v2 = volume_id(&c, "p2", "v2");
    wait_object(&c, "p2", &format!("vopen.{v2}."));

    // pool rm refuses while one of its volumes is served.
    let o = c.cairn(&["pool", "rm", "p2", "--yes-i-really-mean-it"]);
    let e = text(&o.stderr);
    assert!(
        !o.status.success(),
        "pool rm with a served volume succeeded"
    );
    assert!(
        e.contains("pool p2 has open volumes: v2 (cairn nbd serve on"),
        "{e}"
    );

    // A server killed -9 leaves its lease: a plain rm refuses until it expires, a forced
    // one waits for that (15 s at most), then removes everything.
    server.signal(libc::SIGKILL);
    server.wait_exit();
    drop(holder);
    let o = c.cairn(&["vol", "rm", "v2", "-p", "p2"]);
    let e = text(&o.stderr);
    assert!(!o.status.success() && e.contains("lease valid"), "{e}");
    let start = Instant::now();
    let o = c.cairn(&["vol", "rm", "v2", "-p", "p2", "--force"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        start.elapsed() < Duration::from_secs(25),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(objects_with(&c, "p2", &v2), Vec::<String>::new());

    // pool rm --force makes a live server close the pool's volumes first.
    c.ok(&["vol", "create", "v3", "-p", "p2", "--size", "64M"]);
    let server = NbdServer::start(&c, "p2");
    let holder = nbdsh_spawn(&server.uri("v3"), 90, HOLDER);
    wait_object(&c, "p2", "vopen.");
    let o = c.cairn(&["pool", "rm", "p2", "--yes-i-really-mean-it", "--force"]);
    let e = text(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("waiting for the server(s) to close volume v3"),
        "{e}"
    );
    assert!(!c.ok(&["pool", "ls"]).contains("p2"));
    drop(holder);
    drop(server);
}

/// Writes, says so, then (while the test has the OSDs stopped) writes and reads back again.
const STALLED: &str = r#"
import nbd, os, time
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
h.pwrite(b"\x11" * 4096, 0)
print("ready", flush=True)
time.sleep(1.5)
t = time.time()
h.pwrite(b"\x22" * 4096, 8 << 20)
assert h.pread(4096, 8 << 20) == b"\x22" * 4096
print("resumed after %.1f s" % (time.time() - t), flush=True)
"#;

#[test]
fn io_stalls_while_the_open_lease_cannot_be_renewed_then_resumes() {
    use std::io::BufRead;
    let c = Cluster::up_with_nbd("nbd-lapse", 3);
    let mut client = nbdsh_spawn(&c.nbd_uri("disk0"), 120, STALLED);
    let mut lines = std::io::BufReader::new(client.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    // Every OSD stopped for longer than the server may go without renewing its lease (10 s):
    // the write in flight is dropped, then sent again once the lease is renewed.
    let osds = ["osd.0", "osd.1", "osd.2"];
    for o in osds {
        c.signal(o, libc::SIGSTOP);
    }
    std::thread::sleep(Duration::from_secs(14));
    for o in osds {
        c.signal(o, libc::SIGCONT);
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = client.wait_with_output().expect("client");
    let resumed = rest.iter().find(|l| l.starts_with("resumed after"));
    assert!(
        resumed.is_some() && out.status.success(),
        "client failed: {rest:?}\n{}\n{}",
        text(&out.stderr),
        c.logs()
    );
    let log = std::fs::read_to_string(c.dir.join("log/nbd.log")).expect("nbd log");
    assert!(
        log.contains("open lease lapsed during an I/O"),
        "no lapse logged:\n{}",
        c.logs()
    );
}

#[test]
fn a_full_pool_is_enospc_to_nbd_clients_and_status_says_so() {
    // Three 256 MiB OSDs, 3 copies, a 1 GiB volume: about 180 MiB fit.
    let c = Cluster::up_with_nbd_sized("nbd-full", 3, "256M");
    let out = tool(
        300,
        "fio",
        &[
            "--name=fill",
            "--ioengine=nbd",
            &format!("--uri={}", c.nbd_uri("disk0")),
            "--rw=write",
            "--bs=1M",
            "--size=1G",
            "--iodepth=4",
            "--output-format=json",
        ],
    );
    let stdout = text(&out.stdout);
    let json_start = stdout.find('{').unwrap_or(0);
    let v: serde_json::Value = serde_json::from_str(&stdout[json_start..])
        .unwrap_or_else(|e| panic!("fio json ({e}): {stdout}\n{}", text(&out.stderr)));
    let job = &v["jobs"][0];
    // ENOSPC (28), not EIO: the OSDs' typed "no space" reaches the NBD client as such.
    assert_eq!(job["error"], 28, "{job}\n{}", text(&out.stderr));
    let written = job["write"]["io_bytes"].as_u64().expect("io_bytes");
    assert!(written > 64 << 20 && written < 256 << 20, "wrote {written}");
    let s = c.status();
    let problems = s["problems"].to_string();
    assert!(
        s["health"] == "HEALTH_ERR" && problems.contains("pool default is full"),
        "{s}"
    );
}

/// Writes with FUA and plain writes followed by FLUSH, then checks the pattern (READBACK).
const MEMORY_WRITES: &str = r#"
import nbd, os
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
assert h.can_fua() and h.can_flush()
for i in range(8):
    h.pwrite(bytes([i + 1]) * 65536, i * 65536, nbd.CMD_FLAG_FUA)
for i in range(8, 16):
    h.pwrite(bytes([i + 1]) * 65536, i * 65536)
h.flush()
print("written", flush=True)
"#;

const MEMORY_READBACK: &str = r#"
import nbd, os
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
bad = [i for i in range(16) if h.pread(65536, i * 65536) != bytes([i + 1]) * 65536]
print("bad", bad)
"#;

#[test]
fn fua_and_flush_on_a_memory_pool_and_its_writes_survive_kill9_of_every_osd() {
    let c = Cluster::up_with_nbd("nbd-memory", 3);
    c.ok(&["pool", "set", "default", "durability", "memory"]);
    c.ok(&["vol", "create", "m", "--size", "64M"]);
    let uri = c.nbd_uri("m");
    let o = nbdsh_spawn(&uri, 60, MEMORY_WRITES)
        .wait_with_output()
        .expect("nbdsh");
    assert!(
        text(&o.stdout).contains("written"),
        "FUA writes or FLUSH failed on a memory pool: {}\n{}",
        text(&o.stderr),
        c.logs()
    );
    for i in 0..3 {
        c.kill9(&format!("osd.{i}"));
    }
    for i in 0..3 {
        c.start_osd(i);
    }
    let o = nbdsh_spawn(&uri, 90, MEMORY_READBACK)
        .wait_with_output()
        .expect("nbdsh");
    assert!(
        text(&o.stdout).contains("bad []"),
        "acknowledged writes lost: {}{}\n{}",
        text(&o.stdout),
        text(&o.stderr),
        c.logs()
    );
}

/// `nbds://ENTITY@ADDR/VOLUME?tls-psk-file=PSK` of a server started with --tls require.
fn nbds(server: &NbdServer, entity: &str, volume: &str, psk: &Path) -> String {
    format!(
        "nbds://{entity}@{}/{volume}?tls-psk-file={}",
        server.addr,
        psk.display()
    )
}

/// Writes the TLS pre-shared key of `entity` (`cairn auth psk -o`) into DIR/ENTITY/keys.psk.
fn psk_file(c: &Cluster, dir: &Path, entity: &str) -> PathBuf {
    let sub = dir.join(entity);
    std::fs::create_dir_all(&sub).expect("psk dir");
    let path = sub.join("keys.psk");
    c.ok(&["auth", "psk", entity, "-o", &p(&path)]);
    path
}

/// Runs `code` in nbdsh connected to `uri` (which may name a local PSK file).
fn nbdsh_at(uri: &str, code: &str) -> String {
    format!("h.set_uri_allow_local_file(True)\nh.connect_uri('{uri}')\n{code}")
}

fn fails(secs: u32, cmd: &str, args: &[&str]) -> String {
    let o = tool(secs, cmd, args);
    assert!(!o.status.success(), "{cmd} {args:?} succeeded");
    format!("{}{}", text(&o.stdout), text(&o.stderr))
}

#[test]
fn nbd_over_tls_psk_serves_each_user_what_its_caps_grant() {
    let c = Cluster::up_with_nbd("nbd-tls", 1);
    c.ok(&["vol", "create", "disk1", "--size", "64M"]);
    c.add_key("client.alice", ("", "", "rw volume=disk0, r volume=disk1"));
    c.add_key("client.bob", ("", "", "r volume=disk0"));
    c.add_key("client.carol", ("r", "", ""));
    let dir = scratch("nbd-tls");
    let (alice, bob, carol) = (
        psk_file(&c, &dir, "client.alice"),
        psk_file(&c, &dir, "client.bob"),
        psk_file(&c, &dir, "client.carol"),
    );
    let psk_mode = std::fs::metadata(&alice).expect("psk file").permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&psk_mode) & 0o777,
        0o600
    );
    let server =
        NbdServer::start_with(&c, "default", &["--tls", "require", "--users-refresh", "1"]);

    // Each user lists only what it may open.
    let list = tool_ok(
        &c,
        30,
        "nbdinfo",
        &["--list", &nbds(&server, "client.alice", "", &alice)],
    );
    assert!(
        list.contains("\"disk0\"") && list.contains("\"disk1\""),
        "{list}"
    );
    let list = tool_ok(
        &c,
        30,
        "nbdinfo",
        &["--list", &nbds(&server, "client.bob", "", &bob)],
    );
    assert!(
        list.contains("\"disk0\"") && !list.contains("disk1"),
        "{list}"
    );

    // Refused: no TLS, a user without NBD caps, a volume not granted, a wrong key.
    let plain = fails(30, "nbdinfo", &[&server.uri("disk0")]);
    assert!(plain.to_lowercase().contains("tls"), "{plain}");
    fails(
        30,
        "nbdinfo",
        &[&nbds(&server, "client.carol", "disk0", &carol)],
    );
    fails(
        30,
        "nbdinfo",
        &[&nbds(&server, "client.bob", "disk1", &bob)],
    );
    let wrong = dir.join("wrong.psk");
    let bob_key = std::fs::read_to_string(&bob).expect("bob's psk");
    std::fs::write(&wrong, bob_key.replace("client.bob", "client.alice")).expect("write");
    fails(
        30,
        "nbdinfo",
        &[&nbds(&server, "client.alice", "disk0", &wrong)],
    );

    // Alice writes disk0 over TLS; bob reads the same bytes back over his own session.
    let data = image(4 << 20, &[(1 << 20, 2 << 20)], 5);
    let src = dir.join("src.img");
    std::fs::write(&src, &data).expect("write src");
    tool_ok(
        &c,
        60,
        "nbdcopy",
        &[&p(&src), &nbds(&server, "client.alice", "disk0", &alice)],
    );
    let back = dir.join("back.img");
    let bob_disk0 = nbds(&server, "client.bob", "disk0", &bob);
    let read = format!(
        "open('{}', 'wb').write(h.pread({}, 0))",
        p(&back),
        data.len()
    );
    tool_ok(&c, 60, "nbdsh", &["-c", &nbdsh_at(&bob_disk0, &read)]);
    let read = std::fs::read(&back).expect("read back");
    assert!(read == data, "bob read other bytes than alice wrote");

    // r without w is read-only: flagged so, and a write sent anyway fails with EPERM.
    let info = tool_ok(&c, 30, "nbdinfo", &["--json", &bob_disk0]);
    assert!(info.contains("\"is_read_only\": true"), "{info}");
    let write = nbdsh_at(&bob_disk0, "h.set_strict_mode(0)\nh.pwrite(b'x' * 512, 0)");
    let eperm = fails(30, "nbdsh", &["-c", &write]);
    assert!(
        eperm.contains("pwrite: write: command failed: Operation not permitted"),
        "{eperm}"
    );

    // A rotated key stops working (within the refresh), the new one works at once.
    c.ok(&["auth", "rotate", "client.bob", "--keep-old", "0"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while tool(30, "nbdinfo", &["--size", &bob_disk0])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "bob's old key still accepted");
        std::thread::sleep(Duration::from_millis(300));
    }
    let bob = psk_file(&c, &dir, "client.bob");
    tool_ok(
        &c,
        30,
        "nbdinfo",
        &["--size", &nbds(&server, "client.bob", "disk0", &bob)],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs openssl(1) in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let o = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (apt-get install openssl)");
    assert!(o.status.success(), "openssl {args:?}: {}", text(&o.stderr));
}

/// A certificate for `cn` issued by the CA in `ca` (ca-cert.pem, ca-key.pem), written as
/// DIR/cert.pem and DIR/key.pem, with extra `-addext` extensions.
fn issue(ca: &Path, dir: &Path, cn: &str, exts: &[&str], (cert, key): (&str, &str)) {
    std::fs::create_dir_all(dir).expect("cert dir");
    let (ca_cert, ca_key) = (p(&ca.join("ca-cert.pem")), p(&ca.join("ca-key.pem")));
    let subject = format!("/CN={cn}");
    let mut args = vec![
        "req",
        "-x509",
        "-CA",
        &ca_cert,
        "-CAkey",
        &ca_key,
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        key,
        "-out",
        cert,
        "-subj",
        &subject,
        "-days",
        "1",
        "-addext",
        "basicConstraints=critical,CA:FALSE",
    ];
    for e in exts {
        args.extend(["-addext", e]);
    }
    openssl(dir, &args);
}

/// DIR/ENTITY with what libnbd and QEMU read: ca-cert.pem and the entity's certificate.
fn x509_client(ca: &Path, dir: &Path, entity: &str) -> PathBuf {
    let sub = dir.join(entity);
    std::fs::create_dir_all(&sub).expect("client dir");
    std::fs::copy(ca.join("ca-cert.pem"), sub.join("ca-cert.pem")).expect("copy CA");
    let usage = ["extendedKeyUsage=clientAuth"];
    issue(
        ca,
        &sub,
        entity,
        &usage,
        ("client-cert.pem", "client-key.pem"),
    );
    sub
}

#[test]
fn nbd_over_tls_x509_holds_each_certificate_to_its_entitys_caps() {
    let c = Cluster::up_with_nbd("nbd-x509", 1);
    c.ok(&["vol", "create", "disk1", "--size", "64M"]);
    c.add_key("client.alice", ("", "", "rw volume=disk0"));
    c.add_key("client.carol", ("r", "", ""));
    let dir = scratch("nbd-x509");
    let ca = dir.join("ca");
    std::fs::create_dir_all(&ca).expect("ca dir");
    openssl(
        &ca,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
            "-subj",
            "/CN=cairn-ca",
            "-days",
            "1",
        ],
    );
    let exts = ["subjectAltName=IP:127.0.0.1", "extendedKeyUsage=serverAuth"];
    issue(
        &ca,
        &ca,
        "127.0.0.1",
        &exts,
        ("server-cert.pem", "server-key.pem"),
    );
    let (cert, key, client_ca) = (
        p(&ca.join("server-cert.pem")),
        p(&ca.join("server-key.pem")),
        p(&ca.join("ca-cert.pem")),
    );
    let args = [
        "--tls",
        "require",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &client_ca,
    ];
    let server = NbdServer::start_with(&c, "default", &args);
    let uri = |dir: &Path, volume: &str| {
        format!(
            "nbds://{}/{volume}?tls-certificates={}",
            server.addr,
            p(dir)
        )
    };
    let alice = x509_client(&ca, &dir, "client.alice");
    let list = tool_ok(&c, 30, "nbdinfo", &["--list", &uri(&alice, "")]);
    assert!(
        list.contains("\"disk0\"") && !list.contains("disk1"),
        "{list}"
    );
    let data = image(2 << 20, &[], 9);
    let src = dir.join("src.img");
    std::fs::write(&src, &data).expect("write src");
    tool_ok(&c, 60, "nbdcopy", &[&p(&src), &uri(&alice, "disk0")]);
    let back = dir.join("back.img");
    tool_ok(&c, 60, "nbdcopy", &[&uri(&alice, "disk0"), &p(&back)]);
    let read = std::fs::read(&back).expect("read back");
    assert!(
        read[..data.len()] == data[..],
        "read other bytes than written"
    );
    // Refused: an entity without NBD caps, a volume not granted, an entity the monitors do
    // not know, a plain client.
    let carol = x509_client(&ca, &dir, "client.carol");
    fails(30, "nbdinfo", &[&uri(&carol, "disk0")]);
    fails(30, "nbdinfo", &[&uri(&alice, "disk1")]);
    let ghost = x509_client(&ca, &dir, "client.ghost");
    fails(30, "nbdinfo", &[&uri(&ghost, "disk0")]);
    fails(30, "nbdinfo", &[&server.uri("disk0")]);
    // Certificates without TLS required make no sense: refused before serving.
    let conf = c.conf.display().to_string();
    let (ok, out) = run_as(
        &conf,
        &[
            "nbd",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &client_ca,
        ],
    );
    assert!(!ok && out.contains("--tls require"), "{out}");
    // A key file that is not the certificate's key is refused with the file named.
    let (ok, out) = run_as(
        &conf,
        &[
            "nbd",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls",
            "require",
            "--tls-cert",
            &cert,
            "--tls-key",
            &p(&alice.join("client-key.pem")),
            "--tls-client-ca",
            &client_ca,
        ],
    );
    assert!(!ok && out.contains("client-key.pem"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nbd_serve_refuses_unsafe_or_unauthorised_setups() {
    let c = Cluster::up_with_nbd("nbd-tls-setup", 1);
    let conf = c.conf.display().to_string();
    // Without TLS, only loopback (checked before anything listens).
    let (ok, out) = run_as(&conf, &["nbd", "serve", "--listen", "0.0.0.0:0"]);
    assert!(!ok && out.contains("refusing to serve"), "{out}");
    // A server key without `x` in its NBD caps cannot fetch the users' keys.
    let ring = c.add_key("client.gw", ("r", "rw", "rw"));
    let gw = c.conf_for("client.gw", &ring);
    let (ok, out) = run_as(
        &gw,
        &[
            "nbd",
            "serve",
            "--tls",
            "require",
            "--listen",
            "127.0.0.1:0",
        ],
    );
    assert!(!ok && out.contains("not an NBD gateway"), "{out}");
}

#[test]
fn bench_nbd_measures_tls_against_the_same_path_in_the_clear() {
    let c = Cluster::up_with_nbd("nbd-bench-tls", 1);
    let args = [
        "bench",
        "nbd",
        "--json",
        "--tls",
        "--size",
        "1",
        "--volume-size",
        "16M",
        "--seconds",
        "0.5",
        "--ramp",
        "0",
        "--only",
        "randwrite-4k-qd1",
    ];
    let out = c.ok(&args);
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench JSON");
    let w = &v["workloads"][0];
    assert_eq!(w["name"], "randwrite-4k-qd1", "{out}");
    // CPU per op of the cluster's processes, and of the whole host (which runs them too, so
    // it is not smaller, within the clock ticks' rounding), for Cairn and for the baseline.
    let num = |k: &str| w[k].as_f64().unwrap_or(0.0);
    for key in [
        "cpu_us_per_op",
        "host_cpu_us_per_op",
        "baseline_host_cpu_us_per_op",
    ] {
        assert!(num(key) > 0.0, "{key}: {out}");
    }
    assert!(
        num("host_cpu_us_per_op") >= 0.8 * num("cpu_us_per_op"),
        "the host used less CPU than the cluster's processes: {out}"
    );
    let tls = &w["tls"];
    for key in ["iops", "plain_iops", "iops_ratio_to_plain"] {
        assert!(tls[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {out}");
    }
    assert!(
        tls["lat_us"]["p99"].as_f64().is_some_and(|x| x > 0.0),
        "{out}"
    );
}

/// `bench nbd --ec 2+2 --degraded` on 4 OSDs: each workload on the replicated and the EC
/// volume, the space each fill took, then one OSD killed (reads measured with its shards
/// decoded), the EC volume rewritten, the OSD restarted by `dev up` and its shards rebuilt.
#[test]
fn bench_nbd_measures_an_ec_volume_beside_a_replicated_one_and_with_an_osd_down() {
    let c = Cluster::up_with_nbd("nbd-bench-ec", 4);
    let base = [
        "bench",
        "nbd",
        "--json",
        "--volume-size",
        "16M",
        "--seconds",
        "0.5",
        "--ramp",
        "0",
        "--only",
        "randread-4k-qd1",
        "--no-device",
    ];
    let o = c.cairn(&[&base[..], &["--ec", "2+1", "--degraded"]].concat());
    assert!(
        !o.status.success() && text(&o.stderr).contains("m >= 2"),
        "{}",
        text(&o.stderr)
    );
    let out = c.ok(&[&base[..], &["--ec", "2+2", "--degraded"]].concat());
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench JSON");
    let w = &v["workloads"][0];
    let pos = |x: &serde_json::Value| x.as_f64().is_some_and(|x| x > 0.0);
    assert!(pos(&w["iops"]) && pos(&w["ec"]["iops"]), "{out}");
    assert!(pos(&w["ec"]["ratio_to_replicated"]), "{out}");
    // Replicated (the dev cluster's size 3 on 4 OSDs) against 2+2: 3 and 2 bytes per byte.
    let per_byte = |x: &serde_json::Value| x["raw_bytes_per_byte"].as_f64().unwrap_or(0.0);
    assert!((2.9..3.2).contains(&per_byte(&v["space"])), "{out}");
    assert!((1.9..2.2).contains(&per_byte(&v["ec"]["space"])), "{out}");
    let d = &v["degraded"];
    assert_eq!(d["osd"], 3, "{out}");
    assert_eq!(d["reads"][0]["name"], "randread-4k-qd1-degraded", "{out}");
    assert!(pos(&d["reads"][0]["ratio_to_healthy"]), "{out}");
    // Every shard osd.3 held was stale: the rebuild pushed its share of the EC volume.
    let r = &d["rebuild"];
    let moved = r["bytes_moved"].as_f64().unwrap_or(0.0);
    assert!(moved >= 0.5 * 8.0 * 1048576.0, "{out}");
    assert!(
        pos(&r["rebuild_mb_per_s"]) && pos(&r["objects_moved"]),
        "{out}"
    );
    assert_eq!(c.status()["osds"]["up"], 4, "osd.3 restarted by the bench");
}

#[test]
fn bench_nbd_measures_the_data_disk_beside_the_osds_for_large_writes() {
    let c = Cluster::up_with_nbd("nbd-bench-disk", 1);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "nbd",
            "--json",
            "--size",
            "1",
            "--volume-size",
            "16M",
            "--seconds",
            "0.5",
            "--ramp",
            "0",
            "--only",
            "write-1m",
        ];
        args.extend_from_slice(extra);
        let out = c.ok(&args);
        let v: serde_json::Value = serde_json::from_str(&out).expect("bench JSON");
        (v["workloads"][0].clone(), out)
    };
    let (w, out) = run(&[]);
    assert_eq!(w["name"], "write-1m-qd8", "{out}");
    let d = &w["device"];
    let osd_dir = c.dir.join("osd.0");
    assert_eq!(d["dir"].as_str(), osd_dir.to_str(), "{out}");
    // One OSD holds the pool's one replica: one job.
    assert_eq!(d["jobs"], 1, "{out}");
    let num = |o: &serde_json::Value, k: &str| o[k].as_f64().unwrap_or(0.0);
    assert!(num(d, "mb_per_s") > 0.0, "{out}");
    assert!(num(&d["lat_us"], "p99") > 0.0, "{out}");
    assert!(num(d, "synced_mb_per_s") > 0.0, "{out}");
    let synced = num(d, "synced_ceiling_mb_per_s");
    assert!((synced - num(d, "synced_mb_per_s")).abs() < 0.2, "{out}");
    let want = num(&w, "mb_per_s") / synced;
    assert!(
        (num(d, "ratio_to_synced_ceiling") - want).abs() < 0.01,
        "{out}"
    );
    assert!(
        (num(d, "ceiling_mb_per_s") - num(d, "mb_per_s")).abs() < 0.2,
        "{out}"
    );
    let want = num(&w, "mb_per_s") / num(d, "ceiling_mb_per_s");
    assert!((num(d, "ratio_to_ceiling") - want).abs() < 0.01, "{out}");
    let left: Vec<_> = std::fs::read_dir(&osd_dir)
        .expect("osd dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cairn-bench-device"))
        .collect();
    assert!(left.is_empty(), "the measurement left {left:?}");
    let (w, out) = run(&["--no-device"]);
    assert!(w["device"].is_null(), "{out}");
}

/// Reads block 0 of `uri`: its first byte.
const FIRST_BYTE: &str = r#"
import nbd, os
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
print(h.pread(4096, 0)[0])
"#;

#[test]
fn a_second_server_of_a_written_volume_is_refused_until_the_first_is_gone() {
    let c = Cluster::up_with_nbd("nbd-excl", 3);
    c.ok(&["vol", "create", "ex", "--size", "64M"]);
    let id = volume_id(&c, "default", "ex");
    // The dev cluster's server has it open for writing (a client wrote 0x42 and stays).
    let holder = nbdsh_spawn(&c.nbd_uri("ex"), 90, HOLDER);
    wait_object(&c, "default", &format!("vopen.{id}."));
    let second = NbdServer::start(&c, "default");
    let o = tool(30, "nbdinfo", &[&second.uri("ex")]);
    assert!(
        !o.status.success(),
        "a second server opened a written volume"
    );
    let info: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", "ex", "--json"])).expect("json");
    assert_eq!(info["open_by"], 1, "{info}");
    // Snapshots are not written: the second server serves them beside the first.
    c.ok(&["vol", "snap", "create", "ex@s"]);
    tool_ok(&c, 30, "nbdinfo", &[&second.uri("ex@s")]);

    // The first dies (kill -9): its lease expires, then the second takes over.
    c.kill9("nbd");
    drop(holder);
    let start = Instant::now();
    loop {
        let o = tool(
            30,
            "nbdsh",
            &[
                "-u",
                &second.uri("ex"),
                "-c",
                "h.pwrite(b'\\x07' * 4096, 0)",
            ],
        );
        if o.status.success() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "the second server never took over: {}\n{}",
            text(&o.stderr),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("took over {} ms after kill -9", start.elapsed().as_millis());
    std::thread::sleep(Duration::from_secs(2));
    let out = Command::new("nbdsh")
        .args(["-c", FIRST_BYTE])
        .env("URI", second.uri("ex"))
        .env("PATH", system_path())
        .output()
        .expect("nbdsh");
    assert_eq!(text(&out.stdout).trim(), "7", "{}", text(&out.stderr));
}

/// Writes 0xAA over the first block again and again (10 ms apart) until an error or 60 s;
/// says when it started and how it ended.
const REWRITER: &str = r#"
import nbd, os, time
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
h.pwrite(b"\xaa" * 4096, 0)
print("writing", flush=True)
end = time.time() + 60
n = 1
try:
    while time.time() < end:
        h.pwrite(b"\xaa" * 4096, 0); n += 1
        time.sleep(0.01)
    print("done", n, flush=True)
except nbd.Error as e:
    print("error after", n, "writes:", e, flush=True)
"#;

/// Files removed when dropped.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// libfaketime (Debian package faketime): runs a process with its wall clock shifted.
fn libfaketime() -> String {
    let found = std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(Result::ok)
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .chain([PathBuf::from("/usr/lib/faketime/libfaketime.so.1")])
        .find(|p| p.exists());
    found
        .unwrap_or_else(|| {
            panic!("libfaketime.so.1 not found: install faketime (scripts/deps.sh test)")
        })
        .display()
        .to_string()
}

#[test]
fn a_writer_whose_lease_looks_expired_is_fenced_and_none_of_its_writes_land_afterwards() {
    use std::io::BufRead;
    let c = Cluster::up_with_nbd("nbd-fence", 3);
    c.ok(&["vol", "create", "fz", "--size", "64M"]);
    let id = volume_id(&c, "default", "fz");
    // The dev cluster's server writes the volume without pause, alive and renewing its lease.
    let mut first = nbdsh_spawn(&c.nbd_uri("fz"), 90, REWRITER);
    let mut lines = std::io::BufReader::new(first.stdout.take().expect("stdout")).lines();
    assert_eq!(
        lines.next().and_then(Result::ok).as_deref(),
        Some("writing")
    );
    wait_object(&c, "default", &format!("vopen.{id}."));
    // A second server whose clock runs 60 s ahead sees that lease as long expired (what a
    // skewed clock, or a first server paused past its lease, looks like): it takes over. Time
    // alone cannot stop the first, which is well and still writing: the OSDs must.
    let lib = libfaketime();
    let second = NbdServer::start_env(
        &c,
        "default",
        &[],
        &[
            ("LD_PRELOAD", lib.as_str()),
            ("FAKETIME", "+60s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    // libfaketime keeps a segment and a semaphore in /dev/shm per process, removed at a
    // clean exit only: removed here, whatever ends the server.
    let pid = second.child.id();
    let _shm = Cleanup(vec![
        PathBuf::from(format!("/dev/shm/faketime_shm_{pid}")),
        PathBuf::from(format!("/dev/shm/sem.faketime_sem_{pid}")),
    ]);
    let o = tool(
        30,
        "nbdsh",
        &[
            "-u",
            &second.uri("fz"),
            "-c",
            "h.pwrite(b'\\xbb' * 4096, 0)",
        ],
    );
    assert!(
        o.status.success(),
        "the second server did not take over: {}\n{}",
        text(&o.stderr),
        c.logs()
    );
    // The first server's writes fail from the takeover on, and none lands after it.
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let _ = first.wait();
    assert!(
        rest.iter().any(|l| l.starts_with("error after")),
        "the first server's client kept writing: {rest:?}"
    );
    std::thread::sleep(Duration::from_secs(1));
    let out = Command::new("nbdsh")
        .args(["-c", FIRST_BYTE])
        .env("URI", second.uri("fz"))
        .env("PATH", system_path())
        .output()
        .expect("nbdsh");
    assert_eq!(
        text(&out.stdout).trim(),
        "187",
        "a write of the fenced server landed after the takeover: {}",
        text(&out.stderr)
    );
    let log = std::fs::read_to_string(c.dir.join("log/nbd.log")).expect("nbd log");
    assert!(log.contains("this client was fenced"), "{log}");
    let fenced = c.ok(&["osd", "blocklist", "ls", "--json"]);
    let fenced: serde_json::Value = serde_json::from_str(&fenced).expect("json");
    assert_eq!(fenced.as_array().map(Vec::len), Some(1), "{fenced}");
    eprintln!("{rest:?}");

    // Fencing is allowed to whoever may write the pool it protects, and lifting it to
    // operators (`mon w`) only.
    let ring = c.dir.join("fencer.keyring");
    c.ok(&[
        "auth",
        "add",
        "client.fencer",
        "--mon",
        "r",
        "--osd",
        "rw pool=default",
    ]);
    c.ok(&["auth", "get", "client.fencer", "-o", &p(&ring)]);
    let conf = c.conf_for("client.fencer", &ring);
    let (ok, out) = run_as(
        &conf,
        &[
            "osd",
            "blocklist",
            "add",
            "00000000000000ab",
            "--pool",
            "default",
        ],
    );
    assert!(ok, "{out}");
    c.pool_create("other", 3, 2, 8);
    let (ok, out) = run_as(&conf, &["osd", "blocklist", "add", "cd", "--pool", "other"]);
    assert!(!ok && out.contains("permission denied"), "{out}");
    let (ok, out) = run_as(&conf, &["osd", "blocklist", "rm", "ab"]);
    assert!(!ok && out.contains("permission denied"), "{out}");
    assert!(c
        .ok(&["osd", "blocklist", "ls"])
        .contains("00000000000000ab"));
    c.ok(&["osd", "blocklist", "rm", "ab"]);
    let (ok, out) = run_as(
        &conf,
        &["osd", "blocklist", "add", "0", "--pool", "default"],
    );
    assert!(!ok && out.contains("not a client instance"), "{out}");
}

/// Prints the first byte at each offset of env OFFS (comma separated).
const BYTES_AT: &str = r#"
import nbd, os
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
print(",".join(str(h.pread(4096, int(o))[0]) for o in os.environ["OFFS"].split(",")))
"#;

fn bytes_at(uri: &str, offs: &[u64]) -> String {
    let offs: Vec<String> = offs.iter().map(u64::to_string).collect();
    let out = Command::new("nbdsh")
        .args(["-c", BYTES_AT])
        .env("URI", uri)
        .env("OFFS", offs.join(","))
        .env("PATH", system_path())
        .output()
        .expect("nbdsh");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// Starts a server of pool default, retrying while a killed one's lease has not expired.
fn server_when_free(c: &Cluster, volume: &str) -> NbdServer {
    let start = Instant::now();
    loop {
        let s = NbdServer::start(c, "default");
        if tool(30, "nbdinfo", &[&s.uri(volume)]).status.success() {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "{}", c.logs());
        drop(s);
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn the_allocation_map_is_persisted_and_an_open_reads_it_instead_of_listing() {
    let c = Cluster::up_with_nbd("nbd-alloc", 3);
    c.ok(&["vol", "create", "am", "--size", "256M"]);
    let id = volume_id(&c, "default", "am");
    const OBJ: u64 = 4 << 20;
    let mut s = NbdServer::start(&c, "default");
    // A client keeps the volume open, so the kill below finds it open.
    let mut holder = nbdsh_spawn(&s.uri("am"), 90, HOLDER);
    wait_line(&mut holder, "connected");
    let write = "h.pwrite(b'\\x11' * 4096, 0); h.pwrite(b'\\x33' * 4096, 3 * 4194304 + 8192); \
                 h.pwrite(b'\\x44' * 4096, 40 * 4194304)";
    tool_ok(&c, 30, "nbdsh", &["-u", &s.uri("am"), "-c", write]);
    // A crash: every object written is marked in the map before its data was sent.
    s.signal(libc::SIGKILL);
    s.wait_exit();
    let _ = holder.kill();
    let _ = holder.wait();
    let shard = format!("valloc.{id}.00000000");
    assert_eq!(objects_with(&c, "default", &shard), vec![shard.clone()]);
    // An object put behind the map's back is not seen by the next open: it reads the map,
    // it does not list the pool.
    let planted_dir = scratch("nbd-alloc");
    let planted = planted_dir.join("planted");
    std::fs::write(&planted, vec![0x55u8; 4096]).expect("write");
    let data20 = format!("vdata.{id}.{:016x}", 20);
    c.ok(&["obj", "put", "default", &data20, &p(&planted)]);
    let s2 = server_when_free(&c, "am");
    let offs = [0, 3 * OBJ + 8192, 40 * OBJ, 20 * OBJ];
    assert_eq!(bytes_at(&s2.uri("am"), &offs), "17,51,68,0");
    // Without a map (a volume from before it, or a damaged one) the pool is listed once and
    // the map written from it: now the planted object is seen.
    s2.signal(libc::SIGTERM);
    let mut s2 = s2;
    s2.wait_exit();
    c.ok(&["obj", "rm", "default", &shard]);
    let s3 = server_when_free(&c, "am");
    assert_eq!(bytes_at(&s3.uri("am"), &offs), "17,51,68,85");
    assert_eq!(objects_with(&c, "default", &shard), vec![shard.clone()]);
    drop(s3);
    c.ok(&["vol", "rm", "am", "--force"]);
    assert_eq!(objects_with(&c, "default", &id), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&planted_dir);
}
