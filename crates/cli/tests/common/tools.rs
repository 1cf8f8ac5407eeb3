//! External tools the tests drive (qemu-img, nbdcopy, nbdsh, fio, ...), run under a hang
//! guard with the system's PATH first.

#![allow(dead_code)]

use super::cluster::{text, Cluster};
use rand::{Rng, RngCore, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

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

/// Unmounts what the ext4 test mounted, even when it fails half-way.
pub struct Mounts {
    pub loop_mnt: PathBuf,
    pub fuse_mnt: PathBuf,
    pub nbdfuse: Option<Child>,
}

impl Mounts {
    pub fn umount_loop(&self) -> bool {
        Command::new("umount")
            .arg(&self.loop_mnt)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.loop_mnt).status();
        let fuse_unmounted = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.fuse_mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !fuse_unmounted {
            // No fusermount3 (or it failed): a lazy unmount, so no dead FUSE mount is left.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.fuse_mnt)
                .status();
        }
        if let Some(mut ch) = self.nbdfuse.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = ch.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = ch.kill();
            let _ = ch.wait();
        }
    }
}

pub fn mount_loop(c: &Cluster, file: &Path, at: &Path) {
    let o = Command::new("mount")
        .args(["-o", "loop"])
        .arg(file)
        .arg(at)
        .output()
        .expect("run mount");
    assert!(
        o.status.success(),
        "mount -o loop failed (the test needs root and loop devices): {}\n{}",
        text(&o.stderr),
        c.logs()
    );
}

/// A tree of files with random contents: (relative path, contents).
pub fn file_tree(seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..120)
        .map(|i| {
            let len = match i % 4 {
                0 => rng.gen_range(0..100),
                1 => rng.gen_range(1..64 << 10),
                2 => rng.gen_range(64 << 10..1 << 20),
                _ => 4096,
            };
            let mut data = vec![0u8; len];
            rng.fill_bytes(&mut data);
            (format!("d{}/s{}/f{i}", i % 5, i % 3), data)
        })
        .collect()
}

pub fn verify_tree(root: &Path, tree: &[(String, Vec<u8>)]) {
    for (rel, data) in tree {
        let got = std::fs::read(root.join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"));
        assert!(got == *data, "{rel}: contents differ after remount");
    }
}

/// Serves `uri` as the file `disk` through nbdfuse under `dir`; the mounts go when dropped.
pub fn fuse_disk(c: &Cluster, uri: &str, dir: &Path) -> (Mounts, PathBuf) {
    let fuse_mnt = dir.join("fuse");
    let loop_mnt = dir.join("mnt");
    std::fs::create_dir_all(&fuse_mnt).expect("mkdir");
    std::fs::create_dir_all(&loop_mnt).expect("mkdir");
    let pidfile = dir.join("nbdfuse.pid");
    let child = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(fuse_mnt.join("disk"))
        .arg(uri)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run nbdfuse ({e}): apt-get install nbdfuse"));
    let mut m = Mounts {
        loop_mnt,
        fuse_mnt: fuse_mnt.clone(),
        nbdfuse: Some(child),
    };
    let start = Instant::now();
    while !pidfile.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nbdfuse did not become ready\n{}",
            c.logs()
        );
        if let Some(Ok(Some(st))) = m.nbdfuse.as_mut().map(|ch| ch.try_wait()) {
            panic!("nbdfuse exited: {st}\n{}", c.logs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (m, fuse_mnt.join("disk"))
}

/// `fsck.ext4 -n -f` of `disk` must find nothing.
pub fn fsck_clean(disk: &Path) {
    let fsck = tool(120, "fsck.ext4", &["-n", "-f", &p(disk)]);
    assert!(
        fsck.status.success(),
        "fsck.ext4 -n found problems:\n{}{}",
        text(&fsck.stdout),
        text(&fsck.stderr)
    );
}

/// Runs an nbdsh script against `uri` under a hang guard, its stdout piped.
pub fn nbdsh_spawn(uri: &str, secs: u32, script: &str) -> Child {
    Command::new("timeout")
        .args(["-k", "5", &secs.to_string(), "nbdsh", "-c", script])
        .env("URI", uri)
        .env("PATH", system_path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run nbdsh (apt-get install libnbd-bin python3-libnbd)")
}

/// Reads the first line a spawned child prints (its stdout, taken) and checks it.
pub fn wait_line(child: &mut Child, want: &str) {
    use std::io::BufRead;
    let out = child.stdout.take().expect("stdout");
    let mut line = String::new();
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line.trim(), want, "the child said {line:?}");
}

/// Offsets (4 KiB aligned) in the file at `path` whose block equals `block`.
pub fn find_block(path: &std::path::Path, block: &[u8]) -> Vec<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).expect("open data file");
    let mut buf = vec![0u8; 1 << 20];
    let (mut at, mut found) = (0u64, Vec::new());
    loop {
        let n = f.read(&mut buf).expect("read data file");
        if n == 0 {
            return found;
        }
        for (i, chunk) in buf[..n].chunks_exact(4096).enumerate() {
            if chunk == block {
                found.push(at + (i * 4096) as u64);
            }
        }
        at += n as u64;
    }
}
