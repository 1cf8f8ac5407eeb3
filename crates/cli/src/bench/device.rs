//! The data disk's own speed for a benchmark's large writes, measured in the same run: fio
//! writes the same block size at the same queue depth straight to files beside the OSDs' data
//! (`O_DIRECT`), one job per replica that lands on that file system, all together; first without
//! flushes (the disk's bandwidth), then with an `fdatasync` after every queue depth of writes
//! (fio drains its queue for each, so the disk idles meanwhile: a floor, not what an OSD does,
//! whose writes go on during a flush). A replicated write is written once per replica, so the
//! unflushed rate divided by those replicas bounds what a client can write through the cluster
//! on this machine: the ceiling the benchmark reports beside its own figure.

use super::nbd::{lat_us, run_fio, Fio};
use super::report::{ratio, round, Obj};
use anyhow::{bail, Context, Result};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Prefix of the files the measurement writes (removed afterwards, however it ends).
const FILE_PREFIX: &str = "cairn-bench-device";
/// Smallest file each job writes over (a sequential writer wraps around at its end).
const MIN_FILE: u64 = 1 << 30;
/// Free space left on the file system beyond the files.
const SPARE: u64 = 1 << 30;

/// One large-write workload to measure the disk under.
struct DeviceRun {
    /// Where to write: the folder of the OSDs' data.
    dir: PathBuf,
    /// Replicas the cluster writes to this file system: one job each.
    jobs: usize,
    block: usize,
    qd: usize,
    /// Bytes each job writes over (the benchmark's working set, at least 1 GiB).
    file_bytes: u64,
    ramp: f64,
    seconds: f64,
    /// An `fdatasync` after every `qd` writes.
    synced: bool,
}

/// Where the local OSDs keep their data (the folder of `--data`, else `--dir`), from their
/// command lines: how many OSDs share the first one's file system, and that folder. None when no
/// OSD runs here; an error when the data is a block device (files cannot be written beside it).
fn osd_data_dir(pids: &[i32]) -> Result<Option<(PathBuf, usize)>> {
    let mut dirs = Vec::new();
    for pid in pids {
        let Some(args) = super::objects::cmdline(*pid) else {
            continue;
        };
        if args.get(1).map(String::as_str) != Some("osd") {
            continue;
        }
        if let Some(d) = data_dir_of(&args, is_block_device)? {
            dirs.push(d);
        }
    }
    let Some(first) = dirs.first().cloned() else {
        return Ok(None);
    };
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    let fs = dev(&first);
    let same = dirs.iter().filter(|d| dev(d) == fs).count();
    Ok(Some((first, same)))
}

fn is_block_device(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

/// The folder of one OSD's data file from its arguments (`--data F` / `--data=F`, else
/// `--dir D`, whose `data.img` it is).
fn data_dir_of(args: &[String], is_block: impl Fn(&Path) -> bool) -> Result<Option<PathBuf>> {
    let value = |flag: &str| {
        let eq = format!("{flag}=");
        args.iter().enumerate().find_map(|(i, a)| match a {
            a if a == flag => args.get(i + 1).cloned(),
            a => a.strip_prefix(&eq).map(str::to_string),
        })
    };
    if let Some(data) = value("--data") {
        let data = PathBuf::from(data);
        if is_block(&data) {
            bail!(
                "the OSD's data is the block device {}: files cannot be written beside it; \
                 give --device-dir a folder on the same kind of device, or --no-device",
                data.display()
            );
        }
        return Ok(data.parent().map(Path::to_path_buf));
    }
    Ok(value("--dir").map(PathBuf::from))
}

/// Free bytes for an unprivileged writer on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .with_context(|| format!("{} has a NUL byte", dir.display()))?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a writable statvfs for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot stat the file system of {}", dir.display()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Removes the measurement's files from `dir`.
fn remove_files(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(FILE_PREFIX) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes the files when the measurement ends, also on an error.
struct Cleanup<'a>(&'a Path);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        remove_files(self.0);
    }
}

impl DeviceRun {
    /// Runs the jobs together and sums them.
    fn measure(&self) -> Result<Fio> {
        let need = (self.file_bytes.saturating_mul(self.jobs as u64)).saturating_add(SPARE);
        let free = free_bytes(&self.dir)?;
        if free < need {
            bail!(
                "{} has {} MiB free, the device measurement needs {} MiB ({} files of {} MiB \
                 and 1 GiB spare): free space there, give --device-dir, or --no-device",
                self.dir.display(),
                free >> 20,
                need >> 20,
                self.jobs,
                self.file_bytes >> 20
            );
        }
        let _cleanup = Cleanup(&self.dir);
        let mut cmd = Command::new("fio");
        cmd.arg(format!("--name={FILE_PREFIX}"))
            .arg(format!("--directory={}", self.dir.display()))
            .args([
                "--ioengine=libaio",
                "--direct=1",
                "--rw=write",
                "--group_reporting",
                "--lat_percentiles=1",
                "--clat_percentiles=0",
                "--output-format=json",
                "--time_based",
            ])
            .arg(format!("--numjobs={}", self.jobs))
            .arg(format!("--bs={}", self.block))
            .arg(format!("--iodepth={}", self.qd))
            .arg(format!(
                "--fdatasync={}",
                if self.synced { self.qd } else { 0 }
            ))
            .arg(format!("--size={}", self.file_bytes))
            .arg(format!("--runtime={}ms", (self.seconds * 1000.0) as u64))
            .arg(format!("--ramp_time={}ms", (self.ramp * 1000.0) as u64));
        let what = format!(
            "fio of {} jobs writing {} bytes at QD{} in {}",
            self.jobs,
            self.block,
            self.qd,
            self.dir.display()
        );
        run_fio(&mut cmd, "write", &what)
    }
}

