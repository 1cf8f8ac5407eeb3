//! Authentication and capabilities at the monitors, on a real cluster from `cairn dev up`:
//! who gets in, who is refused (and the refusal logged), and what each entity may ask.

mod common;

use cairn_auth::{Caps, Entity, Keyring, Secret};
use cairn_proto::msg::mon::{ErrorReply, MonStatus, ERROR, MON_STATUS, MON_STATUS_REPLY};
use cairn_proto::msg::{decode, ErrorCode};
use cairn_proto::Limits;
use cairn_transport::{initiate, node_kind, read_frame, write_frame, Credentials};
use common::cluster::{run_as, runtime, text, Cluster};
use tokio::net::TcpStream;

/// Adds `entity` with `caps` through `cairn auth add -o FILE` (as the administrator) and
/// writes a configuration using it; returns the configuration's path and the key.
fn add_client(c: &Cluster, name: &str, caps: Caps) -> (String, Secret) {
    let entity = Entity::parse(name).expect("entity");
    let ring = c.add_key(name, (&caps.mon, &caps.osd, &caps.nbd));
    let secret = Keyring::load_key(&ring, &entity)
        .expect("the new key")
        .secret;
    (c.conf_for(name, &ring), secret)
}

async fn connect(addr: &str, creds: &Credentials) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    initiate(&mut s, node_kind::CLIENT, creds)
        .await
        .map_err(|e| e.to_string())?;
    Ok(s)
}

/// The monitor's Raft term, asked on `s`.
async fn term(s: &mut TcpStream) -> u64 {
    write_frame(s, MON_STATUS, 9, &[], &[]).await.expect("send");
    let f = read_frame(s, &Limits::default()).await.expect("status");
    decode::<MonStatus>("status", &f.control)
        .expect("decode")
        .term
}

fn mon_log(c: &Cluster) -> String {
    std::fs::read_to_string(c.dir.join("log").join("mon.0.log")).expect("mon log")
}

#[test]
fn a_monitor_admits_only_connections_that_prove_a_key_it_knows() {
    let c = Cluster::up("auth-admit", 1, 1);
    let mon = c.mons()[0].clone();
    let admin = Keyring::load_key(&c.dir.join("keyring"), &Entity::admin()).expect("admin key");
    runtime().block_on(async {
        let cases = [
            (Credentials::None, "requires authentication"),
            (
                Credentials::Key {
                    entity: Entity::admin(),
                    secret: Secret::generate(),
                },
                "client.admin presents a key the monitors do not hold for it",
            ),
            (
                Credentials::Key {
                    entity: Entity::parse("client.nobody").expect("entity"),
                    secret: Secret::generate(),
                },
                "unknown entity client.nobody",
            ),
        ];
        for (creds, want) in cases {
            let e = connect(&mon, &creds).await.expect_err("refused");
            assert!(e.contains(want), "{creds:?}: {e}");
        }
        // The right key gets in and is served.
        let creds = Credentials::Key {
            entity: admin.entity.clone(),
            secret: admin.secret.clone(),
        };
        let mut s = connect(&mon, &creds).await.expect("admitted");
        write_frame(&mut s, MON_STATUS, 1, &[], &[])
            .await
            .expect("send");
        let f = read_frame(&mut s, &Limits::default()).await.expect("reply");
        assert_eq!(f.msg_type, MON_STATUS_REPLY);
    });
    let log = mon_log(&c);
    for want in [
        "requires authentication",
        "client.admin presents a key the monitors do not hold for it",
        "unknown entity client.nobody",
    ] {
        assert!(log.contains(want), "the monitor logs the refusal {want:?}");
    }
    // The command line without a keyring is refused with the reason.
    let bare = std::fs::read_to_string(&c.conf)
        .expect("conf")
        .lines()
        .filter(|l| !l.starts_with("keyring") && !l.starts_with("entity"))
        .collect::<Vec<_>>()
        .join("\n");
    let bare_path = c.dir.join("bare.toml");
    std::fs::write(&bare_path, bare).expect("write");
    let (ok, out) = run_as(&bare_path.display().to_string(), &["status"]);
    assert!(!ok && out.contains("requires authentication"), "{out}");
    // Authentication is fixed when the cluster is created.
    let dir = c.dir.display().to_string();
    let o = c.cairn(&["dev", "up", "--dir", &dir, "--auth", "none"]);
    let out = text(&o.stderr);
    assert!(
        !o.status.success() && out.contains("--auth none (it has key)"),
        "{out}"
    );
}

