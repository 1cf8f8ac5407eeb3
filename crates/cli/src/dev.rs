//! `cairn dev up|down`: a whole local cluster (monitors + OSDs as separate processes) in one
//! directory, for development, tests and benchmarks.
//!
//! Layout of DIR: `cairn.toml` (what commands read), `dev.toml` (ports and counts, so `up`
//! restarts the same cluster), `mon.N/` and `osd.N/` (data), `log/` (one log per process),
//! `run/` (pid files). WALs go to `/dev/shm/cairn-<fsid>/` when /dev/shm exists (standing in for
//! NVM): they do not survive a reboot of the machine, so neither does the cluster's data.

use crate::admin::{block_on, pg_counts};
use crate::conf::{hex16, ClusterConf, Conf};
use anyhow::{bail, Context, Result};
use cairn_map::{Durability, MapChange};
use cairn_monclient::MonClient;
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where `cairn dev up` puts the cluster unless told otherwise.
pub const DEFAULT_DIR: &str = "cairn-dev";

#[derive(Subcommand)]
pub enum DevCmd {
    /// Start a local cluster (or restart the one in DIR) and wait until it is healthy.
    Up(Box<UpArgs>),
    /// Stop the local cluster in DIR (data is kept unless --purge).
    Down(DownArgs),
    /// Run one daemon and start it again when it crashes (what `dev up` starts each daemon
    /// under).
    #[command(hide = true)]
    Supervise(crate::supervise::SuperviseArgs),
}

#[derive(Args)]
pub struct UpArgs {
    /// Directory of the cluster.
    #[arg(long, default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
    /// OSDs to run [default: 3]. On an existing cluster, a larger number adds OSDs (a smaller
    /// one is refused: OSDs are not removed this way).
    #[arg(long)]
    pub osds: Option<u32>,
    /// Monitors to run: 1, 3 or 5 [default: 1]. Fixed when the cluster is created.
    #[arg(long)]
    pub mons: Option<u32>,
    /// Size of each OSD's data file (sparse) [default: 4G]. Fixed when the cluster is
    /// created.
    #[arg(long, value_parser = crate::size::parse_size, allow_hyphen_values = true)]
    pub osd_size: Option<u64>,
    /// Do not create the `default` pool.
    #[arg(long)]
    pub no_pool: bool,
    /// Seconds to wait for the cluster to become healthy.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Address of the NBD server serving the `default` pool's volumes (port 0: any free port)
    /// [default: 127.0.0.1:10809]. On an existing cluster, a new address replaces the old.
    #[arg(long)]
    pub nbd: Option<String>,
    /// Do not start the NBD server.
    #[arg(long)]
    pub no_nbd: bool,
    /// Start the daemons without their metrics endpoints (and the per-op metrics they keep)
    /// this time; by default each serves Prometheus metrics on a port of 127.0.0.1 (see
    /// DIR/prometheus.yml).
    #[arg(long)]
    pub no_metrics: bool,
    /// Seconds a down OSD waits before the monitors mark it out and its PGs are recovered on
    /// other OSDs [default: 600]. Fixed when the cluster is created.
    #[arg(long, value_name = "SECS")]
    pub down_out_interval: Option<u64>,
    /// Map epochs the monitors keep at least (`cairn mon --history-keep`) [default: 500].
    /// Fixed when the cluster is created.
    #[arg(long, value_name = "EPOCHS")]
    pub history_keep: Option<u64>,
    /// Seconds between two scrubs of each PG by its primary (0: only `cairn pg scrub`)
    /// [default: 604800, a week]. Fixed when the cluster is created.
    #[arg(long, value_name = "SECS")]
    pub scrub_interval: Option<u64>,
    /// Milliseconds each OSD pauses after every object it recovers (slows recovery down on
    /// purpose, e.g. to watch it) [default: 0]. Fixed when the cluster is created.
    #[arg(long, value_name = "MS")]
    pub recovery_sleep_ms: Option<u64>,
    /// The OSDs' `--direct-write-min`: whole-block writes of at least this size go straight
    /// to the data device, 0 = off [default: 128K]. Fixed when the cluster is created.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub direct_write_min: Option<u64>,
    /// Size of each OSD's WAL file in /dev/shm (memory, on top of the OSDs' memory targets)
    /// [default: the OSDs' default, a sixteenth of --osd-size between 128M and 1G]. A
    /// checkpoint starts when the WAL is half full, so a larger WAL means fewer checkpoints
    /// under heavy writes. Fixed when the cluster is created.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub wal_size: Option<u64>,
    /// Keep each OSD's WAL on its data device instead of in /dev/shm, as on a machine without
    /// NVM: every commit then waits for the disk. Fixed when the cluster is created.
    #[arg(long)]
    pub wal_on_data: bool,
    /// The OSDs' `--wal-inline-max-us`: shards write the WAL themselves while its quickest
    /// recent sync took at most this many microseconds [default: the OSDs', 30].
    #[arg(long, value_name = "US")]
    pub wal_inline_max_us: Option<u64>,
    /// Size of the volume `disk0` created with the `default` pool (thin: uses no space until
    /// written) [default: 10G, or less so that it fits: what the pool can hold, rounded down
    /// to whole GiB].
    #[arg(long, value_parser = crate::size::parse_size, allow_hyphen_values = true)]
    pub volume_size: Option<u64>,
    /// `key` (default): every daemon and client authenticates with its key (keyrings in
    /// DIR); `none`: no authentication, for benchmarks of its cost. Fixed when the cluster is
    /// created.
    #[arg(long, value_enum)]
    pub auth: Option<crate::daemon_auth::AuthMode>,
    /// Frame protection of every connection: `plain` (default), `signed` or `secure` (see
    /// `cairn osd run --help`); the daemons require it and `cairn.toml` asks for it. Fixed
    /// when the cluster is created; needs authentication.
    #[arg(long, value_name = "MODE", value_parser = crate::daemon_auth::parse_frames)]
    pub frames: Option<cairn_transport::FrameMode>,
    /// Address the monitors and OSDs listen on and connect from, instead of 127.0.0.1 (e.g.
    /// the address of a network namespace standing for a host). Fixed when the cluster is
    /// created.
    #[arg(long, value_name = "IP")]
    pub bind: Option<std::net::IpAddr>,
    /// Host name (failure domain) of the OSDs this cluster starts [default: this machine's
    /// name]. Fixed when the cluster is created.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
}

