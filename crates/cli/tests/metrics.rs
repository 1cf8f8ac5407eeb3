//! Every daemon's Prometheus endpoint, scraped under load by this test and checked with
//! Prometheus's own linter (`promtool check metrics`): the counters grow with the ops the test
//! issued, exactly (client writes counted once by their primaries, applied once per copy).

mod common;

use common::cluster::{runtime, text, Cluster};
use common::tools::{tool, tool_ok};
use std::collections::BTreeMap;
use std::io::{Read, Write};

/// The metrics address of every daemon of a dev cluster (from its `dev.toml`).
fn endpoints(c: &Cluster) -> BTreeMap<String, String> {
    let t = std::fs::read_to_string(c.dir.join("dev.toml")).expect("read dev.toml");
    let v: toml::Value = toml::from_str(&t).expect("parse dev.toml");
    let m = v
        .get("metrics")
        .and_then(|m| m.as_table())
        .expect("metrics in dev.toml");
    m.iter()
        .map(|(k, v)| (k.clone(), v.as_str().expect("address").to_string()))
        .collect()
}

/// The raw HTTP answer to `request` sent to `addr`.
fn http(addr: &str, request: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(request).expect("send");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read the answer");
    String::from_utf8(out).expect("utf-8 answer")
}

/// Scrapes `addr`, checks the page with `promtool check metrics`, returns its body.
fn scrape(c: &Cluster, addr: &str) -> String {
    let answer = http(addr, b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let file = c.dir.join("scrape.txt");
    std::fs::write(&file, body).expect("write the scrape");
    let check = format!("promtool check metrics < {}", file.display());
    let o = tool(30, "sh", &["-c", &check]);
    assert!(
        o.status.success(),
        "promtool refused the metrics of {addr}:\n{}{}\n{body}",
        text(&o.stdout),
        text(&o.stderr)
    );
    body.to_string()
}

/// The sum of the samples of `name` whose labels include every one of `labels`.
fn sum(page: &str, name: &str, labels: &[&str]) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && labels.iter().all(|want| rest.contains(want)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

fn sum_over(pages: &[String], name: &str, labels: &[&str]) -> f64 {
    pages.iter().map(|p| sum(p, name, labels)).sum()
}

/// The `--memory-target` a running OSD was started with (its command line).
fn memory_target_arg(pid: i32) -> u64 {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let at = args
        .iter()
        .position(|a| *a == b"--memory-target")
        .expect("the OSD was given --memory-target");
    text(args[at + 1]).trim().parse().expect("a byte count")
}

#[test]
fn every_daemon_serves_metrics_that_count_exactly_the_ops_issued() {
    let c = Cluster::up_with_nbd("metrics", 3);
    let eps = endpoints(&c);
    for want in ["mon.0", "osd.0", "osd.1", "osd.2", "nbd"] {
        assert!(
            eps.contains_key(want),
            "no metrics address for {want}: {eps:?}"
        );
    }
    let osds: Vec<&String> = ["osd.0", "osd.1", "osd.2"]
        .iter()
        .map(|o| &eps[*o])
        .collect();
    c.pool_create("m", 3, 2, 16);
    c.ok(&["pool", "create", "e", "--ec", "2+1", "--pgs", "4"]);
    let rt = runtime();
    let client = rt
        .block_on(cairn_client::Client::connect(c.client_config()))
        .expect("client");
    let pool = client.pool_id("m").expect("pool m");
    let pool_label = format!("pool=\"{pool}\"");
    let before: Vec<String> = osds.iter().map(|a| scrape(&c, a)).collect();
    assert_eq!(
        sum_over(&before, "cairn_osd_writes_applied_total", &[&pool_label]),
        0.0
    );

    // 300 writes of 4 KiB and 100 reads, scraped while they run.
    const WRITES: usize = 300;
    let data = vec![0x5au8; 4096];
    let mut during = Vec::new();
    rt.block_on(async {
        for i in 0..WRITES {
            let name = format!("obj-{}", i % 50);
            client
                .write_full(pool, name.as_bytes(), &data)
                .await
                .expect("write");
            if i == WRITES / 2 {
                during = osds.iter().map(|a| scrape(&c, a)).collect();
            }
        }
        for i in 0..100 {
            let name = format!("obj-{}", i % 50);
            let got = client.read(pool, name.as_bytes(), 0, 4096).await;
            assert_eq!(got.expect("read"), data);
        }
    });
    let after: Vec<String> = osds.iter().map(|a| scrape(&c, a)).collect();
    let w = WRITES as f64;
    let writes = |pages: &[String]| {
        sum_over(
            pages,
            "cairn_osd_client_ops_total",
            &[&pool_label, "op=\"write_full\""],
        )
    };
    let mid = writes(&during);
    assert!(
        mid > 0.0 && mid < w,
        "half-way: {mid} of {w} writes counted"
    );
    assert_eq!(
        writes(&after),
        w,
        "client writes counted by their primaries"
    );
    let applied = |role: &str| {
        let role = format!("role=\"{role}\"");
        sum_over(
            &after,
            "cairn_osd_writes_applied_total",
            &[&pool_label, &role],
        )
    };
    assert_eq!(applied("primary"), w);
    assert_eq!(
        applied("replica"),
        2.0 * w,
        "each write applied by its two replicas"
    );
    let latency_count = sum_over(
        &after,
        "cairn_osd_op_latency_seconds_count",
        &[&pool_label, "op=\"write_full\""],
    );
    assert_eq!(latency_count, w);
    let reads = sum_over(
        &after,
        "cairn_osd_client_ops_total",
        &[&pool_label, "op=\"read\""],
    );
    assert_eq!(reads, 100.0);
    let bytes_in = sum_over(
        &after,
        "cairn_osd_client_bytes_total",
        &[&pool_label, "direction=\"in\""],
    );
    assert_eq!(bytes_in, w * 4096.0);
    let bytes_out = sum_over(
        &after,
        "cairn_osd_client_bytes_total",
        &[&pool_label, "direction=\"out\""],
    );
    assert_eq!(bytes_out, 100.0 * 4096.0);
    // Every OSD committed to its store (the commit latency histogram saw them), and reports
    // the space it uses.
    for page in &after {
        assert!(sum(page, "cairn_osd_commit_latency_seconds_count", &[]) > 0.0);
        assert!(sum(page, "cairn_osd_used_bytes", &[]) > 0.0);
        assert!(sum(page, "cairn_osd_capacity_bytes", &[]) > 0.0);
    }
    // Each OSD lets as much data wait for its flusher as its memory target gives it.
    for (i, page) in after.iter().enumerate() {
        let target = memory_target_arg(c.pid(&format!("osd.{i}")));
        assert_eq!(
            sum(page, "cairn_osd_flusher_pending_limit_bytes", &[]),
            cairn_osd::pending_share(target) as f64,
            "osd.{i}, memory target {target}"
        );
    }

    // The monitor: one leader, every OSD up and in, the map it holds.
    let mon = scrape(&c, &eps["mon.0"]);
    assert_eq!(sum(&mon, "cairn_mon_leader", &[]), 1.0);
    assert_eq!(sum(&mon, "cairn_mon_osd_up", &[]), 3.0);
    assert_eq!(sum(&mon, "cairn_mon_osd_in", &[]), 3.0);
    let epoch = c.status()["epoch"].as_u64().expect("epoch in status");
    assert!(sum(&mon, "cairn_mon_map_epoch", &[]) >= epoch as f64 - 1.0);
    assert!(sum(&mon, "cairn_mon_proposals_total", &["result=\"applied\""]) > 0.0);
    assert!(
        mon.contains("cairn_mon_pool_info{pool=") && mon.contains("name=\"m\""),
        "{mon}"
    );
    // The EC pool's 4 PGs have every shard; the replicated pools have no such series.
    let ec = format!("pool=\"{}\"", client.pool_id("e").expect("pool e"));
    assert_eq!(
        sum(&mon, "cairn_mon_ec_pgs", &[&ec, "missing=\"0\""]),
        4.0,
        "{mon}"
    );
    assert_eq!(sum(&mon, "cairn_mon_ec_pgs", &[&ec]), 4.0, "{mon}");
    assert_eq!(sum(&mon, "cairn_mon_ec_pgs", &[&pool_label]), 0.0, "{mon}");

    // The NBD server: 1 MiB of random bytes written through it, counted per export.
    let file = c.dir.join("one-mib");
    let bytes: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &bytes).expect("write the file");
    tool_ok(
        &c,
        60,
        "nbdcopy",
        &[&file.display().to_string(), &c.nbd_uri("disk0")],
    );
    let nbd = scrape(&c, &eps["nbd"]);
    let written = sum(
        &nbd,
        "cairn_nbd_export_bytes_total",
        &["export=\"disk0\"", "direction=\"in\""],
    );
    assert_eq!(written, (1u64 << 20) as f64, "{nbd}");
    assert!(
        sum(
            &nbd,
            "cairn_nbd_requests_total",
            &["export=\"disk0\"", "op=\"write\""]
        ) > 0.0
    );
    assert_eq!(sum(&nbd, "cairn_nbd_errors_total", &[]), 0.0);

    // Anything but a GET of a page is refused cleanly; the endpoint goes on serving.
    let osd0 = osds[0].as_str();
    assert!(http(osd0, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(http(osd0, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    assert!(http(osd0, b"\x16\x03\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Long: ".to_vec();
    huge.resize(9 << 10, b'a');
    assert!(http(osd0, &huge).starts_with("HTTP/1.1 431"));
    scrape(&c, osd0);
}

/// An OSD stopped (SIGSTOP) for 2 s under writes: the primaries whose writes wait for it
/// report slow writes naming it, in their logs, in `cairn status` (HEALTH_WARN) and in their
/// metrics; every write still completes.
#[test]
fn an_osd_stopped_for_two_seconds_is_named_by_slow_write_reports() {
    let c = Cluster::up("slowop", 1, 3);
    c.pool_create("s", 3, 2, 16);
    let rt = runtime();
    let client = rt
        .block_on(cairn_client::Client::connect(c.client_config()))
        .expect("client");
    let pool = client.pool_id("s").expect("pool s");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let (client, stop) = (client.clone(), stop.clone());
            rt.spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("w{t}-{}", n % 16);
                    client
                        .write_full(pool, name.as_bytes(), &n.to_le_bytes())
                        .await
                        .expect("a write failed");
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_secs(1));
    c.signal("osd.2", libc::SIGSTOP);
    std::thread::sleep(std::time::Duration::from_secs(2));
    c.signal("osd.2", libc::SIGCONT);
    std::thread::sleep(std::time::Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let done: u64 = writers
        .into_iter()
        .map(|w| rt.block_on(w).expect("writer"))
        .sum();
    assert!(done > 0);

    let status = c.status();
    let slow = status["slow_ops"].as_array().expect("slow_ops in status");
    let named = slow
        .iter()
        .find(|s| s["waiting_for"] == 2 && s["osd"] != 2)
        .unwrap_or_else(|| panic!("no slow writes waiting for osd.2: {status:#}"));
    assert!(
        named["longest_ms"].as_u64().expect("longest") >= 1000,
        "{named}"
    );
    assert_eq!(status["health"], "HEALTH_WARN", "{status:#}");
    let text = c.ok(&["status"]);
    assert!(
        text.contains("slow writes") && text.contains("waiting for osd.2"),
        "{text}"
    );
    let reporter = named["osd"].as_u64().expect("osd");
    let log = std::fs::read_to_string(c.dir.join("log").join(format!("osd.{reporter}.log")))
        .expect("read the OSD log");
    assert!(
        log.lines()
            .any(|l| l.contains("slow write") && l.contains("waiting for osd.2")),
        "osd.{reporter}'s log does not name osd.2"
    );
    let page = scrape(&c, &endpoints(&c)[&format!("osd.{reporter}")]);
    assert!(sum(&page, "cairn_osd_slow_ops_total", &[]) >= 1.0, "{page}");
}

/// The Grafana dashboard and the sample scrape configuration in `deploy/prometheus` are valid
/// for Prometheus (every panel's query parses, checked by `promtool check rules`), and every
/// metric the dashboard queries is one a daemon serves.
#[test]
fn the_grafana_dashboard_queries_parse_and_name_served_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prometheus");
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana-dashboard.json")).expect("read dashboard"),
    )
    .expect("the dashboard is JSON");
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("expr").to_string())
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let c = Cluster::up_with_nbd("metrics-dash", 3);
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:q{i}\n        expr: '{}'\n",
            e.replace('\'', "''")
        ));
    }
    let file = c.dir.join("rules.yml");
    std::fs::write(&file, rules).expect("write rules");
    tool_ok(
        &c,
        30,
        "promtool",
        &["check", "rules", &file.display().to_string()],
    );
    // The multi-host configuration, with the token file it names beside it (as deployed).
    let deploy = c.dir.join("deploy");
    std::fs::create_dir_all(&deploy).expect("mkdir");
    std::fs::copy(root.join("prometheus.yml"), deploy.join("prometheus.yml")).expect("copy");
    std::fs::write(deploy.join("cairn-metrics.token"), "0123456789abcdef0123\n").expect("token");
    let conf = deploy.join("prometheus.yml").display().to_string();
    tool_ok(&c, 30, "promtool", &["check", "config", &conf]);
    let dev_conf = c.dir.join("prometheus.yml").display().to_string();
    tool_ok(&c, 30, "promtool", &["check", "config", &dev_conf]);

    // Every metric named in the dashboard is on some daemon's page.
    let file = c.dir.join("data");
    let bytes: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(40503) >> 7) as u8)
        .collect();
    std::fs::write(&file, bytes).expect("write the file");
    tool_ok(
        &c,
        60,
        "nbdcopy",
        &[&file.display().to_string(), &c.nbd_uri("disk0")],
    );
    let pages: Vec<String> = endpoints(&c).values().map(|a| scrape(&c, a)).collect();
    let served = |name: &str| {
        pages.iter().any(|p| {
            p.lines().any(|l| {
                !l.starts_with('#')
                    && l.starts_with(name)
                    && l[name.len()..].starts_with(['{', ' '])
            })
        })
    };
    for e in &exprs {
        for name in e
            .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
            .filter(|w| w.starts_with("cairn_"))
        {
            assert!(
                served(name),
                "the dashboard queries {name}, which no daemon serves"
            );
        }
    }
}

