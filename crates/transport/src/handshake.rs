//! The handshake every connection starts with, and its authentication.
//!
//! The initiator (the side that dialed) sends its [`Hello`] first; with credentials it
//! carries an `AuthInit` (entity, fresh nonce, ticket for an OSD). The acceptor answers with its
//! hello: an `AuthChallenge` (its own fresh nonce and its proof that it holds the key) or an
//! `AuthRefusal`. The initiator checks that proof and sends its own as a 36-byte record. Both
//! then hold a session key derived from the key and both nonces. Each proof covers what was
//! said on this connection, so nothing recorded from another connection is accepted. The
//! protocol and its threat model: `docs/format/wire.md`, "Authentication".

use cairn_auth::proof::{
    acceptor_proof, check_acceptor_proof, check_initiator_proof, initiator_proof, session_key,
};
use cairn_auth::{frame_guards, Caps, Entity, EntityKind, FrameMode, Opener, Sealer, Secret};
use cairn_proto::auth::{
    decode_proof, encode_proof, AuthChallenge, AuthInit, AuthRefusal, AUTH_KEY, AUTH_REFUSED,
    AUTH_TICKET, NONCE_LEN, PROOF_RECORD_LEN,
};
use cairn_proto::msg::{decode, encode};
use cairn_proto::{negotiate, Hello, AUTH_MAX, AUTH_NONE, HELLO_LEN};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a handshake may take: a peer that connects and stays silent (or trickles its
/// bytes) is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a connection's handshake failed. Messages carry no "handshake" prefix: callers say
/// where it failed ("{addr}: handshake: {e}").
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Hello(#[from] cairn_proto::HelloError),
    #[error("timed out")]
    Timeout,
    /// The peer refused us, saying why.
    #[error("refused by the peer: {0}")]
    Refused(String),
    /// We refused the peer (the acceptor logs this).
    #[error("refused: {0}")]
    Denied(String),
    /// The acceptor does not authenticate: with credentials in hand we do not talk to it.
    #[error("the peer does not authenticate (a cluster run with --auth none?): it could be anyone, so nothing is sent to it; drop the keyring to talk to such a cluster")]
    Unauthenticated,
    /// The acceptor could not prove it holds our key.
    #[error("the peer could not prove it holds the key of {0}: it is not the cluster we know, or the key was rotated (fetch the new key)")]
    PeerProof(Entity),
    /// The peer's auth records do not decode.
    #[error("malformed authentication: {0}")]
    Malformed(String),
    /// The frame protection asked for cannot be had (no key to protect with, or the peer
    /// answered less than was asked).
    #[error("frame protection: {0}")]
    Frames(String),
}

/// Node kinds in the handshake.
pub mod node_kind {
    pub const CLIENT: u8 = 1;
    pub const OSD: u8 = 2;
    pub const MON: u8 = 3;

    /// A kind's name, for messages.
    pub fn name(kind: u8) -> &'static str {
        match kind {
            CLIENT => "client",
            OSD => "OSD",
            MON => "monitor",
            _ => "unknown node kind",
        }
    }
}

/// The node kind an entity must say it is.
pub fn kind_of(entity: &Entity) -> u8 {
    match entity.kind() {
        EntityKind::Mon => node_kind::MON,
        EntityKind::Osd => node_kind::OSD,
        EntityKind::Client | EntityKind::Nbd => node_kind::CLIENT,
    }
}

/// What an initiator proves itself with on one connection.
#[derive(Clone)]
pub enum Credentials {
    /// Nothing: accepted only by a cluster that runs without authentication.
    None,
    /// The entity's own key (monitors hold every entity's key).
    Key { entity: Entity, secret: Secret },
    /// A ticket from the monitors and its session secret (for OSDs).
    Ticket {
        entity: Entity,
        ticket: Vec<u8>,
        session: Secret,
    },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::None => f.write_str("None"),
            Credentials::Key { entity, .. } => write!(f, "Key({entity})"),
            Credentials::Ticket { entity, .. } => write!(f, "Ticket({entity})"),
        }
    }
}