/// The volume `dev up` creates and serves as the default NBD export.
pub const DEFAULT_VOLUME: &str = "disk0";

#[derive(Args)]
pub struct DownArgs {
    /// Directory of the cluster.
    #[arg(long, default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
    /// Also delete all data (DIR and the WAL files).
    #[arg(long)]
    pub purge: bool,
    /// Also delete the WAL directories in /dev/shm of dev clusters whose directory is gone
    /// (deleted by hand instead of `dev down --purge`); works without a cluster in DIR.
    #[arg(long)]
    pub purge_orphan_wals: bool,
}

/// What `dev up` needs to restart the same cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DevState {
    fsid: String,
    mons: Vec<String>,
    osds: u32,
    osd_size: u64,
    wal_dir: Option<PathBuf>,
    /// Where the NBD server listens (absent in clusters created before it existed).
    #[serde(default)]
    nbd: Option<String>,
    /// The monitors' down-out interval in seconds (absent: their default).
    #[serde(default)]
    down_out_interval: Option<u64>,
    /// The monitors' map history kept at least, in epochs (absent: their default).
    #[serde(default)]
    history_keep: Option<u64>,
    /// The OSDs' scrub interval in seconds (absent: their default).
    #[serde(default)]
    scrub_interval: Option<u64>,
    /// The OSDs' pause after each recovered object, in milliseconds.
    #[serde(default)]
    recovery_sleep_ms: u64,
    /// The OSDs' `--direct-write-min` in bytes (0: off).
    #[serde(default)]
    direct_write_min: u64,
    /// The OSDs' `--wal-size` in bytes (absent: their default, which depends on the OSD
    /// size).
    #[serde(default)]
    wal_size: Option<u64>,
    /// The OSDs' `--wal-inline-max-us` (absent: their default).
    #[serde(default)]
    wal_inline_max_us: Option<u64>,
    /// Daemons and clients run without authentication (`--auth none`).
    #[serde(default)]
    no_auth: bool,
    /// Frame protection (`--frames`; absent: plain).
    #[serde(default)]
    frames: Option<String>,
    /// Address the daemons listen on (`--bind`; absent: 127.0.0.1).
    #[serde(default)]
    bind: Option<String>,
    /// The OSDs' host name (`--host`; absent: the machine's).
    #[serde(default)]
    host: Option<String>,
    /// Each daemon's metrics address (`mon.0`, `osd.1`, `nbd` -> 127.0.0.1:port), given
    /// ports as daemons are added.
    #[serde(default)]
    metrics: std::collections::BTreeMap<String, String>,
}

impl DevState {
    /// Gives every daemon a metrics address on loopback (the page is not authenticated);
    /// whether any was added.
    fn assign_metrics(&mut self) -> Result<bool> {
        let names = (0..self.mons.len())
            .map(|i| format!("mon.{i}"))
            .chain((0..self.osds).map(|i| format!("osd.{i}")))
            .chain(std::iter::once("nbd".to_string()));
        let mut added = false;
        for name in names {
            if let std::collections::btree_map::Entry::Vacant(e) = self.metrics.entry(name) {
                e.insert(format!("127.0.0.1:{}", free_port()?));
                added = true;
            }
        }
        Ok(added)
    }

    /// `--metrics-addr ADDR` for daemon `name`, if it has one.
    fn metrics_args(&self, name: &str) -> Vec<String> {
        match self.metrics.get(name) {
            Some(a) => vec!["--metrics-addr".into(), a.clone()],
            None => Vec::new(),
        }
    }

    /// The address daemons listen on.
    fn bind(&self) -> &str {
        self.bind.as_deref().unwrap_or("127.0.0.1")
    }

    fn frames(&self) -> cairn_transport::FrameMode {
        self.frames
            .as_deref()
            .and_then(cairn_transport::FrameMode::parse)
            .unwrap_or_default()
    }
}

pub fn run(cmd: DevCmd) -> Result<()> {
    match cmd {
        DevCmd::Up(a) => up(*a),
        DevCmd::Down(a) => down(a),
        DevCmd::Supervise(a) => crate::supervise::run(a),
    }
}

