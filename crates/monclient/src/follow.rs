//! Following the map: a task that subscribes to a monitor, applies the pushed updates and
//! publishes each new map on a watch channel.

use crate::conn::{Ended, Stream};
use cairn_map::ClusterMap;
use cairn_proto::msg::mon::{ErrorCode, ErrorReply, MapUpdate, Subscribe, ERROR, MAP, SUBSCRIBE};
use cairn_proto::msg::{decode, encode};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A monitor pushes at least this often (empty updates when idle, see `cairn_mon::KEEPALIVE`);
/// a subscription silent for longer is presumed dead and moved to another monitor.
const SILENCE: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The wait after a monitor refused this client (its key or caps): an operator must act, so
/// asking often would only fill the monitors' logs.
const REFUSED_BACKOFF: Duration = Duration::from_secs(30);

/// The value a follower starts with when it has no map: epoch 0, which no real map has.
pub(crate) fn placeholder() -> ClusterMap {
    let mut m = ClusterMap::new([0; 16]);
    m.epoch = 0;
    m
}

/// Subscribes to the monitors in turn until every receiver is gone.
pub(crate) async fn follow(
    known: crate::Addrs,
    from: crate::conn::Source,
    tx: watch::Sender<Arc<ClusterMap>>,
) {
    if known.get().is_empty() {
        tracing::warn!("cannot follow the map: no monitor addresses");
        return;
    }
    let mut next = 0usize;
    let mut backoff = Duration::from_millis(20);
    // After a gap (an update that does not follow our epoch) the next subscription asks for
    // the full map.
    let mut need_full = false;
    loop {
        // The monitors known now (the client may have learned more since the last round).
        let addrs = known.get();
        let addr = &addrs[next % addrs.len()];
        next += 1;
        let mut progressed = false;
        let r = tokio::select! {
            _ = tx.closed() => return,
            r = session(addr, &from, &tx, &mut need_full, &mut progressed) => r,
        };
        let mut wait = backoff;
        match r {
            Err(e) if e.refused => {
                tracing::warn!(
                    "the map is not followed: {}; asking again in {REFUSED_BACKOFF:?}",
                    e.why
                );
                wait = REFUSED_BACKOFF;
            }
            Err(e) => tracing::debug!("map subscription to {addr} ended: {}", e.why),
            Ok(()) => {}
        }
        if progressed {
            backoff = Duration::from_millis(20);
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One subscription: runs until the connection fails or an update does not apply.
async fn session(
    addr: &str,
    from: &crate::conn::Source,
    tx: &watch::Sender<Arc<ClusterMap>>,
    need_full: &mut bool,
    progressed: &mut bool,
) -> Result<(), Ended> {
    const RID: u64 = 1;
    let have = if *need_full { 0 } else { tx.borrow().epoch };
    let req = encode(&Subscribe { have });
    let mut stream = Stream::open(addr, (CONNECT_TIMEOUT, from), SUBSCRIBE, RID, &req).await?;
    *need_full = false;
    loop {
        let f = match tokio::time::timeout(SILENCE, stream.next()).await {
            Ok(r) => r.map_err(|e| Ended::from(e.to_string()))?,
            Err(_) => return Err(format!("{addr} silent for {SILENCE:?}").into()),
        };
        if f.msg_type == ERROR {
            return Err(match decode::<ErrorReply>("error", &f.control) {
                Ok(e) => Ended {
                    refused: e.code == ErrorCode::Denied,
                    why: format!(
                        "{addr} refused the subscription ({}): {}",
                        e.code, e.message
                    ),
                },
                Err(e) => format!("{addr} refused the subscription: {e}").into(),
            });
        }
        if f.msg_type != MAP || f.request_id != RID {
            continue;
        }
        let update: MapUpdate =
            decode("map update", &f.control).map_err(|e| Ended::from(e.to_string()))?;
        *progressed = true;
        if let Err(e) = apply(tx, update) {
            *need_full = true;
            return Err(e.to_string().into());
        }
    }
}

/// Why a pushed update does not apply to the map this client holds (the next subscription
/// asks for the full map).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ApplyError {
    /// Incrementals came before any full map.
    #[error("incrementals without a base map")]
    NoBase,
    /// An incremental does not follow the map held (a gap, or a change that fails).
    #[error("{0}")]
    Incremental(#[from] cairn_map::MapError),
}

/// Applies an update to the published map; publishes only when the epoch moves forward.
fn apply(tx: &watch::Sender<Arc<ClusterMap>>, update: MapUpdate) -> Result<(), ApplyError> {
    let cur = tx.borrow().clone();
    match update {
        MapUpdate::Full(m) => {
            if m.epoch > cur.epoch {
                tx.send_replace(Arc::new(m));
            }
        }
        MapUpdate::Incrementals(incs) => {
            let fresh: Vec<_> = incs.into_iter().filter(|i| i.epoch > cur.epoch).collect();
            if fresh.is_empty() {
                return Ok(());
            }
            if cur.epoch == 0 {
                return Err(ApplyError::NoBase);
            }
            let mut m = (*cur).clone();
            for inc in &fresh {
                m.apply_incremental(inc)?;
            }
            tx.send_replace(Arc::new(m));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_map::{ChangeOutcome, Incremental, MapChange};

    fn pool(name: &str) -> MapChange {
        MapChange::PoolCreate {
            name: name.into(),
            size: 1,
            min_size: 1,
            pg_count: 8,
            durability: cairn_map::Durability::Wal,
        }
    }

    #[test]
    fn updates_apply_in_order_and_gaps_are_errors() {
        let (tx, _rx) = watch::channel(Arc::new(placeholder()));
        let mut leader = ClusterMap::new([7; 16]);
        apply(&tx, MapUpdate::Full(leader.clone())).unwrap();
        let mut incs = Vec::new();
        for n in ["a", "b", "c"] {
            let c = pool(n);
            let Ok(ChangeOutcome::Changed { epoch, .. }) = leader.apply(&c) else {
                panic!("pool create");
            };
            incs.push(Incremental { epoch, change: c });
        }
        apply(&tx, MapUpdate::Incrementals(incs[..2].to_vec())).unwrap();
        // Replayed epochs are skipped, new ones applied.
        apply(&tx, MapUpdate::Incrementals(incs.clone())).unwrap();
        assert_eq!(**tx.borrow(), leader);
        // An older full map does not move the map back.
        apply(&tx, MapUpdate::Full(ClusterMap::new([7; 16]))).unwrap();
        assert_eq!(**tx.borrow(), leader);
        let gap = Incremental {
            epoch: leader.epoch + 2,
            change: pool("z"),
        };
        assert!(matches!(
            apply(&tx, MapUpdate::Incrementals(vec![gap])),
            Err(ApplyError::Incremental(_))
        ));
        assert_eq!(**tx.borrow(), leader);
    }
}
