//! The OSD side of tickets: a [`Verifier`] that admits whoever presents a ticket it can open
//! with the service keys it holds, for the entity named in the hello. The ticket carries the
//! holder's caps (the monitors put them in), so an OSD knows what a client may do without
//! holding any entity key.

use crate::handshake::{Known, Verifier};
use cairn_auth::ticket::open_ticket;
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

    fn key_for(&self, method: u8, init: &AuthInit, entity: &Entity) -> Result<Known, String> {
        if method != AUTH_TICKET {
            return Err(format!(
                "{entity} presented its key: OSDs admit tickets from the monitors, not keys"
            ));
        }
        let body = open_ticket(&self.keys.get(), &init.ticket, unix_now())
            .map_err(|e| format!("{entity}'s ticket is refused: {e}"))?;
        if &body.entity != entity {
            return Err(format!(
                "{entity} presented a ticket issued to {}",
                body.entity
            ));
        }
        Ok(Known {
            entity: body.entity,
            caps: body.caps,
            key: body.session,
        })
    }
}