/// Ports daemons are given are picked here: below Linux's default range of ports for
/// outgoing connections (32768-60999), which could otherwise take a picked port before its
/// daemon starts listening on it.
const PICKED_PORTS: std::ops::Range<u16> = 20000..32768;

/// How long a picked port stays promised to the `dev up` that picked it: enough for its
/// daemon to start listening on it.
const PORT_PROMISED_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// A free port on 127.0.0.1 from [`PICKED_PORTS`], tried from a random start.
pub(crate) fn free_port() -> Result<u16> {
    let r = random_fsid()?;
    let span = PICKED_PORTS.end - PICKED_PORTS.start;
    let start = u16::from_le_bytes([r[0], r[1]]) % span;
    for i in 0..span {
        let port = PICKED_PORTS.start + (start + i) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() && promise(port) {
            return Ok(port);
        }
    }
    bail!(
        "no free port on 127.0.0.1 between {} and {}",
        PICKED_PORTS.start,
        PICKED_PORTS.end - 1
    )
}

/// Marks `port` as picked (a file in the temporary directory) unless another `dev up` on
/// this machine picked it within [`PORT_PROMISED_FOR`]: between the pick and its daemon's
/// start the port is free, and two clusters started at once could otherwise both take it.
/// Where the mark cannot be written the port is taken as it is.
fn promise(port: u16) -> bool {
    let dir = std::env::temp_dir().join("cairn-dev-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let mark = dir.join(port.to_string());
    let fresh = |m: &std::path::Path| {
        std::fs::metadata(m)
            .and_then(|md| md.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < PORT_PROMISED_FOR)
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&mark)
    {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if fresh(&mark) {
                return false;
            }
            // A stale mark (its cluster started long ago, or went): renewed, the port taken.
            let _ = std::fs::File::options()
                .write(true)
                .open(&mark)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            true
        }
        Err(_) => true,
    }
}

pub(crate) fn random_fsid() -> Result<[u8; 16]> {
    let mut b = [0u8; 16];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("cannot read /dev/urandom")?;
    Ok(b)
}

fn load_state(dir: &Path) -> Result<Option<DevState>> {
    let p = dir.join("dev.toml");
    if !p.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    Ok(Some(
        toml::from_str(&text).with_context(|| format!("{} is damaged", p.display()))?,
    ))
}

/// Default NBD address of a new cluster.
const DEFAULT_NBD: &str = "127.0.0.1:10809";

/// An NBD address with port 0 replaced by a free port.
fn nbd_addr(a: &str) -> Result<String> {
    Ok(match a.strip_suffix(":0") {
        Some(host) => format!("{host}:{}", free_port()?),
        None => a.to_string(),
    })
}

fn new_state(a: &UpArgs) -> Result<DevState> {
    let n_mons = a.mons.unwrap_or(1);
    if ![1, 3, 5].contains(&n_mons) {
        bail!("--mons {n_mons}: run 1, 3 or 5 monitors");
    }
    let osds = a.osds.unwrap_or(3);
    if osds == 0 {
        bail!("--osds must be at least 1");
    }
    let no_auth = a.auth == Some(crate::daemon_auth::AuthMode::None);
    if let Some(f) = a
        .frames
        .filter(|f| no_auth && *f != cairn_transport::FrameMode::Plain)
    {
        bail!("--frames {f} needs authentication: drop --auth none");
    }
    let fsid = hex16(&random_fsid()?);
    let bind = a.bind.map_or("127.0.0.1".to_string(), |ip| ip.to_string());
    let mons = (0..n_mons)
        .map(|_| free_port().map(|p| format!("{bind}:{p}")))
        .collect::<Result<Vec<_>>>()?;
    let shm = Path::new("/dev/shm");
    let wal_dir = (!a.wal_on_data && shm.is_dir()).then(|| shm.join(format!("cairn-{fsid}")));
    Ok(DevState {
        fsid,
        mons,
        osds,
        osd_size: a.osd_size.unwrap_or(4 << 30),
        wal_dir,
        nbd: Some(nbd_addr(a.nbd.as_deref().unwrap_or(DEFAULT_NBD))?),
        down_out_interval: Some(a.down_out_interval.unwrap_or(600)),
        history_keep: Some(a.history_keep.unwrap_or(cairn_mon::DEFAULT_HISTORY_KEEP)),
        scrub_interval: Some(a.scrub_interval.unwrap_or(7 * 24 * 3600)),
        recovery_sleep_ms: a.recovery_sleep_ms.unwrap_or(0),
        direct_write_min: a
            .direct_write_min
            .unwrap_or(cairn_osd::DEFAULT_DIRECT_WRITE_MIN),
        wal_size: a.wal_size,
        wal_inline_max_us: a.wal_inline_max_us,
        no_auth: a.auth == Some(crate::daemon_auth::AuthMode::None),
        frames: a.frames.map(|f| f.to_string()),
        bind: a.bind.map(|ip| ip.to_string()),
        host: a.host.clone(),
        metrics: Default::default(),
    })
}

