//! The server against real NBD clients (libnbd's nbdinfo/nbdcopy/nbdsh, qemu-img, fio) over
//! TCP on 127.0.0.1, with in-memory exports as the backend.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::mem::{MemExport, MemExports, BLOCK};
use common::{assert_same, image, read_file, run, tool, write_file, TempDir, TestServer};

const LIMIT: Duration = Duration::from_secs(30);
const MIB: usize = 1 << 20;

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn nbdinfo_size_list_and_map() {
    let mut exports = MemExports::new();
    let disk = exports.add("disk", "the first disk", MemExport::new(MIB as u64));
    exports.add("small", "", MemExport::new(64 << 10));
    disk.fill(0, &vec![0xaa; MIB]);
    let server = TestServer::start(exports);

    let size = run(
        tool("nbdinfo", "libnbd-bin").args(["--size", &server.uri("disk")]),
        LIMIT,
    );
    assert_eq!(text(&size).trim(), MIB.to_string());

    let list = run(
        tool("nbdinfo", "libnbd-bin").args(["--list", &server.uri("")]),
        LIMIT,
    );
    let list = text(&list);
    assert!(list.contains("export=\"disk\""), "{list}");
    assert!(list.contains("export=\"small\""), "{list}");
    assert!(list.contains("the first disk"), "{list}");
    assert!(list.contains("export-size: 65536"), "{list}");

    // Trim 64 KiB at 128 KiB; --map must show it as a hole (3 = hole,zero), the rest as data.
    run(
        tool("nbdsh", "python3-libnbd").args([
            "-u",
            &server.uri("disk"),
            "-c",
            "h.trim(65536, 131072)",
        ]),
        LIMIT,
    );
    let map = run(
        tool("nbdinfo", "libnbd-bin").args(["--map", &server.uri("disk")]),
        LIMIT,
    );
    let rows: Vec<(u64, u64, u32)> = text(&map)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (0, 131072, 0),
            (131072, 65536, 3),
            (196608, MIB as u64 - 196608, 0)
        ],
        "{}",
        text(&map)
    );
}

#[test]
fn qemu_img_convert_and_compare_both_ways() {
    let size = 32 * MIB;
    let mut exports = MemExports::new();
    let disk = exports.add("disk", "", MemExport::new(size as u64));
    let server = TestServer::start(exports);
    let dir = TempDir::new("qemu");
    let src = dir.path("src.img");
    let src_bytes = image(size, 1);
    write_file(&src, &src_bytes);
    let uri = server.uri("disk");

    run(
        tool("qemu-img", "qemu-utils")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&uri),
        LIMIT,
    );
    assert_same(
        &disk.contents(),
        &src_bytes,
        "export after qemu-img convert in",
    );
    run(
        tool("qemu-img", "qemu-utils")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(&uri),
        LIMIT,
    );

    let out = dir.path("out.img");
    run(
        tool("qemu-img", "qemu-utils")
            .args(["convert", "-f", "raw", "-O", "raw", &uri])
            .arg(&out),
        LIMIT,
    );
    assert_same(
        &read_file(&out),
        &src_bytes,
        "image after qemu-img convert out",
    );
}

#[test]
fn nbdcopy_both_ways() {
    let size = 16 * MIB;
    let mut exports = MemExports::new();
    let disk = exports.add("disk", "", MemExport::new(size as u64));
    let server = TestServer::start(exports);
    let dir = TempDir::new("nbdcopy");
    let src = dir.path("src.img");
    let src_bytes = image(size, 2);
    write_file(&src, &src_bytes);
    let uri = server.uri("disk");

    // nbdcopy uses several connections (the export allows multi-conn) and many requests in
    // flight on each.
    run(tool("nbdcopy", "libnbd-bin").arg(&src).arg(&uri), LIMIT);
    assert_same(&disk.contents(), &src_bytes, "export after nbdcopy in");

    let out = dir.path("out.img");
    write_file(&out, &[]);
    run(tool("nbdcopy", "libnbd-bin").arg(&uri).arg(&out), LIMIT);
    assert_same(&read_file(&out), &src_bytes, "image after nbdcopy out");
}

/// Structured replies, FUA, flush, zero flags, trim, cache and block status through libnbd.
const NBDSH_COMMANDS: &str = r#"
import errno, os
h.add_meta_context("base:allocation")
h.connect_uri(URI)
for f in (h.can_fua, h.can_flush, h.can_trim, h.can_zero, h.can_fast_zero, h.can_cache,
          h.can_df, h.can_multi_conn):
    assert f(), f.__name__
assert h.can_meta_context("base:allocation")
assert h.get_structured_replies_negotiated()
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 << 20

buf = os.urandom(262144)
h.pwrite(buf, 0, nbd.CMD_FLAG_FUA)
assert h.pread(262144, 0) == buf
assert h.pread(4096, 0, nbd.CMD_FLAG_DF) == buf[:4096]
h.flush()

