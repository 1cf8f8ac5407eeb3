//! The monitors' key database through `cairn auth`, on real clusters: keys are created,
//! shown, limited, replicated, removed and rotated by the monitors (not by editing keyring
//! files), and a rotation under load fails no I/O.

mod common;

use cairn_auth::{Entity, Keyring};
use common::cluster::{run_as, runtime, text, Cluster};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `cairn ARGS` as the administrator, which must fail; returns its output.
fn refused(c: &Cluster, args: &[&str]) -> String {
    let o = c.cairn(args);
    let out = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{args:?} succeeded: {out}");
    out
}

#[test]
fn keys_are_created_limited_replicated_and_removed_through_the_monitors() {
    let c = Cluster::up("keys-manage", 3, 1);
    c.pool_create("p", 1, 1, 8);
    let ls: serde_json::Value =
        serde_json::from_str(&c.ok(&["auth", "ls", "--json"])).expect("ls json");
    let mut names: Vec<&str> = ls
        .as_array()
        .expect("list")
        .iter()
        .map(|e| e["entity"].as_str().expect("entity"))
        .collect();
    names.sort();
    assert_eq!(names, ["client.admin", "mon.*", "osd.0"], "{ls}");
    let mons = ls
        .as_array()
        .and_then(|l| l.iter().find(|e| e["entity"] == "mon.*"))
        .expect("the monitors' key");
    assert_eq!(mons["monitors_key"]["rotated"], false, "{ls}");
    assert!(mons["previous_key_until"].is_null(), "{ls}");
    let admin = ls
        .as_array()
        .and_then(|l| l.iter().find(|e| e["entity"] == "client.admin"))
        .expect("admin");
    assert_eq!(admin["caps"]["mon"], "*");
    // The monitors' database holds every key: private to the monitor's user.
    let db = c.dir.join("mon.0").join("mon.redb");
    let mode = std::fs::metadata(&db)
        .expect("mon.redb")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "{}", db.display());

    // A new client: its key comes from the monitors, written private.
    let app_ring = c.add_key("client.app", ("r", "rw pool=p", ""));
    let mode = std::fs::metadata(&app_ring)
        .expect("keyring")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let app = Entity::parse("client.app").expect("entity");
    let key = Keyring::load_key(&app_ring, &app).expect("app key").secret;
    let shown = c.ok(&["auth", "get", "client.app"]);
    assert!(shown.contains(&key.to_hex()), "{shown}");
    let out = refused(&c, &["auth", "add", "client.app"]);
    assert!(out.contains("client.app already has another key"), "{out}");

    // What the caps allow, checked by the monitors and the OSDs.
    let app_conf = c.conf_for("client.app", &app_ring);
    let data = c.dir.join("data");
    std::fs::write(&data, b"hello keys").expect("data");
    let data_s = data.display().to_string();
    let (ok, out) = run_as(&app_conf, &["obj", "put", "p", "a", &data_s]);
    assert!(ok, "{out}");
    let (ok, out) = run_as(&app_conf, &["auth", "ls"]);
    assert!(
        !ok && out.contains("permission denied: client.app lacks x on the monitors"),
        "{out}"
    );
    // The state of the monitors' key is for `mon x` too (asked directly: `auth ls` stops
    // at the list's refusal).
    let app_key = cairn_monclient::auth::KeySource::keyring(&app_ring, &app).expect("key");
    let asked = runtime().block_on(async {
        let mons = cairn_monclient::MonClient::new(c.mons()).with_auth(app_key.clone());
        mons.auth_request(cairn_proto::msg::mon::AuthRequest::MonKey, &app_key)
            .await
    });
    match asked {
        Err(e) => assert!(e.to_string().contains("lacks x on the monitors"), "{e}"),
        Ok(a) => panic!("the monitors' key state given to client.app: {a:?}"),
    }
    let (ok, out) = run_as(&app_conf, &["pool", "create", "q", "--size", "1"]);
    assert!(!ok && out.contains("lacks w on the monitors"), "{out}");
    c.ok(&[
        "auth",
        "caps",
        "client.app",
        "--mon",
        "r",
        "--osd",
        "r pool=p",
    ]);
    let (ok, out) = run_as(&app_conf, &["obj", "put", "p", "b", &data_s]);
    assert!(
        !ok && out.contains("permission denied: client.app lacks w on pool p"),
        "{out}"
    );
    let (ok, out) = run_as(&app_conf, &["obj", "get", "p", "a", "-"]);
    assert!(ok && out.contains("hello keys"), "{out}");

    // Rules the database keeps.
    let out = refused(&c, &["auth", "rm", "client.admin"]);
    assert!(
        out.contains("refusing to leave no key with `mon x`"),
        "{out}"
    );
    let out = refused(&c, &["auth", "add", "mon.7"]);
    assert!(
        out.contains("the monitors' key lives in each monitor's keyring file"),
        "{out}"
    );
    let out = refused(&c, &["auth", "caps", "osd.0", "--mon", "r"]);
    assert!(out.contains("daemons have no caps"), "{out}");
    let out = refused(&c, &["auth", "caps", "client.app", "--osd", "rw pool"]);
    assert!(out.contains("bad caps"), "{out}");
    let out = refused(
        &c,
        &["auth", "rotate", "client.app", "--keep-old", "9999999"],
    );
    assert!(out.contains("over the limit of 2592000 s"), "{out}");
    let out = refused(&c, &["auth", "get", "client.no/such"]);
    assert!(out.contains("is not an entity name"), "{out}");

    // Replicated: with the leader killed, the others still know every key.
    let leader = c.status()["mons"]["leader"].as_u64().expect("a leader");
    c.kill9(&format!("mon.{leader}"));
    let again = c.ok(&["auth", "get", "client.app"]);
    assert!(again.contains(&key.to_hex()), "{again}");
    let (ok, out) = run_as(&app_conf, &["obj", "get", "p", "a", "-"]);
    assert!(ok && out.contains("hello keys"), "{out}");

    // Removed: refused at the door, with the reason.
    c.ok(&["auth", "rm", "client.app"]);
    let (ok, out) = run_as(&app_conf, &["status"]);
    assert!(!ok && out.contains("unknown entity client.app"), "{out}");
    let out = refused(&c, &["auth", "get", "client.app"]);
    assert!(out.contains("client.app has no key"), "{out}");
}