/// The capability matrix of monitor requests: each row an entity's caps, each column a
/// request, each cell allowed or refused with "permission denied".
#[test]
fn monitor_requests_are_checked_against_the_senders_caps() {
    let c = Cluster::up("auth-caps", 1, 1);
    let caps = |mon: &str| Caps {
        mon: mon.into(),
        ..Caps::default()
    };
    let none = add_client(&c, "client.none", caps("")).0;
    let reader = add_client(&c, "client.reader", caps("r")).0;
    let writer = add_client(&c, "client.writer", caps("rw")).0;
    let admin = c.conf.display().to_string();
    let status: &[&str] = &["status"];
    let create: &[&str] = &["pool", "create", "p", "--size", "1", "--pgs", "8"];
    let out_: &[&str] = &["osd", "in", "0"];
    #[rustfmt::skip]
    let matrix: [(&str, &[&str], bool, &str); 10] = [
        (&none, status, false, "client.none lacks r on the monitors"),
        (&none, out_, false, "client.none lacks w on the monitors"),
        (&reader, status, true, ""),
        (&reader, create, false, "client.reader lacks w on the monitors"),
        (&reader, out_, false, "client.reader lacks w on the monitors"),
        (&writer, status, true, ""),
        (&writer, out_, true, ""),
        (&writer, create, true, ""),
        (&admin, status, true, ""),
        (&admin, &["pool", "rm", "p", "--yes-i-really-mean-it"], true, ""),
    ];
    for (conf, args, allowed, why) in matrix {
        let (ok, out) = run_as(conf, args);
        assert_eq!(ok, allowed, "{conf} {args:?}: {out}");
        if !allowed {
            assert!(
                out.contains("permission denied") && out.contains(why),
                "{conf} {args:?}: {out}"
            );
        }
    }
    // Daemon messages from a client key: a heartbeat, an OSD boot, a Raft vote.
    let (_, secret) = add_client(&c, "client.forger", Caps::admin());
    let creds = Credentials::Key {
        entity: Entity::parse("client.forger").expect("entity"),
        secret,
    };
    let mon = c.mons()[0].clone();
    runtime().block_on(async {
        let mut admin_conn = connect(&mon, &{
            let k = Keyring::load_key(&c.dir.join("keyring"), &Entity::admin()).expect("key");
            Credentials::Key {
                entity: k.entity,
                secret: k.secret,
            }
        })
        .await
        .expect("admin");
        let before = term(&mut admin_conn).await;
        let heartbeat = cairn_proto::msg::mon::Heartbeat {
            osd: 0,
            up_from: 1,
            pgs: Vec::new(),
        };
        for (msg_type, body) in [
            (
                cairn_proto::msg::mon::HEARTBEAT,
                cairn_proto::msg::encode(&heartbeat),
            ),
            // A Raft vote request (type 100..=199): refused before its body is read.
            (101u16, vec![0u8; 64]),
        ] {
            let mut s = connect(&mon, &creds).await.expect("admitted");
            write_frame(&mut s, msg_type, 1, &body, &[])
                .await
                .expect("send");
            let f = read_frame(&mut s, &Limits::default()).await.expect("reply");
            assert_eq!(f.msg_type, ERROR, "message {msg_type}");
            let e: ErrorReply = decode("error", &f.control).expect("error");
            assert_eq!(e.code, ErrorCode::Denied, "{}", e.message);
            assert!(
                e.message.contains("permission denied: client.forger"),
                "{}",
                e.message
            );
        }
        assert_eq!(
            term(&mut admin_conn).await,
            before,
            "a forged vote changed no term"
        );
    });
}

