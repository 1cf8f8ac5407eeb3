//! `cairn bench store`: the store benchmark of issue 2, with a raw baseline of each workload
//! measured in the same run, so that results are ratios that hold on a noisy machine.
//!
//! Flow: create the baseline files -> single-device store (prefill, checkpoint, randwrite qd1 /
//! qd32, checkpoint, randread qd1 / qd32, each followed by its baseline) -> mirrored store on
//! two slow-flushing devices (prefill, then the mix with and without read/flush separation)
//! -> one JSON object. Files are removed at the end, also after an error or Ctrl-C.

mod connect;
mod device;
mod echo;
pub mod measure;
pub mod nbd;
mod nbd_ec;
mod nbd_qos;
mod nbd_snap;
pub mod objects;
mod ops;
pub mod recovery;
pub mod report;
pub mod scale;
mod scale_mon;
mod target;

use crate::size::{human, parse_size};
use anyhow::{anyhow, bail, Context, Result};
use cairn_store::fault::{FaultDevice, Power};
use cairn_store::{BlockDevice, Devices, FileDevice, Store, StoreConfig, Transaction};
use clap::Args;
use measure::{check_interrupt, install_signal_handlers, measure, Kind, Worker};
use ops::{BenchFiles, RawFiles, WorkingSet};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use report::{entry, print_table, round, Obj, Row};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Object size of the working set (a block volume's default object size).
const OBJ_SIZE: u64 = 4 << 20;
const BLK: u64 = 4096;
const BLOCKS_PER_OBJ: u64 = OBJ_SIZE / BLK;
const COLL: u64 = 1;
/// Prefill writes objects in transactions of this size.
const PREFILL_TXN: u64 = 1 << 20;
/// Flush delay of the fault-injecting devices in the mixed workloads (a commodity SSD).
const MIX_FLUSH_DELAY: Duration = Duration::from_millis(5);
/// Checkpoint interval in the mixed workloads: each checkpoint flushes the data devices.
const MIX_CKPT_INTERVAL: Duration = Duration::from_millis(25);
const MIX_READ_PERCENT: u32 = 70;
/// Marks the first bytes of every block the benchmark writes, so that reads can check they
/// got the block they asked for.
const TAG_MAGIC: &[u8; 8] = b"cairnbnc";

const RANDWRITE_QD1: &str = "randwrite-4k-qd1";
const RANDWRITE_QD32: &str = "randwrite-4k-qd32";
const RANDREAD_QD1: &str = "randread-4k-qd1";
const RANDREAD_QD32: &str = "randread-4k-qd32";
const MIX_SEP: &str = "mix70-4k-qd32-separated";
const MIX_UNSEP: &str = "mix70-4k-qd32-unseparated";
/// Large writes: (name, bytes per write, whether they go straight to the data device).
const LARGE: [(&str, u64, bool); 4] = [
    ("write-128k-qd8-wal", 128 << 10, false),
    ("write-128k-qd8-direct", 128 << 10, true),
    ("write-1m-qd8-wal", 1 << 20, false),
    ("write-1m-qd8-direct", 1 << 20, true),
];
const LARGE_THREADS: usize = 8;
const WORKLOADS: [&str; 10] = [
    RANDWRITE_QD1,
    RANDWRITE_QD32,
    RANDREAD_QD1,
    RANDREAD_QD32,
    LARGE[0].0,
    LARGE[1].0,
    LARGE[2].0,
    LARGE[3].0,
    MIX_SEP,
    MIX_UNSEP,
];

pub const LONG_ABOUT: &str = "\
Benchmark cairn-store on files it creates in --wal-dir (the WAL: put it on /dev/shm, standing for \
an NVDIMM) and --data-dir (the data devices: put it on the flash device). It removes its files at \
the end (also on Ctrl-C), runs each workload for --seconds, then its raw baseline for as long, \
prints a progress line per workload on stderr and, with --json, ONE JSON object on stdout.

Workloads (4 KiB at random aligned offsets of a prefilled working set of objects of 4 MiB in one \
collection; qdN = N threads each doing synchronous operations):
  randwrite-4k-qd1, randwrite-4k-qd32   store.commit() of one 4 KiB write
  randread-4k-qd1,  randread-4k-qd32    store.read() of 4 KiB, after a checkpoint, so reads hit the data device
  mix70-4k-qd32-separated, mix70-4k-qd32-unseparated
      70% reads / 30% writes on a store with TWO mirrored data devices whose flushes are slowed to \
5 ms by the fault-injecting device, checkpointing every 25 ms (each checkpoint flushes the data \
devices), with read/flush separation on / off.
  write-128k-qd8-wal, write-128k-qd8-direct, write-1m-qd8-wal, write-1m-qd8-direct
      store.commit() of one 128 KiB / 1 MiB write at a random aligned offset, 8 threads, on the \
single-device store reopened with such writes going through the WAL and the flusher (-wal) or \
straight to the data device with only their metadata in the WAL (-direct).
The single-device workloads use StoreConfig::default() (large writes: as said).

Baselines (same size, same queue depth, same run):
  writes: pwrite + fdatasync of 4 KiB at random aligned offsets of a file in --wal-dir
  reads:  pread (O_DIRECT where supported) of 4 KiB at random aligned offsets of a prefilled file in --data-dir
  mixes:  70% of the reads above, 30% of the writes above
  large writes: pwrite (O_DIRECT where supported) + fdatasync of the same size at random aligned \
offsets of a file in --data-dir

JSON: {\"workloads\": [...], ...}; each workload has name, threads, ops, iops, \
lat_us {p50,p99,p999,max}, dev_writes, dev_write_mean_bytes, dev_read_bytes, dev_flushes (data \
devices only, summed over a mirror, deltas over the timed part), baseline_iops, \
baseline_lat_us {p50,p99}, ratio_to_baseline = iops / baseline_iops (above 1: faster than the raw \
baseline), lat_p50_ratio_to_baseline = lat_us.p50 / baseline_lat_us.p50 (below 1: faster), and \
for the mixes read_lat_us and write_lat_us {p50,p99,p999,max}. Store counters over the timed \
part: commits, wal_flushes, commits_per_wal_flush (group commit), checkpoints, segments_cleaned, \
commit_waits {flusher, wal_space} (times a commit waited, by cause: for the flusher to write \
pending data, or for WAL space, which only a checkpoint frees; no commit waits for a checkpoint \
being written otherwise), lock_waits, wal_lock_waits, collection_lock_waits and \
collection_lock_waits_background {waits, total_ms, p99_us, over_1ms, over_1ms_per_s} \
(acquisitions of the store's state lock, of its WAL queue's lock and of its collections' locks \
by commits and reads, and by the flusher and the cleaner, that found it taken, and how long \
they waited: docs/operator/store.md, \"Lock waits\"); large writes \
also block_bytes, mb_per_s, baseline_mb_per_s and direct_bytes (bytes that skipped the WAL). Latencies are in \
microseconds (recorded in nanoseconds, reported with 0.1 us resolution).";

#[derive(Args)]
pub struct BenchStoreArgs {
    /// Print the results as one JSON object on stdout (otherwise as a table).
    #[arg(long)]
    json: bool,
    /// Directory for the WAL files and the write baseline's file (the fast log device;
    /// /dev/shm stands for an NVDIMM). Created if missing.
    #[arg(long, value_name = "DIR")]
    wal_dir: PathBuf,
    /// Directory for the data device files and the read baseline's file (the flash device).
    /// Created if missing.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Seconds each workload runs, and then its baseline (fractions allowed).
    #[arg(long, value_name = "N", default_value_t = 5.0, value_parser = parse_seconds)]
    seconds: f64,
    /// Bytes the random offsets spread over (objects of 4 MiB, all prefilled). Keep the default
    /// for measurements; small values are for smoke tests.
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = parse_size, allow_hyphen_values = true)]
    working_set: u64,
    /// Size of each store's WAL file (preallocated in --wal-dir).
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = parse_size, allow_hyphen_values = true)]
    wal_size: u64,
    /// Size of each data device file (sparse). Default: 4 x working set + 4 GiB, so that the
    /// write workloads do not run out of free segments.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, allow_hyphen_values = true)]
    data_size: Option<u64>,
    /// Run only these workloads (comma-separated names; default: all six).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    only: Vec<String>,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!(
            "{s:?}: give a number of seconds above 0 (at most 86400)"
        ));
    }
    Ok(v)
}

