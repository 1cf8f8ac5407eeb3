//! A real local cluster for tests: `cairn dev up` in a temporary directory, processes
//! killed and restarted through their pid files, torn down (and purged) on drop.

#![allow(dead_code)]

use cairn_client::{Client, ClientConfig};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn cairn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .env("CAIRN_LOG", "info")
        .output()
        .expect("run the cairn binary")
}

/// Runs `cairn -c CONF ARGS`; returns (success, stdout + stderr).
pub fn run_as(conf: &str, args: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["-c", conf])
        .args(args)
        .output()
        .expect("run cairn");
    (
        o.status.success(),
        format!("{}{}", text(&o.stdout), text(&o.stderr)),
    )
}

impl Cluster {
    /// A configuration for this cluster that uses the key of `entity` in `keyring`; returns
    /// its path.
    pub fn conf_for(&self, entity: &str, keyring: &std::path::Path) -> String {
        let conf = std::fs::read_to_string(&self.conf)
            .expect("conf")
            .replace(
                "keyring = \"keyring\"",
                &format!("keyring = \"{}\"", keyring.display()),
            )
            .replace("client.admin", entity);
        let file = keyring.file_name().and_then(|n| n.to_str()).unwrap_or("k");
        let path = self.dir.join(format!("{entity}-{file}.toml"));
        std::fs::write(&path, conf).expect("write conf");
        path.display().to_string()
    }

    /// `cairn auth add ENTITY --mon M --osd O --nbd N -o DIR/ENTITY.keyring` as the
    /// administrator; returns the keyring's path.
    pub fn add_key(&self, entity: &str, (mon, osd, nbd): (&str, &str, &str)) -> PathBuf {
        let ring = self.dir.join(format!("{entity}.keyring"));
        let ring_s = ring.display().to_string();
        self.ok(&[
            "auth", "add", entity, "--mon", mon, "--osd", osd, "--nbd", nbd, "-o", &ring_s,
        ]);
        ring
    }

    /// The (emptied) directory of test cluster `name`, nothing started: the caller runs
    /// `dev up` itself. Torn down on drop like any other.
    pub fn at(name: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("cairn-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Cluster {
            conf: dir.join("cairn.toml"),
            dir,
        }
    }

    /// Starts `mons` monitors and `osds` OSDs, no pool, with extra `dev up` arguments.
    pub fn up_with(name: &str, mons: u32, osds: u32, extra: &[&str]) -> Cluster {
        let c = Cluster::at(name);
        c.dev_up_with(mons, osds, extra);
        c
    }

    /// Starts `mons` monitors and `osds` OSDs; no pool.
    pub fn up(name: &str, mons: u32, osds: u32) -> Cluster {
        Cluster::up_with(name, mons, osds, &[])
    }

    /// Starts a cluster with the `default` pool (size min(3, osds)), a 1 GiB volume `disk0`
    /// and the NBD server on a free port serving the pool's volumes.
    pub fn up_with_nbd(name: &str, osds: u32) -> Cluster {
        Cluster::up_with_nbd_sized(name, osds, "2G")
    }

    /// As [`Cluster::up_with_nbd`], with OSDs of `osd_size` (e.g. "256M").
    pub fn up_with_nbd_sized(name: &str, osds: u32, osd_size: &str) -> Cluster {
        let c = Cluster::at(name);
        let d = c.dir.display().to_string();
        let n = osds.to_string();
        c.run_dev_up(&[
            "dev",
            "up",
            "--dir",
            &d,
            "--osds",
            &n,
            "--osd-size",
            osd_size,
            "--nbd",
            "127.0.0.1:0",
            "--volume-size",
            "1G",
            "--timeout",
            "60",
        ]);
        c
    }

    /// Runs `cairn dev up ARGS` for this cluster; it must succeed.
    fn run_dev_up(&self, args: &[&str]) {
        let o = cairn(args);
        assert!(
            o.status.success(),
            "dev up failed:\n{}\n{}\n{}",
            text(&o.stdout),
            text(&o.stderr),
            self.logs()
        );
    }

    /// Where the NBD server of an `up_with_nbd` cluster listens.
    pub fn nbd_addr(&self) -> String {
        let t = std::fs::read_to_string(self.dir.join("dev.toml")).expect("read dev.toml");
        let v: toml::Value = toml::from_str(&t).expect("parse dev.toml");
        v["nbd"]
            .as_str()
            .expect("nbd address in dev.toml")
            .to_string()
    }

    /// `nbd://ADDR/VOLUME` of a volume served by this cluster.
    pub fn nbd_uri(&self, volume: &str) -> String {
        format!("nbd://{}/{volume}", self.nbd_addr())
    }

    fn dev_up(&self, mons: u32, osds: u32) {
        self.dev_up_with(mons, osds, &[]);
    }

