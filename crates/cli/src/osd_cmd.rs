//! `cairn osd`: run an OSD daemon, list OSDs, mark them out/in.

use crate::admin::change;
use anyhow::{bail, Result};
use cairn_map::MapChange;
use clap::{Args, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum OsdCmd {
    /// Run an OSD daemon (creates and formats its store on first start). Settings missing
    /// from the flags come from DIR/osd.toml when `cairn osd create` prepared the OSD.
    Run(Box<RunArgs>),
    /// Prepare an OSD on this host: format its store, have the monitors give it an id (down
    /// and out until it first starts), register its key, and write DIR/osd.toml and
    /// DIR/keyring; then `cairn osd run --dir DIR` starts it. Needs `mon w` and `mon x`.
    Create(Box<crate::osd_create::CreateArgs>),
    /// Start prepared OSDs in the background unless they run already (at boot, where the
    /// OSDs are not systemd units): the directories named, or with --all every one under
    /// /var/lib/cairn (--root). Each logs to DIR/osd.log; DIR/osd.pid holds its pid.
    Activate(crate::osd_activate::ActivateArgs),
    /// Wait until at least N OSDs are up and in (for scripts: after starting OSDs, before
    /// creating a pool that needs their hosts).
    Wait {
        /// OSDs that must be up and in.
        #[arg(long)]
        up: usize,
        /// Seconds to wait at most.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// List OSDs: id, address, host, up/down, in/out, weight.
    Ls(crate::admin::JsonFlag),
    /// Show the placement hierarchy: hosts (the failure domains) with their OSDs, weights
    /// (a host weighs what its in OSDs do), up/down, in/out, and the PGs each OSD holds and
    /// leads over every pool.
    Tree(crate::admin::JsonFlag),
    /// Per-OSD commit latency (store: WAL write and flush) and apply latency (a client write
    /// as primary, until every member holds it), ops and MB/s, over an interval, refreshing
    /// on a terminal (like `ceph osd perf`).
    Perf(crate::perf::PerfArgs),
    /// Stop placing data on an OSD (its PGs move to others).
    Out { id: u32 },
    /// Place data on an OSD again.
    In { id: u32 },
    /// Set an OSD's placement weight (1.0 = a typical device).
    Reweight { id: u32, weight: f64 },
    /// Declare a down OSD's data gone for good: PGs down waiting for it go on with the copies
    /// left, and writes only it held are lost (status and the OSD logs name those PGs).
    ///
    /// Use it only when the OSD cannot come back (its disk is dead or wiped): if it could,
    /// start it instead, and the PGs recover everything. The OSD must be down.
    Lost {
        /// The OSD's id (`cairn osd ls`).
        id: u32,
        /// Required: confirms that writes only this OSD held may be lost.
        #[arg(long)]
        yes_i_really_mean_it: bool,
    },
    /// Fenced client instances (a volume's new writer fences the previous one): ls, add, rm.
    #[command(subcommand)]
    Blocklist(crate::blocklist_cmd::BlocklistCmd),
}

/// An OSD's devices (`osd run`, `osd create`).
#[derive(Args)]
pub struct Devices {
    /// Data device or file (default DIR/data.img).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Size of the data file when it is created, e.g. 4G (sparse).
    #[arg(long, default_value = "4G", value_parser = crate::size::parse_size, allow_hyphen_values = true)]
    pub data_size: u64,
    /// WAL device or file on a fast device (e.g. /dev/shm/osd0.wal); default: on the data device.
    #[arg(long)]
    pub wal: Option<PathBuf>,
    /// Size of the WAL when it is created [default: with --wal, a sixteenth of
    /// --data-size, between 128M and 1G; without, 128M of the data device]. A checkpoint
    /// writes the whole index when the WAL is half full: a larger WAL means fewer of them
    /// under heavy writes, at the cost of its memory (or NVM) and a longer replay at start.
    #[arg(long, value_parser = crate::size::parse_size, allow_hyphen_values = true)]
    pub wal_size: Option<u64>,
}

impl Devices {
    /// Puts the devices into an OSD configuration.
    pub fn apply(&self, cfg: &mut cairn_osd::OsdConfig) {
        cfg.data = self.data.clone();
        cfg.data_size = self.data_size;
        cfg.wal = self.wal.clone();
        cfg.wal_size = self
            .wal_size
            .unwrap_or_else(|| cairn_osd::default_wal_size(self.data_size, self.wal.is_some()));
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// Directory of this OSD (holds data.img unless --data is given).
    #[arg(long)]
    pub dir: PathBuf,
    // The keyring holding this OSD's key (osd.N: the OSD boots as id N).
    #[command(flatten)]
    pub auth: crate::daemon_auth::DaemonAuth,
    #[command(flatten)]
    pub conns: crate::daemon_auth::ConnArgs,
    #[command(flatten)]
    pub requests: crate::daemon_auth::RequestArgs,
    /// Monitor address (repeat for several); default: from -c / CAIRN_CONF.
    #[arg(long = "mon")]
    pub mons: Vec<String>,
    #[command(flatten)]
    pub devices: Devices,
    /// Address to serve on (port 0 = any free port). Unless it is 0.0.0.0, the OSD's own
    /// connections (to the monitors and other OSDs) are made from this address too.
    /// [default: the one in DIR/osd.toml, else 127.0.0.1:0]
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Host name used as the failure domain (default: DIR/osd.toml's, else this machine's).
    #[arg(long)]
    pub host: Option<String>,
    /// Shards: threads each running its own event loop that owns a share of the PGs and of
    /// the connections.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// Reader threads: client reads that miss the read cache read the data device on them,
    /// this many at once, while the shards go on serving; 0 = reads wait on their shard.
    #[arg(long, default_value_t = cairn_osd::DEFAULT_READ_THREADS)]
    pub read_threads: usize,
    /// Seconds between two scrubs of each PG this OSD leads (compare every object's copies
    /// across the PG's OSDs and repair wrong ones); 0 = only on demand (`cairn pg scrub`).
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    pub scrub_interval: u64,
    /// Fraction of the time recovery and backfill may take while clients send I/O to this
    /// OSD (recovery pauses for the rest); 1 = recover at full speed.
    #[arg(long, default_value_t = 0.5, value_parser = parse_share)]
    pub recovery_share: f64,
    /// Milliseconds to pause after every object recovery copies (on top of --recovery-share;
    /// 0 = none), to slow recovery down whatever the load.
    #[arg(long, default_value_t = 0)]
    pub recovery_sleep_ms: u64,
    /// Object copies recovery and backfill run at once on this OSD, over all its PGs (a copy
    /// a client op waits for does not count). More recovers faster and leaves clients less.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub recovery_max_active: u32,
    /// Memory this OSD aims to use, e.g. 4G; three quarters of it is the read cache. Default:
    /// a quarter of the machine's memory, from 256M to 4G. Give several OSDs on one machine
    /// their share (`cairn dev up` does: half the memory split between its OSDs).
    #[arg(long, value_parser = parse_memory_target, allow_hyphen_values = true)]
    pub memory_target: Option<u64>,
    /// Write whole-block writes of at least this size straight to the data device, with
    /// only their metadata through the WAL: every byte written once, WAL traffic cut to the
    /// metadata. Smaller writes go through the WAL and the flusher (on NVM a WAL write costs
    /// far less than a data-device flush). 0 = off: every write goes through the WAL. The
    /// default (131072 = 128K) measured best through a whole cluster; see
    /// docs/operator/store.md.
    #[arg(long, value_parser = parse_direct_write_min,
          default_value_t = cairn_osd::DEFAULT_DIRECT_WRITE_MIN)]
    pub direct_write_min: u64,
    /// Pools with durability `memory`: their writes are acknowledged once written to every
    /// member's WAL device (safe from any process crash) and flushed within this many
    /// milliseconds; a power loss of every member inside that window can lose them. 1..=1000.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub memory_flush_ms: u64,
    /// Each shard writes its WAL batches itself (fastest on NVM: a few microseconds) while
    /// the quickest of the last 64 WAL syncs took at most this many microseconds; above it
    /// (the WAL is on a disk or SSD) every sync goes to a thread of its own, so that reads the
    /// cache can answer do not wait behind the device. 0 = always that thread.
    #[arg(long, default_value_t = 30, value_name = "US")]
    pub wal_inline_max_us: u64,
    #[command(flatten)]
    pub metrics: crate::metrics_args::MetricsArgs,
    /// A write this OSD leads that takes longer than this many milliseconds is reported as
    /// slow: logged once with which members hold it and which it still waits for, and shown
    /// by `cairn status` for a minute (HEALTH_WARN).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub slow_op_ms: u64,
}

fn parse_direct_write_min(s: &str) -> std::result::Result<u64, String> {
    let v = crate::size::parse_size(s)?;
    if v != 0 && (v < 64 << 10 || v % 4096 != 0) {
        return Err(format!(
            "{s} is not 0 (off) or a multiple of 4 KiB of at least 64K"
        ));
    }
    Ok(v)
}

fn parse_memory_target(s: &str) -> std::result::Result<u64, String> {
    let v = crate::size::parse_size(s)?;
    if v < cairn_osd::MIN_MEMORY_TARGET {
        return Err(format!(
            "{s} is below the smallest memory target, {}",
            crate::size::human(cairn_osd::MIN_MEMORY_TARGET)
        ));
    }
    Ok(v)
}

fn parse_share(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a fraction in (0, 1]")),
    }
}