/// An OSD's key boots only that OSD: a stopped OSD's store started with another OSD's
/// key is refused by the monitors.
#[test]
fn an_osd_key_boots_only_its_own_osd() {
    let c = Cluster::up("auth-osd", 1, 2);
    c.kill9("osd.1");
    let dev: toml::Value =
        toml::from_str(&std::fs::read_to_string(c.dir.join("dev.toml")).expect("dev.toml"))
            .expect("parse dev.toml");
    let mut wal = Vec::new();
    if let Some(w) = dev.get("wal_dir").and_then(|w| w.as_str()) {
        wal = vec!["--wal".to_string(), format!("{w}/osd.1.wal")];
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["osd", "run", "--dir"])
        .arg(c.dir.join("osd.1"))
        .args(&wal)
        .arg("--keyring")
        .arg(c.dir.join("osd.0").join("keyring"))
        .args(["--mon", &c.mons()[0]])
        .output()
        .expect("run an osd");
    let out = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("permission denied: osd.0 may not boot this store"),
        "{out}"
    );
    // An OSD given no keyring does not start without authentication on its own.
    let empty = c.dir.join("empty-osd");
    std::fs::create_dir_all(&empty).expect("dir");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["osd", "run", "--dir"])
        .arg(&empty)
        .args(["--mon", &c.mons()[0]])
        .output()
        .expect("run an osd");
    let out = text(&o.stderr);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("no keyring at") && out.contains("--auth none"),
        "{out}"
    );
    // Frame protection without authentication is refused by both daemons before they
    // start (every frame would go out plain otherwise).
    let nowhere = c.dir.join("no-auth");
    for args in [
        vec![
            "mon",
            "run",
            "--id",
            "0",
            "--listen",
            "127.0.0.1:0",
            "--member",
            "0=127.0.0.1:1",
            "--dir",
        ],
        vec!["osd", "run", "--mon", "127.0.0.1:1", "--dir"],
    ] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(&args)
            .arg(&nowhere)
            .args(["--auth", "none", "--frames", "secure"])
            .output()
            .expect("run a daemon");
        let out = text(&o.stderr);
        assert!(!o.status.success(), "{args:?}: {out}");
        assert!(
            out.contains("secure frames need authentication"),
            "{args:?}: {out}"
        );
    }
    assert!(
        !nowhere.exists(),
        "a refused daemon created {}",
        nowhere.display()
    );
}

/// Connects to an OSD presenting `creds` as a node of `kind`.
async fn osd_connect(addr: &str, kind: u8, creds: &Credentials) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    initiate(&mut s, kind, creds)
        .await
        .map_err(|e| e.to_string())?;
    Ok(s)
}

/// An OSD admits only tickets the monitors granted: not a bare connection, not a key, not a
/// ticket sealed with another key, expired, or issued to someone else; each refusal is logged
/// by the OSD. A ticket got from the monitors the way every client gets one is admitted.
#[test]
fn an_osd_admits_only_tickets_from_the_monitors() {
    use cairn_auth::service::{derive_service_key, mint, service_key_id};
    let c = Cluster::up("auth-osdport", 1, 1);
    let rt = runtime();
    let client = rt.block_on(cairn_client::Client::connect(c.client_config()));
    let client = client.expect("client");
    let osd = client.map().osds[&0].addr.clone();
    let admin = Keyring::load_key(&c.dir.join("keyring"), &Entity::admin()).expect("admin key");
    let now = cairn_auth::unix_now();
    let ticket = |svc: &cairn_auth::ServiceKey, entity: Entity, at: u64, ttl: u64| {
        let m = mint(svc, &entity, &Caps::admin(), at, ttl);
        Credentials::Ticket {
            entity,
            ticket: m.ticket,
            session: m.session,
        }
    };
    let forged = derive_service_key(&Secret::generate(), service_key_id(now));
    let Credentials::Ticket {
        ticket: real,
        session,
        ..
    } = c.ticket_as(Entity::admin(), Caps::admin())
    else {
        panic!("the cluster authenticates");
    };
    let real_svc = {
        let ring = Keyring::load(&c.dir.join("mon.0").join("keyring")).expect("mon keyring");
        let mon = ring
            .keys
            .iter()
            .find(|k| k.entity.kind() == cairn_auth::EntityKind::Mon);
        derive_service_key(&mon.expect("mon key").secret, service_key_id(now))
    };
    #[rustfmt::skip]
    let refused: [(Credentials, &str); 5] = [
        (Credentials::None, "requires authentication"),
        (Credentials::Key { entity: admin.entity.clone(), secret: admin.secret.clone() }, "not keys"),
        (ticket(&forged, Entity::admin(), now, 600), "not sealed with this key"),
        (ticket(&real_svc, Entity::admin(), now - 7200, 60), "expired"),
        (
            Credentials::Ticket { entity: Entity::parse("client.mallory").expect("e"), ticket: real, session },
            "issued to client.admin",
        ),
    ];
    rt.block_on(async {
        for (creds, why) in &refused {
            let e = osd_connect(&osd, node_kind::CLIENT, creds)
                .await
                .err()
                .unwrap_or_else(|| panic!("{creds:?} admitted"));
            assert!(e.contains(why), "{creds:?}: {e}");
        }
        // Only OSDs get the service keys: the administrator's key is refused them.
        let mon = cairn_monclient::MonClient::new(c.mons()).with_auth(std::sync::Arc::new(
            cairn_transport::Fixed(Credentials::Key {
                entity: admin.entity.clone(),
                secret: admin.secret.clone(),
            }),
        ));
        let e = mon
            .get_service_keys(&admin.entity, std::slice::from_ref(&admin.secret))
            .await
            .expect_err("service keys for a client");
        assert!(
            matches!(e, cairn_monclient::MonClientError::Denied(ref m) if m.contains("is not an OSD")),
            "{e}"
        );
        // The real path: a ticket from the monitors, renewed by the client library.
        let key = cairn_monclient::auth::EntityKey::new(admin.entity, admin.secret, c.mons());
        let creds = cairn_transport::Authenticator::credentials(key.as_ref(), node_kind::OSD)
            .await
            .expect("a ticket from the monitors");
        let mut s = osd_connect(&osd, node_kind::CLIENT, &creds)
            .await
            .expect("admitted");
        use cairn_proto::msg::osd::{OSD_PING, OSD_PONG};
        write_frame(&mut s, OSD_PING, 3, &[], &[])
            .await
            .expect("ping");
        let f = read_frame(&mut s, &Limits::default()).await.expect("pong");
        assert_eq!(f.msg_type, OSD_PONG);
    });
    let log = std::fs::read_to_string(c.dir.join("log").join("osd.0.log")).expect("osd log");
    for (_, why) in &refused {
        assert!(log.contains(why), "the OSD did not log the refusal {why:?}");
    }
}