/// State of one benchmark run.
struct Ctx<'a> {
    args: &'a BenchStoreArgs,
    dur: Duration,
    ws: WorkingSet,
    data_size: u64,
    selected: Vec<&'static str>,
    results: Vec<Obj>,
    rows: Vec<Row>,
    files: BenchFiles,
    data_direct: Option<bool>,
    baseline_read_direct: Option<bool>,
}

impl Ctx<'_> {
    fn wants(&self, name: &str) -> bool {
        self.selected.contains(&name)
    }

    fn push(&mut self, (o, row): (Obj, Row)) {
        self.results.push(o);
        self.rows.push(row);
    }
}

fn select(only: &[String]) -> Result<Vec<&'static str>> {
    if only.is_empty() {
        return Ok(WORKLOADS.to_vec());
    }
    if let Some(n) = only.iter().find(|n| !WORKLOADS.contains(&n.as_str())) {
        bail!(
            "unknown workload {n:?} in --only; the workloads are {}",
            WORKLOADS.join(", ")
        );
    }
    Ok(WORKLOADS
        .iter()
        .copied()
        .filter(|w| only.iter().any(|n| n == w))
        .collect())
}

pub fn run(args: BenchStoreArgs) -> Result<()> {
    install_signal_handlers();
    let selected = select(&args.only)?;
    if args.working_set < (1 << 20) {
        bail!(
            "--working-set {} is too small; give at least 1 MiB",
            args.working_set
        );
    }
    if args.wal_size < (16 << 20) {
        bail!(
            "--wal-size {} is too small; give at least 16 MiB",
            args.wal_size
        );
    }
    let data_size = args.data_size.unwrap_or(4 * args.working_set + (4 << 30));
    if data_size < args.working_set * 2 + (64 << 20) {
        bail!(
            "--data-size {} is too small for a working set of {}; give at least twice the working set + 64 MiB",
            human(data_size),
            human(args.working_set)
        );
    }
    for (d, what) in [(&args.wal_dir, "--wal-dir"), (&args.data_dir, "--data-dir")] {
        std::fs::create_dir_all(d)
            .with_context(|| format!("cannot create {what} {}", d.display()))?;
    }
    let mut ctx = Ctx {
        args: &args,
        dur: Duration::from_secs_f64(args.seconds),
        ws: WorkingSet::new(args.working_set),
        data_size,
        selected,
        results: Vec::new(),
        rows: Vec::new(),
        files: BenchFiles::new(),
        data_direct: None,
        baseline_read_direct: None,
    };
    let started = Instant::now();
    eprintln!(
        "cairn bench: store, {} s per workload and as long for its baseline, working set {} ({} objects of {}), WAL in {}, data in {}",
        args.seconds,
        human(ctx.ws.blocks * BLK),
        ctx.ws.names.len(),
        human(OBJ_SIZE),
        args.wal_dir.display(),
        args.data_dir.display()
    );
    let raw = raw_files(&mut ctx)?;
    single_device_workloads(&mut ctx, &raw)?;
    mirror_workloads(&mut ctx, &raw)?;
    drop(raw);
    let total = started.elapsed().as_secs_f64();
    eprintln!("cairn bench: done in {total:.1} s");
    if !args.json {
        print_table(&ctx.rows);
        return Ok(());
    }
    let definitions = Obj::new()
        .put("ratio_to_baseline", "iops / baseline_iops (above 1: faster than the raw baseline)")
        .put(
            "lat_p50_ratio_to_baseline",
            "lat_us.p50 / baseline_lat_us.p50 (below 1: faster than the raw baseline)",
        )
        .put(
            "baseline_write",
            "pwrite + fdatasync of 4 KiB at random aligned offsets of a file in wal_dir, same thread count",
        )
        .put(
            "baseline_read",
            "pread (O_DIRECT where supported) of 4 KiB at random aligned offsets of a prefilled file in data_dir, same thread count",
        )
        .put("baseline_mix", "70% baseline_read, 30% baseline_write, same thread count")
        .put(
            "dev_*",
            "data devices only (summed over both devices of a mirror), deltas of the store's counters over the timed part",
        )
        .put(
            "lat_us",
            "microseconds, from per-operation nanosecond histograms",
        );
    let out = Obj::new()
        .put_arr("workloads", &ctx.results)
        .put("bench", "store")
        .put("version", env!("CARGO_PKG_VERSION"))
        .put("seconds_per_workload", args.seconds)
        .put("working_set_bytes", ctx.ws.blocks * BLK)
        .put("object_size", OBJ_SIZE)
        .put("wal_dir", args.wal_dir.display().to_string())
        .put("data_dir", args.data_dir.display().to_string())
        .put("wal_size", args.wal_size)
        .put("data_size", ctx.data_size)
        .put("data_direct", ctx.data_direct)
        .put("baseline_read_direct", ctx.baseline_read_direct)
        .put("total_seconds", round(total, 1))
        .put_obj("definitions", definitions);
    println!("{}", out.render());
    Ok(())
}

