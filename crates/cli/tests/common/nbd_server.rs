//! A `cairn nbd serve` process beside a test cluster (`nbd.rs`, `hosts.rs`).

#![allow(dead_code)]

use super::cluster::Cluster;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A `cairn nbd serve` of one pool on a free port, killed on drop.
pub struct NbdServer {
    pub child: Child,
    pub addr: String,
}

impl NbdServer {
    pub fn start(c: &Cluster, pool: &str) -> NbdServer {
        NbdServer::start_with(c, pool, &[])
    }

    pub fn start_with(c: &Cluster, pool: &str, extra: &[&str]) -> NbdServer {
        NbdServer::start_env(c, pool, extra, &[])
    }

    pub fn start_env(c: &Cluster, pool: &str, extra: &[&str], env: &[(&str, &str)]) -> NbdServer {
        use std::io::BufRead;
        let conf = c.conf.display().to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["-c", &conf, "nbd", "serve", "--pool", pool])
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start cairn nbd serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if line.starts_with("serving the volumes") {
                    let addr = line.rsplit("nbd://").next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("cairn nbd serve did not start\n{}", c.logs()));
        NbdServer { child, addr }
    }

    pub fn uri(&self, volume: &str) -> String {
        format!("nbd://{}/{volume}", self.addr)
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits (30 s at most) for the server to exit.
    pub fn wait_exit(&mut self) {
        let start = Instant::now();
        while self.child.try_wait().expect("try_wait").is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "nbd serve did not exit"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
