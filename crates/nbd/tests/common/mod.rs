//! Shared test fixtures: the in-memory exports, a server on 127.0.0.1 with its own runtime,
//! and a runner for the external NBD clients with a time limit.
#![allow(dead_code)] // Each test binary uses a different subset.

pub mod mem;
pub mod raw;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use mem::MemExports;

/// A server on an ephemeral port, stopped (gracefully) on drop.
pub struct TestServer {
    pub port: u16,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub fn start(exports: MemExports) -> TestServer {
        TestServer::start_with(exports, None)
    }

    /// A server that requires TLS with the pre-shared keys `tls` finds.
    pub fn start_with(exports: MemExports, tls: Option<Arc<cairn_nbd::TlsServer>>) -> TestServer {
        init_logging();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = rt.spawn(cairn_nbd::serve(
            listener,
            Arc::new(exports),
            tls,
            async move {
                let _ = stopped.await;
            },
        ));
        TestServer {
            port,
            rt,
            stop: Some(stop),
            done: Some(done),
        }
    }

    /// nbd://127.0.0.1:PORT/name
    pub fn uri(&self, name: &str) -> String {
        format!("nbd://127.0.0.1:{}/{}", self.port, name)
    }

    /// Signals shutdown and waits (bounded) for `serve` to return; true if it did.
    pub fn shutdown(&mut self) -> bool {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.done.take() {
            Some(done) => self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), done).await })
                .is_ok(),
            None => true,
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// A command for an external client, or a panic naming the Debian package to install.
pub fn tool(name: &str, package: &str) -> Command {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{name}` not found in PATH: install the Debian package `{package}` \
         (CI: apt-get install fio libnbd-bin nbdkit nbdfuse qemu-utils python3-libnbd)"
    );
    let mut cmd = Command::new(name);
    // nbdsh runs `python3`, which must be the system one with the libnbd bindings (a pyenv or
    // venv python earlier in PATH does not have them).
    if let Some(path) = std::env::var_os("PATH") {
        let mut dirs = vec![PathBuf::from("/usr/bin"), PathBuf::from("/bin")];
        dirs.extend(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(dirs) {
            cmd.env("PATH", joined);
        }
    }
    cmd
}

/// Runs a command to completion within `limit`, killing it otherwise; panics (with its
/// output) if it fails or times out.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let out = run_status(cmd, limit);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Like [`run`] but returns a failed status instead of panicking on it (still panics on a
/// timeout).
pub fn run_status(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = so.read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = se.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = t_err.join().unwrap_or_default();
            panic!(
                "{cmd:?} did not finish within {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cairn-nbd-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Random bytes with some all-zero stretches (so clients use zeroing and holes too).
pub fn image(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    // Zero the second eighth and every 7th 64 KiB piece.
    v[len / 8..len / 4].fill(0);
    for (i, chunk) in v.chunks_mut(64 << 10).enumerate() {
        if i % 7 == 3 {
            chunk.fill(0);
        }
    }
    v
}

pub fn write_file(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

pub fn read_file(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Asserts two images are equal, naming the first differing offset rather than dumping MiBs.
pub fn assert_same(a: &[u8], b: &[u8], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
        panic!("{what}: first difference at byte {i}");
    }
}
