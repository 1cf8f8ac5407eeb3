//! In-process monitor clusters on 127.0.0.1 for the integration tests.

#![allow(dead_code)]

use cairn_map::{ChangeOutcome, ClusterMap, Durability, MapChange};
use cairn_mon::{MonConfig, MonError};
use cairn_monclient::MonClient;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const FSID: [u8; 16] = [0x42; 16];

/// Polls `f` every 20 ms until it returns `Some`, failing the test after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Bounds a future.
pub async fn within<T>(what: &str, limit: Duration, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// A raw connection to a monitor, past the handshake (as a client): ready for frames.
pub async fn raw_connect(addr: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let done = within(
        "the monitor's handshake",
        Duration::from_secs(5),
        cairn_transport::initiate(
            &mut s,
            cairn_transport::node_kind::CLIENT,
            &cairn_transport::Credentials::None,
        ),
    )
    .await
    .expect("handshake");
    assert_eq!(done.hello.node_kind, cairn_transport::node_kind::MON);
    s
}

/// A unique scratch dir under the system temp dir, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cairn-mon-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One monitor running as a task.
pub struct Mon {
    pub cfg: MonConfig,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), MonError>>>,
}

impl Mon {
    pub fn addr(&self) -> String {
        self.cfg.members[&self.cfg.id].clone()
    }

    pub fn is_running(&self) -> bool {
        self.task.is_some()
    }
}

/// A monitor cluster whose members can be stopped and restarted from their dirs.
pub struct Cluster {
    pub mons: Vec<Mon>,
    pub scratch: Scratch,
}

pub fn config(
    id: u64,
    members: &BTreeMap<u64, String>,
    dir: PathBuf,
    grace: Duration,
) -> MonConfig {
    let mut cfg = MonConfig::new(id, members.clone(), dir, FSID);
    cfg.osd_grace = grace;
    cfg.command_timeout = Duration::from_secs(2);
    cfg
}

impl Cluster {
    /// Starts `n` monitors (ids 0..n, as `cairn dev` numbers them) with OSD grace `grace`.
    pub async fn start(name: &str, n: u64, grace: Duration) -> Cluster {
        Cluster::start_with(name, n, |c| c.osd_grace = grace).await
    }

    /// Starts `n` monitors (ids 0..n, as `cairn dev` numbers them) with the test defaults changed by `tweak`.
    pub async fn start_with(name: &str, n: u64, tweak: impl Fn(&mut MonConfig)) -> Cluster {
        let scratch = Scratch::new(name);
        let mut listeners = Vec::new();
        let mut members = BTreeMap::new();
        for id in 0..n {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            members.insert(id, l.local_addr().expect("addr").to_string());
            listeners.push(l);
        }
        let mut mons = Vec::new();
        for (id, l) in (0..n).zip(listeners) {
            let dir = scratch.0.join(format!("mon{id}"));
            let mut cfg = config(id, &members, dir, cairn_mon::DEFAULT_OSD_GRACE);
            tweak(&mut cfg);
            let mut m = Mon {
                cfg,
                stop: None,
                task: None,
            };
            spawn(&mut m, l);
            mons.push(m);
        }
        Cluster { mons, scratch }
    }

    /// A client of every monitor.
    pub fn client(&self) -> MonClient {
        MonClient::new(self.mons.iter().map(Mon::addr).collect())
            .with_timeout(Duration::from_secs(8))
    }

    /// A client that knows only monitor `i` (index into `mons`).
    pub fn client_of(&self, i: usize) -> MonClient {
        MonClient::new(vec![self.mons[i].addr()]).with_timeout(Duration::from_secs(3))
    }

    /// Stops monitor `i` and waits until it has released its data dir.
    pub async fn stop(&mut self, i: usize) {
        let m = &mut self.mons[i];
        if let Some(s) = m.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = m.task.take() {
            let r = within("monitor shutdown", Duration::from_secs(10), t).await;
            r.expect("monitor task").expect("monitor stopped cleanly");
        }
    }

    /// Restarts monitor `i` from its data dir on its address.
    pub async fn restart(&mut self, i: usize) {
        let addr = self.mons[i].addr();
        let l = TcpListener::bind(&addr)
            .await
            .expect("rebind the monitor's address");
        spawn(&mut self.mons[i], l);
    }

    /// Index of the leader, once all running monitors agree on one.
    pub async fn leader(&self) -> usize {
        eventually(
            "a leader all running monitors agree on",
            Duration::from_secs(10),
            || async {
                let mut leader = None;
                for m in &self.mons {
                    if !m.is_running() {
                        continue;
                    }
                    let c = MonClient::new(vec![m.addr()]).with_timeout(Duration::from_millis(500));
                    // A single-address client asking a follower goes on to ask the leader; the
                    // answer's leader field is what matters.
                    let s = c.status().await.ok()?;
                    let l = s.leader?;
                    if leader.is_some_and(|x| x != l) {
                        return None;
                    }
                    leader = Some(l);
                }
                let id = leader?;
                self.mons
                    .iter()
                    .position(|m| m.cfg.id == id && m.is_running())
            },
        )
        .await
    }

    /// The map as monitor `i` has it.
    pub async fn map_of(&self, i: usize) -> Option<ClusterMap> {
        MonClient::new(vec![self.mons[i].addr()])
            .with_timeout(Duration::from_millis(500))
            .get_map()
            .await
            .ok()
    }
}

fn spawn(m: &mut Mon, l: TcpListener) {
    let (tx, rx) = oneshot::channel::<()>();
    let cfg = m.cfg.clone();
    m.stop = Some(tx);
    m.task = Some(tokio::spawn(cairn_mon::run(cfg, l, async move {
        let _ = rx.await;
    })));
}

pub fn pool(name: &str) -> MapChange {
    MapChange::PoolCreateRule {
        name: name.into(),
        size: 3,
        min_size: 2,
        pg_count: 64,
        durability: Durability::Wal,
        domain: None,
    }
}

pub fn osd_boot(n: u8) -> MapChange {
    MapChange::OsdBoot {
        store_id: [n; 16],
        addr: format!("127.0.0.1:{}", 7000 + n as u16),
        host: format!("host{n}"),
        weight: 0x10000,
    }
}

/// The epoch a change produced.
pub fn changed_epoch(o: ChangeOutcome) -> u64 {
    match o {
        ChangeOutcome::Changed { epoch, .. } => epoch,
        ChangeOutcome::Unchanged => panic!("expected a change"),
    }
}