/// The capability matrix of object ops: each client's `osd` caps against reads, writes and
/// scrubs of two pools, through the real CLI (which gets its ticket from the monitors).
#[test]
fn object_ops_are_checked_against_the_pool_caps() {
    let c = Cluster::up("auth-ops", 1, 1);
    c.pool_create("a", 1, 1, 4);
    c.pool_create("b", 1, 1, 4);
    let admin = c.conf.display().to_string();
    for pool in ["a", "b"] {
        let (ok, out) = run_as(&admin, &["obj", "put", pool, "o", "-"]);
        assert!(ok, "{out}");
    }
    let caps = |osd: &str| Caps {
        mon: "r".into(),
        osd: osd.into(),
        nbd: String::new(),
    };
    let none = add_client(&c, "client.none", caps("")).0;
    let reader = add_client(&c, "client.reader", caps("r")).0;
    let apool = add_client(&c, "client.apool", caps("rw pool=a")).0;
    let scrubber = add_client(&c, "client.scrubber", caps("r, x pool=a")).0;
    let get = |p: &'static str| -> Vec<&'static str> { vec!["obj", "get", p, "o", "-"] };
    let put = |p: &'static str| -> Vec<&'static str> { vec!["obj", "put", p, "o2", "-"] };
    let scrub = |p: &'static str| -> Vec<&'static str> { vec!["pg", "scrub", "--pool", p] };
    // An exclusive create is a write: it needs w like a put.
    let create =
        |p: &'static str| -> Vec<&'static str> { vec!["obj", "put", p, "o3", "-", "--if-absent"] };
    #[rustfmt::skip]
    let matrix: Vec<(&str, Vec<&str>, bool, &str)> = vec![
        (&none, get("a"), false, "client.none lacks r on pool a"),
        (&none, put("a"), false, "client.none lacks w on pool a"),
        (&reader, get("a"), true, ""),
        (&reader, get("b"), true, ""),
        (&reader, put("a"), false, "client.reader lacks w on pool a"),
        (&apool, put("a"), true, ""),
        (&reader, create("a"), false, "client.reader lacks w on pool a"),
        (&apool, create("a"), true, ""),
        (&apool, get("a"), true, ""),
        (&apool, get("b"), false, "client.apool lacks r on pool b"),
        (&apool, put("b"), false, "client.apool lacks w on pool b"),
        (&apool, scrub("a"), false, "client.apool lacks x on pool a"),
        (&scrubber, scrub("a"), true, ""),
        (&scrubber, scrub("b"), false, "client.scrubber lacks x on pool b"),
        (&scrubber, put("a"), false, "client.scrubber lacks w on pool a"),
        (&admin, put("b"), true, ""),
        // A PG's status (asked of its primary) needs r on its pool; pool a is pool 1.
        (&none, vec!["pg", "query", "1.0"], false, "client.none lacks r on pool a"),
        (&reader, vec!["pg", "query", "1.0"], true, ""),
    ];
    for (conf, args, allowed, why) in matrix {
        let (ok, out) = run_as(conf, &args);
        assert_eq!(ok, allowed, "{conf} {args:?}: {out}");
        if !allowed {
            assert!(
                out.contains("permission denied") && out.contains(why),
                "{conf} {args:?}: {out}"
            );
        }
    }
}

