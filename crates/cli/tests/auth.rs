//! Authentication and capabilities at the monitors, on a real cluster from `cairn dev up`:
//! who gets in, who is refused (and the refusal logged), and what each entity may ask.

mod common;

use cairn_auth::{Caps, Entity, KeyEntry, Keyring, Secret};
use cairn_proto::msg::mon::{ErrorReply, MonStatus, ERROR, MON_STATUS, MON_STATUS_REPLY};
use cairn_proto::msg::{decode, ErrorCode};
use cairn_proto::Limits;
use cairn_transport::{initiate, node_kind, read_frame, write_frame, Credentials};
use common::cluster::{runtime, text, Cluster};
use tokio::net::TcpStream;

/// Adds `entity` with `caps` to every monitor's keyring (they re-read it) and writes a
/// configuration using it; returns the configuration's path and the key.
fn add_client(c: &Cluster, name: &str, caps: Caps) -> (String, Secret) {
    let entity = Entity::parse(name).expect("entity");
    let secret = Secret::generate();
    let entry = KeyEntry {
        entity: entity.clone(),
        secret: secret.clone(),
        caps: Some(caps),
    };
    let path = c.dir.join("mon.0").join("keyring");
    let mut ring = Keyring::load(&path).expect("mon keyring");
    ring.put(entry.clone());
    ring.save(&path).expect("save mon keyring");
    let own = c.dir.join(format!("{name}.keyring"));
    Keyring {
        keys: vec![KeyEntry {
            caps: None,
            ..entry
        }],
    }
    .save(&own)
    .expect("save client keyring");
    let conf = std::fs::read_to_string(&c.conf)
        .expect("conf")
        .replace(
            "keyring = \"keyring\"",
            &format!("keyring = \"{name}.keyring\""),
        )
        .replace("client.admin", name);
    let conf_path = c.dir.join(format!("{name}.toml"));
    std::fs::write(&conf_path, conf).expect("write conf");
    (conf_path.display().to_string(), secret)
}

/// Runs `cairn -c CONF ARGS`; returns (success, stdout + stderr).
fn as_client(conf: &str, args: &[&str]) -> (bool, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["-c", conf])
        .args(args)
        .output()
        .expect("run cairn");
    (
        o.status.success(),
        format!("{}{}", text(&o.stdout), text(&o.stderr)),
    )
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
                "could not prove it holds the key of client.admin",
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
        "client.admin hung up before proving its key",
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
    let (ok, out) = as_client(&bare_path.display().to_string(), &["status"]);
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
        let (ok, out) = as_client(conf, args);
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
}