/// Why there are no credentials for a peer.
#[derive(Debug, Clone)]
pub struct NoCredentials {
    pub why: String,
    /// The monitors refused them (this entity's key or caps): trying again cannot help.
    /// `false` when they could not be asked (unreachable), which a retry may cure.
    pub refused: bool,
}

/// What [`Authenticator::credentials`] returns: getting a ticket may ask the monitors.
pub type CredentialsFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Credentials, NoCredentials>> + Send + 'a>,
>;

/// Gives a dialer the credentials for a peer of a kind (a key for monitors, a current ticket
/// for OSDs).
pub trait Authenticator: Send + Sync + fmt::Debug {
    fn credentials(&self, peer_kind: u8) -> CredentialsFuture<'_>;
}

/// Credentials known without waiting.
pub fn ready(c: Result<Credentials, NoCredentials>) -> CredentialsFuture<'static> {
    Box::pin(std::future::ready(c))
}

/// An authenticator that presents nothing (clusters run with `auth = none`, and tests of
/// refusals).
#[derive(Debug, Clone, Copy)]
pub struct NoAuth;

impl Authenticator for NoAuth {
    fn credentials(&self, _: u8) -> CredentialsFuture<'_> {
        ready(Ok(Credentials::None))
    }
}

/// An authenticator with one set of credentials for every peer.
#[derive(Debug)]
pub struct Fixed(pub Credentials);

impl Authenticator for Fixed {
    fn credentials(&self, _: u8) -> CredentialsFuture<'_> {
        ready(Ok(self.0.clone()))
    }
}

/// Shared handle on an authenticator.
pub type Auth = Arc<dyn Authenticator>;

/// What the acceptor knows about the key a peer must prove.
pub struct Known {
    pub entity: Entity,
    pub caps: Caps,
    pub key: Secret,
}

/// The acceptor's side: which key an initiator must prove, or why it is refused.
pub trait Verifier: Send + Sync {
    /// Whether a peer may connect without authenticating (a cluster with `auth = none`).
    fn allow_none(&self) -> bool;
    /// The key the initiator must prove for its `AuthInit` under `method`; `Err` is the
    /// refusal the initiator is sent.
    fn key_for(&self, method: u8, init: &AuthInit, entity: &Entity) -> Result<Known, VerifyError>;
    /// The frame protection every connection must have at least (a stronger one is used
    /// when the initiator asks for it).
    fn frames(&self) -> FrameMode {
        FrameMode::Plain
    }
}

/// A verifier that lets every peer in unauthenticated and knows no keys.
#[derive(Debug, Clone, Copy)]
pub struct AllowNone;

impl Verifier for AllowNone {
    fn allow_none(&self) -> bool {
        true
    }
    fn key_for(&self, _: u8, _: &AuthInit, _: &Entity) -> Result<Known, VerifyError> {
        Err(VerifyError::NoAuthentication)
    }
}

/// Why a [`Verifier`] refuses the key or ticket an initiator presents: the refusal it is sent
/// (and the acceptor logs). Each is a permission failure: the same credentials will be
/// refused again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// This node authenticates no one (it runs with `auth = none`).
    #[error("this node runs without authentication")]
    NoAuthentication,
    /// A ticket presented to a monitor.
    #[error("monitors authenticate entities by their keys, not tickets")]
    TicketToMonitor,
    /// A key presented to an OSD.
    #[error("{0} presented its key: OSDs admit tickets from the monitors, not keys")]
    KeyToOsd(Entity),
    /// The ticket does not open with the service keys held, or expired.
    #[error("{entity}'s ticket is refused: {error}")]
    Ticket {
        entity: Entity,
        error: cairn_auth::ticket::SealError,
    },
    /// The ticket opened, but was issued to another entity.
    #[error("{entity} presented a ticket issued to {holder}")]
    TicketOfAnother { entity: Entity, holder: Entity },
    /// The key is not one the keys held admit for the entity.
    #[error(transparent)]
    Key(#[from] cairn_auth::KeyRefusal),
}