/// Refuses options given to `dev up` of an existing cluster that differ from what it was
/// created with (they would be silently ignored otherwise).
fn check_fixed(a: &UpArgs, s: &DevState) -> Result<()> {
    let mut differ = Vec::new();
    let mut check = |flag: &str, given: Option<u64>, have: Option<u64>| {
        if let Some(g) = given {
            if Some(g) != have {
                let was = have.map_or("its default".to_string(), |h| h.to_string());
                differ.push(format!("--{flag} {g} (it has {was})"));
            }
        }
    };
    check("mons", a.mons.map(u64::from), Some(s.mons.len() as u64));
    check("osd-size", a.osd_size, Some(s.osd_size));
    check(
        "down-out-interval",
        a.down_out_interval,
        s.down_out_interval,
    );
    check("history-keep", a.history_keep, s.history_keep);
    check("scrub-interval", a.scrub_interval, s.scrub_interval);
    check(
        "recovery-sleep-ms",
        a.recovery_sleep_ms,
        Some(s.recovery_sleep_ms),
    );
    check(
        "direct-write-min",
        a.direct_write_min,
        Some(s.direct_write_min),
    );
    check("wal-size", a.wal_size, s.wal_size);
    check(
        "wal-inline-max-us",
        a.wal_inline_max_us,
        s.wal_inline_max_us,
    );
    if let Some(mode) = a.auth {
        if (mode == crate::daemon_auth::AuthMode::None) != s.no_auth {
            let have = if s.no_auth { "none" } else { "key" };
            differ.push(format!("--auth {mode:?} (it has {have})").to_lowercase());
        }
    }
    if let Some(f) = a.frames {
        if f != s.frames() {
            differ.push(format!("--frames {f} (it has {})", s.frames()));
        }
    }
    if a.wal_on_data && s.wal_dir.is_some() {
        differ.push("--wal-on-data (its WALs are in /dev/shm)".to_string());
    }
    if let Some(ip) = a.bind.filter(|ip| ip.to_string() != s.bind()) {
        differ.push(format!("--bind {ip} (it has {})", s.bind()));
    }
    if let Some(h) = a.host.as_ref().filter(|h| Some(*h) != s.host.as_ref()) {
        let have = s.host.as_deref().unwrap_or("the machine's name");
        differ.push(format!("--host {h} (it has {have})"));
    }
    if differ.is_empty() {
        return Ok(());
    }
    bail!(
        "the cluster in {} was created with other settings, which cannot change: {}. Leave \
         these options out to restart it as it is, or `cairn dev down --dir {} --purge` and \
         create it again (its data is then lost)",
        a.dir.display(),
        differ.join(", "),
        a.dir.display()
    )
}