/// What a writer did: its client and pool, how many writes it made, and the errors of those
/// that failed.
type Written = (cairn_client::Client, u32, u64, Vec<String>);

/// Writes the numbers 0, 1, ... in turn to objects `k0`..`k{objects-1}` of pool `p` with the
/// key of `source` until `stop` (at most 150 s), every write waited for.
fn spawn_writer(
    rt: &tokio::runtime::Runtime,
    c: &Cluster,
    source: Arc<cairn_monclient::auth::KeySource>,
    objects: u64,
    stop: &Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Written> {
    let mut cfg = cairn_client::ClientConfig::new(c.mons());
    cfg.auth = cairn_monclient::auth::EntityKey::from_source(source, c.mons());
    cfg.op_timeout = Duration::from_secs(60);
    let stop = stop.clone();
    rt.spawn(async move {
        let client = cairn_client::Client::connect(cfg).await.expect("connect");
        let pool = client.pool_id("p").expect("pool");
        let (mut done, mut failed) = (0u64, Vec::new());
        let deadline = Instant::now() + Duration::from_secs(150);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let name = format!("k{}", done % objects);
            match client
                .write_full(pool, name.as_bytes(), &done.to_le_bytes())
                .await
            {
                Ok(_) => done += 1,
                Err(e) => failed.push(e.to_string()),
            }
        }
        (client, pool, done, failed)
    })
}

/// The stopped writer failed no write, made enough of them, and the last value of every
/// object is the last write acknowledged for it.
fn check_writes(
    rt: &tokio::runtime::Runtime,
    writer: tokio::task::JoinHandle<Written>,
    objects: u64,
) {
    let (client, pool, done, failed) = rt.block_on(writer).expect("writer");
    assert!(failed.is_empty(), "failed writes: {failed:?}");
    assert!(done > 50, "only {done} writes");
    rt.block_on(async {
        for i in 0..objects.min(done) {
            let last = (0..done).rev().find(|n| n % objects == i).expect("a write");
            let got = client
                .read(pool, format!("k{i}").as_bytes(), 0, 8)
                .await
                .expect("read");
            assert_eq!(got, last.to_le_bytes(), "k{i}");
        }
    });
}