/// Creates the baseline files the selected workloads need.
fn raw_files(ctx: &mut Ctx) -> Result<RawFiles> {
    let wants = |p: &[&str]| {
        ctx.selected
            .iter()
            .any(|w| p.iter().any(|p| w.starts_with(p)))
    };
    let needs_write = wants(&["randwrite", "mix"]);
    let needs_read = wants(&["randread", "mix"]);
    let mut raw = RawFiles {
        write: None,
        read: None,
        large: None,
        blocks: ctx.ws.blocks,
    };
    if wants(&["write-"]) {
        let p = ctx.files.path(&ctx.args.data_dir, "baseline-large-write");
        raw.large = Some(ops::large_write_file(&p, ctx.ws.blocks)?);
    }
    if needs_write {
        let p = ctx.files.path(&ctx.args.wal_dir, "baseline-write");
        ops::preallocate(&p, ctx.ws.blocks * BLK)?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .with_context(|| format!("cannot open {}", p.display()))?;
        raw.write = Some(f);
    }
    if needs_read {
        let p = ctx.files.path(&ctx.args.data_dir, "baseline-read");
        let t = Instant::now();
        let (f, direct) = ops::fill_read_file(&p, ctx.ws.blocks)?;
        eprintln!(
            "cairn bench: read baseline file of {} written in {:.1} s (O_DIRECT: {direct})",
            human(ctx.ws.blocks * BLK),
            t.elapsed().as_secs_f64()
        );
        raw.read = Some(f);
        ctx.baseline_read_direct = Some(direct);
    }
    Ok(raw)
}

