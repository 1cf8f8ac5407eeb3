// The torture harness shared by kill9.rs and failpoints.rs (included by both with
// `include!`): runs `cairn store torture` against a store, ends it (kill -9, or a failpoint),
// and verifies every acknowledged commit against the model after reopening the store.

use cairn_store::{BlockDevice, Devices, FileDevice, Store, StoreConfig, StoreError};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use workload::{Model, ModelObj, Rng, COLLS, OBJECTS};

const BIN: &str = env!("CARGO_BIN_EXE_cairn");
/// How long a round may wait for the torture process to reach a point of its plan.
const PATIENCE: Duration = Duration::from_secs(90);

fn test_seed(name: &str) -> u64 {
    let seed = match std::env::var("CAIRN_KILL9_SEED") {
        Ok(s) => s.trim().parse().expect("CAIRN_KILL9_SEED must be a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            workload::mix(t ^ (std::process::id() as u64) << 40)
        }
    };
    eprintln!("{name}: seed {seed} (rerun with CAIRN_KILL9_SEED={seed})");
    seed
}

/// The store's files; removed at the end unless the test failed.
struct Files {
    paths: Vec<PathBuf>,
    data: Vec<PathBuf>,
    wal: Option<PathBuf>,
}

impl Files {
    /// Data files on local disk (the temp dir); the WAL, if separate, on /dev/shm when it
    /// exists (standing for NVM).
    fn new(name: &str, data_files: usize, separate_wal: bool) -> Files {
        let tag = format!("cairn-kill9-{}-{name}", std::process::id());
        let dir = std::env::temp_dir().join(&tag);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<PathBuf> = (0..data_files)
            .map(|i| dir.join(format!("data{i}")))
            .collect();
        let wal = separate_wal.then(|| {
            let shm = PathBuf::from("/dev/shm");
            if shm.is_dir() {
                shm.join(format!("{tag}-wal"))
            } else {
                dir.join("wal")
            }
        });
        let mut paths = vec![dir];
        paths.extend(wal.clone());
        Files { paths, data, wal }
    }

    fn dev_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        for d in &self.data {
            a.push("--data".to_string());
            a.push(d.display().to_string());
        }
        if let Some(w) = &self.wal {
            a.push("--wal".to_string());
            a.push(w.display().to_string());
        }
        a
    }

    fn devices(&self) -> Devices {
        let open = |p: &PathBuf, role: &str| -> Arc<dyn BlockDevice> {
            Arc::new(FileDevice::open(p, 0, role).unwrap())
        };
        Devices {
            data: self
                .data
                .iter()
                .enumerate()
                .map(|(i, p)| open(p, &format!("data{i}")))
                .collect(),
            wal: self.wal.as_ref().map(|p| open(p, "wal")),
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kill9: keeping the store's files for inspection: {:?}",
                self.paths
            );
            return;
        }
        for p in &self.paths {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

fn cairn(args: &[String]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the cairn binary")
}

/// What the torture process said on stdout.
#[derive(Default, Debug)]
struct Seen {
    open: bool,
    starts: BTreeMap<usize, u64>,
    /// Highest counter tried / acknowledged per thread.
    tries: BTreeMap<usize, u64>,
    acks: BTreeMap<usize, u64>,
    ack_count: BTreeMap<usize, u64>,
    protocol: Vec<String>,
    /// The last STATS line: commits, checkpoints, segments cleaned, free segments, direct
    /// writes.
    stats: Vec<u64>,
    eof: bool,
}

impl Seen {
    fn line(&mut self, l: &str) {
        let w: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok());
        match (w.first().copied(), num(1), num(2)) {
            (Some("OPEN"), Some(_), None) => self.open = true,
            (Some("START"), Some(t), Some(c)) => {
                self.starts.insert(t as usize, c);
            }
            (Some("TRY"), Some(t), Some(c)) => {
                let t = t as usize;
                let prev = self.tries.get(&t).or(self.starts.get(&t)).copied();
                if prev != c.checked_sub(1) {
                    self.protocol
                        .push(format!("TRY {t} {c} follows {prev:?} (START/TRY)"));
                }
                self.tries.insert(t, c);
            }
            (Some("ACK"), Some(t), Some(c)) => {
                let t = t as usize;
                if self.tries.get(&t) != Some(&c) {
                    self.protocol.push(format!(
                        "ACK {t} {c} while the last TRY was {:?}",
                        self.tries.get(&t)
                    ));
                }
                self.acks.insert(t, c);
                *self.ack_count.entry(t).or_default() += 1;
            }
            (Some("STATS"), Some(_), Some(_)) => {
                self.stats = w[1..].iter().filter_map(|x| x.parse().ok()).collect();
            }
            _ => self.protocol.push(format!("unexpected line {l:?}")),
        }
    }
}