#[test]
fn a_rotated_client_and_osd_key_under_load_fail_no_io_and_the_old_key_expires() {
    let c = Cluster::up("keys-rotate", 1, 3);
    c.pool_create("p", 3, 2, 32);
    let app_ring = c.add_key("client.app", ("r", "rw", ""));
    let ring_s = app_ring.display().to_string();
    let app = Entity::parse("client.app").expect("entity");
    let old_ring = c.dir.join("app-old.keyring");
    std::fs::copy(&app_ring, &old_ring).expect("keep the old keyring");
    let old_conf = c.conf_for("client.app", &old_ring);
    let source = cairn_monclient::auth::KeySource::keyring(&app_ring, &app).expect("key");

    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&rt, &c, source.clone(), 32, &stop);
    std::thread::sleep(Duration::from_secs(1));

    // Rotate both keys, the new ones installed where the processes read them.
    let grace = 4u64;
    let keep = grace.to_string();
    c.ok(&[
        "auth",
        "rotate",
        "client.app",
        "--keep-old",
        &keep,
        "-o",
        &ring_s,
    ]);
    let osd_ring = c.dir.join("osd.1").join("keyring");
    let osd_s = osd_ring.display().to_string();
    c.ok(&["auth", "rotate", "osd.1", "--keep-old", &keep, "-o", &osd_s]);
    let rotated = Instant::now();
    let new_key = Keyring::load_key(&app_ring, &app).expect("new key").secret;
    let old_key = Keyring::load_key(&old_ring, &app).expect("old key").secret;
    assert_ne!(new_key, old_key);
    let listed = c.ok(&["auth", "ls"]);
    assert!(listed.contains("previous key accepted until"), "{listed}");
    // During the grace the old key still gets in.
    let (ok, out) = run_as(&old_conf, &["status"]);
    assert!(ok, "the old key within its grace: {out}");
    std::thread::sleep(Duration::from_secs(grace + 1).saturating_sub(rotated.elapsed()));
    let (ok, out) = run_as(&old_conf, &["status"]);
    assert!(
        !ok && out.contains("presents its previous key"),
        "the old key after its grace: {out}"
    );

    // Every process must authenticate again: the monitor restarts. The OSD and the client
    // reconnect with the keys they read from their files.
    let mon_log = c.dir.join("log").join("mon.0.log");
    let before = std::fs::read_to_string(&mon_log).expect("mon log");
    c.kill9("mon.0");
    c.restart_missing(1, 3);
    rt.block_on(async {
        let mons = cairn_monclient::MonClient::new(c.mons()).with_auth(source.clone());
        let t = mons.get_ticket(&app, &source.candidates()).await;
        assert!(t.is_ok(), "a ticket for the new key: {t:?}");
    });
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let st = c.status();
        if st["osds"]["up"].as_u64() == Some(3) && st["pgs"]["inactive"].as_u64() == Some(0) {
            break;
        }
        assert!(
            Instant::now() < until,
            "the OSDs did not all come back: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    check_writes(&rt, writer, 32);
    let log = std::fs::read_to_string(&mon_log).expect("mon log");
    let after = log.strip_prefix(before.as_str()).unwrap_or(&log);
    for who in ["osd.1", "client.app"] {
        assert!(
            !after
                .lines()
                .any(|l| l.contains(who) && l.contains("refused")),
            "{who} was refused after the restart:\n{after}"
        );
    }
}