/// Who the peer proved to be.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The node kind it said it is (checked against its entity when it authenticated).
    pub kind: u8,
    /// Its entity; `None` when it did not authenticate (allowed only with `auth = none`).
    pub entity: Option<Entity>,
    /// Its caps (empty for daemons and unauthenticated peers).
    pub caps: Caps,
    /// The connection's session key.
    pub session: Option<Secret>,
    /// The key it proved (its entity key, or its ticket's session secret): what answers
    /// meant for it alone are sealed with (during a rotation it may be the previous key).
    pub key: Option<Secret>,
    /// How the connection's frames are protected.
    pub frames: FrameMode,
}

/// The frame guards of one end of a protected connection (`None` for plain frames).
pub type Guards = Option<(Sealer, Opener)>;

/// The sealer (for the writing half) and the opener (for the reading half) of `g`.
pub fn split_guards(g: Guards) -> (Option<Sealer>, Option<Opener>) {
    match g {
        Some((s, o)) => (Some(s), Some(o)),
        None => (None, None),
    }
}

impl Peer {
    /// The peer as it appears in logs and refusals.
    pub fn name(&self) -> String {
        match &self.entity {
            Some(e) => e.to_string(),
            None => format!("an unauthenticated {}", node_kind::name(self.kind)),
        }
    }
}

/// What the initiator learned.
#[derive(Debug)]
pub struct Initiated {
    pub hello: Hello,
    pub version: u8,
    pub session: Option<Secret>,
    /// The connection's frame protection, and its guards for this end.
    pub frames: FrameMode,
    pub guards: Guards,
}

/// What the acceptor learned.
#[derive(Debug)]
pub struct Accepted {
    pub hello: Hello,
    pub version: u8,
    pub peer: Peer,
    /// The guards of this end of the connection (see `peer.frames`).
    pub guards: Guards,
}

async fn read_hello<S: AsyncRead + Unpin>(s: &mut S) -> Result<(Hello, Vec<u8>), HandshakeError> {
    let mut head = [0u8; HELLO_LEN];
    s.read_exact(&mut head).await?;
    // The auth length is checked by decode before the bytes are kept: read at most one
    // byte past the limit so decode sees the violation.
    let auth_len = (u16::from_le_bytes([head[8], head[9]]) as usize).min(AUTH_MAX + 1);
    let mut all = head.to_vec();
    if auth_len <= AUTH_MAX {
        all.resize(HELLO_LEN + auth_len, 0);
        s.read_exact(&mut all[HELLO_LEN..]).await?;
    }
    let (h, _) = Hello::decode(&all)?;
    Ok((h, all))
}

fn with_auth(kind: u8, method: u8, auth: Vec<u8>) -> Hello {
    Hello {
        auth_method: method,
        auth,
        ..Hello::ours(kind)
    }
}

/// The acceptor hello's bytes its proof covers: its fixed fields, its nonce and the frame
/// protection it chose (so no one in between can weaken it).
fn reply_head(h: &Hello, nonce: &[u8], frames: u8) -> Vec<u8> {
    [
        &[h.min_version, h.max_version, h.node_kind, h.auth_method][..],
        nonce,
        &[frames],
    ]
    .concat()
}

/// Runs `fut` within [`HANDSHAKE_TIMEOUT`].
async fn timed<T>(
    fut: impl std::future::Future<Output = Result<T, HandshakeError>>,
) -> Result<T, HandshakeError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, fut)
        .await
        .map_err(|_| HandshakeError::Timeout)?
}

/// The initiator's handshake as a node of `kind` presenting `creds`, asking for plain
/// frames (the acceptor may require more).
pub async fn initiate<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    kind: u8,
    creds: &Credentials,
) -> Result<Initiated, HandshakeError> {
    initiate_with(s, kind, creds, FrameMode::Plain).await
}

