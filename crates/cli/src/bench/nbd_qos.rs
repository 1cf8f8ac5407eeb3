//! `cairn bench nbd --volumes`: a noisy neighbour and QoS, and how long opening a volume takes.
//!
//! The bench volume (the victim) runs 4 KiB random writes at QD1 alone, then beside a second
//! volume of the same server under 4 KiB random writes at QD32, unlimited and then limited to
//! `--qos-iops`: the victim's latency in the three cases, and how close the limited neighbour
//! stays to its limit. Then a 1 TiB thin volume with `--open-objects` data objects (4 KiB
//! each) in a pool holding `--open-volumes` volumes is opened as the NBD server opens it.

use super::nbd::{fio, lat_obj, Fio};
use super::report::{round, Obj};
use super::target::Target;
use anyhow::{Context, Result};
use std::time::Instant;

/// What the volume measurements need.
pub struct VolumeBench<'a> {
    pub t: &'a Target,
    pub pool: &'a str,
    /// URI of the bench volume; the neighbour is served by the same server.
    pub uri: &'a str,
    pub victim_size: u64,
    pub ramp: f64,
    pub seconds: f64,
    pub qos_iops: u64,
    pub open_objects: u64,
    pub open_volumes: u64,
    pub json: bool,
}

const NEIGHBOUR: &str = "noisy";
const NEIGHBOUR_SIZE: u64 = 1 << 30;
const BIG: &str = "big";

impl VolumeBench<'_> {
    fn say(&self, m: &str) {
        if !self.json {
            eprintln!("{m}");
        }
    }

    fn victim(&self) -> Result<Fio> {
        let timed = Some((self.ramp, self.seconds));
        fio(self.uri, "randwrite", 4096, 1, self.victim_size, timed)
    }

    /// The victim measured while the neighbour runs QD32 random writes; the neighbour's own
    /// result too.
    fn beside_neighbour(&self, neighbour: &str) -> Result<(Fio, Fio)> {
        let uri = neighbour.to_string();
        // The neighbour starts first and ends last: the victim's measurement is inside it.
        let timed = Some((self.ramp + 1.0, self.seconds + 2.0));
        let noisy =
            std::thread::spawn(move || fio(&uri, "randwrite", 4096, 32, NEIGHBOUR_SIZE, timed));
        std::thread::sleep(std::time::Duration::from_secs(1));
        let victim = self.victim();
        let noisy = noisy
            .join()
            .map_err(|_| anyhow::anyhow!("the neighbour's fio thread failed"))??;
        Ok((victim?, noisy))
    }

    fn set_qos(&self, iops: u64) -> Result<()> {
        let q = cairn_volume::snaps::Qos {
            iops,
            ..Default::default()
        };
        self.t.block_on(cairn_volume::set_qos(
            &self.t.client,
            self.pool,
            NEIGHBOUR,
            q,
            &mut |_| {},
        ))?;
        Ok(())
    }

    pub fn run(&self) -> Result<Obj> {
        let c = &self.t.client;
        let os = cairn_volume::DEFAULT_OBJECT_SIZE;
        self.t.block_on(cairn_volume::create(
            c,
            self.pool,
            NEIGHBOUR,
            NEIGHBOUR_SIZE,
            os,
        ))?;
        let neighbour = self.uri.replace("/bench", &format!("/{NEIGHBOUR}"));
        fio(&neighbour, "write", 1 << 20, 8, NEIGHBOUR_SIZE, None)?;
        self.say("volumes: the victim alone, then beside an unlimited and a limited neighbour...");
        let alone = self.victim()?;
        let (with_unlimited, noisy_free) = self.beside_neighbour(&neighbour)?;
        self.set_qos(self.qos_iops)?;
        let (with_limited, noisy_limited) = self.beside_neighbour(&neighbour)?;
        let off = (noisy_limited.iops - self.qos_iops as f64) / self.qos_iops as f64;
        self.say(&format!(
            "volumes: victim QD1 p50 {} us alone, {} us beside {:.0} IOPS, {} us beside {:.0} \
             IOPS (limit {}, {:+.1}%)",
            alone.p50_us,
            with_unlimited.p50_us,
            noisy_free.iops,
            with_limited.p50_us,
            noisy_limited.iops,
            self.qos_iops,
            off * 100.0
        ));
        let open_ms = self.open_big()?;
        Ok(Obj::new()
            .put_obj("victim_randwrite_4k_qd1_alone", lat_obj(&alone))
            .put_obj(
                "victim_beside_unlimited_neighbour",
                lat_obj(&with_unlimited),
            )
            .put_obj("victim_beside_limited_neighbour", lat_obj(&with_limited))
            .put("neighbour_iops_unlimited", round(noisy_free.iops, 1))
            .put("neighbour_limit_iops", self.qos_iops)
            .put("neighbour_iops_limited", round(noisy_limited.iops, 1))
            .put("neighbour_off_limit_ratio", round(off, 4))
            .put("open_volume_objects", self.open_objects)
            .put("open_pool_volumes", self.open_volumes)
            .put("open_1t_volume_ms", round(open_ms, 1)))
    }

    /// Creates the pool's other volumes and a 1 TiB one with `open_objects` small data
    /// objects, then times opening it.
    fn open_big(&self) -> Result<f64> {
        let c = &self.t.client;
        let os = cairn_volume::DEFAULT_OBJECT_SIZE;
        self.say(&format!(
            "volumes: a 1 TiB volume with {} objects among {} volumes...",
            self.open_objects, self.open_volumes
        ));
        self.t.block_on(async {
            for i in 2..self.open_volumes {
                cairn_volume::create(c, self.pool, &format!("other-{i}"), 1 << 30, os).await?;
            }
            cairn_volume::create(c, self.pool, BIG, 1 << 40, os).await?;
            let desc = "cairn bench nbd (filling)";
            let v = cairn_volume::Volume::open(c.clone(), self.pool, BIG, desc).await?;
            let stride = (1u64 << 40) / self.open_objects.max(1);
            for n in 0..self.open_objects {
                v.write(n * stride, &[0x5a; 4096]).await?;
            }
            v.close().await;
            anyhow::Ok(())
        })?;
        let start = Instant::now();
        let v = self
            .t
            .block_on(cairn_volume::Volume::open(
                c.clone(),
                self.pool,
                BIG,
                "cairn bench nbd (open)",
            ))
            .context("cannot open the 1 TiB volume")?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        self.t.block_on(v.close());
        Ok(ms)
    }
}