pub(crate) fn pid_alive(pid: i32) -> bool {
    // Signal 0 checks existence; a zombie child of ours is not "alive".
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Starts `cairn <args>` detached (own process group, so a Ctrl-C in the shell that ran
/// `dev up` does not stop the cluster) under `cairn dev supervise`, which starts it again when
/// it crashes (`supervise.rs`), logging to `log`; returns once its pid is recorded.
fn spawn(dir: &Path, name: &str, args: &[String]) -> Result<()> {
    let pidfile = dir.join("run").join(format!("{name}.pid"));
    if read_pid(&pidfile).is_some_and(pid_alive) {
        return Ok(());
    }
    let exe = std::env::current_exe().context("cannot find the cairn executable")?;
    let log_path = dir.join("log").join(format!("{name}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    // A supervisor waiting to restart a crashed daemon would start a second one.
    let supfile = dir.join("run").join(format!("{name}.sup"));
    if let Some(pid) = read_pid(&supfile).filter(|p| pid_alive(*p)) {
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let _ = std::fs::remove_file(&pidfile);
    let run_dir = dir.join("run").display().to_string();
    let crash_dir = dir.join("crash");
    let mut child = Command::new(exe)
        .args([
            "dev",
            "supervise",
            "--name",
            name,
            "--run-dir",
            &run_dir,
            "--",
        ])
        .args(args)
        .env(cairn_failstop::CRASH_DIR_ENV, &crash_dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .env(
            "CAIRN_LOG",
            std::env::var("CAIRN_LOG").unwrap_or_else(|_| "info".into()),
        )
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {name}"))?;
    let start = Instant::now();
    while read_pid(&pidfile).is_none() {
        if let Some(status) = child.try_wait()? {
            bail!(
                "{name}'s supervisor ended at once ({status}); see {}",
                log_path.display()
            );
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!(
                "{name} did not start within 10 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Polls `f` until it gives a value, the timeout passes, or a daemon of the cluster in `dir`
/// has died (then its own last error line says why, at once).
fn wait_for<T>(
    dir: &Path,
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let mut last_err = String::new();
    loop {
        if let Some(why) = dead_daemon(dir) {
            bail!("{why}");
        }
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = format!(" (last error: {e:#})"),
        }
        if start.elapsed() > timeout {
            bail!(
                "timed out after {timeout:?} waiting for {what}{last_err}; see the logs in DIR/log"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn up(a: UpArgs) -> Result<()> {
    let before = running(&a.dir);
    let r = start(a.dir.clone(), &a);
    if r.is_err() {
        let stopped: Vec<String> = running(&a.dir)
            .into_iter()
            .filter(|n| !before.contains(n))
            .collect();
        for name in &stopped {
            stop_one(&a.dir, name);
        }
        if !stopped.is_empty() {
            eprintln!(
                "stopped what this `dev up` started ({}); the data in {} is kept",
                stopped.join(", "),
                a.dir.display()
            );
        }
    }
    r
}

/// The daemons of the cluster in `dir` that are running (by their pid files).
fn running(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir.join("run")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| read_pid(&e.path()).is_some_and(pid_alive))
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".pid").map(str::to_string)
        })
        .collect()
}

/// Stops daemon `name` (`nbd`, `osd.1`) of the cluster in `dir`: SIGTERM, SIGKILL after 10 s.
fn stop_one(dir: &Path, name: &str) {
    // Its supervisor first, which could otherwise start it again if it is between a crash
    // and its restart.
    let supfile = dir.join("run").join(format!("{name}.sup"));
    if let Some(pid) = read_pid(&supfile).filter(|p| pid_alive(*p)) {
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let _ = std::fs::remove_file(supfile);
    let pidfile = dir.join("run").join(format!("{name}.pid"));
    if let Some(pid) = read_pid(&pidfile).filter(|p| pid_alive(*p)) {
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        while pid_alive(pid) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        if pid_alive(pid) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = std::fs::remove_file(pidfile);
}

/// A daemon of the cluster in `dir` whose pid file names a process that is gone, with the
/// last error line of its log.
fn dead_daemon(dir: &Path) -> Option<String> {
    let rd = std::fs::read_dir(dir.join("run")).ok()?;
    for e in rd.flatten() {
        let Some(pid) = read_pid(&e.path()) else {
            continue;
        };
        if pid_alive(pid) {
            continue;
        }
        let file = e.file_name().to_string_lossy().into_owned();
        // Supervisors (`NAME.sup`) end with their daemon.
        let Some(name) = file.strip_suffix(".pid").map(str::to_string) else {
            continue;
        };
        let log = dir.join("log").join(format!("{name}.log"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let why = lines
            .iter()
            .rev()
            .take(50)
            .find(|l| l.to_ascii_lowercase().contains("error"))
            .or(lines.last())
            .map_or("(its log is empty)", |l| l.trim());
        return Some(format!(
            "{name} stopped while starting: {why} (log: {})",
            log.display()
        ));
    }
    None
}

/// Refuses to start OSDs whose WAL is gone while their data is there (a reboot emptied
/// /dev/shm): they could not open their store, and the writes only the WAL held are lost.
fn check_wals(dir: &Path, s: &DevState) -> Result<()> {
    let Some(w) = &s.wal_dir else {
        return Ok(());
    };
    let lost: Vec<String> = (0..s.osds)
        .filter(|i| dir.join(format!("osd.{i}")).join("data.img").exists())
        .filter(|i| !w.join(format!("osd.{i}.wal")).exists())
        .map(|i| format!("osd.{i}"))
        .collect();
    if lost.is_empty() {
        return Ok(());
    }
    bail!(
        "the WAL of {} is gone from {} (it lives in /dev/shm, which a reboot empties): those \
         OSDs cannot open their stores, and their latest writes were only in the WAL. This dev \
         cluster cannot start again: `cairn dev down --dir {} --purge`, then `cairn dev up` \
         creates a new one",
        lost.join(", "),
        w.display(),
        dir.display()
    )
}

fn start(dir: PathBuf, a: &UpArgs) -> Result<()> {
    for sub in ["log", "run"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("cannot create {}", dir.join(sub).display()))?;
    }
    // Pid files of daemons that stopped before this run: they are started again below, and
    // must not read as daemons that died while starting.
    if let Ok(rd) = std::fs::read_dir(dir.join("run")) {
        for e in rd.flatten() {
            if !read_pid(&e.path()).is_some_and(pid_alive) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let state = match load_state(&dir)? {
        Some(mut s) => {
            check_fixed(a, &s)?;
            eprintln!("restarting the cluster in {}", dir.display());
            if let Some(n) = &a.nbd {
                let addr = nbd_addr(n)?;
                if s.nbd.as_ref() != Some(&addr) {
                    eprintln!("  the NBD server moves to {addr}");
                    stop_one(&dir, "nbd");
                    s.nbd = Some(addr);
                    std::fs::write(dir.join("dev.toml"), toml::to_string(&s)?)
                        .context("cannot write dev.toml")?;
                }
            }
            // More OSDs than the cluster has: add them (data moves to them by placement).
            let want = a.osds.unwrap_or(s.osds);
            if want < s.osds {
                bail!(
                    "--osds {want}: the cluster in {} has {} OSDs and `dev up` only adds OSDs \
                     (mark one out with `cairn osd out ID` to drain it)",
                    dir.display(),
                    s.osds
                );
            }
            if want > s.osds {
                eprintln!("  adding {} OSD(s)", want - s.osds);
                s.osds = want;
                std::fs::write(dir.join("dev.toml"), toml::to_string(&s)?)
                    .context("cannot write dev.toml")?;
            }
            s
        }
        None => {
            let s = new_state(a)?;
            std::fs::write(dir.join("dev.toml"), toml::to_string(&s)?)
                .context("cannot write dev.toml")?;
            eprintln!("creating a cluster in {}", dir.display());
            s
        }
    };
    if let Some(w) = crate::dev_space::shortfall(&dir, state.osds, state.osd_size) {
        eprintln!("{w}");
    }
    let mut state = state;
    if state.assign_metrics()? {
        std::fs::write(dir.join("dev.toml"), toml::to_string(&state)?)
            .context("cannot write dev.toml")?;
    }
    write_prometheus_config(&dir, &state)?;
    if a.no_metrics {
        state.metrics.clear();
    }
    let conf_path = dir.join("cairn.toml");
    let keyring = if state.no_auth {
        None
    } else {
        let admin = crate::dev_keys::ensure(&dir, state.mons.len(), state.osds)?;
        crate::conf::use_keyring(&admin, Some("client.admin"), &state.mons)?;
        Some("keyring".to_string())
    };
    crate::conf::save(
        &conf_path,
        &Conf {
            cluster: ClusterConf {
                fsid: state.fsid.clone(),
                mons: state.mons.clone(),
                entity: keyring.as_ref().map(|_| "client.admin".to_string()),
                keyring,
                frames: state.frames.clone(),
            },
        },
    )?;
    if let Some(w) = &state.wal_dir {
        std::fs::create_dir_all(w).with_context(|| format!("cannot create {}", w.display()))?;
        crate::dev_wals::claim(w, &dir)?;
    }
    crate::dev_wals::report();
    let timeout = Duration::from_secs(a.timeout);
    check_wals(&dir, &state)?;
    start_mons(&dir, &state)?;
    let mon = crate::conf::mon_client(state.mons.clone()).with_timeout(Duration::from_secs(2));
    eprintln!(
        "  waiting for {} monitor(s) to form a quorum...",
        state.mons.len()
    );
    wait_for(&dir, "the monitors", timeout, || {
        Ok(block_on(mon.status())?.ok().filter(|s| s.leader.is_some()))
    })?;
    if !state.no_auth {
        register_osd_keys(&dir, &state, &mon)?;
    }
    eprintln!("  starting {} OSD(s)...", state.osds);
    start_osds(&dir, &state, &mon, timeout)?;
    let mut progress = crate::progress::Progress::new("  OSDs up");
    wait_for(&dir, "the OSDs", timeout, || {
        let map = block_on(mon.get_map())??;
        let up = map.osd_counts().1 as u64;
        progress.show(up.min(state.osds.into()), state.osds.into());
        Ok((up >= u64::from(state.osds)).then_some(()))
    })?;
    progress.finish();
    let map = block_on(mon.get_map())??;
    if !a.no_pool && map.pools.is_empty() {
        let size = state.osds.min(3) as u8;
        let c = MapChange::PoolCreateRule {
            name: "default".into(),
            size,
            min_size: size.saturating_sub(1).max(1),
            pg_count: 64,
            durability: Durability::Wal,
            domain: None,
        };
        block_on(mon.command(c))??;
        eprintln!("  created pool `default` (size {size}, 64 pgs, durability wal)");
    }
    let mut progress = crate::progress::Progress::new("  PGs active+clean");
    wait_for(&dir, "all PGs to be active+clean", timeout, || {
        let map = block_on(mon.get_map())??;
        let c = pg_counts(&map, &[]);
        progress.show(c.clean, c.total);
        Ok((c.clean == c.total).then_some(()))
    })?;
    progress.finish();
    let nbd = match (&state.nbd, a.no_nbd || a.no_pool) {
        (Some(addr), false) => {
            start_nbd(&dir, &state, addr, a.volume_size, timeout)?;
            Some(addr.clone())
        }
        _ => None,
    };
    let conf_abs = std::fs::canonicalize(&conf_path).unwrap_or(conf_path);
    println!(
        "cluster up: {} monitor(s), {} OSD(s), healthy",
        state.mons.len(),
        state.osds
    );
    println!("  config: {}", conf_abs.display());
    println!("  logs:   {}", dir.join("log").display());
    println!(
        "  metrics: {} daemons on 127.0.0.1 (Prometheus scrape config: {})",
        state.metrics.len(),
        dir.join("prometheus.yml").display()
    );
    // The hints name this very executable: `cairn` may not be on the PATH.
    let exe = std::env::current_exe()
        .ok()
        .and_then(|e| {
            let cwd = std::env::current_dir().ok()?;
            Some(match e.strip_prefix(&cwd) {
                Ok(rel) => format!("./{}", rel.display()),
                Err(_) => e.display().to_string(),
            })
        })
        .unwrap_or_else(|| "cairn".to_string());
    println!("next:");
    println!("  export CAIRN_CONF={}", conf_abs.display());
    println!("  {exe} status");
    println!("  {exe} obj put default hello /etc/hostname && {exe} obj get default hello -");
    println!("  {exe} bench objects --json");
    if let Some(addr) = nbd {
        println!("  nbdinfo nbd://{addr}/{DEFAULT_VOLUME}    # the volume served over NBD");
        println!("  {exe} vol ls");
    }
    println!("  {exe} dev down --dir {}", dir.display());
    Ok(())
}

/// Writes `prometheus.yml` beside the cluster's configuration: a scrape job per kind of
/// daemon, so `prometheus --config.file=DIR/prometheus.yml` watches this cluster.
fn write_prometheus_config(dir: &Path, s: &DevState) -> Result<()> {
    let mut out = String::from(
        "# Written by `cairn dev up`: scrapes every daemon of this dev cluster.\n\
         global:\n  scrape_interval: 5s\nscrape_configs:\n",
    );
    for (job, prefix) in [
        ("cairn-mon", "mon."),
        ("cairn-osd", "osd."),
        ("cairn-nbd", "nbd"),
    ] {
        let targets: Vec<String> = s
            .metrics
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(name, addr)| {
                format!("      - targets: ['{addr}']\n        labels: {{daemon: '{name}'}}\n")
            })
            .collect();
        if targets.is_empty() {
            continue;
        }
        out.push_str(&format!("  - job_name: {job}\n    static_configs:\n"));
        out.extend(targets);
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, out).with_context(|| format!("cannot write {}", path.display()))
}

/// The default volume's size: 10 GiB, or what the `default` pool can hold when less (whole
/// GiB; below 1 GiB, 64 MiB steps, at least 64 MiB), so that writing it full does not run out
/// of space.
async fn default_volume_size(client: &cairn_client::Client) -> u64 {
    const GIB: u64 = 1 << 30;
    const STEP: u64 = 64 << 20;
    let map = client.map();
    let Some(p) = map.pool_by_name("default") else {
        return 10 * GIB;
    };
    let uses = crate::capacity::osd_uses(&map).await;
    let room = crate::capacity::usable(&map, &uses, p.raw_per_byte()).unwrap_or(10 * GIB);
    if room >= GIB {
        (room / GIB).min(10) * GIB
    } else {
        (room / STEP).max(1) * STEP
    }
}

/// Creates the default volume if the pool has none and starts the NBD server serving it.
fn start_nbd(
    dir: &Path,
    s: &DevState,
    addr: &str,
    size: Option<u64>,
    timeout: Duration,
) -> Result<()> {
    // One runtime for the client's whole life: its connections are tasks of that runtime.
    let created = block_on(async {
        let cfg = crate::conf::client_config(s.mons.clone());
        let client = cairn_client::Client::connect(cfg).await?;
        if !cairn_volume::list(&client, "default").await?.is_empty() {
            return Ok(None);
        }
        let size = match size {
            Some(b) => b,
            None => default_volume_size(&client).await,
        };
        let os = cairn_volume::DEFAULT_OBJECT_SIZE;
        cairn_volume::create(&client, "default", DEFAULT_VOLUME, size, os).await?;
        anyhow::Ok(Some(size))
    })??;
    if let Some(size) = created {
        eprintln!(
            "  created volume {DEFAULT_VOLUME} ({}, thin) in pool `default`",
            crate::size::human(size)
        );
    }
    let ours = read_pid(&dir.join("run").join("nbd.pid")).is_some_and(pid_alive);
    if !ours && std::net::TcpStream::connect(addr).is_ok() {
        bail!(
            "cannot serve NBD on {addr}: another program listens there; stop it, or create the \
             cluster with --nbd 127.0.0.1:0 (any free port), or run with --no-nbd"
        );
    }
    let conf = dir.join("cairn.toml").display().to_string();
    let mut args: Vec<String> = [
        "-c",
        &conf,
        "nbd",
        "serve",
        "--pool",
        "default",
        "--listen",
        addr,
        "--default-export",
        DEFAULT_VOLUME,
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    args.extend(s.metrics_args("nbd"));
    spawn(dir, "nbd", &args)?;
    wait_for(dir, &format!("the NBD server on {addr}"), timeout, || {
        Ok(std::net::TcpStream::connect(addr).ok().map(|_| ()))
    })?;
    eprintln!("  serving pool `default`'s volumes over NBD on {addr}");
    Ok(())
}

fn start_mons(dir: &Path, s: &DevState) -> Result<()> {
    for (i, addr) in s.mons.iter().enumerate() {
        let mut args = vec![
            "mon".to_string(),
            "run".into(),
            "--id".into(),
            i.to_string(),
            "--dir".into(),
            dir.join(format!("mon.{i}")).display().to_string(),
            "--listen".into(),
            addr.clone(),
            "--fsid".into(),
            s.fsid.clone(),
        ];
        for (j, m) in s.mons.iter().enumerate() {
            args.push("--member".into());
            args.push(format!("{j}={m}"));
        }
        if let Some(secs) = s.down_out_interval {
            args.push("--down-out-interval".into());
            args.push(secs.to_string());
        }
        if let Some(n) = s.history_keep {
            args.push("--history-keep".into());
            args.push(n.to_string());
        }
        if s.no_auth {
            args.extend(["--auth".into(), "none".into()]);
        }
        args.extend(["--frames".into(), s.frames().to_string()]);
        args.extend(s.metrics_args(&format!("mon.{i}")));
        spawn(dir, &format!("mon.{i}"), &args)?;
    }
    Ok(())
}

/// Each OSD's memory target on a dev cluster: the machine's memory split between its OSDs,
/// half of it for them all, from 256 MiB to 4 GiB each.
fn dev_memory_target(osds: u32) -> u64 {
    let total = cairn_osd::machine_memory().unwrap_or(2 << 30);
    (total / 2 / u64::from(osds.max(1))).clamp(cairn_osd::MIN_MEMORY_TARGET, 4 << 30)
}

/// Starts the OSDs that are not running. A new OSD gets the next id at its first boot, so new
/// ones are started one at a time: `osd.N` (directory, log, pid file) is OSD id N.
/// Has the monitors hold every OSD's key (the first leader seeds the key database from the
/// monitor keyrings; OSDs added later are registered here).
fn register_osd_keys(dir: &Path, state: &DevState, mon: &MonClient) -> Result<()> {
    let me = crate::conf::own_key().context("the administrator's key is not loaded")?;
    let mon = mon.clone().with_timeout(Duration::from_secs(10));
    for i in 0..state.osds {
        let path = dir.join(format!("osd.{i}")).join("keyring");
        let entry = cairn_auth::Keyring::load_key(&path, &cairn_auth::Entity::osd(i))?;
        crate::auth_cmd::ensure_registered(&mon, &me, &entry)?;
    }
    Ok(())
}

fn start_osds(dir: &Path, s: &DevState, mon: &MonClient, timeout: Duration) -> Result<()> {
    for i in 0..s.osds {
        let mut args = vec![
            "osd".to_string(),
            "run".into(),
            "--dir".into(),
            dir.join(format!("osd.{i}")).display().to_string(),
            "--data-size".into(),
            s.osd_size.to_string(),
            "--memory-target".into(),
            dev_memory_target(s.osds).to_string(),
            "--listen".into(),
            format!("{}:0", s.bind()),
        ];
        if let Some(h) = &s.host {
            args.extend(["--host".into(), h.clone()]);
        }
        // Always given: a cluster made when the default was another keeps its setting.
        args.push("--direct-write-min".into());
        args.push(s.direct_write_min.to_string());
        if s.recovery_sleep_ms > 0 {
            args.push("--recovery-sleep-ms".into());
            args.push(s.recovery_sleep_ms.to_string());
        }
        if let Some(secs) = s.scrub_interval {
            args.push("--scrub-interval".into());
            args.push(secs.to_string());
        }
        for m in &s.mons {
            args.push("--mon".into());
            args.push(m.clone());
        }
        if let Some(w) = &s.wal_dir {
            args.push("--wal".into());
            args.push(w.join(format!("osd.{i}.wal")).display().to_string());
        }
        if let Some(size) = s.wal_size {
            args.push("--wal-size".into());
            args.push(size.to_string());
        }
        if let Some(us) = s.wal_inline_max_us {
            args.push("--wal-inline-max-us".into());
            args.push(us.to_string());
        }
        if s.no_auth {
            args.extend(["--auth".into(), "none".into()]);
        }
        args.extend(["--frames".into(), s.frames().to_string()]);
        args.extend(s.metrics_args(&format!("osd.{i}")));
        let known = block_on(mon.get_map())??.osds.len() as u32;
        spawn(dir, &format!("osd.{i}"), &args)?;
        if known <= i {
            wait_for(dir, &format!("osd.{i} to register"), timeout, || {
                Ok((block_on(mon.get_map())??.osds.len() as u32 > i).then_some(()))
            })?;
        }
    }
    Ok(())
}

fn down(a: DownArgs) -> Result<()> {
    stop_cluster(&a)?;
    if a.purge_orphan_wals {
        crate::dev_wals::remove_orphans()
    } else {
        crate::dev_wals::report();
        Ok(())
    }
}

fn stop_cluster(a: &DownArgs) -> Result<()> {
    if !a.dir.join("dev.toml").exists() && !a.dir.join("run").exists() {
        println!(
            "no dev cluster in {}: nothing to stop{}",
            a.dir.display(),
            if a.purge { " or remove" } else { "" }
        );
        return Ok(());
    }
    let run = a.dir.join("run");
    let mut pids = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&run) {
        for e in rd.flatten() {
            if let Some(pid) = read_pid(&e.path()) {
                if pid_alive(pid) {
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                    pids.push(pid);
                }
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
    let start = Instant::now();
    while pids.iter().any(|p| pid_alive(*p)) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in pids.iter().filter(|p| pid_alive(**p)) {
        unsafe { libc::kill(*p, libc::SIGKILL) };
    }
    println!(
        "stopped {} process(es) of the cluster in {}",
        pids.len(),
        a.dir.display()
    );
    if a.purge {
        if let Some(s) = load_state(&a.dir)? {
            if let Some(w) = s.wal_dir {
                let _ = std::fs::remove_dir_all(&w);
            }
        }
        std::fs::remove_dir_all(&a.dir)
            .with_context(|| format!("cannot remove {}", a.dir.display()))?;
        println!("removed {} and its WAL files", a.dir.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_picked_port_is_not_picked_again_while_promised() {
        // Port 1 is outside the picked range: no `dev up` competes for this mark.
        let mark = std::env::temp_dir().join("cairn-dev-ports").join("1");
        let _ = std::fs::remove_file(&mark);
        assert!(promise(1), "a fresh port is promised");
        assert!(!promise(1), "a promised port is not promised twice");
        let old = std::time::SystemTime::now() - PORT_PROMISED_FOR * 2;
        let f = std::fs::File::options()
            .write(true)
            .open(&mark)
            .expect("mark");
        f.set_modified(old).expect("age the mark");
        assert!(promise(1), "a stale promise is renewed");
        assert!(!promise(1));
        let _ = std::fs::remove_file(&mark);
        let p = free_port().expect("a free port");
        assert!(PICKED_PORTS.contains(&p));
        assert!(!promise(p), "free_port promised what it returned");
    }
}