h.zero(8192, 4096, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(8192, 4096) == bytes(8192)
try:
    h.zero(4096, 0, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
    raise AssertionError("fast zero without punching should fail")
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, e
assert h.pread(4096, 0) == buf[:4096]
h.zero(65536, 65536, nbd.CMD_FLAG_FAST_ZERO)
h.trim(65536, 131072, nbd.CMD_FLAG_FUA)
h.cache(4096, 0)

seen = []
def extents(metacontext, offset, entries, err):
    assert metacontext == "base:allocation"
    seen.append((offset, list(entries)))
h.block_status(262144, 0, extents)
# 0..64K data, 64K..192K punched or trimmed (hole, zero), 192K..256K data.
assert seen == [(0, [65536, 0, 131072, 3, 65536, 0])], seen
seen.clear()
h.block_status(262144, 0, extents, nbd.CMD_FLAG_REQ_ONE)
assert seen == [(0, [65536, 0])], seen
assert h.pread(131072, 65536) == bytes(131072)

try:
    h.pread(4096, (1 << 20) - 2048)
    raise AssertionError("read past the end should fail")
except nbd.Error as e:
    assert e.errnum == errno.EINVAL, e
h.shutdown()
"#;

#[test]
fn nbdsh_structured_commands() {
    let mut exports = MemExports::new();
    let disk = exports.add("disk", "", MemExport::new(MIB as u64));
    let server = TestServer::start(exports);
    // Past-the-end requests are refused by libnbd itself unless strict mode is relaxed.
    let script = format!(
        "URI = {:?}\nh.set_strict_mode(0)\n{NBDSH_COMMANDS}",
        server.uri("disk")
    );
    run(tool("nbdsh", "python3-libnbd").args(["-c", &script]), LIMIT);
    assert_eq!(disk.calls.fua_writes.load(Ordering::SeqCst), 1);
    // One FLUSH, plus one for the FUA trim (the export's trim has no FUA of its own).
    assert_eq!(disk.calls.flushes.load(Ordering::SeqCst), 2);
    assert!(!disk.is_allocated((65536 / BLOCK) as usize));
    assert!(disk.is_allocated(0));
}

/// A slow read issued first completes after a fast one issued second; then 100 writes in
/// flight at once all land.
const NBDSH_IN_FLIGHT: &str = r#"
import os
h.connect_uri(URI)
slow = h.aio_pread(nbd.Buffer(4096), 0)
fast = h.aio_pread(nbd.Buffer(4096), 65536)
while not h.aio_command_completed(fast):
    h.poll(-1)
assert not h.aio_command_completed(slow), "slow read finished before the fast one"
while not h.aio_command_completed(slow):
    h.poll(-1)

bufs = [os.urandom(4096) for _ in range(100)]
cookies = [h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b)), 131072 + i * 4096)
           for i, b in enumerate(bufs)]
assert h.aio_in_flight() > 1
for c in cookies:
    while not h.aio_command_completed(c):
        h.poll(-1)
assert h.pread(4096 * 100, 131072) == b"".join(bufs)
h.shutdown()
"#;

#[test]
fn nbdsh_out_of_order_replies_and_many_in_flight() {
    let mut exports = MemExports::new();
    exports.add(
        "disk",
        "",
        MemExport::new(MIB as u64).with_slow_reads(4096, Duration::from_millis(500)),
    );
    let server = TestServer::start(exports);
    let script = format!("URI = {:?}\n{NBDSH_IN_FLIGHT}", server.uri("disk"));
    run(tool("nbdsh", "python3-libnbd").args(["-c", &script]), LIMIT);
}

#[test]
fn nbdsh_without_structured_replies() {
    let mut exports = MemExports::new();
    exports.add("disk", "", MemExport::new(MIB as u64).without_multi_conn());
    let server = TestServer::start(exports);
    let script = format!(
        "URI = {:?}\n{}",
        server.uri("disk"),
        r#"
h.set_request_structured_replies(False)
h.connect_uri(URI)
assert not h.get_structured_replies_negotiated()
assert not h.can_df() and not h.can_multi_conn() and h.can_fua()
h.pwrite(b"x" * 512, 512)
assert h.pread(1024, 0) == bytes(512) + b"x" * 512
h.shutdown()
"#
    );
    run(tool("nbdsh", "python3-libnbd").args(["-c", &script]), LIMIT);
}

#[test]
fn fio_randwrite_verify() {
    let mut exports = MemExports::new();
    let disk = exports.add("disk", "", MemExport::new(16 * MIB as u64));
    let server = TestServer::start(exports);
    // fio writes a verify state file into its working directory.
    let dir = TempDir::new("fio");
    let out = run(
        tool("fio", "fio").current_dir(dir.path("")).args([
            "--name=nbd",
            "--ioengine=nbd",
            &format!("--uri={}", server.uri("disk")),
            "--rw=randwrite",
            "--bs=4k",
            "--size=16M",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--runtime=5",
            "--verify_state_save=0",
        ]),
        LIMIT,
    );
    let report = text(&out);
    assert!(report.contains("nbd: (groupid="), "{report}");
    assert!(
        !report.contains("verify:"),
        "fio reported a verify problem:\n{report}"
    );
    assert!(disk.calls.writes.load(Ordering::SeqCst) > 0);
    assert!(disk.calls.reads.load(Ordering::SeqCst) > 0);
}
