//! Golden files of what `cairn-auth` puts on the wire and on disk (`testdata/`, listed in
//! `docs/format/wire.md`, "Golden files"): the handshake's proofs and the keys derived from
//! keys (labels `... v1`), tickets and sealed secrets (`cairn ticket v1`), protected frames
//! (`cairn frames v3`) and keyring files. Regenerate with
//! `CAIRN_BLESS_GOLDEN=1 cargo test -p cairn-auth --test golden` (only with a new label
//! version: a changed golden file is a changed format).

#[path = "../../../testsupport/golden.rs"]
mod support;

use cairn_auth::{
    frame_guards, key_id, nbd_psk, proof, service, ticket, Caps, Entity, FrameMode, KeyEntry,
    Keyring, Secret, FRAME_TAGS_LEN,
};
use support::{same, Golden};

fn key() -> Secret {
    Secret(*b"the entity's key, 32 bytes long!")
}

fn entity() -> Entity {
    "client.golden".parse().unwrap()
}

/// Keys and proofs computed from keys: the same inputs must give the same bytes in every
/// build, or peers of two builds cannot authenticate each other.
#[test]
fn derivations_v1() {
    let (init, reply_head, reply) = (b"initiator hello", b"acceptor head", b"acceptor reply");
    let (nonce_i, nonce_a) = ([1u8; 32], [2u8; 32]);
    let mon_key = Secret(*b"the monitors' key, also 32 bytes");
    let mut g = Golden::new("derivations-v1.bin");
    let mut add = |name: &str, b: Vec<u8>| {
        let want = b.clone();
        g.add(name, b, move |got| same(&got.to_vec(), &want));
    };
    add("key_id", key_id(&key()).to_vec());
    add("nbd_psk", nbd_psk(&key()).0.to_vec());
    add(
        "acceptor_proof",
        proof::acceptor_proof(&key(), init, reply_head).to_vec(),
    );
    add(
        "initiator_proof",
        proof::initiator_proof(&key(), init, reply).to_vec(),
    );
    add(
        "session_key",
        proof::session_key(&key(), &nonce_i, &nonce_a).0.to_vec(),
    );
    let svc = service::derive_service_key(&mon_key, 20_454);
    add("derive_service_key", svc.secret.0.to_vec());
    add(
        "service_key_id",
        service::service_key_id(1_767_225_600)
            .to_le_bytes()
            .to_vec(),
    );
    g.finish();
}

/// Tickets and sealed secrets. Sealing draws a random nonce, so the sealed entries are only
/// opened (with the key and the AAD of the format), never compared with a new sealing.
#[test]
fn ticket_v1() {
    let svc = ticket::ServiceKey {
        id: 20_454,
        secret: Secret(*b"a service key for osds, 32 bytes"),
    };
    let body = ticket::TicketBody {
        entity: entity(),
        caps: Caps {
            mon: "r".into(),
            osd: "rw pool=rbd".into(),
            nbd: "".into(),
        },
        session: Secret(*b"the session secret, 32 bytes!!!!"),
        expires: 1_767_229_200,
    };
    let mut g = Golden::new("ticket-v1.bin");
    let want = body.clone();
    g.add(
        "TicketBody",
        postcard::to_stdvec(&body).unwrap(),
        move |b| {
            same(
                &postcard::from_bytes::<ticket::TicketBody>(b).map_err(|e| e.to_string())?,
                &want,
            )
        },
    );
    let keys = vec![svc.clone()];
    let want = keys.clone();
    g.add(
        "Vec<ServiceKey>",
        postcard::to_stdvec(&keys).unwrap(),
        move |b| {
            same(
                &postcard::from_bytes::<Vec<ticket::ServiceKey>>(b).map_err(|e| e.to_string())?,
                &want,
            )
        },
    );
    let want = body.clone();
    g.add_pinned(
        "sealed ticket",
        ticket::seal_ticket(&svc, &body),
        move |b| {
            let opened = ticket::open_ticket(&keys, b, 1_767_225_600).map_err(|e| e.to_string())?;
            same(&opened, &want)
        },
    );
    let aad = session_aad();
    let secret = body.session;
    g.add_pinned(
        "sealed secret",
        ticket::seal(&key(), &aad, &secret.0),
        move |b| {
            let opened = ticket::open_secret(&key(), &aad, b).map_err(|e| e.to_string())?;
            same(&opened, &secret)
        },
    );
    g.finish();
}

/// The AAD a ticket's session secret is sealed under for `client.golden`
/// (`cairn_proto::msg::mon::ticket_session_aad`, spelled out: this crate is below the protocol
/// crate).
fn session_aad() -> Vec<u8> {
    [b"cairn ticket session v1".as_slice(), b"client.golden"].concat()
}

/// Frames protected by both ends of a connection, in both modes: the first two frames each
/// way, each its body (in the clear when signed, encrypted when secure) and its tag.
#[test]
fn frames_v3() {
    let session = Secret(*b"a connection's session key, 32 B");
    let header = b"a frame header of 32 bytes......";
    let body = |seq: u8| [b"control part".as_slice(), b"data part", &[seq]].concat();
    let mut g = Golden::new("frames-v3.bin");
    for mode in [FrameMode::Signed, FrameMode::Secure] {
        for initiator in [true, false] {
            let (mut sealer, _) = frame_guards(&session, mode, initiator).unwrap().unwrap();
            let mut bytes = Vec::new();
            for seq in 0..2 {
                let mut b = body(seq);
                let tag = sealer.seal(header, &mut b).unwrap();
                bytes.extend_from_slice(&b);
                bytes.extend_from_slice(&tag);
            }
            let side = if initiator { "initiator" } else { "acceptor" };
            let session = session.clone();
            g.add(format!("{mode} {side} frames 0 and 1"), bytes, move |b| {
                // The other end opens them in order.
                let (_, mut opener) = frame_guards(&session, mode, !initiator)
                    .map_err(|_| "no guards")?
                    .ok_or("plain")?;
                let n = body(0).len();
                let frames: Vec<&[u8]> = b.chunks(n + FRAME_TAGS_LEN).collect();
                same(&frames.len(), &2)?;
                for (seq, f) in frames.into_iter().enumerate() {
                    let (sealed, tag) = f.split_at(n.min(f.len()));
                    let mut opened = sealed.to_vec();
                    let tag: &[u8; FRAME_TAGS_LEN] = tag.try_into().map_err(|_| "short tag")?;
                    opener
                        .open(header, &mut opened, tag)
                        .map_err(|e| e.to_string())?;
                    same(&opened, &body(seq as u8))?;
                }
                Ok(())
            });
        }
    }
    g.finish();
}

/// A keyring file as `Keyring::save` writes it (TOML).
#[test]
fn keyring_v1() {
    let ring = Keyring {
        keys: vec![
            KeyEntry {
                entity: Entity::admin(),
                secret: key(),
                caps: Some(Caps::admin()),
            },
            KeyEntry {
                entity: "osd.3".parse().unwrap(),
                secret: Secret([0x5a; 32]),
                caps: None,
            },
        ],
    };
    let path = std::env::temp_dir().join(format!("cairn-golden-keyring-{}", std::process::id()));
    ring.save(&path).unwrap();
    let text = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    Golden::raw("keyring-v1.toml", text, move |b| {
        let text = std::str::from_utf8(b).map_err(|e| e.to_string())?;
        same(
            &Keyring::parse("golden", text).map_err(|e| e.to_string())?,
            &ring,
        )
    })
    .finish();
}