/// When a round's kill timer starts.
#[derive(Clone, Copy, Debug)]
enum KillFrom {
    /// At spawn: the kill may land while the store is opening (replaying the WAL).
    Spawn,
    /// When the store is open and the threads start.
    Open,
    /// When every thread has had this many commits acknowledged (a heavy steady state).
    AllAcked(u64),
}

#[derive(Clone, Debug)]
struct Plan {
    threads: usize,
    from: KillFrom,
    delay: Duration,
    checkpoint_ms: Option<u64>,
    flush_ms: Option<u64>,
    /// Close the store cleanly after verifying (a final checkpoint) or just drop it (the
    /// next open replays the WAL again).
    close: bool,
}

struct Harness {
    name: &'static str,
    seed: u64,
    files: Files,
    /// Per workload thread: the model at `ctr[t]`, the counter verified last.
    models: Vec<Model>,
    ctr: Vec<u64>,
    round: usize,
    total_acks: u64,
    /// The torture process's `--direct-write-min` (None: the store's default, off).
    direct_write_min: Option<u64>,
    /// Direct writes the torture processes reported (their last STATS lines).
    direct_writes: u64,
    /// How the next rounds end: kill -9 (none), or at a failpoint.
    failpoint: Option<Failpoint>,
}

/// A round that ends at a named failpoint of the store (`fail` syntax after the name, e.g.
/// `store_index_apply=300*off->panic`) instead of a kill -9 at a random time.
#[derive(Clone, Debug)]
struct Failpoint {
    /// The failpoint's name.
    name: &'static str,
    /// What it does once reached: `panic` (the process must abort by itself, with a crash
    /// report) or `sleep(...)` (the process stalls there and is killed -9 while it does).
    action: &'static str,
    /// Calls that pass before it acts.
    skip: u64,
}

impl Failpoint {
    fn spec(&self) -> String {
        format!("{}={}*off->{}", self.name, self.skip, self.action)
    }

    fn panics(&self) -> bool {
        self.action == "panic"
    }
}

impl Harness {
    fn new(name: &'static str, files: Files, mkfs: &[&str]) -> Harness {
        let seed = test_seed(name);
        let mut args: Vec<String> = vec!["store".into(), "mkfs".into()];
        args.extend(files.dev_args());
        args.extend(mkfs.iter().map(|s| s.to_string()));
        let o = cairn(&args);
        assert!(
            o.status.success(),
            "mkfs failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Harness {
            name,
            seed,
            files,
            models: vec![Model::default(); workload::MAX_THREADS],
            ctr: vec![0; workload::MAX_THREADS],
            round: 0,
            total_acks: 0,
            direct_write_min: None,
            direct_writes: 0,
            failpoint: None,
        }
    }

    fn ctx(&self) -> String {
        let at = self
            .failpoint
            .as_ref()
            .map_or(String::new(), |f| format!(" failpoint {}", f.spec()));
        format!("{} seed {} round {}{at}", self.name, self.seed, self.round)
    }

    fn spawn(&self, p: &Plan) -> Child {
        let mut args: Vec<String> = vec!["store".into(), "torture".into()];
        args.extend(self.files.dev_args());
        args.extend([
            "--seed".into(),
            self.seed.to_string(),
            "--threads".into(),
            p.threads.to_string(),
        ]);
        if let Some(ms) = p.checkpoint_ms {
            args.extend(["--checkpoint-interval-ms".into(), ms.to_string()]);
        }
        if let Some(ms) = p.flush_ms {
            args.extend(["--flush-max-delay-ms".into(), ms.to_string()]);
        }
        if let Some(b) = self.direct_write_min {
            args.extend(["--direct-write-min".into(), b.to_string()]);
        }
        let mut cmd = Command::new(BIN);
        if let Some(f) = &self.failpoint {
            cmd.env("FAILPOINTS", f.spec())
                .env("CAIRN_CRASH_DIR", self.crash_dir());
        }
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cairn store torture")
    }

