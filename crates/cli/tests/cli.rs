//! Runs the real `cairn` binary against files in temporary directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

fn cairn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .output()
        .expect("run the cairn binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts success and returns stdout.
fn ok(args: &[&str]) -> String {
    let o = cairn(args);
    assert!(
        o.status.success(),
        "cairn {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// Asserts the exit code and returns stderr.
fn fails(args: &[&str], code: i32) -> String {
    let o = cairn(args);
    assert_eq!(
        o.status.code(),
        Some(code),
        "cairn {args:?}: expected exit {code}\nstdout: {}\nstderr: {}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stderr)
}

/// A runtime error is one line on stderr, prefixed, naming what failed.
fn assert_one_line_error(stderr: &str, must_contain: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected a one-line error, got:\n{stderr}");
    assert!(lines[0].starts_with("cairn: error: "), "{stderr}");
    assert!(
        lines[0].contains(must_contain),
        "error should mention {must_contain:?}: {stderr}"
    );
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("cairn-cli-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn file(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

#[test]
fn mkfs_info_scrub_with_wal_on_the_data_device() {
    let t = TempDir::new("single");
    let d = t.file("data");
    let out = ok(&[
        "store",
        "mkfs",
        "--data",
        &d,
        "--size",
        "128M",
        "--wal-size",
        "16M",
    ]);
    assert!(out.contains("formatted store"), "{out}");
    let info = ok(&["store", "info", "--data", &d]);
    assert!(info.contains("collections:  0"), "{info}");
    let scrub = ok(&["store", "scrub", "--data", &d]);
    assert!(scrub.contains("no issues"), "{scrub}");
}

#[test]
fn mkfs_info_scrub_mirror_with_separate_wal() {
    let t = TempDir::new("mirror");
    let (a, b, w) = (t.file("a"), t.file("b"), t.file("wal"));
    let devs = ["--data", &a, "--data", &b, "--wal", &w];
    let mkfs: Vec<&str> = ["store", "mkfs"]
        .into_iter()
        .chain(devs)
        .chain(["--size", "64M", "--wal-size", "16M", "--segment-size", "1M"])
        .collect();
    ok(&mkfs);
    let info: Vec<&str> = ["store", "info", "--json"]
        .into_iter()
        .chain(devs)
        .collect();
    let v = json(&ok(&info));
    assert_eq!(v["data_devices"], 2);
    assert_eq!(v["collections"], 0);
    assert_eq!(v["segment_size"], 1 << 20);
    assert!(v["segments_free"].as_u64().unwrap() > 0);
    let scrub: Vec<&str> = ["store", "scrub", "--json"]
        .into_iter()
        .chain(devs)
        .collect();
    let v = json(&ok(&scrub));
    assert_eq!(v["issues"].as_array().unwrap().len(), 0);

    // Formatting over a store needs --force.
    let e = fails(&mkfs, 1);
    assert_one_line_error(&e, "already holds a Cairn store");
    let forced: Vec<&str> = mkfs.iter().copied().chain(["--force"]).collect();
    ok(&forced);

    // Devices of a mirror given in the wrong order.
    let e = fails(
        &["store", "info", "--data", &b, "--data", &a, "--wal", &w],
        1,
    );
    assert_one_line_error(&e, "data device 1 of 2");
    // The WAL missing.
    let e = fails(&["store", "info", "--data", &a, "--data", &b], 1);
    assert_one_line_error(&e, "separate WAL device");
}

/// Finds every occurrence of `pat` in the file and flips a bit of it.
fn damage(path: &Path, pat: &[u8]) -> usize {
    let mut bytes = std::fs::read(path).unwrap();
    let mut hits = Vec::new();
    let mut i = 0;
    while i + pat.len() <= bytes.len() {
        if &bytes[i..i + pat.len()] == pat {
            hits.push(i);
            i += pat.len();
        } else {
            i += 1;
        }
    }
    for &h in &hits {
        bytes[h + 100] ^= 0x10;
    }
    std::fs::write(path, bytes).unwrap();
    hits.len()
}

#[test]
fn scrub_reports_damaged_blocks_and_exits_3() {
    use cairn_store::{BlockDevice, Devices, FileDevice, Store, StoreConfig, Transaction};
    let t = TempDir::new("scrub");
    let (d, w) = (t.file("data"), t.file("wal"));
    ok(&[
        "store",
        "mkfs",
        "--data",
        &d,
        "--wal",
        &w,
        "--size",
        "64M",
        "--wal-size",
        "16M",
    ]);
    let mut block = vec![0u8; 4096];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    block[..16].copy_from_slice(b"cairn-cli-test!!");
    {
        let data: Arc<dyn BlockDevice> =
            Arc::new(FileDevice::open(Path::new(&d), 0, "data0").unwrap());
        let wal: Arc<dyn BlockDevice> =
            Arc::new(FileDevice::open(Path::new(&w), 0, "wal").unwrap());
        let devs = Devices {
            data: vec![data],
            wal: Some(wal),
        };
        let s = Store::open(&devs, StoreConfig::default()).unwrap();
        let mut txn = Transaction::new();
        txn.create_collection(7)
            .write(7, b"victim", 8192, &block)
            .write(7, b"bystander", 0, &[1u8; 4096]);
        s.commit(&txn).unwrap();
        s.close().unwrap();
    }
    let v = json(&ok(&["store", "info", "--json", "--data", &d, "--wal", &w]));
    assert_eq!(v["collections"], 1);
    assert_eq!(v["objects"], 2);
    assert!(damage(Path::new(&d), &block[..64]) >= 1);
    let o = cairn(&["store", "scrub", "--data", &d, "--wal", &w]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains("\"victim\"") && out.contains("block 2"),
        "{out}"
    );
    assert!(!out.contains("bystander"), "{out}");
}

#[test]
fn wrong_arguments_give_clear_errors() {
    let t = TempDir::new("errors");
    let missing = t.file("missing");
    // Usage errors (clap): exit 2 and name the problem.
    let e = fails(&["store", "info"], 2);
    assert!(e.contains("--data"), "{e}");
    let e = fails(&["store", "mkfs", "--data", &missing, "--size", "12abc"], 2);
    assert!(e.contains("not a size"), "{e}");
    let e = fails(&["bench", "store", "--json", "--data-dir", &missing], 2);
    assert!(e.contains("--wal-dir"), "{e}");
    let e = fails(
        &[
            "bench",
            "store",
            "--wal-dir",
            &missing,
            "--data-dir",
            &missing,
            "--seconds",
            "0",
        ],
        2,
    );
    assert!(e.contains("seconds"), "{e}");
    let e = fails(&["store", "frobnicate"], 2);
    assert!(e.contains("frobnicate"), "{e}");
    // Usage errors read like every other error (one style), with the usage hint after.
    assert!(e.starts_with("cairn: error: "), "{e}");
    // Sizes: negative refused as such (not as an unknown argument), decimal units refused
    // as ambiguous; nothing is created.
    let e = fails(&["store", "mkfs", "--data", &missing, "--size", "-5G"], 2);
    assert!(e.contains("cannot be negative"), "{e}");
    let e = fails(&["dev", "up", "--dir", &missing, "--osd-size", "10GB"], 2);
    assert!(e.contains("ambiguous") && e.contains("10G or 10GiB"), "{e}");
    assert!(
        !Path::new(&missing).exists(),
        "a refused size must not create files"
    );

    // Runtime errors: exit 1, one line, naming the path.
    let e = fails(&["store", "info", "--data", &missing], 1);
    assert_one_line_error(&e, &missing);
    assert!(!Path::new(&missing).exists(), "info must not create files");
    let e = fails(&["store", "mkfs", "--data", &missing], 1);
    assert_one_line_error(&e, "--size");
    let zeros = t.file("zeros");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let e = fails(&["store", "scrub", "--data", &zeros], 1);
    assert_one_line_error(&e, "not formatted");
    let e = fails(&["store", "mkfs", "--data", &zeros, "--size", "1M"], 1);
    assert_one_line_error(&e, "segments");
    let e = fails(
        &[
            "store", "info", "--data", &zeros, "--data", &zeros, "--data", &zeros,
        ],
        1,
    );
    assert_one_line_error(&e, "3 data devices");
    let e = fails(
        &[
            "bench",
            "store",
            "--wal-dir",
            &missing,
            "--data-dir",
            &missing,
            "--only",
            "nope",
        ],
        1,
    );
    assert_one_line_error(&e, "randwrite-4k-qd1");
}

#[test]
fn bench_store_smoke() {
    let t = TempDir::new("bench");
    let (w, d) = (t.file("wal"), t.file("data"));
    let o = cairn(&[
        "bench",
        "store",
        "--json",
        "--wal-dir",
        &w,
        "--data-dir",
        &d,
        "--seconds",
        "0.5",
        "--working-set",
        "8M",
        "--wal-size",
        "32M",
        "--data-size",
        "256M",
    ]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "bench failed:\n{err}");
    let v = json(&out);
    let names: Vec<&str> = v["workloads"]
        .as_array()
        .expect("a workloads array")
        .iter()
        .map(|w| w["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(
        names,
        [
            "randwrite-4k-qd1",
            "randwrite-4k-qd32",
            "randread-4k-qd1",
            "randread-4k-qd32",
            "write-128k-qd8-wal",
            "write-128k-qd8-direct",
            "write-1m-qd8-wal",
            "write-1m-qd8-direct",
            "mix70-4k-qd32-separated",
            "mix70-4k-qd32-unseparated"
        ]
    );
    for w in v["workloads"].as_array().unwrap() {
        let name = w["name"].as_str().unwrap();
        for f in [
            "iops",
            "dev_writes",
            "dev_write_mean_bytes",
            "dev_read_bytes",
            "baseline_iops",
            "ratio_to_baseline",
            "lat_p50_ratio_to_baseline",
        ] {
            assert!(w[f].is_number(), "{name}: {f} missing in {w}");
        }
        for q in ["p50", "p99", "p999"] {
            assert!(w["lat_us"][q].is_number(), "{name}: lat_us.{q} missing");
        }
        assert!(w["baseline_lat_us"]["p50"].is_number(), "{name}");
        assert!(w["iops"].as_f64().unwrap() > 0.0, "{name}: iops");
        assert!(
            w["baseline_iops"].as_f64().unwrap() > 0.0,
            "{name}: baseline_iops"
        );
        if name.starts_with("mix70") {
            assert!(w["read_lat_us"]["p50"].is_number(), "{name}");
            assert!(w["read_lat_us"]["p99"].is_number(), "{name}");
            assert!(w["dev_flushes"].is_number(), "{name}");
        }
        if name.starts_with("write-") {
            // Large writes: the -direct runs' bytes skipped the WAL (but for a few that took
            // the WAL path while free segments ran short on this small device), none of -wal's.
            let (direct, bytes) = (
                w["direct_bytes"].as_u64().unwrap(),
                w["block_bytes"].as_u64().unwrap(),
            );
            let ops = w["ops"].as_u64().unwrap();
            if name.ends_with("-direct") {
                assert!(
                    direct >= ops * bytes / 2 && direct <= ops * bytes,
                    "{name}: {w}"
                );
                assert!(
                    w["wal_write_bytes"].as_u64().unwrap() < ops * bytes / 2,
                    "{name}: {w}"
                );
            } else {
                assert_eq!(direct, 0, "{name}");
                assert!(
                    w["wal_write_bytes"].as_u64().unwrap() >= ops * bytes,
                    "{name}: {w}"
                );
            }
            assert!(w["mb_per_s"].as_f64().unwrap() > 0.0, "{name}");
        }
    }
    assert_eq!(
        err.lines().filter(|l| l.contains("IOPS")).count(),
        10,
        "{err}"
    );
    // The benchmark removes its files.
    for dir in [&w, &d] {
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
        assert!(left.is_empty(), "{dir} still holds {left:?}");
    }
}

#[test]
fn bench_scale_reports_placement_map_sizes_and_movement() {
    let out = ok(&[
        "bench", "scale", "--json", "--osds", "40,60", "--pgs", "512",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench scale JSON");
    let scales = v["scales"].as_array().expect("scales");
    assert_eq!(scales.len(), 2, "{out}");
    for s in scales {
        assert!(s["placement_ms"].as_f64().is_some_and(|x| x > 0.0), "{s}");
        assert!(
            s["placement_v1_ms"].as_f64().is_some_and(|x| x > 0.0),
            "{s}"
        );
        assert!(s["map_bytes"].as_u64().is_some_and(|x| x > 0), "{s}");
        // 512 PGs x 3 copies spread over the OSDs.
        let mean = s["pgs_per_osd"]["mean"].as_f64().expect("mean");
        let osds = s["osds"].as_f64().expect("osds");
        assert!((mean * osds - 1536.0).abs() < 1.0, "{s}");
        for k in ["host_added", "host_lost"] {
            let r = s[k]["ratio_to_ideal"].as_f64().expect("ratio");
            assert!((0.5..2.0).contains(&r), "{k}: {s}");
        }
    }
    let e = fails(&["bench", "scale", "--osds", "15"], 1);
    assert!(e.contains("multiples of 10"), "{e}");
}

#[test]
fn bench_scale_runs_a_monitor_with_simulated_osds() {
    let args = [
        "bench",
        "scale",
        "--json",
        "--mon",
        "--osds",
        "40",
        "--pgs",
        "256",
        "--seconds",
        "1",
    ];
    let out = ok(&args);
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench scale JSON");
    let m = &v["scales"][0]["monitor"];
    assert_eq!(m["osds"], 40, "{out}");
    assert!(
        m["heartbeats_per_s"].as_f64().is_some_and(|x| x > 0.0),
        "{out}"
    );
    assert!(
        m["commit_us"]["p99"].as_f64().is_some_and(|x| x > 0.0),
        "{out}"
    );
    // The silenced OSD is marked down after its grace, not before, and no other one is.
    let detected = m["down_detected_ms"].as_f64().expect("detected");
    assert!((3000.0..12000.0).contains(&detected), "{out}");
    assert_eq!(m["spurious_downs"], 0, "{out}");
}

#[test]
fn host_setup_refuses_to_overwrite_or_guess() {
    let t = TempDir::new("host-setup");
    let (mon_dir, conf_dir) = (t.file("mon.0"), t.file("etc"));
    let boot = [
        "cluster",
        "bootstrap",
        "--mon-addr",
        "127.0.0.1:6789",
        "--mon-dir",
        &mon_dir,
        "--conf-dir",
        &conf_dir,
    ];
    let fsid = ok(&boot);
    assert_eq!(fsid.trim().len(), 32, "{fsid}");
    let mode = std::fs::metadata(t.0.join("etc/keyring")).expect("admin keyring");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    let mon_toml = std::fs::read_to_string(t.0.join("mon.0/mon.toml")).expect("mon.toml");
    assert!(
        mon_toml.contains(fsid.trim()) && mon_toml.contains("0=127.0.0.1:6789"),
        "{mon_toml}"
    );
    // A second bootstrap would make another cluster of this host: refused, nothing changed.
    let e = fails(&boot, 1);
    assert!(e.contains("already belongs to a cluster"), "{e}");
    assert!(std::fs::read_to_string(t.0.join("mon.0/mon.toml")).expect("kept") == mon_toml);
    let e = fails(
        &[
            "cluster",
            "bootstrap",
            "--mon-addr",
            "0.0.0.0:6789",
            "--mon-dir",
            &t.file("m2"),
        ],
        1,
    );
    assert!(
        e.contains("give this host's address and a fixed port"),
        "{e}"
    );

    // An OSD directory already prepared is not prepared again.
    std::fs::create_dir_all(t.0.join("osd-a")).expect("osd dir");
    std::fs::write(
        t.0.join("osd-a/osd.toml"),
        "id = 4\ndata = \"/x/data.img\"\nhost = \"h\"\nlisten = \"127.0.0.1:0\"\n",
    )
    .expect("osd.toml");
    let e = fails(&["osd", "create", "--dir", &t.file("osd-a")], 1);
    assert!(e.contains("already holds osd.4"), "{e}");

    // A joining monitor with no fsid and no configuration to take it from says so.
    let conf = t.file("missing.toml");
    let e = fails(
        &[
            "-c",
            &conf,
            "mon",
            "run",
            "--join",
            "--id",
            "1",
            "--dir",
            &t.file("mon.1"),
            "--listen",
            "127.0.0.1:1",
        ],
        1,
    );
    assert!(e.contains("--join needs the cluster's fsid"), "{e}");
}

#[test]
fn osd_activate_names_what_is_missing() {
    let e = fails(&["osd", "activate", "--root", "/nonexistent-cairn"], 1);
    assert!(e.contains("no OSD to activate"), "{e}");
    let dir = std::env::temp_dir().join(format!("cairn-activate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let d = dir.display().to_string();
    let e = fails(&["osd", "activate", &d], 1);
    assert!(
        e.contains("holds no prepared OSD") && e.contains("osd create"),
        "{e}"
    );
    let e = fails(
        &["osd", "activate", "--all", "--root", "/nonexistent-cairn"],
        1,
    );
    assert!(e.contains("/nonexistent-cairn"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn host_set_and_pool_set_pgs_refuse_bad_arguments_before_asking_the_cluster() {
    let e = fails(&["host", "set", "h1"], 1);
    assert!(e.contains("nothing to set") && e.contains("--rack"), "{e}");
    let e = fails(&["pool", "set", "p", "pgs", "many"], 1);
    assert!(e.contains("pgs \"many\": not a number"), "{e}");
    let e = fails(&["pool", "create", "p", "--domain", "row"], 2);
    assert!(e.contains("unknown failure domain \"row\""), "{e}");
}

/// `CAIRN_LOG_FORMAT=json`: a daemon's log is one JSON object per line, with the event's
/// level, target, message and fields (a monitor starting, leading, and serving metrics).
#[test]
fn daemon_logs_are_json_lines_when_asked() {
    let dir = std::env::temp_dir().join(format!("cairn-jsonlog-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut mon = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "mon",
            "run",
            "--id",
            "0",
            "--dir",
            &dir.display().to_string(),
        ])
        .args(["--listen", &addr, "--member", &format!("0={addr}")])
        .args([
            "--fsid",
            "0123456789abcdef0123456789abcdef",
            "--auth",
            "none",
        ])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("CAIRN_LOG_FORMAT", "json")
        .env("CAIRN_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a monitor");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let _ = mon.kill();
    let out = mon.wait_with_output().expect("its output");
    let log = String::from_utf8_lossy(&out.stderr);
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let find = |msg: &str| {
        events.iter().find(|e| {
            e["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(msg))
        })
    };
    let leader = find("this monitor is the leader").unwrap_or_else(|| panic!("{log}"));
    assert_eq!(leader["level"], "INFO");
    assert_eq!(leader["fields"]["term"], 1, "{leader}");
    assert!(leader["target"]
        .as_str()
        .is_some_and(|t| t.starts_with("cairn_mon")));
    assert!(find("serving metrics").is_some(), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn metrics_off_loopback_need_a_token_and_a_bad_token_file_is_named() {
    let d = TempDir::new("metrics-token");
    let conf = d.file("cairn.toml");
    let cluster =
        "[cluster]\nfsid = \"00112233445566778899aabbccddeeff\"\nmons = [\"127.0.0.1:1\"]\n";
    std::fs::write(&conf, cluster).unwrap();
    let serve = |extra: &[&str]| {
        let mut args = vec!["-c", &conf, "nbd", "serve", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        fails(&args, 1)
    };
    let e = serve(&["--metrics-addr", "0.0.0.0:0"]);
    assert!(
        e.contains("readable by anyone") && e.contains("--metrics-token-file"),
        "{e}"
    );
    let short = d.file("short.token");
    std::fs::write(&short, "abc\n").unwrap();
    let e = serve(&[
        "--metrics-addr",
        "0.0.0.0:0",
        "--metrics-token-file",
        &short,
    ]);
    assert!(e.contains("short.token") && e.contains("16 to 1024"), "{e}");
    let missing = d.file("missing.token");
    let e = serve(&[
        "--metrics-addr",
        "127.0.0.1:0",
        "--metrics-token-file",
        &missing,
    ]);
    assert!(e.contains("cannot read the metrics token file"), "{e}");
    // A token without an address is a mistake, not silently ignored.
    let e = fails(
        &["-c", &conf, "nbd", "serve", "--metrics-token-file", &short],
        2,
    );
    assert!(e.contains("--metrics-addr"), "{e}");
}