/// Creates a (sparse) data device file.
fn data_device(ctx: &mut Ctx, what: &str) -> Result<Arc<FileDevice>> {
    let p = ctx.files.path(&ctx.args.data_dir, what);
    let _ = std::fs::remove_file(&p);
    let d = FileDevice::open(&p, ctx.data_size, what)
        .with_context(|| format!("cannot create data device {}", p.display()))?;
    ctx.data_direct = Some(d.is_direct());
    Ok(Arc::new(d))
}

/// Creates a preallocated WAL device file.
fn wal_device(ctx: &mut Ctx, what: &str) -> Result<Arc<FileDevice>> {
    let p = ctx.files.path(&ctx.args.wal_dir, what);
    ops::preallocate(&p, ctx.args.wal_size)?;
    let d = FileDevice::open(&p, ctx.args.wal_size, "wal")
        .with_context(|| format!("cannot create WAL device {}", p.display()))?;
    Ok(Arc::new(d))
}

/// Creates the collection and writes every block of the working set (tagged) with 2 threads
/// in 1 MiB transactions, then checkpoints so that the data is on the data devices.
fn prefill(store: &Store, ws: &WorkingSet) -> Result<()> {
    let t = Instant::now();
    let mut txn = Transaction::new();
    txn.create_collection(COLL);
    store.commit(&txn).context("cannot create the collection")?;
    let threads = 2u64;
    let per_txn = PREFILL_TXN / BLK;
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || -> Result<()> {
                    let mut buf = vec![0u8; PREFILL_TXN as usize];
                    SmallRng::seed_from_u64(100 + th).fill_bytes(&mut buf);
                    // Transactions never cross an object: per_txn divides BLOCKS_PER_OBJ.
                    let mut b = th * per_txn;
                    while b < ws.blocks {
                        check_interrupt()?;
                        let n = per_txn.min(ws.blocks - b);
                        for i in 0..n {
                            let s = (i * BLK) as usize;
                            ops::tag(&mut buf[s..s + BLK as usize], b + i);
                        }
                        let (o, off) = ws.locate(b);
                        let mut t = Transaction::new();
                        t.write(COLL, &ws.names[o], off, &buf[..(n * BLK) as usize]);
                        store
                            .commit(&t)
                            .with_context(|| format!("prefill of object {o} at {off}"))?;
                        b += threads * per_txn;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join()
                .unwrap_or_else(|_| Err(anyhow!("a prefill thread panicked")))?;
        }
        Ok(())
    })?;
    store.checkpoint().context("checkpoint after the prefill")?;
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "cairn bench: prefilled {} in {secs:.1} s ({}/s, including the checkpoint)",
        human(ws.blocks * BLK),
        human(((ws.blocks * BLK) as f64 / secs) as u64)
    );
    Ok(())
}