pub fn run(cmd: OsdCmd, conf: Option<&std::path::Path>) -> Result<()> {
    match cmd {
        OsdCmd::Run(a) => run_daemon(*a, conf),
        OsdCmd::Create(a) => crate::osd_create::create(*a, conf),
        OsdCmd::Activate(a) => crate::osd_activate::run(a, conf),
        OsdCmd::Wait { up, timeout } => wait_up(conf, up, timeout),
        OsdCmd::Ls(j) => crate::admin::osd_ls(conf, j.json),
        OsdCmd::Tree(j) => crate::osd_tree::run(conf, j.json),
        OsdCmd::Perf(a) => crate::perf::osd_perf(conf, &a),
        OsdCmd::Blocklist(c) => crate::blocklist_cmd::run(c, conf),
        OsdCmd::Out { id } => change(conf, MapChange::OsdOut { id }, &format!("osd.{id} out")),
        OsdCmd::In { id } => change(conf, MapChange::OsdIn { id }, &format!("osd.{id} in")),
        OsdCmd::Lost {
            id,
            yes_i_really_mean_it,
        } => {
            if !yes_i_really_mean_it {
                bail!(
                    "declaring osd.{id} lost gives up every write only it holds; if it can \
                     come back, start it instead. Add --yes-i-really-mean-it to go on"
                );
            }
            change(
                conf,
                MapChange::OsdLost { id },
                &format!("osd.{id} declared lost"),
            )
        }
        OsdCmd::Reweight { id, weight } => {
            if !(weight > 0.0 && weight <= 4096.0) {
                bail!(
                    "weight {weight} out of range: need 0 < weight <= 4096 (use `osd out` for 0)"
                );
            }
            let w = (weight * 65536.0).round() as u32;
            change(
                conf,
                MapChange::OsdWeight { id, weight: w },
                &format!("osd.{id} weight {weight}"),
            )
        }
    }
}

