//! A client's credentials: its own key, presented to monitors.
//!
//! OSDs do not hold entity keys; until they check tickets, connections to them carry no
//! credentials.

use cairn_auth::{Entity, Secret};
use cairn_transport::{node_kind, Authenticator, Credentials};
use std::fmt;

/// An entity's key, for dialing monitors.
pub struct EntityKey {
    /// Who this client is.
    pub entity: Entity,
    /// Its secret key.
    pub secret: Secret,
}

impl fmt::Debug for EntityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntityKey({})", self.entity)
    }
}

impl Authenticator for EntityKey {
    fn credentials(&self, peer_kind: u8) -> Result<Credentials, String> {
        if peer_kind != node_kind::MON {
            return Ok(Credentials::None);
        }
        Ok(Credentials::Key {
            entity: self.entity.clone(),
            secret: self.secret.clone(),
        })
    }
}
