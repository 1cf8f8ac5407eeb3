//! Reader threads: the device reads of client ops, off the shards' threads.
//!
//! A shard plans each read under the store's index lock and answers at once what memory and
//! the read cache hold. A read that needs a data device would stop the shard's event loop
//! for the device's latency (milliseconds when the device is busy), serving nobody, and
//! would keep the device at one read in flight per shard: reads after a random-write phase
//! were measured at 3 device reads in flight over 3 OSDs, the machine idle, 4-6k IOPS at
//! QD32. Such reads go to a pool of reader threads instead, so a device sees up to
//! `read_threads` reads at once per OSD and the shard goes on.
//!
//! The queue is bounded in jobs and in buffered bytes; when it is full the shard reads in
//! place, which is the backpressure: it stops taking new ops until the device answers.

use cairn_failstop::LockOrDie;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Device reads an OSD runs at once by default (its reader threads).
pub const DEFAULT_READ_THREADS: usize = 8;

/// Most reads queued for the reader threads.
const MAX_QUEUED_JOBS: usize = 1024;

/// Most bytes of read buffers held by queued and running jobs.
const MAX_QUEUED_BYTES: usize = 64 << 20;

/// A read to finish on a reader thread (it replies itself).
pub type ReadJob = Box<dyn FnOnce() + Send>;

/// The reader threads of one OSD; none when configured with 0 threads.
pub struct Readers {
    tx: Option<SyncSender<ReadJob>>,
    held: Arc<AtomicUsize>,
}

impl Readers {
    /// Starts `threads` reader threads (none for 0: every read runs on its shard). They end
    /// when this is dropped, after the jobs already queued.
    pub fn start(threads: usize) -> std::io::Result<Readers> {
        let held = Arc::new(AtomicUsize::new(0));
        if threads == 0 {
            return Ok(Readers { tx: None, held });
        }
        let (tx, rx) = sync_channel::<ReadJob>(MAX_QUEUED_JOBS);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("osd-reader-{i}"))
                .spawn(move || run(&rx))?;
        }
        Ok(Readers { tx: Some(tx), held })
    }

    /// Hands a read holding `bytes` of buffers to a reader thread; gives the job back when
    /// there are no reader threads or the queue is full (the caller then runs it itself).
    pub fn submit(&self, bytes: usize, job: ReadJob) -> Result<(), ReadJob> {
        let Some(tx) = &self.tx else { return Err(job) };
        if self.held.fetch_add(bytes, Ordering::AcqRel) + bytes > MAX_QUEUED_BYTES {
            self.held.fetch_sub(bytes, Ordering::AcqRel);
            return Err(job);
        }
        let held = self.held.clone();
        let counted: ReadJob = Box::new(move || {
            job();
            held.fetch_sub(bytes, Ordering::AcqRel);
        });
        tx.try_send(counted).map_err(|e| {
            self.held.fetch_sub(bytes, Ordering::AcqRel);
            match e {
                TrySendError::Full(j) | TrySendError::Disconnected(j) => j,
            }
        })
    }

    /// Bytes of read buffers queued or being read.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

fn run(rx: &Mutex<Receiver<ReadJob>>) {
    loop {
        // One thread waits in `recv`, the others on the lock: a job wakes exactly one.
        let job = rx.lock_or_die().recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn jobs_run_on_reader_threads_at_once() {
        let r = Readers::start(4).unwrap();
        let (tx, rx) = channel();
        let gate = Arc::new(std::sync::Barrier::new(4));
        for _ in 0..4 {
            let (tx, gate) = (tx.clone(), gate.clone());
            let job: ReadJob = Box::new(move || {
                // Passes only when all four run at the same time.
                gate.wait();
                tx.send(std::thread::current().name().map(String::from))
                    .unwrap();
            });
            assert!(r.submit(10, job).is_ok());
        }
        for _ in 0..4 {
            let name = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
            assert!(name.starts_with("osd-reader-"), "{name}");
        }
        // The bytes are given back once the jobs are done.
        let t = std::time::Instant::now();
        while r.held_bytes() != 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(r.held_bytes(), 0);
    }

    #[test]
    fn no_threads_or_too_many_bytes_give_the_job_back() {
        let none = Readers::start(0).unwrap();
        assert!(none.submit(1, Box::new(|| {})).is_err());

        let r = Readers::start(1).unwrap();
        let (release, wait) = channel::<()>();
        let busy: ReadJob = Box::new(move || {
            let _ = wait.recv();
        });
        assert!(r.submit(MAX_QUEUED_BYTES - 10, busy).is_ok());
        assert!(
            r.submit(11, Box::new(|| {})).is_err(),
            "over the byte bound"
        );
        assert!(r.submit(10, Box::new(|| {})).is_ok(), "within it");
        release.send(()).unwrap();
    }
}
