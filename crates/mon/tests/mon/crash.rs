//! kill -9: every command a monitor acknowledged is in its map after it restarts.
//!
//! The monitor runs in a child process (this test binary re-run in child mode) so that it can
//! really be killed with SIGKILL while commands are in flight.

use crate::common::*;
use cairn_mon::MonConfig;
use cairn_monclient::MonClient;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

const CHILD_ENV: &str = "CAIRN_MON_CRASH_CHILD_DIR";

/// Kills the child monitor however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Child mode: runs one monitor on the dir named by the environment, forever. Without the
/// environment variable (a normal test run) it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let members = BTreeMap::from([(1, addr.clone())]);
    let cfg = MonConfig::new(1, members, dir.join("mon"), FSID);
    let tmp = dir.join("addr.tmp");
    std::fs::write(&tmp, &addr).expect("write addr");
    std::fs::rename(&tmp, dir.join("addr")).expect("publish addr");
    cairn_mon::run(cfg, l, std::future::pending())
        .await
        .expect("monitor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_commands_survive_kill_9() {
    let scratch = Scratch::new("crash");
    std::fs::create_dir_all(&scratch.0).expect("mkdir");
    let exe = std::env::current_exe().expect("test binary");
    let mut child = KillOnDrop(
        Command::new(exe)
            .args([
                "crash::crash_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &scratch.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the monitor process"),
    );
    let addr_file = scratch.0.join("addr");
    let addr = eventually(
        "the child monitor's address",
        Duration::from_secs(10),
        || async { std::fs::read_to_string(&addr_file).ok() },
    )
    .await;

    // Short deadline: after the kill the writers give up quickly.
    let client = MonClient::new(vec![addr.clone()]).with_timeout(Duration::from_millis(1500));
    client.command(pool("warmup")).await.expect("first command");
    // Commands from several tasks in flight at once; remember the acknowledged ones.
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (client, acked) = (client.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            for n in 0.. {
                let name = format!("w{w}-{n}");
                if client.command(pool(&name)).await.is_err() {
                    return;
                }
                acked.lock().unwrap().push(name);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    child.0.kill().expect("kill -9");
    let _ = child.0.wait();
    for w in writers {
        let _ = within("writers notice the crash", Duration::from_secs(10), w).await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 5,
        "too few commands before the kill: {}",
        acked.len()
    );

    // Restart the monitor from its dir in this process.
    let l = TcpListener::bind(&addr).await.expect("rebind");
    let cfg = MonConfig::new(
        1,
        BTreeMap::from([(1, addr.clone())]),
        scratch.0.join("mon"),
        FSID,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mon = tokio::spawn(cairn_mon::run(cfg, l, async move {
        let _ = stopped.await;
    }));
    let map = within(
        "map after the crash",
        Duration::from_secs(10),
        client.get_map(),
    )
    .await
    .expect("map");
    for name in &acked {
        assert!(
            map.pool_by_name(name).is_some(),
            "acknowledged pool {name} lost by kill -9"
        );
    }
    assert!(map.pool_by_name("warmup").is_some());
    assert!(map.epoch as usize >= acked.len() + 2);
    let _ = stop.send(());
    within("monitor stops", Duration::from_secs(10), mon)
        .await
        .expect("task")
        .expect("clean stop");
}
