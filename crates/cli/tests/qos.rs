//! Per-volume QoS through a real client (fio's nbd engine) against a real cluster: a limited
//! volume runs at its limit (within 5%) under QD32, a changed limit applies while the client
//! runs, and `vol info` reports the served volume's current rates.

mod common;

use common::cluster::Cluster;
use common::tools::{system_path, tool_ok};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// fio's nbd engine against `uri` for `secs` (after 3 s of ramp), `rw` `bs` at `qd`: returns
/// (IOPS, bytes/s) of the measured part.
fn fio_rate(c: &Cluster, uri: &str, rw: &str, bs: &str, qd: u32, secs: u32) -> (f64, f64) {
    let out = tool_ok(
        c,
        secs + 60,
        "fio",
        &[
            "--name=qos",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            &format!("--iodepth={qd}"),
            "--size=256M",
            "--time_based",
            &format!("--runtime={secs}"),
            "--ramp_time=3",
            "--output-format=json",
        ],
    );
    let v: serde_json::Value =
        serde_json::from_str(&out[out.find('{').unwrap_or(0)..]).expect("fio json");
    let j = &v["jobs"][0]["read"];
    (
        j["iops"].as_f64().expect("iops"),
        j["bw_bytes"].as_f64().expect("bw"),
    )
}

/// A background fio reading at QD32 for `secs`.
fn background_reader(uri: &str, secs: u32) -> Child {
    Command::new("timeout")
        .args(["-k", "5", &(secs + 30).to_string(), "fio"])
        .args([
            "--name=bg",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randread",
            "--bs=4k",
            "--iodepth=32",
            "--size=256M",
            "--time_based",
            &format!("--runtime={secs}"),
        ])
        .env("PATH", system_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run fio")
}

fn read_rate(c: &Cluster, name: &str) -> (u64, u64) {
    let v: serde_json::Value =
        serde_json::from_str(&c.ok(&["vol", "info", name, "--json"])).expect("json");
    (
        v["open_by"].as_u64().expect("open_by"),
        v["rates"]["read_ops"].as_u64().expect("read_ops"),
    )
}

fn assert_near(what: &str, got: f64, want: f64, tolerance: f64) {
    assert!(
        (got - want).abs() <= want * tolerance,
        "{what}: {got:.0}, limit {want:.0} (more than {:.0}% off)",
        tolerance * 100.0
    );
}

#[test]
fn a_limited_volume_runs_at_its_limit_and_limits_change_live() {
    let c = Cluster::up_with_nbd("qos", 3);
    c.ok(&["vol", "create", "q", "--size", "256M"]);
    let uri = c.nbd_uri("q");
    tool_ok(
        &c,
        120,
        "fio",
        &[
            "--name=fill",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=write",
            "--bs=1M",
            "--iodepth=8",
            "--size=256M",
        ],
    );
    let (free, _) = fio_rate(&c, &uri, "randread", "4k", 32, 4);
    assert!(
        free > 3000.0,
        "unlimited, the volume reads only {free:.0} IOPS"
    );

    c.ok(&["vol", "qos", "set", "q", "--iops", "2000"]);
    let (iops, _) = fio_rate(&c, &uri, "randread", "4k", 32, 8);
    assert_near("IOPS limited to 2000", iops, 2000.0, 0.05);

    c.ok(&["vol", "qos", "set", "q", "--bps", "8M"]);
    let (_, bps) = fio_rate(&c, &uri, "read", "1M", 8, 8);
    assert_near("bytes/s limited to 8 MiB", bps, 8.0 * 1048576.0, 0.05);

    // While a client runs: the rates show in `vol info`, a new limit applies at once.
    c.ok(&["vol", "qos", "set", "q", "--iops", "1500"]);
    let mut bg = background_reader(&uri, 32);
    std::thread::sleep(Duration::from_secs(6));
    let (holders, rate) = read_rate(&c, "q");
    assert_eq!(holders, 1, "vol info does not see the server");
    assert_near("reported read rate at 1500", rate as f64, 1500.0, 0.15);
    c.ok(&["vol", "qos", "set", "q", "--iops", "600"]);
    std::thread::sleep(Duration::from_secs(5));
    let (_, rate) = read_rate(&c, "q");
    assert_near("reported read rate at 600", rate as f64, 600.0, 0.15);
    // Without limits of its own, the pool's defaults hold it (applied at the next renewal).
    c.ok(&["vol", "qos", "set", "--pool-default", "--iops", "900"]);
    c.ok(&["vol", "qos", "clear", "q"]);
    std::thread::sleep(Duration::from_secs(6));
    let (_, rate) = read_rate(&c, "q");
    assert_near(
        "reported read rate at the pool's 900",
        rate as f64,
        900.0,
        0.15,
    );
    assert!(c.ok(&["vol", "info", "q"]).contains("(the pool's default)"));
    c.ok(&["vol", "qos", "clear", "--pool-default"]);
    std::thread::sleep(Duration::from_secs(6));
    let (_, rate) = read_rate(&c, "q");
    assert!(rate > 2000, "cleared limits still hold the rate at {rate}");
    // `timeout` passes SIGTERM on to fio.
    let _ = Command::new("kill")
        .args(["-TERM", &bg.id().to_string()])
        .status();
    let _ = bg.wait();
}
