//! Heartbeats between OSDs: each OSD pings every other up OSD once per heartbeat interval and
//! reports to the monitors a peer that has not answered for the grace. The monitors mark an
//! OSD down once enough peers report it (it may still reach them itself: cut off from its
//! peers, its PGs' writes cannot complete anywhere).

use crate::context::Osd;
use crate::peering::rpc::Rpc;
use cairn_monclient::MonClient;
use cairn_proto::msg::call::Empty;
use cairn_proto::msg::osd::PING_CALL;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::AbortHandle;

/// Starts and stops one watcher per up peer as the map changes, forever.
pub async fn run(osd: Arc<Osd>, mon: MonClient, every: Duration) {
    let mut watchers: HashMap<(u32, u64), AbortHandle> = HashMap::new();
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let peers = up_peers(&osd);
        watchers.retain(|key, task| {
            let keep = peers.contains(key);
            if !keep {
                task.abort();
            }
            keep
        });
        for key in peers {
            if let std::collections::hash_map::Entry::Vacant(slot) = watchers.entry(key) {
                let task = tokio::spawn(watch(osd.clone(), mon.clone(), key, every));
                slot.insert(task.abort_handle());
            }
        }
    }
}

/// Pings peer `id` in its life `life` and reports it when it stays silent for the grace.
async fn watch(osd: Arc<Osd>, mon: MonClient, (id, life): (u32, u64), every: Duration) {
    let mut link: Option<Rpc> = None;
    let mut last_ok = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if ping(&osd, &mut link, id, every).await {
            last_ok = tokio::time::Instant::now();
            continue;
        }
        // An OSD that cannot reach the monitors itself is in no position to accuse others.
        let grace = osd.lease.grace();
        if last_ok.elapsed() < grace || !osd.lease.valid() {
            continue;
        }
        tracing::warn!(peer = id, silent_for = ?last_ok.elapsed(), "peer does not answer pings; reporting it to the monitors");
        let me = (osd.id(), osd.up_from.load(Ordering::Relaxed));
        if let Err(e) = mon.report_failure(me, (id, life)).await {
            tracing::warn!(peer = id, error = %e, "failure report not accepted");
        }
        // Report again only after another grace.
        last_ok = tokio::time::Instant::now();
    }
}

/// Waits until this OSD can reach at least one other up OSD (or there is none): one cut off
/// from its peers must not boot again, it would only be reported and marked down again while
/// its PGs wait for it.
pub async fn wait_for_peers(osd: &Osd, every: Duration) {
    let mut said = false;
    loop {
        let peers = up_peers(osd);
        if peers.is_empty() {
            return;
        }
        for (id, _) in peers {
            if ping(osd, &mut None, id, every).await {
                if said {
                    tracing::info!(peer = id, "a peer answers again");
                }
                return;
            }
        }
        if !said {
            tracing::warn!("no other OSD answers pings: staying down until one does");
            said = true;
        }
        tokio::time::sleep(every).await;
    }
}

/// The other OSDs up in this OSD's map, with their lives.
fn up_peers(osd: &Osd) -> Vec<(u32, u64)> {
    let me = osd.id();
    osd.map()
        .osds
        .values()
        .filter(|o| o.up && o.id != me)
        .map(|o| (o.id, o.up_from))
        .collect()
}

/// One ping of peer `id`, within `timeout` (connecting first if needed).
async fn ping(osd: &Osd, link: &mut Option<Rpc>, id: u32, timeout: Duration) -> bool {
    let attempt = async {
        if link.is_none() {
            *link = Some(Rpc::connect_osd(&osd.map(), id, &osd.dialer).await?);
        }
        match link.as_mut() {
            Some(rpc) => rpc.ask(PING_CALL, &Empty, &[]).await.map(|_| ()),
            None => Err(crate::peering::rpc::RpcError::NotInMap(id)),
        }
    };
    let ok = matches!(tokio::time::timeout(timeout, attempt).await, Ok(Ok(())));
    if !ok {
        *link = None;
    }
    ok
}
