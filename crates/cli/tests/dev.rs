//! `cairn dev up|down` explains what goes wrong: options that cannot change on an existing
//! cluster, a daemon that dies while starting, a WAL lost with /dev/shm, a failed start that
//! would leave processes behind, a missing directory.

mod common;

use cairn_failstop::LockOrDie;
use common::cluster::{text, Cluster};
use std::process::Output;
use std::time::{Duration, Instant};

/// The tests of this file run one at a time: they stop clusters and take their freed ports
/// (a cluster created meanwhile by another test could pick the same port).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock_or_die()
}

fn cairn(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .output()
        .expect("run the cairn binary")
}

/// `dev up` of an existing test cluster with `extra` arguments; must fail. Returns stderr.
fn dev_up_fails(c: &Cluster, extra: &[&str]) -> String {
    let d = c.dir.display().to_string();
    let mut args = vec!["dev", "up", "--dir", &d, "--no-pool", "--timeout", "30"];
    args.extend_from_slice(extra);
    let o = cairn(&args);
    assert!(!o.status.success(), "dev up {extra:?} should fail");
    text(&o.stderr)
}

/// `dev up` of a new one-monitor, one-OSD (1 GiB) cluster in `c`'s directory, with `extra`.
fn new_one_osd(c: &Cluster, extra: &[&str]) -> Output {
    let d = c.dir.display().to_string();
    let mut args = vec![
        "dev",
        "up",
        "--dir",
        &d,
        "--osds",
        "1",
        "--osd-size",
        "1G",
        "--timeout",
        "60",
    ];
    args.extend_from_slice(extra);
    cairn(&args)
}

fn dev_toml(c: &Cluster) -> toml::Value {
    let t = std::fs::read_to_string(c.dir.join("dev.toml")).expect("read dev.toml");
    toml::from_str(&t).expect("parse dev.toml")
}

#[test]
fn dev_down_of_a_missing_dir_says_so_and_succeeds() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("cairn-test-nodir-{}", std::process::id()));
    let d = dir.display().to_string();
    let o = cairn(&["dev", "down", "--dir", &d, "--purge"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("no dev cluster in"),
        "{}",
        text(&o.stdout)
    );
    assert!(!dir.exists());
}

#[test]
fn dev_up_refuses_changes_and_explains_failed_starts() {
    let _serial = serial();
    let c = Cluster::up("dev-explains", 1, 1);
    let d = c.dir.display().to_string();

    // Options fixed at creation are refused, naming them; the cluster keeps running.
    let e = dev_up_fails(&c, &["--osd-size", "2G", "--mons", "3"]);
    assert!(
        e.contains("cannot change") && e.contains("--osd-size 2147483648 (it has 1073741824)"),
        "{e}"
    );
    assert!(e.contains("--mons 3 (it has 1)"), "{e}");
    assert_eq!(c.status()["osds"]["up"], 1);

    // A monitor that cannot start (its port taken) is reported at once with its own error.
    c.ok(&["dev", "down", "--dir", &d]);
    let mon = c.mons()[0].clone();
    let squatter = std::net::TcpListener::bind(&mon).expect("take the monitor's port");
    let t0 = Instant::now();
    let e = dev_up_fails(&c, &[]);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    assert!(e.contains("mon.0 stopped while starting"), "{e}");
    assert!(e.to_lowercase().contains("in use"), "{e}");
    drop(squatter);

    // The WAL gone (as after a reboot): refused before anything starts, saying why.
    let wal = dev_toml(&c)["wal_dir"]
        .as_str()
        .map(|w| format!("{w}/osd.0.wal"));
    if let Some(wal) = wal {
        std::fs::rename(&wal, format!("{wal}.away")).expect("hide the WAL");
        let e = dev_up_fails(&c, &[]);
        assert!(e.contains("the WAL of osd.0 is gone"), "{e}");
        assert!(e.contains("--purge"), "{e}");
        std::fs::rename(format!("{wal}.away"), &wal).expect("restore the WAL");
    }
    // All back: the same cluster starts again.
    c.ok(&["dev", "up", "--dir", &d, "--no-pool", "--timeout", "60"]);
    assert_eq!(c.status()["osds"]["up"], 1);
}

#[test]
fn a_failed_dev_up_stops_what_it_started_and_a_new_nbd_address_is_taken() {
    let _serial = serial();
    let c = Cluster::at("dev-nbd");
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = squatter.local_addr().expect("addr").to_string();
    let up = |nbd: &str| new_one_osd(&c, &["--volume-size", "64M", "--nbd", nbd]);
    let o = up(&taken);
    let e = text(&o.stderr);
    assert!(!o.status.success(), "the NBD port is taken");
    assert!(e.contains("another program listens there"), "{e}");
    assert!(e.contains("stopped what this `dev up` started"), "{e}");
    for name in ["mon.0", "osd.0"] {
        let pidfile = c.dir.join("run").join(format!("{name}.pid"));
        assert!(!pidfile.exists(), "{name} left running");
    }
    // The suggested fix works: another NBD address on the same cluster.
    let o = up("127.0.0.1:0");
    assert!(o.status.success(), "{}\n{}", text(&o.stderr), c.logs());
    let addr = c.nbd_addr();
    assert_ne!(addr, taken);
    std::net::TcpStream::connect(&addr).expect("the NBD server listens on its new address");
}

#[test]
fn wals_of_a_cluster_whose_directory_was_deleted_are_found_and_removed() {
    let _serial = serial();
    let gone = Cluster::up("dev-orphan", 1, 1);
    let Some(wal) = dev_toml(&gone)["wal_dir"]
        .as_str()
        .map(std::path::PathBuf::from)
    else {
        return; // no /dev/shm on this machine: WALs live in the cluster directory
    };
    let kept = Cluster::up("dev-kept", 1, 1);
    let kept_wal = dev_toml(&kept)["wal_dir"]
        .as_str()
        .map(std::path::PathBuf::from)
        .expect("wal dir");
    // Stopped, then its directory deleted by hand: the WALs stay in /dev/shm.
    let d = gone.dir.display().to_string();
    gone.ok(&["dev", "down", "--dir", &d]);
    std::fs::remove_dir_all(&gone.dir).expect("delete the cluster directory");
    assert!(wal.exists());
    // Any dev command tells; the purge removes exactly the orphans.
    let o = cairn(&["dev", "down", "--dir", &d]);
    assert!(o.status.success());
    let e = text(&o.stderr);
    assert!(
        e.contains("belong") && e.contains("--purge-orphan-wals"),
        "{e}"
    );
    let o = cairn(&["dev", "down", "--dir", &d, "--purge-orphan-wals"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains(&format!("removed {}", wal.display())));
    assert!(!wal.exists(), "the orphaned WALs are gone");
    assert!(kept_wal.exists(), "a live cluster's WALs stay");
    assert_eq!(kept.status()["osds"]["up"], 1);
}

#[test]
fn the_default_volume_fits_in_the_default_pool() {
    let _serial = serial();
    // One 1 GiB OSD: the 10 GiB default would fail part way when written full.
    let c = Cluster::at("dev-fit");
    let o = new_one_osd(&c, &["--nbd", "127.0.0.1:0"]);
    assert!(o.status.success(), "{}\n{}", text(&o.stderr), c.logs());
    let info: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", "disk0", "--json"])).expect("json");
    let size = info["size"].as_u64().expect("size");
    let room = c.status()["pools"][0]["usable_bytes"]
        .as_u64()
        .expect("usable_bytes");
    assert!(size > 0 && size <= room, "volume {size} > room {room}");
    assert_eq!(size % (64 << 20), 0, "{size}");
}
