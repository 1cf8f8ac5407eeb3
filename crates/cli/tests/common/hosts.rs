//! Hosts for multi-host tests: Linux network namespaces, each with its own address, joined by
//! a bridge. The bridge lives in the test's own namespace with an address on a private /24
//! (so the test and the `cairn` CLI reach every host), is joined to no outside interface, and
//! the hosts have no route beyond that /24: traffic goes only to the test's own hosts. Each
//! daemon runs as a real process inside its host's namespace (`ip netns exec`). Everything is
//! removed on drop (processes in the namespaces killed first).
//!
//! Needs root and iproute2; [`Hosts::create`] returns `None` with the reason printed where
//! namespaces cannot be made, and the test then skips itself.

#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct Hosts {
    /// Short unique id (interface names are at most 15 bytes).
    id: String,
    /// Each host's address.
    pub ips: Vec<String>,
}

fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip {args:?}: {e}"))
}

fn ip_ok(args: &[&str]) {
    let o = ip(args);
    assert!(
        o.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

impl Hosts {
    /// `n` hosts (at most 200), or `None` (the reason printed) where network namespaces
    /// cannot be created here.
    pub fn create(n: usize) -> Option<Hosts> {
        assert!(n <= 200);
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: multi-host tests need root (network namespaces)");
            return None;
        }
        let seq = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}{}", std::process::id() % 100_000, seq);
        let subnet = format!("10.231.{}", (std::process::id() * 7 + seq) % 250);
        let probe = format!("cairn{id}p");
        let made = ip(&["netns", "add", &probe]);
        if !made.status.success() {
            eprintln!(
                "skipped: cannot create network namespaces here: {}",
                String::from_utf8_lossy(&made.stderr).trim()
            );
            return None;
        }
        ip_ok(&["netns", "del", &probe]);
        let hosts = Hosts {
            id,
            ips: (0..n).map(|i| format!("{subnet}.{}", i + 1)).collect(),
        };
        let br = hosts.bridge();
        ip_ok(&["link", "add", &br, "type", "bridge"]);
        ip_ok(&["addr", "add", &format!("{subnet}.254/24"), "dev", &br]);
        ip_ok(&["link", "set", &br, "up"]);
        for i in 0..n {
            let (ns, veth) = (hosts.ns(i), hosts.veth(i));
            ip_ok(&["netns", "add", &ns]);
            ip_ok(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip_ok(&["link", "set", &veth, "master", &br, "up"]);
            let addr = format!("{}/24", hosts.ips[i]);
            ip_ok(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            ip_ok(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip_ok(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        Some(hosts)
    }

    fn bridge(&self) -> String {
        format!("cb{}", self.id)
    }

    /// Network namespace of host `i`.
    pub fn ns(&self, i: usize) -> String {
        format!("cairn{}h{i}", self.id)
    }

    fn veth(&self, i: usize) -> String {
        format!("cv{}h{i}", self.id)
    }

    /// A command that runs `program` on host `i`.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i), program]);
        c
    }

    /// Pids of every process on host `i`.
    pub fn pids(&self, i: usize) -> Vec<i32> {
        let o = ip(&["netns", "pids", &self.ns(i)]);
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// The whole host fails at once: every process on it killed (SIGKILL), its link down.
    pub fn lose(&self, i: usize) {
        self.cut(i);
        for pid in self.pids(i) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// Host `i`'s network link goes down (its processes keep running, unreachable).
    pub fn cut(&self, i: usize) {
        ip_ok(&["link", "set", &self.veth(i), "down"]);
    }

    /// Host `i`'s network link comes back.
    pub fn heal(&self, i: usize) {
        ip_ok(&["link", "set", &self.veth(i), "up"]);
    }

    /// Host `i` is cut off by nftables inside its namespace: every packet in or out that
    /// is not on its loopback is dropped (its processes, and a client in it, still reach
    /// each other).
    pub fn firewall(&self, i: usize) {
        let ns = self.ns(i);
        let nft = |args: &[&str]| {
            let mut full = vec!["netns", "exec", &ns, "nft"];
            full.extend_from_slice(args);
            ip_ok(&full);
        };
        nft(&["add", "table", "inet", "cairn_cut"]);
        for (chain, hook, dev) in [("in", "input", "iif"), ("out", "output", "oif")] {
            let spec = format!("{{ type filter hook {hook} priority 0; }}");
            nft(&["add", "chain", "inet", "cairn_cut", chain, &spec]);
            nft(&[
                "add",
                "rule",
                "inet",
                "cairn_cut",
                chain,
                dev,
                "!=",
                "lo",
                "drop",
            ]);
        }
    }

    /// Removes [`Hosts::firewall`]'s rules.
    pub fn unfirewall(&self, i: usize) {
        ip_ok(&[
            "netns",
            "exec",
            &self.ns(i),
            "nft",
            "delete",
            "table",
            "inet",
            "cairn_cut",
        ]);
    }

    /// Moves the calling thread into host `i`'s network namespace: sockets it opens from
    /// then on are on that host (use a current-thread runtime on it).
    pub fn enter(&self, i: usize) {
        use std::os::fd::AsRawFd;
        let path = format!("/var/run/netns/{}", self.ns(i));
        let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            r,
            0,
            "setns into {path}: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for i in 0..self.ips.len() {
            for pid in self.pids(i) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            // Deleting the link removes both ends at once: a namespace outlives its name
            // while sockets in it wait out TIME_WAIT, and its end of the pair with it.
            let _ = ip(&["link", "del", &self.veth(i)]);
            let _ = ip(&["netns", "del", &self.ns(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}