    /// Where the torture process writes its crash reports.
    fn crash_dir(&self) -> PathBuf {
        self.files.paths[0].join("crash")
    }

    /// One round: run the workload, kill -9 it, verify the store.
    fn round(&mut self, p: Plan) {
        self.round += 1;
        let ctx = self.ctx();
        eprintln!("{ctx}: {p:?}");
        let t0 = Instant::now();
        let mut child = self.spawn(&p);
        let seen = Arc::new((Mutex::new(Seen::default()), Condvar::new()));
        let out = child.stdout.take().unwrap();
        let reader = {
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(out);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match r.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        // A line cut by the kill is not a statement.
                        Ok(_) if buf.last() != Some(&b'\n') => break,
                        Ok(_) => {
                            let l = String::from_utf8_lossy(&buf);
                            seen.0.lock().unwrap().line(l.trim_end());
                            seen.1.notify_all();
                        }
                    }
                }
                seen.0.lock().unwrap().eof = true;
                seen.1.notify_all();
            })
        };
        let mut err = child.stderr.take().unwrap();
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });

        // Wait for the plan's starting point, then the delay, then kill -9.
        let threads = p.threads as u64;
        let reached = |s: &Seen| match p.from {
            KillFrom::Spawn => true,
            KillFrom::Open => s.open,
            KillFrom::AllAcked(n) => {
                s.ack_count.len() as u64 == threads && s.ack_count.values().all(|&c| c >= n)
            }
        };
        {
            let (m, cv) = &*seen;
            let mut s = m.lock().unwrap();
            while !reached(&s) && !s.eof {
                assert!(
                    t0.elapsed() < PATIENCE,
                    "{ctx}: the torture process did not reach {:?} in {PATIENCE:?}",
                    p.from
                );
                s = cv.wait_timeout(s, Duration::from_millis(50)).unwrap().0;
            }
        }
        let want = match &self.failpoint {
            Some(f) if f.panics() => wait_for_abort(&mut child, &ctx),
            Some(_) => {
                wait_for_silence(&seen, &ctx);
                kill9(&mut child)
            }
            None => {
                std::thread::sleep(p.delay);
                kill9(&mut child)
            }
        };
        let status = child.wait().unwrap();
        reader.join().unwrap();
        let stderr = err_reader.join().unwrap();
        let seen = std::mem::take(&mut *seen.0.lock().unwrap());
        assert_eq!(
            status.signal(),
            Some(want),
            "{ctx}: the torture process ended with {status}, not by signal {want}\n\
             stderr: {stderr}\nseen: {seen:?}"
        );
        if let Some(f) = self.failpoint.clone().filter(Failpoint::panics) {
            self.check_crash_report(&f, &stderr, &ctx);
        }
        assert!(
            seen.protocol.is_empty(),
            "{ctx}: protocol violations: {:?}",
            seen.protocol
        );
        for (&t, &c) in &seen.starts {
            assert_eq!(
                c, self.ctr[t],
                "{ctx}: thread {t} resumed after counter {c}, but the store held {} when this \
                 test verified and closed it",
                self.ctr[t]
            );
        }
        let acks: u64 = seen.ack_count.values().sum();
        self.total_acks += acks;
        self.direct_writes += seen.stats.get(4).copied().unwrap_or(0);
        eprintln!(
            "{ctx}: killed after {:?}: {acks} commits acknowledged, last ACK {:?}, last TRY \
             {:?}; store counters (commits, checkpoints, segments cleaned, free, direct): {:?}",
            t0.elapsed(),
            seen.acks,
            seen.tries,
            seen.stats
        );
        self.verify(&seen, p.close);
    }

    /// A process that aborted at failpoint `f` logged the panic (where and what) and left a
    /// crash report naming it.
    fn check_crash_report(&self, f: &Failpoint, stderr: &str, ctx: &str) {
        assert!(
            stderr.contains("panicked") && stderr.contains(f.name) && stderr.contains("aborting"),
            "{ctx}: the abort at {} was not logged as a panic:\n{stderr}",
            f.name
        );
        let (reports, bad) = cairn_failstop::pending_reports(&self.crash_dir());
        assert!(bad.is_empty(), "{ctx}: unreadable crash reports: {bad:?}");
        let r = reports
            .iter()
            .map(|(_, r)| r)
            .find(|r| r.message.contains(f.name))
            .unwrap_or_else(|| panic!("{ctx}: no crash report names {}: {reports:?}", f.name));
        assert!(r.location.contains(".rs:"), "{ctx}: {r:?}");
        for (path, _) in &reports {
            // The next round's report is looked for alone.
            std::fs::remove_file(path).unwrap();
        }
    }

    /// Opens the store here and checks everything the workload owns against the model.
    fn verify(&mut self, seen: &Seen, close: bool) {
        let ctx = self.ctx();
        let t0 = Instant::now();
        let store = Store::open(&self.files.devices(), StoreConfig::default())
            .unwrap_or_else(|e| panic!("{ctx}: reopening the store after kill -9 failed: {e}"));
        let present: Vec<bool> = COLLS.iter().map(|&c| store.collection_exists(c)).collect();
        assert!(
            present.iter().all(|&p| p) || present.iter().all(|&p| !p),
            "{ctx}: collections {COLLS:?} present {present:?}: the transaction creating them \
             was applied in part"
        );
        if !present[0] {
            assert!(
                self.ctr.iter().all(|&c| c == 0) && seen.acks.is_empty(),
                "{ctx}: the workload's collections are gone, ACKs seen: {:?}",
                seen.acks
            );
            assert!(
                store.list_collections().is_empty(),
                "{ctx}: stray collections"
            );
            finish(store, close, &ctx);
            return;
        }
        let mut expected_objects = 0;
        let mut expected_keys = 0;
        for t in 0..self.models.len() {
            let prev = self.ctr[t];
            let ack = seen.acks.get(&t).copied().unwrap_or(0);
            let tried = seen.tries.get(&t).copied().unwrap_or(0);
            let r = match store.kv_get(COLLS[0], &workload::ctr_key(t)).unwrap() {
                None => 0,
                Some(v) => workload::parse_ctr(&v)
                    .unwrap_or_else(|| panic!("{ctx}: thread {t}'s counter holds {v:?}")),
            };
            assert!(
                r >= prev && r >= ack && r <= prev.max(tried),
                "{ctx}: thread {t} holds counter {r}; expected within [{}, {}] (verified last \
                 round: {prev}, last ACK: {ack}, last TRY: {tried}){}",
                prev.max(ack),
                prev.max(tried),
                if r < ack {
                    " — an acknowledged transaction was lost"
                } else {
                    ""
                }
            );
            let before = self.models[t].clone();
            for c in prev + 1..=r {
                self.models[t].apply(&workload::txn(self.seed, t, c));
            }
            let got = snapshot(&store, t);
            if got != self.models[t] {
                panic!(
                    "{ctx}: thread {t} (counter {r}; verified last round {prev}, last ACK {ack}, \
                     last TRY {tried}): the store differs from the model:\n{}\n{}",
                    diff(&self.models[t], &got),
                    which_counters(&before, prev, prev.max(tried), &got, self.seed, t)
                );
            }
            self.ctr[t] = r;
            expected_objects += self.models[t].objects.len();
            expected_keys += self.models[t].kv.len();
        }
        // Nothing else is in the store.
        let colls = store.list_collections();
        assert_eq!(colls, COLLS.to_vec(), "{ctx}: collections");
        let (mut objects, mut keys) = (0, 0);
        for &c in &COLLS {
            objects += store.list_objects(c, None, usize::MAX).unwrap().len();
            keys += store.kv_range(c, b"", None, usize::MAX).unwrap().len();
        }
        assert_eq!(objects, expected_objects, "{ctx}: objects in the store");
        assert_eq!(
            keys, expected_keys,
            "{ctx}: collection entries in the store"
        );
        let rep = store.scrub();
        assert!(
            rep.issues.is_empty(),
            "{ctx}: scrub found damage after kill -9: {:?}",
            rep.issues
        );
        if let Err(e) = store.check_space_accounting() {
            panic!("{ctx}: space accounting is wrong after kill -9: {e}");
        }
        assert_eq!(store.failure(), None, "{ctx}: the store failed");
        let stats = store.stats();
        eprintln!(
            "{ctx}: verified {expected_objects} objects, {expected_keys} keys, {} blocks \
             scrubbed, {} of {} segments free, counters {:?} in {:?}",
            rep.blocks,
            stats.segments_free,
            stats.segments_total,
            &self.ctr[..self.ctr.iter().rposition(|&c| c > 0).map_or(0, |i| i + 1)],
            t0.elapsed()
        );
        finish(store, close, &ctx);
    }

    /// A last check with the operator's tools: `cairn store scrub` exits 0.
    fn final_scrub(&self) {
        let mut args: Vec<String> = vec!["store".into(), "scrub".into()];
        args.extend(self.files.dev_args());
        let o = cairn(&args);
        assert!(
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("no issues"),
            "{}: cairn store scrub: {}\n{}\n{}",
            self.ctx(),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

fn finish(store: Store, close: bool, ctx: &str) {
    if close {
        store
            .close()
            .unwrap_or_else(|e| panic!("{ctx}: closing the verified store failed: {e}"));
    } else {
        drop(store);
    }
}

/// What the store holds of thread `t`'s objects and keys.
fn snapshot(store: &Store, t: usize) -> Model {
    let mut m = Model::default();
    for k in 0..OBJECTS {
        let (c, name) = (workload::obj_coll(k), workload::obj_name(t, k));
        let st = match store.stat(c, &name) {
            Ok(st) => st,
            Err(StoreError::NoObject { .. }) => continue,
            Err(e) => panic!("stat {c}/{}: {e}", String::from_utf8_lossy(&name)),
        };
        let data = store
            .read(c, &name, 0, st.size)
            .unwrap_or_else(|e| panic!("read {c}/{}: {e}", String::from_utf8_lossy(&name)));
        let attrs = store.attrs(c, &name).unwrap().into_iter().collect();
        m.objects.insert((c, name), ModelObj { data, attrs });
    }
    let prefix = workload::key_prefix(t);
    let mut end = prefix.clone();
    *end.last_mut().unwrap() += 1;
    for &c in &COLLS {
        for (k, v) in store.kv_range(c, &prefix, Some(&end), usize::MAX).unwrap() {
            m.kv.insert((c, k), v);
        }
    }
    m
}

fn show(k: &(u64, Vec<u8>)) -> String {
    format!("{}/{}", k.0, String::from_utf8_lossy(&k.1))
}

/// The differences between the model (`want`) and the store (`got`), one per line.
fn diff(want: &Model, got: &Model) -> String {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<_> =
        want.objects.keys().chain(got.objects.keys()).collect();
    for k in keys {
        match (want.objects.get(k), got.objects.get(k)) {
            (Some(_), None) => out.push(format!("  object {} is missing", show(k))),
            (None, Some(_)) => out.push(format!("  object {} should not exist", show(k))),
            (Some(w), Some(g)) if w != g => {
                let mut s = format!("  object {}:", show(k));
                if w.data.len() != g.data.len() {
                    s += &format!(" size {} (want {})", g.data.len(), w.data.len());
                }
                let bad: Vec<usize> = (0..w.data.len().min(g.data.len()))
                    .filter(|&i| w.data[i] != g.data[i])
                    .collect();
                if let (Some(first), Some(last)) = (bad.first(), bad.last()) {
                    s += &format!(
                        " {} bytes differ in {first}..={last} (blocks {}..={})",
                        bad.len(),
                        first / 4096,
                        last / 4096
                    );
                }
                if w.attrs != g.attrs {
                    let show_attrs = |a: &BTreeMap<Vec<u8>, Vec<u8>>| {
                        a.iter()
                            .map(|(k, v)| {
                                let v = if k == b"ctr" {
                                    String::from_utf8_lossy(v).into_owned()
                                } else {
                                    format!("{} bytes", v.len())
                                };
                                format!("{}={v}", String::from_utf8_lossy(k))
                            })
                            .collect::<Vec<_>>()
                    };
                    s += &format!(
                        " attrs {:?} (want {:?})",
                        show_attrs(&g.attrs),
                        show_attrs(&w.attrs)
                    );
                }
                out.push(s);
            }
            _ => {}
        }
    }
    let keys: std::collections::BTreeSet<_> = want.kv.keys().chain(got.kv.keys()).collect();
    for k in keys {
        match (want.kv.get(k), got.kv.get(k)) {
            (Some(_), None) => out.push(format!("  key {} is missing", show(k))),
            (None, Some(_)) => out.push(format!("  key {} should not exist", show(k))),
            (Some(w), Some(g)) if w != g => out.push(format!("  key {} differs", show(k))),
            _ => {}
        }
    }
    out.join("\n")
}

/// For each object of the store's snapshot, the counters in `from..=to` at which the model
/// holds the same object: shows lost or partly applied transactions.
fn which_counters(base: &Model, from: u64, to: u64, got: &Model, seed: u64, t: usize) -> String {
    let mut m = base.clone();
    let mut matches: BTreeMap<(u64, Vec<u8>), Vec<u64>> = BTreeMap::new();
    for c in from..=to {
        if c > from {
            m.apply(&workload::txn(seed, t, c));
        }
        for k in 0..OBJECTS {
            let key = (workload::obj_coll(k), workload::obj_name(t, k));
            if m.objects.get(&key) == got.objects.get(&key) {
                matches.entry(key).or_default().push(c);
            }
        }
    }
    let mut out = format!("  counters {from}..={to} at which the model matches each object:");
    for k in 0..OBJECTS {
        let key = (workload::obj_coll(k), workload::obj_name(t, k));
        let list = matches.get(&key).cloned().unwrap_or_default();
        let shown = if list.len() > 12 {
            format!("{:?}.. ({} counters)", &list[..12], list.len())
        } else {
            format!("{list:?}")
        };
        out += &format!("\n    {}: {shown}", show(&key));
    }
    out
}

/// A random round, for soak runs (`CAIRN_KILL9_EXTRA_ROUNDS`).
fn random_plan(r: &mut Rng) -> Plan {
    Plan {
        threads: 1 + r.below(6) as usize,
        from: match r.below(4) {
            0 => KillFrom::Spawn,
            1 => KillFrom::Open,
            _ => KillFrom::AllAcked(1 + r.below(40)),
        },
        delay: ms(r, 0, 1500),
        checkpoint_ms: (r.below(2) == 0).then(|| 10 + r.below(500)),
        flush_ms: (r.below(2) == 0).then(|| r.below(100)),
        close: r.below(2) == 0,
    }
}

/// Extra random rounds after the fixed ones (default none): a soak test, e.g.
/// `CAIRN_KILL9_EXTRA_ROUNDS=100 cargo test -p cairn-cli --test kill9`.
fn extra_rounds() -> usize {
    std::env::var("CAIRN_KILL9_EXTRA_ROUNDS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// kill -9 of the torture process; the signal it must then have died of.
fn kill9(child: &mut Child) -> i32 {
    child.kill().expect("kill -9 the torture process");
    libc::SIGKILL
}

/// Waits until the torture process aborts by itself (a failpoint panicked: fail stop).
fn wait_for_abort(child: &mut Child, ctx: &str) -> i32 {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("{ctx}: the failpoint did not stop the torture process in {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    libc::SIGABRT
}

/// Waits until the torture process has said nothing for a second after its threads began
/// committing: a failpoint that sleeps with a collection's lock held (every transaction of
/// the workload names collection 1), or its batch unwritten, has stopped every thread there.
/// Nothing need be acknowledged yet: a point reached in the first transaction (a small skip
/// count) stalls the process before any acknowledgement.
fn wait_for_silence(seen: &Arc<(Mutex<Seen>, Condvar)>, ctx: &str) {
    let t0 = Instant::now();
    let (m, cv) = &**seen;
    let mut s = m.lock().unwrap();
    let mut last = (s.tries.clone(), s.acks.clone(), Instant::now());
    loop {
        assert!(
            t0.elapsed() < PATIENCE,
            "{ctx}: the torture process never stalled at the failpoint"
        );
        assert!(
            !s.eof,
            "{ctx}: the torture process ended before the failpoint"
        );
        s = cv.wait_timeout(s, Duration::from_millis(100)).unwrap().0;
        if (&s.tries, &s.acks) != (&last.0, &last.1) {
            last = (s.tries.clone(), s.acks.clone(), Instant::now());
        } else if last.2.elapsed() > Duration::from_secs(1) && !s.tries.is_empty() {
            return;
        }
    }
}

fn ms(r: &mut Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + r.below(hi - lo + 1))
}
