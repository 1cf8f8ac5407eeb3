//! `cairn`: the operator and developer entry point of Cairn.
//!
//! Daemons (`cairn mon`, `cairn osd run`), a local cluster (`cairn dev up|down`), operator
//! commands (`status`, `pool`, `osd`, `obj`), the local store's tools (`cairn store`) and
//! benchmarks (`cairn bench`). Commands find the cluster with `-c FILE` or `CAIRN_CONF`.

/// mimalloc rather than glibc's malloc: an OSD allocates and frees index nodes, frames and
/// payloads by the million, and glibc spent a quarter of all CPU under 4 KiB random writes in
/// malloc, free and consolidating its free lists (every allocation above 1 KiB consolidates
/// them). With mimalloc, `cairn bench nbd` randwrite-4k-qd32 over 20 s: 14,515 and 14,899
/// IOPS, p99 13-15 ms, 136 us CPU per op, against 13,146 and 11,661, p99 17-26 ms, 154-167
/// us with glibc, alternating runs (docs/operator/cluster.md, "Memory and the read cache").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_e` (the Rust bindings name no constant).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// mimalloc gives memory that stayed free for 1 s back to the kernel by default. Under load an
/// OSD's 1 MiB frame buffers and read-cache pages go back and forth at about that pace, and
/// each return is paid again as page faults that clear fresh (huge) pages: 44% of a shard
/// thread's time in 1 MiB writes. With 10 s, `bench nbd` write-1m-qd8 used 4,666 us of CPU per
/// op against 5,180 (400 vs 360 MB/s) and randwrite-4k-qd32 126 us against 136-146
/// (docs/operator/cluster.md, "Memory and the read cache"). `MIMALLOC_PURGE_DELAY` in the
/// environment still wins.
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's global options; any value is valid and mimalloc
        // reads its options atomically.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) }
    }
}

