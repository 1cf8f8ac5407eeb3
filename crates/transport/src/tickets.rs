//! The OSD side of tickets: a [`Verifier`] that admits whoever presents a ticket it can open
//! with the service keys it holds, for the entity named in the hello. The ticket carries the
//! holder's caps (the monitors put them in), so an OSD knows what a client may do without
//! holding any entity key.

use crate::handshake::{Known, Verifier, VerifyError};
use cairn_auth::ticket::{open_ticket, SealError};
use cairn_auth::{unix_now, Entity, FrameMode, ServiceKeys};
use cairn_proto::auth::{AuthInit, AUTH_TICKET};
use std::sync::Arc;

/// Opens tickets with the service keys in `keys`; every connection's frames are protected
/// with `frames` at least.
#[derive(Debug, Clone)]
pub struct TicketVerifier {
    pub keys: Arc<ServiceKeys>,
    pub frames: FrameMode,
}

impl Verifier for TicketVerifier {
    fn allow_none(&self) -> bool {
        false
    }

    fn frames(&self) -> FrameMode {
        self.frames
    }

    fn key_for(&self, method: u8, init: &AuthInit, entity: &Entity) -> Result<Known, VerifyError> {
        if method != AUTH_TICKET {
            return Err(VerifyError::KeyToOsd(entity.clone()));
        }
        let body = open_ticket(&self.keys.get(), &init.ticket, unix_now()).map_err(|error| {
            // A key this OSD lacks, or one of an id it holds that does not open the ticket
            // (the monitors' key was rotated): the monitors may have newer service keys.
            if matches!(error, SealError::UnknownKey(_) | SealError::Invalid) {
                self.keys.want_newer();
            }
            VerifyError::Ticket {
                entity: entity.clone(),
                error,
            }
        })?;
        if &body.entity != entity {
            return Err(VerifyError::TicketOfAnother {
                entity: entity.clone(),
                holder: body.entity,
            });
        }
        Ok(Known {
            entity: body.entity,
            caps: body.caps,
            key: body.session,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_auth::service::{derive_service_key, mint, service_key_id};
    use cairn_auth::{Caps, Secret};

    fn init(ticket: Vec<u8>) -> AuthInit {
        AuthInit {
            entity: "client.a".into(),
            key_id: [0; 8],
            frames: 0,
            nonce: [0; cairn_proto::auth::NONCE_LEN],
            ticket,
        }
    }

    #[test]
    fn a_ticket_the_held_keys_do_not_open_asks_for_newer_keys() {
        let now = unix_now();
        let (old, new) = (Secret::generate(), Secret::generate());
        let keys = Arc::new(ServiceKeys::default());
        keys.set(vec![derive_service_key(&old, service_key_id(now))]);
        let v = TicketVerifier {
            keys: keys.clone(),
            frames: FrameMode::Plain,
        };
        let a = Entity::parse("client.a").expect("entity");
        let ticket = |mon: &Secret, id| {
            mint(&derive_service_key(mon, id), &a, &Caps::default(), now, 60).ticket
        };
        let ok = v.key_for(AUTH_TICKET, &init(ticket(&old, service_key_id(now))), &a);
        assert!(ok.is_ok(), "{:?}", ok.err());
        assert!(!keys.take_wanted(), "a ticket that opens asks for nothing");
        // Sealed with the service key of a rotated monitors' key: same id, other secret.
        let Err(e) = v.key_for(AUTH_TICKET, &init(ticket(&new, service_key_id(now))), &a) else {
            panic!("a ticket of another monitors' key opened");
        };
        assert!(matches!(e, VerifyError::Ticket { .. }), "{e:?}");
        assert!(e.to_string().contains("ticket is refused"), "{e}");
        assert!(keys.take_wanted());
        assert!(!keys.take_wanted(), "taken once");
        // Sealed with a key of an id not held.
        let later = service_key_id(now) + 5;
        assert!(v
            .key_for(AUTH_TICKET, &init(ticket(&old, later)), &a)
            .is_err());
        assert!(keys.take_wanted());
    }
}
