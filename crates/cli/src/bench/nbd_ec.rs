//! `cairn bench nbd --ec K+M --degraded`: the EC volume with one OSD killed (4 KiB random
//! reads, some decoded from the other shards; the whole volume rewritten), then that OSD back
//! and the time and rate at which its shards are rebuilt.

use super::nbd::{fio, lat_us, timed_fio, BenchNbdArgs, Fio, Spec, SETTLE};
use super::recovery::{kill_osd, osd_used, recovery_totals, wait_clean, wait_down, wait_serving};
use super::report::{ratio, round, Obj};
use super::target::Target;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The `cairn dev` cluster's folder (beside its configuration), or why the OSD killing part
/// cannot run against this cluster.
pub(super) fn dev_dir(conf: &Path) -> Result<PathBuf> {
    let dir = conf.parent().unwrap_or(Path::new("."));
    if !dir.join("dev.toml").is_file() {
        bail!(
            "--degraded kills an OSD and restarts it through `cairn dev up`, so it runs only \
             on a `cairn dev` cluster: {} is not in one (no dev.toml beside it)",
            conf.display()
        );
    }
    Ok(dir.to_path_buf())
}

pub(super) struct Degraded<'a> {
    pub t: &'a Target,
    pub a: &'a BenchNbdArgs,
    pub dir: &'a Path,
    pub uri: &'a str,
    /// The healthy reads measured earlier in the same run, by workload name.
    pub healthy: &'a [(&'static str, Fio)],
}

impl Degraded<'_> {
    pub fn run(&self) -> Result<Obj> {
        let client = &self.t.client;
        let victim = self.victim()?;
        let held = self.t.block_on(osd_used(client, victim))?;
        self.say(format!(
            "degraded: kill -9 of osd.{victim} ({held} bytes of objects)"
        ));
        kill_osd(self.dir, victim)?;
        let to_down = self.t.block_on(wait_down(client, victim))?;
        let to_serve = self.t.block_on(wait_serving(client))?;
        let mut reads = Vec::new();
        for (name, healthy) in self.healthy {
            let s = Spec::named(name).with_context(|| format!("no workload {name}"))?;
            std::thread::sleep(SETTLE);
            let r = timed_fio(self.uri, s, self.a)?;
            self.say(format!(
                "{name:<26} degraded {:>8.0} IOPS p50 {:>8.1} us | healthy {:>8.0} IOPS",
                r.iops, r.p50_us, healthy.iops
            ));
            reads.push(
                Obj::new()
                    .put("name", format!("{name}-degraded"))
                    .put("iops", round(r.iops, 1))
                    .put_obj("lat_us", lat_us(&r))
                    .put("healthy_iops", round(healthy.iops, 1))
                    .put_obj("healthy_lat_us", lat_us(healthy))
                    .put("ratio_to_healthy", ratio(r.iops, healthy.iops, 3)),
            );
        }
        std::thread::sleep(SETTLE);
        let size = self.a.volume_size;
        self.say(format!(
            "degraded: rewriting the whole volume ({size} bytes) so that every shard of osd.{victim} is stale"
        ));
        let rewrite = fio(self.uri, "write", 1 << 20, 8, size, None)?;
        let rebuild = self.rebuild(victim)?;
        Ok(Obj::new()
            .put("osd", victim)
            .put("osd_held_bytes", held)
            .put("seconds_to_down", round(to_down.as_secs_f64(), 2))
            .put("seconds_to_serving", round(to_serve.as_secs_f64(), 2))
            .put_arr("reads", &reads)
            .put_obj(
                "rewrite_1m_qd8",
                Obj::new()
                    .put("bytes", size)
                    .put("mb_per_s", round(rewrite.mb_per_s, 1)),
            )
            .put_obj("rebuild", rebuild))
    }

    /// Restarts `victim` and measures until every PG is clean again.
    fn rebuild(&self, victim: u32) -> Result<Obj> {
        let client = &self.t.client;
        std::thread::sleep(SETTLE);
        let (bytes0, objects0) = self.t.block_on(recovery_totals(client));
        let start = Instant::now();
        self.restart()?;
        let to_restart = start.elapsed();
        let took = self.t.block_on(wait_clean(client))?;
        let (bytes1, objects1) = self.t.block_on(recovery_totals(client));
        let bytes = bytes1.saturating_sub(bytes0);
        let secs = took.as_secs_f64().max(1e-3);
        let after = self.t.block_on(osd_used(client, victim))?;
        self.say(format!(
            "rebuild: osd.{victim} clean {secs:.1} s after its restart ({:.1} s), {bytes} bytes pushed, {:.1} MB/s",
            to_restart.as_secs_f64(),
            bytes as f64 / secs / 1e6
        ));
        Ok(Obj::new()
            .put("seconds_to_restart", round(to_restart.as_secs_f64(), 2))
            .put("seconds_to_clean", round(secs, 2))
            .put("bytes_moved", bytes)
            .put("objects_moved", objects1.saturating_sub(objects0))
            .put("rebuild_mb_per_s", round(bytes as f64 / secs / 1e6, 1))
            .put("osd_held_bytes_after", after))
    }

    /// The up OSD with the highest id.
    fn victim(&self) -> Result<u32> {
        let map = self.t.client.map();
        map.osds
            .values()
            .filter(|o| o.up)
            .map(|o| o.id)
            .max()
            .context("no OSD is up")
    }

    /// `cairn dev up --dir DIR`: starts what is not running, as it was.
    fn restart(&self) -> Result<()> {
        let exe = std::env::current_exe().context("cannot find the cairn binary")?;
        let out = std::process::Command::new(exe)
            .arg("dev")
            .arg("up")
            .arg("--dir")
            .arg(self.dir)
            .output()
            .context("cannot run `cairn dev up`")?;
        if !out.status.success() {
            bail!(
                "`cairn dev up --dir {}` failed: {}",
                self.dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn say(&self, m: String) {
        if !self.a.json {
            eprintln!("{m}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dev_dir;

    #[test]
    fn degraded_runs_only_beside_a_dev_clusters_configuration() {
        let dir = std::env::temp_dir().join(format!("cairn-nbd-ec-dev-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("cairn.toml");
        let e = dev_dir(&conf).unwrap_err().to_string();
        assert!(
            e.contains("only on a `cairn dev` cluster") && e.contains("no dev.toml"),
            "{e}"
        );
        std::fs::write(dir.join("dev.toml"), "").unwrap();
        assert_eq!(dev_dir(&conf).unwrap(), dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