/// Forged daemon messages to a replica (a `PG_PUSH Reset` that would wipe its copy, a `REP`
/// that would overwrite an object) from a client key, from an OSD speaking in the primary's
/// name, and from an OSD that is not the primary: all refused, and the replica's copy is
/// intact (read from it after the primary is killed).
#[test]
fn forged_daemon_messages_change_nothing_on_a_replica() {
    use cairn_proto::msg::osd::{OpKind, RepOp, RepReply, REP, REP_REPLY};
    use cairn_proto::msg::peering::{PgDone, PgPush, PushKind, PG_DONE, PG_PUSH};
    let c = Cluster::up("auth-forge", 1, 2);
    c.pool_create("r", 2, 1, 4);
    let rt = runtime();
    let mut cfg = c.client_config();
    cfg.op_timeout = std::time::Duration::from_secs(60);
    let client = rt
        .block_on(cairn_client::Client::connect(cfg))
        .expect("client");
    let pool = client.pool_id("r").expect("pool");
    rt.block_on(client.write_full(pool, b"victim", b"precious"))
        .expect("write");
    let map = client.map();
    let pg = map.object_pg(pool, b"victim").expect("pg");
    let acting = map.pg_placement(pg).acting;
    let (primary, replica) = (acting[0], acting[1]);
    let addr = map.osds[&replica].addr.clone();
    let admin = c.ticket_as(Entity::admin(), Caps::admin());
    let as_replica = c.ticket_as(Entity::osd(replica), Caps::default());
    let reset = |claim: u32| PgPush {
        epoch: map.epoch,
        pool,
        pg: pg.pg,
        primary: claim,
        kind: PushKind::Reset,
    };
    let rep = |claim: u32| RepOp {
        epoch: map.epoch,
        pool,
        pg: pg.pg,
        version: 2,
        primary: claim,
        object: b"victim".to_vec(),
        kind: OpKind::WriteFull,
    };
    rt.block_on(async {
        // Refused outright (permission denied, connection closed).
        for (creds, kind, claim, why) in [
            (&admin, node_kind::CLIENT, primary, "is not an OSD"),
            (&as_replica, node_kind::OSD, primary, "in the name of"),
        ] {
            for (t, body) in [
                (PG_PUSH, cairn_proto::msg::encode(&reset(claim))),
                (REP, cairn_proto::msg::encode(&rep(claim))),
            ] {
                let mut s = osd_connect(&addr, kind, creds).await.expect("admitted");
                write_frame(&mut s, t, 1, &body, b"forged!!")
                    .await
                    .expect("send");
                let f = read_frame(&mut s, &Limits::default()).await.expect("reply");
                assert_eq!(f.msg_type, cairn_proto::msg::osd::ERROR, "message {t}");
                let e: ErrorReply = decode("error", &f.control).expect("error");
                assert_eq!(e.code, ErrorCode::Denied, "{}", e.message);
                assert!(e.message.contains(why), "{}", e.message);
            }
        }
        // The replica speaking as itself is not the primary: stale.
        let mut s = osd_connect(&addr, node_kind::OSD, &as_replica)
            .await
            .expect("admitted");
        let body = cairn_proto::msg::encode(&reset(replica));
        write_frame(&mut s, PG_PUSH, 2, &body, &[])
            .await
            .expect("send");
        let f = read_frame(&mut s, &Limits::default()).await.expect("reply");
        assert_eq!(f.msg_type, PG_DONE);
        let r: PgDone = decode("pg done", &f.control).expect("decode");
        assert!(matches!(r, PgDone::Stale { .. }), "{r:?}");
        let body = cairn_proto::msg::encode(&rep(replica));
        write_frame(&mut s, REP, 3, &body, b"forged!!")
            .await
            .expect("send");
        let f = read_frame(&mut s, &Limits::default()).await.expect("reply");
        assert_eq!(f.msg_type, REP_REPLY);
        let r: RepReply = decode("rep reply", &f.control).expect("decode");
        assert!(matches!(r, RepReply::Stale { .. }), "{r:?}");
    });
    // The replica's copy is what was written: it serves it once the primary is gone.
    c.kill9(&format!("osd.{primary}"));
    let got = rt
        .block_on(client.read(pool, b"victim", 0, 8))
        .expect("read from the replica");
    assert_eq!(got, b"precious");
}