fn wait_up(conf: Option<&std::path::Path>, want: usize, timeout: u64) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
    loop {
        let map = crate::admin::get_map(conf)?;
        let up = map.osds.values().filter(|o| o.up && o.in_).count();
        if up >= want {
            eprintln!("{up} OSDs up and in");
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            let missing: Vec<String> = map
                .osds
                .values()
                .filter(|o| !(o.up && o.in_))
                .map(|o| format!("osd.{} ({})", o.id, if o.up { "out" } else { "down" }))
                .collect();
            bail!(
                "{up} of the {want} OSDs wanted are up and in after {timeout} s; not: {}",
                if missing.is_empty() {
                    "none known yet".to_string()
                } else {
                    missing.join(", ")
                }
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

fn run_daemon(mut a: RunArgs, conf: Option<&std::path::Path>) -> Result<()> {
    let prepared = crate::osd_create::OsdToml::load(&a.dir)?;
    if let Some(t) = prepared {
        a.devices.data = a.devices.data.or(Some(t.data));
        a.devices.wal = a.devices.wal.or(t.wal);
        a.host = a.host.or(Some(t.host));
        a.listen = a.listen.or(Some(t.listen));
    }
    let mons = if a.mons.is_empty() {
        crate::conf::load(conf)?.cluster.mons
    } else {
        a.mons
    };
    let key = a.auth.osd_key(&a.dir)?;
    let mut cfg = cairn_osd::OsdConfig::new(a.dir, mons);
    cfg.key = key;
    cfg.frames = a.auth.frames;
    cfg.conn_limits = a.conns.limits()?;
    cfg.request_limits = a.requests.limits()?;
    a.devices.apply(&mut cfg);
    cfg.listen = a.listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
    if let Some(h) = a.host {
        cfg.host = h;
    }
    cfg.shards = a.shards;
    cfg.read_threads = a.read_threads;
    cfg.scrub_interval =
        (a.scrub_interval > 0).then(|| std::time::Duration::from_secs(a.scrub_interval));
    cfg.recovery_share = a.recovery_share;
    cfg.recovery_sleep = std::time::Duration::from_millis(a.recovery_sleep_ms);
    cfg.recovery_max_active = a.recovery_max_active;
    cfg.direct_write_min = a.direct_write_min;
    cfg.memory_flush_delay = std::time::Duration::from_millis(a.memory_flush_ms);
    cfg.wal_inline_max = std::time::Duration::from_micros(a.wal_inline_max_us);
    cfg.metrics_listen = a.metrics.listen()?;
    cfg.slow_op = std::time::Duration::from_millis(a.slow_op_ms);
    if let Some(m) = a.memory_target {
        cfg.memory_target = m;
    }
    cfg.crash_dir = Some(crate::crash::dir_of(&cfg.dir));
    cairn_osd::run(cfg)?;
    Ok(())
}
