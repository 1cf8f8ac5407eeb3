//! `cairn store torture` (hidden): a verifiable mixed workload that runs until it is killed.
//!
//! Used by `crates/cli/tests/kill9.rs`, which SIGKILLs it mid-workload and checks the store
//! after restart. Protocol on stdout, one line each, flushed at once:
//!
//! - `OPEN <ms>`: the store is open (WAL replayed) after `<ms>` milliseconds.
//! - `START <thread> <counter>`: the thread resumes after `<counter>`, read from the store.
//! - `TRY <thread> <counter>`: the thread is about to commit transaction `<counter>`.
//! - `ACK <thread> <counter>`: that commit returned Ok, so the transaction is durable.
//! - `STATS <commits> <checkpoints> <segments cleaned> <free segments> <direct writes>`:
//!   every 100 ms, the
//!   store's counters since this process opened it.
//!
//! Transaction `<counter>` of `<thread>` is [`workload::txn`]`(seed, thread, counter)`. A
//! failed commit prints `ERR <thread> <counter> <error>` on stderr and exits with status 1.

pub mod workload;

use crate::store_cmd::{open_existing, DeviceArgs};
use anyhow::{bail, Context, Result};
use cairn_store::{Store, StoreConfig};
use clap::Args;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct TortureArgs {
    #[command(flatten)]
    devs: DeviceArgs,
    /// Seed of the workload; every run on one store must use the same seed.
    #[arg(long)]
    seed: u64,
    /// Writer threads (each owns its objects and keys).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Take a checkpoint at least this often (default: the store's default).
    #[arg(long, value_name = "MS")]
    checkpoint_interval_ms: Option<u64>,
    /// Longest time data waits in memory before the flusher writes it (default: the store's).
    #[arg(long, value_name = "MS")]
    flush_max_delay_ms: Option<u64>,
    /// Whole-block writes of at least this many bytes go straight to the data device
    /// (`StoreConfig::direct_write_min_bytes`; default: the store's, off).
    #[arg(long, value_name = "BYTES")]
    direct_write_min: Option<u64>,
}

/// Prints one protocol line and flushes it; exits quietly when stdout is gone.
fn emit(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if out.write_fmt(line).is_err() || out.write_all(b"\n").is_err() || out.flush().is_err() {
        std::process::exit(2);
    }
}

pub fn run(a: TortureArgs) -> Result<ExitCode> {
    if a.threads == 0 || a.threads > workload::MAX_THREADS {
        bail!("--threads must be 1..={}", workload::MAX_THREADS);
    }
    let devs = open_existing(&a.devs)?;
    let mut cfg = StoreConfig::default();
    if let Some(ms) = a.checkpoint_interval_ms {
        cfg.checkpoint_interval = Duration::from_millis(ms);
    }
    if let Some(ms) = a.flush_max_delay_ms {
        cfg.flush_max_delay = Duration::from_millis(ms);
    }
    if let Some(b) = a.direct_write_min {
        cfg.direct_write_min_bytes = b;
    }
    let t0 = Instant::now();
    let store = Arc::new(Store::open(&devs, cfg).context("cannot open the store")?);
    let missing: Vec<_> = workload::COLLS
        .iter()
        .copied()
        .filter(|&c| !store.collection_exists(c))
        .collect();
    if !missing.is_empty() {
        if missing.len() != workload::COLLS.len() {
            bail!(
                "collections {missing:?} are missing but others exist: \
                 the transaction creating them was applied in part"
            );
        }
        store
            .commit(&workload::setup_txn(&missing))
            .context("cannot create the workload's collections")?;
    }
    emit(format_args!("OPEN {}", t0.elapsed().as_millis()));
    let mut starts = Vec::new();
    for t in 0..a.threads {
        let v = store.kv_get(workload::COLLS[0], &workload::ctr_key(t))?;
        let c = match v {
            None => 0,
            Some(v) => workload::parse_ctr(&v)
                .with_context(|| format!("thread {t}'s counter key holds {v:?}"))?,
        };
        starts.push(c);
    }
    for (t, c) in starts.iter().enumerate() {
        emit(format_args!("START {t} {c}"));
    }
    let mut handles = Vec::new();
    for (t, start) in starts.into_iter().enumerate() {
        let store = store.clone();
        let seed = a.seed;
        handles.push(std::thread::spawn(move || {
            let mut c = start;
            loop {
                c += 1;
                let txn = workload::txn(seed, t, c);
                emit(format_args!("TRY {t} {c}"));
                match store.commit(&txn) {
                    Ok(_) => emit(format_args!("ACK {t} {c}")),
                    Err(e) => {
                        eprintln!("ERR {t} {c} {e}");
                        std::process::exit(1);
                    }
                }
            }
        }));
    }
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let s = store.stats();
        emit(format_args!(
            "STATS {} {} {} {} {}",
            s.commits, s.checkpoints, s.segments_cleaned, s.segments_free, s.direct_writes
        ));
        if handles.iter().all(|h| h.is_finished()) {
            break;
        }
    }
    for h in handles {
        let _ = h.join();
    }
    bail!("the workload threads stopped")
}
