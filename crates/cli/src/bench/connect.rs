//! `bench objects`' connection workloads: how long a new connection takes to be ready for
//! requests (TCP connect, handshake, mutual authentication: a key to a monitor, a ticket to
//! an OSD), one after another, next to a bare loopback TCP connect + accept measured in the
//! same run.

use super::measure::new_hist;
use super::report::{lat, q, ratio, round, Obj};
use anyhow::{bail, Context, Result};
use cairn_client::Client;
use cairn_transport::{node_kind, Dialer};
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// Most connections one workload opens (each leaves a socket in TIME_WAIT behind it).
const MAX_CONNECTIONS: u64 = 5_000;

struct Timed {
    ops: u64,
    elapsed: Duration,
    lat: Histogram<u64>,
}

/// Opens connections one after another for `dur` (at most [`MAX_CONNECTIONS`]).
async fn timed<F, Fut>(dur: Duration, mut open: F) -> Result<Timed>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut lat = new_hist();
    let start = Instant::now();
    let mut ops = 0u64;
    while start.elapsed() < dur && ops < MAX_CONNECTIONS {
        let t = Instant::now();
        open().await?;
        let _ = lat.record(t.elapsed().as_nanos() as u64);
        ops += 1;
    }
    Ok(Timed {
        ops,
        elapsed: start.elapsed(),
        lat,
    })
}

/// The baseline: TCP connect to a loopback listener that accepts (and drops) each one.
async fn tcp_baseline(dur: Duration) -> Result<Timed> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("connect baseline: cannot listen")?;
    let addr = listener.local_addr()?;
    let acceptor = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            drop(s);
        }
    });
    let r = timed(dur, || async move {
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(())
    })
    .await;
    acceptor.abort();
    r
}

fn entry(name: &str, m: &Timed, base: &Timed, json: bool) -> Obj {
    let rate = |t: &Timed| t.ops as f64 / t.elapsed.as_secs_f64().max(1e-9);
    let (p50, bp50) = (q(&m.lat, 0.5), q(&base.lat, 0.5));
    if !json {
        eprintln!(
            "{name:<14} {:>9.0} conn/s  p50 {p50:>8.1} us  p99 {:>8.1} us | tcp connect p50 {bp50:>7.1} us",
            rate(m),
            q(&m.lat, 0.99)
        );
    }
    Obj::new()
        .put("name", name)
        .put("connections", m.ops)
        .put("per_s", round(rate(m), 1))
        .put_obj("lat_us", lat(&m.lat))
        .put("baseline_per_s", round(rate(base), 1))
        .put_obj("baseline_lat_us", lat(&base.lat))
        .put("lat_p50_ratio_to_baseline", ratio(p50, bp50, 3))
}

/// Runs the connection workloads whose names pass `keep`: `connect-mon` (key
/// authentication) and `connect-osd` (ticket authentication), each followed by the TCP
/// baseline.
pub async fn run(
    client: &Client,
    dur: Duration,
    json: bool,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<Obj>> {
    let map = client.map();
    let Some(osd) = map.osds.values().find(|o| o.up) else {
        bail!("no OSD is up to connect to");
    };
    let osd_addr = osd.addr.clone();
    let Some(mon_addr) = client.mon().addrs().first().cloned() else {
        bail!("no monitor address");
    };
    let dialer =
        Dialer::new(node_kind::CLIENT, crate::conf::auth()).timeout(Duration::from_secs(5));
    let mut out = Vec::new();
    for (name, addr, kind) in [
        ("connect-mon", mon_addr, node_kind::MON),
        ("connect-osd", osd_addr, node_kind::OSD),
    ] {
        if !keep(name) {
            continue;
        }
        let d = &dialer;
        let addr = &addr;
        let m = timed(dur, || async move {
            let s = d.dial(addr, kind).await?;
            drop(s);
            Ok(())
        })
        .await
        .with_context(|| format!("{name}: connecting to {addr}"))?;
        let base = tcp_baseline(dur).await?;
        out.push(entry(name, &m, &base, json));
    }
    Ok(out)
}