/// `cairn bench objects --json` (0.3 s per workload, one object, size 1) with `extra`
/// arguments; its workloads.
fn bench_objects(c: &Cluster, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "bench",
        "objects",
        "--json",
        "--seconds",
        "0.3",
        "--objects",
        "1",
        "--size",
        "1",
    ];
    args.extend_from_slice(extra);
    let v: serde_json::Value = serde_json::from_str(&c.ok(&args)).expect("json");
    v["workloads"].as_array().expect("workloads").clone()
}

/// `cairn bench objects` measures new connections (handshake and authentication to a
/// monitor with a key, to an OSD with a ticket) next to a bare TCP connect, and runs a
/// workload in each frame protection mode in one run.
#[test]
fn bench_objects_measures_authenticated_connections() {
    let c = Cluster::up("auth-bench-connect", 1, 1);
    let w = bench_objects(&c, &["--only", "connect"]);
    let names: Vec<&str> = w.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["connect-mon", "connect-osd"], "{w:?}");
    for e in &w {
        assert!(e["connections"].as_u64().unwrap_or(0) > 0, "{e}");
        assert!(e["lat_us"]["p50"].as_f64().unwrap_or(0.0) > 0.0, "{e}");
        assert!(
            e["baseline_lat_us"]["p50"].as_f64().unwrap_or(0.0) > 0.0,
            "{e}"
        );
    }
    // The same workload in each frame protection mode, in one run.
    let w = bench_objects(
        &c,
        &["--only", "write-4k-qd1", "--frames", "plain,signed,secure"],
    );
    let modes: Vec<&str> = w.iter().filter_map(|e| e["frames"].as_str()).collect();
    assert_eq!(modes, ["plain", "signed", "secure"], "{w:?}");
    for e in &w {
        assert!(e["ops"].as_u64().unwrap_or(0) > 0, "{e}");
        let has_ratio = e["iops_ratio_to_plain"].as_f64().is_some();
        assert_eq!(has_ratio, e["frames"] != "plain", "{e}");
    }
}

/// A cluster created with `--frames secure`: monitors (Raft among three), OSDs (replication
/// to two peers) and clients all talk in encrypted frames; `cairn status` says so; data
/// written is read back, also after the primary is killed.
#[test]
fn a_secure_cluster_replicates_and_serves_in_encrypted_frames() {
    let c = Cluster::up_with("auth-secure", 3, 3, &["--frames", "secure"]);
    c.pool_create("p", 3, 2, 16);
    let st = c.status();
    assert_eq!(st["mons"]["frames"], "secure", "{st}");
    assert_eq!(st["mons"]["authentication"], "key", "{st}");
    let text = c.ok(&["status"]);
    assert!(text.contains("frames secure"), "{text}");
    let data = c.dir.join("data");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(&data, &payload).expect("data");
    c.ok(&["obj", "put", "p", "obj", &data.display().to_string()]);
    let back = c.dir.join("back");
    c.ok(&["obj", "get", "p", "obj", &back.display().to_string()]);
    assert_eq!(std::fs::read(&back).expect("back"), payload);
    // The cluster's daemons logged every connection's mode; none failed its frame checks.
    let logs = c.logs();
    assert!(!logs.contains("failed its integrity check"), "{logs}");
    // A configuration that asks for nothing is given what the cluster requires.
    let plain = std::fs::read_to_string(&c.conf)
        .expect("conf")
        .replace("frames = \"secure\"", "frames = \"plain\"");
    let plain_path = c.dir.join("plain.toml");
    std::fs::write(&plain_path, plain).expect("write");
    let (ok, out) = run_as(
        &plain_path.display().to_string(),
        &["obj", "get", "p", "obj", &back.display().to_string()],
    );
    assert!(ok, "{out}");
    // Replicas were written in encrypted frames too: with the primary gone, another copy
    // serves the same bytes.
    let map = runtime().block_on(async { c.client().await.map().as_ref().clone() });
    let pool = map.pool_by_name("p").expect("pool").id;
    let pg = map.object_pg(pool, b"obj").expect("pg");
    let primary = map.pg_placement(pg).primary().expect("a primary");
    c.kill9(&format!("osd.{primary}"));
    c.ok(&["obj", "get", "p", "obj", &back.display().to_string()]);
    assert_eq!(std::fs::read(&back).expect("back"), payload);
}
