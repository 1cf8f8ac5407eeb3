//! A fault-injecting device for tests and benchmarks.
//!
//! It wraps any [`BlockDevice`] and keeps every write since the last flush in a volatile
//! overlay, so that a simulated power cut can lose or tear exactly the writes a real device
//! could lose. It can also flip bits in durable data, fail I/O, and slow flushes down (holding
//! off reads and writes during a slow flush, as a commodity SSD without power-loss protection
//! does).
//!
//! Several devices of one store share a [`Power`] switch, so a cut freezes them all at once,
//! e.g. at the Nth flush of any of them.

use crate::device::{AlignedBuf, BlockDevice};
use cairn_failstop::{LockOrDie, RwLockOrDie};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

const SECTOR: usize = 512;

/// The shared power switch of a group of fault devices.
#[derive(Default)]
pub struct Power {
    cut: AtomicBool,
    flushes: AtomicU64,
    cut_at_flush: AtomicU64,
}

impl Power {
    /// A switch that is on and never cuts by itself.
    pub fn new() -> Arc<Self> {
        Arc::new(Power::default())
    }
    /// Cuts the power now: every later I/O on every device fails.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
    /// Whether the power has been cut.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
    /// Cuts the power when the `n`th flush (counting from now, over all devices) starts;
    /// that flush does not happen. 0 disables.
    pub fn cut_at_flush(&self, n: u64) {
        self.flushes.store(0, Ordering::SeqCst);
        self.cut_at_flush.store(n, Ordering::SeqCst);
    }
    fn on_flush(&self) -> bool {
        let n = self.flushes.fetch_add(1, Ordering::SeqCst) + 1;
        let at = self.cut_at_flush.load(Ordering::SeqCst);
        if at != 0 && n >= at {
            self.cut();
        }
        self.is_cut()
    }
}

/// What a crash does to the writes that were not flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unflushed write is lost.
    LoseAll,
    /// Each unflushed write is independently kept, lost, or torn (a random subset of its
    /// 512-byte sectors reaches the device).
    Random,
}

#[derive(Default)]
struct Faults {
    fail_reads: bool,
    fail_writes: bool,
    fail_flush: bool,
    flush_delay: Duration,
    read_delay: Duration,
    /// Writes do not wait for a flush in progress (as on most real devices, where a write
    /// queues beside a cache flush).
    writes_during_flush: bool,
}

/// A device that injects faults; see the module documentation.
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    power: Arc<Power>,
    overlay: Mutex<Vec<(u64, AlignedBuf)>>,
    faults: Mutex<Faults>,
    gate: RwLock<()>,
    dead: AtomicBool,
    /// Set while a flush holds the device (reads and writes wait meanwhile).
    in_flush: AtomicBool,
    /// Writes go straight to the inner device (no crash simulation): for benchmarks that only
    /// want slow flushes, so that write I/O costs what it costs on the real device.
    passthrough: bool,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected fault: {what}"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock_or_die()
}

impl FaultDevice {
    /// Wraps `inner`; `power` may be shared with the store's other devices.
    pub fn new(inner: Arc<dyn BlockDevice>, power: Arc<Power>) -> Self {
        FaultDevice {
            inner,
            power,
            overlay: Mutex::new(Vec::new()),
            faults: Mutex::new(Faults::default()),
            gate: RwLock::new(()),
            dead: AtomicBool::new(false),
            in_flush: AtomicBool::new(false),
            passthrough: false,
        }
    }

    /// Wraps `inner` without crash simulation: writes reach `inner` at once; flush delays
    /// and injected failures still apply.
    pub fn passthrough(inner: Arc<dyn BlockDevice>, power: Arc<Power>) -> Self {
        FaultDevice {
            passthrough: true,
            ..FaultDevice::new(inner, power)
        }
    }

    /// Makes every flush take at least `d`, blocking reads and writes meanwhile.
    pub fn set_flush_delay(&self, d: Duration) {
        lock(&self.faults).flush_delay = d;
    }
    /// Makes every read take at least `d` (a slow or busy device).
    pub fn set_read_delay(&self, d: Duration) {
        lock(&self.faults).read_delay = d;
    }
    /// Lets writes go on while a flush holds the device (reads still wait).
    pub fn let_writes_through_flush(&self, yes: bool) {
        lock(&self.faults).writes_during_flush = yes;
    }
    /// Whether a flush is in progress on this device.
    pub fn is_flushing(&self) -> bool {
        self.in_flush.load(Ordering::SeqCst)
    }

    /// Makes reads, writes or flushes fail with EIO (without cutting power).
    pub fn set_failures(&self, reads: bool, writes: bool, flush: bool) {
        let mut f = lock(&self.faults);
        f.fail_reads = reads;
        f.fail_writes = writes;
        f.fail_flush = flush;
    }

    /// Flips bit `bit` (0..8) of the byte at `off`, in durable and volatile data alike.
    pub fn flip_bit(&self, off: u64, bit: u8) -> io::Result<()> {
        let base = off / 4096 * 4096;
        let mut b = AlignedBuf::zeroed(4096);
        self.inner.read_at(&mut b, base)?;
        b[(off - base) as usize] ^= 1 << (bit % 8);
        self.inner.write_at(&b, base)?;
        for (o, data) in lock(&self.overlay).iter_mut() {
            if off >= *o && off < *o + data.len() as u64 {
                data[(off - *o) as usize] ^= 1 << (bit % 8);
            }
        }
        Ok(())
    }

