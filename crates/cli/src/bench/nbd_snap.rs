//! `cairn bench nbd --snapshots`: what a snapshot costs a served volume. Snapshot creation
//! time (no client connected, and while fio runs against the volume), a clone of a snapshot,
//! the first write to each
//! data object after a snapshot (it copies the object first), and 4 KiB random writes at QD1
//! once every object was copied, against the same workload without a snapshot in the same run.

use super::nbd::{fio, fio_with, lat_obj, Fio};
use super::report::{round, Obj};
use super::target::Target;
use anyhow::{Context, Result};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The bench volume, its pool and its NBD URI.
pub struct SnapBench<'a> {
    pub t: &'a Target,
    pub pool: &'a str,
    pub volume: &'a str,
    pub uri: &'a str,
    pub size: u64,
    pub ramp: f64,
    pub seconds: f64,
    pub json: bool,
}

impl SnapBench<'_> {
    fn create(&self, name: &str) -> Result<f64> {
        let start = Instant::now();
        self.t
            .block_on(cairn_volume::create_snap(
                &self.t.client,
                self.pool,
                self.volume,
                name,
                &mut |_| {},
            ))
            .with_context(|| format!("cannot take snapshot {name}"))?;
        Ok(start.elapsed().as_secs_f64() * 1000.0)
    }

    /// Times a clone of snapshot `snap` (protected first), then removes the clone and
    /// unprotects the snapshot.
    fn clone_of(&self, snap: &str) -> Result<f64> {
        let (c, pool, vol) = (&self.t.client, self.pool, self.volume);
        let clone = "bench-clone";
        self.t
            .block_on(cairn_volume::protect_snap(c, pool, vol, snap, true))
            .context("cannot protect the snapshot to clone")?;
        let start = Instant::now();
        self.t
            .block_on(cairn_volume::clone_volume(c, pool, vol, snap, clone))
            .context("cannot clone the snapshot")?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        self.t
            .block_on(cairn_volume::remove(c, pool, clone, false, &mut |_| {}))
            .context("cannot remove the bench clone")?;
        self.t
            .block_on(cairn_volume::protect_snap(c, pool, vol, snap, false))
            .context("cannot unprotect the snapshot")?;
        Ok(ms)
    }

    fn qd1(&self) -> Result<Fio> {
        fio(
            self.uri,
            "randwrite",
            4096,
            1,
            self.size,
            Some((self.ramp, self.seconds)),
        )
    }

    /// One 4 KiB write into each data object, in order, one at a time.
    fn one_write_per_object(&self) -> Result<Fio> {
        let os = u64::from(cairn_volume::DEFAULT_OBJECT_SIZE);
        let rw = format!("write:{}", os - 4096);
        let n = format!("--number_ios={}", self.size.div_ceil(os));
        fio_with(self.uri, &rw, 4096, 1, self.size, None, &[n])
    }

    pub fn run(&self) -> Result<Obj> {
        let say = |m: &str| {
            if !self.json {
                eprintln!("{m}");
            }
        };
        let without = self.qd1()?;
        say("snapshots: no client connected...");
        let idle_ms = self.create("bench-idle")?;
        // A client is connected (the volume is open, its server must adopt the snapshot).
        let mut reader = Command::new("fio")
            .args([
                "--name=hold",
                "--ioengine=nbd",
                "--rw=randread",
                "--bs=4096",
                "--rate_iops=200",
                "--time_based",
                "--runtime=30",
            ])
            .arg(format!("--uri={}", self.uri))
            .arg(format!("--size={}", self.size))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot run fio")?;
        std::thread::sleep(Duration::from_secs(2));
        let served_ms = self.create("bench-served");
        let _ = reader.kill();
        let _ = reader.wait();
        let served_ms = served_ms?;
        let clone_ms = self.clone_of("bench-idle")?;
        say("snapshots: first write to each object after a snapshot...");
        let first = self.one_write_per_object()?;
        let with = self.qd1()?;
        let start = Instant::now();
        for s in ["bench-idle", "bench-served"] {
            self.t.block_on(cairn_volume::remove_snap(
                &self.t.client,
                self.pool,
                self.volume,
                s,
                &mut |_| {},
            ))?;
        }
        let rm_ms = start.elapsed().as_secs_f64() * 1000.0;
        let ratio = if without.p50_us > 0.0 {
            with.p50_us / without.p50_us
        } else {
            0.0
        };
        say(&format!(
            "snapshots: create {idle_ms:.1} ms (idle), {served_ms:.1} ms (served); clone \
             {clone_ms:.1} ms; first write p50 {} us; QD1 p50 {} us with, {} us without \
             ({ratio:.3}x)",
            first.p50_us, with.p50_us, without.p50_us
        ));
        Ok(Obj::new()
            .put("create_ms_no_client", round(idle_ms, 1))
            .put("create_ms_served", round(served_ms, 1))
            .put("clone_ms", round(clone_ms, 1))
            .put_obj("first_write_after_snapshot_us", lat_obj(&first))
            .put_obj("randwrite_4k_qd1_with_snapshot", lat_obj(&with))
            .put_obj("randwrite_4k_qd1_without", lat_obj(&without))
            .put("qd1_p50_ratio_with_to_without", round(ratio, 3))
            .put("remove_two_snapshots_ms", round(rm_ms, 1)))
    }
}
