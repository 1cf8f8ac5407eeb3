//! Registration with the monitors, heartbeats, and following the map.

use crate::config::OsdConfig;
use crate::context::Osd;
use crate::error::OsdError;
use cairn_map::{ChangeOutcome, ClusterMap, MapChange, PgId};
use cairn_monclient::MonClient;
use cairn_proto::msg::mon::{PgStarted, MAX_HEARTBEAT_PGS};
use cairn_proto::msg::osd::OpReply;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What a boot gave this OSD.
pub struct Booted {
    pub id: u32,
    pub up_from: u64,
    pub map: Arc<ClusterMap>,
}

async fn boot_once(
    mon: &MonClient,
    store_id: [u8; 16],
    addr: &str,
    host: &str,
    weight: u32,
) -> Result<(u32, u64), OsdError> {
    let change = MapChange::OsdBoot {
        store_id,
        addr: addr.to_string(),
        host: host.to_string(),
        weight,
    };
    match mon.command(change).await {
        Ok(ChangeOutcome::Changed { epoch, id }) => Ok((id, epoch)),
        Ok(ChangeOutcome::Unchanged) => Err(OsdError::Boot("monitors ignored the boot".into())),
        Err(e) => Err(OsdError::Boot(e.to_string())),
    }
}

/// Registers this OSD and fetches a map that includes the registration.
pub fn boot(
    rt: &tokio::runtime::Runtime,
    mon: &MonClient,
    store_id: [u8; 16],
    addr: &str,
    cfg: &OsdConfig,
) -> Result<Booted, OsdError> {
    rt.block_on(async {
        let (id, up_from) = boot_once(mon, store_id, addr, &cfg.host, cfg.weight).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let map = mon
                .get_map()
                .await
                .map_err(|e| OsdError::Boot(e.to_string()))?;
            if map.epoch >= up_from {
                return Ok(Booted {
                    id,
                    up_from,
                    map: Arc::new(map),
                });
            }
            if tokio::time::Instant::now() > deadline {
                return Err(OsdError::Boot(format!(
                    "the monitors' map stays at epoch {} < {up_from}",
                    map.epoch
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Follows the map and heartbeats, forever. Boots again when the map says this OSD is down
/// (it was presumed dead, e.g. while stopped or cut off).
pub async fn watch(
    osd: Arc<Osd>,
    mon: MonClient,
    cfg: OsdConfig,
    store_id: [u8; 16],
    addr: String,
) {
    tokio::spawn(heartbeats(osd.clone(), mon.clone(), cfg.heartbeat_interval));
    // Monitors added since this OSD was configured are found too (and the map followed
    // through them once the configured ones are gone).
    let _learning = mon.keep_learning_monitors(cairn_monclient::LEARN_MONITORS_EVERY);
    tokio::spawn(crate::peer_heartbeat::run(
        osd.clone(),
        mon.clone(),
        cfg.heartbeat_interval,
    ));
    let mut rx = mon.follow(Some((*osd.map()).clone()));
    let mut flaps = Flaps::default();
    loop {
        if rx.changed().await.is_err() {
            tracing::error!("map subscription ended");
            tokio::time::sleep(Duration::from_secs(1)).await;
            rx = mon.follow(Some((*osd.map()).clone()));
            continue;
        }
        let map = rx.borrow_and_update().clone();
        install(&osd, map.clone());
        let me = osd.id();
        let life = osd.up_from.load(Ordering::Relaxed);
        let marked_down = map
            .osds
            .get(&me)
            .is_some_and(|o| !o.up || o.up_from != life);
        if marked_down && map.epoch > life {
            let wait = flaps.marked_down(std::time::Instant::now());
            tracing::warn!(
                osd = me,
                epoch = map.epoch,
                times_in_window = flaps.count(),
                wait_secs = wait.as_secs(),
                "the map says this OSD is down; booting again"
            );
            // A flapping OSD stays down a while: every return makes its PGs peer again.
            tokio::time::sleep(wait).await;
            crate::peer_heartbeat::wait_for_peers(&osd, cfg.heartbeat_interval).await;
            match boot_once(&mon, store_id, &addr, &cfg.host, cfg.weight).await {
                Ok((_, up_from)) => osd.up_from.store(up_from, Ordering::Relaxed),
                Err(e) => tracing::warn!(error = %e, "boot failed"),
            }
        }
    }
}

/// How long this OSD was marked down lately, to damp flapping.
#[derive(Default)]
struct Flaps {
    times: Vec<std::time::Instant>,
}

/// Mark-downs remembered for damping.
const FLAP_WINDOW: Duration = Duration::from_secs(600);
/// Mark-downs in the window before booting again is delayed.
const FLAP_FREE: usize = 2;
/// Longest delay before booting again.
const FLAP_MAX_WAIT: Duration = Duration::from_secs(300);

impl Flaps {
    /// Records a mark-down at `now`; returns how long to wait before booting again: nothing
    /// for the first two in ten minutes, then 2, 4, 8 ... seconds, at most five minutes.
    fn marked_down(&mut self, now: std::time::Instant) -> Duration {
        self.times
            .retain(|t| now.saturating_duration_since(*t) < FLAP_WINDOW);
        self.times.push(now);
        let extra = self.times.len().saturating_sub(FLAP_FREE) as u32;
        if extra == 0 {
            return Duration::ZERO;
        }
        Duration::from_secs(1u64 << extra.min(9)).min(FLAP_MAX_WAIT)
    }

    fn count(&self) -> usize {
        self.times.len()
    }
}

/// Longest wait for a map a peer's message says exists.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(2);
/// How long the subscription gets to bring it before the monitors are asked.
const CATCH_UP_ASK_AFTER: Duration = Duration::from_millis(20);

/// Waits until this OSD's map reaches `epoch` (a peer's message was sent at it): the
/// subscription usually brings it within milliseconds; after [`CATCH_UP_ASK_AFTER`] the
/// monitors are asked for it; after [`CATCH_UP_LIMIT`] it gives up (the message is then
/// refused as stale: an epoch the monitors do not have is a forgery or a bug). Returns
/// whether the map got there.
pub(crate) async fn catch_up(osd: &Osd, epoch: u64) -> bool {
    let start = tokio::time::Instant::now();
    let mut asked = false;
    while osd.map().epoch < epoch {
        let waited = start.elapsed();
        if waited >= CATCH_UP_LIMIT {
            tracing::warn!(epoch, have = osd.map().epoch, "a peer's message claims a map epoch the monitors do not give; refusing it as stale");
            return false;
        }
        if !asked && waited >= CATCH_UP_ASK_AFTER {
            asked = true;
            let left = CATCH_UP_LIMIT - waited;
            if let Ok(Ok(m)) = tokio::time::timeout(left, osd.mon.get_map()).await {
                install(osd, Arc::new(m));
            }
            continue;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

fn install(osd: &Osd, map: Arc<ClusterMap>) {
    let epoch = map.epoch;
    let old = osd.map();
    if epoch <= old.epoch {
        return;
    }
    // Before any shard can see the new PG counts: the copies to split (`split/pending.rs`).
    osd.splits.note(&osd.store, Some(&old), &map);
    if !osd.set_map(map.clone()) {
        return;
    }
    tracing::debug!(epoch, "new map");
    // Writes waiting for a member that is now down will never hear from it: the client
    // resends them to the PG's new acting set.
    osd.inflight
        .fail_waiting_on(|m| !map.osds.get(&m).is_some_and(|o| o.up), &OpReply::Retry);
    // PGs whose acting set changed peer now, not at their next client op.
    osd.queue_all(|| crate::mailbox::ShardMsg::MapChanged);
}

async fn heartbeats(osd: Arc<Osd>, mon: MonClient, every: Duration) {
    let mut tick = tokio::time::interval(every);
    let mut round = 0usize;
    loop {
        tick.tick().await;
        let (id, life) = (osd.id(), osd.up_from.load(Ordering::Relaxed));
        let starts = pg_starts(&osd, round);
        round = round.wrapping_add(1);
        let sent = std::time::Instant::now();
        match mon.heartbeat(id, life, starts).await {
            Ok(grace) => osd.lease.renew(sent, grace),
            Err(e) => tracing::warn!(error = %e, "heartbeat to monitors failed"),
        }
    }
}

/// The PGs this OSD leads with the epoch each last went active here, for the monitors'
/// history trimming; over [`MAX_HEARTBEAT_PGS`] PGs, a different window each `round`.
fn pg_starts(osd: &Osd, round: usize) -> Vec<PgStarted> {
    let map = osd.map();
    let me = osd.id();
    let mut all = Vec::new();
    for (&pool, p) in &map.pools {
        for pg in (0..p.pg_count).map(|pg| PgId { pool, pg }) {
            if osd.placement(&map, pg).primary() == Some(me) {
                // An EC PG holds nothing yet (its I/O is refused): no history before this
                // epoch is needed to peer it.
                let epoch = match p.ec() {
                    Some(_) => map.epoch,
                    None => crate::peering::copy::last_epoch_started(&osd.store, pg),
                };
                all.push(PgStarted {
                    pool,
                    pg: pg.pg,
                    epoch,
                });
            }
        }
    }
    if all.len() <= MAX_HEARTBEAT_PGS {
        return all;
    }
    let start = (round * MAX_HEARTBEAT_PGS) % all.len();
    all.into_iter()
        .cycle()
        .skip(start)
        .take(MAX_HEARTBEAT_PGS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn an_osd_marked_down_again_and_again_waits_longer_each_time() {
        let mut f = Flaps::default();
        let t0 = Instant::now();
        let s = |n| Duration::from_secs(n);
        assert_eq!(f.marked_down(t0), Duration::ZERO);
        assert_eq!(f.marked_down(t0 + s(10)), Duration::ZERO);
        assert_eq!(f.marked_down(t0 + s(20)), s(2));
        assert_eq!(f.marked_down(t0 + s(40)), s(4));
        assert_eq!(f.marked_down(t0 + s(60)), s(8));
        for i in 0..10 {
            f.marked_down(t0 + s(70 + i));
        }
        assert_eq!(f.marked_down(t0 + s(90)), FLAP_MAX_WAIT);
        // Ten quiet minutes later it is forgiven.
        assert_eq!(f.marked_down(t0 + s(90) + FLAP_WINDOW), Duration::ZERO);
        assert_eq!(f.count(), 1);
    }
}