    /// Resolves a power cut: applies what `mode` lets survive of the unflushed writes to the
    /// inner device and marks this device dead (every later I/O fails). Returns the number of
    /// unflushed writes that were lost or torn. Reopen the store on a new `FaultDevice` over the
    /// same inner device.
    pub fn crash(&self, mode: CrashMode, rng: &mut impl FnMut() -> u64) -> io::Result<usize> {
        self.power.cut();
        self.dead.store(true, Ordering::SeqCst);
        let _g = self.gate.write_or_die();
        let writes = std::mem::take(&mut *lock(&self.overlay));
        let mut damaged = 0;
        for (off, data) in writes {
            let fate = if mode == CrashMode::LoseAll {
                1
            } else {
                rng() % 3
            };
            match fate {
                0 => self.inner.write_at(&data, off)?,
                1 => damaged += 1,
                _ => {
                    damaged += 1;
                    // Whole blocks around it (a write to NVM may be shorter than a block).
                    let base = off / 4096 * 4096;
                    let at = (off - base) as usize;
                    let mut cur = AlignedBuf::zeroed(at + data.len());
                    self.inner.read_at(&mut cur, base)?;
                    for s in (0..data.len()).step_by(SECTOR) {
                        let e = (s + SECTOR).min(data.len());
                        if rng().is_multiple_of(2) {
                            cur[at + s..at + e].copy_from_slice(&data[s..e]);
                        }
                    }
                    self.inner.write_at(&cur, base)?;
                }
            }
        }
        self.inner.flush()?;
        Ok(damaged)
    }

    fn alive(&self) -> io::Result<()> {
        if self.dead.load(Ordering::SeqCst) || self.power.is_cut() {
            return Err(eio("power cut"));
        }
        Ok(())
    }
}

impl BlockDevice for FaultDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let _g = self.gate.read_or_die();
        self.alive()?;
        let (fail, delay) = {
            let f = lock(&self.faults);
            (f.fail_reads, f.read_delay)
        };
        if fail {
            return Err(eio("read error"));
        }
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        self.inner.read_at(buf, off)?;
        let end = off + buf.len() as u64;
        for (o, data) in lock(&self.overlay).iter() {
            let (wo, we) = (*o, *o + data.len() as u64);
            if wo < end && we > off {
                let (s, e) = (wo.max(off), we.min(end));
                buf[(s - off) as usize..(e - off) as usize]
                    .copy_from_slice(&data[(s - wo) as usize..(e - wo) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let (fail, through) = {
            let f = lock(&self.faults);
            (f.fail_writes, f.writes_during_flush)
        };
        let _g = (!through).then(|| self.gate.read_or_die());
        self.alive()?;
        if fail {
            return Err(eio("write error"));
        }
        if self.passthrough {
            return self.inner.write_at(buf, off);
        }
        crate::device::check_aligned(buf.len(), off, self.size(), self.write_align())?;
        crate::device::check_mem_aligned(self.name(), buf, self.mem_align())?;
        lock(&self.overlay).push((off, AlignedBuf::copy_of(buf)));
        Ok(())
    }
    fn mem_align(&self) -> usize {
        self.inner.mem_align()
    }
    fn write_align(&self) -> usize {
        self.inner.write_align()
    }
    fn flush(&self) -> io::Result<()> {
        let (fail, delay) = {
            let f = lock(&self.faults);
            (f.fail_flush, f.flush_delay)
        };
        let _g = self.gate.write_or_die();
        self.alive()?;
        if self.power.on_flush() {
            return Err(eio("power cut at flush"));
        }
        if fail {
            return Err(eio("flush error"));
        }
        if !delay.is_zero() {
            self.in_flush.store(true, Ordering::SeqCst);
            std::thread::sleep(delay);
            self.in_flush.store(false, Ordering::SeqCst);
        }
        let writes = std::mem::take(&mut *lock(&self.overlay));
        for (off, data) in writes {
            self.inner.write_at(&data, off)?;
        }
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    #[test]
    fn unflushed_writes_are_lost_and_flushed_survive() {
        let inner: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("m", 1 << 16));
        let d = FaultDevice::new(inner.clone(), Power::new());
        d.write_at(&AlignedBuf::from_slice(b"durable"), 0).unwrap();
        d.flush().unwrap();
        d.write_at(&AlignedBuf::from_slice(b"volatile"), 4096)
            .unwrap();
        let mut r = AlignedBuf::zeroed(4096);
        d.read_at(&mut r, 4096).unwrap();
        assert_eq!(&r[..8], b"volatile");
        assert_eq!(d.crash(CrashMode::LoseAll, &mut || 0).unwrap(), 1);
        assert!(d.read_at(&mut r, 0).is_err());
        inner.read_at(&mut r, 0).unwrap();
        assert_eq!(&r[..7], b"durable");
        inner.read_at(&mut r, 4096).unwrap();
        assert_eq!(&r[..8], &[0u8; 8]);
    }

    #[test]
    fn passthrough_writes_at_once_and_delays_flushes() {
        let inner: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("m", 1 << 16));
        let d = FaultDevice::passthrough(inner.clone(), Power::new());
        d.set_flush_delay(std::time::Duration::from_millis(20));
        d.write_at(&AlignedBuf::from_slice(b"now"), 0).unwrap();
        let mut r = AlignedBuf::zeroed(4096);
        inner.read_at(&mut r, 0).unwrap();
        assert_eq!(&r[..3], b"now");
        let t = std::time::Instant::now();
        d.flush().unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(20));
    }

    #[test]
    fn power_cuts_at_nth_flush_for_all_devices() {
        let p = Power::new();
        let a = FaultDevice::new(Arc::new(MemDevice::new("a", 1 << 16)), p.clone());
        let b = FaultDevice::new(Arc::new(MemDevice::new("b", 1 << 16)), p.clone());
        p.cut_at_flush(2);
        a.flush().unwrap();
        assert!(b.flush().is_err());
        assert!(a.write_at(&AlignedBuf::zeroed(4096), 0).is_err());
    }
}
