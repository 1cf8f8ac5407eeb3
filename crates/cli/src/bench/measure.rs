//! Running a workload: N threads each doing synchronous operations for a fixed time, with the
//! latency of every operation recorded in nanosecond histograms. Ctrl-C stops a run.

use super::BLK;
use anyhow::{anyhow, bail, Result};
use cairn_store::AlignedBuf;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGINT/SIGTERM stop the benchmark cleanly (so it removes its files); a second
/// signal kills as usual.
pub fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the sigaction
    // struct is zeroed, then the fields we use are set.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

pub fn check_interrupt() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// What an operation was, for the per-kind histograms.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
}

/// Per-thread state of a workload.
pub struct Worker {
    pub rng: SmallRng,
    /// An aligned block for O_DIRECT reads.
    pub abuf: AlignedBuf,
    /// The block to write: random bytes, tagged per write.
    data: Vec<u8>,
    /// The chunk of a large write ([`Worker::chunk_for`]).
    big: Vec<u8>,
    n: u64,
}

impl Worker {
    fn new(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut data = vec![0u8; BLK as usize];
        rng.fill_bytes(&mut data);
        Worker {
            rng,
            abuf: AlignedBuf::zeroed(BLK as usize),
            data,
            big: Vec::new(),
            n: 0,
        }
    }

    /// The bytes of a write of `len` bytes (whole blocks) from working-set block `b`: the
    /// worker's random bytes, each block tagged with its address and a write counter.
    pub fn chunk_for(&mut self, b: u64, len: usize) -> &[u8] {
        if self.big.len() != len {
            self.big = vec![0u8; len];
            self.rng.fill_bytes(&mut self.big);
        }
        self.n += 1;
        for (i, blk) in self.big.chunks_mut(BLK as usize).enumerate() {
            super::ops::tag(blk, b + i as u64);
            blk[16..24].copy_from_slice(&self.n.to_le_bytes());
        }
        &self.big
    }

    /// The bytes of a write of working-set block `b`: tagged with `b` and a write counter.
    pub fn block_for(&mut self, b: u64) -> &[u8] {
        self.n += 1;
        super::ops::tag(&mut self.data, b);
        self.data[16..24].copy_from_slice(&self.n.to_le_bytes());
        &self.data
    }
}

pub fn new_hist() -> Histogram<u64> {
    // Nanoseconds from 1 ns to 1 hour, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// The outcome of one timed run.
pub struct Measured {
    pub threads: usize,
    pub ops: u64,
    pub elapsed: Duration,
    pub all: Histogram<u64>,
    pub reads: Histogram<u64>,
    pub writes: Histogram<u64>,
}

impl Measured {
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

type ThreadResult = Result<(Histogram<u64>, Histogram<u64>, u64)>;

/// Runs `op` on `threads` threads for `dur` (all start at a common barrier) and records the
/// latency of every operation. The first error stops all threads and is returned.
pub fn measure<F>(threads: usize, dur: Duration, seed: u64, op: F) -> Result<Measured>
where
    F: Fn(&mut Worker) -> Result<Kind> + Sync,
{
    let barrier = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let (results, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, stop, op) = (&barrier, &stop, &op);
                s.spawn(move || -> ThreadResult {
                    let mut w = Worker::new(seed.wrapping_mul(1_000_003).wrapping_add(t as u64));
                    let (mut hr, mut hw) = (new_hist(), new_hist());
                    let mut n = 0u64;
                    barrier.wait();
                    let deadline = Instant::now() + dur;
                    loop {
                        let t0 = Instant::now();
                        if t0 >= deadline || stop.load(Ordering::Relaxed) || interrupted() {
                            break;
                        }
                        let kind = match op(&mut w) {
                            Ok(k) => k,
                            Err(e) => {
                                stop.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        };
                        let ns = (t0.elapsed().as_nanos() as u64).max(1);
                        match kind {
                            Kind::Read => hr.saturating_record(ns),
                            Kind::Write => hw.saturating_record(ns),
                        }
                        n += 1;
                    }
                    Ok((hr, hw, n))
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let results: Vec<ThreadResult> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a benchmark thread panicked")))
            })
            .collect();
        (results, start.elapsed())
    });
    let mut m = Measured {
        threads,
        ops: 0,
        elapsed,
        all: new_hist(),
        reads: new_hist(),
        writes: new_hist(),
    };
    let merge = |into: &mut Histogram<u64>, h: &Histogram<u64>| {
        into.add(h).map_err(|e| anyhow!("merging histograms: {e}"))
    };
    for r in results {
        let (hr, hw, n) = r?;
        merge(&mut m.reads, &hr)?;
        merge(&mut m.writes, &hw)?;
        m.ops += n;
    }
    let (reads, writes) = (m.reads.clone(), m.writes.clone());
    merge(&mut m.all, &reads)?;
    merge(&mut m.all, &writes)?;
    check_interrupt()?;
    if m.ops == 0 {
        bail!("no operation completed in {dur:?}");
    }
    Ok(m)
}