/// `cairn osd perf` and `cairn top` under a steady load of object writes and NBD writes: the
/// OSDs' commit and apply latencies and rates, the pools' rates, and the served volume.
#[test]
fn osd_perf_and_top_show_the_load_while_it_runs() {
    let c = Cluster::up_with_nbd("perf-top", 3);
    let rt = runtime();
    let client = rt
        .block_on(cairn_client::Client::connect(c.client_config()))
        .expect("client");
    let pool = client.pool_id("default").expect("pool");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (cl, st) = (client.clone(), stop.clone());
    let writer = rt.spawn(async move {
        let mut n = 0u64;
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            let name = format!("perf-{}", n % 32);
            cl.write_full(pool, name.as_bytes(), &[7u8; 4096])
                .await
                .expect("write");
            n += 1;
        }
        n
    });
    // An NBD client writing too (one connection for 12 s), so that the volume has a holder
    // reporting its rates with each lease renewal.
    let uri = c.nbd_uri("disk0");
    let nbd = std::thread::spawn(move || {
        let uri = format!("--uri={uri}");
        let args = [
            "--name=top",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=4",
            "--size=64M",
            "--time_based",
            "--runtime=12",
        ];
        tool(80, "fio", &args)
    });
    std::thread::sleep(std::time::Duration::from_secs(1));

    let perf: serde_json::Value =
        serde_json::from_str(&c.ok(&["osd", "perf", "--json", "--interval", "1", "--count", "1"]))
            .expect("osd perf JSON");
    let osds = perf["osds"].as_array().expect("osds");
    assert_eq!(osds.len(), 3, "{perf}");
    let writes: f64 = osds
        .iter()
        .map(|o| o["write_ops"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(writes > 10.0, "{perf}");
    assert!(
        osds.iter()
            .all(|o| o["commit_lat_ms"].as_f64().is_some_and(|l| l > 0.0)),
        "every OSD committed: {perf}"
    );
    assert!(osds
        .iter()
        .any(|o| o["apply_lat_ms"].as_f64().is_some_and(|l| l > 0.0)));
    let perf_text = c.ok(&["osd", "perf", "--interval", "0.5", "--count", "1"]);
    assert!(
        perf_text.contains("COMMIT_LAT(ms)") && perf_text.contains("osd.2"),
        "{perf_text}"
    );

    let top: serde_json::Value =
        serde_json::from_str(&c.ok(&["top", "--json", "--interval", "1", "--count", "1"]))
            .expect("top JSON");
    let default = top["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pool"] == "default"))
        .unwrap_or_else(|| panic!("no pool default: {top}"));
    assert!(
        default["rates"]["write_ops"].as_f64().expect("write_ops") > 10.0,
        "{top}"
    );
    // The volume being written, with the rates its NBD server reports (every few seconds).
    let start = std::time::Instant::now();
    loop {
        let top: serde_json::Value =
            serde_json::from_str(&c.ok(&["top", "--json", "--interval", "0.5", "--count", "1"]))
                .expect("top JSON");
        let busy = top["volumes"].as_array().and_then(|v| {
            v.iter()
                .find(|v| v["volume"] == "disk0" && v["write_ops"].as_u64().unwrap_or(0) > 0)
                .cloned()
        });
        if let Some(v) = busy {
            assert_eq!(v["holders"], 1, "{v}");
            // fio writes all over the first 64 MiB: its objects are in the allocation map.
            let allocated = v["allocated_bytes"].as_u64().expect("an allocation map");
            assert!((1 << 20..=1 << 30).contains(&allocated), "{v}");
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "disk0 never showed its writes: {top}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(rt.block_on(writer).expect("writer") > 0);
    let fio = nbd.join().expect("nbd writer");
    assert!(fio.status.success(), "fio: {}", text(&fio.stderr));
}

/// The result of a Prometheus instant query, as a number (the first series' value).
fn prom_query(port: u16, query: &str) -> Option<f64> {
    let q: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let req =
        format!("GET /api/v1/query?query={q} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    // Refused until the server listens: no answer yet.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    s.write_all(req.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (_, body) = answer.split_once("\r\n\r\n")?;
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// A real Prometheus server (Debian's) scrapes a dev cluster with the configuration `dev up`
/// wrote: every daemon is up for it, and queries over Cairn's metrics answer what the cluster
/// is.
#[test]
fn a_prometheus_server_scrapes_every_daemon_with_the_dev_configuration() {
    let c = Cluster::up_with_nbd("prometheus", 3);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let log = std::fs::File::create(c.dir.join("log").join("prometheus.log")).expect("log");
    let mut prom = std::process::Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            c.dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            c.dir.join("prometheus-data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start prometheus (scripts/deps.sh test installs it)");
    let start = std::time::Instant::now();
    let targets = endpoints(&c).len() as f64;
    loop {
        if prom_query(port, "sum(up)") == Some(targets) {
            break;
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = prom.kill();
            let log = std::fs::read_to_string(c.dir.join("log").join("prometheus.log"));
            panic!(
                "prometheus never scraped every daemon: {:?}\n{log:?}",
                prom_query(port, "sum(up)")
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let osds_up = prom_query(port, "sum(cairn_mon_osd_up)");
    let leaders = prom_query(port, "sum(cairn_mon_leader)");
    let held = prom_query(port, "sum(cairn_osd_pgs_held)");
    let _ = prom.kill();
    let _ = prom.wait();
    assert_eq!(osds_up, Some(3.0));
    assert_eq!(leaders, Some(1.0));
    // 64 PGs of 3 copies.
    assert_eq!(held, Some(192.0));
}