    /// `cairn dev up` of this cluster (1 GiB OSDs, no pool) with extra arguments.
    fn dev_up_with(&self, mons: u32, osds: u32, extra: &[&str]) {
        let d = self.dir.display().to_string();
        let (m, n) = (mons.to_string(), osds.to_string());
        let mut args = vec![
            "dev",
            "up",
            "--dir",
            &d,
            "--mons",
            &m,
            "--osds",
            &n,
            "--osd-size",
            "1G",
            "--no-pool",
            "--timeout",
            "60",
        ];
        args.extend_from_slice(extra);
        self.run_dev_up(&args);
    }

    /// Starts whatever process of the cluster is not running (after a kill).
    pub fn restart_missing(&self, mons: u32, osds: u32) {
        self.dev_up(mons, osds);
    }

    /// The tail of every process log (for failure messages).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(rd) = std::fs::read_dir(self.dir.join("log")) {
            for e in rd.flatten() {
                let t = std::fs::read_to_string(e.path()).unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(15).collect();
                out.push_str(&format!("--- {}\n", e.path().display()));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
    }

    /// Runs `cairn -c CONF args...`.
    pub fn cairn(&self, args: &[&str]) -> Output {
        let conf = self.conf.display().to_string();
        let mut all = vec!["-c", conf.as_str()];
        all.extend_from_slice(args);
        cairn(&all)
    }

    /// `cairn pool create NAME --size S --min-size M --pgs N`, which must succeed.
    pub fn pool_create(&self, name: &str, size: u8, min_size: u8, pgs: u32) {
        let (size, min_size, pgs) = (size.to_string(), min_size.to_string(), pgs.to_string());
        self.ok(&[
            "pool",
            "create",
            name,
            "--size",
            &size,
            "--min-size",
            &min_size,
            "--pgs",
            &pgs,
        ]);
    }

    /// `cairn pool create NAME --ec KM --stripe-unit 4K [--min-size M] --pgs N`, which must
    /// succeed.
    pub fn ec_pool_create(&self, name: &str, km: &str, min_size: Option<u8>, pgs: u32) {
        let pgs = pgs.to_string();
        let mut args = vec!["pool", "create", name, "--ec", km, "--stripe-unit", "4K"];
        let min = min_size.map(|m| m.to_string());
        if let Some(m) = &min {
            args.extend(["--min-size", m.as_str()]);
        }
        args.extend(["--pgs", pgs.as_str()]);
        self.ok(&args);
    }