/// The four single-device workloads, on one store with a separate WAL device and
/// `StoreConfig::default()`.
fn single_device_workloads(ctx: &mut Ctx, raw: &RawFiles) -> Result<()> {
    let mine = [RANDWRITE_QD1, RANDWRITE_QD32, RANDREAD_QD1, RANDREAD_QD32];
    if !mine
        .iter()
        .chain(LARGE.iter().map(|l| &l.0))
        .any(|w| ctx.wants(w))
    {
        return Ok(());
    }
    let mark = ctx.files.paths.len();
    let data = data_device(ctx, "data")?;
    let wal = wal_device(ctx, "wal")?;
    let devs = Devices {
        data: vec![data as Arc<dyn BlockDevice>],
        wal: Some(wal as Arc<dyn BlockDevice>),
    };
    let cfg = StoreConfig::default();
    Store::mkfs(&devs, &cfg).context("mkfs of the benchmark store")?;
    let store = Store::open(&devs, cfg).context("opening the benchmark store")?;
    prefill(&store, &ctx.ws)?;
    let dur = ctx.dur;
    for (name, threads) in [(RANDWRITE_QD1, 1), (RANDWRITE_QD32, 32)] {
        if !ctx.wants(name) {
            continue;
        }
        let ws = &ctx.ws;
        let s0 = store.stats();
        let m = measure(threads, dur, 1, |w| ops::store_write(&store, ws, w))?;
        let s1 = store.stats();
        let base = measure(threads, dur, 1, |w| ops::raw_write(raw, w))?;
        ctx.push(entry(name, &m, &base, &s0, &s1));
    }
    if ctx.wants(RANDREAD_QD1) || ctx.wants(RANDREAD_QD32) {
        // What the writes left in memory goes to the data device, so that reads hit it.
        store
            .checkpoint()
            .context("checkpoint before the read workloads")?;
    }
    for (name, threads) in [(RANDREAD_QD1, 1), (RANDREAD_QD32, 32)] {
        if !ctx.wants(name) {
            continue;
        }
        let ws = &ctx.ws;
        let s0 = store.stats();
        let m = measure(threads, dur, 2, |w| ops::store_read(&store, ws, w))?;
        let s1 = store.stats();
        let base = measure(threads, dur, 2, |w| ops::raw_read(raw, w))?;
        ctx.push(entry(name, &m, &base, &s0, &s1));
    }
    store.close().context("closing the benchmark store")?;
    large_write_workloads(ctx, raw, &devs)?;
    // Free the space before the mirrored store is created.
    ctx.files.remove_since(mark);
    Ok(())
}