mod admin;
mod auth_cmd;
mod bench;
mod blocklist_cmd;
mod bootstrap;
mod capacity;
mod conf;
mod crash;
mod daemon_auth;
mod dashboard;
mod dev;
mod dev_keys;
mod dev_space;
mod dev_wals;
mod host_cmd;
mod logging;
mod metrics_args;
mod mon_cmd;
mod nbd_cmd;
mod obj_cmd;
mod osd_activate;
mod osd_cmd;
mod osd_create;
mod osd_tree;
mod perf;
mod pg_cmd;
mod progress;
mod qos_cmd;
mod size;
mod snap_cmd;
mod store_cmd;
mod supervise;
mod torture;
mod vol_cmd;
mod vol_io;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: a scale-out storage cluster for flash",
    long_about = "Cairn: a scale-out storage cluster for flash.\n\n\
        Exit status: 0 on success, 1 on an error (printed on one line to stderr), \
        2 on a usage error, 3 when `store scrub` found damaged data or `pg scrub` left \
        inconsistent copies."
)]
struct Cli {
    /// Cluster configuration file (default: $CAIRN_CONF, else ./cairn-dev/cairn.toml).
    #[arg(short = 'c', long = "conf", global = true)]
    conf: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start or stop a local development cluster (monitors + OSDs as processes).
    #[command(subcommand)]
    Dev(dev::DevCmd),
    /// Cluster health, OSDs, PGs and pools at a glance.
    Status(admin::StatusArgs),
    /// Daemons' recent crashes (panics: a daemon aborts, is restarted, and reports them).
    #[command(subcommand)]
    Crash(crash::CrashCmd),
    /// Serve a read-only web dashboard of the cluster (health, OSDs, pools, volumes, PGs,
    /// recovery, live IOPS/throughput/latency charts) on 127.0.0.1:7480.
    Dashboard(dashboard::DashboardArgs),
    /// Live I/O per pool (ops, MB/s, mean latency, from the OSDs) and per volume (as their NBD
    /// servers report), refreshing on a terminal.
    Top(perf::PerfArgs),
    /// Create, list, remove and configure pools.
    #[command(subcommand)]
    Pool(admin::PoolCmd),
    /// Run an OSD daemon; list OSDs; mark them out or in.
    #[command(subcommand)]
    Osd(osd_cmd::OsdCmd),
    /// Where hosts are: rack and zone labels for failure domains.
    #[command(subcommand)]
    Host(host_cmd::HostCmd),
    /// Placement groups: scrub (compare and repair object copies), query (state, past intervals).
    #[command(subcommand)]
    Pg(pg_cmd::PgCmd),
    /// Manage keys and caps: who may connect and what each may do (needs `mon x`).
    #[command(subcommand)]
    Auth(auth_cmd::AuthCmd),
    /// Put, get, remove, list and stat objects.
    #[command(subcommand)]
    Obj(obj_cmd::ObjCmd),
    /// Create, list, inspect, resize and remove block volumes.
    #[command(subcommand)]
    Vol(vol_cmd::VolCmd),
    /// Serve volumes over NBD (QEMU, libnbd tools, the Linux nbd driver).
    #[command(subcommand)]
    Nbd(nbd_cmd::NbdCmd),
    /// Create a cluster on this host (`cluster bootstrap`).
    #[command(subcommand)]
    Cluster(bootstrap::ClusterCmd),
    /// Run a monitor daemon; list, add and remove monitors.
    #[command(subcommand)]
    Mon(mon_cmd::MonCmd),
    /// Format, inspect and verify a local object store (the store an OSD runs on).
    #[command(subcommand)]
    Store(store_cmd::StoreCmd),
    /// Benchmarks, each reported against a raw baseline measured in the same run.
    #[command(subcommand)]
    Bench(BenchCmd),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Benchmark cairn-store on files in two directories (--help: workloads, baselines, JSON).
    #[command(long_about = bench::LONG_ABOUT)]
    Store(bench::BenchStoreArgs),
    /// Benchmark object I/O against a running cluster (--help: workloads, baselines, JSON).
    #[command(long_about = bench::objects::LONG_ABOUT)]
    Objects(bench::objects::BenchObjectsArgs),
    /// Benchmark block I/O over NBD with fio, against nbdkit memory (--help: workloads, JSON).
    #[command(long_about = bench::nbd::LONG_ABOUT)]
    Nbd(bench::nbd::BenchNbdArgs),
    /// Benchmark healing after kill -9 of an OSD on a cluster of its own (--help: scenarios).
    #[command(long_about = bench::recovery::LONG_ABOUT)]
    Recovery(bench::recovery::BenchRecoveryArgs),
    /// Benchmark the map and placement at 100-1,000 OSDs, no daemons (--help: measures, JSON).
    #[command(long_about = bench::scale::LONG_ABOUT)]
    Scale(bench::scale::BenchScaleArgs),
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    let daemon = matches!(
        cli.cmd,
        Cmd::Mon(mon_cmd::MonCmd::Run(_))
            | Cmd::Osd(osd_cmd::OsdCmd::Run(_))
            | Cmd::Nbd(_)
            | Cmd::Dashboard(_)
    );
    let _log = logging::init(daemon);
    if let Some((entity, crash_dir)) = crash::daemon_of(&cli.cmd) {
        cairn_failstop::install(&entity, crash_dir);
    }
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let conf = cli.conf.as_deref();
    let ok = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let r = match cli.cmd {
        Cmd::Dev(c) => ok(dev::run(c)),
        Cmd::Status(a) => ok(admin::status(conf, &a)),
        Cmd::Crash(c) => ok(crash::run(c, conf)),
        Cmd::Top(a) => ok(perf::top(conf, &a)),
        Cmd::Dashboard(a) => ok(dashboard::run(conf, a)),
        Cmd::Pool(c) => ok(admin::pool(c, conf)),
        Cmd::Osd(c) => ok(osd_cmd::run(c, conf)),
        Cmd::Host(c) => ok(host_cmd::run(c, conf)),
        Cmd::Pg(c) => pg_cmd::run(c, conf),
        Cmd::Auth(c) => ok(auth_cmd::run(c, conf)),
        Cmd::Obj(c) => ok(obj_cmd::run(c, conf)),
        Cmd::Vol(c) => ok(vol_cmd::run(c, conf)),
        Cmd::Nbd(c) => ok(nbd_cmd::run(c, conf)),
        Cmd::Mon(c) => ok(mon_cmd::run_cmd(c, conf)),
        Cmd::Cluster(c) => ok(bootstrap::run(c)),
        Cmd::Store(c) => store_cmd::run(c),
        Cmd::Bench(BenchCmd::Store(a)) => ok(bench::run(a)),
        Cmd::Bench(BenchCmd::Objects(a)) => ok(bench::objects::run(a, conf)),
        Cmd::Bench(BenchCmd::Nbd(a)) => ok(bench::nbd::run(a, conf)),
        Cmd::Bench(BenchCmd::Recovery(a)) => ok(bench::recovery::run(a)),
        Cmd::Bench(BenchCmd::Scale(a)) => ok(bench::scale::run(a)),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cairn: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Prints a command-line error in the same style as every other error (`cairn: error: ...`,
/// then clap's usage hint), exit status 2; help and version go to stdout, status 0.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return ExitCode::from(2);
    }
    let rendered = e.render().to_string();
    let body = rendered.strip_prefix("error: ").unwrap_or(&rendered);
    eprint!("cairn: error: {body}");
    ExitCode::from(2)
}

/// The error and its causes on one line ("what: why: root cause"), skipping a cause whose
/// text the line already holds (some errors print their source themselves).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if line.contains(&s) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&s);
    }
    line.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_tuned() {
        // mimalloc's default purge delay is 1,000 ms: option 15 is that one in the linked
        // version (a different index would tune some other option silently).
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        let get = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(get(), 1000);
        tune_allocator();
        assert_eq!(get(), 10_000);
    }
}