    /// Runs a command that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.cairn(args);
        assert!(
            o.status.success(),
            "cairn {args:?} failed: {}\n{}",
            text(&o.stderr),
            self.logs()
        );
        text(&o.stdout)
    }

    pub fn pid(&self, name: &str) -> i32 {
        let p = self.dir.join("run").join(format!("{name}.pid"));
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .parse()
            .expect("pid")
    }

    /// kill -9 of one process (`mon.0`, `osd.2`), waiting until it is gone.
    pub fn kill9(&self, name: &str) {
        self.signal(name, libc::SIGKILL);
        let pid = self.pid(name);
        let start = Instant::now();
        while alive(pid) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{name} does not die"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts OSD `i` alone (as `dev up` would, with its directory, WAL and monitors), leaving
    /// every other stopped process stopped.
    pub fn start_osd(&self, i: u32) {
        self.start_osd_with(i, &[]);
    }

    /// [`Cluster::start_osd`] with extra environment variables (e.g. `FAILPOINTS`).
    pub fn start_osd_with(&self, i: u32, env: &[(&str, &str)]) {
        use std::os::unix::process::CommandExt;
        let t = std::fs::read_to_string(self.dir.join("dev.toml")).expect("read dev.toml");
        let v: toml::Value = toml::from_str(&t).expect("parse dev.toml");
        let name = format!("osd.{i}");
        let mut args = vec![
            "osd".to_string(),
            "run".into(),
            "--dir".into(),
            self.dir.join(&name).display().to_string(),
            "--data-size".into(),
            v["osd_size"].as_integer().expect("osd_size").to_string(),
        ];
        for m in self.mons() {
            args.push("--mon".into());
            args.push(m);
        }
        if let Some(w) = v.get("wal_dir").and_then(|w| w.as_str()) {
            args.push("--wal".into());
            args.push(format!("{w}/{name}.wal"));
        }
        if let Some(d) = v.get("direct_write_min").and_then(|d| d.as_integer()) {
            args.push("--direct-write-min".into());
            args.push(d.to_string());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log").join(format!("{name}.log")))
            .expect("open the OSD log");
        let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(&args)
            .envs(env.iter().copied())
            .env("CAIRN_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start the OSD");
        let pidfile = self.dir.join("run").join(format!("{name}.pid"));
        std::fs::write(pidfile, child.id().to_string()).expect("write the pid file");
        // Reaped when it exits (killed by the test or by `dev down`), leaving no zombie.
        let mut child = child;
        std::thread::spawn(move || child.wait());
    }

    pub fn signal(&self, name: &str, sig: i32) {
        let pid = self.pid(name);
        unsafe { libc::kill(pid, sig) };
    }

    pub fn mons(&self) -> Vec<String> {
        let t = std::fs::read_to_string(&self.conf).expect("read cairn.toml");
        let v: toml::Value = toml::from_str(&t).expect("parse cairn.toml");
        v["cluster"]["mons"]
            .as_array()
            .expect("mons")
            .iter()
            .map(|m| m.as_str().expect("mon addr").to_string())
            .collect()
    }

    /// The credentials of the cluster's administrator (`client.admin` from the keyring
    /// `dev up` wrote), or none for a cluster without authentication.
    pub fn auth(&self) -> cairn_transport::Auth {
        let path = self.dir.join("keyring");
        if !path.exists() {
            return std::sync::Arc::new(cairn_transport::NoAuth);
        }
        let key = cairn_auth::Keyring::load_key(&path, &cairn_auth::Entity::admin())
            .expect("the admin key");
        cairn_monclient::auth::EntityKey::new(key.entity, key.secret, self.mons())
    }

    /// Creates the key of OSD `i` (an OSD this test starts by hand) in `osd.I/keyring` and
    /// registers it with the monitors (`cairn auth import`); returns the OSD's keyring.
    pub fn osd_keyring(&self, i: u32) -> PathBuf {
        let entry = cairn_auth::KeyEntry {
            entity: cairn_auth::Entity::osd(i),
            secret: cairn_auth::Secret::generate(),
            caps: None,
        };
        let own = self.dir.join(format!("osd.{i}")).join("keyring");
        std::fs::create_dir_all(own.parent().expect("dir")).expect("create osd dir");
        cairn_auth::Keyring {
            keys: vec![entry.clone()],
        }
        .save(&own)
        .expect("save the OSD keyring");
        self.ok(&["auth", "import", &own.display().to_string()]);
        own
    }

    /// Credentials to connect to an OSD as `entity`, as a monitor would grant them: a ticket
    /// with `caps` sealed with the current service key (derived from the monitors' key), so
    /// a test can speak as any OSD or client. `None` for a cluster without authentication.
    pub fn ticket_as(
        &self,
        entity: cairn_auth::Entity,
        caps: cairn_auth::Caps,
    ) -> cairn_transport::Credentials {
        let path = self.dir.join("mon.0").join("keyring");
        if !path.exists() {
            return cairn_transport::Credentials::None;
        }
        let ring = cairn_auth::Keyring::load(&path).expect("the monitor keyring");
        let mon = ring
            .keys
            .iter()
            .find(|k| k.entity.kind() == cairn_auth::EntityKind::Mon)
            .expect("the monitors' key");
        let now = cairn_auth::unix_now();
        let id = cairn_auth::service::service_key_id(now);
        let svc = cairn_auth::service::derive_service_key(&mon.secret, id);
        let m = cairn_auth::service::mint(&svc, &entity, &caps, now, 600);
        cairn_transport::Credentials::Ticket {
            entity,
            ticket: m.ticket,
            session: m.session,
        }
    }

    /// Client settings for this cluster, as its administrator.
    pub fn client_config(&self) -> ClientConfig {
        let mut cfg = ClientConfig::new(self.mons());
        cfg.auth = self.auth();
        cfg
    }

    pub async fn client(&self) -> Client {
        let mut cfg = self.client_config();
        cfg.op_timeout = Duration::from_secs(60);
        Client::connect(cfg).await.expect("connect a client")
    }

    /// `cairn status --json` parsed.
    pub fn status(&self) -> serde_json::Value {
        self.status_with(&[])
    }

    /// Polls `cairn status --json` until `f` holds, `within` at most; returns that status.
    pub fn wait_status(
        &self,
        what: &str,
        within: Duration,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let s = self.status();
            if f(&s) {
                return s;
            }
            assert!(
                start.elapsed() < within,
                "status never showed {what} within {within:?}: {s:#}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `cairn status --json ARGS` parsed.
    pub fn status_with(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["status", "--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&self.ok(&all)).expect("status json")
    }
}

/// Waits until `osd` is marked down (`want_up` false) or up in the map (30 s at most).
pub async fn wait_osd(client: &Client, osd: u32, want_up: bool) {
    let start = Instant::now();
    loop {
        let map = client.mon().get_map().await.expect("map");
        if map.osds.get(&osd).is_some_and(|o| o.up == want_up) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "osd.{osd} not marked {} within 30 s",
            if want_up { "up" } else { "down" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A 2-thread runtime for a test's clients.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    !s.rsplit(')')
        .next()
        .is_some_and(|r| r.trim_start().starts_with('Z'))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let dir = self.dir.display().to_string();
        if std::env::var_os("CAIRN_TEST_KEEP").is_none() {
            let _ = cairn(&["dev", "down", "--dir", &dir, "--purge"]);
        }
    }
}