/// What the disk did: the run's folder and jobs and fio's sums without and with flushes, or
/// why it was not measured.
pub type Measured = std::result::Result<(PathBuf, usize, Fio, Fio), String>;

/// The device measurement a benchmark's large writes get: None when switched off; else the
/// folder and jobs, or why there are none (no local OSD, a block device).
pub fn plan(
    dir: Option<&Path>,
    off: bool,
    pids: &[i32],
    replicas: usize,
) -> Option<std::result::Result<(PathBuf, usize), String>> {
    if off {
        return None;
    }
    if let Some(d) = dir {
        return Some(Ok((d.to_path_buf(), replicas)));
    }
    Some(match osd_data_dir(pids) {
        Ok(Some((d, local))) => Ok((d, replicas.min(local).max(1))),
        Ok(None) => Err("no OSD of the cluster runs on this machine: give --device-dir".into()),
        Err(e) => Err(format!("{e:#}")),
    })
}

/// Measures the disk under `plan` with writes of `block` bytes at depth `qd`, over files of
/// the benchmark's working set (at least 1 GiB) each.
pub fn measure(
    plan: &std::result::Result<(PathBuf, usize), String>,
    block: usize,
    qd: usize,
    working_set: u64,
    (ramp, seconds): (f64, f64),
) -> Measured {
    let (dir, jobs) = plan.clone()?;
    let run = |synced| {
        DeviceRun {
            dir: dir.clone(),
            jobs,
            block,
            qd,
            file_bytes: working_set.max(MIN_FILE),
            ramp,
            seconds,
            synced,
        }
        .measure()
        .map_err(|e| format!("{e:#}"))
    };
    let raw = run(false)?;
    let synced = run(true)?;
    Ok((dir, jobs, raw, synced))
}

/// One line for people: the disk's MB/s, its jobs and the ceiling.
pub fn summary(m: &Measured) -> String {
    match m {
        Ok((dir, jobs, d, synced)) => format!(
            "data disk ({}) {:.0} MB/s over {jobs} jobs ({:.0} MB/s with a flush per depth): \
             ceilings {:.0} / {:.0} MB/s",
            dir.display(),
            d.mb_per_s,
            synced.mb_per_s,
            per_replica(d, *jobs),
            per_replica(synced, *jobs)
        ),
        Err(why) => format!("data disk not measured: {why}"),
    }
}

/// What the disk took per replica: the most a client can write through the cluster here.
fn per_replica(f: &Fio, jobs: usize) -> f64 {
    f.mb_per_s / jobs.max(1) as f64
}

/// The `device` object of a workload that wrote `mb_per_s` through the cluster.
pub fn report(m: &Measured, mb_per_s: f64) -> Obj {
    let (dir, jobs, d, synced) = match m {
        Ok(x) => x,
        Err(why) => return Obj::new().put("skipped", why.as_str()),
    };
    let ceiling = per_replica(d, *jobs);
    let synced_ceiling = per_replica(synced, *jobs);
    Obj::new()
        .put("dir", dir.display().to_string())
        .put("jobs", *jobs)
        .put("mb_per_s", round(d.mb_per_s, 1))
        .put_obj("lat_us", lat_us(d))
        .put("synced_mb_per_s", round(synced.mb_per_s, 1))
        .put("ceiling_mb_per_s", round(ceiling, 1))
        .put("ratio_to_ceiling", ratio(mb_per_s, ceiling, 4))
        .put("synced_ceiling_mb_per_s", round(synced_ceiling, 1))
        .put(
            "ratio_to_synced_ceiling",
            ratio(mb_per_s, synced_ceiling, 4),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_data_folder_comes_from_data_else_dir() {
        let file = |_: &Path| false;
        let a = args(&[
            "cairn", "osd", "run", "--dir", "/x/osd.0", "--data", "/y/d.img",
        ]);
        assert_eq!(
            data_dir_of(&a, file).ok().flatten(),
            Some(PathBuf::from("/y"))
        );
        let a = args(&["cairn", "osd", "run", "--data=/z/d.img", "--dir", "/x"]);
        assert_eq!(
            data_dir_of(&a, file).ok().flatten(),
            Some(PathBuf::from("/z"))
        );
        let a = args(&["cairn", "osd", "run", "--dir", "/x/osd.1"]);
        assert_eq!(
            data_dir_of(&a, file).ok().flatten(),
            Some(PathBuf::from("/x/osd.1"))
        );
        let a = args(&["cairn", "osd", "run", "--dir"]);
        assert_eq!(data_dir_of(&a, file).ok().flatten(), None);
    }

    #[test]
    fn a_block_device_is_refused_with_what_to_do() {
        let a = args(&[
            "cairn",
            "osd",
            "run",
            "--data",
            "/dev/nvme0n1",
            "--dir",
            "/x",
        ]);
        let e = data_dir_of(&a, |p| p == Path::new("/dev/nvme0n1"));
        let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("/dev/nvme0n1") && msg.contains("--device-dir"),
            "{msg}"
        );
    }

    #[test]
    fn a_folder_without_room_is_refused_before_writing() {
        let dir = std::env::temp_dir();
        let run = DeviceRun {
            dir: dir.clone(),
            jobs: 3,
            block: 1 << 20,
            qd: 8,
            file_bytes: u64::MAX / 8,
            ramp: 0.0,
            seconds: 0.1,
            synced: false,
        };
        let e = run
            .measure()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("MiB free") && e.contains("--no-device"), "{e}");
        let left = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(FILE_PREFIX))
            })
            .unwrap_or(false);
        assert!(!left, "files left in {}", dir.display());
    }
}
