//! External tools the tests drive (qemu-img, nbdcopy, nbdsh, fio, ...), run under a hang
//! guard with the system's PATH first.

#![allow(dead_code)]

use super::cluster::{text, Cluster};
use rand::{RngCore, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// PATH with the system's directories first: nbdsh needs the system python3 (with libnbd's
/// bindings, Debian package python3-libnbd), not one a version manager put first.
pub fn system_path() -> String {
    format!(
        "/usr/bin:/usr/sbin:/bin:/sbin:{}",
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Runs a tool under a hang guard; a missing tool fails with the package to install.
pub fn tool(secs: u32, cmd: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", &secs.to_string(), cmd])
        .args(args)
        .env("PATH", system_path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run timeout {cmd}: {e}"))
}

pub fn package_of(cmd: &str) -> &'static str {
    match cmd {
        "qemu-img" => "qemu-utils",
        "nbdinfo" | "nbdcopy" => "libnbd-bin",
        "nbdsh" => "libnbd-bin python3-libnbd",
        "nbdfuse" => "nbdfuse",
        "fio" => "fio",
        "mkfs.ext4" | "fsck.ext4" => "e2fsprogs",
        _ => "?",
    }
}

/// Runs a tool that must succeed; returns its stdout.
pub fn tool_ok(c: &Cluster, secs: u32, cmd: &str, args: &[&str]) -> String {
    let o = tool(secs, cmd, args);
    if o.status.code() == Some(127) {
        panic!(
            "{cmd} is not installed: apt-get install {}",
            package_of(cmd)
        );
    }
    assert!(
        o.status.success(),
        "{cmd} {args:?} failed ({}):\n{}\n{}\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr),
        c.logs()
    );
    text(&o.stdout)
}

pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-nbdtest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// A path as an argument.
pub fn p(path: &Path) -> String {
    path.display().to_string()
}

/// Random bytes with zeroed stretches (so thin provisioning and hole skipping are exercised).
pub fn image(len: usize, zero_ranges: &[(usize, usize)], seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    for &(start, end) in zero_ranges {
        v[start..end].fill(0);
    }
    v
}

/// A fio job writing `size` at random with crc32c verification, then verifying it all.
pub fn fio_verify(c: &Cluster, uri: &str, name: &str, bs: &str, size: &str, iodepth: &str) {
    let out = tool_ok(
        c,
        300,
        "fio",
        &[
            &format!("--name={name}"),
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            &format!("--bs={bs}"),
            &format!("--size={size}"),
            &format!("--iodepth={iodepth}"),
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ],
    );
    let json_start = out.find('{').unwrap_or(0);
    let v: serde_json::Value = serde_json::from_str(&out[json_start..])
        .unwrap_or_else(|e| panic!("fio json ({e}): {out}"));
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    let written = job["write"]["io_bytes"].as_u64().expect("io_bytes");
    let verified = job["read"]["io_bytes"].as_u64().expect("read io_bytes");
    assert!(
        written > 0 && verified == written,
        "{name}: wrote {written}, verified {verified}"
    );
}
