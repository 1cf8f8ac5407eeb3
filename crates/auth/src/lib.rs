//! cairn-auth: who may talk to Cairn, and how they prove it.
//!
//! - [`entity`]: entity names (`mon.N`, `osd.N`, `client.NAME`, `nbd.NAME`).
//! - [`secret`]: secret keys and nonces from the operating system's random source.
//! - [`keyring`]: key files (TOML, mode 0600).
//! - [`caps`]: capabilities, parsed and checked.
//! - [`proof`]: the handshake's mutual proofs and session key (HMAC-SHA256, HKDF-SHA256).
//! - [`ticket`]: tickets for OSDs, sealed with ChaCha20-Poly1305.
//! - [`frames`]: frame protection after the handshake (signed, secure).
//! - [`keydb`]: the monitors' replicated key database and key ids.
//! - [`service`]: the OSD service keys tickets are sealed with, derived from the monitors' key.
//!
//! No primitive is written here: they come from RustCrypto (`hmac`, `sha2`, `hkdf`) and
//! `ring` (AES-256-GCM, ChaCha20-Poly1305). The protocol is in `docs/format/wire.md` ("Authentication").

pub mod caps;
pub mod entity;
pub mod frames;
pub mod keydb;
pub mod keyring;
pub mod mon_key;
pub mod proof;
pub mod secret;
pub mod service;
pub mod ticket;

pub use caps::{BadCaps, Caps, Grant, Perms};
pub use entity::{BadEntity, Entity, EntityKind, MAX_ENTITY_LEN};
pub use frames::{frame_guards, FrameMode, Opener, Sealer, Tampered, COPY_ALIGN, FRAME_TAGS_LEN};
pub use keydb::{key_id, KeyChange, KeyDb, KeyDbError, KeyRefusal, StoredKey, KEY_ID_LEN};
pub use keyring::{write_private, FileStamp, KeyEntry, Keyring, KeyringError};
pub use mon_key::{MonKey, MonKeySet, MIN_MON_KEEP_OLD_SECS};
pub use secret::{nbd_psk, random, BadSecret, Secret, SECRET_LEN};
pub use service::{Minted, ServiceKeys};
pub use ticket::{
    open, open_secret, open_ticket, seal, seal_ticket, unix_now, SealError, ServiceKey, TicketBody,
    MAX_TICKET, TICKET_TTL_SECS,
};
