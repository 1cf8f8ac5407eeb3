//! The web dashboard in a real browser: Debian's Chromium, headless, driven over WebDriver by
//! chromedriver, against a `cairn dev up` cluster. The page asks for a sign-in (a wrong key is
//! refused), then shows what `cairn status --json` says, and an OSD killed -9 shows as down
//! within its grace. Screenshots are kept in target/test-artefacts/.

mod common;

use common::cluster::{text, Cluster};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free port on loopback.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// One HTTP/1.1 request with a JSON body to chromedriver; the JSON answer's `value`.
fn wd(port: u16, method: &str, path: &str, body: Option<Value>) -> Value {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect chromedriver");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    // chromedriver may keep the connection open: read the head, then Content-Length bytes.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).expect("read the answer");
        assert!(n > 0, "chromedriver closed without an answer");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("a Content-Length from chromedriver");
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).expect("read the answer");
        assert!(n > 0, "chromedriver closed mid-answer");
        buf.extend_from_slice(&chunk[..n]);
    }
    let v: Value = serde_json::from_slice(&buf[head_end..head_end + len]).expect("JSON");
    v["value"].clone()
}

struct Browser {
    port: u16,
    session: String,
    driver: Child,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            wd(
                self.port,
                "DELETE",
                &format!("/session/{}", self.session),
                None,
            )
        });
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium; `None` (with the reason printed) where
    /// neither is installed.
    fn start(profile: &std::path::Path) -> Option<Browser> {
        for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            if !std::path::Path::new(bin).exists() {
                eprintln!("SKIPPED: {bin} is not installed (scripts/deps.sh test installs it)");
                return None;
            }
        }
        let port = free_port();
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The machine has no network beyond loopback: every background connection is off.
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1800",
            &format!("--user-data-dir={}", profile.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}}}});
        let mut b = Browser {
            port,
            session: String::new(),
            driver,
        };
        let v = wd(port, "POST", "/session", Some(caps));
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {v}"))
            .to_string();
        Some(b)
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        wd(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            body,
        )
    }

    fn go(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    fn find(&self, css: &str) -> Option<String> {
        let v = self.call(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        v.as_object()?
            .iter()
            .find(|(k, _)| k.starts_with("element-"))
            .and_then(|(_, id)| id.as_str().map(String::from))
    }

    fn text(&self, css: &str) -> Option<String> {
        let id = self.find(css)?;
        self.call("GET", &format!("/element/{id}/text"), None)
            .as_str()
            .map(String::from)
    }

    fn type_into(&self, css: &str, value: &str) {
        let id = self
            .find(css)
            .unwrap_or_else(|| panic!("no {css} on the page"));
        self.call("POST", &format!("/element/{id}/clear"), Some(json!({})));
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": value })),
        );
    }

    fn click(&self, css: &str) {
        let id = self
            .find(css)
            .unwrap_or_else(|| panic!("no {css} on the page"));
        self.call("POST", &format!("/element/{id}/click"), Some(json!({})));
    }

    /// Waits until `css`'s text satisfies `ok` (returns it), or fails after `secs`.
    fn wait_text(&self, css: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            if let Some(t) = self.text(css) {
                if ok(&t) {
                    return t;
                }
            }
            if start.elapsed() > Duration::from_secs(secs) {
                panic!("{css} never showed what was expected: {:?}", self.text(css));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Saves a screenshot under target/test-artefacts/.
    fn screenshot(&self, name: &str) {
        let v = self.call("GET", "/screenshot", None);
        let png = base64_decode(v.as_str().expect("a screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("../test-artefacts");
        std::fs::create_dir_all(&dir).expect("artefacts dir");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("save the screenshot");
    }
}

/// Standard base64 (screenshots): no dependency for one test.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The admin's key (hex) from a dev cluster's keyring.
fn admin_key(c: &Cluster) -> String {
    let ring = std::fs::read_to_string(c.dir.join("keyring")).expect("read the keyring");
    let v: toml::Value = toml::from_str(&ring).expect("parse the keyring");
    let keys = v
        .get("key")
        .and_then(|k| k.as_array())
        .expect("[[key]] entries");
    keys.iter()
        .find(|k| k.get("entity").and_then(|e| e.as_str()) == Some("client.admin"))
        .and_then(|k| k.get("secret")?.as_str())
        .expect("client.admin's secret in the keyring")
        .to_string()
}

#[test]
fn the_dashboard_shows_the_cluster_as_status_does_and_a_killed_osd_goes_down() {
    let c = Cluster::up_with_nbd("dashboard", 3);
    c.ok(&["pool", "create", "e", "--ec", "2+1", "--pgs", "8"]);
    let profile = c.dir.join("chromium-profile");
    let Some(b) = Browser::start(&profile) else {
        return;
    };
    let port = free_port();
    let mut dash = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "-c",
            &c.conf.display().to_string(),
            "dashboard",
            "--refresh",
            "1",
        ])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the dashboard");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the dashboard did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let url = format!("http://127.0.0.1:{port}/");

    // Signed out: the login page; a wrong key is refused and says so.
    b.go(&url);
    b.wait_text("h1", 20, |t| t.contains("Cairn dashboard"));
    b.type_into("#key", &"00".repeat(32));
    b.click("#signin");
    let refused = b.wait_text("#login-error", 20, |t| !t.is_empty());
    assert!(refused.contains("did not accept"), "{refused}");
    b.type_into("#key", &admin_key(&c));
    b.click("#signin");
    b.wait_text("#health", 30, |t| t.starts_with("HEALTH_"));

    // The numbers are `cairn status --json`'s.
    let status = c.status();
    let same = |css: &str, want: &Value| {
        let want = want.to_string().trim_matches('"').to_string();
        b.wait_text(css, 20, |t| t == want);
    };
    same("#health", &status["health"]);
    same("#osds-total", &status["osds"]["total"]);
    same("#osds-up", &status["osds"]["up"]);
    same("#osds-in", &status["osds"]["in"]);
    same("#pgs-total", &status["pgs"]["total"]);
    same("#pgs-clean", &status["pgs"]["active_clean"]);
    b.wait_text("#volumes tbody", 20, |t| t.contains("default/disk0"));
    b.wait_text("#pools tbody", 20, |t| t.contains("default"));
    // The EC pool with its profile and its PGs by missing shards.
    let ec_row = "tr[data-pool=\"e\"]";
    b.wait_text(ec_row, 20, |t| {
        t.contains("ec 2+1, unit 16 KiB") && t.contains("8 with every shard")
    });
    // One host holds the dev cluster's three OSDs, all up.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let host_row = format!("tr[data-host=\"{}\"]", host.trim());
    let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let host_shows = |want: String| move |t: &str| words(t).starts_with(&want);
    b.wait_text(&host_row, 20, host_shows(format!("{} 3 3 3", host.trim())));
    b.screenshot("dashboard-healthy");

    // An OSD killed -9: down on the page within its grace (the monitors' OSD grace) and the
    // few seconds of a refresh.
    c.kill9("osd.1");
    let killed = Instant::now();
    b.wait_text("tr[data-osd=\"1\"]", 60, |t| t.contains("down"));
    let took = killed.elapsed();
    b.wait_text(&host_row, 20, host_shows(format!("{} 3 2", host.trim())));
    b.wait_text("#health", 20, |t| t != "HEALTH_OK");
    // Every PG of the 2+1 pool has a shard on osd.1.
    b.wait_text(ec_row, 20, |t| {
        t.contains("0 with every shard, 8 missing 1")
    });
    b.screenshot("dashboard-osd-down");
    // The monitors' grace is 4 s; then a refresh (status, usage reports) and a poll.
    assert!(
        took < Duration::from_secs(20),
        "osd.1 showed as down only after {took:?}"
    );
    let status = c.status();
    assert_eq!(status["osds"]["up"], 2, "{status}");
    same("#osds-up", &status["osds"]["up"]);

    // Signed out again: the data is refused.
    b.go(&format!("{url}logout"));
    b.wait_text("h1", 20, |t| t.contains("Cairn dashboard"));
    let api = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
        s.write_all(b"GET /api/cluster HTTP/1.1\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    });
    assert!(api.expect("ask the API").starts_with("HTTP/1.1 401"));
    let _ = dash.kill();
    let out = dash.wait_with_output().expect("dashboard output");
    let log = text(&out.stderr);
    assert!(log.contains("dashboard on http://"), "{log}");
}