/// The initiator's handshake, asking for frame protection `wish` at least (an acceptor that
/// answers with less is refused).
pub async fn initiate_with<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    kind: u8,
    creds: &Credentials,
    wish: FrameMode,
) -> Result<Initiated, HandshakeError> {
    if wish != FrameMode::Plain && matches!(creds, Credentials::None) {
        return Err(HandshakeError::Frames(format!(
            "{wish} frames need authentication: give the client its keyring"
        )));
    }
    timed(async {
        let nonce: [u8; NONCE_LEN] = cairn_auth::random();
        let (ours, key) = match creds {
            Credentials::None => (Hello::ours(kind), None),
            Credentials::Key { entity, secret } => {
                let init = AuthInit {
                    entity: entity.to_string(),
                    key_id: cairn_auth::key_id(secret),
                    frames: wish.to_u8(),
                    nonce,
                    ticket: Vec::new(),
                };
                (
                    with_auth(kind, AUTH_KEY, encode(&init)),
                    Some((entity, secret)),
                )
            }
            Credentials::Ticket {
                entity,
                ticket,
                session,
            } => {
                let init = AuthInit {
                    entity: entity.to_string(),
                    key_id: cairn_auth::key_id(session),
                    frames: wish.to_u8(),
                    nonce,
                    ticket: ticket.clone(),
                };
                (
                    with_auth(kind, AUTH_TICKET, encode(&init)),
                    Some((entity, session)),
                )
            }
        };
        let init_bytes = ours.encode()?;
        s.write_all(&init_bytes).await?;
        let (theirs, reply_bytes) = read_hello(s).await?;
        if theirs.auth_method == AUTH_REFUSED {
            let r: AuthRefusal = decode("auth refusal", &theirs.auth)
                .map_err(|e| HandshakeError::Malformed(e.to_string()))?;
            return Err(HandshakeError::Refused(r.message));
        }
        let version = negotiate(&ours, &theirs)?;
        let Some((entity, key)) = key else {
            if theirs.auth_method != AUTH_NONE {
                return Err(HandshakeError::Malformed(
                    "the peer answered an unauthenticated hello with a challenge".into(),
                ));
            }
            return Ok(Initiated {
                hello: theirs,
                version,
                session: None,
                frames: FrameMode::Plain,
                guards: None,
            });
        };
        if theirs.auth_method != ours.auth_method {
            return Err(HandshakeError::Unauthenticated);
        }
        let c: AuthChallenge = decode("auth challenge", &theirs.auth)
            .map_err(|e| HandshakeError::Malformed(e.to_string()))?;
        let head = reply_head(&theirs, &c.nonce, c.frames);
        if !check_acceptor_proof(key, &init_bytes, &head, &c.proof) {
            return Err(HandshakeError::PeerProof(entity.clone()));
        }
        let frames = match FrameMode::from_u8(c.frames) {
            Some(m) if m >= wish => m,
            _ => {
                return Err(HandshakeError::Frames(format!(
                    "the peer answered {} to a request for {wish}",
                    c.frames
                )))
            }
        };
        let proof = initiator_proof(key, &init_bytes, &reply_bytes);
        s.write_all(&encode_proof(&proof)).await?;
        let session = session_key(key, &nonce, &c.nonce);
        let guards = frame_guards(&session, frames, true)
            .map_err(|e| HandshakeError::Frames(e.to_string()))?;
        Ok(Initiated {
            hello: theirs,
            version,
            guards,
            session: Some(session),
            frames,
        })
    })
    .await
}

/// Sends a refusal hello and returns the error the acceptor logs.
async fn refuse<S: AsyncWrite + Unpin>(s: &mut S, kind: u8, why: String) -> HandshakeError {
    let r = with_auth(kind, AUTH_REFUSED, encode(&AuthRefusal::new(why.clone())));
    if let Ok(b) = r.encode() {
        let _ = s.write_all(&b).await;
    }
    HandshakeError::Denied(why)
}