/// Large sequential-sized writes at random aligned offsets, 8 threads, on the single-device
/// store reopened with large writes going through the WAL (and the flusher) or straight to
/// the data device; baseline: the same pwrite + fdatasync on the data device's file system.
fn large_write_workloads(ctx: &mut Ctx, raw: &RawFiles, devs: &Devices) -> Result<()> {
    let dur = ctx.dur;
    for (name, len, direct) in LARGE {
        if !ctx.wants(name) {
            continue;
        }
        let cfg = StoreConfig {
            direct_write_min_bytes: if direct { len } else { 0 },
            ..StoreConfig::default()
        };
        let store = Store::open(devs, cfg).context("reopening the benchmark store")?;
        let ws = &ctx.ws;
        let s0 = store.stats();
        let m = measure(LARGE_THREADS, dur, 1, |w| {
            ops::store_write_large(&store, ws, w, len)
        })?;
        let s1 = store.stats();
        // What the WAL path left pending is written before the next workload starts.
        store.close().context("closing the benchmark store")?;
        let base = measure(LARGE_THREADS, dur, 1, |w| ops::raw_write_large(raw, w, len))?;
        let (o, row) = entry(name, &m, &base, &s0, &s1);
        let o = o
            .put("block_bytes", len)
            .put("direct_bytes", s1.direct_bytes - s0.direct_bytes)
            .put("mb_per_s", round(m.iops() * len as f64 / 1e6, 1))
            .put(
                "baseline_mb_per_s",
                round(base.iops() * len as f64 / 1e6, 1),
            );
        ctx.push((o, row));
    }
    Ok(())
}

fn mix_op(w: &mut Worker) -> Kind {
    if w.rng.gen_range(0..100) < MIX_READ_PERCENT {
        Kind::Read
    } else {
        Kind::Write
    }
}

/// The two mixed workloads, on one store with two mirrored data devices whose flushes take
/// 5 ms, opened once with and once without read/flush separation.
fn mirror_workloads(ctx: &mut Ctx, raw: &RawFiles) -> Result<()> {
    if !ctx.wants(MIX_SEP) && !ctx.wants(MIX_UNSEP) {
        return Ok(());
    }
    let power = Power::new();
    let mut data: Vec<Arc<dyn BlockDevice>> = Vec::new();
    for i in 0..2 {
        // Writes pass straight through (they cost what they cost on the real device); only
        // the flush is slowed, as on a commodity SSD without power-loss protection.
        let inner = data_device(ctx, &format!("mirror{i}"))?;
        let f = FaultDevice::passthrough(inner as Arc<dyn BlockDevice>, power.clone());
        f.set_flush_delay(MIX_FLUSH_DELAY);
        data.push(Arc::new(f));
    }
    let wal = wal_device(ctx, "mirror-wal")?;
    let devs = Devices {
        data,
        wal: Some(wal as Arc<dyn BlockDevice>),
    };
    let cfg = |separation: bool| StoreConfig {
        checkpoint_interval: MIX_CKPT_INTERVAL,
        read_flush_separation: separation,
        ..StoreConfig::default()
    };
    Store::mkfs(&devs, &cfg(true)).context("mkfs of the mirrored benchmark store")?;
    let store = Store::open(&devs, cfg(true)).context("opening the mirrored store")?;
    prefill(&store, &ctx.ws)?;
    store.close().context("closing the mirrored store")?;
    let dur = ctx.dur;
    for (name, separation) in [(MIX_SEP, true), (MIX_UNSEP, false)] {
        if !ctx.wants(name) {
            continue;
        }
        let store = Store::open(&devs, cfg(separation)).context("reopening the mirrored store")?;
        let ws = &ctx.ws;
        let s0 = store.stats();
        let m = measure(32, dur, 3, |w| match mix_op(w) {
            Kind::Read => ops::store_read(&store, ws, w),
            Kind::Write => ops::store_write(&store, ws, w),
        })?;
        let s1 = store.stats();
        store.close().context("closing the mirrored store")?;
        let base = measure(32, dur, 3, |w| match mix_op(w) {
            Kind::Read => ops::raw_read(raw, w),
            Kind::Write => ops::raw_write(raw, w),
        })?;
        ctx.push(entry(name, &m, &base, &s0, &s1));
    }
    Ok(())
}