/// A handshake with monitor `addr` as monitor `mon.9` proving `key`.
fn mon_handshake(addr: &str, key: &cairn_auth::Secret) -> Result<(), String> {
    use cairn_transport::{initiate, node_kind, Credentials};
    let creds = Credentials::Key {
        entity: Entity::mon(9),
        secret: key.clone(),
    };
    runtime().block_on(async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        initiate(&mut s, node_kind::MON, &creds)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

/// The monitors' key held in monitor `i`'s keyring file.
fn mon_key(c: &Cluster, i: u32) -> cairn_auth::Secret {
    let ring = Keyring::load(&c.dir.join(format!("mon.{i}")).join("keyring")).expect("keyring");
    let k = ring
        .keys
        .iter()
        .find(|k| k.entity.kind() == cairn_auth::EntityKind::Mon);
    k.expect("the monitors' key").secret.clone()
}

#[test]
fn the_monitors_key_rotates_under_load_failing_no_io_and_the_old_key_expires() {
    let c = Cluster::up("keys-monrot", 3, 3);
    c.pool_create("p", 3, 2, 16);
    let admin_ring = c.dir.join("keyring");
    let source = cairn_monclient::auth::KeySource::keyring(&admin_ring, &Entity::admin())
        .expect("admin key");
    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&rt, &c, source, 16, &stop);
    std::thread::sleep(Duration::from_secs(1));
    let old = mon_key(&c, 0);
    let addrs = c.mons();

    // Out of range, or shown: refused before anything changes.
    let e = refused(&c, &["auth", "rotate", "mon", "--keep-old", "10"]);
    assert!(e.contains("must be kept 60 s"), "{e}");
    let e = refused(&c, &["auth", "rotate", "mon", "-o", "/tmp/x"]);
    assert!(e.contains("never shown"), "{e}");
    assert_eq!(mon_key(&c, 0), old);
    let grace = 60u64;
    let out = c.ok(&["auth", "rotate", "mon", "--keep-old", &grace.to_string()]);
    let rotated = Instant::now();
    assert!(out.contains("rotated the monitors' key"), "{out}");
    let e = refused(&c, &["auth", "rotate", "mon", "--keep-old", "60"]);
    assert!(e.contains("rotate again after that"), "{e}");
    let listed = c.ok(&["auth", "ls"]);
    assert!(
        listed.contains("shared key, rotated (previous key accepted until"),
        "{listed}"
    );

    // Every monitor writes the new key into its keyring file.
    let until = Instant::now() + Duration::from_secs(15);
    let new = loop {
        let keys: Vec<_> = (0..3).map(|i| mon_key(&c, i)).collect();
        if keys.iter().all(|k| k != &old) {
            assert!(keys.iter().all(|k| k == &keys[0]), "one new key");
            break keys[0].clone();
        }
        assert!(
            Instant::now() < until,
            "the keyrings still hold the old key"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // In the grace both keys get in, at every monitor.
    for a in &addrs {
        mon_handshake(a, &old).unwrap_or_else(|e| panic!("{a}: the old key in its grace: {e}"));
        mon_handshake(a, &new).unwrap_or_else(|e| panic!("{a}: the new key: {e}"));
    }
    // A monitor killed and restarted in the grace rejoins (with the key it applied).
    c.kill9("mon.2");
    c.restart_missing(3, 3);

    std::thread::sleep(Duration::from_secs(grace + 2).saturating_sub(rotated.elapsed()));
    for a in &addrs {
        let e = mon_handshake(a, &old).expect_err("the old key after its grace");
        assert!(
            e.contains("previous key, replaced by `cairn auth rotate mon`"),
            "{a}: {e}"
        );
        mon_handshake(a, &new).unwrap_or_else(|e| panic!("{a}: the new key: {e}"));
    }
    let listed = c.ok(&["auth", "ls"]);
    assert!(
        listed.contains("shared key, rotated") && !listed.contains("previous key"),
        "{listed}"
    );
    // New tickets come from the new key's service keys: the OSDs took them up.
    let file = c.dir.join("after-rotation");
    std::fs::write(&file, b"sealed by the new key").expect("write");
    let f = file.display().to_string();
    c.ok(&["obj", "put", "p", "after", &f]);
    let got = c.cairn(&["obj", "get", "p", "after", "-"]);
    assert_eq!(
        got.stdout,
        b"sealed by the new key",
        "{}",
        text(&got.stderr)
    );
    // After the grace, monitors restarted (the leader among them) rejoin with the new key.
    for m in ["mon.0", "mon.1"] {
        c.kill9(m);
        c.restart_missing(3, 3);
    }
    let until = Instant::now() + Duration::from_secs(30);
    while c.cairn(&["status"]).status.code() != Some(0) {
        assert!(
            Instant::now() < until,
            "no quorum after the restarts:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    check_writes(&rt, writer, 16);
}