/// The acceptor's handshake as a node of `kind`: the initiator must prove a key `verifier`
/// knows (or `verifier` must allow unauthenticated peers). Refusals are sent to the peer
/// with their reason and returned.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    kind: u8,
    verifier: &dyn Verifier,
) -> Result<Accepted, HandshakeError> {
    timed(async {
        let (theirs, init_bytes) = read_hello(s).await?;
        let ours = Hello::ours(kind);
        let version = match negotiate(&ours, &theirs) {
            Ok(v) => v,
            Err(e) => return Err(refuse(s, kind, e.to_string()).await),
        };
        if theirs.auth_method == AUTH_NONE {
            if verifier.frames() != FrameMode::Plain {
                let why = format!(
                    "this cluster protects frames ({}): that needs authentication, give the \
                     client its keyring",
                    verifier.frames()
                );
                return Err(refuse(s, kind, why).await);
            }
            if !verifier.allow_none() {
                let why = "this cluster requires authentication: give the client its keyring \
                           (`keyring` in cairn.toml; --keyring for a daemon)";
                return Err(refuse(s, kind, why.into()).await);
            }
            s.write_all(&ours.encode()?).await?;
            let peer = Peer {
                kind: theirs.node_kind,
                entity: None,
                caps: Caps::default(),
                session: None,
                key: None,
                frames: FrameMode::Plain,
            };
            return Ok(Accepted {
                hello: theirs,
                version,
                peer,
                guards: None,
            });
        }
        if theirs.auth_method != AUTH_KEY && theirs.auth_method != AUTH_TICKET {
            let why = cairn_proto::HelloError::UnsupportedAuth(theirs.auth_method).to_string();
            return Err(refuse(s, kind, why).await);
        }
        let init: AuthInit = match decode("auth init", &theirs.auth) {
            Ok(i) => i,
            Err(e) => return Err(refuse(s, kind, e.to_string()).await),
        };
        let entity = match Entity::parse(&init.entity) {
            Ok(e) => e,
            Err(e) => return Err(refuse(s, kind, e.to_string()).await),
        };
        if kind_of(&entity) != theirs.node_kind {
            let why = format!(
                "{entity} cannot connect as a {}",
                node_kind::name(theirs.node_kind)
            );
            return Err(refuse(s, kind, why).await);
        }
        let known = match verifier.key_for(theirs.auth_method, &init, &entity) {
            Ok(k) => k,
            Err(why) => return Err(refuse(s, kind, why.to_string()).await),
        };
        let Some(wish) = FrameMode::from_u8(init.frames) else {
            let why = format!(
                "frame protection {} is not one this node knows",
                init.frames
            );
            return Err(refuse(s, kind, why).await);
        };
        let frames = wish.max(verifier.frames());
        let nonce: [u8; NONCE_LEN] = cairn_auth::random();
        let mut reply = with_auth(kind, theirs.auth_method, Vec::new());
        let head = reply_head(&reply, &nonce, frames.to_u8());
        let proof = acceptor_proof(&known.key, &init_bytes, &head);
        reply.auth = encode(&AuthChallenge {
            nonce,
            frames: frames.to_u8(),
            proof,
        });
        let reply_bytes = reply.encode()?;
        s.write_all(&reply_bytes).await?;
        let mut rec = [0u8; PROOF_RECORD_LEN];
        s.read_exact(&mut rec).await.map_err(|e| {
            HandshakeError::Denied(format!(
                "{} hung up before proving its key ({e}): it holds another key (rotated?)",
                known.entity
            ))
        })?;
        let ok = decode_proof(&rec)
            .is_some_and(|p| check_initiator_proof(&known.key, &init_bytes, &reply_bytes, p));
        if !ok {
            return Err(HandshakeError::Denied(format!(
                "{} failed to prove its key",
                known.entity
            )));
        }
        let session = session_key(&known.key, &init.nonce, &nonce);
        let guards = frame_guards(&session, frames, false)
            .map_err(|e| HandshakeError::Frames(e.to_string()))?;
        let peer = Peer {
            kind: theirs.node_kind,
            entity: Some(known.entity),
            caps: known.caps,
            session: Some(session),
            key: Some(known.key),
            frames,
        };
        Ok(Accepted {
            hello: theirs,
            version,
            peer,
            guards,
        })
    })
    .await
}
